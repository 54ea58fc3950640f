//! Nothing outside the election holds up the fence: a stderr that does not take leaderrun's
//! lines (stalled or closed), a parent that does not reap, what COMMAND inherits, leaderrun and
//! its watchdog killed together.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{
    alive, leaderrun, sample, secs, unique_lock_id, wait_for, watchdog_of, Cluster, Replica,
    Scratch, Setup, CLASS, INTERVAL,
};

/// Child script that records `began PID NS` and, on TERM, `ended PID NS`. Its own stderr is
/// /dev/null: it inherits leaderrun's, and sh reports its `sleep` killed by TERM there, which
/// would block (or kill it with SIGPIPE) before the trap.
const TIMED_CHILD: &str = "exec 2>/dev/null\n\
     echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     trap 'echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
     while :; do sleep 0.02; done";

/// What leaderrun's stderr is in a test.
#[derive(Clone, Copy, Debug)]
enum Stderr {
    /// A pipe whose reader never reads, full before leaderrun starts: every write blocks.
    Stalled,
    /// A pipe whose reader is gone: every write fails with EPIPE.
    Closed,
    /// A regular file already at leaderrun's `RLIMIT_FSIZE`: every write fails with EFBIG,
    /// and raises SIGXFSZ, whose default action ends the process.
    AtSizeLimit,
}

/// [`Stderr::AtSizeLimit`]'s limit, in bytes, and what its file holds before leaderrun starts.
const SIZE_LIMIT: u64 = 1024;

/// A pipe `(read end, write end)`, full when `fill` (the write end is left blocking).
fn pipe(fill: bool) -> (OwnedFd, OwnedFd) {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    if fill {
        let fd = write.as_raw_fd();
        // SAFETY: fcntl and write on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            let chunk = [b'x'; 4096];
            while libc::write(fd, chunk.as_ptr().cast(), chunk.len()) > 0 {}
            // Byte by byte to the last free byte.
            while libc::write(fd, chunk.as_ptr().cast(), 1) > 0 {}
            libc::fcntl(fd, libc::F_SETFL, flags);
        }
    }
    (read, write)
}

/// Sets `O_NONBLOCK` on `fd`'s open file description, as a Node.js or Go parent leaves a pipe.
fn set_non_blocking(fd: &OwnedFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// Gives `cmd` a stderr file `file` filled to [`SIZE_LIMIT`] under a `ulimit -f` of that size:
/// every write to it fails (EFBIG) until the file is cut back.
fn at_size_limit(cmd: &mut std::process::Command, mut file: std::fs::File) {
    file.write_all(&[b'x'; SIZE_LIMIT as usize]).unwrap();
    let limit = libc::rlimit {
        rlim_cur: SIZE_LIMIT,
        rlim_max: SIZE_LIMIT,
    };
    // SAFETY: setrlimit only, async-signal-safe, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.stderr(Stdio::from(file));
}

/// A stderr file opened to append (as a shell's `2>>`), so that writes go on at its end after
/// the test cut it back; with a second handle for the test.
fn append_file(path: &std::path::Path) -> (std::fs::File, std::fs::File) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    (file.try_clone().unwrap(), file)
}

/// Runs a one-term leaderrun of `script` (it exits 0 on its own) with stderr the pipe's `write`
/// end, reads the pipe once COMMAND runs, and returns what leaderrun wrote (the pipe's filler
/// taken off), once it exited 0.
fn run_reading_stderr(
    cluster: &Cluster,
    scratch: &Scratch,
    script: &str,
    read: OwnedFd,
    write: OwnedFd,
) -> String {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "300ms", "--", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write));
    let mut leader = Muted {
        child: cmd.spawn().expect("spawn leaderrun"),
        _reader: None,
    };
    drop(cmd);
    // COMMAND runs: what was logged before went into the pipe as far as it took it.
    scratch.wait_starts(1, secs(10.0));
    let mut out = Vec::new();
    std::fs::File::from(read)
        .read_to_end(&mut out)
        .expect("read stderr");
    assert_eq!(leader.wait_exit(secs(10.0)), Some(0));
    String::from_utf8_lossy(&out)
        .trim_start_matches('x')
        .to_owned()
}

/// A leaderrun whose stderr is `stderr`'s; killed (and its watchdog with it) when dropped.
struct Muted {
    child: Child,
    /// The read end of a stalled pipe, kept open and never read.
    _reader: Option<OwnedFd>,
}

impl Muted {
    fn start(cluster: &Cluster, id: i32, interval: &str, stderr: Stderr, args: &[&str]) -> Muted {
        let mut cmd = leaderrun();
        cmd.args(["-v", "--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
            .args(["--check-interval", interval])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let reader = if let Stderr::AtSizeLimit = stderr {
            at_size_limit(&mut cmd, tempfile::tempfile().expect("a file for stderr"));
            None
        } else {
            let (read, write) = pipe(matches!(stderr, Stderr::Stalled));
            cmd.stderr(Stdio::from(write));
            matches!(stderr, Stderr::Stalled).then_some(read)
        };
        Muted {
            child: cmd.spawn().expect("spawn leaderrun"),
            _reader: reader,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("signal leaderrun");
    }

    /// Its exit code, waiting at most `within`.
    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let child = &mut self.child;
        wait_for("leaderrun to exit", within, || {
            child.try_wait().expect("try_wait")
        })
        .code()
    }
}

impl Drop for Muted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The leader's session is terminated while its stderr does not take lines: the old child is
/// stopped at once (not when the pipe drains), a waiting standby's child does not overlap it
/// by more than the child's own exit on TERM, and SIGTERM to leaderrun is still acted on.
fn terminated_session_with(stderr: Stderr) {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", TIMED_CHILD);
    let script = script.to_str().unwrap();
    let mut leader = Muted::start(cluster, id, "300ms", stderr, &["--", script]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.ppid, leader.pid());
    let _standby = Replica::start(cluster, id, "300ms", &["--", script]);
    wait_for("the standby to wait for the lock", secs(10.0), || {
        (cluster.waiters(id) >= 1).then_some(())
    });
    cluster.terminate_backend(first.backend_pid);
    let terminated = Instant::now();
    wait_for("the old child to be stopped", secs(5.0), || {
        (!alive(first.pid)).then_some(())
    });
    let took = terminated.elapsed();
    // The stop is one message and one signal away; 1 s leaves room for a loaded machine (the
    // pipe never drains here, so a blocked log line would hold it for good).
    assert!(took < secs(1.0), "the old child was stopped after {took:?}");
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, leader.pid());
    let (ended, began) = scratch.ended_and_began(first.pid, second.pid);
    // The server freed the lock at once: the overlap is the old child's exit on TERM, at most
    // the grace (the interval, 300 ms).
    assert!(
        ended - began < 0.3,
        "old child ended at {ended:.3}, new began at {began:.3}"
    );
    // Still campaigning with a dead stderr; SIGTERM ends it at once (exit 0 as a standby),
    // the exit not held by queued lines beyond the flush bound.
    let watchdog = watchdog_of(leader.pid());
    leader.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let code = leader.wait_exit(secs(5.0));
    assert!(sent.elapsed() < secs(2.0), "exit took {:?}", sent.elapsed());
    assert_eq!(code, Some(0));
    if let Some(watchdog) = watchdog {
        wait_for("the watchdog to exit", secs(2.0), || {
            (!alive(watchdog)).then_some(())
        });
    }
}

#[test]
fn a_stalled_stderr_holds_up_neither_the_stop_of_a_terminated_session_nor_sigterm() {
    terminated_session_with(Stderr::Stalled);
}

#[test]
fn a_closed_stderr_holds_up_neither_the_stop_of_a_terminated_session_nor_sigterm() {
    terminated_session_with(Stderr::Closed);
}

/// A frozen leader (SIGSTOP, leaderrun alone) whose stderr, shared with the watchdog, does not
/// take lines: the watchdog still stops the tree before the standby can lead, and lives on.
fn frozen_leader_with(stderr: Stderr) {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", TIMED_CHILD);
    let script = script.to_str().unwrap();
    let leader = Muted::start(cluster, id, "300ms", stderr, &["--", script]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.ppid, leader.pid());
    let _standby = Replica::start(cluster, id, "300ms", &["--", script]);
    let watchdog = wait_for("the leader's watchdog", secs(5.0), || {
        watchdog_of(leader.pid())
    });
    let writes_before = write_calls(watchdog);
    leader.signal(Signal::SIGSTOP);
    let frozen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, leader.pid());
    let (ended, _) = scratch.assert_no_overlap(first.pid, second.pid, "");
    assert!(!alive(first.pid), "the frozen leader's child is dead");
    // At most the safe window (2 × 300 ms) and the stall (150 ms) after the last check, and
    // the child's exit on TERM; 3 s leaves room for a loaded machine.
    assert!(
        ended - frozen < 3.0,
        "stopped {:.3} s after the freeze",
        ended - frozen
    );
    if let Stderr::AtSizeLimit = stderr {
        // Its line written (or tried), and back waiting for messages, or dead of it.
        wait_for("the watchdog's line", secs(5.0), || {
            let wchan = std::fs::read_to_string(format!("/proc/{watchdog}/wchan")).ok()?;
            (write_calls(watchdog)? > writes_before?
                && (!alive(watchdog) || wchan.contains("poll")))
            .then_some(())
        });
    }
    assert!(alive(watchdog), "the watchdog survived its own writes");
    leader.signal(Signal::SIGCONT);
}

