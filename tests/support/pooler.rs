//! A real PgBouncer in front of a test cluster, in transaction or session mode.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::cluster::Cluster;

pub struct Bouncer {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

fn binary() -> PathBuf {
    for candidate in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if std::path::Path::new(candidate).is_file() {
            return candidate.into();
        }
    }
    panic!("pgbouncer not found: install the pgbouncer package");
}

impl Bouncer {
    /// Starts PgBouncer with `pool_mode` (`transaction` or `session`) and `pool_size` server
    /// connections for the `postgres` database of `cluster`.
    pub fn start(cluster: &Cluster, pool_mode: &str, pool_size: u32) -> Bouncer {
        Bouncer::start_with(cluster, pool_mode, pool_size, "")
    }

    /// [`Bouncer::start`] with more lines of `[pgbouncer]` settings (`name = value\n` each).
    pub fn start_with(cluster: &Cluster, pool_mode: &str, pool_size: u32, more: &str) -> Bouncer {
        Bouncer::start_for(cluster, pool_mode, pool_size, more, &["postgres"])
    }

    /// [`Bouncer::start_with`] that lets in the roles `users` (each must exist on `cluster`;
    /// the pooler trusts them all).
    pub fn start_for(
        cluster: &Cluster,
        pool_mode: &str,
        pool_size: u32,
        more: &str,
        roles: &[&str],
    ) -> Bouncer {
        let dir = tempfile::Builder::new()
            .prefix("leaderrun-pgbouncer-")
            .tempdir_in("/tmp")
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("userlist.txt");
        let listed: String = roles
            .iter()
            .map(|user| format!("\"{user}\" \"\"\n"))
            .collect();
        std::fs::write(&users, listed).unwrap();
        std::fs::write(
            &ini,
            format!(
                "[databases]\npostgres = host=127.0.0.1 port={} dbname=postgres\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir = {}\n\
                 auth_type = trust\nauth_file = {}\npool_mode = {pool_mode}\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {}\n{more}",
                cluster.addr().port(),
                dir.path().display(),
                users.display(),
                dir.path().join("pgbouncer.log").display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(binary());
        cmd.arg(&ini).stdout(Stdio::null()).stderr(Stdio::null());
        // PgBouncer refuses to run as root.
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
            for path in [dir.path().to_owned(), ini.clone(), users.clone()] {
                std::os::unix::fs::chown(&path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                    .unwrap();
            }
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let child = cmd.spawn().expect("start pgbouncer");
        super::wait_for("pgbouncer to listen", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(|_| ())
        });
        Bouncer { dir, port, child }
    }

    /// A DSN through the pooler.
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Runs `sql` through the pooler with `cluster`'s `psql` and returns its output, trimmed
    /// (rows on lines, columns separated by `|`).
    pub fn sql(&self, cluster: &Cluster, sql: &str) -> String {
        let out = Command::new(cluster.psql_path())
            .args(["-X", "-q", "-A", "-t", "-d", &self.dsn(), "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A DSN through the pooler's Unix socket (in its own directory).
    pub fn unix_dsn(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.dir.path().display(),
            self.port
        )
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
