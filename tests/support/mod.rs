//! Test support: a real PostgreSQL cluster, the real binary, and waits with deadlines. Also
//! the support of `benches/handover.rs`, which includes this module by path (and nothing else
//! of the tests).

pub mod cluster;
// The benchmark's floor clients, a binary of their own there; here their sessions for the
// floors the benchmark runs in its own process.
#[allow(dead_code)]
pub mod floor;
// The benchmark's measurements: the benchmark runs them all, the smoke test only a few.
#[allow(dead_code)]
pub mod measure;
pub mod pooler;
pub mod proxy;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use cluster::Cluster;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The check interval most tests run with: short, so that a test waits little for a check.
pub const INTERVAL: &str = "200ms";

/// A DSN of a server nobody listens on: port 1 of the loopback refuses every connection at
/// once, so a replica given it fails its checks without waiting for a timeout.
pub const UNREACHABLE_DSN: &str = "host=127.0.0.1 port=1 user=postgres dbname=postgres";

/// The `leaderrun` that [`bin`] names instead of cargo's, once set ([`measure_product_build`]).
static PRODUCT_BUILD: OnceLock<PathBuf> = OnceLock::new();

/// Has [`bin`] name `path` from now on: the benchmark measures `leaderrun` as `cargo build
/// --release` builds it (BENCHMARKS.md), not the copy cargo built beside it with the
/// dev-dependencies' features. Call before any replica starts; a second call is ignored.
pub fn measure_product_build(path: PathBuf) {
    let _ = PRODUCT_BUILD.set(path);
}

/// The `leaderrun` binary that tests and measurements run: cargo's, built beside this test
/// binary, unless the benchmark named another ([`measure_product_build`]).
pub fn bin() -> &'static Path {
    PRODUCT_BUILD
        .get()
        .map_or(Path::new(env!("CARGO_BIN_EXE_leaderrun")), PathBuf::as_path)
}

/// `s` seconds.
pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A lock id no other test in this process uses, so tests can share one cluster.
pub fn unique_lock_id() -> i32 {
    static NEXT: AtomicI32 = AtomicI32::new(1000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Lock class used by the tests (the default class, so the key is the seed's shape).
pub const CLASS: i32 = leaderrun::elector::DEFAULT_LOCK_CLASS;

/// Polls `cond` every 10 ms until it returns `Some`, or panics naming `what` at the deadline.
pub fn wait_for<T>(what: &str, within: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid of `leaderrun`'s watchdog process (its child whose argv[0] is
/// `leaderrun-watchdog`), if one runs.
pub fn watchdog_of(leaderrun: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: i32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == leaderrun && cmdline.starts_with(leaderrun::watchdog::ARGV0.as_bytes()))
            .then_some(pid)
    })
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            !matches!(state, Some(Some('Z')) | Some(Some('X')))
        }
        Err(_) => false,
    }
}

/// A scratch directory for one test, with the child script and its event log.
pub struct Scratch {
    dir: tempfile::TempDir,
}

