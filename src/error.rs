//! Errors of the election, and how their causes are shown.
//!
//! Each variant says what failed at this layer; `source()` carries the cause. tokio-postgres'
//! own `Display` says only "db error" or "error connecting to server", so everything that logs or
//! prints an error goes through [`Chain`], which writes the whole cause chain on one line and
//! renders a server error as its message and SQLSTATE.
//!
//! Text from outside (a server's message, detail and hint, the text of any other cause) is cut
//! at [`MAX_TEXT_BYTES`] for each piece: a server that sends a message of megabytes (a wrong port,
//! an odd proxy, a hostile server) gets a log line of a few kilobytes, so the lines waiting for
//! a slow stderr hold bounded memory (docs/guarantees.md#safety-guarantees).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// What can go wrong in the election (see [`crate::elector`]).
///
/// Most of these never leave [`crate::Elector::run`]: a failed connect or query is logged and the
/// replica stays a standby, as the seed's `Run` does. They are public so that log lines and
/// embedding programs share one wording.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`crate::Elector::run`] was called while an earlier call on the same elector (or a
    /// clone of it) had not returned yet. The seed forbids two concurrent `Run` calls.
    #[error("this elector is already running; a second concurrent run is refused")]
    AlreadyRunning,

    /// The configuration's timers cannot be used ([`crate::Elector::new`]).
    #[error("invalid timing")]
    Timing(#[source] crate::timing::TimingError),

    /// [`crate::Config::slots`] is over [`crate::pg::lock::MAX_SLOTS`] ([`crate::Elector::new`]):
    /// a standby's try names every slot's key, and one for so many would not fit an interval.
    #[error("{slots} slots: a lock can have at most {max}", max = crate::pg::lock::MAX_SLOTS)]
    Slots {
        /// The number asked for.
        slots: u32,
    },
    /// The election's metrics (the `plexsphere_background_leader` gauge and the `leaderrun_*`
    /// series) could not be registered on the configured registry, e.g. because a collector
    /// that is not an elector's uses one of their names; the cause names it.
    #[error("cannot register the election's metrics on the registry")]
    Metrics(#[source] prometheus::Error),

    /// Opening the session failed (refused, authentication, unknown database, …).
    #[error("connect to {target}")]
    Connect {
        /// The redacted connection target, e.g. `host=db port=5432 dbname=app user=app`.
        target: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// The socket to one host of the list did not connect (refused, no route, a name that
    /// does not resolve, a timeout); the next host is tried, as libpq does.
    #[error("connect to {target}")]
    Socket {
        /// The redacted host, e.g. `host=db port=5432 dbname=app user=app`.
        target: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A host answered but is not what `target_session_attrs` asks for.
    #[error("connect to {target}: the server is not {wanted} (target_session_attrs)")]
    NotSuitable {
        /// The redacted host.
        target: String,
        /// `read-write`, `read-only`, `primary` or `standby`.
        wanted: &'static str,
    },

    /// The TLS settings cannot be used (a certificate file missing or malformed).
    #[error("TLS settings")]
    Tls(#[source] crate::pg::tls::TlsError),

    /// A statement failed on the server or the connection broke while it ran.
    #[error("{what}")]
    Query {
        /// What the statement was for, e.g. `try advisory lock`.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// Connecting or a statement did not finish within its bound (the DSN's `connect_timeout`
    /// when set, else the check interval; docs/guarantees.md#safety-guarantees).
    #[error("{what} timed out after {}", humantime::format_duration(*.after))]
    Timeout {
        /// What was bounded, e.g. `connect` or `leader check`.
        what: &'static str,
        /// The bound that passed.
        after: Duration,
    },

    /// A statement that can grant the lock did not finish within its bound on a server whose
    /// commits wait for a synchronous standby: the grant's fencing token is committed there as
    /// durably as any write (docs/guarantees.md#fencing-tokens), so a synchronous standby that
    /// is down holds every grant. The same timeout as [`Error::Timeout`], with what this
    /// server adds to it.
    #[error(
        "{what} timed out after {}; this server makes every commit, a grant's too, wait for a \
         synchronous standby (synchronous_standby_names = '{standbys}'): if the server is \
         reachable, that standby may be down",
        humantime::format_duration(*.after)
    )]
    AwaitingStandby {
        /// What was bounded, e.g. `try advisory lock`.
        what: &'static str,
        /// The bound that passed.
        after: Duration,
        /// The server's `synchronous_standby_names`.
        standbys: String,
    },

    /// A statement that returns one row returned `rows` rows instead.
    #[error("{what} returned {rows} rows, not 1")]
    UnexpectedRows {
        /// What the statement was for, e.g. `leader check`.
        what: &'static str,
        /// How many rows came back.
        rows: usize,
    },

    /// The lock was granted, but its session could not be handed to the
    /// [`SessionKeeper`](crate::elector::SessionKeeper) (the binary's watchdog: no descriptor
    /// left, or no watchdog can run). No term begins on such a grant, and the session is closed,
    /// which gives the lock back: the next check tries again.
    #[error("cannot hand the lock session to the watchdog, so the lock is given back")]
    Keeper(#[source] std::io::Error),

    /// The lock session ended (EOF from the server: terminated backend, restart, broken socket).
    #[error("lock session closed by the server")]
    SessionClosed(#[source] Option<tokio_postgres::Error>),

    /// The leader's check ran but its backend no longer holds the granted lock row
    /// (docs/field-notes.md#a-live-session-is-not-a-held-lock).
    #[error("advisory lock {lock} is no longer held by backend {backend_pid}")]
    LockNotHeld {
        /// The key, `class:id`.
        lock: crate::LockKey,
        /// The backend pid the lock was granted to.
        backend_pid: i32,
    },

    /// The statement ran on a different backend than the one that took the lock: a
    /// transaction-mode pooler moves sessions between clients
    /// (docs/field-notes.md#transaction-mode-poolers-move-the-session).
    #[error(
        "the lock session moved from backend {granted_to} to backend {now}: \
         a transaction-mode connection pooler (e.g. PgBouncer pool_mode=transaction) \
         cannot carry a session advisory lock; connect directly or through a session-mode pooler"
    )]
    BackendChanged {
        /// Backend pid at the grant.
        granted_to: i32,
        /// Backend pid that answered the check.
        now: i32,
    },

    /// No check has proved the lock for 2 check intervals (a partition, a stuck check, or the
    /// process was suspended): the server may already have given the lock away
    /// (docs/guarantees.md#safety-guarantees).
    #[error(
        "no check has proved the lock for {} (more than 2 check intervals): \
         the server may have given it away",
        humantime::format_duration(Duration::from_millis(since.as_millis() as u64))
    )]
    SafeWindowPassed {
        /// Time since the send time of the last good check.
        since: Duration,
    },

    /// `leaderrun step-down` asked this leader to hand over: it stops its child, releases the
    /// lock and stays out of the campaign for one check interval.
    #[error("a step-down was requested (leaderrun step-down): handing over")]
    StepDownRequested,

    /// The leader's own holder gave the term up ([`crate::Term::give_up`]); the term ends as
    /// for a step-down request.
    #[error("the term was given up by its holder: its work was ended by something it cannot take back (the watchdog stopped COMMAND's tree)")]
    GivenUp,

    /// A second session reached the server backend that was granted this session's lock, or
    /// was granted the lock itself: both reached one server backend, as behind a
    /// transaction-mode pooler (docs/field-notes.md#transaction-mode-poolers-move-the-session).
    #[error(
        "a second session reached the server backend that holds this session's lock (or was \
         granted the lock), so both share one server backend: a transaction-mode connection \
         pooler (e.g. PgBouncer pool_mode=transaction) cannot carry a session advisory lock; \
         connect directly or through a session-mode pooler"
    )]
    SharedBackend,

    /// The server backend this session's guarded try reached held the lock already, for
    /// another client (docs/election.md#a-standbys-check: a session that is not direct reads
    /// `pg_locks` before it tries): sessions share server backends, as behind a
    /// transaction-mode pooler
    /// (docs/field-notes.md#transaction-mode-poolers-move-the-session). Nothing was taken, and
    /// nothing is given back: the lock is that client's.
    #[error(
        "the server backend this session reached already holds the lock for another client, \
         so sessions share server backends: a transaction-mode connection pooler (e.g. \
         PgBouncer pool_mode=transaction) cannot carry a session advisory lock; connect \
         directly or through a session-mode pooler"
    )]
    BackendHeldByAnother,

    /// A grant this session was given was no longer its backend's a statement later (its
    /// unlock found nothing to release): the session moves between server backends, as behind
    /// a transaction-mode pooler (docs/field-notes.md#transaction-mode-poolers-move-the-session).
    #[error(
        "the lock this session was granted was gone from its server backend one statement \
         later, so the session moves between server backends: a transaction-mode connection \
         pooler (e.g. PgBouncer pool_mode=transaction) cannot carry a session advisory lock; \
         connect directly or through a session-mode pooler"
    )]
    GrantMoved,

    /// A recent check of this elector found a pooler that moves sessions between server
    /// backends or shares them between clients ([`Error::BackendChanged`],
    /// [`Error::SharedBackend`], [`Error::BackendHeldByAnother`], [`Error::GrantMoved`]), and
    /// this session is not direct either: nothing is tried on it for a minute (or 12 check
    /// intervals) after each finding, since a count a pooled backend was granted and could not
    /// give back would keep every replica out, the direct ones too
    /// (docs/field-notes.md#transaction-mode-poolers-move-the-session). The elector stays a
    /// standby and keeps checking; a direct session is tried as any.
    #[error(
        "a recent check found that this replica's sessions reach the server through a \
         transaction-mode connection pooler (e.g. PgBouncer pool_mode=transaction), which \
         cannot carry a session advisory lock: nothing is tried through it for another {} \
         (a lock left on a pooled server connection would keep every replica out); connect \
         directly or through a session-mode pooler",
        humantime::format_duration(Duration::from_secs(again_in.as_secs().max(1)))
    )]
    PoolerFound {
        /// Time until a session that is not direct is tried again.
        again_in: Duration,
    },

    /// The run history's session (`--history`) reached a hot standby, whose tables cannot be
    /// written (a host list can land it on another server than the lock session's): said as
    /// such, rather than as each write's read-only error.
    #[error("server {server} is in recovery (a hot standby): the run history is written on the primary, not there")]
    HistoryInRecovery {
        /// The redacted connection target.
        server: String,
    },

    /// The server is a hot standby: it grants advisory locks of its own, which would make a
    /// second leader (docs/guarantees.md#safety-guarantees,
    /// docs/field-notes.md#a-hot-standby-grants-its-own-locks).
    #[error("server {server} is in recovery (a hot standby); refusing to lead on it")]
    InRecovery {
        /// The redacted connection target.
        server: String,
    },

    /// The session's role may not read what the leader's check reads (the `pg_locks` view and
    /// the `pg_lock_status()` it calls), so no check could prove a grant: the grant was given
    /// back before any term began (docs/field-notes.md#a-lock-the-check-cannot-see).
    #[error(
        "the role cannot read pg_catalog.pg_locks on {server}, which the leader's check reads to \
         prove the lock, so this replica stays a standby; a DBA runs GRANT SELECT ON \
         pg_catalog.pg_locks TO the role (and GRANT EXECUTE ON FUNCTION \
         pg_catalog.pg_lock_status() TO the role, if that was revoked too)"
    )]
    CannotCheck {
        /// The redacted connection target (`USER@HOST:PORT/DBNAME`).
        server: String,
    },
}

