//! The child: look up, spawn, signal, stop, reap.
//!
//! # Process model
//!
//! * COMMAND is looked up on `PATH` before campaigning, so a typo exits 127 (not found) or 126
//!   (not executable) at once instead of waiting as a standby (contract §5).
//! * The child runs in its own process group (pgid = its pid). Signals go to the group, so the
//!   real worker behind a `sh -c` gets them too (FIELD-NOTES child 2).
//! * In the child, before exec, only raw syscalls run (FIELD-NOTES child 10):
//!   `PR_SET_PDEATHSIG(SIGKILL)`, so the child dies with leaderrun; default dispositions and an
//!   empty signal mask; close-on-exec for every descriptor above 2 (FIELD-NOTES child 11–12).
//!   `PR_SET_PDEATHSIG` fires when the *thread* that forked exits (FIELD-NOTES child 5): the
//!   binary forks from its main thread, which lives as long as the process.
//! * One place waits (FIELD-NOTES child 6): [`reap`] drains `waitpid(-1, WNOHANG)` and
//!   recognises the main child inside the loop. Nothing else calls `wait`.
//! * leaderrun is a child subreaper (or PID 1), so descendants that escape the group with
//!   `setsid` are re-parented to it; [`Child::stop`] signals those adopted orphans too, and the
//!   child counts as stopped only when the main child is reaped, its group is empty and no
//!   adopted orphan is left (FIELD-NOTES child 3–4).
//!
//! What cannot be guaranteed without cgroups: a descendant that double-forks *and* whose
//! parent outlives it in another session is not ours until it is re-parented.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::signals::{is_forwarded, is_shutdown, SignalStream};
use crate::terminal::Terminal;

/// The process group of the child that is running now (0: none), for [`kill_on_panic`].
static RUNNING_GROUP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Installs a panic hook that SIGKILLs the running child's process group before the default
/// hook runs: a leaderrun that dies of a bug must not leave COMMAND's helpers running while
/// another replica takes the lock (`PR_SET_PDEATHSIG` reaches only the direct child).
pub fn kill_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let group = RUNNING_GROUP.load(std::sync::atomic::Ordering::Acquire);
        if group > 0 {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
        previous(info);
    }));
}

/// How the main child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code (0–255).
    Code(i32),
    /// It was killed by this signal.
    Signal(Signal),
}

impl ExitStatus {
    /// The status a shell would report: the code, or 128 + signal number (contract §6).
    pub fn exit_code(self) -> u8 {
        match self {
            ExitStatus::Code(code) => (code & 0xff) as u8,
            ExitStatus::Signal(sig) => 128u8.wrapping_add(sig as i32 as u8),
        }
    }

    /// Whether it exited with code 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Signal(sig) => write!(f, "signal {} ({})", *sig as i32, sig.as_str()),
        }
    }
}

/// Why COMMAND cannot be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// Not found on `PATH`, or the path names nothing (exit 127).
    #[error("{program}: command not found")]
    NotFound {
        /// COMMAND as given.
        program: String,
    },
    /// Found, but not an executable file (exit 126).
    #[error("{program}: permission denied (not an executable file)")]
    NotExecutable {
        /// COMMAND as given.
        program: String,
    },
    /// A script whose `#!` interpreter does not exist (exit 127, as a shell reports it).
    #[error("{program}: bad interpreter {interpreter}: no such file")]
    BadInterpreter {
        /// COMMAND as given.
        program: String,
        /// The interpreter its first line names.
        interpreter: String,
    },
    /// `fork`/`exec` failed; exec errors map to 126/127 like a shell's, other failures are
    /// leaderrun's own (125).
    #[error("cannot start {program}")]
    Spawn {
        /// COMMAND as given.
        program: String,
        /// The error `exec` (or `fork`) reported.
        #[source]
        source: std::io::Error,
    },
}

impl SpawnError {
    /// The exit status of contract §6 for this failure: 127, 126, or 125.
    pub fn exit_code(&self) -> u8 {
        match self {
            SpawnError::NotFound { .. } | SpawnError::BadInterpreter { .. } => 127,
            SpawnError::NotExecutable { .. } => 126,
            SpawnError::Spawn { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => 127,
                Some(libc::EACCES) | Some(libc::ENOEXEC) | Some(libc::EISDIR)
                | Some(libc::EPERM) | Some(libc::ETXTBSY) => 126,
                _ => 125,
            },
        }
    }
}

/// COMMAND resolved to an executable file, with argv exactly as given.
#[derive(Clone, Debug)]
pub struct Command {
    program: PathBuf,
    argv: Vec<OsString>,
}

