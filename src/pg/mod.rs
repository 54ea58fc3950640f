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

/// Bounds every statement of a session that takes no part in the election (the history's) on
/// the server as well: `statement_timeout` = `bound`, `lock_timeout` = half of
/// it (at least 1 ms), no `idle_session_timeout` (PostgreSQL 14 and later: the history's
/// session idles between runs), no
/// `transaction_timeout` (17 and later, whose end is the session's) and no deferrable
/// transactions (which wait for a safe snapshot while any serializable writer is open), no JIT
/// compilation and no `exit_on_error` (which ends the session at any failed statement: a
/// history table not yet there, a privilege missing), whatever the role's or the database's
/// defaults. A default of a few milliseconds would otherwise fail these statements, or end
/// the session, while the replicas, which pin their own timers
/// (docs/guarantees.md#session-timers), lead. One round trip, or up to [`BOUND_SESSION_TRIES`]
/// when the role's own default cancels it; `what` names it in an error.
///
/// The settings stay on the server connection: behind a transaction-mode pooler, on one that
/// other clients are handed next. `status`, `step-down` and `doctor` use [`begin_bounded`]
/// instead.
///
/// # Errors
/// [`Error::Query`] when the server refuses a setting; [`Error::Timeout`] after `bound`.
pub async fn bound_session(
    what: &'static str,
    client: &tokio_postgres::Client,
    bound: Duration,
) -> Result<(), Error> {
    let sql = format!(
        "SET exit_on_error = off; {}",
        bound_settings(
            bound,
            Scope::Session,
            "SET transaction_deferrable = off; SET default_transaction_deferrable = off;"
        )
    );
    send_settings(what, client, bound, &sql, false).await
}

/// Opens a transaction on `client` whose statements are bounded on the server as
/// [`bound_session`] bounds a session's, every setting `LOCAL` to the transaction (and
/// `idle_in_transaction_session_timeout` off, as `idle_session_timeout` is there): `status`
/// and `step-down` run in one, committed at their end. A transaction-mode pooler hands a
/// server connection to one client per transaction (docs/field-notes.md#transaction-mode-poolers-move-the-session),
/// so through one nothing they set or take outlives them on a connection that other clients
/// are handed next: the timers end with the transaction, `step-down`'s request stays on the
/// backend it was taken on until it is released there, and a run that ends before (INT, TERM,
/// a kill) leaves the transaction open, which PgBouncer answers by closing that server
/// connection, and the server by freeing the request. `READ COMMITTED`: each statement sees
/// the locks of its moment (`pg_stat_activity` is kept for the transaction:
/// [`crate::cli::status::report`] clears it first). One round trip, or up to
/// [`BOUND_SESSION_TRIES`] when the role's own default cancels it; `what` names it in an error.
///
/// # Errors
/// [`Error::Query`] when the server refuses a setting; [`Error::Timeout`] after `bound`.
pub async fn begin_bounded(
    what: &'static str,
    client: &tokio_postgres::Client,
    bound: Duration,
) -> Result<(), Error> {
    send_settings(what, client, bound, &begin_bounded_sql(bound), true).await
}

/// [`begin_bounded`]'s statements, to send in a flight of one's own (`doctor` sends each of its
/// statements between them and a `COMMIT`). `exit_on_error` first, even before `BEGIN`: a
/// cancel of a later statement must not end the session, and a statement of the same query
/// before a `BEGIN` belongs to the transaction it opens (PostgreSQL's manual, "Multiple
/// Statements in a Simple Query"). `BEGIN` sets the transaction's isolation level itself, so
/// the deferrable defaults (which only a serializable transaction would wait for) need no
/// setting.
pub(crate) fn begin_bounded_sql(bound: Duration) -> String {
    format!(
        "SET LOCAL exit_on_error = off; BEGIN ISOLATION LEVEL READ COMMITTED; \
         SET LOCAL idle_in_transaction_session_timeout = 0; {}",
        bound_settings(bound, Scope::Transaction, "")
    )
}

/// Where [`bound_settings`]' settings last.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Session,
    Transaction,
}

