//! The operator surface against a real PostgreSQL: metrics and probes over HTTP, `status`,
//! `doctor` (also against a hot standby), JSON logs, the systemd protocol, secrets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{
    leaderrun, status, unique_lock_id, wait_for, wait_status_waiters, Cluster, Replica, Scratch,
    CLASS,
};

const INTERVAL: &str = "200ms";

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// One HTTP/1.0 request; returns the status code and the body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the probe port");
    stream.set_read_timeout(Some(secs(5.0))).unwrap();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}; read so far: {raw:?}"));
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The address a replica started with `--http-addr 127.0.0.1:0` bound, from its log.
fn probe_addr(replica: &Replica) -> SocketAddr {
    wait_for("the HTTP address in the log", secs(5.0), || {
        let log = replica.log();
        let line = log.lines().find(|l| l.contains("serving /metrics"))?;
        let addr = line.split("addr=").nth(1)?.split_whitespace().next()?;
        addr.parse().ok()
    })
}

/// The value of an unlabelled sample in a Prometheus text exposition.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

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
        "leaderrun_seconds_since_last_successful_check",
        "process_resident_memory_bytes",
    ] {
        assert!(
            sample(&metrics, name).is_some(),
            "{name} missing:\n{metrics}"
        );
    }
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
    let series = [
        (
            "leaderrun_checks_total",
            "outcome",
            &["granted", "refused", "verified", "lost"][..],
        ),
        (
            "leaderrun_demotions_total",
            "cause",
            &[
                "session_closed",
                "timeout",
                "check_failed",
                "lock_not_held",
                "backend_changed",
                "in_recovery",
                "safe_window_passed",
                "step_down",
                "abandoned",
            ][..],
        ),
        (
            "leaderrun_child_exits_total",
            "outcome",
            &["success", "failure", "stopped"][..],
        ),
        (
            "leaderrun_ticks_total",
            "outcome",
            &["success", "failure", "skipped", "interrupted"][..],
        ),
    ];
    for (name, label, values) in series {
        for value in values {
            let line = format!("{name}{{{label}=\"{value}\"}} 0");
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} missing:\n{metrics}"
            );
        }
    }
    // Failed checks are counted under their own label.
    assert!(
        metrics.contains("leaderrun_checks_total{outcome=\"failed\"}"),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "leaderrun_terms_started_total"), Some(0.0));
    assert_eq!(sample(&metrics, "leaderrun_child_starts_total"), Some(0.0));
}

