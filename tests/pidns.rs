//! `--pid-namespace`: COMMAND under an init of leaderrun's, PID 1 of a namespace of its own
//! (docs/process-model.md#a-pid-namespace-of-its-own). Inside the namespace `$$` is not the
//! machine's pid, so the scripts record their own with `read PID _ < /proc/self/stat` (the shell
//! opens the file itself, and `/proc` is the machine's).

use std::time::Instant;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::cluster::skip;
use crate::support::*;

const INTERVAL: &str = "200ms";

/// Writes an executable script `name` in `scratch` that first records the machine's pid of
/// its shell as `WHAT PID` in the events (`read` makes the shell open `/proc/self/stat` itself,
/// and `/proc` is the machine's), then runs `body` (`$EVENTS` names the event file, `$D` the
/// scratch directory). Returns its path.
fn helper(scratch: &Scratch, name: &str, what: &str, body: &str) -> String {
    let path = scratch.file(name);
    let text = format!(
        "#!/bin/sh\nD='{}'\nEVENTS=\"$D/events\"\nread me _ < /proc/self/stat\n\
         echo \"{what} $me\" >> \"$EVENTS\"\n{body}\n",
        scratch.path().display()
    );
    std::fs::write(&path, text).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Whether this test run may make PID namespaces (CAP_SYS_ADMIN); says so when not.
fn privileged(test: &str) -> bool {
    let ok = leaderrun::process::pidns::PidNamespace::new().is_ok();
    if !ok {
        skip(test, "no CAP_SYS_ADMIN: PID namespaces cannot be made here");
    }
    ok
}

#[test]
fn leaderrun_and_its_watchdog_killed_together_leave_nothing_of_the_tree() {
    if !privileged("leaderrun_and_its_watchdog_killed_together_leave_nothing_of_the_tree") {
        return;
    }
    // A worker in the group, and one that left it with setsid and started one of its own:
    // without the namespace only the direct child would die with leaderrun.
    let setup = Setup::new(Cluster::shared(), "\"$(dirname \"$0\")/main.sh\"");
    let scratch = &setup.scratch;
    helper(scratch, "below.sh", "below", "exec sleep 600");
    helper(
        scratch,
        "escaped.sh",
        "escaped",
        "\"$D/below.sh\" & exec sleep 600",
    );
    helper(scratch, "worker.sh", "worker", "exec sleep 600");
    helper(
        scratch,
        "main.sh",
        "main",
        "setsid \"$D/escaped.sh\" & \"$D/worker.sh\" & wait",
    );
    let replica = setup.replica(INTERVAL, &["--pid-namespace"]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(
        (start.pid, start.ppid),
        (2, 1),
        "COMMAND is pid 2 under init"
    );
    let pids: Vec<i32> = ["main ", "escaped ", "below ", "worker "]
        .iter()
        .map(|what| scratch.recorded_pid(what))
        .collect();
    let watchdog = wait_for("the watchdog", secs(5.0), || watchdog_of(replica.pid()));
    // The standby that takes over runs without the flag, in the machine's namespace, and
    // records at its start which of the old tree's pids it still sees.
    let takeover = Setup::new(
        Cluster::shared(),
        &format!(
            "left=''; for p in {}; do [ -r /proc/$p/stat ] && \
             left=\"$left $p:$(cut -d' ' -f3 /proc/$p/stat):$(grep -h '^S[a-z]*Pnd' /proc/$p/status | tr -d '\\t ' | tr '\\n' ,)\"; \
             done\necho \"left:$left\" >> \"$EVENTS\"\nexec sleep 600",
            pids.iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    let mut standby = Replica::start(
        setup.cluster,
        setup.id,
        INTERVAL,
        &["--", takeover.script()],
    );
    wait_for(
        "the standby to wait in the lock's queue",
        secs(10.0),
        || (setup.cluster.waiters(setup.id) >= 1).then_some(()),
    );
    // Killed together: no pid of theirs runs between the two kills.
    let killed = Instant::now();
    kill(Pid::from_raw(watchdog), Signal::SIGKILL).unwrap();
    kill(Pid::from_raw(replica.pid()), Signal::SIGKILL).unwrap();
    wait_for(
        "every process of the old tree to be gone",
        secs(2.0),
        || pids.iter().all(|&p| !alive(p)).then_some(()),
    );
    let gone = killed.elapsed();
    takeover.scratch.wait_starts(1, secs(10.0));
    let left = wait_for("the new leader's look at the old tree", secs(2.0), || {
        takeover
            .scratch
            .events()
            .iter()
            .find_map(|l| l.strip_prefix("left:").map(str::to_owned))
    });
    // What the kernel still had of the old tree when the new leader's COMMAND started: the
    // lock passes as leaderrun's socket closes, and its init's death (and with it the
    // namespace's) follows in the same exit, so on a busy machine a process may still be
    // there, mostly with SIGKILL pending or a zombie. The bound is what the README states; this
    // measures it.
    eprintln!(
        "old tree gone within {gone:?} of the kill; at the new leader's start (pid:state:pending) \
         it saw:{left}"
    );
    standby.signal(Signal::SIGTERM);
    assert_eq!(standby.wait_exit(secs(10.0)).code(), Some(143));
}

#[test]
fn command_keeps_its_exit_status_environment_and_descriptors() {
    if !privileged("command_keeps_its_exit_status_environment_and_descriptors") {
        return;
    }
    let cluster = Cluster::shared();
    let outside = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let once = |body: &str, env: &[(&str, &str)]| {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &cluster.dsn(), "--lock-id"])
            .arg(unique_lock_id().to_string())
            .args(["--once", "--pid-namespace", "--", "sh", "-c", body])
            .envs(env.iter().copied());
        let mut replica = Replica::spawn(cmd);
        let status = replica.wait_exit(secs(10.0));
        (status, replica.stdout(), replica.log())
    };
    let (status, out, log) = once(
        "echo \"$$ $PPID $(readlink /proc/self/ns/pid) ${LEADERRUN_TERM:-none} \
         ${NOTIFY_SOCKET:-unset} ${LISTEN_FDS:-unset}\"; ls /proc/self/fd; exit 7",
        &[("NOTIFY_SOCKET", "/nonexistent"), ("LISTEN_FDS", "1")],
    );
    assert_eq!(status.code(), Some(7), "{log}");
    let mut lines = out.lines();
    let fields: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    assert_eq!(fields[..2], ["2", "1"], "{out}");
    assert_ne!(
        fields[2],
        outside.to_str().unwrap(),
        "a namespace of its own: {out}"
    );
    assert_eq!(fields[3], "1", "LEADERRUN_TERM: {out}");
    assert_eq!(fields[4..], ["unset", "unset"], "{out}");
    // 0, 1, 2 and the descriptor `ls` opened to list them: nothing of leaderrun's or the init's.
    let fds: Vec<&str> = lines.collect();
    assert_eq!(fds, ["0", "1", "2", "3"], "{out}");
    // A death by signal is reported as one, 128 + N, as without the flag.
    let (status, _, log) = once("kill -USR1 $$", &[]);
    assert_eq!(status.code(), Some(128 + libc::SIGUSR1), "{log}");
}

#[test]
fn a_descendant_that_left_the_group_gets_the_stop_signal_not_only_sigkill() {
    if !privileged("a_descendant_that_left_the_group_gets_the_stop_signal_not_only_sigkill") {
        return;
    }
    // The escaped one is re-parented to the init when its shell dies: leaderrun finds it
    // among the init's children and sends it the stop signal, well before the grace ends.
    let setup = Setup::new(
        Cluster::shared(),
        "setsid \"$(dirname \"$0\")/escaped.sh\" & wait",
    );
    let scratch = &setup.scratch;
    helper(
        scratch,
        "escaped.sh",
        "escaped",
        "trap 'echo termed >> \"$EVENTS\"; exit 0' TERM; echo armed >> \"$EVENTS\"\n\
         while :; do sleep 0.05; done",
    );
    let mut replica = setup.replica(INTERVAL, &["--pid-namespace", "--grace", "60s"]);
    scratch.wait_starts(1, secs(10.0));
    let escaped = scratch.recorded_pid("escaped ");
    wait_for("the escaped one's trap", secs(5.0), || {
        scratch.events().iter().any(|l| l == "armed").then_some(())
    });
    replica.signal(Signal::SIGTERM);
    let deadline = Instant::now() + secs(10.0);
    while !scratch.events().iter().any(|l| l == "termed") {
        assert!(
            Instant::now() < deadline,
            "the escaped process got no stop signal within 10 s: {:?}, escaped alive: {}, \
             its status: {:?}\n{}",
            scratch.events(),
            alive(escaped),
            std::fs::read_to_string(format!("/proc/{escaped}/status")).ok(),
            replica.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(143), "{}", replica.log());
    assert!(!alive(escaped));
}

/// COMMAND's end while a helper of it still runs in the namespace is reported by the init on
/// its pipe, not by a SIGCHLD (the init lives on): leaderrun has the kernel signal it when a
/// report is written, so the helper gets the stop signal at once. Before, the report waited
/// for the reaper's one-second poll, and a one-shot's helpers ran on (and the one-shot took)
/// that much longer than without the flag.
#[test]
fn commands_end_with_helpers_left_is_acted_on_at_once() {
    if !privileged("commands_end_with_helpers_left_is_acted_on_at_once") {
        return;
    }
    let scratch = Scratch::new();
    helper(
        &scratch,
        "helper.sh",
        "helper",
        "trap 'date +%s.%N > \"$D/termed\"; exit 0' TERM\necho armed > \"$D/armed\"\n\
         while :; do sleep 0.02; done",
    );
    let main = helper(
        &scratch,
        "main.sh",
        "main",
        "\"$D/helper.sh\" &\nuntil [ -s \"$D/armed\" ]; do sleep 0.01; done\n\
         date +%s.%N > \"$D/ended\"\nexit 7",
    );
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &Cluster::shared().dsn(), "--lock-id"])
        .arg(unique_lock_id().to_string())
        .args(["--once", "--pid-namespace", "--grace", "30s", "--", &main]);
    let mut replica = Replica::spawn(cmd);
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(7), "{}", replica.log());
    let stamp = |name: &str| -> f64 {
        let text = std::fs::read_to_string(scratch.file(name))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", replica.log()));
        text.trim().parse().unwrap()
    };
    let late = stamp("termed") - stamp("ended");
    // The poll would come about 0.9 s after the end: the one-shot's first poll is at its start.
    assert!(
        late < 0.5,
        "the helper got the stop signal {late:.3} s after COMMAND's end"
    );
    assert!(!alive(scratch.recorded_pid("helper ")));
}

