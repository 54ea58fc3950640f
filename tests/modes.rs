//! The modes of docs/guarantees.md#modes with a real PostgreSQL and real processes: cron one-shots,
//! --wait, the ticker and `--tick-at-grant`, restarts, timeouts, takeover delay and name-derived
//! lock ids.

use std::process::{Command, Stdio};
use std::time::Instant;

use nix::sys::signal::Signal;

use crate::support::{
    alive, leaderrun, secs, unique_lock_id, wait_for, Cluster, Replica, Scratch, Setup, CLASS,
    INTERVAL, UNREACHABLE_DSN,
};

/// A replica that holds lock `id` (its child sleeps) until dropped.
fn holder(cluster: &Cluster, id: i32, scratch: &Scratch) -> Replica {
    let script = scratch.child_script("holder.sh", "exec sleep 600");
    let replica = Replica::start(cluster, id, INTERVAL, &["--", script.to_str().unwrap()]);
    scratch.wait_starts(1, secs(10.0));
    replica
}

/// Timestamps (seconds) of lines `PREFIX <nanoseconds>` in the event log.
fn stamps(scratch: &Scratch, prefix: &str) -> Vec<f64> {
    scratch
        .events()
        .iter()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|ns| ns.trim().parse::<f64>().unwrap() / 1e9)
        .collect()
}

#[test]
fn cron_on_two_hosts_two_seconds_apart_runs_the_job_once() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "sleep 1\necho \"done $$\" >> \"$EVENTS\"");
    let args = ["--once", "--min-hold", "10s", "--", job.to_str().unwrap()];
    let first_fired = Instant::now();
    let mut first = Replica::start(cluster, id, "1s", &args);
    let start = scratch.wait_starts(1, secs(5.0))[0].clone();
    // The second host's cron fires 2 s later, after the 1 s job has finished: wait for both
    // instead of hoping 2 s were enough for the job.
    scratch.recorded_pid("done ");
    wait_for("the first job to exit", secs(5.0), || {
        (!alive(start.pid)).then_some(())
    });
    wait_for(
        "the second host's cron time, 2 s after the first",
        secs(5.0),
        || (first_fired.elapsed() >= secs(2.0)).then_some(()),
    );
    // The job is over, but --min-hold keeps the first host's lock session holding the lock.
    assert!(first.running(), "the first host exited before --min-hold");
    assert_eq!(cluster.lock_holders(CLASS, id), vec![start.backend_pid]);
    let mut second = Replica::start(cluster, id, "1s", &args);
    assert_eq!(second.wait_exit(secs(5.0)).code(), Some(0));
    assert_eq!(second.log(), "", "a skipping host prints nothing");
    assert_eq!(second.stdout(), "", "a skipping host runs nothing");
    assert_eq!(scratch.starts().len(), 1, "the job ran once");
    // The first host kept the lock for the whole --min-hold, then released it.
    assert_eq!(first.wait_exit(secs(15.0)).code(), Some(0));
    assert!(first_fired.elapsed() >= secs(10.0));
    assert!(cluster.lock_holders(CLASS, id).is_empty());
}

/// A leaderrun started by COMMAND of a leaderrun that holds the same lock (the key set by the
/// environment both read, as in a container's) can never lead while the outer one does: its
/// one-shot skips with exit 0, the inner job never run, and nothing said why even at `-v`. It
/// now says why at start: an INFO in a one-shot (which prints nothing at its default level
/// when refused), a WARN in the other modes. On a key of its own it says nothing and runs.
#[test]
fn a_leaderrun_inside_one_that_holds_its_lock_says_it_cannot_lead() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let inner = |flags: &str| {
        format!(
            "{} --once -v {flags} -- echo inner-ran",
            env!("CARGO_BIN_EXE_leaderrun")
        )
    };
    let other = unique_lock_id().to_string();
    let out = leaderrun()
        .env("LEADERRUN_DSN", cluster.dsn())
        .env("LEADERRUN_LOCK_ID", &id)
        .args(["--once", "--", "sh", "-c"])
        .arg(format!(
            "{}; {}",
            inner(""),
            inner(&format!("--lock-id {other}"))
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("inner-ran").count(), 1, "{stdout}");
    assert_eq!(
        stderr
            .matches(&format!(
                "INFO the leaderrun that started this one holds this lock \
                 (LEADERRUN_LOCK={CLASS}:{id} in the environment)"
            ))
            .count(),
        1,
        "{stderr}"
    );
    // The default mode, a standby for good: a WARN.
    let mut cmd = leaderrun();
    cmd.env("LEADERRUN_DSN", cluster.dsn())
        .env("LEADERRUN_LOCK_ID", &id)
        .args(["--check-interval", INTERVAL, "--", "sh", "-c"])
        .arg(format!("{} -- true", env!("CARGO_BIN_EXE_leaderrun")));
    let mut outer = Replica::spawn(cmd);
    outer.wait_log(
        &format!(
            "WARN the leaderrun that started this one holds this lock \
             (LEADERRUN_LOCK={CLASS}:{id} in the environment)"
        ),
        1,
        secs(10.0),
    );
    outer.signal(Signal::SIGTERM);
    outer.wait_exit(secs(10.0));
}

