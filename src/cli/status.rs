//! `leaderrun status` and `leaderrun step-down` (docs/guarantees.md#observing-a-replica); `doctor`
//! is in [`super::doctor`].
//!
//! `status` runs the seed's `pg_locks` query for the key in use, joined to `pg_stat_activity`:
//! the leader's backend pid, application name (`leaderrun@HOST:PID`), client address and port,
//! backend start, and, read back from the text of the leader's check statement, its term, the
//! time it began leading and its fencing token. Waiters are sessions queued on the key.
//!
//! Long because `status` is one report (the queries, their rows, and two renderings: text and
//! JSON) and `step-down` is one careful sequence over it (see its doc); they share every query.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::Client;

use crate::cli::exit_codes::FAILURE as EXIT_FAILURE;
use crate::cli::logging::escape_text;
use crate::elector::{connect, LockKey};
use crate::elector::{standby_comment, CLIENT_CONNECTION_CHECK};
use crate::error::{Chain, Error};
use crate::pg::conninfo::describe;
use crate::pg::lock::{current_database_oid, MAX_SLOTS};
use crate::pg::within;
use crate::process::signals::{is_shutdown, suspend_self, SignalStream};
use crate::supervisor::Exit;
use nix::sys::signal::Signal;

/// The leader as `status` sees it. Field names are stable (`--json`, documented in README).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Leader {
    /// The slot it holds, 0 … N−1 (`--slots N`; always 0 with one slot).
    pub slot: u32,
    /// The key of that slot, `class:id` (docs/guarantees.md#the-lock-key-and-slots: slot k is
    /// `class + k : id`).
    pub lock: String,
    /// Backend pid of the lock session.
    pub pid: i32,
    /// Whether the holder is a leaderrun (its `application_name` is `leaderrun@HOST:PID`, or its
    /// statements say so). Any other holder (a psql session, the plexsphere API's own Elector)
    /// leads too. False also when it cannot be told: see `activity_tracked`.
    pub leaderrun: bool,
    /// Whether the server tracks the lock session's activity. False when `track_activities` is
    /// off for it (for the server, its role or database, or the session:
    /// `pg_stat_activity.state` is `disabled`): its statements are not shown, so its term,
    /// since and fencing token are unknown (null), and so are its host and leaderrun pid
    /// unless its `application_name` names them.
    pub activity_tracked: bool,
    /// The leader's host, from `application_name` `leaderrun@HOST:PID`; null when the holder
    /// is not leaderrun.
    pub host: Option<String>,
    /// The pid of the leaderrun process on that host (not the backend's), from
    /// `application_name`; null when the holder is not leaderrun.
    pub leaderrun_pid: Option<u32>,
    /// `application_name` of the lock session (`leaderrun@HOST:PID` unless the DSN set one).
    pub application_name: Option<String>,
    /// Client address of the lock session (null for Unix sockets or without permission).
    pub client_addr: Option<String>,
    /// Client port of the lock session.
    pub client_port: Option<i32>,
    /// When the lock session's backend started (RFC 3339, UTC).
    pub backend_start: Option<String>,
    /// The term number in the leading process, when its check statement is visible. It counts
    /// the terms of that one process: every new leader process says 1.
    pub term: Option<u64>,
    /// When this term began (RFC 3339, UTC), when known.
    pub since: Option<String>,
    /// Seconds the leader has led, when known (local clock minus `since`).
    pub leading_seconds: Option<u64>,
    /// The fencing token of the term (`LEADERRUN_FENCING_TOKEN`), when known: greater for
    /// every later term of any replica.
    pub fencing_token: Option<i64>,
}

/// A standby of the lock: a session in line for it (waiting in the server's queue, or
/// holding a place in line, see [`LockKey::queue_key`]) or one that tries it once per check
/// interval (found by the comment its statements carry in `pg_stat_activity.query`).
#[derive(Debug, Serialize, PartialEq)]
pub struct Standby {
    /// Backend pid of the standby's session.
    pub backend_pid: i32,
    /// Whether it waits in the server's lock queue right now (for a slot or for the place
    /// ahead of it); its pid is then in [`Report::waiters`].
    pub queued: bool,
    /// Its place in the line of standbys (1: the queue head, which waits for the lock
    /// itself; 2: the one behind it); null for a standby that is not in line and tries the
    /// lock once per interval.
    pub place: Option<u32>,
    /// The slot whose line it is in; null when it is not in line.
    pub slot: Option<u32>,
    /// Whether it waits in the line of a slot beyond the `--slots` asked (its statement is the
    /// key's standby statement and waits for an advisory lock that is none of theirs): ask
    /// with more `--slots` to see which.
    pub other_slot: bool,
    /// Whether it is a leaderrun (`application_name` `leaderrun@HOST:PID`).
    pub leaderrun: bool,
    /// Its host, from `application_name`; null when it is not leaderrun.
    pub host: Option<String>,
    /// The pid of the leaderrun process on that host, from `application_name`.
    pub leaderrun_pid: Option<u32>,
    /// Its `application_name`.
    pub application_name: Option<String>,
    /// Its client address (null for Unix sockets or without permission).
    pub client_addr: Option<String>,
    /// When its current wait began (RFC 3339, UTC; PostgreSQL 14 and later), when known. A
    /// standby renews its wait every check interval.
    pub waiting_since: Option<String>,
}

