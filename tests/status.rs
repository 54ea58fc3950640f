//! `status`, `step-down` and `doctor` through the binary against a real PostgreSQL: who leads
//! and who stands by (hosts, pids, a holder that is not leaderrun), negative lock keys, the
//! hand-over `step-down` asks for, and `doctor` on a primary, a hot standby and its database.

use std::io::Write;
use std::os::unix::ffi::OsStringExt;

use nix::sys::signal::Signal;

use crate::support::{
    holder_lines, hostname, leaderrun, secs, status, step_down, unique_lock_id, wait_for,
    wait_status_waiters, Cluster, Replica, Scratch, Setup, CLASS, INTERVAL, UNREACHABLE_DSN,
};

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
        .args(["status", "--dsn", UNREACHABLE_DSN])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(125));
}

/// A server that keeps only the first 99 bytes of each statement (`track_activity_query_size
/// = 100`, its least) and a leader renamed by its DSN on a host with a longer name: the
/// leader's check carries who it is first, so `status` still names its host and pid and says
/// its term. Before, the term's comment came first and the cut fell inside the host's name:
/// `status` said "not leaderrun" (and `step-down` refused to ask it).
#[test]
fn status_names_a_renamed_leader_when_the_server_keeps_99_bytes_of_its_statement() {
    const TEST: &str =
        "status::status_names_a_renamed_leader_when_the_server_keeps_99_bytes_of_its_statement";
    if !nix::unistd::geteuid().is_root() {
        return crate::support::cluster::skip(TEST, "needs root for a host name of its own");
    }
    let cluster = Cluster::start_private();
    cluster.sql("ALTER SYSTEM SET track_activity_query_size = 100");
    cluster.restart();
    let id = unique_lock_id();
    let host = "a-host-named-as-clouds-do-0042";
    let mut cmd = crate::support::wrapper("unshare");
    cmd.args(["--uts", "sh", "-c"])
        .arg("hostname \"$HOST\" && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .env("HOST", host)
        .args([
            "--dsn",
            &format!("{} application_name=nightly", cluster.dsn()),
        ])
        .args(["--lock-id", &id.to_string(), "--check-interval", "200ms"])
        .args(["--", "sleep", "600"]);
    let leader = Replica::spawn(cmd);
    let report = wait_for("status to show the leader's term", secs(10.0), || {
        let out = status(&cluster, id, true);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (!report["leader"]["term"].is_null()).then_some(report)
    });
    let l = &report["leader"];
    assert_eq!(l["application_name"], "nightly", "{report}");
    assert_eq!(l["leaderrun"], true, "{report}\n{}", leader.log());
    assert_eq!(l["host"], host, "{report}");
    assert_eq!(l["leaderrun_pid"], leader.pid(), "{report}");
    assert_eq!(l["term"], 1, "{report}");
}

#[test]
fn status_names_the_hosts_and_pids_of_the_leader_and_its_standbys() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let leader = setup.replica(INTERVAL, &[]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let standby = setup.replica(INTERVAL, &[]);
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

/// A `psql` session on database `db` of `cluster` (application_name `psql-holder`, client
/// encoding `encoding`) that sends `statements` as they are, bytes that are not UTF-8
/// included, and stays until it is killed.
fn psql_on(cluster: &Cluster, db: &str, encoding: &str, statements: &[u8]) -> std::process::Child {
    let mut psql = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", "127.0.0.1", "-p", &cluster.addr().port().to_string()])
        .args(["-U", "postgres", "-d", db])
        .env("PGAPPNAME", "psql-holder")
        .env("PGCLIENTENCODING", encoding)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run psql");
    psql.stdin.as_mut().unwrap().write_all(statements).unwrap();
    psql
}

#[test]
fn status_and_standbys_read_other_sessions_in_every_database_encoding() {
    // Databases of its own: a private cluster.
    let cluster = Cluster::start_private();
    for (db, encoding) in [("lr_sql_ascii", "SQL_ASCII"), ("lr_latin1", "LATIN1")] {
        cluster.sql(&format!(
            "CREATE DATABASE {db} ENCODING '{encoding}' TEMPLATE template0 \
             LC_COLLATE 'C' LC_CTYPE 'C'"
        ));
    }
    let dsn = |db: &str| {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            cluster.addr().port()
        )
    };
    let holder_of = |db: &str, id: i32| {
        wait_for("psql to hold the lock", secs(10.0), || {
            cluster
                .sql(&format!(
                    "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                     WHERE d.datname = '{db}' AND l.locktype = 'advisory' AND l.granted \
                       AND l.classid = ({CLASS}::bigint & 4294967295)::text::oid \
                       AND l.objid = ({id}::bigint & 4294967295)::text::oid AND l.objsubid = 2"
                ))
                .first()
                .map(|pid| pid.parse::<i32>().unwrap())
        })
    };
    let status_of = |db: &str, id: i32, json: bool| {
        let mut cmd = leaderrun();
        cmd.args(["status", "--dsn", &dsn(db), "--lock-id", &id.to_string()]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "status in {db}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };

    // In a SQL_ASCII database the server cannot convert a session's bytes that are not UTF-8 to
    // the client's encoding: a holder that is not leaderrun whose statement has some.
    let id = unique_lock_id();
    let mut sql = format!("SELECT pg_advisory_lock({CLASS}, {id}) /* ").into_bytes();
    sql.extend_from_slice(b"\xff\xfe */, '\xff';\n");
    let mut stranger = psql_on(&cluster, "lr_sql_ascii", "SQL_ASCII", &sql);
    let holder = holder_of("lr_sql_ascii", id);
    let report: serde_json::Value =
        serde_json::from_slice(&status_of("lr_sql_ascii", id, true)).unwrap();
    let l = &report["leader"];
    assert_eq!(l["pid"], holder, "{report}");
    assert_eq!(l["leaderrun"], false, "{report}");
    assert_eq!(l["application_name"], "psql-holder", "{report}");
    let table = String::from_utf8(status_of("lr_sql_ascii", id, false)).unwrap();
    assert!(
        table.contains("leader         not leaderrun: application_name=psql-holder"),
        "{table}"
    );
    // A standby there says who holds the lock, and status lists it.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn("lr_sql_ascii"), "--lock-id", &id.to_string()])
        .args(["--check-interval", INTERVAL, "--", job.to_str().unwrap()]);
    let standby = Replica::spawn(cmd);
    standby.wait_log("the lock is held by", 1, secs(10.0));
    let lines = holder_lines(&standby.log());
    assert!(
        lines[0].contains(" INFO ")
            && lines[0].contains(&format!(
                "the lock is held by not leaderrun: application_name=psql-holder, backend \
                 {holder}, session started "
            )),
        "{lines:?}"
    );
    let report: serde_json::Value = wait_for("status to list the standby", secs(10.0), || {
        let report: serde_json::Value =
            serde_json::from_slice(&status_of("lr_sql_ascii", id, true)).unwrap();
        report["standbys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["leaderrun_pid"] == standby.pid())
            .then_some(report)
    });
    assert_eq!(report["leader"]["pid"], holder, "{report}");

    // A leaderrun known by the comment its statements carry, on a host whose name is not ASCII,
    // is read right in every encoding: SQL_ASCII keeps the UTF-8 bytes it was sent, LATIN1
    // converts them to its own and back.
    for db in ["lr_sql_ascii", "lr_latin1", "postgres"] {
        let id = unique_lock_id();
        let mut named = psql_on(
            &cluster,
            db,
            "UTF8",
            format!("/* by=hôte-é:4242 */ SELECT pg_advisory_lock({CLASS}, {id});\n").as_bytes(),
        );
        holder_of(db, id);
        let report: serde_json::Value = serde_json::from_slice(&status_of(db, id, true)).unwrap();
        let l = &report["leader"];
        assert_eq!(
            (&l["leaderrun"], &l["host"], &l["leaderrun_pid"]),
            (
                &serde_json::json!(true),
                &serde_json::json!("hôte-é"),
                &serde_json::json!(4242)
            ),
            "{db}: {report}"
        );
        let _ = named.kill();
        let _ = named.wait();
    }
    let _ = stranger.kill();
    let _ = stranger.wait();
    scratch.wait_starts(1, secs(10.0));
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
fn step_down_hands_over_to_a_standby_and_says_so() {
    let setup = Setup::new(
        Cluster::shared(),
        "trap 'echo \"stopped $$\" >> \"$EVENTS\"; exit 0' TERM\nwhile :; do sleep 0.02; done",
    );
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // No leader: nothing to ask.
    assert_eq!(step_down(cluster, id).status.code(), Some(1));
    // A 1 s interval: the old leader stays out for one interval, long enough for the queue
    // head to be granted the lock even on a loaded machine (at 200 ms a stalled standby could
    // miss it, and the old leader took it back: seen once in CI).
    let leader = setup.replica("1s", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    // A lone leader is not asked: nobody could take over, and its COMMAND would only restart.
    let out = step_down(cluster, id);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no standby is there to take over"),
        "{out:?}"
    );
    let standby = setup.replica("1s", &[]);
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
    // It names the new leader as status does: its host and leaderrun's pid.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "stepped down: the new leader is {}, leaderrun pid {} (backend ",
            nix::unistd::gethostname().unwrap().to_string_lossy(),
            standby.pid()
        )),
        "{said}"
    );
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
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // A 3 s interval: the dead standby's wait would stay queued for seconds.
    let leader = setup.replica("3s", &[]);
    scratch.wait_starts(1, secs(10.0));
    let mut standby = setup.replica("3s", &[]);
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
        ("check", "ok"),
        ("fencing token", "ok"),
        ("session", "ok"),
        ("path", "ok"),
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
        "status::doctor_passes_on_a_primary_and_fails_on_a_hot_standby (the standby half)",
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
    // A standby cannot write the token's WAL record: the check is left to the primary's.
    assert!(!text.contains("fencing token"), "{text}");

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
    // A one-shot there says it once: one ERROR line, exit 125.
    let once = leaderrun()
        .args(["--dsn", &standby.dsn(), "--check-interval", INTERVAL])
        .args([
            "--lock-id",
            &unique_lock_id().to_string(),
            "--once",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&once.stderr);
    assert_eq!(once.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.matches("ERROR").count(), 1, "{stderr}");
    assert!(stderr.contains("in recovery"), "{stderr}");
    // So does a `--wait`, which like `--once` did not see the lock held elsewhere: exit 125,
    // not the conflict code (before, 0: "did not lead", while nothing ran anywhere), and
    // COMMAND never ran.
    let waited = leaderrun()
        .args(["--dsn", &standby.dsn(), "--check-interval", INTERVAL])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--wait", "1s", "-E", "3", "--"])
        .arg(&job)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(waited.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("in recovery"), "{stderr}");
    assert!(
        stderr.contains("no check within --wait got an answer about the lock"),
        "{stderr}"
    );
    assert!(scratch.starts().is_empty());
    // `status` there says that what it shows is the standby's own, not the election's: a
    // holder of the key on the standby is no leader (exit 1).
    let id = unique_lock_id();
    let mut holder = standby.psql_session();
    writeln!(
        holder.stdin.as_mut().unwrap(),
        "SELECT pg_advisory_lock({CLASS}, {id});"
    )
    .unwrap();
    wait_for("the standby's own holder", secs(10.0), || {
        (standby.lock_holders(CLASS, id).len() == 1).then_some(())
    });
    let shown = leaderrun()
        .args([
            "status",
            "--dsn",
            &standby.dsn(),
            "--lock-id",
            &id.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.status.code(), Some(1), "{text}");
    assert!(
        text.contains("a hot standby (in recovery): no replica leads here"),
        "{text}"
    );
    assert!(text.contains("not leaderrun"), "{text}");
    let _ = holder.kill();
    let _ = holder.wait();
    let json = leaderrun()
        .args(["status", "--json", "--dsn", &standby.dsn()])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["in_recovery"], true, "{report}");
    // And `step-down` there says where it is instead of "no leader".
    let asked = leaderrun()
        .args(["step-down", "--dsn", &standby.dsn()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&asked.stdout);
    assert_eq!(asked.status.code(), Some(1), "{text}");
    assert!(text.contains("the server is a hot standby"), "{text}");
    let on_primary = leaderrun()
        .args(["status", "--json", "--dsn", &primary.dsn()])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&on_primary.stdout).unwrap();
    assert_eq!(report["in_recovery"], false, "{report}");

    let unreachable = leaderrun()
        .args(["doctor", "--dsn", UNREACHABLE_DSN])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(125));
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
    // The job refuses such settings (125): doctor fails them, and its other checks still run.
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("FAIL  database       no setting names the database, so leaderrun refuses"),
        "{text}"
    );
    assert!(text.contains("ok    exclusion"), "{text}");
    assert!(
        text.contains("hint: advisory locks are per database"),
        "{text}"
    );
    let (code, text) = doctor(&cluster.dsn());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("ok    database       the lock lives in database postgres (from dsn)"),
        "{text}"
    );
    // Every finding's text, and every hint, starts at one column, whatever its check's name
    // (`fencing token` is the longest).
    let checks = [
        "connect",
        "database",
        "version",
        "primary",
        "server",
        "exclusion",
        "check",
        "fencing token",
        "session",
        "path",
        "idle timeout",
        "tls",
        "leader",
    ];
    let mut columns = std::collections::BTreeSet::new();
    for line in text.lines() {
        let rest = &line[6..];
        let name = checks
            .iter()
            .find(|c| rest.starts_with(&format!("{c} ")))
            .map_or(0, |c| c.len());
        let blanks = rest[name..].len() - rest[name..].trim_start().len();
        assert!(blanks >= 2, "{line:?}");
        columns.insert(6 + name + blanks);
    }
    assert_eq!(
        columns.len(),
        1,
        "one column for every finding's text:\n{text}"
    );
}

