//! The real `leaderrun` binary against a real PostgreSQL: election, failover, signals, exit
//! codes, and what the child gets.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{
    alive, leaderrun, status, unique_lock_id, wait_for, wait_status_waiters, Cluster, Replica,
    Scratch, CLASS,
};

const INTERVAL: &str = "200ms";

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The replica whose child a start record belongs to.
fn leader_of<'a>(replicas: &'a mut [Replica], start: &crate::support::Start) -> &'a mut Replica {
    replicas
        .iter_mut()
        .find(|r| r.pid() == start.ppid)
        .expect("the child's parent is one of the replicas")
}

#[test]
fn three_replicas_run_exactly_one_child() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(cluster, id, INTERVAL, &["-v", "--", script]))
        .collect();
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
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(cluster, id, INTERVAL, &["--", script]))
        .collect();
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
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    // A trap-less script with a background and a foreground worker: the group signal must stop
    // all of them, not only sh.
    let script = scratch.child_script(
        "child.sh",
        "sleep 600 & echo \"bg $!\" >> \"$EVENTS\"\nsleep 600\nwait",
    );
    let script = script.to_str().unwrap();
    // A long interval, so "at once" cannot be the next check.
    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| Replica::start(cluster, id, "3s", &["--", script]))
        .collect();
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
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "trap 'echo \"term $$\" >> \"$EVENTS\"; exit 3' TERM\nwhile :; do sleep 0.05; done",
    );
    let script = script.to_str().unwrap();
    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| Replica::start(cluster, id, INTERVAL, &["--", script]))
        .collect();
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

/// `systemctl stop` sends SIGTERM: a leader whose COMMAND dies of it exits 143 (128 + 15), so
/// the README's unit counts 143 as success; without it the unit shows "failed" after every stop.
#[test]
fn a_stopped_leader_exits_143_and_the_systemd_unit_counts_it_as_success() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut leader = Replica::start(cluster, id, INTERVAL, &["--", script.to_str().unwrap()]);
    scratch.wait_starts(1, secs(10.0));
    leader.signal(Signal::SIGTERM);
    let status = leader.wait_exit(secs(5.0));
    assert_eq!(status.code(), Some(143), "log:\n{}", leader.log());
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let unit = readme
        .split("### systemd")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("the README's systemd unit");
    assert!(unit.lines().any(|l| l == "SuccessExitStatus=143"), "{unit}");
}

