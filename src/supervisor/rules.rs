//! The product's three rules, each written once: COMMAND starts ([`Supervisor::start`]) or
//! continues (`resume_child`) only on a proven term, and `enforce` ends a term whose proof lapsed;
//! a tree's hold is dropped only after the tree is gone (`stop`, `stopped`); no INT/TERM is
//! lost (`shutdown_signal`), and job control follows COMMAND's stops.

use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{child_env, Election, Exit, Mode, Phase, State, Supervisor, Then, Why};
use crate::cli::exit_codes;
use crate::cli::metrics;
use crate::elector::{Term, TermEnd, TermHold};
use crate::error::Chain;
use crate::process::child::{ExitStatus, Spawner, Tree};
use crate::process::signals::suspend_self;

/// Rule 2, *release only after the tree is dead* (docs/guarantees.md#the-three-rules): one run
/// of COMMAND, owning its process tree and the [`TermHold`] it was started under.
///
/// While any hold of a term lives, the elector does not release a lock that may still be held
/// (see [`Term`]). A run gives its hold up only when it is dropped, and [`Drop`] ends the tree
/// first: a tree that was not seen empty is killed (see [`Tree`]), and only then does the
/// hold go. The supervisor drops a run by leaving [`State::Child`], after the tree was seen
/// empty or given up on (grace, SIGKILL, [`super::KILL_WAIT`]).
pub(super) struct Run {
    /// `Some` from [`Run::new`] until [`Drop`]; an `Option` only so that the drop order is
    /// written in code, not left to the order of fields.
    tree: Option<Box<dyn Tree>>,
    /// As `tree`: dropped after it.
    hold: Option<TermHold>,
    pid: u32,
    term: Term,
    started: Instant,
}

impl Run {
    /// A run of `tree`, started now under `hold`.
    pub(super) fn new(tree: Box<dyn Tree>, hold: TermHold) -> Run {
        Run {
            pid: tree.pid(),
            term: hold.term().clone(),
            tree: Some(tree),
            hold: Some(hold),
            started: Instant::now(),
        }
    }

    /// The tree, to signal and poll.
    pub(super) fn tree(&mut self) -> &mut dyn Tree {
        self.tree
            .as_deref_mut()
            .expect("a run owns its tree until it is dropped")
    }

    /// The main child's pid (its process group id).
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// The term the run was started under.
    pub(super) fn term(&self) -> &Term {
        &self.term
    }