/// A role that may not run `pg_logical_emit_message` (a DBA revoked it from PUBLIC) could take
/// the lock but not the durable fencing token that goes with a grant: doctor says so, with the
/// GRANT that fixes it, and a replica leads nowhere (its grants fail and free the lock).
#[test]
fn doctor_fails_for_a_role_that_cannot_make_the_fencing_token_durable() {
    let cluster = Cluster::start_private();
    // Every overload, whatever the major calls it (17 added a fourth argument).
    cluster.sql(
        "CREATE ROLE plain LOGIN; \
         DO $$ DECLARE f regprocedure; BEGIN \
           FOR f IN SELECT oid FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP \
             EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); \
           END LOOP; END $$",
    );
    let dsn = cluster.dsn().replace("user=postgres", "user=plain");
    let out = leaderrun()
        .args(["doctor", "--dsn", &dsn])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  fencing token") && text.contains("permission denied"),
        "{text}"
    );
    assert!(
        text.contains("GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message"),
        "{text}"
    );
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL, "--", job.to_str().unwrap()]);
    let replica = Replica::spawn(cmd);
    replica.wait_log(
        "permission denied for function pg_logical_emit_message",
        2,
        secs(10.0),
    );
    assert!(
        replica
            .log()
            .contains("hint: a grant writes its fencing token"),
        "{}",
        replica.log()
    );
    assert!(scratch.starts().is_empty(), "{}", replica.log());
    drop(replica);

    // The hint's GRANT, in the form this major names, is what gives the role back its token.
    let hint = text
        .lines()
        .find(|line| line.contains("GRANT EXECUTE ON FUNCTION"))
        .unwrap();
    let signatures: Vec<&str> = hint
        .match_indices("pg_logical_emit_message(boolean")
        .map(|(at, _)| &hint[at..at + hint[at..].find(')').unwrap() + 1])
        .collect();
    assert_eq!(signatures.len(), 2, "{hint}");
    let exists = |signature: &str| {
        cluster.sql(&format!(
            "SELECT to_regprocedure('{signature}') IS NOT NULL"
        )) == ["t"]
    };
    let signature = signatures
        .iter()
        .find(|s| exists(s))
        .unwrap_or_else(|| panic!("the hint names no signature this server has: {hint}"));
    cluster.sql(&format!("GRANT EXECUTE ON FUNCTION {signature} TO plain"));
    let out = leaderrun()
        .args(["doctor", "--dsn", &dsn])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ok    fencing token"), "{text}");
}

