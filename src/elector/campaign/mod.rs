//! One call of [`super::Elector::run`]: the checks, the grant, demotion and release. This
//! module is the loop and its state (`Campaign`, whose `Role` is standby or leader); `standby`
//! is the try and the wait in line, `leader` the term: grant, verification, demotion, release.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::session::{boottime, session_closed, Session};
use super::term::{Term, TermControl, TermEnd};
use super::{CheckOutcome, Shared};
use crate::error::{Chain, Error};
use crate::pg::holder::activity_bytes;
use crate::pg::lock::current_database_oid;

mod heads;
mod leader;
mod standby;

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

/// Where a campaign stands: standing by, or leading on its lock session. Only a leader has a
/// term, and a leader always has its session: a term without the session that may hold its
/// lock cannot be written down. The grant (`Campaign::begin_term`) moves the standby's session
/// into the leader; the end of the term (`Campaign::end_term`) hands it back to a standby,
/// which releases it once the term's holds are gone.
pub(crate) enum Role {
    /// Not leading. The start of every campaign, and what a leader becomes when its term ends
    /// (keeping the session until it is released: `Campaign::end_term`).
    Standby {
        /// The session tries are made on, kept between them; `None` before the first connect
        /// and after a session was thrown away.
        session: Option<Session>,
        /// Backend pids of the holders the last INFO line about the holder named, so that a
        /// standby says who holds the lock once, and again only when the holder changes.
        holder_seen: Vec<i32>,
        /// Since when tries fail on a momentarily full or starting server, in a row.
        transient_since: Option<Instant>,
        /// With `--slots N`, while `session` heads one slot's line: a session of its own for
        /// each other slot it heads, one that had no head (at most N − 1; `heads`). Whichever
        /// session is granted a slot becomes the lock session, and the others are closed.
        heads: Vec<Session>,
    },
    /// Leading on `session`, the lock session, for `term`. The term's proof ends 2 check
    /// intervals after the send time of the last check that proved the lock (or of the
    /// grant); past it the server may already have given the lock away
    /// (docs/guarantees.md#safety-guarantees), so the leader demotes without asking.
    Leader {
        session: Session,
        term: TermControl,
        /// The term's first check is still to come. It runs soon after the grant, while the
        /// `leaderrun step-down` that made the previous leader go may still hold its request,
        /// so it does not act on one; a request for this term is seen at the next check.
        first_check: bool,
    },
}

impl Default for Role {
    /// A standby that has not connected yet.
    fn default() -> Self {
        Role::Standby {
            session: None,
            holder_seen: Vec::new(),
            transient_since: None,
            heads: Vec::new(),
        }
    }
}

impl Role {
    /// Whether this is a leader.
    pub(crate) fn is_leader(&self) -> bool {
        matches!(self, Role::Leader { .. })
    }

    /// The session, whichever the role.
    pub(crate) fn session(&self) -> Option<&Session> {
        match self {
            Role::Standby { session, .. } => session.as_ref(),
            Role::Leader { session, .. } => Some(session),
        }
    }

    /// The session, whichever the role.
    pub(crate) fn session_mut(&mut self) -> Option<&mut Session> {
        match self {
            Role::Standby { session, .. } => session.as_mut(),
            Role::Leader { session, .. } => Some(session),
        }
    }

    /// The leader's term.
    pub(crate) fn term(&self) -> Option<&TermControl> {
        match self {
            Role::Standby { .. } => None,
            Role::Leader { term, .. } => Some(term),
        }
    }

    /// Takes a standby's session (to close it or throw it away); a leader keeps its own. A
    /// standby's extra heads are closed at once: they are kept only beside a session in line,
    /// and nothing ever ran under a grant they may have (closing one gives it back).
    pub(crate) fn take_standby_session(&mut self) -> Option<Session> {
        match self {
            Role::Standby { session, heads, .. } => {
                heads.clear();
                session.take()
            }
            Role::Leader { .. } => None,
        }
    }

    /// Takes a standby's extra heads, for one check's wait; none on a leader.
    pub(crate) fn take_heads(&mut self) -> Vec<Session> {
        match self {
            Role::Standby { heads, .. } => std::mem::take(heads),
            Role::Leader { .. } => Vec::new(),
        }
    }

    /// A leader stands by, keeping its session for now; returns its term. `None` on a standby.
    pub(crate) fn stand_by(&mut self) -> Option<TermControl> {
        match std::mem::take(self) {
            Role::Leader { session, term, .. } => {
                *self = Role::Standby {
                    session: Some(session),
                    holder_seen: Vec::new(),
                    transient_since: None,
                    heads: Vec::new(),
                };
                Some(term)
            }
            standby => {
                *self = standby;
                None
            }
        }
    }
}

