//! leaderrun's exit status through the binary (docs/guarantees.md#exit-codes): COMMAND's status
//! passed on, its death by a signal passed on, a stopped leader's 143, usage errors' 125, and
//! a missing or unexecutable COMMAND.

use std::os::unix::process::ExitStatusExt;
use std::time::Instant;

use nix::sys::signal::Signal;

use crate::support::{leaderrun, secs, unique_lock_id, Cluster, Replica, Scratch, Setup, INTERVAL};

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

/// `systemctl stop` sends SIGTERM: a leader whose COMMAND dies of it exits 143 (128 + 15), so
/// the README's unit counts 143 as success; without it the unit shows "failed" after every stop.
#[test]
fn a_stopped_leader_exits_143_and_the_systemd_unit_counts_it_as_success() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let mut leader = setup.replica(INTERVAL, &[]);
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

/// A value that is not UTF-8 text, typed or in an option's variable, is a usage error that
/// names the option (and the variable, in a note), never the value: clap's own message, "invalid
/// UTF-8 was detected in one or more arguments", named neither, and blamed the command line for
/// a variable of the unit's environment. COMMAND's words stay bytes as given.
#[test]
fn a_value_that_is_not_utf8_names_its_option_and_variable() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let bytes = |b: &[u8]| OsStr::from_bytes(b).to_owned();
    let unreachable = "host=127.0.0.1 port=1 dbname=x connect_timeout=1";
    // The arguments, the variable set (and its bytes), the option the error must name.
    type Case = (
        Vec<std::ffi::OsString>,
        Option<(&'static str, &'static [u8])>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            vec!["--once".into(), "--".into(), "true".into()],
            Some(("LEADERRUN_TZ", b"\xff")),
            "'--tz <ZONE>'",
        ),
        (
            vec!["--once".into(), "--".into(), "true".into()],
            Some(("LEADERRUN_DSN", b"host=h password=hunter2\xff")),
            "'--dsn <DSN>'",
        ),
        // A subcommand reads a variable of its own options (a run's it leaves unread).
        (
            vec!["status".into()],
            Some(("LEADERRUN_LOCK_NAME", b"\xfe")),
            "'--lock-name <NAME>'",
        ),
        (
            vec![
                "--once".into(),
                bytes(b"--lock-name=\xff"),
                "--".into(),
                "true".into(),
            ],
            None,
            "'--lock-name <NAME>'",
        ),
        (
            vec!["-ns".into(), bytes(b"\xff"), "--".into(), "true".into()],
            None,
            "'--stop-signal <SIG>'",
        ),
        (
            vec!["doctor".into(), "--scratch-id".into(), bytes(b"\xff")],
            None,
            "'--scratch-id <ID>'",
        ),
    ];
    for (args, var, option) in cases {
        let mut cmd = leaderrun();
        cmd.env("PGHOST", "127.0.0.1").env("PGPORT", "1");
        if let Some((name, value)) = var {
            cmd.env(name, OsStr::from_bytes(value));
        }
        let out = cmd.args(&args).output().expect("run leaderrun");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?} {var:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert_eq!(
            first,
            format!("error: invalid value for {option}: not UTF-8 text"),
            "{args:?} {var:?}: {stderr}"
        );
        if let Some((name, _)) = var {
            assert!(
                stderr.contains(&format!("set by {name} in the environment")),
                "{stderr}"
            );
        }
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    // A flag wins over its variable, whatever bytes the variable holds; COMMAND's words and
    // -c's script are bytes as given.
    for (var, args) in [
        (
            Some("LEADERRUN_STOP_SIGNAL"),
            vec![
                "--stop-signal".into(),
                "INT".into(),
                "--".into(),
                "true".into(),
                bytes(b"\xff"),
            ],
        ),
        (None, vec!["-c".into(), bytes(b"true \xff")]),
    ] {
        let mut cmd = leaderrun();
        if let Some(name) = var {
            cmd.env(name, OsStr::from_bytes(b"\xff"));
        }
        let out = cmd
            .args(["--once", "--dsn", unreachable])
            .args(&args)
            .output()
            .expect("run leaderrun");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(
            stderr.contains("could not check the lock"),
            "{args:?}: {stderr}"
        );
    }
}

