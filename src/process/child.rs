//! The child: look up, spawn, signal, stop, reap.
//!
//! # Process model
//!
//! * COMMAND is looked up on `PATH` before campaigning, so a typo exits 127 (not found) or 126
//!   (not executable) at once instead of waiting as a standby
//!   (docs/guarantees.md#the-child-process).
//! * The child runs in its own process group (pgid = its pid). Signals go to the group, so the
//!   real worker behind a `sh -c` gets them too (docs/field-notes.md#signal-the-group-not-the-pid).
//! * In the child, before exec, only raw syscalls run
//!   (docs/field-notes.md#only-raw-syscalls-before-exec): `PR_SET_PDEATHSIG(SIGKILL)`, so the child
//!   dies with leaderrun; default dispositions and an empty signal mask; close-on-exec for every
//!   descriptor above 2 (docs/field-notes.md#ignored-dispositions-survive-exec,
//!   #no-descriptor-leaks-into-the-child). `PR_SET_PDEATHSIG` fires when the *thread* that forked
//!   exits (docs/field-notes.md#pdeathsig-follows-the-forking-thread): the binary forks from its
//!   main thread, which lives as long as the process.
//! * One place waits (docs/field-notes.md#one-place-waits): [`reap`] drains `waitpid(-1, WNOHANG)`
//!   and recognises the main child inside the loop. Nothing else calls `wait`.
//! * leaderrun is a child subreaper (or PID 1), so descendants that escape the group with
//!   `setsid` are re-parented to it. What is left of a tree is found from leaderrun's own
//!   children (`/proc/self/task/*/children`), never by scanning all of `/proc`; a tree is
//!   empty when the main child is reaped, its group is gone and no adopted orphan is left
//!   (docs/field-notes.md#stopped-means-the-whole-tree, #descendants-that-leave-the-group).
//!
//! * With `--pid-namespace` the direct child is an init of leaderrun's, PID 1 of a new PID
//!   namespace, and COMMAND its child in the same group ([`crate::process::pidns`]): the tree
//!   then dies with the init, and so with leaderrun, whatever kills it; COMMAND's status comes
//!   from the init's report pipe, and the tree is empty once the init is reaped.
//!
//! This module knows processes, not policy: when to signal, how long to wait and what a stop
//! means is the [`crate::supervisor`]'s business, through the [`Tree`] and [`Spawner`] traits
//! (which its tests implement with fake processes).
//!
//! What cannot be guaranteed without cgroups: a descendant that double-forks *and* whose
//! parent outlives it in another session is not ours until it is re-parented.
//!
//! One file, although long: the items above are one set of invariants, each a few functions
//! that lean on the others (the reaper recognises the main child, a tree reads what the reaper
//! left, the spawn's pre-exec half sets up what the tree's stop relies on), and a split would
//! scatter them.

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::{debug, warn};

use crate::process::cgroup::Cgroup;
use crate::process::group;
use crate::process::pidns::{self, PidNamespace, Report};
use crate::process::procfs;

/// How the main child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code (0–255).
    Code(i32),
    /// It was killed by this signal.
    Signal(Signal),
}

impl ExitStatus {
    /// The status a shell would report: the code, or 128 + signal number
    /// (docs/guarantees.md#exit-codes).
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
    /// Found, but the system cannot look at it (a loop of symbolic links, a name too long, a
    /// directory on the way without search permission): exit 126, as env(1) and a shell give,
    /// with the system's reason.
    #[error("cannot execute {program}")]
    Unusable {
        /// COMMAND as given.
        program: String,
        /// What the system said of the path.
        #[source]
        source: std::io::Error,
    },
    /// A script whose `#!` interpreter does not exist (exit 127, as a shell reports it).
    #[error("{program}: bad interpreter {interpreter}: no such file")]
    BadInterpreter {
        /// COMMAND as given.
        program: String,
        /// The interpreter its first line names.
        interpreter: String,
    },
    /// No watchdog runs and none could be started (exit 125): without one, COMMAND's tree
    /// could outlive a killed leaderrun while the lock passes on
    /// (docs/process-model.md#the-watchdog), so COMMAND is not started.
    #[error("cannot start COMMAND: no watchdog runs, and none can be started")]
    Unguarded,
    /// The safe window of the check that proved the lock closed before COMMAND's exec (the
    /// machine stalled between the check and the spawn): COMMAND was not started, and the
    /// term is over for it (rule 1, docs/guarantees.md#the-three-rules).
    #[error("the lock's proof ran out before COMMAND's exec; COMMAND was not started")]
    ProofLapsed,
    /// `exec` refused COMMAND's arguments and environment as too long for the kernel (E2BIG):
    /// exit 126, as any exec failure. Said with the sizes, because the environment leaderrun
    /// was started with fitted, and its own variables (`LEADERRUN_TERM`, …) may be what tips
    /// COMMAND's over; the kernel says only "Argument list too long".
    #[error("cannot start {program}: {sizes}")]
    TooLong {
        /// COMMAND as given.
        program: String,
        /// What exec was given, measured as the kernel counts it.
        sizes: ExecSizes,
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
    /// Whether a later start may succeed where this one failed with nothing of leaderrun's to
    /// mend: COMMAND's file (126/127: replaced mid-deploy, its interpreter missing for a
    /// moment), or the fork refused for want of a process or memory (EAGAIN, ENOMEM). A set-up
    /// step of leaderrun's own (its cgroup removed, the terminal) or a missing watchdog would
    /// fail every later start the same way (125). `--restart` starts COMMAND again after the
    /// first kind only.
    pub fn may_pass_later(&self) -> bool {
        match self {
            SpawnError::Unguarded | SpawnError::ProofLapsed => false,
            SpawnError::Spawn { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM))
                    || self.exit_code() != 125
            }
            _ => true,
        }
    }

    /// The exit status of docs/guarantees.md#exit-codes for this failure: 127, 126, or 125.
    pub fn exit_code(&self) -> u8 {
        match self {
            SpawnError::NotFound { .. } | SpawnError::BadInterpreter { .. } => 127,
            SpawnError::NotExecutable { .. }
            | SpawnError::Unusable { .. }
            | SpawnError::TooLong { .. } => 126,
            SpawnError::Unguarded | SpawnError::ProofLapsed => 125,
            // exec's own failures are 126 as env(1) gives them (found, cannot be run); the
            // rest (the clone: EAGAIN, ENOMEM) are leaderrun's.
            SpawnError::Spawn { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => 127,
                Some(
                    libc::EACCES
                    | libc::ENOEXEC
                    | libc::EISDIR
                    | libc::EPERM
                    | libc::ETXTBSY
                    | libc::E2BIG
                    | libc::ELOOP
                    | libc::ENAMETOOLONG
                    | libc::ELIBBAD
                    | libc::EIO,
                ) => 126,
                _ => 125,
            },
        }
    }
}

