//! The binary's default command: build the real parts and run the [`Supervisor`] on them.
//!
//! Begin a one-shot's connect, resolve COMMAND, claim the terminal, become a subreaper, start
//! the election on a current-thread runtime on the main thread (the thread that forks every
//! child and lives as long as they do, as `PR_SET_PDEATHSIG` needs), serve the probes, then
//! hand everything to the supervisor. The modes themselves live in [`crate::supervisor`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::exit_codes;
use crate::cli::health::Health;
use crate::cli::http::Observed;
use crate::cli::metrics::Metrics;
use crate::cli::{Mode, Settings};
use crate::elector::{Checks, Config, EarlyConnect, Elector, Term};
use crate::error::Chain;
use crate::history::{History, HistorySettings};
use crate::process::child::{self, Command, ProcessSpawner};
use crate::process::signals::SignalStream;
use crate::process::terminal::Terminal;
use crate::supervisor::{Election, Exit, Plan, Supervisor};
use crate::watchdog::{EarlyWatchdog, Watchdog, WatchdogPlan, WatchedSpawner};

/// What [`prepare`] did before the signal handlers exist: COMMAND looked up, and a one-shot's
/// connect begun.
pub struct Prepared {
    command: Result<Command, child::SpawnError>,
    early_connect: Option<Arc<EarlyConnect>>,
    /// `--http-addr` resolved, or why it could not be.
    http_addr: Option<Result<std::net::SocketAddr, String>>,
}

/// Looks COMMAND up (`PATH`), and for a one-shot whose COMMAND can run begins the connect to
/// its first host ([`EarlyConnect::start`]): the server starts its backend (most of a
/// connect's time) while the rest of start-up runs. A one-shot only: the other modes spread
/// their first check (a fleet started together must not connect at once). `main` calls it as
/// early as the settings exist.
///
/// Not for a COMMAND that cannot run: [`main`] exits 127 or 126 before any attempt, and a
/// session begun for nothing makes a server that asks for a password, or offers TLS, log a
/// lost client on every run of a mistyped cron job.
///
/// A host name in `--http-addr` is looked up here too: `main` runs this where a stop request
/// ends a wait for a resolver that does not answer (`signals::Blocked::stoppable`).
pub fn prepare(settings: &Settings) -> Prepared {
    let path = std::env::var_os("PATH");
    let command = if settings.shell {
        Command::shell(settings.command.clone())
    } else {
        Command::resolve(settings.command.clone(), path.as_deref())
    };
    let one_shot = matches!(settings.mode, Mode::OneShot { wait: None, .. });
    let early_connect = (one_shot && command.is_ok())
        .then(|| EarlyConnect::start(&settings.connect, &settings.tls))
        .flatten();
    let http_addr = settings.http_addr.as_ref().map(|addr| {
        addr.resolve()
            .map_err(|err| format!("--http-addr {addr}: {err}"))
    });
    Prepared {
        command,
        early_connect,
        http_addr,
    }
}

/// Runs the default command from checked settings, the signal handlers `main` installed
/// (docs/field-notes.md#handlers-before-anything-else), the watchdog it forked and what
/// [`prepare`] did. Errors are logged; the result is the exit status of
/// docs/guarantees.md#exit-codes.
pub fn main(
    settings: Settings,
    signals: SignalStream,
    early: Option<EarlyWatchdog>,
    prepared: Prepared,
) -> Exit {
    let Prepared {
        command,
        early_connect,
        http_addr,
    } = prepared;
    // COMMAND is looked up before campaigning: a typo must not wait silently as a standby.
    let command = match command {
        Ok(command) => command,
        Err(err) => {
            error!("{}{}", Chain(&err), lock_file_hint(&settings.command, &err));
            return Exit::Code(err.exit_code());
        }
    };
    let http_addr = match http_addr.transpose() {
        Ok(addr) => addr,
        Err(err) => {
            error!("{err}");
            return Exit::Code(exit_codes::FAILURE);
        }
    };
    // The server may have answered the early SSLRequest by now: the startup message follows.
    if let Some(early) = &early_connect {
        early.advance();
    }
    // Claimed before anything is spawned; a child gets the foreground only while leaderrun's
    // group has it (at start, or once `fg` gave it).
    let terminal = Terminal::claim().map(Arc::new);
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
            return Exit::Code(exit_codes::FAILURE);
        }
    };
    let exit = runtime.block_on(run(
        settings,
        command,
        signals,
        terminal,
        early,
        early_connect,
        http_addr,
    ));
    // Not waiting for blocking work: a stop acted on at once must not wait for a resolver
    // that does not answer (seconds to a minute). A host name's lookup runs on a detached
    // thread of its own (`connecting::lookup_host`), not the runtime's; everything of the run
    // has ended by now, and whatever is left goes with the exit.
    runtime.shutdown_background();
    exit
}

