//! Signal intake for the binary.
//!
//! [`install`] registers handlers for every signal leaderrun acts on, before anything is
//! spawned or connected (docs/field-notes.md#handlers-before-anything-else), and before the async
//! runtime exists. The handlers only note the signal and write to signal-hook's self-pipe, which
//! the runtime that polls [`SignalStream::recv`] watches (no thread of its own: one fewer to
//! start and end, and no hop between threads on every SIGCHLD), so a signal that arrives while
//! connecting or campaigning waits in the handlers' record and is acted on (never lost). Handling them explicitly also matters as PID 1, where
//! the kernel drops every signal that has no handler
//! (docs/field-notes.md#pid-1-drops-unhandled-signals).
//!
//! A signal that was ignored when leaderrun started (`nohup`, `cmd &` in a non-interactive
//! shell) gets no handler: it stays ignored, is never passed on, and COMMAND inherits the
//! ignored disposition, as a POSIX shell keeps it (docs/guarantees.md#the-child-process,
//! docs/field-notes.md#ignored-dispositions-survive-exec). [`ignored_at_entry`] tells the child
//! which ones those are.

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use signal_hook::consts::signal::{
    SIGALRM, SIGCHLD, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGUSR1, SIGUSR2,
    SIGWINCH,
};
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::iterator::exfiltrator::SignalOnly;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Signals passed on to the child's process group while it runs
/// (docs/guarantees.md#the-child-process, plus SIGALRM, which tini passes on too). While standby
/// there is nobody to pass them to and they are ignored, except INT and TERM, which shut down.
///
/// The others leaderrun receives:
/// * SIGTSTP is passed on too; when the child stops, leaderrun stops itself (SIGSTOP) so the
///   calling shell sees the job stopped; `fg` (SIGCONT) resumes leaderrun, which resumes the
///   child. As a standby leaderrun stops itself at once.
/// * SIGPIPE is ignored (Rust's default): a closed stderr must not kill a leader mid-term.
/// * SIGCHLD wakes the reaper.
/// * SIGCONT (`fg`, `bg`) makes leaderrun look again at whom the terminal's foreground is
///   (`Terminal::look`); it is never passed on: a stopped child is continued only on a
///   proven lock.
pub const FORWARDED: [Signal; 8] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
];

/// Signals ignored at entry, bit N for signal N; see [`ignored_at_entry`].
static IGNORED_AT_ENTRY: AtomicU64 = AtomicU64::new(0);

/// SIGPIPE's disposition as the process was exec'd: [`PIPE_UNKNOWN`] until
/// [`record_sigpipe_at_exec`] ran, then [`PIPE_IGNORED`] or [`PIPE_NOT_IGNORED`].
static PIPE_AT_EXEC: AtomicU8 = AtomicU8::new(PIPE_UNKNOWN);
const PIPE_UNKNOWN: u8 = 0;
const PIPE_IGNORED: u8 = 1;
const PIPE_NOT_IGNORED: u8 = 2;

/// Reads SIGPIPE's disposition before Rust's runtime sets it to "ignore" (std does so in
/// `main`'s preamble; constructors of `.init_array` run before that, from the C library's start
/// code), so that a SIGPIPE the parent ignored stays ignored for COMMAND like every other
/// signal ignored at entry. Only `sigaction` with no new action: async-signal-safe, touches no
/// part of std.
extern "C" fn record_sigpipe_at_exec() {
    // SAFETY: sigaction with a null new action only reads the current one.
    let ignored = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    };
    PIPE_AT_EXEC.store(
        if ignored {
            PIPE_IGNORED
        } else {
            PIPE_NOT_IGNORED
        },
        Ordering::Release,
    );
}

/// Runs [`record_sigpipe_at_exec`] as a constructor of every program linked with this crate
/// (rustc keeps `#[used]` statics of its dependencies in the link).
#[used]
#[link_section = ".init_array"]
static RECORD_SIGPIPE_AT_EXEC: extern "C" fn() = record_sigpipe_at_exec;

/// Whether SIGPIPE was ignored when the process was exec'd. Where that was not recorded (no
/// constructor ran), not: COMMAND gets the default, as every Rust program's children do.
pub(crate) fn sigpipe_ignored_at_exec() -> bool {
    PIPE_AT_EXEC.load(Ordering::Acquire) == PIPE_IGNORED
}

/// The signals [`install`] handles, bit N for signal N: [`Blocked`]'s drop unblocks them
/// whatever mask leaderrun inherited.
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// The signals (bit N for signal N) whose disposition was "ignore" when [`install`] ran, so
/// the child keeps them ignored. For SIGPIPE, which Rust's runtime ignores before `main`, what
/// counts is its disposition at exec, read by a constructor before the runtime changed it
/// (`record_sigpipe_at_exec`): ignored by the parent, COMMAND keeps it ignored; else COMMAND
/// gets the default back.
pub fn ignored_at_entry() -> u64 {
    IGNORED_AT_ENTRY.load(Ordering::Acquire)
}

