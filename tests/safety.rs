//! The guarantees of docs/guarantees.md#safety-guarantees with real components: partitions through
//! a TCP proxy, a paused leaderrun, fencing tokens over forced terms, the session's timers,
//! the TCP timers of the lock session, poolers, and a role's `search_path` that shadows the
//! catalog.

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::support::cluster::has_idle_session_timeout;
use crate::support::proxy::Proxy;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::support::{
    alive, leaderrun, secs, unique_lock_id, wait_for, watchdog_of, Cluster, Replica, Scratch,
    Setup, CLASS,
};

/// Child script that records `began PID NS` and, on TERM, `ended PID NS`.
const TIMED_CHILD: &str = "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     trap 'echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
     while :; do sleep 0.02; done";

fn through_proxy(
    cluster: &Cluster,
    proxy: &Proxy,
    id: i32,
    interval: &str,
    script: &str,
) -> Replica {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &proxy.dsn()]).args([
        "--lock-id",
        &id.to_string(),
        "--check-interval",
        interval,
        "--",
        script,
    ]);
    let _ = cluster;
    Replica::spawn(cmd)
}

#[test]
fn a_partitioned_leaders_child_is_dead_before_the_standby_starts() {
    if !has_idle_session_timeout(
        "safety::a_partitioned_leaders_child_is_dead_before_the_standby_starts",
        crate::support::proxy::PARTITION_NEEDS_IDLE_SESSION_TIMEOUT,
    ) {
        return;
    }
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.addr());
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", TIMED_CHILD);
    let script = script.to_str().unwrap();
    let leader = through_proxy(cluster, &proxy, id, "300ms", script);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.ppid, leader.pid());
    let _standby = Replica::start(cluster, id, "300ms", &["--", script]);
    proxy.blackhole();
    let cut_at = Instant::now();
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    let took = cut_at.elapsed();
    assert_ne!(second.ppid, first.ppid);
    // The server frees the lock only after idle_session_timeout (4 × 300 ms) …
    assert!(took >= secs(0.8), "the lock moved after {took:?}");
    // … and the standby leads within that plus one interval and some slack.
    assert!(took < secs(3.0), "the standby took {took:?}");
    let ended = scratch
        .stamp("ended", first.pid)
        .expect("the old child got TERM");
    let began = wait_for("the new child's start stamp", secs(2.0), || {
        scratch.stamp("began", second.pid)
    });
    assert!(
        ended < began,
        "overlap: old child ended at {ended:.3}, new began at {began:.3}"
    );
    assert!(!alive(first.pid));
    leader.wait_log("background leader lock lost", 1, secs(1.0));
}

#[test]
fn a_resumed_leader_stops_its_child_before_any_round_trip() {
    if !has_idle_session_timeout(
        "safety::a_resumed_leader_stops_its_child_before_any_round_trip",
        "a frozen leader keeps the lock until it wakes, so no standby takes over \
         (rules::a_paused_leaders_tree_is_stopped_by_its_watchdog_before_the_lock_moves checks that on 13)",
    ) {
        return;
    }
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.addr());
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    // A long interval: a check that had to time out would take 2 s.
    let leader = through_proxy(cluster, &proxy, id, "2s", script);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let _standby = Replica::start(cluster, id, "200ms", &["--", script]);
    // The whole machine freezes (a paused VM): leaderrun and its watchdog alike. leaderrun
    // first: a running leaderrun continues a watchdog that was stopped on its own.
    let watchdog = wait_for("the leader's watchdog", secs(5.0), || {
        watchdog_of(leader.pid())
    });
    leader.signal(Signal::SIGSTOP);
    kill(Pid::from_raw(watchdog), Signal::SIGSTOP).unwrap();
    // The server ends the paused leader's idle session (4 × 2 s) and the standby takes over.
    let second = scratch.wait_starts(2, secs(20.0))[1].clone();
    assert_ne!(second.ppid, first.ppid);
    // Nothing the resumed leader sends will be answered now.
    proxy.blackhole();
    assert!(alive(first.pid), "the paused leader's child still runs");
    leader.signal(Signal::SIGCONT);
    kill(Pid::from_raw(watchdog), Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    wait_for("the resumed leader to stop its child", secs(1.9), || {
        (!alive(first.pid)).then_some(())
    });
    assert!(resumed.elapsed() < secs(1.9), "{:?}", resumed.elapsed());
    wait_for(
        &format!("the demotion in the log:\n{}", leader.log()),
        secs(2.0),
        || {
            leader
                .log()
                .contains("background leader lock lost")
                .then_some(())
        },
    );
}

/// A replica of lock `id` that connects with `dsn` (a role of a test's own) and runs `script`.
fn replica_as(dsn: &str, id: i32, interval: &str, script: &std::path::Path) -> Replica {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", interval, "--"])
        .arg(script);
    Replica::spawn(cmd)
}

#[test]
fn fencing_tokens_increase_over_forced_terms() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, scratch) = (setup.cluster, &setup.scratch);
    let _replicas: Vec<Replica> = setup.replicas(2, "200ms", &[]);
    for round in 1..=4 {
        let start = scratch.wait_starts(round, secs(10.0))[round - 1].clone();
        cluster.terminate_backend(start.backend_pid);
    }
    let starts = scratch.wait_starts(5, secs(10.0));
    let tokens: Vec<i64> = starts.iter().map(|s| s.fencing_token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// A crash of the server (an immediate stop: no checkpoint, nothing flushed on the way out)
/// right after a grant must not hand the next leader the same fencing token, or a smaller
/// one: the token is flushed to the WAL before the grant's answer (the test cluster runs
/// with `synchronous_commit=off`, so the grant turns it back on for itself). With the token
/// taken as a bare `txid_current()` every round gave the next leader the same number.
#[test]
fn fencing_tokens_increase_across_a_crash_of_the_server() {
    let cluster = Cluster::start_private();
    let setup = Setup::new(&cluster, "exit 0");
    let mut tokens = Vec::new();
    for round in 1..=4 {
        // A one-shot's try is bounded by the interval, and the first statements of a server
        // just out of crash recovery are slow on a loaded machine: 1 s, not the usual 200 ms
        // (the interval costs a one-shot that leads nothing).
        let mut replica = setup.replica("1s", &["--once"]);
        let status = replica.wait_exit(secs(15.0));
        assert_eq!(status.code(), Some(0), "round {round}\n{}", replica.log());
        let starts = setup.scratch.wait_starts(round, secs(5.0));
        tokens.push(starts[round - 1].fencing_token);
        cluster.kill();
        cluster.start();
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens across crashes: {tokens:?}"
    );
}

#[test]
fn a_cut_connection_demotes_at_once_and_leads_again_through_the_proxy() {
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.addr());
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let leader = through_proxy(
        cluster,
        &proxy,
        unique_lock_id(),
        "2s",
        script.to_str().unwrap(),
    );
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    proxy.blackhole();
    proxy.forward();
    proxy.cut();
    let cut = Instant::now();
    wait_for("the child to stop on EOF", secs(1.5), || {
        (!alive(first.pid)).then_some(())
    });
    assert!(
        cut.elapsed() < secs(1.5),
        "not at once: {:?}",
        cut.elapsed()
    );
    let second = scratch.wait_starts(2, secs(6.0))[1].clone();
    assert_eq!((second.ppid, second.term), (leader.pid(), 2));
}

