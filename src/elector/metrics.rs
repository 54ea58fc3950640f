//! The election's metrics on a registry, shared by electors that share the registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::GAUGE_NAME;
use crate::error::Error;

/// The election's metrics on one registry.
pub(crate) struct ElectorMetrics {
    pub(crate) leader: IntGauge,
    pub(crate) slot: IntGauge,
    pub(crate) terms: IntCounter,
    pub(crate) checks: IntCounterVec,
    pub(crate) check_seconds: Histogram,
    pub(crate) wait_seconds: Histogram,
    pub(crate) demotions: IntCounterVec,
}

/// Every value of `leaderrun_checks_total`'s `outcome` label.
pub(crate) const CHECK_OUTCOMES: [&str; 5] = ["granted", "refused", "verified", "lost", "failed"];

/// Every value of `leaderrun_demotions_total`'s `cause` label ([`demotion_cause`], and
/// `abandoned` after a panic or a dropped run).
pub(crate) const DEMOTION_CAUSES: [&str; 9] = [
    "session_closed",
    "timeout",
    "check_failed",
    "lock_not_held",
    "backend_changed",
    "in_recovery",
    "safe_window_passed",
    "step_down",
    "abandoned",
];

impl ElectorMetrics {
    pub(crate) fn new() -> Result<ElectorMetrics, prometheus::Error> {
        let metrics = ElectorMetrics {
            leader: IntGauge::new(GAUGE_NAME, "1 while this replica leads, 0 otherwise")?,
            slot: {
                let slot = IntGauge::new(
                    "leaderrun_slot",
                    "The slot this replica leads on (0 ... N-1 with --slots N), -1 while standby.",
                )?;
                slot.set(-1);
                slot
            },
            terms: IntCounter::new(
                "leaderrun_terms_started_total",
                "Terms this replica began (lock grants).",
            )?,
            checks: IntCounterVec::new(
                Opts::new(
                    "leaderrun_checks_total",
                    "Checks by outcome: granted, refused, verified, lost, failed.",
                ),
                &["outcome"],
            )?,
            check_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "leaderrun_check_duration_seconds",
                    "Time one check took, connect included: a standby's try or a leader's \
                     check. A standby's wait in the lock queue is not in it (see \
                     leaderrun_lock_wait_seconds); a check that was only such a wait is not \
                     observed.",
                )
                .buckets(vec![
                    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ]),
            )?,
            wait_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "leaderrun_lock_wait_seconds",
                    "Time a standby's wait in the server's lock queue took (up to one check \
                     interval, then renewed), round trip included.",
                )
                .buckets(vec![
                    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ]),
            )?,
            demotions: IntCounterVec::new(
                Opts::new(
                    "leaderrun_demotions_total",
                    "Demotions by cause: session_closed, timeout, check_failed, lock_not_held, \
                     backend_changed, in_recovery, safe_window_passed, step_down, abandoned.",
                ),
                &["cause"],
            )?,
        };
        // Every series exists from the start at 0: Prometheus' increase() cannot see an event
        // whose series begins with it.
        for outcome in CHECK_OUTCOMES {
            metrics.checks.with_label_values(&[outcome]);
        }
        for cause in DEMOTION_CAUSES {
            metrics.demotions.with_label_values(&[cause]);
        }
        Ok(metrics)
    }

    pub(crate) fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.leader.clone()))?;
        registry.register(Box::new(self.slot.clone()))?;
        registry.register(Box::new(self.terms.clone()))?;
        registry.register(Box::new(self.checks.clone()))?;
        registry.register(Box::new(self.check_seconds.clone()))?;
        registry.register(Box::new(self.wait_seconds.clone()))?;
        registry.register(Box::new(self.demotions.clone()))?;
        Ok(())
    }
}

/// The label of a demotion's cause in `leaderrun_demotions_total`.
pub(crate) fn demotion_cause(err: &Error) -> &'static str {
    match err {
        Error::SessionClosed(_) => "session_closed",
        Error::Timeout { .. } => "timeout",
        Error::LockNotHeld { .. } => "lock_not_held",
        Error::BackendChanged { .. } => "backend_changed",
        Error::InRecovery { .. } => "in_recovery",
        Error::SafeWindowPassed { .. } => "safe_window_passed",
        Error::StepDownRequested => "step_down",
        e if e.is_closed() => "session_closed",
        _ => "check_failed",
    }
}

/// Finds the election metrics already registered on `registry`, or registers new ones.
///
/// prometheus' `AlreadyReg` does not hand back the existing collector (Go's does), so electors
/// remember which registries they registered on. Registry identity is tested by registering a
/// throw-away collector with a unique name on one registry and seeing whether the other
/// refuses it as already registered; both registrations are undone at once.
pub(crate) fn shared_metrics(registry: &Registry) -> Result<Arc<ElectorMetrics>, Error> {
    static KNOWN: Mutex<Vec<(Registry, Arc<ElectorMetrics>)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    for (other, metrics) in known.iter() {
        if same_registry(other, registry) {
            return Ok(metrics.clone());
        }
    }
    let metrics = Arc::new(ElectorMetrics::new().map_err(Error::Metrics)?);
    metrics.register(registry).map_err(Error::Metrics)?;
    known.push((registry.clone(), metrics.clone()));
    Ok(metrics)
}

pub(crate) fn same_registry(a: &Registry, b: &Registry) -> bool {
    use prometheus::core::{Collector, Desc};
    use prometheus::proto::MetricFamily;

    #[derive(Clone)]
    struct Probe(Desc);
    impl Collector for Probe {
        fn desc(&self) -> Vec<&Desc> {
            vec![&self.0]
        }
        fn collect(&self) -> Vec<MetricFamily> {
            Vec::new()
        }
    }

    static PROBES: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "leaderrun_registry_probe_{}",
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let Ok(desc) = Desc::new(
        name,
        "identity probe".into(),
        Vec::new(),
        Default::default(),
    ) else {
        return false;
    };
    let probe = Probe(desc);
    if a.register(Box::new(probe.clone())).is_err() {
        return false;
    }
    let same = matches!(
        b.register(Box::new(probe.clone())),
        Err(prometheus::Error::AlreadyReg)
    );
    if !same {
        let _ = b.unregister(Box::new(probe.clone()));
    }
    let _ = a.unregister(Box::new(probe));
    same
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn every_demotion_cause_is_a_label_value() {
        let causes = [
            Error::SessionClosed(None),
            Error::StepDownRequested,
            Error::SafeWindowPassed {
                since: std::time::Duration::ZERO,
            },
        ];
        for cause in &causes {
            assert!(DEMOTION_CAUSES.contains(&demotion_cause(cause)));
        }
    }

    #[test]
    pub(crate) fn registry_identity() {
        let a = Registry::new();
        let b = Registry::new();
        assert!(same_registry(&a, &a.clone()));
        assert!(!same_registry(&a, &b));
        // Probes leave nothing behind.
        assert!(a.gather().is_empty());
        assert!(b.gather().is_empty());
    }
}
