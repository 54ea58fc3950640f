//! `--schedule`, `--catch-up` and `--history` with a real PostgreSQL and real processes: due
//! times run once across replicas through failovers, a missed due time is caught up once,
//! the history and `status` agree with what ran, and failing history writes leave the job
//! alone.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;

use crate::support::{
    alive, leaderrun, status_with, step_down, unique_lock_id, wait_for, Cluster, Replica, Scratch,
    Setup,
};

const INTERVAL: &str = "200ms";

/// How long the three replicas of the failover test run their two-second schedule: a minute,
/// thirty due times across a `kill -9` and a SIGTERM of the leader. It runs beside the rest of
/// the suite, which takes longer than that on two cores.
const FAILOVER_RUN: Duration = Duration::from_secs(60);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A job that stamps its start and its end (`began PID NS`, `ended PID NS`) around `sleep`.
fn stamping_job(scratch: &Scratch, sleep: &str) -> String {
    scratch
        .child_script(
            "job.sh",
            &format!(
                "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\nsleep {sleep}\n\
                 echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\""
            ),
        )
        .to_str()
        .unwrap()
        .to_owned()
}

/// `(pid, began, ended)` of every run the job stamped, in the order they began (seconds).
fn runs(scratch: &Scratch) -> Vec<(i32, f64, Option<f64>)> {
    let mut out: Vec<(i32, f64, Option<f64>)> = scratch
        .events()
        .iter()
        .filter_map(|l| l.strip_prefix("began "))
        .map(|l| {
            let (pid, ns) = l.split_once(' ').unwrap();
            let pid: i32 = pid.parse().unwrap();
            (
                pid,
                ns.parse::<f64>().unwrap() / 1e9,
                scratch.stamp("ended", pid),
            )
        })
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

/// `status --json` of the key, parsed.
fn status_json(cluster: &Cluster, id: i32, extra: &[&str]) -> serde_json::Value {
    let out = status_with(cluster, id, true, extra);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits for a replica told to stop (SIGTERM): 0 between runs, else the run's own status
/// (143 when the forwarded TERM ended it, or what it exited with meanwhile).
fn stopped_by_term(replica: &mut Replica) {
    let code = replica.wait_exit(secs(5.0)).code();
    assert!(
        matches!(code, Some(0 | 3 | 143)),
        "exit {code:?}: {}",
        replica.log()
    );
}

/// The replica whose child started last.
fn leader_of<'a>(replicas: &'a [Replica], scratch: &Scratch) -> &'a Replica {
    let last = scratch.starts().last().cloned().expect("a start");
    replicas
        .iter()
        .find(|r| r.pid() == last.ppid)
        .expect("the leader is one of the replicas")
}

#[test]
fn three_replicas_run_each_due_time_once_through_kill_and_term() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = format!("runs_failover_{id}");
    let job = stamping_job(&scratch, "0.5");
    let args = [
        "--schedule",
        "*/2 * * * * *",
        "--tz",
        "UTC",
        "--grace",
        "500ms",
        "--history",
        "--history-table",
        &table,
        "--",
        &job,
    ];
    let began = now();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(cluster, id, INTERVAL, &args))
        .collect();
    // A few due times, then the leader dies hard: its watchdog kills the run, the lock moves.
    let third = scratch.wait_starts(3, secs(10.0))[2].pid;
    wait_for("the run to stamp its start", secs(5.0), || {
        scratch.stamp("began", third)
    });
    // And its row to be written: a leader killed between a start and the history's write of
    // it leaves no row (README, Schedules), which is not what this test is about.
    wait_for("the third run's row", secs(5.0), || {
        let rows: i64 = cluster.sql(&format!(
            "SELECT count(*) FROM {table} WHERE lock_id = {id}"
        ))[0]
            .parse()
            .unwrap();
        (rows >= 3).then_some(())
    });
    let killed = leader_of(&replicas, &scratch).pid();
    replicas
        .iter()
        .find(|r| r.pid() == killed)
        .unwrap()
        .signal(Signal::SIGKILL);
    let after_kill = scratch.starts().len();
    // The next leader runs the next due times.
    wait_for(
        "a start by another leader after the kill -9",
        secs(10.0),
        || {
            let starts = scratch.starts();
            (starts.len() > after_kill && starts.last().unwrap().ppid != killed).then_some(())
        },
    );
    let next = scratch.wait_starts(after_kill + 2, secs(10.0))[after_kill + 1].pid;
    wait_for("the run to stamp its start", secs(5.0), || {
        scratch.stamp("began", next)
    });
    // Then it is told to stop (SIGTERM): its run is stopped, the lock passes again.
    let termed = leader_of(&replicas, &scratch).pid();
    replicas
        .iter()
        .find(|r| r.pid() == termed)
        .unwrap()
        .signal(Signal::SIGTERM);
    let after_term = scratch.starts().len();
    wait_for("a start by the third replica", secs(10.0), || {
        let starts = scratch.starts();
        (starts.len() > after_term && starts.last().unwrap().ppid != termed).then_some(())
    });
    wait_for("the end of the run", FAILOVER_RUN * 2, || {
        (now() - began >= FAILOVER_RUN.as_secs_f64()).then_some(())
    });
    // Stopped between two runs, so every run that started also stamped its start.
    let last = scratch.starts().last().unwrap().pid;
    wait_for("the last run to end", secs(5.0), || {
        scratch.stamp("ended", last)
    });
    for r in &replicas {
        if r.pid() != killed {
            r.signal(Signal::SIGTERM);
        }
    }
    for r in &mut replicas {
        r.wait_exit(secs(10.0));
    }
    for r in &replicas {
        assert!(!r.log().contains("history: cannot"), "{}", r.log());
    }

    // Every run began right after its due time (an even second): no due time ran twice,
    // and no run began while the one before it still went on.
    let runs = runs(&scratch);
    let mut by_due: BTreeMap<i64, Vec<i32>> = BTreeMap::new();
    for (pid, start, _) in &runs {
        let due = (start.floor() as i64) / 2 * 2;
        assert!(
            start - (due as f64) < 1.5,
            "run {pid} began {start}, long after {due}"
        );
        by_due.entry(due).or_default().push(*pid);
    }
    for (due, pids) in &by_due {
        assert_eq!(
            pids.len(),
            1,
            "due time {due} ran {} times: {runs:?}",
            pids.len()
        );
    }
    for pair in runs.windows(2) {
        if let (_, _, Some(ended)) = pair[0] {
            assert!(pair[1].1 >= ended, "runs overlapped: {pair:?}");
        }
    }
    let due_times = (FAILOVER_RUN.as_secs() / 2) as usize;
    assert!(
        runs.len() + 3 >= due_times,
        "{} runs for about {due_times} due times: {runs:?}\n{}",
        runs.len(),
        replicas
            .iter()
            .map(|r| format!("--- replica {}\n{}", r.pid(), r.log()))
            .collect::<String>()
    );
    let leaders: std::collections::HashSet<i32> = scratch.starts().iter().map(|s| s.ppid).collect();
    assert_eq!(leaders.len(), 3, "each replica led in turn");

    // The history: one row per run; the killed leader's run was marked lost by the next
    // leader; status --json lists them newest first.
    let status = status_json(cluster, id, &["--history-table", &table]);
    let rows = status["runs"].as_array().expect("runs");
    let expected = runs.len().min(leaderrun::history::STATUS_RUNS as usize);
    assert_eq!(rows.len(), expected, "{status:#}");
    let counted: i64 = cluster.sql(&format!(
        "SELECT count(*) FROM {table} WHERE lock_id = {id}"
    ))[0]
        .parse()
        .unwrap();
    assert_eq!(counted as usize, runs.len(), "one row per run");
    // Each run is its row: the leaderrun that started it, and its start within a moment of the
    // one the job stamped.
    let rows_at: Vec<(i32, f64)> = cluster
        .sql(&format!(
            "SELECT pid || ' ' || extract(epoch FROM started_at) FROM {table} WHERE lock_id = {id}"
        ))
        .iter()
        .map(|l| {
            let (pid, at) = l.split_once(' ').unwrap();
            (pid.parse().unwrap(), at.parse().unwrap())
        })
        .collect();
    for start in scratch.starts() {
        let began = scratch.stamp("began", start.pid).expect("stamped");
        assert!(
            rows_at
                .iter()
                .any(|&(pid, at)| pid == start.ppid && (began - at).abs() < 0.5),
            "no row for the run {start:?} that began at {began}: {rows_at:?}"
        );
    }
    let starts: Vec<&str> = rows
        .iter()
        .map(|r| r["started_at"].as_str().unwrap())
        .collect();
    let mut sorted = starts.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(starts, sorted, "newest first");
    let outcome_of = |pid: i32| -> Vec<String> {
        cluster.sql(&format!(
            "SELECT outcome || ' ' || lost FROM {table} WHERE lock_id = {id} AND pid = {pid}"
        ))
    };
    assert!(
        outcome_of(killed).contains(&"lost true".to_owned()),
        "the killed leader's run: {:?}",
        outcome_of(killed)
    );
    let running: i64 = cluster.sql(&format!(
        "SELECT count(*) FROM {table} WHERE lock_id = {id} AND outcome = 'running'"
    ))[0]
        .parse()
        .unwrap();
    assert_eq!(running, 0, "every run has ended or was marked lost");
    let ok: i64 = cluster.sql(&format!(
        "SELECT count(*) FROM {table} WHERE lock_id = {id} AND outcome = 'ok' \
           AND exit_code = 0 AND ended_at IS NOT NULL"
    ))[0]
        .parse()
        .unwrap();
    let finished = runs.iter().filter(|r| r.2.is_some()).count();
    assert_eq!(ok as usize, finished, "each run that ended by itself is ok");
    for row in rows {
        for field in [
            "host",
            "pid",
            "term",
            "fencing_token",
            "started_at",
            "ended_at",
            "exit_code",
            "signal",
            "outcome",
        ] {
            assert!(row.get(field).is_some(), "{field} missing: {row}");
        }
        let pid = row["pid"].as_i64().unwrap() as i32;
        assert!(leaders.contains(&pid), "{row}");
    }
    assert!(status["next_due_at"].is_string(), "{status:#}");
    assert!(!alive(killed));
}

