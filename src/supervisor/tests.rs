//! The supervisor's state machine in-process and deterministic: fake terms (issued with
//! `Term::issue`), fake process trees, signals fed by hand, and tokio's paused clock. Each test
//! is one class of issue 10's faults; the binary's end-to-end tests are in `tests/rules.rs`. Runs
//! with `cargo test --lib`: no PostgreSQL, no processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cli::health::Health;
use crate::cli::metrics::Metrics;
use crate::elector::{boottime, Checks};
use crate::process::child::{Announcement, ExitStatus, SpawnError, Spawner, Tree, TreeState};
use crate::process::signals::{SignalSender, SignalStream};
use crate::supervisor::{
    Backoff, Election, Exit, Mode, Plan, Restart, Supervisor, BACKOFF_INITIAL, BACKOFF_RESET_AFTER,
};
use crate::{Term, TermControl, TermEnd, Timing};
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

const GRACE: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One fake process: dies `delay` after a signal it reacts to (TERM, INT, the stop signal);
/// `None` ignores them. SIGKILL always kills at once.
#[derive(Clone, Debug, Default)]
struct Life {
    delay: Option<Duration>,
    status: Option<ExitStatus>,
    dying: Option<(Instant, ExitStatus)>,
}

impl Life {
    fn dies_after(delay: Duration) -> Life {
        Life {
            delay: Some(delay),
            ..Life::default()
        }
    }

    fn ignores_term() -> Life {
        Life::default()
    }

    fn alive(&mut self) -> bool {
        if let Some((at, status)) = self.dying {
            if at <= Instant::now() && self.status.is_none() {
                self.status = Some(status);
            }
        }
        self.status.is_none()
    }

    fn signal(&mut self, sig: Signal) {
        if !self.alive() {
            return;
        }
        match sig {
            Signal::SIGKILL => self.status = Some(ExitStatus::Signal(Signal::SIGKILL)),
            Signal::SIGCONT | Signal::SIGWINCH | Signal::SIGCHLD => {}
            sig => {
                if let (Some(delay), None) = (self.delay, self.dying) {
                    self.dying = Some((Instant::now() + delay, ExitStatus::Signal(sig)));
                }
            }
        }
    }
}

/// A COMMAND: its main process and, optionally, a helper in its group that outlives it.
#[derive(Clone, Debug)]
struct Proc {
    main: Life,
    helper: Option<Life>,
    /// The watchdog stopped it ([`TreeState::fenced`]): its end is held back.
    fenced: bool,
}

/// One thing the fakes did. Not every field is asserted on; all show in a failing test's
/// `{world:?}`.
#[derive(Debug)]
#[allow(dead_code)]
enum Did {
    /// A tree was started; `term` is its `LEADERRUN_TERM`.
    Spawn { pid: u32, term: String },
    /// A signal went to the tree of `pid`.
    Signal { pid: u32, sig: Signal },
    /// The main process of `pid` exited.
    Exit { pid: u32 },
}

/// Everything the fakes did, for the tests to look at.
#[derive(Debug, Default)]
struct World {
    procs: HashMap<u32, Proc>,
    /// What happened, in order.
    log: Vec<Did>,
    next_pid: u32,
    /// The next spawns find the proof's end passed at their exec (a machine that stalled
    /// between the check and the exec).
    lapse: bool,
}

impl World {
    fn spawns(&self) -> Vec<&Did> {
        self.log
            .iter()
            .filter(|d| matches!(d, Did::Spawn { .. }))
            .collect()
    }

    fn signals_to(&self, pid: u32) -> Vec<&'static str> {
        self.log
            .iter()
            .filter_map(|d| match *d {
                Did::Signal { pid: to, sig } if to == pid => Some(sig.as_str()),
                _ => None,
            })
            .collect()
    }

    fn alive(&mut self, pid: u32) -> bool {
        let p = self.procs.get_mut(&pid).expect("known pid");
        let main = p.main.alive();
        let helper = p.helper.as_mut().is_some_and(Life::alive);
        main || helper
    }
}

#[derive(Debug)]
struct FakeTree {
    pid: u32,
    world: Arc<Mutex<World>>,
}

impl Tree for FakeTree {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn signal_group(&mut self, sig: Signal) {
        let mut world = self.world.lock().unwrap();
        world.log.push(Did::Signal { pid: self.pid, sig });
        let p = world.procs.get_mut(&self.pid).unwrap();
        p.main.signal(sig);
        if let Some(h) = p.helper.as_mut() {
            h.signal(sig);
        }
    }

