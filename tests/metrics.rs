//! `/metrics` through the binary against a real PostgreSQL: the leader gauge across a failover,
//! every series there at zero from the start, what the check duration counts, and the slot
//! gauge.

use std::net::{SocketAddr, TcpListener};

use nix::sys::signal::Signal;

use crate::support::{
    http, leaderrun, probe_addr, sample, secs, unique_lock_id, wait_for, Cluster, Replica, Scratch,
    Setup, INTERVAL,
};

#[test]
fn the_gauge_flips_on_failover_across_two_replicas() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let args = ["--http-addr", "127.0.0.1:0", "--", job.to_str().unwrap()];
    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| Replica::start(cluster, id, INTERVAL, &args))
        .collect();
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let addrs: Vec<SocketAddr> = replicas.iter().map(probe_addr).collect();
    let leader = replicas.iter().position(|r| r.pid() == first.ppid).unwrap();
    let other = 1 - leader;
    let gauge = |i: usize| {
        sample(
            &http(addrs[i], "GET", "/metrics").1,
            "plexsphere_background_leader",
        )
    };
    wait_for("the standby to have checked", secs(5.0), || {
        (gauge(other) == Some(0.0)).then_some(())
    });
    assert_eq!(gauge(leader), Some(1.0));
    let metrics = http(addrs[leader], "GET", "/metrics").1;
    for name in [
        "leaderrun_terms_started_total",
        "leaderrun_child_starts_total",
        "leaderrun_child_start_failures_total",
        "leaderrun_seconds_since_last_successful_check",
        "leaderrun_last_run_start_timestamp_seconds",
        "leaderrun_last_success_timestamp_seconds",
        "process_resident_memory_bytes",
    ] {
        assert!(
            sample(&metrics, name).is_some(),
            "{name} missing:\n{metrics}"
        );
    }
    // The leader started its run: the start's time is there, no success yet (it still runs).
    assert!(sample(&metrics, "leaderrun_last_run_start_timestamp_seconds").unwrap() > 1e9);
    assert_eq!(
        sample(&metrics, "leaderrun_last_success_timestamp_seconds"),
        Some(0.0)
    );
    assert!(
        metrics.contains("leaderrun_checks_total{outcome=\"granted\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("leaderrun_check_duration_seconds_bucket"),
        "{metrics}"
    );

    replicas[leader].signal(Signal::SIGTERM);
    replicas[leader].wait_exit(secs(5.0));
    wait_for("the other replica's gauge to read 1", secs(5.0), || {
        (gauge(other) == Some(1.0)).then_some(())
    });
}

/// The label values README.md (Metrics and probes) says every counter has from the start, as
/// `(metric, label, values)`: the sentence "Every counter exists from the start at 0 with each
/// label value it can take (check outcomes `granted`, …; demotion causes …)" is the one list
/// of them the test and the documentation share; the crate keeps its own to create them.
fn documented_label_values() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let list = readme
        .split_once("each label value it can take (")
        .and_then(|(_, rest)| rest.split_once("), so"))
        .expect("README.md lists each counter's label values")
        .0;
    list.split("; ")
        .map(|group| {
            let (words, values) = group.split_once(" `").expect("words, then `values`");
            let (name, label) = match words {
                "check outcomes" => ("leaderrun_checks_total", "outcome"),
                "demotion causes" => ("leaderrun_demotions_total", "cause"),
                "child exits" => ("leaderrun_child_exits_total", "outcome"),
                "ticks" => ("leaderrun_ticks_total", "outcome"),
                other => panic!("README.md names a counter this test does not know: {other:?}"),
            };
            let values = format!("`{values}")
                .split(", ")
                .map(|v| v.trim_matches('`').to_owned())
                .collect();
            (name, label, values)
        })
        .collect()
}