/// An empty `LEADERRUN_*` variable is no setting, for every option as for the DSN (a compose
/// file's `LEADERRUN_SCHEDULE=${SCHEDULE:-}`): with every one of them empty, a one-shot runs as
/// without them (before, an empty duration failed its parse and an empty `LEADERRUN_SCHEDULE`
/// conflicted with `--once`), and COMMAND still gets them, empty, as the caller passed them.
#[test]
fn an_empty_variable_is_no_setting() {
    let cluster = Cluster::shared();
    let vars: Vec<String> = leaderrun::cli::command()
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    assert!(
        vars.iter().any(|v| v == "LEADERRUN_SCHEDULE")
            && vars.iter().any(|v| v == "LEADERRUN_CHECK_INTERVAL")
            && vars.len() >= 20,
        "{vars:?}"
    );
    let mut cmd = leaderrun();
    for var in &vars {
        cmd.env(var, "");
    }
    let out = cmd
        .args(["--once", "--dsn", &cluster.dsn(), "--lock-id"])
        .arg(unique_lock_id().to_string())
        .args([
            "--",
            "sh",
            "-c",
            "echo \"ran schedule=[${LEADERRUN_SCHEDULE-unset}]\"",
        ])
        .output()
        .expect("run leaderrun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ran schedule=[]",
        "{stderr}"
    );
}

/// An option of a run typed without the option it modifies (`--tz` without `--schedule`,
/// `--history-keep` or `--history-table` without `--history`) is refused: before, it was taken
/// and did nothing, and a `--history-table` typed without `--history` recorded no run. Set by
/// its variable (one environment may serve several jobs, and `status` reads
/// `LEADERRUN_HISTORY_TABLE`), it is left alone.
#[test]
fn a_modifier_typed_without_what_it_modifies_is_refused() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let run = |env: &[(&str, &str)], flags: &[&str]| {
        let out = leaderrun()
            .envs(env.iter().copied())
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--once"])
            .args(flags)
            .args(["--", "true"])
            .output()
            .expect("run leaderrun");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (flags, says) in [
        (&["--tz", "UTC"][..], "--tz only applies with --schedule"),
        (
            &["--history-keep", "7d"],
            "--history-keep only applies with --history",
        ),
        (
            &["--history-table", "runs"],
            "--history-table only applies with --history",
        ),
    ] {
        let (code, stderr) = run(&[], flags);
        assert_eq!(code, Some(125), "{flags:?}: {stderr}");
        assert!(stderr.starts_with(&format!("error: {says}")), "{stderr}");
    }
    let (code, stderr) = run(
        &[
            ("LEADERRUN_TZ", "UTC"),
            ("LEADERRUN_HISTORY_KEEP", "7d"),
            ("LEADERRUN_HISTORY_TABLE", "runs"),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
}

/// `status` takes `--tz` as a run takes it: only with `--schedule` (it reads the next due time
/// of that schedule in the zone; a stored schedule is read in the zone it was stored with),
/// and a zone it cannot load is the run's usage error, word for word. Before, `status --tz
/// Mars/X` without `--schedule` was taken and did nothing: no message, and the exit status of
/// what it found (1: no leader). Set by its variable, `--tz` is left alone, as in a run.
#[test]
fn status_takes_tz_as_a_run_does() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let out = leaderrun()
            .envs(env.iter().copied())
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id])
            .args(args)
            .output()
            .expect("run leaderrun");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let first_line = |text: &str| text.lines().next().unwrap_or("").to_owned();
    for tz in ["Mars/X", "UTC"] {
        let (code, _, refused) = run(&[], &["--once", "--tz", tz, "--", "true"]);
        assert_eq!(code, Some(125), "{refused}");
        assert!(
            refused.starts_with("error: --tz only applies with --schedule"),
            "{refused}"
        );
        for args in [&["status", "--tz", tz][..], &["--tz", tz, "status"]] {
            let (code, _, stderr) = run(&[], args);
            assert_eq!(code, Some(125), "{args:?}: {stderr}");
            assert_eq!(first_line(&stderr), first_line(&refused), "{args:?}");
        }
    }
    let (code, _, refused) = run(
        &[],
        &["--schedule", "@daily", "--tz", "Mars/X", "--", "true"],
    );
    assert_eq!(code, Some(125), "{refused}");
    assert!(
        refused.starts_with("error: unknown time zone \"Mars/X\" (--tz)"),
        "{refused}"
    );
    let (code, _, stderr) = run(&[], &["status", "--schedule", "@daily", "--tz", "Mars/X"]);
    assert_eq!(code, Some(125), "{stderr}");
    assert_eq!(first_line(&stderr), first_line(&refused));
    // With --schedule, in any form TZ takes; by its variable alone, left alone.
    let rule = "EST5EDT,M3.2.0,M11.1.0";
    let (code, table, stderr) = run(&[], &["status", "--schedule", "@daily", "--tz", rule]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        table.contains(&format!("schedule       @daily ({rule})")),
        "{table}"
    );
    let (code, _, stderr) = run(&[("LEADERRUN_TZ", "Mars/X")], &["status"]);
    assert_eq!(code, Some(1), "{stderr}");
}