#[test]
fn once_while_another_session_holds_the_lock_exits_silently() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let _holder = holder(cluster, id, &scratch);
    let job = scratch.child_script("job.sh", "echo ran");
    let started = Instant::now();
    let mut skipped = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--once", "--", job.to_str().unwrap()],
    );
    assert_eq!(skipped.wait_exit(secs(5.0)).code(), Some(0));
    assert!(started.elapsed() < secs(3.0), "--once is one check");
    assert_eq!(
        (skipped.log(), skipped.stdout()),
        (String::new(), String::new())
    );
    // The environment form and a conflict code of our own.
    let mut cmd = leaderrun();
    cmd.env("LEADERRUN_ONCE", "1")
        .env("LEADERRUN_DSN", cluster.dsn())
        .env("LEADERRUN_LOCK_ID", id.to_string())
        .args(["--conflict-exit-code", "75", "--", job.to_str().unwrap()]);
    let mut skipped = Replica::spawn(cmd);
    assert_eq!(skipped.wait_exit(secs(5.0)).code(), Some(75));
    assert_eq!(skipped.log(), "");
    // With -v the skip says so (before, only the start line: a skip looked like a run that
    // never started).
    let mut told = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["-v", "--once", "--", job.to_str().unwrap()],
    );
    assert_eq!(told.wait_exit(secs(5.0)).code(), Some(0));
    assert!(
        told.log()
            .contains("another session holds the lock; COMMAND does not run"),
        "{}",
        told.log()
    );
    assert_eq!(
        scratch.starts().len(),
        1,
        "only the holder's child ever ran"
    );
}

#[test]
fn once_when_leading_runs_to_the_end_and_releases() {
    let setup = Setup::new(Cluster::shared(), "exit 9");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let mut once = setup.replica(INTERVAL, &["-n"]);
    assert_eq!(once.wait_exit(secs(5.0)).code(), Some(9));
    assert_eq!(scratch.starts().len(), 1);
    assert!(cluster.lock_holders(CLASS, id).is_empty());
}

#[test]
fn once_against_an_unreachable_database_is_an_error() {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", UNREACHABLE_DSN, "--once", "--", "true"]);
    let mut once = Replica::spawn(cmd);
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(125));
    assert!(
        once.log().contains("could not check the lock"),
        "{}",
        once.log()
    );
    // --wait too, once the wait is over.
    let mut cmd = leaderrun();
    cmd.args(["--dsn", UNREACHABLE_DSN]).args([
        "--check-interval",
        INTERVAL,
        "--wait",
        "600ms",
        "--",
        "true",
    ]);
    let mut wait = Replica::spawn(cmd);
    assert_eq!(wait.wait_exit(secs(10.0)).code(), Some(125));
}

/// `LEADERRUN_ONCE=0` (or `false`, `no`, `off`) is no `--once`: the other modes, given as
/// options or variables, run; before, clap counted the variable as given and refused them
/// ("the argument '--once' cannot be used with …", exit 125). `LEADERRUN_ONCE=1` still
/// conflicts with them.
#[test]
fn a_false_leaderrun_once_is_no_once() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    for (args, envs) in [
        (&["--wait", "5s"][..], &[][..]),
        (&["--restart", "never"], &[]),
        (&[], &[("LEADERRUN_WAIT", "5s")]),
    ] {
        for off in ["0", "false", "no", "off"] {
            let out = leaderrun()
                .env("LEADERRUN_ONCE", off)
                .envs(envs.iter().copied())
                .args(["--dsn", &cluster.dsn(), "--lock-id", &id])
                .args(args)
                .args(["--", "echo", "led"])
                .output()
                .unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{off} {args:?} {envs:?}: {log}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "led\n", "{log}");
        }
    }
    // A true one with --wait typed: the flag wins over the variable it excludes
    // (exits::a_flag_wins_over_a_variable_it_excludes).
    let out = leaderrun()
        .env("LEADERRUN_ONCE", "1")
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id])
        .args(["--wait", "5s", "--", "echo", "led"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "led\n");
}