impl Standby {
    /// A standby session as `pg_stat_activity` shows it, not (yet) known to be in line.
    fn seen(
        backend_pid: i32,
        application_name: Option<String>,
        client_addr: Option<String>,
        query: Option<&str>,
    ) -> Self {
        let (host, leaderrun_pid) = who(application_name.as_deref(), query);
        Standby {
            backend_pid,
            queued: false,
            place: None,
            slot: None,
            other_slot: false,
            leaderrun: host.is_some(),
            host,
            leaderrun_pid,
            application_name,
            client_addr,
            waiting_since: None,
        }
    }
}

/// One slot and its leader in a [`Report`].
#[derive(Debug, Serialize, PartialEq)]
pub struct Slot {
    /// The slot, 0 … N−1.
    pub slot: u32,
    /// Its key, `class:id`.
    pub lock: String,
    /// Its leader, or null.
    pub leader: Option<Leader>,
}

/// The output of `status`; also its `--json` form (field names are stable).
#[derive(Debug, Serialize)]
pub struct Report {
    /// The key, `class:id`.
    pub lock: String,
    /// First int4.
    pub lock_class: i32,
    /// Second int4.
    pub lock_id: i32,
    /// The database the key lives in (advisory locks are per database).
    pub database: String,
    /// The server, redacted (no password).
    pub server: String,
    /// The server is a hot standby (`pg_is_in_recovery()`): it grants advisory locks of its
    /// own, on which no replica leads (docs/field-notes.md#a-hot-standby-grants-its-own-locks),
    /// so what this report shows is not the election's; the leader is on the primary.
    pub in_recovery: bool,
    /// How many slots were asked about (`--slots N`, default 1).
    pub slots: u32,
    /// The leader of slot 0 (with one slot: the leader), or, when slot 0 is free, of the
    /// first slot that is held; null when none is.
    pub leader: Option<Leader>,
    /// Every slot with its leader, in slot order.
    pub slot_leaders: Vec<Slot>,
    /// Backend pids of the standbys that wait in the server's lock queue right now (for a
    /// slot, or for the place ahead of them in line), in pid order.
    pub waiters: Vec<i32>,
    /// Every standby session: those in line first (by slot and place), then those that try
    /// the lock once per interval, each group in pid order.
    pub standbys: Vec<Standby>,
    /// How many other sessions of the database have their activity untracked
    /// (`track_activities` off, `pg_stat_activity.state` `disabled`), leaders and standbys in
    /// line not counted: a standby that tries once per interval is found by its statement,
    /// which such a session does not show, so any among them is not listed.
    pub untracked_sessions: u32,
    /// Slots at or beyond `slots` (up to 1023) whose key is held: a hint that the lock is
    /// used with a larger `--slots` than was asked about. Slot numbers, ascending.
    pub more_slots_held: Vec<u32>,
    /// The key's last runs from the history table (`--history`), newest first; empty when
    /// the table does not exist.
    pub runs: Vec<crate::history::Run>,
    /// The schedule (`--schedule`, else the one the newest scheduled run was made under),
    /// or null.
    pub schedule: Option<String>,
    /// Its zone's name, or null.
    pub tz: Option<String>,
    /// The next due time of that schedule (RFC 3339 in its zone), or null.
    pub next_due_at: Option<String>,
    /// Why the next due time of the stored schedule cannot be told here (its zone cannot be
    /// loaded, or has no name; the schedule itself cannot be read); not in `--json`, whose
    /// `next_due_at` is null then.
    #[serde(skip)]
    pub next_due_unknown: Option<String>,
}

/// Which slots' keys beyond the ones asked about are held. `$1`: their classes (`oid[]`),
/// `$2`: the id.
const MORE_SLOTS_SQL: &str = concat!(
    "SELECT l.classid FROM pg_catalog.pg_locks l \
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted \
       AND l.objsubid OPERATOR(pg_catalog.=) 2 \
       AND l.database OPERATOR(pg_catalog.=) ",
    current_database_oid!(),
    " AND l.objid OPERATOR(pg_catalog.=) $2 AND l.classid OPERATOR(pg_catalog.=) ANY ($1)"
);

/// The seed's `pg_locks` query for every slot's key and every place in line, joined to
/// `pg_stat_activity`. `$1`: the slots' classes, `$2`: the places' classes (both `oid[]`, the
/// unsigned view of the int4), `$3`: the id.
const STATUS_SQL: &str = concat!(
    "SELECT l.pid, l.granted, ",
    activity_bytes!("a.application_name"),
    ", pg_catalog.host(a.client_addr), \
       CASE WHEN a.client_port OPERATOR(pg_catalog.<>) -1 THEN a.client_port END, \
       pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ",
    activity_bytes!("a.query"),
    ", pg_catalog.current_database(), \
       pg_catalog.to_char((pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart')\
         ::pg_catalog.timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
       l.classid, l.objsubid, a.state OPERATOR(pg_catalog.=) 'disabled' \
     FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a \
       ON a.pid OPERATOR(pg_catalog.=) l.pid \
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' \
       AND l.database OPERATOR(pg_catalog.=) ",
    current_database_oid!(),
    " AND l.objid OPERATOR(pg_catalog.=) $3 \
       AND ((l.objsubid OPERATOR(pg_catalog.=) 2 AND l.classid OPERATOR(pg_catalog.=) ANY ($1)) \
         OR (l.objsubid OPERATOR(pg_catalog.=) 1 AND l.classid OPERATOR(pg_catalog.=) ANY ($2))) \
     ORDER BY l.granted DESC, l.pid"
);