/// flock's word order, `leaderrun -n /var/lock/x cmd`: a path that cannot be run, followed by
/// more words, is most likely meant as a lock file, which leaderrun does not take.
fn lock_file_hint(command: &[std::ffi::OsString], err: &child::SpawnError) -> &'static str {
    let path_like = command
        .first()
        .is_some_and(|w| w.as_encoded_bytes().contains(&b'/'));
    let unrunnable = matches!(
        err,
        child::SpawnError::NotFound { .. } | child::SpawnError::NotExecutable { .. }
    );
    if path_like && unrunnable && command.len() > 1 {
        "; hint: leaderrun takes no lock-file argument (flock's word order): the lock lives in \
         PostgreSQL and --lock-id or --lock-name names it, e.g. leaderrun -n --lock-name x -- cmd"
    } else {
        ""
    }
}

/// How long after the first check start-up's code pages are dropped
/// ([`crate::process::memory::drop_start_up_pages`]): past a grant's COMMAND start.
const TRIM_AFTER_FIRST_CHECK: Duration = Duration::from_millis(500);

/// Upper bound of the random delay before a replica's first check ([`Config::first_check_spread`]).
pub const FIRST_CHECK_SPREAD: Duration = Duration::from_secs(1);

/// The elector configuration for `settings`.
pub fn elector_config(settings: &Settings) -> Config {
    let mut config = Config::new(settings.connect.clone());
    config.tls = settings.tls.clone();
    config.lock = settings.lock;
    config.slots = settings.slots;
    config.check_interval = settings.timing.check_interval;
    config.idle_session_timeout = Some(settings.timing.idle_session_timeout);
    // Standbys wait in the lock queue, so a release reaches them at once
    // (docs/guarantees.md#safety-guarantees); a `--once` check must not wait.
    config.wait_for_release = !matches!(settings.mode, Mode::OneShot { wait: None, .. });
    // A fleet started together connects spread over up to a quarter interval (at most 1 s);
    // `--once` decides at once (its herd is handled by retrying 53300/57P03); `--wait DUR`
    // spreads over at most a quarter of DUR, so that its first check always comes well
    // before the wait is over (a spread as long as the wait made a reachable database look
    // unreachable: exit 125 instead of the conflict code).
    let spread = (settings.timing.check_interval / 4).min(FIRST_CHECK_SPREAD);
    config.first_check_spread = match settings.mode {
        Mode::OneShot { wait: None, .. } => Duration::ZERO,
        Mode::OneShot {
            wait: Some(wait), ..
        } => spread.min(wait / 4),
        _ => spread,
    };
    // `--once` reports its one failed check as the ERROR it exits with: printed once.
    config.warn_failed_tries = !matches!(settings.mode, Mode::OneShot { wait: None, .. });
    // A one-shot's retries of a momentarily full server are no error (cron mails nothing).
    config.warn_transient_tries = !matches!(settings.mode, Mode::OneShot { .. });
    // Only a one-shot retries a momentarily full or starting server soon: it decides within
    // its first interval. The long-running modes try once per interval, as on any failure.
    config.retry_transient_soon = matches!(settings.mode, Mode::OneShot { .. });
    // A one-shot (cron) would say the server's weaker bound on every run: `doctor` says it.
    config.warn_weaker_server = !matches!(settings.mode, Mode::OneShot { .. });
    config
}

/// The supervisor's plan for `settings`.
pub fn plan(settings: &Settings) -> Plan {
    Plan {
        mode: settings.mode,
        grace: settings.timing.grace,
        stop_signal: settings.stop_signal,
        takeover_delay: settings.takeover_delay,
        timeout: settings.timeout,
        conflict_exit_code: settings.conflict_exit_code,
        check_interval: settings.timing.check_interval,
        tick_at_grant: settings.tick_at_grant,
    }
}