impl Command {
    /// Looks COMMAND (`argv[0]`) up like `execvp` does: a name with a slash is used as is,
    /// otherwise each `PATH` entry is tried (an empty entry is the current directory; no `PATH`
    /// means `/usr/local/bin:/usr/bin:/bin`).
    ///
    /// # Errors
    /// [`SpawnError::NotFound`] when nothing matches; [`SpawnError::NotExecutable`] when only
    /// non-executable files (or directories) match.
    ///
    /// # Panics
    /// When `argv` is empty (the command line parser requires COMMAND).
    pub fn resolve(argv: Vec<OsString>, path: Option<&OsStr>) -> Result<Command, SpawnError> {
        let name = argv.first().expect("COMMAND is required").clone();
        let shown = name.to_string_lossy().into_owned();
        if name.is_empty() {
            return Err(SpawnError::NotFound { program: shown });
        }
        let candidates: Vec<PathBuf> = if name.as_bytes().contains(&b'/') {
            vec![PathBuf::from(&name)]
        } else {
            let path = path
                .filter(|p| !p.is_empty())
                .unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
            std::env::split_paths(path)
                .map(|dir| {
                    if dir.as_os_str().is_empty() {
                        PathBuf::from(&name)
                    } else {
                        dir.join(&name)
                    }
                })
                .collect()
        };
        let mut not_executable = false;
        for candidate in candidates {
            match executable(&candidate) {
                Some(true) => {
                    if let Some(interpreter) = missing_interpreter(&candidate) {
                        return Err(SpawnError::BadInterpreter {
                            program: shown,
                            interpreter,
                        });
                    }
                    return Ok(Command {
                        program: candidate,
                        argv,
                    });
                }
                Some(false) => not_executable = true,
                None => {}
            }
        }
        if not_executable {
            Err(SpawnError::NotExecutable { program: shown })
        } else {
            Err(SpawnError::NotFound { program: shown })
        }
    }

    /// The file that will be executed.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// argv as given, `argv[0]` included.
    pub fn argv(&self) -> &[OsString] {
        &self.argv
    }
}

/// The interpreter a `#!` script names, when it does not exist: exec would fail with ENOENT
/// only once the replica leads, so it is caught at start like a missing COMMAND.
fn missing_interpreter(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let interpreter = std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .next()?
        .to_owned();
    (!Path::new(&interpreter).exists()).then_some(interpreter)
}

/// `None`: nothing there. `Some(true)`: an executable regular file. `Some(false)`: something
/// that exec would refuse (a directory, a file without execute permission for us).
fn executable(path: &Path) -> Option<bool> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return Some(false);
    }
    // access(2) answers for our real uid, including root's "any x bit" rule.
    let ok = nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
        && meta.permissions().mode() & 0o111 != 0;
    Some(ok)
}

/// What one drain of `waitpid(-1, WNOHANG)` found.
#[derive(Debug, Default)]
pub struct Reaped {
    /// The main child's status, if it was reaped in this drain.
    pub main: Option<ExitStatus>,
    /// Whether any child (live, or adopted and not yet exited) is left.
    pub children_left: bool,
    /// The signal that stopped the main child, if it stopped (Ctrl-Z) in this drain.
    pub main_stopped: Option<Signal>,
}

/// Reaps every child that has exited: the one place that waits (FIELD-NOTES child 6). Also
/// reports a stop of the main child (`WUNTRACED`), which is how a Ctrl-Z shows.
///
/// `main` is the pid whose status matters; every other reaped pid is an adopted orphan or a
/// leftover of an earlier term and is only logged at DEBUG.
pub fn reap(main: Option<Pid>) -> Reaped {
    let mut reaped = Reaped::default();
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
        ) {
            Ok(WaitStatus::StillAlive) => {
                reaped.children_left = true;
                return reaped;
            }
            Ok(WaitStatus::Exited(pid, code)) => {
                if Some(pid) == main {
                    reaped.main = Some(ExitStatus::Code(code));
                } else {
                    debug!(pid = pid.as_raw(), code, "reaped orphan");
                }
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                if Some(pid) == main {
                    reaped.main = Some(ExitStatus::Signal(sig));
                } else {
                    debug!(pid = pid.as_raw(), signal = sig.as_str(), "reaped orphan");
                }
            }
            Ok(WaitStatus::Stopped(pid, sig)) if Some(pid) == main => {
                reaped.main_stopped = Some(sig);
            }
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(_) => return reaped, // ECHILD: no children at all
        }
    }
}

/// Pids whose parent is this process: the main child and every adopted orphan.
fn children_of_self() -> Vec<Pid> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid …"; comm may hold spaces and parentheses, so split after the
        // last ')'.
        let Some(close) = stat.iter().rposition(|&b| b == b')') else {
            continue;
        };
        let mut fields = stat[close + 1..]
            .split(|&b| b == b' ')
            .filter(|f| !f.is_empty());
        let state = fields.next();
        let ppid = fields
            .next()
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse::<i32>().ok());
        if ppid == Some(me) && state != Some(b"Z") {
            out.push(Pid::from_raw(pid));
        }
    }
    out
}