/// A standby's wait in the lock queue (up to a whole interval) is its own figure, not a
/// check's duration: a latency alert on checks does not fire on every standby.
#[test]
fn a_queue_wait_is_not_counted_as_check_duration() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    let _leader = Replica::start(cluster, id, "1s", &["--", job]);
    scratch.wait_starts(1, secs(10.0));
    let standby = Replica::start(
        cluster,
        id,
        "1s",
        &["--http-addr", "127.0.0.1:0", "--", job],
    );
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
fn probes_follow_the_readiness_table() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    // Fails while the marker file exists.
    let marker = scratch.file("fail");
    let job = scratch.child_script(
        "job.sh",
        &format!("[ -e '{}' ] && exit 3\nexit 0", marker.display()),
    );
    let job = job.to_str().unwrap();
    let holder_script = scratch.child_script("holder.sh", "exec sleep 600");
    let leader = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--http-addr", "127.0.0.1:0", "--every", "200ms", "--", job],
    );
    let addr = probe_addr(&leader);
    wait_for("the leader to be ready", secs(5.0), || {
        let (code, body) = http(addr, "GET", "/readyz");
        (code == 200 && body.starts_with("leader, term 1")).then_some(())
    });
    // A failed tick fails readiness with its error, until a later tick succeeds.
    std::fs::write(&marker, "").unwrap();
    let body = wait_for("readiness to fail", secs(5.0), || {
        let (code, body) = http(addr, "GET", "/readyz");
        (code == 503).then_some(body)
    });
    assert!(body.contains("exit code 3"), "{body}");
    std::fs::remove_file(&marker).unwrap();
    wait_for("readiness to recover", secs(5.0), || {
        (http(addr, "GET", "/readyz").0 == 200).then_some(())
    });
    assert_eq!(http(addr, "GET", "/healthz"), (200, "ok\n".to_owned()));

    // A standby is ready: it runs nothing.
    let standby = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--",
            holder_script.to_str().unwrap(),
        ],
    );
    let standby_addr = probe_addr(&standby);
    wait_for("the standby to be ready", secs(5.0), || {
        (http(standby_addr, "GET", "/readyz") == (200, "standby\n".to_owned())).then_some(())
    });

    // Clients that connect and send nothing, or half a request, never stall the election: the
    // ticks go on and leadership holds. (The abuses of the port itself are in the http module.)
    let mut idle: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for stream in idle.iter_mut().take(20) {
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x")
            .unwrap();
    }
    let ticks_before = scratch.starts().len();
    let during = scratch.wait_starts(ticks_before + 3, secs(5.0));
    assert!(during.iter().all(|s| s.term == 1));
    drop(idle);
    assert_eq!(http(addr, "GET", "/healthz"), (200, "ok\n".to_owned()));

    // HEAD works; other methods and paths do not.
    assert_eq!(http(addr, "HEAD", "/readyz"), (200, String::new()));
    assert_eq!(http(addr, "POST", "/readyz").0, 405);
    assert_eq!(http(addr, "GET", "/nope").0, 404);
}

#[test]
fn probes_before_the_first_check_and_when_the_loop_is_stuck() {
    // A server that accepts TCP connections and never answers: the first connect hangs until
    // the DSN's connect_timeout, so there is no check yet, and the loop is stuck.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=20"),
    ])
    .args([
        "--check-interval",
        INTERVAL,
        "--http-addr",
        "127.0.0.1:0",
        "--",
        "true",
    ]);
    let replica = Replica::spawn(cmd);
    let addr = probe_addr(&replica);
    assert_eq!(
        http(addr, "GET", "/readyz"),
        (503, "booted, no check yet\n".to_owned())
    );
    let body = wait_for(
        "liveness to fail after 3 intervals without a check",
        secs(5.0),
        || {
            let (code, body) = http(addr, "GET", "/healthz");
            (code == 503).then_some(body)
        },
    );
    assert!(body.contains("no check for"), "{body}");
    // Never a successful check: the gauge counts from start, so an alert on it fires.
    let metrics = http(addr, "GET", "/metrics").1;
    let since = sample(&metrics, "leaderrun_seconds_since_last_successful_check").unwrap();
    assert!(since > 0.5, "{since}");
    drop(silent);
}

/// A replica whose checks cannot reach the server (a missing database, a port where nothing
/// listens) is never ready: `/readyz` is 503 with the check's error, check after check, while
/// `/healthz` says the loop runs.
#[test]
fn a_replica_that_cannot_reach_the_server_is_not_ready() {
    let cluster = Cluster::shared();
    let refused = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_port = refused.local_addr().unwrap().port();
    drop(refused);
    let dsns = [
        (
            format!(
                "host=127.0.0.1 port={} user=postgres dbname=leaderrun_no_such_db",
                cluster.addr().port()
            ),
            "does not exist",
        ),
        (
            format!("host=127.0.0.1 port={refused_port} user=postgres dbname=postgres"),
            "refused",
        ),
    ];
    let replicas: Vec<(Replica, &str)> = dsns
        .iter()
        .map(|(dsn, expect)| {
            let mut cmd = leaderrun();
            cmd.args(["--dsn", dsn, "--lock-id", &unique_lock_id().to_string()])
                .args(["--check-interval", INTERVAL, "--http-addr", "127.0.0.1:0"])
                .args(["--", "true"]);
            (Replica::spawn(cmd), *expect)
        })
        .collect();
    for (replica, expect) in &replicas {
        let addr = probe_addr(replica);
        // Three failed checks in a row, and still not ready.
        replica.wait_log("acquire lock connection", 3, secs(10.0));
        let (code, body) = http(addr, "GET", "/readyz");
        assert_eq!(code, 503, "{body}");
        assert!(body.starts_with("cannot reach the server: "), "{body}");
        assert!(body.to_lowercase().contains(expect), "{body}");
        assert_eq!(http(addr, "GET", "/healthz"), (200, "ok\n".to_owned()));
    }
}

