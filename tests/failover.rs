//! Election and failover through the real `leaderrun` binary against a real PostgreSQL: one
//! child among replicas, a killed leader, a terminated lock session, a server restart, a
//! hand-over on SIGTERM and on release, a database down at start, and a standby or a
//! connecting replica told to stop.

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::support::{
    alive, leader_of, leaderrun, secs, status, unique_lock_id, wait_for, wait_status_waiters,
    Cluster, Replica, Scratch, Setup, CLASS, INTERVAL, UNREACHABLE_DSN,
};

#[test]
fn three_replicas_run_exactly_one_child() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let replicas: Vec<Replica> = setup.replicas(3, INTERVAL, &["-v"]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let leader = replicas.iter().find(|r| r.pid() == start.ppid).unwrap();
    let standbys: Vec<&Replica> = replicas.iter().filter(|r| r.pid() != start.ppid).collect();
    assert_eq!(standbys.len(), 2);
    // Every standby has been refused five times since: still exactly one child.
    for standby in &standbys {
        standby.wait_log("lock held by another session", 5, secs(10.0));
    }
    assert_eq!(scratch.starts().len(), 1, "events: {:?}", scratch.events());
    assert!(alive(start.pid));
    // The child's backend is the one holding the seed's lock row; it names this host and pid.
    assert_eq!(cluster.lock_holders(CLASS, id), vec![start.backend_pid]);
    assert_eq!(start.term, 1);
    assert_eq!(start.lock, format!("{CLASS}:{id}"));
    assert!(start.fencing_token > 0);
    let app = cluster.sql(&format!(
        "SELECT application_name FROM pg_stat_activity WHERE pid = {}",
        start.backend_pid
    ));
    assert!(
        app[0].starts_with("leaderrun@") && app[0].ends_with(&format!(":{}", start.ppid)),
        "application_name {app:?}"
    );
    let log = leader.log();
    assert!(log.contains("background leader lock acquired"), "{log}");
    assert!(
        log.contains(&format!("backend_pid={}", start.backend_pid)),
        "{log}"
    );
    assert!(
        log.contains("term=1") && log.contains("database=postgres"),
        "{log}"
    );
    assert!(
        log.contains(&format!("child started pid={}", start.pid)),
        "{log}"
    );
}

#[test]
fn kill_9_of_the_leader_kills_its_child_and_another_takes_over() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let mut replicas: Vec<Replica> = setup.replicas(3, INTERVAL, &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    leader_of(&mut replicas, &first).signal(Signal::SIGKILL);
    let killed = Instant::now();
    wait_for("the old child to die with its leaderrun", secs(2.0), || {
        (!alive(first.pid)).then_some(())
    });
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    let took = killed.elapsed();
    assert_ne!(second.ppid, first.ppid);
    assert!(second.fencing_token > first.fencing_token);
    // The server ends the dead leader's session at once, and a standby waiting in the lock
    // queue is granted the lock then.
    assert!(took < secs(1.5), "failover took {took:?}");
}