/// Standby sessions between their checks: their last statement carries
/// [`standby_comment`]. `$1`: the comment, `$2`: the id, `$3`: the classes of the slots and
/// places asked (`oid[]`); the last column says whether it waits for a lock of this id outside
/// them (the line of another slot).
const STANDBYS_SQL: &str = concat!(
    "SELECT a.pid, ",
    activity_bytes!("a.application_name"),
    ", pg_catalog.host(a.client_addr), ",
    activity_bytes!("a.query"),
    ", EXISTS (SELECT FROM pg_catalog.pg_locks l \
       WHERE l.pid OPERATOR(pg_catalog.=) a.pid AND NOT l.granted \
         AND l.locktype OPERATOR(pg_catalog.=) 'advisory' \
         AND l.objid OPERATOR(pg_catalog.=) $2 \
         AND NOT l.classid OPERATOR(pg_catalog.=) ANY ($3)) \
     FROM pg_catalog.pg_stat_activity a \
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() \
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid() \
       AND pg_catalog.starts_with(a.query, $1) \
     ORDER BY a.pid"
);

/// Sessions of the database whose activity is not tracked (`track_activities` off): their
/// statements, the comment a standby is found by included, are not shown.
const UNTRACKED_SQL: &str = "SELECT a.pid FROM pg_catalog.pg_stat_activity a \
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() \
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid() \
       AND a.state OPERATOR(pg_catalog.=) 'disabled'";

use crate::pg::holder::{activity_bytes, activity_text, parse_check_comment};

/// The host and pid of a leaderrun session: from `leaderrun@HOST:PID`, else from the
/// identity comment of its last statement ([`crate::pg::holder::identify`]).
fn who(application_name: Option<&str>, query: Option<&str>) -> (Option<String>, Option<u32>) {
    match crate::pg::holder::identify(application_name, query) {
        Some((host, pid)) => (Some(host), Some(pid)),
        None => (None, None),
    }
}