    fn signal_all(&mut self, sig: Signal) {
        // As `WatchedTree`: a stop asked for ends the hold-back of a fenced tree's end.
        if let Some(p) = self.world.lock().unwrap().procs.get_mut(&self.pid) {
            p.fenced = false;
        }
        self.signal_group(sig);
    }

    fn poll(&mut self) -> TreeState {
        let mut world = self.world.lock().unwrap();
        let p = world.procs.get_mut(&self.pid).unwrap();
        p.main.alive();
        let helper_alive = p.helper.as_mut().is_some_and(Life::alive);
        if p.fenced {
            return TreeState {
                fenced: true,
                ..TreeState::default()
            };
        }
        TreeState {
            main: p.main.status,
            stopped: None,
            empty: p.main.status.is_some() && !helper_alive,
            fenced: false,
            unguarded: false,
        }
    }
}

struct FakeSpawner {
    world: Arc<Mutex<World>>,
    template: Proc,
    fail: bool,
}

impl Spawner for FakeSpawner {
    fn spawn(
        &mut self,
        env: &[(&'static str, String)],
        _: Option<Announcement<'_>>,
        exec_by: Option<Duration>,
    ) -> Result<Box<dyn Tree>, SpawnError> {
        // As the real child checks before exec: a start after the proof's end never runs.
        if exec_by.is_some_and(|at| boottime() > at) || self.world.lock().unwrap().lapse {
            return Err(SpawnError::ProofLapsed);
        }
        if self.fail {
            return Err(SpawnError::NotFound {
                program: "job".into(),
            });
        }
        let mut world = self.world.lock().unwrap();
        world.next_pid += 1;
        let pid = 100 + world.next_pid;
        let term = env
            .iter()
            .find(|(k, _)| *k == "LEADERRUN_TERM")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        world.log.push(Did::Spawn { pid, term });
        world.procs.insert(pid, self.template.clone());
        Ok(Box::new(FakeTree {
            pid,
            world: self.world.clone(),
        }))
    }

    fn reap_strays(&mut self) {}
}

struct FakeElection {
    terms: watch::Sender<Term>,
    checks: watch::Sender<Checks>,
}

/// The supervisor's handle on the shared fake election.
struct FakeSource(Arc<FakeElection>);

impl Election for FakeSource {
    fn terms(&self) -> watch::Receiver<Term> {
        self.0.terms.subscribe()
    }

    fn checks(&self) -> watch::Receiver<Checks> {
        self.0.checks.subscribe()
    }

    async fn failed(&mut self) -> String {
        std::future::pending().await
    }
}

/// A supervisor on fakes, running on a local task.
struct Harness {
    world: Arc<Mutex<World>>,
    signals: SignalSender,
    election: Arc<FakeElection>,
    task: tokio::task::JoinHandle<Exit>,
    terms: u64,
}

fn plan(mode: Mode) -> Plan {
    Plan {
        mode,
        grace: GRACE,
        stop_signal: Signal::SIGTERM,
        takeover_delay: Duration::ZERO,
        timeout: None,
        conflict_exit_code: 3,
        check_interval: ms(200),
        tick_at_grant: false,
    }
}

fn ended_term() -> Term {
    let (term, control) = Term::issue(0, None, Duration::ZERO);
    control.end(TermEnd::LeadershipLost);
    term
}

impl Harness {
    fn start(plan: Plan, template: Proc) -> Harness {
        Harness::start_with(plan, template, false)
    }

    fn start_with(plan: Plan, template: Proc, fail: bool) -> Harness {
        let world = Arc::new(Mutex::new(World::default()));
        let (signals, stream) = SignalStream::channel();
        let election = Arc::new(FakeElection {
            terms: watch::channel(ended_term()).0,
            checks: watch::channel(Checks::default()).0,
        });
        let spawner = FakeSpawner {
            world: world.clone(),
            template,
            fail,
        };
        let timing = Timing::new(ms(200), GRACE);
        let supervisor = Supervisor::new(
            plan,
            FakeSource(election.clone()),
            spawner,
            stream,
            None,
            Metrics::new(),
            Arc::new(Health::new(&timing)),
        );
        let task = tokio::task::spawn_local(supervisor.run());
        Harness {
            world,
            signals,
            election,
            task,
            terms: 0,
        }
    }

    /// Begins a new term, proven for an hour.
    fn grant(&mut self) -> TermControl {
        self.terms += 1;
        let (term, control) = Term::issue(self.terms, None, boottime() + Duration::from_secs(3600));
        self.election.terms.send_replace(term);
        control
    }

    fn demote(&self, control: &TermControl) {
        control.end(TermEnd::LeadershipLost);
        self.election.terms.send_replace(ended_term());
    }

    fn signal(&self, sig: Signal) {
        self.signals.send(sig).unwrap();
    }

    /// The main process of `pid` exits with `code`; SIGCHLD follows.
    fn exit(&self, pid: u32, code: i32) {
        let mut world = self.world.lock().unwrap();
        world.log.push(Did::Exit { pid });
        world.procs.get_mut(&pid).unwrap().main.status = Some(ExitStatus::Code(code));
        drop(world);
        self.signal(Signal::SIGCHLD);
    }

    fn spawned(&self) -> usize {
        self.world.lock().unwrap().spawns().len()
    }

    fn last_pid(&self) -> u32 {
        100 + self.world.lock().unwrap().next_pid
    }

    fn alive(&self, pid: u32) -> bool {
        self.world.lock().unwrap().alive(pid)
    }

    fn signals_to(&self, pid: u32) -> Vec<&'static str> {
        self.world.lock().unwrap().signals_to(pid)
    }

    async fn exit_status(self) -> Exit {
        tokio::time::timeout(Duration::from_secs(600), self.task)
            .await
            .expect("the supervisor ended")
            .expect("no panic")
    }
}

/// Lets the loop handle everything that is due (paused clock: this advances it by `d`).
async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

fn job(main: Life) -> Proc {
    Proc {
        main,
        helper: None,
        fenced: false,
    }
}

/// Runs `test` on a current-thread runtime with the clock paused and a local task set.
fn paused<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, test());
}

