//! `leaderrun doctor` (docs/guarantees.md#observing-a-replica): proves, through exactly the
//! connection settings a replica would use, what the election relies on: two sessions exclude each
//! other on a scratch id of the same class (a running leader is not disturbed), the server is not
//! in recovery, a session keeps its backend (no transaction-mode pooler) and reaches the server
//! directly or not (a proxy or pooler between is a warning), `idle_session_timeout` can be set;
//! it also shows the TLS state and who holds the real key. Through a transaction-mode pooler
//! it leaves nothing on the server connections it is handed (`one`, the exclusion's give-backs).

use std::time::Duration;

use tokio_postgres::Client;

use crate::cli::exit_codes::FAILURE as EXIT_FAILURE;
use crate::elector::LockKey;
use crate::error::{Chain, Error};
use crate::pg::conninfo::describe;
use crate::pg::lock::{
    give_back_sql, on_backend, Held, DURABLE_TOKEN, DURABLE_TOKEN_GRANT, SYNC_STANDBYS,
};
use crate::pg::within;

use super::status::{line, out, output_lost, report, runtime, until_interrupted};
use crate::process::signals::SignalStream;
use crate::supervisor::Exit;

/// One line of `doctor`'s output: `ok`, `FAIL` (with a hint), or `warn` (holds, with a hint).
#[derive(Debug)]
pub struct Finding {
    /// Short name of the check.
    pub check: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do about it, when it does not hold.
    pub hint: Option<String>,
}

/// The column the checks' names take in doctor's output: the longest name's, `fencing token`,
/// so that every finding's text starts at the same column.
const CHECK_WIDTH: usize = 13;

impl Finding {
    fn pass(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding {
            check,
            ok: true,
            detail: detail.into(),
            hint: None,
        }
    }

