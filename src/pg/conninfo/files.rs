//! The files libpq reads: the connection service file (`pg_service.conf`, a section of
//! keyword/value lines) and the password file (`.pgpass`, `host:port:database:user:password`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::syntax::syntax;
use super::{default_socket_dir, ConnInfoError};

/// The home directory, as libpq finds it: `HOME` (its bytes, whatever they are: a path is no
/// text), else the effective uid's password entry. `paths` looks up a variable that names a
/// file or a directory.
pub(super) fn home(paths: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    paths("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
}

/// The length at which libpq (15, as psql 15 shows) refuses a service file's line ("line N too long in
/// service file"): its `fgets` buffer is 1024 bytes, and a line that fills it (1023 bytes,
/// the newline counted) is refused.
const SERVICE_LINE_MAX: usize = 1023;

/// The `[name]` section of the first service file that has one, read as libpq reads it: a
/// line is `keyword=value` exactly (no blanks around `=`), a line without `=`, an unknown
/// keyword, `requiressl` and a nested `service=` are errors. A section begins at a line that
/// starts with `[name]`, whatever follows the `]` (`[name] # comment`): libpq compares the
/// name and the `]` only, and a header it takes for the section must not send leaderrun to the
/// next file's section of that name (another server). An empty name is a name (`[]`), as
/// libpq reads `service=''`.
pub(super) fn service_section(
    name: &str,
    paths: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut files = Vec::new();
    if let Some(file) = paths("PGSERVICEFILE") {
        let file = PathBuf::from(file);
        if !file.exists() {
            return Err(ConnInfoError::ServiceFile { path: file });
        }
        files.push(file);
    } else if let Some(home) = home(paths) {
        files.push(home.join(".pg_service.conf"));
    }
    // Joined as libpq joins it (`"%s/pg_service.conf"`): an empty PGSYSCONFDIR is the root
    // directory's file, not one in the working directory.
    let mut sysconf = paths("PGSYSCONFDIR").unwrap_or_else(|| "/etc/postgresql-common".into());
    sysconf.push("/pg_service.conf");
    files.push(PathBuf::from(sysconf));
    for file in files {
        // As libpq (parseServiceOrFile): a file that is not there (its `stat` fails) is
        // passed over; one that is there but cannot be opened (no read permission, a socket)
        // is an error, never a reason to read the next file, whose section of that name
        // may name another server.
        if std::fs::metadata(&file).is_err() {
            continue;
        }
        let mut opened =
            std::fs::File::open(&file).map_err(|e| ConnInfoError::ServiceFileUnreadable {
                path: file.clone(),
                reason: e.to_string(),
            })?;
        // Bytes, as libpq reads it: a line that is not UTF-8 (a comment in Latin-1, another
        // service's value) must not make the whole file unread, which found no service or
        // the next file's. A read that fails ends the file where it failed, as libpq's
        // `fgets` does (a directory opens and reads as an empty file).
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut opened, &mut bytes);
        let origin = || format!("service file {}", file.display());
        let mut inside = false;
        let mut found = false;
        let mut out = Vec::new();
        for (number, raw) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
            // libpq reads a line into a buffer of 1024 bytes (`fgets`) and refuses one that
            // fills it, its newline counted: 1023 bytes or more, anywhere it reads, a comment
            // or another service's line too.
            if raw.len() >= SERVICE_LINE_MAX {
                return Err(syntax(&origin(), format!("line {} too long", number + 1)));
            }
            // libpq trims C's white space (a vertical tab and a form feed too).
            let c_space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0b;
            let start = raw.iter().position(|b| !c_space(b)).unwrap_or(raw.len());
            let end = raw
                .iter()
                .rposition(|b| !c_space(b))
                .map_or(start, |i| i + 1);
            let raw = &raw[start..end];
            if raw.is_empty() || raw.starts_with(b"#") {
                continue;
            }
            // A section header, compared as bytes, as libpq compares it (`strncmp` of the
            // name, then `]`): what follows the `]` plays no part.
            if let Some(section) = raw.strip_prefix(b"[") {
                if found {
                    break;
                }
                inside = section
                    .strip_prefix(name.as_bytes())
                    .is_some_and(|rest| rest.starts_with(b"]"));
                found |= inside;
                continue;
            }
            let Ok(line) = std::str::from_utf8(raw) else {
                if inside {
                    // One of the service's own settings: refused, not ignored, as a variable
                    // that is not UTF-8 is.
                    return Err(syntax(
                        &origin(),
                        format!("line {} is not UTF-8 text", number + 1),
                    ));
                }
                continue;
            };
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
/// anything, `\` escapes the next byte (so `\*` is a star and `\:` a colon), and an
/// unescaped `:` ends the field once `value` is used up; before that it matches a `:` of
/// `value`, so `::1:5432:…` matches the host `::1` as libpq reads it. Bytes, as libpq reads
/// the file: a line need not be UTF-8 text.
pub(super) fn pgpass_field<'a>(line: &'a [u8], value: &str) -> Option<&'a [u8]> {
    if let Some(rest) = line.strip_prefix(b"*:") {
        return Some(rest);
    }
    let mut want = value.bytes().peekable();
    let mut i = 0;
    while i < line.len() {
        let (c, escaped) = if line[i] == b'\\' {
            i += 1;
            match line.get(i) {
                Some(&n) => (n, true),
                None => return None,
            }
        } else {
            (line[i], false)
        };
        i += 1;
        if c == b':' && !escaped && want.peek().is_none() {
            return Some(&line[i..]);
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
/// As text; see [`pgpass_password`] for a password that is not UTF-8.
pub fn pgpass_lookup(
    file: &Path,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    pgpass_password(file, host, port, dbname, user).and_then(|p| String::from_utf8(p).ok())
}

/// [`pgpass_lookup`]'s password as the bytes the file holds. The file is read as libpq reads
/// it, line by line and as bytes: a line that is not UTF-8 (a comment or another host's
/// password in Latin-1) is matched like any other, and does not make the whole file unread
/// (which left a replica without the password psql finds). A password file that is not a
/// plain file (a directory, a FIFO, a device) is ignored with a WARN, as libpq warns.
pub fn pgpass_password(
    file: &Path,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<Vec<u8>> {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if !meta.is_file() {
        tracing::warn!(
            file = %file.display(),
            "password file is not a plain file: ignored"
        );
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            file = %file.display(),
            "password file has group or world access; permissions should be u=rw (0600) or less: ignored"
        );
        return None;
    }
    let mut reader = std::io::BufReader::new(std::fs::File::open(file).ok()?);
    let host = if host.is_empty() || host == default_socket_dir() {
        "localhost"
    } else {
        host
    };
    let port = if port.is_empty() { "5432" } else { port };
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        // Every carriage return and newline at the end, as libpq's `pg_strip_crlf` strips
        // them: a file converted to CRLF twice (`\r\r\n`) still gives the password.
        let mut line = line.as_slice();
        while let Some(rest) = line
            .strip_suffix(b"\n")
            .or_else(|| line.strip_suffix(b"\r"))
        {
            line = rest;
        }
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let Some(rest) = pgpass_field(line, host)
            .and_then(|r| pgpass_field(r, port))
            .and_then(|r| pgpass_field(r, dbname))
            .and_then(|r| pgpass_field(r, user))
        else {
            continue;
        };
        let mut password = Vec::new();
        let mut bytes = rest.iter();
        while let Some(&c) = bytes.next() {
            match c {
                b':' => break,
                b'\\' => match bytes.next() {
                    Some(&n) => password.push(n),
                    None => password.push(b'\\'),
                },
                c => password.push(c),
            }
        }
        return Some(password);
    }
}
