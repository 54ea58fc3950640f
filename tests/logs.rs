//! What cron users, operators and users of flock, timeout and consul lock expect, through the
//! real binary against a real PostgreSQL: `status` names hosts and pids, a standby says who
//! holds the lock, one-shots are quiet, every failure is printed once, password hints,
//! the database of the lock, and `--tick-at-grant`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{
    leaderrun, status, unique_lock_id, wait_for, Cluster, Replica, Scratch, CLASS,
};

const INTERVAL: &str = "200ms";

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The body of `GET /metrics` from `addr`.
fn metrics(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the probe port");
    stream.set_read_timeout(Some(secs(5.0))).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
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

/// `leaderrun_checks_total{outcome="refused"}` of a replica.
fn refusals(addr: SocketAddr) -> u64 {
    metrics(addr)
        .lines()
        .find(|l| l.starts_with("leaderrun_checks_total{outcome=\"refused\"}"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// Lines of `log` that name the holder.
fn holder_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("the lock is held by"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn status_names_the_hosts_and_pids_of_the_leader_and_its_standbys() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let leader = Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let standby = Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]);
    let standby_backend = wait_for("the standby's session", secs(10.0), || {
        let backends = cluster.backends_of(standby.pid());
        (backends.len() == 1).then(|| backends[0])
    });
    let host = hostname();
    let report = wait_for("the standby listed by status", secs(5.0), || {
        let out = status(cluster, id, true);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        // The leader's term and token show from its term's first check on, which a loaded
        // machine may run after the standby queues.
        (report["standbys"].as_array()?.len() == 1
            && report["standbys"][0]["queued"] == true
            && report["leader"]["term"] == 1
            && out.status.code() == Some(0))
        .then_some(report)
    });
    let l = &report["leader"];
    assert_eq!(l["leaderrun"], true, "{report}");
    assert_eq!(l["host"], host.as_str());
    assert_eq!(l["leaderrun_pid"], leader.pid());
    assert_eq!(l["pid"], start.backend_pid);
    assert_eq!(l["client_addr"], "127.0.0.1");
    assert_eq!(l["term"], 1);
    assert_eq!(l["fencing_token"], start.fencing_token);
    assert!(l["since"].as_str().unwrap().ends_with('Z'), "{report}");
    let s = &report["standbys"][0];
    assert_eq!(s["leaderrun"], true, "{report}");
    assert_eq!(s["host"], host.as_str());
    assert_eq!(s["leaderrun_pid"], standby.pid());
    assert_eq!(s["backend_pid"], standby_backend);
    assert_eq!(s["client_addr"], "127.0.0.1");
    // pg_locks.waitstart is new in PostgreSQL 14.
    if crate::support::cluster::server_major() >= 14 {
        assert!(
            s["waiting_since"].as_str().unwrap().ends_with('Z'),
            "{report}"
        );
    } else {
        assert!(s["waiting_since"].is_null(), "{report}");
    }
    assert_eq!(report["waiters"], serde_json::json!([standby_backend]));
    // The only standby is the queue head: place 1 in the line of slot 0.
    assert_eq!(s["place"], 1, "{report}");
    assert_eq!(s["slot"], 0, "{report}");

    let table = String::from_utf8(status(cluster, id, false).stdout).unwrap();
    for line in [
        format!("leader         {host}, leaderrun pid {}", leader.pid()),
        format!("leader pid     {} (backend)", start.backend_pid),
        format!(
            "fencing token  {} (grows across all replicas)",
            start.fencing_token
        ),
        format!(
            "standby        {host}, leaderrun pid {} (backend {standby_backend}), queue head{}",
            standby.pid(),
            if crate::support::cluster::server_major() >= 14 {
                ", waiting since "
            } else {
                "\n"
            }
        ),
    ] {
        assert!(table.contains(&line), "{line:?} not in\n{table}");
    }
}

#[test]
fn a_holder_that_is_not_leaderrun_leads_too() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let mut psql = cluster.psql_session();
    writeln!(
        psql.stdin.as_mut().unwrap(),
        "SELECT pg_advisory_lock({CLASS}, {id});"
    )
    .unwrap();
    let holder = wait_for("psql to hold the lock", secs(10.0), || {
        cluster.lock_holders(CLASS, id).first().copied()
    });
    let out = status(cluster, id, true);
    assert_eq!(out.status.code(), Some(0), "a leader holds the lock");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &report["leader"];
    assert_eq!(l["pid"], holder);
    assert_eq!(l["leaderrun"], false);
    assert_eq!(l["application_name"], "psql");
    assert!(
        l["host"].is_null() && l["leaderrun_pid"].is_null(),
        "{report}"
    );
    assert!(
        l["term"].is_null() && l["fencing_token"].is_null(),
        "{report}"
    );
    let table = status(cluster, id, false);
    assert_eq!(table.status.code(), Some(0));
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("leader         not leaderrun: application_name=psql"),
        "{table}"
    );

    // A standby started by hand says who holds the lock, once.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let standby = Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]);
    standby.wait_log("the lock is held by", 1, secs(10.0));
    let lines = holder_lines(&standby.log());
    assert!(
        lines[0].contains(" INFO ")
            && lines[0].contains(&format!(
                "the lock is held by not leaderrun: application_name=psql, backend {holder}, session started "
            )),
        "{lines:?}"
    );
    let _ = psql.kill();
    let _ = psql.wait();
    scratch.wait_starts(1, secs(10.0));
}

