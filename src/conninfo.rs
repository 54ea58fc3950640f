//! Connection settings, resolved the way libpq resolves them (contract §1, FIELD-NOTES
//! PostgreSQL 11): tokio-postgres reads no environment, no `.pgpass`, no service file, and knows
//! only `disable|prefer|require`, so this module does it.
//!
//! Order, as libpq's:
//!
//! 1. the DSN: `--dsn`/`LEADERRUN_DSN`, else `PLEXSPHERE_DSN`, else `DATABASE_URL`; a
//!    `postgres://` / `postgresql://` URL or keyword/value pairs (`host=db user=app`);
//! 2. the service (`service=` in the DSN, else `PGSERVICE`) from `PGSERVICEFILE`, else
//!    `~/.pg_service.conf`, else `PGSYSCONFDIR/pg_service.conf`: fills what the DSN left out;
//! 3. the `PG*` variables: fill what is still missing;
//! 4. psql's defaults: the Unix socket in `/var/run/postgresql` (else `/tmp`), port 5432,
//!    user = the OS user, database = the user name, `sslmode=prefer`;
//!    `~/.postgresql/root.crt`, `postgresql.crt` and `postgresql.key` when they exist;
//! 5. with no password yet, the first matching line of `passfile`/`PGPASSFILE`, else
//!    `~/.pgpass`, which is ignored (with a WARN) unless only its owner can read it.
//!
//! Several hosts (`host=a,b port=5432,5433`) and `target_session_attrs` (`any`, `read-write`,
//! `primary`, `read-only`, `standby`) are passed on to tokio-postgres. Errors never repeat
//! the DSN, which may hold a password.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::config::{ChannelBinding, Host, TargetSessionAttrs};

use crate::tls::{SslMode, TlsSettings};

/// Environment variables consulted for the DSN, in order, when `--dsn` is not given
/// (`LEADERRUN_DSN` is read by the command line parser itself).
pub const DSN_ENV_CHAIN: [&str; 3] = ["LEADERRUN_DSN", "PLEXSPHERE_DSN", "DATABASE_URL"];

/// Keywords leaderrun understands, with the `PG*` variable that fills each.
const KEYWORDS: [(&str, Option<&str>); 22] = [
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
    ("sslrootcert", Some("PGSSLROOTCERT")),
    ("sslcert", Some("PGSSLCERT")),
    ("sslkey", Some("PGSSLKEY")),
    ("target_session_attrs", Some("PGTARGETSESSIONATTRS")),
    ("channel_binding", Some("PGCHANNELBINDING")),
    ("keepalives", None),
    ("keepalives_idle", None),
    ("keepalives_interval", None),
    ("keepalives_count", None),
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
    /// A keyword libpq knows but leaderrun does not use, or one nobody knows.
    #[error("invalid connection option {key:?} (from {origin})")]
    Option {
        /// The keyword.
        key: String,
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
    /// `service=NAME` names no section of the service files.
    #[error("definition of service {name:?} not found")]
    Service {
        /// The service name.
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
}

/// Where each setting came from, for error messages.
type Params = BTreeMap<String, (String, String)>;

fn percent_decode(text: &str, origin: &str) -> Result<String, ConnInfoError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ConnInfoError::Syntax {
                    origin: origin.to_owned(),
                    reason: "invalid percent-encoding".into(),
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConnInfoError::Syntax {
        origin: origin.to_owned(),
        reason: "percent-encoding is not UTF-8".into(),
    })
}

/// `postgres[ql]://[user[:password]@][host[:port][,...]][/dbname][?key=value&...]`
fn parse_url(url: &str, origin: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .unwrap_or(url);
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut out = Vec::new();
    let hostspec = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                out.push(("user".into(), percent_decode(user, origin)?));
            }
            if let Some(p) = password {
                out.push(("password".into(), percent_decode(p, origin)?));
            }
            hosts
        }
        None => authority,
    };
    if !hostspec.is_empty() {
        let (mut hosts, mut ports) = (Vec::new(), Vec::new());
        for spec in hostspec.split(',') {
            let (host, port) = if let Some(v6) = spec.strip_prefix('[') {
                let (h, after) = v6.split_once(']').ok_or_else(|| ConnInfoError::Syntax {
                    origin: origin.to_owned(),
                    reason: "unterminated [IPv6 address]".into(),
                })?;
                (h.to_owned(), after.strip_prefix(':').unwrap_or(""))
            } else {
                match spec.split_once(':') {
                    Some((h, p)) => (percent_decode(h, origin)?, p),
                    None => (percent_decode(spec, origin)?, ""),
                }
            };
            hosts.push(host);
            ports.push(port.to_owned());
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            out.push(("host".into(), hosts.join(",")));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            out.push(("port".into(), ports.join(",")));
        }
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        out.push(("dbname".into(), percent_decode(db, origin)?));
    }
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| ConnInfoError::Syntax {
            origin: origin.to_owned(),
            reason: format!(
                "query parameter without '=': {:?}",
                pair.split(':').next().unwrap_or("")
            ),
        })?;
        out.push((percent_decode(k, origin)?, percent_decode(v, origin)?));
    }
    Ok(out)
}

