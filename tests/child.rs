//! Child supervision with real processes and real signals: process groups, adopted orphans,
//! PID 1, the one reaper, signals at awkward moments, the stop signal and the grace, helpers
//! left behind, and the descriptors COMMAND inherits.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{
    alive, leaderrun, secs, unique_lock_id, wait_for, watchdog_of, Cluster, Replica, Scratch,
    Setup, INTERVAL,
};

/// Whether process `holder` has a pidfd of `pid` open (`Pid:` in its fdinfo, Linux 5.10).
fn holds_pidfd_of(holder: i32, pid: i32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{holder}/fdinfo")) else {
        return false;
    };
    let line = format!("Pid:\t{pid}");
    fds.flatten().any(|fd| {
        std::fs::read_to_string(fd.path()).is_ok_and(|info| info.lines().any(|l| l == line))
    })
}

#[test]
fn a_grandchild_that_called_setsid_is_stopped_on_demotion() {
    // The background job is not a group leader, so setsid(1) calls setsid() itself and
    // execs sleep: that sleep has its own session and group, outside the child's group.
    let setup = Setup::new(
        Cluster::shared(),
        "setsid sleep 600 &\necho \"escaped $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let (cluster, scratch) = (setup.cluster, &setup.scratch);
    let mut replica = setup.replica(INTERVAL, &[]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let escaped = scratch.recorded_pid("escaped ");
    wait_for(
        "the escaped grandchild to be in its own session",
        secs(2.0),
        || {
            let sid = nix::unistd::getsid(Some(Pid::from_raw(escaped))).ok()?;
            (sid.as_raw() == escaped).then_some(())
        },
    );
    cluster.terminate_backend(start.backend_pid);
    wait_for(
        "the child and the escaped grandchild to stop",
        secs(3.0),
        || (!alive(start.pid) && !alive(escaped)).then_some(()),
    );
    // And the replica campaigns on, leading again in a new term.
    let second = scratch.wait_starts(2, secs(5.0))[1].clone();
    assert_eq!((second.ppid, second.term), (replica.pid(), 2));
    // A shutdown right after the new term's child started stops its escaped grandchild too.
    let again = wait_for("the second term's escaped grandchild", secs(5.0), || {
        scratch
            .events()
            .iter()
            .filter_map(|l| l.strip_prefix("escaped ")?.trim().parse::<i32>().ok())
            .nth(1)
    });
    replica.signal(Signal::SIGTERM);
    let _ = replica.wait_exit(secs(10.0));
    assert!(
        !alive(second.pid) && !alive(again),
        "the second term's tree outlived leaderrun"
    );
}

/// Kills `replica` (SIGKILL) once its watchdog holds a pidfd of `escaped`, a grandchild that
/// left the tree's group (the watchdog walks the tree every 25 ms; a pidfd's fdinfo names its
/// pid), and waits for its exit. Returns the watchdog's pid.
fn kill_9_once_the_watchdog_holds(replica: &mut Replica, escaped: i32) -> i32 {
    let watchdog = wait_for("the watchdog", secs(5.0), || watchdog_of(replica.pid()));
    wait_for(
        "the watchdog to hold the escaped grandchild",
        secs(5.0),
        || holds_pidfd_of(watchdog, escaped).then_some(()),
    );
    replica.signal(Signal::SIGKILL);
    let _ = replica.wait_exit(secs(10.0));
    watchdog
}

#[test]
fn kill_9_of_leaderrun_also_ends_a_grandchild_that_called_setsid() {
    // Without a cgroup the process group does not reach it, and its parent dies with
    // leaderrun (PDEATHSIG): the watchdog must have found it while the tree ran. Its own child
    // (started after setsid, in its group) must die too.
    let setup = Setup::new(
        Cluster::shared(),
        "setsid sh -c 'sleep 600 & echo \"below $!\" >> \"$0\"; exec sleep 600' \"$EVENTS\" &\n\
         echo \"escaped $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &[]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let escaped = scratch.recorded_pid("escaped ");
    let below = scratch.recorded_pid("below ");
    wait_for(
        "the escaped grandchild to be in its own session",
        secs(2.0),
        || {
            let sid = nix::unistd::getsid(Some(Pid::from_raw(escaped))).ok()?;
            (sid.as_raw() == escaped).then_some(())
        },
    );
    kill_9_once_the_watchdog_holds(&mut replica, escaped);
    wait_for(
        "the child, the escaped grandchild and its child to die",
        secs(3.0),
        || (!alive(start.pid) && !alive(escaped) && !alive(below)).then_some(()),
    );
}

/// `sh -c 'sidecar & exec leaderrun … -- job'` with `args` after `leaderrun`: the sidecar, a
/// child of leaderrun from its first instruction, records its pid (`sidecar PID`) and a TERM
/// (`sidecar-term`) in `scratch`'s events; its stdio is `/dev/null`, so it holds none of the
/// replica's pipes.
fn with_sidecar(scratch: &Scratch, args: &[&str]) -> Replica {
    let sidecar = scratch.file("sidecar.sh");
    std::fs::write(
        &sidecar,
        format!(
            "EVENTS='{}'\necho \"sidecar $$\" >> \"$EVENTS\"\n\
             trap 'echo sidecar-term >> \"$EVENTS\"; exit 0' TERM\n\
             while :; do sleep 0.05; done\n",
            scratch.file("events").display()
        ),
    )
    .unwrap();
    let mut cmd = crate::support::wrapper("sh");
    cmd.arg("-c")
        .arg("sh \"$0\" </dev/null >/dev/null 2>&1 & exec \"$@\"")
        .arg(&sidecar)
        .arg(crate::support::bin())
        .args(args);
    Replica::spawn(cmd)
}

/// A child leaderrun was handed by the program that exec'd it (`sh -c 'sidecar & exec
/// leaderrun …'`, a common container entrypoint) is not COMMAND's: not stopped when COMMAND
/// ends, nor by the watchdog when leaderrun is killed, while COMMAND's own escaped grandchild
/// still is. Before, both took it for an orphan of COMMAND's tree and sent it the stop signal.
#[test]
fn a_child_leaderrun_was_handed_at_start_is_not_commands() {
    let cluster = Cluster::shared();
    // After the run: the sidecar never got the stop signal and runs on; then it is ended.
    let sidecar_survived = |scratch: &Scratch| {
        let sidecar = scratch.recorded_pid("sidecar ");
        let events = scratch.events();
        assert!(
            !events.iter().any(|l| l == "sidecar-term"),
            "the sidecar got the stop signal: {events:?}"
        );
        assert!(alive(sidecar), "the sidecar {sidecar} was killed");
        let _ = kill(Pid::from_raw(sidecar), Signal::SIGKILL);
    };

    // A one-shot: COMMAND's end, and leaderrun's exit, leave the sidecar alone.
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "sleep 0.2");
    let id = unique_lock_id().to_string();
    let mut once = with_sidecar(
        &scratch,
        &[
            "--once",
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id,
            "--",
            job.to_str().unwrap(),
        ],
    );
    let status = once.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(0), "{}", once.log());
    sidecar_survived(&scratch);

    // leaderrun killed while leading: the watchdog kills COMMAND's tree, its escaped
    // grandchild included, and leaves the sidecar alone. Once the watchdog holds the escaped
    // grandchild, it has walked leaderrun's children with the sidecar among them.
    let scratch = Scratch::new();
    let job = scratch.child_script(
        "job.sh",
        "setsid sleep 600 </dev/null >/dev/null 2>&1 &\n\
         echo \"escaped $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let id = unique_lock_id().to_string();
    let mut leader = with_sidecar(
        &scratch,
        &[
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id,
            "--check-interval",
            INTERVAL,
            "--",
            job.to_str().unwrap(),
        ],
    );
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    let escaped = scratch.recorded_pid("escaped ");
    let watchdog = kill_9_once_the_watchdog_holds(&mut leader, escaped);
    wait_for(
        "COMMAND and its escaped grandchild to die",
        secs(5.0),
        || (!alive(start.pid) && !alive(escaped)).then_some(()),
    );
    // The watchdog is gone too: nothing of it can still reach the sidecar.
    wait_for("the watchdog to exit", secs(5.0), || {
        (!alive(watchdog)).then_some(())
    });
    sidecar_survived(&scratch);
}

#[test]
fn a_stopped_child_is_still_stopped_by_sigterm() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &["--grace", "60s"]);
    let start = scratch.wait_starts(1, secs(10.0))[0].clone();
    kill(Pid::from_raw(start.pid), Signal::SIGSTOP).unwrap();
    wait_for("the child to be stopped", secs(2.0), || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", start.pid)).ok()?;
        stat.contains(") T ").then_some(())
    });
    replica.signal(Signal::SIGTERM);
    // Without SIGCONT the pending TERM would wait for the 60 s grace and SIGKILL.
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(143));
}