/// `S M H * * *` for the UTC second `at` (seconds since the epoch).
fn daily_at(at: i64) -> String {
    let day = at.rem_euclid(86400);
    format!("{} {} {} * * *", day % 60, day / 60 % 60, day / 3600)
}

#[test]
fn catch_up_runs_a_missed_due_time_once_after_a_failover() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = format!("runs_catch_up_{id}");
    let job = stamping_job(&scratch, "0.3");
    // One due time a day, a few seconds from now.
    let due = now().ceil() as i64 + 5;
    let schedule = daily_at(due);
    let args = |catch_up: bool| {
        let mut args: Vec<String> = ["--schedule", &schedule, "--tz", "UTC", "--history"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--history-table".to_owned(), table.clone()]);
        if catch_up {
            args.extend(["--catch-up".to_owned(), "1m".to_owned()]);
        }
        args.extend(["--".to_owned(), job.clone()]);
        args
    };
    let start = |catch_up: bool| {
        let args = args(catch_up);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Replica::start(cluster, id, INTERVAL, &args)
    };
    // The first leader dies before the due time, and nobody leads when it passes.
    let first = start(true);
    wait_for("the first replica to lead", secs(10.0), || {
        status_json(cluster, id, &[])["leader"]
            .is_object()
            .then_some(())
    });
    first.signal(Signal::SIGKILL);
    wait_for("the due time to pass", secs(10.0), || {
        (now() >= due as f64 + 0.5).then_some(())
    });
    assert!(scratch.starts().is_empty(), "nobody ran the due time");
    // A replica without --catch-up that leads now leaves it alone.
    let mut plain = start(false);
    wait_for("the plain replica to lead", secs(10.0), || {
        status_json(cluster, id, &[])["leader"]
            .is_object()
            .then_some(())
    });
    plain.signal(Signal::SIGTERM);
    plain.wait_exit(secs(5.0));
    assert!(
        scratch.starts().is_empty(),
        "no catch-up without --catch-up"
    );
    // The next leader's term begins within a minute of it: it runs it once, at once.
    let second = start(true);
    let ran = scratch.wait_starts(1, secs(10.0));
    let mut third = start(true);
    assert_eq!(
        ran[0].ppid,
        second.pid(),
        "the replica that led first ran it"
    );
    let pid = ran[0].pid;
    wait_for("the caught-up run to end", secs(5.0), || {
        scratch.stamp("ended", pid)
    });
    let due_rows = wait_for("the caught-up run's row", secs(5.0), || {
        let rows = cluster.sql(&format!(
            "SELECT extract(epoch FROM due_at)::bigint || ' ' || outcome FROM {table} \
             WHERE lock_id = {id}"
        ));
        (rows.iter().any(|r| r.ends_with(" ok"))).then_some(rows)
    });
    assert_eq!(due_rows, [format!("{due} ok")]);
    // A failover to a third replica, still within the minute: the row says it ran.
    second.signal(Signal::SIGTERM);
    wait_for("the third replica to lead", secs(10.0), || {
        (status_json(cluster, id, &[])["leader"]["leaderrun_pid"] == third.pid()).then_some(())
    });
    third.wait_log("catch-up", 1, secs(5.0));
    assert_eq!(scratch.starts().len(), 1, "the due time ran once");
    third.signal(Signal::SIGTERM);
    assert_eq!(third.wait_exit(secs(5.0)).code(), Some(0));
}

/// A psql session whose open transaction holds `table` in ACCESS EXCLUSIVE mode, once the
/// server shows the lock granted: every other statement on the table waits. Killing the session
/// frees it.
fn lock_table(cluster: &Cluster, table: &str) -> std::process::Child {
    lock_table_in(cluster, table, "ACCESS EXCLUSIVE", "AccessExclusiveLock")
}

/// [`lock_table`] in `mode` (`pg_locks` calls it `shown`).
fn lock_table_in(cluster: &Cluster, table: &str, mode: &str, shown: &str) -> std::process::Child {
    let mut locker = cluster.psql_session();
    {
        use std::io::Write;
        let stdin = locker.stdin.as_mut().unwrap();
        writeln!(stdin, "BEGIN; LOCK TABLE {table} IN {mode} MODE;").unwrap();
        stdin.flush().unwrap();
    }
    wait_for("the table lock", secs(5.0), || {
        let rows = cluster.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE relation = '{table}'::regclass \
               AND mode = '{shown}' AND granted"
        ));
        (rows == ["1"]).then_some(())
    });
    locker
}