/// One start of the child, as the child script recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub pid: i32,
    pub ppid: i32,
    pub term: u64,
    pub backend_pid: i32,
    pub fencing_token: i64,
    pub lock: String,
    /// `LEADERRUN_SLOT`.
    pub slot: Option<u32>,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("leaderrun-test-")
                .tempdir()
                .expect("scratch dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes an executable `sh` script whose first act is to record its start
    /// (`start PID PPID TERM BACKEND_PID FENCING_TOKEN LOCK`) in `events`, then runs `body`.
    /// `$EVENTS` names the event file inside the body.
    pub fn child_script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.file(name);
        let events = self.file("events");
        let script = format!(
            "#!/bin/sh\nEVENTS='{}'\n\
             echo \"start $$ $PPID $LEADERRUN_TERM $LEADERRUN_BACKEND_PID $LEADERRUN_FENCING_TOKEN $LEADERRUN_LOCK $LEADERRUN_SLOT\" >> \"$EVENTS\"\n{body}\n",
            events.display()
        );
        std::fs::write(&path, script).expect("write script");
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
        path
    }

    /// Lines of the event log.
    pub fn events(&self) -> Vec<String> {
        std::fs::read_to_string(self.file("events"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The recorded child starts, in order.
    pub fn starts(&self) -> Vec<Start> {
        self.events()
            .iter()
            .filter_map(|l| l.strip_prefix("start "))
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                // Without leaderrun (the benchmark's etcdctl runs) the LEADERRUN_* fields are
                // empty: 0.
                Start {
                    pid: f[0].parse().unwrap(),
                    ppid: f[1].parse().unwrap(),
                    term: f.get(2).and_then(|v| v.parse().ok()).unwrap_or(0),
                    backend_pid: f.get(3).and_then(|v| v.parse().ok()).unwrap_or(0),
                    fencing_token: f.get(4).and_then(|v| v.parse().ok()).unwrap_or(0),
                    lock: f.get(5).map(|v| (*v).to_owned()).unwrap_or_default(),
                    slot: f.get(6).and_then(|v| v.parse().ok()),
                }
            })
            .collect()
    }

    /// The pid recorded in a line `PREFIX PID` of the event log, waiting up to 5 s for it.
    pub fn recorded_pid(&self, prefix: &str) -> i32 {
        wait_for(
            &format!("{prefix:?} pid in the events"),
            Duration::from_secs(5),
            || {
                self.events()
                    .iter()
                    .find_map(|l| l.strip_prefix(prefix).and_then(|p| p.trim().parse().ok()))
            },
        )
    }

    /// The time (seconds since the epoch) in a line `WHAT PID NANOSECONDS` of the event log.
    pub fn stamp(&self, what: &str, pid: i32) -> Option<f64> {
        let prefix = format!("{what} {pid} ");
        self.events().iter().find_map(|l| {
            l.strip_prefix(&prefix)
                .and_then(|ns| ns.trim().parse::<f64>().ok())
                .map(|ns| ns / 1e9)
        })
    }

    /// The old child's `ended` stamp and the new child's `began` stamp (seconds), waiting up
    /// to 2 s for each: the overlap checks compare them.
    pub fn ended_and_began(&self, old: i32, new: i32) -> (f64, f64) {
        let ended = wait_for("the old child's end stamp", Duration::from_secs(2), || {
            self.stamp("ended", old)
        });
        let began = wait_for(
            "the new child's start stamp",
            Duration::from_secs(2),
            || self.stamp("began", new),
        );
        (ended, began)
    }

    /// Asserts that the old child's `ended` stamp precedes the new child's `began` stamp (no
    /// overlap, [`Scratch::ended_and_began`]), showing `log` (the leader's) when it does not;
    /// returns the two stamps.
    pub fn assert_no_overlap(&self, old: i32, new: i32, log: &str) -> (f64, f64) {
        let (ended, began) = self.ended_and_began(old, new);
        assert!(
            ended < began,
            "overlap: old child ended at {ended:.3}, new began at {began:.3}; leader log:\n{log}"
        );
        (ended, began)
    }

    /// Waits until at least `n` starts are recorded and returns them.
    pub fn wait_starts(&self, n: usize, within: Duration) -> Vec<Start> {
        wait_for(&format!("{n} child start(s)"), within, || {
            let starts = self.starts();
            (starts.len() >= n).then_some(starts)
        })
    }
}

/// The set-up most tests of the binary share: a lock id no other test uses, on `cluster`, and a
/// scratch directory with the child script `child.sh` ([`Scratch::child_script`]) that the
/// replicas run as COMMAND.
pub struct Setup<'c> {
    /// The cluster the lock lives on.
    pub cluster: &'c Cluster,
    /// The lock id (class [`CLASS`]).
    pub id: i32,
    /// The scratch directory: the script and its event log.
    pub scratch: Scratch,
    script: String,
}

