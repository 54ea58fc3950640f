//! Log lines to stderr (docs/guarantees.md#observing-a-replica): the seed's wording, one line per
//! event, fields appended.
//!
//! # Output never waits
//!
//! The thread that logs is the thread that stops COMMAND, passes on signals and tells the
//! watchdog that leaderrun is alive. A stderr whose reader stopped reading (a blocked container
//! log driver, a stuck logger, a terminal paused with Ctrl-S) would hold it at its next line
//! for as long as the reader sleeps. So lines go through `tracing-appender`'s lossy
//! non-blocking writer: the event is formatted on the logging thread, put in a bounded queue
//! ([`QUEUE_LINES`]) without waiting, and written to descriptor 2 by a thread of its own. A line
//! that finds the queue full, or whose write fails (stderr closed, its reader gone), is
//! dropped and counted ([`dropped_lines`], `leaderrun_log_lines_dropped_total` in `/metrics`);
//! once a write goes through again, one WARN line says how many were lost. At exit
//! [`finish`] waits for the queue to drain for at most [`EXIT_FLUSH`], then leaves what is left.
//!
//! The queue and its thread start with the first line, not with [`init`]: a one-shot that has
//! nothing to say (cron's good night) starts no thread and has none to end at exit
//! (BENCHMARKS.md, "Issue 18 item 6, third pass").

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// How many formatted lines may wait for a slow stderr before new ones are dropped.
pub const QUEUE_LINES: usize = 4096;
/// How long [`finish`] waits at exit for queued lines to be written.
pub const EXIT_FLUSH: Duration = Duration::from_millis(500);

/// Lines dropped because their write failed (the queue's own drops are in [`QUEUE_DROPS`]).
static WRITE_DROPS: AtomicU64 = AtomicU64::new(0);
/// Lines handed to the queue (written, dropped or waiting).
static QUEUED: AtomicU64 = AtomicU64::new(0);
/// Lines the writer thread finished with (written or failed).
static DONE: AtomicU64 = AtomicU64::new(0);
/// The queue's count of lines it refused because it was full.
static QUEUE_DROPS: OnceLock<ErrorCounter> = OnceLock::new();
/// The queue's front, made with its writer thread by the first line ([`queue`]).
static QUEUE: OnceLock<Option<NonBlocking>> = OnceLock::new();
/// The writer thread's guard, kept until [`finish`].
static GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);
/// Set by the first [`init`]: later calls do nothing.
static INITIALIZED: OnceLock<()> = OnceLock::new();

/// Log lines lost so far: refused by the full queue, or whose write to stderr failed.
pub fn dropped_lines() -> u64 {
    let queue = QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64);
    queue + WRITE_DROPS.load(Ordering::Relaxed)
}