#[test]
fn the_main_childs_status_is_never_taken_by_the_reaper() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    // Orphans exit with 3 around the main child's exit with 7; the reaper sees them all.
    let body = "for i in 1 2 3 4 5 6 7 8; do (sleep 0.00$i; exit 3) & done; exit 7";
    for round in 0..15 {
        let mut replica = Replica::start(cluster, id, "100ms", &["--", "sh", "-c", body]);
        let status = replica.wait_exit(secs(10.0));
        assert_eq!(status.code(), Some(7), "round {round}: {}", replica.log());
    }
}

#[test]
fn sigterm_at_any_moment_of_start_up_leaves_no_child_and_no_hang() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    for round in 0..30u64 {
        let mut replica = setup.replica("100ms", &[]);
        // Spread the signal over start-up: handler install, connect, grant, spawn, running.
        std::thread::sleep(Duration::from_millis(round * 4));
        replica.signal(Signal::SIGTERM);
        let status = replica.wait_exit(secs(5.0));
        // 0: standby; 143: the child got the forwarded TERM. Before main installs the handlers
        // (dynamic loader, runtime start) TERM's default action ends the process: acceptable
        // only if it had not even logged, let alone started anything.
        let died_early = status.signal() == Some(libc::SIGTERM) && replica.log().is_empty();
        assert!(
            matches!(status.code(), Some(0) | Some(143)) || died_early,
            "round {round}: {status:?}\n{}",
            replica.log()
        );
        for start in scratch.starts() {
            assert!(
                !alive(start.pid),
                "round {round}: child {} left behind",
                start.pid
            );
        }
    }
}

