//! The three rules of the product, end to end: the real binary against a real PostgreSQL
//! (docs/guarantees.md#the-three-rules; issue 10's classes). The supervisor's state machine is
//! tested in-process in `src/supervisor/tests.rs`; these show the same classes from outside.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{
    alive, leader_of, leaderrun, secs, unique_lock_id, wait_for, watchdog_of, Cluster, Replica,
    Scratch, Setup, INTERVAL,
};

fn now_ns() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as f64
        / 1e9
}

/// Records `began PID NS`; on TERM waits 0.6 s, then records `ended PID NS` and exits.
const SLOW_TO_STOP: &str = "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     trap 'sleep 0.6; echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
     while :; do sleep 0.02; done";

#[test]
fn a_failed_check_on_a_live_session_stops_the_child_before_the_lock_moves() {
    // The leader's backend stops answering (SIGSTOP): its check times out after one interval
    // on a session that is still alive and still holds the lock. The standby waits in the
    // server's lock queue, so any release reaches it at once.
    let cluster = Cluster::start_private();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", SLOW_TO_STOP);
    let script = script.to_str().unwrap();
    // The grace outlasts the child's 0.6 s stop.
    let args = ["--grace", "2s", "--", script];
    let leader = Replica::start(&cluster, id, "300ms", &args);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.ppid, leader.pid());
    let _standby = Replica::start(&cluster, id, "300ms", &args);
    wait_for("the standby to wait in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    let backend = Pid::from_raw(first.backend_pid);
    kill(backend, Signal::SIGSTOP).unwrap();
    leader.wait_log("background leader lock lost", 1, secs(5.0));
    // The backend answers again at once: a client that closed its session on demotion has
    // now released the lock, while its child still takes 0.6 s to stop.
    kill(backend, Signal::SIGCONT).unwrap();
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, first.ppid);
    scratch.assert_no_overlap(first.pid, second.pid, &leader.log());
    assert!(!alive(first.pid));
}

#[test]
fn after_a_freeze_past_the_safe_window_no_tick_runs_in_the_old_term() {
    let setup = Setup::new(
        Cluster::shared(),
        "echo \"ran $LEADERRUN_TERM $(date +%s%N)\" >> \"$EVENTS\"",
    );
    let scratch = &setup.scratch;
    let leader = setup.replica("200ms", &["--every", "100ms"]);
    let runs = |scratch: &Scratch| -> Vec<(u64, f64)> {
        scratch
            .events()
            .iter()
            .filter_map(|l| l.strip_prefix("ran "))
            .map(|l| {
                let (term, ns) = l.split_once(' ').unwrap();
                (term.parse().unwrap(), ns.parse::<f64>().unwrap() / 1e9)
            })
            .collect()
    };
    wait_for("a few ticks", secs(10.0), || {
        (runs(scratch).len() >= 3).then_some(())
    });
    // Frozen for 5 safe windows (2 × 200 ms each): every timer is due at once on resume.
    leader.signal(Signal::SIGSTOP);
    std::thread::sleep(secs(2.0));
    let resumed = now_ns();
    leader.signal(Signal::SIGCONT);
    leader.wait_log("background leader lock lost", 1, secs(5.0));
    wait_for("ticks in a new term", secs(10.0), || {
        runs(scratch)
            .iter()
            .any(|(term, _)| *term >= 2)
            .then_some(())
    });
    let stale: Vec<_> = runs(scratch)
        .into_iter()
        .filter(|(term, at)| *term == 1 && *at >= resumed)
        .collect();
    assert!(
        stale.is_empty(),
        "ticks ran in term 1 after the resume: {stale:?}; log:\n{}",
        leader.log()
    );
}

#[test]
fn term_while_stopping_helpers_left_behind_is_not_lost() {
    // COMMAND exits at once and leaves a helper that ignores TERM: the stop waits the grace.
    let setup = Setup::new(
        Cluster::shared(),
        "(trap '' TERM; exec sleep 600) &\necho \"helper $!\" >> \"$EVENTS\"\nexit 0",
    );
    let scratch = &setup.scratch;
    let mut leader = setup.replica("200ms", &["--restart", "always", "--grace", "3s"]);
    let helper = scratch.recorded_pid("helper ");
    leader.wait_log("child exited", 1, secs(10.0));
    leader.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let status = leader.wait_exit(secs(10.0));
    assert!(
        sent.elapsed() < secs(4.5),
        "exited after {:?}",
        sent.elapsed()
    );
    assert_eq!(status.code(), Some(0), "log:\n{}", leader.log());
    assert_eq!(
        scratch.starts().len(),
        1,
        "COMMAND was restarted after TERM"
    );
    assert!(!alive(helper), "the helper outlived leaderrun");
}