impl<'c> Setup<'c> {
    /// A fresh lock id on `cluster` and a child script that runs `body` after recording its
    /// start.
    pub fn new(cluster: &'c Cluster, body: &str) -> Setup<'c> {
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", body);
        Setup {
            cluster,
            id: unique_lock_id(),
            script: script.to_str().expect("a UTF-8 temp path").to_owned(),
            scratch,
        }
    }

    /// The child script's path, to give as COMMAND.
    pub fn script(&self) -> &str {
        &self.script
    }

    /// Starts `leaderrun --dsn … --lock-id ID --check-interval INTERVAL OPTIONS... -- SCRIPT`.
    pub fn replica(&self, interval: &str, options: &[&str]) -> Replica {
        Replica::spawn(self.command(interval, options))
    }

    /// The command [`Setup::replica`] starts, for a test to change before it starts it.
    pub fn command(&self, interval: &str, options: &[&str]) -> Command {
        let mut cmd = leaderrun_on(self.cluster, self.id, interval);
        cmd.args(options).args(["--", self.script()]);
        cmd
    }

    /// `n` replicas of [`Setup::replica`], started one after the other.
    pub fn replicas(&self, n: usize, interval: &str, options: &[&str]) -> Vec<Replica> {
        (0..n).map(|_| self.replica(interval, options)).collect()
    }
}

/// A running `leaderrun` process with its stderr (and stdout) collected.
pub struct Replica {
    child: Child,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
    /// The collector threads of stderr and stdout; each ends at EOF of its pipe.
    collectors: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// How long the pipes may stay open after the process exited (a descendant that outlives it
/// holds them); past that, the output read so far is not all of it and the test fails.
const EOF_AFTER_EXIT: Duration = Duration::from_secs(5);

fn collect(mut from: impl Read + Send + 'static) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(String::new()));
    let sink = buf.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    (buf, reader)
}

/// Gives the process `cmd` starts the default disposition of every signal, as a shell gives
/// its foreground jobs: the test run itself may have some ignored (`nohup`, `cmd &` in a
/// script), which leaderrun would keep ignored and not pass on
/// (docs/guarantees.md#the-child-process).
pub fn default_signals(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal() between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in 1..32 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            Ok(())
        })
    }
}

/// Limits the process `cmd` starts to `limit` open descriptors (`RLIMIT_NOFILE`, soft and
/// hard).
pub fn descriptor_limit(cmd: &mut Command, limit: u64) -> &mut Command {
    descriptor_limits(cmd, limit, limit)
}

/// Sets the descriptor limit (`RLIMIT_NOFILE`) of the process `cmd` starts: `soft`, `hard`.
pub fn descriptor_limits(cmd: &mut Command, soft: u64, hard: u64) -> &mut Command {
    limits(cmd, libc::RLIMIT_NOFILE, soft, hard)
}

/// `cmd` started with `resource`'s limits `soft` and `hard` (`setrlimit` before exec).
pub fn limits(
    cmd: &mut Command,
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let rlimit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(resource, &rlimit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

/// `leaderrun --dsn CLUSTER --lock-id ID --check-interval INTERVAL`, to be given the rest.
pub fn leaderrun_on(cluster: &Cluster, lock_id: i32, interval: &str) -> Command {
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn(), "--lock-id", &lock_id.to_string()])
        .args(["--check-interval", interval]);
    cmd
}

pub fn leaderrun() -> Command {
    let mut cmd = Command::new(bin());
    default_signals(&mut cmd);
    clear_settings_env(&mut cmd);
    cmd
}

/// `cmd`'s output, `cmd` a [`leaderrun_as`] copy ([`busy_retried`]).
pub fn output_of_copy(cmd: &mut Command) -> std::process::Output {
    busy_retried(|| cmd.output()).expect("run leaderrun")
}

/// `start` (a spawn), tried again for a second at most while the kernel refuses to run the
/// binary (`ETXTBSY`): a [`leaderrun_as`] copy that was just written may be held open for
/// writing by a fork of another test's thread until that fork's exec.
pub fn busy_retried<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match start() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// `leaderrun` run as `uid` (group too, no supplementary groups) with at most `soft` tasks
/// of that uid (`RLIMIT_NPROC`, threads included, `hard` its hard limit; root is not held to
/// it): from a copy of the binary in `scratch` that the uid can read. `None`, said with [`cluster::skip`] for `test`,
/// when not root or when the scratch directory is out of other users' reach. Each test takes
/// a uid of its own: the limit counts every task of the uid, another test's too.
pub fn leaderrun_as(
    scratch: &Scratch,
    test: &str,
    uid: u32,
    (soft, hard): (u64, u64),
) -> Option<Command> {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        cluster::skip(test, "needs root to run as a uid of its own");
        return None;
    }
    let bin = scratch.file("leaderrun");
    // The uid must reach the copy: every directory above the scratch directory searchable by
    // others (a TMPDIR under /root is not).
    let reachable = bin
        .parent()
        .unwrap()
        .ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if !reachable {
        cluster::skip(test, "the scratch directory is out of other users' reach");
        return None;
    }
    std::fs::copy(self::bin(), &bin).expect("copy the binary");
    for path in [bin.as_path(), bin.parent().unwrap()] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(&bin);
    default_signals(&mut cmd);
    clear_settings_env(&mut cmd);
    let nproc = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setgroups, setgid, setuid and setrlimit only, async-signal-safe, between fork
    // and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
                || libc::setrlimit(libc::RLIMIT_NPROC, &nproc) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Some(cmd)
}