/// The `write(2)` calls `pid` has made (`syscw` of `/proc/PID/io`).
fn write_calls(pid: i32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("syscw: "))
        .and_then(|n| n.parse().ok())
}

#[test]
fn a_frozen_leaders_watchdog_stops_the_tree_with_a_stalled_stderr() {
    frozen_leader_with(Stderr::Stalled);
}

#[test]
fn a_frozen_leaders_watchdog_stops_the_tree_with_a_closed_stderr() {
    frozen_leader_with(Stderr::Closed);
}

/// stderr a file at the size limit (`ulimit -f`, a log file that reached it): the watchdog's
/// line fails with EFBIG and raises SIGXFSZ. Before, that signal's default action killed the
/// watchdog right after it had stopped the tree, and a frozen leaderrun was left unguarded.
#[test]
fn a_frozen_leaders_watchdog_survives_a_stderr_file_at_the_size_limit() {
    frozen_leader_with(Stderr::AtSizeLimit);
}

/// A free port on 127.0.0.1 (bound and let go: the test's replica binds it next).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET /metrics`: the body, or `None` while nothing answers.
fn metrics(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(secs(5.0))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

const DROPPED: &str = "leaderrun_log_lines_dropped_total";

#[test]
fn log_lines_stderr_does_not_take_are_counted_and_reported_once_it_takes_them() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let script = script.to_str().unwrap();
    // The counter is there from the start, at 0.
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let quiet = Replica::start(
        cluster,
        unique_lock_id(),
        "300ms",
        &["--http-addr", &http, "--", script],
    );
    let addr: SocketAddr = http.parse().unwrap();
    let body = wait_for("/metrics", secs(10.0), || metrics(addr));
    assert_eq!(sample(&body, DROPPED), Some(0.0), "{body}");
    drop(quiet);

    // A stderr file at the size limit (`ulimit -f`): every write fails (EFBIG) until the file
    // is cut back.
    let log = scratch.file("stderr.log");
    let (file, stderr) = append_file(&log);
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let mut cmd = leaderrun();
    cmd.args(["-vv", "--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args([
            "--check-interval",
            "300ms",
            "--http-addr",
            &http,
            "--",
            script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    at_size_limit(&mut cmd, stderr);
    let leader = Muted {
        child: cmd.spawn().expect("spawn leaderrun"),
        _reader: None,
    };
    let addr: SocketAddr = http.parse().unwrap();
    let dropped = wait_for("dropped lines counted", secs(10.0), || {
        let body = metrics(addr)?;
        sample(&body, DROPPED).filter(|&n| n > 0.0)
    });
    scratch.wait_starts(1, secs(10.0));
    // Room again: after the next line that goes through (at -vv every check logs one), one
    // line says how many were lost.
    file.set_len(0).unwrap();
    let line = wait_for("the report of dropped lines", secs(10.0), || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .find(|l| l.contains("log line(s) were dropped"))
            .map(str::to_owned)
    });
    assert!(line.contains("WARN"), "{line}");
    let reported = report_field(&line, "total");
    assert!(reported >= dropped, "{line}: counted {dropped} before");
    drop(leader);
}

/// A stderr in non-blocking mode (as a Node.js or Go parent leaves a pipe) with room for only
/// part of a line longer than `PIPE_BUF` (here the first line, which names a COMMAND with a
/// path of 3.9 KB): the pipe takes its head, and the rest is written once the reader reads.
/// Before, the rest was dropped and the next line ran on from the head: one line torn, two
/// records run together.
#[test]
fn a_line_a_non_blocking_stderr_takes_in_part_is_finished_not_torn() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let dir = vec!["d".repeat(200); 19].join("/");
    std::fs::create_dir_all(scratch.file(&dir)).unwrap();
    // Kept alive until the reader reads: leaderrun exits with it.
    let script = scratch.child_script(&format!("{dir}/job"), "sleep 0.5");
    let script = script.to_str().unwrap();
    assert!(
        script.len() > 3800 && script.len() < 4096,
        "{}",
        script.len()
    );
    let (read, write) = pipe(true);
    set_non_blocking(&write);
    // SAFETY: read on a descriptor we own.
    unsafe {
        // One page free: room for the head of a long line, not for all of it.
        let mut page = [0u8; 4096];
        assert_eq!(
            libc::read(read.as_raw_fd(), page.as_mut_ptr().cast(), page.len()),
            4096
        );
    }
    let out = run_reading_stderr(cluster, &scratch, script, read, write);
    let lines: Vec<&str> = out.lines().collect();
    let campaigning = lines
        .iter()
        .find(|l| l.contains("campaigning"))
        .unwrap_or_else(|| panic!("no campaigning line in {lines:#?}"));
    // Longer than the page the pipe had room for: written in two parts.
    assert!(campaigning.len() > 4096, "{}", campaigning.len());
    assert!(
        campaigning.ends_with(&format!("command={script}")),
        "{campaigning}"
    );
    for line in &lines {
        let records = line.matches("Z  INFO ").count() + line.matches("Z  WARN ").count();
        assert_eq!(records, 1, "one record a line: {line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("child exited")),
        "{lines:#?}"
    );
}

/// Lines dropped after the last line that went through are said at exit: a leader at `-q`
/// whose first run failed (its WARN dropped by a stderr file at the size limit) and whose
/// restart then succeeded says nothing more, so only the exit is left to report the drop.
/// Before, the lost line was never reported.
#[test]
fn lines_dropped_after_the_last_written_one_are_reported_at_exit() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let go = scratch.file("go");
    // The first run fails at once; the second waits for the test, then succeeds.
    let script = scratch.child_script(
        "child.sh",
        &format!(
            "if [ ! -e \"$0.ran\" ]; then : > \"$0.ran\"; exit 2; fi\n\
             while [ ! -e {} ]; do sleep 0.02; done\nexit 0",
            go.display()
        ),
    );
    let log = scratch.file("stderr.log");
    let (file, stderr) = append_file(&log);
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let mut cmd = leaderrun();
    cmd.args(["-q", "--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "300ms", "--restart", "on-failure"])
        .args(["--http-addr", &http, "--"])
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    at_size_limit(&mut cmd, stderr);
    let mut leader = Muted {
        child: cmd.spawn().expect("spawn leaderrun"),
        _reader: None,
    };
    let addr: SocketAddr = http.parse().unwrap();
    // The failed run's WARN, dropped.
    wait_for("the failed run's line dropped", secs(10.0), || {
        sample(&metrics(addr)?, DROPPED).filter(|&n| n >= 1.0)
    });
    scratch.wait_starts(2, secs(10.0));
    file.set_len(0).unwrap();
    std::fs::write(&go, "").unwrap();
    assert_eq!(leader.wait_exit(secs(10.0)), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("log line(s) were dropped"))
        .unwrap_or_else(|| panic!("no report at exit in {text:?}"));
    assert!(report_field(line, "total") >= 1.0, "{line}");
}

/// A stderr in non-blocking mode whose pipe is full while leaderrun starts (its reader a
/// moment behind, as a busy Node.js parent is): every line arrives once the reader reads, none
/// is dropped. Before, each line that met the full pipe failed with EAGAIN and was dropped at
/// once, though the queue had room for thousands: the start line, the grant and the child's
/// start were lost, and a WARN said so.
#[test]
fn a_non_blocking_stderr_that_is_full_for_a_moment_loses_no_line() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let script = scratch.child_script("job", "sleep 0.5");
    let (read, write) = pipe(true);
    set_non_blocking(&write);
    let out = run_reading_stderr(cluster, &scratch, script.to_str().unwrap(), read, write);
    for said in [
        "campaigning",
        "lock acquired",
        "child started",
        "child exited",
    ] {
        assert!(out.contains(said), "no {said:?} in:\n{out}");
    }
    assert!(!out.contains("were dropped"), "{out}");
}

/// Reads `read` until the line that reports dropped log lines, at most `within`: that line.
fn read_until_report(read: OwnedFd, within: Duration) -> String {
    let mut reader = std::fs::File::from(read);
    let mut out = Vec::new();
    let mut chunk = [0u8; 65536];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match reader.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
        if String::from_utf8_lossy(&out).contains("were dropped") {
            break;
        }
    }
    let out = String::from_utf8_lossy(&out);
    out.lines()
        .find(|l| l.contains("log line(s) were dropped"))
        .unwrap_or_else(|| panic!("no report of dropped lines in {} bytes", out.len()))
        .to_owned()
}