#[test]
fn wait_times_out_with_the_conflict_code() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let _holder = holder(cluster, id, &scratch);
    let started = Instant::now();
    let mut waiter = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--wait", "1s", "--conflict-exit-code", "3", "--", "true"],
    );
    assert_eq!(waiter.wait_exit(secs(5.0)).code(), Some(3));
    let took = started.elapsed();
    assert!(
        took >= secs(1.0) && took < secs(3.0),
        "--wait 1s took {took:?}"
    );
    assert_eq!(waiter.log(), "");
}

#[test]
fn a_wait_shorter_than_the_check_interval_still_means_conflict() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let _holder = holder(cluster, id, &scratch);
    // The default 5 s interval: the standby is still waiting in the lock queue when --wait ends.
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
        .args([
            "--wait",
            "1s",
            "--conflict-exit-code",
            "7",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--", "true"]);
    let mut waiter = Replica::spawn(cmd);
    let code = waiter.wait_exit(secs(5.0)).code();
    assert_eq!(code, Some(7), "{}", waiter.log());
    assert_eq!(
        waiter.log(),
        "",
        "a skipping one-shot prints nothing, probes or not"
    );
}

#[test]
fn very_long_intervals_still_connect() {
    let setup = Setup::new(Cluster::shared(), "exit 0");
    let mut once = setup.replica("10h", &["--once"]);
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0), "{}", once.log());
}

#[test]
fn wait_succeeds_when_the_holder_lets_go() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let holder = holder(cluster, id, &scratch);
    let job = scratch.child_script("job.sh", "exit 4");
    let mut waiter = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--wait", "10s", "--", job.to_str().unwrap()],
    );
    holder.signal(Signal::SIGTERM);
    assert_eq!(waiter.wait_exit(secs(10.0)).code(), Some(4));
    assert_eq!(scratch.starts().len(), 2);
}

#[test]
fn losing_leadership_mid_run_in_once_exits_with_the_conflict_code() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, scratch) = (setup.cluster, &setup.scratch);
    let mut once = setup.replica(INTERVAL, &["-v", "--once", "--conflict-exit-code", "42"]);
    let start = scratch.wait_starts(1, secs(5.0))[0].clone();
    cluster.terminate_backend(start.backend_pid);
    assert_eq!(once.wait_exit(secs(5.0)).code(), Some(42));
    assert!(!alive(start.pid));
    assert!(
        once.log()
            .contains("INFO leadership lost while COMMAND ran"),
        "{}",
        once.log()
    );
}

/// A period far shorter than a run skips a tick at every period while the run goes on: the
/// first skip is said as it happens, the rest in one line when the run ends (a line per
/// period was 170,000 lines a second at `--every 1ns`, which is now refused: under the
/// timers' millisecond it never slept). The metric still counts every skipped tick.
#[test]
fn a_short_period_says_its_skipped_ticks_once_per_run() {
    let setup = Setup::new(
        Cluster::shared(),
        "echo \"begin $(date +%s%N)\" >> \"$EVENTS\"\nsleep 0.3",
    );
    let mut leader = setup.replica(INTERVAL, &["--every", "2ms"]);
    setup.scratch.wait_starts(3, secs(15.0));
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    let log = leader.log();
    let skips = log
        .matches("tick skipped: the previous run is still going")
        .count();
    let starts = setup.scratch.starts().len();
    assert!(
        (1..=starts).contains(&skips),
        "{skips} skip lines for {starts} runs:\n{log}"
    );
    // Each run of 0.3 s at a 2 ms period leaves far more than one skipped tick.
    let summaries: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split("ticks skipped while the run went on: ").nth(1))
        .map(|n| n.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(
        summaries.len() >= 2 && summaries.iter().all(|&n| n >= 2),
        "{summaries:?}\n{log}"
    );

    let refused = leaderrun()
        .args([
            "--dsn",
            "host=127.0.0.1 port=1",
            "--every",
            "999us",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("at least 1ms"),
        "{refused:?}"
    );
}

#[test]
fn a_ticker_on_two_replicas_runs_only_on_the_leader_and_never_overlaps() {
    // Each run takes longer than the period, so some ticks fall due while one runs.
    let setup = Setup::new(Cluster::shared(), "echo \"begin $(date +%s%N)\" >> \"$EVENTS\"\nsleep 0.45\necho \"end $(date +%s%N)\" >> \"$EVENTS\"");
    let scratch = &setup.scratch;
    let replicas: Vec<Replica> = setup.replicas(2, INTERVAL, &["--every", "300ms"]);
    scratch.wait_starts(4, secs(10.0));
    let starts = scratch.starts();
    assert!(
        starts.iter().all(|s| s.ppid == starts[0].ppid),
        "{starts:?}"
    );
    let leader = replicas.iter().find(|r| r.pid() == starts[0].ppid).unwrap();
    leader.wait_log(
        "tick skipped: the previous run is still going",
        1,
        secs(5.0),
    );
    let (begins, ends) = (stamps(scratch, "begin "), stamps(scratch, "end "));
    for (i, end) in ends.iter().enumerate() {
        if let Some(next) = begins.get(i + 1) {
            assert!(
                end <= next,
                "run {i} ended at {end} after run {} began at {next}",
                i + 1
            );
        }
    }
}

#[test]
fn a_failed_tick_is_logged_and_ticking_goes_on() {
    let setup = Setup::new(Cluster::shared(), "exit 3");
    let scratch = &setup.scratch;
    let replica = setup.replica(INTERVAL, &["--every", "200ms"]);
    scratch.wait_starts(3, secs(10.0));
    replica.wait_log(
        "WARN tick failed: COMMAND exited with exit code 3",
        2,
        secs(5.0),
    );
}

#[test]
fn a_ticker_timeout_is_a_failed_tick() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let replica = setup.replica(INTERVAL, &["--every", "200ms", "--timeout", "300ms"]);
    let first = scratch.wait_starts(2, secs(10.0))[0].clone();
    assert!(!alive(first.pid));
    replica.wait_log(
        "WARN tick failed: COMMAND ran longer than --timeout",
        1,
        secs(2.0),
    );
}