#[test]
fn session_timers_are_pinned_whatever_the_role_defaults() {
    use crate::support::proxy::{data_row, messages};
    let cluster = Cluster::start_private();
    // Role defaults that would break the timing model if left in place.
    cluster.sql("ALTER ROLE postgres SET statement_timeout = '1h'");
    let has_idle = crate::support::cluster::server_major() >= 14;
    if has_idle {
        cluster.sql("ALTER ROLE postgres SET idle_session_timeout = 0");
    }
    // They are in effect for new sessions of the role.
    assert_eq!(cluster.sql("SHOW statement_timeout"), ["1h"]);
    // No session can read another's settings, so the lock session is watched on the wire: a
    // recording proxy keeps what the server sent it (no TLS, so the messages are readable).
    let proxy = Proxy::recording(cluster.addr());
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
            proxy.port()
        ),
        "--lock-id",
        &unique_lock_id().to_string(),
        "--check-interval",
        "300ms",
        "--",
        script.to_str().unwrap(),
    ]);
    let replica = Replica::spawn(cmd);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    // The lock session is the connection whose BackendKeyData names the backend the child was
    // told; the server's own rows in it give `statement_timeout` as the session has it, as
    // SHOW answered when leaderrun pinned it. In milliseconds, at most the I/O bound (one
    // interval here) plus one interval: 600, not the role's 3600000.
    let recorded = proxy.server_bytes();
    let lock_session = recorded
        .iter()
        .find(|bytes| {
            messages(bytes)
                .iter()
                .any(|(kind, body)| *kind == b'K' && body[..4] == start.backend_pid.to_be_bytes())
        })
        .unwrap_or_else(|| {
            panic!(
                "no connection to backend {} among {}",
                start.backend_pid,
                recorded.len()
            )
        });
    // SHOW's answer: a RowDescription naming the setting, then its value in a DataRow.
    let answers = messages(lock_session);
    let settings: Vec<String> = answers
        .windows(2)
        .filter(|pair| pair[0].0 == b'T' && pair[0].1[2..].starts_with(b"statement_timeout\0"))
        .filter(|pair| pair[1].0 == b'D')
        .map(|pair| {
            String::from_utf8_lossy(data_row(pair[1].1)[0].unwrap_or_default()).into_owned()
        })
        .collect();
    assert_eq!(
        settings.len(),
        1,
        "statement_timeout read back: {settings:?}"
    );
    // The value in effect, in PostgreSQL's display units.
    let shown = settings[0].as_str();
    let pinned: u64 = match shown.strip_suffix("ms") {
        Some(ms) => ms.parse().expect("statement_timeout in ms"),
        None => {
            let secs: u64 = shown
                .strip_suffix('s')
                .unwrap_or(shown)
                .parse()
                .expect("in s");
            secs * 1000
        }
    };
    assert!(
        (1..=600).contains(&pinned),
        "the lock session runs with statement_timeout = {pinned} ms"
    );
    if !has_idle {
        // PostgreSQL 13: nothing ends a paused client's session (README: PostgreSQL versions).
        assert!(!replica.log().contains("did not take"), "{}", replica.log());
        return;
    }
    // The session's idle_session_timeout shows in its effect: a paused leader loses its
    // session after idle_session_timeout (4 × 300 ms), not never (the role's 0).
    replica.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    wait_for(
        "the server to end the paused leader's session",
        secs(5.0),
        || {
            cluster
                .sql(&format!(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = {}",
                    start.backend_pid
                ))
                .is_empty()
                .then_some(())
        },
    );
    assert!(paused.elapsed() < secs(3.0));
    replica.signal(Signal::SIGCONT);
    assert!(!replica.log().contains("did not take"), "{}", replica.log());
}

/// A role or database that JIT-compiles every statement (`jit_above_cost = 0`, a DBA's
/// experiment left in place) does not make each check pay for a compile: the pin turns `jit`
/// off, as the lock session's own `SHOW` answers on the wire. Before, with JIT available, every
/// statement of the election took 0.25 to 0.6 s of the server's CPU on a 2-core machine: a
/// 200 ms interval's pin timed out at every try ("pin session timers timed out") and nobody led.
#[test]
fn a_roles_jit_default_is_off_on_the_lock_session() {
    use crate::support::proxy::{data_row, messages};
    let cluster = Cluster::start_private();
    cluster.sql(
        "CREATE ROLE compiling LOGIN SUPERUSER; ALTER ROLE compiling SET jit = on; \
         ALTER ROLE compiling SET jit_above_cost = 0; \
         ALTER ROLE compiling SET jit_inline_above_cost = 0; \
         ALTER ROLE compiling SET jit_optimize_above_cost = 0",
    );
    let proxy = Proxy::recording(cluster.addr());
    let dsn = format!(
        "host=127.0.0.1 port={} user=compiling dbname=postgres sslmode=disable",
        proxy.port()
    );
    // The default is in force for the role.
    let shown = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-A", "-t", "-h", "127.0.0.1"])
        .args(["-p", &cluster.addr().port().to_string()])
        .args(["-U", "compiling", "-d", "postgres", "-c", "SHOW jit"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        "on",
        "{shown:?}"
    );
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "1s", "--"])
        .arg(&script);
    let _replica = Replica::spawn(cmd);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    // The lock session is the connection whose BackendKeyData names the child's backend.
    let recorded = proxy.server_bytes();
    let lock_session = recorded
        .iter()
        .find(|bytes| {
            messages(bytes)
                .iter()
                .any(|(kind, body)| *kind == b'K' && body[..4] == start.backend_pid.to_be_bytes())
        })
        .expect("the lock session among the recorded connections");
    let answers = messages(lock_session);
    let jit: Vec<String> = answers
        .windows(2)
        .filter(|pair| pair[0].0 == b'T' && pair[0].1[2..].starts_with(b"jit\0"))
        .filter(|pair| pair[1].0 == b'D')
        .map(|pair| {
            String::from_utf8_lossy(data_row(pair[1].1)[0].unwrap_or_default()).into_owned()
        })
        .collect();
    assert_eq!(jit, ["off"], "the lock session's jit as SHOW answered");
}

