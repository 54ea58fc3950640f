//! Differential test of connecting: every input goes through libpq itself (psql, libpq 15)
//! and through leaderrun's resolver and connector, both against a fake server that records
//! where each client went, whether it asked for TLS, the startup parameters it sent and the
//! password, then refuses. The two records must be equal, case by case; a case that one of
//! them refuses and the other does not is a difference too.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one connection to the fake server carried.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Visit {
    /// Which listener: `A`, `B` (TCP, answering), `H` (TCP, hangs), `N` (TCP, cannot connect
    /// now), `SA`, `SB` (Unix sockets of port A and B).
    at: &'static str,
    /// The SSLRequest came (the server answered `N`).
    ssl: bool,
    /// Startup parameters but client_encoding (psql sends none; tokio-postgres sends UTF8)
    /// and each client's own application_name (`psql`, `leaderrun@HOST:PID`).
    params: BTreeMap<String, String>,
    /// The cleartext password sent, if any.
    password: Option<String>,
}

type Log = Arc<Mutex<Vec<Visit>>>;

fn read_message(stream: &mut impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).ok()?;
    let len = u32::from_be_bytes(len) as usize;
    if !(4..=100_000).contains(&len) {
        return None;
    }
    let mut body = vec![0; len - 4];
    stream.read_exact(&mut body).ok()?;
    Some(body)
}

/// How a listener of the fake server answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A cleartext password asked for after the startup packet, recorded, then refused
    /// (28P01).
    Password,
    /// The first message recorded, and nothing answered.
    Hang,
    /// The startup packet recorded and answered with SQLSTATE 57P03, as a server that is
    /// starting up (or a standby with `hot_standby` off) answers it.
    CannotConnectNow,
}

/// A FATAL ErrorResponse with `code` and `message`.
fn fatal(code: &str, message: &str) -> Vec<u8> {
    let fields = format!("SFATAL\0VFATAL\0C{code}\0M{message}\0\0");
    let mut err = vec![b'E'];
    err.extend_from_slice(&((fields.len() + 4) as u32).to_be_bytes());
    err.extend_from_slice(fields.as_bytes());
    err
}

/// Serves one client: answers `N` to SSLRequest/GSSENCRequest, then as `answer` says.
fn serve(mut stream: impl Read + Write, at: &'static str, answer: Answer, log: &Log) {
    let hang = answer == Answer::Hang;
    let mut visit = Visit {
        at,
        ssl: false,
        params: BTreeMap::new(),
        password: None,
    };
    let startup = loop {
        let Some(body) = read_message(&mut stream) else {
            if visit.ssl {
                log.lock().unwrap().push(visit);
            }
            return;
        };
        if body.len() < 4 {
            return;
        }
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        match code {
            80_877_103 | 80_877_104 => {
                visit.ssl |= code == 80_877_103;
                if hang {
                    log.lock().unwrap().push(visit);
                    let mut sink = [0u8; 64];
                    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                    return;
                }
                if stream.write_all(b"N").is_err() {
                    return;
                }
            }
            _ => break body,
        }
    };
    let fields: Vec<&[u8]> = startup[4..].split(|b| *b == 0).collect();
    for pair in fields.chunks(2) {
        if let [k, v] = pair {
            if k.is_empty() {
                break;
            }
            let k = String::from_utf8_lossy(k).into_owned();
            let v = String::from_utf8_lossy(v).into_owned();
            let default_name =
                k == "application_name" && (v == "psql" || v.starts_with("leaderrun@"));
            if !default_name && k != "client_encoding" {
                visit.params.insert(k, v);
            }
        }
    }
    if hang {
        log.lock().unwrap().push(visit);
        let mut sink = [0u8; 64];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        return;
    }
    if answer == Answer::CannotConnectNow {
        log.lock().unwrap().push(visit);
        let _ = stream.write_all(&fatal("57P03", "the database system is starting up"));
        return;
    }
    // AuthenticationCleartextPassword.
    let _ = stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]);
    let _ = stream.flush();
    let mut tag = [0u8; 1];
    if stream.read_exact(&mut tag).is_ok() && tag[0] == b'p' {
        if let Some(body) = read_message(&mut stream) {
            let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
            visit.password = Some(String::from_utf8_lossy(&body[..end]).into_owned());
        }
    }
    log.lock().unwrap().push(visit);
    let _ = stream.write_all(&fatal("28P01", "password authentication failed"));
}

/// A TCP socket bound to a free port of 127.0.0.1 that never listens: a connection to the port
/// is refused, and the port stays taken while the socket lives.
fn reserved_port() -> (std::os::fd::OwnedFd, u16) {
    use nix::sys::socket::{
        bind, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, 0),
    )
    .unwrap();
    let addr: SockaddrIn = getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
    (fd, addr.port())
}

/// Serves every connection `accept` yields (it polls: `accept` is non-blocking) on a thread of
/// its own, until `stop`; `busy` counts the connections accepted and not yet recorded.
fn accept_loop<S: Read + Write + Send + 'static>(
    mut accept: impl FnMut() -> std::io::Result<S> + Send + 'static,
    at: &'static str,
    answer: Answer,
    (log, stop, busy): (&Log, &Arc<AtomicBool>, &Arc<AtomicUsize>),
) {
    let (log, stop, busy) = (log.clone(), stop.clone(), busy.clone());
    std::thread::spawn(move || loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match accept() {
            Ok(s) => {
                let (log, busy) = (log.clone(), busy.clone());
                busy.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    serve(s, at, answer, &log);
                    busy.fetch_sub(1, Ordering::SeqCst);
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    });
}

/// The fake server of one case: four TCP listeners and two Unix sockets, and a port with
/// nothing behind it.
pub(crate) struct Fake {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) a: u16,
    b: u16,
    h: u16,
    n: u16,
    pub(crate) r: u16,
    /// Holds port `r` bound without listening, so that connections to it are refused and no
    /// other listener of the suite (another case's fake runs in parallel) can take the port.
    _r_reserved: std::os::fd::OwnedFd,
    log: Log,
    stop: Arc<AtomicBool>,
    /// Connections accepted and not yet recorded.
    busy: Arc<AtomicUsize>,
}

impl Fake {
    pub(crate) fn start() -> Fake {
        let dir = tempfile::Builder::new()
            .prefix("lr-libpq")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir(dir.path().join("s")).unwrap();
        std::fs::create_dir(dir.path().join("home")).unwrap();
        let log: Log = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicUsize::new(0));
        let tcp = || TcpListener::bind("127.0.0.1:0").unwrap();
        let (la, lb, lh, ln) = (tcp(), tcp(), tcp(), tcp());
        let port = |l: &TcpListener| l.local_addr().unwrap().port();
        let (a, b, h, n) = (port(&la), port(&lb), port(&lh), port(&ln));
        let (r_reserved, r) = reserved_port();
        let wait = Duration::from_secs(15);
        for (listener, at, answer) in [
            (la, "A", Answer::Password),
            (lb, "B", Answer::Password),
            (lh, "H", Answer::Hang),
            (ln, "N", Answer::CannotConnectNow),
        ] {
            listener.set_nonblocking(true).unwrap();
            let accept = move || {
                let (s, _) = listener.accept()?;
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(wait))?;
                Ok(s)
            };
            accept_loop(accept, at, answer, (&log, &stop, &busy));
        }
        for (p, at) in [(a, "SA"), (b, "SB")] {
            let listener =
                UnixListener::bind(dir.path().join("s").join(format!(".s.PGSQL.{p}"))).unwrap();
            listener.set_nonblocking(true).unwrap();
            let accept = move || {
                let (s, _) = listener.accept()?;
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(wait))?;
                Ok(s)
            };
            accept_loop(accept, at, Answer::Password, (&log, &stop, &busy));
        }
        Fake {
            dir,
            a,
            b,
            h,
            n,
            r,
            log,
            stop,
            busy,
            _r_reserved: r_reserved,
        }
    }

    fn expand(&self, text: &str) -> String {
        text.replace("{A}", &self.a.to_string())
            .replace("{B}", &self.b.to_string())
            .replace("{H}", &self.h.to_string())
            .replace("{N}", &self.n.to_string())
            .replace("{R}", &self.r.to_string())
            .replace(
                "{SENC}",
                &self
                    .dir
                    .path()
                    .join("s")
                    .display()
                    .to_string()
                    .replace('/', "%2F"),
            )
            .replace("{S}", &self.dir.path().join("s").display().to_string())
            .replace("{D}", &self.dir.path().display().to_string())
    }

    /// The visits so far (taken: the next call starts afresh), as `(listener, password)`.
    pub(crate) fn passwords(&self) -> Vec<(&'static str, Option<String>)> {
        self.take()
            .into_iter()
            .map(|v| (v.at, v.password))
            .collect()
    }

    fn take(&self) -> Vec<Visit> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One input: a DSN (or none), variables, and files written into the case's directory