    /// How long ago the run started.
    pub(super) fn lasted(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Run {
    /// The rule's order: the tree (killed if it was not seen empty), then the hold.
    fn drop(&mut self) {
        drop(self.tree.take());
        drop(self.hold.take());
    }
}

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// The rule before every event: a term whose proof lapsed is as good as ended, whatever
    /// fired first on a resume.
    pub(super) fn enforce(&mut self) {
        let lapsed = match &self.state {
            State::Leading { term, .. } => !term.is_proven(),
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => !run.term().is_proven(),
            _ => false,
        };
        if lapsed {
            self.term_ended(TermEnd::LeadershipLost);
        }
    }

    /// The one way COMMAND starts: only on a term that is proven now, and with a hold on it.
    pub(super) fn start(&mut self, term: Term) {
        if self.shutdown.is_some() {
            self.state = State::Done(Exit::Code(0));
            return;
        }
        let Some(hold) = term.hold() else {
            self.state = State::Leading {
                term,
                until: None,
                then: Then::Start,
            };
            return self.term_ended(TermEnd::LeadershipLost);
        };
        match self.spawner.spawn(&child_env(&term)) {
            Ok(tree) => {
                info!(pid = tree.pid(), term = term.number(), "child started");
                self.metrics.child_started();
                self.state = State::Child {
                    run: Run::new(tree, hold),
                    phase: Phase::Running {
                        timeout_at: self.plan.timeout.map(|t| Instant::now() + t),
                    },
                };
            }
            Err(err) => {
                drop(hold);
                self.health
                    .run_failed(term.number(), Chain(&err).to_string());
                if let Mode::Every { .. } = self.plan.mode {
                    warn!(term = term.number(), "tick failed: {}", Chain(&err));
                    self.metrics.tick(metrics::Tick::Failure);
                    self.state = State::Leading {
                        term,
                        until: None,
                        then: Then::Start,
                    };
                } else {
                    error!("{}", Chain(&err));
                    self.state = State::Done(Exit::Code(err.exit_code()));
                }
            }
        }
    }

    /// The one way a suspended child continues: only while the term is proven; otherwise it is
    /// stopped as on demotion (docs/guarantees.md#safety-guarantees,
    /// docs/field-notes.md#a-resumed-process-wakes-with-every-timer-due).
    pub(super) fn resume_child(&mut self) {
        let State::Child {
            run,
            phase: Phase::Running { .. },
        } = &mut self.state
        else {
            return;
        };
        if !run.term().is_proven() {
            info!(
                pid = run.pid(),
                "resumed, but the lock is no longer proven; stopping the child"
            );
            return self.stop(Why::Demoted, self.plan.stop_signal);
        }
        // `fg` gave the terminal back to our group: pass it on. After `bg` the shell keeps it.
        if let Some(terminal) = &self.terminal {
            if terminal.owns_foreground() {
                terminal.give_to(Pid::from_raw(run.pid() as i32));
            }
        }
        run.tree().signal_group(Signal::SIGCONT);
        info!(pid = run.pid(), "resumed; child continued");
    }

    /// Starts stopping the running tree: `first` and SIGCONT to the group and every adopted
    /// orphan (a stopped job cannot act on a signal), SIGKILL after the grace.
    pub(super) fn stop(&mut self, why: Why, first: Signal) {
        let State::Child {
            run,
            phase: phase @ Phase::Running { .. },
        } = &mut self.state
        else {
            return;
        };
        run.tree().signal_all(first);
        run.tree().signal_all(Signal::SIGCONT);
        *phase = Phase::Stopping {
            why,
            status: None,
            kill_at: Instant::now() + self.plan.grace,
            give_up_at: None,
        };
        self.poll();
    }

    /// The main child exited and nothing of its tree is left.
    pub(super) fn stopped_as(&mut self, why: Why, status: ExitStatus) {
        if let State::Child {
            phase: phase @ Phase::Running { .. },
            ..
        } = &mut self.state
        {
            *phase = Phase::Stopping {
                why,
                status: Some(status),
                kill_at: Instant::now(),
                give_up_at: None,
            };
            self.stopped(status);
        }
    }

    /// The stop is over: the mode decides what comes next, and entering it drops the run (its
    /// tree, then its hold: [`Run`]), after which the elector may release.
    pub(super) fn stopped(&mut self, status: ExitStatus) {
        let State::Child {
            run,
            phase: Phase::Stopping { why, .. },
        } = &self.state
        else {
            return;
        };
        let (why, pid, term, lasted) = (*why, run.pid(), run.term().clone(), run.lasted());
        if let Some(terminal) = &self.terminal {
            terminal.take_back(Pid::from_raw(pid as i32));
        }
        match why {
            Why::Exited => {}
            Why::Demoted => {
                info!(pid, status = %status, term = term.number(), "child stopped after demotion")
            }
            Why::TimedOut => info!(pid, status = %status, "child stopped after the timeout"),
            Why::Shutdown => info!(pid, status = %status, "child stopped"),
        }
        self.record(&term, why, status);
        let next = self.after_stop(&term, why, status, lasted);
        // Leaving `State::Child` drops the run here, before anything else can happen.
        self.state = match next {
            State::Done(exit)
            | State::Leading {
                then: Then::Exit(exit),
                ..
            } if self.shutdown.is_some() => State::Done(exit),
            State::Done(exit) => State::Done(exit),
            _ if self.fatal => State::Done(Exit::Code(exit_codes::FAILURE)),
            _ if self.shutdown.is_some() => State::Done(if self.shutdown_reached_child {
                Exit::Child(status)
            } else {
                Exit::Code(0)
            }),
            next => next,
        };
    }

    /// INT/TERM: remembered first (never lost), then acted on in whatever state.
    pub(super) fn shutdown_signal(&mut self, sig: Signal) {
        let second = self.shutdown.is_some();
        self.shutdown.get_or_insert(sig);
        match &mut self.state {
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => {
                info!(
                    signal = sig.as_str(),
                    pid = run.pid(),
                    "received {}; stopping the child",
                    sig.as_str()
                );
                self.shutdown_reached_child = true;
                self.stop(Why::Shutdown, sig);
            }
            State::Child {
                run,
                phase: Phase::Stopping {
                    kill_at, status, ..
                },
            } => {
                if second {
                    info!(
                        signal = sig.as_str(),
                        "second {} while stopping the child; sending SIGKILL now",
                        sig.as_str()
                    );
                    *kill_at = Instant::now();
                } else {
                    info!(
                        signal = sig.as_str(),
                        "received {}; passing it on and exiting once the child is stopped",
                        sig.as_str()
                    );
                    if status.is_none() {
                        self.shutdown_reached_child = true;
                    }
                    run.tree().signal_group(sig);
                }
            }
            State::Standby { .. } | State::Leading { .. } => {
                info!(
                    signal = sig.as_str(),
                    "received {}; shutting down",
                    sig.as_str()
                );
                let exit = match &self.state {
                    State::Leading {
                        then: Then::Exit(exit),
                        ..
                    } => *exit,
                    _ => Exit::Code(0),
                };
                self.state = State::Done(exit);
            }
            State::Done(_) => {}
        }
    }

    /// Job control: a child stopped by Ctrl-Z (or by reading or writing the terminal it was
    /// given) suspends leaderrun too, so the calling shell sees the job stopped; `fg`
    /// continues leaderrun, which continues the child through [`Self::resume_child`]. A
    /// SIGSTOP from someone else is not ours to act on.
    pub(super) fn job_control(&mut self, sig: Signal) {
        let State::Child {
            run,
            phase: Phase::Running { .. },
        } = &self.state
        else {
            return;
        };
        let pid = run.pid();
        match sig {
            Signal::SIGTSTP => {}
            Signal::SIGTTIN | Signal::SIGTTOU if self.terminal.is_some() => {}
            Signal::SIGTTIN | Signal::SIGTTOU => {
                if !self.warned_background_read {
                    self.warned_background_read = true;
                    warn!(
                        pid,
                        signal = sig.as_str(),
                        "the child stopped on {}: it used the terminal from the background \
                         (leaderrun was not started in the foreground); `kill -CONT {pid}` \
                         continues it",
                        sig.as_str()
                    );
                }
                return;
            }
            _ => return,
        }
        info!(
            pid,
            signal = sig.as_str(),
            "child suspended; suspending leaderrun"
        );
        if let Some(terminal) = &self.terminal {
            terminal.take_back(Pid::from_raw(pid as i32));
        }
        suspend_self();
        self.resume_child();
    }
}