/// On a server whose commits wait for a synchronous standby, a grant waits too (its fencing
/// token is committed as durably as any write there): with that standby down nobody can lead.
/// doctor says so without waiting itself (every later check still answers), a one-shot's error
/// names the setting, and once the server stops waiting the stranded grants end and a
/// one-shot leads again.
#[test]
fn doctor_and_a_one_shot_say_when_a_synchronous_standby_holds_every_grant() {
    let cluster = Cluster::start_private();
    // The test clusters run with synchronous_commit off (on their command line, which only a
    // database's or a role's own setting overrides), and off never waits for a standby.
    cluster.sql("ALTER DATABASE postgres SET synchronous_commit = 'on'");
    cluster.sql("ALTER SYSTEM SET synchronous_standby_names = 'nostandby'");
    cluster.sql("SELECT pg_reload_conf()");
    wait_for("the reload", secs(10.0), || {
        (cluster.sql("SHOW synchronous_standby_names") == ["nostandby"]).then_some(())
    });
    let out = leaderrun()
        .args(["doctor", "--dsn", &cluster.dsn()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  fencing token")
            && text.contains("synchronous_standby_names = 'nostandby'")
            && text.contains("none streams"),
        "{text}"
    );
    for check in ["session", "idle timeout", "tls", "leader"] {
        assert!(text.contains(&format!("ok    {check}")), "{check}: {text}");
    }

    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exit 0");
    let id = unique_lock_id().to_string();
    let once = |what: &str| {
        let out = leaderrun()
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id])
            .args(["--check-interval", INTERVAL, "--once", "--"])
            .arg(&job)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("{what}: {:?}\n{log}", out.status);
        (out.status.code(), log)
    };
    let (code, log) = once("waiting for the standby");
    assert_eq!(code, Some(125), "{log}");
    assert!(
        log.contains("try advisory lock timed out after 200ms")
            && log.contains("synchronous_standby_names = 'nostandby'"),
        "{log}"
    );
    assert!(scratch.starts().is_empty());
    // A replica's own try times out the same way, and the grant the server keeps for it is
    // what its next try meets: it says that holder is itself.
    let own = unique_lock_id();
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &own.to_string()])
        .args(["--check-interval", INTERVAL, "--"])
        .arg(&job);
    let replica = Replica::spawn(cmd);
    replica.wait_log("this process's own session", 1, secs(10.0));
    assert!(
        replica
            .log()
            .contains(&format!("(pid {}), backend", replica.pid())),
        "{}",
        replica.log()
    );
    drop(replica);

    // The server stops waiting: the grant it held for a client long gone commits, that
    // backend ends, and the lock is free again.
    cluster.sql("ALTER SYSTEM RESET synchronous_standby_names");
    cluster.sql("SELECT pg_reload_conf()");
    wait_for("the stranded grant to end", secs(10.0), || {
        (cluster.lock_holders(CLASS, id.parse().unwrap()).is_empty()).then_some(())
    });
    let (code, log) = once("after the reset");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(scratch.starts().len(), 1, "{log}");
}

