//! Connection settings, resolved the way libpq resolves them
//! (docs/guarantees.md#database-and-connection-settings, see
//! docs/field-notes.md#tokio-postgres-is-not-libpq): tokio-postgres reads no environment, no
//! `.pgpass`, no service file, and knows only `disable|prefer|require`, so this module does it.
//!
//! Order, as libpq's:
//!
//! 1. the DSN: `--dsn`/`LEADERRUN_DSN`, else `PLEXSPHERE_DSN`, else `DATABASE_URL`; a
//!    `postgres://` / `postgresql://` URL or keyword/value pairs (`host=db user=app`);
//! 2. the service (`service=` in the DSN, else `PGSERVICE`) from `PGSERVICEFILE`, else
//!    `~/.pg_service.conf`, else `PGSYSCONFDIR/pg_service.conf`: fills what the DSN left out;
//! 3. the `PG*` variables: fill what is still missing;
//! 4. psql's defaults: the Unix socket in `/var/run/postgresql`, then `/tmp`, port 5432,
//!    user = the OS user (the effective uid's password entry; none is an error, as in psql),
//!    database = the user name, `sslmode=prefer`;
//!    `~/.postgresql/root.crt`, `postgresql.crt` and `postgresql.key` when they exist;
//! 5. with no password yet, for each host, the first matching line of `passfile`/`PGPASSFILE`,
//!    else `~/.pgpass`, which is ignored (with a WARN) unless only its owner can read it.
//!
//! An empty value is a set value, read as libpq reads it (`user=''` is the OS user,
//! `PGSSLMODE=` is invalid); an empty DSN variable is no DSN. The result is a
//! [`ConnectPlan`]: the hosts (`host`, `hostaddr`, `port` lists paired as libpq pairs them),
//! each with its own password, `target_session_attrs`, `load_balance_hosts` and
//! `connect_timeout`, which the elector's connect loop follows host by host
//! ([`crate::elector::connect`]). libpq keywords leaderrun does not implement are refused as
//! not supported. Errors never repeat the DSN, and quote none of its words when it holds a
//! password. README, Connecting, lists where leaderrun and libpq differ.
//!
//! # Layout
//!
//! * this module: the settings' types, [`resolve`] (the order above) and `build`, which turns
//!   the merged keywords into a [`ConnectPlan`] keyword by keyword, in libpq's order: long, but
//!   one ordered list of rules, read top to bottom;
//! * `syntax`: the DSN's URL and keyword/value syntaxes;
//! * `files`: the service file and the password file ([`pgpass_lookup`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::{ChannelBinding, Host};

use crate::pg::tls::{SslMode, TlsSettings};

mod files;
mod syntax;
#[cfg(test)]
mod tests;

use files::{home, service_section};
pub use files::{pgpass_lookup, pgpass_password};
use syntax::{parse_keywords, parse_url};

/// Environment variables consulted for the DSN, in order, when `--dsn` is not given
/// (`LEADERRUN_DSN` is read by the command line parser itself).
pub const DSN_ENV_CHAIN: [&str; 3] = ["LEADERRUN_DSN", "PLEXSPHERE_DSN", "DATABASE_URL"];

/// Keywords leaderrun understands, with the `PG*` variable that fills each.
const KEYWORDS: [(&str, Option<&str>); 25] = [
    ("host", Some("PGHOST")),
    ("hostaddr", Some("PGHOSTADDR")),
    ("port", Some("PGPORT")),
    ("dbname", Some("PGDATABASE")),
    ("user", Some("PGUSER")),
    ("password", Some("PGPASSWORD")),
    ("passfile", Some("PGPASSFILE")),
    ("service", Some("PGSERVICE")),
    ("options", Some("PGOPTIONS")),
    ("application_name", Some("PGAPPNAME")),
    ("fallback_application_name", None),
    ("connect_timeout", Some("PGCONNECT_TIMEOUT")),
    ("sslmode", Some("PGSSLMODE")),
    ("requiressl", Some("PGREQUIRESSL")),
    ("sslrootcert", Some("PGSSLROOTCERT")),
    ("sslcert", Some("PGSSLCERT")),
    ("sslkey", Some("PGSSLKEY")),
    ("target_session_attrs", Some("PGTARGETSESSIONATTRS")),
    ("load_balance_hosts", Some("PGLOADBALANCEHOSTS")),
    ("channel_binding", Some("PGCHANNELBINDING")),
    ("gssencmode", Some("PGGSSENCMODE")),
    ("keepalives", None),
    ("keepalives_idle", None),
    ("keepalives_interval", None),
    ("keepalives_count", None),
];

/// libpq keywords leaderrun does not implement: refused as "not supported" when a DSN, a
/// service or their variable ([`UNSUPPORTED_ENV`]) sets them, but to a value leaderrun's own
/// behaviour matches ([`harmless`]).
const UNSUPPORTED: [&str; 21] = [
    "sslnegotiation",
    "client_encoding",
    "tcp_user_timeout",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "requirepeer",
    "require_auth",
    "sslcompression",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslpassword",
    "sslcertmode",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "replication",
    "scram_client_key",
    "scram_server_key",
    "min_protocol_version",
    "max_protocol_version",
];

