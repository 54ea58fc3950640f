//! Liveness and readiness, as `/healthz` and `/readyz` report them (contract §7).
//!
//! Readiness follows the seed's readiness table:
//!
//! | replica state | readiness |
//! |---|---|
//! | booted, no check yet | not ready |
//! | leader, last run/tick succeeded (or none yet) | ready |
//! | leader, last run/tick failed | not ready, with that run's error, until a later one succeeds |
//! | standby | ready: a standby runs nothing and has no outcome of its own |
//!
//! A failure belongs to the term it happened in, so a demoted leader's failure no longer
//! counts once it is a standby, nor in a later term.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::elector::Elector;
use crate::timing::Timing;

/// Shared between the supervisor (which records run outcomes) and the HTTP thread.
#[derive(Debug)]
pub struct Health {
    booted: Instant,
    /// `/healthz` limit, [`Timing::liveness_limit`].
    liveness_limit: Duration,
    /// The latest failed run or tick: (term, reason). Cleared by a later success.
    failure: Mutex<Option<(u64, String)>>,
}

impl Health {
    /// Starts the clock for liveness at boot; the limit comes from `timing`.
    pub fn new(timing: &Timing) -> Health {
        Health {
            booted: Instant::now(),
            liveness_limit: timing.liveness_limit(),
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
    /// the first check). `Err` carries the reason for a 503.
    pub fn liveness(&self, elector: &Elector) -> Result<String, String> {
        let limit = self.liveness_limit;
        let since = elector.checks().last_at.unwrap_or(self.booted);
        let age = since.elapsed();
        if age <= limit {
            Ok("ok".to_owned())
        } else {
            Err(format!(
                "no check for {} (limit: 3 check intervals, {})",
                humantime::format_duration(Duration::from_millis(age.as_millis() as u64)),
                humantime::format_duration(limit)
            ))
        }
    }

    /// `/readyz`: the seed's readiness table (module docs). `Err` carries the reason for a 503.
    pub fn readiness(&self, elector: &Elector) -> Result<String, String> {
        // A standby whose first wait is queued on the server has checked (contract §7).
        let checks = elector.checks();
        if checks.total == 0 && !checks.waiting {
            return Err("booted, no check yet".to_owned());
        }
        let term = elector.term();
        if term.is_ended() {
            return Ok("standby".to_owned());
        }
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((failed_in, reason)) if *failed_in == term.number() => Err(reason.clone()),
            _ => Ok(format!("leader, term {}", term.number())),
        }
    }
}