#[test]
fn catch_up_reads_the_history_while_its_writes_wait() {
    // A transaction holds the table in SHARE mode (as a `CREATE INDEX` does): reads go on,
    // writes wait. The new term's own writes (marking vanished runs, pruning) wait for their
    // lock_timeout; the catch-up's question is asked before them and answered at once.
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = history_table(cluster, "runs_share", id);
    let mut locker = lock_table_in(cluster, &table, "SHARE", "ShareLock");
    let job = scratch
        .child_script("job.sh", "true")
        .to_str()
        .unwrap()
        .to_owned();
    // A due time a day, a second ago: nobody started it.
    let schedule = daily_at(now().floor() as i64 - 1);
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--schedule",
            &schedule,
            "--tz",
            "UTC",
            "--catch-up",
            "1m",
            "--history",
            "--history-table",
            &table,
            "--",
            &job,
        ],
    );
    replica.wait_log("catch-up:", 1, secs(10.0));
    assert!(
        replica
            .log()
            .contains("catch-up: no replica started the due time; running it now"),
        "{}",
        replica.log()
    );
    scratch.wait_starts(1, secs(5.0));
    let _ = locker.kill();
    let _ = locker.wait();
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

#[test]
fn a_locked_history_table_leaves_the_job_alone() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = format!("runs_locked_{id}");
    let job = scratch
        .child_script("job.sh", "true")
        .to_str()
        .unwrap()
        .to_owned();
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--schedule",
            "* * * * * *",
            "--history",
            "--history-table",
            &table,
            "--http-addr",
            "127.0.0.1:0",
            "-v",
            "--",
            &job,
        ],
    );
    replica.wait_log("history: created the table", 1, secs(10.0));
    scratch.wait_starts(2, secs(10.0));
    // The leader's /metrics: when its last run started, and when its last success ended.
    let addr = crate::support::probe_addr(&replica);
    let metric = |name: &str| {
        crate::support::sample(&crate::support::http(addr, "GET", "/metrics").1, name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let success = wait_for("a success on /metrics", secs(5.0), || {
        let at = metric("leaderrun_last_success_timestamp_seconds");
        (at > 0.0).then_some(at)
    });
    assert!((now() - success).abs() < 5.0, "{success}");
    assert!(metric("leaderrun_last_run_start_timestamp_seconds") > success - 2.0);
    // A transaction holds the table in ACCESS EXCLUSIVE mode: every history write waits.
    let mut locker = lock_table(cluster, &table);
    let before = scratch.starts().len();
    // The due times keep running, every second, while the writes fail.
    let t0 = now();
    scratch.wait_starts(before + 5, secs(8.0));
    assert!(now() - t0 < 6.5, "the runs kept their pace");
    replica.wait_log("history: cannot write the run history", 1, secs(10.0));
    assert_eq!(
        replica
            .log()
            .matches("history: cannot write the run history")
            .count(),
        1,
        "one WARN per streak of failures"
    );
    // The table is free again: writes go on.
    let _ = locker.kill();
    let _ = locker.wait();
    replica.wait_log("history: writes succeed again", 1, secs(15.0));
    let n = scratch.starts().len();
    scratch.wait_starts(n + 2, secs(5.0));
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
    assert!(!replica.log().contains("ERROR"), "{}", replica.log());
}

/// A role that may not create the history table (as on PostgreSQL 15 and later, where no
/// role but the owner may create in schema `public`) gets one WARN that names the README's
/// SQL, and none for the writes that then fail for the same reason (there was a second WARN,
/// 42P01, right after the first); once a DBA made the table, the runs are recorded and the log
/// says so.
#[test]
fn a_table_that_cannot_be_created_is_one_warn_until_a_dba_makes_it() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    // A schema of its own, which the role may use but not create in (as `public` on
    // PostgreSQL 15 and later, without changing `public` for the other tests).
    let schema = format!("history_nocreate_{id}");
    let table = format!("{schema}.runs");
    let role = format!("history_nocreate_{id}");
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO {role}"
    ));
    let job = scratch
        .child_script("job.sh", "true")
        .to_str()
        .unwrap()
        .to_owned();
    let dsn = format!("{} user={role}", cluster.dsn());
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", INTERVAL])
        .args(["--schedule", "* * * * * *", "--history"])
        .args(["--history-table", &table, "--", &job]);
    let mut replica = Replica::spawn(cmd);
    replica.wait_log("history: cannot create the table", 1, secs(10.0));
    scratch.wait_starts(3, secs(10.0));
    let log = replica.log();
    assert!(
        log.contains("a DBA creates it with the SQL in the README"),
        "{log}"
    );
    assert!(!log.contains("cannot write the run history"), "{log}");
    let sql = table
        .parse::<leaderrun::history::TableName>()
        .unwrap()
        .create_sql();
    cluster.sql(&sql);
    cluster.sql(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
    ));
    replica.wait_log("history: writes succeed again", 1, secs(10.0));
    wait_for("a recorded run", secs(5.0), || {
        (cluster.sql(&format!(
            "SELECT count(*) FROM {table} WHERE outcome = 'ok'"
        )) != ["0"])
        .then_some(())
    });
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
    let log = replica.log();
    assert_eq!(log.matches("cannot create the table").count(), 1, "{log}");
    assert!(!log.contains("cannot write the run history"), "{log}");
}

#[test]
fn history_without_insert_rights_leaves_the_job_alone() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = format!("runs_readonly_{id}");
    let role = format!("history_ro_{id}");
    cluster.sql(&format!("CREATE ROLE {role} LOGIN"));
    // The DBA made the table (the README's SQL), and the role may only read it.
    let sql = table
        .parse::<leaderrun::history::TableName>()
        .unwrap()
        .create_sql();
    cluster.sql(&sql);
    cluster.sql(&format!("GRANT SELECT ON {table} TO {role}"));
    let job = scratch
        .child_script("job.sh", "exit 3")
        .to_str()
        .unwrap()
        .to_owned();
    let dsn = format!("{} user={role}", cluster.dsn());
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--check-interval", INTERVAL])
        .args([
            "--schedule",
            "* * * * * *",
            "--history",
            "--history-table",
            &table,
        ])
        .args(["--", &job]);
    let mut replica = Replica::spawn(cmd);
    scratch.wait_starts(3, secs(10.0));
    replica.wait_log("history: cannot write the run history", 1, secs(5.0));
    assert_eq!(
        replica.log().matches("history: cannot write").count(),
        1,
        "{}",
        replica.log()
    );
    // Failed runs are WARN lines of their own; the schedule goes on.
    replica.wait_log("exited with exit code 3", 2, secs(5.0));
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
    assert_eq!(cluster.sql(&format!("SELECT count(*) FROM {table}")), ["0"]);
}