/// One call of [`Elector::run`](crate::Elector::run): the state that must be cleaned up however the
/// call ends.
pub(crate) struct Campaign<'a> {
    pub(crate) shared: &'a Shared,
    /// Standby or leader, with the session and what belongs to each.
    pub(crate) role: Role,
    /// Set when `run` returns normally; a `Campaign` dropped without it was unwound by a panic
    /// or dropped mid-await.
    pub(crate) finished: bool,
    /// Time the current check spent waiting in the server's lock queue: not part of the
    /// check's own duration (`leaderrun_lock_wait_seconds` has it).
    pub(crate) waited: Duration,
    /// The current check is only a wait in line (the standby already held its place): its
    /// duration is the queue's, and `leaderrun_check_duration_seconds` does not observe it.
    pub(crate) wait_only: bool,
    /// The ended term whose holds are being waited for before its session is released, and
    /// the end of that wait: a campaign dropped meanwhile hands the session on to a task that
    /// keeps waiting ([`Campaign::abandon`]), instead of freeing the lock under live work.
    pub(crate) releasing: Option<(Term, Instant)>,
}

/// Who holds the lock, for a standby whose check was refused: one row whatever is found (the
/// holder's fields are NULL when the lock was released meanwhile). The activity is read for
/// the holder's pid only.
const HOLDER_SQL: &str = concat!(
    "SELECT l.pid, ",
    activity_bytes!("a.application_name"),
    ", pg_catalog.host(a.client_addr), \
       pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', \
       'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ",
    activity_bytes!("a.query"),
    " FROM (SELECT 1) AS one \
     LEFT JOIN pg_catalog.pg_locks l ON l.locktype OPERATOR(pg_catalog.=) 'advisory' \
       AND l.database OPERATOR(pg_catalog.=) ",
    current_database_oid!(),
    " AND l.classid OPERATOR(pg_catalog.=) ANY ($1) AND l.objid OPERATOR(pg_catalog.=) $2 \
       AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted \
     LEFT JOIN LATERAL (SELECT * FROM pg_catalog.pg_stat_get_activity(l.pid) \
       WHERE l.pid IS NOT NULL) a ON true \
     ORDER BY pg_catalog.array_position($1, l.classid)"
);

/// How soon after a grant the term's first check runs (at most a quarter interval).
const FIRST_CHECK_AFTER_GRANT: Duration = Duration::from_millis(50);

/// The leader's check: its backend, whether that backend holds the slot's key, recovery, and
/// whether place 1 of the line is held in the same database. The database is the one of the
/// backend's own row (a backend's advisory locks carry its database), so the check reads no
/// catalog and calls no function a role may be refused (`pg_database` was one: a revoked,
/// locked or lock-table-starved catalog failed every check of a held lock); without its own
/// row it is no leader, and place 1 does not matter.
pub(crate) const LOCK_ROW_SQL: &str = "WITH own AS (SELECT database FROM pg_catalog.pg_locks \
             WHERE locktype OPERATOR(pg_catalog.=) 'advisory' \
               AND classid OPERATOR(pg_catalog.=) $1 AND objid OPERATOR(pg_catalog.=) $2 \
               AND objsubid OPERATOR(pg_catalog.=) 2 \
               AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() AND granted) \
     SELECT pg_catalog.pg_backend_pid(), EXISTS (SELECT 1 FROM own), \
     pg_catalog.pg_is_in_recovery(), \
     EXISTS (SELECT 1 FROM pg_catalog.pg_locks l JOIN own \
               ON l.database OPERATOR(pg_catalog.=) own.database \
             WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' \
               AND l.classid OPERATOR(pg_catalog.=) $3 AND l.objid OPERATOR(pg_catalog.=) $2 \
               AND l.objsubid OPERATOR(pg_catalog.=) 1 AND l.granted)";