#[test]
fn restart_always_backs_off_doubling() {
    let setup = Setup::new(
        Cluster::shared(),
        "echo \"at $(date +%s%N)\" >> \"$EVENTS\"\nexit 1",
    );
    let scratch = &setup.scratch;
    let replica = setup.replica(INTERVAL, &["--restart", "always"]);
    scratch.wait_starts(4, secs(10.0));
    let at = stamps(scratch, "at ");
    let starts = scratch.starts();
    assert!(
        starts.iter().all(|s| s.term == 1),
        "restarts stay in the term"
    );
    for (k, pair) in at.windows(2).take(3).enumerate() {
        let gap = pair[1] - pair[0];
        let expected = 0.5 * f64::from(1u32 << k);
        assert!(
            gap >= expected - 0.02 && gap <= expected + 0.6,
            "gap {k} was {gap:.3}s, expected about {expected}s"
        );
    }
    assert!(replica
        .log()
        .contains("restarting COMMAND after the back-off"));
}

#[test]
fn restart_on_failure_ends_after_a_success() {
    // Fails twice, then succeeds.
    let setup = Setup::new(
        Cluster::shared(),
        "n=$(grep -c '^start ' \"$EVENTS\")\n[ \"$n\" -ge 3 ] && exit 0\nexit 2",
    );
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &["-q", "--restart", "on-failure"]);
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    assert_eq!(scratch.starts().len(), 3);
    // Each failure is a WARN, so a crash loop shows even at -q.
    let log = replica.log();
    let failures = log
        .lines()
        .filter(|l| {
            l.contains(" WARN ")
                && l.contains("COMMAND failed (exit code 2); restarting COMMAND after the back-off")
        })
        .count();
    assert_eq!(failures, 2, "{log}");
}

/// Under `--restart on-failure|always`, a start that fails (COMMAND's file gone for a moment:
/// a deploy replacing it; the process limit reached) is a run that failed at once: started
/// again after the back-off, in the same term, counted and recorded as such. Before, the
/// leader ended with 127 (125 for a failed fork), which `--restart` was given to avoid.
#[test]
fn under_restart_a_start_that_fails_is_tried_again_after_the_back_off() {
    let cluster = Cluster::shared();
    for restart in ["on-failure", "always"] {
        let scratch = Scratch::new();
        // The first run moves its own file away and fails; a later one runs on.
        let job = scratch.child_script(
            "job.sh",
            "[ -e \"$EVENTS.moved\" ] && exec sleep 600\n\
             touch \"$EVENTS.moved\"\nmv \"$0\" \"$0.away\"\nexit 1",
        );
        let job = job.to_str().unwrap();
        let id = unique_lock_id();
        let table = format!("runs_failed_start_{id}");
        let mut replica = Replica::start(
            cluster,
            id,
            INTERVAL,
            &[
                "--restart",
                restart,
                "--http-addr",
                "127.0.0.1:0",
                "--history",
                "--history-table",
                &table,
                "--",
                job,
            ],
        );
        scratch.wait_starts(1, secs(10.0));
        replica.wait_log("COMMAND could not be started (", 1, secs(5.0));
        // Counted: the leader goes on, so the failure shows on /metrics, not as an exit.
        let metrics =
            crate::support::http(crate::support::probe_addr(&replica), "GET", "/metrics").1;
        assert!(
            crate::support::sample(&metrics, "leaderrun_child_start_failures_total")
                .is_some_and(|n| n >= 1.0),
            "{metrics}"
        );
        // And in the history, as a run that failed at once, with the status a shell gives.
        wait_for("the failed start's row", secs(10.0), || {
            (cluster.sql(&format!(
                "SELECT count(*) FROM {table} WHERE outcome = 'failed' AND exit_code = 127 \
                 AND started_at = ended_at"
            )) != ["0"])
            .then_some(())
        });
        // The deploy ends: the file is back, and a later try runs it, in the same term.
        std::fs::rename(format!("{job}.away"), job).unwrap();
        let starts = scratch.wait_starts(2, secs(10.0));
        assert_eq!(starts[1].term, starts[0].term, "{restart}");
        assert!(replica.running(), "{restart}: {}", replica.log());
        replica.signal(Signal::SIGTERM);
        assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(143), "{restart}");
    }
}