#[test]
fn schedule_conflicts_and_bad_expressions_are_usage_errors() {
    for args in [
        &["--schedule", "* * * * *", "--every", "1m", "--", "true"][..],
        &["--schedule", "* * * * *", "--once", "--", "true"],
        &["--schedule", "* * * * *", "--wait", "5s", "--", "true"],
        &["--schedule", "* * * * *", "--catch-up", "1m", "--", "true"],
        &["--catch-up", "1m", "--history", "--", "true"],
        &["--schedule", "61 * * * *", "--", "true"],
        &["--schedule", "* * * *", "--", "true"],
        &["--schedule", "@often", "--", "true"],
        // A day name in the minute field: cron refuses it (croner read it as minute 1).
        &["--schedule", "MON * * * *", "--", "true"],
        &["--schedule", "@daily", "--tz", "Mars/Olympus", "--", "true"],
        &["--history-table", "a;b", "--history", "--", "true"],
    ] {
        let out = leaderrun()
            .args(["--dsn", "host=/nonexistent dbname=x"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?} says why");
    }
    let out = leaderrun()
        .args([
            "--dsn",
            "host=/nonexistent dbname=x",
            "--schedule",
            "61 * * * *",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("six with seconds first"), "{err}");

    // Names cron and other schedulers know, refused for what they are: never in words of
    // fields and years, which the one who typed a name did not give.
    for (expr, reason) in [
        ("@reboot", "@reboot has no due time"),
        ("@REBOOT", "@REBOOT has no due time"),
        ("@every 5m", "give --every DUR instead"),
        ("@often", "unknown name @often"),
        ("@daily 3", "@daily takes no fields after it"),
    ] {
        let out = leaderrun()
            .args(["--dsn", "host=/nonexistent dbname=x", "--schedule", expr])
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{expr}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(reason), "{expr}: {err}");
        assert!(!err.contains("years"), "{expr}: {err}");
    }
}

#[test]
fn a_run_still_going_skips_the_next_due_time_and_timeout_bounds_each_run() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    // Each run would take 1.5 s: the due time one second later is skipped.
    let job = stamping_job(&scratch, "1.5");
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--schedule", "* * * * * *", "--", &job],
    );
    replica.wait_log(
        "due time skipped: the previous run is still going",
        2,
        secs(10.0),
    );
    let runs = runs(&scratch);
    for pair in runs.windows(2) {
        let ended = scratch.stamp("ended", pair[0].0).expect("the run ended");
        assert!(pair[1].1 >= ended, "runs overlapped: {pair:?}");
    }
    replica.signal(Signal::SIGTERM);
    replica.wait_exit(secs(5.0));

    // --timeout stops each run; the schedule goes on.
    let scratch = Scratch::new();
    let job = stamping_job(&scratch, "5");
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--schedule",
            "* * * * * *",
            "--timeout",
            "300ms",
            "--grace",
            "200ms",
            "--",
            &job,
        ],
    );
    replica.wait_log(
        "tick failed: COMMAND ran longer than --timeout",
        2,
        secs(10.0),
    );
    assert!(scratch.starts().len() >= 2);
    assert!(
        !replica.log().contains("due time skipped"),
        "a run stopped after 300 ms never overlaps the next second: {}",
        replica.log()
    );
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

/// A run that outlasts several due times says the first skip at once and the rest in one line
/// at its end, as `--every` does: one WARN per skipped due time was 3,600 lines an hour for a
/// run that hung under a schedule of every second.
#[test]
fn a_run_that_outlasts_several_due_times_says_its_skips_once() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    // Each run takes 3.5 s: the three due times after its start are skipped.
    let job = stamping_job(&scratch, "3.5");
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &["--schedule", "* * * * * *", "--", &job],
    );
    let summary = "due times skipped while the run went on: ";
    replica.wait_log(summary, 1, secs(15.0));
    let log = replica.log();
    let (first_run, rest) = log.split_once(summary).unwrap();
    assert_eq!(
        first_run
            .matches("due time skipped: the previous run is still going")
            .count(),
        1,
        "one line for the first skip of the run:\n{log}"
    );
    assert!(
        first_run.lines().last().unwrap().contains(" WARN "),
        "a schedule's skips are WARN lines:\n{log}"
    );
    let skipped: u64 = rest
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count of skipped due times:\n{log}"));
    assert!(
        (2..=4).contains(&skipped),
        "a run of 3.5 s at a due time per second skips about 3 of them:\n{log}"
    );
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

/// An ex-leader keeps no history session: once its term is over and its run's end is written,
/// the session closes, so a standby holds its lock's session only (docs/election.md); the next
/// leader's history has a session of its own.
#[test]
fn an_ex_leaders_history_session_closes_once_it_is_a_standby() {
    let setup = Setup::new(Cluster::shared(), "while :; do sleep 0.02; done");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let table = history_table(cluster, "runs_ex", id);
    let args = ["--history", "--history-table", table.as_str()];
    let history_sessions = |pid: i32| {
        cluster.sql(&format!(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name LIKE 'leaderrun-history@%:{pid}'"
        ))
    };
    let run_of = |pid: i32| {
        cluster.sql(&format!(
            "SELECT ended_at IS NOT NULL FROM {table} WHERE lock_id = {id} AND pid = {pid}"
        ))
    };
    // A 1 s interval, as the step-down test: the queue head is granted the lock before the
    // old leader could take it back.
    let leader = setup.replica("1s", &args);
    scratch.wait_starts(1, secs(10.0));
    wait_for("the leader's run in the history", secs(10.0), || {
        (run_of(leader.pid()) == ["f"]).then_some(())
    });
    assert_eq!(history_sessions(leader.pid()), ["1"], "{}", leader.log());
    let standby = setup.replica("1s", &args);
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    assert_eq!(
        history_sessions(standby.pid()),
        ["0"],
        "a standby writes nothing"
    );
    let out = step_down(cluster, id);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    scratch.wait_starts(2, secs(10.0));
    wait_for(
        "the ex-leader's run ended in the history",
        secs(10.0),
        || (run_of(leader.pid()) == ["t"]).then_some(()),
    );
    wait_for("the ex-leader's history session closed", secs(5.0), || {
        (history_sessions(leader.pid()) == ["0"]).then_some(())
    });
    wait_for("the new leader's history session", secs(10.0), || {
        (history_sessions(standby.pid()) == ["1"]).then_some(())
    });
    // The ex-leader goes on as a standby, its lock session queued.
    wait_for("the ex-leader queued as a standby", secs(5.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    assert!(
        !leader.log().contains("history: cannot"),
        "{}",
        leader.log()
    );
}

/// `--history-keep` takes a year however it is spelt (humantime's `1y` is 365.25 days, its
/// month 30.44): a retention of `1y` is not refused as "more than a year".
#[test]
fn history_keep_takes_a_year_in_every_spelling() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = format!("runs_keep_{id}");
    for keep in ["365d", "1y", "1year", "12months"] {
        let mut once = Replica::start(
            cluster,
            id,
            INTERVAL,
            &[
                "--once",
                "--history",
                "--history-table",
                &table,
                "--history-keep",
                keep,
                "--",
                "true",
            ],
        );
        assert_eq!(
            once.wait_exit(secs(10.0)).code(),
            Some(0),
            "--history-keep {keep}: {}",
            once.log()
        );
    }
    assert_eq!(
        cluster.sql(&format!(
            "SELECT count(*) FROM {table} WHERE lock_id = {id} AND outcome = 'ok'"
        )),
        ["4"]
    );
    let out = leaderrun()
        .args(["--dsn", "host=/nonexistent dbname=x", "--history"])
        .args(["--history-keep", "2y", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be at most a year"));
}

#[test]
fn history_records_a_one_shot_and_status_shows_it() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = format!("runs_once_{id}");
    let mut once = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--once",
            "--history",
            "--history-table",
            &table,
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    );
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(3));
    assert_eq!(
        once.log(),
        "",
        "a one-shot that led prints only what COMMAND prints"
    );
    assert_eq!(
        cluster.sql(&format!(
            "SELECT outcome, exit_code, signal IS NULL, ended_at >= started_at, due_at IS NULL, \
                    pid = {} FROM {table} WHERE lock_id = {id}",
            once.pid()
        )),
        ["failed|3|t|t|t|t"]
    );
    // The table: the run, and with --schedule the next due time.
    let out = status_with(
        cluster,
        id,
        false,
        &[
            "--history-table",
            &table,
            "--schedule",
            "@daily",
            "--tz",
            "UTC",
        ],
    );
    let table_out = String::from_utf8_lossy(&out.stdout);
    assert!(
        table_out.contains("schedule       @daily (UTC)"),
        "{table_out}"
    );
    assert!(table_out.contains("next due       "), "{table_out}");
    assert!(table_out.contains("T00:00:00+00:00"), "{table_out}");
    let run_line = table_out
        .lines()
        .find(|l| l.starts_with("run            "))
        .unwrap_or_else(|| panic!("no run line: {table_out}"));
    assert!(run_line.contains(", exit 3, failed"), "{run_line}");
    assert!(
        run_line.contains(&format!("pid {}", once.pid())),
        "{run_line}"
    );
    let json = status_json(cluster, id, &["--history-table", &table]);
    assert_eq!(json["runs"][0]["exit_code"], 3);
    assert_eq!(json["runs"][0]["outcome"], "failed");
    assert!(json["runs"][0]["ended_at"].is_string());
    assert!(
        json["next_due_at"].is_null(),
        "no schedule, none stored: {json}"
    );
}