/// A role's `transaction_timeout` (PostgreSQL 17 and later) shorter than the check interval
/// does not end a standby's session while it waits in the lock queue: the pin turns it off.
/// Before, the server ended the waiting session every check ("terminating connection due to
/// transaction timeout", a WARN each interval, `/readyz` 503), so no standby ever stood in
/// line, a failover waited for the next check and `step-down` found no standby to hand to.
#[test]
fn a_roles_transaction_timeout_does_not_end_a_waiting_standby() {
    let test = "a_roles_transaction_timeout_does_not_end_a_waiting_standby";
    let major = crate::support::cluster::server_major();
    if major < 17 {
        crate::support::cluster::skip(
            test,
            &format!("PostgreSQL {major} has no transaction_timeout"),
        );
        return;
    }
    let cluster = Cluster::start_private();
    cluster.sql(
        "CREATE ROLE hurried LOGIN SUPERUSER; \
         ALTER ROLE hurried SET transaction_timeout = 300",
    );
    let dsn = format!(
        "host=127.0.0.1 port={} user=hurried dbname=postgres",
        cluster.addr().port()
    );
    // The default is in force for the role: a transaction of 0.5 s ends its session.
    let sleep = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &dsn, "-c", "SELECT pg_sleep(0.5)"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sleep.stderr).contains("transaction timeout"),
        "{sleep:?}"
    );
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = || replica_as(&dsn, id, "1s", &script);
    let _leader = replica();
    scratch.wait_starts(1, secs(10.0));
    let standby = replica();
    let waiting = || {
        cluster.sql(&format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND objsubid = 2 AND objid = ({id}::bigint & 4294967295)::text::oid"
        ))
    };
    let first = wait_for("the standby waiting in the lock queue", secs(10.0), || {
        waiting().pop()
    });
    // Its wait lasts an interval (`lock_timeout`) and is sent again at once on the same
    // session: after 1.5 intervals the same backend still waits, and nothing ended it.
    let queued = Instant::now();
    wait_for(
        "the same session waiting for 1.5 intervals",
        secs(10.0),
        || {
            let log = standby.log();
            assert!(!log.contains("transaction timeout"), "{log}");
            let now = waiting();
            assert!(
                now.iter().all(|pid| *pid == first),
                "{now:?}, first {first}"
            );
            (queued.elapsed() > secs(1.5) && now == [first.clone()]).then_some(())
        },
    );
    // So a step-down finds it and hands over.
    let (code, text) = crate::support::run_tool(&dsn, &id.to_string(), &["step-down"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        !standby.log().contains("transaction timeout"),
        "{}",
        standby.log()
    );
}

/// A role whose transactions are serializable, read-only and deferrable by default waits for a
/// safe snapshot at every statement that reads, for as long as any serializable transaction
/// that writes is open: the pin turns `deferrable` off, so the election does not wait for the
/// application's writers. Before, an open serializable writer made every pin time out ("pin
/// session timers timed out"), and a leader lose the lock ("no check has proved the lock")
/// while nothing was wrong with it; `status` waited the same way.
#[test]
fn a_roles_deferrable_default_does_not_make_the_election_wait_for_writers() {
    use std::io::Write;
    let cluster = Cluster::start_private();
    cluster.sql(
        "CREATE ROLE deferring LOGIN SUPERUSER; \
         ALTER ROLE deferring SET default_transaction_isolation = 'serializable'; \
         ALTER ROLE deferring SET default_transaction_read_only = on; \
         ALTER ROLE deferring SET default_transaction_deferrable = on; \
         CREATE TABLE written (x int)",
    );
    let dsn = format!(
        "host=127.0.0.1 port={} user=deferring dbname=postgres",
        cluster.addr().port()
    );
    // An application's serializable transaction that wrote, left open.
    let mut writer = cluster.psql_session();
    writeln!(
        writer.stdin.as_mut().unwrap(),
        "BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO written VALUES (1); \
         SELECT count(*) FROM written;"
    )
    .unwrap();
    writer.stdin.as_mut().unwrap().flush().unwrap();
    wait_for("the writer's open transaction", secs(10.0), || {
        let rows = cluster.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'psql' \
             AND state = 'idle in transaction' AND backend_xid IS NOT NULL",
        );
        (rows == ["1"]).then_some(())
    });
    // The default is in force for the role: a statement that reads waits for the writer.
    let waits = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &dsn])
        .args(["-c", "SET statement_timeout = 300", "-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&waits.stderr).contains("statement timeout"),
        "{waits:?}"
    );
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = || replica_as(&dsn, id, "300ms", &script);
    let leader = replica();
    scratch.wait_starts(1, secs(10.0));
    let standby = replica();
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    let (code, text) = crate::support::run_tool(&dsn, &id.to_string(), &["status"]);
    assert_eq!(code, Some(0), "{text}");
    // The leader's checks go on while the writer stays open: three intervals more, and the
    // one start, with nothing timed out on either side.
    let checked = Instant::now();
    wait_for("three more intervals of checks", secs(10.0), || {
        for log in [leader.log(), standby.log()] {
            assert!(!log.contains("timed out"), "{log}");
            assert!(!log.contains("lost"), "{log}");
        }
        (checked.elapsed() > secs(0.9)).then_some(())
    });
    assert_eq!(scratch.starts().len(), 1);
    let _ = writer.kill();
    let _ = writer.wait();
}

