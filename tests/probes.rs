//! The readiness of a replica through the binary against a real PostgreSQL: `/healthz` and
//! `/readyz` (docs/guarantees.md#observing-a-replica), before the first check, while checks
//! fail, from a queued standby's first check, a port in use, and the systemd notification
//! protocol (READY, STATUS, WATCHDOG, STOPPING).

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;

use nix::sys::signal::Signal;

use crate::support::{
    http, leaderrun, probe_addr, sample, secs, unique_lock_id, wait_for, Cluster, Replica, Scratch,
    Setup, INTERVAL,
};

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

/// A replica whose checks reach the server but can never lead there (here through a
/// transaction-mode pooler) is not ready either, and `/readyz` says what rules leading out
/// rather than that the server cannot be reached (which it said before, sending an operator
/// to look at the network).
#[test]
fn a_replica_that_reaches_a_server_it_cannot_lead_through_says_so() {
    use crate::support::pooler::Bouncer;
    let bouncer = Bouncer::start(Cluster::shared(), "transaction", 1);
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &bouncer.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL, "--http-addr", "127.0.0.1:0"])
        .args(["--", "true"]);
    let replica = Replica::spawn(cmd);
    let addr = probe_addr(&replica);
    replica.wait_log("nothing is tried through it for another", 2, secs(10.0));
    let (code, body) = http(addr, "GET", "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("cannot lead through this server: "),
        "{body}"
    );
    assert!(body.contains("pooler"), "{body}");
    assert_eq!(http(addr, "GET", "/healthz"), (200, "ok\n".to_owned()));
}

/// A check that takes longer than 3 intervals because the database does not answer (each of
/// four hosts of a list within its turn's bound, the check interval) is the check loop at
/// work: `/healthz` stays 200 throughout, from the boot on, as it does while the database
/// refuses (the README: restarting leaderrun would not bring the database back), and
/// `/readyz` says the database cannot be reached. Before, `/healthz` read 503 for a part of
/// each such check, so a liveness probe restarted replicas whose only fault was a database
/// that was down. (One step longer than 3 intervals still reads as a loop that does not run:
/// `probes_before_the_first_check_and_when_the_loop_is_stuck`.)
#[test]
fn a_check_that_outlasts_three_intervals_on_a_silent_database_keeps_the_replica_live() {
    let proxy = crate::support::proxy::Proxy::start(Cluster::shared().addr());
    proxy.blackhole();
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1 port={} user=postgres dbname=postgres",
        proxy.port()
    );
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL, "--http-addr", "127.0.0.1:0"])
        .args(["--", "true"]);
    let replica = Replica::spawn(cmd);
    let addr = probe_addr(&replica);
    // Three whole checks (0.8 s each) with their turns.
    let until = std::time::Instant::now() + secs(3.0);
    let mut answers = 0;
    while std::time::Instant::now() < until {
        let (code, body) = http(addr, "GET", "/healthz");
        assert_eq!(
            code,
            200,
            "/healthz {code} {body} after {answers} answers\n{}",
            replica.log()
        );
        answers += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, body) = wait_for("a failed check", secs(5.0), || {
        let (code, body) = http(addr, "GET", "/readyz");
        body.starts_with("cannot reach the server")
            .then_some((code, body))
    });
    assert_eq!(code, 503, "{body}");
}

/// A standby that was ready is not ready while its checks fail to reach the server, and is
/// ready again once one does.
#[test]
fn a_standby_is_not_ready_while_its_checks_fail() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let job = setup.script();
    let _leader = setup.replica(INTERVAL, &[]);
    scratch.wait_starts(1, secs(10.0));
    let proxy = crate::support::proxy::Proxy::start(cluster.addr());
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &proxy.dsn(), "--lock-id", &id.to_string()])
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

/// At the default 5 s interval a waiting standby's first check returns only when its wait
/// times out; it is ready as soon as the wait is queued, for `/readyz` and for systemd's
/// READY=1 alike (docs/guarantees.md#observing-a-replica). Before, READY=1 came a whole
/// interval late, so `systemctl start` of every standby took that long (and a unit whose
/// interval was longer than its start timeout failed to start).
#[test]
fn a_standby_waiting_in_the_lock_queue_is_ready_from_its_first_check() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let _leader = setup.replica("5s", &[]);
    scratch.wait_starts(1, secs(10.0));
    let socket_path = scratch.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(secs(3.0))).unwrap();
    let mut cmd = leaderrun();
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .args(["--dsn", &setup.cluster.dsn()])
        .args(["--lock-id", &setup.id.to_string(), "--check-interval", "5s"])
        .args(["--http-addr", "127.0.0.1:0", "--", setup.script()]);
    let standby = Replica::spawn(cmd);
    let started = std::time::Instant::now();
    let addr = probe_addr(&standby);
    wait_for("the standby to be ready", secs(3.0), || {
        (http(addr, "GET", "/readyz").0 == 200).then_some(())
    });
    assert!(started.elapsed() < secs(3.0));
    assert_eq!(http(addr, "GET", "/readyz").1.trim(), "standby");
    let mut seen: Vec<String> = Vec::new();
    while !seen.iter().any(|m| m.contains("READY=1")) {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no READY=1 {:?} after the start: {e}; got {seen:?}\n{}",
                started.elapsed(),
                standby.log()
            )
        });
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(started.elapsed() < secs(3.0), "{seen:?}");
    assert!(
        seen.iter().any(|m| m.contains("STATUS=standby")),
        "{seen:?}"
    );
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