#[test]
fn status_tells_the_next_due_time_in_the_posix_tz_rule_the_runs_were_made_in() {
    let cluster = Cluster::shared();
    let status_in = |tz: &str, id: i32, table: &str, json: bool| {
        let mut cmd = leaderrun();
        cmd.env("TZ", tz)
            .args([
                "status",
                "--dsn",
                &cluster.dsn(),
                "--lock-id",
                &id.to_string(),
            ])
            .args(["--history-table", table]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "no leader: {out:?}");
        out
    };
    let json_of = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // `TZ` rules with no IANA name; `status` itself runs in yet another zone.
    for (rule, offsets) in [
        ("<+14>-14", &["+14:00"][..]),
        ("UTC0", &["+00:00"][..]),
        ("EST5EDT,M3.2.0,M11.1.0", &["-05:00", "-04:00"][..]),
    ] {
        let id = unique_lock_id();
        let table = format!("runs_tz_{id}");
        // Every two seconds, in this hour of the rule's wall clock and the next (any hour where
        // the offset changes with the season): read in another zone, those hours are far off.
        let schedule = match offsets {
            [fixed] => {
                let hours: i64 = fixed[..3].parse().unwrap();
                let hour = (now() as i64 / 3600 + hours).rem_euclid(24);
                format!("*/2 * {hour},{} * * *", (hour + 1) % 24)
            }
            _ => "*/2 * * * * *".to_owned(),
        };
        let mut cmd = leaderrun();
        cmd.env("TZ", rule)
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
            .args([
                "--check-interval",
                INTERVAL,
                "--history",
                "--history-table",
                &table,
            ])
            .args(["--schedule", &schedule, "--", "true"]);
        let mut replica = Replica::spawn(cmd);
        wait_for("a run in the history", secs(10.0), || {
            let rows = cluster.sql(&format!(
                "SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = '{table}'"
            ));
            (rows == ["1"]
                && cluster.sql(&format!(
                    "SELECT count(*) FROM {table} WHERE ended_at IS NOT NULL"
                )) != ["0"])
            .then_some(())
        });
        replica.signal(Signal::SIGTERM);
        stopped_by_term(&mut replica);
        assert_eq!(
            cluster.sql(&format!("SELECT DISTINCT tz FROM {table}")),
            [rule],
            "the history names the rule the schedule was read in"
        );
        let json = json_of(&status_in("<-03>3", id, &table, true));
        assert_eq!(json["schedule"], schedule.as_str(), "{json}");
        assert_eq!(json["tz"], rule, "{json}");
        let next = json["next_due_at"].as_str().unwrap_or_default();
        assert!(
            offsets.iter().any(|o| next.ends_with(o)),
            "{rule}: next due {next:?} is not in the rule's offset {offsets:?}: {json}"
        );
        let next: jiff::Timestamp = next.parse().unwrap();
        let ahead = next.as_second() as f64 - now();
        assert!(
            (-1.0..=3.0).contains(&ahead),
            "{rule}: next due {next} is {ahead} s away, not the next two-second mark: {json}"
        );
        let table_out = String::from_utf8(status_in("<-03>3", id, &table, false).stdout).unwrap();
        assert!(
            table_out.contains(&format!("schedule       {schedule} ({rule})")),
            "{table_out}"
        );
    }

    // A zone status cannot load by the stored name (an unnamed /etc/localtime is stored as
    // `local time`), or a stored schedule it cannot read: no next due time from another zone
    // or schedule, and a WARN and the table say why (before, an unreadable schedule was
    // blamed on its zone).
    let id = unique_lock_id();
    let table = format!("runs_tz_{id}");
    let mut once = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--once",
            "--history",
            "--history-table",
            &table,
            "--",
            "true",
        ],
    );
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0));
    for (schedule, tz, why) in [
        (
            "*/2 * * * * *",
            "local time",
            "the zone of the runs has no name",
        ),
        (
            "*/2 * * * * *",
            "Mars/Olympus",
            "the runs' zone cannot be loaded here",
        ),
        ("bogus sched", "UTC", "the runs' schedule cannot be read"),
    ] {
        cluster.sql(&format!(
            "UPDATE {table} SET schedule = '{schedule}', tz = '{tz}'"
        ));
        let out = status_in("UTC", id, &table, true);
        let json = json_of(&out);
        assert_eq!(json["tz"], tz, "{json}");
        assert!(json["next_due_at"].is_null(), "{json}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(" WARN ") && stderr.contains("cannot tell the next due time"),
            "{stderr}"
        );
        let table_out = String::from_utf8(status_in("UTC", id, &table, false).stdout).unwrap();
        assert!(
            table_out.contains(&format!("schedule       {schedule} ({tz})"))
                && table_out.contains(&format!("next due       unknown ({why}")),
            "{table_out}"
        );
    }
}

/// The README's SQL for a DBA is the SQL leaderrun runs itself.
#[test]
fn the_readme_gives_the_history_tables_sql() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let sql = leaderrun::history::TableName::default().create_sql();
    assert!(readme.contains(&sql), "README lacks:\n{sql}");
}

#[test]
fn status_reads_a_history_whose_times_rfc3339_cannot_spell() {
    // The table is anyone's: `infinity` and a year past 9999 are valid timestamps there, and
    // `status` shows them instead of panicking on them.
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = history_table(cluster, "runs_odd_times", id);
    cluster.sql(&format!(
        "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, due_at, \
           started_at, ended_at, outcome) \
         VALUES ({class}, {id}, 'far', 1, 1, 1, '-infinity', '200000-01-01', 'infinity', 'ok'), \
                ({class}, {id}, 'near', 1, 1, 1, NULL, now() - interval '1 minute', NULL, \
                 'running')",
        class = crate::support::CLASS
    ));
    let json = status_json(cluster, id, &["--history-table", &table]);
    assert_eq!(json["runs"][0]["host"], "far", "{json}");
    assert_eq!(json["runs"][0]["started_at"], "9999-12-31T23:59:59.000Z");
    assert_eq!(json["runs"][0]["ended_at"], "infinity");
    assert_eq!(json["runs"][0]["due_at"], "-infinity");
    assert_eq!(json["runs"][1]["host"], "near", "{json}");
    let out = status_with(cluster, id, false, &["--history-table", &table]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("run            9999-12-31T23:59:59.000Z far, pid 1"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Text `status`'s table shows from the history (a host, a signal, the schedule and its zone:
/// whoever may write the table writes them) is escaped as the log escapes it. Before, a host
/// with a newline forged a line of the table (`leader         FAKEHOST`, read by eye or by a
/// script that greps the table) and an escape sequence drove the terminal of whoever ran
/// `status`. `--json` was escaped by JSON already.
#[test]
fn status_escapes_the_text_of_the_history_it_shows() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = history_table(cluster, "runs_forged", id);
    cluster.sql(&format!(
        "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, started_at, \
           ended_at, signal, outcome, schedule, tz) \
         VALUES ({class}, {id}, E'evil\\nleader         FAKEHOST\\u001b[31m', 1, 1, 1, \
                 now() - interval '1 minute', now(), E'SIGTERM\\r\\u202e', 'failed', \
                 E'@daily\\nleader         FAKESCHEDULE', E'UTC\\u001b]0;title\\u0007')",
        class = crate::support::CLASS
    ));
    let out = status_with(cluster, id, false, &["--history-table", &table]);
    let text = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}{stderr}");
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && leaderrun::cli::logging::must_escape(c)),
        "a raw control character in {text:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("leader         FAKE")),
        "a forged line in:\n{text}"
    );
    for shown in [
        r"run            ",
        r" evil\nleader         FAKEHOST\u{1b}[31m, pid 1, term 1, ",
        r", SIGTERM\r\u{202e}, failed",
        r"schedule       @daily\nleader         FAKESCHEDULE (UTC\u{1b}]0;title\u{7})",
    ] {
        assert!(text.contains(shown), "{shown:?} not in:\n{text}");
    }
    // The JSON keeps the values as they are.
    let json = status_json(cluster, id, &["--history-table", &table]);
    assert_eq!(
        json["runs"][0]["host"],
        "evil\nleader         FAKEHOST\u{1b}[31m"
    );
}