#[test]
fn terminated_lock_session_stops_the_child_at_once() {
    // A trap-less script with a background and a foreground worker: the group signal must stop
    // all of them, not only sh.
    let setup = Setup::new(
        Cluster::shared(),
        "sleep 600 & echo \"bg $!\" >> \"$EVENTS\"\nsleep 600\nwait",
    );
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // A long interval, so "at once" cannot be the next check.
    let mut replicas: Vec<Replica> = setup.replicas(2, "3s", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let background: i32 = scratch.recorded_pid("bg ");
    cluster.terminate_backend(first.backend_pid);
    let terminated = Instant::now();
    wait_for("the child's whole group to stop", secs(1.5), || {
        (!alive(first.pid) && !alive(background)).then_some(())
    });
    assert!(terminated.elapsed() < secs(1.5));
    let leader = leader_of(&mut replicas, &first);
    leader.wait_log("background leader lock lost", 1, secs(1.0));
    assert!(leader.running(), "a demoted leader goes back to standby");
    // Leadership is taken again within about one interval: by the other replica, or by the
    // demoted one when its next check comes first (the seed retries on a fixed interval).
    let second = scratch.wait_starts(2, secs(6.0))[1].clone();
    if second.ppid == first.ppid {
        assert_eq!(second.term, 2);
    }
    assert_ne!(second.backend_pid, first.backend_pid);
    assert_eq!(cluster.lock_holders(CLASS, id), vec![second.backend_pid]);
}

#[test]
fn leadership_comes_back_after_a_server_restart() {
    let cluster = Cluster::start_private();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = Replica::start(&cluster, id, INTERVAL, &["--", script.to_str().unwrap()]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    cluster.restart();
    wait_for("the first term's child to stop", secs(3.0), || {
        (!alive(first.pid)).then_some(())
    });
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    // COMMAND starts afresh in the next term of the same process.
    assert_eq!(second.ppid, first.ppid);
    assert_eq!(second.term, 2);
    assert_ne!(second.pid, first.pid);
    assert!(replica.log().contains("background leader lock lost"));
    assert_eq!(cluster.lock_holders(CLASS, id), vec![second.backend_pid]);
}

#[test]
fn sigterm_stops_the_child_exits_with_its_status_and_hands_over() {
    let setup = Setup::new(
        Cluster::shared(),
        "trap 'echo \"term $$\" >> \"$EVENTS\"; exit 3' TERM\nwhile :; do sleep 0.05; done",
    );
    let scratch = &setup.scratch;
    let mut replicas: Vec<Replica> = setup.replicas(2, INTERVAL, &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let leader = leader_of(&mut replicas, &first);
    leader.signal(Signal::SIGTERM);
    let status = leader.wait_exit(secs(5.0));
    let exited = Instant::now();
    assert_eq!(status.code(), Some(3), "log:\n{}", leader.log());
    assert!(scratch.events().contains(&format!("term {}", first.pid)));
    assert!(leader.log().contains("background leader lock released"));
    let second = scratch.wait_starts(2, secs(3.0))[1].clone();
    assert_ne!(second.ppid, first.ppid);
    let took = exited.elapsed();
    assert!(took < secs(1.0), "handover took {took:?}");
}

#[test]
fn a_release_reaches_a_waiting_standby_at_once_even_at_the_default_interval() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // The default check interval, 5 s: without waiting in the lock queue a standby would need
    // up to 5 s to notice.
    let mut replicas: Vec<Replica> = setup.replicas(4, "5s", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // Every replica has made its first check (they spread their first connects over up to
    // a quarter interval), and two of them wait in line.
    wait_for("three standbys, two in line", secs(5.0), || {
        let out = status(cluster, id, true);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (report["standbys"].as_array()?.len() == 3 && cluster.waiters(id) == 2).then_some(())
    });
    // Graceful: SIGTERM, the child stops, the lock is released, a standby is granted it.
    let leader = leader_of(&mut replicas, &first);
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    let released = Instant::now();
    let second = scratch.wait_starts(2, secs(2.0))[1].clone();
    assert!(
        released.elapsed() < secs(1.0),
        "graceful handover took {:?}",
        released.elapsed()
    );
    // Sudden: kill -9, the server frees the lock when the socket closes.
    let leader = leader_of(&mut replicas, &second);
    leader.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let third = scratch.wait_starts(3, secs(2.0))[2].clone();
    assert!(
        killed.elapsed() < secs(1.0),
        "failover took {:?}",
        killed.elapsed()
    );
    assert!(third.fencing_token > second.fencing_token);
    // The one standby left waits in the server's queue: `status` shows it as the waiter, in
    // the table and in --json, next to the third leader.
    let standby = replicas
        .iter()
        .find(|r| ![first.ppid, second.ppid, third.ppid].contains(&r.pid()))
        .expect("one standby left");
    let standby_backends = cluster.backends_of(standby.pid());
    assert_eq!(standby_backends.len(), 1, "{standby_backends:?}");
    // It was not in line (the two places were taken): it takes the free place at its next
    // check, at most one interval (5 s) later.
    wait_status_waiters(cluster, id, &standby_backends, secs(7.0));
    let report: serde_json::Value =
        serde_json::from_slice(&status(cluster, id, true).stdout).unwrap();
    assert_eq!(report["leader"]["pid"], third.backend_pid);
}

#[test]
fn database_down_at_start_warns_then_leads() {
    let cluster = Cluster::start_private();
    cluster.stop();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = Replica::start(&cluster, id, INTERVAL, &["--", script.to_str().unwrap()]);
    replica.wait_log(
        "WARN leader: acquire lock connection: connect to",
        2,
        secs(5.0),
    );
    assert!(scratch.starts().is_empty());
    // The cause chain is shown, not just "connect to ...".
    let log = replica.log();
    assert!(log.contains(": Connection refused"), "{log}");
    cluster.start();
    let start = scratch.wait_starts(1, secs(5.0))[0].clone();
    assert_eq!(start.ppid, replica.pid());
}

#[test]
fn sigterm_while_standby_exits_0_and_starts_nothing() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let _leader = setup.replica(INTERVAL, &[]);
    scratch.wait_starts(1, secs(10.0));
    let mut standby = setup.replica(INTERVAL, &["-v"]);
    standby.wait_log("lock held by another session", 1, secs(5.0));
    standby.signal(Signal::SIGTERM);
    assert_eq!(standby.wait_exit(secs(5.0)).code(), Some(0));
    assert_eq!(scratch.starts().len(), 1);
}

#[test]
fn signal_while_connecting_ends_cleanly_with_no_child() {
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    // Port 1 refuses at once; a blackholed address would hang connect: both are "connecting".
    let mut cmd = leaderrun();
    cmd.args(["--dsn", UNREACHABLE_DSN]).args([
        "--check-interval",
        INTERVAL,
        "--",
        script.to_str().unwrap(),
    ]);
    let mut replica = Replica::spawn(cmd);
    replica.wait_log("leader: acquire lock connection:", 1, secs(5.0));
    replica.signal(Signal::SIGINT);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(0));
    assert!(scratch.starts().is_empty());
}