const WHILE_LEADER: Mode = Mode::WhileLeader {
    restart: Restart::Never,
};

#[test]
fn the_lock_is_released_only_after_the_tree_is_dead() {
    paused(|| async {
        // The child takes 600 ms to exit on TERM.
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::dies_after(ms(600))));
        let control = h.grant();
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 1);
        let pid = h.last_pid();
        assert_eq!(control.holds(), 1, "the running child holds the term");
        h.demote(&control);
        settle(ms(10)).await;
        assert_eq!(h.signals_to(pid), ["SIGTERM", "SIGCONT"]);
        // The elector would release now only if the hold were gone: it is not.
        settle(ms(500)).await;
        assert!(h.alive(pid));
        assert_eq!(
            control.holds(),
            1,
            "hold dropped while the child still runs"
        );
        settle(ms(200)).await;
        assert!(!h.alive(pid));
        assert_eq!(control.holds(), 0, "the hold outlived the tree");
        assert!(control.released(ms(1)).await);
        // Back to standby: the next term starts COMMAND afresh.
        let _second = h.grant();
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 2);
        h.signal(Signal::SIGTERM);
        settle(ms(700)).await;
        assert!(matches!(h.exit_status().await, Exit::Child(_)));
    });
}

#[test]
fn a_tree_that_ignores_the_stop_signal_is_killed_after_the_grace() {
    paused(|| async {
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::ignores_term()));
        let control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        h.demote(&control);
        settle(GRACE - ms(50)).await;
        assert!(h.alive(pid));
        assert_eq!(control.holds(), 1);
        settle(ms(100)).await;
        assert!(!h.alive(pid));
        assert_eq!(h.signals_to(pid), ["SIGTERM", "SIGCONT", "SIGKILL"]);
        assert_eq!(control.holds(), 0);
        h.signal(Signal::SIGTERM);
        assert_eq!(h.exit_status().await, Exit::Code(0));
    });
}

#[test]
fn a_term_that_is_not_proven_starts_nothing() {
    paused(|| async {
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::dies_after(ms(1))));
        h.terms += 1;
        // Granted, but its proof has already lapsed (a resume after SIGSTOP).
        let (term, control) = Term::issue(1, None, boottime());
        h.election.terms.send_replace(term);
        settle(ms(50)).await;
        assert_eq!(h.spawned(), 0, "COMMAND started on an unproven lock");
        assert!(term_hold_refused(&control));
        // A later proven term runs.
        let _next = h.grant();
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 1);
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        assert!(matches!(h.exit_status().await, Exit::Child(_)));
    });
}