/// A role whose `exit_on_error` is on (a DBA's way to make any error end an application's
/// session) gets it turned off on its sessions: a check that fails on a live session stops the
/// child before the lock moves, and a standby's timed-out wait in the lock queue keeps its
/// session. Before, the server made every ERROR of the lock session FATAL: a leader's failed
/// check (here a privilege taken from it) ended its session and freed the lock at once, and
/// the next leader's COMMAND started while the old one was still stopping; and the standby in
/// line lost its session at every timed-out wait and stood in line again only after a reconnect.
#[test]
fn a_roles_exit_on_error_neither_frees_the_lock_early_nor_ends_a_waiting_standby() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    // A role and a database of this test's own: the privilege taken below is the database's.
    let (role, db) = (
        format!("erring{}", id.unsigned_abs()),
        format!("erring{}", id.unsigned_abs()),
    );
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN; ALTER ROLE {role} SET exit_on_error = on"
    ));
    cluster.sql(&format!("CREATE DATABASE {db} TEMPLATE template0"));
    let dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname={db}",
        cluster.addr().port()
    );
    // The default is in force for the role: an error ends its session.
    let erring = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &dsn, "-c", "SELECT 1/0", "-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&erring.stderr).contains("FATAL"),
        "{erring:?}"
    );
    let scratch = Scratch::new();
    // Stops 1 s after its TERM: longer than a standby needs to take a lock that is free.
    let script = scratch.child_script(
        "child.sh",
        "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
         trap 'sleep 1; echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
         while :; do sleep 0.02; done",
    );
    let replica = || {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()])
            .args(["--check-interval", "300ms", "--grace", "3s", "--"])
            .arg(&script);
        Replica::spawn(cmd)
    };
    let leader = replica();
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let standby = replica();
    let waiting = || {
        cluster.sql(&format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND objid = ({id}::bigint & 4294967295)::text::oid"
        ))
    };
    let queued = wait_for("the standby waiting in the lock queue", secs(10.0), || {
        waiting().pop()
    });
    // Its wait lasts an interval (`lock_timeout`) and is sent again on the same session:
    // after three intervals the same backend still waits.
    let since = Instant::now();
    wait_for(
        "the same session waiting for three intervals",
        secs(10.0),
        || {
            let now = waiting();
            assert!(
                now.iter().all(|pid| *pid == queued),
                "the standby's session changed: {now:?}, first {queued}; log:\n{}",
                standby.log()
            );
            (since.elapsed() > secs(0.9) && now == [queued.clone()]).then_some(())
        },
    );
    // The leader's next check fails on its live session.
    cluster.sql_in(&db, "REVOKE SELECT ON pg_catalog.pg_locks FROM PUBLIC");
    leader.wait_log("background leader lock lost", 1, secs(5.0));
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, first.ppid);
    scratch.assert_no_overlap(first.pid, second.pid, &leader.log());
}

