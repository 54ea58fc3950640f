//! `leaderrun [OPTIONS] -- COMMAND [ARG...]`: parse, build, run, exit with the status of
//! docs/guarantees.md#exit-codes. Never returns a `Result`: errors are logged as one line each, not
//! as a backtrace.

use std::process::ExitCode;

use leaderrun::cli::exit_codes::FAILURE;
use leaderrun::cli::Action;
use leaderrun::cli::{doctor, runner, status};
use leaderrun::supervisor::Exit;
use leaderrun::Chain;

/// Every signal is blocked before Rust's runtime starts, so that one sent in the first
/// milliseconds after exec (a container stopped as it starts) waits for the handlers instead
/// of killing leaderrun or, as PID 1, being dropped (`signals::block_at_exec`). In the binary
/// only: a program that uses the library keeps its own signals.
#[used]
#[link_section = ".init_array"]
static BLOCK_SIGNALS_AT_EXEC: extern "C" fn() = leaderrun::process::signals::block_at_exec;

fn main() -> ExitCode {
    // First of all: a stack limit too small for start-up overflows it (a parent's `ulimit -s`).
    let stack = leaderrun::process::stack::reserve();
    // The same binary is leaderrun's watchdog process, started by leaderrun itself.
    if leaderrun::watchdog::is_watchdog() {
        leaderrun::process::signals::unblock_at_exec();
        return leaderrun::watchdog::main();
    }
    // And the init of COMMAND's PID namespace (`--pid-namespace`).
    if leaderrun::process::pidns::is_init() {
        leaderrun::process::signals::unblock_at_exec();
        return leaderrun::process::pidns::init_main();
    }
    // Refused for leaderrun's own run only: the processes it starts itself go on with what
    // they have (leaderrun, with the same limits, was not refused).
    if let leaderrun::process::stack::Reserve::Short { .. } = stack {
        let _ = leaderrun::cli::output::stderr(&format!("leaderrun: {stack}\n"));
        return ExitCode::from(FAILURE);
    }
    // Signals wait (blocked since the constructor above) until the handlers exist: a signal
    // that arrives during start-up is delivered to them, then waits in the stream.
    let blocked = leaderrun::process::signals::block_all();
    // Before anything is opened or forked, so that the watchdog has the same room: a
    // leaderrun that runs short later cannot see COMMAND's tree gone
    // (docs/process-model.md#enough-descriptors). Said once the log exists.
    let descriptors = leaderrun::process::descriptors::reserve();
    // Children the program that exec'd us left (`sidecar & exec leaderrun`) are not COMMAND's:
    // known before anything of ours runs, and kept by the watchdog forked next.
    leaderrun::process::inherited::record();
    // The run mode's watchdog is forked first, before the parse, while the process is at its
    // smallest: nothing that start-up writes later is a page it shares with the watchdog, so
    // neither pays a copy-on-write fault for it (docs/process-model.md#the-watchdog). It needs
    // no exec. Any other action drops it (it exits and is reaped) before running.
    // SAFETY: no other thread exists: the log's writer starts with the first line, the
    // runtime after the parse.
    let early = unsafe { leaderrun::watchdog::EarlyWatchdog::fork() };
    let cli = match leaderrun::cli::parse() {
        Ok(cli) => cli,
        Err(code) => {
            drop(early);
            return ExitCode::from(code);
        }
    };
    let json = cli.log_format == leaderrun::cli::LogFormat::Json;
    leaderrun::cli::logging::init(cli.log_level(), cli.verbose > 0 || cli.quiet > 0, json);
    leaderrun::watchdog::use_json_logs(json);
    let early = early.filter(|_| cli.action.is_none());
    // Refused before anything of the run is begun (a one-shot's connect included); the
    // subcommands hold no lock and no tree, and say their own errors.
    match descriptors {
        leaderrun::process::descriptors::Reserve::Short { .. } if cli.action.is_none() => {
            tracing::error!("{descriptors}");
            drop(early);
            leaderrun::cli::logging::finish();
            return ExitCode::from(FAILURE);
        }
        leaderrun::process::descriptors::Reserve::Raised { .. } => {
            tracing::debug!("{descriptors}");
        }
        _ => {}
    }
    if let leaderrun::process::stack::Reserve::Raised { .. } = stack {
        tracing::debug!("{stack}");
    }
    // Reading what the settings name can block for good: a stop request meanwhile ends it.
    let watchdog = early
        .as_ref()
        .and_then(leaderrun::watchdog::EarlyWatchdog::pid);
    let exit = match blocked.stoppable(watchdog, || cli.settings_from_env()) {
        Ok(settings) => {
            // COMMAND is looked up, and a one-shot's connect begins before the rest of
            // start-up: the server starts its backend meanwhile.
            let prepared = match cli.action {
                None => Some(blocked.stoppable(watchdog, || runner::prepare(&settings))),
                Some(_) => None,
            };
            match leaderrun::process::signals::install() {
                Ok(signals) => {
                    drop(blocked);
                    // A panic is a bug of leaderrun's own: exit 125 as for any failure of
                    // its own (docs/guarantees.md#exit-codes), not Rust's 101. By the time it
                    // gets here the unwinding has killed COMMAND's tree and waited for its
                    // end before the term's hold, and so the lock, went (rule 2).
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(cli.action, settings, signals, early, prepared)
                    }))
                    .unwrap_or(Exit::Code(FAILURE))
                }
                Err(err) => {
                    tracing::error!("cannot install signal handlers: {err}");
                    Exit::Code(FAILURE)
                }
            }
        }
        Err(err) => {
            tracing::error!("{}", Chain(&err));
            Exit::Code(FAILURE)
        }
    };
    // Queued log lines get a bounded moment to reach stderr; the exit never waits on them.
    leaderrun::cli::logging::finish();
    exit.finish()
}

/// Everything after the settings and the handlers: the exit to make.
fn run(
    action: Option<Action>,
    settings: leaderrun::cli::Settings,
    signals: leaderrun::process::signals::SignalStream,
    early: Option<leaderrun::watchdog::EarlyWatchdog>,
    prepared: Option<runner::Prepared>,
) -> Exit {
    let bound = runner::elector_config(&settings).io_bound();
    let (connect, tls, lock, slots) = (
        &settings.connect,
        &settings.tls,
        settings.lock,
        settings.slots,
    );
    match action {
        Some(Action::Status { json }) => status::status_main(
            connect,
            tls,
            lock,
            slots,
            bound,
            json,
            (&settings.history_table, settings.schedule.as_ref()),
            signals,
        ),
        Some(Action::StepDown { slot }) => {
            status::step_down_main(connect, tls, lock, slots, slot, bound, signals)
        }
        Some(Action::Doctor { scratch_id }) => doctor::doctor_main(
            connect,
            tls,
            lock,
            slots,
            bound,
            settings.database_from,
            scratch_id,
            signals,
        ),
        None => {
            let prepared = prepared.unwrap_or_else(|| runner::prepare(&settings));
            runner::main(settings, signals, early, prepared)
        }
    }
}
