//! `--pid-namespace`: COMMAND under a small init of ours, PID 1 of a PID namespace of its own.
//!
//! # Why
//!
//! The watchdog ends COMMAND's tree when leaderrun dies, but when leaderrun and its watchdog
//! die together (an operator's `kill -9` of both pids, `pkill -9 -f leaderrun`, the OOM killer)
//! only COMMAND's direct child dies with leaderrun (`PR_SET_PDEATHSIG`), and the rest of its
//! tree runs on while the lock passes (docs/guarantees.md#what-is-not-guaranteed). The kernel
//! can close that: when the init of a PID namespace dies, it kills every other process of the
//! namespace, and does not let the init finish dying before they are gone
//! (pid_namespaces(7)). So with the flag, the direct child is that init: it gets
//! `PR_SET_PDEATHSIG(SIGKILL)` like any child, and its death takes the whole tree with it,
//! descendants that left the process group or the session included, whatever kills leaderrun.
//!
//! # How
//!
//! * [`PidNamespace::new`] opens a pidfd of leaderrun, and
//!   proves at start that a namespace can be made (`CAP_SYS_ADMIN` in the owning user
//!   namespace: root, or root of a user namespace), so a missing privilege is an error at
//!   start, not at the first grant.
//! * To spawn, leaderrun forks with `clone(CLONE_NEWPID)`, so the child is PID 1 of a new
//!   namespace, and execs its own binary as `leaderrun-init` (`PidNamespace::spawn_init`).
//! * The init ([`init_main`]) starts COMMAND as its child in its own process group (the group
//!   leaderrun signals), reports on a pipe whether exec worked and every stop and the end of
//!   COMMAND (raw wait statuses), reaps every orphan of the namespace, and exits once it has
//!   no child left. It installs no handler: the kernel then drops every signal sent to a
//!   namespace's init except SIGKILL and SIGSTOP from outside (pid_namespaces(7)), so the
//!   stop signal that leaderrun sends to the group reaches COMMAND and its group, never the
//!   init, and the init lives until the tree is gone.
//! * Leaderrun's [`crate::process::child::Child`] reads COMMAND's status from that pipe and
//!   takes the tree as empty once the init is reaped: by then the kernel has ended everything
//!   in the namespace.
//!
//! # What changes for COMMAND
//!
//! `getpid()` in COMMAND is 2 and its parent is 1; `/proc` is not remounted, so `ps` and
//! `/proc/PID` still show the machine's process ids. Everything else (environment,
//! descriptors, signal dispositions, terminal, cgroup, exit status) is as without the flag.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use crate::process::child::ExitStatus;

/// `argv[0]` of the init process: how `main` recognises it, and how `ps` shows it.
pub const ARGV0: &str = "leaderrun-init";

/// The descriptor the init reports on (the pipe's write end, inherited across its exec).
pub(crate) const REPORT_FD: RawFd = 3;

/// Whether this process was started as the init of COMMAND's namespace (`argv[0]` is [`ARGV0`]).
pub fn is_init() -> bool {
    std::env::args_os().next().is_some_and(|a| a == ARGV0)
}