#[test]
fn a_nohup_job_survives_the_hangup_and_keeps_hup_ignored() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "trap 'echo usr1 >> \"$EVENTS\"' USR1\n\
         grep SigIgn /proc/$$/status >> \"$EVENTS\"\n\
         while :; do sleep 0.02; done",
    );
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &cluster.dsn(),
        "--lock-id",
        &unique_lock_id().to_string(),
    ])
    .args(["--check-interval", "200ms", "--", script.to_str().unwrap()]);
    // What `nohup` does before exec.
    // SAFETY: signal() between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut leader = Replica::spawn(cmd);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let ignored = wait_for("the child's SigIgn line", secs(5.0), || {
        scratch.events().iter().find_map(|l| {
            l.strip_prefix("SigIgn:")
                .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        })
    });
    assert_ne!(
        ignored & (1 << (libc::SIGHUP - 1)),
        0,
        "HUP not ignored in the child"
    );
    leader.signal(Signal::SIGHUP);
    // Signals are handled in order: once USR1 has been passed on, HUP was dealt with too.
    leader.signal(Signal::SIGUSR1);
    wait_for(
        &format!("USR1 to reach the child; log:\n{}", leader.log()),
        secs(5.0),
        || scratch.events().contains(&"usr1".to_owned()).then_some(()),
    );
    assert!(alive(start.pid), "the job died of the hangup");
    assert!(leader.running());
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
}