/// A role that may not read `pg_locks` (the view, or the `pg_lock_status()` it calls) cannot
/// prove a grant: every replica stays a standby with an ERROR that names the grant a DBA
/// runs, and COMMAND never starts, in any mode; once the privilege is granted, one replica
/// leads at once. Before, each replica in turn took the lock, started COMMAND and stopped it
/// at its first check, 50 ms later, every interval.
#[test]
fn a_role_that_cannot_read_pg_locks_stays_a_standby_until_it_may() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let name = format!("lockblind{}", id.unsigned_abs());
    let (role, db) = (name.as_str(), name.as_str());
    cluster.sql(&format!("CREATE ROLE {role} LOGIN"));
    cluster.sql(&format!("CREATE DATABASE {db} TEMPLATE template0"));
    // The catalog's views are the database's own: nothing outside this test's database changes.
    cluster.sql_in(db, "REVOKE SELECT ON pg_catalog.pg_locks FROM PUBLIC");
    let dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname={db}",
        cluster.addr().port()
    );
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = || {
        let mut cmd = leaderrun();
        cmd.args(["-v", "--dsn", &dsn, "--lock-id", &id.to_string()])
            .args(["--check-interval", "200ms", "--"])
            .arg(&script);
        Replica::spawn(cmd)
    };
    let said = "the role cannot read pg_catalog.pg_locks";
    let replicas = [replica(), replica()];
    for replica in &replicas {
        replica.wait_log(said, 3, secs(10.0));
    }
    assert!(
        scratch.starts().is_empty(),
        "COMMAND started on a lock no check could prove: {:?}; logs:\n{}\n{}",
        scratch.starts(),
        replicas[0].log(),
        replicas[1].log()
    );
    assert!(replicas[0]
        .log()
        .contains("GRANT SELECT ON pg_catalog.pg_locks TO the role"));
    // A one-shot says so and exits 125 (leaderrun could not check the lock), COMMAND unrun.
    let once = leaderrun()
        .args(["--once", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", "200ms", "--"])
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&once.stderr);
    assert_eq!(once.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(said), "{stderr}");
    assert!(scratch.starts().is_empty(), "{:?}", scratch.starts());
    // doctor names it too.
    let doctor = leaderrun()
        .args(["doctor", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{report}");
    assert!(
        report.lines().any(|l| l.starts_with("FAIL")
            && l.contains("check")
            && l.contains("cannot read pg_catalog.pg_locks")),
        "{report}"
    );
    // The view readable, the function it calls not: the same, in one transaction so that no
    // replica sees the two privileges between.
    cluster.sql_in(
        db,
        &format!(
            "GRANT SELECT ON pg_catalog.pg_locks TO {role}; \
             REVOKE EXECUTE ON FUNCTION pg_catalog.pg_lock_status() FROM PUBLIC"
        ),
    );
    let before: Vec<usize> = replicas
        .iter()
        .map(|r| r.log().matches(said).count())
        .collect();
    for (replica, before) in replicas.iter().zip(before) {
        replica.wait_log(said, before + 3, secs(10.0));
    }
    assert!(scratch.starts().is_empty(), "{:?}", scratch.starts());
    // Granted: one replica leads, and its checks hold the term.
    cluster.sql_in(
        db,
        &format!("GRANT EXECUTE ON FUNCTION pg_catalog.pg_lock_status() TO {role}"),
    );
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let leader = replicas
        .iter()
        .find(|r| r.pid() == start.ppid)
        .expect("the child's parent is one of the replicas");
    leader.wait_log("leader check ok", 5, secs(10.0));
    assert_eq!(scratch.starts().len(), 1, "{:?}", scratch.starts());
    assert!(!leader.log().contains("lock lost"), "{}", leader.log());
}

#[test]
fn a_transaction_mode_pooler_is_refused_and_session_mode_works() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    let through = |bouncer: &Bouncer, id: i32| {
        let mut cmd = leaderrun();
        cmd.args(["-v", "--dsn", &bouncer.dsn(), "--lock-id", &id.to_string()])
            .args(["--check-interval", "200ms", "--", script]);
        Replica::spawn(cmd)
    };

    let transaction = Bouncer::start(&cluster, "transaction", 1);
    let id = unique_lock_id();
    let refused = through(&transaction, id);
    // Found once, at the grant; from then on nothing is tried through the pooler, and the
    // replica keeps checking and saying so.
    refused.wait_log("nothing is tried through it for another", 2, secs(10.0));
    assert_eq!(
        refused
            .log()
            .matches("ERROR leader: a second session reached the server backend")
            .count(),
        1,
        "{}",
        refused.log()
    );
    assert!(
        scratch.starts().is_empty(),
        "no child behind a transaction pooler"
    );
    assert!(
        cluster.lock_holders(crate::support::CLASS, id).is_empty(),
        "the lock was given back"
    );
    drop(refused);

    let session = Bouncer::start(&cluster, "session", 10);
    let id = unique_lock_id();
    let replicas: Vec<Replica> = (0..2).map(|_| through(&session, id)).collect();
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(
        cluster.lock_holders(crate::support::CLASS, id),
        vec![first.backend_pid]
    );
    let standby = replicas.iter().find(|r| r.pid() != first.ppid).unwrap();
    assert!(!standby.log().contains("ERROR"), "{}", standby.log());
    // Still exactly one child after the standby has been refused a few times.
    standby.wait_log("lock held by another session", 3, secs(5.0));
    assert_eq!(scratch.starts().len(), 1);
}

/// Behind a transaction-mode pooler a try can reach a server backend that already holds the
/// lock for another client: granted there (the holder's lock counted up), with its pooler proof
/// landing on another backend under load, two replicas led at once. A session's first try,
/// sent before the server says whether the session is direct, takes nothing where the server
/// does not see our socket; the guarded try after it refuses such a backend: nothing of the
/// holder's is taken or given back.
#[test]
fn a_try_on_a_backend_that_holds_the_lock_for_another_client_takes_nothing() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    let transaction = Bouncer::start(&cluster, "transaction", 1);
    let id = unique_lock_id();
    // Another client takes the lock through the pooler: it stays on the one server backend.
    let psql = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &transaction.dsn(), "-c"])
        .arg(format!(
            "SELECT pg_advisory_lock({}, {id})",
            crate::support::CLASS
        ))
        .output()
        .unwrap();
    assert!(psql.status.success(), "{psql:?}");
    let held = cluster.lock_holders(crate::support::CLASS, id);
    assert_eq!(held.len(), 1, "{held:?}");
    // A one-shot: its first try travels unguarded with the session's set-up, is granted on the
    // holder's backend, given back and tried again guarded. Exit 7 would be COMMAND run, 1 the
    // lock refused as held elsewhere (neither may happen: the backend is the holder's).
    let out = leaderrun()
        .args([
            "-vv",
            "--dsn",
            &transaction.dsn(),
            "--lock-id",
            &id.to_string(),
        ])
        .args([
            "--check-interval",
            "200ms",
            "--once",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.matches("ERROR").count(), 1, "{stderr}");
    // The first try, sent with the set-up before the server's answer says the session is not
    // direct, took nothing: there was nothing to give back.
    assert!(
        !stderr.contains("giving it back and trying again guarded"),
        "{stderr}"
    );
    assert!(
        stderr.contains("already holds the lock for another client"),
        "{stderr}"
    );
    assert_eq!(cluster.lock_holders(crate::support::CLASS, id), held);
    // The other client's lock is where it was, counted once: one unlock frees it.
    let psql = |sql: String| {
        let out = std::process::Command::new(cluster.psql_path())
            .args(["-X", "-q", "-A", "-t", "-d", &transaction.dsn(), "-c", &sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let class = crate::support::CLASS;
    assert_eq!(
        psql(format!("SELECT pg_advisory_unlock({class}, {id})")),
        "t"
    );
    assert!(cluster.lock_holders(class, id).is_empty());

    // A replica that stands by meets it at a check, and from then on tries nothing through
    // the pooler; it never starts COMMAND, and the other client's lock stays counted once.
    psql(format!("SELECT pg_advisory_lock({class}, {id})"));
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &transaction.dsn(), "--lock-id", &id.to_string()])
        .args(["--check-interval", "200ms", "--", script.to_str().unwrap()]);
    let standby = Replica::spawn(cmd);
    standby.wait_log("already holds the lock for another client", 1, secs(10.0));
    standby.wait_log("nothing is tried through it for another", 3, secs(10.0));
    assert!(scratch.starts().is_empty(), "{}", standby.log());
    // Nothing it prepared stays on the pooler's server connection, where statements would
    // pile up check after check and collide with the next client's of the same name.
    assert_eq!(
        psql(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%leaderrun%'".into()
        ),
        "0"
    );
    drop(standby);
    assert_eq!(
        psql(format!("SELECT pg_advisory_unlock({class}, {id})")),
        "t"
    );
    assert!(cluster.lock_holders(class, id).is_empty());
}

/// The reproduction of the overlap the guard closes, bounded: PgBouncer in transaction mode
/// with six server connections handed out in turn, three clients of load, four replicas whose
/// trees each hold one `flock` (an exact overlap check, as the fault run's). Before the guard,
/// a try reached the holder's backend and was granted there while the second session landed
/// elsewhere: five overlaps in 40 s on 2 cores, one in about twenty refusals. And before the
/// replicas stopped trying through the pooler once they had found it, a count of the lock
/// they were granted and could not give back (its give-back landed on another server
/// connection) stayed on a pooled backend that their polling kept busy: a replica connected
/// directly was refused for as long as they ran. Now every replica finds the pooler, no two
/// trees ever overlap, nothing is left held, and a direct replica leads at once.
#[test]
fn a_transaction_pooler_under_load_never_runs_two_trees_nor_keeps_a_direct_replica_out() {
    use crate::support::pooler::Bouncer;
    use std::io::Write;
    let cluster = Cluster::start_private();
    let bouncer = Bouncer::start_with(&cluster, "transaction", 6, "server_round_robin = 1\n");
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "exec 9>>\"$EVENTS.lock\"\n\
         flock -n 9 || { echo \"overlap $$\" >> \"$EVENTS\"; flock 9; }\n\
         exec sleep 600",
    );
    // Load: persistent clients, each a stream of short transactions.
    let load: Vec<std::process::Child> = (0..3)
        .map(|_| {
            let mut psql = std::process::Command::new(cluster.psql_path())
                .args(["-X", "-q", "-d", &bouncer.dsn(), "-f", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut stdin = psql.stdin.take().unwrap();
            std::thread::spawn(
                move || {
                    while stdin.write_all(b"SELECT pg_sleep(0.002);\n").is_ok() {}
                },
            );
            psql
        })
        .collect();
    let id = unique_lock_id();
    let replica = |dsn: &str| {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", dsn, "--lock-id", &id.to_string()])
            .args(["--check-interval", "200ms", "--grace", "1s", "--"])
            .arg(&script);
        Replica::spawn(cmd)
    };
    let pooled: Vec<Replica> = (0..4).map(|_| replica(&bouncer.dsn())).collect();
    // Each replica finds the pooler (a second session on its backend, its session moved, a
    // backend holding the lock for another) and then tries nothing through it.
    for r in &pooled {
        r.wait_log("nothing is tried through it for another", 1, secs(60.0));
    }
    // No count is left on a pooled backend, of the lock or of a place in the line of
    // standbys (the same id, as the low half of a place's key): every grant was given back
    // where it was granted, and no place was taken through the pooler.
    let held = || {
        cluster.sql(&format!(
            "SELECT classid || ':' || objid || ':' || objsubid || ' pid ' || pid FROM pg_locks \
             WHERE locktype = 'advisory' AND granted \
             AND objid = ({id}::bigint & 4294967295)::text::oid"
        ))
    };
    crate::support::wait_for(
        "no backend holding the lock or a place once every replica has found the pooler",
        secs(5.0),
        || held().is_empty().then_some(()),
    );
    let direct = replica(&cluster.dsn());
    crate::support::wait_for("the direct replica's child", secs(5.0), || {
        scratch
            .starts()
            .iter()
            .any(|s| s.ppid == direct.pid())
            .then_some(())
    });
    drop(direct);
    drop(pooled);
    for mut psql in load {
        let _ = psql.kill();
        let _ = psql.wait();
    }
    let overlaps: Vec<String> = scratch
        .events()
        .into_iter()
        .filter(|e| e.starts_with("overlap"))
        .collect();
    assert!(
        overlaps.is_empty(),
        "two trees at once behind the pooler: {overlaps:?} of {} starts",
        scratch.starts().len()
    );
}

/// A standby behind a transaction-mode pooler can take a place in the line of standbys on the
/// backend its session was pinned on, and find at a later check that its session moved. The
/// place stayed on that pooled backend before: the standbys behind it (direct ones too) waited
/// for it, and a standby at place 2 or later never tries the lock itself. Now the place is
/// given back on its backend when the session is dropped. PgBouncer here hands out its two
/// server connections in turn, so a session's statements alternate between them.
#[test]
fn a_place_in_line_taken_through_a_transaction_pooler_is_given_back() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    let bouncer = Bouncer::start_with(
        &cluster,
        "transaction",
        2,
        "server_round_robin = 1\nmin_pool_size = 2\n",
    );
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let id = unique_lock_id();
    let leader = Replica::start(&cluster, id, "200ms", &["--", script.to_str().unwrap()]);
    scratch.wait_starts(1, secs(10.0));
    let held = || {
        cluster.sql(&format!(
            "SELECT classid || ':' || objsubid FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND objid = ({id}::bigint & 4294967295)::text::oid ORDER BY 1"
        ))
    };
    let key = format!("{}:2", crate::support::CLASS);
    assert_eq!(held(), vec![key.clone()]);
    let mut cmd = leaderrun();
    cmd.args(["-vv", "--dsn", &bouncer.dsn(), "--lock-id", &id.to_string()])
        .args(["--check-interval", "200ms", "--", script.to_str().unwrap()]);
    let pooled = Replica::spawn(cmd);
    pooled.wait_log("nothing is tried through it for another", 1, secs(20.0));
    assert!(
        pooled.log().contains("in line: waiting"),
        "{}",
        pooled.log()
    );
    crate::support::wait_for(
        "only the leader's key held once the pooled standby found the pooler",
        secs(5.0),
        || (held() == vec![key.clone()]).then_some(()),
    );
    drop(pooled);
    drop(leader);
}

/// Replicas behind a transaction-mode pooler that hands out the server connection its clients
/// used last (PgBouncer's default): while the other replicas kept the pool's other connections
/// busy, one replica's second session met another backend than its grant's and was refused,
/// and it led, its checks landing on its own backend for seconds (a tester saw leads of 55 ms
/// to 15.8 s, in one trial of three to ten). The second session's test now runs three times,
/// each right after a statement of the lock session. Twelve trials of four replicas on a fresh
/// lock: none may lead.
#[test]
fn replicas_behind_a_last_used_first_pooler_never_lead() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    let bouncer = Bouncer::start(&cluster, "transaction", 3);
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut led = Vec::new();
    for trial in 0..12 {
        let id = unique_lock_id();
        let replicas: Vec<Replica> = (0..4)
            .map(|_| {
                let mut cmd = leaderrun();
                cmd.args(["--dsn", &bouncer.dsn(), "--lock-id", &id.to_string()])
                    .args(["--check-interval", "200ms", "--"])
                    .arg(&script);
                Replica::spawn(cmd)
            })
            .collect();
        for r in &replicas {
            r.wait_log("nothing is tried through it for another", 1, secs(20.0));
        }
        for r in &replicas {
            if r.log().contains("lock acquired") {
                led.push(format!("trial {trial}: {}", r.log()));
            }
        }
    }
    assert!(led.is_empty(), "{} replicas led: {led:#?}", led.len());
    assert!(scratch.starts().is_empty());
}

