//! The supervisor: one loop owns COMMAND's life (docs/guarantees.md#modes, #the-child-process,
//! #the-three-rules).
//!
//! # Theory of operation
//!
//! [`Supervisor::run`] is a loop over one event type, [`Event`]: a signal, a term that began,
//! the end of the term, a change of the check tally, the state's deadline, a tick of
//! `--every`, a due time of `--schedule` and the history's answers for it (`due`), a poll of the
//! child's tree, the election failing. Each event is handled by one function, which moves the
//! one `State` value on; each mode (docs/guarantees.md#modes) is a small policy over those
//! events (`Supervisor::after_stop` and friends). A stop is a state the loop
//! drives (signal, grace, SIGKILL, a bound), not a function that swallows events, so nothing
//! that arrives meanwhile is lost.
//!
//! The three rules of the product are written once each:
//!
//! * **Start or continue only on a proven lock.** Every spawn goes through
//!   `Supervisor::start`, every SIGCONT after job control through
//!   `Supervisor::resume_child`; both require [`Term::hold`] / [`Term::is_proven`], which
//!   are refused once the safe window of the last check that proved the lock has passed.
//!   Before every event and again before it is handled, `Supervisor::enforce` treats a term whose
//!   proof lapsed (a resume after SIGSTOP) as ended, so a timer that fires first on resume finds no
//!   term to start anything on.
//! * **Release only after the tree is dead.** A `Run` (rules.rs) owns COMMAND's tree and its
//!   [`TermHold`](crate::TermHold); its `Drop` ends the tree first and only then the hold, and
//!   the supervisor drops it once the tree is empty. The elector releases a lock that may still
//!   be held only when every hold is gone (see [`Term`]).
//! * **No stop request is lost.** One `Ending` value (rules.rs) records INT/TERM and a failed
//!   election whatever the state; its transitions only add to it, every transition that would
//!   start something consults it first, and every stop ends through `Ending::settle`.
//!
//! The supervisor takes its signals ([`SignalStream`]), its terms ([`Election`]) and its
//! processes ([`Spawner`]) from injected sources, so its tests drive every mode in-process
//! with fake terms and fake children under `tokio::time::pause`.
//!
//! Over 600 lines because the loop, its `Event`, its `State` and the `Supervisor` they move
//! are one thing: the rules (rules.rs), the modes (modes.rs), due times (due.rs) and reporting
//! (report.rs) are apart.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{debug, error, info, warn};

use crate::cli::exit_codes;
use crate::cli::health::Health;
use crate::cli::metrics::Metrics;
use crate::elector::{Checks, Term, TermEnd};
use crate::history::{History, RunId};
use crate::process::child::{ExitStatus, Spawner};
use crate::process::signals::{is_forwarded, is_shutdown, SignalStream};
use crate::process::terminal::Terminal;

mod due;
mod modes;
mod report;
mod rules;
pub mod schedule;

pub use modes::{Backoff, Mode, Plan, Restart, BACKOFF_CAP, BACKOFF_INITIAL, BACKOFF_RESET_AFTER};
pub use report::child_env;
use rules::{Ending, Run};

/// How leaderrun ends; [`Exit::finish`] turns it into the process exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// COMMAND's status is leaderrun's status (docs/guarantees.md#exit-codes).
    Child(ExitStatus),
    /// A status of leaderrun's own: 0 (stopped while standby), the conflict code, 124
    /// (`--timeout`), 125, 126, 127.
    Code(u8),
    /// A subcommand (`status`, `doctor`, `step-down`) was interrupted by this signal (INT or
    /// TERM). It has nothing to shut down, so leaderrun ends as the signal's default action
    /// would have ended it: a shell must see a program killed by the signal, not one that
    /// finished (docs/guarantees.md#exit-codes).
    Interrupted(Signal),
}