impl Error {
    /// Whether the server answered and what it answered rules leading out through these
    /// settings, however often it is asked: a pooler that moves or shares sessions, a hot
    /// standby (or no host of a list with the `target_session_attrs` asked for), a role that
    /// may not read what the leader's check reads, or a statement the server refused for want
    /// of a privilege (SQLSTATE 42501). `/readyz` says so instead of "cannot reach the server".
    /// A refused connect (authentication, `pg_hba.conf`, the `CONNECT` privilege) stays
    /// "cannot reach", as the README says of a bad secret.
    pub fn rules_out_leading(&self) -> bool {
        match self {
            Error::BackendChanged { .. }
            | Error::SharedBackend
            | Error::BackendHeldByAnother
            | Error::GrantMoved
            | Error::PoolerFound { .. }
            | Error::InRecovery { .. }
            | Error::NotSuitable { .. }
            | Error::CannotCheck { .. } => true,
            Error::Query { source, .. } => {
                source.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
            }
            _ => false,
        }
    }

    /// Whether this error means the server ended the session (as opposed to a slow or
    /// failing statement on a live session).
    pub fn is_closed(&self) -> bool {
        match self {
            Error::SessionClosed(_) => true,
            Error::Query { source, .. } => source.is_closed(),
            _ => false,
        }
    }
}