/// `status`, `step-down` and `doctor` bound their own statements on the server, as the replicas
/// pin their timers: a role whose defaults are a `statement_timeout` and a `lock_timeout` of
/// 1 ms and an `idle_session_timeout`, an `idle_in_transaction_session_timeout` and a
/// `transaction_timeout` of 300 ms fails none of them (before, each failed on its first query
/// while the replicas led).
#[test]
fn status_step_down_and_doctor_outlast_a_role_default_of_one_millisecond() {
    let cluster = Cluster::start_private();
    cluster.sql(
        "CREATE ROLE hasty LOGIN SUPERUSER; ALTER ROLE hasty SET statement_timeout = 1; \
         ALTER ROLE hasty SET lock_timeout = 1",
    );
    // And sessions idle for 300 ms end (PostgreSQL 14 and later): `step-down` looks at the
    // standbys twice, 0.75 s apart.
    if crate::support::cluster::server_major() >= 14 {
        cluster.sql("ALTER ROLE hasty SET idle_session_timeout = 300");
    }
    // `status` and `step-down` run in a transaction (its timers `LOCAL`, so that none stays
    // on a pooler's server connection): one idle in it, or older, for 300 ms would end too.
    cluster.sql("ALTER ROLE hasty SET idle_in_transaction_session_timeout = 300");
    if crate::support::cluster::server_major() >= 17 {
        cluster.sql("ALTER ROLE hasty SET transaction_timeout = 300");
    }
    let dsn = format!(
        "host=127.0.0.1 port={} user=hasty dbname=postgres",
        cluster.addr().port()
    );
    // The default is in force for the role: a statement of 10 ms is cancelled.
    let sleep = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &dsn, "-c", "SELECT pg_sleep(0.01)"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sleep.stderr).contains("statement timeout"),
        "{sleep:?}"
    );
    let id = unique_lock_id().to_string();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let replica = || {
        let mut cmd = leaderrun();
        cmd.args([
            "--dsn",
            &dsn,
            "--lock-id",
            &id,
            "--check-interval",
            "1s",
            "--",
        ])
        .arg(&script);
        Replica::spawn(cmd)
    };
    let _leader = replica();
    scratch.wait_starts(1, secs(10.0));
    let _standby = replica();
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id.parse().unwrap()) == 1).then_some(())
    });
    let tool = |args: &[&str]| crate::support::run_tool(&dsn, &id, args);
    let (code, text) = tool(&["status"]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = tool(&["doctor"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    let (code, text) = tool(&["step-down"]);
    assert_eq!(code, Some(0), "{text}");
    scratch.wait_starts(2, secs(10.0));
}

/// A server that accepts every connection on 127.0.0.1 and never answers: a subcommand given
/// it waits in its connect for as long as `connect_timeout` lets it. Counts the connections
/// it accepted, so a test knows when the subcommand got there.
struct Mute {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Mute {
    fn start() -> Mute {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            // Kept open (never read, never written) until the test process ends.
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                held.push(stream);
                count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        });
        Mute { port, accepted }
    }

    fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=30",
            self.port
        )
    }

    fn wait_connected(&self, who: &str) {
        wait_for(&format!("{who} to connect"), secs(10.0), || {
            (self.accepted.load(std::sync::atomic::Ordering::Acquire) > 0).then_some(())
        });
    }
}

/// `status`, `doctor` and `step-down` end at once on INT or TERM, even while a connect waits
/// on a server that never answers: each dies of the signal (a shell sees 128 + N), prints
/// nothing and logs one line. HUP, USR1 and WINCH, sent first, do not end them (as standard
/// signals pending together are delivered lowest number first, a subcommand that ended on
/// HUP would say SIGHUP).
#[test]
fn status_doctor_and_step_down_end_at_once_on_int_or_term() {
    use std::os::unix::process::ExitStatusExt;
    let cases = [
        ("status", Signal::SIGINT),
        ("doctor", Signal::SIGTERM),
        ("step-down", Signal::SIGINT),
    ];
    let mut running = Vec::new();
    for (sub, sig) in cases {
        let mute = Mute::start();
        let mut cmd = leaderrun();
        cmd.args([sub, "--dsn", &mute.dsn(), "--lock-id", "7"]);
        let replica = Replica::spawn(cmd);
        mute.wait_connected(sub);
        running.push((sub, sig, replica, mute));
    }
    for (_, _, replica, _) in &running {
        for other in [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGWINCH] {
            replica.signal(other);
        }
    }
    for (sub, sig, mut replica, _mute) in running {
        let sent = std::time::Instant::now();
        replica.signal(sig);
        let status = replica.wait_exit(secs(2.0));
        let log = replica.log();
        assert!(sent.elapsed() < secs(2.0), "{sub}: {log}");
        assert_eq!(
            status.signal(),
            Some(sig as i32),
            "{sub}: {status:?}\n{log}"
        );
        assert_eq!(replica.stdout(), "", "{sub} printed something\n{log}");
        assert!(
            log.contains(&format!("{sub}: interrupted by {}", sig.as_str())),
            "{sub}: {log}"
        );
        assert!(!log.contains("SIGHUP"), "{sub}: {log}");
        if sub == "step-down" {
            assert!(
                log.contains("step-down: the leader was not asked to step down"),
                "{log}"
            );
        }
    }
}