impl Exit {
    /// The process exit code. For a child that died of SIGINT, when leaderrun is not PID 1,
    /// leaderrun first dies of SIGINT itself so a calling shell loop stops
    /// (docs/field-notes.md#exit-statuses-as-a-shell-sees-them); should that return, 130 is the
    /// fallback. An interrupted subcommand dies of its signal the same way (128 + N as the
    /// fallback).
    pub fn finish(self) -> std::process::ExitCode {
        match self {
            Exit::Child(ExitStatus::Signal(Signal::SIGINT)) => die_of(Signal::SIGINT),
            Exit::Child(status) => std::process::ExitCode::from(status.exit_code()),
            Exit::Code(code) => std::process::ExitCode::from(code),
            Exit::Interrupted(sig) => die_of(sig),
        }
    }
}

/// Dies of `sig` (its default disposition restored, then raised), so that a calling shell loop
/// stops on Ctrl-C; as PID 1 the kernel drops it, and should it return the exit is the
/// shell's 128 + N.
fn die_of(sig: Signal) -> std::process::ExitCode {
    if std::process::id() != 1 {
        let _ = signal_hook::low_level::emulate_default_handler(sig as libc::c_int);
    }
    std::process::ExitCode::from(128 + sig as u8)
}

/// How long a stop waits for the tree after SIGKILL before it gives up on what it cannot
/// find or kill (a process in uninterruptible sleep; without `/proc`, an orphan that left the
/// group): every stop is bounded by grace + this.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often a stopping tree is looked at: members of the group that are not our children die
/// without a SIGCHLD to us.
pub const STOP_POLL: Duration = Duration::from_millis(25);
/// How often the reaper runs without a SIGCHLD (SIGCHLD coalesces,
/// docs/field-notes.md#one-place-waits).
pub const REAP_POLL: Duration = Duration::from_secs(1);

/// Where the supervisor gets its terms from: the running [`crate::Elector`] in the binary, a
/// fake in tests.
pub trait Election {
    /// The current term: each term that begins, and the ended placeholder when it ends.
    fn terms(&self) -> watch::Receiver<Term>;
    /// The check tally (one-shot modes decide on it).
    fn checks(&self) -> watch::Receiver<Checks>;
    /// Resolves, with the reason, if the election ends by itself (a bug or a panic); pending
    /// forever otherwise.
    fn failed(&mut self) -> impl Future<Output = String>;
}

/// Every input of the loop.
#[derive(Debug)]
pub enum Event {
    /// A signal leaderrun received.
    Signal(Signal),
    /// A term began (only awaited while standby).
    TermBegan(Term),
    /// The current term ended.
    TermEnded(TermEnd),
    /// The check tally changed (only awaited by a one-shot's first check).
    Checked,
    /// The state's deadline passed.
    Deadline,
    /// `--every` ticked.
    Tick,
    /// The wall-clock time of the next `--schedule` due time may have come (it is looked at
    /// again: the timer runs on the monotonic clock).
    Due,
    /// The history answered whether a replica started the due time a new term may catch up:
    /// the term's number, the due time, the answer (`None`: unknown).
    CatchUp(u64, SystemTime, Option<bool>),
    /// The history answered whether an earlier leader started a due time that has come early
    /// in this term (its clock ahead of ours): the term's number, the due time, the answer
    /// (`None`: unknown).
    DueChecked(u64, SystemTime, Option<bool>),
    /// Time to look at the child's tree (reap, leftovers).
    Poll,
    /// The election ended by itself.
    ElectionFailed(String),
    /// The terminal leaderrun owned hung up.
    HungUp,
}

/// Why a tree is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// COMMAND exited on its own; what it left behind is stopped.
    Exited,
    /// The term ended, or its proof lapsed.
    Demoted,
    /// `--timeout`.
    TimedOut,
    /// INT/TERM.
    Shutdown,
}

/// What a wait while leading without a child leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Start COMMAND (after a takeover delay, a back-off, or at the next tick).
    Start,
    /// `--every` after the takeover delay: wait for the next tick.
    AwaitTick,
    /// `--min-hold` is over: exit with this.
    Exit(Exit),
}