/// A command that runs `program`, a wrapper that in turn runs leaderrun (`sh -c '… exec
/// leaderrun'`, `unshare … leaderrun`), prepared as [`leaderrun`] is: every signal at its
/// default, no setting in the environment.
pub fn wrapper(program: &str) -> Command {
    let mut cmd = Command::new(program);
    default_signals(&mut cmd);
    clear_settings_env(&mut cmd);
    cmd
}

/// Removes from `cmd`'s environment every variable leaderrun reads its settings from
/// (`LEADERRUN_*`, libpq's `PG*`, `PLEXSPHERE_DSN`, `DATABASE_URL`, `RUST_LOG`).
pub fn clear_settings_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("LEADERRUN_")
            || key.starts_with("PG")
            || key == "PLEXSPHERE_DSN"
            || key == "DATABASE_URL"
            || key == "RUST_LOG"
        {
            cmd.env_remove(&*key);
        }
    }
}

/// `leaderrun status --dsn DSN --lock-id ID`, with `--json` when `json`.
pub fn status(cluster: &Cluster, lock_id: i32, json: bool) -> std::process::Output {
    status_with(cluster, lock_id, json, &[])
}

/// `leaderrun status` with `extra` options (e.g. `--slots 2`).
pub fn status_with(
    cluster: &Cluster,
    lock_id: i32,
    json: bool,
    extra: &[&str],
) -> std::process::Output {
    let mut cmd = leaderrun();
    cmd.args(["status", "--dsn", &cluster.dsn()])
        .args(["--lock-id", &lock_id.to_string()])
        .args(extra);
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run leaderrun status")
}