/// An option typed on the command line wins over a variable of an option it excludes, as it
/// wins over its own variable (`LEADERRUN_ONCE=1` in a unit's environment, `--wait 5s` typed
/// for one run): before, the two were refused as a conflict (125) naming a flag the user never
/// typed. Two variables that exclude each other are still refused, and a usage error over an
/// option set by its variable names the variable.
#[test]
fn a_flag_wins_over_a_variable_it_excludes() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let run = |var: (&str, &str), flags: &[&str]| {
        let out = leaderrun()
            .env(var.0, var.1)
            .args(["-v", "--dsn", &cluster.dsn()])
            .args(flags)
            .args(["--", "true"])
            .output()
            .expect("run leaderrun");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{var:?} {flags:?}: {stderr}");
        stderr
    };
    for (var, flags, mode) in [
        (
            ("LEADERRUN_ONCE", "1"),
            &["--wait", "5s"][..],
            "mode=wait 5s",
        ),
        (("LEADERRUN_WAIT", "5s"), &["--once"][..], "mode=once"),
        (("LEADERRUN_EVERY", "1m"), &["--once"][..], "mode=once"),
        (
            ("LEADERRUN_SCHEDULE", "* * * * *"),
            &["--once"][..],
            "mode=once",
        ),
        (
            ("LEADERRUN_RESTART", "always"),
            &["--wait", "5s"][..],
            "mode=wait 5s",
        ),
    ] {
        let stderr = run(var, &[&["--lock-id", &id][..], flags].concat());
        assert!(stderr.contains(mode), "{var:?} {flags:?}: {stderr}");
    }
    let stderr = run(
        ("LEADERRUN_LOCK_ID", "3"),
        &["--once", "--lock-name", "nightly-report"],
    );
    assert!(stderr.contains("lock=1886156915:"), "{stderr}");
    assert!(!stderr.contains("lock=1886156915:3 "), "{stderr}");
    let status = leaderrun()
        .env("LEADERRUN_LOCK_ID", "3")
        .args([
            "status",
            "--dsn",
            &cluster.dsn(),
            "--lock-name",
            "nightly-report",
        ])
        .output()
        .expect("run leaderrun status");
    assert_eq!(status.status.code(), Some(1), "{status:?}");
    // Both from the environment: which one was meant is not known.
    let both = leaderrun()
        .env("LEADERRUN_ONCE", "1")
        .env("LEADERRUN_EVERY", "1m")
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--", "true"])
        .output()
        .expect("run leaderrun");
    assert_eq!(both.status.code(), Some(125), "{both:?}");
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    // The error names flags nobody typed: the notes name the variables.
    for var in ["LEADERRUN_ONCE", "LEADERRUN_EVERY"] {
        assert!(
            stderr.contains(&format!("was set by {var} in the environment")),
            "{stderr}"
        );
    }
    let bad = leaderrun()
        .env("LEADERRUN_CHECK_INTERVAL", "5")
        .args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--", "true"])
        .output()
        .expect("run leaderrun");
    assert_eq!(bad.status.code(), Some(125), "{bad:?}");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("note: --check-interval was set by LEADERRUN_CHECK_INTERVAL"),
        "{stderr}"
    );
    // Typed, it is not the variable's.
    let typed = leaderrun()
        .env("LEADERRUN_CHECK_INTERVAL", "5s")
        .args(["--dsn", &cluster.dsn(), "--check-interval", "5"])
        .args(["--lock-id", &id, "--", "true"])
        .output()
        .expect("run leaderrun");
    assert_eq!(typed.status.code(), Some(125), "{typed:?}");
    assert!(!String::from_utf8_lossy(&typed.stderr).contains("note:"));
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
    // A path the system cannot look at is found but cannot be run (126, as env(1) and a
    // shell say), with the system's reason: not "command not found".
    let (one, two) = (scratch.file("loop1"), scratch.file("loop2"));
    std::os::unix::fs::symlink(&two, &one).unwrap();
    std::os::unix::fs::symlink(&one, &two).unwrap();
    let too_long = format!("./{}", "a".repeat(5000));
    let cases = [
        ("no-such-command-leaderrun", 127, "command not found"),
        ("./no/such/file", 127, "command not found"),
        (plain.to_str().unwrap(), 126, "permission denied"),
        (scratch.path().to_str().unwrap(), 126, "permission denied"),
        (bad_interpreter.to_str().unwrap(), 127, "bad interpreter"),
        (
            one.to_str().unwrap(),
            126,
            "Too many levels of symbolic links",
        ),
        (too_long.as_str(), 126, "File name too long"),
    ];
    for (command, code, says) in cases {
        let started = Instant::now();
        let out = leaderrun()
            .args(["--dsn", dsn, "--", command])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{command}: {stderr}");
        assert!(stderr.contains(says), "{command}: {stderr}");
        assert!(started.elapsed() < secs(2.0));
    }
}

