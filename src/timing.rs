//! The timing model (docs/field-notes.md#measuring-the-safe-window,
//! docs/guarantees.md#the-timing-model), as one value.
//!
//! With i = check interval, g = grace and T = the lock session's `idle_session_timeout`:
//!
//! * a leader's **safe window** ends 2i after the send time of the last check that proved the
//!   lock (measured on CLOCK_BOOTTIME, which keeps running while the machine sleeps);
//! * a leader cut off from the server has stopped its child at most 2i + g after that check;
//! * the server frees the lock of a session that stopped talking no earlier than T after it.
//!
//! So exclusion holds iff 2i + g < T. [`Timing::new`] picks T = 4i (the seed's value), raised
//! to 3i + g when g > i, which always leaves at least one interval of margin, and
//! [`Timing::check`] refuses any T that does not. The elector (safe window, T), the supervisor
//! (grace), the probes (liveness limit) and the docs all read these figures from here.

use std::time::Duration;

/// PostgreSQL's largest `idle_session_timeout`: `INT_MAX` milliseconds (about 24.8 days).
pub const MAX_IDLE_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// The timing of one election and the supervision of its child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// i: standby retry period, leader verification period, and bound of one verification.
    pub check_interval: Duration,
    /// g: time between the stop signal and SIGKILL.
    pub grace: Duration,
    /// T: `idle_session_timeout` of every session that asks for the lock.
    pub idle_session_timeout: Duration,
}

/// Why a [`Timing`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingError {
    /// 2i + g ≥ T: a cut-off leader's child could still run when the server frees the lock.
    #[error(
        "idle_session_timeout {t} must be longer than 2 × check interval + grace ({bound}), \
         or a cut-off leader's child could outlive its lock",
        t = humantime::format_duration(*idle_session_timeout),
        bound = humantime::format_duration(*bound)
    )]
    Unsafe {
        /// The T asked for.
        idle_session_timeout: Duration,
        /// 2i + g.
        bound: Duration,
    },
    /// T is over PostgreSQL's limit, [`MAX_IDLE_SESSION_TIMEOUT`].
    #[error(
        "the lock session's idle_session_timeout would be {t}, over PostgreSQL's limit of {max}",
        t = humantime::format_duration(*idle_session_timeout),
        max = humantime::format_duration(MAX_IDLE_SESSION_TIMEOUT)
    )]
    TooLong {
        /// The T asked for.
        idle_session_timeout: Duration,
    },
    /// A zero check interval or grace.
    #[error("the check interval and the grace must be greater than zero")]
    Zero,
}

impl Timing {
    /// The timing for interval `check_interval` and grace `grace`, with T chosen as
    /// docs/guarantees.md#timing-settings says: 4i, or 3i + g when g > i. Not yet checked: see
    /// [`Timing::check`].
    pub fn new(check_interval: Duration, grace: Duration) -> Timing {
        let idle_session_timeout = if grace > check_interval {
            check_interval.saturating_mul(3).saturating_add(grace)
        } else {
            check_interval.saturating_mul(4)
        };
        Timing {
            check_interval,
            grace,
            idle_session_timeout,
        }
    }

    /// Checks the model: i and g non-zero, 2i + g < T, T within PostgreSQL's limit.
    ///
    /// # Errors
    /// [`TimingError`] naming the rule that fails.
    pub fn check(&self) -> Result<(), TimingError> {
        if self.check_interval.is_zero() || self.grace.is_zero() {
            return Err(TimingError::Zero);
        }
        let bound = self.stop_bound();
        if self.idle_session_timeout <= bound {
            return Err(TimingError::Unsafe {
                idle_session_timeout: self.idle_session_timeout,
                bound,
            });
        }
        if self.idle_session_timeout > MAX_IDLE_SESSION_TIMEOUT {
            return Err(TimingError::TooLong {
                idle_session_timeout: self.idle_session_timeout,
            });
        }
        Ok(())
    }

    /// The safe window: 2i from the send time of the last check that proved the lock.
    pub fn safe_window(&self) -> Duration {
        self.check_interval.saturating_mul(2)
    }

    /// 2i + g: the longest a cut-off leader's child may still run after the last good check.
    pub fn stop_bound(&self) -> Duration {
        self.safe_window().saturating_add(self.grace)
    }

    /// How often leaderrun tells its watchdog it is alive: i/8, between 5 ms and 250 ms.
    pub fn heartbeat(&self) -> Duration {
        (self.check_interval / 8).clamp(Duration::from_millis(5), Duration::from_millis(250))
    }

    /// A leaderrun that sent no heartbeat for i/2 after its proof ran out is frozen: its
    /// watchdog stops the tree. The tree is then dead at most 2i + i/2 + g after the last good
    /// check, still before T (which is at least 3i + g, or 4i with g ≤ i).
    pub fn watchdog_stall(&self) -> Duration {
        self.check_interval / 2
    }

    /// `/healthz` limit: the check loop has run within 3i (docs/guarantees.md#observing-a-replica).
    pub fn liveness_limit(&self) -> Duration {
        self.check_interval.saturating_mul(3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_seeds_value_and_the_raise_for_a_long_grace() {
        assert_eq!(Timing::new(5 * S, 5 * S).idle_session_timeout, 20 * S);
        assert_eq!(Timing::new(5 * S, 2 * S).idle_session_timeout, 20 * S);
        assert_eq!(Timing::new(5 * S, 30 * S).idle_session_timeout, 45 * S);
        for (i, g) in [(1, 1), (1, 100), (5, 1), (300, 7)] {
            let t = Timing::new(i * S, g * S);
            t.check().unwrap();
            assert!(t.stop_bound() + t.check_interval <= t.idle_session_timeout);
            // A frozen leaderrun's tree, stopped by its watchdog, is dead before T too.
            assert!(t.stop_bound() + t.watchdog_stall() < t.idle_session_timeout);
        }
    }

    #[test]
    fn an_unsafe_or_oversized_timeout_is_refused() {
        let mut t = Timing::new(S, S);
        t.idle_session_timeout = 3 * S;
        assert!(matches!(t.check(), Err(TimingError::Unsafe { .. })));
        let huge = Timing::new(Duration::from_secs(30 * 24 * 3600), S);
        assert!(matches!(huge.check(), Err(TimingError::TooLong { .. })));
        assert_eq!(
            Timing::new(Duration::ZERO, S).check(),
            Err(TimingError::Zero)
        );
    }
}