/// `leaderrun --dsn DSN --lock-id ID ARGS...` to its end: its exit code and what it wrote,
/// stdout then stderr.
pub fn run_tool(dsn: &str, lock_id: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = leaderrun()
        .args(["--dsn", dsn, "--lock-id", lock_id])
        .args(args)
        .output()
        .expect("run leaderrun");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// `leaderrun step-down --dsn DSN --lock-id ID`.
pub fn step_down(cluster: &Cluster, id: i32) -> std::process::Output {
    leaderrun()
        .args([
            "--dsn",
            &cluster.dsn(),
            "--lock-id",
            &id.to_string(),
            "step-down",
        ])
        .output()
        .expect("run leaderrun step-down")
}

/// Waits until `leaderrun status` lists exactly `waiters` as the sessions waiting for the
/// lock, both in `--json` (`"waiters": [PID, ...]`) and in the table (`waiters        PID, ...`
/// or `none`), in pid order as it prints them; panics with both outputs at the deadline.
pub fn wait_status_waiters(cluster: &Cluster, lock_id: i32, waiters: &[i32], within: Duration) {
    let mut want = waiters.to_vec();
    want.sort_unstable();
    let want_json: Vec<serde_json::Value> = want.iter().map(|&p| p.into()).collect();
    let line = if want.is_empty() {
        "waiters        none".to_owned()
    } else {
        let pids: Vec<String> = want.iter().map(i32::to_string).collect();
        format!("waiters        {}", pids.join(", "))
    };
    let deadline = Instant::now() + within;
    loop {
        let json = String::from_utf8_lossy(&status(cluster, lock_id, true).stdout).into_owned();
        let table = String::from_utf8_lossy(&status(cluster, lock_id, false).stdout).into_owned();
        let report: Option<serde_json::Value> = serde_json::from_str(&json).ok();
        let json_ok =
            report.is_some_and(|r| r["waiters"] == serde_json::Value::from(want_json.clone()));
        if json_ok && table.lines().any(|l| l == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`leaderrun status` did not list waiters {want:?} within {within:?}; \
             --json printed {json}the table:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Replica {
    /// Starts `leaderrun --dsn DSN --lock-id ID --check-interval INTERVAL ARGS...`.
    pub fn start(cluster: &Cluster, lock_id: i32, interval: &str, args: &[&str]) -> Replica {
        let mut cmd = leaderrun_on(cluster, lock_id, interval);
        cmd.args(args);
        Replica::spawn(cmd)
    }

    /// Starts a prepared command with stdin closed and stdout/stderr collected.
    pub fn spawn(mut cmd: Command) -> Replica {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = busy_retried(|| cmd.spawn()).expect("spawn leaderrun");
        let (stderr, err_reader) = collect(child.stderr.take().unwrap());
        let (stdout, out_reader) = collect(child.stdout.take().unwrap());
        Replica {
            child,
            stderr,
            stdout,
            collectors: vec![err_reader, out_reader],
            status: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// What COMMAND wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits until `needle` is in the log `count` times; panics with the log at the deadline.
    pub fn wait_log(&self, needle: &str, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.log().matches(needle).count() < count {
            assert!(
                Instant::now() < deadline,
                "timed out after {within:?} waiting for {count}× {needle:?} in the log of \
                 replica {}:\n{}",
                self.pid(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("signal replica");
    }

    /// Waits for the process to exit and for its stdout and stderr to reach EOF (the collector
    /// threads joined), so [`Replica::log`] and [`Replica::stdout`] are then all it wrote;
    /// panics with its log at the deadline.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let deadline = Instant::now() + within;
        // Its helper (the watchdog), seen while it runs, must be gone once it exited.
        let mut helper = watchdog_of(self.pid());
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.status = Some(status);
                self.join_collectors();
                if let Some(helper) = helper {
                    wait_for(
                        &format!("the watchdog {helper} of replica {} to exit", self.pid()),
                        Duration::from_secs(6),
                        || (!alive(helper)).then_some(()),
                    );
                }
                return status;
            }
            if helper.is_none() {
                helper = watchdog_of(self.pid());
            }
            assert!(
                Instant::now() < deadline,
                "replica {} did not exit within {within:?}; log:\n{}",
                self.pid(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Joins the collector threads once both pipes are at EOF; panics when a pipe stays open
    /// for [`EOF_AFTER_EXIT`] after the exit.
    fn join_collectors(&mut self) {
        let eof_by = Instant::now() + EOF_AFTER_EXIT;
        while self.collectors.iter().any(|c| !c.is_finished()) {
            assert!(
                Instant::now() < eof_by,
                "replica {} exited, but its stdout/stderr stayed open for {EOF_AFTER_EXIT:?} \
                 (a descendant still holds them); log so far:\n{}",
                self.pid(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for reader in self.collectors.drain(..) {
            reader.join().expect("output collector panicked");
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.status.is_none() && self.child.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The replica among `replicas` whose child made the start record `start` (its parent).
pub fn leader_of<'a>(replicas: &'a mut [Replica], start: &Start) -> &'a mut Replica {
    replicas
        .iter_mut()
        .find(|r| r.pid() == start.ppid)
        .expect("the child's parent is one of the replicas")
}

/// One HTTP/1.0 request to a replica's HTTP port; returns the status code (0 when the answer
/// has none) and the body. Panics when the port does not answer within 5 s.
pub fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the probe port");
    stream.set_read_timeout(Some(secs(5.0))).unwrap();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}; read so far: {raw:?}"));
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The body of `GET /metrics` from `addr`.
pub fn metrics(addr: SocketAddr) -> String {
    http(addr, "GET", "/metrics").1
}

/// The address a replica started with `--http-addr 127.0.0.1:0` bound, from its log (waits
/// up to 5 s for the line).
pub fn probe_addr(replica: &Replica) -> SocketAddr {
    wait_for("the HTTP address in the log", secs(5.0), || {
        let log = replica.log();
        let line = log.lines().find(|l| l.contains("serving /metrics"))?;
        let addr = line.split("addr=").nth(1)?.split_whitespace().next()?;
        addr.parse().ok()
    })
}

/// The value of an unlabelled sample `name` in a Prometheus text exposition.
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// This machine's host name, as leaderrun puts it in `application_name`.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Lines of a replica's `log` that name the lock's holder (a standby's "the lock is held by").
pub fn holder_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("the lock is held by"))
        .map(str::to_owned)
        .collect()
}