/// The sizes of what `exec` was given, for [`SpawnError::TooLong`]: bytes as the kernel counts
/// them against its limit, each string with its NUL and a pointer to it (fs/exec.c).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSizes {
    /// COMMAND's arguments, `argv[0]` included.
    pub argument_bytes: usize,
    /// Its environment, leaderrun's variables included.
    pub environment_bytes: usize,
    /// How many variables the environment holds.
    pub variables: usize,
    /// The part of `environment_bytes` that is leaderrun's own variables.
    pub added_bytes: usize,
    /// Their names (`LEADERRUN_TERM`, …).
    pub added: Vec<String>,
    /// The longest single string, which the kernel also bounds on its own.
    pub longest: usize,
    /// The system's limit for arguments and environment together (`sysconf(_SC_ARG_MAX)`,
    /// `getconf ARG_MAX`), when it can be read.
    pub limit: Option<usize>,
}

/// The kernel's bound on one argument or variable, `NAME=VALUE` and its NUL: 32 pages
/// (`MAX_ARG_STRLEN`, include/uapi/linux/binfmts.h).
pub const MAX_ARG_STRLEN: usize = 32 * 4096;

impl ExecSizes {
    /// Measures `argv` and `environment` (`NAME=VALUE` entries), of which `added` are
    /// leaderrun's own variables.
    pub fn measure(argv: &[OsString], environment: &[OsString], added: &[(&str, String)]) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let pointer = std::mem::size_of::<*const libc::c_char>();
        let cost = |s: &OsStr| s.as_bytes().len() + 1 + pointer;
        // SAFETY: sysconf reads a value; -1 is "unknown".
        let limit = unsafe { libc::sysconf(libc::_SC_ARG_MAX) };
        ExecSizes {
            argument_bytes: argv.iter().map(|a| cost(a)).sum(),
            environment_bytes: environment.iter().map(|e| cost(e)).sum(),
            variables: environment.len(),
            added_bytes: added
                .iter()
                .map(|(n, v)| n.len() + 1 + v.len() + 1 + pointer)
                .sum(),
            added: added.iter().map(|(n, _)| (*n).to_owned()).collect(),
            longest: argv
                .iter()
                .chain(environment)
                .map(|s| s.as_bytes().len() + 1)
                .max()
                .unwrap_or(0),
            limit: usize::try_from(limit).ok(),
        }
    }
}

impl std::fmt::Display for ExecSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its argument list and environment are too long for exec (E2BIG, \"Argument list \
             too long\"): arguments {} bytes, environment {} bytes in {} variables, {} bytes \
             in all (each string with its NUL and an {}-byte pointer)",
            self.argument_bytes,
            self.environment_bytes,
            self.variables,
            self.argument_bytes + self.environment_bytes,
            std::mem::size_of::<*const libc::c_char>(),
        )?;
        match self.limit {
            Some(limit) => write!(f, ", over the system's limit of about {limit} (ARG_MAX)")?,
            None => f.write_str(", over the system's limit (ARG_MAX)")?,
        }
        if self.longest > MAX_ARG_STRLEN {
            write!(
                f,
                ", and one string is {} bytes, over the {MAX_ARG_STRLEN} the kernel takes for one",
                self.longest
            )?;
        }
        write!(
            f,
            "; leaderrun added {} bytes of its own variables ({}) to the environment it was \
             started with: make that environment (or COMMAND's arguments) smaller",
            self.added_bytes,
            self.added.join(", ")
        )
    }
}

/// The shell that runs `-c STRING` ([`Command::shell`]).
pub const SHELL: &str = "/bin/sh";

/// COMMAND resolved to an executable file, with argv exactly as given.
#[derive(Clone, Debug)]
pub struct Command {
    program: PathBuf,
    argv: Vec<OsString>,
}

impl Command {
    /// Looks COMMAND (`argv[0]`) up like `execvp` does: a name with a slash is used as is,
    /// otherwise each `PATH` entry is tried (an empty entry is the current directory, and so is
    /// a `PATH` set to the empty string, its one entry; no `PATH` means
    /// `/usr/local/bin:/usr/bin:/bin`).
    ///
    /// # Errors
    /// [`SpawnError::NotFound`] when nothing matches; [`SpawnError::NotExecutable`] when only
    /// non-executable files (or directories) match; [`SpawnError::Unusable`] when a path with a
    /// slash cannot be looked at (a loop of symbolic links, a name too long).
    ///
    /// # Panics
    /// When `argv` is empty (the command line parser requires COMMAND).
    pub fn resolve(argv: Vec<OsString>, path: Option<&OsStr>) -> Result<Command, SpawnError> {
        let name = argv.first().expect("COMMAND is required").clone();
        let shown = name.to_string_lossy().into_owned();
        if name.is_empty() {
            return Err(SpawnError::NotFound { program: shown });
        }
        let direct = name.as_bytes().contains(&b'/');
        let candidates: Vec<PathBuf> = if direct {
            vec![PathBuf::from(&name)]
        } else {
            // An empty `PATH` is set, not unset: `execvp`, env(1) and a shell look in the
            // current directory alone, and taken for unset it ran a program from the default
            // directories that the caller had emptied `PATH` to keep out.
            let path = path.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
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
        let mut unusable = None;
        for candidate in candidates {
            match executable(&candidate) {
                // A path of its own is reported as the system saw it, as a shell does; a
                // directory of PATH that cannot be looked in is passed over, as a shell does.
                Err(source) if direct => unusable = Some(source),
                Err(_) => {}
                Ok(None) => {}
                Ok(Some(true)) => {
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
                Ok(Some(false)) => not_executable = true,
            }
        }
        if let Some(source) = unusable.filter(|_| !not_executable) {
            Err(SpawnError::Unusable {
                program: shown,
                source,
            })
        } else if not_executable {
            Err(SpawnError::NotExecutable { program: shown })
        } else {
            Err(SpawnError::NotFound { program: shown })
        }
    }

    /// `argv` (`sh -c STRING`) run by [`SHELL`], which is not looked up on `PATH`: as
    /// system(3) runs it, so a `PATH` without `/bin` (a service's own, a container's) or with
    /// another `sh` in front changes nothing.
    ///
    /// # Errors
    /// As [`Command::resolve`] for the path [`SHELL`].
    pub fn shell(argv: Vec<OsString>) -> Result<Command, SpawnError> {
        let program = Command::resolve(vec![SHELL.into()], None)?.program;
        Ok(Command { program, argv })
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
///
/// # Errors
/// What the system said when it could not look (`ELOOP`, `ENAMETOOLONG`, `EACCES` on a
/// directory on the way): not "nothing there", which is `ENOENT` and `ENOTDIR` only.
fn executable(path: &Path) -> std::io::Result<Option<bool>> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Ok(None)
        }
        Err(err) => return Err(err),
    };
    if !meta.is_file() {
        return Ok(Some(false));
    }
    // access(2) answers for our real uid, including root's "any x bit" rule.
    let ok = nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
        && meta.permissions().mode() & 0o111 != 0;
    Ok(Some(ok))
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

/// Reaps every child that has exited: the one place that waits
/// (docs/field-notes.md#one-place-waits). Also reports a stop of the main child (`WUNTRACED`),
/// which is how a Ctrl-Z shows, and continues `helper` (the watchdog) when it was stopped
/// ([`continue_if_stopped`]).
///
/// `main` is the pid whose status matters; every other reaped pid is an adopted orphan or a
/// leftover of an earlier term and is only logged at DEBUG.
pub fn reap(main: Option<Pid>, helper: Option<Pid>) -> Reaped {
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
            Ok(WaitStatus::Stopped(pid, sig)) if Some(pid) == helper => {
                continued_helper(pid, sig);
            }
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(_) => return reaped, // ECHILD: no children at all
        }
    }
}