/// A connection string or setting that could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnInfoError {
    /// The DSN is neither a `postgres://` URL nor keyword/value pairs.
    #[error(
        "invalid DSN (from {origin}): expected a postgres:// or postgresql:// URL, \
         or keyword/value pairs like 'host=db user=app dbname=plexsphere'"
    )]
    Form {
        /// Where the DSN came from.
        origin: String,
    },
    /// The DSN is of the right form but does not parse.
    #[error("invalid DSN (from {origin}): {reason}")]
    Syntax {
        /// Where the DSN came from.
        origin: String,
        /// What is wrong (never the password).
        reason: String,
    },
    /// A keyword nobody knows (a typo). The keyword is shown only when the DSN holds no
    /// password: in a DSN that does, a stray word may be part of it.
    #[error("invalid connection option {key} (from {origin})")]
    Option {
        /// The keyword, quoted, or a note that it is not shown.
        key: String,
        /// Where it came from.
        origin: String,
    },
    /// A libpq keyword, or a value of one, that leaderrun does not implement.
    #[error("{what} is not supported by leaderrun (from {origin}; README: Connecting)")]
    Unsupported {
        /// The keyword, or `keyword=value`.
        what: String,
        /// Where it came from.
        origin: String,
    },
    /// A setting holds a value that cannot be used.
    #[error("invalid {key} (from {origin}): {reason}")]
    Value {
        /// The keyword.
        key: String,
        /// Where it came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// No setting names the database. The lock lives in one database, and psql's default
    /// (the user's name) differs from user to user and machine to machine, so a run refuses
    /// it rather than electing a leader in a database nobody chose.
    #[error(
        "no setting names the database, and the lock lives in one: set dbname in --dsn or \
         LEADERRUN_DSN (or PLEXSPHERE_DSN, DATABASE_URL), PGDATABASE, or a service \
         (service=NAME or PGSERVICE) whose section sets dbname"
    )]
    NoDatabase,
    /// No setting names the user, and the effective uid has no password entry to take the
    /// name from (libpq refuses this too, rather than guessing).
    #[error(
        "local user with ID {uid} {reason}, and no setting names the database user: set user \
         in --dsn or LEADERRUN_DSN (or PLEXSPHERE_DSN, DATABASE_URL), PGUSER, or a service"
    )]
    NoOsUser {
        /// The effective uid.
        uid: u32,
        /// `does not exist`, or why the lookup failed.
        reason: String,
    },
    /// `PGSERVICEFILE` names a file that does not exist (libpq refuses it too, rather than
    /// falling back to the system-wide file).
    #[error("service file {} not found (PGSERVICEFILE)", path.display())]
    ServiceFile {
        /// The file.
        path: PathBuf,
    },
    /// A service file that is there but cannot be read (no read permission): libpq refuses
    /// it ("service file ... not found") rather than reading the next file, whose section
    /// of the same name may name another server.
    #[error("service file {} cannot be read: {reason}", path.display())]
    ServiceFileUnreadable {
        /// The file.
        path: PathBuf,
        /// Why it could not be opened.
        reason: String,
    },
    /// `service=NAME` names no section of the service files.
    #[error("definition of service {name:?} not found")]
    Service {
        /// The service name.
        name: String,
    },
    /// A variable leaderrun reads (`PGHOST`, `LEADERRUN_DSN`, …) is set, but not to UTF-8
    /// text. libpq would use its bytes; taken as unset, it would make leaderrun connect
    /// elsewhere (the default socket instead of `PGHOST`'s server) and elect there.
    #[error("{name} is set, but not to valid UTF-8 text: fix or unset it")]
    NotUnicode {
        /// The variable's name.
        name: String,
    },
}

/// Resolved connection settings: tokio-postgres' part and the TLS part.
#[derive(Clone, Debug)]
pub struct ConnSettings {
    /// Everything tokio-postgres takes (its `sslmode` is derived from [`ConnSettings::tls`]).
    pub config: tokio_postgres::Config,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
    pub tls: TlsSettings,
    /// Where the database name came from, in one word: `dsn` (the DSN, from `--dsn` or a
    /// variable), `service`, `PGDATABASE`, or `default` (none was given, so it is the user's
    /// name, as with psql). Advisory locks are per database, so `default` deserves a second
    /// look (`leaderrun doctor` says so).
    pub database_from: &'static str,
    /// Where the password came from: `None` when there is none; `Some("--dsn")` when it is
    /// written into a DSN given on the command line, where every user of the machine can read
    /// it in `ps`; else the variable, service or password file it came from.
    pub password_from: Option<String>,
    /// Which setting gave the DSN: `--dsn`, `LEADERRUN_DSN`, `PLEXSPHERE_DSN` or
    /// `DATABASE_URL`; `None` when there is none (the `PG*` variables and a service alone).
    pub dsn_from: Option<String>,
}

/// How one host of the list is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket in this directory (`.s.PGSQL.PORT`); never TLS.
    Unix(PathBuf),
    /// TCP: to `addr` when `hostaddr` gave one (no name lookup), else to the addresses of
    /// `name`. `name` (when not empty) is also the name a `verify-full` certificate must have;
    /// without it the address is.
    Tcp {
        /// `host`; empty when only `hostaddr` was given.
        name: String,
        /// `hostaddr`.
        addr: Option<std::net::IpAddr>,
    },
}