/// What follows tokio-postgres' "password missing": where leaderrun looks for one.
/// The password file is named generically: PGPASSFILE or `passfile=` may name another
/// than `~/.pgpass`, and a missing one is as silent as in libpq.
pub(crate) const PASSWORD_HINT: &str = "; hint: the server asks for a password and none was \
     found: set PGPASSWORD, add a line host:port:database:user:password to the password file \
     (passfile= in the DSN, else PGPASSFILE, else ~/.pgpass; it must exist and be mode 0600), or \
     name a service (service= in the DSN, or PGSERVICE) whose entry in ~/.pg_service.conf has one";

/// The most bytes of one piece of outside text that [`Chain`] writes: each of a server error's
/// message, detail and hint, and the whole text of each other cause. 2,000 bytes is far more
/// than any message PostgreSQL itself sends (its longest are a few hundred bytes), and little
/// enough that a log line stays a few kilobytes whatever a server sends
/// (docs/guarantees.md#safety-guarantees).
pub const MAX_TEXT_BYTES: usize = 2000;

/// `text` cut to at most `max` bytes, at the start of a character (UTF-8 is never split), with
/// ` … (N more bytes)` after it saying how many bytes were left out; `text` itself when it is
/// no longer than `max`. The marker adds at most 40 bytes to `max`.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{} … ({} more bytes)",
        &text[..end],
        text.len() - end
    ))
}