/// A standby that was ready is not ready while its checks fail to reach the server, and is
/// ready again once one does.
#[test]
fn a_standby_is_not_ready_while_its_checks_fail() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    let _leader = Replica::start(cluster, id, INTERVAL, &["--", job]);
    scratch.wait_starts(1, secs(10.0));
    let proxy = crate::support::proxy::Proxy::start(cluster.addr());
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            proxy.port()
        ),
        "--lock-id",
        &id.to_string(),
    ])
    .args(["--check-interval", INTERVAL, "--http-addr", "127.0.0.1:0"])
    .args(["--", job]);
    let standby = Replica::spawn(cmd);
    let addr = probe_addr(&standby);
    wait_for("the standby to be ready", secs(10.0), || {
        (http(addr, "GET", "/readyz") == (200, "standby\n".to_owned())).then_some(())
    });
    proxy.blackhole();
    proxy.cut();
    let body = wait_for("the standby to be not ready", secs(10.0), || {
        let (code, body) = http(addr, "GET", "/readyz");
        (code == 503).then_some(body)
    });
    assert!(body.starts_with("cannot reach the server: "), "{body}");
    assert_eq!(http(addr, "GET", "/healthz"), (200, "ok\n".to_owned()));
    proxy.forward();
    wait_for("the standby to be ready again", secs(10.0), || {
        (http(addr, "GET", "/readyz") == (200, "standby\n".to_owned())).then_some(())
    });
}

