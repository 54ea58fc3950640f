//! The default mode, while-leader (contract §4): ties the [`Elector`] to the [`Child`].
//!
//! One loop, two phases. As a standby it waits for a term or a signal. As the leader it starts
//! COMMAND for that term and waits for whichever comes first: COMMAND exits (stop what is left
//! of its group, release the lock, exit with its status), the term ends (stop COMMAND, back to
//! standby), or INT/TERM (forward it, stop COMMAND, release the lock, exit with its status).
//! Every wait also handles SIGCHLD (reap) and the other forwarded signals.
//!
//! The binary runs this on a current-thread runtime on the main thread, which is therefore the
//! thread that forks every child and lives as long as they do (`PR_SET_PDEATHSIG`).

use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::child::{self, Child, Command, ExitStatus};
use crate::cli::{Cli, Settings, EXIT_FAILURE};
use crate::elector::{Config, Elector, Term, TermEnd};
use crate::error::Chain;
use crate::signals::{is_forwarded, is_shutdown, suspend_self, SignalStream};
use crate::terminal::Terminal;

/// How leaderrun ends; [`Exit::finish`] turns it into the process exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// COMMAND's status is leaderrun's status (contract §6).
    Child(ExitStatus),
    /// A status of leaderrun's own: 0 (stopped while standby), 125, 126, 127.
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
    // COMMAND is looked up before campaigning: a typo must not wait silently as a standby.
    let path = std::env::var_os("PATH");
    let command = match Command::resolve(settings.command.clone(), path.as_deref()) {
        Ok(command) => command,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(err.exit_code());
        }
    };
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
    runtime.block_on(while_leader(settings, command, signals, terminal))
}

/// The elector configuration for `settings`.
pub fn elector_config(settings: &Settings) -> Config {
    let mut config = Config::new(settings.connect.clone());
    config.lock = settings.lock;
    config.check_interval = settings.check_interval;
    config.idle_session_timeout = Some(settings.idle_session_timeout);
    config
}