/// A signal that arrives after the binary's constructors and before `main` (Rust's runtime
/// starting, the stack's reserve) waits for the handlers: TERM ends leaderrun as a stopped
/// standby (exit 0, nothing started), HUP does nothing at start-up. An `LD_PRELOAD` shim wraps
/// `__libc_start_main` and raises the signal just before the program's `main`. Before, signals
/// were blocked only in `main`: TERM and HUP killed leaderrun by their default action there,
/// and as PID 1 the kernel dropped them (a container stopped as it started ran COMMAND to its
/// end).
#[test]
fn a_signal_before_main_waits_for_the_handlers() {
    const TEST: &str = "child::a_signal_before_main_waits_for_the_handlers";
    const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
typedef int (*main_fn)(int, char **, char **);
typedef int (*start_fn)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *);
static main_fn real_main;
static int raising_main(int argc, char **argv, char **envp) {
    const char *sig = getenv("LR_TEST_RAISE");
    if (sig) {
        int n = atoi(sig);
        /* Not for what this process starts. */
        unsetenv("LR_TEST_RAISE");
        unsetenv("LD_PRELOAD");
        raise(n);
    }
    return real_main(argc, argv, envp);
}
int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void),
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
    start_fn real = (start_fn)dlsym(RTLD_NEXT, "__libc_start_main");
    real_main = main;
    return real(raising_main, argc, argv, init, fini, rtld_fini, stack_end);
}
"#;
    let scratch = Scratch::new();
    let source = scratch.file("shim.c");
    std::fs::write(&source, SHIM).unwrap();
    let shim = scratch.file("shim.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .output();
    if !built.as_ref().is_ok_and(|o| o.status.success()) {
        crate::support::cluster::skip(TEST, "needs a C compiler (cc) for its LD_PRELOAD shim");
        return;
    }
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let run = |sig: i32| {
        crate::support::leaderrun()
            .env("LD_PRELOAD", &shim)
            .env("LR_TEST_RAISE", sig.to_string())
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--once"])
            .args(["--", "sh", "-c", "echo RAN"])
            .output()
            .expect("run leaderrun")
    };
    let out = run(libc::SIGTERM);
    assert_eq!(
        (
            out.status.code(),
            out.status.signal(),
            out.stdout.as_slice()
        ),
        (Some(0), None, &b""[..]),
        "TERM before main: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(libc::SIGHUP);
    assert_eq!(
        (
            out.status.code(),
            out.status.signal(),
            out.stdout.as_slice()
        ),
        (Some(0), None, &b"RAN\n"[..]),
        "HUP before main: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A file the settings name that blocks when read (a FIFO nobody writes to, as a hung NFS mount
/// would block) holds up no stop request. A service file is read at start-up, before the
/// signal handlers exist: TERM ends leaderrun there as a stopped standby ends (exit 0), its
/// watchdog reaped (`fence::no_zombie_is_left_to_a_parent_that_does_not_reap` checks that no
/// zombie is left), nothing started. A root certificate is read at each connect, on a thread of
/// its own: TERM is handled as for any standby (exit 0). Before, start-up kept every signal
/// blocked while it read, and the certificate was read on the runtime's only thread: only
/// SIGKILL ended either; later a TERM during start-up's reads killed leaderrun by its default
/// action (exit 143), leaving its watchdog to its parent.
#[test]
fn sigterm_while_a_file_the_settings_name_blocks_ends_leaderrun() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let fifo = scratch.file("blocks");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let id = unique_lock_id().to_string();
    let service = cluster.dsn().replace("dbname=", "service=x dbname=");
    let verify = format!("{} sslmode=verify-ca", cluster.dsn());
    for (name, dsn) in [("PGSERVICEFILE", service), ("PGSSLROOTCERT", verify)] {
        let mut cmd = crate::support::leaderrun();
        cmd.env(name, &fifo)
            .args(["--dsn", &dsn, "--lock-id", &id, "--once"])
            .args(["--", "sh", "-c", "echo RAN"]);
        let mut replica = Replica::spawn(cmd);
        let pid = replica.pid();
        // Whichever thread opens it.
        let opening = || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
            tasks.flatten().find(|task| {
                std::fs::read_to_string(task.path().join("wchan"))
                    .is_ok_and(|w| w.contains("fifo") || w.contains("partner"))
            })
        };
        wait_for(
            &format!("{name}: leaderrun to block opening the FIFO"),
            secs(10.0),
            opening,
        );
        replica.signal(Signal::SIGTERM);
        let status = replica.wait_exit(secs(5.0));
        assert_eq!(
            status.code(),
            Some(0),
            "{name}: {status:?}\n{}",
            replica.log()
        );
        assert!(replica.stdout().is_empty(), "{name}: COMMAND ran");
    }
}

#[test]
fn each_forwarded_signal_arrives_exactly_once() {
    let scratch = Scratch::new();
    let mut traps = String::new();
    for sig in ["HUP", "QUIT", "USR1", "USR2", "WINCH", "ALRM"] {
        traps.push_str(&format!("trap 'echo {sig} >> \"$EVENTS\"' {sig}\n"));
    }
    traps.push_str("while :; do sleep 0.02; done");
    let script = scratch.child_script("child.sh", &traps);
    let mut replica = Replica::start(
        Cluster::shared(),
        unique_lock_id(),
        INTERVAL,
        &["--", script.to_str().unwrap()],
    );
    scratch.wait_starts(1, secs(10.0));
    let sent = [
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
        Signal::SIGALRM,
        Signal::SIGUSR1,
        Signal::SIGHUP,
    ];
    for (n, sig) in sent.iter().enumerate() {
        replica.signal(*sig);
        wait_for(&format!("{sig} to reach the child"), secs(3.0), || {
            (scratch.events().len() == n + 2).then_some(())
        });
    }
    let received: Vec<String> = scratch.events()[1..].to_vec();
    let expected: Vec<String> = sent
        .iter()
        .map(|s| s.as_str().trim_start_matches("SIG").to_owned())
        .collect();
    assert_eq!(received, expected);
    assert!(replica.running());
}

#[test]
fn as_pid_1_it_reaps_every_orphan() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root for a PID namespace (unshare --pid)"
    );
    const ORPHANS: usize = 200;
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    // The script is the main child and exits 7. Each subshell starts a `sleep` and exits at
    // once, so the sleep is orphaned and re-parented to PID 1 of the namespace: leaderrun. The
    // script records every orphan's pid, waits (bounded) until all are re-parented and records
    // `orphaned PID PPID STATE` for each; then it kills them all at once, so PID 1 has that
    // many dead children to reap, waits (bounded) until their /proc entries are gone (reaped,
    // not zombies) and records how many are left and how many zombies the namespace has.
    let script = scratch.child_script(
        "child.sh",
        &format!(
            "echo \"pid1 $(cat /proc/1/comm)\" >> \"$EVENTS\"\n\
             i=0; while [ $i -lt {ORPHANS} ]; do (sleep 600 & echo \"orphan $!\" >> \"$EVENTS\"); i=$((i+1)); done\n\
             files=$(awk '$1 == \"orphan\" {{print \"/proc/\" $2 \"/stat\"}}' \"$EVENTS\")\n\
             n=0; while [ $n -lt 200 ]; do\n\
               [ \"$(cat $files 2>/dev/null | awk '$4 == 1' | wc -l)\" -eq {ORPHANS} ] && break\n\
               n=$((n+1)); sleep 0.05\n\
             done\n\
             cat $files 2>/dev/null | awk '{{print \"orphaned\", $1, $4, $3}}' >> \"$EVENTS\"\n\
             kill $(awk '$1 == \"orphan\" {{print $2}}' \"$EVENTS\")\n\
             n=0; while [ $n -lt 200 ] && [ \"$(cat $files 2>/dev/null | wc -l)\" -gt 0 ]; do n=$((n+1)); sleep 0.05; done\n\
             echo \"left $(cat $files 2>/dev/null | wc -l)\" >> \"$EVENTS\"\n\
             echo \"zombies $(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l)\" >> \"$EVENTS\"\n\
             exit 7"
        ),
    );
    let mut cmd = std::process::Command::new("unshare");
    crate::support::default_signals(&mut cmd);
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--check-interval", INTERVAL, "--", script.to_str().unwrap()]);
    // Keep the test's environment out, like `leaderrun()` does.
    for (key, _) in leaderrun().get_envs() {
        cmd.env_remove(key);
    }
    let mut replica = Replica::spawn(cmd);
    let status = replica.wait_exit(secs(40.0));
    let events = scratch.events();
    let field = |prefix: &str| -> Vec<Vec<String>> {
        events
            .iter()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| l.split(' ').map(str::to_owned).collect())
            .collect()
    };
    assert!(
        events.contains(&"pid1 leaderrun".to_owned()),
        "{events:?}\n{}",
        replica.log()
    );
    // The orphans existed: ORPHANS distinct processes, each alive and a child of PID 1
    // (leaderrun) before any was killed.
    let orphans: std::collections::BTreeSet<String> =
        field("orphan ").into_iter().map(|f| f[0].clone()).collect();
    assert_eq!(orphans.len(), ORPHANS, "{events:?}");
    let orphaned = field("orphaned ");
    let adopted: std::collections::BTreeSet<String> = orphaned
        .iter()
        .filter(|f| f[1] == "1" && f[2] != "Z")
        .map(|f| f[0].clone())
        .collect();
    assert_eq!(
        adopted, orphans,
        "not every orphan was alive under PID 1: {orphaned:?}"
    );
    // And after they all died at once, PID 1 reaped every one: no zombie is left.
    assert_eq!(field("left "), [["0"]], "{events:?}");
    assert_eq!(field("zombies "), [["0"]], "{events:?}");
    assert_eq!(status.code(), Some(7), "{}", replica.log());
}