/// The one state of the loop.
enum State {
    /// Waiting for a term; `deadline` ends a `--wait`.
    Standby { deadline: Option<Instant> },
    /// Leading without a child until `until` (or the next tick).
    Leading {
        term: Term,
        until: Option<Instant>,
        then: Then,
    },
    /// COMMAND's tree is there: `run` owns it and its hold (rule 2, [`Run`]), from the spawn
    /// until the state is left after the tree was seen empty or given up on.
    Child { run: Run, phase: Phase },
    /// Finished.
    Done(Exit),
}

/// Where a [`State::Child`] is: a stop changes the phase in place, the run stays where it is.
enum Phase {
    /// COMMAND runs; `timeout_at` is the `--timeout`.
    Running { timeout_at: Option<Instant> },
    /// COMMAND's tree is being stopped: `why`, the main child's `status` once seen, SIGKILL
    /// at `kill_at`, giving up on what is left at `give_up_at` (set with the SIGKILL).
    Stopping {
        why: Why,
        status: Option<ExitStatus>,
        kill_at: Instant,
        give_up_at: Option<Instant>,
    },
}

/// The loop and what it owns.
pub struct Supervisor<E: Election, S: Spawner> {
    plan: Plan,
    election: E,
    spawner: S,
    signals: SignalStream,
    terminal: Option<Arc<Terminal>>,
    /// The terminal's hangup, watched from the first event on while leaderrun owns it.
    hangup: Option<crate::process::terminal::Hangup>,
    metrics: Metrics,
    health: Arc<Health>,
    state: State,
    /// Whether a stop was requested (INT/TERM, a failed election): rule 3, [`Ending`].
    ending: Ending,
    /// Number of the last term seen, so a term is never started twice.
    last_term: u64,
    /// The grant of the current one-shot term, for `--min-hold`.
    granted_at: Option<Instant>,
    backoff: Backoff,
    ticker: Option<Interval>,
    reap: Interval,
    checks: watch::Receiver<Checks>,
    terms: watch::Receiver<Term>,
    warned_background_read: bool,
    /// When the supervisor was made: a one-shot's retries count from here.
    started: Instant,
    /// `--schedule`.
    schedule: Option<schedule::Schedule>,
    /// The next due time, when to look at the wall clock for it, and both clocks as they read
    /// when it was armed (to tell a clock that was set from one that ran).
    next_due: Option<due::NextDue>,
    /// A due time that came during the takeover delay (or a catch-up), to run when it ends.
    pending_due: Option<SystemTime>,
    /// `--every`: a tick came during the takeover delay; it runs when the delay ends.
    pending_tick: bool,
    /// The due time of the run being started.
    starting_due: Option<SystemTime>,
    /// `--history`.
    history: Option<History>,
    /// The history row of the run going on.
    history_run: Option<RunId>,
    /// The history's answer for a catch-up, while it is awaited.
    catch_up: Option<Pin<Box<dyn Future<Output = Event>>>>,
    /// Due times up to this wall-clock time are looked up in the history before they run
    /// (set at a term's start, `None` past it or once the history could not answer).
    check_due_until: Option<SystemTime>,
    /// The history's answer for a due time about to run, while it is awaited.
    due_check: Option<Pin<Box<dyn Future<Output = Event>>>>,
}

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// A supervisor for `plan`. Nothing runs before [`Supervisor::run`].
    pub fn new(
        plan: Plan,
        election: E,
        spawner: S,
        signals: SignalStream,
        terminal: Option<Arc<Terminal>>,
        metrics: Metrics,
        health: Arc<Health>,
    ) -> Self {
        let deadline = match plan.mode {
            Mode::OneShot {
                wait: Some(wait), ..
            } => Some(Instant::now() + wait),
            _ => None,
        };
        let ticker = match plan.mode {
            Mode::Every { period } => {
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
                Some(ticker)
            }
            _ => None,
        };
        let mut reap = tokio::time::interval(REAP_POLL);
        reap.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let checks = election.checks();
        let terms = election.terms();
        Supervisor {
            plan,
            election,
            spawner,
            signals,
            terminal,
            hangup: None,
            metrics,
            health,
            state: State::Standby { deadline },
            ending: Ending::No,
            last_term: 0,
            granted_at: None,
            backoff: Backoff::default(),
            ticker,
            reap,
            checks,
            terms,
            warned_background_read: false,
            started: Instant::now(),
            schedule: None,
            next_due: None,
            pending_due: None,
            pending_tick: false,
            starting_due: None,
            history: None,
            history_run: None,
            catch_up: None,
            check_due_until: None,
            due_check: None,
        }
    }

    /// The schedule of [`Mode::Schedule`]; its first due time is armed now.
    pub fn with_schedule(mut self, schedule: schedule::Schedule) -> Self {
        self.schedule = Some(schedule);
        self.arm_due(SystemTime::now());
        self
    }

    /// Records every run in `history` (off the fence's path: [`History`] never waits).
    pub fn with_history(mut self, history: History) -> Self {
        self.history = Some(history);
        self
    }

    /// Runs until the mode is done; returns the exit status of docs/guarantees.md#exit-codes.
    pub async fn run(mut self) -> Exit {
        self.hangup = self.terminal.as_ref().and_then(|t| t.watch_hangup());
        let mut was_standby = true;
        loop {
            self.enforce();
            self.note_standby(&mut was_standby);
            if let State::Done(exit) = self.state {
                return exit;
            }
            let event = self.next_event().await;
            // Again between the event and its handling: a resume after a freeze wakes with
            // every event due, and the lapse must be seen before any of them is acted on.
            self.enforce();
            self.handle(event);
            self.note_standby(&mut was_standby);
        }
    }

    /// Back to standby: the term is over and its history writes are queued (a run's end is
    /// recorded before its state settles), so the history's session closes after them; a
    /// standby keeps no session but its lock's (docs/election.md#a-standbys-check).
    fn note_standby(&self, was_standby: &mut bool) {
        let standby = matches!(self.state, State::Standby { .. });
        if standby && !*was_standby {
            if let Some(history) = &self.history {
                history.term_over();
            }
        }
        *was_standby = standby;
    }

    /// Waits for the next event the current state listens to.
    async fn next_event(&mut self) -> Event {
        let one_shot_first_check = matches!(
            (self.plan.mode, &self.state),
            (Mode::OneShot { wait: None, .. }, State::Standby { .. })
        );
        let standby = matches!(self.state, State::Standby { .. });
        let term = match &self.state {
            State::Leading { term, .. } => Some(term.clone()),
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => Some(run.term().clone()),
            _ => None,
        };
        let deadline = match &self.state {
            State::Standby { deadline } => *deadline,
            State::Leading { until, .. } => *until,
            State::Child {
                phase: Phase::Running { timeout_at },
                ..
            } => *timeout_at,
            State::Child {
                phase:
                    Phase::Stopping {
                        kill_at,
                        give_up_at,
                        ..
                    },
                ..
            } => Some(give_up_at.unwrap_or(*kill_at)),
            State::Done(_) => None,
        };
        let stopping = matches!(
            self.state,
            State::Child {
                phase: Phase::Stopping { .. },
                ..
            }
        );
        let after = self.last_term;
        tokio::select! {
            biased;
            sig = self.signals.recv() => Event::Signal(sig),
            () = crate::process::terminal::hung_up(self.hangup.as_ref()) => Event::HungUp,
            reason = self.election.failed() => Event::ElectionFailed(reason),
            cause = ended(term.as_ref()) => Event::TermEnded(cause),
            term = next_term(&mut self.terms, after), if standby => Event::TermBegan(term),
            _ = self.checks.changed(), if one_shot_first_check => Event::Checked,
            () = sleep_until(deadline) => Event::Deadline,
            () = tokio::time::sleep(STOP_POLL), if stopping => Event::Poll,
            _ = self.reap.tick() => Event::Poll,
            () = next_tick(self.ticker.as_mut()) => Event::Tick,
            // A due time's lookup that ended as the next due time came is handled first: its
            // due time runs (or is known to have run) before the next one is looked at.
            event = answer(self.due_check.as_mut()) => event,
            () = sleep_until(self.next_due.map(|n| n.wake)) => Event::Due,
            event = answer(self.catch_up.as_mut()) => event,
        }
    }

    /// One event, one transition.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Signal(sig) => self.signal(sig),
            Event::TermBegan(term) => self.term_began(term),
            Event::TermEnded(cause) => self.term_ended(cause),
            Event::Checked => self.first_check(),
            Event::Deadline => self.deadline(),
            Event::Tick => self.tick(),
            Event::Due => self.due(),
            Event::CatchUp(term, due, answer) => self.catch_up_answered(term, due, answer),
            Event::DueChecked(term, due, answer) => self.due_checked(term, due, answer),
            Event::Poll => {
                self.look_at_terminal();
                self.poll()
            }
            Event::HungUp => {
                // Watched once: a hung-up terminal stays so.
                self.hangup = None;
                // As the kernel does: a hangup ends the foreground job, not one sent to the
                // background (`bg`, maybe `disown`ed), nor one that ignores SIGHUP (`nohup`):
                // the hangup stands for the SIGHUP, which leaderrun does not act on then.
                if crate::process::signals::was_ignored_at_entry(Signal::SIGHUP) {
                    info!(
                        "the terminal hung up; SIGHUP was ignored when leaderrun started \
                         (nohup), so it goes on"
                    );
                } else if self
                    .terminal
                    .as_ref()
                    .is_some_and(|t| t.job_in_foreground())
                {
                    info!("the terminal hung up; stopping as a shell stops its jobs, with SIGHUP");
                    self.shutdown_signal(Signal::SIGHUP);
                } else {
                    info!("the terminal hung up; leaderrun runs in the background and goes on");
                }
            }
            Event::ElectionFailed(reason) => {
                error!("the election stopped unexpectedly: {reason}");
                self.ending.election_failed();
                match self.state {
                    State::Child {
                        phase: Phase::Running { .. },
                        ..
                    } => self.stop(Why::Demoted, self.plan.stop_signal),
                    State::Child {
                        phase: Phase::Stopping { .. },
                        ..
                    } => {}
                    _ => self.state = State::Done(Exit::Code(exit_codes::FAILURE)),
                }
            }
        }
    }

    fn signal(&mut self, sig: Signal) {
        if is_shutdown(sig) {
            return self.shutdown_signal(sig);
        }
        match (&mut self.state, sig) {
            (_, Signal::SIGCHLD) => self.poll(),
            (_, Signal::SIGCONT) => self.look_at_terminal(),
            (
                State::Child {
                    run,
                    phase: Phase::Running { .. },
                },
                sig,
            ) if is_forwarded(sig) || sig == Signal::SIGTSTP => run.tree().signal_group(sig),
            (
                State::Child {
                    run,
                    phase: Phase::Stopping { .. },
                },
                sig,
            ) if is_forwarded(sig) => run.tree().signal_group(sig),
            // A Ctrl-Z now would stop what we are stopping; SIGCONT keeps it going.
            (
                State::Child {
                    phase: Phase::Stopping { .. },
                    ..
                },
                _,
            ) => {}
            // Not in an orphaned group: nothing could continue it (docs/process-model.md#job-control).
            (_, Signal::SIGTSTP) if !crate::process::terminal::own_group_is_orphaned() => {
                self.suspend()
            }
            (_, sig) => debug!(
                signal = sig.as_str(),
                "no child to pass {} to",
                sig.as_str()
            ),
        }
    }

    /// Looks at whom the terminal's foreground is, after a SIGCONT and at every reaper's poll
    /// (once a second): `fg` of a job that runs sends no signal (a shell continues only a
    /// stopped job), and whether leaderrun's job has the terminal decides what a hangup does.
    /// After `fg` a running child is handed the terminal, as at its start in the foreground.
    /// Nothing is continued here: a child that stopped is continued only through
    /// `resume_child`, on a proven term.
    fn look_at_terminal(&mut self) {
        let Some(terminal) = &self.terminal else {
            return;
        };
        // A child being stopped still counts as the job's (a hangup meanwhile is the
        // foreground job's), but is handed nothing.
        let (child, running) = match &self.state {
            State::Child { run, phase } => (
                Some(nix::unistd::Pid::from_raw(run.pid() as i32)),
                matches!(phase, Phase::Running { .. }),
            ),
            _ => (None, false),
        };
        if terminal.look(child) && running && terminal.child_may_have_it() {
            if let Some(child) = child {
                let _ = terminal.give_to(child);
            }
        }
    }

    fn term_began(&mut self, term: Term) {
        if !matches!(self.state, State::Standby { .. }) || term.number() <= self.last_term {
            return;
        }
        self.last_term = term.number();
        self.granted_at = Some(Instant::now());
        self.backoff = Backoff::default();
        let delay = self.plan.takeover_delay;
        // `--tick-at-grant` makes the grant itself the first tick of the term.
        // `--schedule` waits for its due times as `--every` waits for its ticks.
        let is_every = (matches!(self.plan.mode, Mode::Every { .. }) && !self.plan.tick_at_grant)
            || matches!(self.plan.mode, Mode::Schedule { .. });
        self.pending_due = None;
        self.pending_tick = false;
        // The catch-up's question goes first: the term's writes below can wait for locks on
        // the table (a `CREATE INDEX`, a long prune) that a read does not wait for.
        self.ask_catch_up(&term);
        // Queued, never awaited: marks the runs of vanished leaders lost, prunes old rows.
        if let (Some(history), Some(lease)) = (&self.history, term.lease()) {
            history.term_began(lease.slot, lease.fencing_token);
        }
        self.arm_due_checks();
        if !delay.is_zero() {
            info!(term = term.number(), delay = %humantime::format_duration(delay), "takeover delay: verifying the lock before COMMAND starts");
            let then = if is_every {
                Then::AwaitTick
            } else {
                Then::Start
            };
            self.state = State::Leading {
                term,
                until: Some(Instant::now() + delay),
                then,
            };
        } else if is_every {
            self.state = State::Leading {
                term,
                until: None,
                then: Then::Start,
            };
        } else {
            self.start(term);
        }
    }

    /// The term ended (or its proof lapsed).
    fn term_ended(&mut self, cause: TermEnd) {
        match &self.state {
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => {
                let how = if cause == TermEnd::LeadershipLost {
                    "leadership lost"
                } else {
                    "leadership released"
                };
                info!(
                    pid = run.pid(),
                    term = run.term().number(),
                    "{how}; stopping the child"
                );
                self.stop(Why::Demoted, self.plan.stop_signal);
            }
            State::Leading { then, .. } => {
                self.state = match (then, self.plan.mode) {
                    (Then::Exit(exit), _) => State::Done(*exit),
                    (_, Mode::OneShot { .. }) => {
                        info!("leadership lost before COMMAND started; COMMAND does not run");
                        State::Done(Exit::Code(self.plan.conflict_exit_code))
                    }
                    _ => State::Standby { deadline: None },
                };
            }
            _ => {}
        }
    }

    fn deadline(&mut self) {
        let now = Instant::now();
        match &mut self.state {
            State::Standby { deadline: Some(_) } => {
                // A standby may still be waiting in the lock queue when the wait is over: what
                // counts is whether the server was reached at all, and, as for `--once`,
                // whether a check got an answer about the lock: a server that was reached but
                // never asked (a hot standby, every check failed) is no holder elsewhere
                // (docs/guarantees.md#modes).
                let seen = self.checks.borrow().clone();
                let unanswered = seen.refused == 0
                    && !seen.waiting
                    && seen.last == Some(crate::CheckOutcome::Failed);
                self.state = if seen.sessions_opened > 0 && unanswered {
                    // Each failed try was an ERROR or WARN line with its cause, but for a
                    // server that was momentarily full or starting up (DEBUG), as below.
                    match seen.last_error {
                        Some(cause) if seen.last_transient => error!(
                            "could not check the lock: no check within --wait got an answer about the lock: {cause}"
                        ),
                        _ => error!(
                            "could not check the lock: no check within --wait got an answer about the lock (causes above)"
                        ),
                    }
                    State::Done(Exit::Code(exit_codes::FAILURE))
                } else if seen.sessions_opened == 0 {
                    // Each failed try was a WARN line with its cause, but for a server that was
                    // momentarily full or starting up (DEBUG: retried, no error by itself): the
                    // verdict repeats no WARN, and gives that cause.
                    match seen.last_error {
                        Some(cause) if seen.last_transient => error!(
                            "could not check the lock: the database could not be reached within --wait: {cause}"
                        ),
                        Some(_) => error!(
                            "could not check the lock: the database could not be reached within --wait (causes above)"
                        ),
                        None => error!("could not check the lock: could not connect within --wait"),
                    }
                    State::Done(Exit::Code(exit_codes::FAILURE))
                } else {
                    debug!("another session holds the lock; COMMAND does not run");
                    State::Done(Exit::Code(self.plan.conflict_exit_code))
                };
            }
            State::Leading {
                term, until, then, ..
            } => match *then {
                Then::Start => {
                    let term = term.clone();
                    self.start(term);
                }
                Then::AwaitTick => {
                    *until = None;
                    *then = Then::Start;
                    // A due time or a tick that came during the takeover delay runs now.
                    if let Some(due) = self.pending_due.take() {
                        let term = term.clone();
                        self.run_due(term, due);
                    } else if std::mem::take(&mut self.pending_tick) {
                        let term = term.clone();
                        self.start(term);
                    }
                }
                Then::Exit(exit) => self.state = State::Done(exit),
            },
            State::Child {
                run,
                phase: Phase::Running {
                    timeout_at: Some(at),
                },
            } if *at <= now => {
                let limit = humantime::format_duration(self.plan.timeout.unwrap_or_default());
                warn!(
                    pid = run.pid(),
                    term = run.term().number(),
                    "COMMAND ran longer than --timeout {limit}; stopping it"
                );
                self.stop(Why::TimedOut, self.plan.stop_signal);
            }
            State::Child {
                phase:
                    Phase::Stopping {
                        kill_at,
                        give_up_at: None,
                        ..
                    },
                ..
            } if *kill_at <= now => {
                // Looked at first: a leaderrun that was stopped itself past the grace may
                // find the tree gone (its watchdog stopped it meanwhile), and then it is not
                // still running.
                self.poll();
                let State::Child {
                    run,
                    phase:
                        Phase::Stopping {
                            give_up_at: give_up_at @ None,
                            status,
                            ..
                        },
                } = &mut self.state
                else {
                    return;
                };
                let what = if status.is_some() {
                    "processes COMMAND left behind are"
                } else {
                    "child is"
                };
                warn!(
                    pgid = run.pid(),
                    grace = %humantime::format_duration(self.plan.grace),
                    "{what} still running after the grace period; sending SIGKILL"
                );
                run.tree().signal_all(Signal::SIGKILL);
                *give_up_at = Some(now + KILL_WAIT);
                self.poll();
            }
            State::Child {
                run,
                phase:
                    Phase::Stopping {
                        give_up_at, status, ..
                    },
            } if give_up_at.is_some_and(|at| at <= now) => {
                warn!(
                    pgid = run.pid(),
                    "processes of COMMAND are still there {} after SIGKILL; going on without them",
                    humantime::format_duration(KILL_WAIT)
                );
                let status = status.unwrap_or(ExitStatus::Signal(Signal::SIGKILL));
                self.stopped(status);
            }
            _ => {}
        }
    }

    /// Reaps and looks at the tree: a child that exited or stopped, leftovers gone.
    fn poll(&mut self) {
        match &mut self.state {
            State::Child {
                run,
                phase: Phase::Running { .. },
            } => {
                let seen = run.tree().poll();
                if seen.fenced {
                    // The watchdog stopped the tree while this leaderrun did not answer it. As
                    // a rule the proof had lapsed and the term ends by itself; where the
                    // watchdog knew an older proof than the last check's (leaderrun stopped
                    // right after it), the term is given up: either way it is a demotion, never
                    // COMMAND's own exit (docs/process-model.md#when-leaderrun-freezes).
                    if run.term().is_proven() {
                        warn!(
                            pid = run.pid(),
                            term = run.term().number(),
                            "the watchdog stopped COMMAND's tree while this leaderrun did not answer it, on a proof it had not heard of yet; giving the term up"
                        );
                        run.term().give_up();
                    }
                    self.stop(Why::Demoted, self.plan.stop_signal);
                    return;
                }
                if seen.unguarded {
                    // Rule 2 holds only while a watchdog would kill the tree if leaderrun
                    // were killed: without one, the term ends and the tree is stopped before
                    // the release, as a tree is never started unguarded
                    // (docs/process-model.md#when-the-watchdog-dies).
                    warn!(
                        pid = run.pid(),
                        term = run.term().number(),
                        "no watchdog guards COMMAND's tree and none can be started: stopping it and giving the term up"
                    );
                    run.term().give_up();
                    self.stop(Why::Demoted, self.plan.stop_signal);
                    return;
                }
                if let Some(status) = seen.main {
                    info!(pid = run.pid(), status = %status, term = run.term().number(), "child exited");
                    if seen.empty {
                        self.stopped_as(Why::Exited, status);
                    } else {
                        // Helpers it left running are stopped before anything else happens.
                        self.stop(Why::Exited, self.plan.stop_signal);
                        if let State::Child {
                            phase: Phase::Stopping { status: s, .. },
                            ..
                        } = &mut self.state
                        {
                            *s = Some(status);
                        }
                    }
                } else if let Some(sig) = seen.stopped {
                    self.job_control(sig);
                }
            }
            State::Child {
                run,
                phase: Phase::Stopping { status, .. },
            } => {
                let seen = run.tree().poll();
                if status.is_none() {
                    *status = seen.main;
                }
                if seen.empty {
                    let status = status
                        .or(seen.main)
                        .unwrap_or(ExitStatus::Signal(Signal::SIGKILL));
                    self.stopped(status);
                }
            }
            _ => self.spawner.reap_strays(),
        }
    }
}

/// Resolves with the first live term numbered above `after`.
async fn next_term(terms: &mut watch::Receiver<Term>, after: u64) -> Term {
    match terms
        .wait_for(|t| !t.is_ended() && t.number() > after)
        .await
    {
        Ok(term) => term.clone(),
        // The election is gone; `Election::failed` reports that.
        Err(_) => std::future::pending().await,
    }
}

/// The answer of a history query (a catch-up, a due time's check); pending forever without
/// one.
async fn answer(query: Option<&mut Pin<Box<dyn Future<Output = Event>>>>) -> Event {
    match query {
        Some(query) => query.await,
        None => std::future::pending().await,
    }
}

/// Resolves when `term` ends; pending forever without one.
async fn ended(term: Option<&Term>) -> TermEnd {
    match term {
        Some(term) => term.ended().await,
        None => std::future::pending().await,
    }
}

/// The next tick of an optional ticker; pending forever without one.
async fn next_tick(ticker: Option<&mut Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; pending forever without it.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