/// Queries who holds `lock`'s `slots` slots (1 for an ordinary lock) through `client`, and
/// who stands by.
///
/// # Errors
/// [`Error::Query`] when the query fails; [`Error::Timeout`] after `bound`.
pub async fn report(
    client: &Client,
    server: &str,
    lock: LockKey,
    slots: u32,
    bound: Duration,
) -> Result<Report, Error> {
    use crate::pg::lock::QUEUE_PLACES;
    let slots = slots.max(1);
    // pg_locks shows the int4 halves as oid, i.e. unsigned.
    let slot_classes: Vec<u32> = (0..slots).map(|k| lock.slot(k).class as u32).collect();
    let mut place_classes = Vec::new();
    let mut places = std::collections::HashMap::new();
    for k in 0..slots {
        for place in 1..=QUEUE_PLACES {
            let class = (lock.slot(k).queue_key(place) >> 32) as u32;
            place_classes.push(class);
            places.insert(class, (k, place));
        }
    }
    let id = lock.id as u32;
    let comment = standby_comment(lock);
    use tokio_postgres::types::{ToSql, Type};
    // Typed, so sent as the unnamed statement: nothing stays prepared on a server connection
    // a pooler hands to other clients next.
    let lock_params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&slot_classes, Type::OID_ARRAY),
        (&place_classes, Type::OID_ARRAY),
        (&id, Type::OID),
    ];
    let asked_classes: Vec<u32> = slot_classes.iter().chain(&place_classes).copied().collect();
    let comment_params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&comment, Type::TEXT),
        (&id, Type::OID),
        (&asked_classes, Type::OID_ARRAY),
    ];
    let more_classes: Vec<u32> = (slots..MAX_SLOTS)
        .map(|k| lock.slot(k).class as u32)
        .collect();
    let more_params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&more_classes, Type::OID_ARRAY), (&id, Type::OID)];
    // All in one flight, in this order (`biased`): inside a transaction (`status`,
    // `step-down`: crate::pg::begin_bounded) the server keeps what pg_stat_activity showed
    // first for the rest of it, so a later look clears that before it reads.
    let (cleared, rows, between, more, recovery, untracked) = tokio::join!(
        biased;
        within(
            "activity snapshot",
            bound,
            client.query_typed("SELECT pg_catalog.pg_stat_clear_snapshot()", &[]),
        ),
        within(
            "status query",
            bound,
            client.query_typed(STATUS_SQL, &lock_params),
        ),
        within(
            "standbys query",
            bound,
            client.query_typed(STANDBYS_SQL, &comment_params),
        ),
        within(
            "other slots query",
            bound,
            client.query_typed(MORE_SLOTS_SQL, &more_params),
        ),
        within(
            "recovery query",
            bound,
            client.query_typed("SELECT pg_catalog.pg_is_in_recovery()", &[]),
        ),
        within(
            "untracked sessions query",
            bound,
            client.query_typed(UNTRACKED_SQL, &[]),
        )
    );
    cleared?;
    let (rows, between, more, untracked) = (rows?, between?, more?, untracked?);
    let in_recovery = recovery?.first().is_some_and(|row| row.get::<_, bool>(0));
    let mut more_slots_held: Vec<u32> = more
        .iter()
        .map(|row| row.get::<_, u32>(0).wrapping_sub(lock.class as u32))
        .collect();
    more_slots_held.sort_unstable();
    let database = match rows.first() {
        Some(row) => row.get(7),
        None => {
            let row = client
                .query_typed("SELECT pg_catalog.current_database()", &[])
                .await;
            row.ok()
                .and_then(|rows| rows.first().map(|r| r.get(0)))
                .unwrap_or_default()
        }
    };
    let mut slot_leaders: Vec<Slot> = (0..slots)
        .map(|k| Slot {
            slot: k,
            lock: lock.slot(k).to_string(),
            leader: None,
        })
        .collect();
    let mut waiters = Vec::new();
    let mut in_line: Vec<Standby> = Vec::new();
    for row in &rows {
        let pid: i32 = row.get(0);
        let granted: bool = row.get(1);
        let application_name = activity_text(row.get(2));
        let activity = activity_text(row.get(6));
        let (host, leaderrun_pid) = who(application_name.as_deref(), activity.as_deref());
        let class: u32 = row.get(9);
        let objsubid: i16 = row.get(10);
        if !granted {
            waiters.push(pid);
        }
        if granted && objsubid == 2 {
            let slot = class.wrapping_sub(lock.class as u32);
            let (term, since, fencing_token) =
                parse_check_comment(activity.as_deref().unwrap_or(""));
            let leading_seconds = since
                .as_deref()
                .and_then(|s| humantime::parse_rfc3339(s).ok())
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map(|d| d.as_secs());
            if let Some(entry) = slot_leaders.get_mut(slot as usize) {
                entry.leader = Some(Leader {
                    slot,
                    lock: lock.slot(slot).to_string(),
                    pid,
                    leaderrun: host.is_some(),
                    activity_tracked: row.get::<_, Option<bool>>(11) != Some(true),
                    host,
                    leaderrun_pid,
                    application_name,
                    client_addr: row.get(3),
                    client_port: row.get(4),
                    backend_start: row.get(5),
                    term,
                    since,
                    leading_seconds,
                    fencing_token,
                });
            }
            continue;
        }
        let standby = match in_line.iter_mut().find(|s| s.backend_pid == pid) {
            Some(standby) => standby,
            None => {
                in_line.push(Standby::seen(
                    pid,
                    application_name,
                    row.get(3),
                    activity.as_deref(),
                ));
                in_line.last_mut().expect("just pushed")
            }
        };
        if !granted {
            standby.queued = true;
            standby.waiting_since = row.get(8);
        } else if let Some(&(slot, place)) = places.get(&class) {
            standby.place = Some(place);
            standby.slot = Some(slot);
        }
    }
    waiters.sort_unstable();
    in_line.sort_by_key(|s| (s.slot, s.place, s.backend_pid));
    let leaders: Vec<i32> = slot_leaders
        .iter()
        .filter_map(|s| s.leader.as_ref().map(|l| l.pid))
        .collect();
    let mut standbys = in_line;
    for row in &between {
        let pid: i32 = row.get(0);
        if leaders.contains(&pid) || standbys.iter().any(|s| s.backend_pid == pid) {
            continue;
        }
        let query = activity_text(row.get(3));
        let mut standby =
            Standby::seen(pid, activity_text(row.get(1)), row.get(2), query.as_deref());
        standby.other_slot = row.get(4);
        standbys.push(standby);
    }
    let untracked_sessions = untracked
        .iter()
        .map(|row| row.get::<_, i32>(0))
        .filter(|pid| !leaders.contains(pid) && !standbys.iter().any(|s| s.backend_pid == *pid))
        .count() as u32;
    let leader = slot_leaders.iter().find_map(|s| s.leader.clone());
    Ok(Report {
        lock: lock.to_string(),
        lock_class: lock.class,
        lock_id: lock.id,
        database,
        server: server.to_owned(),
        in_recovery,
        slots,
        leader,
        slot_leaders,
        waiters,
        standbys,
        untracked_sessions,
        more_slots_held,
        runs: Vec::new(),
        schedule: None,
        tz: None,
        next_due_at: None,
        next_due_unknown: None,
    })
}

/// Adds the key's last runs from `table` (when it exists) and the next due time of
/// `schedule`, else of the schedule the newest run was made under. A history that cannot be
/// read is a WARN, not an error of `status`.
pub async fn add_history(
    report: &mut Report,
    client: &Client,
    table: &crate::history::TableName,
    lock: LockKey,
    schedule: Option<&crate::supervisor::schedule::Schedule>,
    bound: Duration,
) {
    let exists = within(
        "history table lookup",
        bound,
        client.query_typed(
            "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
            &[(&table.sql(), tokio_postgres::types::Type::TEXT)],
        ),
    )
    .await
    .map(|rows| rows.first().is_some_and(|row| row.get::<_, bool>(0)));
    let mut stored = None;
    match exists {
        Ok(true) => {
            match crate::history::recent(client, table, lock, crate::history::STATUS_RUNS, bound)
                .await
            {
                Ok(recent) => {
                    report.runs = recent.runs;
                    stored = recent.schedule;
                }
                Err(err) => {
                    tracing::warn!("status: cannot read the history {table}: {}", Chain(&err))
                }
            }
        }
        Ok(false) => {}
        Err(err) => tracing::warn!(
            "status: cannot look for the history {table}: {}",
            Chain(&err)
        ),
    }
    let schedule = match (schedule, stored) {
        (Some(s), _) => s.clone(),
        (None, None) => return,
        (None, Some((expr, tz))) => match stored_schedule(&expr, &tz) {
            Ok(s) => s,
            Err(why) => {
                // Shown without a next due time rather than with one from another zone.
                tracing::warn!(
                    "status: cannot tell the next due time of the schedule {expr} ({tz}) the \
                     runs were made under: {why}; give status --schedule and --tz"
                );
                report.schedule = Some(expr);
                report.tz = Some(tz);
                report.next_due_unknown = Some(why);
                return;
            }
        },
    };
    report.schedule = Some(schedule.expr().to_owned());
    report.tz = Some(schedule.zone().to_owned());
    report.next_due_at = schedule
        .next_after(SystemTime::now())
        .map(|t| schedule.format(t));
}