    fn fail(check: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Finding {
        Finding {
            check,
            ok: false,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
}

/// The one value of `sql` on `client`, asked in a transaction of its own whose timers are
/// `bound` ([`crate::pg::begin_bounded`]'s, `LOCAL` to it): through a transaction-mode pooler
/// nothing doctor sets stays on a server connection that other clients are handed next, and
/// between two statements the session is as free to move as a replica's (what the `session`
/// and `exclusion` checks look for). One flight: the transaction's start, the statement
/// (typed, so the unnamed statement: nothing stays prepared) and `COMMIT`, whose failure is
/// the statement's (a commit waits for the WAL flush and a synchronous standby, which is what
/// the fencing token's check asks about). When the role's own `statement_timeout` cancels the
/// start and the statement, the flight is sent again, up to [`crate::pg::BOUND_SESSION_TRIES`]
/// times; a statement that ran all the same (its start cancelled before the `BEGIN`) answers.
async fn one<T>(client: &Client, sql: &str, bound: Duration) -> Result<T, Error>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let (value, ended) = one_and_end(client, sql, bound).await?;
    ended?;
    Ok(value)
}

/// [`one`], its value and its `COMMIT`'s answer apart: a grant of the exclusion's try is
/// counted (and given back) even when its commit's answer is lost.
async fn one_and_end<T>(
    client: &Client,
    sql: &str,
    bound: Duration,
) -> Result<(T, Result<(), Error>), Error>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let begin = crate::pg::begin_bounded_sql(bound);
    let mut tries = 1;
    loop {
        // `biased`: sent in this order, the statement between its transaction's ends.
        let (begun, rows, ended) = tokio::join!(
            biased;
            within("doctor query", bound, client.batch_execute(&begin)),
            within("doctor query", bound, client.query_typed(sql, &[])),
            within("doctor query", bound, client.batch_execute("COMMIT")),
        );
        let rows = match (begun, rows) {
            // Ran: in its transaction, or on its own when the start was cancelled before its
            // `BEGIN` (a grant of the exclusion's try must be counted, not sent again).
            (_, Ok(rows)) => rows,
            (Err(err), Err(_))
                if tries < crate::pg::BOUND_SESSION_TRIES && crate::pg::cancelled(&err) =>
            {
                tries += 1;
                continue;
            }
            (Err(err), Err(_)) | (Ok(()), Err(err)) => return Err(err),
        };
        return match rows.as_slice() {
            [row] => Ok((row.get(0), ended)),
            _ => Err(Error::UnexpectedRows {
                what: "doctor query",
                rows: rows.len(),
            }),
        };
    }
}

/// [`keep_alive`]'s statement: the role's `idle_session_timeout` in ms, no row before
/// PostgreSQL 14.
const KEEP_ALIVE_SQL: &str = "SELECT (setting)::pg_catalog.int8 FROM pg_catalog.pg_settings \
     WHERE name OPERATOR(pg_catalog.=) 'idle_session_timeout'";

/// Keeps `client`'s session from the role's `idle_session_timeout` until `both_there` is
/// notified: a statement of its own every third of that timeout as the server gives it, none
/// when it is 0 or the server has none (before PostgreSQL 14). No `SET` and no transaction:
/// nothing stays on a pooled server connection, and none is held from a pooler's other
/// clients (through a pool of one, the other session's connect may need it for its
/// `target_session_attrs` look). A failed statement is tried again a tenth of a second later
/// (the role's own `statement_timeout` may cancel it); the checks meet a session that ended.
async fn keep_alive(client: &Client, both_there: &tokio::sync::Notify, bound: Duration) {
    loop {
        let period =
            match within("keep-alive", bound, client.query_typed(KEEP_ALIVE_SQL, &[])).await {
                Ok(rows) => match rows.first().and_then(|row| row.try_get::<_, i64>(0).ok()) {
                    Some(ms) if ms > 0 => Duration::from_millis(ms.unsigned_abs()) / 3,
                    _ => return both_there.notified().await,
                },
                Err(_) => Duration::from_millis(100),
            };
        tokio::select! {
            () = both_there.notified() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// What to check when `doctor` cannot connect, by the kind of failure (as psql would say it):
/// pg_hba.conf only for an authentication failure.
fn connect_hint(err: &Error) -> &'static str {
    use tokio_postgres::error::SqlState;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(db) = e.downcast_ref::<tokio_postgres::error::DbError>() {
            let code = db.code();
            if *code == SqlState::UNDEFINED_DATABASE {
                return "check the database name (dbname= in --dsn, or PGDATABASE)";
            }
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                return "check the role, its password (PGPASSWORD, or the password file: \
                        passfile=, PGPASSFILE, ~/.pgpass) and the server's pg_hba.conf";
            }
        }
        // The server asked for a password and none was found (tokio-postgres' words): an
        // authentication failure, though the server never saw a wrong password.
        if e.to_string() == "password missing" {
            return "check the role, its password (PGPASSWORD, or the password file: passfile=, \
                    PGPASSFILE, ~/.pgpass) and the server's pg_hba.conf";
        }
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return "check the host and port (--dsn, PGHOST, PGPORT) and that the server runs there";
        }
        source = e.source();
    }
    "check the DSN and the PG* variables"
}

/// Whether the server refused `err`'s statement for want of a privilege.
fn denied(err: &Error) -> bool {
    matches!(err, Error::Query { source, .. }
        if source.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE))
}

fn permission_hint(err: &Error) -> String {
    if denied(err) {
        "the role lacks a permission this check needs; grant it or use the role the replicas use"
            .to_owned()
    } else {
        "see the error; the replicas would meet it too".to_owned()
    }
}

/// How many synchronous standbys stream (or may: without `pg_read_all_stats`, `sync_state`
/// reads NULL). `IS DISTINCT FROM` would look `=` up by name
/// (docs/guarantees.md#names-in-its-sql).
const STREAMING_SYNC_STANDBYS_SQL: &str = "SELECT pg_catalog.count(*) \
     FROM pg_catalog.pg_stat_replication WHERE sync_state IS NULL \
     OR NOT (sync_state OPERATOR(pg_catalog.=) ANY (ARRAY['async', 'potential']))";

