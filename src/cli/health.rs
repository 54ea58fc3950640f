//! Liveness and readiness, as `/healthz` and `/readyz` report them
//! (docs/guarantees.md#observing-a-replica).
//!
//! Readiness follows the seed's readiness table:
//!
//! | replica state | readiness |
//! |---|---|
//! | booted, no check yet | not ready |
//! | standby whose latest check could not reach the server | not ready, with that check's error |
//! | just demoted: the leader's check got no answer in time | not ready, with that check's error |
//! | standby before any check has reached the server | not ready |
//! | leader, last run/tick succeeded (or none yet) | ready |
//! | leader, last run/tick failed | not ready, with that run's error, until a later one succeeds |
//! | standby whose latest check reached the server, or whose wait is queued on it | ready: a
//! standby runs nothing and has no outcome of its own |
//!
//! A replica that cannot reach the server (a wrong password, a missing role or database, a
//! port where nothing listens) is therefore never ready: a rollout with a bad secret stops at
//! its first pod instead of turning every pod Ready while nobody can lead. Nor is one whose
//! checks reach a server it can never lead through (a transaction-mode pooler, a hot standby, a
//! privilege missing: [`crate::Error::rules_out_leading`]), which `/readyz` says as such.
//!
//! A failure belongs to the term it happened in, so a demoted leader's failure no longer
//! counts once it is a standby, nor in a later term.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::elector::{CheckOutcome, Checks, Elector};
use crate::timing::Timing;

/// Shared between the supervisor (which records run outcomes) and the HTTP thread.
#[derive(Debug)]
pub struct Health {
    booted: Instant,
    /// `/healthz` limit, [`Timing::liveness_limit`].
    liveness_limit: Duration,
    /// The grace: while a demoted term's tree is being stopped, the loop waits for it (at most
    /// the grace, then SIGKILL) before it checks again.
    grace: Duration,
    /// The latest failed run or tick: (term, reason). Cleared by a later success.
    failure: Mutex<Option<(u64, String)>>,
}

impl Health {
    /// Starts the clock for liveness at boot; the limit comes from `timing`.
    pub fn new(timing: &Timing) -> Health {
        Health {
            booted: Instant::now(),
            liveness_limit: timing.liveness_limit(),
            grace: timing.grace,
            failure: Mutex::new(None),
        }
    }

    /// A run or tick of COMMAND in `term` failed with `reason`.
    pub fn run_failed(&self, term: u64, reason: String) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some((term, reason));
    }

    /// A run or tick of COMMAND succeeded: an earlier failure no longer counts.
    pub fn run_succeeded(&self) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `/healthz`: the check loop has run within 3 check intervals (counting from boot until
    /// the first check, and from the end of a wait for a demoted term's tree when that came
    /// later), or, while a demoted term's tree is still being stopped (the loop waits for it
    /// before it checks again, the release only after the tree is dead), within that and the
    /// grace. A standby's check that began a step (one host address's connect, the session's
    /// first statements, a try: [`Elector::stepped_at`]) counts as a check: a list of hosts
    /// that do not answer makes one check outlast 3 intervals, each host within its bound, and
    /// a liveness probe must not restart a replica for a database that is down. A single step
    /// longer than the limit (a `connect_timeout` over 3 intervals that runs out) still reads
    /// as a loop that does not run. `Err` carries the reason for a 503.
    pub fn liveness(&self, elector: &Elector) -> Result<String, String> {
        let stopping = elector.is_releasing();
        let limit = if stopping {
            self.liveness_limit + self.grace
        } else {
            self.liveness_limit
        };
        // Counted from the wait's end too: right after a long stop, the last check is a
        // grace old, and /healthz read 503 until the next one was recorded.
        let since = elector
            .checks()
            .last_at
            .unwrap_or(self.booted)
            .max(elector.released_at().unwrap_or(self.booted))
            .max(elector.stepped_at().unwrap_or(self.booted));
        let age = since.elapsed();
        if age <= limit {
            Ok("ok".to_owned())
        } else {
            Err(format!(
                "no check for {} (limit: 3 check intervals{}, {})",
                humantime::format_duration(Duration::from_millis(age.as_millis() as u64)),
                if stopping { " and the grace" } else { "" },
                humantime::format_duration(limit)
            ))
        }
    }

    /// `/readyz`: the seed's readiness table (module docs). `Err` carries the reason for a 503.
    pub fn readiness(&self, elector: &Elector) -> Result<String, String> {
        let checks = elector.checks();
        let term = elector.term();
        if term.is_ended() {
            return standby_readiness(&checks);
        }
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((failed_in, reason)) if *failed_in == term.number() => Err(reason.clone()),
            _ => Ok(format!("leader, term {}", term.number())),
        }
    }
}

/// A standby's readiness: ready only once a check reached the server, and not while its
/// checks fail to reach it. A wait that is queued on the server reached it, even before the
/// check that sent it completes (at the default interval that is seconds later).
fn standby_readiness(checks: &Checks) -> Result<String, String> {
    if checks.waiting {
        return Ok("standby".to_owned());
    }
    match checks.last {
        None => Err("booted, no check yet".to_owned()),
        // A leader's check that got no answer in time demoted it: no check has reached the
        // server since, as with a standby's failed one.
        Some(CheckOutcome::Failed) | Some(CheckOutcome::Lost) if !checks.last_reached => {
            // The server's own answer (a pooler, a hot standby, a privilege) is no network
            // fault: said as what it is, still not ready, since no replica could lead so.
            let what = if checks.last_ruled_out {
                "cannot lead through this server"
            } else {
                "cannot reach the server"
            };
            Err(format!(
                "{what}: {}",
                checks.last_error.as_deref().unwrap_or("unknown error")
            ))
        }
        Some(_) => Ok("standby".to_owned()),
    }
}