/// One host of the list, with its own password (libpq looks up the password file per host).
#[derive(Clone)]
pub struct HostTarget {
    /// Where.
    pub address: Address,
    /// The TCP port, or the Unix socket's number.
    pub port: u16,
    /// The password for this host, if any (never shown: `Debug` leaves it out).
    pub password: Option<Vec<u8>>,
    /// Where this host's password is looked up again before each later connection, as
    /// libpq reads the password file at every connection: `None` when the password was given
    /// (`password`, `PGPASSWORD`), which no file overrides.
    pub passfile: Option<std::sync::Arc<Passfile>>,
}

impl PartialEq for HostTarget {
    /// The same host, port, password and password file entry (whether the file was read
    /// again is no part of it).
    fn eq(&self, other: &Self) -> bool {
        self.address == other.address
            && self.port == other.port
            && self.password == other.password
            && self.passfile.as_deref() == other.passfile.as_deref()
    }
}

impl Eq for HostTarget {}

impl std::fmt::Debug for HostTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTarget")
            .field("address", &self.address)
            .field("port", &self.port)
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .field("passfile", &self.passfile.as_ref().map(|p| &p.file))
            .finish()
    }
}

/// A host's entry in the password file: the file and the key its lines are matched with
/// ([`pgpass_password`]). The resolver read it once; a connection after the first reads it
/// again ([`Passfile::password_now`]), so a password rotated in the file (by an agent, a
/// mounted secret) is used without a restart, as psql would use it.
#[derive(Debug)]
pub struct Passfile {
    /// `passfile`, `PGPASSFILE`, else `~/.pgpass`.
    pub file: PathBuf,
    host: String,
    port: String,
    dbname: String,
    user: String,
    /// Whether the resolver's reading was used already (by the first connection).
    used: std::sync::atomic::AtomicBool,
    /// A reading is in flight (on a thread of its own): no second one starts meanwhile.
    reading: std::sync::atomic::AtomicBool,
    /// The last password read: used while a reading is in flight or took too long.
    last: std::sync::Mutex<Option<Vec<u8>>>,
}

impl PartialEq for Passfile {
    fn eq(&self, other: &Self) -> bool {
        (&self.file, &self.host, &self.port, &self.dbname, &self.user)
            == (
                &other.file,
                &other.host,
                &other.port,
                &other.dbname,
                &other.user,
            )
    }
}

