//! Starting COMMAND the way `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)` on a stack of
//! its own, so that no page table is copied and no page of leaderrun's is copied on write
//! while the child gets to `execve` (from the spawn to the exec of a shell, measured on a
//! failover: 0.5–2 ms with a fork, 0.2–0.4 ms this way; BENCHMARKS.md). The parent waits in
//! the kernel until
//! the child has exec'd or exited, so an exec failure is known when [`spawn`] returns, as
//! with std's spawn.
//!
//! `posix_spawn` itself cannot be used: the child must run leaderrun's own preparation
//! (process group, terminal, parent-death signal, the check that leaderrun still lives,
//! dispositions, descriptors), which no `posix_spawnattr` expresses.
//!
//! The child shares leaderrun's memory until it execs: it runs only raw syscalls on what the
//! parent prepared (docs/field-notes.md#only-raw-syscalls-before-exec), never allocates or
//! unwinds, writes only its own stack and the error cell, and ends in `execve` or `_exit`. Every
//! signal is blocked in the parent's thread across the clone, so no handler of leaderrun's
//! runs in the child: the preparation restores the dispositions before it unblocks them.
//!
//! The parent's thread is pinned to the CPU it runs on across the clone ([`Pinned`]), so the
//! child, which inherits the pin, runs there: the parent is suspended anyway, and the kernel
//! would otherwise place a new task on the idlest CPU, where it waited behind whatever ran
//! there (up to a millisecond, traced on a one-shot) while the parent's CPU went idle. The
//! child restores the parent's affinity first, so COMMAND inherits leaderrun's own.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::unistd::Pid;

/// The child's stack: the preparation and `execve` need a few KiB; 64 KiB leaves room for a
/// libc that uses more.
const STACK_BYTES: usize = 64 * 1024;

/// The shell that runs a file `execve` refuses as not an executable format (ENOEXEC), as
/// `execvp` and a POSIX shell do.
const SHELL: &CStr = c"/bin/sh";

/// What the child reads: all of it is prepared by the parent before the clone.
struct Plan<'a, F> {
    program: &'a CStr,
    argv: &'a [*const libc::c_char],
    /// `/bin/sh PROGRAM ARG...`, for a file without a known format.
    script_argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    prepare: &'a F,
    /// The errno of a failed exec, or the negated errno of a failed preparation; 0 until
    /// then. Written by the child only.
    error: i32,
    /// The affinity to restore before anything else (`None`: the parent was not pinned).
    affinity: Option<&'a libc::cpu_set_t>,
}

/// The calling thread pinned to the CPU it runs on, its own affinity kept to restore.
struct Pinned {
    saved: libc::cpu_set_t,
}

impl Pinned {
    /// Pins the calling thread to its current CPU. `None` when the affinity cannot be read
    /// (more CPUs than a `cpu_set_t` holds) or set: the spawn goes on unpinned.
    fn current_cpu() -> Option<Pinned> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: cpu_set_t is plain data; each call gets a valid pointer and its size.
        unsafe {
            let mut saved: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut saved) != 0 {
                return None;
            }
            let cpu = libc::sched_getcpu();
            if cpu < 0 || cpu as usize >= libc::CPU_SETSIZE as usize {
                return None;
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut one);
            (libc::sched_setaffinity(0, size, &one) == 0).then_some(Pinned { saved })
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        restore_affinity(&self.saved);
    }
}

/// Sets the calling thread's affinity to `saved`; should the kernel refuse it (a cpuset that
/// changed meanwhile), to every CPU, which the kernel narrows to those allowed: never left
/// pinned to one. Raw syscalls only: the child calls it too.
fn restore_affinity(saved: &libc::cpu_set_t) {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: valid pointers to cpu_set_t of the size given.
    unsafe {
        if libc::sched_setaffinity(0, size, saved) != 0 {
            let mut all: libc::cpu_set_t = std::mem::zeroed();
            for cpu in 0..libc::CPU_SETSIZE as usize {
                libc::CPU_SET(cpu, &mut all);
            }
            libc::sched_setaffinity(0, size, &all);
        }
    }
}