/// (`{D}/pgpass` with mode 0600, `{D}/services`).
#[derive(Clone, Debug, Default)]
struct Case {
    dsn: Option<String>,
    env: Vec<(String, String)>,
    pgpass: Option<String>,
    services: Option<String>,
    /// `{D}/pg_service.conf`, the system-wide file when `PGSYSCONFDIR={D}`.
    sysconf: Option<String>,
    /// `~/.pgpass` (mode 0600) and `~/.pg_service.conf` in the case's home directory.
    home_pgpass: Option<String>,
    home_services: Option<String>,
    expect: Expect,
}

/// What the two records must show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Expect {
    /// The same visits.
    #[default]
    Same,
    /// libpq connects; leaderrun refuses the input with this text in its error.
    Refused(&'static str),
    /// libpq 15 refuses (no visit); leaderrun connects, as libpq 16 (or, for the protocol
    /// range, 18) does.
    Libpq16,
    /// libpq sends this startup parameter, a session default of its environment (`PGTZ`'s
    /// `timezone`, `PGDATESTYLE`'s `datestyle`, `PGGEQO`'s `geqo`), and leaderrun does not:
    /// nothing it sends or reads depends on them (README, "Where leaderrun differs"). The
    /// visits are otherwise the same.
    SessionDefault(&'static str),
}

fn case(dsn: &str) -> Case {
    Case {
        dsn: Some(dsn.to_owned()),
        ..Case::default()
    }
}

impl Case {
    fn env(mut self, k: &str, v: &str) -> Case {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
    fn pgpass(mut self, text: &str) -> Case {
        self.pgpass = Some(text.to_owned());
        self
    }
    fn services(mut self, text: &str) -> Case {
        self.services = Some(text.to_owned());
        self
    }
    /// A documented difference: libpq connects, leaderrun refuses with `why` in its error.
    fn refused(mut self, why: &'static str) -> Case {
        self.expect = Expect::Refused(why);
        self
    }
    /// A documented difference: libpq sends `parameter`, leaderrun does not.
    fn session_default(mut self, parameter: &'static str) -> Case {
        self.expect = Expect::SessionDefault(parameter);
        self
    }
    /// A documented difference: libpq 15 refuses a keyword of libpq 16 that leaderrun has.
    fn libpq16(mut self) -> Case {
        self.expect = Expect::Libpq16;
        self
    }
}

/// The environment both clients get: HOME and PGSYSCONFDIR in the case's directory (so the
/// machine's own files play no part), the case's variables.
fn environment(fake: &Fake, case: &Case) -> Vec<(String, String)> {
    let mut env = vec![
        ("HOME".to_owned(), fake.expand("{D}/home")),
        ("PGSYSCONFDIR".to_owned(), fake.expand("{D}/sysconf")),
    ];
    for (k, v) in &case.env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), fake.expand(v)));
    }
    env
}

/// A file's bytes: the case's text expanded, each `{xE9}` the byte 0xE9 (Latin-1 `é`, which is
/// not UTF-8 on its own).
fn file_bytes(fake: &Fake, text: &str) -> Vec<u8> {
    let text = fake.expand(text);
    let parts: Vec<&[u8]> = text.split("{xE9}").map(str::as_bytes).collect();
    parts.join(&0xE9)
}

