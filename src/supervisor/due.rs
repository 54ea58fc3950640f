//! `--schedule`: its due times as events, and `--catch-up` at the start of a term.
//!
//! The schedule is wall-clock time and the loop's timers are monotonic: the timer for the next
//! due time wakes at most [`DUE_RECHECK`] ahead and the wall clock is read again, so a clock
//! that was set meanwhile moves the due time with it. A clock set ahead passes over the due
//! times in between at once: only the latest of them runs (cron's way after a clock change, not
//! one run after another of stale due times); a clock set back by more than
//! [`CLOCK_SET_BACK`] is read afresh (else the schedule would wait out the whole step), and one
//! set back by less runs nothing twice. A due time is handled like a tick of
//! `--every`: it starts COMMAND only from `State::Leading` waiting to start, through
//! `Supervisor::start` (the proven-term rule); a standby runs nothing; a run still going makes
//! it skip with a WARN; during a takeover delay it waits for the delay's end.
//!
//! With `--history`, the due times that come in the first [`DUE_CHECK_WINDOW`] of a term are
//! looked up in the history before they run ([`Supervisor::run_due`]): an earlier leader whose
//! clock was ahead of ours ran them already by its clock, and ran them before our term began.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Election, Event, Mode, State, Supervisor, Then};
use crate::cli::metrics;
use crate::elector::Term;
use crate::process::child::Spawner;

/// Longest sleep of the due-time timer before the wall clock is read again: how late a clock
/// that was set (or a suspend the monotonic timer slept through) can be noticed. A second, not
/// cron's minute: a timer armed for an hourly due time slept up to a minute past a due time
/// the clock had been set beyond, and a schedule of seconds runs a second apart. One wake-up a
/// second of a process that has a schedule costs nothing to speak of.
pub const DUE_RECHECK: Duration = Duration::from_secs(1);

/// How much earlier than its due time a wake-up still counts as the due time (the monotonic
/// timer and the wall clock tick apart).
const DUE_EARLY: Duration = Duration::from_millis(20);

/// A wall clock set back by more than this (measured against the monotonic clock since the
/// due-time timer was armed) is taken as set right: the schedule goes on from the new time,
/// and the due times the step repeats run again. A smaller step runs nothing twice: the due
/// times it repeats ran already, and the schedule waits until the clock is back where it was.
/// Three hours, as cron draws the line between a clock that moved back a little and one that
/// was reset.
pub const CLOCK_SET_BACK: Duration = Duration::from_secs(3 * 3600);

/// The due-time timer: the due time, when to look at the wall clock for it, and both clocks
/// as they read when it was armed.
#[derive(Clone, Copy, Debug)]
pub(super) struct NextDue {
    due: SystemTime,
    pub(super) wake: Instant,
    wall: SystemTime,
    mono: Instant,
}

impl NextDue {
    fn new(due: SystemTime) -> NextDue {
        let (wall, mono) = (SystemTime::now(), Instant::now());
        let wait = due
            .duration_since(wall)
            .unwrap_or_default()
            .min(DUE_RECHECK);
        NextDue {
            due,
            wake: mono + wait,
            wall,
            mono,
        }
    }

    /// How far the wall clock was set back since the timer was armed (zero if it was not).
    fn set_back(&self, now: SystemTime) -> Duration {
        (self.wall + self.mono.elapsed())
            .duration_since(now)
            .unwrap_or_default()
    }
}

/// Shortest bound of the catch-up's history query.
const CATCH_UP_BOUND_MIN: Duration = Duration::from_secs(1);

/// How long after a term's start (by this host's clock) its due times are looked up in the
/// history before they run.
///
/// Only due times early in a term can have run already: an earlier leader ran a due time when
/// its own clock reached it, before our term began, so one that comes after the term's start by
/// our clock ran already only if our clock is behind its clock by more than that. A window
/// rather than every due time: a query before every start would put the history, and its
/// outages (each one a wait of the bound), in front of every run for good. Ten minutes covers
/// clocks NTP keeps many times over, and a host left to drift for a while; the README states
/// the bound.
pub const DUE_CHECK_WINDOW: Duration = Duration::from_secs(600);

/// A due time's history query waits at most the check interval, but at least this long (a
/// shorter interval); never past [`DUE_CHECK_BEFORE_NEXT`] before the next due time.
const DUE_CHECK_BOUND_MIN: Duration = Duration::from_millis(250);

/// How long before the next due time a due time's history query gives up at the latest: the
/// due time then runs (no answer in time) before the next one's timer fires, which may be
/// [`DUE_EARLY`] ahead of it; the rest is room for a runtime that is held up a moment.
const DUE_CHECK_BEFORE_NEXT: Duration = Duration::from_millis(250);