#[test]
fn exec_failure_is_reported_through_the_spawn_as_without_the_flag() {
    if !privileged("exec_failure_is_reported_through_the_spawn_as_without_the_flag") {
        return;
    }
    crate::child::exec_failure_is_reported_as_126(&["--pid-namespace"]);
}

#[test]
fn without_cap_sys_admin_it_exits_125_at_start() {
    let cluster = Cluster::shared();
    let mut cmd = if nix::unistd::geteuid().is_root() {
        // Root without CAP_SYS_ADMIN: setpriv drops it from the bounding set before exec.
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"])
            .arg(env!("CARGO_BIN_EXE_leaderrun"));
        clear_settings_env(&mut cmd);
        cmd
    } else if leaderrun::process::pidns::PidNamespace::new().is_err() {
        leaderrun()
    } else {
        return skip(
            "without_cap_sys_admin_it_exits_125_at_start",
            "not root, yet PID namespaces can be made",
        );
    };
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id"])
        .arg(unique_lock_id().to_string())
        .args(["--once", "--pid-namespace", "--", "true"]);
    let mut replica = Replica::spawn(cmd);
    let status = replica.wait_exit(secs(10.0));
    let log = replica.log();
    assert_eq!(status.code(), Some(125), "{log}");
    assert!(log.contains("CAP_SYS_ADMIN"), "{log}");
    assert!(
        !log.contains("lock acquired"),
        "it must not campaign: {log}"
    );
}

