//! The election's metrics on a registry, shared by electors that share the registry.

use std::sync::{Arc, Mutex, Weak};

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
pub(crate) const DEMOTION_CAUSES: [&str; 10] = [
    "session_closed",
    "timeout",
    "check_failed",
    "lock_not_held",
    "backend_changed",
    "in_recovery",
    "safe_window_passed",
    "step_down",
    "given_up",
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
                     backend_changed, in_recovery, safe_window_passed, step_down, given_up, abandoned.",
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

    /// The collectors, each a handle on the same series as the field it clones.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.leader.clone()),
            Box::new(self.slot.clone()),
            Box::new(self.terms.clone()),
            Box::new(self.checks.clone()),
            Box::new(self.check_seconds.clone()),
            Box::new(self.wait_seconds.clone()),
            Box::new(self.demotions.clone()),
        ]
    }

    /// Registers every collector on `registry`, or none: one that cannot be registered (a
    /// name the application uses already) takes back those registered before it, so a failed
    /// [`Elector::new`](crate::Elector::new) leaves the registry as it found it.
    fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        for (i, collector) in self.collectors().into_iter().enumerate() {
            // prometheus' own error does not say which name is taken.
            let names: Vec<String> = collector.desc().iter().map(|d| d.fq_name.clone()).collect();
            if let Err(err) = registry.register(collector) {
                // Fresh handles on the same series: unregister matches by description.
                for done in self.collectors().into_iter().take(i) {
                    let _ = registry.unregister(done);
                }
                return Err(match err {
                    prometheus::Error::AlreadyReg => prometheus::Error::Msg(format!(
                        "{} is already registered by another collector",
                        names.join(", ")
                    )),
                    err => err,
                });
            }
        }
        Ok(())
    }
}

/// The election's metrics as registered on one registry, for as long as an elector uses them:
/// the last one dropped takes them off the registry again.
pub(crate) struct Registered {
    pub(crate) metrics: ElectorMetrics,
    registry: Registry,
}

impl std::ops::Deref for Registered {
    type Target = ElectorMetrics;
    fn deref(&self) -> &ElectorMetrics {
        &self.metrics
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut known = known();
        let me: *const Registered = self;
        // Unless `shared_metrics` took the entry over while this drop waited for the lock
        // (and took these series off itself, to register new ones).
        if let Some(i) = known.iter().position(|(_, w)| std::ptr::eq(w.as_ptr(), me)) {
            known.swap_remove(i);
            for collector in self.metrics.collectors() {
                let _ = self.registry.unregister(collector);
            }
        }
    }
}

/// The registries electors registered on, each with its live metrics ([`shared_metrics`]).
static KNOWN: Mutex<Vec<(Registry, Weak<Registered>)>> = Mutex::new(Vec::new());

fn known() -> std::sync::MutexGuard<'static, Vec<(Registry, Weak<Registered>)>> {
    KNOWN.lock().unwrap_or_else(|e| e.into_inner())
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
        Error::GivenUp => "given_up",
        e if e.is_closed() => "session_closed",
        _ => "check_failed",
    }
}

/// Finds the election metrics already registered on `registry` by a live elector, or
/// registers new ones.
///
/// prometheus' `AlreadyReg` does not hand back the existing collector (Go's does, which is how
/// the seed's `New` reuses a gauge), so electors remember which registries they registered on,
/// weakly: the last elector of a registry dropped takes the metrics off it ([`Registered`]) and
/// its entry here goes with the next call, so neither the registries nor this list outlive the
/// electors. Registry identity is tested by registering a probe ([`same_registry`]); a live
/// entry is not upgraded to be compared, so a scan never keeps another registry's metrics
/// alive past their last elector.
///
/// # Errors
/// [`Error::Metrics`] when a name is taken on `registry` by something else (the application's
/// own `plexsphere_background_leader`, say); the registry is then left as it was.
pub(crate) fn shared_metrics(registry: &Registry) -> Result<Arc<Registered>, Error> {
    let mut known = known();
    if let Some(i) = known.iter().position(|(r, _)| same_registry(r, registry)) {
        if let Some(registered) = known[i].1.upgrade() {
            return Ok(registered);
        }
        // Its last elector is being dropped right now: its series are taken off here (the
        // drop, which waits for this lock, then finds its entry gone), and new ones registered.
        known.swap_remove(i);
        for collector in ElectorMetrics::new().map_err(Error::Metrics)?.collectors() {
            let _ = registry.unregister(collector);
        }
    }
    let metrics = ElectorMetrics::new().map_err(Error::Metrics)?;
    metrics.register(registry).map_err(Error::Metrics)?;
    let registered = Arc::new(Registered {
        metrics,
        registry: registry.clone(),
    });
    known.push((registry.clone(), Arc::downgrade(&registered)));
    Ok(registered)
}

/// Whether `a` and `b` are one registry: a probe registered on `a` is refused by `b`. The
/// probe's name is always the same (prometheus keeps every name it saw, unregistered or not),
/// and callers hold `KNOWN`'s lock, so two probes never meet.
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

    let Ok(desc) = Desc::new(
        "leaderrun_registry_probe".to_owned(),
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
            Error::GivenUp,
            Error::SafeWindowPassed {
                since: std::time::Duration::ZERO,
            },
        ];
        for cause in &causes {
            assert!(DEMOTION_CAUSES.contains(&demotion_cause(cause)));
        }
    }

    #[test]
    fn a_failed_registration_leaves_the_registry_as_it_was() {
        let registry = Registry::new();
        // The application's own collector under one of the election's names.
        let own = IntCounter::new("leaderrun_terms_started_total", "the application's").unwrap();
        registry.register(Box::new(own.clone())).unwrap();
        let refused = shared_metrics(&registry).err().expect("refused");
        // The message names the metric that is taken, not always the gauge.
        assert_eq!(
            crate::error::Chain(&refused).to_string(),
            "cannot register the election's metrics on the registry: Error: \
             leaderrun_terms_started_total is already registered by another collector"
        );
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert_eq!(names, ["leaderrun_terms_started_total"]);
    }

    #[test]
    fn metrics_live_as_long_as_an_elector_uses_them() {
        let registry = Registry::new();
        let first = shared_metrics(&registry).unwrap();
        let second = shared_metrics(&registry).unwrap();
        assert!(
            Arc::ptr_eq(&first, &second),
            "one registry, one set of series"
        );
        first.leader.set(1);
        drop(first);
        assert!(registry
            .gather()
            .iter()
            .any(|f| f.name() == super::GAUGE_NAME));
        drop(second);
        let left: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert!(left.is_empty(), "the last one takes them off: {left:?}");
        // And a new elector on the registry registers them again.
        let again = shared_metrics(&registry).unwrap();
        assert_eq!(again.leader.get(), 0);
        drop(again);
        // Registries given up are not kept: many come and go, each registers at once.
        for _ in 0..200 {
            let registry = Registry::new();
            let metrics = shared_metrics(&registry).unwrap();
            assert!(!registry.gather().is_empty());
            drop(metrics);
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
