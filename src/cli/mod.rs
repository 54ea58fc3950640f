//! The binary's own parts (feature `cli`). The command line
//! (docs/guarantees.md#database-and-connection-settings, #the-lock-key-and-slots,
//! #timing-settings): one clap definition ([`Cli`], in `args`), and the checks that turn it into
//! [`Settings`] (in `settings`). Every usage error exits 125 (docs/guarantees.md#exit-codes), not
//! clap's default 2: [`parse`] does that.
//!
//! Beside it: [`runner`] builds the real parts of a run (elector, watchdog, supervisor) and
//! runs it; [`status`] (`status`, `step-down`) and [`doctor`] are the operator's subcommands;
//! [`http`] with [`health`] and [`metrics`] serves the endpoints, [`notify`] tells systemd,
//! [`logging`] sets up the log, [`output`] writes stdout and stderr (waiting for a
//! non-blocking one), [`docs`] generates the man page and completions, and [`exit_codes`]
//! names the statuses.

pub mod docs;
pub mod doctor;
pub mod exit_codes;
pub mod health;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod output;
pub mod runner;
pub mod status;

mod args;
mod settings;
#[cfg(test)]
mod tests;

pub use crate::supervisor::{Mode, Restart};
pub use args::{
    command, parse, parse_duration, parse_duration_or_zero, parse_from, parse_http_addr,
    parse_period, parse_signal, Action, Cli, HttpAddr, LogFormat, RestartPolicy, MAX_DURATION,
    USAGE,
};
pub use settings::Settings;