#[test]
fn status_warns_of_a_history_table_with_nulls_the_readme_forbids() {
    // A DBA's table without the README's NOT NULL: `status` says it cannot read the history
    // (a WARN) and shows the rest, instead of panicking.
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = history_table(cluster, "runs_nulls", id);
    cluster.sql(&format!(
        "ALTER TABLE {table} ALTER COLUMN host DROP NOT NULL; \
         INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, started_at, \
           outcome) VALUES ({}, {id}, NULL, 1, 1, 1, now(), 'ok')",
        crate::support::CLASS
    ));
    let out = status_with(cluster, id, true, &["--history-table", &table]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("status: cannot read the history {table}")),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["lock_id"], id, "{json}");
}

#[test]
fn a_backlog_of_old_rows_is_deleted_a_batch_at_a_time() {
    // 6000 rows past --history-keep, each of whose deletions takes half a millisecond: one
    // DELETE of them all outlasts the writer's statement_timeout (2 s) every time, and the
    // table would never shrink.
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = history_table(cluster, "runs_backlog", id);
    cluster.sql(&format!(
        "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, started_at, \
           outcome) \
         SELECT {}, {id}, 'old', 1, 1, 1, now() - interval '2 hours', 'ok' \
         FROM generate_series(1, 6000)",
        crate::support::CLASS
    ));
    cluster.sql(&format!(
        "CREATE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM pg_sleep(0.0005); RETURN OLD; END $$; \
         CREATE TRIGGER slow BEFORE DELETE ON {table} FOR EACH ROW \
           EXECUTE FUNCTION {table}_slow()"
    ));
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--schedule",
            "* * * * * *",
            "--history",
            "--history-table",
            &table,
            "--history-keep",
            "1h",
            "--",
            "true",
        ],
    );
    wait_for("the old rows to be deleted", secs(20.0), || {
        let old = cluster.sql(&format!(
            "SELECT count(*) FROM {table} WHERE lock_id = {id} AND host = 'old'"
        ));
        (old == ["0"]).then_some(())
    });
    assert!(
        !replica.log().contains("cannot write the run history"),
        "{}",
        replica.log()
    );
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

#[test]
fn the_leader_deletes_rows_older_than_history_keep_and_marks_vanished_runs_lost() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = history_table(cluster, "runs_keep", id);
    // A run of two hours ago, and one of a leader that vanished a minute ago (token 1: lower
    // than any later term's).
    for (ago, outcome) in [("2 hours", "ok"), ("1 minute", "running")] {
        cluster.sql(&format!(
            "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, \
               started_at, outcome) \
             VALUES ({}, {id}, 'gone', 1, 1, 1, now() - interval '{ago}', '{outcome}')",
            crate::support::CLASS
        ));
    }
    let mut once = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--once",
            "--history",
            "--history-table",
            &table,
            "--history-keep",
            "1h",
            "--",
            "true",
        ],
    );
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0));
    assert_eq!(
        cluster.sql(&format!(
            "SELECT host || ' ' || outcome || ' ' || lost FROM {table} WHERE lock_id = {id} \
             ORDER BY started_at"
        )),
        [
            "gone lost true".to_owned(),
            format!(
                "{} ok false",
                nix::unistd::gethostname().unwrap().to_string_lossy()
            )
        ]
    );
}

#[test]
fn a_new_leader_whose_clock_is_behind_skips_a_due_time_an_earlier_leader_started() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = history_table(cluster, "runs_skew", id);
    let job = stamping_job(&scratch, "0.2");
    // An even second at least four seconds ahead: the replica leads well before it.
    let due = ((now() + 4.0) / 2.0).ceil() as i64 * 2;
    // What a leader whose clock is ahead of this host's leaves: it ran `due` by its clock,
    // then handed over before this host's clock reached it.
    cluster.sql(&format!(
        "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, due_at, \
           started_at, ended_at, exit_code, outcome) \
         VALUES ({}, {id}, 'ahead', 1, 1, 1, to_timestamp({due}), to_timestamp({due}), \
           to_timestamp({due}) + interval '200 ms', 0, 'ok')",
        crate::support::CLASS
    ));
    let mut replica = Replica::start(
        cluster,
        id,
        INTERVAL,
        &[
            "--schedule",
            "*/2 * * * * *",
            "--tz",
            "UTC",
            "--history",
            "--history-table",
            &table,
            "--",
            &job,
        ],
    );
    // The due time after it is not in the history: it runs.
    let next = due + 2;
    let started = wait_for("the run of the next due time", secs(15.0), || {
        let rows = cluster.sql(&format!(
            "SELECT pid FROM {table} WHERE lock_id = {id} \
               AND due_at = to_timestamp({next}) AND host <> 'ahead'"
        ));
        (!rows.is_empty()).then_some(rows)
    });
    assert_eq!(started, [replica.pid().to_string()]);
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
    let log = replica.log();
    let shown = jiff::Timestamp::from_second(due)
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%S+00:00")
        .to_string();
    let skipped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the due time was started already"))
        .collect();
    assert!(
        skipped.len() == 1 && skipped[0].contains(" INFO ") && skipped[0].contains(&shown),
        "one INFO line for {shown}: {log}"
    );
    // The earlier leader's row is the only start of that due time, and no run began between
    // it and the next one.
    assert_eq!(
        cluster.sql(&format!(
            "SELECT host FROM {table} WHERE lock_id = {id} AND due_at = to_timestamp({due})"
        )),
        ["ahead"]
    );
    for (pid, began, _) in runs(&scratch) {
        assert!(
            !(due as f64..next as f64).contains(&began),
            "run {pid} began at {began}, for the due time {due}: {log}"
        );
    }
    assert!(!log.contains("history: cannot"), "{log}");
}