/// Every counter is there from the start at 0, with each label value it can take, so that
/// Prometheus' `increase()` sees the first event of each.
#[test]
fn every_counter_series_exists_at_zero_from_the_start() {
    let refused = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
    ])
    .args(["--check-interval", INTERVAL, "--http-addr", "127.0.0.1:0"])
    .args(["--every", "1h", "--", "true"]);
    let replica = Replica::spawn(cmd);
    let metrics = http(probe_addr(&replica), "GET", "/metrics").1;
    for (name, label, documented) in documented_label_values() {
        let prefix = format!("{name}{{{label}=\"");
        let mut shown: Vec<String> = Vec::new();
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let (value, sample) = rest.split_once("\"} ").expect("one label, then the sample");
            // The server refuses every connection: this replica's checks fail, and its ticks
            // fall due while it is a standby; those two count from the first check on.
            let counting = matches!(
                (name, value),
                ("leaderrun_checks_total", "failed") | ("leaderrun_ticks_total", "standby")
            );
            if !counting {
                assert_eq!(sample, "0", "{line}: not at 0 from the start");
            }
            shown.push(value.to_owned());
        }
        shown.sort();
        // Its HELP names every value too, for one who reads /metrics and not the README.
        let help = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
            .unwrap_or_else(|| panic!("{name} has a HELP line"));
        for value in &documented {
            assert!(
                help.contains(value.as_str()),
                "{name}'s HELP lacks {value}: {help}"
            );
        }
        let mut documented = documented;
        documented.sort();
        assert_eq!(
            shown, documented,
            "{name}'s {label} values on /metrics, and as README.md documents them"
        );
    }
    assert_eq!(sample(&metrics, "leaderrun_terms_started_total"), Some(0.0));
    assert_eq!(sample(&metrics, "leaderrun_child_starts_total"), Some(0.0));
    // --schedule's due times count there as --every's ticks do (README), and the HELP says so.
    let help = metrics
        .lines()
        .find_map(|l| l.strip_prefix("# HELP leaderrun_ticks_total "))
        .expect("a HELP line");
    assert!(
        help.contains("--every") && help.contains("--schedule"),
        "{help}"
    );
}

/// A standby's wait in the lock queue (up to a whole interval) is its own figure, not a
/// check's duration: a latency alert on checks does not fire on every standby.
#[test]
fn a_queue_wait_is_not_counted_as_check_duration() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let _leader = setup.replica("1s", &[]);
    scratch.wait_starts(1, secs(10.0));
    let standby = setup.replica("1s", &["--http-addr", "127.0.0.1:0"]);
    let addr = probe_addr(&standby);
    let metrics = wait_for("two waits in the lock queue", secs(15.0), || {
        let metrics = http(addr, "GET", "/metrics").1;
        (sample(&metrics, "leaderrun_lock_wait_seconds_count")? >= 2.0).then_some(metrics)
    });
    let value = |name: &str| sample(&metrics, name).unwrap();
    let waits =
        value("leaderrun_lock_wait_seconds_sum") / value("leaderrun_lock_wait_seconds_count");
    assert!(
        waits > 0.7,
        "a wait lasts about one interval: {waits} s\n{metrics}"
    );
    let checks = value("leaderrun_check_duration_seconds_count");
    assert!(checks >= 1.0, "{metrics}");
    let mean = value("leaderrun_check_duration_seconds_sum") / checks;
    assert!(mean < 0.5, "checks are round trips: {mean} s\n{metrics}");
}

#[test]
fn the_slot_gauge_names_each_leaders_slot() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let args = [
        "--slots",
        "2",
        "--http-addr",
        "127.0.0.1:0",
        "--",
        job.to_str().unwrap(),
    ];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(cluster, id, INTERVAL, &args))
        .collect();
    let starts = scratch.wait_starts(2, secs(10.0));
    let addrs: Vec<SocketAddr> = replicas.iter().map(probe_addr).collect();
    let slot_of = |i: usize| sample(&http(addrs[i], "GET", "/metrics").1, "leaderrun_slot");
    let standby = replicas
        .iter()
        .position(|r| starts.iter().all(|s| s.ppid != r.pid()))
        .unwrap();
    wait_for("the standby's gauge", secs(5.0), || {
        (slot_of(standby) == Some(-1.0)).then_some(())
    });
    for start in &starts {
        let i = replicas.iter().position(|r| r.pid() == start.ppid).unwrap();
        assert_eq!(slot_of(i), start.slot.map(f64::from), "replica {i}");
    }
}