#[test]
fn a_port_in_use_exits_125() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = leaderrun()
        .args([
            "--dsn",
            &Cluster::shared().dsn(),
            "--http-addr",
            &addr,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot serve HTTP on"), "{stderr}");
}

#[test]
fn status_shows_the_leader_or_none() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let none = status(cluster, id, false);
    assert_eq!(none.status.code(), Some(1));
    let table = String::from_utf8_lossy(&none.stdout);
    assert!(table.contains("leader         none"), "{table}");
    assert!(table.contains("waiters        none"), "{table}");

    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let _leader = Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    // The term shows from its first check, 50 ms after the grant (README).
    let report: serde_json::Value = wait_for("status to show the term", secs(5.0), || {
        let out = status(cluster, id, true);
        assert_eq!(out.status.code(), Some(0));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (!report["leader"]["term"].is_null()).then_some(report)
    });
    assert_eq!(report["lock"], format!("{CLASS}:{id}"));
    assert_eq!(report["database"], "postgres");
    assert_eq!(report["waiters"], serde_json::json!([]));
    let leader = &report["leader"];
    assert_eq!(leader["pid"], start.backend_pid);
    assert_eq!(leader["term"], 1);
    assert_eq!(leader["fencing_token"], start.fencing_token);
    assert_eq!(leader["client_addr"], "127.0.0.1");
    assert!(leader["since"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        leader["application_name"].as_str().unwrap(),
        format!(
            "leaderrun@{}:{}",
            nix::unistd::gethostname().unwrap().to_string_lossy(),
            start.ppid
        )
    );
    let table = String::from_utf8(status(cluster, id, false).stdout).unwrap();
    assert!(
        table.contains(&format!("leader pid     {}", start.backend_pid)),
        "{table}"
    );
    assert!(table.contains("leading since"), "{table}");
    assert!(table.contains("waiters        none"), "{table}");

    // Two standbys wait in the server's queue: both are listed as waiters, the leader is not.
    let standbys: Vec<Replica> = (0..2)
        .map(|_| Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]))
        .collect();
    let waiting: Vec<i32> = standbys
        .iter()
        .map(|r| {
            wait_for("the standby's session", secs(10.0), || {
                let backends = cluster.backends_of(r.pid());
                (backends.len() == 1).then(|| backends[0])
            })
        })
        .collect();
    assert!(!waiting.contains(&start.backend_pid));
    wait_status_waiters(cluster, id, &waiting, secs(5.0));
    let report: serde_json::Value =
        serde_json::from_slice(&status(cluster, id, true).stdout).unwrap();
    assert_eq!(report["leader"]["pid"], start.backend_pid);
    assert_eq!(scratch.starts().len(), 1);

    let unreachable = leaderrun()
        .args([
            "status",
            "--dsn",
            "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        ])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(125));
}

/// `doctor --scratch-id` takes the scratch key it is given, and says which it took; a scratch
/// key someone holds is a failed check with a hint, not a broken lock.
#[test]
fn doctor_takes_the_scratch_id_it_is_given_and_says_so() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let held = unique_lock_id();
    let _holder = Replica::start(cluster, held, INTERVAL, &["--", job.to_str().unwrap()]);
    scratch.wait_starts(1, secs(10.0));
    let doctor = |scratch_id: i32| {
        let out = leaderrun()
            .args([
                "--dsn",
                &cluster.dsn(),
                "--lock-id",
                &unique_lock_id().to_string(),
            ])
            .args(["doctor", "--scratch-id", &scratch_id.to_string()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let free = unique_lock_id();
    let (code, text) = doctor(free);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "scratch key {CLASS}:{free}; --scratch-id picks the id"
        )),
        "{text}"
    );
    let (code, text) = doctor(held);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "the scratch key {CLASS}:{held} is held by another session"
        )),
        "{text}"
    );
    assert!(
        text.contains("pick a free id of the class with --scratch-id"),
        "{text}"
    );
}

#[test]
fn doctor_passes_on_a_primary_and_fails_on_a_hot_standby() {
    let primary = Cluster::start_private();
    let doctor = |cluster: &Cluster| {
        leaderrun()
            .args(["doctor", "--dsn", &cluster.dsn()])
            .output()
            .unwrap()
    };
    let good = doctor(&primary);
    let text = String::from_utf8_lossy(&good.stdout);
    assert_eq!(good.status.code(), Some(0), "{text}");
    // PostgreSQL 13 is outside the supported range and has no idle_session_timeout: doctor
    // warns about both, and passes.
    let on_13 = crate::support::cluster::server_major() == 13;
    for (check, level) in [
        ("connect", "ok"),
        ("version", if on_13 { "warn" } else { "ok" }),
        ("primary", "ok"),
        ("exclusion", "ok"),
        ("session", "ok"),
        ("idle timeout", if on_13 { "warn" } else { "ok" }),
        ("tls", "ok"),
        ("leader", "ok"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(level) && l.contains(check)),
            "{check}: {text}"
        );
    }
    let Some(standby) = Cluster::standby_of(
        &primary,
        "operate::doctor_passes_on_a_primary_and_fails_on_a_hot_standby (the standby half)",
    ) else {
        return;
    };
    let bad = doctor(&standby);
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  primary") && text.contains("in recovery"),
        "{text}"
    );
    assert!(
        text.contains("hint: point the DSN at the primary"),
        "{text}"
    );

    // And the election itself refuses to lead there, saying why.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let replica = Replica::start(
        &standby,
        unique_lock_id(),
        INTERVAL,
        &["--", job.to_str().unwrap()],
    );
    replica.wait_log("ERROR leader: server", 2, secs(5.0));
    assert!(replica
        .log()
        .contains("is in recovery (a hot standby); refusing to lead"));
    assert!(scratch.starts().is_empty());

    let unreachable = leaderrun()
        .args([
            "doctor",
            "--dsn",
            "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        ])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(125));
}

#[test]
fn json_log_lines_parse_and_carry_fields() {
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--log-format", "json", "--", job.to_str().unwrap()],
    );
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let lines: Vec<serde_json::Value> = replica
        .log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 4);
    for line in &lines {
        assert!(
            line["timestamp"].is_string()
                && line["level"].is_string()
                && line["message"].is_string(),
            "{line}"
        );
    }
    let acquired = lines
        .iter()
        .find(|l| l["message"] == "background leader lock acquired")
        .expect("acquisition line");
    assert_eq!(acquired["level"], "INFO");
    assert!(acquired["term"].is_u64() && acquired["backend_pid"].is_i64());
    let exited = lines
        .iter()
        .find(|l| l["message"] == "child exited")
        .unwrap();
    assert_eq!(exited["status"], "exit code 0");
}