/// A replica that cannot reach its database tells systemd `STATUS=no database: <cause>`
/// (docs/guarantees.md#observing-a-replica), and stops at once on SIGTERM.
#[test]
fn systemd_hears_no_database_with_its_cause() {
    let scratch = Scratch::new();
    let socket_path = scratch.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(secs(5.0))).unwrap();
    let mut cmd = leaderrun();
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .args(["--dsn", crate::support::UNREACHABLE_DSN])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL, "--", "true"]);
    let mut replica = Replica::spawn(cmd);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|m: &String| m.contains("STATUS=no database: ") && m.contains("refused"))
    {
        let mut buf = [0u8; 4096];
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("waiting for no database: {e}; got {seen:?}"));
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    replica.signal(Signal::SIGTERM);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(0));
}

/// A notification socket nobody reads (its queue holds about ten datagrams) holds up nothing:
/// with WATCHDOG=1 every 50 ms and a STATUS= at every change, the leader keeps its term and its
/// child, hands over after `pg_terminate_backend`, and ends at once on SIGTERM. Before, the
/// next datagram blocked in `sendto` on the election's thread: the checks stopped and the
/// watchdog stopped COMMAND within a second, and SIGTERM waited for a reader. Once the socket
/// is read, READY=1 is among what it holds.
#[test]
fn a_notify_socket_nobody_reads_holds_up_nothing() {
    let scratch = Scratch::new();
    let socket_path = scratch.file("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "100000")
        .args([
            "--dsn",
            &Cluster::shared().dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--check-interval", INTERVAL, "--", job.to_str().unwrap()]);
    let mut replica = Replica::spawn(cmd);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // Well past the queue's ten datagrams: 40 pings, and as many checks.
    let settled = std::time::Instant::now() + secs(2.0);
    wait_for("two seconds of pings into a full queue", secs(5.0), || {
        (std::time::Instant::now() >= settled).then_some(())
    });
    assert!(
        crate::support::alive(first.pid),
        "COMMAND was stopped: {}",
        replica.log()
    );
    assert_eq!(scratch.starts().len(), 1, "{}", replica.log());
    // A demotion and a new term, with STATUS= changes into the full queue.
    Cluster::shared().terminate_backend(first.backend_pid);
    scratch.wait_starts(2, secs(5.0));
    let asked = std::time::Instant::now();
    replica.signal(Signal::SIGTERM);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(143));
    assert!(
        asked.elapsed() < secs(2.0),
        "SIGTERM took {:?}",
        asked.elapsed()
    );
    socket.set_nonblocking(true).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = socket.recv(&mut buf) {
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(seen.iter().any(|m| m.contains("READY=1")), "{seen:?}");
    assert!(!replica.log().contains("watchdog"), "{}", replica.log());
}

/// A leader cut off from the server (a blackholed proxy) is demoted when its check times out
/// and then stops a COMMAND that ignores the stop signal for the whole grace, reaching nobody
/// meanwhile. `/readyz` says at once that it cannot reach the server (before, it said
/// `standby` for two intervals), and `/healthz` stays 200 throughout the grace: the loop waits
/// for the tree by design (before, 503 for about the grace, which a liveness probe would
/// answer with a restart).
#[test]
fn a_leader_cut_off_is_not_ready_and_stays_live_while_it_stops_its_tree() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "trap '' TERM\nwhile :; do sleep 0.05; done");
    let proxy = crate::support::proxy::Proxy::start(cluster.addr());
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &proxy.dsn(),
        "--lock-id",
        &unique_lock_id().to_string(),
    ])
    .args(["--check-interval", INTERVAL, "--grace", "3s"])
    .args(["--http-addr", "127.0.0.1:0", "--"])
    .arg(&job);
    let leader = Replica::spawn(cmd);
    let child = scratch.wait_starts(1, secs(10.0))[0].pid;
    let addr = probe_addr(&leader);
    wait_for("the leader to be ready", secs(5.0), || {
        (http(addr, "GET", "/readyz").0 == 200).then_some(())
    });
    proxy.blackhole();
    leader.wait_log("stopping the child", 1, secs(10.0));
    let stopping = std::time::Instant::now();
    let mut seen = Vec::new();
    while crate::support::alive(child) && stopping.elapsed() < secs(10.0) {
        let health = http(addr, "GET", "/healthz");
        let ready = http(addr, "GET", "/readyz");
        seen.push((stopping.elapsed(), health.clone(), ready.clone()));
        assert_eq!(health.0, 200, "/healthz while stopping: {seen:?}");
        assert_eq!(ready.0, 503, "/readyz while stopping: {seen:?}");
        assert!(ready.1.starts_with("cannot reach the server: "), "{seen:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!crate::support::alive(child), "COMMAND outlived the grace");
    assert!(
        seen.len() > 20,
        "the stop took {:?}, not the grace",
        stopping.elapsed()
    );
    // Still live once the tree is dead and the lock session released, while checks still
    // find no server: before, the last check was a grace old then, and /healthz read 503
    // until the next one was recorded.
    let after = std::time::Instant::now();
    while after.elapsed() < secs(1.0) {
        let health = http(addr, "GET", "/healthz");
        seen.push((stopping.elapsed(), health.clone(), (0, String::new())));
        assert_eq!(health.0, 200, "/healthz after the stop: {seen:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
