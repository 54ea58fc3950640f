//! One call of [`super::Elector::run`]: the checks, the grant, demotion and release.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::time::{timeout, Instant, MissedTickBehavior};
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::connecting::connect;
use super::metrics::demotion_cause;
use super::session::{boottime, session_closed, socket_of, standby_comment, wait_sql, Session};
use super::term::{Lease, Term, TermControl, TermEnd};
use super::{CheckOutcome, Shared, UNLOCK_BOUND};
use crate::error::{Chain, Error};
use crate::pg::lock::LockKey;
use crate::pg::within;

/// Whether a failed try met a server that is momentarily full (53300) or starting up (57P03).
fn is_transient(err: &Error) -> bool {
    use tokio_postgres::error::SqlState;
    let source = match err {
        Error::Connect { source, .. } | Error::Query { source, .. } => source,
        _ => return false,
    };
    matches!(
        source.code(),
        Some(&SqlState::TOO_MANY_CONNECTIONS) | Some(&SqlState::CANNOT_CONNECT_NOW)
    )
}

/// A pseudo-random delay in [5 ms, `max`]: enough to spread a herd, no cryptography needed.
fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(boottime().as_nanos() as u64);
    hasher.write_u32(std::process::id());
    let floor = Duration::from_millis(5);
    let span = max.saturating_sub(floor).as_nanos().max(1) as u64;
    floor + Duration::from_nanos(hasher.finish() % span)
}

/// How one check phase of the campaign ended.
pub(crate) enum Phase {
    Checked(Result<(), Error>),
    Unsafe,
    Cancelled,
}

/// One call of [`Elector::run`]: the state that must be cleaned up however the call ends.
pub(crate) struct Campaign<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) session: Option<Session>,
    /// The term while leading. Its proof ends 2 check intervals after the send time of the
    /// last check that proved the lock (or of the grant); past it the server may already have
    /// given the lock away (contract §8), so the leader demotes without asking.
    pub(crate) term: Option<TermControl>,
    /// Set when `run` returns normally; a `Campaign` dropped without it was unwound by a panic
    /// or dropped mid-await.
    pub(crate) finished: bool,
    /// Backend pid of the holder the last INFO line about the holder named, so that a standby
    /// says who holds the lock once, and again only when the holder changes.
    pub(crate) holder_seen: Vec<i32>,
    /// Since when tries fail on a momentarily full or starting server, in a row.
    pub(crate) transient_since: Option<Instant>,
    /// The term's first check is still to come. It runs soon after the grant, while the
    /// `leaderrun step-down` that made the previous leader go may still hold its request, so
    /// it does not act on one; a request for this term is seen at the next check.
    pub(crate) first_check: bool,
    /// Time the current check spent waiting in the server's lock queue: not part of the
    /// check's own duration (`leaderrun_lock_wait_seconds` has it).
    pub(crate) waited: Duration,
    /// The current check is only a wait in line (the standby already held its place): its
    /// duration is the queue's, and `leaderrun_check_duration_seconds` does not observe it.
    pub(crate) wait_only: bool,
}

/// Who holds the lock, for a standby whose check was refused: one row whatever is found (the
/// holder's fields are NULL when the lock was released meanwhile). The activity is read for
/// the holder's pid only.
const HOLDER_SQL: &str = "SELECT l.pid, a.application_name, host(a.client_addr), \
       to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), a.query \
     FROM (SELECT 1) AS one \
     LEFT JOIN pg_locks l ON l.locktype = 'advisory' \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND l.classid = ANY($1) AND l.objid = $2 AND l.objsubid = 2 AND l.granted \
     LEFT JOIN LATERAL (SELECT * FROM pg_stat_get_activity(l.pid) WHERE l.pid IS NOT NULL) a \
       ON true \
     ORDER BY array_position($1, l.classid)";

/// How soon after a grant the term's first check runs (at most a quarter interval).
const FIRST_CHECK_AFTER_GRANT: Duration = Duration::from_millis(50);

pub(crate) const LOCK_ROW_SQL: &str = "SELECT pg_backend_pid(), \
     EXISTS (SELECT 1 FROM pg_locks \
             WHERE locktype = 'advisory' \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND classid = $1 AND objid = $2 AND objsubid = 2 \
               AND pid = pg_backend_pid() AND granted), \
     pg_is_in_recovery(), \
     EXISTS (SELECT 1 FROM pg_locks \
             WHERE locktype = 'advisory' \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND classid = $1 AND objid = $2 AND objsubid = 1 AND granted)";