#[test]
fn timeout_stops_the_command_and_exits_124() {
    let cluster = Cluster::shared();
    for mode in [&["--once"][..], &[]] {
        let scratch = Scratch::new();
        let job = scratch.child_script("job.sh", "exec sleep 600");
        let mut args = mode.to_vec();
        args.extend_from_slice(&["--timeout", "500ms", "--", job.to_str().unwrap()]);
        let mut replica = Replica::start(cluster, unique_lock_id(), INTERVAL, &args);
        let start = scratch.wait_starts(1, secs(5.0))[0].clone();
        let began = Instant::now();
        assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(124), "{mode:?}");
        assert!(began.elapsed() < secs(2.0));
        assert!(!alive(start.pid));
    }
}

#[test]
fn takeover_delay_holds_command_back_while_the_lock_is_verified() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let started = Instant::now();
    let replica = setup.replica(INTERVAL, &["-v", "--takeover-delay", "1s"]);
    replica.wait_log("background leader lock acquired", 1, secs(5.0));
    scratch.wait_starts(1, secs(5.0));
    assert!(started.elapsed() >= secs(1.0));
    // The child may write its start line before leaderrun's own line about it is collected.
    replica.wait_log("child started", 1, secs(5.0));
    // The lock was verified during the delay.
    let log = replica.log();
    let acquired = log.find("background leader lock acquired").unwrap();
    let started_child = log.find("child started").unwrap();
    assert!(
        log[acquired..started_child].contains("leader check ok"),
        "{log}"
    );
}

#[test]
fn lock_name_derives_a_fixed_id_that_excludes_by_name() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    let name = format!("nightly-report-{}", unique_lock_id());
    let id = leaderrun::pg::lock::lock_id_for_name(&name);
    let start_with = |name: &str| {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &cluster.dsn(), "--lock-name", name])
            .args(["--check-interval", INTERVAL, "--", job]);
        Replica::spawn(cmd)
    };
    let same: Vec<Replica> = (0..2).map(|_| start_with(&name)).collect();
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.lock, format!("{CLASS}:{id}"));
    assert_eq!(cluster.lock_holders(CLASS, id), vec![first.backend_pid]);
    let leader = same.iter().find(|r| r.pid() == first.ppid).unwrap();
    assert!(leader.log().contains(&format!("lock={CLASS}:{id}")));
    // Another name is another lock: it runs alongside.
    let _other = start_with(&format!("{name}-other"));
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.lock, first.lock);
    assert!(alive(first.pid));
    wait_for("still one child for the first name", secs(1.0), || {
        (scratch
            .starts()
            .iter()
            .filter(|s| s.lock == first.lock)
            .count()
            == 1)
            .then_some(())
    });
}

