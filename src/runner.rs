//! The modes (contract §4): tie the [`Elector`] to the [`Child`].
//!
//! One mechanism, [`Supervisor`], with three waits every mode is built from:
//!
//! * `Supervisor::campaign` waits as a standby until a term begins, a one-shot's check or
//!   deadline is done, or INT/TERM arrives;
//! * `Supervisor::hold` keeps leading without a child until a time (takeover delay, minimum
//!   hold, restart back-off) or the next tick, or until the term ends;
//! * `Supervisor::run_command` runs COMMAND once inside a term and reports why it ended:
//!   it exited (what is left of its group is stopped too), the term ended, `--timeout`, or
//!   INT/TERM (forwarded, then stop).
//!
//! Each of them handles every signal the same way: SIGCHLD reaps, INT/TERM shut down, the
//! others go to the child's group while there is one. The modes are short loops over them:
//! `Supervisor::while_leader`, `Supervisor::one_shot`, `Supervisor::every`.
//!
//! The binary runs this on a current-thread runtime on the main thread, which is therefore the
//! thread that forks every child and lives as long as they do (`PR_SET_PDEATHSIG`).

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::child::{self, Child, Command, ExitStatus, SpawnError};
use crate::cli::{Action, Cli, Mode, Restart, Settings, EXIT_FAILURE};
use crate::elector::{CheckOutcome, Config, Elector, Term, TermEnd};
use crate::error::Chain;
use crate::health::Health;
use crate::http::Observed;
use crate::metrics::{self, ChildExit, Metrics};
use crate::signals::{is_forwarded, is_shutdown, suspend_self, SignalStream};
use crate::terminal::Terminal;

/// How leaderrun ends; [`Exit::finish`] turns it into the process exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// COMMAND's status is leaderrun's status (contract §6).
    Child(ExitStatus),
    /// A status of leaderrun's own: 0 (stopped while standby), the conflict code, 124
    /// (`--timeout`), 125, 126, 127.
    Code(u8),
}

impl Exit {
    /// The process exit code. For a child that died of SIGINT, when leaderrun is not PID 1,
    /// leaderrun first dies of SIGINT itself so a calling shell loop stops (FIELD-NOTES child 8);
    /// should that return, 130 is the fallback.
    pub fn finish(self) -> std::process::ExitCode {
        match self {
            Exit::Child(ExitStatus::Signal(Signal::SIGINT)) if std::process::id() != 1 => {
                let _ = signal_hook::low_level::emulate_default_handler(libc::SIGINT);
                std::process::ExitCode::from(130)
            }
            Exit::Child(status) => std::process::ExitCode::from(status.exit_code()),
            Exit::Code(code) => std::process::ExitCode::from(code),
        }
    }
}

/// Runs the binary's default mode from parsed arguments and the signal handlers `main`
/// installed first (FIELD-NOTES child 1): resolve the connection, resolve COMMAND, claim the
/// terminal, become a subreaper, then campaign on a current-thread runtime. Errors are logged;
/// the result is the exit status of contract §6.
pub fn main(cli: Cli, signals: SignalStream) -> Exit {
    let settings = match cli.settings(&|name| std::env::var(name).ok()) {
        Ok(settings) => settings,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(EXIT_FAILURE);
        }
    };
    let bound = elector_config(&settings).io_bound();
    match cli.action {
        Some(Action::Status { json }) => {
            return Exit::Code(crate::status::status_main(
                &settings.connect,
                &settings.tls,
                settings.lock,
                bound,
                json,
            ))
        }
        Some(Action::Doctor) => {
            return Exit::Code(crate::status::doctor_main(
                &settings.connect,
                &settings.tls,
                settings.lock,
                bound,
            ))
        }
        None => {}
    }
    // COMMAND is looked up before campaigning: a typo must not wait silently as a standby.
    let path = std::env::var_os("PATH");
    let command = match Command::resolve(settings.command.clone(), path.as_deref()) {
        Ok(command) => command,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(err.exit_code());
        }
    };
    child::kill_on_panic();
    // Decided before anything is spawned: only a leaderrun that owns the terminal's foreground
    // at start hands it to its children.
    let terminal = Terminal::claim();
    if let Err(err) = child::become_subreaper() {
        warn!("cannot become a child subreaper; orphans of COMMAND will not be stopped: {err}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            error!("cannot start the async runtime: {}", Chain(&err));
            return Exit::Code(EXIT_FAILURE);
        }
    };
    runtime.block_on(run(settings, command, signals, terminal))
}