/// Gives back the grant of `key` on server backend `pid` through `client`
/// ([`crate::pg::lock::give_back_sql`], sent again until it lands there, within
/// [`crate::elector::UNLOCK_BOUND`]) and drops it from `granted`; whether it was given back.
async fn give_back(
    client: &Client,
    key: LockKey,
    pid: i32,
    granted: &mut Vec<(&Client, i32)>,
) -> bool {
    let sql = give_back_sql(Held::Key(key), pid);
    let given = on_backend(crate::elector::UNLOCK_BOUND, |left| {
        let sql = &sql;
        async move { Ok(one::<Option<bool>>(client, sql, left).await?.is_some()) }
    })
    .await;
    if given {
        if let Some(at) = granted
            .iter()
            .rposition(|&(c, p)| std::ptr::eq(c, client) && p == pid)
        {
            granted.remove(at);
        }
    }
    given
}

/// `doctor`'s finding on the grant's fencing token ([`DURABLE_TOKEN`]): asked on `a` whether
/// commits here wait for a synchronous standby and whether one streams, then taken on `b`.
async fn fencing_token_finding(a: &Client, b: &Client, bound: Duration) -> Finding {
    // The server's text, cut as every server text leaderrun shows (crate::error::cut).
    let standbys: Option<String> =
        one::<Option<String>>(a, &format!("SELECT {SYNC_STANDBYS}"), bound)
            .await
            .ok()
            .flatten()
            .map(|names| crate::error::cut(&names, crate::error::MAX_TEXT_BYTES).into_owned());
    if let Some(names) = &standbys {
        // Without pg_read_all_stats, sync_state reads NULL: unknown, so tried.
        let streaming: Option<i64> = one(a, STREAMING_SYNC_STANDBYS_SQL, bound).await.ok();
        if streaming == Some(0) {
            return Finding::fail(
                "fencing token",
                format!(
                    "every commit here waits for a synchronous standby \
                     (synchronous_standby_names = '{names}'), a grant's too, and none streams \
                     (pg_stat_replication): no replica can lead until one is back"
                ),
                "bring the synchronous standby back, or clear synchronous_standby_names if \
                 this server should not wait for it (a grant's token is committed as durably as \
                 every write here, so that a failover to that standby keeps tokens increasing)",
            );
        }
    }
    let sql = format!("SELECT ({DURABLE_TOKEN})");
    match one::<i64>(b, &sql, bound).await {
        Ok(token) => Finding::pass(
            "fencing token",
            format!(
                "a grant's token can be taken and flushed to the WAL before its answer \
                 ({token} now)"
            ),
        ),
        Err(err @ Error::Timeout { .. }) => Finding::fail(
            "fencing token",
            Chain(&err).to_string(),
            match &standbys {
                Some(names) => format!(
                    "a grant's commit waits for its WAL flush and for a synchronous standby \
                     (synchronous_standby_names = '{names}'): the server's disk or that standby \
                     did not answer in time"
                ),
                None => "a grant's commit waits for its WAL flush: the server's disk did not \
                         answer in time"
                    .to_owned(),
            },
        ),
        Err(err) => {
            let hint = if denied(&err) {
                format!(
                    "a grant takes its fencing token with pg_logical_emit_message(true, \
                     'leaderrun', …), so that it survives a crash of the server: \
                     {DURABLE_TOKEN_GRANT}"
                )
            } else {
                permission_hint(&err)
            };
            Finding::fail("fencing token", Chain(&err).to_string(), hint)
        }
    }
}

/// The majors leaderrun is tested on and supports (the README's "PostgreSQL versions").
pub const SUPPORTED_MAJORS: std::ops::RangeInclusive<u32> = 14..=18;

/// `doctor`'s finding on the server's major version: inside [`SUPPORTED_MAJORS`] it holds;
/// 13 and others outside hold with a warning (13 runs, with the weaker bound the
/// `idle timeout` finding gives).
fn version_finding(major: u32) -> Finding {
    let range = format!("{}–{}", SUPPORTED_MAJORS.start(), SUPPORTED_MAJORS.end());
    if SUPPORTED_MAJORS.contains(&major) {
        return Finding::pass(
            "version",
            format!("PostgreSQL {major}, in the supported range {range}"),
        );
    }
    let (detail, hint) = if major == 13 {
        (
            format!(
                "PostgreSQL 13 is past its end of life and outside the supported range {range}"
            ),
            "it works, with the weaker bound the idle timeout line gives; upgrade".to_owned(),
        )
    } else if major < 13 {
        (
            format!("PostgreSQL {major} is outside the supported range {range} and untested"),
            "upgrade to a supported major".to_owned(),
        )
    } else {
        (
            format!("PostgreSQL {major} is newer than the supported range {range} and untested"),
            format!("run the test suite against {major} (README: PostgreSQL versions)"),
        )
    };
    Finding {
        check: "version",
        ok: true,
        detail,
        hint: Some(hint),
    }
}