/// A child that finds the proof's end passed just before its exec does not exec (the real
/// one checks `exec_by` against CLOCK_BOOTTIME: `child::tests`); the supervisor takes that
/// as the term's end, lets the hold go, and a one-shot exits with the conflict code.
#[test]
fn a_start_whose_proof_ran_out_before_exec_runs_nothing() {
    paused(|| async {
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::dies_after(ms(1))));
        h.world.lock().unwrap().lapse = true;
        let control = h.grant();
        settle(ms(50)).await;
        assert_eq!(h.spawned(), 0, "COMMAND started after the proof's end");
        assert_eq!(control.holds(), 0, "the lapsed start kept its hold");
        // The next term's start finds its proof in force.
        h.world.lock().unwrap().lapse = false;
        h.demote(&control);
        let _next = h.grant();
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 1);
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        assert!(matches!(h.exit_status().await, Exit::Child(_)));

        let mut once = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(1))),
        );
        once.world.lock().unwrap().lapse = true;
        let _control = once.grant();
        settle(ms(50)).await;
        assert_eq!(once.spawned(), 0);
        assert_eq!(once.exit_status().await, Exit::Code(3));
    });
}

fn term_hold_refused(control: &TermControl) -> bool {
    control.term().hold().is_none()
}

#[test]
fn a_restart_back_off_that_ends_after_the_proof_lapsed_starts_nothing() {
    paused(|| async {
        let mode = Mode::WhileLeader {
            restart: Restart::Always,
        };
        let mut h = Harness::start(plan(mode), job(Life::dies_after(ms(1))));
        let control = h.grant();
        settle(ms(10)).await;
        h.exit(h.last_pid(), 1);
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 1);
        // Frozen past the safe window: on resume the back-off timer is due at once.
        control.revoke_proof();
        settle(ms(600)).await;
        assert_eq!(h.spawned(), 1, "restarted on an unproven lock");
        // The term's end follows; a new term restarts COMMAND.
        h.demote(&control);
        let _next = h.grant();
        settle(ms(10)).await;
        assert_eq!(h.spawned(), 2);
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        let _ = h.exit_status().await;
    });
}

#[test]
fn a_tick_or_a_takeover_delay_after_the_proof_lapsed_starts_nothing() {
    paused(|| async {
        let mode = Mode::Every { period: ms(300) };
        let mut h = Harness::start(plan(mode), job(Life::dies_after(ms(1))));
        let control = h.grant();
        settle(ms(310)).await;
        assert_eq!(h.spawned(), 1);
        h.exit(h.last_pid(), 0);
        settle(ms(10)).await;
        control.revoke_proof();
        settle(ms(1000)).await;
        assert_eq!(h.spawned(), 1, "a tick ran on an unproven lock");
        h.signal(Signal::SIGTERM);
        assert_eq!(h.exit_status().await, Exit::Code(0));
    });
    paused(|| async {
        let mut p = plan(WHILE_LEADER);
        p.takeover_delay = ms(500);
        let mut h = Harness::start(p, job(Life::dies_after(ms(1))));
        let control = h.grant();
        settle(ms(100)).await;
        control.revoke_proof();
        settle(ms(1000)).await;
        assert_eq!(
            h.spawned(),
            0,
            "started after the takeover delay on an unproven lock"
        );
        h.signal(Signal::SIGTERM);
        assert_eq!(h.exit_status().await, Exit::Code(0));
    });
}