#[test]
fn exec_failure_after_start_is_reported_through_the_spawn() {
    exec_failure_is_reported_as_126(&[]);
}

/// The script is executable at lookup, but open for writing while it is exec'd, so exec fails
/// with ETXTBSY: that errno comes back through the spawn as 126, not a guess. `options` go
/// before `--` (`pidns` runs it with `--pid-namespace`, where the init execs it).
pub fn exec_failure_is_reported_as_126(options: &[&str]) {
    let scratch = Scratch::new();
    let script = scratch.child_script("busy.sh", "exit 0");
    let _writer = std::fs::OpenOptions::new()
        .append(true)
        .open(&script)
        .unwrap();
    let mut args = options.to_vec();
    args.extend(["--", script.to_str().unwrap()]);
    let mut replica = Replica::start(Cluster::shared(), unique_lock_id(), INTERVAL, &args);
    assert_eq!(
        replica.wait_exit(secs(10.0)).code(),
        Some(126),
        "{}",
        replica.log()
    );
    let log = replica.log();
    assert!(
        log.contains("cannot start") && log.contains("busy"),
        "{log}"
    );
    assert!(scratch.starts().is_empty());
}

#[test]
fn only_a_panic_that_unwinds_the_tree_kills_it() {
    use leaderrun::process::child::{Child, Command};
    let argv = vec![std::ffi::OsString::from("sleep"), "600".into()];
    let command = Command::resolve(argv, std::env::var_os("PATH").as_deref()).unwrap();
    let child = Child::spawn(&command, &[], Default::default()).unwrap();
    let pid = leaderrun::process::child::Tree::pid(&child) as i32;
    // A panic that is caught and survived elsewhere leaves the child alone.
    let caught = std::thread::spawn(|| std::panic::catch_unwind(|| panic!("caught and survived")))
        .join()
        .unwrap();
    assert!(caught.is_err());
    assert!(alive(pid), "a survived panic killed the child");
    // A panic that unwinds through the owner of the tree (the supervisor's loop, and so the
    // process) kills it.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _owned = child;
        panic!("unwinds through the tree's owner");
    }));
    assert!(unwound.is_err());
    // Dead when the drop returned, not only signalled: what the owner drops after the tree
    // (the term's hold, and so the lock) goes after the tree's end.
    assert!(!alive(pid), "the dropped tree was still running");
    // Reap it by pid: the test binary's other children are not ours to wait for.
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
}

