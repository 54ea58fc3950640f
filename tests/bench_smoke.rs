//! The benchmark's measurements run and produce numbers (one run each; the figures themselves
//! are the benchmark's business, not the test suite's).

use crate::measure::{failover, graceful, one_shot};
use crate::support::Cluster;

#[test]
fn the_benchmark_measurements_run() {
    let cluster = Cluster::start_private();
    let mut rows = vec![graceful(&cluster, "1s", 1)];
    let (latency, overlap) = failover(&cluster, "kill -9", 1);
    rows.push(latency);
    rows.push(overlap);
    rows.extend(one_shot(&cluster, 1));
    for row in &rows {
        let (min, median, _, max) = row
            .stats()
            .unwrap_or_else(|| panic!("{}: no samples", row.name));
        assert!(min <= median && median <= max, "{}", row.name);
    }
}