#[test]
fn a_standby_says_who_holds_the_lock_once_and_again_when_the_holder_changes() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut first = Replica::start(cluster, id, INTERVAL, &["--", job.to_str().unwrap()]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let host = hostname();
    let standbys: Vec<Replica> = (0..2)
        .map(|_| {
            Replica::start(
                cluster,
                id,
                INTERVAL,
                &["--http-addr", "127.0.0.1:0", "--", job.to_str().unwrap()],
            )
        })
        .collect();
    for standby in &standbys {
        standby.wait_log("the lock is held by", 1, secs(10.0));
        let line = &holder_lines(&standby.log())[0];
        assert!(
            line.contains(&format!(
                "INFO the lock is held by leaderrun on {host} (pid {}), backend {}, leading since ",
                first.pid(),
                start.backend_pid
            )),
            "{line}"
        );
        // Nothing more while nothing changes: three more refused checks, still one line.
        let addr = probe_addr(standby);
        let seen = refusals(addr);
        wait_for("three more refused checks", secs(10.0), || {
            (refusals(addr) >= seen + 3).then_some(())
        });
        assert_eq!(holder_lines(&standby.log()).len(), 1, "{}", standby.log());
    }
    // The leader hands over: one standby leads, the other names its new holder.
    first.signal(Signal::SIGTERM);
    first.wait_exit(secs(10.0));
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    let (leading, waiting): (Vec<&Replica>, Vec<&Replica>) =
        standbys.iter().partition(|r| r.pid() == second.ppid);
    assert_eq!((leading.len(), waiting.len()), (1, 1));
    let waiting = waiting[0];
    waiting.wait_log("the lock is held by", 2, secs(10.0));
    let line = &holder_lines(&waiting.log())[1];
    assert!(
        line.contains(&format!(
            "the lock is held by leaderrun on {host} (pid {}), backend {}",
            leading[0].pid(),
            second.backend_pid
        )),
        "{line}"
    );
}

#[test]
fn a_one_shot_that_led_prints_only_what_command_prints() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "echo report done\necho to stderr >&2");
    for mode in [&["--once"][..], &["--wait", "5s"]] {
        let mut args = mode.to_vec();
        args.extend(["--", job.to_str().unwrap()]);
        let mut once = Replica::start(cluster, unique_lock_id(), INTERVAL, &args);
        assert_eq!(once.wait_exit(secs(10.0)).code(), Some(0));
        assert_eq!(once.stdout(), "report done\n");
        assert_eq!(
            once.log(),
            "to stderr\n",
            "{mode:?}: only COMMAND's own stderr"
        );
    }
    // -v shows the INFO lines, the fencing token in the acquisition line among them.
    let mut verbose = Replica::start(
        cluster,
        unique_lock_id(),
        INTERVAL,
        &["-v", "--once", "--", job.to_str().unwrap()],
    );
    assert_eq!(verbose.wait_exit(secs(10.0)).code(), Some(0));
    let log = verbose.log();
    let start = scratch.starts().last().unwrap().clone();
    let acquired = log
        .lines()
        .find(|l| l.contains("INFO background leader lock acquired"))
        .unwrap_or_else(|| panic!("no acquisition line:\n{log}"));
    assert!(
        acquired.contains(&format!("fencing_token={}", start.fencing_token)),
        "{acquired}"
    );
    assert!(log.contains("INFO child started"), "{log}");
    // The settings line names the database the lock lives in.
    let settings = log
        .lines()
        .find(|l| l.contains("campaigning for the background leader lock"))
        .unwrap_or_else(|| panic!("no settings line:\n{log}"));
    assert!(
        settings.contains("database=postgres database_from=dsn"),
        "{settings}"
    );
}

