//! `leaderrun [OPTIONS] -- COMMAND [ARG...]`: parse, run, exit with the contract's status.
//! Never returns a `Result`: errors are logged as one line each, not as a backtrace.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Handlers first: a signal that arrives during start-up waits in the stream.
    let signals = match leaderrun::signals::install() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("leaderrun: cannot install signal handlers: {err}");
            return ExitCode::from(leaderrun::cli::EXIT_FAILURE);
        }
    };
    let cli = leaderrun::cli::parse();
    let json = cli.log_format == leaderrun::cli::LogFormat::Json;
    leaderrun::logging::init(cli.log_level(), cli.verbose > 0 || cli.quiet > 0, json);
    leaderrun::runner::main(cli, signals).finish()
}