/// A `step-down` interrupted before it took the step-down request leaves the leader alone:
/// the request is never held, the leader goes on leading with the same COMMAND, and the log
/// says it was not asked. The interruption comes while it looks at the standbys a second time
/// (README: twice, 0.75 s apart), behind a proxy that blackholes itself once it forwarded the
/// first look's answer, with a standby there that could take over.
#[test]
fn step_down_interrupted_before_it_asks_leaves_the_leader_leading() {
    use std::os::unix::process::ExitStatusExt;
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let leader = setup.replica("300ms", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    let _standby = setup.replica("300ms", &[]);
    wait_for("the standby in the lock queue", secs(10.0), || {
        (cluster.waiters(id) == 1).then_some(())
    });
    let holders = cluster.lock_holders(CLASS, id);
    assert_eq!(holders.len(), 1, "{holders:?}");

    // The first look names the leader's session; the ask can come only after the second,
    // which the proxy, blackholed by its own thread right after the first answer, holds.
    let leader_name = format!("leaderrun@{}:{}", hostname(), leader.pid());
    let proxy =
        crate::support::proxy::Proxy::blackholing_after(cluster.addr(), leader_name.as_bytes());
    let mut cmd = leaderrun();
    cmd.args([
        "step-down",
        "--dsn",
        &proxy.dsn(),
        "--lock-id",
        &id.to_string(),
    ]);
    let mut step_down = Replica::spawn(cmd);
    wait_for("step-down's first look at the lock", secs(10.0), || {
        proxy.is_blackholed().then_some(())
    });
    let request = |cluster: &Cluster| {
        cluster.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid = ({CLASS}::bigint & 4294967295)::text::oid \
             AND objid = ({id}::bigint & 4294967295)::text::oid"
        ))
    };
    assert_eq!(request(cluster), ["0"], "the request was taken already");

    let sent = std::time::Instant::now();
    step_down.signal(Signal::SIGINT);
    let status = step_down.wait_exit(secs(2.0));
    let log = step_down.log();
    assert!(sent.elapsed() < secs(2.0), "{log}");
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{log}");
    assert_eq!(step_down.stdout(), "", "{log}");
    assert!(log.contains("step-down: interrupted by SIGINT"), "{log}");
    assert!(
        log.contains("step-down: the leader was not asked to step down"),
        "{log}"
    );
    proxy.cut();

    // Over several of the leader's checks: never asked, it leads on with the same COMMAND.
    let watched = std::time::Instant::now();
    while watched.elapsed() < secs(1.5) {
        assert_eq!(request(cluster), ["0"]);
        assert_eq!(cluster.lock_holders(CLASS, id), holders);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!leader.log().contains("stepping down"), "{}", leader.log());
    assert_eq!(scratch.starts().len(), 1);
    assert!(crate::support::alive(first.pid));
}

/// Output that cannot be written (stdout on a full disk: `/dev/full`) is a failure of
/// leaderrun's own, exit 125 with the reason on stderr: `status` and `doctor` exit with what
/// they found, and 0 ("a leader holds the lock", "all checks passed") must not stand for a
/// report nobody got. Before, every one of them exited 0. A reader that went away (`| head`)
/// is no failure: it read what it wanted. `step-down` says it too, with its outcome's status.
#[test]
fn output_that_cannot_be_written_is_a_failure_but_a_reader_gone_is_not() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let dsn = cluster.dsn();
    for args in [
        &["status", "--dsn", &dsn, "--lock-id", &id][..],
        &["status", "--json", "--dsn", &dsn, "--lock-id", &id],
        &["doctor", "--dsn", &dsn, "--lock-id", &id],
        &["--help"],
        &["--version"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = leaderrun().args(args).stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot write to stdout"),
            "{args:?}: {stderr}"
        );
        // The same with a reader that reads nothing and leaves.
        let mut child = leaderrun()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_ne!(out.status.code(), Some(125), "{args:?}: {out:?}");
    }
    // `step-down` says so too, but its status stays the outcome's (here 1, no leader): a
    // script that read 125 after a hand-over would ask again, of the new leader. Before, the
    // lost line went unsaid.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = leaderrun()
        .args(["step-down", "--dsn", &dsn, "--lock-id", &id])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write to stdout"), "{stderr}");
}

/// A stdout its parent left non-blocking (`O_NONBLOCK` on a pipe, as Node.js and Go parents
/// leave one) that is full when leaderrun writes is waited for as a blocking one: the output
/// arrives whole once the reader drains the pipe, and the exit status is the command's.
/// Before, the write failed with EAGAIN, and `status`, `doctor`, `--help` and `--version`
/// exited 125 ("cannot write to stdout: Resource temporarily unavailable") with their output
/// lost; `step-down` said so too.
#[test]
fn a_full_non_blocking_stdout_is_waited_for_as_a_blocking_one() {
    use std::io::Read;
    use std::process::Stdio;
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let dsn = cluster.dsn();
    for args in [
        &["status", "--dsn", &dsn, "--lock-id", &id][..],
        &["status", "--json", "--dsn", &dsn, "--lock-id", &id],
        &["doctor", "--dsn", &dsn, "--lock-id", &id],
        &["step-down", "--dsn", &dsn, "--lock-id", &id],
        &["--help"],
        &["--version"],
    ] {
        // What a blocking stdout gets.
        let want = leaderrun().args(args).output().unwrap();
        assert!(want.stdout.ends_with(b"\n"), "{args:?}: {want:?}");
        // A pipe whose write end is non-blocking, filled to the brim. Close-on-exec: a
        // concurrent test's child must not hold it open.
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        nix::fcntl::fcntl(
            &write_end,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let mut filled = 0;
        for chunk in [&[b'x'; 4096][..], b"x"] {
            while let Ok(n) = nix::unistd::write(&write_end, chunk) {
                filled += n;
            }
        }
        let mut child = leaderrun()
            .args(args)
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Until it met the full pipe: exited (EAGAIN taken for an error) or waiting for the
        // pipe to take bytes (an untimed poll of one descriptor). Where the system call cannot
        // be read (no ptrace access to the child), nothing tells the wait from the run.
        let readable = wait_for(
            &format!("{args:?} to meet the full pipe"),
            secs(10.0),
            || {
                if child.try_wait().unwrap().is_some() {
                    return Some(true);
                }
                match waits_in_untimed_poll(pid) {
                    None => Some(false),
                    Some(true) => Some(true),
                    Some(false) => None,
                }
            },
        );
        if !readable {
            let _ = child.kill();
            let _ = child.wait();
            return crate::support::cluster::skip(
                "status::a_full_non_blocking_stdout_is_waited_for_as_a_blocking_one",
                "/proc/PID/syscall cannot be read here",
            );
        }
        let mut got = Vec::new();
        std::fs::File::from(read_end).read_to_end(&mut got).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), want.status.code(), "{args:?}: {stderr}");
        assert!(!stderr.contains("cannot write"), "{args:?}: {stderr}");
        assert!(got[..filled].iter().all(|&b| b == b'x'));
        let got = String::from_utf8_lossy(&got[filled..]).into_owned();
        let want_text = String::from_utf8_lossy(&want.stdout);
        if args[0].starts_with("--") {
            assert_eq!(got, want_text, "{args:?}");
        } else {
            // The same report (a leader's timings aside: there is none), whole.
            assert_eq!(got.lines().count(), want_text.lines().count(), "{got}");
            assert!(got.ends_with('\n'), "{args:?}: {got:?}");
        }
    }
}