#[test]
fn a_connection_failure_is_printed_once() {
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        "--once",
        "--",
        "true",
    ]);
    let mut once = Replica::spawn(cmd);
    assert_eq!(once.wait_exit(secs(10.0)).code(), Some(125));
    let log = once.log();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("ERROR could not check the lock: connect to host=127.0.0.1 port=1")
            && lines[0].contains("Connection refused"),
        "{log}"
    );
    // --wait: each failed try is one WARN with its cause; the verdict does not repeat it.
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        "host=127.0.0.1 port=1 user=postgres dbname=postgres",
    ])
    .args([
        "--check-interval",
        INTERVAL,
        "--wait",
        "500ms",
        "--",
        "true",
    ]);
    let mut wait = Replica::spawn(cmd);
    assert_eq!(wait.wait_exit(secs(10.0)).code(), Some(125));
    let log = wait.log();
    let refused = log.matches("Connection refused").count();
    let warned = log.matches("WARN leader: acquire lock connection").count();
    assert!(warned >= 1 && refused == warned, "{log}");
    assert_eq!(log.matches("ERROR").count(), 1, "{log}");
}

#[test]
fn passwords_get_hints_and_a_warning_on_the_command_line() {
    let cluster = Cluster::start_private();
    cluster.require_password("pwuser", "s3cret-pw");
    let home = Scratch::new();
    let dsn = format!(
        "host=127.0.0.1 port={} user=pwuser dbname=postgres",
        cluster.addr().port()
    );
    let id = unique_lock_id().to_string();
    let run = |dsn: &str, env: &[(&str, &str)]| {
        let mut cmd = leaderrun();
        cmd.env("HOME", home.path())
            .args(["--dsn", dsn, "--lock-id", &id, "--once", "--", "true"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut replica = Replica::spawn(cmd);
        let code = replica.wait_exit(secs(10.0)).code();
        (code, replica.log())
    };
    // No password anywhere.
    let (code, log) = run(&dsn, &[]);
    assert_eq!(code, Some(125), "{log}");
    assert_eq!(log.lines().count(), 1, "{log}");
    for needle in [
        "password missing",
        "PGPASSWORD",
        "~/.pgpass",
        "~/.pg_service.conf",
    ] {
        assert!(log.contains(needle), "{needle:?} not in {log}");
    }
    // PGPASSWORD: quiet.
    let (code, log) = run(&dsn, &[("PGPASSWORD", "s3cret-pw")]);
    assert_eq!((code, log.as_str()), (Some(0), ""));
    // In --dsn, keyword and URL form: it works, with a WARN that names no password.
    let url = format!(
        "postgres://pwuser:s3cret-pw@127.0.0.1:{}/postgres",
        cluster.addr().port()
    );
    for dsn in [format!("{dsn} password=s3cret-pw"), url] {
        let (code, log) = run(&dsn, &[]);
        assert_eq!(code, Some(0), "{log}");
        assert!(
            log.contains("WARN the password is written into --dsn")
                && log.contains("ps")
                && log.contains("PGPASSWORD or ~/.pgpass"),
            "{log}"
        );
        assert!(!log.contains("s3cret"), "{log}");
    }
    // The same DSN in LEADERRUN_DSN is not on the command line: no warning.
    let mut cmd = leaderrun();
    cmd.env("HOME", home.path())
        .env("LEADERRUN_DSN", format!("{dsn} password=s3cret-pw"))
        .args(["--lock-id", &id, "--once", "--", "true"]);
    let mut replica = Replica::spawn(cmd);
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    assert_eq!(replica.log(), "");
}

#[test]
fn doctor_says_which_database_the_lock_lives_in() {
    let cluster = Cluster::shared();
    let port = cluster.addr().port();
    let doctor = |dsn: &str| {
        let out = leaderrun().args(["doctor", "--dsn", dsn]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(&format!("host=127.0.0.1 port={port} user=postgres"));
    assert_eq!(
        code,
        Some(0),
        "a default database is a warning, not a failure: {text}"
    );
    assert!(
        text.contains(
            "warn  database      the lock lives in database postgres, which no setting named"
        ),
        "{text}"
    );
    assert!(
        text.contains("hint: advisory locks are per database"),
        "{text}"
    );
    let (code, text) = doctor(&cluster.dsn());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("ok    database      the lock lives in database postgres (from dsn)"),
        "{text}"
    );
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