/// The schedule `expr` the history stored, in the zone `tz` it stored with it: the zone the
/// runs were made in, loaded by that name ([`crate::supervisor::schedule::Zone::name`]);
/// why not, when it cannot be.
fn stored_schedule(expr: &str, tz: &str) -> Result<crate::supervisor::schedule::Schedule, String> {
    use crate::supervisor::schedule::{stored_zone, Schedule, LOCAL_TIME};
    if tz == LOCAL_TIME || tz.is_empty() {
        // This host's local time need not be the runs' host's.
        return Err(format!(
            "the zone of the runs has no name ({LOCAL_TIME:?}: their host's /etc/localtime, or a \
             POSIX TZ rule as earlier releases stored one)"
        ));
    }
    let zone =
        stored_zone(tz).map_err(|e| format!("the runs' zone cannot be loaded here ({e})"))?;
    // Not the `--schedule` of this command line: the one the runs were stored with.
    Schedule::parse(expr, zone).map_err(|e| format!("the runs' schedule cannot be read ({e})"))
}

fn show<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "unknown".to_owned(), T::to_string)
}

impl Leader {
    /// Who leads, in words: the host and leaderrun's pid when its sessions say them, else the
    /// session's application name as [`crate::pg::holder::Who`] shows it.
    fn who(&self) -> String {
        match (&self.host, self.leaderrun_pid) {
            (Some(host), Some(pid)) => format!("{host}, leaderrun pid {pid}"),
            // Its statements, which would say whether it is leaderrun, are not shown.
            _ if !self.activity_tracked => format!(
                "unknown: application_name={}, and its activity is not tracked",
                self.application_name.as_deref().unwrap_or("")
            ),
            _ => crate::pg::holder::Who {
                application_name: self.application_name.as_deref(),
                query: None,
            }
            .to_string(),
        }
    }

    /// The leader's lines of the table.
    fn lines(&self, out: &mut String) {
        out.push_str(&line(&format!("leader         {}", self.who())));
        out.push_str(&line(&format!("leader pid     {} (backend)", self.pid)));
        if !self.activity_tracked {
            // Said, or the unknowns below would look like a leader before its first check.
            out.push_str(&line(
                "activity       not tracked: track_activities is off for the leader's session \
                 (server, role or database setting), so pg_stat_activity shows none of its \
                 statements, and its term, since and fencing token are unknown",
            ));
        }
        out.push_str(&line(&format!(
            "application    {}",
            show(&self.application_name)
        )));
        let client = match (&self.client_addr, self.client_port) {
            (Some(addr), Some(port)) if port > 0 => format!("{addr}:{port}"),
            (Some(addr), _) => addr.clone(),
            (None, _) => "local socket or not visible".to_owned(),
        };
        out.push_str(&line(&format!("client         {client}")));
        out.push_str(&line(&format!(
            "backend start  {}",
            show(&self.backend_start)
        )));
        let led = match (&self.since, self.leading_seconds) {
            (Some(since), Some(secs)) => format!(
                "{since} ({})",
                humantime::format_duration(Duration::from_secs(secs))
            ),
            (Some(since), None) => since.clone(),
            _ => "unknown".to_owned(),
        };
        out.push_str(&line(&format!("leading since  {led}")));
        out.push_str(&line(&format!(
            "term           {} (terms of this leader process)",
            show(&self.term)
        )));
        out.push_str(&line(&format!(
            "fencing token  {} (grows across all replicas)",
            show(&self.fencing_token)
        )));
    }
}