/// Runs the mode `settings` selects on the real election and real processes; returns the exit
/// status of docs/guarantees.md#exit-codes. `early`: the watchdog `main` forked;
/// `early_connect`: the first host's connect, begun already.
pub async fn run(
    settings: Settings,
    command: Command,
    signals: SignalStream,
    terminal: Option<Arc<Terminal>>,
    early: Option<EarlyWatchdog>,
    early_connect: Option<Arc<EarlyConnect>>,
    http_addr: Option<std::net::SocketAddr>,
) -> Exit {
    let metrics = Metrics::new();
    let mut config = elector_config(&settings);
    config.registry = Some(metrics.registry().clone());
    if let Some(early) = &early_connect {
        early.advance();
    }
    config.early_connect = early_connect;
    // COMMAND's own cgroup where one can be made, and the watchdog, before anything runs.
    let cgroup = crate::process::cgroup::Cgroup::create(settings.cgroup).map(Arc::new);
    let pid_namespace = match settings
        .pid_namespace
        .then(crate::process::pidns::PidNamespace::new)
        .transpose()
    {
        Ok(namespace) => namespace.map(Arc::new),
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(exit_codes::FAILURE);
        }
    };
    let watchdog = Arc::new(Watchdog::new(WatchdogPlan {
        grace: settings.timing.grace,
        stall: settings.timing.watchdog_stall(),
        stop_signal: settings.stop_signal,
        cgroup: cgroup.as_ref().map(|c| c.dir().to_owned()),
    }));
    config.keeper = Some(watchdog.clone());
    // The watchdog `main` forked before any thread existed gets its plan and is this handle's
    // (no exec). Without one (the fork failed, or a caller that did not fork), one is started
    // now, by exec, on a thread of its own, while the first connect waits for the server: off
    // the path of the first grant (a one-shot's) and of every later handover. A grant that
    // comes first waits for it (`SessionKeeper::keep` takes the same lock).
    let adopted = early.is_some_and(|early| watchdog.adopt(early));
    let starter = if adopted {
        None
    } else {
        let starting = watchdog.clone();
        let started = std::thread::Builder::new()
            .name("watchdog-start".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                if !starting.ready() {
                    warn!(
                        "cannot start the watchdog; it is tried again at the grant, and \
                         COMMAND does not start without one"
                    );
                }
            });
        match started {
            Ok(starter) => Some(starter),
            Err(err) => {
                warn!(
                    "cannot start a thread for the watchdog's start; it starts at the grant: {err}"
                );
                None
            }
        }
    };
    // On every way out of here from now on, the watchdog is ended and reaped last.
    let reaped = ReapOnExit {
        watchdog: watchdog.clone(),
        starter,
    };
    let elector = match Elector::new(config) {
        Ok(elector) => elector,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(exit_codes::FAILURE);
        }
    };
    let health = Arc::new(Health::new(&settings.timing));
    log_settings(&settings, &command);
    say_if_parent_holds(&settings, std::env::var_os("LEADERRUN_LOCK").as_deref());
    // Probes come up before the first check, on threads of their own.
    if let Some(addr) = http_addr {
        let observed = Observed {
            elector: elector.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
        };
        match crate::cli::http::serve(addr, observed) {
            Ok(bound) => info!(addr = %bound, "serving /metrics, /healthz and /readyz"),
            Err(err) => {
                error!("{}", Chain(&err));
                return Exit::Code(exit_codes::FAILURE);
            }
        }
    }
    let notifier = tokio::spawn(crate::cli::notify::follow(elector.clone(), health.clone()));
    let watching = tokio::spawn(watchdog.clone().watch());
    let heartbeat = tokio::spawn(heartbeat(
        elector.clone(),
        watchdog.clone(),
        settings.timing.heartbeat(),
    ));
    // Once the first check is done, start-up has run: its code pages go back to the page cache.
    let mut checks = elector.watch_checks();
    let mut election = ElectionTask::start(elector);
    let trim = tokio::spawn(async move {
        if checks.wait_for(|c| c.total > 0).await.is_ok() {
            tokio::time::sleep(TRIM_AFTER_FIRST_CHECK).await;
            crate::process::memory::drop_start_up_pages();
        }
    });
    let spawner = ProcessSpawner {
        command,
        terminal: terminal.clone(),
        cgroup,
        helper: watchdog.helper_pid(),
        pid_namespace,
    };
    let plan = plan(&settings);
    let spawner = WatchedSpawner {
        inner: spawner,
        watchdog,
    };
    let history = settings.history.then(|| {
        History::spawn(HistorySettings {
            connect: settings.connect.clone(),
            tls: settings.tls.clone(),
            table: settings.history_table.clone(),
            keep: settings.history_keep,
            lock: settings.lock,
            schedule: settings
                .schedule
                .as_ref()
                .map(|s| (s.expr().to_owned(), s.zone().to_owned())),
            bound: settings.timing.check_interval.max(HISTORY_BOUND_MIN),
        })
    });
    let mut supervisor = Supervisor::new(
        plan,
        &mut election,
        spawner,
        signals,
        terminal,
        metrics,
        health,
    );
    if let Some(schedule) = settings.schedule.clone() {
        supervisor = supervisor.with_schedule(schedule);
    }
    if let Some(history) = &history {
        supervisor = supervisor.with_history(history.clone());
    }
    let exit = supervisor.run().await;
    // No tree runs any more: the watchdog exits while the session is released, and is only
    // reaped at the end (one-shot: a few hundred microseconds off the exit).
    reaped.watchdog.end_early();
    trim.abort();
    heartbeat.abort();
    watching.abort();
    crate::cli::notify::stopping();
    notifier.abort();
    election.stop().await;
    // After the release: the last run's end is worth a moment, never a hang.
    if let Some(history) = history {
        history.flush(HISTORY_FLUSH).await;
    }
    exit
}