/// Whether `pid`'s main thread waits in `poll` (or `ppoll`) on one descriptor without a
/// timeout, as leaderrun waits for a full stdout to take bytes again (`/proc/PID/syscall`:
/// the call's number, then its arguments).
fn waits_in_untimed_poll(pid: i32) -> Option<bool> {
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    Some(in_untimed_poll(&syscall))
}

/// Whether a `/proc/PID/syscall` line shows an untimed `poll` (or `ppoll`) of one descriptor.
fn in_untimed_poll(syscall: &str) -> bool {
    let fields: Vec<u64> = syscall
        .split_whitespace()
        .map(|f| match f.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => f.parse(),
        })
        .map_while(Result::ok)
        .collect();
    let [number, _, descriptors, timeout, ..] = fields[..] else {
        return false;
    };
    if descriptors != 1 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if number == libc::SYS_poll as u64 {
        return timeout as u32 as i32 == -1;
    }
    // ppoll's timeout is a pointer: none is no timeout.
    number == libc::SYS_ppoll as u64 && timeout == 0
}

/// `status`, `doctor` and `step-down` typed into the environment of a job configured by its
/// variables (`docker exec`, `kubectl exec`, a unit's `Environment=`) work: the run's settings
/// there (`LEADERRUN_EVERY`, `LEADERRUN_HISTORY`, …) are not theirs and are left aside, where
/// before every one of them was refused with exit 125. Typed on their command line, a run's
/// option is still refused.
#[test]
fn status_doctor_and_step_down_leave_a_runs_settings_in_the_environment_aside() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let runs_environment = [
        ("LEADERRUN_ONCE", "1"),
        ("LEADERRUN_EVERY", "5m"),
        ("LEADERRUN_TICK_AT_GRANT", "true"),
        ("LEADERRUN_TIMEOUT", "1m"),
        ("LEADERRUN_GRACE", "3s"),
        ("LEADERRUN_TAKEOVER_DELAY", "1s"),
        ("LEADERRUN_HTTP_ADDR", "127.0.0.1:1"),
        ("LEADERRUN_HISTORY", "1"),
        ("LEADERRUN_HISTORY_KEEP", "90d"),
        // Not read at all: values the run would refuse (a unit's typo) fail none of them.
        ("LEADERRUN_EVERY", "5 parsecs"),
        ("LEADERRUN_RESTART", "sometimes"),
        ("LEADERRUN_HTTP_ADDR", "nowhere"),
    ];
    let not_utf8 = std::ffi::OsString::from_vec(b"5m\xff".to_vec());
    let runs_environment = runs_environment
        .into_iter()
        .map(|(name, value)| (name, std::ffi::OsString::from(value)))
        .chain([("LEADERRUN_TIMEOUT", not_utf8.clone())]);
    for (name, value) in runs_environment {
        for (tool, want) in [("status", 1), ("doctor", 0), ("step-down", 1)] {
            let out = leaderrun()
                .env(name, &value)
                .args(["--dsn", &cluster.dsn(), "--lock-id", &id, tool])
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(want),
                "{tool} with {name}={value:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // A run reads them, a COMMAND named like a subcommand included.
    let run = leaderrun()
        .env("LEADERRUN_TIMEOUT", &not_utf8)
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id,
            "--once",
            "--",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&run.stderr).contains("LEADERRUN_TIMEOUT"));
    let typed = leaderrun()
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id])
        .args(["status", "--every", "5m"])
        .output()
        .unwrap();
    assert_eq!(typed.status.code(), Some(125));
    let typed = leaderrun()
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--every", "5m"])
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(typed.status.code(), Some(125));
}