/// A history slower than the schedule never holds a new leader's due times back, nor loses
/// one: each due time early in a term waits for the history's word at most until just before
/// the next one comes, then runs (a WARN), and the term's later ones run without asking.
/// Before, each lookup was replaced by the next due time's before it could time out, and
/// every due time of the term's first ten minutes was skipped; later, the first was still
/// skipped ("the previous due time is skipped"), though no replica had run it.
#[test]
fn a_history_slower_than_the_schedule_skips_no_due_time() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = history_table(cluster, "runs_slow", id);
    // Every history statement waits on this lock until its own timeout.
    let mut locker = lock_table(cluster, &table);
    let job = scratch.child_script("job.sh", "true");
    // A lookup may wait one check interval (5 s); the due times come every 2 s.
    let mut replica = Replica::start(
        cluster,
        id,
        "5s",
        &[
            "--schedule",
            "*/2 * * * * *",
            "--history",
            "--history-table",
            &table,
            "--",
            job.to_str().unwrap(),
        ],
    );
    replica.wait_log("background leader lock acquired", 1, secs(15.0));
    replica.wait_log(
        "the history cannot tell whether an earlier leader started the due time; running it",
        1,
        secs(6.0),
    );
    // The first due time's run and the next's (the next may be skipped only as the overlap
    // rule says, when the first's run still goes as it comes; then the one after it runs).
    scratch.wait_starts(2, secs(6.0));
    let log = replica.log();
    assert!(
        !log.contains("the previous due time is skipped") && !log.contains("still being looked up"),
        "a due time no replica ran was skipped: {log}"
    );
    let _ = locker.kill();
    let _ = locker.wait();
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

/// A due time that came during the takeover delay is looked up in the history too, when the
/// delay ends just before the next due time: an earlier leader whose clock is ahead may have
/// run it, and that is the case the lookup is for. Here every due time of the next 40 s was
/// started by such a leader: the new leader runs none of them. Before, a due time whose next
/// came within 270 ms was run without asking (and before that, one whose next came within a
/// check interval).
#[test]
fn a_due_time_of_the_takeover_delay_is_looked_up_too() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let table = history_table(cluster, "runs_delay", id);
    let job = stamping_job(&scratch, "0.2");
    cluster.sql(&format!(
        "INSERT INTO {table} (lock_class, lock_id, host, pid, term, fencing_token, due_at, \
           started_at, ended_at, exit_code, outcome) \
         SELECT {}, {id}, 'ahead', 1, 1, 1, to_timestamp(s), to_timestamp(s), \
           to_timestamp(s) + interval '200 ms', 0, 'ok' \
         FROM generate_series(pg_catalog.floor(extract(epoch FROM now()))::bigint, \
           pg_catalog.floor(extract(epoch FROM now()))::bigint + 40) AS s",
        crate::support::CLASS
    ));
    // A holder that is not leaderrun, so that the replica's term begins when this test says.
    let mut holder = cluster.psql_session();
    {
        use std::io::Write;
        let stdin = holder.stdin.as_mut().unwrap();
        writeln!(
            stdin,
            "SELECT pg_advisory_lock({}, {id});",
            crate::support::CLASS
        )
        .unwrap();
        stdin.flush().unwrap();
    }
    wait_for("the holder's lock", secs(5.0), || {
        (!cluster.lock_holders(crate::support::CLASS, id).is_empty()).then_some(())
    });
    let mut replica = Replica::start(
        cluster,
        id,
        "300ms",
        &[
            "--schedule",
            "* * * * * *",
            "--tz",
            "UTC",
            "--history",
            "--history-table",
            &table,
            "--takeover-delay",
            "1900ms",
            "--",
            &job,
        ],
    );
    wait_for("the replica in the lock queue", secs(10.0), || {
        (cluster.waiters(id) >= 1).then_some(())
    });
    // Released at a whole second, the delay ends 100 ms before one: the due time that came
    // during it has less time to be asked about than any lookup needs.
    std::thread::sleep(Duration::from_secs_f64(1.0 - now().fract()));
    let _ = holder.kill();
    let _ = holder.wait();
    replica.wait_log("background leader lock acquired", 1, secs(5.0));
    replica.wait_log("the due time was started already", 3, secs(10.0));
    assert!(
        scratch.starts().is_empty() && runs(&scratch).is_empty(),
        "ran a due time an earlier leader had started: {}",
        replica.log()
    );
    replica.signal(Signal::SIGTERM);
    stopped_by_term(&mut replica);
}

/// A zone file that `TZ` or `--tz` names is read only when it is a regular file of a
/// zone file's size: a FIFO nobody writes to held start-up for good (every signal blocked,
/// so only SIGKILL ended it), and `/dev/zero` filled the memory (4 GB in 2 s). Each is
/// refused at once with the reason, exit 125.
#[test]
fn a_zone_file_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let scratch = Scratch::new();
    let fifo = scratch.file("zone.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let fifo = fifo.to_str().unwrap().to_owned();
    for (tz, flag) in [
        (format!(":{fifo}"), false),
        (fifo.clone(), true),
        (":/dev/zero".to_owned(), false),
        ("/dev/zero".to_owned(), true),
    ] {
        let mut cmd = leaderrun();
        cmd.args([
            "--dsn",
            "host=/nonexistent dbname=x",
            "--schedule",
            "@daily",
        ]);
        if flag {
            cmd.args(["--tz", &tz]);
        } else {
            cmd.env("TZ", &tz);
        }
        cmd.args(["--", "true"]);
        let mut run = Replica::spawn(cmd);
        let status = run.wait_exit(secs(10.0));
        let log = run.log();
        assert_eq!(status.code(), Some(125), "{tz}: {log}");
        assert!(log.contains("not a regular file"), "{tz}: {log}");
    }
}

/// Creates a history table of its own for one test, `PREFIX_ID`, as the README's SQL makes it
/// (`TableName::create_sql`); returns its name.
fn history_table(cluster: &Cluster, prefix: &str, id: i32) -> String {
    let table = format!("{prefix}_{id}");
    cluster.sql(
        &table
            .parse::<leaderrun::history::TableName>()
            .unwrap()
            .create_sql(),
    );
    table
}

/// A wall clock that is set while a leader runs its schedule (NTP stepping a clock that was
/// far off, an operator's `date -s`, a machine's clock after a resume): set a day ahead, the
/// due times it passed over are not run one after another, only the latest, once; set two
/// days back, the schedule goes on from the new time. Before, a clock set ahead ran COMMAND
/// back to back for every due time in between (an every-second job thousands of times, each
/// with a stale due time), and a clock set back ran nothing until it was back where it had
/// been: a day, for a day. The clock is leaderrun's own: an `LD_PRELOAD` shim adds the
/// seconds a file names to `CLOCK_REALTIME` (the machine's clock is left alone); the job
/// stamps its runs with `/proc/uptime`, which no shim changes.
#[test]
fn a_wall_clock_set_ahead_or_back_neither_floods_nor_stalls_the_schedule() {
    const TEST: &str =
        "schedule::a_wall_clock_set_ahead_or_back_neither_floods_nor_stalls_the_schedule";
    let scratch = Scratch::new();
    let Some((shim, shift)) = clock_shim(&scratch) else {
        return crate::support::cluster::skip(TEST, "no C compiler for the clock shim");
    };
    let job = scratch
        .child_script(
            "job.sh",
            "echo \"ran $(cut -d' ' -f1 /proc/uptime)\" >> \"$EVENTS\"",
        )
        .to_str()
        .unwrap()
        .to_owned();
    let cluster = Cluster::shared();
    let mut cmd = leaderrun();
    cmd.env("LD_PRELOAD", &shim)
        .env("SHIFT_FILE", &shift)
        .args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL])
        .args(["--schedule", "* * * * * *", "--tz", "UTC", "--", &job]);
    let mut replica = Replica::spawn(cmd);
    let ran = || -> Vec<f64> {
        scratch
            .events()
            .iter()
            .filter_map(|l| l.strip_prefix("ran ")?.parse().ok())
            .collect()
    };
    let runs_by = |n: usize, what: &str| {
        wait_for(what, secs(15.0), || {
            let runs = ran();
            (runs.len() >= n).then_some(runs)
        })
    };
    let before = runs_by(2, "two runs on time").len();
    std::fs::write(&shift, "86400").unwrap();
    let after = runs_by(before + 4, "four runs after the clock was set ahead");
    // Every second, one run: none of them back to back (a flood ran them 0.01 s apart; a
    // run held up by a loaded machine may come a little closer to the next than a second).
    for pair in after[before - 1..before + 4].windows(2) {
        assert!(
            pair[1] - pair[0] > 0.2,
            "runs {:.2} s apart after the clock was set ahead: {after:?}\n{}",
            pair[1] - pair[0],
            replica.log()
        );
    }
    let before = ran().len();
    std::fs::write(&shift, "-86400").unwrap();
    runs_by(before + 2, "two runs after the clock was set back two days");
    replica.signal(Signal::SIGTERM);
    replica.wait_exit(secs(10.0));
    let log = replica.log();
    assert!(
        log.contains("due times passed at once") && log.contains("the wall clock was set back"),
        "{log}"
    );
}