/// The number in field `name=` of a report line.
fn report_field(line: &str, name: &str) -> f64 {
    line.split(&format!("{name}="))
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

/// A stderr that blocks (a stalled pipe, filled) until the log's queue is full too: the lines
/// the queue refuses are counted, and once the reader reads again the first report says how
/// many, all of them. Before, the report joined the still full queue and was itself dropped,
/// and the one after said "1".
#[test]
fn a_full_log_queue_is_reported_whole_once_stderr_takes_lines_again() {
    let cluster = Cluster::shared();
    let (read, write) = pipe(true);
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let mut cmd = leaderrun();
    // A tick every 5 ms at debug level: several hundred lines a second.
    cmd.args(["-vv", "--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args([
            "--check-interval",
            "100ms",
            "--every",
            "5ms",
            "--http-addr",
            &http,
        ])
        .args(["--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write));
    let leader = Muted {
        child: cmd.spawn().expect("spawn leaderrun"),
        _reader: None,
    };
    let addr: SocketAddr = http.parse().unwrap();
    let counted = wait_for("the full queue to refuse lines", secs(60.0), || {
        sample(&metrics(addr)?, DROPPED).filter(|&n| n >= 100.0)
    });
    let line = read_until_report(read, secs(20.0));
    assert!(
        report_field(&line, "dropped") >= counted,
        "{line}: {counted} counted before the reader read"
    );
    drop(leader);
}

/// The environment variable that makes [`no_zombie_is_left_to_a_parent_that_does_not_reap`]
/// the non-reaping parent itself, in a process of its own: `DSN LOCK_ID`.
const AS_PARENT: &str = "FENCE_TEST_NON_REAPING_PARENT";

/// This process's children, read from `/proc/self/task/*/children`.
fn own_children() -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
    {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    out
}

/// Runs every mode once under this process as a subreaper that reaps nothing but its own
/// direct child (`wait` on its pid): right after each run's exit, nothing of leaderrun's is
/// left among this process's children (its watchdog, alive or a zombie, would be). Then a
/// one-shot stopped by SIGTERM while start-up blocks reading its service file (a FIFO).
fn be_a_non_reaping_parent(setting: &str) {
    let (dsn, id) = setting.rsplit_once(' ').expect("DSN LOCK_ID");
    // SAFETY: plain prctl on this process.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
        0,
        "PR_SET_CHILD_SUBREAPER"
    );
    let scratch = Scratch::new();
    let marker = scratch.file("ticked");
    let tick = format!("touch '{}'", marker.display());
    let modes: [&[&str]; 4] = [
        &["--once", "--", "true"],
        &["--wait", "5s", "--", "true"],
        &["--", "true"],
        &["--every", "200ms", "--", "sh", "-c", &tick],
    ];
    for args in modes {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", dsn, "--lock-id", id, "--check-interval", "200ms"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(scratch.file("log")).expect("log file"),
            ));
        let mut child = cmd.spawn().expect("spawn leaderrun");
        let pid = child.id() as i32;
        let watchdog = wait_for("its watchdog", secs(10.0), || {
            watchdog_of(pid).or_else(|| child.try_wait().unwrap().map(|_| 0))
        });
        if args[0] == "--every" {
            wait_for("a tick", secs(10.0), || marker.exists().then_some(()));
            kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
        }
        let status = child.wait().expect("wait for leaderrun");
        // A SIGTERM that lands while a tick's `sh -c touch` still runs passes on its status
        // (143), as a stopped leader does.
        let stopped_mid_tick = args[0] == "--every" && status.code() == Some(143);
        assert!(
            status.success() || stopped_mid_tick,
            "{args:?}: {status:?}; log:\n{}",
            std::fs::read_to_string(scratch.file("log")).unwrap_or_default()
        );
        assert!(watchdog != pid);
        let left = own_children();
        assert!(
            left.is_empty(),
            "{args:?}: leaderrun left {left:?} to its parent (its watchdog was {watchdog})"
        );
    }
    let fifo = scratch.file("service");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut child = leaderrun()
        .args([
            "--dsn",
            &format!("service=x {dsn}"),
            "--lock-id",
            id,
            "--once",
        ])
        .args(["--", "true"])
        .env("PGSERVICEFILE", &fifo)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn leaderrun");
    let pid = child.id() as i32;
    let watchdog = wait_for("its watchdog, and its open of the FIFO", secs(10.0), || {
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()?;
        (wchan.contains("fifo") || wchan.contains("partner"))
            .then(|| watchdog_of(pid))
            .flatten()
    });
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let status = child.wait().expect("wait for leaderrun");
    assert_eq!(status.code(), Some(0), "stopped in start-up: {status:?}");
    let left = own_children();
    assert!(
        left.is_empty(),
        "stopped in start-up, leaderrun left {left:?} to its parent (its watchdog was {watchdog})"
    );
}

