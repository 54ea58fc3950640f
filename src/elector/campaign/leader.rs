//! The leader's side of a campaign: the grant (`begin_term`), the check that proves the lock
//! (`verify`), demotion, the release after every hold, and resignation.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tracing::{debug, error, info, warn};

use super::{Campaign, Role, LOCK_ROW_SQL};
use crate::elector::metrics::demotion_cause;
use crate::elector::session::{boottime, session_closed, Session};
use crate::elector::term::{Lease, Term, TermControl, TermEnd};
use crate::elector::{CheckOutcome, UNLOCK_BOUND};
use crate::error::{Chain, Error};
use crate::pg::lock::{Held, CAN_CHECK_SQL};
use crate::pg::within;

impl Campaign<'_> {
    /// Slot `slot` was granted on the current session in the check whose answer is `row`
    /// ([`try_sql`](crate::pg::lock::try_sql)'s columns): make it the lock session and start a
    /// term.
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
        if let Some(session) = self.role.session_mut() {
            session.granted = Some(key);
        } else {
            return Ok(());
        }
        let idle = config.effective_idle_session_timeout();
        // A grant no check could prove is no term: each replica in turn would start COMMAND
        // and stop it at its first check. The pin's "no" is asked again, so a privilege granted
        // since counts at once; the pin's "yes" costs the grant nothing.
        if let Some(session) = self.role.session_mut().filter(|s| !s.can_check) {
            let bound = config.effective_check_interval().min(config.io_bound());
            let row = session
                .bounded("can the check read pg_locks", bound, CAN_CHECK_SQL, &[])
                .await?;
            session.can_check = row.get::<_, Option<bool>>(0) != Some(false);
            if !session.can_check {
                return Err(Error::CannotCheck {
                    server: session.endpoint.clone(),
                });
            }
        }
        // Found direct or not when the session's timers were pinned (`Session::direct`).
        let direct = self.role.session().is_some_and(|s| s.direct);
        // Behind a transaction-mode pooler two client sessions can share one server backend,
        // and a session lock then excludes nothing
        // (docs/field-notes.md#transaction-mode-poolers-move-the-session). A direct TCP connection,
        // whose local address and port are the ones the server sees, cannot be a pooler's, nor a
        // Unix socket whose listener is the backend's parent; anything else is proven with a
        // second session, whose failure to connect costs a WARN, not the election
        // (docs/guarantees.md#safety-guarantees).
        if !direct {
            tracing::debug!(
                target: "leaderrun::elector",
                "leader: a second session proves that no transaction-mode pooler sits between"
            );
            let backend_pid = self.role.session().map_or(0, |s| s.backend_pid);
            match self.probe_exclusion(key, backend_pid).await {
                Err(err @ (Error::SharedBackend | Error::BackendChanged { .. })) => {
                    return Err(err)
                }
                Err(err) => warn!(
                    target: "leaderrun::elector",
                    "leader: cannot open a second session to rule out a transaction-mode \
                     pooler; leading on the one session: {}",
                    Chain(&err)
                ),
                Ok(()) => {}
            }
        }
        // No await from here to the term's start: the standby's session becomes the leader's.
        let Some(mut session) = self.role.take_standby_session() else {
            return Ok(());
        };
        // A connection that ended after its answer (the server closed the session, which frees
        // the lock) holds nothing: no term begins on it. Later ends are the term's to find.
        match session.closed.try_recv() {
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            Ok(err) => return Err(Error::SessionClosed(err)),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                return Err(Error::SessionClosed(None))
            }
        }
        let number = self.shared.terms.load(Ordering::Acquire) + 1;
        let lease = Lease {
            lock: key,
            slot,
            backend_pid: session.backend_pid,
            fencing_token: row.get::<_, Option<i64>>(1).unwrap_or_default(),
            database: row.get(2),
            granted_at: SystemTime::now(),
        };
        // The comments are what `leaderrun status` reads back from pg_stat_activity.query;
        // every value in them is a number or a timestamp we formatted. Who leads comes first:
        // a small track_activity_query_size keeps only the text's first 99 bytes.
        let check_sql = format!(
            "{} /* leaderrun term={number} since={} fencing_token={} */ {LOCK_ROW_SQL}",
            crate::pg::holder::identity_comment(),
            humantime::format_rfc3339_seconds(lease.granted_at),
            lease.fencing_token,
        );
        // Whoever keeps the session alive beyond this process (the watchdog) gets its copy
        // before anything can run under the term. A first grant before the watchdog is up
        // waits here for its start (see `runner`). Without the copy a killed leaderrun would
        // hand the lock on at once, its tree maybe still running: no term begins.
        if let Some(keeper) = &config.keeper {
            if let Err(err) = keeper.keep(session.fd.as_fd()) {
                // Back to the standby, which gives the lock back as it does a pooler's grant.
                if let Role::Standby { session: slot, .. } = &mut self.role {
                    *slot = Some(session);
                }
                return Err(Error::Keeper(err));
            }
            session.keeper = Some(keeper.clone());
        }
        // From here on the keeper holds a copy: every way the session ends takes it back first
        // (`Session::release_copy`, from `drop_session`, the resignation, or the session's own
        // drop). The check is sent with its text each time (one round trip, no PREPARE at the
        // grant, which would delay COMMAND).
        session.check = Some(check_sql);
        let session_endpoint = session.endpoint.clone();
        self.shared.terms.store(number, Ordering::Release);
        // The grant is the term's first proof: its window counts from the try's send time.
        let (term, control) = Term::issue(number, Some(lease.clone()), sent + config.safe_window());
        self.role = Role::Leader {
            session,
            term: control,
            first_check: true,
        };
        term.mirror_proof_into(&self.shared.proven_until);
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
            server = %session_endpoint,
            lock = %lease.lock,
            fencing_token = lease.fencing_token,
            idle_session_timeout_ms = idle.as_millis() as u64,
            "background leader lock acquired"
        );
        Ok(())
    }

    /// The leader's check: proves in one round trip that this session still holds the lock.
    /// `Err` is the cause to demote with; the session is left as it is for [`Self::demote`].
    pub(crate) async fn verify(&mut self) -> Result<(), Error> {
        let Role::Leader {
            session,
            term: control,
            first_check,
        } = &mut self.role
        else {
            return Ok(());
        };
        let Some(check_sql) = session.check.as_deref() else {
            return Ok(());
        };
        // After a suspend or a SIGSTOP: no round trip once the safe window has passed.
        if let Some(until) = control.term().proven_until().filter(|&u| boottime() >= u) {
            let window = self.shared.config.safe_window();
            return Err(Error::SafeWindowPassed {
                since: since_last_proof(boottime(), until, window).unwrap_or(window),
            });
        }
        let first = std::mem::take(first_check);
        let sent = boottime();
        let config = &self.shared.config;
        let bound = config.effective_check_interval().min(config.io_bound());
        let lock = session.granted.unwrap_or(config.lock);
        // pg_locks shows the int4 halves as oid, i.e. unsigned.
        let (class, id, request) = (lock.class as u32, lock.id as u32, lock.step_down_class());
        let started = Instant::now();
        self.waited = Duration::ZERO;
        self.wait_only = false;
        let result = session
            .bounded_typed(
                "leader check",
                bound,
                check_sql,
                &[(&class, Type::OID), (&id, Type::OID), (&request, Type::OID)],
            )
            .await
            .and_then(|row| {
                let pid: i32 = row.get(0);
                let held: bool = row.get(1);
                let in_recovery: bool = row.get(2);
                // `leaderrun step-down` holds our key's request (`LockKey::step_down_request`).
                let step_down: bool = row.get(3);
                if pid != session.backend_pid {
                    Err(Error::BackendChanged {
                        granted_to: session.backend_pid,
                        now: pid,
                    })
                } else if in_recovery {
                    Err(Error::InRecovery {
                        server: session.endpoint.clone(),
                    })
                } else if !held {
                    Err(Error::LockNotHeld {
                        lock,
                        backend_pid: pid,
                    })
                } else if step_down && !first {
                    Err(Error::StepDownRequested)
                } else if control.term().is_given_up() {
                    Err(Error::GivenUp)
                } else {
                    Ok(())
                }
            });
        let window = config.safe_window();
        // An answer that arrives after the window closed proves nothing any more. The window
        // that closed is the last proof's: read before this proof is offered.
        let last = control.term().proven_until();
        let result = result.and_then(|()| match control.prove(sent + window) {
            true if !control.term().is_ended() => {
                control.term().mirror_proof();
                Ok(())
            }
            false => Err(Error::SafeWindowPassed {
                since: last
                    .and_then(|until| since_last_proof(boottime(), until, window))
                    .unwrap_or_else(|| boottime().saturating_sub(sent)),
            }),
            true => Ok(()),
        });
        match result {
            Ok(()) => {
                self.record(CheckOutcome::Verified, started, None);
                debug!(target: "leaderrun::elector", latency_ms = started.elapsed().as_millis() as u64, "leader check ok");
                Ok(())
            }
            Err(err) => {
                self.found_pooler(&err);
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
    /// it at once), log the cause, and close the session only once every
    /// [`TermHold`](crate::TermHold) is dropped, since a session that is still open may still hold
    /// the lock (see docs/field-notes.md#a-failed-check-is-not-a-lost-lock). Nothing is sent on the
    /// session meanwhile, so the server's `idle_session_timeout` bounds the wait; so does this one.
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
        // The session stays in the role while the holds are waited for, so that a campaign
        // dropped meanwhile still has it to hand on (`Campaign::abandon`).
        self.release_after_holds(&control, self.role.session().is_some())
            .await;
        let session = self.role.take_standby_session();
        // A direct session's close frees the lock; a pooled server session outlives its
        // client's close, so a session that is not direct gives the lock back first, on the
        // backend that was granted it (the work is stopped by now), unless it was cut off
        // (no answer, or its connection ended): sent there, the give-back would only spend its
        // bound before the next check.
        let cut_off = matches!(
            cause,
            Error::SafeWindowPassed { .. }
                | Error::Timeout { .. }
                | Error::SessionClosed(_)
                | Error::LockNotHeld { .. }
        );
        if let Some(session) = session.as_ref().filter(|s| !s.direct && !cut_off) {
            let lock = session.granted.unwrap_or(self.shared.config.lock);
            session.give_back(Held::Key(lock), UNLOCK_BOUND).await;
        }
        self.drop_session(session);
    }

    /// Closes a session on purpose: whoever keeps a copy of its socket drops it first, or the
    /// session (and the lock) would outlive the close.
    pub(crate) fn drop_session(&self, session: Option<Session>) {
        if let Some(mut session) = session {
            session.release_copy(true);
        }
    }

    /// Waits for the holds of `control`'s term, bounded by `idle_session_timeout`.
    pub(crate) async fn release_after_holds(&mut self, control: &TermControl, may_hold_lock: bool) {
        if control.holds() == 0 || !may_hold_lock {
            return;
        }
        debug!(
            target: "leaderrun::elector",
            term = control.term().number(),
            "keeping the lock session until the term's work has stopped"
        );
        let bound = self.shared.config.effective_idle_session_timeout();
        self.releasing = Some((control.term().clone(), Instant::now() + bound));
        self.shared.releasing.store(true, Ordering::Release);
        // The server may end the session first (its idle_session_timeout counts from the last
        // check, before the wait began; a terminated backend): the lock is gone then, and the
        // work outlived it. The wait goes on all the same (no check runs while the work does).
        let until = Instant::now() + bound;
        let released = tokio::select! {
            released = control.released(bound) => released,
            _ = session_closed(self.role.session_mut()) => {
                control.released_under_holds();
                control.released(until.saturating_duration_since(Instant::now())).await
            }
        };
        self.releasing = None;
        *self
            .shared
            .released_at
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.shared.releasing.store(false, Ordering::Release);
        if !released {
            control.released_under_holds();
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
    /// The leader stands by with its session, for the caller to release.
    pub(crate) fn end_term(&mut self, cause: TermEnd) -> Option<TermControl> {
        let control = self.role.stand_by()?;
        self.shared.leader.store(false, Ordering::Release);
        self.shared.proven_until.store(0, Ordering::Release);
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
            self.release_after_holds(control, self.role.session().is_some())
                .await;
        }
        let Some(mut session) = self.role.take_standby_session() else {
            return;
        };
        let mut unlock_failed = false;
        // The server took an unlock on this session.
        let mut unlocked = false;
        if let Some(control) = control {
            let term = control.term();
            let lock = session.granted.unwrap_or(self.shared.config.lock);
            // A session that is not direct gives it back on the backend that was granted it,
            // and says so itself when it cannot (closing it frees nothing there).
            if !session.direct {
                unlocked = session.give_back(Held::Key(lock), UNLOCK_BOUND).await;
                unlock_failed = !unlocked;
                if unlocked {
                    info!(
                        target: "leaderrun::elector",
                        term = term.number(),
                        lock = %lock,
                        "background leader lock released"
                    );
                }
            } else {
                // One round trip: the simple protocol, with the key written out.
                let unlock = crate::pg::lock::unlock_sql(lock);
                let result = match session.client.as_ref() {
                    Some(client) => within("unlock", UNLOCK_BOUND, client.simple_query(&unlock))
                        .await
                        .map(|_| ()),
                    None => Err(Error::SessionClosed(None)),
                };
                unlock_failed = result.is_err();
                unlocked = result.is_ok();
                match result {
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
        }
        // After an unlock the server took, the lock is free and the close ends the session by
        // Terminate, which the backend obeys whoever else holds a copy of the socket: the
        // watchdog is told to drop its copy without waiting for its answer (a round trip to
        // another process, on a one-shot's path to its exit; leaderrun reaps the watchdog before
        // it exits anyway). When the unlock failed, the close is what frees the lock, and the
        // copy must be gone first.
        session.release_copy(!unlocked);
        session.close(unlock_failed).await;
    }
}

/// Time from the send of the check whose proof ran until `until` (its window `window` long) to
/// `now`, all on [`boottime`]: what [`Error::SafeWindowPassed`] reports. `None` for a proof
/// that was revoked rather than run out (its end is not a check's).
pub(crate) fn since_last_proof(
    now: Duration,
    until: Duration,
    window: Duration,
) -> Option<Duration> {
    until
        .checked_sub(window)
        .map(|proved_at| now.saturating_sub(proved_at))
}