impl Passfile {
    /// Whether this connection must read the file again: every one after the first (the
    /// first uses what the resolver read moments before, which keeps a one-shot's path free
    /// of a second reading).
    pub fn stale(&self) -> bool {
        self.used.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// The file's password for this host now (`None`: no line matches, or the file cannot
    /// be read), also kept as the last one read. Blocking file I/O: run it off the runtime's
    /// thread, after [`Passfile::begin_reading`] said so.
    pub fn password_now(&self) -> Option<Vec<u8>> {
        let now = pgpass_password(&self.file, &self.host, &self.port, &self.dbname, &self.user)
            .filter(|p| !p.is_empty());
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = now.clone();
        self.reading
            .store(false, std::sync::atomic::Ordering::Release);
        now
    }

    /// Whether the caller is to read the file now: false while another reading is in
    /// flight (one on a hung mount holds one thread, not one per connection).
    pub fn begin_reading(&self) -> bool {
        !self.reading.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// A reading that [`Passfile::begin_reading`] allowed never ran to its end (no thread
    /// for it, a panic): the next connection may start one.
    pub fn end_reading(&self) {
        self.reading
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// The last password read (the resolver's, until a later reading finished).
    pub fn last(&self) -> Option<Vec<u8>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `target_session_attrs`, with libpq 14's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SessionAttrs {
    /// Any server.
    #[default]
    Any,
    /// `SHOW transaction_read_only` is off.
    ReadWrite,
    /// `SHOW transaction_read_only` is on.
    ReadOnly,
    /// Not in recovery (`pg_is_in_recovery()` false), read-only by default or not.
    Primary,
    /// In recovery.
    Standby,
    /// A standby if any host is one, else any server.
    PreferStandby,
}

/// The connect loop's plan: the hosts in order, each tried once (its own timeout, password
/// and TLS decision), the first that suits [`SessionAttrs`] wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectPlan {
    /// The hosts; empty: the tokio-postgres configuration's hosts (tests build those).
    pub hosts: Vec<HostTarget>,
    /// `target_session_attrs`.
    pub attrs: SessionAttrs,
    /// `load_balance_hosts=random`: try the hosts in a random order.
    pub random_order: bool,
    /// `connect_timeout`, per host (libpq's meaning); `None`: the caller's bound.
    pub connect_timeout: Option<Duration>,
}

/// Where each setting came from, for error messages.
type Params = BTreeMap<String, (String, String)>;

/// The variables of [`UNSUPPORTED`] keywords, as libpq reads them.
const UNSUPPORTED_ENV: [(&str, &str); 16] = [
    ("client_encoding", "PGCLIENTENCODING"),
    ("krbsrvname", "PGKRBSRVNAME"),
    ("gsslib", "PGGSSLIB"),
    ("gssdelegation", "PGGSSDELEGATION"),
    ("requirepeer", "PGREQUIREPEER"),
    ("require_auth", "PGREQUIREAUTH"),
    ("sslcompression", "PGSSLCOMPRESSION"),
    ("sslcrl", "PGSSLCRL"),
    ("sslcrldir", "PGSSLCRLDIR"),
    ("sslsni", "PGSSLSNI"),
    ("sslcertmode", "PGSSLCERTMODE"),
    ("ssl_min_protocol_version", "PGSSLMINPROTOCOLVERSION"),
    ("ssl_max_protocol_version", "PGSSLMAXPROTOCOLVERSION"),
    ("sslnegotiation", "PGSSLNEGOTIATION"),
    ("min_protocol_version", "PGMINPROTOCOLVERSION"),
    ("max_protocol_version", "PGMAXPROTOCOLVERSION"),
];

/// Whether an unsupported keyword's value asks for what leaderrun does anyway: UTF-8 as the
/// client encoding (tokio-postgres speaks nothing else), SNI on (rustls sends it), no TLS
/// compression, libpq's own negotiation, and a protocol range that holds 3.0, the one version
/// tokio-postgres speaks (libpq 18's values, its manual's "Parameter Key Words": `3.0`, `3.2`,
/// `latest`; any of them as the highest allows 3.0, only `3.0` as the lowest does).
fn harmless(key: &str, value: &str) -> bool {
    match key {
        "min_protocol_version" => value == "3.0",
        "max_protocol_version" => matches!(value, "3.0" | "3.2" | "latest"),
        "client_encoding" => matches!(value.to_ascii_uppercase().as_str(), "UTF8" | "UTF-8"),
        "sslsni" => value == "1",
        "sslcompression" => value == "0",
        "sslnegotiation" => value == "postgres",
        _ => false,
    }
}

fn insert_all(
    params: &mut Params,
    pairs: Vec<(String, String)>,
    origin: &str,
    only_missing: bool,
    shown: bool,
) -> Result<(), ConnInfoError> {
    for (key, value) in pairs {
        if UNSUPPORTED.contains(&key.as_str()) {
            if harmless(&key, &value) {
                continue;
            }
            return Err(ConnInfoError::Unsupported {
                what: format!("connection option {key:?}"),
                origin: origin.to_owned(),
            });
        }
        if !KEYWORDS.iter().any(|(k, _)| *k == key) {
            return Err(ConnInfoError::Option {
                key: if shown {
                    format!("{key:?}")
                } else {
                    "(not shown: the DSN holds a password)".to_owned()
                },
                origin: origin.to_owned(),
            });
        }
        if only_missing && params.contains_key(&key) {
            continue;
        }
        // libpq's conninfo_storeval: in a connection string the deprecated `requiressl` is
        // stored as `sslmode` (1… `require`, else `prefer`), so the later of the two wins.
        let (key, value) = if key == "requiressl" {
            let mode = if value.starts_with('1') {
                "require"
            } else {
                "prefer"
            };
            ("sslmode".to_owned(), mode.to_owned())
        } else {
            (key, value)
        };
        params.insert(key, (value, origin.to_owned()));
    }
    Ok(())
}

/// The variables that name a file or a directory: [`resolve_with_paths`] reads them as bytes,
/// never as text, since libpq takes a path's bytes as they are (psql connects with a `HOME`
/// that is not UTF-8, and so must leaderrun, though it needs no file there).
pub const PATH_VARIABLES: [&str; 4] = ["HOME", "PGPASSFILE", "PGSERVICEFILE", "PGSYSCONFDIR"];

/// Resolves the connection settings (module docs for the order): [`resolve_with_paths`] with
/// the [`PATH_VARIABLES`] looked up by `env` too.
///
/// # Errors
/// As [`resolve_with_paths`].
pub fn resolve(
    dsn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConnSettings, ConnInfoError> {
    resolve_with_paths(dsn, env, &|name| env(name).map(OsString::from))
}

/// Resolves the connection settings (module docs for the order).
///
/// `dsn` is `--dsn` or `LEADERRUN_DSN`; `env` looks up an environment variable as text, and
/// `paths` one of the [`PATH_VARIABLES`] as bytes (both injected so tests need not touch the
/// process environment); `env` is never asked for those. An empty DSN variable is no DSN; a
/// `PG*` variable set to the empty string is set, as libpq reads it (`PGSSLMODE=` is invalid).
///
/// # Errors
/// [`ConnInfoError`] when the DSN, the service or a setting cannot be used.
pub fn resolve_with_paths(
    dsn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    paths: &dyn Fn(&str) -> Option<OsString>,
) -> Result<ConnSettings, ConnInfoError> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    let (dsn, origin) = match dsn.filter(|d| !d.is_empty()) {
        // clap fills --dsn from LEADERRUN_DSN: only a value that differs from the variable
        // was typed on the command line (and is visible in `ps`).
        Some(d) if get(DSN_ENV_CHAIN[0]).as_deref() == Some(d) => {
            (Some(d.to_owned()), DSN_ENV_CHAIN[0].to_owned())
        }
        Some(d) => (Some(d.to_owned()), "--dsn".to_owned()),
        None => DSN_ENV_CHAIN[1..]
            .iter()
            .find_map(|name| get(name).map(|v| (Some(v), (*name).to_owned())))
            .unwrap_or((None, String::new())),
    };
    let mut params = Params::new();
    let mut shown = true;
    if let Some(dsn) = &dsn {
        let url = dsn.starts_with("postgres://") || dsn.starts_with("postgresql://");
        // As libpq: only those two prefixes make a URL, so a keyword value may hold `://`
        // (`application_name=http://x`, a password). Another scheme, or no `=` at all, is
        // refused here with the forms named (libpq would take it for a database name or
        // say "missing =").
        if !url && (other_scheme(dsn) || !dsn.contains('=')) {
            return Err(ConnInfoError::Form { origin });
        }
        // Whether words of the DSN may be quoted in errors: not when it may hold a password.
        shown = !(dsn.contains("password") || url && dsn.contains('@'));
        let pairs = if url {
            // Parsed, a URL's words are known: a password is a pair of its own
            // (`user:password@`, `?password=`, however percent-encoded), and a user alone
            // (`postgres://app@db/x`) leaves its keywords and values fit to quote.
            let pairs = parse_url(dsn, &origin)?;
            shown = !pairs.iter().any(|(k, _)| k == "password");
            pairs
        } else {
            parse_keywords(dsn, &origin, shown)?
        };
        insert_all(&mut params, pairs, &origin, false, shown)?;
    }
    // An empty name is a name, as libpq reads it (`service=''`, `PGSERVICE=`): the section
    // `[]`, else "definition of service \"\" not found", never no service at all.
    let service = match params.get("service") {
        Some((v, _)) => Some(v.clone()),
        None => env("PGSERVICE"),
    };
    if let Some(name) = service {
        let pairs = service_section(&name, paths)?;
        let shown = !pairs.iter().any(|(k, _)| k == "password");
        insert_all(&mut params, pairs, &format!("service {name}"), true, shown)?;
    }
    for (key, var) in UNSUPPORTED_ENV {
        if let Some(value) = get(var) {
            if !harmless(key, &value) && !params.contains_key(key) {
                return Err(ConnInfoError::Unsupported {
                    what: format!("{var} (connection option {key:?})"),
                    origin: var.to_owned(),
                });
            }
        }
    }
    for (key, var) in KEYWORDS {
        // `PGPASSFILE` is a path: `build` reads it as bytes.
        if let Some(var) = var.filter(|var| !PATH_VARIABLES.contains(var)) {
            if !params.contains_key(key) {
                if let Some(value) = env(var) {
                    params.insert(key.to_owned(), (value, var.to_owned()));
                }
            }
        }
    }
    let mut settings = build(params, paths, shown)?;
    settings.dsn_from = dsn.is_some().then_some(origin);
    Ok(settings)
}

/// Whether `dsn` begins with a URL scheme other than libpq's (`mysql://`, `postgis://`).
fn other_scheme(dsn: &str) -> bool {
    dsn.split_once("://").is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// A libpq integer setting (`parse_int_param`): C's white space around the digits is
/// allowed; a value that does not fit a C `int` is refused, as libpq refuses it ("invalid
/// integer value").
fn int_value(text: &str) -> Option<i64> {
    text.trim_matches(syntax::is_c_space)
        .parse::<i32>()
        .ok()
        .map(i64::from)
}

fn build(
    mut params: Params,
    paths: &dyn Fn(&str) -> Option<OsString>,
    shown: bool,
) -> Result<ConnSettings, ConnInfoError> {
    let value_err = |key: &str, params: &Params, reason: String| ConnInfoError::Value {
        key: key.to_owned(),
        origin: params.get(key).map(|(_, o)| o.clone()).unwrap_or_default(),
        reason,
    };
    // A value is quoted in an error only when the settings hold no password.
    let quote = |value: &str| {
        if shown {
            format!("{value:?}")
        } else {
            "the value".to_owned()
        }
    };
    let take = |params: &Params, key: &str| params.get(key).map(|(v, _)| v.clone());
    let nonempty = |params: &Params, key: &str| take(params, key).filter(|v| !v.is_empty());
    let mut config = tokio_postgres::Config::new();

    // Hosts, as libpq pairs `host`, `hostaddr` and `port` (connectOptions2).
    let addrs: Option<Vec<String>> =
        nonempty(&params, "hostaddr").map(|a| a.split(',').map(str::to_owned).collect());
    // As libpq (connectOptions2): the addresses, when given, count the hosts; an empty or
    // absent `host` is no list at all (every place then has no name), not a list of one.
    let names: Vec<String> = match nonempty(&params, "host") {
        Some(h) => h.split(',').map(str::to_owned).collect(),
        None => vec![String::new(); addrs.as_ref().map_or(1, Vec::len)],
    };
    // As libpq 15: a list of names, when given, is as long as the addresses' (empty names
    // will do).
    if let Some(addrs) = &addrs {
        if names.len() != addrs.len() {
            return Err(value_err(
                "hostaddr",
                &params,
                format!(
                    "could not match {} host names to {} hostaddr values",
                    names.len(),
                    addrs.len()
                ),
            ));
        }
    }
    let ports: Vec<String> = take(&params, "port")
        .map(|p| p.split(',').map(str::to_owned).collect())
        .unwrap_or_else(|| vec![String::new()]);
    if ports.len() != 1 && ports.len() != names.len() {
        return Err(value_err(
            "port",
            &params,
            format!(
                "could not match {} port numbers to {} hosts",
                ports.len(),
                names.len()
            ),
        ));
    }
    let mut targets = Vec::new();
    // The value is not repeated: in a malformed URL it may be part of the password.
    let bad_port = |params: &Params| value_err("port", params, "not a port number".to_owned());
    let shuffled = take(&params, "load_balance_hosts").as_deref() == Some("random");
    for (i, name) in names.iter().enumerate() {
        let raw_port = ports.get(i).unwrap_or(&ports[0]).clone();
        // libpq reads a host's port only when its turn comes (PQconnectPoll): a number out of
        // 1..=65535 passes the turn to the next host, text that is no number ends the attempt
        // there, so the hosts before it are tried. Refused up front only when no host would
        // be tried, or in a shuffled list (where libpq may come to it first).
        let port = if raw_port.is_empty() {
            5432
        } else {
            match int_value(&raw_port) {
                Some(p) if (1..=65535).contains(&p) => p as u16,
                Some(_) if !shuffled => continue,
                None if !shuffled && !targets.is_empty() => break,
                _ => return Err(bad_port(&params)),
            }
        };
        let addr = match addrs.as_ref().map(|a| a[i].as_str()) {
            Some("") | None => None,
            Some(a) => Some(a.parse::<std::net::IpAddr>().map_err(|_| {
                value_err(
                    "hostaddr",
                    &params,
                    // libpq hands the value to getaddrinfo, which also takes inet_aton's
                    // short, octal and hex forms (`127.1`, `010.0.0.1`) and an IPv6 zone
                    // (`fe80::1%eth0`); leaderrun does not (README, Connecting).
                    format!(
                        "{} is not an IP address leaderrun supports (four decimal parts, or \
                         IPv6 without a zone)",
                        quote(a)
                    ),
                )
            })?),
        };
        let addresses = match (addr, name.as_str()) {
            (Some(addr), _) => vec![Address::Tcp {
                name: name.clone(),
                addr: Some(addr),
            }],
            // No host: psql's default socket directory, then /tmp (`default_socket_dirs`),
            // tried in order as a list's hosts are.
            (None, "") => default_socket_dirs()
                .iter()
                .map(|dir| Address::Unix(PathBuf::from(dir)))
                .collect(),
            (None, n) if n.starts_with('/') => vec![Address::Unix(PathBuf::from(n))],
            // libpq 14 and later: a host that starts with `@` is a socket in Linux's abstract
            // namespace. Taken for a host name it failed its lookup, and in a list the next
            // host was tried: another server than psql's.
            (None, n) if n.starts_with('@') => {
                return Err(ConnInfoError::Unsupported {
                    what: "a host that starts with '@' (a Unix socket in the abstract namespace)"
                        .to_owned(),
                    origin: params
                        .get("host")
                        .map(|(_, o)| o.clone())
                        .unwrap_or_default(),
                })
            }
            (None, n) => vec![Address::Tcp {
                name: n.to_owned(),
                addr: None,
            }],
        };
        for address in addresses {
            match &address {
                Address::Unix(dir) => config.host_path(dir),
                Address::Tcp { name, addr } if name.is_empty() => {
                    config.host(addr.map(|a| a.to_string()).unwrap_or_default())
                }
                Address::Tcp { name, .. } => config.host(name),
            };
            config.port(port);
            // The password file's key for this host: the name, else the address; for the
            // default socket directories, `localhost` (libpq's key for its default host).
            let key = match (&address, name.as_str()) {
                (Address::Unix(_), "") => String::new(),
                (Address::Unix(dir), _) => dir.display().to_string(),
                (_, "") => addr.map(|a| a.to_string()).unwrap_or_default(),
                (_, n) => n.to_owned(),
            };
            targets.push((
                HostTarget {
                    address,
                    port,
                    password: None,
                    passfile: None,
                },
                key,
                raw_port.clone(),
            ));
        }
    }

    if targets.is_empty() {
        return Err(bad_port(&params));
    }
    let user = match nonempty(&params, "user") {
        Some(user) => user,
        None => os_user(nix::unistd::geteuid())?,
    };
    config.user(&user);
    let database_from = match params.get("dbname") {
        None => "default",
        Some((v, _)) if v.is_empty() => "default",
        Some((_, origin)) if origin == "PGDATABASE" => "PGDATABASE",
        Some((_, origin)) if origin.starts_with("service ") => "service",
        Some(_) => "dsn",
    };
    let dbname = nonempty(&params, "dbname").unwrap_or_else(|| user.clone());
    config.dbname(&dbname);
    if let Some(options) = nonempty(&params, "options") {
        config.options(options);
    }
    // An empty application_name is a setting, as libpq reads it (no fallback then), and is
    // not sent, as libpq sends none (build_startup_packet): the session gets the server's
    // default, which a role or database may set. An empty fallback is none.
    let app = take(&params, "application_name")
        .or_else(|| nonempty(&params, "fallback_application_name"))
        .unwrap_or_else(default_application_name);
    if !app.is_empty() {
        config.application_name(app);
    }
    let mut connect_timeout = None;
    if let Some(secs) = take(&params, "connect_timeout") {
        let parsed = int_value(&secs).ok_or_else(|| {
            value_err(
                "connect_timeout",
                &params,
                format!("{} is not a number of seconds", quote(&secs)),
            )
        })?;
        // libpq: zero or negative waits forever (leaderrun then bounds by the check interval);
        // below 2 s counts as 2 s. It bounds each host's attempt, not the list.
        if parsed > 0 {
            connect_timeout = Some(Duration::from_secs(parsed.max(2) as u64));
        }
    }
    let attrs = match take(&params, "target_session_attrs").as_deref() {
        None | Some("any") => SessionAttrs::Any,
        Some("read-write") => SessionAttrs::ReadWrite,
        Some("read-only") => SessionAttrs::ReadOnly,
        Some("primary") => SessionAttrs::Primary,
        Some("standby") => SessionAttrs::Standby,
        Some("prefer-standby") => SessionAttrs::PreferStandby,
        Some(other) => {
            return Err(value_err(
                "target_session_attrs",
                &params,
                format!(
                    "{} is not one of any, read-write, read-only, primary, standby, \
                     prefer-standby",
                    quote(other)
                ),
            ))
        }
    };
    let random_order = match take(&params, "load_balance_hosts").as_deref() {
        None | Some("disable") => false,
        Some("random") => true,
        Some(other) => {
            return Err(value_err(
                "load_balance_hosts",
                &params,
                format!("{} is not disable or random", quote(other)),
            ))
        }
    };
    match take(&params, "gssencmode").as_deref() {
        None | Some("disable") => {}
        Some(other) => {
            // Without the value (the settings hold a password) it is said in words: "the
            // value" after `gssencmode=` read as garbled.
            return Err(ConnInfoError::Unsupported {
                what: if shown {
                    format!("gssencmode={other:?}")
                } else {
                    "a gssencmode other than disable".to_owned()
                },
                origin: params["gssencmode"].1.clone(),
            });
        }
    }
    if let Some(binding) = take(&params, "channel_binding") {
        let binding = match binding.as_str() {
            "disable" => ChannelBinding::Disable,
            "prefer" => ChannelBinding::Prefer,
            "require" => ChannelBinding::Require,
            other => return Err(value_err("channel_binding", &params, quote(other))),
        };
        config.channel_binding(binding);
    }
    // libpq reads `keepalives` as an integer, 0 for off. The lock session's keepalives bound how
    // long a half-open session lives (README, Safety): off is refused, not quietly kept on.
    if let Some(k) = take(&params, "keepalives") {
        match int_value(&k) {
            None => {
                return Err(value_err(
                    "keepalives",
                    &params,
                    format!("{} is not a whole number", quote(&k)),
                ))
            }
            Some(0) => {
                return Err(ConnInfoError::Unsupported {
                    what: "keepalives=0 (the lock session's keepalives bound a half-open session)"
                        .to_owned(),
                    origin: params["keepalives"].1.clone(),
                })
            }
            Some(_) => {
                config.keepalives(true);
            }
        }
    }
    // Upper bounds on the lock session's client-side keepalives: the elector takes each where
    // it is shorter than its own (`pin_client_timers`), never a longer one, which would let a
    // half-open session outlive the safe window. Linux refuses 0 for all three, as libpq's
    // setsockopt then does.
    for key in ["keepalives_idle", "keepalives_interval", "keepalives_count"] {
        let Some(text) = take(&params, key) else {
            continue;
        };
        let n = int_value(&text)
            .filter(|n| (1..=32_767).contains(n))
            .ok_or_else(|| {
                value_err(
                    key,
                    &params,
                    format!("{} is not a whole number from 1 to 32767", quote(&text)),
                )
            })?;
        match key {
            "keepalives_idle" => config.keepalives_idle(Duration::from_secs(n as u64)),
            "keepalives_interval" => config.keepalives_interval(Duration::from_secs(n as u64)),
            _ => config.keepalives_retries(n as u32),
        };
    }

    let tls_file = |params: &mut Params, key: &str, default: &str| -> Option<PathBuf> {
        match params.remove(key).filter(|(v, _)| !v.is_empty()) {
            Some((v, _)) => Some(PathBuf::from(v)),
            None => home(paths)
                .map(|h| h.join(".postgresql").join(default))
                .filter(|p| p.is_file()),
        }
    };
    let root_cert = tls_file(&mut params, "sslrootcert", "root.crt");
    let system_roots = root_cert
        .as_deref()
        .is_some_and(|p| p == std::path::Path::new(crate::pg::tls::SYSTEM_ROOTS));
    let mode = match take(&params, "sslmode") {
        Some(m) if m == "allow" => {
            return Err(ConnInfoError::Unsupported {
                what: "sslmode=allow (use disable or prefer)".to_owned(),
                origin: params["sslmode"].1.clone(),
            })
        }
        Some(m) => m.parse::<SslMode>().map_err(|_| {
            value_err(
                "sslmode",
                &params,
                format!("{} is not a sslmode", quote(&m)),
            )
        })?,
        // The deprecated PGREQUIRESSL (libpq's conninfo_add_defaults; in a connection string
        // `requiressl` became `sslmode` above): a value starting with 1 is `require`.
        None if take(&params, "requiressl").is_some_and(|v| v.starts_with('1')) => SslMode::Require,
        // libpq 16: `sslrootcert=system` makes `verify-full` the default.
        None if system_roots => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    // libpq 16 refuses a weaker mode with the system's roots: a public CA vouches for names,
    // and a chain to it alone says nothing about which server this is.
    if system_roots && mode != SslMode::VerifyFull {
        return Err(value_err(
            "sslmode",
            &params,
            format!(
                "weaker sslmode {} may not be used with sslrootcert=system (use \"verify-full\")",
                quote(&take(&params, "sslmode").unwrap_or_else(|| "require".to_owned()))
            ),
        ));
    }
    // As libpq (initialize_SSL): a named root certificate that does not exist is an error
    // for `verify-ca` and `verify-full` (the path is kept, and reading it fails), and for the
    // other modes no root at all: TLS without a check, never a refusal of a session libpq
    // opens.
    let root_cert = root_cert.filter(|p| {
        system_roots || matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) || p.exists()
    });
    // As libpq: a client certificate that does not exist is none (and the key is then not
    // looked for); one that exists needs its key, the named one or
    // `~/.postgresql/postgresql.key`, and a missing key is an error ("certificate present, but
    // not private key file"), not a session without the certificate.
    let client_cert = tls_file(&mut params, "sslcert", "postgresql.crt").filter(|p| {
        !matches!(std::fs::metadata(p), Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR))
    });
    let client_key = match params.remove("sslkey").filter(|(v, _)| !v.is_empty()) {
        _ if client_cert.is_none() => None,
        Some((v, _)) => Some(PathBuf::from(v)),
        None => home(paths).map(|h| h.join(".postgresql").join("postgresql.key")),
    };

    // Passwords, per host: the explicit one, else each host's own line of the password file.
    let mut password_from = None;
    let explicit = nonempty(&params, "password");
    // `passfile=` of the DSN or the service, else `PGPASSFILE` (a path, bytes as they are), else
    // `~/.pgpass`; an empty one is the default, and a `passfile=''` given hides `PGPASSFILE`.
    let passfile = match params.get("passfile") {
        Some((file, _)) => Some(PathBuf::from(file)),
        None => paths("PGPASSFILE").map(PathBuf::from),
    }
    .filter(|file| !file.as_os_str().is_empty())
    .or_else(|| home(paths).map(|h| h.join(".pgpass")));
    let mut hosts = Vec::new();
    for (mut target, key, raw_port) in targets {
        if let Some(password) = &explicit {
            target.password = Some(password.clone().into_bytes());
            password_from = params.get("password").map(|(_, o)| o.clone());
        } else if let Some(file) = &passfile {
            let entry = Passfile {
                file: file.clone(),
                host: key,
                port: raw_port,
                dbname: dbname.clone(),
                user: user.clone(),
                used: std::sync::atomic::AtomicBool::new(false),
                reading: std::sync::atomic::AtomicBool::new(false),
                last: std::sync::Mutex::new(None),
            };
            entry
                .reading
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(password) = entry.password_now() {
                target.password = Some(password);
                password_from = Some(file.display().to_string());
            }
            target.passfile = Some(std::sync::Arc::new(entry));
        }
        hosts.push(target);
    }
    // No password in `config`: each attempt sets its own host's (libpq sends a host's
    // password file entry to that host only).
    let tls = TlsSettings {
        mode,
        root_cert: if mode == SslMode::Disable {
            None
        } else {
            root_cert
        },
        client_cert,
        client_key,
        plan: ConnectPlan {
            hosts,
            attrs,
            random_order,
            connect_timeout,
        },
    };
    config.ssl_mode(tls.driver_mode());
    if let Some(t) = connect_timeout {
        config.connect_timeout(t);
    }
    Ok(ConnSettings {
        config,
        tls,
        database_from,
        password_from,
        dsn_from: None,
    })
}

/// psql's default host: the Debian socket directory when it exists, else `/tmp`.
fn default_socket_dir() -> &'static str {
    default_socket_dirs()[0]
}

/// The socket directories tried, in order, when no setting names a host: the Debian socket
/// directory (psql's default there), then `/tmp` (libpq's default as built upstream), so a
/// server whose socket is in either is reached; only `/tmp` where the first does not exist.
fn default_socket_dirs() -> &'static [&'static str] {
    if std::path::Path::new("/var/run/postgresql").is_dir() {
        &["/var/run/postgresql", "/tmp"]
    } else {
        &["/tmp"]
    }
}