/// A clock set past a due time runs it within a second, whatever the schedule's period. Before,
/// the timer armed for an hourly due time slept up to a minute before it read the wall clock
/// again, so the clock an NTP step (or a resume) had set past the due time ran it a minute late.
/// The clock is set ten hours ahead, to just past a full hour: the due time the timer waits for
/// and nine more are passed over, and only the latest runs (its WARN, which a real full hour
/// cannot write, tells the run apart from one the machine's own clock reached meanwhile).
#[test]
fn a_clock_set_past_a_due_time_runs_it_within_a_second() {
    const TEST: &str = "schedule::a_clock_set_past_a_due_time_runs_it_within_a_second";
    let scratch = Scratch::new();
    let Some((shim, shift)) = clock_shim(&scratch) else {
        return crate::support::cluster::skip(TEST, "no C compiler for the clock shim");
    };
    let job = scratch.child_script("job.sh", "");
    let cluster = Cluster::shared();
    let mut cmd = leaderrun();
    cmd.env("LD_PRELOAD", &shim)
        .env("SHIFT_FILE", &shift)
        .args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL])
        .args(["--schedule", "0 0 * * * *", "--tz", "UTC", "--"])
        .arg(&job);
    let mut replica = Replica::spawn(cmd);
    replica.wait_log("background leader lock acquired", 1, secs(15.0));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ahead = (now / 3600 + 10) * 3600 + 1 - now;
    std::fs::write(&shift, ahead.to_string()).unwrap();
    let set = std::time::Instant::now();
    wait_for(
        "the run of the due time the clock was set past",
        secs(10.0),
        || (!scratch.starts().is_empty()).then_some(()),
    );
    let took = set.elapsed();
    // (A real full hour that came between the grant and the shift ran first; the WARN comes
    // all the same, from the shift.)
    replica.wait_log("due times passed at once", 1, secs(5.0));
    replica.signal(Signal::SIGTERM);
    replica.wait_exit(secs(10.0));
    let log = replica.log();
    assert!(
        took < secs(5.0),
        "ran {took:?} after the clock was set\n{log}"
    );
}

/// An `LD_PRELOAD` shim that adds the seconds the returned file names (0 at first) to
/// leaderrun's `CLOCK_REALTIME` (the machine's clock is left alone); `None` without a C
/// compiler.
fn clock_shim(scratch: &Scratch) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    const SHIM: &str = "#define _GNU_SOURCE\n#include <time.h>\n#include <fcntl.h>\n\
        #include <stdlib.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n\
        int clock_gettime(clockid_t c, struct timespec *ts) {\n\
          long r = syscall(SYS_clock_gettime, c, ts);\n\
          const char *p;\n\
          if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)\n\
              && (p = getenv(\"SHIFT_FILE\")) != 0) {\n\
            char b[32] = {0};\n\
            int fd = open(p, O_RDONLY | O_CLOEXEC);\n\
            if (fd >= 0) {\n\
              if (read(fd, b, sizeof b - 1) > 0) ts->tv_sec += strtol(b, 0, 10);\n\
              close(fd);\n\
            }\n\
          }\n\
          return r;\n\
        }\n";
    let (source, shim, shift) = (
        scratch.file("shim.c"),
        scratch.file("shim.so"),
        scratch.file("shift"),
    );
    std::fs::write(&source, SHIM).unwrap();
    std::fs::write(&shift, "0").unwrap();
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&source)
        .status();
    built.is_ok_and(|s| s.success()).then_some((shim, shift))
}

/// A role whose transactions are read-only by default (`default_transaction_read_only`, as a
/// DBA sets it for a read-only role or to freeze a database) cannot write the history: the
/// WARN says that cause, not that a DBA should create the table, both when leaderrun would
/// create the table and when a DBA's table is there.
#[test]
fn a_read_only_role_is_told_why_the_history_is_not_written() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let table = format!("runs_read_only_{id}");
    let role = format!("history_read_only_{id}");
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN SUPERUSER; \
         ALTER ROLE {role} SET default_transaction_read_only = on"
    ));
    let dsn = format!("{} user={role}", cluster.dsn());
    let run = || {
        let out = leaderrun()
            .args(["--dsn", &dsn, "--lock-id", &id.to_string(), "--once"])
            .args(["--history", "--history-table", &table, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let hint = "; hint: the session's transactions are read-only: default_transaction_read_only \
                is on for its role or database";
    let log = run();
    assert!(
        log.contains("history: cannot create the table (history: create the table:"),
        "{log}"
    );
    assert!(log.contains("(SQLSTATE 25006)"), "{log}");
    assert!(log.contains(hint), "{log}");
    assert!(!log.contains("a DBA creates it"), "{log}");
    // A DBA's table: the write itself is refused, with the same hint.
    let sql = table
        .parse::<leaderrun::history::TableName>()
        .unwrap()
        .create_sql();
    cluster.sql(&sql);
    let log = run();
    assert!(
        log.contains("history: cannot write the run history ("),
        "{log}"
    );
    assert!(log.contains("(SQLSTATE 25006)"), "{log}");
    assert!(log.contains(hint), "{log}");
    assert_eq!(cluster.sql(&format!("SELECT count(*) FROM {table}")), ["0"]);
}

/// An unqualified history table that the role's own schema holds (the default `search_path`
/// begins with `"$user"`: PostgreSQL's pattern of a schema per user) is said (INFO: a one-shot
/// at the default level prints nothing for it) with the option that names the schema:
/// replicas that log in as other roles would each write a table of their own, and
/// `--catch-up` ran a due time once per role. A name with its schema is not.
#[test]
fn a_history_table_in_the_roles_own_schema_is_warned_of() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let role = format!("history_own_{}", id.unsigned_abs());
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN; CREATE SCHEMA {role} AUTHORIZATION {role}"
    ));
    let dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname=postgres",
        cluster.addr().port()
    );
    let once = |table: &str| {
        let out = leaderrun()
            .args(["-v", "--dsn", &dsn, "--lock-id", &id.to_string()])
            .args([
                "--once",
                "--history",
                "--history-table",
                table,
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let table = format!("runs_own_{}", id.unsigned_abs());
    let log = once(&table);
    assert!(
        log.contains("history: the table is found in the role's own schema")
            && log.contains(&format!("--history-table {role}.{table}")),
        "{log}"
    );
    assert_eq!(
        cluster.sql(&format!(
            "SELECT count(*) FROM {role}.{table} WHERE outcome = 'ok'"
        )),
        ["1"]
    );
    // Found there the next time: said again, by each process.
    assert!(once(&table).contains("role's own schema"));
    let log = once(&format!("{role}.{table}"));
    assert!(!log.contains("role's own schema"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}
