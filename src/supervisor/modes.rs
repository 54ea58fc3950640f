//! The modes (docs/guarantees.md#modes) as policy over the loop's events: what `--restart` does
//! ([`Restart`], [`Backoff`]), what follows a run (`after_stop`), `--once`'s first check and
//! `--every`'s tick.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{Election, Exit, State, Supervisor, Then, Why};
use crate::cli::exit_codes;
use crate::cli::metrics;
use crate::elector::{CheckOutcome, Term};
use crate::process::child::{ExitStatus, Spawner};

/// `--restart`: what the default mode does when COMMAND exits while leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Release the lock and exit with COMMAND's status.
    Never,
    /// Restart after a non-zero exit, a death by signal or a timeout.
    OnFailure,
    /// Restart after every exit.
    Always,
}

impl Restart {
    /// Whether a run that ended with `status` (or timed out: `None`) is started again.
    pub fn restarts(self, status: Option<ExitStatus>) -> bool {
        match self {
            Restart::Never => false,
            Restart::Always => true,
            Restart::OnFailure => !status.is_some_and(ExitStatus::success),
        }
    }
}

/// How COMMAND is run (docs/guarantees.md#modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Default: run COMMAND while leading; start it afresh in every term.
    WhileLeader {
        /// What to do when it exits on its own.
        restart: Restart,
    },
    /// `--once` (`wait: None`) or `--wait DUR`: run at most once.
    OneShot {
        /// How long to campaign; `None` is a single check.
        wait: Option<Duration>,
        /// `--min-hold`: keep the lock at least this long after the grant.
        min_hold: Duration,
    },
    /// `--every DUR`: run once per period while leading.
    Every {
        /// The ticker period.
        period: Duration,
    },
    /// `--schedule EXPR`: run at each due time while leading; the schedule itself is given
    /// with [`Supervisor::with_schedule`].
    Schedule {
        /// `--catch-up`: a new leader whose term begins this soon after a due time no replica
        /// started runs it at once.
        catch_up: Option<Duration>,
    },
}

/// What the supervisor does, independent of how it connects: the run-time half of the
/// settings.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// The mode.
    pub mode: Mode,
    /// Grace between the stop signal (or a passed-on INT/TERM) and SIGKILL.
    pub grace: Duration,
    /// First signal of a stop for demotion, `--timeout`, shutdown and leftovers of a COMMAND
    /// that exited; with the default (TERM), a shutdown's INT/TERM is passed on as it is
    /// instead ([`Plan::shutdown_stop_signal`], docs/guarantees.md#the-child-process).
    pub stop_signal: Signal,
    /// `--takeover-delay` (zero: none).
    pub takeover_delay: Duration,
    /// `--timeout`.
    pub timeout: Option<Duration>,
    /// `--conflict-exit-code`.
    pub conflict_exit_code: u8,
    /// `--tick-at-grant`: with `--every`, run COMMAND as soon as a term begins (after the
    /// takeover delay) instead of at the next tick; the ticker keeps its cadence, and a tick
    /// that falls due while that run goes on is skipped as usual.
    pub tick_at_grant: bool,
    /// The check interval: how long a one-shot keeps trying a server that is momentarily full.
    pub check_interval: Duration,
}

impl Plan {
    /// The first signal of the stop that shutdown signal `received` (INT or TERM) begins:
    /// the stop signal when one other than TERM was chosen (`--stop-signal INT` for a program
    /// that shuts down cleanly only on INT, as a container's `STOPSIGNAL` is used for
    /// `docker stop`), else `received` itself, passed on as a shell or tini would.
    pub fn shutdown_stop_signal(&self, received: Signal) -> Signal {
        if self.stop_signal == Signal::SIGTERM {
            received
        } else {
            self.stop_signal
        }
    }
}

/// First delay of the `--restart` back-off.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);

/// Longest delay of the `--restart` back-off.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// A run that lasts at least this long starts the back-off over.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// The `--restart` back-off: [`BACKOFF_INITIAL`], doubling up to [`BACKOFF_CAP`], back to the
/// start after a run of at least [`BACKOFF_RESET_AFTER`].
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_INITIAL,
        }
    }
}