/// `doctor` opens its two sessions at once and binds each as soon as it is ready, so a role's
/// `idle_session_timeout` shorter than a connect does not end the first while the second
/// connects. Before, the first waited idle through the second's whole connect: behind a first
/// host that accepts and never answers (a hung old primary: one `connect_timeout` per
/// session), a role's 500 ms ended it, and `doctor` failed its `connect` finding while the
/// replicas, whose sessions pin their timers at once, led.
#[test]
fn doctor_outlasts_a_roles_idle_session_timeout_behind_a_hung_first_host() {
    let test = "doctor_outlasts_a_roles_idle_session_timeout_behind_a_hung_first_host";
    if !crate::support::cluster::has_idle_session_timeout(test, "the role's timeout is that") {
        return;
    }
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let role = format!("idler{}", id.unsigned_abs());
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN; ALTER ROLE {role} SET idle_session_timeout = 500"
    ));
    // Accepts connections (the kernel's backlog) and never answers: each session's attempt
    // there ends after connect_timeout, 2 s, and the next host is tried.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user={role} dbname=postgres connect_timeout=2",
        hung.local_addr().unwrap().port(),
        cluster.addr().port()
    );
    let (code, text) = crate::support::run_tool(&dsn, &id.to_string(), &["doctor"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    connect"), "{text}");
    drop(hung);
}

/// `track_activities = off` for the replicas' role: `pg_stat_activity` shows none of their
/// statements (`state` is `disabled`), so the leader's term, since and fencing token cannot be
/// read, nor a standby that is not in line be found. `status` says so (`activity_tracked`,
/// `untracked_sessions`, and a line each in the table) instead of showing bare unknowns.
#[test]
fn status_says_when_the_leaders_activity_is_not_tracked() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let role = format!("untracked_{id}");
    cluster.sql(&format!(
        "CREATE ROLE {role} LOGIN SUPERUSER; ALTER ROLE {role} SET track_activities = off"
    ));
    let dsn = format!("{} user={role}", cluster.dsn());
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let replica = || {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()])
            .args(["--check-interval", INTERVAL, "--"])
            .arg(&job);
        Replica::spawn(cmd)
    };
    let leader = replica();
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    // Two in line (found by pg_locks), one that tries every interval (found only by its
    // statement, which is not shown).
    let _standbys: Vec<Replica> = (0..3).map(|_| replica()).collect();
    let report = wait_for(
        "two standbys in line and one more session",
        secs(10.0),
        || {
            let out = status(cluster, id, true);
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            (report["waiters"].as_array()?.len() == 2 && report["untracked_sessions"] == 1)
                .then_some(report)
        },
    );
    let l = &report["leader"];
    assert_eq!(l["pid"], start.backend_pid, "{report}");
    assert_eq!(l["activity_tracked"], false, "{report}");
    // Its application_name still names it; its statements, with the term, are not shown.
    assert_eq!(l["host"], hostname().as_str(), "{report}");
    assert_eq!(l["leaderrun_pid"], leader.pid(), "{report}");
    assert!(
        l["term"].is_null() && l["fencing_token"].is_null(),
        "{report}"
    );
    assert_eq!(report["standbys"].as_array().unwrap().len(), 2, "{report}");
    let out = status(cluster, id, false);
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8(out.stdout).unwrap();
    for line in [
        "activity       not tracked: track_activities is off for the leader's session",
        "untracked      1 other session of this database has track_activities off: a standby \
         among them that is not in line is not listed",
    ] {
        assert!(table.contains(line), "{line:?} not in\n{table}");
    }
    // Renamed as well: nothing tells whether it is leaderrun, and step-down says so rather
    // than that it is not.
    let id = unique_lock_id();
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &format!("{dsn} application_name=nightly")])
        .args([
            "--lock-id",
            &id.to_string(),
            "--check-interval",
            INTERVAL,
            "--",
        ])
        .arg(&job);
    let _renamed = Replica::spawn(cmd);
    scratch.wait_starts(2, secs(10.0));
    let out = leaderrun()
        .args([
            "step-down",
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id.to_string(),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "whether the holder is leaderrun cannot be told (nightly, and track_activities is off"
        ),
        "{said}"
    );
}