/// The child's whole life: prepare, exec, or report the errno and `_exit(127)`.
extern "C" fn child_main<F: Fn() -> std::io::Result<()>>(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive (the parent is suspended until we exec or
    // exit); only raw syscalls follow.
    unsafe {
        let plan = &mut *arg.cast::<Plan<'_, F>>();
        if let Some(saved) = plan.affinity {
            restore_affinity(saved);
        }
        if let Err(err) = (plan.prepare)() {
            // Negated: a set-up step's errno is no exec errno (ENOENT from a cgroup that was
            // removed would read as "COMMAND not found").
            plan.error = -err.raw_os_error().unwrap_or(libc::EINVAL);
            libc::_exit(127);
        }
        libc::execve(
            plan.program.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        );
        let mut errno = *libc::__errno_location();
        if errno == libc::ENOEXEC {
            libc::execve(
                SHELL.as_ptr(),
                plan.script_argv.as_ptr(),
                plan.envp.as_ptr(),
            );
            errno = *libc::__errno_location();
        }
        plan.error = errno;
        libc::_exit(127)
    }
}

/// Starts `program` with `argv` (`argv[0]` first) and `env` (every entry `NAME=VALUE`),
/// running `prepare` in the child before exec; returns once the child has exec'd. `program`
/// is used as given (a path: COMMAND is looked up before, see
/// [`crate::process::child::Command::resolve`]).
///
/// # Errors
/// `InvalidInput` for a NUL byte in an argument or the environment; `clone`'s error; the
/// errno with which `prepare` or `execve` failed in the child (the child is reaped then).
///
/// # Safety
/// `prepare` runs in a child that shares this process's memory and is not a thread: it may
/// make raw syscalls only (no allocation, no locks, no panics) and must not return `Err`
/// from a failed allocation.
pub(crate) unsafe fn spawn<F: Fn() -> std::io::Result<()>>(
    program: &Path,
    argv: &[OsString],
    env: &[OsString],
    prepare: &F,
) -> std::io::Result<Pid> {
    let cstring = |s: &OsStr| {
        CString::new(s.as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let program = cstring(program.as_os_str())?;
    let args: Vec<CString> = argv.iter().map(|a| cstring(a)).collect::<Result<_, _>>()?;
    let vars: Vec<CString> = env.iter().map(|v| cstring(v)).collect::<Result<_, _>>()?;
    let pointers = |all: &mut dyn Iterator<Item = *const libc::c_char>| {
        all.chain([std::ptr::null()]).collect::<Vec<_>>()
    };
    let argp = pointers(&mut args.iter().map(|a| a.as_ptr()));
    let script = pointers(
        &mut [SHELL.as_ptr(), program.as_ptr()]
            .into_iter()
            .chain(args.iter().skip(1).map(|a| a.as_ptr())),
    );
    let envp = pointers(&mut vars.iter().map(|v| v.as_ptr()));
    let pinned = Pinned::current_cpu();
    let mut plan = Plan {
        program: &program,
        argv: &argp,
        script_argv: &script,
        envp: &envp,
        prepare,
        error: 0,
        affinity: pinned.as_ref().map(|p| &p.saved),
    };
    // 16-byte aligned, as the ABI wants the stack; it grows down from its end. Left
    // uninitialized: the child writes each byte it reads, and zeroing 64 KiB touched sixteen
    // pages, a page fault each on a heap that had not grown that far yet.
    let mut stack: Vec<std::mem::MaybeUninit<u128>> = Vec::with_capacity(STACK_BYTES / 16);
    // SAFETY: within the allocation: its capacity is exactly STACK_BYTES / 16 elements.
    let top = unsafe { stack.as_mut_ptr().add(STACK_BYTES / 16) }.cast::<libc::c_void>();
    // SAFETY: the masks are plain values; the clone runs `child_main` on `stack` with `plan`,
    // both alive until the child has exec'd or exited (CLONE_VFORK suspends us until then);
    // the caller promised that `prepare` suits such a child.
    let (pid, clone_error, error) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main::<F>,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut plan as *mut Plan<'_, F>).cast(),
        );
        // Only meaningful when there is no child: the child writes this thread's errno.
        let clone_error = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        // The child wrote it through the shared memory: read what is there now.
        (pid, clone_error, std::ptr::read_volatile(&plan.error))
    };
    // The child has exec'd or exited: its stack is ours again, and the parent's CPUs too.
    drop(stack);
    drop(pinned);
    if pid < 0 {
        return Err(clone_error);
    }
    let pid = Pid::from_raw(pid);
    if error != 0 {
        // It exited without exec: reap it here, as std's spawn does, so no waiter sees it.
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        return Err(match error {
            e if e < 0 => SetupFailed(-e).into(),
            e => std::io::Error::from_raw_os_error(e),
        });
    }
    Ok(pid)
}

/// A step of the child's set-up before exec failed (joining its cgroup, its process group,
/// the terminal, the descriptor limit, the proof's end) with this errno: no exec was tried,
/// so the errno says nothing of COMMAND (exit 125, not the 126/127 of exec's errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupFailed(pub i32);

impl std::fmt::Display for SetupFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its set-up before exec failed: {}",
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

impl std::error::Error for SetupFailed {}

impl From<SetupFailed> for std::io::Error {
    fn from(setup: SetupFailed) -> std::io::Error {
        let kind = std::io::Error::from_raw_os_error(setup.0).kind();
        std::io::Error::new(kind, setup)
    }
}

impl SetupFailed {
    /// The set-up's errno, when `err` is a [`SetupFailed`].
    pub fn errno_of(err: &std::io::Error) -> Option<i32> {
        err.get_ref()?.downcast_ref::<SetupFailed>().map(|s| s.0)
    }
}