/// libpq's default user (`pg_fe_getauthname`): the name of `uid`'s (the effective uid's)
/// password entry. A uid without one (a container run as an arbitrary `--user`) is an error, as
/// psql's "local user with ID N does not exist": neither `$USER` nor `postgres` stands in.
fn os_user(uid: nix::unistd::Uid) -> Result<String, ConnInfoError> {
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => Ok(user.name),
        Ok(None) => Err(ConnInfoError::NoOsUser {
            uid: uid.as_raw(),
            reason: "does not exist".to_owned(),
        }),
        Err(e) => Err(ConnInfoError::NoOsUser {
            uid: uid.as_raw(),
            reason: format!("could not be looked up: {e}"),
        }),
    }
}

/// `leaderrun@HOST:PID`, cut to PostgreSQL's 63-byte `NAMEDATALEN` limit on a character
/// boundary, so `pg_stat_activity` shows which host leads
/// (docs/guarantees.md#database-and-connection-settings).
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

/// A compact, space-free name of where `config` connects, for log fields:
/// `USER@HOST:PORT/DBNAME`, several hosts joined by commas, each with its own port
/// (`app@db1:5432,db2:5433/plexsphere`); never the password.
pub fn endpoint(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            // libpq: one port for every host, or one per host.
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(name) => host_port(name, port),
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

/// [`endpoint`] of the one host of `config`'s list that a session reached: its name (or
/// `hostaddr` when it has none) and its port.
pub fn host_endpoint(config: &tokio_postgres::Config, host: &HostTarget) -> String {
    let place = match &host.address {
        Address::Unix(dir) => format!("{}:{}", dir.display(), host.port),
        Address::Tcp { name, addr } if name.is_empty() => {
            host_port(&addr.map(|a| a.to_string()).unwrap_or_default(), host.port)
        }
        Address::Tcp { name, .. } => host_port(name, host.port),
    };
    format!(
        "{}@{place}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// `HOST:PORT`, an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
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