/// `key=value key='quoted \' value'`
fn parse_keywords(text: &str, origin: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let syntax = |reason: &str| ConnInfoError::Syntax {
        origin: origin.to_owned(),
        reason: reason.to_owned(),
    };
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(syntax(&format!("missing \"=\" after {key:?}")));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(syntax("unterminated quoted string")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                if c == '\\' {
                    chars.next();
                    value.extend(chars.next());
                } else {
                    value.push(c);
                    chars.next();
                }
            }
        }
        out.push((key, value));
    }
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from).or_else(|| {
        nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map(|u| u.dir)
    })
}

/// The `[name]` section of the first service file that has one.
fn service_section(
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut files = Vec::new();
    if let Some(file) = env("PGSERVICEFILE") {
        files.push(PathBuf::from(file));
    } else if let Some(home) = home() {
        files.push(home.join(".pg_service.conf"));
    }
    let sysconf = env("PGSYSCONFDIR").unwrap_or_else(|| "/etc/postgresql-common".to_owned());
    files.push(Path::new(&sysconf).join("pg_service.conf"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut inside = false;
        let mut found = false;
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                inside = section == name;
                found |= inside;
                continue;
            }
            if inside {
                if let Some((k, v)) = line.split_once('=') {
                    out.push((k.trim().to_owned(), v.trim().to_owned()));
                }
            }
        }
        if found {
            return Ok(out);
        }
    }
    Err(ConnInfoError::Service {
        name: name.to_owned(),
    })
}

/// One field of a `.pgpass` line, with `\:` and `\\` unescaped; `*` matches anything.
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// The password for (host, port, dbname, user) from a password file, libpq's rules: the first
/// matching line wins; `*` matches anything; a Unix-socket host matches `localhost`. The file
/// is ignored, with a WARN, unless only its owner can read and write it.
pub fn pgpass_lookup(
    file: &Path,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            file = %file.display(),
            "password file has group or world access; permissions should be u=rw (0600) or less: ignored"
        );
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    let host = if host.starts_with('/') {
        "localhost"
    } else {
        host
    };
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f = pgpass_fields(line);
        if f.len() < 5 {
            continue;
        }
        let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        if matches(&f[0], host)
            && matches(&f[1], port)
            && matches(&f[2], dbname)
            && matches(&f[3], user)
        {
            return Some(f[4..].join(":"));
        }
    }
    None
}

fn insert_all(
    params: &mut Params,
    pairs: Vec<(String, String)>,
    origin: &str,
    only_missing: bool,
) -> Result<(), ConnInfoError> {
    for (key, value) in pairs {
        if !KEYWORDS.iter().any(|(k, _)| *k == key) {
            return Err(ConnInfoError::Option {
                key,
                origin: origin.to_owned(),
            });
        }
        if only_missing && params.contains_key(&key) {
            continue;
        }
        params.insert(key, (value, origin.to_owned()));
    }
    Ok(())
}