/// Over a Unix socket the server cannot show leaderrun's address, so what proves that no
/// pooler sits between is the socket's listener: on PostgreSQL's own socket the postmaster, the
/// backend's parent. A one-shot there needs no second session (a whole connect); a
/// transaction-mode pooler listening on a Unix socket is the listener, no backend's parent, and
/// is still found out by the second session and refused.
#[test]
fn over_a_unix_socket_the_listener_proves_that_no_pooler_sits_between() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    let probe = "a second session proves that no transaction-mode pooler sits between";
    let unix = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.socket_dir().display(),
        cluster.addr().port()
    );
    let id = unique_lock_id().to_string();
    let out = leaderrun()
        .args([
            "-vv",
            "--dsn",
            &unix,
            "--lock-id",
            &id,
            "--once",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("background leader lock acquired"), "{log}");
    assert!(!log.contains(probe), "{log}");

    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let transaction = Bouncer::start(&cluster, "transaction", 1);
    let mut cmd = leaderrun();
    cmd.args(["-vv", "--dsn", &transaction.unix_dsn(), "--lock-id"])
        .arg(unique_lock_id().to_string())
        .args(["--check-interval", "200ms", "--", script.to_str().unwrap()]);
    let refused = Replica::spawn(cmd);
    refused.wait_log(
        "ERROR leader: a second session reached the server backend",
        1,
        secs(10.0),
    );
    assert!(refused.log().contains(probe), "{}", refused.log());
    // pgbouncer is no postgres: its socket's session sent no try before its pin.
    assert!(
        !refused
            .log()
            .contains("giving it back and trying again guarded"),
        "{}",
        refused.log()
    );
    assert!(
        scratch.starts().is_empty(),
        "no child behind a transaction pooler"
    );
}