impl Campaign<'_> {
    /// The server this replica's session reached (`USER@HOST:PORT/DBNAME`), for a message
    /// about that server; the whole list of hosts when no session is open.
    pub(crate) fn reached(&self) -> String {
        self.role
            .session()
            .map_or_else(|| self.shared.target.clone(), |s| s.endpoint.clone())
    }

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
        // Spread a fleet's first connects
        // (docs/field-notes.md#full-and-starting-servers-are-transient): nothing is held yet, so
        // waiting here costs only the delay.
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
                    _ = safety.tick(), if self.role.is_leader() => {
                        if self.window_passed() {
                            self.demote_unsafe().await;
                            ticker.reset();
                        }
                        continue;
                    }
                    closed = session_closed(self.role.session_mut()) => {
                        let led = self.role.is_leader();
                        self.on_session_closed(closed);
                        if led {
                            ticker.reset();
                        }
                        continue;
                    }
                    _ = ticker.tick() => {}
                }
            }
            let leading = self.role.is_leader();
            let proven_until = self.role.term().and_then(|t| t.term().proven_until());
            let phase = {
                let check = async {
                    if self.role.is_leader() {
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
                Phase::Checked(Ok(())) if !leading && self.role.is_leader() => {
                    // Just granted: the first leader check follows soon, once COMMAND has
                    // started (on a small machine the check's server work would compete with
                    // its fork and exec). Its text, with the term in it, is what `leaderrun
                    // status` reads from pg_stat_activity.
                    ticker.reset_after(FIRST_CHECK_AFTER_GRANT.min(interval / 4));
                }
                Phase::Checked(Ok(())) => {
                    // A one-shot tries a server that is momentarily full or starting up (53300,
                    // 57P03) again soon, with jitter, for up to one interval (see
                    // docs/field-notes.md#full-and-starting-servers-are-transient): a fleet whose
                    // cron fires the same minute gets through. A campaign that goes on tries at
                    // its next check: every standby retrying within the interval would hammer
                    // the server that is full.
                    let transient = self.shared.config.retry_transient_soon
                        && self.shared.checks.borrow().last == Some(CheckOutcome::Failed)
                        && self.shared.checks.borrow().last_transient;
                    if let Role::Standby {
                        transient_since, ..
                    } = &mut self.role
                    {
                        if transient {
                            let since = *transient_since.get_or_insert_with(Instant::now);
                            if since.elapsed() < interval {
                                ticker.reset_after(jitter(interval / 8));
                            }
                        } else {
                            *transient_since = None;
                        }
                    }
                }
                Phase::Checked(Err(err)) => {
                    // The check failed on a live session: the lock may still be held, so the
                    // work stops before it is released
                    // (docs/field-notes.md#a-failed-check-is-not-a-lost-lock).
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
                    drop(self.role.take_standby_session());
                    return;
                }
            }
        }
    }

    /// Whether the leader's safe window (2 check intervals from the send time of its last good
    /// check, on CLOCK_BOOTTIME) has passed.
    pub(crate) fn window_passed(&self) -> bool {
        self.role
            .term()
            .is_some_and(|t| t.term().proven_until().is_some_and(|u| boottime() >= u))
    }

    /// Demotes because the safe window passed, without a round trip.
    pub(crate) async fn demote_unsafe(&mut self) {
        let Some(until) = self.role.term().and_then(|t| t.term().proven_until()) else {
            return;
        };
        let window = self.shared.config.safe_window();
        let since = leader::since_last_proof(boottime(), until, window).unwrap_or(window);
        self.demote(&Error::SafeWindowPassed { since }).await;
    }

    /// The server ended the session: the lock is gone with it, so there is nothing to hold
    /// back; the term ends at once (docs/field-notes.md#the-lock-goes-with-the-session).
    pub(crate) fn on_session_closed(&mut self, cause: Option<tokio_postgres::Error>) {
        // Nothing to wait for: the session, and its lock, are gone already. The term ends
        // first, so the child's stop starts without delay.
        let ended = self.end_term(TermEnd::LeadershipLost);
        if let Some(mut session) = self.role.take_standby_session() {
            session.release_copy(false);
        }
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

    /// Publishes one check's outcome in [`Checks`](crate::Checks).
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
            checks.last_reached = match outcome {
                CheckOutcome::Failed => false,
                CheckOutcome::Lost => !matches!(
                    error,
                    Some(Error::Timeout { .. } | Error::SafeWindowPassed { .. })
                ),
                _ => true,
            };
            checks.last_ruled_out = error.is_some_and(Error::rules_out_leading);
            if let Some(err) = error {
                checks.last_error = Some(Chain(err).to_string());
            }
        });
    }
}

impl Campaign<'_> {
    /// Leaves the election without unlocking: after a panic, or when `run`'s future is dropped
    /// mid-await. The session may be mid-statement, so it is closed instead; the server frees
    /// the lock when the socket closes.
    pub(crate) fn abandon(&mut self, panicked: bool) {
        let led = self.end_term(TermEnd::LeadershipLost);
        let bound = self.shared.config.effective_idle_session_timeout();
        // Dropped while it waited for an ended term's holds (after a demotion or a cancel):
        // that wait goes on, for what is left of it.
        let releasing = self.releasing.take();
        self.shared.releasing.store(false, Ordering::Release);
        let waited_for = match (&led, releasing) {
            (Some(control), _) => Some((control.term().clone(), bound)),
            (None, Some((term, until))) => {
                Some((term, until.saturating_duration_since(Instant::now())))
            }
            (None, None) => None,
        };
        let mut session = self.role.take_standby_session();
        if let (Some((term, bound)), Some(_)) = (waited_for, &session) {
            // Work may still run under the term: the session (and maybe the lock) stays until
            // it is dead, as in every other demotion, on a task of its own since this runs in
            // a drop. Nothing is sent on it: it may be mid-statement.
            let held = TermControl { term };
            if held.holds() > 0 {
                if let (Ok(runtime), Some(session)) =
                    (tokio::runtime::Handle::try_current(), session.take())
                {
                    runtime.spawn(async move {
                        if !held.released(bound).await {
                            held.released_under_holds();
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

#[cfg(test)]
mod tests;
