//! The DSN's two syntaxes, as libpq reads them: a `postgres://` / `postgresql://` URL
//! (percent-decoded) and keyword/value pairs (`host=db user='a b'`).

use super::ConnInfoError;

pub(super) fn syntax(origin: &str, reason: impl Into<String>) -> ConnInfoError {
    ConnInfoError::Syntax {
        origin: origin.to_owned(),
        reason: reason.into(),
    }
}

/// C's `isspace` in the C locale, which libpq's parsers use: a blank, tab, newline, vertical
/// tab, form feed or carriage return. Not Unicode's white space: libpq keeps a no-break space
/// (U+00A0) inside a value (`user=u\u{a0}dbname=d` is one user name), so splitting there
/// would connect as another user, to another database.
pub(super) fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

pub(super) fn percent_decode(text: &str, origin: &str) -> Result<String, ConnInfoError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| syntax(origin, "invalid percent-encoding"))?;
            // libpq refuses `%00` ("forbidden value %00"): a C string ends there.
            if hex == 0 {
                return Err(syntax(
                    origin,
                    "forbidden value %00 in percent-encoded value",
                ));
            }
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| syntax(origin, "percent-encoding is not UTF-8"))
}

/// `postgres[ql]://[user[:password]@][host[:port][,...]][/dbname][?key=value&...]`, read as
/// libpq reads it: the user part ends at the first `@` that comes before any `/` (so a
/// password may hold `?`, `:` or `#`); an empty password is no password; an empty query
/// parameter (`?&&`) is refused, and so is an unencoded `@` after the user part (where
/// libpq would read part of a password as a host or database name).
pub(super) fn parse_url(url: &str, origin: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .unwrap_or(url);
    let mut out = Vec::new();
    let rest = match rest.find(['@', '/']) {
        Some(i) if rest.as_bytes()[i] == b'@' => {
            let userinfo = &rest[..i];
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                out.push(("user".into(), percent_decode(user, origin)?));
            }
            if let Some(p) = password.filter(|p| !p.is_empty()) {
                out.push(("password".into(), percent_decode(p, origin)?));
            }
            &rest[i + 1..]
        }
        _ => rest,
    };
    // An `@` left in the host part or the path is almost always a password's own `@` (or
    // `/`) written unencoded: libpq would take what follows for a host or a database name,
    // and every message naming the server would then show part of the password. Refused,
    // with how to write it (a database name holding `@` is written `%40` too).
    let path_end = rest.find('?').unwrap_or(rest.len());
    if rest[..path_end].contains('@') {
        return Err(syntax(
            origin,
            "an '@' after the user part: percent-encode a password's '@' as %40 and '/' as %2F \
             (a database name's '@' too)",
        ));
    }
    // The host list, scanned as libpq scans it: a bracketed host runs to its `]` whatever it
    // holds (`[/run/postgresql]` is a socket directory), any other to `:`, `/`, `?` or `,`,
    // and a port to `/`, `?` or `,`.
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    let mut rest = rest;
    loop {
        let (host, after) = if let Some(inner) = rest.strip_prefix('[') {
            let (h, after) = inner
                .split_once(']')
                .ok_or_else(|| syntax(origin, "unterminated [IPv6 address]"))?;
            // As libpq: `[]` is refused, not an empty host that PGHOST would fill.
            if h.is_empty() {
                return Err(syntax(origin, "IPv6 host address may not be empty"));
            }
            if !after.is_empty() && !after.starts_with([':', '/', '?', ',']) {
                return Err(syntax(origin, "unexpected text after [IPv6 address]"));
            }
            (h, after)
        } else {
            rest.split_at(rest.find([':', '/', '?', ',']).unwrap_or(rest.len()))
        };
        // libpq percent-decodes the whole host list, bracketed addresses too.
        hosts.push(percent_decode(host, origin)?);
        rest = after;
        match rest.strip_prefix(':') {
            Some(p) => {
                let (port, after) = p.split_at(p.find(['/', '?', ',']).unwrap_or(p.len()));
                ports.push(percent_decode(port, origin)?);
                rest = after;
            }
            None => ports.push(String::new()),
        }
        match rest.strip_prefix(',') {
            Some(next) => rest = next,
            None => break,
        }
    }
    // As libpq: a list is set when its text is not empty, so `h1,` is two hosts (the second
    // the default socket) and `h1:5433,h2:` two ports (the second 5432), and neither PGHOST
    // nor PGPORT fills them.
    let (hosts, ports) = (hosts.join(","), ports.join(","));
    if !hosts.is_empty() {
        out.push(("host".into(), hosts));
    }
    if !ports.is_empty() {
        out.push(("port".into(), ports));
    }
    let (path, query) = if let Some(r) = rest.strip_prefix('/') {
        match r.split_once('?') {
            Some((d, q)) => (Some(d), Some(q)),
            None => (Some(r), None),
        }
    } else {
        (None, rest.strip_prefix('?'))
    };
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        out.push(("dbname".into(), percent_decode(db, origin)?));
    }
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        let pairs: Vec<&str> = query.split('&').collect();
        for (i, pair) in pairs.iter().enumerate() {
            if pair.is_empty() {
                if i + 1 == pairs.len() {
                    continue;
                }
                return Err(syntax(origin, "empty query parameter ('&&')"));
            }
            // Neither part is shown: a malformed URL may carry a password here.
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| syntax(origin, "a query parameter without '='"))?;
            if k.is_empty() {
                return Err(syntax(origin, "a query parameter without a name"));
            }
            // libpq refuses a second `=` ("extra key/value separator"): a value that holds
            // one is written `%3D` (`options=-c%20search_path%3Dx`).
            if v.contains('=') {
                return Err(syntax(
                    origin,
                    "a query parameter with a second '=': percent-encode an '=' of its value \
                     as %3D",
                ));
            }
            let (k, v) = (percent_decode(k, origin)?, percent_decode(v, origin)?);
            // libpq's JDBC compatibility: `ssl=true` in a URL is `sslmode=require` (any other
            // `ssl` is an unknown keyword, as there).
            if k == "ssl" && v == "true" {
                out.push(("sslmode".to_owned(), "require".to_owned()));
                continue;
            }
            out.push((k, v));
        }
    }
    Ok(out)
}

/// `key=value key='quoted \' value'`. `shown` says whether a keyword may be quoted in an
/// error (not when the text may hold a password).
pub(super) fn parse_keywords(
    text: &str,
    origin: &str,
    shown: bool,
) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|&c| is_c_space(c)) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || is_c_space(c) {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|&c| is_c_space(c)) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(syntax(
                origin,
                if shown {
                    format!("missing \"=\" after {key:?}")
                } else {
                    "missing \"=\" after a keyword (not shown: the DSN holds a password)".to_owned()
                },
            ));
        }
        while chars.peek().is_some_and(|&c| is_c_space(c)) {
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
                    None => return Err(syntax(origin, "unterminated quoted string")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if is_c_space(c) {
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