#[test]
fn helpers_left_by_an_exited_command_are_stopped_before_exit() {
    let setup = Setup::new(
        Cluster::shared(),
        "sleep 600 & echo \"bg $!\" >> \"$EVENTS\"\nexit 5",
    );
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &[]);
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(5));
    let background: i32 = scratch.recorded_pid("bg ");
    assert!(!alive(background), "helper {background} outlived leaderrun");
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
    // A program opens files of its own as it starts (`sleep` reads the locale archive, then
    // closes it): one may show for a moment. A descriptor COMMAND inherited stays, and fails
    // this.
    let fds = || {
        let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", start.pid))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        fds.sort();
        fds
    };
    let deadline = Instant::now() + secs(5.0);
    while fds() != ["0", "1", "2"] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fds(), ["0", "1", "2"]);
}

#[test]
fn a_child_ignoring_the_stop_signal_is_killed_after_the_grace() {
    // An ignored TERM survives exec, so `sleep` ignores it too.
    let setup = Setup::new(Cluster::shared(), "trap '' TERM\nexec sleep 600");
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &["--grace", "1s"]);
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
    let setup = Setup::new(Cluster::shared(), "trap '' TERM\nexec sleep 600");
    let scratch = &setup.scratch;
    let mut replica = setup.replica(INTERVAL, &["--grace", "60s"]);
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
    // Killed on the second TERM, not because the 60 s grace ran out, and the log says which.
    let log = replica.log();
    assert!(log.contains("sending SIGKILL now"), "{log}");
    assert!(!log.contains("after the grace period"), "{log}");
}