#[test]
fn a_tick_that_falls_due_during_the_takeover_delay_runs_when_it_ends() {
    // Ticks at 0, 300, 600 ms…; the grant at 50 ms, after the first tick (a standby's).
    paused(|| async {
        let mut p = plan(Mode::Every { period: ms(300) });
        p.takeover_delay = ms(500);
        let mut h = Harness::start(p, job(Life::dies_after(ms(1))));
        settle(ms(50)).await;
        let _control = h.grant();
        // The tick at 300 ms falls in the delay (50–550 ms): nothing runs yet…
        settle(ms(400)).await;
        assert_eq!(h.spawned(), 0, "ran during the takeover delay");
        // …and it runs when the delay ends, before the next tick at 600 ms.
        settle(ms(130)).await;
        assert_eq!(h.spawned(), 1, "the tick of the delay was dropped");
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        let _ = h.exit_status().await;
    });
    paused(|| async {
        // No tick in the delay (50–250 ms): the first run is the tick at 300 ms.
        let mut p = plan(Mode::Every { period: ms(300) });
        p.takeover_delay = ms(200);
        let mut h = Harness::start(p, job(Life::dies_after(ms(1))));
        settle(ms(50)).await;
        let _control = h.grant();
        settle(ms(230)).await;
        assert_eq!(h.spawned(), 0, "ran at the end of a delay no tick fell in");
        settle(ms(50)).await;
        assert_eq!(h.spawned(), 1);
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        let _ = h.exit_status().await;
    });
}

#[test]
fn a_running_child_whose_proof_lapsed_is_stopped_at_the_next_event() {
    paused(|| async {
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::dies_after(ms(10))));
        let control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        control.revoke_proof();
        // Any event (here the slow reap timer) finds the lapse before anything else.
        settle(ms(1100)).await;
        assert_eq!(h.signals_to(pid), ["SIGTERM", "SIGCONT"]);
        assert!(!h.alive(pid));
        assert_eq!(control.holds(), 0);
        h.signal(Signal::SIGTERM);
        assert_eq!(h.exit_status().await, Exit::Code(0));
    });
}

/// A COMMAND that exits at once but leaves a helper that ignores TERM.
fn leaves_a_stubborn_helper() -> Proc {
    Proc {
        main: Life::dies_after(ms(1)),
        helper: Some(Life::ignores_term()),
        fenced: false,
    }
}

#[test]
fn term_while_stopping_leftovers_is_not_lost() {
    // --restart always: no restart after the stop.
    paused(|| async {
        let mode = Mode::WhileLeader {
            restart: Restart::Always,
        };
        let mut h = Harness::start(plan(mode), leaves_a_stubborn_helper());
        let _control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        h.exit(pid, 0);
        settle(ms(100)).await;
        assert_eq!(
            h.signals_to(pid),
            ["SIGTERM", "SIGCONT"],
            "leftovers get the stop signal"
        );
        h.signal(Signal::SIGTERM);
        let exit = h.exit_status().await;
        assert_eq!(exit, Exit::Code(0));
    });
    // --every: no further tick.
    paused(|| async {
        let mut h = Harness::start(
            plan(Mode::Every { period: ms(300) }),
            leaves_a_stubborn_helper(),
        );
        let _control = h.grant();
        settle(ms(310)).await;
        h.exit(h.last_pid(), 0);
        settle(ms(50)).await;
        h.signal(Signal::SIGTERM);
        let world = h.world.clone();
        let exit = h.exit_status().await;
        assert_eq!(exit, Exit::Code(0));
        assert_eq!(world.lock().unwrap().spawns().len(), 1);
    });
    // --once --min-hold: does not sit out the hold.
    paused(|| async {
        let mode = Mode::OneShot {
            wait: None,
            min_hold: Duration::from_secs(3600),
        };
        let mut h = Harness::start(plan(mode), leaves_a_stubborn_helper());
        let _control = h.grant();
        settle(ms(10)).await;
        h.exit(h.last_pid(), 7);
        settle(ms(50)).await;
        h.signal(Signal::SIGTERM);
        let started = Instant::now();
        let exit = h.exit_status().await;
        assert!(started.elapsed() <= GRACE + ms(100), "sat out the hold");
        assert_eq!(exit, Exit::Child(ExitStatus::Code(7)));
    });
}

#[test]
fn term_during_a_back_off_a_takeover_delay_or_a_hold_ends_at_once() {
    for case in 0..3 {
        paused(|| async move {
            let mut p = plan(Mode::WhileLeader {
                restart: Restart::Always,
            });
            if case == 1 {
                p.takeover_delay = Duration::from_secs(60);
            }
            if case == 2 {
                p.mode = Mode::OneShot {
                    wait: None,
                    min_hold: Duration::from_secs(60),
                };
            }
            let mut h = Harness::start(p, job(Life::dies_after(ms(1))));
            let control = h.grant();
            settle(ms(10)).await;
            if case != 1 {
                h.exit(h.last_pid(), 0);
                settle(ms(10)).await;
            }
            h.signal(Signal::SIGTERM);
            let started = Instant::now();
            let spawned_before = h.spawned();
            let world = h.world.clone();
            let exit = h.exit_status().await;
            assert!(started.elapsed() < ms(50), "case {case}: shutdown waited");
            assert_eq!(world.lock().unwrap().spawns().len(), spawned_before);
            let want = if case == 2 {
                Exit::Child(ExitStatus::Code(0))
            } else {
                Exit::Code(0)
            };
            assert_eq!(exit, want, "case {case}");
            drop(control);
        });
    }
}