/// Whether `sig` was ignored when [`install`] ran (`nohup` for SIGHUP): leaderrun neither acts
/// on it nor passes it on, nor on what stands for it (a hung-up terminal for SIGHUP).
pub fn was_ignored_at_entry(sig: Signal) -> bool {
    ignored_at_entry() & (1 << sig as i32) != 0
}

/// Whether `sig` is ignored right now.
pub(crate) fn is_ignored(sig: i32) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The receiving end of the installed handlers.
///
/// SIGCHLD is delivered here too (it wakes the reaper); like the kernel, the handlers' record
/// may merge several SIGCHLDs into one.
pub struct SignalStream {
    source: Source,
    /// Signals taken from the source and not returned yet: [`SignalStream::recv`] moves them
    /// here before it returns one, so a `select!` that drops it loses none.
    queue: VecDeque<Signal>,
}

enum Source {
    /// Fed by hand ([`SignalStream::channel`]).
    Channel(mpsc::UnboundedReceiver<Signal>),
    /// signal-hook's handlers: what they record, and the read end of their self-pipe.
    Handlers {
        /// The self-pipe registered with the runtime that first waited on it; dropped before
        /// the pipe itself.
        readable: Option<AsyncFd<UnixStream>>,
        delivery: SignalDelivery<UnixStream, SignalOnly>,
    },
}

/// Installs the handlers. The runtime that polls the stream reads what they record.
///
/// # Errors
/// The OS error when a handler or the self-pipe cannot be made.
pub fn install() -> std::io::Result<SignalStream> {
    let mut ignored = 0u64;
    for sig in 1..32 {
        let was_ignored = if sig == libc::SIGPIPE {
            // Ignored by Rust's runtime by now: what counts is what it was at exec.
            sigpipe_ignored_at_exec()
        } else {
            is_ignored(sig)
        };
        if was_ignored {
            ignored |= 1 << sig;
        }
    }
    IGNORED_AT_ENTRY.store(ignored, Ordering::Release);
    // SIGCHLD is ours whatever its disposition was: the reaper needs it.
    let wanted: Vec<i32> = [
        SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGALRM, SIGTSTP, SIGCONT,
    ]
    .into_iter()
    .filter(|&sig| ignored & (1 << sig) == 0)
    .chain([SIGCHLD])
    .collect();
    // Both ends close on exec (std makes them so); the handlers write with MSG_DONTWAIT and
    // the stream reads with it.
    let (read, write) = UnixStream::pair()?;
    read.set_nonblocking(true)?;
    write.set_nonblocking(true)?;
    let delivery = SignalDelivery::with_pipe(read, write, SignalOnly, wanted.iter().copied())?;
    HANDLED.store(
        wanted.iter().fold(0u64, |bits, &sig| bits | 1 << sig),
        Ordering::Release,
    );
    Ok(SignalStream {
        source: Source::Handlers {
            readable: None,
            delivery,
        },
        queue: VecDeque::new(),
    })
}

/// Every signal blocked on the calling thread until this drops, when the mask it had is
/// restored, less every signal the handlers take (a parent may have blocked them), and what
/// arrived meanwhile is delivered (to the handlers, once [`install`] ran).
/// `main` holds one from its first line until the handlers are installed, so that the
/// watchdog forked in between ([`crate::watchdog::EarlyWatchdog::fork`]) does not lengthen the
/// time in which a signal meets no handler. A handler may run on any thread that does not
/// block its signal (it only records it and writes a byte to the self-pipe, without waiting);
/// the log's writer blocks them all.
pub struct Blocked {
    old: libc::sigset_t,
}

/// The signal mask the process was exec'd with, when [`block_at_exec`] blocked every signal
/// before `main`: what [`block_all`] restores, and [`unblock_at_exec`] gives back.
static MASK_AT_EXEC: std::sync::Mutex<Option<libc::sigset_t>> = std::sync::Mutex::new(None);

/// Blocks every signal and records the mask it replaces: for a binary's `.init_array`
/// constructor, which runs before Rust's runtime and `main`. A signal sent in the first
/// milliseconds after exec then waits, pending, for the handlers `main` installs, where it
/// killed the process before (HUP, USR1, TERM at their default) or, as PID 1, was discarded
/// by the kernel (init drops a signal it has no handler for, but keeps a blocked one
/// pending). What remains is the dynamic loader's time before the first constructor, which
/// no code of a program can close. Only `sigprocmask` and an uncontended mutex: nothing of
/// std's runtime is needed yet.
pub extern "C" fn block_at_exec() {
    // SAFETY: sigset_t is plain data; sigprocmask changes the mask of this, the only, thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        if libc::sigprocmask(libc::SIG_BLOCK, &all, &mut old) == 0 {
            *MASK_AT_EXEC.lock().unwrap_or_else(|e| e.into_inner()) = Some(old);
        }
    }
}