impl Backoff {
    /// The delay before the next start, given how long the run that just ended lasted.
    pub fn after_run(&mut self, lasted: Duration) -> Duration {
        if lasted >= BACKOFF_RESET_AFTER {
            self.next = BACKOFF_INITIAL;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_CAP);
        delay
    }
}

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// `--once`: the first check decides.
    pub(super) fn first_check(&mut self) {
        let seen = self.checks.borrow_and_update().clone();
        if seen.total == 0 || seen.last == Some(CheckOutcome::Granted) {
            return;
        }
        // A server that is momentarily full or starting up is not an answer: the elector tries
        // again soon, for up to one interval (docs/guarantees.md#modes).
        if seen.last == Some(CheckOutcome::Failed)
            && seen.last_transient
            && self.started.elapsed() < self.plan.check_interval
        {
            return;
        }
        self.state = if seen.refused > 0 {
            // INFO: silent at a one-shot's default level (cron mails nothing), said with -v,
            // where a skip that says nothing looks like a run that never started.
            info!(
                exit_code = self.plan.conflict_exit_code,
                "another session holds the lock; COMMAND does not run (`leaderrun status` \
                 names the holder)"
            );
            State::Done(Exit::Code(self.plan.conflict_exit_code))
        } else {
            error!(
                "could not check the lock: {}",
                seen.last_error.unwrap_or_default()
            );
            State::Done(Exit::Code(exit_codes::FAILURE))
        };
    }

    pub(super) fn tick(&mut self) {
        match &mut self.state {
            State::Standby { .. } => {
                debug!("tick: standby, nothing to run");
                self.metrics.tick(metrics::Tick::Standby);
            }
            State::Leading {
                term,
                until: None,
                then: Then::Start,
            } => {
                let term = term.clone();
                self.start(term);
            }
            // The takeover delay: the tick runs when the delay is over.
            State::Leading {
                then: Then::AwaitTick,
                ..
            } => self.pending_tick = true,
            State::Child { run, .. } => {
                // The first skip of a run is said at once; after more than one, a line at its
                // end counts them all, the first included (`Supervisor::stopped`).
                if run.skip_tick() == 1 {
                    info!(
                        pid = run.pid(),
                        "tick skipped: the previous run is still going"
                    );
                }
                self.metrics.tick(metrics::Tick::Skipped);
            }
            _ => {}
        }
    }

    /// The modes (docs/guarantees.md#modes): what follows a run that ended for `why` with `status`.
    pub(super) fn after_stop(
        &mut self,
        term: &Term,
        why: Why,
        status: ExitStatus,
        lasted: Duration,
    ) -> State {
        let conflict = Exit::Code(self.plan.conflict_exit_code);
        if why == Why::Shutdown {
            return State::Done(Exit::Child(status));
        }
        // Ctrl-C on the terminal reached only the child's group, which had the foreground, and
        // not leaderrun: a child that died of SIGINT there is the user's stop, as a shell
        // takes it (docs/field-notes.md#exit-statuses-as-a-shell-sees-them), not a failed run
        // to restart or a tick to go on from. Before, `--restart always` started it again at
        // every Ctrl-C.
        if why == Why::Exited
            && status == ExitStatus::Signal(nix::sys::signal::Signal::SIGINT)
            && !matches!(self.plan.mode, Mode::OneShot { .. })
            && self
                .terminal
                .as_ref()
                .is_some_and(|t| t.job_in_foreground())
        {
            info!(
                term = term.number(),
                "COMMAND died of SIGINT while leaderrun's job had the terminal (a Ctrl-C, as \
                 a shell takes it); stopping"
            );
            return State::Done(Exit::Child(status));
        }
        let leading = |then| State::Leading {
            term: term.clone(),
            until: None,
            then,
        };
        match self.plan.mode {
            Mode::OneShot { min_hold, .. } => match why {
                Why::Demoted => {
                    info!(status = %status, "leadership lost while COMMAND ran; it was stopped");
                    State::Done(conflict)
                }
                Why::TimedOut => State::Done(Exit::Code(exit_codes::TIMEOUT)),
                _ => {
                    let hold_until = self.granted_at.map(|g| g + min_hold);
                    match hold_until {
                        Some(until) if Instant::now() < until && !term.is_ended() => {
                            debug!(min_hold = %humantime::format_duration(min_hold), "keeping the lock for --min-hold");
                            State::Leading {
                                term: term.clone(),
                                until: Some(until),
                                then: Then::Exit(Exit::Child(status)),
                            }
                        }
                        _ => State::Done(Exit::Child(status)),
                    }
                }
            },
            Mode::Every { .. } | Mode::Schedule { .. } => {
                match why {
                    Why::Demoted => {
                        info!(term = term.number(), status = %status, "tick stopped: leadership lost (not a failure)");
                        self.metrics.tick(metrics::Tick::Interrupted);
                        return State::Standby { deadline: None };
                    }
                    Why::TimedOut => {
                        warn!(term = term.number(), status = %status, "tick failed: COMMAND ran longer than --timeout");
                        self.metrics.tick(metrics::Tick::Failure);
                    }
                    _ if status.success() => {
                        debug!(term = term.number(), "tick succeeded");
                        self.metrics.tick(metrics::Tick::Success);
                    }
                    _ => {
                        warn!(term = term.number(), status = %status, "tick failed: COMMAND exited with {status}");
                        self.metrics.tick(metrics::Tick::Failure);
                    }
                }
                leading(Then::Start)
            }
            Mode::WhileLeader { restart } => {
                let (restarts, otherwise) = match why {
                    Why::Demoted => return State::Standby { deadline: None },
                    Why::TimedOut => (restart.restarts(None), Exit::Code(exit_codes::TIMEOUT)),
                    _ => (restart.restarts(Some(status)), Exit::Child(status)),
                };
                if !restarts {
                    return State::Done(otherwise);
                }
                let delay = self.backoff.after_run(lasted);
                // INT/TERM came while the tree was stopping: nothing restarts
                // (`Ending::settle`), so nothing says it will.
                if self.ending.shutdown_requested() {
                    debug!(term = term.number(), last = %status, "shutdown requested: COMMAND is not restarted");
                } else if matches!(why, Why::TimedOut) || !status.success() {
                    // A crash loop is worth a WARN (as a failed tick is): visible at -q.
                    warn!(term = term.number(), delay = %humantime::format_duration(delay), "COMMAND failed ({status}); restarting COMMAND after the back-off");
                } else {
                    info!(term = term.number(), last = %status, delay = %humantime::format_duration(delay), "restarting COMMAND after the back-off");
                }
                State::Leading {
                    term: term.clone(),
                    until: Some(Instant::now() + delay),
                    then: Then::Start,
                }
            }
        }
    }
}