#[test]
fn a_second_term_signal_kills_at_once() {
    paused(|| async {
        let mut h = Harness::start(plan(WHILE_LEADER), job(Life::ignores_term()));
        let _control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        h.signal(Signal::SIGINT);
        settle(ms(100)).await;
        assert!(h.alive(pid));
        h.signal(Signal::SIGTERM);
        settle(ms(50)).await;
        assert!(!h.alive(pid));
        // INT was passed on as received, not replaced by the stop signal.
        assert_eq!(h.signals_to(pid), ["SIGINT", "SIGCONT", "SIGKILL"]);
        assert_eq!(
            h.exit_status().await,
            Exit::Child(ExitStatus::Signal(Signal::SIGKILL))
        );
    });
}

#[test]
fn a_stop_is_bounded_even_when_the_tree_never_empties() {
    paused(|| async {
        // The helper survives SIGKILL too (uninterruptible sleep, or unreachable without /proc).
        #[derive(Debug)]
        struct Immortal;
        impl Tree for Immortal {
            fn pid(&self) -> u32 {
                1
            }
            fn signal_group(&mut self, _: Signal) {}
            fn signal_all(&mut self, _: Signal) {}
            fn poll(&mut self) -> TreeState {
                TreeState::default()
            }
        }
        struct Spawns;
        impl Spawner for Spawns {
            fn spawn(
                &mut self,
                _: &[(&'static str, String)],
                _: Option<Announcement<'_>>,
                _: Option<Duration>,
            ) -> Result<Box<dyn Tree>, SpawnError> {
                Ok(Box::new(Immortal))
            }
            fn reap_strays(&mut self) {}
        }
        let (signals, stream) = SignalStream::channel();
        let election = Arc::new(FakeElection {
            terms: watch::channel(ended_term()).0,
            checks: watch::channel(Checks::default()).0,
        });
        let timing = Timing::new(ms(200), GRACE);
        let supervisor = Supervisor::new(
            plan(WHILE_LEADER),
            FakeSource(election.clone()),
            Spawns,
            stream,
            None,
            Metrics::new(),
            Arc::new(Health::new(&timing)),
        );
        let task = tokio::task::spawn_local(supervisor.run());
        let (term, control) = Term::issue(1, None, boottime() + Duration::from_secs(3600));
        election.terms.send_replace(term);
        settle(ms(10)).await;
        signals.send(Signal::SIGTERM).unwrap();
        let started = Instant::now();
        let exit = task.await.unwrap();
        let took = started.elapsed();
        assert!(
            took <= GRACE + crate::supervisor::KILL_WAIT + ms(100),
            "{took:?}"
        );
        assert_eq!(exit, Exit::Child(ExitStatus::Signal(Signal::SIGKILL)));
        assert_eq!(control.holds(), 0);
    });
}

#[test]
fn once_exits_with_the_conflict_code_when_refused_and_with_125_when_unreachable() {
    paused(|| async {
        let h = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(1))),
        );
        h.election.checks.send_modify(|c| {
            c.total = 1;
            c.refused = 1;
            c.last = Some(crate::CheckOutcome::Refused);
        });
        assert_eq!(h.exit_status().await, Exit::Code(3));
    });
    paused(|| async {
        let h = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(1))),
        );
        h.election.checks.send_modify(|c| {
            c.total = 1;
            c.failed = 1;
            c.last = Some(crate::CheckOutcome::Failed);
        });
        assert_eq!(h.exit_status().await, Exit::Code(125));
    });
}

