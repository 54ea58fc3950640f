//! The standby's side of a campaign: the try (`try_acquire`), the wait in the server's lock
//! queue (`wait_in_line`), naming the holder a standby sees, and the probe that proves two
//! sessions exclude each other.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{is_transient, Campaign, Role, HOLDER_SQL};
use crate::elector::connecting::connect;
use crate::elector::session::{boottime, Session};
use crate::elector::{CheckOutcome, UNLOCK_BOUND};
use crate::error::{Chain, Error};
use crate::pg::lock::{
    probe_sql, standby_comment, try_sql, Guard, Held, LockKey, MOVED_BACKEND, NOT_DIRECT,
};
use crate::pg::within;

/// A wait's answer: the row when it was granted, `None` when it timed out on the server
/// (`lock_timeout`, 55P03: what is ahead is still held, and the session keeps its place).
pub(crate) fn lock_timeout_is_refusal(
    result: Result<tokio_postgres::Row, Error>,
) -> Result<Option<tokio_postgres::Row>, Error> {
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

impl Campaign<'_> {
    pub(crate) async fn try_acquire(&mut self) {
        self.waited = Duration::ZERO;
        self.wait_only = self.role.session().is_some_and(|s| s.place.is_some());
        let started = Instant::now();
        let sent = boottime();
        match self.try_acquire_inner(started, sent).await {
            // begin_term recorded it, before publishing the term; the holders a standby saw
            // went with the standby.
            Ok(CheckOutcome::Granted) => {}
            Ok(CheckOutcome::Refused) => {
                self.record(CheckOutcome::Refused, started, None);
                // Who holds it costs the server a pg_locks scan: asked at the first refusal,
                // then only by the standbys in line, so a fleet of pollers does not pay it at
                // every check (a thousand of them would keep a core busy).
                let in_line = self.role.session().is_some_and(|s| s.place.is_some());
                let named = matches!(&self.role, Role::Standby { holder_seen, .. } if !holder_seen.is_empty());
                if !named || in_line {
                    self.note_holder().await;
                }
            }
            Ok(outcome) => self.record(outcome, started, None),
            Err(err @ Error::InRecovery { .. }) => {
                self.say_refusal(&err);
                // The next check connects again, from the first host of the list, as libpq
                // would: kept, the session would stay on this standby after the primary is
                // back.
                let session = self.role.take_standby_session();
                self.drop_session(session);
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(
                err @ (Error::BackendHeldByAnother
                | Error::GrantMoved
                | Error::BackendChanged { .. }
                | Error::PoolerFound { .. }
                | Error::SharedBackend
                | Error::Keeper(_)
                | Error::CannotCheck { .. }),
            ) => {
                self.found_pooler(&err);
                self.say_refusal(&err);
                // Closing the client does not end a pooled server session: what the session
                // holds is given back first, on its backend. A grant no term begins on (a
                // pooler found at the grant, the watchdog, a check it could not make); a place
                // in the line an earlier check took on a session that is not direct (it would
                // hold up every standby behind it; a direct session's close frees it). A
                // guarded statement that was refused took nothing, and a first grant that
                // moved was given back where it could be.
                if let Some(session) = self.role.take_standby_session() {
                    if let Some(key) = session.granted {
                        session.give_back(Held::Key(key), UNLOCK_BOUND).await;
                    }
                    if let Some((slot, place)) = session.place.filter(|_| !session.direct) {
                        let key = self.shared.config.lock.slot(slot);
                        session
                            .give_back(Held::Place(key, place), UNLOCK_BOUND)
                            .await;
                    }
                    self.drop_session(Some(session));
                }
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(err) => {
                // docs/field-notes.md#a-timed-out-try-may-have-been-granted: whatever failed, the
                // session may hold a grant we never saw; never reuse it.
                let session = self.role.take_standby_session();
                let err = match &session {
                    Some(session) => session.explain(err),
                    None => err,
                };
                self.drop_session(session);
                let transient = is_transient(&err);
                let config = &self.shared.config;
                if config.warn_failed_tries && (config.warn_transient_tries || !transient) {
                    warn!(target: "leaderrun::elector", "leader: acquire lock connection: {}", Chain(&err));
                } else {
                    debug!(target: "leaderrun::elector", "leader: acquire lock connection: {}", Chain(&err));
                }
                self.record(CheckOutcome::Failed, started, Some(&err));
                self.shared
                    .checks
                    .send_modify(|c| c.last_transient = transient);
            }
        }
    }

    /// Notes that `err` shows a pooler that moves sessions between server backends or shares
    /// them between clients (docs/field-notes.md#transaction-mode-poolers-move-the-session):
    /// for a while this elector tries nothing on a session that is not direct
    /// ([`Error::PoolerFound`]), where each grant could leave a count on a pooled backend.
    pub(crate) fn found_pooler(&self, err: &Error) {
        if matches!(
            err,
            Error::BackendHeldByAnother
                | Error::GrantMoved
                | Error::BackendChanged { .. }
                | Error::SharedBackend
        ) {
            *self
                .shared
                .pooler_found
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
    }

    /// Time left of the back-off after this elector last found a pooler ([`found_pooler`](Self::found_pooler),
    /// [`pooler_backoff`](crate::elector::pooler_backoff)); `None` when it is over or none was found.
    fn pooler_backoff_left(&self) -> Option<Duration> {
        let backoff = crate::elector::pooler_backoff(self.shared.config.effective_check_interval());
        let found = *self
            .shared
            .pooler_found
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        found.and_then(|at| backoff.checked_sub(at.elapsed()))
    }

    /// Says why this replica refuses to lead on the server it reached (in recovery, a pooler):
    /// an ERROR, or DEBUG for a caller that reports the failure itself
    /// ([`Config::warn_failed_tries`](crate::Config::warn_failed_tries), `leaderrun --once`),
    /// so that it is printed once.
    fn say_refusal(&self, err: &Error) {
        if self.shared.config.warn_failed_tries {
            error!(target: "leaderrun::elector", "leader: {}", Chain(err));
        } else {
            debug!(target: "leaderrun::elector", "leader: {}", Chain(err));
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
        let Some(session) = self.role.session() else {
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
        let Role::Standby { holder_seen, .. } = &mut self.role else {
            return;
        };
        if pids.is_empty() || *holder_seen == pids {
            return;
        }
        *holder_seen = pids;
        let mut holders = Vec::new();
        for row in &rows {
            let Some(pid) = row.get::<_, Option<i32>>(0) else {
                continue;
            };
            let application_name = crate::pg::holder::activity_text(row.get(1));
            let backend_start: Option<String> = row.get(3);
            let query = crate::pg::holder::activity_text(row.get(4));
            let (term, since, _) =
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
            // Another elector of this process (the seed allows several) runs leader checks
            // on its session; a try of ours that timed out and was granted after all left a
            // standby's statement there. Just granted, another elector's session shows its
            // try too: then both are said.
            let own = match (who.is_this_process(), term) {
                (false, _) => "",
                (true, Some(_)) => " (another elector of this process)",
                (true, None) => {
                    " (this process's own session: another elector of this process just \
                     granted, or a try of ours that timed out and was granted after all, which \
                     the server frees when it ends that session)"
                }
            };
            holders.push(format!("{who}, backend {pid}, {since}{own}"));
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

    pub(crate) async fn try_acquire_inner(
        &mut self,
        started: Instant,
        mut sent: Duration,
    ) -> Result<CheckOutcome, Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let slots = config.effective_slots();
        self.shared.steps.begin();
        // A new session's first try travels with its set-up (Session::open_and_try).
        let mut first = None;
        if let Role::Standby { session: None, .. } = self.role {
            // A replica that found a transaction-mode pooler a moment ago sets nothing on a
            // session that is not direct: its timers would stay on a server connection that
            // other clients of the pooler use next.
            if let Some(again_in) = self.pooler_backoff_left() {
                let direct = crate::elector::session::is_direct_session(
                    config,
                    &self.shared.target,
                    &self.shared.steps,
                )
                .await?;
                if !direct {
                    return Err(Error::PoolerFound { again_in });
                }
            }
            let (opened, answer) =
                Session::open_and_try(config, &self.shared.target, &self.shared.steps).await?;
            if let Role::Standby { session, .. } = &mut self.role {
                *session = Some(opened);
            }
            self.shared.checks.send_modify(|c| c.sessions_opened += 1);
            first = answer;
        }
        // The flight's try: a grant on a session that is not direct (a Unix socket whose
        // listener looked like PostgreSQL's and is no backend's parent) may be the holder's
        // lock counted up on a shared backend, and is given back; nothing was taken where the
        // server did not see our socket (NOT_DIRECT). Either way the lock is tried again below
        // with the session's own guard.
        let first = match first {
            Some(answer) => {
                let answer = answer?;
                let direct = self.role.session().is_some_and(|s| s.direct);
                match answer.get::<_, Option<i32>>(0) {
                    Some(code) if !direct && code >= 0 => {
                        self.give_back_first_grant(code as u32).await?;
                        None
                    }
                    Some(NOT_DIRECT) => None,
                    _ => Some(answer),
                }
            }
            None => None,
        };
        let Some(session) = self.role.session() else {
            return Ok(CheckOutcome::Failed);
        };
        if first.is_none() && !session.direct {
            if let Some(again_in) = self.pooler_backoff_left() {
                return Err(Error::PoolerFound { again_in });
            }
        }
        let mut row = match (first, session.place) {
            (Some(answer), _) => Some(answer),
            (None, Some(place)) => self.wait_in_place(place).await?,
            (None, None) => match session.try_lock.as_ref() {
                Some(statement) => Some(
                    session
                        .bounded("try advisory lock", bound, statement, &[])
                        .await?,
                ),
                None if !session.direct => {
                    // Never prepared on a session that is not direct: behind a transaction-mode
                    // pooler a named statement stays on the shared server connection, and the
                    // next client that prepares one of the same name fails.
                    let sql = try_sql(
                        config.lock,
                        slots,
                        config.wait_for_release,
                        &session.guard(),
                    );
                    Some(
                        session
                            .bounded_typed("try advisory lock", bound, &sql, &[])
                            .await?,
                    )
                }
                None => {
                    // The session's first try went unprepared in its set-up flight; its second
                    // prepares the statement in the same flight as it runs it unprepared.
                    let sql = try_sql(config.lock, slots, config.wait_for_release, &Guard::None);
                    let (prepared, row) = tokio::join!(
                        session.prepare("prepare the lock statements", bound, &sql),
                        session.bounded_typed("try advisory lock", bound, &sql, &[])
                    );
                    let row = row?;
                    if let Some(session) = self.role.session_mut() {
                        session.try_lock = prepared.ok();
                    }
                    Some(row)
                }
            },
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
                        server: self.reached(),
                    })
                }
                Some(crate::pg::lock::SHARED_BACKEND) => return Err(Error::BackendHeldByAnother),
                Some(MOVED_BACKEND) => {
                    return Err(Error::BackendChanged {
                        granted_to: self.role.session().map_or(0, |s| s.backend_pid),
                        now: answer.get::<_, Option<i32>>(3).unwrap_or_default(),
                    })
                }
                Some(code) if code < 0 => {
                    debug!(target: "leaderrun::elector", lock = %self.shared.config.lock, "lock held by another session; standing by");
                    return Ok(CheckOutcome::Refused);
                }
                Some(code) if (code as u32) < slots => {
                    if let Some(session) = self.role.session_mut() {
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
                    if let Some(session) = self.role.session_mut() {
                        session.place = Some(place);
                    }
                    debug!(target: "leaderrun::elector", lock = %self.shared.config.lock.slot(place.0), place = place.1, "in line: waiting in the server's queue");
                    // A grant of this wait is proven from its own send time, not the check's:
                    // each wait may take up to an interval (`lock_timeout`), so a standby that
                    // moved up and was then granted in the same check would begin its term
                    // with its window all but spent, and lose it before its first check.
                    sent = boottime();
                    row = self.wait_in_place(place).await?;
                }
            }
        }
    }

    /// The session is not direct, and its flight's try, sent before that was known, was
    /// granted `code` (a slot, or a place in the line: [`try_sql`]): on a server backend
    /// shared with other clients that may be the holder's lock granted once more
    /// (docs/field-notes.md#transaction-mode-poolers-move-the-session). Only a Unix socket whose
    /// listener is named `postgres` and is no backend's parent comes here (over TCP the try
    /// took nothing where the server did not see our socket). The grant is given back;
    /// [`Error::GrantMoved`] when the unlock found nothing to give back (the session moved
    /// between backends).
    async fn give_back_first_grant(&mut self, code: u32) -> Result<(), Error> {
        let config = &self.shared.config;
        let Some(session) = self.role.session() else {
            return Err(Error::SessionClosed(None));
        };
        let slots = config.effective_slots();
        let key = config.lock.slot(code % slots);
        let held = match code / slots {
            0 => Held::Key(key),
            place => Held::Place(key, place),
        };
        let unlock = format!("SELECT {}", held.unlock_call());
        debug!(target: "leaderrun::elector", lock = %key, "granted on a session that is not direct: giving it back and trying again guarded");
        // Not prepared: a named statement would outlive a one-shot on a pooler's shared server
        // connection, and the next client there that prepares one of the same name would fail.
        let unlocked = session
            .bounded_typed("unlock", config.io_bound(), &unlock, &[])
            .await?;
        if !unlocked.get::<_, bool>(0) {
            return Err(Error::GrantMoved);
        }
        Ok(())
    }

    /// The wait of this check at `place` (slot, place) in the line: a queue head of a lock
    /// with slots also waits for the slots that have no head ([`Self::wait_as_heads`]); every
    /// other place is one wait on the session ([`Self::wait_in_line`]).
    pub(crate) async fn wait_in_place(
        &mut self,
        place: (u32, u32),
    ) -> Result<Option<tokio_postgres::Row>, Error> {
        if place.1 == 1 && self.shared.config.effective_slots() > 1 {
            self.wait_as_heads(place).await
        } else {
            self.wait_in_line(place).await
        }
    }

    /// The prepared wait of `place` (slot, place) on the session ([`wait_sql`](crate::pg::lock::wait_sql)), prepared
    /// the first time this session holds that place.
    pub(crate) async fn prepared_wait(
        &mut self,
        place: (u32, u32),
    ) -> Result<tokio_postgres::Statement, Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let Some(session) = self.role.session_mut() else {
            return Err(Error::SessionClosed(None));
        };
        if let Some((_, statement)) = session.waits.iter().find(|(p, _)| *p == place) {
            return Ok(statement.clone());
        }
        let sql = session.wait_text(config, place);
        let statement = session
            .prepare("prepare the wait in line", bound, &sql)
            .await?;
        session.waits.push((place, statement.clone()));
        Ok(statement)
    }

    /// The wait of the standby at `place` (slot, place) in the line ([`wait_sql`](crate::pg::lock::wait_sql)), bounded
    /// on the server by `lock_timeout` (one interval); only a client-side timeout means
    /// "unknown outcome" (docs/field-notes.md#a-timed-out-try-may-have-been-granted). `None` when
    /// the wait timed out on the server: what is ahead is still held, and this session keeps its
    /// place.
    pub(crate) async fn wait_in_line(
        &mut self,
        place: (u32, u32),
    ) -> Result<Option<tokio_postgres::Row>, Error> {
        // Unprepared on a session that is not direct, as its try is.
        let direct = self.role.session().is_some_and(|s| s.direct);
        let statement = match direct {
            true => Some(self.prepared_wait(place).await?),
            false => None,
        };
        let config = &self.shared.config;
        let Some(session) = self.role.session() else {
            return Err(Error::SessionClosed(None));
        };
        let bound = config.effective_check_interval() + config.io_bound();
        let wait = async {
            match &statement {
                Some(statement) => {
                    session
                        .bounded("wait for the advisory lock", bound, statement, &[])
                        .await
                }
                None => {
                    let sql = session.wait_text(config, place);
                    session
                        .bounded_typed("wait for the advisory lock", bound, &sql, &[])
                        .await
                }
            }
        };
        // The wait is queued on the server as soon as it is sent: a standby is ready from
        // then on (docs/guarantees.md#observing-a-replica), not only once its wait times out.
        self.shared.checks.send_modify(|c| c.waiting = true);
        let wait_started = Instant::now();
        let result = wait.await;
        // `waiting` stays set until this check's outcome is recorded ([`Self::record`] clears
        // both at once): clearing it here would show a queued standby as "no check yet" for
        // the moment between the wait's end and its record.
        let waited = wait_started.elapsed();
        self.waited += waited;
        if let Some(metrics) = &self.shared.metrics {
            metrics.wait_seconds.observe(waited.as_secs_f64());
        }
        lock_timeout_is_refusal(result)
    }

    /// Opens a second session and tests the lock this session was just granted, on server
    /// backend `backend_pid`: the second session must reach another backend and be refused
    /// the lock there ([`probe_sql`], which gives back in the same statement whatever it was
    /// granted, so that no pooler can move the give-back away from the grant). Either failing
    /// means both sessions reached one server backend (a transaction-mode pooler):
    /// [`Error::SharedBackend`]. The test runs [`PROBE_ROUNDS`] times, each right after a
    /// statement of the lock session that must still answer from `backend_pid` (else
    /// [`Error::BackendChanged`]): a pooler that hands out the server connection its clients
    /// used last (PgBouncer's default) gives the second session the grant's backend right
    /// after the lock session has let it go, unless another client took it in between, which
    /// a single test, behind a new connection's start-up, often met.
    pub(crate) async fn probe_exclusion(
        &self,
        lock: LockKey,
        backend_pid: i32,
    ) -> Result<(), Error> {
        use tokio_postgres::SimpleQueryMessage;
        let config = &self.shared.config;
        let bound = config.io_bound();
        let (client, _closed, _task) =
            connect(&config.connect, &config.tls, &self.shared.target, bound).await?;
        let Some(session) = self.role.session() else {
            return Err(Error::SessionClosed(None));
        };
        let Some(ours) = session.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        // The simple protocol: no named prepared statement that a pooler could mix up.
        let probe = probe_sql(lock, backend_pid);
        let first = |messages: Vec<SimpleQueryMessage>| {
            messages.into_iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
        };
        for _ in 0..PROBE_ROUNDS {
            {
                let now = within(
                    "probe exclusion",
                    bound,
                    ours.simple_query("SELECT pg_catalog.pg_backend_pid()"),
                )
                .await
                .map(first)?
                .and_then(|pid| pid.parse::<i32>().ok());
                if let Some(now) = now.filter(|&now| now != backend_pid) {
                    return Err(Error::BackendChanged {
                        granted_to: backend_pid,
                        now,
                    });
                }
            }
            let shared = within("probe exclusion", bound, client.simple_query(&probe))
                .await
                .map(first)?;
            if shared.as_deref() == Some("t") {
                return Err(Error::SharedBackend);
            }
        }
        Ok(())
    }
}

/// How many times [`Campaign::probe_exclusion`] tests a grant on a session that is not direct
/// (a few round trips of the grant's, on such a session only).
const PROBE_ROUNDS: usize = 3;