#[test]
fn mode_usage_errors_exit_125() {
    let cases: &[&[&str]] = &[
        &["--once", "--every", "1m", "--", "true"],
        &["--wait", "5s", "--every", "1m", "--", "true"],
        &["--min-hold", "10s", "--", "true"],
        &["--lock-name", "a", "--lock-id", "1", "--", "true"],
        &["--conflict-exit-code", "256", "--", "true"],
        &["--restart", "sometimes", "--", "true"],
        &["--restart", "always", "--once", "--", "true"],
        &["--every", "0s", "--", "true"],
        &["--timeout", "soon", "--", "true"],
        &["--wait", "-1s", "--", "true"],
        &["--takeover-delay", "-1s", "--", "true"],
    ];
    for args in cases {
        let out = leaderrun().args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
    let out = leaderrun()
        .env("LEADERRUN_ONCE", "garbage")
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
}

#[test]
fn flock_and_timeout_habits_work() {
    let cluster = Cluster::shared();
    let dsn = cluster.dsn();
    let id = unique_lock_id();
    let id_arg = id.to_string();
    let base = ["--dsn", dsn.as_str(), "--lock-id", id_arg.as_str()];
    // -c STRING runs `sh -c STRING` as COMMAND: shell syntax, its status, the child environment.
    let scratch = Scratch::new();
    let out_file = scratch.file("out");
    let script = format!(
        "echo \"$0 $LEADERRUN_LOCK\" | tr a-z A-Z > '{}'; exit 7",
        out_file.display()
    );
    let out = leaderrun()
        .args(base)
        .args([
            "-n",
            "--takeover-delay",
            "0",
            "--min-hold",
            "0",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        format!("SH {CLASS}:{id}\n")
    );

    // While another replica leads: -n -E and -w -E exit with the conflict code, -c never runs.
    let _holder = holder(cluster, id, &scratch);
    let ran = scratch.file("ran");
    let touch = format!("touch '{}'", ran.display());
    for mode in [&["-n"][..], &["-w", "300ms"]] {
        let out = leaderrun()
            .args(base)
            .args(["--check-interval", INTERVAL])
            .args(mode)
            .args(["-E", "75", "-c", &touch])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{mode:?}: {stderr}");
    }
    assert!(!ran.exists(), "-c ran while another replica led");

    // -s and -k (timeout(1)): the stop signal reaches COMMAND, and after -k comes SIGKILL.
    let other = unique_lock_id().to_string();
    let traps = scratch.child_script(
        "traps.sh",
        "trap 'echo \"got INT\" >> \"$EVENTS\"' INT\necho trapped >> \"$EVENTS\"\n\
         while :; do sleep 0.05; done",
    );
    let started = Instant::now();
    let out = leaderrun()
        .args([
            "--dsn",
            &dsn,
            "--lock-id",
            &other,
            "--check-interval",
            INTERVAL,
        ])
        .args(["-n", "--timeout", "2s", "-s", "INT", "-k", "300ms", "--"])
        .arg(&traps)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    // The trap was in place (2 s before the timeout) when INT came, and it did not end the
    // script: only SIGKILL after -k did.
    let events = scratch.events();
    let trapped = events.iter().position(|l| l == "trapped");
    let got = events.iter().position(|l| l == "got INT");
    assert!(trapped.is_some() && got > trapped, "{events:?}");
    assert!(
        started.elapsed() >= secs(2.3),
        "SIGKILL came before -k 300ms"
    );

    // The short forms check their values like the long ones: usage errors, exit 125.
    for bad in [
        &["-n", "-w", "5s", "-c", "true"][..],
        &["-w", "30", "-c", "true"],
        &["-k", "0", "-c", "true"],
        &["-w", "0", "-c", "true"],
        &["-E", "256", "-c", "true"],
        &["-s", "STOP", "-c", "true"],
        &["-c", "true", "--", "false"],
        &["--takeover-delay", "5", "-c", "true"],
    ] {
        let out = leaderrun().args(base).args(bad).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {stderr}");
    }
}

#[test]
fn a_cron_herd_against_a_small_server_runs_the_job_once_without_errors() {
    // 150 `--once` at the same moment against max_connections = 40: the server refuses most
    // connects with "too many clients" (53300); those are retried for up to one interval,
    // so exactly one copy runs the job and every other exits with the conflict code, none 125.
    let cluster = Cluster::start_private_with(40);
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap();
    let mut herd: Vec<Replica> = (0..150)
        .map(|_| {
            Replica::start(
                &cluster,
                id,
                "3s",
                &["--once", "-E", "3", "--min-hold", "1m", "--", job],
            )
        })
        .collect();
    let ran = scratch.wait_starts(1, secs(30.0))[0].clone();
    let mut codes = std::collections::BTreeMap::new();
    for replica in herd.iter_mut().filter(|r| r.pid() != ran.ppid) {
        let code = replica.wait_exit(secs(30.0)).code();
        *codes.entry(code).or_insert(0) += 1;
        assert_ne!(code, Some(125), "a herd member failed:\n{}", replica.log());
    }
    assert_eq!(codes.get(&Some(3)), Some(&149), "{codes:?}");
    assert_eq!(scratch.starts().len(), 1, "the job ran more than once");
}

#[test]
fn a_role_with_connection_limit_1_leads_on_its_one_session() {
    // Leading needs one session (docs/guarantees.md#safety-guarantees): a direct TCP connection
    // cannot be a pooler's, so no second session is opened to probe for one.
    let cluster = Cluster::start_private();
    cluster.sql("CREATE ROLE lim LOGIN CONNECTION LIMIT 1");
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    let dsn = cluster.dsn().replace("user=postgres", "user=lim");
    let mut once = leaderrun();
    once.args([
        "--dsn",
        &dsn,
        "--lock-id",
        &id.to_string(),
        "--once",
        "--",
        job.to_str().unwrap(),
    ]);
    let mut once = Replica::spawn(once);
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0), "{}", once.log());
    assert_eq!(scratch.starts().len(), 1);
    let mut lead = leaderrun();
    lead.args([
        "--dsn",
        &dsn,
        "--lock-id",
        &id.to_string(),
        "--check-interval",
        "200ms",
        "--",
    ])
    .arg(job.to_str().unwrap());
    let mut lead = Replica::spawn(lead);
    assert_eq!(lead.wait_exit(secs(10.0)).code(), Some(0), "{}", lead.log());
    assert_eq!(scratch.starts().len(), 2);
    assert!(!lead.log().contains("pooler"), "{}", lead.log());
}