/// The init of COMMAND's namespace execs COMMAND only before the end of the proof leaderrun
/// started it under (its first argument, CLOCK_BOOTTIME nanoseconds; 0 for none): past it,
/// it reports exec's failure as `ETIME` and COMMAND never runs, so a leaderrun that stalled
/// between its check and the init's start never has COMMAND start after the safe window
/// (rule 1). Run here as leaderrun runs it, without a namespace (none is needed to see it).
#[test]
fn the_init_never_execs_command_after_the_proofs_end() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let now_ns = {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
    };
    let touch = which("touch");
    for (exec_by, runs) in [
        (now_ns - 1_000_000, false),
        (0, true),
        (now_ns + 600_000_000_000, true),
    ] {
        let scratch = Scratch::new();
        let ran = scratch.file("ran");
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut init = leaderrun();
        init.arg0(leaderrun::process::pidns::ARGV0)
            .arg(exec_by.to_string())
            .arg(&touch)
            .arg("touch")
            .arg(&ran);
        let write_fd = write.as_raw_fd();
        // SAFETY: dup2 between fork and exec: the report pipe goes to descriptor 3, as
        // leaderrun's spawn leaves it.
        unsafe {
            init.pre_exec(move || {
                if libc::dup2(write_fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = init.status().unwrap();
        drop(write);
        assert!(status.success(), "{exec_by}: {status:?}");
        let mut report = [0u8; 8];
        std::fs::File::from(read).read_exact(&mut report).unwrap();
        let tag = u32::from_ne_bytes(report[..4].try_into().unwrap());
        let value = i32::from_ne_bytes(report[4..].try_into().unwrap());
        if runs {
            assert_eq!(tag, 1, "{exec_by}: not started ({value})");
            assert!(ran.exists(), "{exec_by}: COMMAND did not run");
        } else {
            assert_eq!((tag, value), (2, libc::ETIME), "{exec_by}");
            assert!(
                !ran.exists(),
                "{exec_by}: COMMAND ran after the proof's end"
            );
        }
    }
}

/// The path of `program` on `PATH`.
fn which(program: &str) -> std::path::PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}