#[test]
fn systemd_hears_ready_status_watchdog_and_stopping() {
    let scratch = Scratch::new();
    let socket_path = scratch.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(secs(5.0))).unwrap();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .args([
            "--dsn",
            &Cluster::shared().dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--check-interval", INTERVAL, "--", job.to_str().unwrap()]);
    let mut replica = Replica::spawn(cmd);
    let mut seen: Vec<String> = Vec::new();
    let receive_until = |want: &str, seen: &mut Vec<String>| {
        while !seen.iter().any(|m| m.contains(want)) {
            let mut buf = [0u8; 4096];
            let n = socket
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("waiting for {want}: {e}; got {seen:?}"));
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    };
    receive_until("READY=1", &mut seen);
    // READY=1 only once the first check has completed: the STATUS= sent with it (or the last
    // one before it) already tells that check's outcome, "leader, term 1" for this lone
    // replica ("standby" if the term was not yet published when it was composed), never
    // "starting"; and nothing says "starting" before READY=1.
    let status_of = |datagram: &str| -> Option<String> {
        datagram
            .lines()
            .find_map(|l| l.strip_prefix("STATUS="))
            .map(str::to_owned)
    };
    let ready_at = seen.iter().position(|m| m.contains("READY=1")).unwrap();
    let status_at_ready = seen[..=ready_at].iter().rev().find_map(|m| status_of(m));
    assert!(
        matches!(
            status_at_ready.as_deref(),
            Some("leader, term 1" | "standby")
        ),
        "READY=1 before the first check completed: {seen:?}"
    );
    assert!(
        !seen[..=ready_at]
            .iter()
            .any(|m| status_of(m).as_deref() == Some("starting")),
        "{seen:?}"
    );
    receive_until("STATUS=leader, term 1", &mut seen);
    receive_until("WATCHDOG=1", &mut seen);
    assert_eq!(
        seen.iter().filter(|m| m.contains("READY=1")).count(),
        1,
        "READY=1 more than once: {seen:?}"
    );
    // STATUS=leader can come before the child starts; TERM before that is a standby's (exit 0).
    let first = scratch.wait_starts(1, secs(5.0))[0].clone();
    // A demotion that comes without a check (the server closed the session) updates STATUS=.
    let before = seen.len();
    Cluster::shared().terminate_backend(first.backend_pid);
    receive_until("STATUS=leader, term 2", &mut seen);
    assert!(
        seen[before..].iter().any(|m| m.contains("STATUS=standby")),
        "no STATUS=standby after the session closed: {:?}",
        &seen[before..]
    );
    scratch.wait_starts(2, secs(5.0));
    replica.signal(Signal::SIGTERM);
    receive_until("STOPPING=1", &mut seen);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(143));
}

