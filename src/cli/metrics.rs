//! The binary's Prometheus registry (docs/guarantees.md#observing-a-replica).
//!
//! The election's metrics (`plexsphere_background_leader`, checks, terms, demotions) are
//! registered by the [`Elector`] itself on the same registry; this module adds what only the
//! binary knows (child runs and ticks), the time since the last successful check, and the
//! process collector. Names follow Prometheus conventions: `leaderrun_…_total` counters and
//! `…_seconds` units.

use prometheus::{Encoder, Gauge, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::elector::Elector;

/// Outcome label of `leaderrun_child_exits_total`.
#[derive(Clone, Copy, Debug)]
pub enum ChildExit {
    /// Exited with 0.
    Success,
    /// Exited non-zero or died of a signal on its own.
    Failure,
    /// Stopped by leaderrun: demotion, `--timeout` or shutdown.
    Stopped,
}

impl ChildExit {
    fn label(self) -> &'static str {
        match self {
            ChildExit::Success => "success",
            ChildExit::Failure => "failure",
            ChildExit::Stopped => "stopped",
        }
    }
}

/// Outcome label of `leaderrun_ticks_total` (`--every` ticks and `--schedule` due times).
#[derive(Clone, Copy, Debug)]
pub enum Tick {
    /// The run succeeded.
    Success,
    /// The run failed (non-zero, signal, timeout, could not start).
    Failure,
    /// Skipped: the previous run was still going.
    Skipped,
    /// Stopped by a demotion (not a failure).
    Interrupted,
    /// Standby: nothing to run.
    Standby,
}

impl Tick {
    fn label(self) -> &'static str {
        match self {
            Tick::Success => "success",
            Tick::Failure => "failure",
            Tick::Skipped => "skipped",
            Tick::Interrupted => "interrupted",
            Tick::Standby => "standby",
        }
    }
}

/// Counters of the binary, on the registry `/metrics` serves.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    child_starts: IntCounter,
    child_start_failures: IntCounter,
    child_exits: IntCounterVec,
    ticks: IntCounterVec,
    since_success: Gauge,
    log_dropped: IntCounter,
    last_run_start: Gauge,
    last_success: Gauge,
    started: std::time::Instant,
}

impl Metrics {
    /// A fresh registry with the binary's metrics and the process collector.
    ///
    /// # Panics
    /// Never in practice: the names are constants that register once on a new registry.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let child_starts =
            IntCounter::new("leaderrun_child_starts_total", "Times COMMAND was started.")
                .expect("valid metric");
        let child_start_failures = IntCounter::new(
            "leaderrun_child_start_failures_total",
            "Times COMMAND could not be started (exec or fork refused), in every mode.",
        )
        .expect("valid metric");
        let child_exits = IntCounterVec::new(
            Opts::new(
                "leaderrun_child_exits_total",
                "Ends of COMMAND by outcome: success, failure, stopped (by leaderrun).",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let ticks = IntCounterVec::new(
            Opts::new(
                "leaderrun_ticks_total",
                "Ticks of --every and due times of --schedule, by outcome: success, failure, \
                 skipped, interrupted, standby.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let since_success = Gauge::new(
            "leaderrun_seconds_since_last_successful_check",
            "Seconds since the last check that got an answer from the server (since start when none has).",
        )
        .expect("valid metric");
        // Every series exists from the start at 0: Prometheus' increase() cannot see an event
        // whose series begins with it.
        for outcome in [ChildExit::Success, ChildExit::Failure, ChildExit::Stopped] {
            child_exits.with_label_values(&[outcome.label()]);
        }
        for outcome in [
            Tick::Success,
            Tick::Failure,
            Tick::Skipped,
            Tick::Interrupted,
            Tick::Standby,
        ] {
            ticks.with_label_values(&[outcome.label()]);
        }
        let log_dropped = IntCounter::new(
            "leaderrun_log_lines_dropped_total",
            "Log lines dropped because stderr did not take them (a stalled or closed reader).",
        )
        .expect("valid metric");
        let last_run_start = Gauge::new(
            "leaderrun_last_run_start_timestamp_seconds",
            "Unix time of the last start of COMMAND on this replica (0 before its first run).",
        )
        .expect("valid metric");
        let last_success = Gauge::new(
            "leaderrun_last_success_timestamp_seconds",
            "Unix time of the end of the last run of COMMAND on this replica that exited 0 (0 before one).",
        )
        .expect("valid metric");
        for collector in [
            Box::new(last_run_start.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(last_success.clone()),
            Box::new(child_starts.clone()),
            Box::new(child_start_failures.clone()),
            Box::new(child_exits.clone()),
            Box::new(ticks.clone()),
            Box::new(since_success.clone()),
            Box::new(log_dropped.clone()),
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        ] {
            registry.register(collector).expect("fresh registry");
        }
        Metrics {
            registry,
            child_starts,
            child_start_failures,
            child_exits,
            ticks,
            since_success,
            log_dropped,
            last_run_start,
            last_success,
            started: std::time::Instant::now(),
        }
    }

    /// The registry, for [`crate::Config::registry`].
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// COMMAND was started.
    pub fn child_started(&self) {
        self.child_starts.inc();
    }

    /// COMMAND could not be started (exec or fork refused): under `--restart` the leader goes
    /// on after the back-off, so the failure shows here and not as an exit.
    pub fn child_start_failed(&self) {
        self.child_start_failures.inc();
    }

    /// A run of COMMAND started at `at` (`leaderrun_last_run_start_timestamp_seconds`).
    pub fn run_started(&self, at: std::time::SystemTime) {
        self.last_run_start.set(unix_seconds(at));
    }

    /// A run of COMMAND that exited 0 ended at `at` (`leaderrun_last_success_timestamp_seconds`).
    pub fn run_succeeded(&self, at: std::time::SystemTime) {
        self.last_success.set(unix_seconds(at));
    }

    /// COMMAND ended.
    pub fn child_exited(&self, outcome: ChildExit) {
        self.child_exits.with_label_values(&[outcome.label()]).inc();
    }

    /// A tick of `--every` or a due time of `--schedule`.
    pub fn tick(&self, outcome: Tick) {
        self.ticks.with_label_values(&[outcome.label()]).inc();
    }

    /// The Prometheus text exposition of everything, `elector`'s state read at this moment.
    pub fn render(&self, elector: &Elector) -> String {
        // Never a success: the time since start, so an alert on this gauge fires.
        let since = match elector.checks().last_success_at {
            Some(at) => at.elapsed(),
            None => self.started.elapsed(),
        };
        self.since_success.set(since.as_secs_f64());
        let dropped = crate::cli::logging::dropped_lines();
        self.log_dropped
            .inc_by(dropped.saturating_sub(self.log_dropped.get()));
        let mut out = Vec::new();
        // Encoding gathered families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

fn unix_seconds(at: std::time::SystemTime) -> f64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
