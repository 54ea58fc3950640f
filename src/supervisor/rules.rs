//! The product's three rules (docs/guarantees.md#the-three-rules), each written once: COMMAND
//! starts ([`Supervisor::start`]) or continues (`resume_child`) only on a proven term, and
//! `enforce` ends a term whose proof lapsed; a [`Run`] drops its tree before its hold (`stop`,
//! `stopped`); no stop request is lost ([`Ending`], `shutdown_signal`). Job control follows
//! COMMAND's stops.

use std::time::Duration;

use std::time::SystemTime;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{child_env, Election, Exit, Mode, Phase, State, Supervisor, Then, Why};
use crate::cli::exit_codes;
use crate::cli::metrics;
use crate::elector::{Term, TermEnd, TermHold};
use crate::error::Chain;
use crate::history::RunStart;
use crate::process::child::SpawnError;
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
    /// Ticks (`--every`) or due times (`--schedule`) that came while this run went on, each
    /// skipped.
    skipped_ticks: u64,
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
            skipped_ticks: 0,
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

    /// Counts a tick skipped for this run; the count so far, this one included.
    pub(super) fn skip_tick(&mut self) -> u64 {
        self.skipped_ticks += 1;
        self.skipped_ticks
    }

    /// How many ticks were skipped while this run went on.
    pub(super) fn skipped_ticks(&self) -> u64 {
        self.skipped_ticks
    }
}

impl Drop for Run {
    /// The rule's order: the tree (killed if it was not seen empty), then the hold.
    fn drop(&mut self) {
        drop(self.tree.take());
        drop(self.hold.take());
    }
}

/// Rule 3, *no stop request is lost* (docs/guarantees.md#the-three-rules): whether, and why,
/// the supervisor is ending, as one value.
///
/// INT/TERM ([`Ending::shutdown`]) and a failed election ([`Ending::election_failed`]) are
/// recorded the moment they are handled, whatever the state. The transitions only add to what
/// is recorded: no method goes back to [`Ending::No`] or from a failure to a shutdown, and a
/// shutdown once requested stays requested. Every transition that would start something asks
/// [`Ending::shutdown_requested`] first, and the end of every stop goes through
/// [`Ending::settle`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Ending {
    /// Nothing asked the supervisor to end: the mode decides.
    #[default]
    No,
    /// INT/TERM asked for shutdown. `to_child`: it was passed on to the main child while that
    /// still ran, so leaderrun exits with the child's status.
    Shutdown { to_child: bool },
    /// The election failed: exit 125 once the tree is dead. `shutdown`: INT/TERM asked too.
    ElectionFailed { shutdown: bool },
}

impl Ending {
    /// Records an INT/TERM; true when one was recorded before (a second one: SIGKILL now).
    pub(super) fn shutdown(&mut self) -> bool {
        let second = self.shutdown_requested();
        *self = match *self {
            Ending::No => Ending::Shutdown { to_child: false },
            Ending::ElectionFailed { .. } => Ending::ElectionFailed { shutdown: true },
            shutdown @ Ending::Shutdown { .. } => shutdown,
        };
        second
    }

    /// The INT/TERM just recorded was passed on to a main child that still ran.
    pub(super) fn passed_to_child(&mut self) {
        if let Ending::Shutdown { to_child } = self {
            *to_child = true;
        }
    }

    /// Records that the election failed; an INT/TERM recorded before stays recorded.
    pub(super) fn election_failed(&mut self) {
        *self = Ending::ElectionFailed {
            shutdown: self.shutdown_requested(),
        };
    }

    /// Whether INT/TERM asked for shutdown: nothing may start any more.
    pub(super) fn shutdown_requested(self) -> bool {
        matches!(
            self,
            Ending::Shutdown { .. } | Ending::ElectionFailed { shutdown: true }
        )
    }