/// Continues `helper` (the watchdog) if it is stopped now, and says so: a stopped watchdog
/// guards nothing, and a `kill -9` of leaderrun meanwhile would leave COMMAND's tree running
/// beside the next leader's (docs/process-model.md#the-watchdog). Its own stops (`SIGSTOP`
/// from outside; it ignores the terminal's) are undone at once: [`reap`] sees them when
/// `SIGCHLD` comes, and a grant looks before it hands the session over. Returns whether it was
/// stopped. The stop's report is left for [`reap`] (`WNOWAIT`); once continued there is none.
pub fn continue_if_stopped(helper: Pid) -> bool {
    use nix::sys::wait::{waitid, Id};
    match waitid(
        Id::Pid(helper),
        WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
    ) {
        Ok(WaitStatus::Stopped(pid, sig)) => {
            continued_helper(pid, sig);
            true
        }
        _ => false,
    }
}

fn continued_helper(pid: Pid, sig: Signal) {
    let _ = kill(pid, Signal::SIGCONT);
    tracing::warn!(
        pid = pid.as_raw(),
        signal = sig.as_str(),
        "the watchdog was stopped from outside; continued it"
    );
}

/// The pid of leaderrun's own helper process (the watchdog), which is a child of leaderrun but
/// never part of COMMAND's tree: one shared cell, set by whoever starts helpers (the watchdog's
/// handle, at every start, since a helper that died is replaced while a tree runs) and read by
/// the trees it is given to, which leave that pid out of their orphans. The default: none.
#[derive(Clone, Debug, Default)]
pub struct HelperPid(Arc<std::sync::atomic::AtomicI32>);

impl HelperPid {
    /// Records `pid` as the running helper (`None`: none runs).
    pub fn set(&self, pid: Option<u32>) {
        self.0.store(
            pid.map_or(0, |p| p as i32),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// The running helper's pid, if one was recorded.
    pub fn get(&self) -> Option<Pid> {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            pid => Some(Pid::from_raw(pid)),
        }
    }
}

/// Pids whose parent is this process (the main child and every adopted orphan, not `helper`),
/// read from
/// `/proc/self/task/*/children`: a subreaper's orphans are re-parented to one of its threads.
/// `None` when that cannot be read (no `/proc`); then only the process group can be reached.
pub fn own_children(helper: Option<Pid>) -> Option<Vec<Pid>> {
    children_of("/proc/self/task", helper)
}

/// [`own_children`] but those leaderrun was handed at start ([`inherited`](crate::process::inherited)):
/// the orphans of COMMAND's tree it may have adopted.
fn adopted_children(helper: Option<Pid>) -> Option<Vec<Pid>> {
    own_children(helper).map(crate::process::inherited::without_inherited)
}

/// The children of every thread under `tasks` (a `/proc/PID/task` directory) but `skip`.
/// `None` when any live thread's list cannot be read (no `/proc`; `EMFILE`): a partial list
/// would prove a tree gone while an orphan re-parented to that thread still runs.
fn children_of(tasks: &str, skip: Option<Pid>) -> Option<Vec<Pid>> {
    let skip = skip.map_or(0, Pid::as_raw);
    let tasks = std::fs::read_dir(tasks).ok()?;
    let mut out = Vec::new();
    let mut read_any = false;
    for task in tasks {
        let list = match std::fs::read_to_string(task.ok()?.path().join("children")) {
            Ok(list) => list,
            // The thread exited meanwhile; its children went to another.
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => continue,
            Err(_) => return None,
        };
        read_any = true;
        out.extend(
            list.split_ascii_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    if !read_any {
        return None;
    }
    // The lists name processes as the procfs's namespace does, which need not be ours.
    let out = procfs::to_own(out)?;
    Some(
        out.into_iter()
            .filter(|&p| p != skip)
            .map(Pid::from_raw)
            .collect(),
    )
}

/// Whether a procfs that can name this process's children is mounted on `/proc`: this PID
/// namespace's, or another's whose pids translate ([`procfs::view`]).
fn procfs_mounted() -> bool {
    procfs::view() != procfs::View::None
}

/// Says once per process that without `/proc` the tree is its process group and its main
/// child only.
fn warn_once_without_procfs() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "no /proc that names this PID namespace's processes: processes of COMMAND that \
             leave its process group (setsid) cannot be found, so they are neither stopped nor \
             waited for (mount /proc to have them stopped too)"
        );
    });
}

/// What one look at a [`Tree`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeState {
    /// The main child's status, once it has been reaped.
    pub main: Option<ExitStatus>,
    /// The signal that stopped the main child since the last look (Ctrl-Z, or reading the
    /// terminal from the background), if it stopped.
    pub stopped: Option<Signal>,
    /// Whether nothing of the tree is left: the main child reaped, its group gone, no adopted
    /// orphan alive.
    pub empty: bool,
    /// Whether the watchdog stopped the tree (leaderrun did not answer it in time) while no
    /// stop was asked for: its end is not COMMAND's own, and the term must end for it.
    pub fenced: bool,
    /// Whether the tree runs with no watchdog, the one it had gone and none could be started
    /// in its place (no process or descriptor left): a kill of leaderrun now would leave the
    /// tree's helpers running while the lock passes on, so the term must end and the tree be
    /// stopped, as a tree is never started unguarded.
    pub unguarded: bool,
}

/// COMMAND's process tree as the supervisor drives it: the main child, its process group, and
/// the orphans adopted from it. Dropping a tree that may still run kills it (SIGKILL, without
/// the grace): the supervisor always stops a tree first, so a live tree is dropped only when a
/// panic unwinds the supervisor, and then nothing of COMMAND may outlive leaderrun. A panic
/// that is caught elsewhere unwinds no tree and leaves it running.
pub trait Tree: std::fmt::Debug {
    /// The main child's pid, which is also its process group id.
    fn pid(&self) -> u32;
    /// Sends `sig` to the main child's process group only (signals passed on, job control),
    /// and to the main child by pid when it has left that group.
    fn signal_group(&mut self, sig: Signal);
    /// Sends `sig` to the group and to every adopted orphan (a stop).
    fn signal_all(&mut self, sig: Signal);
    /// Reaps what has exited and reports what is left.
    fn poll(&mut self) -> TreeState;
}

/// A datagram the child sends on a descriptor of its own just before exec, the last thing it
/// does: whoever reads the other end learns of the tree before anything of it runs. The
/// watchdog uses it ([`crate::watchdog::WatchedSpawner`]): a leaderrun frozen or killed between
/// the child's exec and its own report would otherwise leave the tree unguarded.
#[derive(Clone, Copy, Debug)]
pub struct Announcement<'a> {
    /// A `SOCK_SEQPACKET` (or `SOCK_DGRAM`) socket; sent without blocking and without
    /// SIGPIPE, and a failed send is not an error (the reader is gone, and the spawn's caller
    /// tells it the tree again).
    pub socket: BorrowedFd<'a>,
    /// The datagram's bytes.
    pub datagram: &'a [u8],
}