#[test]
fn no_zombie_is_left_to_a_parent_that_does_not_reap() {
    if let Ok(setting) = std::env::var(AS_PARENT) {
        return be_a_non_reaping_parent(&setting);
    }
    let cluster = Cluster::shared();
    // This test again, alone, in a process of its own (a subreaper would adopt the orphans
    // of every other test running here).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "fence::no_zombie_is_left_to_a_parent_that_does_not_reap",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AS_PARENT, format!("{} {}", cluster.dsn(), unique_lock_id()))
        .output()
        .expect("run the parent");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn command_inherits_the_environment_but_not_socket_activation_or_systemds_watchdog() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let dump = scratch.file("env");
    let job = format!("env > '{}'", dump.display());
    let mut cmd = leaderrun();
    cmd.args(["--lock-id", &unique_lock_id().to_string(), "--once"])
        .args(["--", "sh", "-c", &job])
        .env("LEADERRUN_DSN", cluster.dsn())
        .env("PGPASSWORD", "not-needed-with-trust")
        .env("FENCE_TEST_INHERITED", "yes")
        .env("LISTEN_FDS", "2")
        .env("LISTEN_PID", std::process::id().to_string())
        .env("LISTEN_FDNAMES", "http:admin")
        .env("WATCHDOG_PID", std::process::id().to_string());
    let out = cmd.output().expect("run leaderrun --once");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&dump).expect("the child's environment");
    let has = |name: &str| env.lines().any(|l| l.starts_with(&format!("{name}=")));
    for kept in [
        "FENCE_TEST_INHERITED",
        "LEADERRUN_DSN",
        "PGPASSWORD",
        "LEADERRUN_TERM",
        "LEADERRUN_FENCING_TOKEN",
    ] {
        assert!(
            has(kept),
            "{kept} missing from the child's environment:\n{env}"
        );
    }
    for dropped in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_PID"] {
        assert!(
            !has(dropped),
            "{dropped} in the child's environment:\n{env}"
        );
    }
}

#[test]
fn a_frozen_leaders_tree_is_stopped_at_once_when_the_server_ends_its_session() {
    let setup = Setup::new(Cluster::shared(), TIMED_CHILD);
    let (cluster, id, scratch) = (setup.cluster, setup.id, &setup.scratch);
    // A long interval: the freeze path alone would stop the tree 2 × 2 s + 1 s after the last
    // check.
    let mut leader = setup.replica("2s", &[]);
    let first = scratch.wait_starts(1, secs(10.0))[0].clone();
    assert_eq!(first.ppid, leader.pid());
    let _standby = setup.replica("200ms", &[]);
    wait_for("the standby to wait for the lock", secs(10.0), || {
        (cluster.waiters(id) >= 1).then_some(())
    });
    let watchdog = wait_for("the leader's watchdog", secs(5.0), || {
        watchdog_of(leader.pid())
    });
    leader.signal(Signal::SIGSTOP);
    cluster.terminate_backend(first.backend_pid);
    let terminated = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, leader.pid());
    let (ended, began) = scratch.ended_and_began(first.pid, second.pid);
    eprintln!(
        "stopped {:.3} s after the termination; overlap {:.3} s",
        ended - terminated,
        ended - began
    );
    // The watchdog saw the server close the session: it left it 100 ms to leaderrun, then
    // stopped the tree. 1 s leaves room for a loaded machine (the freeze path: 5 s).
    assert!(
        ended - terminated < 1.0,
        "the old child ended {:.3} s after the termination",
        ended - terminated
    );
    assert!(
        ended - began < 1.0,
        "overlap: old child ended at {ended:.3}, new began at {began:.3}"
    );
    assert!(alive(watchdog));
    // Resumed, it demotes and stands by: the stop was the watchdog's, not COMMAND's own exit
    // (which would end a `--restart never` leaderrun).
    leader.signal(Signal::SIGCONT);
    leader.wait_log("background leader lock lost", 1, secs(5.0));
    leader.wait_log("child stopped after demotion", 1, secs(5.0));
    assert!(leader.running(), "{}", leader.log());
}

#[test]
fn a_dead_watchdog_is_replaced_at_once_even_with_nothing_to_tell_it() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let scratch = &setup.scratch;
    let _leader = setup.replica("300ms", &[]);
    scratch.wait_starts(1, secs(10.0));
    // A standby sends its watchdog nothing (no tree, no heartbeat): only its pidfd tells.
    let standby = setup.replica("300ms", &[]);
    let old = wait_for("the standby's watchdog", secs(5.0), || {
        watchdog_of(standby.pid())
    });
    kill(Pid::from_raw(old), Signal::SIGKILL).unwrap();
    let new = wait_for("a new watchdog", secs(2.0), || {
        watchdog_of(standby.pid()).filter(|&p| p != old)
    });
    assert!(alive(new));
}

#[test]
fn killing_the_watchdog_then_leaderrun_a_moment_later_leaves_nothing_of_the_tree() {
    // A helper in COMMAND's group: only the direct child dies with leaderrun (PDEATHSIG).
    let setup = Setup::new(
        Cluster::shared(),
        "sleep 600 &\necho \"helper $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let scratch = &setup.scratch;
    // The default interval: heartbeats every 250 ms, which alone would leave the tree alone
    // for up to that long.
    let leader = setup.replica("5s", &[]);
    scratch.wait_starts(1, secs(10.0));
    let helper = scratch.recorded_pid("helper ");
    let watchdog = wait_for("the leader's watchdog", secs(5.0), || {
        watchdog_of(leader.pid())
    });
    kill(Pid::from_raw(watchdog), Signal::SIGKILL).unwrap();
    // Wait for the replacement (at once), not a fixed time: what is measured is that nothing
    // between the two kills is left to a heartbeat.
    let started = Instant::now();
    wait_for("a new watchdog", secs(2.0), || {
        watchdog_of(leader.pid()).filter(|&p| p != watchdog)
    });
    let replaced = started.elapsed();
    leader.signal(Signal::SIGKILL);
    wait_for("the helper to be killed", secs(3.0), || {
        (!alive(helper)).then_some(())
    });
    assert!(replaced < secs(1.0), "replaced after {replaced:?}");
}

/// Whether `pid` is stopped (state `T` in `/proc/PID/stat`).
fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name's closing parenthesis.
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|state| state == "T")
        })
        .unwrap_or(false)
}