/// The timers [`bound_session`] and [`begin_bounded`] set, in `scope`, with `more` (`SET`s,
/// each ended by `;`) before the last statement, a `SELECT`: a `SET TRANSACTION` after it would
/// fail (a snapshot was taken). Numbers we formatted,
/// in the settings' base unit (ms): nothing to quote. `idle_session_timeout` and
/// `transaction_timeout` through `pg_settings`: a server before 14 (17) has none, and a `SET`
/// of it would fail there. A `transaction_timeout` set inside its transaction stops its timer
/// (PostgreSQL's `assign_transaction_timeout`).
fn bound_settings(bound: Duration, scope: Scope, more: &str) -> String {
    let (set, local) = match scope {
        Scope::Session => ("SET", "false"),
        Scope::Transaction => ("SET LOCAL", "true"),
    };
    format!(
        "{set} statement_timeout = {}; {set} lock_timeout = {}; {set} jit = off; {more} \
         SELECT pg_catalog.set_config(name, '0', {local}) FROM pg_catalog.pg_settings \
         WHERE name OPERATOR(pg_catalog.=) 'idle_session_timeout' \
         OR name OPERATOR(pg_catalog.=) 'transaction_timeout'",
        bound.as_millis().clamp(1, i32::MAX as u128),
        (bound / 2).as_millis().clamp(1, i32::MAX as u128)
    )
}

/// Sends `sql` (settings, the first of which may run under the role's own timers) until the
/// server does not cancel it, at most [`BOUND_SESSION_TRIES`] times. `in_transaction`: `sql`
/// opens a transaction, which a cancel leaves failed, so a try after one rolls it back first.
async fn send_settings(
    what: &'static str,
    client: &tokio_postgres::Client,
    bound: Duration,
    sql: &str,
    in_transaction: bool,
) -> Result<(), Error> {
    // The first `SET` runs under the role's own `statement_timeout`: a default of a
    // millisecond can cancel it on a busy machine, or, when the timer fires just as a
    // statement ends, the next one ("due to user request"; seen in CI). Every try that gets
    // further has set more of the bound, and the settings are the same each time.
    let again = format!("ROLLBACK; {sql}");
    until_not_cancelled(|first| {
        let text = if !first && in_transaction {
            &again
        } else {
            sql
        };
        within(what, bound, client.batch_execute(text))
    })
    .await
}

/// Whether `err` is the server's cancel of a statement (SQLSTATE 57014: a
/// `statement_timeout`, the role's own one included, or a cancel request).
pub(crate) fn cancelled(err: &Error) -> bool {
    matches!(err, Error::Query { source, .. }
        if source.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED))
}

/// Sends a statement (`send(first)`, `first` true the first time) again while the server
/// cancels it ([`cancelled`]), at most [`BOUND_SESSION_TRIES`] times in all: a role whose own
/// `statement_timeout` is a millisecond may cancel a statement sent before any bound of ours
/// is set. Its last answer.
pub(crate) async fn until_not_cancelled<T, F, Fut>(mut send: F) -> Result<T, Error>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut tries = 1;
    loop {
        match send(tries == 1).await {
            Err(err) if tries < BOUND_SESSION_TRIES && cancelled(&err) => tries += 1,
            answer => return answer,
        }
    }
}

/// Ends the transaction [`begin_bounded`] opened: `COMMIT`, bounded by `bound`. Nothing it
/// holds is written; a transaction that failed is rolled back by it.
///
/// # Errors
/// [`Error::Query`] when the server refuses it; [`Error::Timeout`] after `bound`.
pub async fn end_bounded(client: &tokio_postgres::Client, bound: Duration) -> Result<(), Error> {
    within(
        "end of the transaction",
        bound,
        client.batch_execute("COMMIT"),
    )
    .await
}

/// How often [`bound_session`] sends its settings when the server cancels them.
pub const BOUND_SESSION_TRIES: u32 = 4;