/// The election task and the token that stops it.
struct Election {
    elector: Elector,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), crate::Error>>,
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
        }
    }

    /// Cancels the election (end term, unlock, close) and waits for it to finish.
    async fn stop(self) {
        self.cancel.cancel();
        if let Err(err) = self.task.await {
            error!("the election task failed: {err}");
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

/// The default mode: campaign; while leading, run COMMAND; on demotion stop it and campaign
/// again; exit when COMMAND exits on its own or on INT/TERM.
pub async fn while_leader(
    settings: Settings,
    command: Command,
    mut signals: SignalStream,
    terminal: Option<Terminal>,
) -> Exit {
    let elector = match Elector::new(elector_config(&settings)) {
        Ok(elector) => elector,
        Err(err) => {
            error!("{}", Chain(&err));
            return Exit::Code(EXIT_FAILURE);
        }
    };
    info!(
        server = ?crate::conninfo::describe(&settings.connect),
        lock = %settings.lock,
        check_interval = %humantime::format_duration(settings.check_interval),
        grace = %humantime::format_duration(settings.grace),
        "campaigning for the background leader lock"
    );
    let mut election = Election::start(elector);
    // Leftovers of earlier terms are reaped by a slow timer as well as on SIGCHLD (SIGCHLD
    // coalesces, FIELD-NOTES child 6).
    let mut reap_timer = tokio::time::interval(Duration::from_secs(1));
    loop {
        // Standby: wait for a term, handling signals first.
        let term = tokio::select! {
            biased;
            sig = signals.recv() => {
                if is_shutdown(sig) {
                    info!(signal = sig.as_str(), "received {} while standby; shutting down", sig.as_str());
                    election.stop().await;
                    return Exit::Code(0);
                }
                if sig == Signal::SIGTSTP {
                    suspend_self();
                }
                child::reap(None);
                continue;
            }
            _ = reap_timer.tick() => {
                child::reap(None);
                continue;
            }
            result = &mut election.task => {
                error!("the election stopped unexpectedly: {}", match result {
                    Ok(Ok(())) => "returned".to_owned(),
                    Ok(Err(err)) => Chain(&err).to_string(),
                    Err(err) => err.to_string(),
                });
                return Exit::Code(EXIT_FAILURE);
            }
            term = election.elector.wait_for_term() => term,
        };
        // A signal that arrived while the term was being granted is acted on before any child
        // exists (FIELD-NOTES child 1).
        while let Some(sig) = signals.try_recv() {
            if is_shutdown(sig) {
                info!(
                    signal = sig.as_str(),
                    "received {} before COMMAND started; shutting down",
                    sig.as_str()
                );
                election.stop().await;
                return Exit::Code(0);
            }
        }
        if term.is_ended() {
            continue;
        }
        let mut child = match Child::spawn(&command, &child_env(&term), terminal.as_ref()) {
            Ok(child) => child,
            Err(err) => {
                error!("{}", Chain(&err));
                election.stop().await;
                return Exit::Code(err.exit_code());
            }
        };
        info!(pid = child.pid(), term = term.number(), "child started");
        let led = lead(
            &settings,
            &term,
            &mut child,
            &mut signals,
            terminal.as_ref(),
        )
        .await;
        if let Some(terminal) = &terminal {
            terminal.take_back();
        }
        match led {
            Led::Demoted(stopped) => {
                info!(pid = child.pid(), status = %stopped.status, term = term.number(), "child stopped after demotion");
                if let Some(sig) = stopped.shutdown {
                    info!(
                        signal = sig.as_str(),
                        "shutting down after {}",
                        sig.as_str()
                    );
                    election.stop().await;
                    return Exit::Child(stopped.status);
                }
            }
            Led::Finished(status) => {
                election.stop().await;
                return Exit::Child(status);
            }
        }
    }
}

/// How one term's child ended.
enum Led {
    /// Leadership ended; the child was stopped and the replica campaigns again (unless a
    /// shutdown signal arrived meanwhile).
    Demoted(child::Stopped),
    /// COMMAND exited on its own or after INT/TERM; leaderrun exits with this status.
    Finished(ExitStatus),
}

/// Supervises the child of one term.
async fn lead(
    settings: &Settings,
    term: &Term,
    child: &mut Child,
    signals: &mut SignalStream,
    terminal: Option<&Terminal>,
) -> Led {
    let mut reap_timer = tokio::time::interval(Duration::from_secs(1));
    loop {
        // A stop by Ctrl-Z (SIGTSTP), or by reading/writing the terminal we handed over, is job
        // control; a SIGSTOP from someone else is not ours to act on.
        let job_stop = match child.take_stop() {
            Some(Signal::SIGTSTP) => Some(Signal::SIGTSTP),
            Some(sig @ (Signal::SIGTTIN | Signal::SIGTTOU)) if terminal.is_some() => Some(sig),
            _ => None,
        };
        if let Some(sig) = job_stop {
            // Job control: the child was suspended (Ctrl-Z). Suspend leaderrun too, so the
            // calling shell sees the job stopped; `fg` continues us, and we continue the child.
            info!(
                pid = child.pid(),
                signal = sig.as_str(),
                "child suspended; suspending leaderrun"
            );
            if let Some(terminal) = terminal {
                terminal.take_back();
            }
            suspend_self();
            if let Some(terminal) = terminal {
                terminal.give_to(Pid::from_raw(child.pid() as i32));
            }
            child.signal_group(Signal::SIGCONT);
            info!(pid = child.pid(), "resumed; child continued");
        }
        if let Some(status) = child.status() {
            info!(pid = child.pid(), status = %status, term = term.number(), "child exited");
            // Helpers it left running are stopped too before the lock is released.
            let stopped = child
                .stop(settings.stop_signal, settings.grace, false, signals)
                .await;
            return Led::Finished(stopped.status);
        }
        tokio::select! {
            biased;
            sig = signals.recv() => {
                if sig == Signal::SIGCHLD {
                    child.reap();
                } else if is_shutdown(sig) {
                    info!(signal = sig.as_str(), pid = child.pid(), "received {}; stopping the child", sig.as_str());
                    let stopped = child.stop(sig, settings.grace, true, signals).await;
                    info!(pid = child.pid(), status = %stopped.status, "child stopped");
                    return Led::Finished(stopped.status);
                } else if is_forwarded(sig) || sig == Signal::SIGTSTP {
                    child.signal_group(sig);
                }
            }
            cause = term.ended() => {
                let how = if cause == TermEnd::LeadershipLost { "leadership lost" } else { "leadership released" };
                info!(pid = child.pid(), term = term.number(), "{how}; stopping the child");
                let stopped = child.stop(settings.stop_signal, settings.grace, false, signals).await;
                return Led::Demoted(stopped);
            }
            _ = reap_timer.tick() => {
                child.reap();
            }
        }
    }
}