/// A watchdog stopped from outside (`kill -STOP`) guards nothing: a `kill -9` of leaderrun
/// then left COMMAND's helpers running beside the next leader's tree. leaderrun continues it
/// at once (the stop's SIGCHLD), a leader's and a standby's alike, says so, and the tree is
/// fenced as before.
#[test]
fn a_watchdog_stopped_from_outside_is_continued_and_still_fences_the_tree() {
    let setup = Setup::new(
        Cluster::shared(),
        "sleep 600 &\necho \"helper $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let scratch = &setup.scratch;
    let helpers = || -> Vec<i32> {
        scratch
            .events()
            .iter()
            .filter_map(|l| l.strip_prefix("helper ")?.trim().parse().ok())
            .collect()
    };
    let leader = setup.replica("300ms", &[]);
    scratch.wait_starts(1, secs(10.0));
    let standby = setup.replica("300ms", &[]);
    let said = "the watchdog was stopped from outside; continued it";
    // The standby's (nothing to guard yet) and the leader's (guarding the tree).
    for replica in [&standby, &leader] {
        let watchdog = wait_for("the watchdog", secs(5.0), || watchdog_of(replica.pid()));
        kill(Pid::from_raw(watchdog), Signal::SIGSTOP).unwrap();
        replica.wait_log(said, 1, secs(2.0));
        wait_for("the watchdog running again", secs(2.0), || {
            (!is_stopped(watchdog)).then_some(())
        });
    }
    let first = wait_for("the first tree's helper", secs(5.0), || {
        helpers().first().copied()
    });
    leader.signal(Signal::SIGKILL);
    wait_for("the first tree's helper killed", secs(3.0), || {
        (!alive(first)).then_some(())
    });
    // The standby leads, and its watchdog fences its tree.
    scratch.wait_starts(2, secs(10.0));
    let second = wait_for("the second tree's helper", secs(5.0), || {
        helpers().get(1).copied()
    });
    let watchdog = watchdog_of(standby.pid()).expect("the standby's watchdog");
    assert!(!is_stopped(watchdog));
    standby.signal(Signal::SIGKILL);
    wait_for("the second tree's helper killed", secs(3.0), || {
        (!alive(second)).then_some(())
    });
}

/// A leaderrun stopped while it stops COMMAND (after its SIGTERM, during the grace) finds on
/// resume that its watchdog stopped the tree meanwhile: it says nothing of a tree "still
/// running after the grace period" (before, a false WARN and a SIGKILL to a dead group) and
/// exits at once.
#[test]
fn a_tree_the_watchdog_stopped_while_leaderrun_was_frozen_is_not_said_to_run() {
    // The whole group ignores TERM: only SIGKILL, after the grace, ends it.
    let setup = Setup::new(
        Cluster::shared(),
        "trap '' TERM INT HUP\nsleep 600 &\necho \"helper $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let scratch = &setup.scratch;
    let mut leader = setup.replica("300ms", &["--grace", "300ms"]);
    let child = scratch.wait_starts(1, secs(10.0))[0].pid;
    let helper = scratch.recorded_pid("helper ");
    leader.signal(Signal::SIGTERM);
    // Frozen once it is stopping the tree (the grace runs), not before it read the signal.
    leader.wait_log("received SIGTERM", 1, secs(5.0));
    leader.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    // The watchdog, without heartbeats, stops the tree itself: TERM, its grace, SIGKILL.
    wait_for("the watchdog to kill the tree", secs(10.0), || {
        (!alive(child) && !alive(helper)).then_some(())
    });
    assert!(
        frozen.elapsed() > secs(0.3),
        "leaderrun's grace ran out while it was stopped"
    );
    leader.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    leader.wait_exit(secs(10.0));
    let log = leader.log();
    assert!(!log.contains("still running after the grace"), "{log}");
    assert!(!log.contains("still there"), "{log}");
    assert!(
        resumed.elapsed() < secs(2.0),
        "exited {:?} after resuming: {log}",
        resumed.elapsed()
    );
}

/// The pid namespace `pid` is in (the target of `/proc/PID/ns/pid`).
fn pid_namespace(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Live processes in pid namespace `ns`.
fn members_of(ns: &std::path::Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| alive(p) && pid_namespace(p).as_deref() == Some(ns))
        .collect()
}

#[test]
fn as_pid_1_of_a_namespace_nothing_of_the_tree_outlives_leaderrun_and_its_watchdog_killed_together()
{
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a pid namespace takes root here");
        return;
    }
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    // A helper beside the main child: outside a namespace only the direct child would die with
    // leaderrun (PDEATHSIG) once its watchdog is gone too.
    let script = scratch.child_script(
        "child.sh",
        "sleep 600 &\necho \"helper $!\" >> \"$EVENTS\"\nexec sleep 600",
    );
    // A container's entrypoint: leaderrun is PID 1 of a pid namespace of its own.
    let mut cmd = crate::support::wrapper("unshare");
    cmd.args(["--pid", "--fork", "--", env!("CARGO_BIN_EXE_leaderrun")])
        .args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "300ms", "--", script.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut unshare = cmd.spawn().expect("run unshare");
    scratch.wait_starts(1, secs(10.0));
    scratch.recorded_pid("helper ");
    let leaderrun = wait_for("leaderrun under unshare", secs(5.0), || {
        let children = std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            unshare.id(),
            unshare.id()
        ))
        .ok()?;
        children.split_whitespace().next()?.parse::<i32>().ok()
    });
    let ns = pid_namespace(leaderrun).expect("its pid namespace");
    let watchdog = wait_for("its watchdog", secs(5.0), || watchdog_of(leaderrun));
    // leaderrun, its watchdog, the main child, the helper.
    let members = wait_for("the tree in the namespace", secs(5.0), || {
        let members = members_of(&ns);
        (members.len() >= 4).then_some(members)
    });
    // Both at once, as an operator's `kill -9` of both pids does. The namespace may be gone
    // (and the watchdog with it) before the second kill.
    kill(Pid::from_raw(leaderrun), Signal::SIGKILL).unwrap();
    let _ = kill(Pid::from_raw(watchdog), Signal::SIGKILL);
    wait_for("every process of the namespace to die", secs(5.0), || {
        members.iter().all(|&p| !alive(p)).then_some(())
    });
    assert!(members_of(&ns).is_empty());
    let _ = unshare.wait();
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

/// The tree's leader as leaderrun is starting it: a child of `leaderrun` (not its watchdog)
/// whose environment is COMMAND's already (with `--pid-namespace`, the init has exec'd itself:
/// the spawn has not returned, and leaderrun has not told its watchdog of the tree yet).
fn starting_tree_of(leaderrun: i32) -> Option<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{leaderrun}/task")).ok()?;
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let environ = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
            if environ
                .split(|&b| b == 0)
                .any(|var| var.starts_with(b"LEADERRUN_FENCING_TOKEN="))
            {
                return Some(child);
            }
        }
    }
    None
}

/// leaderrun frozen (SIGSTOP) the moment its COMMAND starts, before the spawn returned (with
/// `--pid-namespace` that takes milliseconds: the init execs itself, then COMMAND): the
/// watchdog knows the tree all the same, from the tree's own announcement before exec, and
/// stops it once the proof runs out, while leaderrun stays frozen. Told only by leaderrun
/// after the spawn, it knew no tree and the tree ran on beside the next leader's.
#[test]
fn a_leaderrun_frozen_as_command_starts_is_fenced_by_its_watchdog() {
    let setup = Setup::new(
        Cluster::shared(),
        "read T _ < /proc/self/stat\necho \"host $T\" >> \"$EVENTS\"\nexec sleep 600",
    );
    let namespaced = leaderrun::process::pidns::PidNamespace::new().is_ok();
    let options: &[&str] = if namespaced {
        &["--grace", "200ms", "--pid-namespace"]
    } else {
        &["--grace", "200ms"]
    };
    let leader = setup.replica("200ms", options);
    let pid = leader.pid();
    // No pause between looks: the window is a millisecond or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    let tree = loop {
        if let Some(tree) = starting_tree_of(pid) {
            break tree;
        }
        assert!(
            Instant::now() < deadline,
            "no COMMAND started\n{}",
            leader.log()
        );
    };
    leader.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    let command = wait_for("COMMAND to run", secs(10.0), || {
        setup
            .scratch
            .events()
            .iter()
            .find_map(|l| l.strip_prefix("host ")?.trim().parse::<i32>().ok())
    });
    // The safe window (2 × 200 ms) and the stall (100 ms) after the last check, then the
    // grace; 5 s leaves room for a loaded machine.
    wait_for(
        "the watchdog to stop the frozen leader's tree",
        secs(5.0),
        || (!alive(command) && !alive(tree)).then_some(()),
    );
    eprintln!(
        "tree {tree} (COMMAND {command}) stopped {:?} after the freeze",
        frozen.elapsed()
    );
    leader.signal(Signal::SIGCONT);
    leader.wait_log("stopped COMMAND's tree", 1, secs(5.0));
    leader.signal(Signal::SIGTERM);
}