/// Panics unless every name in `sql` is resolved without the session's `search_path`
/// (docs/guarantees.md#names-in-its-sql): each function, type and catalog relation written
/// `pg_catalog.NAME`, each operator `OPERATOR(pg_catalog.OP)`, and none of the constructs that
/// look an operator up by name behind the text (`BETWEEN`, `IN (…)`, `LIKE`, `NULLIF`,
/// `IS DISTINCT FROM`, a `CASE` with an operand). Comments and string literals are skipped;
/// the names of `WITH` queries and the aliases after `AS` are the statement's own. A lint for
/// the statements the crate writes, kept with them.
#[cfg(test)]
pub(crate) fn assert_qualified(sql: &str) {
    // Comments and literals out, `OPERATOR(pg_catalog.…)` out: what is left must hold no
    // operator character and no bare name that calls, casts or reads.
    let mut text = String::new();
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = &after[after.find("*/").map_or(after.len(), |i| i + 2)..];
            text.push(' ');
        } else if let Some(after) = rest.strip_prefix('\'') {
            rest = &after[after.find('\'').map_or(after.len(), |i| i + 1)..];
            text.push_str(" 'literal' ");
        } else if let Some(after) = rest.strip_prefix("OPERATOR(pg_catalog.") {
            rest = &after[after.find(')').map_or(after.len(), |i| i + 1)..];
            text.push_str(" \u{2295} ");
        } else {
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    // A minus before a number is part of the constant (the grammar negates it, no `-` is
    // looked up), and the stars of `count(*)` and `SELECT *` are none.
    // Every word ends at a separator, the last one too.
    text.push(' ');
    let clean = text
        .replace("'literal'", "")
        .replace("(*)", "()")
        .replace("SELECT *", "SELECT");
    for (i, op) in clean.match_indices(['=', '<', '>', '!', '|', '~', '+', '-', '*', '/', '%']) {
        let negative_number = op == "-" && clean[i + 1..].starts_with(|c: char| c.is_ascii_digit());
        assert!(negative_number, "operator {op:?} by name in: {sql}");
    }
    // Words, with what stands before and after each.
    let words: Vec<(usize, &str)> = text
        .match_indices(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .scan(0usize, |start, (i, sep)| {
            let word = (*start, &text[*start..i]);
            *start = i + sep.len();
            Some(word)
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    let ctes: Vec<&str> = words
        .windows(3)
        .filter(|w| w[0].1.eq_ignore_ascii_case("WITH") && w[2].1 == "AS")
        .map(|w| w[1].1)
        .collect();
    for (k, &(at, word)) in words.iter().enumerate() {
        let upper = word.to_ascii_uppercase();
        for banned in ["BETWEEN", "LIKE", "ILIKE", "SIMILAR", "NULLIF", "DISTINCT"] {
            assert!(upper != banned, "{banned} looks an operator up in: {sql}");
        }
        let after = text[at + word.len()..].trim_start();
        let before = words
            .get(k.wrapping_sub(1))
            .map(|w| w.1.to_ascii_uppercase());
        if upper == "IN" {
            panic!("IN looks `=` up in: {sql}");
        }
        if upper == "CASE" {
            assert!(
                words.get(k + 1).is_some_and(|w| w.1 == "WHEN"),
                "a CASE with an operand looks `=` up in: {sql}"
            );
        }
        let qualified = word.starts_with("pg_catalog.");
        let is_number = word.chars().all(|c| c.is_ascii_digit());
        let keyword_call = [
            "EXISTS", "ARRAY", "VALUES", "ANY", "AS", "FROM", "WHERE", "AND", "OR", "NOT", "THEN",
            "ELSE", "WHEN", "ON", "LATERAL", "SELECT", "CASE", "IN", "JOIN",
        ]
        .contains(&upper.as_str());
        if after.starts_with('(') && !qualified && !keyword_call && before.as_deref() != Some("AS")
        {
            panic!("function {word} by name in: {sql}");
        }
        if text[..at].ends_with("::") && !qualified {
            panic!("type {word} by name in: {sql}");
        }
        let adjacent = k > 0 && {
            let (prev_at, prev) = words[k - 1];
            text[prev_at + prev.len()..at].trim().is_empty()
        };
        if matches!(before.as_deref(), Some("FROM" | "JOIN"))
            && adjacent
            && !qualified
            && !is_number
            && !ctes.contains(&word)
            && !after.starts_with('(')
        {
            panic!("relation {word} by name in: {sql}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lint_finds_each_name_the_search_path_resolves() {
        for sql in [
            "SELECT now()",
            "SELECT 1 = 1",
            "SELECT 1 OPERATOR(=) 1",
            "SELECT (1)::int4",
            "SELECT 1 FROM pg_locks",
            "SELECT 1 FROM pg_catalog.pg_locks l JOIN pg_stat_activity a ON true",
            "SELECT 2 BETWEEN 1 AND 3",
            "SELECT 2 IN (1, 2)",
            "SELECT CASE 2 WHEN 1 THEN 0 END",
            "SELECT NULLIF(1, 2)",
            "SELECT -x",
        ] {
            let caught = std::panic::catch_unwind(|| super::assert_qualified(sql));
            assert!(caught.is_err(), "the lint passed {sql}");
        }
        super::assert_qualified(
            "/* a = b */ WITH held AS (SELECT 1) SELECT pg_catalog.now(), -1, 'a=b', \
             (2)::pg_catalog.int4 OPERATOR(pg_catalog.=) 2 FROM held, pg_catalog.pg_locks \
             WHERE EXISTS (SELECT 1) AND 3 OPERATOR(pg_catalog.=) ANY (ARRAY[3]) \
             AND CASE WHEN true THEN true END",
        );
    }
}