#[test]
fn the_password_appears_nowhere() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let go = scratch.file("go");
    let job = scratch.child_script(
        "job.sh",
        &format!(
            "env > \"$EVENTS.env\"\nwhile [ ! -e '{}' ]; do sleep 0.02; done",
            go.display()
        ),
    );
    // Trust auth accepts any password; what matters is where it shows up.
    let dsn = format!("{} password=hunter2", cluster.dsn());
    let mut cmd = leaderrun();
    cmd.args(["-vv", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--http-addr", "127.0.0.1:0", "--", job.to_str().unwrap()]);
    let mut replica = Replica::spawn(cmd);
    let addr = probe_addr(&replica);
    let metrics = http(addr, "GET", "/metrics").1;
    std::fs::write(&go, "").unwrap();
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let mut outputs = vec![replica.log(), metrics];
    for sub in ["status", "doctor"] {
        let out = leaderrun().args([sub, "--dsn", &dsn]).output().unwrap();
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
        outputs.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    // The child's whole environment: leaderrun adds nothing that carries it, and the caller set
    // no PGPASSWORD (`leaderrun()` clears PG*), so the child must not get one either.
    let env = std::fs::read_to_string(scratch.path().join("events.env")).unwrap();
    assert!(
        env.lines().any(|l| l.starts_with("LEADERRUN_TERM=")),
        "not the child's environment:\n{env}"
    );
    assert!(
        !env.lines().any(|l| l.starts_with("PGPASSWORD=")),
        "PGPASSWORD set in the child:\n{env}"
    );
    outputs.push(env);
    for output in &outputs {
        assert!(!output.contains("hunter2"), "password leaked:\n{output}");
    }
    assert!(outputs[0].contains("background leader lock acquired"));
}

#[test]
fn a_unix_socket_connects_without_tls_whatever_sslmode_says() {
    let cluster = Cluster::shared();
    for mode in ["prefer", "require"] {
        let dsn = format!(
            "host={} port={} user=postgres dbname=postgres sslmode={mode}",
            cluster.socket_dir().display(),
            cluster.addr().port()
        );
        let out = leaderrun()
            .args([
                "--once",
                "--dsn",
                &dsn,
                "--lock-id",
                &unique_lock_id().to_string(),
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn status_and_doctor_take_negative_lock_keys_in_every_form() {
    let cluster = Cluster::shared();
    let dsn = cluster.dsn();
    // A negative id and a negative class no other test uses.
    let id = -unique_lock_id();
    let class = -7;
    let (id_arg, class_arg) = (id.to_string(), class.to_string());
    let id_eq = format!("--lock-id={id}");
    let class_eq = format!("--lock-class={class}");
    let forms: [Vec<&str>; 3] = [
        vec!["--lock-class", &class_arg, "--lock-id", &id_arg],
        vec![&class_eq, &id_eq],
        vec!["--lock-id", &id_arg, "--lock-class", &class_arg],
    ];
    let run = |sub: &str, form: &[&str], before: bool| {
        let mut cmd = leaderrun();
        if before {
            cmd.args(form).arg(sub);
        } else {
            cmd.arg(sub).args(form);
        }
        let out = cmd.args(["--dsn", &dsn]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        )
    };
    // Nobody holds the key: status answers "no leader" (1), not a usage error (125).
    for form in &forms {
        for before in [false, true] {
            let (code, stdout, stderr) = run("status", form, before);
            assert_eq!(code, Some(1), "status {form:?}: {stdout}{stderr}");
            assert!(stdout.contains("leader         none"), "{stdout}");
        }
    }

    // A leader on the negative key, started with the same forms: status finds it under each.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--check-interval", INTERVAL])
        .args(&forms[0])
        .args(["--", job.to_str().unwrap()]);
    let _leader = Replica::spawn(cmd);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(start.lock, format!("{class}:{id}"));
    assert_eq!(cluster.lock_holders(class, id), vec![start.backend_pid]);
    for form in &forms {
        for before in [false, true] {
            let (code, stdout, stderr) = run("status", form, before);
            assert_eq!(code, Some(0), "status {form:?}: {stdout}{stderr}");
            assert!(
                stdout.contains(&format!("leader pid     {}", start.backend_pid)),
                "{stdout}"
            );
        }
    }
    let mut cmd = leaderrun();
    let out = cmd
        .args(["status", "--json", "--dsn", &dsn])
        .args(&forms[0])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["lock"], format!("{class}:{id}"));
    assert_eq!(report["leader"]["pid"], start.backend_pid);

    // doctor takes the same forms and proves exclusion on the negative class beside the leader.
    for form in &forms {
        let (code, stdout, stderr) = run("doctor", form, false);
        assert_eq!(code, Some(0), "doctor {form:?}: {stdout}{stderr}");
        assert!(
            stdout.contains(&format!(
                "{class}:{id} is held by backend {}",
                start.backend_pid
            )),
            "doctor {form:?}: {stdout}"
        );
    }
    assert_eq!(cluster.lock_holders(class, id), vec![start.backend_pid]);

    // A name that looks like a negative number is a name, after status as in a run.
    let (code, stdout, stderr) = run("status", &["--lock-name", "-5", "--json"], false);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        report["lock"],
        format!("{CLASS}:{}", leaderrun::pg::lock::lock_id_for_name("-5"))
    );
}

#[test]
fn a_standby_waiting_in_the_lock_queue_is_ready_from_its_first_check() {
    // At the default 5 s interval a waiting standby's first check returns only when its wait
    // times out; it is ready as soon as the wait is queued
    // (docs/guarantees.md#observing-a-replica).
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    let _leader = Replica::start(cluster, id, "5s", &["--", job]);
    scratch.wait_starts(1, secs(10.0));
    let standby = Replica::start(
        cluster,
        id,
        "5s",
        &["--http-addr", "127.0.0.1:0", "--", job],
    );
    let addr = probe_addr(&standby);
    let started = std::time::Instant::now();
    wait_for("the standby to be ready", secs(3.0), || {
        (http(addr, "GET", "/readyz").0 == 200).then_some(())
    });
    assert!(started.elapsed() < secs(3.0));
    assert_eq!(http(addr, "GET", "/readyz").1.trim(), "standby");
}

fn step_down(cluster: &Cluster, id: i32) -> std::process::Output {
    crate::support::leaderrun()
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id.to_string(),
            "step-down",
        ])
        .output()
        .expect("run leaderrun step-down")
}

#[test]
fn step_down_hands_over_to_a_standby_and_says_so() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script(
        "job.sh",
        "trap 'echo \"stopped $$\" >> \"$EVENTS\"; exit 0' TERM\nwhile :; do sleep 0.02; done",
    );
    let job = job.to_str().unwrap();
    // No leader: nothing to ask.
    assert_eq!(step_down(cluster, id).status.code(), Some(1));
    // A 1 s interval: the old leader stays out for one interval, long enough for the queue
    // head to be granted the lock even on a loaded machine (at 200 ms a stalled standby could
    // miss it, and the old leader took it back: seen once in CI).
    let leader = Replica::start(cluster, id, "1s", &["--", job]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // A lone leader is not asked: nobody could take over, and its COMMAND would only restart.
    let out = step_down(cluster, id);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no standby is there to take over"),
        "{out:?}"
    );
    let standby = Replica::start(cluster, id, "1s", &["--", job]);
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    let out = step_down(cluster, id);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("stepped down"));
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    assert_eq!(second.ppid, standby.pid());
    // The old child got the stop signal and ended before the new one started; the old leader
    // goes on as a standby.
    assert!(scratch.events().contains(&format!("stopped {}", first.pid)));
    assert!(!crate::support::alive(first.pid));
    leader.wait_log("stepping down on request", 1, secs(2.0));
    assert_eq!(cluster.waiters(id), 0);
    wait_for("the old leader to queue as a standby", secs(5.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
}

/// Right after the only standby exited, its wait may still be queued on the server: it is not
/// a standby that can take over, so the leader is not asked and its COMMAND goes on.
#[test]
fn step_down_right_after_the_only_standby_exited_does_not_ask() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    // A 3 s interval: the dead standby's wait would stay queued for seconds.
    let leader = Replica::start(cluster, id, "3s", &["--", job]);
    scratch.wait_starts(1, secs(10.0));
    let mut standby = Replica::start(cluster, id, "3s", &["--", job]);
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    standby.signal(Signal::SIGKILL);
    standby.wait_exit(secs(5.0));
    let started = std::time::Instant::now();
    let out = step_down(cluster, id);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no standby is there to take over"),
        "{out:?}"
    );
    assert!(started.elapsed() < secs(5.0));
    assert!(!leader.log().contains("stepping down"), "{}", leader.log());
    assert_eq!(scratch.starts().len(), 1);
    assert_eq!(cluster.waiters(id), 0);
}

