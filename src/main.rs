//! `leaderrun [OPTIONS] -- COMMAND [ARG...]`: parse, build, run, exit with the status of
//! docs/guarantees.md#exit-codes. Never returns a `Result`: errors are logged as one line each, not
//! as a backtrace.

use std::process::ExitCode;

use leaderrun::cli::exit_codes::FAILURE;
use leaderrun::cli::Action;
use leaderrun::cli::{doctor, runner, status};
use leaderrun::supervisor::Exit;
use leaderrun::Chain;

fn main() -> ExitCode {
    // The same binary is leaderrun's watchdog process, started by leaderrun itself.
    if leaderrun::watchdog::is_watchdog() {
        return leaderrun::watchdog::main();
    }
    // And the init of COMMAND's PID namespace (`--pid-namespace`).
    if leaderrun::process::pidns::is_init() {
        return leaderrun::process::pidns::init_main();
    }
    // Signals wait (blocked) until the handlers exist: a signal that arrives during start-up
    // is delivered to them, then waits in the stream.
    let blocked = leaderrun::process::signals::block_all();
    let cli = leaderrun::cli::parse();
    let json = cli.log_format == leaderrun::cli::LogFormat::Json;
    // No thread yet: the log's writer thread starts with the first line.
    leaderrun::cli::logging::init(cli.log_level(), cli.verbose > 0 || cli.quiet > 0, json);
    leaderrun::watchdog::use_json_logs(json);
    let exit = match cli.settings(&|name| std::env::var(name).ok()) {
        Ok(settings) => {
            // A one-shot's connect begins before the rest of start-up: the server starts its
            // backend meanwhile (a signal meanwhile waits, blocked).
            let early_connect = match cli.action {
                None => runner::early_connect(&settings),
                Some(_) => None,
            };
            // The watchdog of the run mode is forked now, while this is the only thread, and
            // needs no exec (docs/process-model.md#the-watchdog). A setting that logged a
            // line started the log's thread: then it is exec'd later instead.
            let early = match cli.action {
                None if !leaderrun::cli::logging::writer_started() => {
                    // SAFETY: no other thread exists: the log's writer has not started (just
                    // checked), and the runtime starts below.
                    unsafe { leaderrun::watchdog::EarlyWatchdog::fork() }
                }
                _ => None,
            };
            match leaderrun::process::signals::install() {
                Ok(signals) => {
                    drop(blocked);
                    run(cli.action, settings, signals, early, early_connect)
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
    early_connect: Option<std::sync::Arc<leaderrun::elector::EarlyConnect>>,
) -> Exit {
    let bound = runner::elector_config(&settings).io_bound();
    let (connect, tls, lock, slots) = (
        &settings.connect,
        &settings.tls,
        settings.lock,
        settings.slots,
    );
    match action {
        Some(Action::Status { json }) => Exit::Code(status::status_main(
            connect,
            tls,
            lock,
            slots,
            bound,
            json,
            (&settings.history_table, settings.schedule.as_ref()),
        )),
        Some(Action::StepDown { slot }) => Exit::Code(status::step_down_main(
            connect, tls, lock, slots, slot, bound,
        )),
        Some(Action::Doctor { scratch_id }) => Exit::Code(doctor::doctor_main(
            connect,
            tls,
            lock,
            slots,
            bound,
            settings.database_from,
            scratch_id,
        )),
        None => runner::main(settings, signals, early, early_connect),
    }
}