/// The stop signal begins every stop: a demotion's, and a shutdown's too (`docker stop`'s
/// TERM to a leaderrun run with `--stop-signal USR1` reaches COMMAND as USR1, as a container's
/// `STOPSIGNAL` would; before, the TERM was passed on instead, so a program that shuts down
/// cleanly only on its own signal never got it). Other signals are passed on.
#[test]
fn stop_signal_and_forwarded_signals_reach_the_child() {
    let setup = Setup::new(
        Cluster::shared(),
        "trap 'echo hup >> \"$EVENTS\"' HUP\n\
         trap 'echo term >> \"$EVENTS\"; exit 0' TERM\n\
         trap 'echo usr1 >> \"$EVENTS\"; exit 0' USR1\n\
         while :; do sleep 0.05; done",
    );
    let (cluster, scratch) = (setup.cluster, &setup.scratch);
    let replica = setup.replica(INTERVAL, &["--stop-signal", "USR1"]);
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
    // Shutdown: the stop signal, not the TERM received; the exit is the child's status.
    let mut replica = replica;
    replica.signal(Signal::SIGTERM);
    assert_eq!(
        replica.wait_exit(secs(5.0)).code(),
        Some(0),
        "{}",
        replica.log()
    );
    let events = scratch.events();
    assert_eq!(
        events.iter().filter(|e| *e == "usr1").count(),
        2,
        "{events:?}"
    );
    assert!(!events.contains(&"term".to_owned()), "{events:?}");
}

/// The datagram a child sends before exec ([`leaderrun::process::child::Announcement`]) comes
/// with the child's pid (`SCM_CREDENTIALS`), and it comes even when the exec then fails: it
/// is sent before the exec, so nothing of COMMAND ever runs unannounced.
#[test]
fn the_child_announces_itself_before_exec_with_its_pid() {
    use leaderrun::process::child::{Announcement, Child, Command, Placement};
    use nix::sys::socket::{
        recvmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessageOwned, MsgFlags,
        SockFlag, SockType,
    };
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    setsockopt(&theirs, sockopt::PassCred, &true).unwrap();
    let announced = |theirs: &OwnedFd| -> Option<(Vec<u8>, i32)> {
        let mut buf = [0u8; 32];
        let mut space = nix::cmsg_space!(libc::ucred);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            theirs.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT,
        )
        .ok()?;
        let pid = msg.cmsgs().ok()?.find_map(|c| match c {
            ControlMessageOwned::ScmCredentials(creds) => Some(creds.pid()),
            _ => None,
        })?;
        let n = msg.bytes;
        Some((buf[..n].to_vec(), pid))
    };
    let spawn = |argv: Vec<std::ffi::OsString>| {
        let command = Command::resolve(argv, std::env::var_os("PATH").as_deref()).unwrap();
        let placement = Placement {
            announce: Some(Announcement {
                socket: ours.as_fd(),
                datagram: b"here I am",
            }),
            ..Placement::default()
        };
        Child::spawn(&command, &[], placement)
    };
    let child = spawn(vec!["sleep".into(), "600".into()]).unwrap();
    let pid = leaderrun::process::child::Tree::pid(&child) as i32;
    assert_eq!(announced(&theirs), Some((b"here I am".to_vec(), pid)));
    drop(child);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    // An executable file that cannot be exec'd (open for writing: ETXTBSY).
    let scratch = Scratch::new();
    let busy = scratch.child_script("busy.sh", "exit 0");
    let _writer = std::fs::OpenOptions::new()
        .append(true)
        .open(&busy)
        .unwrap();
    let failed = spawn(vec![busy.into_os_string()]).unwrap_err();
    assert_eq!(failed.exit_code(), 126, "{failed}");
    let (datagram, sender) = announced(&theirs).expect("announced before the failed exec");
    assert_eq!(datagram, b"here I am");
    assert!(
        sender > 0 && !alive(sender),
        "the failed child {sender} was reaped"
    );
}

/// A parent that blocked TERM, INT and CHLD before starting us (the mask survives exec) takes
/// no stop request away: leaderrun unblocks the signals it handles, so SIGTERM still ends a
/// leader and its child, and COMMAND's exit is seen at once, not at the reaper's next timer.
/// Before, both stayed pending for good (`ShdPnd` in `/proc`) and only SIGKILL or an unblocked
/// signal ended leaderrun.
#[test]
fn signals_the_parent_blocked_are_still_acted_on() {
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &Cluster::shared().dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", INTERVAL, "--"])
        .arg(&job);
    // SAFETY: sigprocmask between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
                libc::sigaddset(&mut set, sig);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut replica = Replica::spawn(cmd);
    let child = scratch.wait_starts(1, secs(10.0))[0].pid;
    // The spawn blocks signals around its clone for a moment, and COMMAND can start before its
    // parent's thread has unblocked them again: what must hold is that they end up unblocked.
    let handled = [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD]
        .iter()
        .fold(0u64, |mask, sig| mask | 1 << (sig - 1));
    wait_for("the handled signals unblocked", secs(5.0), || {
        let blocked = std::fs::read_to_string(format!("/proc/{}/status", replica.pid()))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:").map(|v| v.trim().to_owned()))?;
        let blocked = u64::from_str_radix(&blocked, 16).ok()?;
        (blocked & handled == 0).then_some(())
    });
    replica.signal(Signal::SIGTERM);
    assert_eq!(replica.wait_exit(secs(5.0)).code(), Some(143));
    assert!(!alive(child), "COMMAND outlived leaderrun");
}