/// Displays an error and all its causes on one line, `outer: cause: root`.
///
/// A PostgreSQL server error is shown as `MESSAGE (SQLSTATE xxxxx)` plus its detail and hint,
/// instead of tokio-postgres' bare "db error". Each piece of outside text is cut at
/// [`MAX_TEXT_BYTES`] ([`cut`]): the message, detail and hint each, and every other cause's
/// whole text (it may quote a server or a peer: a certificate's names, a setting's value).
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(self.0);
        let mut first = true;
        // Whether an attempt at a Unix socket (its target is `host=/dir`) is what failed.
        let mut unix_socket = false;
        while let Some(err) = current {
            if let Some(Error::Socket { target, .. }) = err.downcast_ref::<Error>() {
                unix_socket = target.starts_with("host=/") || target.starts_with("host=@");
            }
            if !first {
                f.write_str(": ")?;
            }
            first = false;
            if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
                write!(
                    f,
                    "{} (SQLSTATE {})",
                    cut(db.message(), MAX_TEXT_BYTES),
                    db.code().code()
                )?;
                if let Some(detail) = db.detail() {
                    write!(f, "; detail: {}", cut(detail, MAX_TEXT_BYTES))?;
                }
                if let Some(hint) = db.hint() {
                    write!(f, "; hint: {}", cut(hint, MAX_TEXT_BYTES))?;
                } else if *db.code() == tokio_postgres::error::SqlState::UNDEFINED_DATABASE {
                    // psql's habit: say what to check, not pg_hba.conf.
                    f.write_str(
                        "; hint: the server has no database of that name: create it, or name \
                         the one the lock lives in (dbname= in the DSN, or PGDATABASE)",
                    )?;
                }
                // A read-only transaction refused a write. The server's message names the
                // statement only, and the same code comes from a hot standby: both causes are
                // said, the role's or database's default first (a session that must write checks
                // for recovery itself, e.g. the history's).
                if *db.code() == tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION {
                    f.write_str(
                        "; hint: the session's transactions are read-only: \
                         default_transaction_read_only is on for its role or database (or in the \
                         DSN's options); a DBA turns it off for the role (ALTER ROLE name SET \
                         default_transaction_read_only = off), unless the server is a hot standby \
                         (in recovery)",
                    )?;
                }
                // A role the DBA took pg_logical_emit_message from: the grant's durable
                // fencing token needs it (docs/field-notes.md#a-fencing-number-must-survive-a-crash).
                if *db.code() == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE
                    && db.message().contains("pg_logical_emit_message")
                {
                    write!(
                        f,
                        "; hint: a grant writes its fencing token to the WAL with \
                         pg_logical_emit_message, so that it survives a crash of the server: {}",
                        crate::pg::lock::DURABLE_TOKEN_GRANT
                    )?;
                }
                // Prepared statements that collide or vanish between statements: the session
                // is being shared or swapped
                // (docs/field-notes.md#transaction-mode-poolers-move-the-session).
                let code = db.code();
                if *code == tokio_postgres::error::SqlState::DUPLICATE_PSTATEMENT
                    || *code == tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME
                {
                    f.write_str(
                        "; likely cause: a transaction-mode connection pooler (e.g. PgBouncer \
                         pool_mode=transaction) shares server sessions between clients; \
                         connect directly or through a session-mode pooler",
                    )?;
                }
            } else {
                let text = err.to_string();
                f.write_str(&cut(&text, MAX_TEXT_BYTES))?;
                // The server asked for a password and none was found anywhere.
                // (tokio-postgres' "invalid configuration", caused by "password missing").
                if text == "password missing" {
                    f.write_str(PASSWORD_HINT)?;
                }
                // psql's hint for a refused connection, as it words it for a socket file (a
                // stale one: nothing listens) and for TCP.
                if err
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    f.write_str(if unix_socket {
                        "; hint: is the server running locally and accepting connections on \
                         that socket?"
                    } else {
                        "; hint: is the server running on that host and accepting TCP \
                         connections on that port?"
                    })?;
                }
            }
            current = err.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_short_text_and_cuts_long_text_on_a_character_with_a_marker() {
        assert!(matches!(cut("short", 5), Cow::Borrowed("short")));
        assert_eq!(cut("abcdef", 4), "abcd … (2 more bytes)");
        // 'é' is two bytes: a cut inside one backs off to its start.
        assert_eq!(cut("aéb", 2), "a … (3 more bytes)");
        assert_eq!(cut("€", 0), " … (3 more bytes)");
    }

    #[test]
    fn chain_cuts_each_cause_at_max_text_bytes() {
        let huge = "x".repeat(5_000_000);
        let err = Error::Socket {
            target: "host=127.0.0.1 port=5432".into(),
            source: std::io::Error::other(huge.clone()),
        };
        let shown = Chain(&err).to_string();
        assert!(shown.starts_with("connect to host=127.0.0.1 port=5432: xxx"));
        assert!(shown.ends_with(&format!(" … ({} more bytes)", huge.len() - MAX_TEXT_BYTES)));
        assert!(shown.len() < MAX_TEXT_BYTES + 100, "{}", shown.len());
    }
}
