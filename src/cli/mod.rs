//! The command line (contract §1–3): one clap definition, and the checks that turn it into
//! [`Settings`].
//!
//! Every usage error exits 125 (contract §6), not clap's default 2: [`parse`] does that.

pub mod docs;
pub mod doctor;
pub mod exit_codes;
pub mod health;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod runner;
pub mod status;

mod args;
mod settings;
#[cfg(test)]
mod tests;

pub use crate::supervisor::{Mode, Restart};
pub use args::{
    command, parse, parse_duration, parse_duration_or_zero, parse_http_addr, parse_signal, Action,
    Cli, LogFormat, RestartPolicy, MAX_DURATION, USAGE,
};
pub use settings::Settings;