/// Descriptor 2, written with `write(2)` and no buffer. A failed line is counted and dropped,
/// never returned as an error (the worker would only retry it or print to that same stderr).
/// After a write that went through, the lines lost before it are reported in one line.
struct Stderr {
    reported: u64,
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let ok = write_all_fd2(buf);
        DONE.fetch_add(1, Ordering::Relaxed);
        if !ok {
            WRITE_DROPS.fetch_add(1, Ordering::Relaxed);
            return Ok(buf.len());
        }
        let dropped = dropped_lines();
        // Through the subscriber, so it has the format of every other line; it joins the
        // queue this thread is draining, so only once that queue has room again: into a full
        // one it was itself dropped, and the next report said "1".
        if dropped > self.reported && pending() < QUEUE_LINES as u64 / 2 {
            let lost = dropped - self.reported;
            let before = self.reported;
            self.reported = dropped;
            tracing::warn!(
                dropped = lost,
                total = dropped,
                "{lost} log line(s) were dropped: stderr did not take them"
            );
            // Refused after all (the queue filled meanwhile): said again later, this line
            // included.
            if dropped_lines() > dropped {
                self.reported = before;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Lines in the queue: handed to it, neither refused nor finished by the writer thread.
fn pending() -> u64 {
    let refused = QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64);
    QUEUED
        .load(Ordering::Relaxed)
        .saturating_sub(refused)
        .saturating_sub(DONE.load(Ordering::Relaxed))
}

/// Writes all of `buf` to descriptor 2 (blocking: only the writer thread calls it); false on
/// any error, a closed descriptor included (which std's stderr would report as written).
fn write_all_fd2(mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: write(2) from a live buffer of the given length.
        let n = unsafe { libc::write(2, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if n == 0 {
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// The queue, started by the first line that needs it: the bounded queue and the thread that
/// writes it to descriptor 2. The thread is born with every signal blocked, whichever thread
/// logs first, so no signal handler ever runs on it (a handler on a thread held by a stalled
/// stderr would still run, but a thread that waits on output is no place for one).
///
/// `None` when the thread cannot be started (no process left under `RLIMIT_NPROC` or a
/// cgroup's `pids.max`): `tracing-appender` panics then, and the panic's own line came back
/// here while the queue was being made, which waited on itself for good, every signal blocked
/// (a hang only SIGKILL ended). Lines then go to [`write_now_or_drop`].
fn queue() -> Option<&'static NonBlocking> {
    QUEUE
        .get_or_init(|| {
            STARTING.set(true);
            // SAFETY: sigset_t is plain data; the masks are this thread's own, restored below.
            let old = unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
                old
            };
            let made = std::panic::catch_unwind(|| {
                NonBlockingBuilder::default()
                    .lossy(true)
                    .buffered_lines_limit(QUEUE_LINES)
                    .thread_name("leaderrun-log")
                    .finish(Stderr { reported: 0 })
            });
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            STARTING.set(false);
            let (writer, guard) = made.ok()?;
            let _ = QUEUE_DROPS.set(writer.error_counter());
            *GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
            Some(writer)
        })
        .as_ref()
}

thread_local! {
    /// Set while this thread makes the queue: a line it logs meanwhile (the panic of a thread
    /// that could not be started) must not ask for the queue again.
    static STARTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Without the writer thread: writes `buf` to descriptor 2 only as far as it takes it at once
/// (`poll` with no wait before each write; a pipe that polls writable takes up to a page
/// without blocking), and drops the rest. False when any of it was dropped.
fn write_now_or_drop(mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        let mut fd = libc::pollfd {
            fd: 2,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; no wait.
        let ready = unsafe { libc::poll(&mut fd, 1, 0) };
        if ready != 1 || fd.revents & libc::POLLOUT == 0 {
            return false;
        }
        let chunk = &buf[..buf.len().min(4096)];
        // SAFETY: write(2) from a live buffer of the given length.
        let n = unsafe { libc::write(2, chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// The queue's front: counts each line handed to it.
#[derive(Clone, Copy)]
struct Counted;

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if STARTING.get() {
            // The panic of the writer thread's start: reported by the lines that follow.
            return Ok(buf.len());
        }
        QUEUED.fetch_add(1, Ordering::Relaxed);
        match queue() {
            // NonBlocking writes through `&mut self`; a clone is the channel's sender and the
            // error counter, two reference counts.
            Some(queue) => queue.clone().write(buf),
            None => {
                if !write_now_or_drop(buf) {
                    WRITE_DROPS.fetch_add(1, Ordering::Relaxed);
                }
                DONE.fetch_add(1, Ordering::Relaxed);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Counted {
    type Writer = Counted;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Installs the global subscriber: lines on stderr at `level`, unless `RUST_LOG` is set and no
/// -v/-q flag was given, in which case `RUST_LOG` decides. `json` writes one object per line
/// with `timestamp`, `level`, `message` and the event's fields at the top level. Lines never
/// wait for stderr (see the module documentation); call [`finish`] before the process exits.
///
/// Safe to call once per process; later calls do nothing.
pub fn init(level: tracing::Level, explicit: bool, json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;

    if INITIALIZED.set(()).is_err() {
        return;
    }
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !explicit && !spec.is_empty() => {
            EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(level.as_str()))
        }
        _ => EnvFilter::new(level.as_str()),
    };
    // A panic's message goes the same way: the default hook writes to stderr on the panicking
    // thread, before it unwinds, and would hold that thread (the one that stops COMMAND) on a
    // stalled stderr.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let backtrace = std::backtrace::Backtrace::capture();
        let mut line = format!("thread '{name}' {info}\n");
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            line.push_str(&format!("stack backtrace:\n{backtrace}\n"));
        }
        let _ = Counted.write(line.as_bytes());
    }));
    // A line that cannot be written is dropped: tracing-subscriber would otherwise report it
    // with eprintln!, which panics on that same broken stderr and would abort a leader
    // mid-term.
    let builder = tracing_subscriber::fmt()
        .with_writer(Counted)
        .log_internal_errors(false)
        .with_target(false)
        .with_env_filter(filter);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

/// Waits until the lines queued so far are written (or dropped), at most [`EXIT_FLUSH`], and
/// stops the writer thread without waiting for it when stderr still does not take them: the
/// exit is never held by output. Call last before the process exits.
pub fn finish() {
    let Some(guard) = GUARD.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let deadline = Instant::now() + EXIT_FLUSH;
    let mut pause = Duration::from_micros(50);
    while pending() > 0 && Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
    // The guard's own drop waits up to 1.1 s for the worker and prints to stdout when the
    // queue is full: the queue is drained or given up on here, so it is never dropped.
    std::mem::forget(guard);
}