/// The elector configuration for `settings`.
pub fn elector_config(settings: &Settings) -> Config {
    let mut config = Config::new(settings.connect.clone());
    config.tls = settings.tls.clone();
    config.lock = settings.lock;
    config.check_interval = settings.check_interval;
    config.idle_session_timeout = Some(settings.idle_session_timeout);
    // Standbys wait in the lock queue, so a release reaches them at once (contract §8); a
    // `--once` check must not wait.
    config.wait_for_release = !matches!(settings.mode, Mode::OneShot { wait: None, .. });
    config
}

/// Exit status when `--timeout` stopped COMMAND, as `timeout(1)` has it (contract §6).
pub const EXIT_TIMEOUT: u8 = 124;

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

impl Restart {
    /// Whether a run that ended with `status` (or timed out: `None`) is started again.
    fn restarts(self, status: Option<ExitStatus>) -> bool {
        match self {
            Restart::Never => false,
            Restart::Always => true,
            Restart::OnFailure => !status.is_some_and(ExitStatus::success),
        }
    }
}

/// Runs the mode `settings` selects; returns the exit status of contract §6.
pub async fn run(
    settings: Settings,
    command: Command,
    signals: SignalStream,
    terminal: Option<Terminal>,
) -> Exit {
    let metrics = Metrics::new();
    let mut config = elector_config(&settings);
    config.registry = Some(metrics.registry().clone());
    let elector = match Elector::new(config) {
        Ok(elector) => elector,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(EXIT_FAILURE);
        }
    };
    let health = Arc::new(Health::new(settings.check_interval));
    log_settings(&settings, &command);
    // Probes come up before the first check, on threads of their own.
    if let Some(addr) = settings.http_addr {
        let observed = Observed {
            elector: elector.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
        };
        match crate::http::serve(addr, observed) {
            Ok(bound) if matches!(settings.mode, Mode::OneShot { .. }) => {
                debug!(addr = %bound, "serving /metrics, /healthz and /readyz")
            }
            Ok(bound) => info!(addr = %bound, "serving /metrics, /healthz and /readyz"),
            Err(err) => {
                error!("{}", Chain(&err));
                return Exit::Code(EXIT_FAILURE);
            }
        }
    }
    let notifier = tokio::spawn(crate::notify::follow(elector.clone(), health.clone()));
    let mode = settings.mode;
    let mut supervisor = Supervisor {
        settings,
        command,
        signals,
        terminal,
        election: Election::start(elector),
        reap_timer: tokio::time::interval(Duration::from_secs(1)),
        metrics,
        health,
    };
    let exit = match mode {
        Mode::WhileLeader { restart } => supervisor.while_leader(restart).await,
        Mode::OneShot { wait, min_hold } => supervisor.one_shot(wait, min_hold).await,
        Mode::Every { period } => supervisor.every(period).await,
    };
    crate::notify::stopping();
    notifier.abort();
    supervisor.election.stop().await;
    exit
}

/// The one INFO line with the effective settings at start (DEBUG for a one-shot, which must
/// print nothing when it does not lead). The password is never part of it.
fn log_settings(settings: &Settings, command: &Command) {
    let mode = match settings.mode {
        Mode::WhileLeader { restart } => {
            format!("while-leader, restart {restart:?}").to_lowercase()
        }
        Mode::OneShot {
            wait: None,
            min_hold,
        } => {
            format!("once, min-hold {}", humantime::format_duration(min_hold))
        }
        Mode::OneShot {
            wait: Some(wait),
            min_hold,
        } => format!(
            "wait {}, min-hold {}",
            humantime::format_duration(wait),
            humantime::format_duration(min_hold)
        ),
        Mode::Every { period } => format!("every {}", humantime::format_duration(period)),
    };
    let dur = |d: Duration| humantime::format_duration(d).to_string();
    let server = crate::conninfo::endpoint(&settings.connect);
    let app = settings.connect.get_application_name().unwrap_or("");
    let timeout = settings.timeout.map(dur).unwrap_or_else(|| "none".into());
    let http = settings
        .http_addr
        .map(|a| a.to_string())
        .unwrap_or_else(|| "off".into());
    let program = command.program().display().to_string();
    macro_rules! settings_line {
        ($level:ident) => {
            tracing::$level!(
                mode = %mode,
                server = %server,
                application_name = %app,
                lock = %settings.lock,
                check_interval = %dur(settings.check_interval),
                grace = %dur(settings.grace),
                stop_signal = settings.stop_signal.as_str(),
                idle_session_timeout = %dur(settings.idle_session_timeout),
                takeover_delay = %dur(settings.takeover_delay),
                timeout = %timeout,
                http_addr = %http,
                command = %program,
                "campaigning for the background leader lock"
            )
        };
    }
    if matches!(settings.mode, Mode::OneShot { .. }) {
        settings_line!(debug);
    } else {
        settings_line!(info);
    }
}