#[test]
fn tick_at_grant_runs_at_the_grant_then_on_the_cadence() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    // A period of an hour: without --tick-at-grant nothing would run for an hour.
    let _every = Replica::start(
        cluster,
        unique_lock_id(),
        INTERVAL,
        &[
            "--every",
            "1h",
            "--tick-at-grant",
            "--",
            job.to_str().unwrap(),
        ],
    );
    scratch.wait_starts(1, secs(10.0));
    // With a takeover delay, the first run follows the delay; the environment form too.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    let mut cmd = leaderrun();
    cmd.env("LEADERRUN_TICK_AT_GRANT", "1")
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args([
            "--check-interval",
            INTERVAL,
            "--every",
            "1h",
            "--takeover-delay",
            "300ms",
        ])
        .args(["--", job.to_str().unwrap()]);
    let delayed = Replica::spawn(cmd);
    scratch.wait_starts(1, secs(10.0));
    delayed.wait_log("takeover delay", 1, secs(1.0));
    // The ticker keeps its cadence after the run at the grant.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    let _fast = Replica::start(
        cluster,
        unique_lock_id(),
        INTERVAL,
        &[
            "--every",
            "500ms",
            "--tick-at-grant",
            "--",
            job.to_str().unwrap(),
        ],
    );
    scratch.wait_starts(3, secs(10.0));
    // And it needs --every.
    let out = leaderrun()
        .args(["--once", "--tick-at-grant", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
}

/// A psql session as `role` through `dsn`, returned once the server counts it (a role with
/// `CONNECTION LIMIT 1` is full then), with its stdin: dropping that ends the session.
fn hold_the_roles_session(
    cluster: &Cluster,
    dsn: &str,
    role: &str,
) -> (std::process::Child, Option<std::process::ChildStdin>) {
    let mut psql = Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", dsn])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let sessions = format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'");
    wait_for("the role's one session", secs(10.0), || {
        (cluster.sql(&sessions) == ["1"]).then_some(())
    });
    let stdin = psql.stdin.take();
    (psql, stdin)
}

/// `--wait` against a server that is momentarily full (53300, the role's connection limit
/// taken by another session): the retries print nothing at the default level, the job runs
/// once the session is free; a server full for the whole wait is one ERROR with the cause
/// (docs/guarantees.md#modes).
#[test]
fn wait_retries_a_momentarily_full_server_without_warnings() {
    use crate::support::metrics;
    let cluster = Cluster::start_private();
    cluster.sql("CREATE ROLE full1 LOGIN CONNECTION LIMIT 1");
    let dsn = cluster.dsn().replace("user=postgres", "user=full1");
    let hold = || hold_the_roles_session(&cluster, &dsn, "full1");
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    // Full for the whole wait: 125, one ERROR that names the cause, no WARN.
    let (mut psql, stdin) = hold();
    let out = leaderrun()
        .args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "300ms", "--wait", "1s", "--"])
        .arg(&job)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    assert_eq!(stderr.matches("ERROR").count(), 1, "{stderr}");
    assert!(stderr.contains("too many connections"), "{stderr}");
    assert!(scratch.starts().is_empty());
    // Full for a moment: the job runs once the session is free, and nothing is printed.
    // The port is free now; the probe line is INFO, which a one-shot does not print.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "300ms", "--wait", "30s"])
        .args(["--http-addr", &addr.to_string(), "--"])
        .arg(&job);
    let mut waiting = Replica::spawn(cmd);
    wait_for("a failed try", secs(10.0), || {
        // Not serving yet: try again.
        std::net::TcpStream::connect(addr).ok()?;
        let failed = metrics(addr)
            .lines()
            .find(|l| l.starts_with("leaderrun_checks_total{outcome=\"failed\"}"))?
            .split_whitespace()
            .nth(1)?
            .parse::<f64>()
            .ok()?;
        (failed >= 1.0).then_some(())
    });
    drop(stdin);
    psql.wait().unwrap();
    assert_eq!(
        waiting.wait_exit(secs(20.0)).code(),
        Some(0),
        "{}",
        waiting.log()
    );
    assert_eq!(scratch.starts().len(), 1);
    assert!(!waiting.log().contains("WARN"), "{}", waiting.log());
}

