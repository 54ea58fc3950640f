//! Who holds a lock, as `pg_stat_activity` shows the session: shared by `leaderrun status` and
//! by a standby's INFO line about the holder.
//!
//! A leaderrun session is named `leaderrun@HOST:PID` ([`crate::pg::conninfo::default_application_name`])
//! unless its settings name it otherwise (`PGAPPNAME`, `application_name`), and every statement
//! it sends on its lock session carries `/* by=HOST:PID */` ([`identity_comment`]): after a
//! standby's leading comment (`/* leaderrun standby lock=C:I */`, which `status` finds standbys
//! by), before the leader's (`/* leaderrun term=N since=TS fencing_token=T */`), so that a
//! `track_activity_query_size` as small as 100 keeps who leads; so it is known whatever its
//! application name; all of these are read back here. Any other holder
//! (psql, the plexsphere API's own Elector) is a holder too, shown by its `application_name`.

use std::fmt;

/// A text column of another session in `pg_stat_activity` (`application_name`, `query`), as
/// the SQL of a `bytea` of its UTF-8 bytes, cut to its first 400 characters (only the leading
/// comments are read). Read it with [`activity_text`].
///
/// Read as text, such a column must be converted to the client's encoding (UTF8), and in a
/// `SQL_ASCII` database the server cannot: a stranger's bytes that are not UTF-8 fail the whole
/// statement (22021). So the server converts what it can (every other database encoding has a
/// UTF-8 form) and gives a `SQL_ASCII` database's bytes as they are, which are decoded lossily.
macro_rules! activity_bytes {
    ($column:literal) => {
        concat!(
            "pg_catalog.convert_to(pg_catalog.left(",
            $column,
            ", 400), CASE WHEN pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) \
             'SQL_ASCII' THEN 'SQL_ASCII' ELSE 'UTF8' END::pg_catalog.name)"
        )
    };
}
pub(crate) use activity_bytes;

/// A column read with `activity_bytes!` as text: bytes that are not UTF-8 (possible only in a
/// `SQL_ASCII` database) become U+FFFD.
pub fn activity_text(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(b).into_owned())
}

/// The host and leaderrun pid in an `application_name` of the form `leaderrun@HOST:PID`;
/// `None` for any other name.
pub fn parse_application_name(name: &str) -> Option<(String, u32)> {
    let rest = name.strip_prefix("leaderrun@")?;
    let (host, pid) = rest.rsplit_once(':')?;
    let pid = pid.parse().ok()?;
    (!host.is_empty()).then(|| (host.to_owned(), pid))
}

/// The comment that names this process in every statement of its lock session:
/// `/* by=HOST:PID */` (the host cut as in [`crate::pg::conninfo::default_application_name`]).
pub fn identity_comment() -> String {
    let name = crate::pg::conninfo::default_application_name();
    format!(
        "/* by={} */",
        name.strip_prefix("leaderrun@").unwrap_or(&name)
    )
}

/// The host and leaderrun pid an [`identity_comment`] in `query`'s leading comments names.
pub fn parse_identity_comment(query: &str) -> Option<(String, u32)> {
    // Only the leading comments: the rest is SQL text of ours, or a stranger's. The cut is
    // moved back to a character's start: a stranger's text may have any character there.
    let mut cut = query.len().min(400);
    while !query.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = &query[..cut];
    let start = head.find("/* by=")? + "/* by=".len();
    let rest = &head[start..];
    let (host, pid) = rest[..rest.find(" */")?].rsplit_once(':')?;
    let pid = pid.parse().ok()?;
    (!host.is_empty() && !host.contains(char::is_whitespace)).then(|| (host.to_owned(), pid))
}

/// Who a session is, if it is a leaderrun: by its `application_name`, else by the
/// [`identity_comment`] in its last statement (`pg_stat_activity.query`).
pub fn identify(application_name: Option<&str>, query: Option<&str>) -> Option<(String, u32)> {
    application_name
        .and_then(parse_application_name)
        .or_else(|| query.and_then(parse_identity_comment))
}

/// What the leader's check statement says about its term: `term`, `since`, `fencing_token`
/// from `/* leaderrun term=N since=TS fencing_token=T */`, after the [`identity_comment`]
/// that leads it (or before it, the order earlier builds sent).
///
/// `pg_stat_activity.query` keeps at most `track_activity_query_size` − 1 bytes (as little as
/// 99): a comment cut short gives the fields that are whole, those followed by a space, and
/// never a number that lost its last digits.
pub fn parse_check_comment(query: &str) -> (Option<u64>, Option<String>, Option<i64>) {
    let mut query = query.trim_start();
    if let Some(after) = query.strip_prefix("/* by=") {
        query = after
            .find(" */")
            .map_or("", |end| after[end + 3..].trim_start());
    }
    let Some(rest) = query.strip_prefix("/* leaderrun ") else {
        return (None, None, None);
    };
    let (mut term, mut since, mut token) = (None, None, None);
    let whole = match rest.find("*/") {
        Some(end) => &rest[..end],
        // Cut: only what a space ends is whole.
        None => rest
            .rsplit_once(char::is_whitespace)
            .map_or("", |(whole, _)| whole),
    };
    for field in whole.split_whitespace() {
        match field.split_once('=') {
            Some(("term", v)) => term = v.parse().ok(),
            Some(("since", v)) => since = Some(v.to_owned()),
            Some(("fencing_token", v)) => token = v.parse().ok(),
            _ => {}
        }
    }
    (term, since, token)
}