/// The lock session's server end carries the TCP timers leaderrun pins on it, so the server
/// frees the lock of a leader cut off by the network within about idle_session_timeout even
/// where that setting does not exist (PostgreSQL 13): its keepalive timer runs out within
/// `tcp_keepalives_idle` (idle_session_timeout / 2), not the kernel's default two hours. On 13
/// the long-running mode says the weaker guarantee once; `--once` stays quiet on every major.
#[test]
fn the_lock_session_carries_tcp_timers_and_13_says_so_once() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, scratch) = (setup.cluster, &setup.scratch);
    // Interval 1 s: idle_session_timeout 4 s, keepalives after 2 s of quiet.
    let replica = setup.replica("1s", &[]);
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

/// A grant whose connection ended together with its answer begins no term: the server frees
/// the lock whenever it ends the session, and the watchdog would be handed a socket already
/// closed. The proxy ends leaderrun's side of the lock session with the answer of the guarded
/// try (the second answer naming `current_database`; a proxy is no direct connection), the
/// answer and the end in one segment, and keeps the server's side open: the lock stays held
/// there, so the second session's proof at the grant is refused as it would be for a live
/// session, and only the session's own end can stop COMMAND from starting.
#[test]
fn a_grant_whose_connection_ended_with_its_answer_starts_nothing() {
    let cluster = Cluster::shared();
    let proxy = Proxy::severing(cluster.addr(), b"current_database\0", 2);
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exit 0");
    let id = unique_lock_id();
    let out = leaderrun()
        .args([
            "--once",
            "-v",
            "--dsn",
            &format!("{} sslmode=disable", proxy.dsn()),
        ])
        .args(["--lock-id", &id.to_string(), "--"])
        .arg(&script)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    // Before, the term began on the dead session ("lock acquired", then "lost" at once) and
    // only the race with the loss kept COMMAND from starting; the one-shot exited 0.
    assert!(!log.contains("background leader lock acquired"), "{log}");
    assert!(scratch.starts().is_empty(), "COMMAND started: {log}");
    assert!(log.contains("lock session closed by the server"), "{log}");
    assert_eq!(out.status.code(), Some(125), "{log}");
    // The lock is still held on the server's side of the proxy, by nobody's running session.
    assert_eq!(cluster.lock_holders(CLASS, id).len(), 1, "{log}");
    proxy.cut();
    wait_for("the severed session's lock freed", secs(10.0), || {
        cluster.lock_holders(CLASS, id).is_empty().then_some(())
    });
}