/// Starts COMMAND: the supervisor's one way to make a [`Tree`].
pub trait Spawner {
    /// Starts COMMAND with `env` added to the inherited environment; `announce`, when given,
    /// is sent by the child itself just before exec ([`Announcement`]). `exec_by`, when
    /// given, is the end of the proof the start is made under (CLOCK_BOOTTIME, as
    /// [`crate::elector::Term::proven_until`]): the child checks it just before exec, and
    /// one that comes later exits unexecuted.
    ///
    /// # Errors
    /// [`SpawnError`] as [`Child::spawn`] reports it; [`SpawnError::ProofLapsed`] when
    /// `exec_by` passed first.
    fn spawn(
        &mut self,
        env: &[(&'static str, String)],
        announce: Option<Announcement<'_>>,
        exec_by: Option<std::time::Duration>,
    ) -> Result<Box<dyn Tree>, SpawnError>;

    /// Reaps children that belong to no running tree (leftovers of an earlier term, strays
    /// adopted as PID 1 or subreaper).
    fn reap_strays(&mut self);
}

/// The real [`Spawner`]: forks and execs `command`, giving the child the terminal's foreground
/// while leaderrun's group has it (at start, or once `fg` gave it).
#[derive(Debug)]
pub struct ProcessSpawner {
    /// What to run.
    pub command: Command,
    /// leaderrun's controlling terminal, if it has one ([`Terminal::claim`]); a child gets its
    /// foreground only while leaderrun's group has it.
    ///
    /// [`Terminal::claim`]: crate::process::terminal::Terminal::claim
    pub terminal: Option<Arc<crate::process::terminal::Terminal>>,
    /// COMMAND's cgroup, where leaderrun could make one.
    pub cgroup: Option<Arc<Cgroup>>,
    /// leaderrun's helper process, never counted as part of a tree.
    pub helper: HelperPid,
    /// With `--pid-namespace`: COMMAND runs under an init of its own, PID 1 of a new PID
    /// namespace ([`crate::process::pidns`]).
    pub pid_namespace: Option<Arc<PidNamespace>>,
}

impl Spawner for ProcessSpawner {
    fn spawn(
        &mut self,
        env: &[(&'static str, String)],
        announce: Option<Announcement<'_>>,
        exec_by: Option<std::time::Duration>,
    ) -> Result<Box<dyn Tree>, SpawnError> {
        Ok(Box::new(Child::spawn(
            &self.command,
            env,
            Placement {
                // Only while leaderrun's group has the foreground now: after Ctrl-Z and `bg`
                // the shell has it, and a child that took it (SIGTTOU is ignored) would leave
                // the shell without its terminal.
                foreground: self
                    .terminal
                    .as_ref()
                    .and_then(|terminal| terminal.for_new_child()),
                cgroup: self.cgroup.clone(),
                helper: self.helper.clone(),
                pid_namespace: self.pid_namespace.as_deref(),
                announce,
                exec_by,
            },
        )?))
    }

    fn reap_strays(&mut self) {
        reap(None, self.helper.get());
    }
}

/// Variables of leaderrun's environment that COMMAND does not inherit.
///
/// systemd's notification socket belongs to leaderrun (the main process), as sd_notify's
/// unset_environment would have it. Socket activation's descriptors were leaderrun's and are
/// closed in the child (every descriptor above 2 is): a socket-activated COMMAND would take
/// whatever it opens as descriptor 3 for a listening socket.
pub const NOT_INHERITED: [&str; 6] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// COMMAND's environment as `NAME=VALUE` entries: leaderrun's own without
/// [`NOT_INHERITED`], with `env` set over it.
fn child_environment(env: &[(&str, String)]) -> Vec<OsString> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| {
            !NOT_INHERITED.iter().any(|n| name == n) && !env.iter().any(|(n, _)| name == n)
        })
        .collect();
    vars.extend(
        env.iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v))),
    );
    vars.into_iter()
        .map(|(name, value)| {
            let mut entry = name;
            entry.push("=");
            entry.push(value);
            entry
        })
        .collect()
}

/// Where a [`Child`] runs, besides its own process group.
#[derive(Debug, Default)]
pub struct Placement<'a> {
    /// The controlling terminal's descriptor when leaderrun owns its foreground: the child's
    /// group becomes the terminal's foreground group before exec.
    pub foreground: Option<RawFd>,
    /// COMMAND's cgroup, where leaderrun could make one.
    pub cgroup: Option<Arc<Cgroup>>,
    /// leaderrun's helper process, never counted as part of a tree.
    pub helper: HelperPid,
    /// A PID namespace of its own, under an init of leaderrun's ([`crate::process::pidns`]).
    pub pid_namespace: Option<&'a PidNamespace>,
    /// Sent by the child just before exec (in a PID namespace, by its init, before it execs
    /// itself as the init): the process that leads the tree's group is its sender.
    pub announce: Option<Announcement<'a>>,
    /// The latest moment of COMMAND's exec (CLOCK_BOOTTIME), checked by the process that
    /// execs it (in a PID namespace, by its init too): the end of the proof it starts under.
    pub exec_by: Option<std::time::Duration>,
}

/// How long a spawn in a PID namespace waits for its init to say whether COMMAND was exec'd:
/// it answers within milliseconds unless it is stopped or the machine is overloaded beyond use.
const INIT_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after the proof's end a spawn in a PID namespace still waits for its init's
/// report: an exec just inside the bound is reported through a pipe, by an init that a loaded
/// machine may not run at once. An init that has not answered by then is killed, and its end
/// waited for.
const INIT_REPORT_TRANSIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The init of COMMAND's PID namespace, as its [`Child`] sees it.
#[derive(Debug)]
struct Init {
    /// The read end of the init's report pipe (non-blocking).
    reports: std::os::fd::OwnedFd,
    /// The init has been reaped: the kernel has ended everything in the namespace.
    reaped: bool,
    /// `/proc/PID/task` of the init, whose children are the namespace's orphans.
    tasks: String,
}