/// Gives back the mask of exec that [`block_at_exec`] replaced, if it did: for the processes
/// this binary also is (the exec'd watchdog, the init of COMMAND's PID namespace), which set
/// up their signals from what they were exec'd with.
pub fn unblock_at_exec() {
    let old = MASK_AT_EXEC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(old) = old {
        // SAFETY: restores a mask read by sigprocmask, on this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
}

/// Blocks every signal on this thread until the [`Blocked`] drops, which restores the mask of
/// before (the mask of exec, when [`block_at_exec`] blocked them already).
pub fn block_all() -> Blocked {
    let at_exec = MASK_AT_EXEC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    // SAFETY: sigset_t is plain data; pthread_sigmask changes this thread's mask only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        Blocked {
            old: at_exec.unwrap_or(old),
        }
    }
}

/// The stop requests [`Blocked::stoppable`] acts on: INT and TERM. HUP stays blocked there as
/// in the rest of start-up: there is no child yet to pass it on to, which is all a running
/// leaderrun does with it (a terminal's hangup is watched for once running).
const START_UP_STOPS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// The watchdog forked at start, for [`start_up_stop`] to reap (0: none).
static START_UP_WATCHDOG: AtomicI32 = AtomicI32::new(0);

/// The handler of a stop request during [`Blocked::stoppable`]'s reads: nothing has started,
/// so leaderrun ends as a standby that is stopped does (exit 0, docs/guarantees.md#exit-codes),
/// after killing and reaping the watchdog forked at start: left to leaderrun's parent, it
/// would be a zombie under one that does not reap (an application as a container's PID 1).
/// Async-signal-safe: `kill`, `waitpid`, `_exit`; no log line (the log's writer may hold a
/// lock, and a stalled stderr must not hold up the stop).
extern "C" fn start_up_stop(_: libc::c_int) {
    let watchdog = START_UP_WATCHDOG.load(Ordering::Acquire);
    // SAFETY: async-signal-safe calls on a child of this process (or none).
    unsafe {
        if watchdog > 0 {
            libc::kill(watchdog, libc::SIGKILL);
            while libc::waitpid(watchdog, std::ptr::null_mut(), 0) == -1
                && *libc::__errno_location() == libc::EINTR
            {}
        }
        libc::_exit(0);
    }
}

impl Blocked {
    /// Runs `read` with INT and TERM unblocked and handled (unless they were ignored at entry:
    /// `nohup`): for start-up's reads of what the settings name (a service file, COMMAND on
    /// `PATH`), which can block for good (a FIFO nobody writes to, a hung NFS mount). Blocked
    /// as the rest of start-up is, such a stop request waited for good. Nothing has started
    /// yet: a stop request meanwhile kills and reaps `watchdog` (the pid of the watchdog forked
    /// at start, if any) and exits 0, as a stopped standby does. (TLS files are read at each
    /// connect, off the runtime's thread.) The dispositions in place before are restored
    /// after `read`, before [`install`] chains its handlers to them.
    pub fn stoppable<T>(&self, watchdog: Option<i32>, read: impl FnOnce() -> T) -> T {
        START_UP_WATCHDOG.store(watchdog.unwrap_or(0), Ordering::Release);
        // SAFETY: sigset_t and sigaction are plain data; the handler is async-signal-safe;
        // pthread_sigmask changes this thread's mask only (every other thread blocks all).
        let (stops, saved) = unsafe {
            let mut stops: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut stops);
            let mut saved: [Option<libc::sigaction>; START_UP_STOPS.len()] = [None; 2];
            for (sig, saved) in START_UP_STOPS.into_iter().zip(&mut saved) {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut old);
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = start_up_stop as extern "C" fn(libc::c_int) as usize;
                libc::sigfillset(&mut action.sa_mask);
                if libc::sigaction(sig, &action, std::ptr::null_mut()) == 0 {
                    *saved = Some(old);
                    libc::sigaddset(&mut stops, sig);
                }
            }
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &stops, std::ptr::null_mut());
            (stops, saved)
        };
        let out = read();
        // SAFETY: as above; what arrives from here on waits for the handlers of `install`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, &stops, std::ptr::null_mut());
            for (sig, saved) in START_UP_STOPS.into_iter().zip(saved) {
                if let Some(old) = saved {
                    libc::sigaction(sig, &old, std::ptr::null_mut());
                }
            }
        }
        START_UP_WATCHDOG.store(0, Ordering::Release);
        out
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // A parent that blocked TERM, INT or CHLD before starting us (a mask survives exec)
        // would leave them pending for good: every other thread blocks every signal, so a stop
        // request would never be acted on and every exit of COMMAND would wait for the
        // reaper's timer. What the handlers take is unblocked; the rest of the mask is kept
        // (COMMAND starts with an empty one anyway).
        let handled = HANDLED.load(Ordering::Acquire);
        // SAFETY: sigset_t is plain data; restores the mask saved by `block_all` on this
        // thread, less the handled signals.
        unsafe {
            let mut mask = self.old;
            for sig in 1..64 {
                if handled & (1 << sig) != 0 {
                    libc::sigdelset(&mut mask, sig);
                }
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        }
    }
}