/// The CPUs a process may run on, as `/proc/PID/status` lists them.
fn cpus_allowed(status: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/PID/status")
        .trim()
        .to_owned()
}

/// COMMAND runs on the CPUs leaderrun may run on: the spawn pins leaderrun's thread to its CPU
/// across the clone, and the child restores the affinity before anything else. Run with
/// leaderrun's own affinity, and again with leaderrun narrowed to the last CPU (on a machine with
/// more than one), a COMMAND left pinned to the spawning CPU would show one CPU where leaderrun
/// has several, or a CPU leaderrun may not use.
#[test]
fn command_inherits_leaderruns_cpu_affinity() {
    let cluster = Cluster::shared();
    let ours = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    // SAFETY: cpu_set_t is plain data; the pointer and size are valid.
    let mut mine: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut mine) }, 0);
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &mine) })
        .collect();
    let can_narrow = cpus.len() > 1;
    let last = *cpus.last().unwrap();
    for narrow in [false, true] {
        if narrow && !can_narrow {
            break;
        }
        let mut cmd = leaderrun();
        cmd.args([
            "-q",
            "--once",
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
            "--",
            "cat",
            "/proc/self/status",
        ]);
        if narrow {
            // SAFETY: sched_setaffinity between fork and exec, on a mask built before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let mut one: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(last, &mut one);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = cpus_allowed(&String::from_utf8_lossy(&out.stdout));
        let want = if narrow {
            last.to_string()
        } else {
            ours.clone()
        };
        assert_eq!(theirs, want, "narrowed to CPU {last}: {narrow}");
    }
}

/// Set for the test binary run as COMMAND by
/// [`a_command_that_moves_into_leaderruns_group_is_still_stopped`]: the file to record in.
const JOINER: &str = "LEADERRUN_TEST_JOIN_PARENTS_GROUP";