/// Runs every check through two sessions `a` and `b` for `lock` of `slots` slots; `scratch`
/// is an id of the lock's class no replica uses; `direct` is what session `a` found of
/// the path to the server (`crate::elector::session_is_direct` of `a`).
// Each argument is one input of the checks; a struct of them would serve one call.
#[allow(clippy::too_many_arguments)]
pub async fn findings(
    a: &Client,
    b: &Client,
    server: &str,
    lock: LockKey,
    slots: u32,
    scratch: i32,
    direct: Result<bool, Error>,
    bound: Duration,
) -> Vec<Finding> {
    let mut out = Vec::new();
    match one::<String>(a, "SHOW server_version", bound).await {
        Ok(version) => out.push(Finding::pass(
            "connect",
            format!(
                "two sessions to {server} (PostgreSQL {})",
                crate::error::cut(&version, crate::error::MAX_TEXT_BYTES)
            ),
        )),
        Err(err) => out.push(Finding::fail(
            "connect",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    if let Ok(num) = one::<String>(a, "SHOW server_version_num", bound).await {
        out.extend(num.parse::<u32>().ok().map(|n| version_finding(n / 10_000)));
    }

    let recovery = one::<bool>(a, "SELECT pg_catalog.pg_is_in_recovery()", bound).await;
    let primary = matches!(recovery, Ok(false));
    match recovery {
        Ok(false) => out.push(Finding::pass("primary", "the server is not in recovery")),
        Ok(true) => out.push(Finding::fail(
            "primary",
            "the server is in recovery (a hot standby): it grants advisory locks of its own, \
             so a replica here would be a second leader; leaderrun refuses to lead on it",
            "point the DSN at the primary, e.g. with several hosts and target_session_attrs=read-write",
        )),
        Err(err) => out.push(Finding::fail("primary", Chain(&err).to_string(), permission_hint(&err))),
    }

    // Both sessions on one server: a host list whose hosts are separate servers (with
    // `load_balance_hosts=random`, or hosts that come and go) sends each replica to a server
    // of its own, where each takes the lock, and the exclusion below then passes or fails by
    // chance. A server is told by when its postmaster started (every role may ask).
    let started = "SELECT pg_catalog.pg_postmaster_start_time()::pg_catalog.text";
    match (
        one::<String>(a, started, bound).await,
        one::<String>(b, started, bound).await,
    ) {
        (Ok(first), Ok(second)) if first == second => out.push(Finding::pass(
            "server",
            format!("both sessions reached the same server (up since {first})"),
        )),
        (Ok(first), Ok(second)) => out.push(Finding::fail(
            "server",
            format!(
                "the two sessions reached different servers (one up since {first}, the other \
                 since {second}): replicas with these settings may each take the lock on a \
                 server of their own and lead at once"
            ),
            "name one server, or a list of a primary and its standbys with \
             target_session_attrs=read-write (and no load_balance_hosts=random over separate \
             servers)",
        )),
        (Err(err), _) | (_, Err(err)) => out.push(Finding::fail(
            "server",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    // Exclusion on a scratch id: a takes it, b must be refused, then b gets it once a lets go.
    let key = LockKey {
        class: lock.class,
        id: scratch,
    };
    // A grant answers the backend it was granted on, and is given back there only
    // (give_back_sql): a session that moved between statements (a transaction-mode pooler)
    // would otherwise leave the scratch key counted on a backend the pooler hands to others.
    let try_sql = format!(
        "SELECT CASE WHEN pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int4, \
         ({})::pg_catalog.int4) THEN pg_catalog.pg_backend_pid() END",
        key.class, key.id
    );
    let mut granted: Vec<(&Client, i32)> = Vec::new();
    // Who holds the scratch key when the first try is refused: a doctor interrupted through
    // a transaction-mode pooler leaves its key on the backend it was granted on.
    let holders_sql = format!(
        "SELECT pg_catalog.string_agg(pid::pg_catalog.text, ', ') FROM pg_catalog.pg_locks \
         WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted \
         AND classid OPERATOR(pg_catalog.=) ({})::pg_catalog.oid \
         AND objid OPERATOR(pg_catalog.=) ({})::pg_catalog.oid \
         AND objsubid OPERATOR(pg_catalog.=) 2",
        key.class as u32, key.id as u32
    );
    let mut holders: Option<String> = None;
    let exclusion = async {
        let (first, ended): (Option<i32>, _) = one_and_end(a, &try_sql, bound).await?;
        granted.extend(first.map(|pid| (a, pid)));
        ended?;
        if first.is_none() {
            holders = one(a, &holders_sql, bound).await.ok().flatten();
        }
        let (second, ended): (Option<i32>, _) = one_and_end(b, &try_sql, bound).await?;
        granted.extend(second.map(|pid| (b, pid)));
        ended?;
        if let Some(pid) = first {
            give_back(a, key, pid, &mut granted).await;
        }
        let (after_release, ended): (Option<i32>, _) = one_and_end(b, &try_sql, bound).await?;
        granted.extend(after_release.map(|pid| (b, pid)));
        ended?;
        Ok::<_, Error>((first.is_some(), second.is_some(), after_release.is_some()))
    };
    let exclusion = exclusion.await;
    // Every grant left, a failed check's included; what cannot be given back is said.
    for (client, pid) in granted.clone() {
        give_back(client, key, pid, &mut granted).await;
    }
    let mut stranded: Vec<i32> = granted.iter().map(|&(_, pid)| pid).collect();
    // A grant whose answer never came (a statement past its bound) is counted nowhere: once
    // the key was ours, any holder left is.
    if stranded.is_empty() && matches!(exclusion, Ok((true, _, _)) | Err(_)) {
        if let Ok(Some(pids)) = one::<Option<String>>(a, &holders_sql, bound).await {
            stranded.extend(pids.split(", ").filter_map(|pid| pid.parse::<i32>().ok()));
        }
    }
    if !stranded.is_empty() {
        out.push(Finding::fail(
            "exclusion",
            format!(
                "the scratch key {}:{scratch} could not be given back on server backend(s) \
                 {stranded:?}, where it was granted: the session's statements ran on other \
                 backends",
                lock.class
            ),
            format!(
                "a transaction-mode pooler moves the session between statements; the key \
                 stays held until it closes that server connection (SELECT \
                 pg_catalog.pg_terminate_backend({}) frees it now)",
                stranded[0]
            ),
        ));
    }
    match exclusion {
        Ok((true, false, true)) => out.push(Finding::pass(
            "exclusion",
            format!(
                "a second session cannot take a lock the first holds, and gets it once \
                 released (scratch key {}:{scratch}; --scratch-id picks the id)",
                lock.class
            ),
        )),
        Ok((false, _, _)) => out.push(Finding::fail(
            "exclusion",
            format!(
                "the scratch key {}:{scratch} is held by another session{}",
                lock.class,
                holders
                    .as_ref()
                    .map(|pids| format!(" (server backend {pids})"))
                    .unwrap_or_default()
            ),
            "pick a free id of the class with --scratch-id; a doctor interrupted through a \
             transaction-mode pooler leaves its key on the pooled backend, which \
             pg_terminate_backend(pid) frees",
        )),
        Ok((first, second, after)) => out.push(Finding::fail(
            "exclusion",
            format!("first session granted: {first}, second while held: {second}, second after release: {after}"),
            "both sessions reached one backend or the lock did not hold: a transaction-mode \
             pooler (PgBouncer pool_mode=transaction) cannot carry session locks; connect directly \
             or through a session-mode pooler",
        )),
        Err(err) => out.push(Finding::fail("exclusion", Chain(&err).to_string(), permission_hint(&err))),
    }

    // The leader's check reads pg_locks: a role that may not is refused every grant
    // (docs/field-notes.md#a-lock-the-check-cannot-see), so no replica could lead.
    match one::<bool>(a, crate::pg::lock::CAN_CHECK_SQL, bound).await {
        Ok(true) => out.push(Finding::pass(
            "check",
            "the role may read pg_locks, which the leader's check reads to prove the lock",
        )),
        Ok(false) => out.push(Finding::fail(
            "check",
            "the role cannot read pg_catalog.pg_locks (or execute pg_catalog.pg_lock_status(), \
             which the view calls): the leader's check could never prove the lock, so every \
             replica would stay a standby",
            "a DBA runs GRANT SELECT ON pg_catalog.pg_locks TO the role (and GRANT EXECUTE ON \
             FUNCTION pg_catalog.pg_lock_status() TO the role, if that was revoked too)",
        )),
        Err(err) => out.push(Finding::fail(
            "check",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    // The grant's fencing token, taken as a grant takes it (a WAL record and a flushed commit):
    // a role without EXECUTE on pg_logical_emit_message could never lead. A hot standby cannot
    // write, and is a failure of its own above. On a server whose commits wait for a
    // synchronous standby the token waits too: with no such standby streaming it would wait
    // for good, so that is said instead of tried. It runs on `b`, which no later check uses:
    // a token still waiting holds up nothing else, and `a` is kept from the role's
    // `idle_session_timeout` meanwhile (`keep_alive`).
    if primary {
        let done = tokio::sync::Notify::new();
        let token = async {
            let finding = fencing_token_finding(a, b, bound).await;
            done.notify_one();
            finding
        };
        let (finding, ()) = tokio::join!(token, keep_alive(a, &done, bound));
        out.push(finding);
    }

    // The session keeps its backend and its session state between statements.
    let sticky = async {
        let pid1: i32 = one(a, "SELECT pg_catalog.pg_backend_pid()", bound).await?;
        let _: String = one(
            a,
            "SELECT pg_catalog.set_config('leaderrun.doctor_marker', 'marked', false)",
            bound,
        )
        .await?;
        let pid2: i32 = one(a, "SELECT pg_catalog.pg_backend_pid()", bound).await?;
        let marker: Option<String> = one(
            a,
            "SELECT pg_catalog.current_setting('leaderrun.doctor_marker', true)",
            bound,
        )
        .await?;
        Ok::<_, Error>((pid1, pid2, marker))
    };
    match sticky.await {
        Ok((p1, p2, Some(m))) if p1 == p2 && m == "marked" => out.push(Finding::pass(
            "session",
            format!("the session keeps its backend ({p1}) and its settings between statements"),
        )),
        Ok((p1, p2, marker)) => out.push(Finding::fail(
            "session",
            format!("backend {p1} then {p2}; session marker {marker:?}"),
            "the session moved between statements: a transaction-mode pooler (PgBouncer \
             pool_mode=transaction, or a hosted pooler) strands or doubles session locks; \
             use a direct connection or a session-mode pooler",
        )),
        Err(err) => out.push(Finding::fail(
            "session",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    // What the replicas' own test finds (docs/election.md#a-standbys-check): the checks above
    // catch a busy transaction-mode pooler only when a statement happens to move.
    let maybe_pooled = !matches!(direct, Ok(true));
    out.push(match direct {
        Ok(true) => Finding::pass(
            "path",
            "the session reaches PostgreSQL directly (the server sees this socket's address and \
             ports, or over a Unix socket its listener is the backend's parent)",
        ),
        Ok(false) => Finding {
            check: "path",
            ok: true,
            detail: "a proxy or a pooler sits between: the server sees other ends than this \
                     socket's (over a Unix socket: its listener is not the backend's parent)"
                .into(),
            hint: Some(
                "a TCP proxy or a session-mode pooler works; through a transaction-mode pooler no \
                 replica leads (each finds it), and the session and exclusion lines above may \
                 pass by chance"
                    .into(),
            ),
        },
        Err(err) => Finding {
            check: "path",
            ok: true,
            detail: format!(
                "whether a proxy or pooler sits between could not be told: {}",
                Chain(&err)
            ),
            hint: Some("the replicas ask it on their own sessions".into()),
        },
    });

    match one::<String>(
        a,
        // `true`: set for its transaction only, whose end takes it back.
        "SELECT pg_catalog.set_config('idle_session_timeout', '60000', true)",
        bound,
    )
    .await
    {
        Ok(_) => out.push(Finding::pass(
            "idle timeout",
            "idle_session_timeout can be set on the lock session",
        )),
        Err(Error::Query { source, .. })
            if source.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) =>
        {
            // Holds, weaker: the lock session's TCP timers still free the lock of a leader
            // cut off by the network within about idle_session_timeout.
            out.push(Finding {
                check: "idle timeout",
                ok: true,
                detail: "the server has no idle_session_timeout (PostgreSQL before 14): the lock \
                         session's TCP keepalives and tcp_user_timeout free the lock of a leader \
                         cut off by the network within about idle_session_timeout (20s by \
                         default), but a leader frozen with its connection open (a stopped process, a paused VM) keeps the \
                         lock until it wakes"
                    .into(),
                hint: Some("upgrade to PostgreSQL 14 or later for that bound too".into()),
            })
        }
        Err(err) => out.push(Finding::fail(
            "idle timeout",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    match one::<Option<bool>>(
        a,
        "SELECT ssl FROM pg_catalog.pg_stat_ssl \
         WHERE pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()",
        bound,
    )
    .await
    {
        Ok(Some(true)) => out.push(Finding::pass("tls", "the session is encrypted (TLS)")),
        Ok(_) => out.push(Finding::pass(
            "tls",
            "the session is not encrypted (fine on a trusted network or a Unix socket)",
        )),
        Err(err) => out.push(Finding::fail(
            "tls",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }

    // The report's statements in one bounded transaction, as `status` sends them.
    let leader = async {
        crate::pg::begin_bounded("session settings", a, bound).await?;
        let r = report(a, server, lock, slots, bound).await;
        let _ = crate::pg::end_bounded(a, bound).await;
        r
    };
    match leader.await {
        Ok(r) => out.push(Finding::pass(
            "leader",
            match &r.leader {
                Some(l) => format!(
                    "{} is held by backend {} ({})",
                    r.lock,
                    l.pid,
                    match (&l.host, l.leaderrun_pid) {
                        (Some(host), Some(pid)) => format!("leaderrun on {host} (pid {pid})"),
                        _ => crate::pg::holder::Who {
                            application_name: l.application_name.as_deref(),
                            query: None,
                        }
                        .to_string(),
                    }
                ),
                None => format!("nobody holds {} right now", r.lock),
            },
        )),
        Err(err) => out.push(Finding::fail(
            "leader",
            Chain(&err).to_string(),
            permission_hint(&err),
        )),
    }
    // A pooler with no server connection free for a session (a session-mode pool of one and
    // doctor's two sessions) makes its statements wait until they time out: said where they
    // did, unless the path is known to be direct.
    if maybe_pooled {
        for f in out
            .iter_mut()
            .filter(|f| !f.ok && f.detail.contains("timed out after"))
        {
            let hint = f.hint.take().unwrap_or_default();
            f.hint = Some(format!(
                "{hint}; if a pooler sits between (see path), one with no server connection \
                 free for this session (its pool size) makes its statements wait"
            ));
        }
    }
    out
}

/// The finding about the database the lock lives in: advisory locks are per database, so
/// leaderrun refuses to run (exit 125) when no setting names it (the user's name, psql's
/// default, would let copies connecting as different users elect a leader each); doctor still
/// runs its checks there and fails this finding, so a gate on `doctor` never passes settings
/// the job refuses. `database_from` is [`crate::pg::conninfo::ConnSettings::database_from`].
pub fn database_finding(database: &str, database_from: &str) -> Finding {
    if database_from == "default" {
        Finding {
            check: "database",
            ok: false,
            detail: format!(
                "no setting names the database, so leaderrun refuses to run with these \
                 settings (exit 125); these checks ran in database {database}, the user's name \
                 (psql's default)"
            ),
            hint: Some(
                "advisory locks are per database: copies that connect as different users \
                 without naming a database would elect a leader each; name the database in the \
                 DSN (dbname=, /DB in a URL), PGDATABASE or a service"
                    .to_owned(),
            ),
        }
    } else {
        Finding::pass(
            "database",
            format!("the lock lives in database {database} (from {database_from})"),
        )
    }
}

/// `leaderrun doctor`: prints each finding; exit 0 when all hold, 1 when one fails, 125 when
/// it cannot connect. A finding that holds but comes with a hint is printed as `warn` and does
/// not change the exit status. `database_from` says where the database name came from
/// ([`crate::pg::conninfo::ConnSettings::database_from`]); `scratch_id` is `--scratch-id`, the id
/// of the scratch key in the lock's class (default: derived from this process). INT or TERM
/// (from `signals`) ends it at once, printing no finding: [`Exit::Interrupted`].
// Each argument is one setting of the command line; a struct of them would serve one call.
#[allow(clippy::too_many_arguments)]
pub fn doctor_main(
    connect_config: &tokio_postgres::Config,
    tls: &crate::pg::tls::TlsSettings,
    lock: LockKey,
    slots: u32,
    bound: Duration,
    database_from: &str,
    scratch_id: Option<i32>,
    mut signals: SignalStream,
) -> Exit {
    let Some(rt) = runtime() else {
        return Exit::Code(EXIT_FAILURE);
    };
    let server = describe(connect_config);
    // A scratch id of the same class that no replica uses: --scratch-id, or derived from this
    // process.
    let scratch = scratch_id.unwrap_or_else(|| {
        crate::pg::lock::lock_id_for_name(&format!(
            "leaderrun doctor {} {}",
            std::process::id(),
            lock.id
        ))
    });
    let work = async {
        // Both connect at once (a hung first host of a list costs one `connect_timeout`), and
        // the first there keeps its session from the role's `idle_session_timeout` until the
        // other is there (`keep_alive`): every check then asks in a transaction of its own
        // (`one`).
        let arrived = std::cell::Cell::new(0u8);
        let both_there = tokio::sync::Notify::new();
        let open = || async {
            let connected =
                crate::elector::connect_socket(connect_config, tls, &server, bound, None, None)
                    .await;
            arrived.set(arrived.get() + 1);
            let first = arrived.get() == 1;
            if !first {
                both_there.notify_one();
            }
            let ((client, closed, task), link) = connected?;
            if first {
                keep_alive(&client, &both_there, bound).await;
            }
            Ok::<_, Error>((client, link, closed, task))
        };
        let (a, b) = tokio::join!(open(), open());
        let ((a, link, _ca, _ta), (b, _, _cb, _tb)) = (a?, b?);
        // The replicas' own test, on the first session.
        let direct = crate::elector::session_is_direct(&a, &link, bound).await;
        Ok::<_, Error>(findings(&a, &b, &server, lock, slots, scratch, direct, bound).await)
    };
    let result = match until_interrupted(rt, &mut signals, "doctor", work) {
        Ok(result) => result,
        Err(sig) => return Exit::Interrupted(sig),
    };
    let database = connect_config.get_dbname().unwrap_or("");
    Exit::Code(match result {
        Ok(mut findings) => {
            findings.insert(1, database_finding(database, database_from));
            for f in &findings {
                let label = match (f.ok, &f.hint) {
                    (false, _) => "FAIL",
                    (true, Some(_)) => "warn",
                    (true, None) => "ok",
                };
                out(&line(&format!(
                    "{:<4}  {:<CHECK_WIDTH$}  {}",
                    label, f.check, f.detail
                )));
                if let Some(hint) = &f.hint {
                    out(&line(&format!(
                        "{:<4}  {:<CHECK_WIDTH$}  hint: {hint}",
                        "", ""
                    )));
                }
            }
            if output_lost() {
                return Exit::Code(EXIT_FAILURE);
            }
            u8::from(findings.iter().any(|f| !f.ok))
        }
        Err(err) => {
            out(&line(&format!(
                "FAIL  {:<CHECK_WIDTH$}  {}",
                "connect",
                Chain(&err)
            )));
            out(&line(&format!(
                "      {:<CHECK_WIDTH$}  hint: {}; leaderrun connects exactly like this",
                "",
                connect_hint(&err)
            )));
            EXIT_FAILURE
        }
    })
}

#[cfg(test)]
mod qualified {
    #[test]
    fn every_name_in_doctors_own_statements_is_the_catalogs() {
        crate::pg::assert_qualified(super::STREAMING_SYNC_STANDBYS_SQL);
        crate::pg::assert_qualified(super::KEEP_ALIVE_SQL);
    }
}
