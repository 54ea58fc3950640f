//! What leaderrun writes, through the binary against a real PostgreSQL: JSON log lines and
//! their fields, the start line, hints for common slips, a standby naming the lock's holder,
//! quiet one-shots, a failure printed once, password hints, a password that appears
//! nowhere, and a server's huge error shown cut (against a fake server).

use std::net::SocketAddr;

use nix::sys::signal::Signal;

use crate::support::{
    holder_lines, hostname, http, leaderrun, metrics, probe_addr, secs, unique_lock_id, wait_for,
    Cluster, Replica, Scratch, Setup, INTERVAL, UNREACHABLE_DSN,
};

/// `leaderrun_checks_total{outcome="refused"}` of a replica.
fn refusals(addr: SocketAddr) -> u64 {
    metrics(addr)
        .lines()
        .find(|l| l.starts_with("leaderrun_checks_total{outcome=\"refused\"}"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[test]
fn json_log_lines_parse_and_carry_fields() {
    let setup = Setup::new(Cluster::shared(), "exit 0");
    let mut replica = setup.replica(INTERVAL, &["--log-format", "json"]);
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let lines: Vec<serde_json::Value> = replica
        .log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 4);
    for line in &lines {
        assert!(
            line["timestamp"].is_string()
                && line["level"].is_string()
                && line["message"].is_string(),
            "{line}"
        );
    }
    let acquired = lines
        .iter()
        .find(|l| l["message"] == "background leader lock acquired")
        .expect("acquisition line");
    assert_eq!(acquired["level"], "INFO");
    assert!(acquired["term"].is_u64() && acquired["backend_pid"].is_i64());
    let exited = lines
        .iter()
        .find(|l| l["message"] == "child exited")
        .unwrap();
    assert_eq!(exited["status"], "exit code 0");
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
    // A socket file nobody listens on (a server that died): psql's words for a socket.
    let stale = Scratch::new();
    let path = stale.path().join(".s.PGSQL.5432");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let dead = format!(
        "host={} user=postgres dbname=postgres",
        stale.path().display()
    );
    let (code, text) = run(&["--dsn", &dead, "--once", "--", "true"]);
    assert_eq!(code, Some(125), "{text}");
    assert!(
        text.contains(
            "hint: is the server running locally and accepting connections on that socket?"
        ),
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

#[test]
fn a_standby_says_who_holds_the_lock_once_and_again_when_the_holder_changes() {
    // A longer interval than the suite's: the test needs one term throughout, and at 200 ms a
    // check that a loaded CI machine delays past its bound ends it (a new term, and rightly a
    // second line).
    let interval = "1s";
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let mut first = setup.replica(interval, &[]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let host = hostname();
    let standbys: Vec<Replica> = setup.replicas(2, interval, &["--http-addr", "127.0.0.1:0"]);
    for standby in &standbys {
        standby.wait_log("the lock is held by", 1, secs(10.0));
        let line = &holder_lines(&standby.log())[0];
        assert!(
            line.contains(&format!(
                "INFO the lock is held by leaderrun on {host} (pid {}), backend {}, leading since ",
                first.pid(),
                start.backend_pid
            )),
            "{line}\nstarts: {:?}\nleader's log:\n{}",
            scratch.starts(),
            first.log()
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

/// Colour sequences only where a terminal shows them: on a terminal stderr, unless `NO_COLOR`
/// is set to something (no-color.org; an empty one is unset) or `TERM` is `dumb` (an editor's
/// shell buffer), as other terminal programs decide. Before, a terminal was enough, and
/// `NO_COLOR=1` or an Emacs shell got escape sequences in every line.
#[test]
fn colours_only_on_a_terminal_that_wants_them() {
    use std::io::Read;
    let dsn = Cluster::shared().dsn();
    let lines_on_a_terminal = |no_color: Option<&str>, term: &str| -> String {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let mut cmd = leaderrun();
        cmd.env("TERM", term).env_remove("NO_COLOR");
        if let Some(value) = no_color {
            cmd.env("NO_COLOR", value);
        }
        let mut child = cmd
            .args(["--dsn", &dsn, "--lock-id"])
            .arg(unique_lock_id().to_string())
            .args(["--", "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(pty.slave))
            .spawn()
            .unwrap();
        // Our copy of the terminal goes, or the reader never sees its end.
        drop(cmd);
        // Drained as it comes: a full terminal would have lines dropped.
        let mut master = std::fs::File::from(pty.master);
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            // EIO once every writer (leaderrun, its watchdog) has closed the terminal.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                out.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&out).into_owned()
        });
        let status = child.wait().unwrap();
        let out = reader.join().unwrap();
        assert_eq!(status.code(), Some(0), "{out}");
        assert!(out.contains("child exited"), "{out}");
        out
    };
    assert!(lines_on_a_terminal(None, "xterm").contains("\x1b["));
    assert!(lines_on_a_terminal(Some(""), "xterm").contains("\x1b["));
    for (no_color, term) in [(Some("1"), "xterm"), (None, "dumb")] {
        let out = lines_on_a_terminal(no_color, term);
        assert!(
            !out.contains('\x1b'),
            "NO_COLOR={no_color:?} TERM={term}: {out:?}"
        );
    }
}

#[test]
fn a_connection_failure_is_printed_once() {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", UNREACHABLE_DSN, "--once", "--", "true"]);
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
    cmd.args(["--dsn", UNREACHABLE_DSN]).args([
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
        "PGPASSFILE",
        "~/.pgpass",
        "~/.pg_service.conf",
    ] {
        assert!(log.contains(needle), "{needle:?} not in {log}");
    }
    // A PGPASSFILE that does not exist is as silent as in libpq: the hint names the password
    // file by every name it may have, not only ~/.pgpass.
    let missing = home.path().join("no-such-passfile");
    let (code, log) = run(&dsn, &[("PGPASSFILE", missing.to_str().unwrap())]);
    assert_eq!(code, Some(125), "{log}");
    assert!(
        log.contains("the password file (passfile= in the DSN, else PGPASSFILE, else ~/.pgpass"),
        "{log}"
    );
    // doctor gives the authentication hint for it, not the generic one.
    let out = leaderrun()
        .env("HOME", home.path())
        .args(["doctor", "--dsn", &dsn])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{text}");
    assert!(
        text.contains("check the role, its password (PGPASSWORD, or the password file")
            && text.contains("pg_hba.conf")
            && !text.contains("check the DSN and the PG* variables"),
        "{text}"
    );
    // PGPASSWORD: quiet.
    let (code, log) = run(&dsn, &[("PGPASSWORD", "s3cret-pw")]);
    assert_eq!((code, log.as_str()), (Some(0), ""));
    // In --dsn, keyword and URL form: it works, with a line that names no password: a WARN
    // at start in the default mode; in a one-shot an INFO, shown at -v, since a one-shot at
    // its default level prints nothing when refused and only what is wrong with the run when
    // it ran (cron mails nothing; the README says where a password belongs).
    let url = format!(
        "postgres://pwuser:s3cret-pw@127.0.0.1:{}/postgres",
        cluster.addr().port()
    );
    let run_with = |dsn: &str, flags: &[&str]| {
        let mut cmd = leaderrun();
        cmd.env("HOME", home.path())
            .args(["--dsn", dsn, "--lock-id", &id])
            .args(flags)
            .args(["--", "true"]);
        let mut replica = Replica::spawn(cmd);
        let code = replica.wait_exit(secs(10.0)).code();
        (code, replica.log())
    };
    for dsn in [format!("{dsn} password=s3cret-pw"), url] {
        let (code, log) = run(&dsn, &[]);
        assert_eq!((code, log.as_str()), (Some(0), ""));
        for (flags, level) in [(&["--once", "-v"][..], "INFO"), (&[][..], "WARN")] {
            let (code, log) = run_with(&dsn, flags);
            assert_eq!(code, Some(0), "{log}");
            assert!(
                log.contains(&format!("{level} the password is written into --dsn"))
                    && log.contains("ps")
                    && log.contains("PGPASSWORD or ~/.pgpass"),
                "{flags:?}: {log}"
            );
            assert!(!log.contains("s3cret"), "{log}");
        }
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
fn the_password_appears_nowhere() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let go = scratch.file("go");
    let job = scratch.child_script(
        "job.sh",
        &format!(
            "env > \"$EVENTS.env\"\nwhile [ ! -e '{}' ]; do sleep 0.02; done",
            go.display()
        ),
    );
    // Trust auth accepts any password; what matters is where it shows up.
    let dsn = format!("{} password=hunter2", cluster.dsn());
    let mut cmd = leaderrun();
    cmd.args(["-vv", "--dsn", &dsn, "--lock-id", &id.to_string()])
        .args(["--http-addr", "127.0.0.1:0", "--", job.to_str().unwrap()]);
    let mut replica = Replica::spawn(cmd);
    let addr = probe_addr(&replica);
    let metrics = http(addr, "GET", "/metrics").1;
    std::fs::write(&go, "").unwrap();
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let mut outputs = vec![replica.log(), metrics];
    for sub in ["status", "doctor"] {
        let out = leaderrun().args([sub, "--dsn", &dsn]).output().unwrap();
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
        outputs.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    // The child's whole environment: leaderrun adds nothing that carries it, and the caller set
    // no PGPASSWORD (`leaderrun()` clears PG*), so the child must not get one either.
    let env = std::fs::read_to_string(scratch.path().join("events.env")).unwrap();
    assert!(
        env.lines().any(|l| l.starts_with("LEADERRUN_TERM=")),
        "not the child's environment:\n{env}"
    );
    assert!(
        !env.lines().any(|l| l.starts_with("PGPASSWORD=")),
        "PGPASSWORD set in the child:\n{env}"
    );
    outputs.push(env);
    for output in &outputs {
        assert!(!output.contains("hunter2"), "password leaked:\n{output}");
    }
    assert!(outputs[0].contains("background leader lock acquired"));
}

/// Whether `line` is one text record: an RFC 3339 timestamp, a level, a message.
fn is_record(line: &str) -> bool {
    let Some((timestamp, rest)) = line.split_once(' ') else {
        return false;
    };
    humantime::parse_rfc3339(timestamp).is_ok()
        && ["TRACE ", "DEBUG ", "INFO ", "WARN ", "ERROR "]
            .iter()
            .any(|level| rest.trim_start().starts_with(level))
}

/// A newline or an ESC in COMMAND's name or in `PGAPPNAME` (text leaderrun does not control)
/// neither splits a text record nor forges one, nor reaches the terminal: each record is one
/// line, its control characters escaped (docs/guarantees.md#observing-a-replica). So are
/// U+2028/U+2029, where some viewers break a line, and the bidirectional controls that make a
/// record display as something else ("Trojan Source"); in the JSON format too, as `\uXXXX`
/// escapes of the same value.
#[test]
fn control_characters_in_fields_and_messages_are_escaped_one_record_per_line() {
    const FORGED: &str = "2026-12-04T00:00:00Z  INFO background leader lock acquired FAKE";
    let check = |log: &str| {
        for line in log.lines() {
            assert!(is_record(line), "not a record: {line:?}\n{log}");
            assert!(!line.starts_with(FORGED), "a forged record:\n{log}");
            assert!(
                !line.contains(['\r', '\t', '\x1b', '\x07', '\u{2028}', '\u{2029}', '\u{202e}']),
                "{line:?}"
            );
        }
    };
    // COMMAND a script whose name carries a record of its own and a colour, PGAPPNAME a
    // newline and a terminal title: the settings line shows both, one line.
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let job = scratch.child_script(&format!("job\n{FORGED}\x1b[31m\u{2029}"), "exit 0");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["-v", "--once", "--"])
        .arg(&job)
        .env("PGAPPNAME", "app\nname\x1b]0;title\x07\t\u{2028}\u{202e}");
    let mut replica = Replica::spawn(cmd);
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let log = replica.log();
    check(&log);
    let settings = log
        .lines()
        .find(|l| l.contains("campaigning for the background leader lock"))
        .unwrap_or_else(|| panic!("no settings line:\n{log}"));
    assert!(
        settings.contains("application_name=app\\nname\\u{1b}]0;title\\u{7}\\t\\u{2028}\\u{202e} "),
        "{settings}"
    );
    assert!(
        settings.contains(&format!("/job\\n{FORGED}\\u{{1b}}[31m\\u{{2029}}")),
        "{settings}"
    );
    // One grant, one record that says so.
    let grants = log
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, rest)| {
            rest.trim_start()
                .starts_with("INFO background leader lock acquired")
        })
        .count();
    assert_eq!(grants, 1, "{log}");
    // A COMMAND that does not exist: the ERROR that names it is one line (tracing-subscriber
    // itself writes an ESC in a message as `\x1b`).
    let out = leaderrun()
        .args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--once", "--"])
        .arg(format!("nonexistent\n{FORGED}\x1b[31m\u{2028}"))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{log}");
    check(&log);
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(
        log.contains(&format!("nonexistent\\n{FORGED}\\x1b[31m\\u{{2028}}")),
        "{log}"
    );
    // The JSON format: the same characters as escapes, the values as they were.
    let appname = "app\u{2028}name\u{202e}";
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--log-format", "json"])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["-v", "--once", "--"])
        .arg(&job)
        .env("PGAPPNAME", appname);
    let mut replica = Replica::spawn(cmd);
    assert_eq!(replica.wait_exit(secs(10.0)).code(), Some(0));
    let log = replica.log();
    assert!(!log.contains(['\u{2028}', '\u{2029}', '\u{202e}']), "{log}");
    let settings: serde_json::Value = log
        .lines()
        .find(|l| l.contains("campaigning for the background leader lock"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .unwrap_or_else(|| panic!("no settings line:\n{log}"));
    assert_eq!(settings["application_name"], appname, "{log}");
    assert!(log.contains("app\\u2028name\\u202e"), "{log}");
    let command = settings["command"].as_str().unwrap_or_default();
    assert!(
        command.ends_with(&format!("job\n{FORGED}\x1b[31m\u{2029}")),
        "{log}"
    );
}

/// A fake "PostgreSQL" on 127.0.0.1 (a wrong port, an odd proxy, a hostile server): it
/// answers each SSLRequest with `N` and each startup packet with a FATAL ErrorResponse
/// (SQLSTATE 28000) whose message is `len` x's, then closes. Serves until dropped.
struct HugeErrorServer {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HugeErrorServer {
    fn start(len: usize) -> HugeErrorServer {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut fields = b"SFATAL\0C28000\0M".to_vec();
        fields.resize(fields.len() + len, b'x');
        fields.extend_from_slice(b"\0\0");
        let mut reply = vec![b'E'];
        reply.extend_from_slice(&((fields.len() + 4) as u32).to_be_bytes());
        reply.extend_from_slice(&fields);
        let reply = std::sync::Arc::new(reply);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                let reply = reply.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    loop {
                        let mut len = [0u8; 4];
                        if stream.read_exact(&mut len).is_err() {
                            return;
                        }
                        let len = u32::from_be_bytes(len) as usize;
                        if !(8..=10_000).contains(&len) {
                            return;
                        }
                        let mut body = vec![0; len - 4];
                        if stream.read_exact(&mut body).is_err() {
                            return;
                        }
                        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
                        // SSLRequest, GSSENCRequest: no.
                        if code == 80_877_103 || code == 80_877_104 {
                            if stream.write_all(b"N").is_err() {
                                return;
                            }
                            continue;
                        }
                        // The startup packet: the error, then the client's end (closing
                        // with its bytes unread would reset the connection).
                        let _ = stream.write_all(&reply);
                        let _ = stream.shutdown(std::net::Shutdown::Write);
                        let mut sink = [0u8; 256];
                        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                        return;
                    }
                });
            }
        });
        HugeErrorServer { port, stop }
    }

    fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for HugeErrorServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A server's error of 5 MB is shown cut, once, in a line of a few kilobytes: its first
/// `MAX_TEXT_BYTES` and how much was left out (docs/guarantees.md#safety-guarantees). In full,
/// each failed try queued a multi-megabyte line, and with stderr stalled the queue of 4096
/// lines grew by ~30 MB/s until the kernel killed the leader.
#[test]
fn a_servers_huge_error_is_cut_in_log_lines_and_in_status() {
    const LEN: usize = 5_000_000;
    let max = leaderrun::error::MAX_TEXT_BYTES;
    let marker = format!(" … ({} more bytes) (SQLSTATE 28000)", LEN - max);
    let server = HugeErrorServer::start(LEN);
    let check = |what: &str, code: Option<i32>, log: &str| {
        assert_eq!(code, Some(125), "{what}: {:.3000}", log);
        assert!(
            log.len() < leaderrun::cli::logging::MAX_LINE_BYTES,
            "{what}: {} bytes of log: {:.3000}",
            log.len(),
            log
        );
        let line = log
            .lines()
            .find(|l| l.contains("SQLSTATE 28000"))
            .unwrap_or_else(|| panic!("{what}: no error line: {log}"));
        assert!(line.contains(&marker), "{what}: {line}");
        assert!(
            line.contains(&format!("db error: {} … (", "x".repeat(max))),
            "{what}: {line}"
        );
        assert!(line.len() < max + 500, "{what}: {} bytes", line.len());
    };

    // --once: the one ERROR line.
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &server.dsn(), "--once", "--", "true"]);
    let mut once = Replica::spawn(cmd);
    let code = once.wait_exit(secs(20.0)).code();
    let log = once.log();
    check("--once", code, &log);
    assert!(
        log.contains("ERROR could not check the lock: connect to host=127.0.0.1"),
        "{log}"
    );

    // The JSON format: the same cut, in a record that parses.
    let mut cmd = leaderrun();
    cmd.args([
        "--dsn",
        &server.dsn(),
        "--log-format",
        "json",
        "--once",
        "--",
        "true",
    ]);
    let mut json = Replica::spawn(cmd);
    let code = json.wait_exit(secs(20.0)).code();
    let log = json.log();
    check("--log-format json", code, &log);
    for line in log.lines() {
        let record: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:.3000}"));
        assert!(record["message"].is_string(), "{line:.3000}");
    }

    // `leaderrun status`: its error on stderr, nothing on stdout.
    let out = leaderrun()
        .args(["status", "--dsn", &server.dsn()])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    check("status", out.status.code(), &log);
    assert!(
        log.contains("status: connect to host=127.0.0.1"),
        "{log:.3000}"
    );
    assert!(out.stdout.len() < 1000, "{}", out.stdout.len());
}

/// The start line shows what every replica of a lock must agree on, so two hosts' lines can be
/// compared: the key and its slots, the exit status of a skip, the history, how the tree is
/// held.
#[test]
fn the_start_line_shows_what_replicas_must_agree_on() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let out = leaderrun()
        .args(["-v", "--once", "--dsn", &cluster.dsn(), "--lock-id", &id])
        .args([
            "--slots",
            "2",
            "-E",
            "75",
            "--history",
            "--history-keep",
            "7d",
        ])
        .args(["--", "true"])
        .output()
        .expect("run leaderrun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("campaigning for"))
        .unwrap_or_else(|| panic!("no start line: {stderr}"));
    // The default mode's line spells --restart's value as the flag does.
    let out = leaderrun()
        .args(["-v", "--dsn", &cluster.dsn(), "--lock-id", &id])
        .args(["--restart", "on-failure", "--", "true"])
        .output()
        .expect("run leaderrun");
    let restarting = String::from_utf8_lossy(&out.stderr);
    assert!(
        restarting.contains("mode=while-leader, restart on-failure "),
        "{restarting}"
    );
    for field in [
        format!("lock=1886156915:{id} "),
        "slots=2 ".to_owned(),
        "conflict_exit_code=75 ".to_owned(),
        "history=leaderrun_runs, keep 7days ".to_owned(),
        "cgroup=false ".to_owned(),
        "pid_namespace=false ".to_owned(),
    ] {
        assert!(line.contains(&field), "{field:?} not in {line}");
    }
}