/// A long-running standby tries a full server (53300: its role's `CONNECTION LIMIT 1` taken by
/// another session) once per check interval, as after any failure: only the one-shots retry it
/// sooner (docs/field-notes.md#full-and-starting-servers-are-transient). Before, each standby
/// tried every few tens of milliseconds for a whole interval.
#[test]
fn a_standby_tries_a_full_server_once_per_interval() {
    let cluster = Cluster::shared();
    let role = format!("full_{}_{}", std::process::id(), unique_lock_id());
    cluster.sql(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 1"));
    let dsn = cluster
        .dsn()
        .replace("user=postgres", &format!("user={role}"));
    let (mut psql, stdin) = hold_the_roles_session(cluster, &dsn, &role);
    // The default mode and a ticker, both standing by against the full server.
    let mut standbys: Vec<Replica> = [&[][..], &["--every", "1h"]]
        .iter()
        .map(|mode| {
            let mut cmd = leaderrun();
            cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
                .args(["--check-interval", "1s"])
                .args(*mode)
                .args(["--", "sleep", "600"]);
            Replica::spawn(cmd)
        })
        .collect();
    // The times of its refused tries, from their log lines.
    let tries = |replica: &Replica| -> Vec<std::time::SystemTime> {
        replica
            .log()
            .lines()
            .filter(|l| l.contains("WARN leader: acquire lock connection: "))
            .inspect(|l| assert!(l.contains("too many connections"), "{l}"))
            .map(|l| humantime::parse_rfc3339(l.split(' ').next().unwrap()).unwrap())
            .collect()
    };
    // A window of 3 intervals from the first refused try, read off the lines' own times (so
    // the test's own delays do not count): that try and at most one per interval. Once a try
    // comes after the window, every try in it has been logged.
    let window = secs(3.0);
    for standby in &standbys {
        let (first, in_window) = wait_for("a try after the window", secs(15.0), || {
            let tries = tries(standby);
            let first = *tries.first()?;
            tries.iter().any(|t| *t > first + window).then(|| {
                (
                    first,
                    tries.iter().filter(|t| **t <= first + window).count(),
                )
            })
        });
        assert!(
            in_window <= 4,
            "{in_window} tries in the {window:?} from {first:?}:\n{}",
            standby.log()
        );
    }
    for standby in &mut standbys {
        standby.signal(Signal::SIGTERM);
        assert_eq!(
            standby.wait_exit(secs(10.0)).code(),
            Some(0),
            "{}",
            standby.log()
        );
    }
    drop(stdin);
    psql.wait().unwrap();
    let sessions = format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'");
    wait_for("the role's session gone", secs(10.0), || {
        (cluster.sql(&sessions) == ["0"]).then_some(())
    });
    cluster.sql(&format!("DROP ROLE {role}"));
}

/// SIGTERM while the leftovers of a run are being stopped, under `--restart always`: nothing
/// restarts, and no line says it will.
#[test]
fn a_shutdown_while_leftovers_stop_restarts_nothing_and_says_so() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    // The main child exits once its leftover is up (it says so): a leftover is there to stop.
    let job = scratch.child_script(
        "job.sh",
        "(trap '' TERM; echo up >> \"$EVENTS\"; exec sleep 997) &\n\
         while ! grep -q '^up$' \"$EVENTS\"; do sleep 0.01; done\nexit 0",
    );
    let mut replica = Replica::start(
        cluster,
        unique_lock_id(),
        INTERVAL,
        &[
            "-k",
            "2s",
            "--restart",
            "always",
            "--",
            job.to_str().unwrap(),
        ],
    );
    scratch.wait_starts(1, secs(10.0));
    // The main child is gone; its leftover ignores TERM and is stopped for up to the grace.
    replica.wait_log("child exited", 1, secs(10.0));
    replica.signal(Signal::SIGTERM);
    assert_eq!(
        replica.wait_exit(secs(10.0)).code(),
        Some(0),
        "{}",
        replica.log()
    );
    assert_eq!(scratch.starts().len(), 1, "{}", replica.log());
    assert!(!replica.log().contains("restarting"), "{}", replica.log());
}
