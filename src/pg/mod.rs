//! The PostgreSQL layer of the library: connection settings resolved the way libpq and psql
//! resolve them ([`conninfo`]), TLS for those connections ([`tls`]), the advisory lock's key and
//! the SQL that takes and releases it ([`lock`]), and the query that names the lock's holder
//! ([`holder`]), and [`within`], the bound every statement runs under. The elector builds on
//! these; nothing here knows about COMMAND or the binary.

pub mod conninfo;
pub mod holder;
pub mod lock;
pub mod tls;

use std::time::Duration;

use tokio::time::timeout;

use crate::error::Error;

/// Runs one statement (any tokio-postgres future) bounded by `bound`: the one place a query
/// error becomes [`Error::Query`] and a missed deadline [`Error::Timeout`], both naming `what`.
///
/// # Errors
/// [`Error::Query`] when the statement fails; [`Error::Timeout`] after `bound`.
pub async fn within<T>(
    what: &'static str,
    bound: Duration,
    statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Error> {
    match timeout(bound, statement).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(Error::Query { what, source }),
        Err(_) => Err(Error::Timeout { what, after: bound }),
    }
}

/// Bounds every statement of a session that takes no part in the election (`leaderrun status`,
/// `step-down` and `doctor`'s, the history's) on the server as well: `statement_timeout` =
/// `bound`, `lock_timeout` = half of it (at least 1 ms), and no `idle_session_timeout`
/// (PostgreSQL 14 and later: the history's session idles between runs, `step-down`'s between
/// its looks), whatever the role's or the database's defaults. A default of a few
/// milliseconds would otherwise fail these statements, or end the session, while the
/// replicas, which pin their own timers (docs/guarantees.md#session-timers), lead. One round
/// trip, or up to [`BOUND_SESSION_TRIES`] when the role's own default cancels it; `what`
/// names it in an error.
///
/// # Errors
/// [`Error::Query`] when the server refuses a setting; [`Error::Timeout`] after `bound`.
pub async fn bound_session(
    what: &'static str,
    client: &tokio_postgres::Client,
    bound: Duration,
) -> Result<(), Error> {
    // Numbers we formatted, in the settings' base unit (ms): nothing to quote.
    // `idle_session_timeout` through pg_settings: a server before 14 has none, and a `SET`
    // of it would fail there.
    let sql = format!(
        "SET statement_timeout = {}; SET lock_timeout = {}; SELECT set_config(name, '0', false) \
         FROM pg_settings WHERE name = 'idle_session_timeout'",
        bound.as_millis().clamp(1, i32::MAX as u128),
        (bound / 2).as_millis().clamp(1, i32::MAX as u128)
    );
    // The first `SET` runs under the role's own `statement_timeout`: a default of a
    // millisecond can cancel it on a busy machine, or, when the timer fires just as a
    // statement ends, the next one ("due to user request"; seen in CI). Every try that gets
    // further has set more of the bound, and the settings are the same each time.
    let mut tries = 1;
    loop {
        match within(what, bound, client.batch_execute(&sql)).await {
            Err(Error::Query { source, .. })
                if tries < BOUND_SESSION_TRIES
                    && source.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// How often [`bound_session`] sends its settings when the server cancels them.
pub const BOUND_SESSION_TRIES: u32 = 4;
