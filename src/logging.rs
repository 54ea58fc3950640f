//! Log lines to stderr (contract §7): the seed's wording, one line per event, fields appended.

/// Installs the global subscriber: lines on stderr at `level`, unless `RUST_LOG` is set and no
/// -v/-q flag was given, in which case `RUST_LOG` decides. `json` writes one object per line
/// with `timestamp`, `level`, `message` and the event's fields at the top level.
///
/// Safe to call once per process; later calls do nothing.
pub fn init(level: tracing::Level, explicit: bool, json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;

    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !explicit && !spec.is_empty() => {
            EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(level.as_str()))
        }
        _ => EnvFilter::new(level.as_str()),
    };
    // A log line that cannot be written (stderr closed, a pipe whose reader left) is dropped:
    // tracing-subscriber would otherwise report it with eprintln!, which panics on that same
    // broken stderr and would abort a leader mid-term.
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_target(false)
        .with_env_filter(filter);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}