/// The election task and the token that stops it.
struct Election {
    elector: Elector,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), crate::Error>>,
    done: bool,
}

impl Election {
    fn start(elector: Elector) -> Election {
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let elector = elector.clone();
            let cancel = cancel.clone();
            async move { elector.run(cancel).await }
        });
        Election {
            elector,
            cancel,
            task,
            done: false,
        }
    }

    /// Resolves if the election task ends on its own (it only should when cancelled).
    async fn failed(&mut self) -> String {
        if self.done {
            return std::future::pending().await;
        }
        let result = (&mut self.task).await;
        self.done = true;
        match result {
            Ok(Ok(())) => "it returned".to_owned(),
            Ok(Err(err)) => Chain(&err).to_string(),
            Err(err) => err.to_string(),
        }
    }

    /// Cancels the election (end term, unlock, close) and waits for it to finish.
    async fn stop(&mut self) {
        self.cancel.cancel();
        if !self.done {
            self.done = true;
            if let Err(err) = (&mut self.task).await {
                error!("the election task failed: {err}");
            }
        }
    }
}

/// The environment COMMAND gets on top of the inherited one (contract §5).
fn child_env(term: &Term) -> Vec<(&'static str, String)> {
    let mut env = vec![("LEADERRUN_TERM", term.number().to_string())];
    if let Some(lease) = term.lease() {
        env.push(("LEADERRUN_LOCK", lease.lock.to_string()));
        env.push(("LEADERRUN_FENCING_TOKEN", lease.fencing_token.to_string()));
        env.push(("LEADERRUN_BACKEND_PID", lease.backend_pid.to_string()));
    }
    env
}

/// What `Supervisor::campaign` waits for.
#[derive(Clone, Copy, Debug)]
enum Until {
    /// A term (default mode, `--every`).
    Term,
    /// A term, or the first check's refusal or failure (`--once`).
    FirstCheck,
    /// A term, or this moment (`--wait`).
    Deadline(Instant),
}

/// How a campaign ended.
enum Campaigned {
    Leading(Term),
    /// INT/TERM while standby.
    Shutdown,
    /// `--once`/`--wait`: the lock was held elsewhere.
    NotLeading,
    /// `--once`/`--wait`: no check reached the server; the latest error.
    Unreachable(String),
    /// The election task ended by itself (a bug or a panic).
    ElectionFailed,
}

/// How a `Supervisor::hold` ended.
enum Held {
    /// The time came.
    Elapsed,
    /// The ticker ticked.
    Tick,
    /// The term ended.
    Lost,
    /// INT/TERM.
    Shutdown,
}

/// Why one run of COMMAND ended; `shutdown` is an INT/TERM that arrived while it was being
/// stopped for another reason (it was forwarded; the caller should exit afterwards).
enum RunEnd {
    /// COMMAND exited on its own (what was left of its group has been stopped).
    Exited(ExitStatus),
    /// The term ended; COMMAND was stopped.
    Demoted {
        status: ExitStatus,
        shutdown: Option<Signal>,
    },
    /// `--timeout` passed; COMMAND was stopped.
    TimedOut {
        status: ExitStatus,
        shutdown: Option<Signal>,
    },
    /// INT/TERM: forwarded, COMMAND stopped.
    Shutdown(ExitStatus),
    /// COMMAND could not be started.
    SpawnFailed(SpawnError),
}

