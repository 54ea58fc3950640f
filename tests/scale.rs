//! Many standbys and `--slots N` through the binary: only a line of two waits in the server's
//! queues however many standbys there are
//! (docs/field-notes.md#every-waiter-costs-a-deadlock-check), hand-overs still reach a waiting
//! standby at once, and with slots every rule of the single lock holds per slot.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{
    alive, secs, status, unique_lock_id, wait_for, Cluster, Replica, Scratch, Setup, Start,
};

/// The standbys `leaderrun status --json` lists, and how many of them wait in a queue.
fn standbys(cluster: &Cluster, id: i32, extra: &[&str]) -> (usize, usize, serde_json::Value) {
    let out = crate::support::status_with(cluster, id, true, extra);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let all = report["standbys"].as_array().map_or(0, Vec::len);
    let queued = report["waiters"].as_array().map_or(0, Vec::len);
    (all, queued, report)
}

#[test]
fn many_standbys_keep_a_line_of_two_and_hand_over_at_once() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // The default interval: a standby not in line would need up to 5 s to notice a release.
    let mut replicas: Vec<Replica> = setup.replicas(12, "5s", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // Eleven standbys, all listed by status, and exactly two of them in the server's queues
    // (the queue head waits for the lock, the second for the head's place).
    let report = wait_for("eleven standbys, two of them queued", secs(12.0), || {
        let (all, queued, report) = standbys(cluster, id, &[]);
        (all == 11 && queued == 2).then_some(report)
    });
    let places: Vec<u64> = report["standbys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["place"].as_u64())
        .collect();
    assert_eq!(places, [1, 2], "{report}");
    assert_eq!(cluster.waiters(id), 2);
    // The line stays two long: a few more checks of every standby.
    let until = Instant::now() + secs(6.0);
    while Instant::now() < until {
        assert!(cluster.waiters(id) <= 2, "more than two standbys queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Graceful: the queue head is granted the lock at once.
    let leader = replicas.iter_mut().find(|r| r.pid() == first.ppid).unwrap();
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    let released = Instant::now();
    let second = scratch.wait_starts(2, secs(2.0))[1].clone();
    assert!(
        released.elapsed() < secs(1.0),
        "handover took {:?}",
        released.elapsed()
    );
    // Sudden, right after: the second in line moved up at the first hand-over, so it too is
    // granted the lock at once.
    let leader = replicas
        .iter_mut()
        .find(|r| r.pid() == second.ppid)
        .unwrap();
    leader.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let third = scratch.wait_starts(3, secs(2.0))[2].clone();
    assert!(
        killed.elapsed() < secs(1.0),
        "failover took {:?}",
        killed.elapsed()
    );
    assert!(third.fencing_token > second.fencing_token);
    assert!(!alive(first.pid) && !alive(second.pid));
    // The free places are taken again within about one interval.
    wait_for("the line of two refilled", secs(8.0), || {
        (cluster.waiters(id) == 2).then_some(())
    });
    assert_eq!(scratch.starts().len(), 3, "one leader at a time");
}

/// `n` replicas of a new lock with `--slots 2` at a 300 ms interval, each running `sleep 600`.
fn two_slots(n: usize) -> (i32, Scratch, Vec<Replica>) {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let args = ["--slots", "2", "--", script.to_str().unwrap()];
    let replicas = (0..n)
        .map(|_| Replica::start(cluster, id, "300ms", &args))
        .collect();
    (id, scratch, replicas)
}

/// `kill -9` of the replica that leads slot 1 (its child among `starts`); waits for the third
/// child, which must be on slot 1. Returns slot 1's old start and the new one.
fn kill_slot1_leader(
    starts: &[Start],
    replicas: &mut [Replica],
    scratch: &Scratch,
) -> (Start, Start) {
    let slot1 = starts.iter().find(|s| s.slot == Some(1)).unwrap().clone();
    let victim = replicas.iter_mut().find(|r| r.pid() == slot1.ppid).unwrap();
    victim.signal(Signal::SIGKILL);
    let _ = victim.wait_exit(secs(5.0));
    let third = scratch.wait_starts(3, secs(5.0))[2].clone();
    assert_eq!(third.slot, Some(1));
    (slot1, third)
}

#[test]
fn slots_let_n_replicas_lead_at_once_each_on_its_own_slot() {
    let cluster = Cluster::shared();
    let (id, scratch, mut replicas) = two_slots(4);
    let starts = scratch.wait_starts(2, secs(10.0));
    let mut slots: Vec<u32> = starts
        .iter()
        .map(|s| s.slot.expect("LEADERRUN_SLOT"))
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1]);
    // Slot k is the key (class + k, id), and LEADERRUN_LOCK names it.
    for start in &starts {
        let class = crate::support::CLASS.wrapping_add(start.slot.unwrap() as i32);
        assert_eq!(start.lock, format!("{class}:{id}"));
    }
    // No third leader while two lead; both other replicas stand by (one of them may head
    // both lines, on a session for each).
    let report = wait_for("two slots held, two standbys", secs(5.0), || {
        let (_, _, report) = standbys(cluster, id, &["--slots", "2"]);
        let mut replicas: Vec<i64> = report["standbys"]
            .as_array()?
            .iter()
            .filter_map(|s| s["leaderrun_pid"].as_i64())
            .collect();
        replicas.sort_unstable();
        replicas.dedup();
        (replicas.len() == 2).then_some(report)
    });
    assert_eq!(scratch.starts().len(), 2);
    // A standby says once who holds the slots.
    for standby in replicas
        .iter()
        .filter(|r| starts.iter().all(|s| s.ppid != r.pid()))
    {
        standby.wait_log("2 of 2 slots are held (by leaderrun on ", 1, secs(5.0));
    }
    let held: Vec<i64> = report["slot_leaders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["leader"]["pid"].as_i64().unwrap_or(0))
        .collect();
    let mut want: Vec<i64> = {
        let mut by_slot = starts.clone();
        by_slot.sort_by_key(|s| s.slot);
        by_slot.iter().map(|s| i64::from(s.backend_pid)).collect()
    };
    assert_eq!(held, want, "{report}");
    let table = String::from_utf8(
        crate::support::status_with(cluster, id, false, &["--slots", "2"]).stdout,
    )
    .unwrap();
    assert!(table.contains("slots          2 of 2 held"), "{table}");
    // Without --slots, status sees slot 0 only.
    let plain: serde_json::Value =
        serde_json::from_slice(&status(cluster, id, true).stdout).unwrap();
    let slot0 = starts.iter().find(|s| s.slot == Some(0)).unwrap();
    assert_eq!(plain["leader"]["pid"], slot0.backend_pid);
    // ... and says that slot 1 is held too.
    assert_eq!(plain["more_slots_held"], serde_json::json!([1]), "{plain}");
    let plain_table = String::from_utf8(status(cluster, id, false).stdout).unwrap();
    assert!(
        plain_table.contains("more slots     1 held too: give --slots 2 (or more) to see them"),
        "{plain_table}"
    );
    assert_eq!(report["more_slots_held"], serde_json::json!([]), "{report}");
    // A standby in slot 1's line is said to wait in another slot's line, where it was said to
    // try the lock every check interval; none of them is.
    let plain = wait_for("slot 1's line seen without --slots", secs(5.0), || {
        let plain: serde_json::Value =
            serde_json::from_slice(&status(cluster, id, true).stdout).ok()?;
        let standbys = plain["standbys"].as_array()?;
        standbys
            .iter()
            .all(|s| s["place"].is_u64() || s["other_slot"] == true)
            .then_some(plain.clone())
            .filter(|_| standbys.iter().any(|s| s["other_slot"] == true))
    });
    let plain_table = String::from_utf8(status(cluster, id, false).stdout).unwrap();
    assert!(
        plain_table.contains("in line for another slot: give --slots 2 (or more) to see it")
            && !plain_table.contains("tries every check interval"),
        "{plain_table}\n{plain}"
    );
    // kill -9 of slot 1's leader: a standby takes slot 1, and slot 0 keeps its leader.
    let (slot1, third) = kill_slot1_leader(&starts, &mut replicas, &scratch);
    assert!(third.fencing_token > slot1.fencing_token);
    assert!(!alive(slot1.pid), "slot 1's old child still runs");
    assert!(alive(slot0.pid), "slot 0's child was disturbed");
    want[1] = i64::from(third.backend_pid);
    let report = wait_for("slot 1 held by the new leader", secs(5.0), || {
        let (_, _, report) = standbys(cluster, id, &["--slots", "2"]);
        let held: Vec<i64> = report["slot_leaders"]
            .as_array()?
            .iter()
            .map(|s| s["leader"]["pid"].as_i64().unwrap_or(0))
            .collect();
        (held == want).then_some(report)
    });
    assert_eq!(report["slots"], 2);
    // step-down of slot 0: its leader hands over to the remaining standby.
    let out = crate::support::leaderrun()
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
        .args([
            "--check-interval",
            "300ms",
            "--slots",
            "2",
            "step-down",
            "--slot",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let fourth = scratch.wait_starts(4, secs(5.0))[3].clone();
    assert_eq!(fourth.slot, Some(0));
    wait_for("slot 0's old child stopped", secs(5.0), || {
        (!alive(slot0.pid)).then_some(())
    });
    assert!(alive(third.pid), "slot 1's child was disturbed");
    let live: Vec<_> = scratch
        .starts()
        .into_iter()
        .filter(|s| alive(s.pid))
        .collect();
    assert_eq!(live.len(), 2, "{live:?}");
    // A slot outside 0 … N-1 is an error.
    let out = crate::support::leaderrun()
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
        .args(["--slots", "2", "step-down", "--slot", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
}

#[test]
fn a_queue_head_that_takes_another_slot_gives_every_place_back() {
    let cluster = Cluster::shared();
    let (id, scratch, mut replicas) = two_slots(3);
    let starts = scratch.wait_starts(2, secs(10.0));
    // The third replica is the queue head of slot 0 (places are tried slot by slot), and of
    // slot 1 too, on a session of its own, since no other standby heads it.
    let report = wait_for("the standby at the head of both slots", secs(5.0), || {
        let (_, _, report) = standbys(cluster, id, &["--slots", "2"]);
        let heads: Vec<_> = report["standbys"]
            .as_array()?
            .iter()
            .filter(|s| s["place"] == 1)
            .map(|s| (s["slot"].as_u64(), s["leaderrun_pid"].as_i64()))
            .collect();
        (heads.len() == 2
            && heads[0].0 == Some(0)
            && heads[1].0 == Some(1)
            && heads[0].1 == heads[1].1)
            .then_some(report)
    });
    let head = report["standbys"][0]["leaderrun_pid"].as_i64().unwrap() as i32;
    // Slot 1 frees up: the head takes it at once, and leaves both lines.
    let (_, third) = kill_slot1_leader(&starts, &mut replicas, &scratch);
    assert_eq!(third.ppid, head);
    // It keeps one session, which holds slot 1's key and nothing else of this lock: no place
    // in either line.
    wait_for(
        "the new leader of slot 1 holds its key only",
        secs(2.0),
        || {
            let held = cluster.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = {} AND granted",
            third.backend_pid
        ));
            (cluster.backends_of(head) == [third.backend_pid] && held == ["1"]).then_some(())
        },
    );
}

/// How many of the first `slots` slots of lock `id` have a session waiting for their key in
/// the server's queue (a queue head).
fn slots_waited_for(cluster: &Cluster, id: i32, slots: u32) -> usize {
    let classes: Vec<String> = (0..slots)
        .map(|k| (crate::support::CLASS.wrapping_add(k as i32) as u32).to_string())
        .collect();
    cluster.sql(&format!(
        "SELECT count(DISTINCT classid) FROM pg_locks WHERE locktype = 'advisory' \
         AND objsubid = 2 AND NOT granted AND objid = ({id}::bigint & 4294967295)::text::oid \
         AND classid::text IN ('{}')",
        classes.join("', '")
    ))[0]
        .parse()
        .unwrap_or(0)
}

/// Seconds since the epoch, as the child's `began` stamp has them.
fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn with_fewer_standbys_than_slots_a_failover_on_any_slot_is_at_once() {
    let cluster = Cluster::shared();
    let setup = Setup::new(
        cluster,
        "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let (id, scratch) = (setup.id, &setup.scratch);
    // A 1 s interval: a slot that no standby waits for would be taken over only at a check,
    // up to 1 s after the kill.
    let mut replicas = setup.replicas(4, "1s", &["--slots", "2"]);
    let mut starts = scratch.wait_starts(2, secs(10.0));
    // Two kill -9 in a row of slot 1's leader: the second leaves one standby for two slots,
    // which must still be in the queue of both.
    for round in 1..=2 {
        wait_for("a standby waits for every slot", secs(5.0), || {
            (slots_waited_for(cluster, id, 2) == 2).then_some(())
        });
        let slot1 = starts
            .iter()
            .rev()
            .find(|s| s.slot == Some(1) && alive(s.pid))
            .unwrap()
            .clone();
        let slot0 = starts
            .iter()
            .rev()
            .find(|s| s.slot == Some(0) && alive(s.pid))
            .unwrap()
            .clone();
        let victim = replicas.iter().position(|r| r.pid() == slot1.ppid).unwrap();
        let killed = epoch_now();
        replicas[victim].signal(Signal::SIGKILL);
        starts = scratch.wait_starts(2 + round, secs(5.0));
        let new = starts[1 + round].clone();
        assert_eq!(new.slot, Some(1), "{starts:?}");
        let began = wait_for("the new child's start stamp", secs(2.0), || {
            scratch.stamp("began", new.pid)
        });
        eprintln!(
            "round {round}: slot 1 taken over {:.3} s after the kill",
            began - killed
        );
        assert!(
            began - killed < 0.3,
            "round {round}: slot 1 taken over {:.3} s after the kill",
            began - killed
        );
        assert!(new.fencing_token > slot1.fencing_token);
        assert!(alive(slot0.pid), "slot 0's child was disturbed");
        // The new leader keeps its lock session only: every other session it waited on is
        // closed, its places given back.
        wait_for("the new leader's one session", secs(2.0), || {
            let held = cluster.sql(&format!(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND a.application_name LIKE 'leaderrun@%:{}'",
                new.ppid
            ));
            (cluster.backends_of(new.ppid).len() == 1 && held == ["1"]).then_some(())
        });
        replicas[victim].wait_exit(secs(5.0));
    }
    assert_eq!(scratch.starts().len(), 4, "one leader per slot at a time");
}