impl Campaign<'_> {
    pub(crate) async fn run(&mut self, cancel: &CancellationToken) {
        let interval = self.shared.config.effective_check_interval();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Compares the safe window with CLOCK_BOOTTIME often, so a resume after a suspend or a
        // SIGSTOP is noticed even before the (monotonic) check timer fires.
        let mut safety = tokio::time::interval(
            (interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(250)),
        );
        safety.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Spread a fleet's first connects (FIELD-NOTES PostgreSQL 15): nothing is held yet,
        // so waiting here costs only the delay.
        let spread = self.shared.config.first_check_spread;
        if !spread.is_zero() {
            let delay = jitter(spread).saturating_sub(Duration::from_millis(5));
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        // The first check runs at once, not at the ticker's first tick: tokio rounds a timer's
        // deadline up to its next millisecond, which every one-shot would pay.
        let mut due_now = true;
        loop {
            if std::mem::take(&mut due_now) {
                if cancel.is_cancelled() {
                    return;
                }
                ticker.reset();
            } else {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    // Only a leader has a window to watch; a standby sleeps until its next check.
                    _ = safety.tick(), if self.term.is_some() => {
                        if self.window_passed() {
                            self.demote_unsafe().await;
                            ticker.reset();
                        }
                        continue;
                    }
                    closed = session_closed(&mut self.session) => {
                        let led = self.term.is_some();
                        self.on_session_closed(closed);
                        if led {
                            ticker.reset();
                        }
                        continue;
                    }
                    _ = ticker.tick() => {}
                }
            }
            let leading = self.term.is_some();
            let proven_until = self.term.as_ref().and_then(|t| t.term().proven_until());
            let phase = {
                let check = async {
                    if self.term.is_some() {
                        self.verify().await
                    } else {
                        self.try_acquire().await;
                        Ok(())
                    }
                };
                tokio::pin!(check);
                loop {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break Phase::Cancelled,
                        _ = safety.tick(), if leading => {
                            if proven_until.is_some_and(|until| boottime() >= until) {
                                break Phase::Unsafe;
                            }
                        }
                        result = &mut check => break Phase::Checked(result),
                    }
                }
            };
            match phase {
                Phase::Checked(Ok(())) if !leading && self.term.is_some() => {
                    // Just granted: the first leader check follows soon, once COMMAND has
                    // started (on a small machine the check's server work would compete with
                    // its fork and exec). Its text, with the term in it, is what `leaderrun
                    // status` reads from pg_stat_activity.
                    self.transient_since = None;
                    ticker.reset_after(FIRST_CHECK_AFTER_GRANT.min(interval / 4));
                }
                Phase::Checked(Ok(())) => {
                    // A server that is momentarily full or starting up (53300, 57P03) is tried
                    // again soon, with jitter, for up to one interval (FIELD-NOTES PostgreSQL
                    // 15): a fleet whose cron fires the same minute gets through.
                    let transient = !leading
                        && self.term.is_none()
                        && self.shared.checks.borrow().last == Some(CheckOutcome::Failed)
                        && self.shared.checks.borrow().last_transient;
                    if transient {
                        let since = *self.transient_since.get_or_insert_with(Instant::now);
                        if since.elapsed() < interval {
                            ticker.reset_after(jitter(interval / 8));
                        }
                    } else {
                        self.transient_since = None;
                    }
                }
                Phase::Checked(Err(err)) => {
                    // The check failed on a live session: the lock may still be held, so the
                    // work stops before it is released (FIELD-NOTES PostgreSQL 13).
                    self.demote(&err).await;
                    // The next try is one full interval away.
                    ticker.reset();
                }
                Phase::Unsafe => {
                    // The check in flight is abandoned; the session goes once the work is dead.
                    self.demote_unsafe().await;
                    ticker.reset();
                }
                Phase::Cancelled => {
                    // A try that was in flight may have been granted on the server: a standby
                    // drops its session (closing it frees any such grant). A leader keeps its
                    // session so that `resign` can unlock it.
                    if self.term.is_none() {
                        self.session = None;
                    }
                    return;
                }
            }
        }
    }

    /// Whether the leader's safe window (2 check intervals from the send time of its last good
    /// check, on CLOCK_BOOTTIME) has passed.
    pub(crate) fn window_passed(&self) -> bool {
        self.term
            .as_ref()
            .is_some_and(|t| t.term().proven_until().is_some_and(|u| boottime() >= u))
    }

    /// Demotes because the safe window passed, without a round trip.
    pub(crate) async fn demote_unsafe(&mut self) {
        let Some(until) = self.term.as_ref().and_then(|t| t.term().proven_until()) else {
            return;
        };
        let window = self.shared.config.safe_window();
        let since = boottime().saturating_sub(until) + window;
        self.demote(&Error::SafeWindowPassed { since }).await;
    }

    /// The server ended the session: the lock is gone with it, so there is nothing to hold
    /// back; the term ends at once (FIELD-NOTES PostgreSQL 4).
    pub(crate) fn on_session_closed(&mut self, cause: Option<tokio_postgres::Error>) {
        // Nothing to wait for: the session, and its lock, are gone already. The term ends
        // first, so the child's stop starts without delay.
        let session = self.session.take();
        let ended = self.end_term(TermEnd::LeadershipLost);
        if let (Some(keeper), Some(session)) = (&self.shared.config.keeper, &session) {
            if session.socket.is_some() {
                keeper.release(false);
            }
        }
        drop(session);
        if let Some(control) = ended {
            let cause = Error::SessionClosed(cause);
            self.count_demotion(&cause);
            warn!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "background leader lock lost: {}",
                Chain(&cause)
            );
        } else {
            debug!(target: "leaderrun::elector", "standby session closed by the server; reconnecting at the next check");
        }
    }

    pub(crate) async fn try_acquire(&mut self) {
        self.waited = Duration::ZERO;
        self.wait_only = self.session.as_ref().is_some_and(|s| s.place.is_some());
        let started = Instant::now();
        let sent = boottime();
        match self.try_acquire_inner(started, sent).await {
            // begin_term recorded it, before publishing the term.
            Ok(CheckOutcome::Granted) => self.holder_seen.clear(),
            Ok(CheckOutcome::Refused) => {
                self.record(CheckOutcome::Refused, started, None);
                // Who holds it costs the server a pg_locks scan: asked at the first refusal,
                // then only by the standbys in line, so a fleet of pollers does not pay it at
                // every check (a thousand of them would keep a core busy).
                let in_line = self.session.as_ref().is_some_and(|s| s.place.is_some());
                if self.holder_seen.is_empty() || in_line {
                    self.note_holder().await;
                }
            }
            Ok(outcome) => self.record(outcome, started, None),
            Err(err @ Error::InRecovery { .. }) => {
                error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(err @ Error::SharedBackend) => {
                error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                // Closing the client does not end a pooled server session: give the lock back.
                if let Some(session) = self.session.take() {
                    let lock = session.granted.unwrap_or(self.shared.config.lock);
                    let _ = session
                        .bounded(
                            "unlock",
                            UNLOCK_BOUND,
                            "SELECT pg_advisory_unlock($1, $2)",
                            &[&lock.class, &lock.id],
                        )
                        .await;
                }
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(err) => {
                // FIELD-NOTES PostgreSQL 3: whatever failed, the session may hold a grant we
                // never saw; never reuse it.
                let session = self.session.take();
                self.drop_session(session);
                if self.shared.config.warn_failed_tries {
                    warn!(target: "leaderrun::elector", "leader: acquire lock connection: {}", Chain(&err));
                } else {
                    debug!(target: "leaderrun::elector", "leader: acquire lock connection: {}", Chain(&err));
                }
                self.record(CheckOutcome::Failed, started, Some(&err));
                let transient = is_transient(&err);
                self.shared
                    .checks
                    .send_modify(|c| c.last_transient = transient);
            }
        }
    }

    /// After a refused check: says at INFO who holds the lock (host, pid, since when), the
    /// first time and, for a standby in line, whenever the holder's backend changes. One extra
    /// statement per such check, and none when INFO lines are not shown (a one-shot's default
    /// level).
    pub(crate) async fn note_holder(&mut self) {
        if !tracing::enabled!(target: "leaderrun::elector", tracing::Level::INFO) {
            return;
        }
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let config = &self.shared.config;
        let lock = config.lock;
        let slots = config.effective_slots();
        // pg_locks shows the int4 halves as oid, i.e. unsigned.
        let classes: Vec<u32> = (0..slots).map(|k| lock.slot(k).class as u32).collect();
        let id = lock.id as u32;
        // The standby comment first: this is the session's last statement until its next
        // check, and `leaderrun status` finds standbys by it.
        let sql = format!(
            "{} {} {HOLDER_SQL}",
            standby_comment(lock),
            crate::pg::holder::identity_comment()
        );
        let rows = match session.client.as_ref() {
            Some(client) => {
                within(
                    "who holds the lock",
                    config.io_bound(),
                    client.query(&sql, &[&classes, &id]),
                )
                .await
            }
            None => return,
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(err) => {
                debug!(target: "leaderrun::elector", "cannot tell who holds the lock: {}", Chain(&err));
                return;
            }
        };
        let pids: Vec<i32> = rows
            .iter()
            .filter_map(|r| r.get::<_, Option<i32>>(0))
            .collect();
        if pids.is_empty() || self.holder_seen == pids {
            return;
        }
        self.holder_seen = pids;
        let mut holders = Vec::new();
        for row in &rows {
            let Some(pid) = row.get::<_, Option<i32>>(0) else {
                continue;
            };
            let application_name: Option<String> = row.get(1);
            let backend_start: Option<String> = row.get(3);
            let query: Option<String> = row.get(4);
            let (_, since, _) =
                crate::pg::holder::parse_check_comment(query.as_deref().unwrap_or(""));
            let who = crate::pg::holder::Who {
                application_name: application_name.as_deref(),
                query: query.as_deref(),
            };
            let since = match (since, backend_start) {
                (Some(since), _) => format!("leading since {since}"),
                (None, Some(start)) => format!("session started {start}"),
                (None, None) => "since an unknown time".to_owned(),
            };
            holders.push(format!("{who}, backend {pid}, {since}"));
        }
        let first = &rows[0];
        let pid: Option<i32> = first.get(0);
        let client: Option<String> = first.get(2);
        if slots == 1 {
            info!(
                target: "leaderrun::elector",
                lock = %lock,
                holder_backend_pid = pid,
                holder_client_addr = client.as_deref().unwrap_or("local"),
                "the lock is held by {}; standing by",
                holders.join("")
            );
        } else {
            info!(
                target: "leaderrun::elector",
                lock = %lock,
                slots,
                "{} of {slots} slots are held (by {}); standing by",
                holders.len(),
                holders.join("; ")
            );
        }
    }

    /// Publishes one check's outcome in [`Checks`].
    pub(crate) fn record(&self, outcome: CheckOutcome, started: Instant, error: Option<&Error>) {
        let now = Instant::now();
        if let Some(metrics) = &self.shared.metrics {
            let label = match outcome {
                CheckOutcome::Granted => "granted",
                CheckOutcome::Refused => "refused",
                CheckOutcome::Verified => "verified",
                CheckOutcome::Lost => "lost",
                CheckOutcome::Failed => "failed",
            };
            metrics.checks.with_label_values(&[label]).inc();
            if !self.wait_only {
                let own = (now - started).saturating_sub(self.waited);
                metrics.check_seconds.observe(own.as_secs_f64());
            }
        }
        let own = (now - started).saturating_sub(self.waited);
        self.shared.checks.send_modify(|checks| {
            checks.total += 1;
            match outcome {
                CheckOutcome::Refused => checks.refused += 1,
                CheckOutcome::Failed => checks.failed += 1,
                _ => {}
            }
            checks.last = Some(outcome);
            checks.waiting = false;
            checks.last_at = Some(now);
            checks.last_latency = own;
            if !matches!(outcome, CheckOutcome::Failed | CheckOutcome::Lost) {
                checks.last_success_at = Some(now);
            }
            if let Some(err) = error {
                checks.last_error = Some(Chain(err).to_string());
            }
        });
    }

    pub(crate) async fn try_acquire_inner(
        &mut self,
        started: Instant,
        sent: Duration,
    ) -> Result<CheckOutcome, Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let slots = config.effective_slots();
        if self.session.is_none() {
            self.session = Some(Session::open(config, &self.shared.target).await?);
            self.shared.checks.send_modify(|c| c.sessions_opened += 1);
        }
        let Some(session) = self.session.as_ref() else {
            return Ok(CheckOutcome::Failed);
        };
        let mut row = match session.place {
            Some(place) => self.wait_in_line(place).await?,
            None => {
                let Some(statement) = session.try_lock.as_ref() else {
                    return Ok(CheckOutcome::Failed);
                };
                Some(
                    session
                        .bounded("try advisory lock", bound, statement, &[])
                        .await?,
                )
            }
        };
        // A place in the line (p·N + k): wait for what is ahead, in this same check, and
        // move up as long as the waits are granted.
        loop {
            let Some(answer) = &row else {
                debug!(target: "leaderrun::elector", lock = %self.shared.config.lock, "lock held by another session for a whole interval; standing by");
                return Ok(CheckOutcome::Refused);
            };
            match answer.get::<_, Option<i32>>(0) {
                None => {
                    return Err(Error::InRecovery {
                        server: self.shared.target.clone(),
                    })
                }
                Some(code) if code < 0 => {
                    debug!(target: "leaderrun::elector", lock = %self.shared.config.lock, "lock held by another session; standing by");
                    return Ok(CheckOutcome::Refused);
                }
                Some(code) if (code as u32) < slots => {
                    if let Some(session) = self.session.as_mut() {
                        session.place = None;
                    }
                    let answer = answer.clone();
                    return self
                        .begin_term(started, sent, code as u32, &answer)
                        .await
                        .map(|()| CheckOutcome::Granted);
                }
                Some(code) => {
                    let place = (code as u32 % slots, code as u32 / slots);
                    if let Some(session) = self.session.as_mut() {
                        session.place = Some(place);
                    }
                    debug!(target: "leaderrun::elector", lock = %self.shared.config.lock.slot(place.0), place = place.1, "in line: waiting in the server's queue");
                    row = self.wait_in_line(place).await?;
                }
            }
        }
    }

    /// The wait of the standby at `place` (slot, place) in the line ([`wait_sql`]), bounded
    /// on the server by `lock_timeout` (one interval); only a client-side timeout means
    /// "unknown outcome" (FIELD-NOTES PostgreSQL 3). `None` when the wait timed out on the
    /// server: what is ahead is still held, and this session keeps its place.
    pub(crate) async fn wait_in_line(
        &mut self,
        place: (u32, u32),
    ) -> Result<Option<tokio_postgres::Row>, Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let Some(session) = self.session.as_mut() else {
            return Err(Error::SessionClosed(None));
        };
        if !session.waits.iter().any(|(p, _)| *p == place) {
            let sql = wait_sql(config.lock, config.effective_slots(), place.0, place.1);
            let statement = session
                .prepare("prepare the wait in line", bound, &sql)
                .await?;
            session.waits.push((place, statement));
        }
        let Some((_, statement)) = session.waits.iter().find(|(p, _)| *p == place) else {
            return Err(Error::SessionClosed(None));
        };
        // The wait is queued on the server as soon as it is sent: a standby is ready from
        // then on (contract §7), not only once its wait times out.
        self.shared.checks.send_modify(|c| c.waiting = true);
        let wait_started = Instant::now();
        let result = session
            .bounded(
                "wait for the advisory lock",
                config.effective_check_interval() + bound,
                statement,
                &[],
            )
            .await;
        // `waiting` stays set until this check's outcome is recorded ([`Self::record`] clears
        // both at once): clearing it here would show a queued standby as "no check yet" for
        // the moment between the wait's end and its record.
        let waited = wait_started.elapsed();
        self.waited += waited;
        if let Some(metrics) = &self.shared.metrics {
            metrics.wait_seconds.observe(waited.as_secs_f64());
        }
        match result {
            Err(Error::Query { source, .. })
                if source.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
            {
                Ok(None)
            }
            Err(err) => Err(err),
            Ok(row) => Ok(Some(row)),
        }
    }

    /// Slot `slot` was granted on the current session in the check whose answer is `row`
    /// ([`try_sql`]'s columns): make it the lock session and start a term.
    ///
    /// `started` and `sent` are the check's start (monotonic) and send time (boottime): the
    /// check is recorded and the safe window set before the term is published, so nobody
    /// observes a term without the check that granted it.
    pub(crate) async fn begin_term(
        &mut self,
        started: Instant,
        sent: Duration,
        slot: u32,
        row: &tokio_postgres::Row,
    ) -> Result<(), Error> {
        let config = &self.shared.config;
        let key = config.lock.slot(slot);
        if let Some(session) = self.session.as_mut() {
            session.granted = Some(key);
        } else {
            return Ok(());
        }
        let idle = config.effective_idle_session_timeout();
        // The address the server sees us at (NULL over a Unix socket).
        let seen: Option<(String, i32)> = row
            .get::<_, Option<String>>(3)
            .zip(row.get::<_, Option<i32>>(4));
        let socket = self
            .session
            .as_ref()
            .map(|s| socket_of(s.fd, seen.as_ref()));
        // Behind a transaction-mode pooler two client sessions can share one server backend,
        // and a session lock then excludes nothing (FIELD-NOTES PostgreSQL 8). A direct TCP
        // connection, whose local address and port are the ones the server sees, cannot be a
        // pooler's; anything else is proven with a second session, whose failure to connect
        // costs a WARN, not the election (contract §8).
        if !socket.is_some_and(|s| s.direct) {
            match self.probe_exclusion(key).await {
                Err(err @ Error::SharedBackend) => return Err(err),
                Err(err) => warn!(
                    target: "leaderrun::elector",
                    "leader: cannot open a second session to rule out a transaction-mode \
                     pooler; leading on the one session: {}",
                    Chain(&err)
                ),
                Ok(()) => {}
            }
        }
        let Some(session) = self.session.as_ref() else {
            return Ok(());
        };
        let number = self.shared.terms.load(Ordering::Acquire) + 1;
        let lease = Lease {
            lock: key,
            slot,
            backend_pid: session.backend_pid,
            fencing_token: row.get::<_, Option<i64>>(1).unwrap_or_default(),
            database: row.get(2),
            granted_at: SystemTime::now(),
        };
        // The comment is what `leaderrun status` reads back from pg_stat_activity.query; every
        // value in it is a number or a timestamp we formatted.
        let check_sql = format!(
            "/* leaderrun term={number} since={} fencing_token={} */ {} {LOCK_ROW_SQL}",
            humantime::format_rfc3339_seconds(lease.granted_at),
            lease.fencing_token,
            crate::pg::holder::identity_comment()
        );
        // Whoever keeps the session alive beyond this process (the watchdog) gets its copy
        // before anything can run under the term. A first grant before the watchdog is up
        // waits here for its start (see `runner`).
        if let Some(keeper) = &config.keeper {
            match socket {
                // SAFETY: the descriptor belongs to the session's connection, alive here.
                Some(found) => {
                    keeper.keep(unsafe { std::os::fd::BorrowedFd::borrow_raw(found.fd) })
                }
                None => warn!(
                    target: "leaderrun::elector",
                    "leader: cannot tell which descriptor is the lock session's socket; if \
                     leaderrun is killed, the lock may move before COMMAND's tree is dead"
                ),
            }
        }
        // From here on the keeper may hold a copy: every way out that drops the session goes
        // through `drop_session`, which takes the copy back first. The check is sent with its
        // text each time (one round trip, no PREPARE at the grant, which would delay COMMAND).
        if let Some(session) = self.session.as_mut() {
            session.socket = socket.map(|s| s.fd);
            session.check = Some(check_sql);
        }
        self.first_check = true;
        self.shared.terms.store(number, Ordering::Release);
        // The grant is the term's first proof: its window counts from the try's send time.
        let (term, control) = Term::issue(number, Some(lease.clone()), sent + config.safe_window());
        self.term = Some(control);
        self.shared.leader.store(true, Ordering::Release);
        if let Some(metrics) = &self.shared.metrics {
            metrics.leader.set(1);
            metrics.slot.set(i64::from(slot));
            metrics.terms.inc();
        }
        self.record(CheckOutcome::Granted, started, None);
        self.shared.current.send_replace(term);
        info!(
            target: "leaderrun::elector",
            term = number,
            backend_pid = lease.backend_pid,
            database = %lease.database,
            server = %crate::pg::conninfo::endpoint(&self.shared.config.connect),
            lock = %lease.lock,
            fencing_token = lease.fencing_token,
            idle_session_timeout_ms = idle.as_millis() as u64,
            "background leader lock acquired"
        );
        Ok(())
    }

    /// Opens a second session and tries the lock this session was just granted: it must be
    /// refused. Granted means both sessions reached one server backend (a transaction-mode
    /// pooler); the probe's extra hold is released again.
    pub(crate) async fn probe_exclusion(&self, lock: LockKey) -> Result<(), Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let (client, _closed, _task) =
            connect(&config.connect, &config.tls, &self.shared.target, bound).await?;
        // The simple protocol: no named prepared statement that a pooler could mix up; the
        // key is two integers.
        let try_sql = format!("SELECT pg_try_advisory_lock({}, {})", lock.class, lock.id);
        let unlock_sql = format!("SELECT pg_advisory_unlock({}, {})", lock.class, lock.id);
        let granted = within("probe exclusion", bound, client.simple_query(&try_sql))
            .await?
            .iter()
            .any(|m| {
                matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("t"))
            });
        if granted {
            let _ = timeout(bound, client.simple_query(&unlock_sql)).await;
            return Err(Error::SharedBackend);
        }
        Ok(())
    }

    /// The leader's check: proves in one round trip that this session still holds the lock.
    /// `Err` is the cause to demote with; the session is left as it is for [`Self::demote`].
    pub(crate) async fn verify(&mut self) -> Result<(), Error> {
        let Some(session) = self.session.as_ref() else {
            return Ok(());
        };
        let Some(check_sql) = session.check.as_deref() else {
            return Ok(());
        };
        // After a suspend or a SIGSTOP: no round trip once the safe window has passed.
        if self.window_passed() {
            let until = self
                .term
                .as_ref()
                .and_then(|t| t.term().proven_until())
                .unwrap_or_default();
            let window = self.shared.config.safe_window();
            return Err(Error::SafeWindowPassed {
                since: boottime().saturating_sub(until) + window,
            });
        }
        let sent = boottime();
        let config = &self.shared.config;
        let bound = config.effective_check_interval().min(config.io_bound());
        let lock = session.granted.unwrap_or(config.lock);
        // pg_locks shows the int4 halves as oid, i.e. unsigned.
        let (class, id) = (lock.class as u32, lock.id as u32);
        let started = Instant::now();
        self.waited = Duration::ZERO;
        self.wait_only = false;
        let first = std::mem::take(&mut self.first_check);
        let result = session
            .bounded_typed(
                "leader check",
                bound,
                check_sql,
                &[(&class, Type::OID), (&id, Type::OID)],
            )
            .await
            .and_then(|row| {
                let pid: i32 = row.get(0);
                let held: bool = row.get(1);
                let in_recovery: bool = row.get(2);
                // `leaderrun step-down` holds the bigint lock whose halves are our key.
                let step_down: bool = row.get(3);
                if pid != session.backend_pid {
                    Err(Error::BackendChanged {
                        granted_to: session.backend_pid,
                        now: pid,
                    })
                } else if in_recovery {
                    Err(Error::InRecovery {
                        server: self.shared.target.clone(),
                    })
                } else if !held {
                    Err(Error::LockNotHeld {
                        lock,
                        backend_pid: pid,
                    })
                } else if step_down && !first {
                    Err(Error::StepDownRequested)
                } else {
                    Ok(())
                }
            });
        let window = config.safe_window();
        // An answer that arrives after the window closed proves nothing any more.
        let result = result.and_then(|()| match &self.term {
            Some(control) if !control.prove(sent + window) => Err(Error::SafeWindowPassed {
                since: boottime().saturating_sub(sent),
            }),
            _ => Ok(()),
        });
        match result {
            Ok(()) => {
                self.record(CheckOutcome::Verified, started, None);
                debug!(target: "leaderrun::elector", latency_ms = started.elapsed().as_millis() as u64, "leader check ok");
                Ok(())
            }
            Err(err) => {
                if matches!(err, Error::BackendChanged { .. } | Error::InRecovery { .. }) {
                    error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                }
                self.record(CheckOutcome::Lost, started, Some(&err));
                Err(err)
            }
        }
    }

    pub(crate) fn count_demotion(&self, cause: &Error) {
        if let Some(metrics) = &self.shared.metrics {
            metrics
                .demotions
                .with_label_values(&[demotion_cause(cause)])
                .inc();
        }
    }

    /// The seed's demotion, with the release after the work: end the term (every holder sees
    /// it at once), log the cause, and close the session only once every [`TermHold`] is
    /// dropped, since a session that is still open may still hold the lock (FIELD-NOTES
    /// PostgreSQL 13). Nothing is sent on the session meanwhile, so the server's
    /// `idle_session_timeout` bounds the wait; so does this one.
    pub(crate) async fn demote(&mut self, cause: &Error) {
        let Some(control) = self.end_term(TermEnd::LeadershipLost) else {
            return;
        };
        self.count_demotion(cause);
        if matches!(cause, Error::StepDownRequested) {
            info!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "stepping down on request: stopping the child, then releasing the lock and \
                 staying out for one check interval"
            );
        } else {
            warn!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "background leader lock lost: {}",
                Chain(cause)
            );
        }
        let session = self.session.take();
        self.release_after_holds(&control, session.is_some()).await;
        self.drop_session(session);
    }

    /// Closes a session on purpose: whoever keeps a copy of its socket drops it first, or the
    /// session (and the lock) would outlive the close.
    pub(crate) fn drop_session(&self, session: Option<Session>) {
        if let (Some(keeper), Some(session)) = (&self.shared.config.keeper, &session) {
            if session.socket.is_some() {
                keeper.release(true);
            }
        }
        drop(session);
    }

    /// Waits for the holds of `control`'s term, bounded by `idle_session_timeout`.
    pub(crate) async fn release_after_holds(&self, control: &TermControl, may_hold_lock: bool) {
        if control.holds() == 0 || !may_hold_lock {
            return;
        }
        debug!(
            target: "leaderrun::elector",
            term = control.term().number(),
            "keeping the lock session until the term's work has stopped"
        );
        let bound = self.shared.config.effective_idle_session_timeout();
        if !control.released(bound).await {
            warn!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "the work of the term still runs after idle_session_timeout ({}); \
                 releasing the lock session anyway",
                humantime::format_duration(bound)
            );
        }
    }

    /// Ends the current term, if any: IsLeader false, gauge 0, standby placeholder published.
    pub(crate) fn end_term(&mut self, cause: TermEnd) -> Option<TermControl> {
        let control = self.term.take()?;
        self.shared.leader.store(false, Ordering::Release);
        if let Some(metrics) = &self.shared.metrics {
            metrics.leader.set(0);
            metrics.slot.set(-1);
        }
        self.shared.current.send_replace(Term::standby());
        control.end(cause);
        Some(control)
    }

    /// After cancellation: end the term, unlock under the 2-second bound, close.
    pub(crate) async fn resign(&mut self) {
        let control = self.end_term(TermEnd::Resigned);
        if let Some(control) = &control {
            self.release_after_holds(control, self.session.is_some())
                .await;
        }
        let Some(session) = self.session.take() else {
            return;
        };
        let mut unlock_failed = false;
        if let Some(control) = control {
            let term = control.term();
            let lock = session.granted.unwrap_or(self.shared.config.lock);
            // One round trip: the simple protocol, with the key written out.
            let unlock = format!(
                "SELECT pg_advisory_unlock(({})::int4, ({})::int4)",
                lock.class, lock.id
            );
            let unlocked = match session.client.as_ref() {
                Some(client) => within("unlock", UNLOCK_BOUND, client.simple_query(&unlock))
                    .await
                    .map(|_| ()),
                None => Err(Error::SessionClosed(None)),
            };
            unlock_failed = unlocked.is_err();
            match unlocked {
                Ok(_) => info!(
                    target: "leaderrun::elector",
                    term = term.number(),
                    lock = %lock,
                    "background leader lock released"
                ),
                Err(err) => warn!(
                    target: "leaderrun::elector",
                    term = term.number(),
                    "leader: unlock failed; the server frees the lock when the session closes: {}",
                    Chain(&err)
                ),
            }
        }
        if let (Some(keeper), Some(_)) = (&self.shared.config.keeper, session.socket) {
            keeper.release(true);
        }
        session.close(unlock_failed).await;
    }
}

