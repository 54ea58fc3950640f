//! What users feel, measured: handover and failover latency with their overlap windows,
//! one-shot overhead, and footprint. Starts a throwaway cluster, runs each measurement N
//! times, prints a table (min/median/p95/max) and writes it to `target/bench/results.{md,json}`.
//!
//! ```text
//! cargo bench --bench handover                 # 5 runs each, all measurements
//! cargo bench --bench handover -- --runs 9     # more runs
//! cargo bench --bench handover -- --quick      # 1 run each, small footprint (a smoke run)
//! ```
//!
//! Timestamps come from the child itself (`date +%s%N` at start, in its TERM trap at the end)
//! and from this process (CLOCK_REALTIME), so they share a clock; `date` adds about a
//! millisecond of its own to every child start.

#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;

mod measure;

use std::time::Duration;

use measure::{etcd, failover, footprint, graceful, one_shot, tree_failover};
use support::Cluster;

fn main() {
    let started = std::time::Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 1 } else { 5 });
    let cluster = Cluster::start_private_with(if quick { 100 } else { 700 });
    let mut rows = Vec::new();
    let progress = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    progress("handover after SIGTERM");
    rows.push(graceful(&cluster, "5s", runs));
    rows.push(graceful(&cluster, "1s", runs));
    for how in ["kill -9", "pg_terminate_backend", "partition"] {
        progress(&format!("failover after {how}"));
        let (latency, overlap) = failover(&cluster, how, runs);
        rows.push(latency);
        rows.push(overlap);
    }
    for how in ["kill -9", "SIGSTOP of leaderrun alone"] {
        progress(&format!("failover after {how}, tree of three"));
        let (latency, overlap) = tree_failover(&cluster, how, runs);
        rows.push(latency);
        rows.push(overlap);
    }
    progress("one-shot overhead");
    rows.extend(one_shot(&cluster, runs));
    let (standbys, window) = if quick {
        (vec![10], Duration::from_secs(2))
    } else {
        (vec![100, 500], Duration::from_secs(20))
    };
    progress("footprint and waiting standbys");
    rows.extend(footprint(&cluster, &standbys, window));
    progress("etcdctl lock, where installed");
    rows.extend(etcd(runs));
    progress("done");

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    let mut md = format!("Machine: {cores} cores, {mem}. Runs per measurement: {runs}.\n\n| measurement | unit | min | median | p95 | max | n | note |\n|---|---|---|---|---|---|---|---|\n");
    let mut json = Vec::new();
    for row in &rows {
        match row.stats() {
            Some((min, med, p95, max)) => {
                md.push_str(&format!(
                    "| {} | {} | {min:.1} | {med:.1} | {p95:.1} | {max:.1} | {} | {} |\n",
                    row.name,
                    row.unit,
                    row.samples.len(),
                    row.note
                ));
                json.push(serde_json::json!({"name": row.name, "unit": row.unit, "min": min, "median": med, "p95": p95, "max": max, "samples": row.samples, "note": row.note}));
            }
            None => {
                md.push_str(&format!(
                    "| {} | {} | – | – | – | – | 0 | {} |\n",
                    row.name, row.unit, row.note
                ));
                json.push(serde_json::json!({"name": row.name, "unit": row.unit, "samples": [], "note": row.note}));
            }
        }
    }
    print!("{md}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("results.md"), &md).unwrap();
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    eprintln!("written to {}", out.display());
}