/// Why a PID namespace for COMMAND cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PidNamespaceError {
    /// `unshare(CLONE_NEWPID)` failed: `EPERM` without
    /// `CAP_SYS_ADMIN`, `EINVAL` on a kernel without PID namespaces, `ENOSPC` past
    /// `user.max_pid_namespaces`.
    #[error(
        "--pid-namespace: cannot make a PID namespace (it needs CAP_SYS_ADMIN: root, or root \
         of a user namespace such as `unshare --user --map-root-user`)"
    )]
    Unshare(#[source] std::io::Error),
    /// A pidfd of leaderrun could not be opened (a kernel before 5.3), or no thread could be
    /// started for the check.
    #[error("--pid-namespace: cannot open {what}")]
    Open {
        /// What could not be opened.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What leaderrun holds to start COMMAND's inits: a pidfd of itself, by which a child in the
/// new namespace (where `getppid()` is 0) sees whether leaderrun died before its parent-death
/// signal was armed.
#[derive(Debug)]
pub struct PidNamespace {
    parent: OwnedFd,
}

impl PidNamespace {
    /// Opens what a spawn needs and proves that this process may make a PID namespace.
    ///
    /// # Errors
    /// [`PidNamespaceError::Open`] without pidfds; [`PidNamespaceError::Unshare`] without the
    /// privilege.
    pub fn new() -> Result<PidNamespace, PidNamespaceError> {
        let parent = crate::watchdog::pidfd_open(std::process::id()).ok_or_else(|| {
            PidNamespaceError::Open {
                what: "a pidfd of leaderrun",
                source: std::io::Error::last_os_error(),
            }
        })?;
        // The same check as `clone(CLONE_NEWPID)` makes, on a thread that ends at once: the
        // namespace it would put the thread's children in is never used.
        let probe = std::thread::Builder::new()
            .name("pid-namespace".into())
            .stack_size(64 * 1024)
            .spawn(|| {
                // SAFETY: unshare takes flags; it changes only this thread's children's
                // namespace, and the thread forks nothing.
                if unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
            .map_err(|source| PidNamespaceError::Open {
                what: "a thread to try",
                source,
            })?
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the probe panicked")));
        probe.map_err(PidNamespaceError::Unshare)?;
        Ok(PidNamespace { parent })
    }

    /// Forks a child that is PID 1 of a new PID namespace, runs `prepare` in it and execs
    /// leaderrun's own binary as [`ARGV0`] `EXEC_BY PROGRAM ARGV...` with `env` (every
    /// `NAME=VALUE`); `exec_by_ns` (CLOCK_BOOTTIME nanoseconds, 0 for none) is the latest
    /// moment of COMMAND's exec, which the init checks before it. A failure before the init's
    /// exec is written to `report` (the report pipe's write end) as
    /// [`Report::SetupFailed`]. Returns its pid, as this namespace sees it.
    ///
    /// `clone(CLONE_NEWPID)` directly rather than `unshare` and a fork: `unshare` moves the
    /// thread's later children too, and going back needs `setns`, which a root of a user
    /// namespace may not do into the machine's namespace. Everything is allocated before the
    /// clone: in the child of a threaded process only raw syscalls run
    /// (docs/field-notes.md#only-raw-syscalls-before-exec). An error of `prepare` or of exec
    /// ends the child with 125, seen by the caller as an init that never answered.
    ///
    /// # Errors
    /// A NUL byte in an argument or the environment (`InvalidInput`); `clone`'s error.
    pub(crate) fn spawn_init(
        &self,
        program: &std::path::Path,
        argv: &[OsString],
        env: &[OsString],
        exec_by_ns: u64,
        report: RawFd,
        prepare: impl Fn() -> std::io::Result<()>,
    ) -> std::io::Result<Pid> {
        use std::os::unix::ffi::OsStrExt;
        let cstring = |s: &std::ffi::OsStr| {
            std::ffi::CString::new(s.as_bytes())
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        };
        let exec_by = OsString::from(exec_by_ns.to_string());
        let args: Vec<std::ffi::CString> = [
            std::ffi::OsStr::new(ARGV0),
            exec_by.as_os_str(),
            program.as_os_str(),
        ]
        .into_iter()
        .chain(argv.iter().map(OsString::as_os_str))
        .map(cstring)
        .collect::<Result<_, _>>()?;
        let vars: Vec<std::ffi::CString> =
            env.iter().map(|v| cstring(v)).collect::<Result<_, _>>()?;
        let argp: Vec<*const libc::c_char> = args
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let envp: Vec<*const libc::c_char> = vars
            .iter()
            .map(|v| v.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        // SAFETY: clone without CLONE_VM and without a new stack is fork with one more flag;
        // the child makes raw syscalls only and ends in exec or _exit.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_NEWPID | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the child: raw syscalls on what was prepared above.
            unsafe {
                // A set-up step that failed says its errno on the report pipe (the caller
                // tells it from exec's, and a lapsed proof from a failure), then the init ends.
                let reported = match prepare() {
                    Ok(()) => {
                        libc::execve(c"/proc/self/exe".as_ptr(), argp.as_ptr(), envp.as_ptr());
                        Report::SetupFailed(*libc::__errno_location())
                    }
                    Err(err) => Report::SetupFailed(err.raw_os_error().unwrap_or(libc::EINVAL)),
                };
                let bytes = reported.encode();
                libc::write(report, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(125);
            }
        }
        Ok(Pid::from_raw(pid as i32))
    }

    /// The pidfd of leaderrun, for the pre-exec check in the child.
    pub(crate) fn parent_pidfd(&self) -> RawFd {
        self.parent.as_raw_fd()
    }
}

/// One report of the init, 8 bytes (a pipe write of at most `PIPE_BUF` is atomic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// COMMAND was exec'd.
    Started,
    /// COMMAND could not be exec'd: the errno.
    ExecFailed(i32),
    /// The init's own set-up before its exec failed (its cgroup, the proof's end): the errno.
    SetupFailed(i32),
    /// COMMAND stopped or ended: the raw wait status.
    Status(i32),
}

impl Report {
    const STARTED: u32 = 1;
    const EXEC_FAILED: u32 = 2;
    const STATUS: u32 = 3;
    const SETUP_FAILED: u32 = 4;

    pub(crate) fn encode(self) -> [u8; 8] {
        let (tag, value) = match self {
            Report::Started => (Self::STARTED, 0),
            Report::ExecFailed(errno) => (Self::EXEC_FAILED, errno),
            Report::Status(status) => (Self::STATUS, status),
            Report::SetupFailed(errno) => (Self::SETUP_FAILED, errno),
        };
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&tag.to_ne_bytes());
        out[4..].copy_from_slice(&value.to_ne_bytes());
        out
    }

    pub(crate) fn decode(bytes: [u8; 8]) -> Option<Report> {
        let tag = u32::from_ne_bytes(bytes[..4].try_into().ok()?);
        let value = i32::from_ne_bytes(bytes[4..].try_into().ok()?);
        match tag {
            Self::STARTED => Some(Report::Started),
            Self::EXEC_FAILED => Some(Report::ExecFailed(value)),
            Self::STATUS => Some(Report::Status(value)),
            Self::SETUP_FAILED => Some(Report::SetupFailed(value)),
            _ => None,
        }
    }
}

/// What a [`Report::Status`] says of COMMAND: it ended (`Ok`), or it stopped (`Err(signal)`).
pub(crate) fn decode_status(raw: i32) -> Option<Result<ExitStatus, nix::sys::signal::Signal>> {
    match WaitStatus::from_raw(Pid::from_raw(2), raw).ok()? {
        WaitStatus::Exited(_, code) => Some(Ok(ExitStatus::Code(code))),
        WaitStatus::Signaled(_, sig, _) => Some(Ok(ExitStatus::Signal(sig))),
        WaitStatus::Stopped(_, sig) => Some(Err(sig)),
        _ => None,
    }
}

/// The init's whole life: `leaderrun-init EXEC_BY PROGRAM ARGV0 [ARG...]` (`EXEC_BY`: the
/// proof's end, CLOCK_BOOTTIME nanoseconds, 0 for none), PID 1 of COMMAND's
/// namespace, started by leaderrun's spawn (never by hand: without the report pipe on
/// descriptor 3 it exits 125).
///
/// Its signal dispositions and mask are what COMMAND must get (the spawn set them up before
/// exec), so it changes none of them but SIGCHLD's, which must not be ignored while it
/// reaps (and is put back for COMMAND). Exits 0 once no child is left.
pub fn init_main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let exec_by: Option<u64> = args.next().and_then(|n| n.to_str()?.parse().ok());
    let (Some(exec_by), Some(program), Some(argv0)) = (exec_by, args.next(), args.next()) else {
        return ExitCode::from(125);
    };
    let rest: Vec<OsString> = args.collect();
    // `ps` shows what it is, not "exe"; like the watchdog's `lr-watchdog`, a name that
    // `killall leaderrun` does not match.
    // SAFETY: PR_SET_NAME with a NUL-terminated name of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lr-init".as_ptr(), 0, 0, 0);
    }
    // SAFETY: fcntl on a descriptor number; F_GETFD only reads.
    if unsafe { libc::fcntl(REPORT_FD, libc::F_GETFD) } < 0 {
        return ExitCode::from(125);
    }
    // SAFETY: the spawn left the pipe's write end on this number for us alone.
    let report = unsafe { OwnedFd::from_raw_fd(REPORT_FD) };
    // SAFETY: fcntl on our own descriptor: COMMAND must not inherit it.
    unsafe { libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    // Ignored here only when leaderrun was started with SIGCHLD ignored (the spawn ignores it
    // again for us), and COMMAND keeps that
    // (docs/field-notes.md#ignored-dispositions-survive-exec).
    let chld_ignored = crate::process::signals::is_ignored(libc::SIGCHLD);
    // So was SIGPIPE when leaderrun left it ignored for COMMAND (ignored when leaderrun started):
    // std's spawn gives the default back unless told otherwise.
    let pipe_ignored = crate::process::signals::sigpipe_ignored_at_exec();
    // SAFETY: plain signal(2) on this single-threaded process.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    // The stack limit leaderrun was given, which this init raised for itself as leaderrun did
    // (docs/process-model.md#enough-stack).
    let stack = crate::process::stack::original();
    let mut cmd = std::process::Command::new(&program);
    cmd.arg0(&argv0).args(&rest);
    // SAFETY: raw syscalls only between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(stack) = stack {
                if libc::setrlimit(libc::RLIMIT_STACK, &stack) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if chld_ignored {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            }
            if pipe_ignored {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            // COMMAND starts only inside the proof leaderrun started it under (rule 1).
            if crate::process::child::past_boottime(exec_by) {
                return Err(std::io::Error::from_raw_os_error(libc::ETIME));
            }
            Ok(())
        });
    }
    let command = match cmd.spawn() {
        Ok(child) => {
            let pid = Pid::from_raw(child.id() as i32);
            // Dropping std's handle neither waits nor kills; the loop below reaps.
            drop(child);
            send(&report, Report::Started);
            pid
        }
        Err(err) => {
            send(
                &report,
                Report::ExecFailed(err.raw_os_error().unwrap_or(libc::EIO)),
            );
            return ExitCode::SUCCESS;
        }
    };
    let mut command_running = true;
    loop {
        let mut status = 0;
        // SAFETY: waitpid into a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WUNTRACED) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // ECHILD: nothing of the namespace is left.
                _ => return ExitCode::SUCCESS,
            }
        }
        if pid == command.as_raw() && command_running {
            let ended = !libc::WIFSTOPPED(status);
            send(&report, Report::Status(status));
            command_running = !ended;
        }
    }
}