/// The watchdog stopped the tree although the term was proven (it knew only the proof before
/// the last check: leaderrun was stopped right after it). The supervisor gives the term up;
/// once the campaign ends it, a one-shot exits with the conflict code, not with the watchdog's
/// signal as COMMAND's own status (before, that came after a 5 s hold-back, with the lock
/// held all the while).
#[test]
fn a_tree_the_watchdog_stopped_on_a_proven_term_gives_the_term_up() {
    paused(|| async {
        let mut h = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(60_000))),
        );
        let control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        {
            let mut world = h.world.lock().unwrap();
            let p = world.procs.get_mut(&pid).unwrap();
            p.main.status = Some(ExitStatus::Signal(Signal::SIGTERM));
            p.fenced = true;
        }
        h.signal(Signal::SIGCHLD);
        settle(ms(10)).await;
        assert!(control.term().is_given_up(), "the term is given up at once");
        assert!(!control.term().is_proven(), "and holds no work any more");
        // Not waiting for the campaign to end it (a check interval away, longer than any
        // hold-back): the tree's end is a demotion now.
        assert_eq!(h.exit_status().await, Exit::Code(3));
    });
}

#[test]
fn once_lost_mid_run_stops_the_child_then_exits_with_the_conflict_code() {
    paused(|| async {
        let mut h = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(300))),
        );
        let control = h.grant();
        settle(ms(10)).await;
        let pid = h.last_pid();
        h.demote(&control);
        settle(ms(100)).await;
        assert_eq!(control.holds(), 1);
        let world = h.world.clone();
        let exit = h.exit_status().await;
        assert!(!world.lock().unwrap().alive(pid));
        assert_eq!(control.holds(), 0);
        assert_eq!(exit, Exit::Code(3));
    });
}

#[test]
fn every_ticks_never_overlap_and_a_spawn_failure_is_a_failed_tick() {
    paused(|| async {
        let mut h = Harness::start(
            plan(Mode::Every { period: ms(100) }),
            job(Life::dies_after(ms(1))),
        );
        let _control = h.grant();
        // The first run outlasts three periods: those ticks are skipped, not stacked.
        settle(ms(110)).await;
        assert_eq!(h.spawned(), 1);
        settle(ms(300)).await;
        assert_eq!(h.spawned(), 1, "ticks overlapped");
        h.exit(h.last_pid(), 0);
        settle(ms(150)).await;
        assert_eq!(h.spawned(), 2);
        h.signal(Signal::SIGTERM);
        settle(ms(10)).await;
        let _ = h.exit_status().await;
    });
    paused(|| async {
        let mut h = Harness::start_with(
            plan(Mode::Every { period: ms(100) }),
            job(Life::default()),
            true,
        );
        let _control = h.grant();
        settle(ms(350)).await;
        h.signal(Signal::SIGTERM);
        assert_eq!(
            h.exit_status().await,
            Exit::Code(0),
            "a failed tick ended the ticker"
        );
    });
}

#[test]
fn a_child_exit_seen_after_a_freeze_counts_as_a_demotion() {
    // On resume, the first event is the child's exit (its watchdog stopped it meanwhile): the
    // lapse is seen before the exit is handled, so a one-shot does not report success.
    paused(|| async {
        let mut h = Harness::start(
            plan(Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO,
            }),
            job(Life::dies_after(ms(1))),
        );
        let control = h.grant();
        settle(ms(10)).await;
        control.revoke_proof();
        h.exit(h.last_pid(), 0);
        assert_eq!(h.exit_status().await, Exit::Code(3));
    });
}

// The policies alone.

#[test]
fn backoff_doubles_to_the_cap_and_resets_after_a_long_run() {
    let mut backoff = Backoff::default();
    let short = Duration::from_millis(10);
    let delays: Vec<Duration> = (0..9).map(|_| backoff.after_run(short)).collect();
    let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
    assert_eq!(
        ms,
        [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
    );
    assert_eq!(backoff.after_run(BACKOFF_RESET_AFTER), BACKOFF_INITIAL);
    assert_eq!(backoff.after_run(short), BACKOFF_INITIAL * 2);
}

#[test]
fn restart_policies() {
    let ok = Some(ExitStatus::Code(0));
    let failed = Some(ExitStatus::Code(1));
    let killed = Some(ExitStatus::Signal(Signal::SIGKILL));
    assert!(!Restart::Never.restarts(failed));
    assert!(Restart::Always.restarts(ok));
    assert!(!Restart::OnFailure.restarts(ok));
    assert!(Restart::OnFailure.restarts(failed));
    assert!(Restart::OnFailure.restarts(killed));
    assert!(Restart::OnFailure.restarts(None), "a timeout is a failure");
}
