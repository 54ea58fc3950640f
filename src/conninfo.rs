//! Connection settings: where the DSN comes from, what psql-style defaults fill in, and how a
//! target is shown without its password (contract §1).
//!
//! Resolution order, as libpq does it: the DSN (URL or keyword/value form) wins for every field
//! it sets; a field it leaves out comes from the `PG*` environment variable; what is still
//! missing gets psql's default (Unix socket in `/var/run/postgresql`, else `/tmp`; port 5432;
//! user = the OS user; database = the user name).

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode};

/// Environment variables consulted for the DSN, in order, when `--dsn` is not given
/// (`LEADERRUN_DSN` is read by the command line parser itself).
pub const DSN_ENV_CHAIN: [&str; 3] = ["LEADERRUN_DSN", "PLEXSPHERE_DSN", "DATABASE_URL"];

/// A connection string that could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnInfoError {
    /// The DSN does not parse. The DSN itself is not repeated, since it may hold a password.
    #[error("invalid DSN (from {origin})")]
    Dsn {
        /// Where the DSN came from: `--dsn` or the environment variable's name.
        origin: String,
        /// The parser's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The DSN is neither a `postgres://` URL nor keyword/value pairs.
    #[error(
        "invalid DSN (from {origin}): expected a postgres:// or postgresql:// URL, \
         or keyword/value pairs like 'host=db user=app dbname=plexsphere'"
    )]
    Form {
        /// Where the DSN came from.
        origin: String,
    },
    /// A `PG*` variable holds a value that cannot be used.
    #[error("invalid {var}: {value:?}")]
    Env {
        /// The variable's name.
        var: &'static str,
        /// Its value (never a password variable).
        value: String,
    },
}

/// Resolves the connection settings from an explicit DSN (`--dsn` or `LEADERRUN_DSN`), then
/// `PLEXSPHERE_DSN`, then `DATABASE_URL`, then the `PG*` variables and psql's defaults.
///
/// `env` looks up an environment variable (injected so tests need not touch the process
/// environment); empty values count as unset.
///
/// # Errors
/// [`ConnInfoError`] when the DSN does not parse or a `PG*` variable is unusable.
pub fn resolve(
    dsn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<tokio_postgres::Config, ConnInfoError> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    let (dsn, origin) = match dsn.filter(|d| !d.is_empty()) {
        Some(d) => (Some(d.to_owned()), "--dsn".to_owned()),
        None => DSN_ENV_CHAIN[1..]
            .iter()
            .find_map(|name| get(name).map(|v| (Some(v), (*name).to_owned())))
            .unwrap_or((None, String::new())),
    };
    let mut config = match &dsn {
        Some(dsn) => {
            let url = dsn.starts_with("postgres://") || dsn.starts_with("postgresql://");
            if !url && (dsn.contains("://") || !dsn.contains('=')) {
                return Err(ConnInfoError::Form { origin });
            }
            tokio_postgres::Config::from_str(dsn)
                .map_err(|source| ConnInfoError::Dsn { origin, source })?
        }
        None => tokio_postgres::Config::new(),
    };

    if config.get_hosts().is_empty() {
        match get("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    config.host(host);
                }
            }
            None => {
                config.host(default_socket_dir());
            }
        }
    }
    if config.get_ports().is_empty() {
        if let Some(port) = get("PGPORT") {
            let parsed = port.parse::<u16>().map_err(|_| ConnInfoError::Env {
                var: "PGPORT",
                value: port.clone(),
            })?;
            config.port(parsed);
        }
    }
    let user = match config.get_user() {
        Some(user) => user.to_owned(),
        None => {
            let user = get("PGUSER").unwrap_or_else(os_user);
            config.user(&user);
            user
        }
    };
    if config.get_dbname().is_none() {
        config.dbname(get("PGDATABASE").unwrap_or(user));
    }
    if config.get_password().is_none() {
        if let Some(password) = get("PGPASSWORD") {
            config.password(password);
        }
    }
    if config.get_application_name().is_none() {
        config.application_name(get("PGAPPNAME").unwrap_or_else(default_application_name));
    }
    if config.get_connect_timeout().is_none() {
        if let Some(secs) = get("PGCONNECT_TIMEOUT") {
            let parsed = secs.parse::<u64>().map_err(|_| ConnInfoError::Env {
                var: "PGCONNECT_TIMEOUT",
                value: secs.clone(),
            })?;
            // libpq: zero or negative means wait forever; we then fall back to the interval.
            if parsed > 0 {
                // libpq treats values below 2 s as 2 s.
                config.connect_timeout(Duration::from_secs(parsed.max(2)));
            }
        }
    }
    if dsn.is_none() {
        if let Some(mode) = get("PGSSLMODE") {
            let mode = match mode.as_str() {
                "disable" => SslMode::Disable,
                "prefer" | "allow" => SslMode::Prefer,
                "require" => SslMode::Require,
                _ => {
                    return Err(ConnInfoError::Env {
                        var: "PGSSLMODE",
                        value: mode,
                    })
                }
            };
            config.ssl_mode(mode);
        }
    }
    Ok(config)
}