/// Every name in leaderrun's SQL is the catalog's, whatever the role's `search_path`
/// (docs/guarantees.md#names-in-its-sql): a role whose path puts a schema before `pg_catalog`,
/// where every catalog function, aggregate, operator, table, view and base type is shadowed
/// by one that raises (tests/support/shadow_catalog.sql), leads, waits, hands over, refuses a
/// one-shot, writes its history and answers `status`, `doctor` and `step-down` as any role
/// does, directly, with slots, and through a transaction-mode pooler, and not one shadow is
/// used. Before, the try called the schema's `pg_try_advisory_lock`: a function there that
/// returns true gave the lock to every replica at once, and ran as leaderrun's role.
#[test]
fn names_a_roles_search_path_puts_before_pg_catalog_are_never_used() {
    use crate::support::pooler::Bouncer;
    let cluster = Cluster::start_private();
    cluster.sql(include_str!("support/shadow_catalog.sql"));
    cluster.sql(
        "CREATE ROLE shadowed LOGIN SUPERUSER; \
         ALTER ROLE shadowed SET search_path = shadow, pg_catalog",
    );
    let port = cluster.addr().port();
    let dsn = format!("host=127.0.0.1 port={port} user=shadowed dbname=postgres");
    let hits = || {
        cluster.sql("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM shadow.hits")[0]
            .parse::<u64>()
            .unwrap()
    };
    // The shadows are in force for the role, and each use is counted.
    let plain = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &dsn, "-c", "SELECT 1 = 1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("shadowed: operator ="),
        "{plain:?}"
    );
    assert_eq!(hits(), 1);
    cluster.sql("SELECT setval('shadow.hits', 1, false)");

    let id = unique_lock_id().to_string();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = |dsn: &str, extra: &[&str], id: &str| {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", dsn, "--lock-id", id, "--check-interval", "200ms"])
            .args(extra)
            .arg("--")
            .arg(&script);
        Replica::spawn(cmd)
    };
    let tool = |dsn: &str, args: &[&str]| crate::support::run_tool(dsn, &id, args);
    let mut logs: Vec<String> = Vec::new();

    let mut leader = replica(&dsn, &["--history"], &id);
    scratch.wait_starts(1, secs(10.0));
    // A standby that asks for a read-write server, as libpq checks one.
    let mut standby = replica(
        &format!("{dsn} target_session_attrs=read-write"),
        &["--history"],
        &id,
    );
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id.parse().unwrap()) == 1).then_some(())
    });
    // It read who holds the lock.
    standby.wait_log("standing by", 1, secs(5.0));
    for (args, wanted) in [
        (
            &["--once", "--conflict-exit-code", "3", "--", "true"][..],
            3,
        ),
        (
            &["--wait", "300ms", "--conflict-exit-code", "3", "--", "true"],
            3,
        ),
        (&["status"], 0),
        (&["status", "--json"], 0),
        (&["doctor"], 0),
    ] {
        let (code, text) = tool(&dsn, args);
        assert_eq!(code, Some(wanted), "{args:?}: {text}");
        assert!(!text.contains("shadowed:"), "{args:?}: {text}");
        logs.push(text);
    }
    let (code, text) = tool(&dsn, &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&text).expect(&text);
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(1), "{text}");
    let (code_down, down) = tool(&dsn, &["step-down"]);
    assert_eq!((code, code_down), (Some(0), Some(0)), "{down}");
    logs.push(down);
    scratch.wait_starts(2, secs(10.0));

    // Slots: two leaders and a standby in line, with the heads' look for slots with no head.
    let slots_id = unique_lock_id().to_string();
    let mut slotted: Vec<Replica> = (0..3)
        .map(|_| replica(&dsn, &["--slots", "2"], &slots_id))
        .collect();
    scratch.wait_starts(4, secs(10.0));
    wait_for("the third replica in line", secs(10.0), || {
        (cluster.waiters(slots_id.parse().unwrap()) >= 1).then_some(())
    });

    // Through poolers: their sessions are not direct, so the statements carry the guard of a
    // shared backend and a grant is proven on a second session. Session mode leads; transaction
    // mode is refused, as for any role.
    for (mode, wanted, says) in [
        ("session", 0, ""),
        ("transaction", 125, "transaction-mode connection pooler"),
    ] {
        let bouncer = Bouncer::start_for(&cluster, mode, 4, "", &["postgres", "shadowed"]);
        let pooled = bouncer.dsn().replace("user=postgres", "user=shadowed");
        let out = leaderrun()
            .args(["--dsn", &pooled, "--lock-id", &unique_lock_id().to_string()])
            .args(["--once", "--", "true"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(wanted), "{mode}: {text}");
        assert!(text.contains(says), "{mode}: {text}");
        logs.push(text.replace("ERROR", "error (expected)"));
    }

    for replica in slotted.iter_mut().chain([&mut leader, &mut standby]) {
        replica.signal(Signal::SIGTERM);
        replica.wait_exit(secs(10.0));
        logs.push(replica.log());
    }
    let all = logs.join("\n----\n");
    assert!(!all.contains("shadowed:"), "{all}");
    assert!(!all.contains("ERROR"), "{all}");
    assert_eq!(hits(), 0, "a shadow was used:\n{all}");
}

/// A role that may not read `pg_database` (a DBA's `REVOKE SELECT ON pg_catalog.pg_database
/// FROM PUBLIC`, a common hardening step) leads as any other: the leader's check takes the
/// database from its own lock row, not from that catalog (nor from a function a DBA may take), and the same holds for a lock table
/// too full for the catalog's relation lock and for a `VACUUM FULL pg_database` holding it.
/// Before, every check of a held lock failed: each grant started COMMAND and stopped it at its
/// first check, 50 ms later, every interval, and a one-shot killed its COMMAND and exited with
/// the conflict code. `status` reads no `pg_database` of its own either. On a cluster of its
/// own: the shared catalog's privilege is the whole cluster's.
#[test]
fn a_role_that_may_not_read_pg_database_leads_and_keeps_its_term() {
    let cluster = Cluster::start_private();
    let id = unique_lock_id();
    cluster.sql(
        "CREATE ROLE hardened LOGIN; \
         REVOKE SELECT ON pg_catalog.pg_database FROM PUBLIC",
    );
    let dsn = format!(
        "host=127.0.0.1 port={} user=hardened dbname=postgres",
        cluster.addr().port()
    );
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "sleep 1; echo finished");
    let once = leaderrun()
        .args(["--once", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", "200ms", "-E", "75", "--"])
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&once.stderr);
    assert_eq!(once.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&once.stdout),
        "finished\n",
        "{stderr}"
    );
    // A leader keeps its one term for many checks.
    let long = scratch.child_script("long.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", "200ms", "--"])
        .arg(&long);
    let leader = Replica::spawn(cmd);
    let first = scratch.wait_starts(2, secs(10.0))[1].clone();
    let checked = Instant::now();
    wait_for("ten checks of the term", secs(10.0), || {
        (checked.elapsed() > secs(2.0)).then_some(())
    });
    assert_eq!(scratch.starts().len(), 2, "{}", leader.log());
    assert!(!leader.log().contains("lock lost"), "{}", leader.log());
    let status = leaderrun()
        .args(["status", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&first.backend_pid.to_string()),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    // Nor does the check call a function a DBA may take: it reads the database off its own row.
    cluster.sql("REVOKE EXECUTE ON FUNCTION pg_catalog.pg_stat_get_activity(integer) FROM PUBLIC");
    let revoked = Instant::now();
    wait_for("ten more checks of the term", secs(10.0), || {
        (revoked.elapsed() > secs(2.0)).then_some(())
    });
    assert_eq!(scratch.starts().len(), 2, "{}", leader.log());
    assert!(!leader.log().contains("lock lost"), "{}", leader.log());
}