/// How a [`Child::stop`] ended.
#[derive(Clone, Copy, Debug)]
pub struct Stopped {
    /// The main child's status.
    pub status: ExitStatus,
    /// The first INT/TERM that arrived while stopping for another reason (demotion, the child's
    /// own exit): it was forwarded, and the caller should shut down afterwards.
    pub shutdown: Option<Signal>,
}

/// A running COMMAND: the leader of its own process group.
#[derive(Debug)]
pub struct Child {
    pid: Pid,
    status: Option<ExitStatus>,
    stopped: Option<Signal>,
}

impl Child {
    /// Starts `command` in a new process group with `env` added to the inherited environment.
    ///
    /// Must be called on the thread that lives as long as the process (the binary's main
    /// thread), because `PR_SET_PDEATHSIG` is tied to the forking thread.
    ///
    /// # Errors
    /// [`SpawnError::Spawn`] when fork or exec fails; exec's errno is reported through the
    /// spawn, so [`SpawnError::exit_code`] gives 126/127 like a shell.
    pub fn spawn(
        command: &Command,
        env: &[(&str, String)],
        terminal: Option<&Terminal>,
    ) -> Result<Child, SpawnError> {
        let mut cmd = std::process::Command::new(&command.program);
        cmd.arg0(&command.argv[0])
            .args(&command.argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            // systemd's notification socket belongs to leaderrun (the main process), as
            // sd_notify's unset_environment would have it.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID");
        let parent = nix::unistd::getpid().as_raw();
        let foreground = terminal.is_some();
        // SAFETY: the closure runs between fork and exec and only makes raw syscalls
        // (no allocation, no locks), as required in a forked child of a threaded process.
        unsafe {
            cmd.pre_exec(move || prepare_child(parent, foreground));
        }
        let child = cmd.spawn().map_err(|source| SpawnError::Spawn {
            program: command.argv[0].to_string_lossy().into_owned(),
            source,
        })?;
        let pid = Pid::from_raw(child.id() as i32);
        // Dropping std's handle neither waits nor kills; `reap` is the only waiter.
        drop(child);
        RUNNING_GROUP.store(pid.as_raw(), std::sync::atomic::Ordering::Release);
        Ok(Child {
            pid,
            status: None,
            stopped: None,
        })
    }

    /// The main child's pid, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// The main child's status once it has been reaped.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Drains exited children (see [`reap`]); records the main child's status.
    pub fn reap(&mut self) -> Reaped {
        let reaped = reap(Some(self.pid));
        if let Some(status) = reaped.main {
            self.status = Some(status);
        }
        if reaped.main_stopped.is_some() {
            self.stopped = reaped.main_stopped;
        }
        reaped
    }

    /// The signal that stopped the main child since the last call (e.g. SIGTSTP from Ctrl-Z),
    /// if any.
    pub fn take_stop(&mut self) -> Option<Signal> {
        self.stopped.take()
    }

    /// Sends `sig` to the child's process group (ESRCH, an empty group, is not an error).
    pub fn signal_group(&self, sig: Signal) {
        match killpg(self.pid, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => warn!(
                pgid = self.pid.as_raw(),
                signal = sig.as_str(),
                "cannot signal the child's process group: {err}"
            ),
        }
    }

    fn group_alive(&self) -> bool {
        !matches!(killpg(self.pid, None), Err(Errno::ESRCH))
    }

    /// Stops the child: `first` and SIGCONT to the group and to every adopted orphan, then
    /// SIGKILL to all of them when `grace` has passed, and waits until the main child is
    /// reaped, the group is empty and no adopted orphan is left (FIELD-NOTES child 3–4). Also
    /// when the main child has already exited: what is left of its group is stopped the same way.
    ///
    /// While it waits, signals keep being handled: SIGCHLD reaps; another forwarded signal goes
    /// to the group; INT/TERM when `shutting_down` (the second one) means SIGKILL now, otherwise
    /// it is forwarded and reported in [`Stopped::shutdown`]; SIGTSTP is not passed on.
    pub async fn stop(
        &mut self,
        first: Signal,
        grace: Duration,
        shutting_down: bool,
        signals: &mut SignalStream,
    ) -> Stopped {
        const POLL: Duration = Duration::from_millis(20);
        let mut shutdown = None;
        let mut signalled: HashSet<Pid> = HashSet::new();
        let mut current = first;
        let mut deadline = Instant::now() + grace;
        let mut killed = false;
        let mut announced = false;
        let mut forced = false;
        loop {
            let reaped = self.reap();
            let group_alive = self.group_alive();
            let orphans: Vec<Pid> = children_of_self()
                .into_iter()
                .filter(|&p| p != self.pid)
                .collect();
            if let Some(status) = self.status {
                if !group_alive && orphans.is_empty() && !reaped.children_left {
                    let _ = RUNNING_GROUP.compare_exchange(
                        self.pid.as_raw(),
                        0,
                        std::sync::atomic::Ordering::AcqRel,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    return Stopped { status, shutdown };
                }
            }
            if !killed && Instant::now() >= deadline {
                if announced && !forced {
                    let what = if self.status.is_some() {
                        "processes COMMAND left behind are"
                    } else {
                        "child is"
                    };
                    warn!(
                        pgid = self.pid.as_raw(),
                        grace = %humantime::format_duration(grace),
                        "{what} still running after the grace period; sending SIGKILL"
                    );
                }
                killed = true;
                current = Signal::SIGKILL;
                signalled.clear();
                if group_alive {
                    self.signal_group(Signal::SIGKILL);
                }
            }
            if !announced && !killed {
                announced = true;
                if group_alive {
                    self.signal_group(current);
                    self.signal_group(Signal::SIGCONT);
                }
            }
            for orphan in orphans {
                if signalled.insert(orphan) {
                    let _ = kill(orphan, current);
                    if current != Signal::SIGKILL {
                        let _ = kill(orphan, Signal::SIGCONT);
                    }
                }
            }
            let wake = if killed {
                Instant::now() + POLL
            } else {
                deadline.min(Instant::now() + POLL)
            };
            tokio::select! {
                sig = signals.recv() => match sig {
                    Signal::SIGCHLD => {}
                    s if is_shutdown(s) && (shutting_down || shutdown.is_some()) => {
                        info!(signal = s.as_str(), "second {} while stopping the child; sending SIGKILL now", s.as_str());
                        deadline = Instant::now();
                        forced = true;
                    }
                    s if is_forwarded(s) => {
                        if is_shutdown(s) {
                            shutdown = Some(s);
                        }
                        self.signal_group(s);
                    }
                    // A Ctrl-Z now would stop what we are stopping; SIGCONT keeps it going.
                    _ => {}
                },
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Runs in the forked child before exec: raw syscalls only (FIELD-NOTES child 10).
fn prepare_child(parent: i32, foreground: bool) -> std::io::Result<()> {
    // SAFETY: plain syscalls on values we own; no allocation, no locks.
    unsafe {
        // Own process group, so the stop signal reaches everything it starts
        // (FIELD-NOTES child 2).
        if libc::setpgid(0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Take the terminal's foreground before exec, so the program never reads the terminal
        // from a background group. SIGTTOU is still ignored here (inherited from leaderrun).
        if foreground {
            libc::tcsetpgrp(0, libc::getpid());
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // leaderrun may have died between fork and prctl: then nothing would ever signal us.
        if libc::getppid() != parent {
            libc::_exit(125);
        }
        // Handlers are reset by exec, but ignored signals stay ignored (FIELD-NOTES child 11).
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // No descriptor of ours survives exec (FIELD-NOTES child 12). Mark, don't close: std's
        // exec-error pipe must stay open until exec so 126/127 are reported through the spawn.
        let marked = libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
        if marked != 0 {
            // Kernels before 5.11: mark each descriptor up to the soft limit.
            let mut limit: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur.min(65_536) as libc::c_int
            } else {
                1024
            };
            for fd in 3..max {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
    Ok(())
}

/// Makes this process a child subreaper unless it is PID 1 (which reaps everything anyway), so
/// orphaned descendants of COMMAND are re-parented to it and can be stopped and reaped.
///
/// # Errors
/// The OS error of `prctl(PR_SET_CHILD_SUBREAPER)`.
pub fn become_subreaper() -> std::io::Result<()> {
    if std::process::id() == 1 {
        return Ok(());
    }
    // SAFETY: plain prctl on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(ExitStatus::Code(7).exit_code(), 7);
        assert_eq!(ExitStatus::Signal(Signal::SIGTERM).exit_code(), 143);
        assert_eq!(ExitStatus::Signal(Signal::SIGKILL).exit_code(), 137);
        assert_eq!(
            ExitStatus::Signal(Signal::SIGKILL).to_string(),
            "signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn lookup() {
        let argv = |s: &str| vec![OsString::from(s)];
        let path = Some(OsStr::new("/nonexistent:/bin:/usr/bin"));
        let sh = Command::resolve(argv("sh"), path).unwrap();
        assert!(sh.program().ends_with("sh"));
        assert_eq!(sh.argv(), &argv("sh")[..]);
        let err = Command::resolve(argv("no-such-command-xyz"), path).unwrap_err();
        assert_eq!(err.exit_code(), 127);
        let err = Command::resolve(argv("/"), path).unwrap_err();
        assert_eq!(err.exit_code(), 126);
        let err = Command::resolve(argv("./no/such/file"), path).unwrap_err();
        assert_eq!(err.exit_code(), 127);
    }
}