impl Campaign<'_> {
    /// Leaves the election without unlocking: after a panic, or when `run`'s future is dropped
    /// mid-await. The session may be mid-statement, so it is closed instead; the server frees
    /// the lock when the socket closes.
    pub(crate) fn abandon(&mut self, panicked: bool) {
        let led = self.end_term(TermEnd::LeadershipLost);
        let mut session = self.session.take();
        if let (Some(control), Some(_)) = (&led, &session) {
            // Work may still run under the term: the session (and maybe the lock) stays until
            // it is dead, as in every other demotion, on a task of its own since this runs in
            // a drop. Nothing is sent on it: it may be mid-statement.
            if control.holds() > 0 {
                if let (Ok(runtime), Some(session)) =
                    (tokio::runtime::Handle::try_current(), session.take())
                {
                    let held = TermControl {
                        term: control.term().clone(),
                    };
                    let bound = self.shared.config.effective_idle_session_timeout();
                    let keeper = self.shared.config.keeper.clone();
                    runtime.spawn(async move {
                        held.released(bound).await;
                        if let (Some(keeper), Some(_)) = (keeper, session.socket) {
                            keeper.release(true);
                        }
                        drop(session);
                    });
                }
            }
        }
        self.drop_session(session);
        if led.is_some() {
            if let Some(metrics) = &self.shared.metrics {
                metrics.demotions.with_label_values(&["abandoned"]).inc();
            }
            if panicked {
                warn!(target: "leaderrun::elector", "background leader lock abandoned after a panic");
            } else {
                warn!(target: "leaderrun::elector", "background leader lock abandoned: the election was dropped mid-run");
            }
        }
    }
}

impl Drop for Campaign<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.abandon(std::thread::panicking());
        }
        self.shared.running.store(false, Ordering::Release);
    }
}