/// A session holding (or waiting for) a lock, in words: `leaderrun on HOST (pid PID)` or
/// `not leaderrun: application_name=NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Who<'a> {
    /// The session's `application_name`, when visible.
    pub application_name: Option<&'a str>,
    /// Its last statement (`pg_stat_activity.query`), when visible: a leaderrun is known by
    /// its [`identity_comment`] whatever its application name.
    pub query: Option<&'a str>,
}

impl Who<'_> {
    /// The host and pid of the leaderrun this session is, by its application name or else
    /// its [`identity_comment`]; `None` for a session that is not leaderrun's.
    pub fn leaderrun(&self) -> Option<(String, u32)> {
        self.application_name
            .and_then(parse_application_name)
            .or_else(|| self.query.and_then(parse_identity_comment))
    }

    /// Whether this session is this process's own (the host and pid of its
    /// [`identity_comment`]): for a standby, a try of its own that timed out and was granted
    /// after all, which the server keeps until it ends that session.
    pub fn is_this_process(&self) -> bool {
        let own = identity_comment();
        self.leaderrun()
            .is_some_and(|(host, pid)| own == format!("/* by={host}:{pid} */"))
    }
}

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((host, pid)) = self.leaderrun() {
            return write!(f, "leaderrun on {host} (pid {pid})");
        }
        match self.application_name {
            Some("") => f.write_str("not leaderrun: no application_name"),
            Some(name) => write!(f, "not leaderrun: application_name={name}"),
            None => f.write_str("a session whose application_name is not visible"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_names() {
        assert_eq!(
            parse_application_name("leaderrun@web-1.example:4242"),
            Some(("web-1.example".to_owned(), 4242))
        );
        assert_eq!(
            parse_application_name("leaderrun@::1:7"),
            Some(("::1".to_owned(), 7))
        );
        assert_eq!(parse_application_name("psql"), None);
        assert_eq!(parse_application_name("leaderrun@host"), None);
        assert_eq!(parse_application_name("leaderrun@:5"), None);
        assert_eq!(parse_application_name("leaderrun@h:x"), None);
        let who = |name| {
            Who {
                application_name: name,
                query: None,
            }
            .to_string()
        };
        assert_eq!(who(Some("leaderrun@h:5")), "leaderrun on h (pid 5)");
        assert_eq!(who(Some("psql")), "not leaderrun: application_name=psql");
        assert_eq!(who(Some("")), "not leaderrun: no application_name");
        // PGAPPNAME renamed it: its statements still say who it is.
        let q = "/* leaderrun term=1 since=x fencing_token=2 */ /* by=web-1:42 */ SELECT 1";
        let by_comment = Who {
            application_name: Some("psqlish"),
            query: Some(q),
        };
        assert_eq!(by_comment.to_string(), "leaderrun on web-1 (pid 42)");
        assert_eq!(
            identify(Some("psqlish"), Some(q)),
            Some(("web-1".to_owned(), 42))
        );
        assert_eq!(identify(Some("psql"), Some("SELECT 1")), None);
        assert!(parse_identity_comment(&identity_comment()).is_some());
        // A character across the 400th byte of a stranger's statement.
        let long = format!("SELECT '{}é'", "x".repeat(391));
        assert_eq!(long.len(), 402);
        assert_eq!(parse_identity_comment(&long), None);
    }

    #[test]
    fn activity_text_is_lossy() {
        assert_eq!(activity_text(None), None);
        assert_eq!(
            activity_text(Some("été".as_bytes())).as_deref(),
            Some("été")
        );
        assert_eq!(
            activity_text(Some(b"a \xff\xfe b")).as_deref(),
            Some("a \u{fffd}\u{fffd} b")
        );
    }

    #[test]
    fn check_comment_after_the_identity_and_cut_short() {
        let q = "/* by=web-1:42 */ /* leaderrun term=3 since=2026-11-30T05:00:00Z \
                 fencing_token=745 */ SELECT 1";
        let whole = (Some(3), Some("2026-11-30T05:00:00Z".to_owned()), Some(745));
        assert_eq!(parse_check_comment(q), whole);
        assert_eq!(parse_identity_comment(q), Some(("web-1".to_owned(), 42)));
        // Cut inside the token: the token is not guessed from its first digits.
        let cut = &q[..q.find("=745").unwrap() + 3];
        assert_eq!(parse_check_comment(cut), (whole.0, whole.1.clone(), None));
        // Cut inside the timestamp, and inside the identity itself.
        assert_eq!(
            parse_check_comment(&q[..q.find("05:00").unwrap()]),
            (Some(3), None, None)
        );
        assert_eq!(parse_check_comment("/* by=web-1:4"), (None, None, None));
    }

    #[test]
    fn check_comment_round_trip() {
        let q = "/* leaderrun term=3 since=2026-11-30T05:00:00Z fencing_token=745 */ SELECT 1";
        assert_eq!(
            parse_check_comment(q),
            (Some(3), Some("2026-11-30T05:00:00Z".to_owned()), Some(745))
        );
        assert_eq!(parse_check_comment("SELECT 1"), (None, None, None));
    }
}