/// The one mechanism under every mode: the election, the child, the signals, the terminal.
pub struct Supervisor {
    settings: Settings,
    command: Command,
    signals: SignalStream,
    terminal: Option<Terminal>,
    election: Election,
    /// Reaps on a slow timer too, since SIGCHLD coalesces (FIELD-NOTES child 6).
    reap_timer: Interval,
    metrics: Metrics,
    health: Arc<Health>,
}

/// The next tick of an optional ticker; pending forever without one.
async fn next_tick(ticker: &mut Option<&mut Interval>) {
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

impl Supervisor {
    /// A signal while there is no child: INT/TERM mean shutdown (returns true); TSTP suspends
    /// leaderrun; SIGCHLD reaps leftovers; the rest have nobody to go to.
    fn no_child_signal(sig: Signal) -> bool {
        if is_shutdown(sig) {
            info!(
                signal = sig.as_str(),
                "received {}; shutting down",
                sig.as_str()
            );
            return true;
        }
        match sig {
            Signal::SIGTSTP => suspend_self(),
            Signal::SIGCHLD => {
                child::reap(None);
            }
            _ => debug!(
                signal = sig.as_str(),
                "no child to pass {} to",
                sig.as_str()
            ),
        }
        false
    }

    /// Waits as a standby (see [`Until`]). Ticks of `ticker` are standby ticks: nothing runs.
    async fn campaign(&mut self, until: Until, mut ticker: Option<&mut Interval>) -> Campaigned {
        let elector = self.election.elector.clone();
        let mut checks = elector.watch_checks();
        let deadline = match until {
            Until::Deadline(at) => Some(at),
            _ => None,
        };
        loop {
            tokio::select! {
                biased;
                sig = self.signals.recv() => {
                    if Self::no_child_signal(sig) {
                        return Campaigned::Shutdown;
                    }
                }
                _ = self.reap_timer.tick() => {
                    child::reap(None);
                }
                reason = self.election.failed() => {
                    error!("the election stopped unexpectedly: {reason}");
                    return Campaigned::ElectionFailed;
                }
                term = elector.wait_for_term() => {
                    // A signal that arrived while the term was being granted is acted on
                    // before any child exists (FIELD-NOTES child 1).
                    while let Some(sig) = self.signals.try_recv() {
                        if Self::no_child_signal(sig) {
                            return Campaigned::Shutdown;
                        }
                    }
                    if !term.is_ended() {
                        return Campaigned::Leading(term);
                    }
                }
                changed = checks.changed(), if matches!(until, Until::FirstCheck) => {
                    let seen = checks.borrow_and_update().clone();
                    if changed.is_ok() && seen.total > 0 && seen.last != Some(CheckOutcome::Granted) {
                        return if seen.refused > 0 {
                            Campaigned::NotLeading
                        } else {
                            Campaigned::Unreachable(seen.last_error.unwrap_or_default())
                        };
                    }
                }
                () = sleep_until(deadline) => {
                    let seen = elector.checks();
                    if elector.is_leader() {
                        continue;
                    }
                    // A standby may still be waiting in the lock queue when the wait is over: what
                    // counts is whether the server was reached at all (contract §4).
                    return if seen.sessions_opened == 0 {
                        Campaigned::Unreachable(seen.last_error.unwrap_or_else(|| {
                            "could not connect within --wait".to_owned()
                        }))
                    } else {
                        Campaigned::NotLeading
                    };
                }
                () = next_tick(&mut ticker) => {
                    debug!("tick: standby, nothing to run");
                    self.metrics.tick(metrics::Tick::Standby);
                }
            }
        }
    }

    /// Leads without a child until `until` (or forever), the next tick of `ticker`, the end of
    /// the term, or INT/TERM.
    async fn hold(
        &mut self,
        term: &Term,
        until: Option<Instant>,
        mut ticker: Option<&mut Interval>,
    ) -> Held {
        loop {
            tokio::select! {
                biased;
                sig = self.signals.recv() => {
                    if Self::no_child_signal(sig) {
                        return Held::Shutdown;
                    }
                }
                _ = term.ended() => return Held::Lost,
                _ = self.reap_timer.tick() => {
                    child::reap(None);
                }
                () = sleep_until(until) => return Held::Elapsed,
                () = next_tick(&mut ticker) => return Held::Tick,
            }
        }
    }

    /// Waits out `--takeover-delay` at the start of a term, still verifying the lock.
    async fn takeover_delay(&mut self, term: &Term) -> Held {
        let delay = self.settings.takeover_delay;
        if delay.is_zero() {
            return Held::Elapsed;
        }
        info!(term = term.number(), delay = %humantime::format_duration(delay), "takeover delay: verifying the lock before COMMAND starts");
        self.hold(term, Some(Instant::now() + delay), None).await
    }

    /// Runs COMMAND once inside `term`. Ticks of `ticker` that fall due meanwhile are skipped
    /// and logged: runs never overlap.
    async fn run_command(&mut self, term: &Term, mut ticker: Option<&mut Interval>) -> RunEnd {
        let mut child = match Child::spawn(&self.command, &child_env(term), self.terminal.as_ref())
        {
            Ok(child) => child,
            Err(err) => return RunEnd::SpawnFailed(err),
        };
        info!(pid = child.pid(), term = term.number(), "child started");
        self.metrics.child_started();
        let timeout_at = self.settings.timeout.map(|t| Instant::now() + t);
        let (stop_signal, grace) = (self.settings.stop_signal, self.settings.grace);
        let end = loop {
            if let Some(status) = child.status() {
                info!(pid = child.pid(), status = %status, term = term.number(), "child exited");
                // Helpers it left running are stopped before anything else happens.
                let stopped = child
                    .stop(stop_signal, grace, false, &mut self.signals)
                    .await;
                break RunEnd::Exited(stopped.status);
            }
            self.job_control(&mut child);
            tokio::select! {
                biased;
                sig = self.signals.recv() => {
                    if sig == Signal::SIGCHLD {
                        child.reap();
                    } else if is_shutdown(sig) {
                        info!(signal = sig.as_str(), pid = child.pid(), "received {}; stopping the child", sig.as_str());
                        let stopped = child.stop(sig, grace, true, &mut self.signals).await;
                        info!(pid = child.pid(), status = %stopped.status, "child stopped");
                        break RunEnd::Shutdown(stopped.status);
                    } else if is_forwarded(sig) || sig == Signal::SIGTSTP {
                        child.signal_group(sig);
                    }
                }
                cause = term.ended() => {
                    let how = if cause == TermEnd::LeadershipLost { "leadership lost" } else { "leadership released" };
                    info!(pid = child.pid(), term = term.number(), "{how}; stopping the child");
                    let stopped = child.stop(stop_signal, grace, false, &mut self.signals).await;
                    info!(pid = child.pid(), status = %stopped.status, term = term.number(), "child stopped after demotion");
                    break RunEnd::Demoted { status: stopped.status, shutdown: stopped.shutdown };
                }
                () = sleep_until(timeout_at) => {
                    let limit = humantime::format_duration(self.settings.timeout.unwrap_or_default());
                    warn!(pid = child.pid(), term = term.number(), "COMMAND ran longer than --timeout {limit}; stopping it");
                    let stopped = child.stop(stop_signal, grace, false, &mut self.signals).await;
                    info!(pid = child.pid(), status = %stopped.status, "child stopped after the timeout");
                    break RunEnd::TimedOut { status: stopped.status, shutdown: stopped.shutdown };
                }
                _ = self.reap_timer.tick() => {
                    child.reap();
                }
                () = next_tick(&mut ticker) => {
                    info!(pid = child.pid(), "tick skipped: the previous run is still going");
                    self.metrics.tick(metrics::Tick::Skipped);
                }
            }
        };
        if let Some(terminal) = &self.terminal {
            terminal.take_back();
        }
        self.record(term, &end);
        end
    }

    /// Counts a run's end and keeps readiness (the seed's table) up to date.
    fn record(&self, term: &Term, end: &RunEnd) {
        match end {
            RunEnd::Exited(status) if status.success() => {
                self.metrics.child_exited(ChildExit::Success);
                self.health.run_succeeded();
            }
            RunEnd::Exited(status) => {
                self.metrics.child_exited(ChildExit::Failure);
                self.health
                    .run_failed(term.number(), format!("COMMAND exited with {status}"));
            }
            RunEnd::TimedOut { .. } => {
                self.metrics.child_exited(ChildExit::Stopped);
                let limit = humantime::format_duration(self.settings.timeout.unwrap_or_default());
                self.health.run_failed(
                    term.number(),
                    format!("COMMAND ran longer than --timeout {limit}"),
                );
            }
            RunEnd::Demoted { .. } | RunEnd::Shutdown(_) => {
                self.metrics.child_exited(ChildExit::Stopped);
            }
            RunEnd::SpawnFailed(err) => {
                self.health
                    .run_failed(term.number(), Chain(err).to_string());
            }
        }
    }

    /// Job control: a child stopped by Ctrl-Z (or by reading or writing the terminal it was
    /// given) suspends leaderrun too, so the calling shell sees the job stopped; `fg` continues
    /// leaderrun, which continues the child. A SIGSTOP from someone else is not ours to act on.
    fn job_control(&mut self, child: &mut Child) {
        let sig = match child.take_stop() {
            Some(Signal::SIGTSTP) => Signal::SIGTSTP,
            Some(sig @ (Signal::SIGTTIN | Signal::SIGTTOU)) if self.terminal.is_some() => sig,
            _ => return,
        };
        info!(
            pid = child.pid(),
            signal = sig.as_str(),
            "child suspended; suspending leaderrun"
        );
        if let Some(terminal) = &self.terminal {
            terminal.take_back();
        }
        suspend_self();
        if let Some(terminal) = &self.terminal {
            terminal.give_to(Pid::from_raw(child.pid() as i32));
        }
        child.signal_group(Signal::SIGCONT);
        info!(pid = child.pid(), "resumed; child continued");
    }

    /// Default mode: campaign; run COMMAND for each term; on demotion stop it and campaign
    /// again; exit when it exits on its own (unless `--restart` says otherwise) or on INT/TERM.
    async fn while_leader(&mut self, restart: Restart) -> Exit {
        loop {
            let term = match self.campaign(Until::Term, None).await {
                Campaigned::Leading(term) => term,
                Campaigned::Shutdown => return Exit::Code(0),
                _ => return Exit::Code(EXIT_FAILURE),
            };
            match self.takeover_delay(&term).await {
                Held::Shutdown => return Exit::Code(0),
                Held::Lost => continue,
                Held::Elapsed | Held::Tick => {}
            }
            let mut backoff = Backoff::default();
            loop {
                let started = Instant::now();
                let status = match self.run_command(&term, None).await {
                    RunEnd::SpawnFailed(err) => {
                        error!("{}", Chain(&err));
                        return Exit::Code(err.exit_code());
                    }
                    RunEnd::Shutdown(status) => return Exit::Child(status),
                    RunEnd::Demoted { status, shutdown } => {
                        if shutdown.is_some() {
                            return Exit::Child(status);
                        }
                        break;
                    }
                    RunEnd::TimedOut { status, shutdown } => {
                        if shutdown.is_some() {
                            return Exit::Child(status);
                        }
                        if !restart.restarts(None) {
                            return Exit::Code(EXIT_TIMEOUT);
                        }
                        status
                    }
                    RunEnd::Exited(status) => {
                        if !restart.restarts(Some(status)) {
                            return Exit::Child(status);
                        }
                        status
                    }
                };
                let delay = backoff.after_run(started.elapsed());
                info!(term = term.number(), last = %status, delay = %humantime::format_duration(delay), "restarting COMMAND after the back-off");
                match self.hold(&term, Some(Instant::now() + delay), None).await {
                    // Nothing runs during the back-off: stopped on request, like a standby.
                    Held::Shutdown => return Exit::Code(0),
                    Held::Lost => break,
                    Held::Elapsed | Held::Tick => {}
                }
            }
        }
    }

    /// `--once` / `--wait`: lead once, run COMMAND to its end, keep the lock for `min_hold`
    /// after the grant; else exit with the conflict code.
    async fn one_shot(&mut self, wait: Option<Duration>, min_hold: Duration) -> Exit {
        let conflict = Exit::Code(self.settings.conflict_exit_code);
        let until = match wait {
            Some(wait) => Until::Deadline(Instant::now() + wait),
            None => Until::FirstCheck,
        };
        let term = match self.campaign(until, None).await {
            Campaigned::Leading(term) => term,
            Campaigned::NotLeading => {
                debug!("another session holds the lock; COMMAND does not run");
                return conflict;
            }
            Campaigned::Unreachable(cause) => {
                error!("could not check the lock: {cause}");
                return Exit::Code(EXIT_FAILURE);
            }
            Campaigned::Shutdown => return Exit::Code(0),
            Campaigned::ElectionFailed => return Exit::Code(EXIT_FAILURE),
        };
        let granted = Instant::now();
        match self.takeover_delay(&term).await {
            Held::Shutdown => return Exit::Code(0),
            Held::Lost => {
                info!("leadership lost during the takeover delay; COMMAND does not run");
                return conflict;
            }
            Held::Elapsed | Held::Tick => {}
        }
        let status = match self.run_command(&term, None).await {
            RunEnd::SpawnFailed(err) => {
                error!("{}", Chain(&err));
                return Exit::Code(err.exit_code());
            }
            RunEnd::Shutdown(status) => return Exit::Child(status),
            RunEnd::Demoted { status, shutdown } => {
                if shutdown.is_some() {
                    return Exit::Child(status);
                }
                info!(status = %status, "leadership lost while COMMAND ran; it was stopped");
                return conflict;
            }
            RunEnd::TimedOut { status, shutdown } => {
                if shutdown.is_some() {
                    return Exit::Child(status);
                }
                return Exit::Code(EXIT_TIMEOUT);
            }
            RunEnd::Exited(status) => status,
        };
        let hold_until = granted + min_hold;
        if Instant::now() < hold_until {
            debug!(min_hold = %humantime::format_duration(min_hold), "keeping the lock for --min-hold");
            // Leadership lost meanwhile changes nothing: COMMAND has run.
            let _ = self.hold(&term, Some(hold_until), None).await;
        }
        Exit::Child(status)
    }

    /// `--every`: the seed's runLeaderTicker. While leading, run COMMAND once per period;
    /// never overlapping; a failed run is a failed tick and ticking goes on.
    async fn every(&mut self, period: Duration) -> Exit {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            let term = match self.campaign(Until::Term, Some(&mut ticker)).await {
                Campaigned::Leading(term) => term,
                Campaigned::Shutdown => return Exit::Code(0),
                _ => return Exit::Code(EXIT_FAILURE),
            };
            match self.takeover_delay(&term).await {
                Held::Shutdown => return Exit::Code(0),
                Held::Lost => continue,
                Held::Elapsed | Held::Tick => {}
            }
            loop {
                match self.hold(&term, None, Some(&mut ticker)).await {
                    Held::Shutdown => return Exit::Code(0),
                    Held::Lost => break,
                    Held::Tick | Held::Elapsed => {}
                }
                match self.run_command(&term, Some(&mut ticker)).await {
                    RunEnd::SpawnFailed(err) => {
                        warn!(term = term.number(), "tick failed: {}", Chain(&err));
                        self.metrics.tick(metrics::Tick::Failure);
                    }
                    RunEnd::Exited(status) if status.success() => {
                        debug!(term = term.number(), "tick succeeded");
                        self.metrics.tick(metrics::Tick::Success);
                    }
                    RunEnd::Exited(status) => {
                        warn!(term = term.number(), status = %status, "tick failed: COMMAND exited with {status}");
                        self.metrics.tick(metrics::Tick::Failure);
                    }
                    RunEnd::TimedOut { status, shutdown } => {
                        warn!(term = term.number(), status = %status, "tick failed: COMMAND ran longer than --timeout");
                        self.metrics.tick(metrics::Tick::Failure);
                        if shutdown.is_some() {
                            return Exit::Child(status);
                        }
                    }
                    RunEnd::Demoted { status, shutdown } => {
                        info!(term = term.number(), status = %status, "tick stopped: leadership lost (not a failure)");
                        self.metrics.tick(metrics::Tick::Interrupted);
                        if shutdown.is_some() {
                            return Exit::Child(status);
                        }
                        break;
                    }
                    RunEnd::Shutdown(status) => return Exit::Child(status),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