/// Writes one report; a leaderrun that is gone cannot read it, and then the init is being
/// killed anyway (its parent-death signal), so errors are dropped.
fn send(fd: &OwnedFd, report: Report) {
    let bytes = report.encode();
    // SAFETY: write from a local buffer to our own descriptor; SIGPIPE is ignored (Rust's
    // runtime ignores it before main).
    unsafe {
        libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        for report in [
            Report::Started,
            Report::ExecFailed(libc::ENOENT),
            Report::Status(0x0300),
            Report::Status(-1),
        ] {
            assert_eq!(Report::decode(report.encode()), Some(report));
        }
        assert_eq!(Report::decode([9, 0, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn statuses_decode_as_waitpid_gives_them() {
        // exit(3): code in the second byte; SIGTERM: the signal in the low 7 bits; stopped by
        // SIGTSTP: 0x7f in the low byte, the signal in the second.
        assert_eq!(decode_status(3 << 8), Some(Ok(ExitStatus::Code(3))));
        assert_eq!(
            decode_status(libc::SIGTERM),
            Some(Ok(ExitStatus::Signal(nix::sys::signal::Signal::SIGTERM)))
        );
        assert_eq!(
            decode_status((libc::SIGTSTP << 8) | 0x7f),
            Some(Err(nix::sys::signal::Signal::SIGTSTP))
        );
    }
}