/// psql's default host: the Debian socket directory when it exists, else `/tmp`.
fn default_socket_dir() -> &'static str {
    if std::path::Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql"
    } else {
        "/tmp"
    }
}

fn os_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "postgres".to_owned())
}

/// `leaderrun@HOST:PID`, cut to PostgreSQL's 63-byte `NAMEDATALEN` limit on a character
/// boundary, so `pg_stat_activity` shows which host leads (contract §1).
pub fn default_application_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".to_owned());
    application_name(&host, std::process::id())
}

fn application_name(host: &str, pid: u32) -> String {
    const MAX: usize = 63;
    let suffix = format!(":{pid}");
    let prefix = "leaderrun@";
    let mut room = MAX - prefix.len() - suffix.len();
    while room > 0 && !host.is_char_boundary(room.min(host.len())) {
        room -= 1;
    }
    let host = &host[..room.min(host.len())];
    format!("{prefix}{host}{suffix}")
}

/// A one-line description of where `config` connects, without the password:
/// `host=H port=P dbname=D user=U` (several hosts joined by commas).
pub fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    let mut out = format!("host={}", hosts.join(","));
    if ports.is_empty() {
        // tokio-postgres' default, as libpq's.
        out.push_str(" port=5432");
    } else {
        out.push_str(&format!(" port={}", ports.join(",")));
    }
    if let Some(db) = config.get_dbname() {
        out.push_str(&format!(" dbname={db}"));
    }
    if let Some(user) = config.get_user() {
        out.push_str(&format!(" user={user}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn dsn_wins_over_env_chain_and_pg_vars() {
        let e = env(&[
            ("PLEXSPHERE_DSN", "host=other"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "s3cret"),
        ]);
        let c = resolve(Some("postgres://app@db.example:6543/plexsphere"), &e).unwrap();
        assert_eq!(
            describe(&c),
            "host=db.example port=6543 dbname=plexsphere user=app"
        );
        // A field the DSN leaves out still comes from the environment, as in libpq.
        assert_eq!(c.get_password(), Some(&b"s3cret"[..]));
    }

    #[test]
    fn env_chain_order() {
        let e = env(&[
            ("PLEXSPHERE_DSN", "host=plex user=u"),
            ("DATABASE_URL", "host=url user=u"),
        ]);
        assert!(describe(&resolve(None, &e).unwrap()).starts_with("host=plex port=5432 "));
        let e = env(&[("PLEXSPHERE_DSN", ""), ("DATABASE_URL", "host=url user=u")]);
        assert!(describe(&resolve(None, &e).unwrap()).starts_with("host=url "));
    }

    #[test]
    fn psql_defaults_without_dsn() {
        let e = env(&[("PGUSER", "alice"), ("PGPORT", "5433")]);
        let c = resolve(None, &e).unwrap();
        let d = describe(&c);
        assert!(d.starts_with("host=/"), "{d}");
        assert!(d.ends_with("port=5433 dbname=alice user=alice"), "{d}");
        assert!(c
            .get_application_name()
            .is_some_and(|a| a.starts_with("leaderrun@")));
    }

    #[test]
    fn dsn_application_name_is_kept() {
        let c = resolve(Some("host=h user=u application_name=mine"), &env(&[])).unwrap();
        assert_eq!(c.get_application_name(), Some("mine"));
    }

    #[test]
    fn bad_dsn_does_not_echo_it() {
        let err = resolve(Some("postgres://u:hunter2@h:notaport/db"), &env(&[])).unwrap_err();
        let shown = format!("{}", crate::error::Chain(&err));
        assert!(shown.starts_with("invalid DSN (from --dsn)"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn dsn_of_another_form_is_named_as_such() {
        for bad in ["nonsense", "mysql://u:p@h/db"] {
            let err = resolve(Some(bad), &env(&[])).unwrap_err();
            assert!(err
                .to_string()
                .contains("expected a postgres:// or postgresql:// URL"));
            assert!(!err.to_string().contains(":p@"));
        }
    }

    #[test]
    fn application_name_fits_namedatalen() {
        assert_eq!(application_name("web-1", 42), "leaderrun@web-1:42");
        let long = "h".repeat(100);
        let name = application_name(&long, 4_194_304);
        assert_eq!(name.len(), 63);
        assert!(name.ends_with(":4194304"));
        let multibyte = "ü".repeat(40);
        let name = application_name(&multibyte, 1);
        assert!(name.len() <= 63);
    }
}