/// Newcomers' slips get a hint that says what to check: a mistyped subcommand, flock's word
/// order, a refused connection, a database that does not exist.
#[test]
fn slips_get_hints_that_say_what_to_check() {
    let cluster = Cluster::shared();
    let run = |args: &[&str]| {
        let out = leaderrun().args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let dsn = cluster.dsn();
    // A near miss of a subcommand is not run as a program...
    let (code, text) = run(&["statsu"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(text.contains("did you mean status?"), "{text}");
    let (code, text) = run(&["--dsn", &dsn, "step-dwon"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(text.contains("did you mean step-down?"), "{text}");
    // ... unless it comes after `--`.
    let (code, text) = run(&["--dsn", &dsn, "--", "statsu"]);
    assert_eq!(code, Some(127), "{text}");
    assert!(!text.contains("did you mean"), "{text}");
    // flock's word order: there is no lock-file argument.
    let (code, text) = run(&["--dsn", &dsn, "-n", "/nonexistent/lock/x", "true"]);
    assert_eq!(code, Some(127), "{text}");
    assert!(text.contains("no lock-file argument"), "{text}");
    // A refused connection: is the server running there? Not pg_hba.conf.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let nobody = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let (code, text) = run(&["--dsn", &nobody, "--once", "--", "true"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(
        text.contains("hint: is the server running on that host and accepting TCP connections"),
        "{text}"
    );
    let (code, text) = run(&["--dsn", &nobody, "doctor"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(text.contains("check the host and port"), "{text}");
    assert!(!text.contains("pg_hba"), "{text}");
    // A database that does not exist: its name, and where it comes from.
    let missing = format!(
        "host=127.0.0.1 port={} user=postgres dbname=leaderrun_no_such_db",
        cluster.addr().port()
    );
    let (code, text) = run(&["--dsn", &missing, "doctor"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(
        text.contains("\"leaderrun_no_such_db\" does not exist"),
        "{text}"
    );
    assert!(text.contains("check the database name"), "{text}");
    assert!(!text.contains("pg_hba"), "{text}");
}

/// The default key is the plexsphere API's own leader lock: the start line says so in words.
#[test]
fn the_start_line_names_the_default_key_in_words() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let dsn = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let start_line = |extra: &[&str]| {
        let out = leaderrun()
            .args(["-v", "--once", "--dsn", &dsn])
            .args(extra)
            .args(["--", "true"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        log.lines()
            .find(|l| l.contains("campaigning for the background leader lock"))
            .unwrap_or_else(|| panic!("no start line:\n{log}"))
            .to_owned()
    };
    let default = start_line(&[]);
    assert!(
        default.contains("lock_is=\"the plexsphere background leader lock"),
        "{default}"
    );
    let own = start_line(&["--lock-name", "nightly-report"]);
    assert!(own.contains("lock_is=\"a key of its own\""), "{own}");
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
fn exit_status_of_command_is_passed_on() {
    let cluster = Cluster::shared();
    let cases: [(&str, Option<i32>, Option<i32>); 4] = [
        ("echo to-stdout; echo to-stderr >&2; exit 7", Some(7), None),
        ("exit 0", Some(0), None),
        ("kill -KILL $$", Some(137), None),
        ("kill -TERM $$", Some(143), None),
    ];
    for (body, code, signal) in cases {
        let mut replica = Replica::start(
            cluster,
            unique_lock_id(),
            INTERVAL,
            &["--", "sh", "-c", body],
        );
        let status = replica.wait_exit(secs(10.0));
        assert_eq!(
            (status.code(), status.signal()),
            (code, signal),
            "{body}: {}",
            replica.log()
        );
        if body.starts_with("echo") {
            // stdio passes through untouched; leaderrun's own lines go to stderr only.
            assert_eq!(replica.stdout(), "to-stdout\n");
            assert!(replica.log().contains("to-stderr\n"));
        }
    }
}

#[test]
fn child_dying_of_sigint_makes_leaderrun_die_of_sigint() {
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--", "sh", "-c", "kill -INT $$"],
    );
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.signal(), Some(libc::SIGINT), "{}", replica.log());
}

#[test]
fn helpers_left_by_an_exited_command_are_stopped_before_exit() {
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "sleep 600 & echo \"bg $!\" >> \"$EVENTS\"\nexit 5",
    );
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--", script.to_str().unwrap()],
    );
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(5));
    let background: i32 = scratch.recorded_pid("bg ");
    assert!(!alive(background), "helper {background} outlived leaderrun");
}

#[test]
fn usage_errors_exit_125_without_a_backtrace() {
    let cases: &[&[&str]] = &[
        &[],
        &["--check-interval", "5", "--", "true"],
        &["--check-interval", "0s", "--", "true"],
        &["--grace", "-1s", "--", "true"],
        &["--lock-id", "2147483648", "--", "true"],
        &["--lock-class", "x", "--", "true"],
        &["--stop-signal", "NOPE", "--", "true"],
        &["--frobnicate", "--", "true"],
        &["--dsn", "postgres://u:hunter2@h:notaport/db", "--", "true"],
        &["--dsn", "mysql://u:hunter2@h/db", "--", "true"],
        &["--stop-signal", "STOP", "--", "true"],
        &["--check-interval", "1000h", "--", "true"],
    ];
    for args in cases {
        let out = leaderrun().args(*args).output().expect("run leaderrun");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(!stderr.contains("backtrace"), "{args:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{args:?}: {stderr}");
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
    }
    let out = leaderrun()
        .args(["--check-interval", "-1s", "--", "true"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("must not be negative"));
    let out = leaderrun().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--check-interval"));
}

#[test]
fn missing_or_unexecutable_command_exits_at_once() {
    let scratch = Scratch::new();
    let plain = scratch.file("plain.txt");
    std::fs::write(&plain, "not a program").unwrap();
    let bad_interpreter = scratch.child_script("bad.sh", "exit 0");
    let text = std::fs::read_to_string(&bad_interpreter).unwrap();
    std::fs::write(
        &bad_interpreter,
        text.replace("#!/bin/sh", "#!/nonexistent/interp"),
    )
    .unwrap();
    // Nothing listens on this port: the checks must happen before any connection attempt.
    let dsn = "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=30";
    let cases = [
        ("no-such-command-leaderrun", 127),
        ("./no/such/file", 127),
        (plain.to_str().unwrap(), 126),
        (scratch.path().to_str().unwrap(), 126),
        (bad_interpreter.to_str().unwrap(), 127),
    ];
    for (command, code) in cases {
        let started = Instant::now();
        let out = leaderrun()
            .args(["--dsn", dsn, "--", command])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(started.elapsed() < secs(2.0));
    }
}

#[test]
fn sigterm_while_standby_exits_0_and_starts_nothing() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    let _leader = Replica::start(cluster, id, INTERVAL, &["--", script]);
    scratch.wait_starts(1, secs(10.0));
    let mut standby = Replica::start(cluster, id, INTERVAL, &["-v", "--", script]);
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
    cmd.args([
        "--dsn",
        "host=127.0.0.1 port=1 user=postgres dbname=postgres",
    ])
    .args(["--check-interval", INTERVAL, "--", script.to_str().unwrap()]);
    let mut replica = Replica::spawn(cmd);
    replica.wait_log("leader: acquire lock connection:", 1, secs(5.0));
    replica.signal(Signal::SIGINT);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(0));
    assert!(scratch.starts().is_empty());
}

#[test]
fn child_sees_only_stdio_descriptors() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let leaked = std::fs::File::create(scratch.file("leak")).unwrap();
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &cluster.dsn(),
        "--lock-id",
        &unique_lock_id().to_string(),
    ])
    .args(["--check-interval", INTERVAL, "--", script.to_str().unwrap()]);
    let raw = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    // SAFETY: dup2 between fork and exec; gives leaderrun an inherited fd 7 without CLOEXEC.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 of a descriptor onto itself keeps its close-on-exec flag: clear it then.
            let done = if raw == 7 {
                libc::fcntl(7, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, 7)
            };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let replica = Replica::spawn(cmd);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    // leaderrun itself has fd 7 and its database socket…
    assert!(std::path::Path::new(&format!("/proc/{}/fd/7", replica.pid())).exists());
    // …the child has only 0, 1 and 2, once it is `sleep` (until its `exec` the shell still
    // holds its own descriptor of the script it reads).
    wait_for("the child to exec sleep", secs(5.0), || {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", start.pid)).ok()?;
        (comm.trim() == "sleep").then_some(())
    });
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", start.pid))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"]);
}