impl Report {
    /// The human table.
    ///
    /// Every line goes through `line`: what it shows of the database (a database's name, a
    /// host or `application_name` a session chose, a history row, a schedule) is escaped.
    pub fn table(&self) -> String {
        let mut out = line(&format!(
            "lock           {} (database {}, {})",
            self.lock, self.database, self.server
        ));
        if self.in_recovery {
            out.push_str(&line(
                "server         a hot standby (in recovery): no replica leads here, and these \
                 are its own locks; ask the primary",
            ));
        }
        if self.slots > 1 {
            let held = self
                .slot_leaders
                .iter()
                .filter(|s| s.leader.is_some())
                .count();
            out.push_str(&line(&format!(
                "slots          {held} of {} held",
                self.slots
            )));
            for slot in &self.slot_leaders {
                out.push_str(&line(&format!(
                    "slot           {} (lock {})",
                    slot.slot, slot.lock
                )));
                match &slot.leader {
                    None => out.push_str(&line("leader         none")),
                    Some(l) => l.lines(&mut out),
                }
            }
        } else {
            match &self.leader {
                None => out.push_str(&line("leader         none")),
                Some(l) => l.lines(&mut out),
            }
        }
        let waiters = if self.waiters.is_empty() {
            "none".to_owned()
        } else {
            self.waiters
                .iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&line(&format!("waiters        {waiters}")));
        if self.untracked_sessions > 0 {
            let (sessions, have) = match self.untracked_sessions {
                1 => ("session", "has"),
                _ => ("sessions", "have"),
            };
            out.push_str(&line(&format!(
                "untracked      {} other {sessions} of this database {have} track_activities \
                 off: a standby among them that is not in line is not listed",
                self.untracked_sessions
            )));
        }
        if let Some(&last) = self.more_slots_held.last() {
            let held: Vec<String> = self.more_slots_held.iter().map(u32::to_string).collect();
            out.push_str(&line(&format!(
                "more slots     {} held too: give --slots {} (or more) to see them",
                held.join(", "),
                last + 1
            )));
        }
        for w in &self.standbys {
            let who = match (&w.host, w.leaderrun_pid) {
                (Some(host), Some(pid)) => format!("{host}, leaderrun pid {pid}"),
                _ => crate::pg::holder::Who {
                    application_name: w.application_name.as_deref(),
                    query: None,
                }
                .to_string(),
            };
            let place = match (w.place, w.slot) {
                (Some(1), Some(slot)) if self.slots > 1 => format!(", queue head of slot {slot}"),
                (Some(1), _) => ", queue head".to_owned(),
                (Some(place), Some(slot)) if self.slots > 1 => {
                    format!(", place {place} in line for slot {slot}")
                }
                (Some(place), _) => format!(", place {place} in line"),
                (None, _) if w.queued => ", waiting".to_owned(),
                (None, _) if w.other_slot => match self.more_slots_held.last() {
                    Some(last) => format!(
                        ", in line for another slot: give --slots {} (or more) to see it",
                        last + 1
                    ),
                    None => ", in line for another slot: give --slots to see it".to_owned(),
                },
                (None, _) => ", tries every check interval".to_owned(),
            };
            let since = w
                .waiting_since
                .as_deref()
                .map(|s| format!(", waiting since {s}"))
                .unwrap_or_default();
            out.push_str(&line(&format!(
                "standby        {who} (backend {}){place}{since}",
                w.backend_pid
            )));
        }
        if let (Some(schedule), Some(tz)) = (&self.schedule, &self.tz) {
            let next = match (&self.next_due_at, &self.next_due_unknown) {
                (Some(next), _) => next.clone(),
                (None, Some(why)) => format!("unknown ({why}: give --schedule and --tz)"),
                (None, None) => "none".to_owned(),
            };
            out.push_str(&line(&format!("schedule       {schedule} ({tz})")));
            out.push_str(&line(&format!("next due       {next}")));
        }
        for run in &self.runs {
            let lasted = match run.duration() {
                Some(d) => humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
                    .to_string(),
                None => "-".to_owned(),
            };
            let how = match (run.exit_code, &run.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => sig.clone(),
                (None, None) => "-".to_owned(),
            };
            out.push_str(&line(&format!(
                "run            {} {}, pid {}, term {}, {lasted}, {how}, {}",
                run.started_at,
                run.host,
                run.pid,
                run.term,
                run.outcome.as_str()
            )));
        }
        out
    }
}

/// `text` as one line of the text output (`status`'s table, `step-down`'s and `doctor`'s
/// lines), newline added: every character the log escapes ([`escape_text`]) escaped the same
/// way. The values a line shows come from the database (a host or `application_name` any
/// session may set, a history row anyone may write, a server's error): one that holds a
/// newline or an escape sequence must neither forge a line nor drive the terminal.
/// leaderrun's own words hold no such character, so escaping the whole line escapes those
/// values and nothing else.
pub(super) fn line(text: &str) -> String {
    let mut line = escape_text(text).into_owned();
    line.push('\n');
    line
}

/// Writes to stdout ([`super::output::stdout`]: whole, a stdout left non-blocking waited for
/// as a blocking one), never panicking. A reader that went away (`EPIPE`: `| head`, `grep -q`)
/// is no failure: it read what it wanted. Any other error (a full disk, `EIO`) is remembered
/// for [`output_lost`]: the subcommands' exit codes say something, and 0 must not stand for
/// output that was lost.
pub(super) fn out(text: &str) {
    if let Err(err) = super::output::stdout(text) {
        if err.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = OUTPUT_LOST.set(err.to_string());
        }
    }
}

/// The first error [`out`] met, other than a reader gone.
static OUTPUT_LOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Whether output was lost ([`out`]); said as an ERROR line when it was. A subcommand exits
/// 125 then (docs/guarantees.md#exit-codes), whatever it found.
pub(super) fn output_lost() -> bool {
    match OUTPUT_LOST.get() {
        Some(err) => {
            tracing::error!("cannot write to stdout: {err}");
            true
        }
        None => false,
    }
}

pub(super) fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(err) => {
            tracing::error!("cannot start the async runtime: {err}");
            None
        }
    }
}