/// As COMMAND: moves into its parent's (leaderrun's) process group, as `setpgid` lets any
/// process do within its session, starts `sleep 600` there, records both pids, and waits. It
/// dies of SIGTERM (no handler).
fn join_parents_group(record: &str) {
    let group = nix::unistd::getpgid(Some(nix::unistd::getppid())).expect("the parent's group");
    nix::unistd::setpgid(Pid::from_raw(0), group).expect("setpgid into the parent's group");
    // Never waited for: this process waits until the stop kills it.
    #[allow(clippy::zombie_processes)]
    let sleeper = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("spawn sleep");
    std::fs::write(record, format!("{} {}\n", std::process::id(), sleeper.id()))
        .expect("record the pids");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A COMMAND that leaves its own process group for leaderrun's (the same session, so
/// `setpgid` allows it) is stopped all the same: the stop signal reaches it by pid, and what
/// it started there is an orphan of leaderrun once it died, stopped too. Before, the group's
/// signal missed it and it was no orphan: it got no stop signal, was killed by pid only 5 s
/// after the grace, and its `sleep` lived on beside the next leader's tree.
#[test]
fn a_command_that_moves_into_leaderruns_group_is_still_stopped() {
    if let Ok(record) = std::env::var(JOINER) {
        return join_parents_group(&record);
    }
    let scratch = Scratch::new();
    let record = scratch.file("joined");
    let me = std::env::current_exe().unwrap();
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &Cluster::shared().dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--once", "--timeout", "1s", "--grace", "20s", "--"])
        .arg(&me)
        .args([
            "child::a_command_that_moves_into_leaderruns_group_is_still_stopped",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(JOINER, &record);
    let mut replica = Replica::spawn(cmd);
    let (joiner, sleeper) = wait_for("COMMAND in leaderrun's group", secs(10.0), || {
        let text = std::fs::read_to_string(&record).ok()?;
        let (a, b) = text.trim().split_once(' ')?;
        Some((a.parse::<i32>().ok()?, b.parse::<i32>().ok()?))
    });
    // The timeout's stop: the stop signal ends COMMAND at once, well inside the grace.
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(124), "{status:?}\n{}", replica.log());
    assert!(
        !replica.log().contains("SIGKILL"),
        "the stop signal did not end COMMAND:\n{}",
        replica.log()
    );
    for pid in [joiner, sleeper] {
        assert!(!alive(pid), "{pid} outlived leaderrun:\n{}", replica.log());
    }
}

/// The child execs COMMAND only before `exec_by`, the end of the proof its start was made
/// under (CLOCK_BOOTTIME), checked just before exec: a spawn that comes later (a machine
/// that stalled since the check) fails as `ProofLapsed` and COMMAND never runs (rule 1).
#[test]
fn the_child_never_execs_command_after_the_proofs_end() {
    use leaderrun::process::child::{Child, Command, Placement, SpawnError};
    let now = leaderrun::elector::boottime();
    for (exec_by, runs) in [
        (Some(now - Duration::from_millis(1)), false),
        (Some(now + Duration::from_secs(600)), true),
        (None, true),
    ] {
        let scratch = Scratch::new();
        let ran = scratch.file("ran");
        let argv = vec!["touch".into(), ran.clone().into_os_string()];
        let command = Command::resolve(argv, std::env::var_os("PATH").as_deref()).unwrap();
        let placement = Placement {
            exec_by,
            ..Placement::default()
        };
        match Child::spawn(&command, &[], placement) {
            Ok(child) => {
                assert!(runs, "{exec_by:?}: started after the proof's end");
                let pid = leaderrun::process::child::Tree::pid(&child) as i32;
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                assert!(ran.exists(), "{exec_by:?}: COMMAND did not run");
            }
            Err(err) => {
                assert!(!runs, "{exec_by:?}: {err}");
                assert!(matches!(err, SpawnError::ProofLapsed), "{err}");
                assert!(
                    !ran.exists(),
                    "{exec_by:?}: COMMAND ran after the proof's end"
                );
            }
        }
    }
}

/// Without `/proc` (a chroot or a mount namespace without it) no orphan of COMMAND can be
/// named, and leaderrun's own watchdog is a child that never ends: the stop counted "any
/// child left" and so waited out the grace and 5 s after SIGKILL at every run, with two WARN
/// lines (a one-shot on a good night mailed cron twice). Now the group and the main child
/// count, and one WARN at the first stop says what cannot be done without `/proc`.
#[test]
fn without_proc_a_stop_does_not_wait_for_the_watchdog() {
    const TEST: &str = "child::without_proc_a_stop_does_not_wait_for_the_watchdog";
    if !nix::unistd::geteuid().is_root() {
        return crate::support::cluster::skip(TEST, "needs root to unmount /proc");
    }
    let cluster = Cluster::shared();
    let mut cmd = crate::support::wrapper("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("umount -l /proc && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--once", "--grace", "5s", "--", "sh", "-c", "sleep 0.1"]);
    let mut run = Replica::spawn(cmd);
    let status = run.wait_exit(secs(30.0));
    let log = run.log();
    if log.contains("umount:") {
        return crate::support::cluster::skip(TEST, "cannot unmount /proc here");
    }
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains("still running"), "{log}");
    assert_eq!(log.matches("no /proc").count(), 1, "{log}");
}

/// PID 1 of a namespace that has no procfs of its own (`unshare --pid --fork` without
/// `--mount-proc`, as the README's own `--kill-child` recipe runs it) reads the machine's pids
/// in `/proc`: its main child and its watchdog looked like orphans that never end, and an
/// orphan's signals went to a pid that is not it. Every stop waited out the grace and 5 s
/// after SIGKILL, and an orphan of COMMAND that left its group was never signalled at all, so
/// it outlived the stop. Now the pids are translated: the orphan gets the stop signal and the
/// run ends with it.
#[test]
fn as_pid_1_with_the_machines_proc_orphans_are_stopped() {
    const TEST: &str = "child::as_pid_1_with_the_machines_proc_orphans_are_stopped";
    if !nix::unistd::geteuid().is_root() {
        return crate::support::cluster::skip(TEST, "needs root for a PID namespace");
    }
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    // The orphan leaves the group, says it is up, and records the stop signal when it comes;
    // COMMAND exits once it is up, so the orphan is re-parented to leaderrun (PID 1).
    let script = scratch.child_script(
        "child.sh",
        "export EVENTS\n\
         setsid sh -c 'trap \"echo orphan TERM >> \\\"$EVENTS\\\"; exit 0\" TERM; \
           echo orphan up >> \"$EVENTS\"; while :; do sleep 0.1; done' &\n\
         n=0; while [ $n -lt 100 ] && ! grep -q 'orphan up' \"$EVENTS\"; do n=$((n+1)); sleep 0.05; done",
    );
    let mut cmd = crate::support::wrapper("unshare");
    cmd.args(["--pid", "--fork"])
        .arg(env!("CARGO_BIN_EXE_leaderrun"))
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--once", "--grace", "20s", "--", script.to_str().unwrap()]);
    let mut run = Replica::spawn(cmd);
    let status = run.wait_exit(secs(40.0));
    let log = run.log();
    let events = scratch.events();
    assert!(
        events.contains(&"orphan up".to_owned()),
        "{events:?}\n{log}"
    );
    assert!(
        events.contains(&"orphan TERM".to_owned()),
        "the orphan never got the stop signal: {events:?}\n{log}"
    );
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains("still running"), "{log}");
    assert!(!log.contains("still there"), "{log}");
}