/// Shortest bound of one history statement (`statement_timeout` of its session); the check
/// interval when that is longer.
const HISTORY_BOUND_MIN: Duration = Duration::from_secs(2);

/// How long leaderrun waits at exit, after the release, for history writes still queued.
const HISTORY_FLUSH: Duration = Duration::from_secs(2);

/// Ends and reaps the watchdog when dropped ([`Watchdog::shutdown`]), once the thread that may
/// still be starting it is done: leaderrun leaves no zombie behind, whatever way it exits.
struct ReapOnExit {
    watchdog: Arc<Watchdog>,
    starter: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ReapOnExit {
    fn drop(&mut self) {
        if let Some(starter) = self.starter.take() {
            let _ = starter.join();
        }
        self.watchdog.shutdown();
    }
}

/// The one INFO line with the effective settings at start (a one-shot's default level, WARN,
/// hides it; see [`crate::cli::Cli::log_level`]). It names the database the lock lives in, as
/// advisory locks are per database. The password is never part of it.
fn log_settings(settings: &Settings, command: &Command) {
    let mode = match settings.mode {
        // As `--restart` spells its values.
        Mode::WhileLeader { restart } => format!(
            "while-leader, restart {}",
            match restart {
                crate::supervisor::Restart::Never => "never",
                crate::supervisor::Restart::OnFailure => "on-failure",
                crate::supervisor::Restart::Always => "always",
            }
        ),
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
        Mode::Schedule { catch_up } => {
            let (expr, zone) = settings
                .schedule
                .as_ref()
                .map(|s| (s.expr(), s.zone()))
                .unwrap_or_default();
            match catch_up {
                Some(c) => format!(
                    "schedule {expr} ({zone}), catch-up {}",
                    humantime::format_duration(c)
                ),
                None => format!("schedule {expr} ({zone})"),
            }
        }
    };
    let dur = |d: Duration| humantime::format_duration(d).to_string();
    let server = crate::pg::conninfo::endpoint(&settings.connect);
    let app = settings.connect.get_application_name().unwrap_or("");
    let timeout = settings.timeout.map(dur).unwrap_or_else(|| "none".into());
    let http = settings
        .http_addr
        .as_ref()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "off".into());
    let program = command.program().display().to_string();
    let database = settings.connect.get_dbname().unwrap_or("");
    // Every replica of a lock must agree on these: the line shows them to compare.
    let history = if settings.history {
        format!(
            "{}, keep {}",
            settings.history_table,
            dur(settings.history_keep)
        )
    } else {
        "off".into()
    };
    info!(
                mode = %mode,
                database = %database,
                database_from = %settings.database_from,
                dsn_from = %settings.dsn_from,
                server = %server,
                application_name = %app,
                lock = %settings.lock,
                lock_is = lock_words(settings.lock),
                slots = settings.slots,
                check_interval = %dur(settings.timing.check_interval),
                grace = %dur(settings.timing.grace),
                stop_signal = settings.stop_signal.as_str(),
                idle_session_timeout = %dur(settings.timing.idle_session_timeout),
                takeover_delay = %dur(settings.takeover_delay),
                timeout = %timeout,
                conflict_exit_code = settings.conflict_exit_code,
                history = %history,
                cgroup = settings.cgroup,
                pid_namespace = settings.pid_namespace,
                http_addr = %http,
                command = %program,
                "campaigning for the background leader lock"
    );
}

