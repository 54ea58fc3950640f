//! The product's three rules, each written once: COMMAND starts ([`Supervisor::start`]) or
//! continues (`resume_child`) only on a proven term, and `enforce` ends a term whose proof lapsed;
//! a tree's hold is dropped only after the tree is gone (`stop`, `stopped`); no INT/TERM is
//! lost (`shutdown_signal`), and job control follows COMMAND's stops.

use std::time::SystemTime;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{child_env, Election, Exit, Mode, State, Supervisor, Then, Why};
use crate::cli::exit_codes;
use crate::cli::metrics;
use crate::elector::{Term, TermEnd};
use crate::error::Chain;
use crate::history::RunStart;
use crate::process::child::{ExitStatus, Spawner};
use crate::process::signals::suspend_self;

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// The rule before every event: a term whose proof lapsed is as good as ended, whatever
    /// fired first on a resume.
    pub(super) fn enforce(&mut self) {
        let lapsed = match &self.state {
            State::Leading { term, .. } => !term.is_proven(),
            State::Running { hold, .. } => !hold.term().is_proven(),
            _ => false,
        };
        if lapsed {
            self.term_ended(TermEnd::LeadershipLost);
        }
    }

    /// The one way COMMAND starts: only on a term that is proven now, and with a hold on it.
    pub(super) fn start(&mut self, term: Term) {
        // The due time this start is for (`--schedule`), whether or not it starts.
        let due = self.starting_due.take();
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
                match (due, &self.schedule) {
                    (Some(due), Some(schedule)) => {
                        info!(pid = tree.pid(), term = term.number(), due = %schedule.format(due), "child started")
                    }
                    _ => info!(pid = tree.pid(), term = term.number(), "child started"),
                }
                self.metrics.child_started();
                self.metrics.run_started(SystemTime::now());
                if let (Some(history), Some(lease)) = (&self.history, term.lease()) {
                    self.run = Some(history.run_started(RunStart {
                        slot: lease.slot,
                        term: term.number(),
                        fencing_token: lease.fencing_token,
                        started_at: SystemTime::now(),
                        due_at: due,
                    }));
                }
                self.state = State::Running {
                    tree,
                    hold,
                    started: Instant::now(),
                    timeout_at: self.plan.timeout.map(|t| Instant::now() + t),
                };
            }
            Err(err) => {
                drop(hold);
                self.health
                    .run_failed(term.number(), Chain(&err).to_string());
                if let Mode::Every { .. } | Mode::Schedule { .. } = self.plan.mode {
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
        let State::Running { tree, hold, .. } = &mut self.state else {
            return;
        };
        if !hold.term().is_proven() {
            info!(
                pid = tree.pid(),
                "resumed, but the lock is no longer proven; stopping the child"
            );
            return self.stop(Why::Demoted, self.plan.stop_signal);
        }
        // `fg` gave the terminal back to our group: pass it on. After `bg` the shell keeps it.
        if let Some(terminal) = &self.terminal {
            if terminal.owns_foreground() {
                terminal.give_to(Pid::from_raw(tree.pid() as i32));
            }
        }
        tree.signal_group(Signal::SIGCONT);
        info!(pid = tree.pid(), "resumed; child continued");
    }

    /// Starts stopping the running tree: `first` and SIGCONT to the group and every adopted
    /// orphan (a stopped job cannot act on a signal), SIGKILL after the grace.
    pub(super) fn stop(&mut self, why: Why, first: Signal) {
        let state = std::mem::replace(&mut self.state, State::Done(Exit::Code(0)));
        let State::Running {
            mut tree,
            hold,
            started,
            ..
        } = state
        else {
            self.state = state;
            return;
        };
        tree.signal_all(first);
        tree.signal_all(Signal::SIGCONT);
        self.state = State::Stopping {
            tree,
            hold,
            why,
            status: None,
            started,
            kill_at: Instant::now() + self.plan.grace,
            give_up_at: None,
        };
        self.poll();
    }

    /// The main child exited and nothing of its tree is left.
    pub(super) fn stopped_as(&mut self, why: Why, status: ExitStatus) {
        if let State::Running {
            tree,
            hold,
            started,
            ..
        } = std::mem::replace(&mut self.state, State::Done(Exit::Code(0)))
        {
            self.state = State::Stopping {
                tree,
                hold,
                why,
                status: Some(status),
                started,
                kill_at: Instant::now(),
                give_up_at: None,
            };
            self.stopped(status);
        }
    }

    /// The stop is over: drop the tree, then its hold (the elector may release now), and let
    /// the mode decide what comes next.
    pub(super) fn stopped(&mut self, status: ExitStatus) {
        let State::Stopping {
            tree,
            hold,
            why,
            started,
            ..
        } = std::mem::replace(&mut self.state, State::Done(Exit::Code(0)))
        else {
            return;
        };
        let pid = tree.pid();
        let term = hold.term().clone();
        drop(tree);
        drop(hold);
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
        let next = self.after_stop(&term, why, status, started.elapsed());
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
            State::Running { tree, .. } => {
                info!(
                    signal = sig.as_str(),
                    pid = tree.pid(),
                    "received {}; stopping the child",
                    sig.as_str()
                );
                self.shutdown_reached_child = true;
                self.stop(Why::Shutdown, sig);
            }
            State::Stopping {
                tree,
                kill_at,
                status,
                ..
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
                    tree.signal_group(sig);
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
        let State::Running { tree, .. } = &mut self.state else {
            return;
        };
        let pid = tree.pid();
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