/// SIGPIPE and SIGCHLD are no exceptions to "ignored at start stays ignored": a parent that
/// ignores one (a supervisor written in Python or Rust that passes its own disposition on, a
/// daemon that ignores SIGCHLD to have its children reaped, `trap '' PIPE`) gets a COMMAND that
/// ignores it too, also through `--pid-namespace`'s init. What leaderrun ignores for itself
/// (Rust's runtime does SIGPIPE, before `main`) is what COMMAND gets the default back for, and
/// SIGCHLD, which leaderrun handles whatever it was (its reaper needs it), is ignored again
/// for COMMAND only when it was ignored at start.
#[test]
fn a_signal_ignored_by_the_parent_stays_ignored_for_command() {
    let cluster = Cluster::shared();
    let child_sigign = |ignore: Option<libc::c_int>, extra: &[&str]| -> u64 {
        let mut cmd = leaderrun();
        cmd.args(["--once", "--dsn", &cluster.dsn(), "--lock-id"])
            .arg(unique_lock_id().to_string())
            .args(extra)
            .args(["--", "grep", "SigIgn", "/proc/self/status"]);
        if let Some(sig) = ignore {
            // SAFETY: signal() between fork and exec (after default_signals' reset).
            unsafe {
                cmd.pre_exec(move || {
                    libc::signal(sig, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let out = cmd.output().expect("run leaderrun");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mask = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .unwrap_or_else(|| panic!("{extra:?}: no SigIgn line: {stdout}"));
        u64::from_str_radix(mask.trim(), 16).unwrap()
    };
    let mut modes: Vec<&[&str]> = vec![&[]];
    // A PID namespace needs CAP_SYS_ADMIN (the pidns module says so when it is missing).
    if nix::unistd::geteuid().is_root() {
        modes.push(&["--pid-namespace"]);
    }
    for extra in modes {
        let by_default = child_sigign(None, extra);
        for (sig, name) in [(libc::SIGPIPE, "SIGPIPE"), (libc::SIGCHLD, "SIGCHLD")] {
            let bit = 1u64 << (sig - 1);
            assert_ne!(
                child_sigign(Some(sig), extra) & bit,
                0,
                "{extra:?}: {name} ignored by the parent is not ignored in COMMAND"
            );
            assert_eq!(
                by_default & bit,
                0,
                "{extra:?}: {name} at its default in the parent is ignored in COMMAND"
            );
        }
    }
}

/// Every stop begins with the stop signal, a shutdown's too: with `--stop-signal USR2` a
/// demotion and a TERM to leaderrun both reach COMMAND as USR2 (before, the TERM was passed on
/// instead, so a `--stop-signal` chosen for a clean shutdown was never used by `docker stop`).
/// With the default stop signal the INT or TERM received is passed on as it is.
#[test]
fn every_stop_begins_with_the_stop_signal_and_the_default_passes_on_what_was_received() {
    let cluster = Cluster::start_private();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "trap 'echo \"got USR2 $$\" >> \"$EVENTS\"; exit 0' USR2\n\
         trap 'echo \"got TERM $$\" >> \"$EVENTS\"; exit 0' TERM\n\
         trap 'echo \"got INT $$\" >> \"$EVENTS\"; exit 0' INT\n\
         while :; do sleep 0.02; done",
    );
    let args = ["--stop-signal", "USR2", "--", script.to_str().unwrap()];
    let mut leader = Replica::start(&cluster, unique_lock_id(), "200ms", &args);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // Demotion (the server ends the session): the stop signal.
    cluster.terminate_backend(first.backend_pid);
    wait_for("the stop signal to reach the child", secs(5.0), || {
        scratch
            .events()
            .contains(&format!("got USR2 {}", first.pid))
            .then_some(())
    });
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    // Shutdown: the stop signal, not the TERM received.
    leader.signal(Signal::SIGTERM);
    assert_eq!(leader.wait_exit(secs(10.0)).code(), Some(0));
    let events = scratch.events();
    assert!(
        events.contains(&format!("got USR2 {}", second.pid)),
        "{events:?}"
    );
    assert!(
        !events.contains(&format!("got TERM {}", second.pid)),
        "{events:?}"
    );
    // The default stop signal: an INT to leaderrun reaches COMMAND as INT.
    let args = ["--", script.to_str().unwrap()];
    let mut leader = Replica::start(&cluster, unique_lock_id(), "200ms", &args);
    let third = scratch.wait_starts(3, secs(10.0))[2].clone();
    leader.signal(Signal::SIGINT);
    leader.wait_exit(secs(10.0));
    let events = scratch.events();
    assert!(
        events.contains(&format!("got INT {}", third.pid)),
        "{events:?}"
    );
}

/// A tree of three: the main child, a background worker in its process group, and a `setsid`
/// descendant outside it. Each records `tick WHO PID NS` every 10 ms while it lives.
const THREE_LEVEL_TREE: &str = "export EVENTS\n\
     echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     sh -c 'trap \"\" TERM; while :; do echo \"tick worker $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done' &\n\
     setsid sh -c 'trap \"\" TERM; while :; do echo \"tick detached $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done' &\n\
     while :; do echo \"tick main $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done";

fn last_tick_before(scratch: &Scratch, began: f64, old_pids: &[i32]) -> Vec<String> {
    let _ = old_pids;
    scratch
        .events()
        .iter()
        .filter_map(|l| l.strip_prefix("tick "))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let at = f.get(2)?.parse::<f64>().ok()? / 1e9;
            (at > began).then(|| l.to_owned())
        })
        .collect()
}

#[test]
fn kill_9_of_the_leader_kills_its_whole_tree_before_the_lock_moves() {
    let cluster = Cluster::shared();
    for round in 0..3 {
        let id = unique_lock_id();
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", THREE_LEVEL_TREE);
        let script = script.to_str().unwrap();
        let mut leader = Replica::start(cluster, id, "200ms", &["--cgroup", "--", script]);
        let first = scratch.wait_starts(1, secs(10.0))[0].clone();
        wait_for("all three of the first tree ticking", secs(5.0), || {
            let events = scratch.events();
            ["main", "worker", "detached"]
                .iter()
                .all(|w| events.iter().any(|l| l.starts_with(&format!("tick {w} "))))
                .then_some(())
        });
        let standby = Replica::start(cluster, id, "200ms", &["--cgroup", "--", script]);
        wait_for("the standby to wait in the lock queue", secs(10.0), || {
            (cluster.waiters(id) == 1).then_some(())
        });
        let watchdog = watchdog_of(leader.pid()).expect("the leader has a watchdog");
        leader.signal(Signal::SIGKILL);
        let _ = leader.wait_exit(secs(5.0));
        let second = scratch.wait_starts(2, secs(10.0))[1].clone();
        assert_eq!(second.ppid, standby.pid(), "round {round}");
        let began = wait_for("the new child's start stamp", secs(2.0), || {
            scratch.stamp("began", second.pid)
        });
        // Let the new tree tick, so that any old process still alive would have ticked too.
        wait_for("the new tree ticking", secs(5.0), || {
            (scratch
                .events()
                .iter()
                .filter(|l| l.starts_with("tick "))
                .count()
                > 0)
            .then_some(())
        });
        std::thread::sleep(Duration::from_millis(100));
        let old: Vec<String> = last_tick_before(&scratch, began, &[first.pid])
            .into_iter()
            .filter(|l| {
                let pid: i32 = l
                    .split(' ')
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                pid != second.pid && !is_descendant_of(pid, standby.pid())
            })
            .collect();
        assert!(
            old.is_empty(),
            "round {round}: old processes ran beside the new child: {old:?}"
        );
        wait_for("the old watchdog to exit", secs(6.0), || {
            (!alive(watchdog)).then_some(())
        });
    }
}

/// Whether `pid` descends from `ancestor` (walking `/proc/PID/stat` parents), or is gone and
/// so cannot be told: then it counts as not descending.
fn is_descendant_of(pid: i32, ancestor: i32) -> bool {
    let mut current = pid;
    for _ in 0..64 {
        if current == ancestor {
            return true;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{current}/stat")) else {
            return false;
        };
        let Some(ppid) = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split(' ').nth(1))
            .and_then(|p| p.parse().ok())
        else {
            return false;
        };
        if ppid <= 1 {
            return false;
        }
        current = ppid;
    }
    false
}

#[test]
fn a_grant_that_reaches_a_client_that_stopped_listening_is_freed_within_the_bound() {
    if !crate::support::cluster::has_idle_session_timeout(
        "rules::a_grant_that_reaches_a_client_that_stopped_listening_is_freed_within_the_bound",
        crate::support::proxy::PARTITION_NEEDS_IDLE_SESSION_TIMEOUT,
    ) {
        return;
    }
    // The standby behind the proxy waits first in the server's lock queue; then the proxy stops
    // forwarding and the leader releases: the server grants the lock to that standby's
    // session, whose client never hears of it. The session carries idle_session_timeout from
    // its connect, so the server ends it and the third replica leads.
    let cluster = Cluster::start_private();
    let proxy = crate::support::proxy::Proxy::start(cluster.addr());
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    let queued = |n: usize| {
        wait_for(
            &format!("{n} waiter(s) in the lock queue"),
            secs(10.0),
            || (cluster.waiters(id) == n).then_some(()),
        )
    };
    let mut leader = Replica::start(&cluster, id, "200ms", &["--", script]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &proxy.dsn(),
        "--lock-id",
        &id.to_string(),
        "--check-interval",
        "200ms",
        "--",
        script,
    ]);
    let behind_proxy = Replica::spawn(cmd);
    queued(1);
    let third = Replica::start(&cluster, id, "200ms", &["--", script]);
    queued(2);
    proxy.blackhole();
    leader.signal(Signal::SIGTERM);
    let released = Instant::now();
    leader.wait_exit(secs(5.0));
    // idle_session_timeout is 4 × 200 ms; the third replica is still queued and gets it then.
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    let took = released.elapsed();
    assert_eq!(second.ppid, third.pid(), "the replica behind the proxy led");
    assert!(
        took < secs(2.5),
        "the stranded grant held the lock for {took:?}"
    );
    assert_ne!(second.pid, first.pid);
    // The path comes back: the replica behind it must not lead beside the third.
    proxy.forward();
    behind_proxy.wait_log("leader: acquire lock connection", 1, secs(5.0));
    let now = scratch.starts().len();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(scratch.starts().len(), now, "a second leader started");
    assert_eq!(cluster.lock_holders(crate::support::CLASS, id).len(), 1);
}