/// Says so when leaderrun runs as (part of) COMMAND of a leaderrun that holds the same lock
/// (`lock`: its `LEADERRUN_LOCK`, `class:id`) and has no other slot to lead: a job script that
/// starts another leaderrun on the key its environment configures (`LEADERRUN_LOCK_NAME` in a
/// container's environment, the default key) can never lead while the outer one does: a
/// standby for good, or a one-shot that skips with the conflict code (0 by default), the inner
/// job never run. A WARN, but an INFO (shown at `-v`) in a one-shot, which prints nothing at
/// its default level when refused.
fn say_if_parent_holds(settings: &Settings, lock: Option<&std::ffi::OsStr>) {
    let Some(held) = lock.and_then(|l| l.to_str()) else {
        return;
    };
    // With more slots than one, another slot may be free for it.
    if settings.slots <= 1 && settings.lock.to_string() == held {
        let said = format!(
            "the leaderrun that started this one holds this lock (LEADERRUN_LOCK={held} in the \
             environment): this one cannot lead while that one does; give it a lock of its own \
             (--lock-id, --lock-name)"
        );
        // A one-shot that is refused prints nothing at its default level (cron mails
        // nothing): there it is said at -v.
        if matches!(settings.mode, Mode::OneShot { .. }) {
            info!(lock = %settings.lock, "{said}");
        } else {
            warn!(lock = %settings.lock, "{said}");
        }
    }
}

/// The lock key in words for the start line: the default key is the plexsphere API's own
/// background leader lock, which a job of its own should not compete for by accident.
fn lock_words(lock: crate::pg::lock::LockKey) -> &'static str {
    if lock == crate::pg::lock::LockKey::default() {
        "the plexsphere background leader lock (the default key; a job of its own takes \
         --lock-id or --lock-name)"
    } else {
        "a key of its own"
    }
}

/// Tells the watchdog every `period` that leaderrun is alive and until when its lock is proven,
/// while a term lasts or a tree is still guarded (being stopped). A standby with nothing to
/// guard sends nothing and wakes for nothing: the watchdog looks for a freeze only while a tree
/// runs, and a thousand standbys would otherwise wake two processes each four times a second.
async fn heartbeat(elector: Elector, watchdog: Arc<Watchdog>, period: Duration) {
    let mut terms = elector.watch_term();
    // Also right after each check: a leaderrun stopped between a check and the next tick
    // would leave the watchdog with the proof before, which runs out a check interval early.
    let mut checks = elector.watch_checks();
    loop {
        let term = terms.borrow_and_update().clone();
        if term.is_ended() && !watchdog.guards_tree() {
            // Trees start only under a live term: nothing to tell until the next one.
            if terms.changed().await.is_err() {
                return;
            }
            continue;
        }
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = terms.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                _ = ticker.tick() => {
                    watchdog.heartbeat(if term.is_ended() { None } else { term.proven_until() });
                    if term.is_ended() && !watchdog.guards_tree() {
                        break;
                    }
                }
                changed = checks.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !term.is_ended() {
                        watchdog.heartbeat(term.proven_until());
                    }
                }
            }
        }
    }
}

/// The election task and the token that stops it: the supervisor's [`Election`] in the binary.
pub struct ElectionTask {
    elector: Elector,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), crate::Error>>,
    done: bool,
}

impl ElectionTask {
    /// Starts [`Elector::run`] on a task of its own.
    pub fn start(elector: Elector) -> ElectionTask {
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let elector = elector.clone();
            let cancel = cancel.clone();
            async move { elector.run(cancel).await }
        });
        ElectionTask {
            elector,
            cancel,
            task,
            done: false,
        }
    }

    /// Cancels the election (end term, unlock, close) and waits for it to finish.
    pub async fn stop(&mut self) {
        self.cancel.cancel();
        if !self.done {
            self.done = true;
            if let Err(err) = (&mut self.task).await {
                error!("the election task failed: {err}");
            }
        }
    }
}

impl Election for &mut ElectionTask {
    fn terms(&self) -> watch::Receiver<Term> {
        self.elector.watch_term()
    }

    fn checks(&self) -> watch::Receiver<Checks> {
        self.elector.watch_checks()
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
}