impl Init {
    /// Every report that is there now.
    fn drain(&self) -> Vec<Report> {
        use std::os::fd::AsRawFd;
        let mut out = Vec::new();
        loop {
            let mut buf = [0u8; 8];
            // SAFETY: read into a local buffer from our own non-blocking descriptor.
            let n = unsafe { libc::read(self.reports.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            if n != 8 {
                if n < 0 && Errno::last() == Errno::EINTR {
                    continue;
                }
                return out;
            }
            out.extend(Report::decode(buf));
        }
    }
}

/// A running COMMAND: the leader of its own process group (with `--pid-namespace`, the init
/// of its namespace leads the group, and COMMAND is in it).
#[derive(Debug)]
pub struct Child {
    pid: Pid,
    status: Option<ExitStatus>,
    stopped: Option<Signal>,
    empty: bool,
    /// The last stop signal sent with [`Tree::signal_all`], and the orphans that got it: an
    /// orphan adopted later (its parent died meanwhile) gets it when it shows up.
    stopping: Option<Signal>,
    signalled: HashSet<Pid>,
    cgroup: Option<Arc<Cgroup>>,
    /// leaderrun's helper, left out of the orphans.
    helper: HelperPid,
    /// With `--pid-namespace`: the init that leads the group (`pid`).
    init: Option<Init>,
}

impl Child {
    /// Starts `command` in a new process group with `env` added to the inherited environment,
    /// placed as `placement` says.
    ///
    /// Must be called on the thread that lives as long as the process (the binary's main
    /// thread), because `PR_SET_PDEATHSIG` is tied to the forking thread.
    ///
    /// # Errors
    /// [`SpawnError::Spawn`] when fork or exec fails; exec's errno is reported through the
    /// spawn (in a PID namespace, by its init), so [`SpawnError::exit_code`] gives 126/127
    /// like a shell.
    pub fn spawn(
        command: &Command,
        env: &[(&str, String)],
        placement: Placement<'_>,
    ) -> Result<Child, SpawnError> {
        let Placement {
            foreground,
            cgroup,
            helper,
            pid_namespace,
            announce,
            exec_by,
        } = placement;
        let program = || command.argv[0].to_string_lossy().into_owned();
        // ETIME is no errno of exec's or clone's: only the pre-exec check of the proof's end
        // reports it (as a set-up step; from a PID namespace's init, as exec's).
        let failed = |source: std::io::Error| {
            let setup = super::spawn::SetupFailed::errno_of(&source);
            match setup.or(source.raw_os_error()) {
                Some(libc::ETIME) => SpawnError::ProofLapsed,
                // exec's own E2BIG (a set-up step never reports it): measured here, in the
                // parent, where allocating is fine.
                Some(libc::E2BIG) if setup.is_none() => SpawnError::TooLong {
                    program: program(),
                    sizes: ExecSizes::measure(&command.argv, &child_environment(env), env),
                },
                _ => SpawnError::Spawn {
                    program: program(),
                    source,
                },
            }
        };
        // Nanoseconds of CLOCK_BOOTTIME; 0: no bound.
        let exec_by_ns = exec_by.map_or(0, |at| u64::try_from(at.as_nanos()).unwrap_or(u64::MAX));
        // The init's report pipe: the write end goes to the init as descriptor 3.
        let reports = match pid_namespace {
            Some(_) => Some(
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|errno| failed(errno.into()))?,
            ),
            None => None,
        };
        let parent = nix::unistd::getpid().as_raw();
        let keep_ignored = crate::process::signals::ignored_at_entry();
        let tty = foreground.unwrap_or(-1);
        let procs = cgroup.as_ref().map(|c| c.procs_path().clone());
        let ns = ChildNamespace {
            parent_pidfd: pid_namespace.map_or(-1, PidNamespace::parent_pidfd),
            report: reports.as_ref().map_or(-1, |(_, w)| {
                use std::os::fd::AsRawFd;
                w.as_raw_fd()
            }),
        };
        let announce = announce.map(|a| {
            use std::os::fd::AsRawFd;
            (a.socket.as_raw_fd(), a.datagram)
        });
        let nofile = crate::process::descriptors::original_soft();
        let stack = crate::process::stack::original();
        let pre_exec = PreExec {
            parent,
            tty,
            keep_ignored,
            cgroup_procs: procs.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
            ns,
            nofile,
            stack,
            announce,
            exec_by_ns,
        };
        let prepare = move || prepare_child(&pre_exec);
        let (pid, init) = match (pid_namespace, reports) {
            (Some(namespace), Some((read, write))) => {
                let pid = namespace
                    .spawn_init(
                        &command.program,
                        &command.argv,
                        &child_environment(env),
                        exec_by_ns,
                        {
                            use std::os::fd::AsRawFd;
                            write.as_raw_fd()
                        },
                        prepare,
                    )
                    .map_err(failed)?;
                drop(write);
                (pid, Some(await_exec(pid, read, exec_by).map_err(failed)?))
            }
            _ => {
                // SAFETY: `prepare` makes raw syscalls only (no allocation, no locks), as a
                // child that shares our memory until exec requires.
                let pid = unsafe {
                    super::spawn::spawn(
                        &command.program,
                        &command.argv,
                        &child_environment(env),
                        &prepare,
                    )
                }
                .map_err(failed)?;
                (pid, None)
            }
        };
        Ok(Child {
            pid,
            status: None,
            stopped: None,
            empty: false,
            stopping: None,
            signalled: HashSet::new(),
            cgroup,
            helper,
            init,
        })
    }

    fn group_alive(&self) -> bool {
        !matches!(killpg(self.pid, None), Err(Errno::ESRCH))
    }

    /// The rest of the tree that can be reached by pid: the cgroup's processes, or else the
    /// orphans adopted by leaderrun.
    ///
    /// Adopted orphans count only when this process is the tree's subreaper (or PID 1):
    /// otherwise its other children are none of the tree's business (a program that embeds
    /// the library, a test binary). The children leaderrun was handed at start never count
    /// ([`inherited`](crate::process::inherited)).
    ///
    /// In a PID namespace the orphans are the init's children outside the group (COMMAND's
    /// group gets every signal through the group).
    fn orphans(&self) -> Option<Vec<Pid>> {
        let all = match (&self.cgroup, &self.init) {
            // A namespace's processes die with its init, wherever their cgroup.
            (Some(cgroup), Some(_)) => Some(cgroup.pids()),
            // A descendant may leave the cgroup too (root may write any cgroup.procs:
            // `systemd-run --scope`, container tooling): once it is adopted, it is found
            // among leaderrun's children as without a cgroup.
            (Some(cgroup), None) => {
                let mut all = cgroup.pids();
                // Where the children cannot be read, the cgroup's members still are.
                if let Some(adopted) = is_reaper()
                    .then(|| adopted_children(self.helper.get()))
                    .flatten()
                {
                    for pid in adopted {
                        if !all.contains(&pid) {
                            all.push(pid);
                        }
                    }
                }
                Some(all)
            }
            (None, Some(init)) if init.reaped => Some(Vec::new()),
            (None, Some(init)) => children_of(&init.tasks, None).map(|children| {
                children
                    .into_iter()
                    .filter(|&p| nix::unistd::getpgid(Some(p)).ok() != Some(self.pid))
                    .collect()
            }),
            (None, None) if is_reaper() => adopted_children(self.helper.get()),
            (None, None) => Some(Vec::new()),
        };
        all.map(|all| all.into_iter().filter(|&p| p != self.pid).collect())
    }

    /// Whether the process that leads the group (COMMAND, or its namespace's init) has been
    /// reaped.
    fn leader_reaped(&self) -> bool {
        match &self.init {
            Some(init) => init.reaped,
            None => self.status.is_some(),
        }
    }
}

impl Tree for Child {
    fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    fn signal_group(&mut self, sig: Signal) {
        match killpg(self.pid, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => warn!(
                pgid = self.pid.as_raw(),
                signal = sig.as_str(),
                "cannot signal the child's process group: {err}"
            ),
        }
        // COMMAND may have moved itself into another group of the session (`setpgid` into
        // leaderrun's own): the group's signal then misses it, and it is no orphan either, so
        // nothing reached it and whatever it started outlived the stop. Reached by pid then,
        // and only then: one that stayed must not get every signal twice. Checked after the
        // group's signal, so one that moves meanwhile gets it one way or the other. (Under
        // `--pid-namespace` the group's leader is the namespace's init, which passes signals
        // on itself.)
        if self.init.is_none()
            && self.status.is_none()
            && nix::unistd::getpgid(Some(self.pid)).is_ok_and(|group| group != self.pid)
        {
            let _ = kill(self.pid, sig);
        }
    }