/// Resolves the connection settings (module docs for the order).
///
/// `dsn` is `--dsn` or `LEADERRUN_DSN`; `env` looks up an environment variable (injected so
/// tests need not touch the process environment); empty values count as unset.
///
/// # Errors
/// [`ConnInfoError`] when the DSN, the service or a setting cannot be used.
pub fn resolve(
    dsn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
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
    if let Some(dsn) = &dsn {
        let url = dsn.starts_with("postgres://") || dsn.starts_with("postgresql://");
        if !url && (dsn.contains("://") || !dsn.contains('=')) {
            return Err(ConnInfoError::Form { origin });
        }
        let pairs = if url {
            parse_url(dsn, &origin)?
        } else {
            parse_keywords(dsn, &origin)?
        };
        insert_all(&mut params, pairs, &origin, false)?;
    }
    let service = params
        .get("service")
        .map(|(v, _)| v.clone())
        .or_else(|| get("PGSERVICE"));
    if let Some(name) = service {
        let pairs = service_section(&name, &|k| get(k))?;
        insert_all(&mut params, pairs, &format!("service {name}"), true)?;
    }
    for (key, var) in KEYWORDS {
        if let Some(var) = var {
            if !params.contains_key(key) {
                if let Some(value) = get(var) {
                    params.insert(key.to_owned(), (value, var.to_owned()));
                }
            }
        }
    }
    build(params, &|k| get(k))
}