#[test]
fn a_watchdog_that_dies_is_replaced_and_still_guards_the_tree() {
    let setup = Setup::new(Cluster::shared(), "sh -c 'trap \"\" TERM; echo \"worker $$\" >> \"$0\"; exec sleep 600' \"$EVENTS\" &\nexec sleep 600");
    let scratch = &setup.scratch;
    let mut leader = setup.replica("200ms", &[]);
    scratch.wait_starts(1, secs(10.0));
    let worker = scratch.recorded_pid("worker ");
    let first = wait_for("the watchdog", secs(5.0), || watchdog_of(leader.pid()));
    // Its name is not matched by `pkill leaderrun` / `killall leaderrun`, which would take it
    // down together with leaderrun.
    let comm = std::fs::read_to_string(format!("/proc/{first}/comm")).unwrap();
    assert!(!comm.contains("leaderrun"), "the watchdog's name {comm:?}");
    kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    let second = wait_for("a new watchdog", secs(5.0), || {
        watchdog_of(leader.pid()).filter(|&p| p != first)
    });
    leader.wait_log("the watchdog is gone; starting a new one", 1, secs(2.0));
    // The new one holds the tree: kill -9 of leaderrun still ends the worker.
    leader.signal(Signal::SIGKILL);
    let _ = leader.wait_exit(secs(10.0));
    wait_for("the worker to die", secs(6.0), || {
        (!alive(worker)).then_some(())
    });
    // The watchdog sees the tree gone at its next poll (every 5 ms), then exits.
    wait_for("the watchdog to exit", secs(1.0), || {
        (!alive(second)).then_some(())
    });
}