    fn signal_all(&mut self, sig: Signal) {
        self.signal_group(sig);
        if sig == Signal::SIGKILL {
            if let Some(cgroup) = &self.cgroup {
                cgroup.kill();
            }
        }
        if sig != Signal::SIGCONT {
            self.stopping = Some(sig);
            self.signalled.clear();
        }
        for orphan in self.orphans().unwrap_or_default() {
            let _ = kill(orphan, sig);
            // Only the stop signal counts as sent: an orphan that shows up between a stop and
            // its SIGCONT (its parent died of the stop) got the SIGCONT alone, and must still
            // get the stop signal at the next poll.
            if sig != Signal::SIGCONT {
                self.signalled.insert(orphan);
            }
        }
    }

    fn poll(&mut self) -> TreeState {
        let reaped = reap(Some(self.pid), self.helper.get());
        let mut stopped_now = reaped.main_stopped;
        match &mut self.init {
            None => {
                if let Some(status) = reaped.main {
                    self.status = Some(status);
                }
            }
            Some(init) => {
                // The init itself never stops (it has no handler); COMMAND's stop is reported.
                stopped_now = None;
                // Read after the reap: an init that was reaped wrote all it had.
                for report in init.drain() {
                    match report {
                        Report::Status(raw) => match pidns::decode_status(raw) {
                            Some(Ok(status)) => self.status = Some(status),
                            Some(Err(sig)) => stopped_now = Some(sig),
                            None => {}
                        },
                        Report::Started | Report::ExecFailed(_) | Report::SetupFailed(_) => {}
                    }
                }
                if let Some(own) = reaped.main {
                    init.reaped = true;
                    // Killed before COMMAND ended (SIGKILL after the grace): the init's end
                    // is COMMAND's.
                    self.status.get_or_insert(own);
                }
            }
        }
        let stopped = stopped_now.or(self.stopped.take());
        if self.empty {
            return TreeState {
                main: self.status,
                stopped,
                empty: true,
                fenced: false,
                unguarded: false,
            };
        }
        // Only a stop or a finished main child needs the orphans: avoid reading them otherwise.
        let orphans = (self.stopping.is_some() || self.status.is_some())
            .then(|| self.orphans())
            .flatten();
        if let (Some(sig), Some(orphans)) = (self.stopping, &orphans) {
            for &orphan in orphans {
                if self.signalled.insert(orphan) {
                    let _ = kill(orphan, sig);
                    if sig != Signal::SIGKILL {
                        let _ = kill(orphan, Signal::SIGCONT);
                    }
                }
            }
        }
        if self.status.is_some() {
            let orphans_left = match (&self.cgroup, &self.init, orphans) {
                (Some(cgroup), Some(_), _) => cgroup.populated() || !self.leader_reaped(),
                // Adopted children that left the cgroup count as without one.
                (Some(cgroup), None, orphans) => {
                    cgroup.populated()
                        || !self.leader_reaped()
                        || orphans.is_some_and(|o| !o.is_empty())
                }
                // The namespace is empty once its init is reaped.
                (None, Some(init), _) => !init.reaped,
                (None, None, Some(orphans)) => !orphans.is_empty(),
                // No /proc at all (a chroot without it): no orphan can be named, so none can
                // be signalled or waited for, and leaderrun's own watchdog is a child that
                // never ends: counting "any child" made every stop wait out the grace and
                // KILL_WAIT for nothing. Said once; the group and the main child still count.
                (None, None, None) if !procfs_mounted() => {
                    warn_once_without_procfs();
                    false
                }
                // /proc is there but the list could not be read (EMFILE): any child at all
                // counts, since a partial answer could prove a running orphan gone.
                (None, None, None) => reaped.children_left,
            };
            self.empty = !self.group_alive() && !orphans_left;
        }
        TreeState {
            main: self.status,
            stopped,
            empty: self.empty,
            fenced: false,
            unguarded: false,
        }
    }
}

/// How long a [`Child`] dropped before it was seen empty waits, after its SIGKILL, for the
/// tree to be gone: SIGKILLed processes end within milliseconds unless they sleep
/// uninterruptibly in the kernel.
const DROP_KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for Child {
    /// A tree dropped before it was seen empty is killed: see [`Tree`]. The drop waits (at
    /// most `DROP_KILL_WAIT`, 1 s) until it is gone: what the tree's owner drops after it (a
    /// supervisor unwinding from a panic drops the term's hold, which lets the lock go) comes
    /// after the tree's end, as rule 2 wants, not after the signal's sending.
    fn drop(&mut self) {
        if self.empty {
            return;
        }
        let _ = killpg(self.pid, Signal::SIGKILL);
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill();
        }
        if !self.leader_reaped() {
            // COMMAND, or its namespace's init, whose death ends the namespace.
            let _ = kill(self.pid, Signal::SIGKILL);
        }
        for orphan in self.orphans().unwrap_or_default() {
            let _ = kill(orphan, Signal::SIGKILL);
        }
        // Waited for without reaping (the reaper is the one place that waits, and a program
        // that embeds this has children of its own): the group's live members, then the
        // cgroup and the orphans, SIGKILLing any orphan that shows up meanwhile.
        let deadline = crate::elector::boottime() + DROP_KILL_WAIT;
        let _ = group::wait_group_exit(self.pid.as_raw(), DROP_KILL_WAIT, true);
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            let orphans: Vec<Pid> = self
                .orphans()
                .unwrap_or_default()
                .into_iter()
                .filter(|p| group::is_live(p.as_raw()))
                .collect();
            let populated = self.cgroup.as_ref().is_some_and(|c| c.populated());
            // Where pidfds are missing the group's wait above returned at once: look here.
            let group_left = group::live_members(self.pid.as_raw()).is_some_and(|m| !m.is_empty());
            if (orphans.is_empty() && !populated && !group_left)
                || crate::elector::boottime() >= deadline
            {
                break;
            }
            for orphan in orphans {
                let _ = kill(orphan, Signal::SIGKILL);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(10));
        }
    }
}