/// Runs `work` on `rt` to its end, unless INT or TERM arrives first (`what` names the
/// subcommand in the log): then `work` is dropped where it waits, one line says so, and the
/// signal is returned for [`Exit::Interrupted`]. The handlers took the signals' default action
/// away, so without this a subcommand would run on, a hung connect included, after Ctrl-C.
/// Other signals do not end a subcommand: SIGTSTP stops leaderrun (the shell's job control
/// still works), the rest are ignored. The runtime is shut down without waiting for blocking
/// tasks (a name lookup, on a detached thread of its own, is left to the exit either way).
pub(super) fn until_interrupted<T>(
    rt: tokio::runtime::Runtime,
    signals: &mut SignalStream,
    what: &str,
    work: impl std::future::Future<Output = T>,
) -> Result<T, Signal> {
    let result = rt.block_on(async {
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                sig = signals.recv() => match sig {
                    sig if is_shutdown(sig) => return Err(sig),
                    Signal::SIGTSTP => suspend_self(),
                    _ => {}
                },
            }
        }
    });
    if let Err(sig) = result {
        tracing::error!("{what}: interrupted by {}", sig.as_str());
    }
    // Not waiting for blocking tasks either way: nothing that outlived its timeout (a name
    // lookup, on a thread nobody waits for) may hold the exit until the resolver gave up.
    rt.shutdown_background();
    result
}

/// `leaderrun status`: prints the report; exit 0 with a leader, 1 without (or on a hot
/// standby, whoever holds the key there), 125 on error. INT or TERM (from `signals`) ends it at
/// once, printing nothing: [`Exit::Interrupted`].
// Each argument is one setting of the command line; a struct of them would serve one call.
#[allow(clippy::too_many_arguments)]
pub fn status_main(
    connect_config: &tokio_postgres::Config,
    tls: &crate::pg::tls::TlsSettings,
    lock: LockKey,
    slots: u32,
    bound: Duration,
    json: bool,
    history: (
        &crate::history::TableName,
        Option<&crate::supervisor::schedule::Schedule>,
    ),
    mut signals: SignalStream,
) -> Exit {
    let Some(rt) = runtime() else {
        return Exit::Code(EXIT_FAILURE);
    };
    let server = describe(connect_config);
    let work = async {
        let (client, _closed, _task) = connect(connect_config, tls, &server, bound).await?;
        crate::pg::begin_bounded("session settings", &client, bound).await?;
        let mut report = report(&client, &server, lock, slots, bound).await?;
        add_history(&mut report, &client, history.0, lock, history.1, bound).await;
        // Nothing was written: a failed end changes no finding.
        let _ = crate::pg::end_bounded(&client, bound).await;
        Ok::<_, Error>(report)
    };
    let result = match until_interrupted(rt, &mut signals, "status", work) {
        Ok(result) => result,
        Err(sig) => return Exit::Interrupted(sig),
    };
    Exit::Code(match result {
        Ok(report) => {
            if json {
                let json = serde_json::to_string(&report).unwrap_or_else(|_| "{}".to_owned());
                out(&format!("{json}\n"));
            } else {
                out(&report.table());
            }
            if output_lost() {
                return Exit::Code(EXIT_FAILURE);
            }
            // A hot standby's holder is its own, not the election's leader.
            u8::from(report.leader.is_none() || report.in_recovery)
        }
        Err(err) => {
            tracing::error!("status: {}", Chain(&err));
            EXIT_FAILURE
        }
    })
}