#[test]
fn a_paused_leaders_tree_is_stopped_by_its_watchdog_before_the_lock_moves() {
    let setup = Setup::new(
        Cluster::shared(),
        "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
         trap 'echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
         while :; do sleep 0.02; done",
    );
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // A grace of 1 s, so that a loaded machine still runs the child's TERM trap (its end
    // stamp) before SIGKILL; idle_session_timeout is then 3 × 200 ms + 1 s.
    let mut replicas: Vec<Replica> =
        setup.replicas(2, INTERVAL, &["--grace", "1s", "--log-format", "json"]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let leader = leader_of(&mut replicas, &first);
    // leaderrun alone is stopped; its tree runs on. Its watchdog stops the tree once the proof
    // ran out (2 × 200 ms) and no heartbeat came for half an interval; only the server's
    // idle_session_timeout (1.6 s) frees the lock, later.
    leader.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    if crate::support::cluster::server_major() == 13 {
        // No idle_session_timeout: the watchdog still stops the tree, but the frozen session
        // keeps the lock (no second leader, and no leader) until leaderrun wakes.
        wait_for(
            "the watchdog to stop the paused leader's tree",
            secs(5.0),
            || (!alive(first.pid)).then_some(()),
        );
        // Past where idle_session_timeout (1.6 s) would have freed it on 14 and later.
        std::thread::sleep(secs(2.5).saturating_sub(paused.elapsed()));
        assert_eq!(
            cluster.lock_holders(crate::support::CLASS, id),
            [first.backend_pid]
        );
        assert_eq!(scratch.starts().len(), 1);
        leader.signal(Signal::SIGCONT);
        scratch.wait_starts(2, secs(10.0));
        return;
    }
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    let took = paused.elapsed();
    assert_ne!(second.ppid, first.ppid);
    assert!(
        took >= secs(0.5),
        "the lock moved after {took:?}, before idle_session_timeout could end the session"
    );
    let (ended, began) = scratch.ended_and_began(first.pid, second.pid);
    assert!(
        ended < began,
        "overlap: old ended {ended:.3}, new began {began:.3}"
    );
    // On resume the old leader finds its tree gone and its lock lost.
    leader.signal(Signal::SIGCONT);
    wait_for(
        &format!("the resumed leader's demotion; log:\n{}", leader.log()),
        secs(2.0),
        || {
            leader
                .log()
                .contains("background leader lock lost")
                .then_some(())
        },
    );
    assert!(!alive(first.pid));
    // The watchdog said so in leaderrun's log format (here JSON), at WARN.
    let log = leader.log();
    let line = log
        .lines()
        .find(|l| l.contains("watchdog: leaderrun stopped answering"))
        .unwrap_or_else(|| panic!("no watchdog line:\n{log}"));
    let object: serde_json::Value = serde_json::from_str(line).expect(line);
    assert_eq!(object["level"], "WARN", "{line}");
    assert!(
        object["timestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{line}"
    );
}