/// `-c STRING` runs `/bin/sh`, as system(3) and flock(1) do, whatever `PATH` holds: a
/// service's or a container's `PATH` without `/bin` made it "sh: command not found" (127), and
/// an `sh` early on `PATH` ran instead of the system's. `$0` stays `sh`.
#[test]
fn dash_c_runs_bin_sh_whatever_path_holds() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let marker = scratch.file("ran");
    // Another `sh` first on PATH, which must not run.
    let decoy = scratch.file("sh");
    std::fs::write(&decoy, "#!/bin/sh\nexit 99\n").unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dsn = Cluster::shared().dsn();
    let line = format!("echo \"$0\" > '{}'; exit 5", marker.display());
    for path in [
        "/nonexistent".to_owned(),
        scratch.path().display().to_string(),
    ] {
        let _ = std::fs::remove_file(&marker);
        let out = leaderrun()
            .env("PATH", &path)
            .args(["--once", "--dsn", &dsn, "--lock-id"])
            .arg(unique_lock_id().to_string())
            .args(["-c", &line])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "PATH={path}: {stderr}");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "sh\n");
    }
}

/// A `PATH` set to the empty string is one empty entry, the current directory, as `execvp`,
/// env(1) and a shell read it: not unset. Taken for unset, it ran `true` from the default
/// directories that the caller had emptied `PATH` to keep out, and said "command not found"
/// of a program in the current directory.
#[test]
fn an_empty_path_is_the_current_directory_as_execvp_reads_it() {
    let scratch = Scratch::new();
    let marker = scratch.file("ran");
    let job = scratch.child_script(
        "lr-job-in-cwd",
        &format!("echo ran > '{}'\nexit 3", marker.display()),
    );
    let name = job.file_name().unwrap().to_str().unwrap();
    let dsn = Cluster::shared().dsn();
    let once = |command: &str| {
        leaderrun()
            .current_dir(scratch.path())
            .env("PATH", "")
            .args(["--once", "--dsn", &dsn, "--lock-id"])
            .arg(unique_lock_id().to_string())
            .args(["--", command])
            .output()
            .unwrap()
    };
    let out = once(name);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
    // Not in the current directory: not found, whatever the default directories hold.
    let env = std::process::Command::new("/usr/bin/env")
        .current_dir(scratch.path())
        .env("PATH", "")
        .arg("true")
        .output()
        .unwrap();
    assert_eq!(env.status.code(), Some(127), "env(1) is the reference");
    let out = once("true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("true: command not found"), "{stderr}");
}

/// An executable file without an interpreter line (`#!`) runs under `/bin/sh`, as `execvp`
/// and a POSIX shell run it: cron scripts often have none. COMMAND is started by leaderrun's
/// own spawn (src/process/spawn.rs), which falls back to the shell on ENOEXEC as execvp does.
#[test]
fn a_script_without_an_interpreter_line_runs_under_sh() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let script = scratch.file("no-interpreter-line");
    let marker = scratch.file("ran");
    std::fs::write(
        &script,
        format!("echo \"$0 $1\" > '{}'\nexit 3\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = leaderrun()
        .args(["--once", "--dsn", &Cluster::shared().dsn(), "--lock-id"])
        .arg(unique_lock_id().to_string())
        .arg("--")
        .arg(&script)
        .arg("first")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The shell was given the script's path as $0 and the arguments after it.
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("{} first\n", script.display())
    );
}

/// An environment that fits leaderrun's own exec but not COMMAND's once leaderrun's variables
/// (`LEADERRUN_TERM`, …) are added: exit 126, and the message says that the argument list and
/// environment are too long, how big they were, and how much leaderrun added, not the kernel's
/// bare "Argument list too long". The edge is found by trying: the largest filler with which
/// leaderrun itself still starts (each string stays under the kernel's 32-page bound of one).
#[test]
fn an_environment_that_leaderruns_variables_tip_over_says_so() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    // A short path to the binary: the kernel counts it twice (file name and argv[0]), and
    // COMMAND's must not be the longer one.
    let bin = scratch.file("lr");
    std::os::unix::fs::symlink(crate::support::bin(), &bin).unwrap();
    let id = unique_lock_id().to_string();
    // Settings in the environment, which COMMAND inherits as it is: argv differs only by the
    // program's path and `--`.
    let command = |filler: usize, lock_id: &str| {
        let mut cmd = std::process::Command::new(&bin);
        crate::support::default_signals(&mut cmd);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LEADERRUN_DSN", cluster.dsn())
            .env("LEADERRUN_LOCK_ID", lock_id)
            .env("LEADERRUN_ONCE", "1")
            .args(["--", "/bin/true"]);
        let mut left = filler;
        for i in 0.. {
            if left == 0 {
                break;
            }
            let n = left.min(100_000);
            cmd.env(format!("FILL{i:03}"), "x".repeat(n));
            left -= n;
        }
        cmd
    };
    // The same sizes with a lock id of the same length that leaderrun refuses (125 at once):
    // whether exec takes them is all a probe asks.
    let refused = "x".repeat(id.len());
    let starts = |filler: usize| match command(filler, &refused).output() {
        Ok(_) => true,
        Err(err) if err.raw_os_error() == Some(libc::E2BIG) => false,
        Err(err) => panic!("spawn leaderrun: {err}"),
    };
    let (mut lo, mut hi) = (0, 4 * 1024 * 1024);
    assert!(starts(lo) && !starts(hi));
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if starts(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Without leaderrun's additions, COMMAND takes this environment.
    let mut alone = command(lo, &id);
    alone.env_remove("LEADERRUN_DSN");
    let direct = std::process::Command::new("/bin/true")
        .env_clear()
        .envs(alone.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("LEADERRUN_DSN", cluster.dsn())
        .status()
        .expect("/bin/true takes the environment leaderrun was given");
    assert!(direct.success());
    let out = command(lo, &id).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{stderr}");
    for says in [
        "cannot start /bin/true: its argument list and environment are too long for exec",
        "Argument list too long",
        "; leaderrun added ",
        " bytes of its own variables (LEADERRUN_TERM, LEADERRUN_LOCK, LEADERRUN_SLOT, \
         LEADERRUN_FENCING_TOKEN, LEADERRUN_BACKEND_PID)",
    ] {
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
    }
    let limit = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
    assert!(
        stderr.contains(&format!("the system's limit of about {limit} (ARG_MAX)")),
        "{stderr}"
    );
    // The sizes are those of what COMMAND was given: the filler and the settings.
    let environment: usize = command(lo, &id)
        .get_envs()
        .map(|(k, v)| k.len() + 1 + v.map_or(0, |v| v.len()) + 1 + 8)
        .sum();
    assert!(
        stderr.contains(&format!("arguments {} bytes", "/bin/true".len() + 1 + 8)),
        "{stderr}"
    );
    let number_after = |what: &str| -> usize {
        stderr
            .split(what)
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {what:?} in {stderr}"))
    };
    assert_eq!(
        number_after(", environment "),
        environment + number_after("leaderrun added "),
        "{stderr}"
    );
}

/// A stack limit too small for leaderrun's start-up (a parent's `ulimit -s 64`): raised for
/// leaderrun where the hard limit allows, COMMAND getting the limit it was started with; where
/// it does not, exit 125 with the reason, before anything is forked. Before, start-up
/// overflowed the main thread's stack (exit 134, or a bare SIGSEGV, 139) after the watchdog's
/// fork, and left it to the parent as a zombie.
#[test]
fn a_stack_limit_too_small_is_raised_or_refused_and_commands_is_kept() {
    let kib = |k: u64| k << 10;
    let cluster = Cluster::shared();
    // COMMAND of leaderrun, and of the init of its own PID namespace.
    let namespaced = leaderrun::process::pidns::PidNamespace::new().is_ok();
    for extra in [&[][..], &["--pid-namespace"][..]] {
        if !extra.is_empty() && !namespaced {
            continue;
        }
        let mut cmd = crate::support::leaderrun_on(cluster, unique_lock_id(), INTERVAL);
        cmd.args(extra).args(["--once", "--", "sh", "-c"]);
        cmd.arg("echo \"$(ulimit -s) $(ulimit -Hs)\"");
        crate::support::limits(&mut cmd, libc::RLIMIT_STACK, kib(64), kib(8192));
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?} {:?}\n{stderr}",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout, "64 8192\n", "{extra:?} {stderr}");
        assert_eq!(stderr, "", "{extra:?}");
    }

    let mut cmd = crate::support::leaderrun_on(cluster, unique_lock_id(), INTERVAL);
    cmd.args(["--once", "--", "true"]);
    crate::support::limits(&mut cmd, libc::RLIMIT_STACK, kib(64), kib(128));
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("the stack limit (ulimit -s) is 64 KiB, its hard limit 128 KiB"),
        "{stderr}"
    );
}