#[test]
fn a_paused_leaders_tree_is_stopped_by_its_watchdog_before_the_lock_moves() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
         trap 'echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
         while :; do sleep 0.02; done",
    );
    let script = script.to_str().unwrap();
    // A grace of 1 s, so that a loaded machine still runs the child's TERM trap (its end
    // stamp) before SIGKILL; idle_session_timeout is then 3 × 200 ms + 1 s.
    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| {
            Replica::start(
                cluster,
                id,
                INTERVAL,
                &["--grace", "1s", "--log-format", "json", "--", script],
            )
        })
        .collect();
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

#[test]
fn a_child_ignoring_the_stop_signal_is_killed_after_the_grace() {
    let scratch = Scratch::new();
    // An ignored TERM survives exec, so `sleep` ignores it too.
    let script = scratch.child_script("child.sh", "trap '' TERM\nexec sleep 600");
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--grace", "1s", "--", script.to_str().unwrap()],
    );
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    replica.signal(Signal::SIGTERM);
    let sent = Instant::now();
    wait_for("the child to be SIGKILLed", secs(4.0), || {
        (!alive(start.pid)).then_some(())
    });
    let took = sent.elapsed();
    assert!(took >= secs(0.9), "killed after {took:?}, before the grace");
    assert_eq!(replica.wait_exit(secs(2.0)).code(), Some(137));
}

