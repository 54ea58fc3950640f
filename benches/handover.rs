//! What users feel, measured: handover and failover latency with their overlap windows,
//! one-shot overhead, and footprint. Starts a throwaway cluster, runs each measurement N
//! times, prints a table (min/median/p95/max) and writes it to `target/bench/results.{md,json}`.
//!
//! ```text
//! cargo bench --bench handover                 # 5 runs each, all measurements
//! cargo bench --bench handover -- --runs 9     # more runs
//! cargo bench --bench handover -- --quick      # 1 run each, small footprint (a smoke run)
//! cargo bench --bench handover -- --only herd  # only the groups whose name contains "herd"
//! cargo bench --bench handover -- --only "default log level"  # opt-in: 1000 standbys at INFO
//! PATH=$(scripts/pg-major 18):$PATH cargo bench --bench handover   # against PostgreSQL 18
//! ```
//!
//! Timestamps come from the child itself (`date +%s%N` at start, in its TERM trap at the end)
//! and from this process (CLOCK_REALTIME), so they share a clock; `date` adds about a
//! millisecond of its own to every child start.

#[allow(dead_code)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::measure::{
    self, check_all_gone, connection_limit, cron_herd, etcd, failover, fleet, floor_handover,
    footprint, graceful, one_shot, one_shot_overhead, progress, readyz, tree_failover, FloorEvent,
    Row,
};
use support::Cluster;

/// The groups of rows, in order; `--only SUBSTRING` runs those whose name contains it.
const GROUPS: &[&str] = &[
    "handover after SIGTERM",
    "failover",
    "tree of three",
    "one-shot",
    "footprint",
    "waiting standbys",
    "1000 standbys at the default log level",
    "connection limit",
    "cron herd",
    "readyz",
    "etcd",
];