fn write_files(fake: &Fake, case: &Case) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(text) = &case.pgpass {
        let path = fake.dir.path().join("pgpass");
        std::fs::write(&path, file_bytes(fake, text)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    if let Some(text) = &case.services {
        std::fs::write(fake.dir.path().join("services"), file_bytes(fake, text)).unwrap();
    }
    if let Some(text) = &case.home_pgpass {
        let path = fake.dir.path().join("home/.pgpass");
        std::fs::write(&path, fake.expand(text)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    if let Some(text) = &case.home_services {
        std::fs::write(
            fake.dir.path().join("home/.pg_service.conf"),
            fake.expand(text),
        )
        .unwrap();
    }
    if let Some(text) = &case.sysconf {
        std::fs::write(fake.dir.path().join("pg_service.conf"), fake.expand(text)).unwrap();
    }
}

/// libpq's record: psql with the case's DSN and environment and nothing else (the psql binary
/// itself, not Debian's `pg_wrapper`, which adds `PGHOST` and `PGPORT` of its own).
fn through_libpq(fake: &Fake, case: &Case) -> Vec<Visit> {
    let mut cmd = Command::new(crate::support::cluster::psql());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-X", "-w", "-q", "-c", "select 1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in environment(fake, case) {
        cmd.env(k, v);
    }
    if let Some(dsn) = &case.dsn {
        cmd.arg("-d").arg(fake.expand(dsn));
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "psql hangs on {case:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The server side records a visit after the client's last byte: give it a moment.
    settle(fake)
}

/// psql (the binary itself, not Debian's `pg_wrapper`) with `settings` as its whole
/// environment but `PATH`, asked for `select 1` without a password prompt: what libpq makes of
/// the same settings, to compare leaderrun's answer with.
fn psql_with<K, V>(settings: impl IntoIterator<Item = (K, V)>) -> Command
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    let mut psql = Command::new(crate::support::cluster::psql());
    psql.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(settings)
        .args(["-X", "-w", "-c", "select 1"])
        .stdin(Stdio::null());
    psql
}

/// The section `[plex]` of a service file, naming the shared cluster.
fn plex_section() -> String {
    format!(
        "[plex]\nhost=127.0.0.1\nport={}\nuser=postgres\ndbname=postgres\n",
        crate::support::Cluster::shared().addr().port()
    )
}

/// psql's `out` must be a refusal whose message contains `says`.
fn assert_psql_refused(out: &std::process::Output, says: impl AsRef<str>) {
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "psql connected:\n{said}");
    assert!(said.contains(says.as_ref()), "{said}");
}

/// The visits of the client that just finished: once every connection it opened is served
/// (and the accept loops, which poll every 2 ms, have had time to see a last one).
fn settle(fake: &Fake) -> Vec<Visit> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        while fake.busy.load(Ordering::SeqCst) > 0 {
            assert!(
                Instant::now() < deadline,
                "the fake server is still serving"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(15));
        if fake.busy.load(Ordering::SeqCst) == 0 {
            return fake.take();
        }
    }
}

/// leaderrun's record: the resolver with the same DSN and environment, then its connector;
/// and its error, if any, as it would be shown.
fn through_leaderrun(
    fake: &Fake,
    case: &Case,
    rt: &tokio::runtime::Runtime,
) -> (Vec<Visit>, Option<String>) {
    let env: BTreeMap<String, String> = environment(fake, case).into_iter().collect();
    let lookup = |k: &str| env.get(k).cloned();
    let dsn = case.dsn.as_ref().map(|d| fake.expand(d));
    let settings = match leaderrun::pg::conninfo::resolve(dsn.as_deref(), &lookup) {
        Ok(settings) => settings,
        Err(err) => return (settle(fake), Some(leaderrun::Chain(&err).to_string())),
    };
    let result = rt.block_on(leaderrun::elector::connect(
        &settings.config,
        &settings.tls,
        "fake",
        Duration::from_secs(10),
    ));
    let err = result.err().map(|e| leaderrun::Chain(&e).to_string());
    (settle(fake), err)
}

/// The visits as the two records are compared: psql puts its own name before a
/// `fallback_application_name` of the case, so where a case has one, no name is compared.
fn comparable(case: &Case, mut visits: Vec<Visit>) -> Vec<Visit> {
    let text = format!("{:?} {:?}", case.dsn, case.services);
    if text.contains("fallback_application_name") {
        for visit in &mut visits {
            visit.params.remove("application_name");
        }
    }
    visits
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let pw = "db:*:*:*:nope\n";
    // --- hostaddr and sslmode: TLS is asked for on TCP whatever names the address.
    for mode in ["", "disable", "allow", "prefer", "require"] {
        let m = if mode.is_empty() {
            String::new()
        } else {
            format!(" sslmode={mode}")
        };
        for form in [
            "hostaddr=127.0.0.1 port={A} user=u dbname=d",
            "host=db hostaddr=127.0.0.1 port={A} user=u dbname=d",
            "host={S} hostaddr=127.0.0.1 port={A} user=u dbname=d",
            "host=127.0.0.1 port={A} user=u dbname=d",
            "host={S} port={A} user=u dbname=d",
            "host=localhost port={A} user=u dbname=d",
        ] {
            out.push(case(&format!("{form}{m}")));
        }
        out.push(case(&format!(
            "postgresql://u@/d?hostaddr=127.0.0.1&port={{A}}{}",
            if mode.is_empty() {
                String::new()
            } else {
                format!("&sslmode={mode}")
            }
        )));
        out.push(
            case("user=u dbname=d")
                .env("PGHOSTADDR", "127.0.0.1")
                .env("PGPORT", "{A}")
                .env("PGSSLMODE", if mode.is_empty() { "prefer" } else { mode }),
        );
        out.push(
            case("user=u dbname=d")
                .env("PGHOST", "{S},127.0.0.1")
                .env("PGPORT", "{A}")
                .env("PGSSLMODE", if mode.is_empty() { "prefer" } else { mode }),
        );
    }
    // --- PGREQUIRESSL, as libpq 15 reads it.
    for (req, mode) in [
        ("1", None),
        ("0", None),
        ("", None),
        ("1", Some("disable")),
        ("1", Some("prefer")),
        ("0", Some("require")),
        ("10", None),
        ("yes", None),
    ] {
        let mut c = case("host=127.0.0.1 port={A} user=u dbname=d").env("PGREQUIRESSL", req);
        if let Some(m) = mode {
            c = c.env("PGSSLMODE", m);
        }
        out.push(c.clone());
        let mut d = case("hostaddr=127.0.0.1 port={A} user=u dbname=d").env("PGREQUIRESSL", req);
        if let Some(m) = mode {
            d = d.env("PGSSLMODE", m);
        }
        out.push(d);
    }
    out.push(
        case("host=127.0.0.1 port={A} user=u dbname=d sslmode=disable").env("PGREQUIRESSL", "1"),
    );
    // --- .pgpass, per host.
    let passes = [
        "127.0.0.1:{A}:d:u:pa\n",
        "127.0.0.1:*:*:*:any\n",
        "localhost:{A}:d:u:loc\n",
        "{S}:{A}:d:u:sock\n",
        "*:*:*:*:star\n",
        "127.0.0.1:{B}:d:u:pb\n127.0.0.1:{A}:d:u:pa\n",
        "127.0.0.1:{A}:d:u:first\n127.0.0.1:{A}:d:u:second\n",
        "127.0.0.1:{A}:d:u:pa:with:colons\n",
        "127.0.0.1:{A}:d:u:back\\\\slash\n",
        "127.0.0.1:{A}:d:u:esc\\:colon\n",
        "# comment\n127.0.0.1:{A}:d:u:aftercomment\n",
        "\\*:*:*:*:literalstar\n",
        "*:*:*:*:s\\*tar\n",
        "127.0.0.1:{A}:d:u\n*:*:*:*:short\n",
        "127.0.0.1:{A}:*:u:dbstar\n",
        "127.0.0.1:{A}:d:*:userstar\n",
        "127.0.0.1:{A}:D:u:case\n*:*:*:*:fallback\n",
        "db:{A}:d:u:byname\n127.0.0.1:*:*:*:byaddr\n",
        "   127.0.0.1:{A}:d:u:leading\n",
        "127.0.0.1:{A}:d:u:\n*:*:*:*:after-empty\n",
        // Lines that are not UTF-8 (Latin-1): libpq reads bytes, and the rest of the file
        // still counts; a password of such bytes is sent as it is.
        "# caf{xE9}\nother:*:*:*:p{xE9}ss\n127.0.0.1:{A}:d:u:pa\n",
        "127.0.0.1:{A}:d:u:p{xE9}ss\n",
        pw,
    ];
    for pass in passes {
        for dsn in [
            "host=127.0.0.1 port={A} user=u dbname=d passfile={D}/pgpass",
            "host={S} port={A} user=u dbname=d passfile={D}/pgpass",
            "host=db hostaddr=127.0.0.1 port={A} user=u dbname=d passfile={D}/pgpass",
            "host=localhost port={A} user=u dbname=d passfile={D}/pgpass sslmode=disable",
            "host=127.0.0.1,{S} port={R},{A} user=u dbname=d passfile={D}/pgpass",
            "host=127.0.0.1,127.0.0.1 port={R},{B} user=u dbname=d passfile={D}/pgpass",
        ] {
            out.push(case(dsn).pgpass(pass));
        }
        out.push(
            case("host=127.0.0.1 port={A} user=u dbname=d")
                .env("PGPASSFILE", "{D}/pgpass")
                .pgpass(pass),
        );
    }
    // Explicit passwords win over the file; an empty one.
    for dsn in [
        "host=127.0.0.1 port={A} user=u dbname=d password=given passfile={D}/pgpass",
        "host=127.0.0.1 port={A} user=u dbname=d password='' passfile={D}/pgpass",
        "postgresql://u:@127.0.0.1:{A}/d?passfile={D}/pgpass",
        "postgresql://u:given@127.0.0.1:{A}/d?passfile={D}/pgpass",
        "postgresql://u@127.0.0.1:{A}/d?passfile={D}/pgpass&password=q",
    ] {
        out.push(case(dsn).pgpass("*:*:*:*:file\n"));
        out.push(
            case(dsn)
                .pgpass("*:*:*:*:file\n")
                .env("PGPASSWORD", "envpw"),
        );
    }
    // --- URL passwords and escapes.
    for url in [
        "postgresql://u:pa?ss@127.0.0.1:{A}/d",
        "postgresql://u:pa%3Fss@127.0.0.1:{A}/d",
        "postgresql://u:p%40ss@127.0.0.1:{A}/d",
        "postgresql://u:p@ss@127.0.0.1:{A}/d",
        "postgresql://u:p:ss@127.0.0.1:{A}/d",
        "postgresql://u:p/ss@127.0.0.1:{A}/d",
        "postgresql://u:p#ss@127.0.0.1:{A}/d",
        "postgresql://u:p&ss@127.0.0.1:{A}/d",
        "postgresql://u:p=ss@127.0.0.1:{A}/d",
        "postgresql://u:p%zzss@127.0.0.1:{A}/d",
        "postgresql://u:p%20ss@127.0.0.1:{A}/d",
        "postgresql://u:%E2%82%AC@127.0.0.1:{A}/d",
        "postgres://u:pw@127.0.0.1:{A}/d?sslmode=disable",
        "postgresql://u%40x:pw@127.0.0.1:{A}/d",
        "postgresql://127.0.0.1:{A}/d?user=u&password=pa%3Fss",
        "postgresql://127.0.0.1:{A}/d?user=u&&password=x",
        "postgresql://127.0.0.1:{A}/d?user=u&",
        "postgresql://127.0.0.1:{A}/d?",
        "postgresql://127.0.0.1:{A}/d?user",
        "postgresql://127.0.0.1:{A}/d?user=u&user=v",
        "postgresql://127.0.0.1:{A}/d?=x",
        "postgresql://127.0.0.1:{A}/d%20b?user=u",
        "postgresql://127.0.0.1:{A}/?user=u",
        "postgresql://127.0.0.1:{A}?user=u&dbname=z",
        "postgresql://127.0.0.1:{A}/d?user=u&port={B}",
        "postgresql://127.0.0.1:{A}/d?user=u&host=127.0.0.1",
        "postgresql://[::1]:{A}/d?user=u&hostaddr=127.0.0.1",
        "postgresql://u@%2F{S}:{A}/d",
        "postgresql://u@:{A}/d?host={S}",
        "postgresql:///d?host={S}&port={A}&user=u",
        "postgresql://u@127.0.0.1:{A},127.0.0.1:{B}/d",
        "postgresql://u@127.0.0.1:{R},127.0.0.1:{B}/d",
        "postgresql://u@127.0.0.1:{R},127.0.0.1/d?port={R},{B}",
        "postgresql://u@127.0.0.1:{A}/d?options=-c%20x%3Dy",
        "postgresql://u@127.0.0.1:{A}/d?application_name=mine",
        "postgresql://u@127.0.0.1:{A}/d?connect_timeout=5",
        "postgresql://u@127.0.0.1:{A}/d?bogus=1",
        "postgresql://u@127.0.0.1:notaport/d",
        "postgresql://u@127.0.0.1:{A}/d?sslmode=sometimes",
        "postgresql://u@127.0.0.1:{A}/d?target_session_attrs=any",
        "mysql://u@127.0.0.1:{A}/d",
        // A password's unencoded '@' or '/': libpq reads the rest as a host it cannot reach,
        // leaderrun refuses before any message could show part of the password.
        "postgresql://u:p@ss@127.0.0.1:{A}/d",
        "postgresql://u:12/ss@127.0.0.1:{A}/d",
    ] {
        out.push(case(url));
        out.push(case(url).env("PGPASSWORD", "envpw"));
    }
    // --- Host lists: a hung first host, refused hosts, sockets in mixed lists.
    for dsn in [
        "host=127.0.0.1,127.0.0.1 port={H},{A} user=u dbname=d connect_timeout=2",
        "host=127.0.0.1,127.0.0.1 port={H},{A} user=u dbname=d connect_timeout=1",
        "host=127.0.0.1,127.0.0.1 port={H},{A} user=u dbname=d connect_timeout=2 sslmode=disable",
        "host=127.0.0.1,{S} port={H},{A} user=u dbname=d connect_timeout=2",
        "hostaddr=127.0.0.1,127.0.0.1 port={H},{B} user=u dbname=d connect_timeout=2",
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={R},{H},{B} user=u dbname=d connect_timeout=2",
        "postgresql://u@127.0.0.1:{H},127.0.0.1:{A}/d?connect_timeout=2",
        "host=127.0.0.1,127.0.0.1 port={R},{A} user=u dbname=d",
        // A server that cannot take connections now (57P03: starting up, a standby with
        // hot_standby off) passes the turn, as libpq does; alone, it is the answer.
        "host=127.0.0.1,127.0.0.1 port={N},{A} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={N},{N},{B} user=u dbname=d sslmode=disable",
        "postgresql://u@127.0.0.1:{N},127.0.0.1:{A}/d?target_session_attrs=primary",
        "host=127.0.0.1 port={N} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1 port={R},{R} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1 port={A} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1 port={A},{B},{A} user=u dbname=d",
        "host=127.0.0.1, port={R},{A} user=u dbname=d",
        "host=,127.0.0.1 port={R},{A} user=u dbname=d",
        "host={S},127.0.0.1 port={A} user=u dbname=d sslmode=require",
        "host={S},127.0.0.1 port={R},{A} user=u dbname=d sslmode=require",
        "host={S},127.0.0.1 port={R},{A} user=u dbname=d sslmode=prefer",
        "host={S},{S} port={R},{B} user=u dbname=d sslmode=require",
        "host=127.0.0.1,{S} port={R},{B} user=u dbname=d sslmode=verify-full",
        "host={S} port={B} user=u dbname=d sslmode=verify-full",
        "host={S} port={B} user=u dbname=d sslmode=verify-ca",
        "hostaddr=127.0.0.1,127.0.0.1 port={R},{A} user=u dbname=d",
        "hostaddr=127.0.0.1, port={R},{A} user=u dbname=d",
        "host=x,y hostaddr=127.0.0.1,127.0.0.1 port={R},{A} user=u dbname=d",
        "host=x,{S} hostaddr=127.0.0.1, port={R},{A} user=u dbname=d",
        "host=x hostaddr=127.0.0.1,127.0.0.1 port={A} user=u dbname=d",
        "hostaddr=notanip port={A} user=u dbname=d",
        "host=127.0.0.1 port={A},{B} user=u dbname=d",
        "host=127.0.0.1 port=' {A}' user=u dbname=d",
        "host=127.0.0.1 port='{A} ' user=u dbname=d",
        "host=127.0.0.1 port=0 user=u dbname=d",
        "host=127.0.0.1 port=99999 user=u dbname=d",
        "host=127.0.0.1 port=-1 user=u dbname=d",
        "host=127.0.0.1 port= user=u dbname=d",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=read-write",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=primary",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=standby",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=prefer-standby",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=read-only",
        "host=127.0.0.1 port={A} user=u dbname=d target_session_attrs=bogus",
        "host=127.0.0.1 port={A} user=u dbname=d connect_timeout=x",
        "host=127.0.0.1 port={A} user=u dbname=d connect_timeout=-3",
        "host=127.0.0.1 port={A} user=u dbname=d connect_timeout=' 5 '",
        "host=127.0.0.1 port={A} user=u dbname=d keepalives=abc",
        "host=127.0.0.1 port={A} user=u dbname=d keepalives=1",
        "host=127.0.0.1 port={A} user=u dbname=d sslmode=disable requiressl=1",
        "host=127.0.0.1 port={A} user=u dbname=d requiressl=1 sslmode=disable",
        "host=127.0.0.1 port={A} user=u dbname=d sslmode=require requiressl=0",
        "host=127.0.0.1 port={A} user=u dbname=d application_name=''",
        // Only a DSN that starts with libpq's prefixes is a URL: a value may hold "://".
        "host=127.0.0.1 port={A} user=u dbname=d password=ab://cd",
        "host=127.0.0.1 port={A} user=u dbname=d options='-c x.y=http://z'",
    ] {
        out.push(case(dsn));
    }
    // A host's port is read when its turn comes, as libpq reads it: out of range passes the
    // turn, text ends the attempt there (after the hosts before it).
    for dsn in [
        "host=127.0.0.1,127.0.0.1 port=99999,{A} user=u dbname=d",
        "host={S},127.0.0.1 port=0,{B} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1 port={A},x user=u dbname=d",
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={R},x,{A} user=u dbname=d",
        "host=127.0.0.1,127.0.0.1 port=99999,x user=u dbname=d",
        "postgresql://u@127.0.0.1:-1,127.0.0.1:{B}/d",
    ] {
        out.push(case(dsn));
    }
    // A URL's host or port list is set when its text is not empty (`,`, `h:,h:`), so
    // PGHOST and PGPORT do not fill it; `[]` and `%00` are refused. A bracketed host runs to
    // its `]`: a socket directory, a list.
    for (url, env) in [
        (
            "postgresql://u@,/d",
            vec![("PGHOST", "127.0.0.1"), ("PGPORT", "{A}")],
        ),
        ("postgresql://u@{SENC}:,{SENC}:/d", vec![("PGPORT", "{A}")]),
        ("postgresql://u@:{R},:{A}/d", vec![("PGHOST", "127.0.0.1")]),
        ("postgresql://u@[]:{A}/d", vec![("PGHOST", "127.0.0.1")]),
        ("postgresql://u@[{S}]:{A}/d", vec![]),
        ("postgresql://u@[{S}]/d", vec![("PGPORT", "{B}")]),
        ("postgresql://u@[{S},127.0.0.1]:{R}/d?port={R},{B}", vec![]),
        ("postgresql://u@127.0.0.1:{A}/d%00", vec![]),
        (
            "postgresql://u@127.0.0.1:{A}/d?options=-c%20x%3D%00",
            vec![],
        ),
    ] {
        let mut c = case(url);
        for (k, v) in env {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // application_name: the one named is sent; an empty one is set (no fallback) and not sent,
    // as libpq sends none.
    for (dsn, env) in [
        (
            "host=127.0.0.1 port={A} user=u dbname=d application_name=x",
            vec![],
        ),
        (
            "host=127.0.0.1 port={A} user=u dbname=d",
            vec![("PGAPPNAME", "")],
        ),
        (
            "host=127.0.0.1 port={A} user=u dbname=d",
            vec![("PGAPPNAME", "e")],
        ),
        (
            "postgresql://u@127.0.0.1:{A}/d?application_name=",
            vec![("PGAPPNAME", "e")],
        ),
        (
            "postgresql://u@127.0.0.1:{A}/d?application_name=%C3%BC%20x",
            vec![],
        ),
    ] {
        let mut c = case(dsn);
        for (k, v) in env {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // Percent-encoded bytes that are not UTF-8: libpq sends them, leaderrun's client cannot
    // (README, "Where leaderrun differs").
    out.push(case("postgresql://u@127.0.0.1:{A}/d%E9").refused("percent-encoding is not UTF-8"));
    // libpq reads an '@' in a URL's path as part of the database name; leaderrun refuses it
    // unencoded (README, "Where leaderrun differs").
    out.push(case("postgresql://127.0.0.1:{A}/d@b?user=u").refused("an '@' after the user part"));
    for dsn in [
        "host=127.0.0.1 port={A} user=u dbname=d load_balance_hosts=disable",
        "host=127.0.0.1,127.0.0.1 port={A} user=u dbname=d load_balance_hosts=random",
    ] {
        out.push(case(dsn).libpq16());
    }
    // libpq 18's protocol range: libpq 15 knows no such keyword; leaderrun takes a range that
    // holds 3.0 and refuses one that does not (so both refuse `min_protocol_version=3.2`).
    for dsn in [
        "host=127.0.0.1 port={A} user=u dbname=d min_protocol_version=3.0",
        "host=127.0.0.1 port={A} user=u dbname=d max_protocol_version=latest",
    ] {
        out.push(case(dsn).libpq16());
    }
    out.push(case(
        "host=127.0.0.1 port={A} user=u dbname=d min_protocol_version=3.2",
    ));
    // --- Keywords leaderrun does not support, and typos: both sides must refuse or agree.
    for kw in [
        "gssencmode=disable",
        "gssencmode=prefer",
        "gssencmode=require",
        "client_encoding=UTF8",
        "client_encoding=LATIN1",
        "sslcompression=0",
        "sslsni=0",
        "tcp_user_timeout=100",
        "krbsrvname=x",
        "requirepeer=root",
        "sslcompression=1",
        "sslcrl=/nonexistent",
        "ssl_min_protocol_version=TLSv1.2",
        "replication=database",
        "sslsni=1",
        "sslpassword=x",
        "frobnicate=1",
        "requiressl=1",
        "keepalives=0",
    ] {
        let c = case(&format!("host=127.0.0.1 port={{A}} user=u dbname=d {kw}"));
        // Keywords libpq 15 has and leaderrun does not: refused, said so (README).
        let refused = !matches!(
            kw,
            "gssencmode=disable"
                | "gssencmode=require"
                | "frobnicate=1"
                | "requiressl=1"
                | "client_encoding=UTF8"
                | "sslsni=1"
                | "sslcompression=0"
        );
        out.push(if refused {
            c.refused("not supported")
        } else {
            c
        });
    }
    // --- Service files.
    let svc = "[plex]\nhost=127.0.0.1\nport={A}\ndbname=svcdb\nuser=svcuser\n\
               [other]\nhost=127.0.0.1\nport={B}\n[pw]\nhost=127.0.0.1\nport={A}\nuser=u\npassword=svcpw\n\
               [spaces]\n  host = 127.0.0.1  \nport={A}\nuser=u\n# c\n[ssl]\nhostaddr=127.0.0.1\nport={A}\nsslmode=require\nuser=u\n\
               [rssl]\nhost=127.0.0.1\nport={A}\nrequiressl=1\nuser=u\n";
    for (dsn, extra) in [
        (Some("service=plex"), vec![]),
        (Some("service=plex dbname=mine"), vec![]),
        (Some("service=plex user=me"), vec![("PGUSER", "envuser")]),
        (Some("service=other user=u"), vec![]),
        (Some("service=pw dbname=d"), vec![("PGPASSWORD", "envpw")]),
        (Some("service=spaces dbname=d"), vec![]),
        (Some("service=ssl dbname=d"), vec![]),
        (Some("service=ssl dbname=d sslmode=disable"), vec![]),
        // libpq reads requiressl in a connection string only: a syntax error in the file.
        (Some("service=rssl dbname=d"), vec![]),
        (None, vec![("PGSERVICE", "rssl"), ("PGDATABASE", "d")]),
        (Some("service=missing"), vec![]),
        (Some("postgresql:///d?service=plex"), vec![]),
        (None, vec![("PGSERVICE", "plex")]),
        (None, vec![("PGSERVICE", "plex"), ("PGPORT", "{B}")]),
        (
            Some("dbname=d"),
            vec![("PGSERVICE", "other"), ("PGUSER", "u")],
        ),
        (Some("service=plex"), vec![("PGHOST", "{S}")]),
    ] {
        let mut c = Case {
            dsn: dsn.map(str::to_owned),
            ..Case::default()
        }
        .services(svc)
        .env("PGSERVICEFILE", "{D}/services");
        for (k, v) in extra {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // The system-wide service file, and a missing PGSERVICEFILE (refused, even when the
    // system-wide file has the service).
    for file in [None, Some("{D}/nonexistent"), Some("{D}/services")] {
        let mut c = case("service=plex").env("PGSYSCONFDIR", "{D}");
        c.sysconf = Some("[plex]\nhost=127.0.0.1\nport={B}\nuser=sys\ndbname=sys\n".to_owned());
        if let Some(file) = file {
            c = c.env("PGSERVICEFILE", file).services("[other]\nhost=x\n");
        }
        out.push(c);
    }
    out.push(
        case("service=plex")
            .env("PGSYSCONFDIR", "{D}")
            .env("PGSERVICEFILE", "{D}/nonexistent")
            .services(svc),
    );
    out.push(case("service=plex").env("PGSERVICEFILE", "{D}/nonexistent"));
    // A service file with lines that are not UTF-8 outside the service asked for (libpq reads
    // bytes): the service is still found.
    out.push(
        case("service=plex")
            .env("PGSERVICEFILE", "{D}/services")
            .services(
                "# caf{xE9}\n[other]\nhost=caf{xE9}\n[plex]\nhost=127.0.0.1\nport={A}\nuser=u\ndbname=d\n",
            ),
    );
    out.push(
        case("host=127.0.0.1 port={A} user=u dbname=d").env("PGSERVICEFILE", "{D}/nonexistent"),
    );
    out.push(
        case("service=plex")
            .env("PGSYSCONFDIR", "{D}")
            .services("[plex]\nhost=127.0.0.1\nport={B}\nuser=sys\ndbname=sys\n"),
    );
    out.push(
        Case::default()
            .services("[plex]\nhost=127.0.0.1\nport={A}\nuser=u\ndbname=d\nbogus=1\n")
            .env("PGSERVICEFILE", "{D}/services")
            .env("PGSERVICE", "plex"),
    );
    out.push(
        Case::default()
            .services("[plex]\nhost=127.0.0.1\nport={A}\nuser=u\ndbname=d\nservice=other\n")
            .env("PGSERVICEFILE", "{D}/services")
            .env("PGSERVICE", "plex"),
    );
    out.push(
        Case::default()
            .services("[plex]\nhost=127.0.0.1\nport={A}\nnovalue\n")
            .env("PGSERVICEFILE", "{D}/services")
            .env("PGSERVICE", "plex"),
    );
    // --- PG* variables and empty values.
    let base = [("PGHOST", "127.0.0.1"), ("PGPORT", "{A}")];
    for extra in [
        vec![("PGUSER", "envu"), ("PGDATABASE", "envd")],
        vec![("PGUSER", "envu")],
        vec![("PGDATABASE", "envd")],
        vec![("PGUSER", ""), ("PGDATABASE", "d")],
        vec![("PGUSER", "u"), ("PGDATABASE", "")],
        vec![("PGPASSWORD", ""), ("PGUSER", "u"), ("PGDATABASE", "d")],
        vec![("PGPASSWORD", "pw"), ("PGUSER", "u"), ("PGDATABASE", "d")],
        vec![
            ("PGOPTIONS", "-c search_path=x"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![
            ("PGAPPNAME", "psqlish"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![
            ("PGSSLMODE", "disable"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![("PGSSLMODE", ""), ("PGUSER", "u"), ("PGDATABASE", "d")],
        vec![("PGSSLMODE", "bogus"), ("PGUSER", "u"), ("PGDATABASE", "d")],
        vec![
            ("PGCONNECT_TIMEOUT", ""),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![
            ("PGTARGETSESSIONATTRS", "any"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![
            ("PGGSSENCMODE", "disable"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![
            ("PGCLIENTENCODING", "UTF8"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![("PGHOSTADDR", ""), ("PGUSER", "u"), ("PGDATABASE", "d")],
        vec![
            ("PGHOSTADDR", "127.0.0.1"),
            ("PGHOST", "db"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
        ],
        vec![("PGPORT", ""), ("PGUSER", "u"), ("PGDATABASE", "d")],
    ] {
        let mut c = Case::default();
        for (k, v) in base.iter().chain(extra.iter()) {
            c = c.env(k, v);
        }
        out.push(c);
    }
    for (dsn, env) in [
        ("user='' host=127.0.0.1 port={A} dbname=d", vec![]),
        ("user='' host=127.0.0.1 port={A} dbname=d", vec![("PGUSER", "envu")]),
        ("dbname='' host=127.0.0.1 port={A} user=u", vec![("PGDATABASE", "envd")]),
        ("host='' port={A} user=u dbname=d", vec![("PGHOST", "127.0.0.1")]),
        ("host=127.0.0.1 port='' user=u dbname=d", vec![("PGPORT", "{A}")]),
        ("host=127.0.0.1 port={A} user=u dbname=d sslmode=''", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname=d options=''", vec![("PGOPTIONS", "-c x=y")]),
        ("", vec![("PGHOST", "127.0.0.1"), ("PGPORT", "{A}"), ("PGUSER", "u"), ("PGDATABASE", "d")]),
        ("postgresql://", vec![("PGHOST", "127.0.0.1"), ("PGPORT", "{A}"), ("PGUSER", "u"), ("PGDATABASE", "d")]),
        ("postgresql://u:@127.0.0.1:{A}/d", vec![]),
        ("postgresql://u:@127.0.0.1:{A}/d", vec![("PGPASSWORD", "envpw")]),
        ("postgresql://:pw@127.0.0.1:{A}/d", vec![("PGUSER", "envu")]),
        ("host=127.0.0.1 port={A} user=u dbname=d password=", vec![("PGPASSWORD", "envpw")]),
        ("host=127.0.0.1 port={A} user=u dbname='my db'", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname=my\\ db", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname='it\\'s'", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname='unterminated", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname", vec![]),
        ("host = 127.0.0.1 port = {A} user = u dbname = d", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname=d user=v", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname=d options='-c a=b'", vec![]),
        ("host=127.0.0.1 port={A} user=ü dbname=d", vec![]),
        ("host=127.0.0.1 port={A} user=u dbname=d application_name=x fallback_application_name=y", vec![]),
        ("dbname=postgresql://u@127.0.0.1:{A}/d", vec![]),
        ("dbname='host=127.0.0.1 port={A} user=u dbname=inner'", vec![]),
        ("host=127.0.0.1 port={A} dbname=d", vec![("PGUSER", "envu")]),
    ] {
        let mut c = case(dsn);
        for (k, v) in env {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // The home directory's .pgpass and service file.
    for (dsn, pass) in [
        (
            "host=127.0.0.1 port={A} user=u dbname=d",
            "127.0.0.1:{A}:d:u:home\n",
        ),
        (
            "host={S} port={A} user=u dbname=d",
            "localhost:*:*:*:loc\n{S}:*:*:*:sock\n",
        ),
        (
            "host=127.0.0.1,127.0.0.1 port={R},{B} user=u dbname=d",
            "127.0.0.1:{A}:*:*:a\n127.0.0.1:{B}:*:*:b\n",
        ),
        (
            "host=127.0.0.1 port={A} user=u dbname=d passfile={D}/none",
            "*:*:*:*:home\n",
        ),
    ] {
        let mut c = case(dsn);
        c.home_pgpass = Some(pass.to_owned());
        out.push(c);
    }
    for (dsn, env) in [
        (Some("service=h"), vec![]),
        (Some("service=h dbname=mine"), vec![("PGPORT", "{B}")]),
        (None, vec![("PGSERVICE", "h")]),
        (Some("service=h"), vec![("PGSERVICEFILE", "{D}/services")]),
    ] {
        let mut c = Case {
            dsn: dsn.map(str::to_owned),
            ..Case::default()
        }
        .services("[h]\nhost=127.0.0.1\nport={B}\nuser=file\ndbname=file\n");
        c.home_services =
            Some("[h]\nhost=127.0.0.1\nport={A}\nuser=home\ndbname=home\n".to_owned());
        for (k, v) in env {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // More variables: lists, blanks, and the ones that take part in TLS and host choice.
    for env in [
        vec![("PGHOST", "127.0.0.1,127.0.0.1"), ("PGPORT", "{R},{A}")],
        vec![("PGHOST", "127.0.0.1"), ("PGPORT", " {A} ")],
        vec![
            ("PGHOST", "{S}"),
            ("PGPORT", "{B}"),
            ("PGSSLMODE", "require"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGHOSTADDR", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGSSLMODE", "disable"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGTARGETSESSIONATTRS", "primary"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGTARGETSESSIONATTRS", "bogus"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGCONNECT_TIMEOUT", "3"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGPASSFILE", ""),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGAPPNAME", ""),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGOPTIONS", ""),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGCHANNELBINDING", "disable"),
        ],
        vec![
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", "{A}"),
            ("PGREQUIRESSL", "1"),
            ("PGSSLMODE", ""),
        ],
    ] {
        let mut c = case("user=u dbname=d");
        for (k, v) in env {
            c = c.env(k, v);
        }
        out.push(c);
    }
    // Variables that fill the default .pgpass and the home directory's service file.
    out.push(
        case("host=127.0.0.1 port={A} user=u dbname=d")
            .env("PGPASSFILE", "{D}/home/.pgpass")
            .pgpass("*:*:*:*:x\n"),
    );
    // The variables of keywords leaderrun does not implement: refused too, unless harmless.
    for (var, value, refused) in [
        ("PGCLIENTENCODING", "UTF8", false),
        ("PGCLIENTENCODING", "LATIN1", true),
        ("PGSSLCRL", "{D}/crl.pem", true),
        ("PGSSLMINPROTOCOLVERSION", "TLSv1.3", true),
        ("PGKRBSRVNAME", "pg", true),
        ("PGGSSLIB", "gssapi", true),
        ("PGREQUIREPEER", "root", true),
        ("PGSSLSNI", "1", false),
        ("PGSSLCOMPRESSION", "1", true),
        ("PGGSSENCMODE", "prefer", true),
        ("PGGSSENCMODE", "disable", false),
        // libpq 18's protocol range (libpq 15 reads no such variable): taken when it holds
        // 3.0, the one version leaderrun speaks.
        ("PGMINPROTOCOLVERSION", "3.0", false),
        ("PGMINPROTOCOLVERSION", "3.2", true),
        ("PGMAXPROTOCOLVERSION", "latest", false),
        ("PGMAXPROTOCOLVERSION", "3.2", false),
    ] {
        let c = case("host=127.0.0.1 port={A} user=u dbname=d").env(var, value);
        out.push(if refused {
            c.refused("not supported")
        } else {
            c
        });
    }
    // Session defaults libpq sends from its environment, which change nothing leaderrun does.
    for (var, value, parameter) in [
        ("PGTZ", "Asia/Kolkata", "timezone"),
        ("PGDATESTYLE", "SQL, DMY", "datestyle"),
        ("PGGEQO", "off", "geqo"),
    ] {
        out.push(
            case("host=127.0.0.1 port={A} user=u dbname=d")
                .env(var, value)
                .session_default(parameter),
        );
    }
    // A DSN without '=' is a database name to libpq; leaderrun refuses it.
    out.push(
        case("   ")
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", "{A}")
            .refused("expected a postgres:// or postgresql:// URL"),
    );
    out.push(
        case("mydb")
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", "{A}")
            .refused("expected a postgres:// or postgresql:// URL"),
    );
    // Found by running psql and leaderrun against real servers: values end at C's white space
    // only, a URL's query as libpq reads it (`ssl=true`, a second `=`, a bracketed host
    // percent-decoded), C `int`s, an address list without names, missing TLS files.
    for dsn in [
        "host=127.0.0.1 port={A} dbname=d user=u\u{a0}x=y",
        "host=127.0.0.1\u{b}port={A}\u{c}user=u\rdbname=d",
        "postgresql://u@127.0.0.1:{A}/d?options=-c%20x=y",
        "postgresql://u@127.0.0.1:{A}/d?options=-c%20x%3Dy",
        "postgresql://u@127.0.0.1:{A}/d?ssl=true",
        "postgresql://u@127.0.0.1:{A}/d?ssl=false",
        "postgresql://u@[127.0.0%2E1]:{A}/d",
        "host=127.0.0.1 port={A} user=u dbname=d connect_timeout=2147483648",
        "host=127.0.0.1 port={A} user=u dbname=d connect_timeout=2147483647",
        "host='' hostaddr=127.0.0.1,127.0.0.1 port={R},{A} user=u dbname=d",
        "hostaddr=127.0.0.1,127.0.0.1 port={A} user=u dbname=d",
        "host=127.0.0.1 port={A} user=u dbname=d service=",
        "host=127.0.0.1 port={A} user=u dbname=d sslrootcert={D}/none.crt",
        "host=127.0.0.1 port={A} user=u dbname=d sslmode=require sslrootcert={D}/none.crt",
        "host=127.0.0.1 port={A} user=u dbname=d sslcert={D}/none.crt sslkey={D}/none.key",
        // A host that is no DNS name is only a name beside hostaddr: TLS is asked all the same.
        "host='x y' hostaddr=127.0.0.1 port={A} user=u dbname=d",
        "host=-db hostaddr=127.0.0.1 port={A} user=u dbname=d sslmode=require",
        "host=@pg hostaddr=127.0.0.1 port={A} user=u dbname=d",
    ] {
        out.push(case(dsn));
    }
    out.push(case("host=127.0.0.1 port={A} user=u dbname=d").env("PGSERVICE", ""));
    // A section header is the name and `]`, whatever follows: the file's `[plex] # …` is
    // the service, not the system-wide file's `[plex]`.
    for header in ["[plex] # main", "[plex]x", "[plexx]", "[ plex]"] {
        let mut c = case("service=plex")
            .env("PGSERVICEFILE", "{D}/services")
            .env("PGSYSCONFDIR", "{D}")
            .services(&format!(
                "{header}\nhost=127.0.0.1\nport={{A}}\nuser=u\ndbname=d\n"
            ));
        c.sysconf = Some("[plex]\nhost=127.0.0.1\nport={B}\nuser=sys\ndbname=sys\n".to_owned());
        out.push(c);
    }
    out.push(
        case("user=u dbname=d")
            .env("PGSERVICE", "")
            .env("PGSERVICEFILE", "{D}/services")
            .services("[]\nhost=127.0.0.1\nport={A}\n"),
    );
    for c in &mut out {
        let text = format!("{:?} {:?}", c.dsn, c.env);
        if text.contains("sslmode=allow") || text.contains("\"PGSSLMODE\", \"allow\"") {
            c.expect = Expect::Refused("sslmode=allow");
        }
    }
    out
}

#[test]
fn leaderrun_connects_as_libpq_does() {
    if Command::new(crate::support::cluster::psql())
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("psql (libpq) is needed for this test");
    }
    let cases = cases();
    assert!(cases.len() >= 250, "{} cases", cases.len());
    let next = AtomicUsize::new(0);
    let diffs = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..12 {
            scope.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { return };
                    let fake = Fake::start();
                    write_files(&fake, case);
                    let libpq = comparable(case, through_libpq(&fake, case));
                    let (ours, err) = through_leaderrun(&fake, case, &rt);
                    let ours = comparable(case, ours);
                    let same = match case.expect {
                        Expect::Same => libpq == ours,
                        Expect::Refused(why) => {
                            !libpq.is_empty()
                                && ours.is_empty()
                                && err.as_deref().is_some_and(|e| e.contains(why))
                        }
                        Expect::Libpq16 => libpq.is_empty() && !ours.is_empty(),
                        Expect::SessionDefault(parameter) => {
                            let without: Vec<Visit> = libpq
                                .iter()
                                .cloned()
                                .map(|mut visit| {
                                    visit.params.remove(parameter);
                                    visit
                                })
                                .collect();
                            without != libpq && without == ours
                        }
                    };
                    if !same {
                        diffs.lock().unwrap().push(format!(
                            "#{i} {case:?}\n  libpq:     {libpq:?}\n  leaderrun: {ours:?} {err:?}"
                        ));
                    }
                }
            });
        }
    });
    let diffs = diffs.into_inner().unwrap();
    eprintln!(
        "{} cases in {:?}, {} differ",
        cases.len(),
        started.elapsed(),
        diffs.len()
    );
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// A variable libpq reads that holds bytes that are not UTF-8 is refused by name (exit 125,
/// nothing started): taken as unset, as before, `PGHOST` fell back to the default socket and
/// `PGPORT` to 5432, so such a replica connected, and could lead, on another server than its
/// peers (libpq uses the bytes, and fails to resolve such a host).
#[test]
fn a_setting_variable_that_is_not_utf8_is_refused_not_ignored() {
    use crate::support::{leaderrun, unique_lock_id, Cluster};
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let cluster = Cluster::shared();
    let port = cluster.addr().port().to_string();
    let cases: [(&str, Vec<u8>); 3] = [
        ("PGHOST", b"127.0.0.1\xff".to_vec()),
        ("PGPORT", [port.as_bytes(), b"\xff"].concat()),
        ("PGDATABASE", b"postgres\xff".to_vec()),
    ];
    for (name, value) in cases {
        let mut cmd = leaderrun();
        cmd.env("PGHOST", "127.0.0.1")
            .env("PGPORT", &port)
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env(name, OsStr::from_bytes(&value))
            .args(["--lock-id", &unique_lock_id().to_string(), "--once"])
            .args(["--", "sh", "-c", "echo RAN"]);
        let out = cmd.output().expect("run leaderrun");
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{name}:\n{log}");
        assert!(
            log.contains(&format!("{name} is set, but not to valid UTF-8 text")),
            "{name}:\n{log}"
        );
        assert!(out.stdout.is_empty(), "{name}: COMMAND ran:\n{log}");
    }
}

/// With no user named anywhere, the user is the name of the effective uid's password entry, as
/// libpq's; a uid without one (a container run as an arbitrary `--user`) is refused, as psql
/// refuses it ("local user with ID N does not exist"): exit 125, COMMAND never runs. Before,
/// leaderrun connected as `$USER`, else as `postgres`, and led there. Named by `PGUSER`, the
/// same uid connects and leads.
#[test]
fn a_uid_without_a_password_entry_is_refused_as_psql_refuses_it() {
    use crate::support::{leaderrun_as, output_of_copy, unique_lock_id, Cluster, Scratch};
    use std::os::unix::process::CommandExt;
    const TEST: &str = "libpq::a_uid_without_a_password_entry_is_refused_as_psql_refuses_it";
    const UID: u32 = 54_323;
    if !matches!(
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(UID)),
        Ok(None)
    ) {
        return crate::support::cluster::skip(TEST, "the uid has a password entry here");
    }
    let scratch = Scratch::new();
    let port = Cluster::shared().addr().port().to_string();
    let settings = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGDATABASE", "postgres"),
        ("HOME", "/nonexistent"),
        ("USER", "postgres"),
    ];
    for named in [false, true] {
        let Some(mut cmd) = leaderrun_as(&scratch, TEST, UID, (64, 64)) else {
            return;
        };
        cmd.envs(settings)
            .args(["--lock-id", &unique_lock_id().to_string(), "--once"])
            .args(["--", "echo", "led"]);
        if named {
            cmd.env("PGUSER", "postgres");
        }
        let out = output_of_copy(cmd.stdin(Stdio::null()));
        let log = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if named {
            assert_eq!(out.status.code(), Some(0), "{log}");
            assert_eq!(stdout, "led\n", "{log}");
        } else {
            assert_eq!(out.status.code(), Some(125), "{log}");
            assert!(
                log.contains(&format!("local user with ID {UID} does not exist")),
                "{log}"
            );
            assert_eq!(stdout, "", "COMMAND ran:\n{log}");
        }
    }
    // psql, as the same uid with the same settings, refuses too.
    let out = psql_with(settings)
        .uid(UID)
        .gid(UID)
        .output()
        .expect("run psql");
    assert_psql_refused(&out, format!("local user with ID {UID} does not exist"));
}

/// A service file that is there but cannot be read (`~/.pg_service.conf` or `PGSERVICEFILE`
/// owned by another user, as a secret mounted for root is to a container's arbitrary uid) is
/// an error, as libpq's ("service file ... not found"): exit 125, COMMAND never runs. Before,
/// leaderrun passed over it to the system-wide file (`PGSYSCONFDIR`) and took that file's
/// section of the same name, another server than psql's, and led there.
#[test]
fn an_unreadable_service_file_is_refused_not_passed_over() {
    use crate::support::{leaderrun_as, output_of_copy, unique_lock_id, Scratch};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const TEST: &str = "libpq::an_unreadable_service_file_is_refused_not_passed_over";
    const UID: u32 = 54_324;
    let scratch = Scratch::new();
    // The system-wide file's section reaches the suite's server: taking it is what would lead.
    let sys = scratch.path().join("sys");
    let home = scratch.path().join("home");
    for dir in [&sys, &home] {
        std::fs::create_dir(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let reached = plex_section();
    std::fs::write(sys.join("pg_service.conf"), &reached).unwrap();
    std::fs::set_permissions(
        sys.join("pg_service.conf"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // The user's own files: root's, mode 0600, out of the uid's reach.
    let unread = [home.join(".pg_service.conf"), home.join("services")];
    for file in &unread {
        std::fs::write(file, "[plex]\nhost=127.0.0.1\nport=1\n").unwrap();
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for (i, file) in unread.iter().enumerate() {
        let mut settings = vec![
            ("PGSERVICE", "plex".to_owned()),
            ("PGSYSCONFDIR", sys.display().to_string()),
            ("HOME", home.display().to_string()),
        ];
        if i == 1 {
            settings.push(("PGSERVICEFILE", file.display().to_string()));
        }
        let Some(mut cmd) = leaderrun_as(&scratch, TEST, UID, (64, 64)) else {
            return;
        };
        cmd.envs(settings.iter().map(|(k, v)| (k, v)))
            .args(["--lock-id", &unique_lock_id().to_string(), "--once"])
            .args(["--", "echo", "led"]);
        let out = output_of_copy(cmd.stdin(Stdio::null()));
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{}:\n{log}", file.display());
        assert!(
            log.contains(&format!("service file {} cannot be read", file.display())),
            "{log}"
        );
        assert!(out.stdout.is_empty(), "COMMAND ran:\n{log}");
        // psql, as the same uid with the same settings, refuses too.
        let out = psql_with(settings.iter().map(|(k, v)| (k, v)))
            .uid(UID)
            .gid(UID)
            .output()
            .expect("run psql");
        assert_psql_refused(
            &out,
            format!("service file \"{}\" not found", file.display()),
        );
    }
}

/// An empty `PGSYSCONFDIR` names the root directory, as libpq joins it
/// (`"%s/pg_service.conf"`: `/pg_service.conf`), not the working directory: before,
/// leaderrun read `./pg_service.conf`, took a section psql does not see, and led there.
#[test]
fn an_empty_pgsysconfdir_is_not_the_working_directory() {
    use crate::support::{leaderrun, unique_lock_id, Scratch};
    let scratch = Scratch::new();
    let service = plex_section();
    std::fs::write(scratch.path().join("pg_service.conf"), service).unwrap();
    let settings = [
        ("PGSERVICE", "plex"),
        ("PGSYSCONFDIR", ""),
        ("HOME", "/nonexistent"),
    ];
    let out = leaderrun()
        .current_dir(scratch.path())
        .envs(settings)
        .args(["--lock-id", &unique_lock_id().to_string(), "--once"])
        .args(["--", "echo", "led"])
        .stdin(Stdio::null())
        .output()
        .expect("run leaderrun");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{log}");
    assert!(
        log.contains("definition of service \"plex\" not found"),
        "{log}"
    );
    assert!(out.stdout.is_empty(), "COMMAND ran:\n{log}");
    let out = psql_with(settings)
        .current_dir(scratch.path())
        .output()
        .expect("run psql");
    assert_psql_refused(&out, "definition of service \"plex\" not found");
}

/// A service file's line of 1023 bytes or more (its newline counted) is refused, as libpq
/// refuses it ("line N too long in service file"), one byte shorter is read: before, leaderrun
/// read any length, and led through a service file psql refuses.
#[test]
fn a_service_file_line_too_long_for_libpq_is_refused() {
    use crate::support::{leaderrun, unique_lock_id, Scratch};
    let scratch = Scratch::new();
    let section = plex_section();
    // (file, whether libpq refuses it): a comment of N bytes with its newline, before the
    // section; a last line of N bytes without one.
    let comment = |n: usize| format!("#{}\n{section}", "x".repeat(n - 2));
    let last = |n: usize| format!("{section}fallback_application_name={}", "x".repeat(n - 26));
    let cases = [
        (comment(1022), false),
        (comment(1023), true),
        (comment(4000), true),
        (last(1022), false),
        (last(1023), true),
    ];
    for (i, (text, refused)) in cases.iter().enumerate() {
        let file = scratch.path().join(format!("services{i}"));
        std::fs::write(&file, text).unwrap();
        let settings = [
            ("PGSERVICE", "plex".to_owned()),
            ("PGSERVICEFILE", file.display().to_string()),
            ("HOME", "/nonexistent".to_owned()),
        ];
        let out = leaderrun()
            .envs(settings.iter().map(|(k, v)| (k, v)))
            .args(["--lock-id", &unique_lock_id().to_string(), "--once"])
            .args(["--", "echo", "led"])
            .stdin(Stdio::null())
            .output()
            .expect("run leaderrun");
        let log = String::from_utf8_lossy(&out.stderr);
        let psql = psql_with(settings.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run psql");
        let said = String::from_utf8_lossy(&psql.stderr);
        assert_eq!(psql.status.success(), !refused, "case {i}: psql:\n{said}");
        if *refused {
            assert_eq!(out.status.code(), Some(125), "case {i}:\n{log}");
            assert!(log.contains("too long"), "case {i}:\n{log}");
            assert!(out.stdout.is_empty(), "case {i}: COMMAND ran:\n{log}");
        } else {
            assert_eq!(out.status.code(), Some(0), "case {i}:\n{log}");
            assert_eq!(out.stdout, b"led\n", "case {i}:\n{log}");
        }
    }
}