/// Descriptors too few at each limit in turn (`RLIMIT_NOFILE`, soft and hard, from 8 up to
/// the first at which COMMAND runs): leaderrun refuses at start (exit 125, nothing campaigned,
/// COMMAND never started) and names the lowest limit that will do, or COMMAND runs, with the
/// watchdog holding its lock session, and leaderrun exits at once after it. Before, a limit
/// that left no room to read COMMAND's children made every stop wait out the grace and 5 s
/// more, saying the tree was still running; one lower gave the lock back at the grant
/// (docs/process-model.md#enough-descriptors).
#[test]
fn running_out_of_descriptors_anywhere_never_runs_command_unguarded() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let mut named = None;
    for limit in 8..=96 {
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--once"])
            .args(["--grace", "100ms", "--", "sh", "-c", "echo RAN"]);
        crate::support::descriptor_limit(&mut cmd, limit);
        let started = Instant::now();
        let mut replica = Replica::spawn(cmd);
        let status = replica.wait_exit(secs(30.0));
        let took = started.elapsed();
        let (log, stdout) = (replica.log(), replica.stdout());
        if stdout.contains("RAN") {
            assert!(status.success(), "limit {limit}: {status:?}\n{log}");
            assert!(!log.contains("WARN"), "limit {limit}: {log}");
            assert!(
                took < secs(3.0),
                "limit {limit}: exited after {took:?}\n{log}"
            );
            assert_eq!(
                named,
                Some(limit),
                "COMMAND ran at {limit} descriptors; the refusals named {named:?}"
            );
            eprintln!("COMMAND ran at {limit} descriptors, every lower limit was refused");
            return;
        }
        assert_eq!(status.code(), Some(125), "limit {limit}:\n{log}");
        assert!(
            log.contains("too few file descriptors"),
            "limit {limit}:\n{log}"
        );
        assert!(!log.contains("campaigning"), "limit {limit}:\n{log}");
        assert!(!log.contains("child started"), "limit {limit}:\n{log}");
        named = Some(at_least(&log));
        assert!(cluster.lock_holders(CLASS, id.parse().unwrap()).is_empty());
    }
    panic!("COMMAND never ran, even with 96 descriptors");
}

/// The limit a refusal names: `raise it to at least N`.
fn at_least(log: &str) -> u64 {
    let (_, rest) = log
        .split_once("raise it to at least ")
        .unwrap_or_else(|| panic!("no limit named:\n{log}"));
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no limit named:\n{log}"))
}

/// At 16 and 17 descriptors (soft and hard), a one-shot and a leaderrun that would lead on
/// both refuse at once, before campaigning. Before, both took the lock and ran COMMAND with no
/// descriptor left to read COMMAND's children: a tree they could not see gone was one that
/// might still run, so every stop waited out the grace and then 5 s after SIGKILL, said
/// processes of COMMAND were still running (none were), and exited that late.
#[test]
fn a_descriptor_limit_too_low_is_refused_at_start_never_run_late() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    for limit in [16, 17] {
        for args in [
            &["--once", "--", "true"][..],
            &["--check-interval", "200ms", "--", "sleep", "30"][..],
        ] {
            let mut cmd = leaderrun();
            cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &id])
                .args(args);
            crate::support::descriptor_limit(&mut cmd, limit);
            let mut replica = Replica::spawn(cmd);
            let status = replica.wait_exit(secs(3.0));
            let log = replica.log();
            assert_eq!(status.code(), Some(125), "limit {limit} {args:?}:\n{log}");
            assert!(
                log.contains("too few file descriptors: the limit (RLIMIT_NOFILE) is"),
                "limit {limit} {args:?}:\n{log}"
            );
            assert!(at_least(&log) > limit, "limit {limit} {args:?}:\n{log}");
            assert!(
                !log.contains("campaigning"),
                "limit {limit} {args:?}:\n{log}"
            );
            assert!(cluster.lock_holders(CLASS, id.parse().unwrap()).is_empty());
        }
    }
}

/// A soft limit of 16 under a hard one of 1024: leaderrun raises its own soft limit as far as
/// it needs, runs and stops on time, and COMMAND starts with the limit leaderrun was given
/// (soft 16, hard 1024), as it would without leaderrun.
#[test]
fn a_low_soft_descriptor_limit_is_raised_for_leaderrun_and_given_back_to_command() {
    let cluster = Cluster::shared();
    let id = unique_lock_id().to_string();
    let report = r#"echo "nofile $(ulimit -n) $(ulimit -Hn)""#;

    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &id, "--once"])
        .args(["--", "sh", "-c", report]);
    crate::support::descriptor_limits(&mut cmd, 16, 1024);
    let started = Instant::now();
    let mut one_shot = Replica::spawn(cmd);
    let status = one_shot.wait_exit(secs(30.0));
    let (took, log) = (started.elapsed(), one_shot.log());
    assert!(status.success(), "{status:?}\n{log}");
    assert_eq!(one_shot.stdout().trim(), "nofile 16 1024", "{log}");
    assert!(!log.contains("WARN"), "{log}");
    assert!(took < secs(3.0), "exited after {took:?}\n{log}");

    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &id])
        .args(["--check-interval", "200ms", "--", "sh", "-c"])
        .arg(format!("{report}; exec sleep 30"));
    crate::support::descriptor_limits(&mut cmd, 16, 1024);
    let mut leader = Replica::spawn(cmd);
    wait_for("COMMAND to report its limit", secs(10.0), || {
        leader.stdout().contains("nofile").then_some(())
    });
    assert_eq!(leader.stdout().trim(), "nofile 16 1024", "{}", leader.log());
    let stopping = Instant::now();
    leader.signal(Signal::SIGTERM);
    let status = leader.wait_exit(secs(30.0));
    let (took, log) = (stopping.elapsed(), leader.log());
    // sleep dies of the TERM passed on to it, as leaderrun does after it.
    assert_eq!(status.code(), Some(143), "{status:?}\n{log}");
    assert!(!log.contains("WARN"), "{log}");
    assert!(took < secs(3.0), "exited {took:?} after SIGTERM\n{log}");
}