fn main() {
    // What users build, and floor clients built alike (BENCHMARKS.md, fifteenth pass).
    progress("building leaderrun as `cargo build --release` does, and the floor clients");
    measure::build_product();
    progress(&format!(
        "start: PostgreSQL {} from {}",
        support::cluster::server_major(),
        support::cluster::bin_dir().display()
    ));
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let runs = value("--runs")
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 1 } else { 5 });
    let only = value("--only").map(|s| s.to_lowercase());
    let selected: Vec<&str> = GROUPS
        .iter()
        .copied()
        // The 1000 at the default log level saturate a small machine for minutes (see
        // BENCHMARKS.md): only when `--only` names them.
        .filter(|g| match &only {
            None => !g.contains("default log level"),
            Some(o) => g.to_lowercase().contains(o),
        })
        .collect();
    assert!(
        !selected.is_empty(),
        "--only {:?} matches no group of {GROUPS:?}",
        only.unwrap_or_default()
    );
    let (sizes, failover_at, window) = if quick {
        (vec![10], vec![10], Duration::from_secs(2))
    } else {
        (
            vec![200, 500, 1000],
            vec![200, 1000],
            Duration::from_secs(20),
        )
    };
    let largest = sizes.iter().copied().max().unwrap_or(0) as u32;
    // Room for the largest fleet, its leader, the previous step's sessions still closing, and
    // the benchmark's own psql.
    let cluster = Cluster::start_private_with(if quick { 100 } else { largest + 200 });
    let mut rows: Vec<Row> = Vec::new();
    for group in &selected {
        progress(group);
        match *group {
            "handover after SIGTERM" => {
                progress("  intervals 5s and 1s, and the two floors, in rounds");
                let merged = rounds(
                    runs,
                    &mut [
                        &mut || vec![graceful(&cluster, "5s", 1)],
                        &mut || vec![graceful(&cluster, "1s", 1)],
                        &mut || vec![floor_handover(&cluster, 1, FloorEvent::Unlock)],
                        &mut || vec![floor_handover(&cluster, 1, FloorEvent::ChildStopped)],
                    ],
                );
                let ratio = ratio_row(
                    "handover after SIGTERM, interval 5s / its floor",
                    &merged[0][0],
                    &merged[2][0],
                );
                // Timed from the same two stamps as the leaderrun rows: the old child's exit
                // after its end stamp is in both (BENCHMARKS.md, fifteenth pass).
                let like = ratio_row(
                    "handover after SIGTERM, interval 5s / the floor with the holder's child",
                    &merged[0][0],
                    &merged[3][0],
                );
                rows.extend(merged.into_iter().flatten());
                rows.push(ratio);
                rows.push(like);
            }
            "failover" => {
                progress("  failover after kill -9, and its floor, in rounds");
                let merged = rounds(
                    runs,
                    &mut [
                        &mut || {
                            let (latency, overlap) = failover(&cluster, "kill -9", 1);
                            vec![latency, overlap]
                        },
                        &mut || vec![floor_handover(&cluster, 1, FloorEvent::Killed)],
                    ],
                );
                let ratio = ratio_row(
                    "failover after kill -9 / its floor",
                    &merged[0][0],
                    &merged[1][0],
                );
                rows.extend(merged.into_iter().flatten());
                rows.push(ratio);
                for how in ["pg_terminate_backend", "partition"] {
                    progress(&format!("  failover after {how}"));
                    let (latency, overlap) = failover(&cluster, how, runs);
                    rows.push(latency);
                    rows.push(overlap);
                }
            }
            "tree of three" => {
                for how in ["kill -9", "SIGSTOP of leaderrun alone"] {
                    progress(&format!("  failover after {how}, tree of three"));
                    let (latency, overlap) = tree_failover(&cluster, how, runs);
                    rows.push(latency);
                    rows.push(overlap);
                }
            }
            "one-shot" => {
                let shots = one_shot(&cluster, runs, true);
                let overhead = one_shot_overhead(&shots);
                rows.extend(shots);
                rows.extend(overhead);
            }
            "footprint" => rows.extend(footprint(&cluster, window)),
            "waiting standbys" => {
                rows.extend(fleet(&cluster, &sizes, &failover_at, window, runs, true));
                // The default log level once, at the smallest size.
                let first = &sizes[..1];
                rows.extend(fleet(&cluster, first, first, window, runs, false));
            }
            "1000 standbys at the default log level" => {
                let last = &sizes[sizes.len() - 1..];
                rows.extend(fleet(&cluster, last, last, window, runs, false));
            }
            "connection limit" => rows.extend(connection_limit(&cluster, runs)),
            "cron herd" => rows.extend(cron_herd(150, 40, runs.min(3))),
            "readyz" => rows.extend(readyz(&cluster, runs)),
            "etcd" => rows.extend(etcd(runs)),
            other => unreachable!("group {other}"),
        }
        check_all_gone(group);
    }
    progress("done");

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    // The server is the one the tests would use: the first initdb on PATH, so
    // `PATH=$(scripts/pg-major 18):$PATH cargo bench --bench handover` measures 18.
    let server = format!(
        "PostgreSQL {} ({})",
        support::cluster::server_major(),
        support::cluster::bin_dir().display()
    );
    let mut md = format!("Machine: {cores} cores, {mem}. Server: {server}. Runs per measurement: {runs}. Groups: {}.\n\n| measurement | unit | min | median | p95 | max | n | note |\n|---|---|---|---|---|---|---|---|\n", selected.join(", "));
    let mut json = Vec::new();
    for row in &rows {
        match row.stats() {
            Some((min, med, p95, max)) => {
                // Cores are small numbers: three decimals; ratios two.
                let d = match row.unit {
                    "cores" => 3,
                    "×" => 2,
                    _ => 1,
                };
                md.push_str(&format!(
                    "| {} | {} | {min:.d$} | {med:.d$} | {p95:.d$} | {max:.d$} | {} | {} |\n",
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

/// Runs each of `measures` once per round for `runs` rounds, round-robin (round *i* starts at
/// measure *i* mod their number), and merges each one's rows: a leaderrun row and its floor,
/// compared as a ratio, then meet the machine's drift alike (run one after the other, a floor
/// could be taken minutes later on a machine that had turned half as fast meanwhile). Each
/// measure returns its rows of one run, the same rows every time.
fn rounds(runs: usize, measures: &mut [&mut dyn FnMut() -> Vec<Row>]) -> Vec<Vec<Row>> {
    let mut merged: Vec<Vec<Row>> = measures.iter().map(|_| Vec::new()).collect();
    for round in 0..runs {
        for k in 0..measures.len() {
            let i = (round + k) % measures.len();
            let rows = (measures[i])();
            if merged[i].is_empty() {
                merged[i] = rows;
            } else {
                for (into, row) in merged[i].iter_mut().zip(rows) {
                    into.samples.extend(row.samples);
                }
            }
        }
    }
    merged
}

/// Each round's sample of `row` over the same round's sample of `floor` ([`rounds`]), as a row
/// of ratios (the goals in BENCHMARKS.md are such ratios).
fn ratio_row(name: &str, row: &Row, floor: &Row) -> Row {
    Row {
        name: name.into(),
        unit: "×",
        samples: row
            .samples
            .iter()
            .zip(&floor.samples)
            .map(|(r, f)| r / f)
            .collect(),
        note: "each round's run over its floor's run of the same round".into(),
    }
}