/// Waits for the init of a new namespace (`pid`) to say whether COMMAND was exec'd, on its
/// report pipe (`reports`, which is made non-blocking for [`Child::poll`]).
///
/// # Errors
/// exec's error as the init reported it; `ETIME` when it did not answer by `exec_by` (and
/// [`INIT_REPORT_TRANSIT`]), `ETIMEDOUT` or `EPIPE` when it did not answer within
/// [`INIT_ANSWER_WAIT`] or died first (it is then killed and left to the reaper).
fn await_exec(
    pid: Pid,
    reports: std::os::fd::OwnedFd,
    exec_by: Option<std::time::Duration>,
) -> std::io::Result<Init> {
    use std::os::fd::AsRawFd;
    // An init that has not answered a moment after the proof's end cannot exec COMMAND any
    // more (it checks the same bound): stop waiting for it then, not seconds later with the
    // runtime's thread held.
    let within = exec_by.map_or(INIT_ANSWER_WAIT, |at| {
        (at.saturating_sub(crate::elector::boottime()) + INIT_REPORT_TRANSIT).min(INIT_ANSWER_WAIT)
    });
    let silent = match within < INIT_ANSWER_WAIT {
        true => libc::ETIME,
        false => libc::ETIMEDOUT,
    };
    let deadline = std::time::Instant::now() + within;
    let mut buf = [0u8; 8];
    let answer = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: reports.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd of ours.
        let ready =
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        if ready <= 0 {
            break Err(std::io::Error::from_raw_os_error(silent));
        }
        // SAFETY: read into a local buffer; the pipe is blocking until below, and readable.
        let n = unsafe { libc::read(reports.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        break match (n == 8).then(|| Report::decode(buf)).flatten() {
            Some(Report::Started) => Ok(()),
            Some(Report::ExecFailed(errno)) => Err(std::io::Error::from_raw_os_error(errno)),
            Some(Report::SetupFailed(errno)) => Err(super::spawn::SetupFailed(errno).into()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EPIPE)),
        };
    };
    if let Err(err) = answer {
        // The init may have exec'd COMMAND and not said so yet: its end (and so its
        // namespace's) is waited for, so what the caller does next (end the term, release)
        // comes after the tree's end (rule 2).
        let _ = kill(pid, Signal::SIGKILL);
        let _ = group::wait_group_exit(pid.as_raw(), DROP_KILL_WAIT, true);
        return Err(err);
    }
    nix::fcntl::fcntl(
        &reports,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )?;
    signal_on_report(&reports);
    Ok(Init {
        reports,
        reaped: false,
        // Where the init cannot be found in /proc, a path that names nothing: its children
        // are then unknown, never another process's.
        tasks: procfs::child_dir(pid.as_raw()).map_or_else(String::new, |dir| dir + "/task"),
    })
}

/// Has the kernel send leaderrun SIGCHLD whenever the init writes a report (`O_ASYNC`, with
/// `F_SETSIG`): the init's own SIGCHLD comes only at its end, and COMMAND's end while helpers
/// of it still run in the namespace, or its stop by Ctrl-Z, waited for the reaper's
/// one-second poll (a one-shot took a second longer, and the helpers ran on as long). The
/// init cannot signal leaderrun itself: across the namespace's border it has no pid for it.
/// Best effort: where it cannot be set, the poll still finds the reports.
fn signal_on_report(reports: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    // <fcntl.h>'s F_SETSIG, the same on every Linux architecture; the libc crate lacks it.
    const F_SETSIG: libc::c_int = 10;
    let fd = reports.as_raw_fd();
    // SAFETY: fcntl on a descriptor of ours. The signal is chosen before O_ASYNC is set:
    // without it the kernel would send SIGIO, which ends the process.
    let armed = unsafe {
        libc::fcntl(fd, F_SETSIG, libc::SIGCHLD) == 0
            && libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) == 0
            && libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK | libc::O_ASYNC) == 0
    };
    // A report written before the arming raised nothing: look once.
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd of ours, without waiting; kill of ourselves.
    if armed && unsafe { libc::poll(&mut pfd, 1, 0) } > 0 {
        unsafe { libc::kill(libc::getpid(), libc::SIGCHLD) };
    }
}

/// What the pre-exec half needs for a child that is the init of a new PID namespace; `-1`
/// for each without one.
#[derive(Clone, Copy, Debug)]
struct ChildNamespace {
    /// A pidfd of leaderrun: `getppid()` is 0 across the namespace's border.
    parent_pidfd: RawFd,
    /// The report pipe's write end, which goes to [`pidns::REPORT_FD`].
    report: RawFd,
}

/// What the forked child's set-up before exec ([`prepare_child`]) works from, made before the
/// fork: plain values, pointers into what the spawn keeps alive.
#[derive(Clone, Copy)]
struct PreExec<'a> {
    /// leaderrun's pid, for the `getppid()` check.
    parent: i32,
    /// The terminal whose foreground the child takes, or -1.
    tty: RawFd,
    /// The signals ignored when leaderrun started, a bit each: they stay ignored.
    keep_ignored: u64,
    /// COMMAND's cgroup's `cgroup.procs` (NUL-terminated), or null.
    cgroup_procs: *const libc::c_char,
    /// A PID namespace's part.
    ns: ChildNamespace,
    /// The descriptor limit to put back.
    nofile: Option<libc::rlimit>,
    /// The stack limit to put back.
    stack: Option<libc::rlimit>,
    /// The watchdog's socket and the datagram that announces the tree.
    announce: Option<(RawFd, &'a [u8])>,
    /// The latest moment of exec, CLOCK_BOOTTIME nanoseconds; 0: none.
    exec_by_ns: u64,
}