/// A lookup that would have less time than this (the next due time is that close: a late
/// wake-up, the end of a takeover delay just before the next one) gets
/// [`DUE_CHECK_BOUND_MIN`] instead, and the next due time, if it comes meanwhile, is skipped
/// as one that comes while a run goes on (`due`): a due time that came during a takeover
/// delay is the one most likely to have run elsewhere already.
const DUE_CHECK_TOO_SHORT: Duration = Duration::from_millis(20);

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// Arms the timer for the first due time after `after`.
    pub(super) fn arm_due(&mut self, after: SystemTime) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        self.next_due = schedule.next_after(after).map(NextDue::new);
    }

    /// The due-time timer fired: if the wall clock says the due time has come, it is run (or
    /// skipped, as a tick), and the next one is armed; else the timer is armed again.
    ///
    /// Due times the wall clock passed while nobody looked (a clock set ahead; a timer that
    /// stood still through a suspend) are passed over, and only the latest runs: before, each
    /// ran in turn, one after another as fast as COMMAND ended (a clock set a day ahead ran an
    /// every-second job thousands of times in a row, each with a stale due time). A clock set
    /// back by more than [`CLOCK_SET_BACK`] is read afresh: before, the schedule waited until
    /// the clock was back where it was, a day without a run for a clock set back a day.
    pub(super) fn due(&mut self) {
        let (Some(next), Some(schedule)) = (self.next_due, &self.schedule) else {
            return;
        };
        let now = SystemTime::now();
        let mut due = next.due;
        if now + DUE_EARLY < due {
            let back = next.set_back(now);
            if back > CLOCK_SET_BACK {
                let was = self.shown(due);
                self.arm_due(now);
                let then = self.next_due.map(|n| self.shown(n.due)).unwrap_or_default();
                warn!(set_back = %humantime::format_duration(Duration::from_secs(back.as_secs())), due = %was, next = %then, "the wall clock was set back: the schedule goes on from the new time");
            } else {
                self.next_due = Some(NextDue::new(due));
            }
            return;
        }
        if let Some(latest) = schedule.last_at_or_before(now).filter(|l| *l > due) {
            warn!(from = %self.shown(due), to = %self.shown(latest), "due times passed at once (the wall clock was set ahead, or leaderrun was held up): only the latest runs");
            due = latest;
        }
        self.arm_due(due);
        let shown = self.shown(due);
        match &mut self.state {
            State::Standby { .. } => {
                debug!(due = %shown, "due time: standby, nothing to run");
                self.metrics.tick(metrics::Tick::Standby);
            }
            State::Leading {
                term,
                until: None,
                then: Then::Start,
            } => {
                let term = term.clone();
                if self.due_check.is_some() {
                    // The previous due time is still being looked up: it came too close to
                    // this one to be asked about with time to spare (the end of a takeover
                    // delay, a late wake-up; `run_due`), or the runtime was held up. It goes
                    // on, as a run would, and this due time is skipped as one that comes
                    // while a run goes on: one of the two runs, and the one that may have run
                    // elsewhere already is still asked about.
                    warn!(due = %shown, "due time skipped: the previous one is still being looked up in the history");
                    self.metrics.tick(metrics::Tick::Skipped);
                    return;
                }
                self.run_due(term, due);
            }
            // The takeover delay: it runs when the delay is over.
            State::Leading {
                then: Then::AwaitTick,
                ..
            } => self.pending_due = Some(due),
            State::Child { run, .. } => {
                skipped_while_running(run, &shown);
                self.metrics.tick(metrics::Tick::Skipped);
            }
            _ => {}
        }
    }

    /// `--catch-up`: at the start of a term, the most recent due time, if it passed at most
    /// the catch-up window ago, is looked up in the history; the answer comes back as
    /// [`Event::CatchUp`]. Nothing waits for it.
    pub(super) fn ask_catch_up(&mut self, term: &Term) {
        self.catch_up = None;
        let (
            Mode::Schedule {
                catch_up: Some(window),
            },
            Some(schedule),
            Some(history),
            Some(lease),
        ) = (self.plan.mode, &self.schedule, &self.history, term.lease())
        else {
            return;
        };
        let now = SystemTime::now();
        let Some(last) = schedule.last_at_or_before(now) else {
            return;
        };
        if now.duration_since(last).unwrap_or_default() > window {
            return;
        }
        let (number, slot) = (term.number(), lease.slot);
        let bound = (self.plan.check_interval * 2).max(CATCH_UP_BOUND_MIN);
        // Asked now: ahead of the term's own writes (`term_began`).
        let asked = history.was_started(slot, last, bound);
        self.catch_up = Some(Box::pin(async move {
            let answer = asked.await;
            Event::CatchUp(number, last, answer)
        }));
    }

    /// The history's answer for a catch-up: the due time runs at once when no replica started
    /// it and this term still leads without a run (after the takeover delay, if one goes on).
    pub(super) fn catch_up_answered(&mut self, term: u64, due: SystemTime, answer: Option<bool>) {
        self.catch_up = None;
        let shown = self.shown(due);
        match answer {
            Some(true) => {
                info!(due = %shown, "catch-up: the due time was started already; not running it again");
                return;
            }
            None => {
                warn!(due = %shown, "catch-up: the history cannot tell whether a replica started the due time; not running it");
                return;
            }
            Some(false) => {}
        }
        match &mut self.state {
            State::Leading {
                term: t,
                until: None,
                then: Then::Start,
            } if t.number() == term => {
                info!(due = %shown, "catch-up: no replica started the due time; running it now");
                let t = t.clone();
                self.starting_due = Some(due);
                self.start(t);
            }
            State::Leading {
                term: t,
                then: Then::AwaitTick,
                ..
            } if t.number() == term => {
                info!(due = %shown, "catch-up: no replica started the due time; running it after the takeover delay");
                self.pending_due.get_or_insert(due);
            }
            _ => {
                debug!(due = %shown, "catch-up: the term moved on or a run goes on; not running it")
            }
        }
    }

    /// At a term's start (`--schedule` with `--history`): the due times of the next
    /// [`DUE_CHECK_WINDOW`] are looked up in the history before they run.
    pub(super) fn arm_due_checks(&mut self) {
        self.due_check = None;
        self.check_due_until = (self.schedule.is_some() && self.history.is_some())
            .then(|| SystemTime::now() + DUE_CHECK_WINDOW);
    }

    /// Runs the due time `due` in `term`, from `State::Leading` waiting to start. Early in a
    /// term (see [`DUE_CHECK_WINDOW`]) the history is asked first whether an earlier leader
    /// started it (its clock ahead of ours); the answer comes back as [`Event::DueChecked`]
    /// and the state waits for it as it is, so a stop or the term's end is handled meanwhile
    /// as ever.
    pub(super) fn run_due(&mut self, term: Term, due: SystemTime) {
        if let (Some(until), Some(history), Some(lease)) =
            (self.check_due_until, &self.history, term.lease())
        {
            if due <= until {
                let (number, slot) = (term.number(), lease.slot);
                // The answer, or its absence, must come before the next due time does: a
                // check still waiting then makes that one skip (`due`; before, the check was
                // dropped and its due time skipped, so a history that waited on a lock and a
                // check interval as long as the schedule's period lost a due time that no
                // replica ran).
                let before_next = self.next_due.map(|next| {
                    next.due
                        .duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .saturating_sub(DUE_CHECK_BEFORE_NEXT)
                });
                let bound = self.plan.check_interval.max(DUE_CHECK_BOUND_MIN);
                let bound = before_next.map_or(bound, |b| bound.min(b));
                let bound = if bound < DUE_CHECK_TOO_SHORT {
                    DUE_CHECK_BOUND_MIN
                } else {
                    bound
                };
                let asked = history.was_started(slot, due, bound);
                self.due_check = Some(Box::pin(async move {
                    let answer = asked.await;
                    Event::DueChecked(number, due, answer)
                }));
                return;
            }
            // Later due times are later still: none is looked up again in this term.
            self.check_due_until = None;
        }
        self.starting_due = Some(due);
        self.start(term);
    }

    /// The history's answer for a due time early in a term: one an earlier leader started is
    /// not run again; otherwise (not started, or no answer in time) it runs now if this term
    /// still leads without a run.
    pub(super) fn due_checked(&mut self, term: u64, due: SystemTime, answer: Option<bool>) {
        self.due_check = None;
        let shown = self.shown(due);
        match answer {
            Some(true) => {
                info!(due = %shown, "the due time was started already (by an earlier leader whose clock is ahead of this host's); not running it again");
                return;
            }
            Some(false) => {}
            None => {
                // A history that does not answer delays no further start of this term.
                self.check_due_until = None;
                warn!(due = %shown, "the history cannot tell whether an earlier leader started the due time; running it");
            }
        }
        match &mut self.state {
            State::Leading {
                term: t,
                until: None,
                then: Then::Start,
            } if t.number() == term => {
                let t = t.clone();
                self.starting_due = Some(due);
                self.start(t);
            }
            State::Child { run, .. } if run.term().number() == term => {
                skipped_while_running(run, &shown);
                self.metrics.tick(metrics::Tick::Skipped);
            }
            _ => debug!(due = %shown, "the term moved on; the due time does not run"),
        }
    }

    /// A due time as logs show it: in the schedule's zone.
    fn shown(&self, due: SystemTime) -> String {
        self.schedule
            .as_ref()
            .map(|s| s.format(due))
            .unwrap_or_default()
    }
}

/// A due time that came while `run` still goes is skipped. The first of a run is said at once
/// (a WARN); after more than one, a line when the run ends counts them all, the first
/// included (`Supervisor::stopped`), as `--every` says its skipped ticks: a run that outlasts a
/// schedule of every second by an hour would otherwise write 3,600 lines.
fn skipped_while_running(run: &mut super::rules::Run, shown: &str) {
    if run.skip_tick() == 1 {
        warn!(
            pid = run.pid(),
            due = %shown,
            "due time skipped: the previous run is still going"
        );
    } else {
        debug!(pid = run.pid(), due = %shown, "due time skipped: the previous run is still going");
    }
}