/// The sending end of a [`SignalStream`] made by [`SignalStream::channel`].
pub type SignalSender = mpsc::UnboundedSender<Signal>;

impl SignalStream {
    /// A stream fed by hand instead of by handlers: for running the supervisor in-process
    /// (tests, or a program that takes its signals elsewhere).
    pub fn channel() -> (SignalSender, SignalStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            tx,
            SignalStream {
                source: Source::Channel(rx),
                queue: VecDeque::new(),
            },
        )
    }

    /// Next received signal. Cancel-safe: a signal taken from the handlers is kept until it
    /// is returned. Must be polled inside a tokio runtime with its I/O driver (it watches the
    /// handlers' self-pipe); pending forever for a channel whose sender is gone.
    pub async fn recv(&mut self) -> Signal {
        loop {
            if let Some(sig) = self.queue.pop_front() {
                return sig;
            }
            match &mut self.source {
                Source::Channel(rx) => match rx.recv().await {
                    Some(sig) => return sig,
                    None => std::future::pending().await,
                },
                Source::Handlers { readable, delivery } => {
                    // Drains the pipe, then reads the record: a signal whose byte comes after
                    // the drain makes the pipe readable again.
                    take_recorded(&mut self.queue, delivery);
                    if !self.queue.is_empty() {
                        continue;
                    }
                    if readable.is_none() {
                        // A descriptor of its own for the same pipe end: registered with the
                        // runtime as long as it lives.
                        if let Ok(read) = delivery.get_read().try_clone() {
                            // SAFETY: `read` owns its descriptor and the AsyncFd owns `read`,
                            // so it stays open and the same for the AsyncFd's whole life.
                            *readable = unsafe { AsyncFd::register(read) }.ok();
                        }
                    }
                    match readable.as_ref() {
                        // Cleared before the next drain, so no byte's readiness is lost.
                        Some(fd) => match fd.readable().await {
                            Ok(mut guard) => guard.clear_ready(),
                            Err(_) => tokio::time::sleep(POLL_WITHOUT_DRIVER).await,
                        },
                        // No I/O driver to register with: look again soon.
                        None => tokio::time::sleep(POLL_WITHOUT_DRIVER).await,
                    }
                }
            }
        }
    }

    /// A signal that already arrived, without waiting.
    pub fn try_recv(&mut self) -> Option<Signal> {
        if let Some(sig) = self.queue.pop_front() {
            return Some(sig);
        }
        match &mut self.source {
            Source::Channel(rx) => rx.try_recv().ok(),
            Source::Handlers { delivery, .. } => {
                take_recorded(&mut self.queue, delivery);
                self.queue.pop_front()
            }
        }
    }
}

/// Moves what the handlers recorded into `queue`, draining their self-pipe first.
fn take_recorded(
    queue: &mut VecDeque<Signal>,
    delivery: &mut SignalDelivery<UnixStream, SignalOnly>,
) {
    queue.extend(
        delivery
            .pending()
            .filter_map(|raw| Signal::try_from(raw).ok()),
    );
}

/// How often [`SignalStream::recv`] looks at the handlers' record when the self-pipe cannot
/// be watched (a runtime without its I/O driver).
const POLL_WITHOUT_DRIVER: Duration = Duration::from_millis(5);

/// Whether `sig` is passed on to the child's group ([`FORWARDED`]).
pub fn is_forwarded(sig: Signal) -> bool {
    FORWARDED.contains(&sig)
}

/// Stops leaderrun itself (job control), unless it is PID 1, which cannot be stopped from
/// inside its namespace. Returns once something sends SIGCONT.
pub fn suspend_self() {
    if std::process::id() != 1 {
        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
    }
}

/// Whether `sig` asks leaderrun to shut down (INT and TERM, docs/guarantees.md#the-child-process).
pub fn is_shutdown(sig: Signal) -> bool {
    matches!(sig, Signal::SIGINT | Signal::SIGTERM)
}