/// Runs in the forked child before exec: raw syscalls only
/// (docs/field-notes.md#only-raw-syscalls-before-exec).
fn prepare_child(pre: &PreExec<'_>) -> std::io::Result<()> {
    let PreExec {
        parent,
        tty,
        keep_ignored,
        cgroup_procs,
        ns,
        nofile,
        stack,
        announce,
        exec_by_ns,
    } = *pre;
    // SAFETY: plain syscalls on values we own; no allocation, no locks.
    unsafe {
        // Into COMMAND's cgroup first, so everything it ever starts is there too ("0": the
        // writer itself).
        // A tree outside the cgroup it was given would be seen gone while it runs (an empty
        // cgroup is a dead tree): a join that fails fails the spawn.
        if !cgroup_procs.is_null() {
            let fd = libc::open(cgroup_procs, libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if written != 1 {
                return Err(err);
            }
        }
        // Own process group, so the stop signal reaches everything it starts
        // (docs/field-notes.md#signal-the-group-not-the-pid).
        if libc::setpgid(0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Take the terminal's foreground before exec, so the program never reads the terminal
        // from a background group. SIGTTOU is still ignored here (inherited from leaderrun).
        if tty >= 0 {
            libc::tcsetpgrp(tty, libc::getpid());
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
        // Across a namespace's border getppid() is 0: there leaderrun's pidfd says it.
        if ns.parent_pidfd >= 0 {
            let mut pfd = libc::pollfd {
                fd: ns.parent_pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 0) != 0 {
                libc::_exit(125);
            }
        } else if libc::getppid() != parent {
            libc::_exit(125);
        }
        // Handlers are reset by exec, but ignored signals stay ignored: restore the default
        // for what leaderrun itself ignored (SIGPIPE, SIGTTOU), keep what was ignored when it
        // started, as a POSIX shell does (docs/field-notes.md#ignored-dispositions-survive-exec).
        // SIGCHLD is the one of those leaderrun handles all the same (its reaper needs it): exec
        // would reset that handler to the default, so it is ignored again here.
        for sig in 1..32 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            if keep_ignored & (1 << sig) == 0 {
                libc::signal(sig, libc::SIG_DFL);
            } else if sig == libc::SIGCHLD {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // No descriptor of ours survives exec
        // (docs/field-notes.md#no-descriptor-leaks-into-the-child). Mark, don't close: exec
        // closes them once it succeeds (one syscall, whatever the number of descriptors).
        crate::process::descriptors::close_on_exec_from(3);
        // COMMAND gets the descriptor limit leaderrun was started with, when leaderrun raised
        // its own (docs/process-model.md#enough-descriptors). After the marking above, whose
        // fallback reads the soft limit: leaderrun's descriptors may lie above the original.
        if let Some(nofile) = nofile {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &nofile) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // And the stack limit (docs/process-model.md#enough-stack): exec lays out COMMAND's
        // stack by it.
        if let Some(stack) = stack {
            if libc::setrlimit(libc::RLIMIT_STACK, &stack) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // The init's report pipe, the one descriptor it keeps (dup2 onto itself would keep
        // close-on-exec).
        if ns.report >= 0 {
            if ns.report == pidns::REPORT_FD {
                libc::fcntl(pidns::REPORT_FD, libc::F_SETFD, 0);
            } else if libc::dup2(ns.report, pidns::REPORT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // The proof the start is made under must still hold at exec: a machine that stalled
        // since the check (or a stopped leaderrun, whose clone waits for this child) does not
        // start COMMAND after its safe window (rule 1).
        if past_boottime(exec_by_ns) {
            return Err(std::io::Error::from_raw_os_error(libc::ETIME));
        }
        // Last: the watchdog learns of the tree from the tree itself, before it runs, so no
        // moment exists in which it runs and the watchdog does not know it (leaderrun's own
        // report comes only once the spawn returned). A send that fails is left to that report.
        if let Some((socket, datagram)) = announce {
            libc::send(
                socket,
                datagram.as_ptr().cast(),
                datagram.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }
    Ok(())
}

/// Whether CLOCK_BOOTTIME is past `ns` (0: never). One raw syscall (vDSO): safe between
/// clone and exec.
pub(crate) fn past_boottime(ns: u64) -> bool {
    if ns == 0 {
        return false;
    }
    // SAFETY: clock_gettime into a local; async-signal-safe.
    let now = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) != 0 {
            return false;
        }
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    };
    // At `ns` itself the proof has ended, as `Term::is_proven` counts it.
    now >= ns
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
    SUBREAPER.store(true, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// Set once [`become_subreaper`] succeeded.
static SUBREAPER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether orphans of a tree are re-parented to this process: it is PID 1 or a subreaper.
fn is_reaper() -> bool {
    std::process::id() == 1 || SUBREAPER.load(std::sync::atomic::Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execs_own_failures_are_126_and_the_clones_are_leaderruns() {
        let spawn = |errno| {
            SpawnError::Spawn {
                program: "job".into(),
                source: std::io::Error::from_raw_os_error(errno),
            }
            .exit_code()
        };
        for errno in [libc::ENOENT, libc::ENOTDIR] {
            assert_eq!(spawn(errno), 127, "{errno}");
        }
        // An environment too large for COMMAND (leaderrun adds its variables), a loop of
        // links, a name too long, a broken library: env(1) and a shell say 126.
        for errno in [
            libc::E2BIG,
            libc::ELOOP,
            libc::ENAMETOOLONG,
            libc::ELIBBAD,
            libc::EACCES,
            libc::ETXTBSY,
        ] {
            assert_eq!(spawn(errno), 126, "{errno}");
        }
        for errno in [libc::EAGAIN, libc::ENOMEM] {
            assert_eq!(spawn(errno), 125, "{errno}");
        }
    }

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

    /// A thread's list of children that cannot be read makes the whole answer unknown: a
    /// partial one would prove the tree gone while an orphan re-parented to that thread runs
    /// (`EMFILE` fails each read alike; here a list that is a directory stands for it).
    #[test]
    fn children_are_unknown_when_any_threads_list_cannot_be_read() {
        let tasks = tempfile::tempdir().unwrap();
        let task = |tid: &str| {
            let dir = tasks.path().join(tid);
            std::fs::create_dir(&dir).unwrap();
            dir
        };
        std::fs::write(task("10").join("children"), "11 12 ").unwrap();
        std::fs::write(task("13").join("children"), "14 ").unwrap();
        // A thread that exited between the listing and the read: skipped.
        task("15");
        let root = tasks.path().to_str().unwrap();
        let mut all = children_of(root, Some(Pid::from_raw(12))).unwrap();
        all.sort();
        assert_eq!(all, [Pid::from_raw(11), Pid::from_raw(14)]);
        std::fs::create_dir(task("16").join("children")).unwrap();
        assert_eq!(children_of(root, None), None);
    }

    /// A stop is two passes, the stop signal and then SIGCONT; a descendant that left the group
    /// and is re-parented between them (its parent died of the stop signal) is seen first by
    /// the SIGCONT pass, and must still get the stop signal at the next poll. Real processes;
    /// this test process is the subreaper (no other unit test starts processes).
    #[test]
    fn an_orphan_first_seen_by_the_sigcont_pass_still_gets_the_stop_signal() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events");
        let write = |name: &str, body: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        };
        let ev = events.display();
        let escaped = write(
            "escaped.sh",
            format!(
                "trap 'echo termed >> {ev}; exit 0' TERM\necho \"armed $$\" >> {ev}\n\
                 while :; do sleep 0.05; done"
            ),
        );
        let main = write("main.sh", format!("setsid {} &\nwait", escaped.display()));
        become_subreaper().unwrap();
        let command = Command::resolve(vec![main.into_os_string()], None).unwrap();
        let mut child = Child::spawn(&command, &[], Placement::default()).unwrap();
        let read = || std::fs::read_to_string(&events).unwrap_or_default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let until = |what: &str, cond: &mut dyn FnMut() -> bool| {
            while !cond() {
                assert!(std::time::Instant::now() < deadline, "timed out: {what}");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        until("the escaped one's trap", &mut || read().contains("armed"));
        let pid: i32 = read()
            .lines()
            .find_map(|l| l.strip_prefix("armed ")?.trim().parse().ok())
            .unwrap();
        let parent_of = |pid: i32| -> Option<i32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
        };
        child.signal_all(Signal::SIGTERM);
        // Its parent dies of the stop signal and it is re-parented here before the SIGCONT.
        until("the escaped one re-parented", &mut || {
            parent_of(pid) == Some(std::process::id() as i32)
        });
        child.signal_all(Signal::SIGCONT);
        until("the stop signal to reach it", &mut || {
            child.poll();
            read().contains("termed")
        });
        until("the tree to be empty", &mut || child.poll().empty);
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