/// `doctor` whose two sessions reach two servers (a host list of separate servers with
/// `load_balance_hosts=random`, or a first host that comes and goes) fails its `server`
/// finding: replicas with such settings may each lead on a server of their own, and the
/// exclusion finding then passed or failed by chance (blaming a pooler when it failed). Here a
/// relay sends the first connection to one cluster and every later one to another.
#[test]
fn doctor_fails_when_its_two_sessions_reach_two_servers() {
    let (first, second) = (Cluster::shared(), Cluster::start_private());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let targets = [first.addr(), second.addr()];
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let Ok(server) = std::net::TcpStream::connect(targets[n.min(1)]) else {
                return;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    let dsn = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let out = leaderrun()
        .args([
            "doctor",
            "--dsn",
            &dsn,
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL  server") && l.contains("reached different servers")),
        "{text}"
    );
    // Both sessions on one server: the finding passes.
    let out = leaderrun()
        .args([
            "doctor",
            "--dsn",
            &first.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok    server") && l.contains("same server")),
        "{text}"
    );
}

/// A leader of `setup` started, then a standby queued behind it, both checking every
/// `interval`.
fn leader_and_standby(setup: &Setup, interval: &str) -> (Replica, Replica) {
    let leader = setup.replica(interval, &[]);
    setup.scratch.wait_starts(1, secs(10.0));
    let standby = setup.replica(interval, &[]);
    wait_for("the standby in the lock queue", secs(15.0), || {
        (setup.cluster.waiters(setup.id) == 1).then_some(())
    });
    (leader, standby)
}

/// `status`, `doctor` and `step-down` through a transaction-mode pooler (PgBouncer with one
/// server connection, which it hands every client in turn) leave that connection as they found
/// it for its next client. Before, each left its timers there (`statement_timeout` and
/// `lock_timeout` of its bound, which then cancelled another application's statements), every
/// statement prepared under a name (which another client's statement of that name then met),
/// and `doctor` its scratch key, granted twice on the one backend and given back once. Each
/// now runs in transactions of its own, with `LOCAL` timers and unnamed statements; a grant is
/// given back on the backend it was granted on; and the pooler keeps its connection (nothing
/// left in a transaction for it to close).
#[test]
fn status_doctor_and_step_down_through_a_transaction_pooler_leave_its_connection_as_found() {
    use crate::support::pooler::Bouncer;
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    let (_leader, standby) = leader_and_standby(&setup, "300ms");
    let bouncer = Bouncer::start(cluster, "transaction", 1);
    let state = || {
        bouncer.sql(
            cluster,
            "SELECT pg_backend_pid(), current_setting('statement_timeout'), \
             current_setting('lock_timeout'), current_setting('jit'), \
             current_setting('exit_on_error'), current_setting('default_transaction_deferrable'), \
             (SELECT count(*) FROM pg_prepared_statements)",
        )
    };
    let before = state();
    let backend: i32 = before.split('|').next().unwrap().parse().unwrap();
    assert!(before.ends_with("|0"), "{before}");
    let held_by_pooler = || {
        cluster.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = {backend}"
        ))
    };
    let tool = |args: &[&str]| crate::support::run_tool(&bouncer.dsn(), &id.to_string(), args);

    let (code, text) = tool(&["status"]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(state(), before, "after status: {text}");

    // Both of doctor's sessions reach the one backend: its exclusion check says so.
    let (code, text) = tool(&["doctor"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL  exclusion"), "{text}");
    assert!(text.contains("transaction-mode"), "{text}");
    // And the replicas' own test of the path, which needs no luck: not direct.
    assert!(
        text.contains("warn  path           a proxy or a pooler sits between"),
        "{text}"
    );
    assert_eq!(state(), before, "after doctor: {text}");
    assert_eq!(held_by_pooler(), vec!["0"], "after doctor: {text}");

    let (code, text) = tool(&["step-down"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("stepped down"), "{text}");
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_eq!(second.ppid, standby.pid());
    assert_eq!(state(), before, "after step-down: {text}");
    assert_eq!(held_by_pooler(), vec!["0"], "after step-down: {text}");
}

/// A `step-down` through a transaction-mode pooler whose statement fails after it took the
/// request (here each is cancelled, as a canceller of long transactions would) must not leave
/// the request held. Before, it ended its transaction with `COMMIT` and closed cleanly: the
/// pooler kept the server connection, request and all, and every leader stepped down again
/// at its next check until a DBA terminated that backend (a tester's find). Now an error
/// leaves the transaction to the connection's close, on which PgBouncer closes that server
/// connection.
#[test]
fn a_step_down_that_fails_through_a_transaction_pooler_leaves_no_request_held() {
    use crate::support::pooler::Bouncer;
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (cluster, id) = (setup.cluster, setup.id);
    // Long intervals: the leader looks at the request seconds later, and step-down waits.
    let _replicas = leader_and_standby(&setup, "5s");
    let bouncer = Bouncer::start(cluster, "transaction", 1);
    // The pool's one server connection, which step-down is handed.
    let pooled: i32 = bouncer
        .sql(cluster, "SELECT pg_backend_pid()")
        .parse()
        .unwrap();
    let mut step_down = leaderrun()
        .args([
            "--dsn",
            &bouncer.dsn(),
            "--lock-id",
            &id.to_string(),
            "step-down",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The request: a lock of one int8 key (objsubid 1) on that backend.
    let requests = || {
        cluster.sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND granted AND pid = {pooled}"
        ))
    };
    wait_for("step-down to take the request", secs(10.0), || {
        (requests() == ["1"]).then_some(())
    });
    // Its statements are cancelled as they run, until it gives up.
    let mut canceller = std::process::Command::new(cluster.psql_path())
        .args(["-X", "-q", "-d", &cluster.dsn(), "-c"])
        .arg(format!(
            "SET statement_timeout = '20s'; DO $$ BEGIN LOOP \
             PERFORM pg_cancel_backend(pid) FROM pg_stat_activity \
             WHERE pid = {pooled} AND state = 'active'; \
             PERFORM pg_stat_clear_snapshot(); END LOOP; END $$"
        ))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_for("step-down to give up", secs(15.0), || {
        step_down.try_wait().unwrap()
    });
    let _ = canceller.kill();
    let _ = canceller.wait();
    let out = step_down.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status.code(), Some(125), "{said}");
    assert!(said.contains("due to user request"), "{said}");
    wait_for("the request to be freed", secs(10.0), || {
        (requests() == ["0"]).then_some(())
    });
}

/// A synchronous standby that streams and then stops answering (here `pg_receivewal
/// --synchronous`, frozen) holds every commit, a grant's fencing token's too: no replica can
/// lead, and doctor's fencing token check must fail with the wait. The token's statement
/// writes its WAL record, and the wait is its commit's: when doctor first sent each statement
/// in a transaction of its own, it did not look at the commit's answer, and said `ok` (a
/// reviewer's find).
#[test]
fn doctor_fails_the_fencing_token_while_a_frozen_synchronous_standby_holds_commits() {
    use crate::support::cluster::{client_tool, server_major, skip};
    let test =
        "status::doctor_fails_the_fencing_token_while_a_frozen_synchronous_standby_holds_commits";
    let Some(receivewal) = client_tool("pg_receivewal", server_major()) else {
        skip(test, "needs pg_receivewal of the server's major or later");
        return;
    };
    let cluster = Cluster::start_private();
    // The test clusters run with synchronous_commit off (on their command line, which only a
    // database's or a role's own setting overrides), and off never waits for a standby.
    cluster.sql("ALTER DATABASE postgres SET synchronous_commit = 'on'");
    cluster.sql("ALTER SYSTEM SET synchronous_standby_names = 'pg_receivewal'");
    cluster.sql("SELECT pg_reload_conf()");
    let wal = tempfile::tempdir().unwrap();
    let mut standby = std::process::Command::new(receivewal)
        .args(["-h", "127.0.0.1", "-p", &cluster.addr().port().to_string()])
        .args(["-U", "postgres", "--synchronous", "--no-loop", "-D"])
        .arg(wal.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "pg_receivewal to stream as the synchronous standby",
        secs(10.0),
        || {
            (cluster.sql(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pg_receivewal'",
        ) == ["sync"])
            .then_some(())
        },
    );
    let pid = nix::unistd::Pid::from_raw(standby.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let out = leaderrun()
        .args(["doctor", "--dsn", &cluster.dsn(), "--check-interval", "1s"])
        .output()
        .unwrap();
    let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
    let _ = standby.kill();
    let _ = standby.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  fencing token  doctor query timed out after 1s"),
        "{text}"
    );
    assert!(
        text.contains("synchronous_standby_names = 'pg_receivewal'"),
        "{text}"
    );
    // The checks after it still answered.
    for check in ["session", "path", "tls", "leader"] {
        assert!(text.contains(&format!("ok    {check}")), "{check}: {text}");
    }
}

/// `doctor` through a session-mode pooler whose pool has one server connection: its second
/// session never gets one, and its statements time out. The timeouts' hints name the pooler's
/// pool (before, they sent an operator to the server's disk: a tester's find).
#[test]
fn doctor_through_a_pool_with_no_connection_for_its_second_session_says_so() {
    use crate::support::pooler::Bouncer;
    let bouncer = Bouncer::start(Cluster::shared(), "session", 1);
    let out = leaderrun()
        .args([
            "doctor",
            "--dsn",
            &bouncer.dsn(),
            "--check-interval",
            "500ms",
        ])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("warn  path"), "{text}");
    assert!(text.contains("timed out after 500ms"), "{text}");
    assert!(
        text.contains("if a pooler sits between (see path), one with no server connection free"),
        "{text}"
    );
}