    /// What follows a stop that ended with the main child's `status`, given `next`, what the
    /// mode chose: the mode's exit when it chose one (a shutdown also ends a `--min-hold`
    /// early), else 125 after a failed election, else the shutdown's exit, else `next`.
    pub(super) fn settle(self, next: State, status: ExitStatus) -> State {
        match (self, next) {
            (_, State::Done(exit)) => State::Done(exit),
            (
                ending,
                State::Leading {
                    then: Then::Exit(exit),
                    ..
                },
            ) if ending.shutdown_requested() => State::Done(exit),
            (Ending::ElectionFailed { .. }, _) => State::Done(Exit::Code(exit_codes::FAILURE)),
            (Ending::Shutdown { to_child: true }, _) => State::Done(Exit::Child(status)),
            (Ending::Shutdown { to_child: false }, _) => State::Done(Exit::Code(0)),
            (Ending::No, next) => next,
        }
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
        // The due time this start is for (`--schedule`), whether or not it starts.
        let due = self.starting_due.take();
        if self.ending.shutdown_requested() {
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
        // The child checks the proof's end itself just before exec: a stall between here and
        // there (an overloaded machine, a stopped leaderrun) never starts COMMAND late.
        match self
            .spawner
            .spawn(&child_env(&term), None, term.proven_until())
        {
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
                    self.history_run = Some(history.run_started(RunStart {
                        slot: lease.slot,
                        term: term.number(),
                        fencing_token: lease.fencing_token,
                        started_at: SystemTime::now(),
                        due_at: due,
                    }));
                }
                self.state = State::Child {
                    run: Run::new(tree, hold),
                    phase: Phase::Running {
                        timeout_at: self.plan.timeout.map(|t| Instant::now() + t),
                    },
                };
            }
            Err(SpawnError::ProofLapsed) => {
                drop(hold);
                // Something is wrong (the machine stalled between the check and the exec):
                // a WARN, which a one-shot's default level shows too.
                warn!(
                    term = term.number(),
                    "the lock's proof ran out before COMMAND's exec; COMMAND was not started"
                );
                self.state = State::Leading {
                    term,
                    until: None,
                    then: Then::Start,
                };
                self.term_ended(TermEnd::LeadershipLost);
            }
            Err(err) => {
                drop(hold);
                self.record_failed_start(&term, due, &err);
                let restarts = match self.plan.mode {
                    Mode::WhileLeader { restart } => restart.restarts(None) && err.may_pass_later(),
                    _ => false,
                };
                if let Mode::Every { .. } | Mode::Schedule { .. } = self.plan.mode {
                    warn!(term = term.number(), "tick failed: {}", Chain(&err));
                    self.metrics.tick(metrics::Tick::Failure);
                    self.state = State::Leading {
                        term,
                        until: None,
                        then: Then::Start,
                    };
                } else if restarts {
                    // A start that failed is a run that failed at once (the process limit
                    // reached for a moment, COMMAND's file replaced by a deploy): `--restart
                    // on-failure|always` starts it again after the back-off, as a supervisor
                    // does after an exec failure, instead of ending the leader. Not when
                    // leaderrun's own set-up failed: every later start would fail alike.
                    let delay = self.backoff.after_run(Duration::ZERO);
                    warn!(
                        term = term.number(),
                        delay = %humantime::format_duration(delay),
                        "COMMAND could not be started ({}); starting it again after the back-off",
                        Chain(&err)
                    );
                    self.state = State::Leading {
                        term,
                        until: Some(Instant::now() + delay),
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
            if terminal.owns_foreground() && terminal.child_may_have_it() {
                let _ = terminal.give_to(Pid::from_raw(run.pid() as i32));
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
        // Only the first skip of a run was logged as it happened (a period far shorter than
        // the run would log a line per period): after more than one, one line here counts
        // them all, the first included. A schedule's
        // skips are WARN lines, as its first one is.
        if run.skipped_ticks() > 1 {
            let skipped = run.skipped_ticks();
            if let Mode::Schedule { .. } = self.plan.mode {
                warn!(
                    pid,
                    skipped, "due times skipped while the run went on: {skipped}"
                );
            } else {
                info!(
                    pid,
                    skipped, "ticks skipped while the run went on: {skipped}"
                );
            }
        }
        if let Some(terminal) = &self.terminal {
            // The modes as a shell leaves them after its foreground job: put back after a
            // child that died of a signal (it may have left the terminal raw), kept after one
            // that exited on its own.
            if terminal.take_back(Pid::from_raw(pid as i32)) {
                terminal.settle_modes(matches!(status, ExitStatus::Signal(_)));
            }
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
        self.state = self.ending.settle(next, status);
    }

    /// INT/TERM: remembered first (never lost), then acted on in whatever state.
    pub(super) fn shutdown_signal(&mut self, sig: Signal) {
        let second = self.ending.shutdown();
        match &mut self.state {
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => {
                let first = self.plan.shutdown_stop_signal(sig);
                info!(
                    signal = sig.as_str(),
                    pid = run.pid(),
                    stop_signal = first.as_str(),
                    "received {}; stopping the child",
                    sig.as_str()
                );
                self.ending.passed_to_child();
                self.stop(Why::Shutdown, first);
            }
            State::Child {
                run,
                phase:
                    Phase::Stopping {
                        kill_at,
                        give_up_at,
                        status,
                        ..
                    },
            } => {
                if second {
                    info!(
                        signal = sig.as_str(),
                        "second {} while stopping the child; sending SIGKILL now",
                        sig.as_str()
                    );
                    // Killed here, not by the grace's deadline, which would say the grace ran
                    // out.
                    if give_up_at.is_none() {
                        run.tree().signal_all(Signal::SIGKILL);
                        *kill_at = Instant::now();
                        *give_up_at = Some(Instant::now() + super::KILL_WAIT);
                    }
                } else if self.plan.shutdown_stop_signal(sig) == sig {
                    info!(
                        signal = sig.as_str(),
                        "received {}; passing it on and exiting once the child is stopped",
                        sig.as_str()
                    );
                    if status.is_none() {
                        self.ending.passed_to_child();
                    }
                    run.tree().signal_group(sig);
                } else {
                    // The stop under way began with the stop signal the user chose: the
                    // child is not sent a TERM it was meant never to get, and its status is
                    // the exit's as if it had been.
                    info!(
                        signal = sig.as_str(),
                        "received {}; exiting once the child is stopped",
                        sig.as_str()
                    );
                    if status.is_none() {
                        self.ending.passed_to_child();
                    }
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
        // A shell that has gone (leaderrun was started with `&` by a script that exited)
        // leaves leaderrun's group orphaned: a stop would last for good, with stop requests
        // pending, so the child is left stopped as if leaderrun had started in the background.
        let orphaned = || {
            let orphaned = crate::process::terminal::own_group_is_orphaned();
            if orphaned {
                warn!(
                    pid,
                    signal = sig.as_str(),
                    "the child stopped on {}, and no shell can continue leaderrun (its process \
                     group is orphaned), so leaderrun does not stop; `kill -CONT {pid}` \
                     continues the child",
                    sig.as_str()
                );
            }
            orphaned
        };
        match sig {
            Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
                if (sig == Signal::SIGTSTP || self.terminal.is_some()) && orphaned() =>
            {
                return
            }
            Signal::SIGTSTP => {}
            // The shell gave leaderrun's group the terminal (`fg` of a job started in the
            // background, or of one sent there, while its child ran): the child that used it
            // from the background is handed it and continued, as `fg` continues a shell's job.
            // Only once the handing over worked: otherwise the child would read again, stop
            // again, and be continued again, for good.
            Signal::SIGTTIN | Signal::SIGTTOU
                if self
                    .terminal
                    .as_ref()
                    .is_some_and(|t| t.give_on_request(Pid::from_raw(pid as i32))) =>
            {
                info!(
                    pid,
                    signal = sig.as_str(),
                    "the child stopped on {} while leaderrun's job has the terminal; handing it \
                     on",
                    sig.as_str()
                );
                return self.resume_child();
            }
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
            // The rest of a pipeline stops with it, as the whole job would without leaderrun.
            crate::process::terminal::stop_rest_of_own_group(sig);
        }
        self.suspend();
        self.resume_child();
    }

    /// Stops leaderrun itself for job control until something continues it, then looks at
    /// whom the shell gave the terminal: `fg` gives it to leaderrun's job, `bg` keeps it.
    pub(super) fn suspend(&self) {
        suspend_self();
        if let Some(terminal) = &self.terminal {
            terminal.owns_foreground();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;

    use super::{Ending, Exit, State, Then};
    use crate::cli::exit_codes;
    use crate::elector::Term;
    use crate::process::child::ExitStatus;

    /// The transitions, by name.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Step {
        Shutdown,
        PassedToChild,
        ElectionFailed,
    }

    const STEPS: [Step; 3] = [Step::Shutdown, Step::PassedToChild, Step::ElectionFailed];

    /// Every sequence of exactly `len` transitions.
    fn sequences(len: usize) -> Vec<Vec<Step>> {
        (0..len).fold(vec![Vec::new()], |seqs, _| {
            seqs.iter()
                .flat_map(|seq| {
                    STEPS.iter().map(move |step| {
                        let mut longer = seq.clone();
                        longer.push(*step);
                        longer
                    })
                })
                .collect()
        })
    }

    #[test]
    fn a_stop_request_is_only_ever_added_to() {
        for seq in (0..=5).flat_map(sequences) {
            let mut ending = Ending::No;
            let (mut asked, mut failed, mut to_child) = (false, false, false);
            for (i, step) in seq.iter().enumerate() {
                let before = ending;
                match step {
                    Step::Shutdown => {
                        let second = ending.shutdown();
                        assert_eq!(second, asked, "{seq:?} at {i}: second INT/TERM");
                        asked = true;
                    }
                    Step::PassedToChild => {
                        ending.passed_to_child();
                        to_child |= matches!(before, Ending::Shutdown { .. });
                    }
                    Step::ElectionFailed => {
                        ending.election_failed();
                        failed = true;
                    }
                }
                let at = &seq[..=i];
                assert_eq!(ending.shutdown_requested(), asked, "{at:?}: shutdown");
                assert_eq!(
                    matches!(ending, Ending::ElectionFailed { .. }),
                    failed,
                    "{at:?}: election failure"
                );
                if !failed {
                    assert_eq!(
                        matches!(ending, Ending::Shutdown { to_child: true }),
                        to_child,
                        "{at:?}: passed to the child"
                    );
                }
                assert_eq!(ending == Ending::No, !asked && !failed, "{at:?}: no stop");
            }
        }
    }

    #[test]
    fn each_transition() {
        let mut ending = Ending::No;
        ending.passed_to_child();
        assert_eq!(
            ending,
            Ending::No,
            "nothing was passed on without a shutdown"
        );
        assert!(!ending.shutdown(), "the first INT/TERM");
        assert_eq!(ending, Ending::Shutdown { to_child: false });
        ending.passed_to_child();
        assert_eq!(ending, Ending::Shutdown { to_child: true });
        assert!(ending.shutdown(), "the second INT/TERM");
        assert_eq!(ending, Ending::Shutdown { to_child: true });
        ending.election_failed();
        assert_eq!(ending, Ending::ElectionFailed { shutdown: true });

        let mut ending = Ending::No;
        ending.election_failed();
        assert_eq!(ending, Ending::ElectionFailed { shutdown: false });
        assert!(!ending.shutdown(), "an election failure is not an INT/TERM");
        assert_eq!(ending, Ending::ElectionFailed { shutdown: true });
        ending.passed_to_child();
        assert_eq!(ending, Ending::ElectionFailed { shutdown: true });
    }

    /// What [`Ending::settle`] makes of what each mode may choose after a stop.
    #[test]
    fn how_a_stop_settles() {
        let status = ExitStatus::Signal(Signal::SIGTERM);
        let min_hold = Exit::Child(ExitStatus::Code(0));
        let (term, _control) = Term::issue(1, None, Duration::ZERO);
        let failure = Some(Exit::Code(exit_codes::FAILURE));
        let nexts = || {
            [
                State::Done(Exit::Code(3)),
                State::Leading {
                    term: term.clone(),
                    until: None,
                    then: Then::Exit(min_hold),
                },
                State::Leading {
                    term: term.clone(),
                    until: None,
                    then: Then::Start,
                },
                State::Standby { deadline: None },
            ]
        };
        // Per ending: the exit for each of `nexts`, `None` where the mode's choice stands.
        let table = [
            (Ending::No, [Some(Exit::Code(3)), None, None, None]),
            (
                Ending::Shutdown { to_child: false },
                [
                    Some(Exit::Code(3)),
                    Some(min_hold),
                    Some(Exit::Code(0)),
                    Some(Exit::Code(0)),
                ],
            ),
            (
                Ending::Shutdown { to_child: true },
                [
                    Some(Exit::Code(3)),
                    Some(min_hold),
                    Some(Exit::Child(status)),
                    Some(Exit::Child(status)),
                ],
            ),
            (
                Ending::ElectionFailed { shutdown: false },
                [Some(Exit::Code(3)), failure, failure, failure],
            ),
            (
                Ending::ElectionFailed { shutdown: true },
                [Some(Exit::Code(3)), Some(min_hold), failure, failure],
            ),
        ];
        for (ending, exits) in table {
            for (i, (next, exit)) in nexts().into_iter().zip(exits).enumerate() {
                let chosen = std::mem::discriminant(&next);
                let settled = ending.settle(next, status);
                match (exit, &settled) {
                    (Some(want), State::Done(got)) => {
                        assert_eq!(*got, want, "{ending:?}, next #{i}")
                    }
                    (None, settled) if std::mem::discriminant(settled) == chosen => {}
                    _ => panic!("{ending:?}, next #{i}: the wrong kind of state"),
                }
            }
        }
    }
}
