//! The benchmark's measurements run and produce numbers that a broken election would not
//! (one run each, with generous bounds; the figures themselves are the benchmark's business).

use crate::support::measure::{failover, graceful, one_shot, tree_failover, Row};
use crate::support::Cluster;

/// The check interval of `graceful` and `failover` (the default, 5 s).
const INTERVAL_MS: f64 = 5000.0;

fn samples(row: &Row) -> &[f64] {
    assert!(!row.samples.is_empty(), "{}: no samples", row.name);
    for s in &row.samples {
        assert!(s.is_finite(), "{}: {s}", row.name);
    }
    &row.samples
}

#[test]
fn the_benchmark_measurements_run() {
    let cluster = Cluster::start_private();
    // A standby waits in the lock queue, so a released or freed lock reaches it at once, not
    // at its next check: well under the interval. And never before the old child is gone.
    let handover = graceful(&cluster, "5s", 1);
    for &ms in samples(&handover) {
        assert!(
            ms > 0.0 && ms < INTERVAL_MS / 5.0,
            "{}: {ms} ms (old child's end → new child's start)",
            handover.name
        );
    }
    let (latency, overlap) = failover(&cluster, "kill -9", 1);
    for &ms in samples(&latency) {
        assert!(
            ms > 0.0 && ms < INTERVAL_MS / 5.0,
            "{}: {ms} ms",
            latency.name
        );
    }
    // No two children at once: the old child died before the new one started.
    for &ms in samples(&overlap) {
        assert!(
            ms <= 0.0,
            "{}: the children overlapped by {ms} ms",
            overlap.name
        );
    }
    // kill -9 of leaderrun with a tree of three: its watchdog kills all of it first.
    let (_, overlap) = tree_failover(&cluster, "kill -9", 1);
    for &ms in samples(&overlap) {
        assert!(
            ms <= 0.0,
            "{}: the old tree ran {ms} ms beside the new child",
            overlap.name
        );
    }
    let one_shots = one_shot(&cluster, 1, false);
    // `true`, flock, the in-process floor, TCP, Unix socket, and `--pid-namespace` where it may.
    let namespaced = leaderrun::process::pidns::PidNamespace::new().is_ok();
    assert_eq!(one_shots.len(), 5 + usize::from(namespaced));
    for row in &one_shots {
        for &ms in samples(row) {
            assert!(ms > 0.0, "{}: {ms} ms", row.name);
        }
        let (min, median, p95, max) = row.stats().unwrap();
        assert!(min <= median && median <= p95 && p95 <= max, "{}", row.name);
    }
}