/// `step-down`'s steps on `client` (in [`crate::pg::begin_bounded`]'s transaction) once it is
/// connected: the exit status of [`step_down_main`]. `asked` is set as the request is sent.
#[allow(clippy::too_many_arguments)]
async fn ask_to_step_down(
    client: &tokio_postgres::Client,
    server: &str,
    lock: LockKey,
    slots: u32,
    slot: u32,
    bound: Duration,
    asked: &std::cell::Cell<bool>,
) -> Result<u8, Error> {
    let leader_of = |r: Report| {
        r.slot_leaders
            .into_iter()
            .nth(slot as usize)
            .and_then(|s| s.leader)
    };
    let mut before = report(client, server, lock, slots, bound).await?;
    let any_standby = |r: &Report| !r.standbys.is_empty() || !r.waiters.is_empty();
    if any_standby(&before) {
        // Only a live standby counts: a waiter whose process just exited stays queued on
        // the server until the server notices (client_connection_check_interval on
        // PostgreSQL 14 and later; its wait's timeout before), so look again after that.
        tokio::time::sleep(CLIENT_CONNECTION_CHECK * 3).await;
        before = report(client, server, lock, slots, bound).await?;
    }
    if before.in_recovery {
        out(&line(
            "the server is a hot standby (in recovery): no replica leads there; point the \
             DSN at the primary",
        ));
        return Ok(1);
    }
    // Nobody could take over: asking would only stop COMMAND and start it again.
    let no_standby = !any_standby(&before);
    let Some(old) = leader_of(before) else {
        out(&line("no leader holds the lock; nothing to step down"));
        return Ok(1);
    };
    if !old.leaderrun {
        let name = old
            .application_name
            .as_deref()
            .unwrap_or("no application_name");
        // Untracked, a renamed leaderrun shows none of the statements that say so.
        out(&line(&if old.activity_tracked {
            format!("the holder is not leaderrun ({name}); it cannot be asked to step down")
        } else {
            format!(
                "whether the holder is leaderrun cannot be told ({name}, and \
                 track_activities is off for its session, so its statements are not \
                 shown); it was not asked to step down"
            )
        }));
        return Ok(1);
    }
    if no_standby {
        out(&line(
            "no standby is there to take over; the leader was not asked",
        ));
        return Ok(1);
    }
    let request = lock.slot(slot).step_down_request();
    let take = format!("SELECT pg_catalog.pg_advisory_lock(({request})::pg_catalog.int8)");
    asked.set(true);
    within(
        "take the step-down request (another step-down holds it while it asks)",
        bound,
        client.simple_query(&take),
    )
    .await?;
    let deadline = tokio::time::Instant::now() + STEP_DOWN_WAIT;
    let mut released = false;
    let mut unnamed_since = None;
    let outcome = loop {
        let now = report(client, server, lock, slots, bound).await?;
        match &leader_of(now) {
            // A holder that pg_stat_activity did not show yet (a session that began as the
            // look was read: its lock seen, its activity not): looked at again, for up to
            // half a second, to name it.
            Some(l)
                if l.application_name.is_none()
                    && *unnamed_since.get_or_insert_with(tokio::time::Instant::now)
                        + Duration::from_millis(500)
                        > tokio::time::Instant::now() => {}
            // Another replica: by leaderrun's identity when both are known (their
            // application names may be alike, e.g. from PGAPPNAME), else by name.
            Some(l)
                if match (l.leaderrun_pid, old.leaderrun_pid) {
                    (Some(_), Some(_)) => {
                        (&l.host, l.leaderrun_pid) != (&old.host, old.leaderrun_pid)
                    }
                    _ => l.application_name != old.application_name,
                } =>
            {
                break Some(l.clone())
            }
            Some(_) if released => break None,
            Some(_) => {}
            None => released = true,
        }
        if tokio::time::Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let release = format!("SELECT pg_catalog.pg_advisory_unlock(({request})::pg_catalog.int8)");
    within(
        "release the step-down request",
        bound,
        client.simple_query(&release),
    )
    .await?;
    Ok(match outcome {
        Some(new) => {
            out(&line(&format!(
                "stepped down: the new leader is {} (backend {})",
                new.who(),
                new.pid
            )));
            0
        }
        None => {
            out(&line("the leader did not hand over to another replica"));
            1
        }
    })
}

/// How long `step-down` waits for another replica to lead.
pub const STEP_DOWN_WAIT: Duration = Duration::from_secs(60);

/// `leaderrun step-down`: takes the step-down request of slot `slot` of `lock`'s `slots`
/// ([`LockKey::step_down_request`] of the slot's key, which the slot's leader's check
/// watches), waits until a replica other than the old leader (by `application_name`) holds
/// that slot, and releases the request. Exit 0 when another replica leads, 1 when none took
/// over within [`STEP_DOWN_WAIT`], none led, or the holder is not leaderrun, 125 on error
/// (a slot outside 0 … N−1 included).
///
/// Output that cannot be written (stdout a full disk) is said as an ERROR line; unlike
/// `status` and `doctor`, the exit status stays the outcome's.
/// INT or TERM (from `signals`) ends it at once ([`Exit::Interrupted`]), printing nothing.
/// Before the request is taken the leader is left alone; after, the log says that it was asked
/// already: it may still hand over, and the request ends with this process's session (no
/// release is awaited from a server that may not answer).
pub fn step_down_main(
    connect_config: &tokio_postgres::Config,
    tls: &crate::pg::tls::TlsSettings,
    lock: LockKey,
    slots: u32,
    slot: u32,
    bound: Duration,
    mut signals: SignalStream,
) -> Exit {
    if slot >= slots.max(1) {
        tracing::error!(
            "step-down: --slot {slot} is not a slot of --slots {}: give 0 … {}",
            slots.max(1),
            slots.max(1) - 1
        );
        return Exit::Code(EXIT_FAILURE);
    }
    let Some(rt) = runtime() else {
        return Exit::Code(EXIT_FAILURE);
    };
    let server = describe(connect_config);
    // Set as the request is sent, so that an interruption tells whether the leader was asked.
    let asked = std::cell::Cell::new(false);
    let work = async {
        let (client, _closed, _task) = connect(connect_config, tls, &server, bound).await?;
        // One transaction from here to the release: through a transaction-mode pooler the
        // request stays on the backend it was taken on, and ends with this process.
        crate::pg::begin_bounded("session settings", &client, bound).await?;
        let outcome = ask_to_step_down(&client, &server, lock, slots, slot, bound, &asked).await;
        // Nothing was written, and the request (if taken) is released: a failed end changes
        // no outcome. After an error the request may still be held: the transaction is left
        // open for the connection's close to end. A `COMMIT` (or `ROLLBACK`) would hand the
        // server connection, request and all, to a transaction-mode pooler's next client, and
        // every leader would step down at its next check; a client gone in a transaction makes
        // PgBouncer close that server connection, and the server free the request.
        if outcome.is_ok() {
            let _ = crate::pg::end_bounded(&client, bound).await;
        }
        outcome
    };
    let result: Result<u8, Error> = match until_interrupted(rt, &mut signals, "step-down", work) {
        Ok(result) => result,
        Err(sig) => {
            if asked.get() {
                tracing::error!(
                    "step-down: the leader was asked to step down already and may still hand \
                     over; the request ends with this session"
                );
            } else {
                tracing::error!("step-down: the leader was not asked to step down");
            }
            return Exit::Interrupted(sig);
        }
    };
    let code = result.unwrap_or_else(|err| {
        tracing::error!("step-down: {}", Chain(&err));
        EXIT_FAILURE
    });
    // Said, but the status stays the outcome's: the leader may have been asked already, and a
    // script that read 125 would ask again, of the new leader.
    output_lost();
    Exit::Code(code)
}

#[cfg(test)]
mod tests;