fn build(
    mut params: Params,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConnSettings, ConnInfoError> {
    let value_err = |key: &str, params: &Params, reason: String| ConnInfoError::Value {
        key: key.to_owned(),
        origin: params.get(key).map(|(_, o)| o.clone()).unwrap_or_default(),
        reason,
    };
    let take = |params: &Params, key: &str| params.get(key).map(|(v, _)| v.clone());
    let mut config = tokio_postgres::Config::new();

    let hosts: Vec<String> = match take(&params, "host") {
        Some(h) => h.split(',').map(str::to_owned).collect(),
        None => vec![default_socket_dir().to_owned()],
    };
    for host in &hosts {
        config.host(if host.is_empty() {
            default_socket_dir()
        } else {
            host
        });
    }
    if let Some(addrs) = take(&params, "hostaddr") {
        for addr in addrs.split(',') {
            let ip = addr.parse().map_err(|_| {
                value_err(
                    "hostaddr",
                    &params,
                    format!("{addr:?} is not an IP address"),
                )
            })?;
            config.hostaddr(ip);
        }
    }
    let ports: Vec<String> = take(&params, "port")
        .map(|p| p.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    for port in &ports {
        let port = if port.is_empty() { "5432" } else { port };
        let parsed = port
            .parse::<u16>()
            // The value is not repeated: in a malformed URL it may be part of the password.
            .map_err(|_| value_err("port", &params, "not a port number".to_owned()))?;
        config.port(parsed);
    }
    let user = take(&params, "user").unwrap_or_else(os_user);
    config.user(&user);
    let database_from = match params.get("dbname").map(|(_, origin)| origin.as_str()) {
        None => "default",
        Some("PGDATABASE") => "PGDATABASE",
        Some(origin) if origin.starts_with("service ") => "service",
        Some(_) => "dsn",
    };
    let dbname = take(&params, "dbname").unwrap_or_else(|| user.clone());
    config.dbname(&dbname);
    if let Some(options) = take(&params, "options") {
        config.options(options);
    }
    let app = take(&params, "application_name")
        .or_else(|| take(&params, "fallback_application_name"))
        .unwrap_or_else(default_application_name);
    config.application_name(app);
    if let Some(secs) = take(&params, "connect_timeout") {
        let parsed = secs.trim().parse::<i64>().map_err(|_| {
            value_err(
                "connect_timeout",
                &params,
                format!("{secs:?} is not a number of seconds"),
            )
        })?;
        // libpq: zero or negative waits forever (leaderrun then bounds by the check interval);
        // below 2 s counts as 2 s.
        if parsed > 0 {
            config.connect_timeout(Duration::from_secs(parsed.max(2) as u64));
        }
    }
    if let Some(attrs) = take(&params, "target_session_attrs") {
        let attrs = match attrs.as_str() {
            "any" => TargetSessionAttrs::Any,
            "read-write" | "primary" => TargetSessionAttrs::ReadWrite,
            "read-only" | "standby" => TargetSessionAttrs::ReadOnly,
            other => {
                return Err(value_err(
                    "target_session_attrs",
                    &params,
                    format!(
                        "{other:?} is not supported (any, read-write, primary, read-only, standby)"
                    ),
                ))
            }
        };
        config.target_session_attrs(attrs);
    }
    if let Some(binding) = take(&params, "channel_binding") {
        let binding = match binding.as_str() {
            "disable" => ChannelBinding::Disable,
            "prefer" => ChannelBinding::Prefer,
            "require" => ChannelBinding::Require,
            other => return Err(value_err("channel_binding", &params, format!("{other:?}"))),
        };
        config.channel_binding(binding);
    }
    if let Some(k) = take(&params, "keepalives") {
        config.keepalives(k != "0");
    }

    let tls_file = |params: &mut Params, key: &str, default: &str| -> Option<PathBuf> {
        match params.remove(key) {
            Some((v, _)) => Some(PathBuf::from(v)),
            None => home()
                .map(|h| h.join(".postgresql").join(default))
                .filter(|p| p.is_file()),
        }
    };
    let mode = match take(&params, "sslmode") {
        Some(m) => m
            .parse::<SslMode>()
            .map_err(|e| value_err("sslmode", &params, e))?,
        None => SslMode::Prefer,
    };
    let root_cert = tls_file(&mut params, "sslrootcert", "root.crt");
    let client_cert = tls_file(&mut params, "sslcert", "postgresql.crt");
    let client_key = tls_file(&mut params, "sslkey", "postgresql.key");
    let tls = TlsSettings {
        mode,
        root_cert: if mode == SslMode::Disable {
            None
        } else {
            root_cert
        },
        client_cert,
        client_key,
    };
    config.ssl_mode(tls.driver_mode());

    let mut password_from = params.get("password").map(|(_, origin)| origin.clone());
    match take(&params, "password") {
        Some(password) => {
            config.password(password);
        }
        None => {
            let file = take(&params, "passfile")
                .map(PathBuf::from)
                .or_else(|| home().map(|h| h.join(".pgpass")));
            if let Some(file) = file {
                let port = ports
                    .first()
                    .map(String::as_str)
                    .filter(|p| !p.is_empty())
                    .unwrap_or("5432");
                let host = hosts.first().map(String::as_str).unwrap_or("");
                let _ = env;
                if let Some(password) = pgpass_lookup(&file, host, port, &dbname, &user) {
                    config.password(password);
                    password_from = Some(file.display().to_string());
                }
            }
        }
    }
    Ok(ConnSettings {
        config,
        tls,
        database_from,
        password_from,
    })
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

/// A compact, space-free name of where `config` connects, for log fields:
/// `USER@HOST:PORT/DBNAME` (several hosts joined by commas), never the password.
pub fn endpoint(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]"),
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{}:{port}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
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

    fn no_home() -> Vec<(&'static str, &'static str)> {
        // No ~/.pgpass, ~/.pg_service.conf or ~/.postgresql of the machine running the tests.
        vec![
            ("PGSERVICEFILE", "/nonexistent"),
            ("PGSYSCONFDIR", "/nonexistent"),
        ]
    }

    fn resolve_with(
        dsn: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<ConnSettings, ConnInfoError> {
        let mut all = no_home();
        all.extend_from_slice(vars);
        let e = env(&all);
        resolve(dsn, &e)
    }

    /// psql's documented behaviour, one row per case: DSN, environment, expected description.
    #[test]
    fn resolution_table() {
        type Case<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            (
                Some("postgres://app@db.example:6543/plexsphere"),
                &[],
                "host=db.example port=6543 dbname=plexsphere user=app",
            ),
            (
                Some("postgresql://db/x"),
                &[("PGUSER", "u")],
                "host=db port=5432 dbname=x user=u",
            ),
            (
                Some("postgresql:///x?host=%2Fvar%2Frun%2Fpostgresql"),
                &[("PGUSER", "u")],
                "host=/var/run/postgresql port=5432 dbname=x user=u",
            ),
            (
                Some("postgresql://%2Ftmp:5433/x"),
                &[("PGUSER", "u")],
                "host=/tmp port=5433 dbname=x user=u",
            ),
            (
                Some("postgresql://a:5432,b:5433/x?user=u"),
                &[],
                "host=a,b port=5432,5433 dbname=x user=u",
            ),
            (
                Some("postgresql://[::1]:5433/x?user=u"),
                &[],
                "host=::1 port=5433 dbname=x user=u",
            ),
            (
                Some("host=h dbname='my db' user=u"),
                &[],
                "host=h port=5432 dbname=my db user=u",
            ),
            (
                Some("host = h  user=u"),
                &[("PGDATABASE", "envdb"), ("PGPORT", "7777")],
                "host=h port=7777 dbname=envdb user=u",
            ),
            (
                None,
                &[("PGHOST", "envhost"), ("PGUSER", "alice")],
                "host=envhost port=5432 dbname=alice user=alice",
            ),
            (
                None,
                &[
                    ("PLEXSPHERE_DSN", "host=plex user=u"),
                    ("DATABASE_URL", "host=url user=u"),
                ],
                "host=plex port=5432 dbname=u user=u",
            ),
            (
                None,
                &[("PLEXSPHERE_DSN", ""), ("DATABASE_URL", "host=url user=u")],
                "host=url port=5432 dbname=u user=u",
            ),
        ];
        for (dsn, vars, expected) in cases {
            let got = resolve_with(*dsn, vars).unwrap_or_else(|e| panic!("{dsn:?}: {e}"));
            assert_eq!(describe(&got.config), *expected, "{dsn:?} {vars:?}");
        }
    }

    #[test]
    fn dsn_fields_win_and_the_environment_fills_the_rest() {
        let c = resolve_with(
            Some("postgres://app@db/x"),
            &[("PGUSER", "envuser"), ("PGPASSWORD", "s3cret")],
        )
        .unwrap();
        assert_eq!(c.config.get_user(), Some("app"));
        assert_eq!(c.config.get_password(), Some(&b"s3cret"[..]));
        let c = resolve_with(Some("postgres://u:p%40ss@db/x"), &[]).unwrap();
        assert_eq!(c.config.get_password(), Some(&b"p@ss"[..]));
    }

    #[test]
    fn defaults_like_psql() {
        let c = resolve_with(None, &[("PGUSER", "alice")]).unwrap();
        let d = describe(&c.config);
        assert!(d.starts_with("host=/"), "{d}");
        assert!(c
            .config
            .get_application_name()
            .is_some_and(|a| a.starts_with("leaderrun@")));
        assert_eq!(c.tls.mode, SslMode::Prefer);
        let c = resolve_with(Some("host=h user=u application_name=mine"), &[]).unwrap();
        assert_eq!(c.config.get_application_name(), Some("mine"));
    }

    #[test]
    fn ssl_settings() {
        let c = resolve_with(
            Some("postgresql://h/x?user=u&sslmode=verify-full&sslrootcert=/r.pem&sslcert=/c.pem&sslkey=/k.pem"),
            &[],
        )
        .unwrap();
        assert_eq!(
            c.tls,
            TlsSettings {
                mode: SslMode::VerifyFull,
                root_cert: Some("/r.pem".into()),
                client_cert: Some("/c.pem".into()),
                client_key: Some("/k.pem".into()),
            }
        );
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        let c = resolve_with(Some("host=h user=u"), &[("PGSSLMODE", "verify-ca")]).unwrap();
        assert_eq!(c.tls.mode, SslMode::VerifyCa);
        assert!(resolve_with(Some("host=h sslmode=sometimes"), &[]).is_err());
    }

    #[test]
    fn service_file_fills_what_the_dsn_leaves_out() {
        let dir = std::env::temp_dir().join(format!("leaderrun-svc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("services.conf");
        std::fs::write(&file, "# comment\n[other]\nhost=nope\n[plex]\nhost=svc-host\nport=6000\ndbname=svcdb\nuser=svcuser\n").unwrap();
        let f = file.to_str().unwrap();
        let c = resolve_with(Some("service=plex dbname=mine"), &[("PGSERVICEFILE", f)]).unwrap();
        assert_eq!(
            describe(&c.config),
            "host=svc-host port=6000 dbname=mine user=svcuser"
        );
        let c = resolve_with(None, &[("PGSERVICEFILE", f), ("PGSERVICE", "plex")]).unwrap();
        assert_eq!(
            describe(&c.config),
            "host=svc-host port=6000 dbname=svcdb user=svcuser"
        );
        let err = resolve_with(Some("service=missing"), &[("PGSERVICEFILE", f)]).unwrap_err();
        assert!(err.to_string().contains("service \"missing\" not found"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn where_the_database_and_the_password_came_from() {
        let c = resolve_with(Some("host=h user=u"), &[]).unwrap();
        assert_eq!((c.database_from, c.password_from), ("default", None));
        let c = resolve_with(Some("host=h user=u dbname=d password=p"), &[]).unwrap();
        assert_eq!(c.database_from, "dsn");
        assert_eq!(c.password_from.as_deref(), Some("--dsn"));
        let c = resolve_with(Some("postgres://u:p@h/d"), &[]).unwrap();
        assert_eq!(c.password_from.as_deref(), Some("--dsn"));
        // The same value in LEADERRUN_DSN came from the environment, not from argv.
        let c = resolve_with(
            Some("host=h user=u password=p"),
            &[("LEADERRUN_DSN", "host=h user=u password=p")],
        )
        .unwrap();
        assert_eq!(c.password_from.as_deref(), Some("LEADERRUN_DSN"));
        let c = resolve_with(
            Some("host=h user=u"),
            &[("PGDATABASE", "d"), ("PGPASSWORD", "p")],
        )
        .unwrap();
        assert_eq!(c.database_from, "PGDATABASE");
        assert_eq!(c.password_from.as_deref(), Some("PGPASSWORD"));
    }

    #[test]
    fn pgpass_rules() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("leaderrun-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:*:*:*:wrong\ndb:5432:app:u:first\ndb:*:*:u:second\nlocalhost:*:*:*:sock\\:et\n*:*:*:*:any\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let look = |h: &str, p: &str, d: &str, u: &str| pgpass_lookup(&file, h, p, d, u);
        assert_eq!(look("db", "5432", "app", "u").as_deref(), Some("first"));
        assert_eq!(look("db", "6000", "x", "u").as_deref(), Some("second"));
        assert_eq!(
            look("/var/run/postgresql", "5432", "x", "v").as_deref(),
            Some("sock:et")
        );
        assert_eq!(look("elsewhere", "1", "x", "v").as_deref(), Some("any"));
        // Through the resolver, with passfile= and with PGPASSFILE.
        let f = file.to_str().unwrap();
        let c = resolve_with(
            Some(&format!("host=db user=u dbname=app passfile={f}")),
            &[],
        )
        .unwrap();
        assert_eq!(c.config.get_password(), Some(&b"first"[..]));
        let c = resolve_with(Some("host=db user=u dbname=app"), &[("PGPASSFILE", f)]).unwrap();
        assert_eq!(c.config.get_password(), Some(&b"first"[..]));
        // An explicit password wins over the file.
        let c = resolve_with(
            Some("host=db user=u dbname=app password=given"),
            &[("PGPASSFILE", f)],
        )
        .unwrap();
        assert_eq!(c.config.get_password(), Some(&b"given"[..]));
        // Readable by others: ignored.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(look("db", "5432", "app", "u"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_never_echo_the_dsn() {
        for bad in [
            "nonsense",
            "mysql://u:hunter2@h/db",
            "postgres://u:hunter2@h:notaport/db",
            "postgres://postgres:hun/ter2@127.0.0.1/postgres",
            "postgres://postgres:hun?ter2@127.0.0.1/postgres",
            "host=h password=hunter2 frobnicate=1",
            "host=h password='hunter2",
        ] {
            let err = resolve_with(Some(bad), &[]).unwrap_err();
            let shown = crate::error::Chain(&err).to_string();
            assert!(shown.starts_with("invalid"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[test]
    fn endpoint_is_one_word() {
        let c = resolve_with(Some("postgresql://app:secret@db:6543/plexsphere"), &[]).unwrap();
        assert_eq!(endpoint(&c.config), "app@db:6543/plexsphere");
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