#[test]
fn step_down_cannot_ask_a_holder_that_is_not_leaderrun() {
    let cluster = Cluster::start_private();
    let id = unique_lock_id();
    let mut psql = std::process::Command::new(cluster.psql_path())
        .args([
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.addr().port().to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    writeln!(
        psql.stdin.as_mut().unwrap(),
        "SELECT pg_advisory_lock({}, {id});",
        crate::support::CLASS
    )
    .unwrap();
    wait_for("psql to hold the lock", secs(10.0), || {
        (cluster.lock_holders(crate::support::CLASS, id).len() == 1).then_some(())
    });
    let out = step_down(&cluster, id);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not leaderrun"));
    let _ = psql.kill();
    let _ = psql.wait();
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

/// The lock session's server end carries the TCP timers leaderrun pins on it, so the server
/// frees the lock of a leader cut off by the network within about idle_session_timeout even
/// where that setting does not exist (PostgreSQL 13): its keepalive timer runs out within
/// `tcp_keepalives_idle` (idle_session_timeout / 2), not the kernel's default two hours. On 13
/// the long-running mode says the weaker guarantee once; `--once` stays quiet on every major.
#[test]
fn the_lock_session_carries_tcp_timers_and_13_says_so_once() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    // Interval 1 s: idle_session_timeout 4 s, keepalives after 2 s of quiet.
    let replica = Replica::start(cluster, id, "1s", &["--", job.to_str().unwrap()]);
    let backend = scratch.wait_starts(1, secs(10.0))[0].backend_pid;
    let client_port: u16 = cluster.sql(&format!(
        "SELECT client_port FROM pg_stat_activity WHERE pid = {backend}"
    ))[0]
        .parse()
        .unwrap();
    // /proc/net/tcp: local and remote address as HEXIP:HEXPORT, state 01 = established, then
    // `tr:when` (timer 2 = keepalive; when in clock ticks of 1/100 s).
    let (local, remote) = (
        format!(":{:04X}", cluster.addr().port()),
        format!(":{client_port:04X}"),
    );
    let timer_secs = wait_for("the server end's keepalive timer", secs(10.0), || {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        table.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || !f[1].ends_with(&local) || !f[2].ends_with(&remote) || f[3] != "01" {
                return None;
            }
            let (timer, when) = f[5].split_once(':')?;
            (timer == "02").then(|| u64::from_str_radix(when, 16).ok().map(|t| t as f64 / 100.0))?
        })
    });
    assert!(
        timer_secs <= 2.5,
        "the lock session's server end probes after {timer_secs} s of quiet, not 2 s"
    );

    let weaker = "the server has no idle_session_timeout";
    let on_13 = crate::support::cluster::server_major() == 13;
    if on_13 {
        replica.wait_log(weaker, 1, secs(5.0));
    }
    let once_id = unique_lock_id();
    let mut once = Replica::start(cluster, once_id, "1s", &["--once", "--", "true"]);
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0));
    assert!(!once.log().contains(weaker), "{}", once.log());
    assert!(!once.log().contains("WARN"), "{}", once.log());
    assert_eq!(
        replica.log().matches(weaker).count(),
        usize::from(on_13),
        "{}",
        replica.log()
    );
}