#[test]
fn a_second_sigterm_while_stopping_kills_at_once() {
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "trap '' TERM\nexec sleep 600");
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--grace", "60s", "--", script.to_str().unwrap()],
    );
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    replica.signal(Signal::SIGTERM);
    replica.wait_log("stopping the child", 1, secs(2.0));
    assert!(
        alive(start.pid),
        "TERM is ignored; only the grace or a second TERM ends it"
    );
    replica.signal(Signal::SIGTERM);
    assert_eq!(replica.wait_exit(secs(3.0)).code(), Some(137));
    assert!(!alive(start.pid));
}

#[test]
fn stop_signal_and_forwarded_signals_reach_the_child() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "trap 'echo hup >> \"$EVENTS\"' HUP\n\
         trap 'echo usr1 >> \"$EVENTS\"; exit 0' USR1\n\
         while :; do sleep 0.05; done",
    );
    let replica = Replica::start(
        cluster,
        unique_lock_id(),
        INTERVAL,
        &["--stop-signal", "USR1", "--", script.to_str().unwrap()],
    );
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    replica.signal(Signal::SIGHUP);
    wait_for("HUP to reach the child", secs(3.0), || {
        scratch.events().contains(&"hup".to_owned()).then_some(())
    });
    assert!(
        alive(first.pid),
        "HUP is passed on, it does not stop the child"
    );
    // Demotion sends the configured stop signal.
    cluster.terminate_backend(first.backend_pid);
    wait_for("USR1 to reach the child", secs(3.0), || {
        scratch.events().contains(&"usr1".to_owned()).then_some(())
    });
    // The same process leads again and starts COMMAND afresh.
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    assert_eq!((second.ppid, second.term), (replica.pid(), 2));
}

#[test]
fn a_broken_stderr_never_aborts_a_leader() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script(
        "child.sh",
        "sleep 600 & echo \"bg $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &cluster.dsn(),
        "--lock-id",
        &unique_lock_id().to_string(),
    ])
    .args(["--check-interval", INTERVAL, "--", script.to_str().unwrap()])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut leader = cmd.spawn().unwrap();
    // The reader goes away: every later log line meets EPIPE.
    drop(leader.stderr.take());
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let background: i32 = scratch.recorded_pid("bg ");
    // Demotion logs a WARN line: it must still stop the whole group and go on campaigning.
    cluster.terminate_backend(start.backend_pid);
    wait_for("the group to stop", secs(3.0), || {
        (!alive(start.pid) && !alive(background)).then_some(())
    });
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    assert_eq!(second.term, 2);
    assert!(leader.try_wait().unwrap().is_none(), "leaderrun died");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(leader.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = leader.wait().unwrap();
    assert_eq!(status.code(), Some(143));
}

#[test]
fn a_release_reaches_a_waiting_standby_at_once_even_at_the_default_interval() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    // The default check interval, 5 s: without waiting in the lock queue a standby would need
    // up to 5 s to notice.
    let mut replicas: Vec<Replica> = (0..4)
        .map(|_| Replica::start(cluster, id, "5s", &["--", script]))
        .collect();
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