/// With no process left to start (`RLIMIT_NPROC`, as a container at its cgroup's `pids.max`):
/// COMMAND cannot be started, nor the thread that writes the log; a one-shot says why on
/// stderr and exits 125. Before, the log thread's failed start panicked, and the panic's own
/// line asked for that same half-made queue: leaderrun waited on itself for good, every signal
/// blocked, the lock held, until SIGKILL. Run as a uid of its own (root is not held to
/// `RLIMIT_NPROC`), from a copy of the binary that uid can read.
#[test]
fn with_no_process_left_to_start_a_one_shot_fails_and_never_hangs() {
    const TEST: &str = "fence::with_no_process_left_to_start_a_one_shot_fails_and_never_hangs";
    const UID: u32 = 54_321;
    let scratch = Scratch::new();
    // Two tasks for the uid: leaderrun and the watchdog it forks at start.
    let Some(mut cmd) = crate::support::leaderrun_as(&scratch, TEST, UID, (2, 2)) else {
        return;
    };
    cmd.args(["--dsn", &Cluster::shared().dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args(["--once", "--", "true"]);
    let mut replica = Replica::spawn(cmd);
    let status = replica.wait_exit(secs(10.0));
    let log = replica.log();
    assert_eq!(status.code(), Some(125), "{status:?}\n{log}");
    assert!(log.contains("cannot start true"), "{log}");
}

/// A descendant that leaves COMMAND's process group *and* its cgroup (root may write any
/// `cgroup.procs`: `systemd-run --scope`, container tooling) is still part of the tree: a
/// shutdown stops it before leaderrun exits, and after `kill -9` of leaderrun its watchdog
/// kills it (docs/process-model.md). Before, with a cgroup, only the cgroup's members counted:
/// such a process ran on beside the next leader's tree, and outlived both.
#[test]
fn a_descendant_that_leaves_the_group_and_the_cgroup_is_still_stopped() {
    let cluster = Cluster::shared();
    // The escapee moves itself into the cgroup leaderrun itself runs in, the parent of the
    // group leaderrun made for COMMAND, then ignores TERM.
    let body = escapee_script("setsid ");
    for how in [Signal::SIGTERM, Signal::SIGKILL] {
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", &body);
        let mut leader = Replica::start(
            cluster,
            unique_lock_id(),
            "200ms",
            &["--cgroup", "--", script.to_str().unwrap()],
        );
        let escaped: i32 = escapee_pid(&scratch);
        if escaped == -1 {
            eprintln!("no cgroup of COMMAND's own here, or none to move to: skipped");
            leader.signal(Signal::SIGTERM);
            leader.wait_exit(secs(10.0));
            return;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{escaped}/cgroup")).unwrap();
        assert!(
            !cgroup.contains("leaderrun-"),
            "still in COMMAND's cgroup: {cgroup}"
        );
        let watchdog = watchdog_of(leader.pid()).expect("a watchdog");
        if how == Signal::SIGKILL {
            // The watchdog walks the tree every 25 ms; one that left in the last walk's period
            // before leaderrun died, with its parent dying too, is out of its reach
            // (docs/process-model.md): so the kill waits until it holds the escapee's pidfd.
            wait_for("the watchdog to know the escapee", secs(5.0), || {
                holds_pidfd_of(watchdog, escaped).then_some(())
            });
        }
        leader.signal(how);
        leader.wait_exit(secs(10.0));
        if how == Signal::SIGTERM {
            // leaderrun said the child stopped only once the whole tree was gone.
            assert!(!alive(escaped), "{how:?}: the escapee outlived leaderrun");
        } else {
            wait_for("the watchdog to kill the escapee", secs(5.0), || {
                (!alive(escaped)).then_some(())
            });
            wait_for("the watchdog to exit", secs(5.0), || {
                (!alive(watchdog)).then_some(())
            });
        }
    }
}

/// A descendant that leaves COMMAND's cgroup but stays in its process group (as
/// `systemd-run --scope` moves a process) is still part of the tree for the watchdog: when
/// leaderrun freezes while leading, the watchdog's stop waits for the group as well as the
/// cgroup, and SIGKILLs what ignored the stop signal once the grace is over. Before, with a
/// cgroup, the watchdog asked the cgroup alone: the main child's exit left it empty, so the
/// stop ended at once, no SIGKILL followed, and the escapee ran on until leaderrun was
/// continued, past the server's end of the frozen session.
#[test]
fn a_descendant_that_leaves_only_the_cgroup_is_stopped_by_the_watchdog_of_a_frozen_leader() {
    let cluster = Cluster::shared();
    let body = escapee_script("");
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", &body);
    let mut leader = Replica::start(
        cluster,
        unique_lock_id(),
        "200ms",
        &[
            "--cgroup",
            "--grace",
            "300ms",
            "--",
            script.to_str().unwrap(),
        ],
    );
    let escaped: i32 = escapee_pid(&scratch);
    if escaped == -1 {
        eprintln!("no cgroup of COMMAND's own here, or none to move to: skipped");
        leader.signal(Signal::SIGTERM);
        leader.wait_exit(secs(10.0));
        return;
    }
    let child = scratch.starts()[0].pid;
    assert_eq!(
        nix::unistd::getpgid(Some(Pid::from_raw(escaped)))
            .unwrap()
            .as_raw(),
        child,
        "the escapee left COMMAND's process group"
    );
    leader.signal(Signal::SIGSTOP);
    // Two intervals, the grace and the watchdog's own margins: well under this.
    let deadline = Instant::now() + secs(10.0);
    while alive(escaped) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = !alive(escaped);
    leader.signal(Signal::SIGCONT);
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    assert!(
        killed,
        "the escapee ran on while leaderrun was frozen:\n{}",
        leader.log()
    );
}

/// COMMAND's script for the escapee tests: it starts (with `prefix`, e.g. `setsid `) a process
/// that moves itself into the cgroup leaderrun itself runs in, the parent of the group
/// leaderrun made for COMMAND, ignores TERM and records `escaped PID`; COMMAND itself ends on
/// TERM.
fn escapee_script(prefix: &str) -> String {
    format!(
        "export EVENTS\n\
         cg=$(sed -n 's/^0:://p' /proc/self/cgroup)\n\
         mnt=$(awk '$3 == \"cgroup2\" {{ print $2; exit }}' /proc/self/mounts)\n\
         echo \"cgroup $cg\" >> \"$EVENTS\"\n\
         {prefix}sh -c 'echo $$ > \"$1/cgroup.procs\" || {{ echo noescape >> \"$EVENTS\"; exit 1; }}; trap \"\" TERM; \
           echo \"escaped $$\" >> \"$EVENTS\"; while :; do sleep 0.05; done' sh \"$mnt$(dirname \"$cg\")\" &\n\
         exec 2>/dev/null\n\
         trap 'exit 0' TERM\n\
         while :; do sleep 0.02; done"
    )
}

/// The escapee's pid once it moved ([`escapee_script`]); -1 when it could not (no cgroup of
/// COMMAND's own, or none to move to).
fn escapee_pid(scratch: &Scratch) -> i32 {
    wait_for("the escapee's move", secs(10.0), || {
        scratch.events().iter().find_map(|l| {
            if l == "noescape" || l.starts_with("cgroup ") && !l.contains("leaderrun-") {
                Some(-1)
            } else {
                l.strip_prefix("escaped ")?.parse().ok()
            }
        })
    })
}

/// Whether process `holder` has a pidfd open for `pid` (its `fdinfo` says `Pid: PID`).
fn holds_pidfd_of(holder: i32, pid: i32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{holder}/fdinfo")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_to_string(fd.path())
            .is_ok_and(|info| info.lines().any(|l| l == format!("Pid:\t{pid}")))
    })
}

/// A cgroup that cannot be joined (removed between two runs of `--restart always`: an admin's
/// cleanup, a tool trimming empty groups) fails the spawn as leaderrun's own failure (exit
/// 125, the set-up step named), not as COMMAND's: the join's ENOENT was read as exec's, "not
/// found", exit 127.
#[test]
fn a_cgroup_that_cannot_be_joined_fails_the_spawn_as_leaderruns_own_failure() {
    const TEST: &str =
        "fence::a_cgroup_that_cannot_be_joined_fails_the_spawn_as_leaderruns_own_failure";
    let cluster = Cluster::shared();
    let namespaced = leaderrun::process::pidns::PidNamespace::new().is_ok();
    // With --pid-namespace the join is the init's, before its own exec: its report says why
    // (before, it only ended, and the spawn said "Broken pipe").
    for extra in [&[][..], &["--pid-namespace"][..]] {
        if !extra.is_empty() && !namespaced {
            crate::support::cluster::skip(TEST, "no PID namespaces here: the second half");
            continue;
        }
        let scratch = Scratch::new();
        let body = "mnt=$(awk '$3 == \"cgroup2\" { print $2; exit }' /proc/self/mounts)\n\
             echo \"cgroup $mnt$(sed -n 's/^0:://p' /proc/self/cgroup)\" >> \"$EVENTS\"\n\
             exit 1";
        let script = scratch.child_script("child.sh", body);
        let mut args = vec!["--cgroup", "--restart", "always"];
        args.extend_from_slice(extra);
        args.extend(["--", script.to_str().unwrap()]);
        let mut leader = Replica::start(cluster, unique_lock_id(), "200ms", &args);
        let dir = wait_for("the first run's cgroup", secs(10.0), || {
            scratch
                .events()
                .iter()
                .find_map(|l| l.strip_prefix("cgroup ").map(str::to_owned))
        });
        if !dir.contains("leaderrun-") {
            leader.signal(Signal::SIGTERM);
            leader.wait_exit(secs(10.0));
            return crate::support::cluster::skip(TEST, "no cgroup of COMMAND's own here");
        }
        // Between two runs (the back-off) the group is empty and can be removed.
        wait_for("the cgroup removed between two runs", secs(20.0), || {
            std::fs::remove_dir(&dir).ok()
        });
        let status = leader.wait_exit(secs(20.0));
        let log = leader.log();
        assert_eq!(status.code(), Some(125), "{extra:?}: {log}");
        assert!(
            log.contains("set-up before exec failed"),
            "{extra:?}: {log}"
        );
    }
}

/// A watchdog that dies while a tree runs and cannot be replaced (no process or descriptor
/// left; here `/proc` unmounted in leaderrun's own mount namespace, so the new one's exec of
/// `/proc/self/exe` fails) leaves no tree unguarded: leaderrun stops the tree and gives the
/// term up within a second, the lock passes to a standby only once the tree is dead, and the
/// failed starts say so once, not at every heartbeat. Before, leaderrun led on with no
/// watchdog (a `kill -9` of it then left the tree's helpers beside the next leader's tree),
/// and logged a WARN every 25 ms.
#[test]
fn a_watchdog_that_cannot_be_replaced_ends_the_term_before_the_tree_runs_unguarded() {
    const TEST: &str =
        "fence::a_watchdog_that_cannot_be_replaced_ends_the_term_before_the_tree_runs_unguarded";
    let setup = Setup::new(Cluster::shared(), TIMED_CHILD);
    let scratch = &setup.scratch;
    // The replica's own command, run by unshare in a mount namespace of its own.
    let inner = setup.command("200ms", &[]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let mut leader = Replica::spawn(cmd);
    let first = match wait_for_start_or_exit(scratch, &mut leader) {
        Some(first) => first,
        None => return crate::support::cluster::skip(TEST, "no mount namespace here"),
    };
    let standby = setup.replica("200ms", &[]);
    let pid = leader.pid().to_string();
    let unmounted = std::process::Command::new("nsenter")
        .args(["-t", &pid, "-m", "--", "umount", "-l", "/proc"])
        .status()
        .is_ok_and(|s| s.success());
    if !unmounted {
        leader.signal(Signal::SIGTERM);
        leader.wait_exit(secs(10.0));
        return crate::support::cluster::skip(TEST, "cannot unmount /proc in its namespace");
    }
    let watchdog = wait_for("the watchdog", secs(5.0), || watchdog_of(leader.pid()));
    kill(Pid::from_raw(watchdog), Signal::SIGKILL).unwrap();
    leader.wait_log("giving the term up", 1, secs(5.0));
    let second = scratch.wait_starts(2, secs(10.0))[1].clone();
    assert_ne!(second.ppid, first.ppid);
    scratch.assert_no_overlap(first.pid, second.pid, &leader.log());
    // The leader goes on as a standby that cannot start COMMAND; its failed starts are one WARN.
    let seen = Instant::now();
    wait_for("a second of heartbeats", secs(5.0), || {
        (seen.elapsed() > secs(1.0)).then_some(())
    });
    let log = leader.log();
    assert_eq!(log.matches("cannot start the watchdog").count(), 1, "{log}");
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    drop(standby);
}

/// The first start of COMMAND, or `None` when the leader exited before one (no namespace).
fn wait_for_start_or_exit(
    scratch: &Scratch,
    leader: &mut Replica,
) -> Option<crate::support::Start> {
    let deadline = Instant::now() + secs(10.0);
    loop {
        if let Some(first) = scratch.starts().first() {
            return Some(first.clone());
        }
        if !leader.running() || Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A descriptor leaderrun was handed without close-on-exec (a parent's `flock`ed file, a pipe
/// the parent waits to see closed) reaches no watchdog: neither the first (forked with every
/// other descriptor closed) nor one started after a watchdog died (an exec of leaderrun's
/// binary). Before, the second held it, and with it the parent's lock or pipe, for its life.
#[test]
fn a_descriptor_leaderrun_inherits_reaches_no_watchdog_started_later() {
    let setup = Setup::new(Cluster::shared(), "exec sleep 600");
    let (read, write) = nix::unistd::pipe().unwrap();
    let handed = write.as_raw_fd();
    let mut cmd = setup.command("200ms", &[]);
    // SAFETY: only fcntl between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            nix::libc::fcntl(handed, nix::libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut leader = Replica::spawn(cmd);
    drop(write);
    setup.scratch.wait_starts(1, secs(10.0));
    let pipe = std::fs::read_link(format!("/proc/self/fd/{}", read.as_raw_fd())).unwrap();
    let holds_pipe = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == pipe))
    };
    assert!(
        holds_pipe(leader.pid()),
        "leaderrun keeps what it was handed"
    );
    let first = wait_for("the watchdog", secs(5.0), || watchdog_of(leader.pid()));
    assert!(!holds_pipe(first));
    kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    let second = wait_for("a new watchdog", secs(5.0), || {
        watchdog_of(leader.pid()).filter(|&pid| pid != first)
    });
    assert!(
        !holds_pipe(second),
        "the new watchdog {second} holds the pipe\n{}",
        leader.log()
    );
    leader.signal(Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    drop(read);
}

/// A leaderrun started under a real-time policy (`chrt -f 10`; COMMAND inherits it) has a
/// watchdog one priority above it, so that a COMMAND spinning at its priority on every CPU it
/// may use cannot starve the watchdog too; under the normal policy the watchdog is
/// SCHED_BATCH. Before, it was SCHED_BATCH always, and ran only in the kernel's real-time
/// throttling gap: with a 200 ms interval the server freed the lock, and a standby's COMMAND
/// started, about 90 ms before the starved leader's tree was stopped.
#[test]
fn a_real_time_leaderruns_watchdog_runs_above_it() {
    const TEST: &str = "fence::a_real_time_leaderruns_watchdog_runs_above_it";
    fn fifo(cmd: &mut std::process::Command, priority: i32) -> &mut std::process::Command {
        use std::os::unix::process::CommandExt;
        // SAFETY: only sched_setscheduler between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let param = libc::sched_param {
                    sched_priority: priority,
                };
                if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
        }
    }
    if !fifo(&mut std::process::Command::new("true"), 10)
        .status()
        .is_ok_and(|s| s.success())
    {
        return crate::support::cluster::skip(TEST, "no real-time scheduling here");
    }
    let policy = |pid: i32| {
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: reads another process's policy into a local.
        unsafe {
            let policy = libc::sched_getscheduler(pid);
            libc::sched_getparam(pid, &mut param);
            (policy, param.sched_priority)
        }
    };
    for real_time in [true, false] {
        let setup = Setup::new(Cluster::shared(), "exec sleep 600");
        let mut cmd = setup.command("200ms", &[]);
        if real_time {
            fifo(&mut cmd, 10);
        }
        let mut leader = Replica::spawn(cmd);
        let child = setup.scratch.wait_starts(1, secs(10.0))[0].pid;
        let watchdog = wait_for("the watchdog", secs(5.0), || watchdog_of(leader.pid()));
        if real_time {
            assert_eq!(policy(leader.pid()), (libc::SCHED_FIFO, 10));
            assert_eq!(policy(child), (libc::SCHED_FIFO, 10));
            assert_eq!(policy(watchdog), (libc::SCHED_FIFO, 11));
        } else {
            assert_eq!(policy(watchdog), (libc::SCHED_BATCH, 0));
        }
        leader.signal(Signal::SIGTERM);
        leader.wait_exit(secs(10.0));
    }
}
