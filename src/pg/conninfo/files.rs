//! The files libpq reads: the connection service file (`pg_service.conf`, a section of
//! keyword/value lines) and the password file (`.pgpass`, `host:port:database:user:password`).

use std::path::{Path, PathBuf};

use super::syntax::syntax;
use super::{default_socket_dir, ConnInfoError};

pub(super) fn home(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    env("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
}

/// The `[name]` section of the first service file that has one, read as libpq reads it: a
/// line is `keyword=value` exactly (no blanks around `=`), a line without `=`, an unknown
/// keyword, `requiressl` and a nested `service=` are errors.
pub(super) fn service_section(
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut files = Vec::new();
    if let Some(file) = env("PGSERVICEFILE") {
        let file = PathBuf::from(file);
        if !file.exists() {
            return Err(ConnInfoError::ServiceFile { path: file });
        }
        files.push(file);
    } else if let Some(home) = home(env) {
        files.push(home.join(".pg_service.conf"));
    }
    let sysconf = env("PGSYSCONFDIR").unwrap_or_else(|| "/etc/postgresql-common".to_owned());
    files.push(Path::new(&sysconf).join("pg_service.conf"));
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let origin = || format!("service file {}", file.display());
        let mut inside = false;
        let mut found = false;
        let mut out = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(section) = line.strip_prefix('[') {
                if found {
                    break;
                }
                inside = section.strip_suffix(']') == Some(name);
                found |= inside;
                continue;
            }
            if inside {
                let Some((k, v)) = line.split_once('=') else {
                    return Err(syntax(
                        &origin(),
                        format!("line {} has no \"=\"", number + 1),
                    ));
                };
                if k == "service" {
                    return Err(syntax(
                        &origin(),
                        format!("line {}: nested service specifications", number + 1),
                    ));
                }
                // libpq turns the deprecated `requiressl` into `sslmode` only in a
                // connection string (conninfo_storeval); a service file's keywords are
                // looked up as they are, and libpq 15 calls this one a syntax error.
                if k == "requiressl" {
                    return Err(syntax(
                        &origin(),
                        format!(
                            "line {}: \"requiressl\" is read in a connection string only; \
                             write sslmode=require",
                            number + 1
                        ),
                    ));
                }
                out.push((k.to_owned(), v.to_owned()));
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

/// Whether the `.pgpass` field at the start of `line` matches `value`; returns the rest of
/// the line after the field's `:`. libpq's rules (`pwdfMatchesString`): `*` alone matches
/// anything, `\` escapes the next character (so `\*` is a star and `\:` a colon), and an
/// unescaped `:` ends the field once `value` is used up; before that it matches a `:` of
/// `value`, so `::1:5432:…` matches the host `::1` as libpq reads it.
pub(super) fn pgpass_field<'a>(line: &'a str, value: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut want = value.chars().peekable();
    let mut chars = line.char_indices();
    while let Some((_, c)) = chars.next() {
        let (c, escaped) = if c == '\\' {
            match chars.next() {
                Some((_, n)) => (n, true),
                None => return None,
            }
        } else {
            (c, false)
        };
        if c == ':' && !escaped && want.peek().is_none() {
            return Some(chars.as_str());
        }
        if want.next() != Some(c) {
            return None;
        }
    }
    None
}

/// The password for (host, port, dbname, user) from a password file, libpq's rules: the first
/// matching line wins (an empty password there is none); `*` alone matches anything; the
/// password ends at an unescaped `:`. `host` is the key libpq uses: the host name, else
/// `hostaddr`; the default socket directory (or no host) is `localhost`, another socket
/// directory its path. The file is ignored, with a WARN, unless only its owner can read it.
pub fn pgpass_lookup(
    file: &Path,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            file = %file.display(),
            "password file has group or world access; permissions should be u=rw (0600) or less: ignored"
        );
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    let host = if host.is_empty() || host == default_socket_dir() {
        "localhost"
    } else {
        host
    };
    let port = if port.is_empty() { "5432" } else { port };
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(rest) = pgpass_field(line, host)
            .and_then(|r| pgpass_field(r, port))
            .and_then(|r| pgpass_field(r, dbname))
            .and_then(|r| pgpass_field(r, user))
        else {
            continue;
        };
        let mut password = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                ':' => break,
                '\\' => match chars.next() {
                    Some(n) => password.push(n),
                    None => password.push('\\'),
                },
                c => password.push(c),
            }
        }
        return Some(password);
    }
    None
}
