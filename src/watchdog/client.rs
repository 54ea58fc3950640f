//! leaderrun's side of the watchdog: the [`Watchdog`] handle that starts the helper process,
//! keeps it told (tree, heartbeat, session) and starts a new one if it dies, and the
//! [`WatchedSpawner`] that starts no tree while no watchdog runs.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tracing::{debug, warn};

use crate::elector::{boottime, SessionKeeper};
use crate::process::child::{Announcement, HelperPid, SpawnError, Spawner, Tree, TreeState};

use super::protocol::*;
use super::{pidfd_open, ARGV0, KILL_WAIT, RELEASE_WAIT};

/// What the watchdog needs to know at start.
#[derive(Clone, Debug)]
pub struct WatchdogPlan {
    /// Grace between the stop signal and SIGKILL, for a freeze.
    pub grace: Duration,
    /// A freeze: no heartbeat for this long, and the proof ran out.
    pub stall: Duration,
    /// The stop signal, for a freeze.
    pub stop_signal: Signal,
    /// COMMAND's cgroup, where there is one.
    pub cgroup: Option<PathBuf>,
}

pub(super) struct Link {
    fd: OwnedFd,
    pid: u32,
    /// Its pidfd (Linux 5.3): its exit is seen at once, and it is reaped before leaderrun exits.
    pidfd: Option<OwnedFd>,
}

/// A watchdog whose pair is closed already, still to be reaped.
pub(super) struct Ending {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

#[derive(Default)]
pub(super) struct Held {
    link: Option<Link>,
    tree: i32,
    session: Option<OwnedFd>,
    beat: u64,
    /// Releases sent without waiting whose acknowledgements are still to come.
    unanswered: usize,
    /// [`Watchdog::shutdown`] or [`Watchdog::end_early`] ran: no new watchdog is started.
    closed: bool,
    /// The watchdog told to end by [`Watchdog::end_early`], not reaped yet.
    ending: Option<Ending>,
    /// leaderrun is stopping the reported tree.
    stopping: bool,
    /// Since when every start of a watchdog failed: the streak's first failure is logged, and
    /// its end.
    start_failing: Option<std::time::Instant>,
    /// When the latest start failed: the next is tried [`START_RETRY`] later.
    last_failed_start: Option<std::time::Instant>,
}

/// A watchdog forked at the very start of leaderrun, before any other thread exists, that runs
/// the watchdog's code in the forked child at once, without an exec (an exec of the binary, its
/// loader and Rust's start-up cost about 1.5 ms of CPU on a one-shot's path). It waits for its
/// plan until [`Watchdog::adopt`] sends it. Dropped without being adopted (a usage error,
/// COMMAND not found), it is told to end (its pair closes) and reaped.
pub struct EarlyWatchdog {
    link: Option<Link>,
}

impl EarlyWatchdog {
    /// Forks the watchdog: in the child, a session of its own (`setsid`), no descriptor but
    /// stdio and its end of the pair (a one-shot's early connect is open by now, and a copy
    /// of it would keep that session alive after leaderrun closed it), the watchdog's
    /// dispositions, name (`lr-watchdog`) and command line, `/dev/null` on stdin and stdout,
    /// then its loop once the plan came; in leaderrun, the handle. Every signal is blocked
    /// across the fork (the child sets its dispositions before it takes any; leaderrun gets
    /// what arrived meanwhile when its mask is restored). `None` when the pair or the fork
    /// fails: the exec path starts one later.
    ///
    /// # Safety
    /// No other thread may exist in the process: the child runs Rust code (it allocates), which
    /// a lock held by a thread that the fork did not copy would deadlock.
    pub unsafe fn fork() -> Option<EarlyWatchdog> {
        let (ours, theirs) = pair().ok()?;
        let leaderrun = std::process::id() as i32;
        // SAFETY: sigset_t is plain data; the masks are this thread's own.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        // SAFETY: one thread (the caller's promise): the child may run any code.
        let pid = libc::fork();
        if pid == 0 {
            drop(ours);
            close_all_but(theirs.as_raw_fd());
            // A session of its own: no terminal signals, no stop of leaderrun's group.
            libc::setsid();
            super::helper::forked_main(theirs, leaderrun);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        drop(theirs);
        if pid < 0 {
            return None;
        }
        Some(EarlyWatchdog {
            link: Some(Link {
                fd: ours,
                pid: pid as u32,
                pidfd: pidfd_open(pid as u32),
            }),
        })
    }
}

/// Closes every descriptor from 3 up but `keep`: `close_range(2)` (Linux 5.9), else each one
/// `/proc/self/fd` lists. For a forked child of a single-threaded process.
fn close_all_but(keep: RawFd) {
    let close_range = |first: RawFd, last: RawFd| -> bool {
        first > last
            // SAFETY: close_range takes two descriptor numbers and flags; it closes, nothing more.
            || unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0) } == 0
    };
    if keep >= 3 && close_range(3, keep - 1) && close_range(keep + 1, RawFd::MAX) {
        return;
    }
    if keep < 3 && close_range(3, RawFd::MAX) {
        return;
    }
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= 3 && fd != keep)
        .collect();
    for fd in fds {
        // SAFETY: closes a descriptor this process no longer uses (the directory's own is
        // closed already, or fails harmlessly).
        unsafe { libc::close(fd) };
    }
}

impl EarlyWatchdog {
    /// The watchdog's pid, while it is this handle's to end.
    pub fn pid(&self) -> Option<i32> {
        self.link.as_ref().map(|link| link.pid as i32)
    }
}

impl Drop for EarlyWatchdog {
    fn drop(&mut self) {
        if let Some(Link { fd, pid, .. }) = self.link.take() {
            // End of file before a plan: it exits at once.
            drop(fd);
            let pid = Pid::from_raw(pid as i32);
            while let Err(Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        }
    }
}

/// leaderrun's handle on its watchdog process. Cheap to share; every call is a non-blocking
/// send of a few bytes, except [`SessionKeeper::release`], which waits for the answer.
pub struct Watchdog {
    plan: WatchdogPlan,
    held: Mutex<Held>,
    /// Woken at every start of a watchdog process, for [`Watchdog::watch`].
    started: tokio::sync::Notify,
    /// The running watchdog's pid, for the trees to leave out ([`Watchdog::helper_pid`]).
    helper: HelperPid,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("pid", &self.pid())
            .finish()
    }
}

impl Watchdog {
    /// A handle; the process starts at the first [`Watchdog::ready`] (the binary calls it at
    /// start, on a thread of its own beside the first connect), or else at the first grant
    /// ([`SessionKeeper::keep`]) or spawn, whichever comes first. A grant or spawn that comes
    /// while it starts waits for it.
    pub fn new(plan: WatchdogPlan) -> Watchdog {
        Watchdog {
            plan,
            held: Mutex::new(Held::default()),
            started: tokio::sync::Notify::new(),
            helper: HelperPid::default(),
        }
    }

    /// The cell that holds the running watchdog's pid: give it to the [`ProcessSpawner`] whose
    /// trees this watchdog guards, so that no stop signals it and no tree waits for it.
    ///
    /// [`ProcessSpawner`]: crate::process::child::ProcessSpawner
    pub fn helper_pid(&self) -> HelperPid {
        self.helper.clone()
    }

    /// The watchdog's settings as arguments: an exec'd one's command line (before leaderrun's
    /// pid), a forked one's plan message.
    fn plan_args(&self) -> Vec<OsString> {
        vec![
            self.plan.grace.as_millis().to_string().into(),
            self.plan.stall.as_millis().to_string().into(),
            (self.plan.stop_signal as i32).to_string().into(),
            self.plan
                .cgroup
                .as_ref()
                .map_or_else(|| OsString::from("-"), |d| d.as_os_str().to_owned()),
            if JSON_LOGS.load(Ordering::Relaxed) {
                "json".into()
            } else {
                "text".into()
            },
        ]
    }

    /// Takes over the watchdog `main` forked at start ([`EarlyWatchdog::fork`]) and sends it
    /// its plan, the first message on its pair: it is this handle's watchdog from now on, as
    /// if [`Watchdog::ready`] had started it, without an exec or a thread. `false` when it is
    /// gone already (it is reaped; the first [`Watchdog::ready`] starts one by exec).
    pub fn adopt(&self, mut early: EarlyWatchdog) -> bool {
        let mut held = self.lock();
        if held.closed || held.link.is_some() {
            return false;
        }
        let Some(link) = early.link.take() else {
            return false;
        };
        if let Err(err) = send_plan(link.fd.as_fd(), &self.plan_args()) {
            warn!(
                pid = link.pid,
                "the watchdog forked at start is gone ({err}); starting one"
            );
            early.link = Some(link);
            return false;
        }
        self.helper.set(Some(link.pid));
        debug!(pid = link.pid, "watchdog forked at start");
        held.link = Some(link);
        held.unanswered = 0;
        self.started.notify_one();
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watchdog's pid, while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().link.as_ref().map(|l| l.pid)
    }

    /// Starts a watchdog process that finds what `held` holds (the tree, the last heartbeat,
    /// a stop under way, the session) already queued on its end of the pair: it is queued
    /// before the fork, so a leaderrun killed at any moment after the fork still leaves a
    /// watchdog that knows the tree and kills it. Queued after the spawn, a kill -9 in between
    /// left a watchdog that knew nothing and the tree running.
    fn spawn(&self, held: &Held) -> std::io::Result<Link> {
        let (ours, theirs) = pair()?;
        {
            let fd = ours.as_fd();
            send_on(fd, Message::Tree(held.tree), None)?;
            send_on(fd, Message::Beat(held.beat), None)?;
            if held.stopping {
                send_on(fd, Message::Stopping, None)?;
            }
            if let Some(session) = &held.session {
                send_on(fd, Message::Session, Some(session.as_fd()))?;
            }
        }
        let theirs_fd = theirs.as_raw_fd();
        let mut cmd = std::process::Command::new("/proc/self/exe");
        cmd.arg0(ARGV0)
            .args(self.plan_args())
            .arg(std::process::id().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: raw syscalls only between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if theirs_fd == CONTROL_FD {
                    libc::fcntl(CONTROL_FD, libc::F_SETFD, 0);
                } else if libc::dup2(theirs_fd, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Nothing else reaches it, as nothing reaches the first watchdog (forked with
                // every other descriptor closed): a descriptor leaderrun was handed without
                // close-on-exec (a parent's `flock`ed file, a pipe it waits to see closed)
                // would otherwise live on in every watchdog started after one died.
                crate::process::descriptors::close_on_exec_from(CONTROL_FD + 1);
                // A session of its own: no terminal signals, no stop of leaderrun's group.
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        let pid = child.id();
        // Dropping std's handle neither waits nor kills; leaderrun's reaper reaps it.
        drop(child);
        self.helper.set(Some(pid));
        debug!(pid, "watchdog started");
        Ok(Link {
            fd: ours,
            pid,
            pidfd: pidfd_open(pid),
        })
    }

    /// Sends `message` (with `fd` attached), starting a new watchdog and handing it what is
    /// held when the current one is gone. Returns whether a watchdog has it.
    fn send(&self, held: &mut Held, message: Message, fd: Option<BorrowedFd<'_>>) -> bool {
        if let Some(link) = &held.link {
            if send_on(link.fd.as_fd(), message, fd).is_ok() {
                return true;
            }
            warn!(
                pid = link.pid,
                "the watchdog is gone; starting a new one (COMMAND's tree is not guarded meanwhile)"
            );
            if let Some(link) = held.link.take() {
                discard(link);
            }
        }
        self.respawn(held)
    }

    /// A new watchdog, born knowing the tree, the session and the last heartbeat.
    fn respawn(&self, held: &mut Held) -> bool {
        if held.closed {
            return false;
        }
        // After a failed start, the next waits [`START_RETRY`]: every message would try one,
        // and a fork of leaderrun at each heartbeat and each check took the runtime's thread
        // from the checks themselves.
        if held
            .last_failed_start
            .is_some_and(|at| at.elapsed() < START_RETRY)
        {
            return false;
        }
        let link = match self.spawn(held) {
            Ok(link) => link,
            Err(err) => {
                let now = std::time::Instant::now();
                held.last_failed_start = Some(now);
                if held.start_failing.is_none() {
                    held.start_failing = Some(now);
                    warn!(
                        "cannot start the watchdog: {err}; tried again every {}, and a tree \
                         it should guard is stopped",
                        humantime::format_duration(START_RETRY)
                    );
                }
                self.helper.set(None);
                return false;
            }
        };
        held.last_failed_start = None;
        if held.start_failing.take().is_some() {
            warn!(pid = link.pid, "the watchdog started again");
        }
        held.link = Some(link);
        held.unanswered = 0;
        self.started.notify_one();
        true
    }

    /// Whether a watchdog runs now (starting a new one when it is gone): the spawn gate, so
    /// COMMAND never starts unguarded.
    pub fn ready(&self) -> bool {
        let mut held = self.lock();
        let beat = held.beat;
        self.send(&mut held, Message::Beat(beat), None)
    }

    /// A tree runs in process group `pgid` now (`None`: no tree any more).
    pub fn tree(&self, pgid: Option<i32>) {
        let mut held = self.lock();
        held.tree = pgid.unwrap_or(0);
        held.stopping = false;
        let tree = held.tree;
        self.send(&mut held, Message::Tree(tree), None);
    }

    /// leaderrun is stopping the reported tree: a lock session the server closes from now on
    /// is left to leaderrun, which is acting on it.
    pub fn stopping(&self) {
        let mut held = self.lock();
        if held.tree == 0 || held.stopping {
            return;
        }
        held.stopping = true;
        self.send(&mut held, Message::Stopping, None);
    }

    /// A duplicate of leaderrun's end of the pair to the running watchdog (close-on-exec), for
    /// a child to announce itself on (`None` while none runs).
    fn announcer(&self) -> Option<OwnedFd> {
        self.lock().link.as_ref()?.fd.try_clone().ok()
    }

    /// A duplicate of the current watchdog's pidfd (readable once it has exited, so its death
    /// is noticed at once) with its pid, read together; `None` while none runs, or without
    /// pidfds.
    fn exit_of_current(&self) -> Option<(OwnedFd, u32)> {
        let held = self.lock();
        let link = held.link.as_ref()?;
        Some((link.pidfd.as_ref()?.try_clone().ok()?, link.pid))
    }

    /// Notices the watchdog's death the moment it happens (its pidfd becomes readable) and
    /// starts a new one at once, handing it the tree and the session: without it a dead
    /// watchdog would be noticed only at the next message leaderrun sends it (up to a
    /// heartbeat later), a window in which a `kill -9` of leaderrun would leave the tree's
    /// helpers running. Runs until [`Watchdog::shutdown`]; without pidfds it returns at once
    /// (the next message still notices).
    pub async fn watch(self: std::sync::Arc<Self>) {
        loop {
            let started = self.started.notified();
            if self.lock().closed {
                return;
            }
            let Some((pidfd, watched)) = self.exit_of_current() else {
                // None runs yet (it starts beside the first connect), or it could not start.
                started.await;
                continue;
            };
            // SAFETY: the AsyncFd owns the pidfd, which stays open (and the same) until it drops.
            let Ok(exit) = (unsafe { tokio::io::unix::AsyncFd::register(pidfd) }) else {
                return;
            };
            let Ok(mut ready) = exit.readable().await else {
                return;
            };
            ready.retain_ready();
            drop(exit);
            let mut held = self.lock();
            if held.closed {
                return;
            }
            // A message that found the pair broken first has replaced it already: the link
            // is another watchdog's now, which must not be dropped (its end of the pair would
            // close, and it would kill the tree it guards).
            if held.link.as_ref().map(|l| l.pid) != Some(watched) {
                continue;
            }
            let pid = held.link.take().map(|l| l.pid);
            warn!(pid, "the watchdog is gone; starting a new one");
            self.respawn(&mut held);
        }
    }

    /// Whether the watchdog said it stopped the tree itself since the last call (its messages
    /// waiting on the pair are read without waiting).
    fn stopped_the_tree(&self) -> bool {
        let mut held = self.lock();
        let mut stopped = false;
        while let Some(link) = &held.link {
            match receive(link.fd.as_fd(), Duration::ZERO) {
                Ok(Some((Message::Stopped, _))) => stopped = true,
                // The answer to a release that did not wait for it.
                Ok(Some((Message::Released, _))) => {
                    held.unanswered = held.unanswered.saturating_sub(1)
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        stopped
    }

    /// Whether no watchdog has run for [`UNGUARDED_AFTER`] or longer: the last one is gone
    /// and every start since failed, this one too (one is tried first). A start that fails for
    /// a moment (a fork's EAGAIN at a `pids.max` spike) is not yet that.
    fn unguarded(&self) -> bool {
        let mut held = self.lock();
        if held.link.is_some() {
            return false;
        }
        let beat = held.beat;
        if self.send(&mut held, Message::Beat(beat), None) {
            return false;
        }
        held.start_failing
            .is_some_and(|since| since.elapsed() >= UNGUARDED_AFTER)
    }

    /// Whether a tree is reported (it runs, or is being stopped): heartbeats matter only then.
    pub fn guards_tree(&self) -> bool {
        self.lock().tree != 0
    }

    /// leaderrun is alive; the current proof ends at `proven_until` (boottime; `None`: no
    /// term).
    pub fn heartbeat(&self, proven_until: Option<Duration>) {
        let mut held = self.lock();
        held.beat = proven_until.map_or(0, |d| d.as_nanos() as u64);
        // Before the first grant there is nothing to guard and no watchdog to tell.
        if held.link.is_none() && held.session.is_none() && held.tree == 0 {
            return;
        }
        let beat = held.beat;
        self.send(&mut held, Message::Beat(beat), None);
    }
}

impl Watchdog {
    /// Tells the watchdog to end now, when no tree is reported (none runs, none is being
    /// stopped): it exits while leaderrun still unlocks and closes the session, and
    /// [`Watchdog::shutdown`] then only reaps it. Returns whether it was told. With a tree
    /// reported it is left alone (its end would kill the tree and close its copy of the
    /// session while leaderrun may still hold the lock through its own): `shutdown` ends it
    /// after the release, as always. Its copy of the session keeps nothing: leaderrun's unlock
    /// frees the lock, and its Terminate ends the session, whatever copies remain. No watchdog
    /// is started after this.
    pub fn end_early(&self) -> bool {
        let mut held = self.lock();
        if held.tree != 0 || held.stopping || held.ending.is_some() {
            return false;
        }
        held.closed = true;
        let Some(link) = held.link.take() else {
            return false;
        };
        // Only the pair closes (its cue to end); the pid and the pidfd stay for the reap.
        let Link { fd, pid, pidfd } = link;
        drop(fd);
        held.ending = Some(Ending { pid, pidfd });
        true
    }
}

/// Ends a watchdog that no message reaches any more, before another takes its place: one that
/// is alive but cannot take messages (stopped with its queue full, wedged) would otherwise keep
/// its copy of the lock session, count as part of COMMAND's tree in every stop, and, continued
/// later, read the end of its pair and kill the tree of a term it no longer knows. Through its
/// pidfd, which never reaches a process that reused the pid; without pidfds (Linux before
/// 5.3) it is left as it is. The reaper reaps it.
fn discard(link: Link) {
    if let Some(pidfd) = &link.pidfd {
        super::helper::pidfd_signal(pidfd, Signal::SIGKILL);
    }
}

impl SessionKeeper for Watchdog {
    /// # Errors
    /// The socket cannot be duplicated (`EMFILE`), or no watchdog runs and none can be
    /// started: the grant is given up (`Error::Keeper`), since a term whose session lives
    /// only in leaderrun would pass the lock on the moment leaderrun is killed.
    fn keep(&self, socket: BorrowedFd<'_>) -> std::io::Result<()> {
        let copy = socket.try_clone_to_owned()?;
        let mut held = self.lock();
        // Stopped while no tree ran, nothing looked: it must run before a term begins.
        if let Some(link) = &held.link {
            crate::process::child::continue_if_stopped(nix::unistd::Pid::from_raw(link.pid as i32));
        }
        let sent = held.link.as_ref().is_some_and(|link| {
            send_on(link.fd.as_fd(), Message::Session, Some(copy.as_fd())).is_ok()
        });
        held.session = Some(copy);
        if sent {
            return Ok(());
        }
        // No watchdog yet (or it died): start one now; it gets the session as part of what
        // is held.
        if let Some(link) = held.link.take() {
            warn!("the watchdog is gone; starting a new one");
            discard(link);
        }
        if self.respawn(&mut held) {
            return Ok(());
        }
        held.session = None;
        Err(std::io::Error::other(
            "no watchdog runs, and none can be started",
        ))
    }

    fn release(&self, wait: bool) {
        let mut held = self.lock();
        held.session = None;
        let Some(link) = &held.link else {
            return;
        };
        if send_on(link.fd.as_fd(), Message::Release, None).is_err() {
            return;
        }
        if !wait {
            // Its acknowledgement is skipped by the next release that waits.
            held.unanswered += 1;
            return;
        }
        let mut skip = std::mem::take(&mut held.unanswered);
        let Some(link) = &held.link else {
            return;
        };
        // Wait for the acknowledgement: until then the watchdog's copy keeps the session (and
        // the lock) alive, and closing ours would release nothing.
        let deadline = boottime() + RELEASE_WAIT;
        loop {
            let left = deadline.saturating_sub(boottime());
            if left.is_zero() {
                warn!(
                    pid = link.pid,
                    "the watchdog did not drop its copy of the lock session within {}",
                    humantime::format_duration(RELEASE_WAIT)
                );
                return;
            }
            match receive(link.fd.as_fd(), left) {
                Ok(Some((Message::Released, _))) if skip > 0 => skip -= 1,
                Ok(Some((Message::Released, _))) => return,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    }
}

impl Watchdog {
    /// Ends the watchdog and reaps it, so that leaderrun leaves no zombie to a parent that does
    /// not reap orphans (a container's PID 1 that is an application, a job scheduler, any
    /// subreaper). Its end of the pair is closed (its cue to end: it kills a tree still
    /// reported, closes its copy of the session and exits), then leaderrun waits for its exit
    /// at most [`KILL_WAIT`] and a second, SIGKILLs it after that, and reaps it. No watchdog
    /// is started after this. Call once, last, on every exit path after the first
    /// [`Watchdog::ready`].
    pub fn shutdown(&self) {
        let ending = {
            let mut held = self.lock();
            held.closed = true;
            // Closing its end of the pair is the watchdog's cue to end.
            match held.link.take() {
                Some(Link { fd, pid, pidfd }) => {
                    drop(fd);
                    Some(Ending { pid, pidfd })
                }
                None => held.ending.take(),
            }
        };
        let Some(Ending { pid, pidfd }) = ending else {
            return;
        };
        let pid = Pid::from_raw(pid as i32);
        let bound = KILL_WAIT + Duration::from_secs(1);
        let exited = match &pidfd {
            Some(pidfd) => {
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                let ms = bound.as_millis() as i32;
                loop {
                    match poll(
                        &mut fds,
                        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                    ) {
                        Err(Errno::EINTR) => continue,
                        Ok(n) => break n > 0,
                        Err(_) => break false,
                    }
                }
            }
            // Before Linux 5.3: look every few milliseconds.
            None => {
                let deadline = boottime() + bound;
                loop {
                    match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                        Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
                        // Reaped here, or by leaderrun's reaper (ECHILD).
                        _ => break true,
                    }
                    if boottime() >= deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        if !exited {
            warn!(pid = pid.as_raw(), "the watchdog did not exit; killing it");
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
        // ECHILD: reaped already (above, or by leaderrun's reaper).
        while let Err(Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        self.helper.set(None);
    }
}

/// Whether leaderrun logs JSON lines (`--log-format json`): the watchdog's own lines follow.
pub(super) static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Makes watchdogs started from now on write their lines as JSON objects, like leaderrun's
/// `--log-format json`, instead of text lines.
pub fn use_json_logs(json: bool) {
    JSON_LOGS.store(json, Ordering::Relaxed);
}

/// A [`Spawner`] that keeps the watchdog told: the spawn gate checks that a watchdog runs
/// (starting a new one if it died), and every tree's process group is reported while it runs.
pub struct WatchedSpawner<S> {
    /// The spawner that starts the processes.
    pub inner: S,
    /// The watchdog to tell.
    pub watchdog: std::sync::Arc<Watchdog>,
}

impl<S: Spawner> Spawner for WatchedSpawner<S> {
    /// The child announces itself to the watchdog before exec (an `M` datagram,
    /// docs/process-model.md#its-protocol; an `announce` given here is not used), and
    /// leaderrun reports the tree again once the spawn returned, which also tells a watchdog
    /// started meanwhile.
    fn spawn(
        &mut self,
        env: &[(&'static str, String)],
        _announce: Option<Announcement<'_>>,
        exec_by: Option<std::time::Duration>,
    ) -> Result<Box<dyn Tree>, SpawnError> {
        // Without a watchdog a killed leaderrun would leave COMMAND's tree running while the
        // lock passes on (rule 2): no start.
        if !self.watchdog.ready() {
            return Err(SpawnError::Unguarded);
        }
        // What the watchdog said of an earlier tree is no news of this one.
        let _ = self.watchdog.stopped_the_tree();
        // A copy of our end of the pair, the child's own: a watchdog replaced meanwhile only
        // makes its send fail, it never reaches another descriptor.
        let socket = self.watchdog.announcer();
        let datagram = Message::Announce.encode();
        let announce = socket.as_ref().map(|socket| Announcement {
            socket: socket.as_fd(),
            datagram: &datagram,
        });
        let tree = match self.inner.spawn(env, announce, exec_by) {
            Ok(tree) => tree,
            Err(err) => {
                // The child may have announced itself before its exec failed.
                if socket.is_some() {
                    self.watchdog.tree(None);
                }
                return Err(err);
            }
        };
        drop(socket);
        self.watchdog.tree(Some(tree.pid() as i32));
        Ok(Box::new(WatchedTree {
            inner: tree,
            watchdog: self.watchdog.clone(),
            reported: true,
            held_back: None,
            stopping: false,
        }))
    }

    fn reap_strays(&mut self) {
        self.inner.reap_strays();
    }
}

/// A [`Tree`] whose end is reported to the watchdog.
#[derive(Debug)]
pub(super) struct WatchedTree {
    inner: Box<dyn Tree>,
    watchdog: std::sync::Arc<Watchdog>,
    reported: bool,
    /// Since when the end of a tree the watchdog stopped is held back (see [`Tree::poll`]).
    held_back: Option<std::time::Instant>,
    /// A stop was asked for since the tree started.
    stopping: bool,
}

/// How long the end of a tree the watchdog stopped is held back at most, waiting for the term's
/// end that caused it.
pub(super) const HOLD_BACK: Duration = Duration::from_secs(5);

/// How long a tree may run with no watchdog, every start of a new one failing, before its term
/// is ended ([`TreeState::unguarded`]): starts are tried every [`START_RETRY`] meanwhile.
pub(super) const UNGUARDED_AFTER: Duration = Duration::from_millis(500);

/// How soon after a failed start of a watchdog the next is tried.
pub(super) const START_RETRY: Duration = Duration::from_millis(100);

impl Tree for WatchedTree {
    fn pid(&self) -> u32 {
        self.inner.pid()
    }

    fn signal_group(&mut self, sig: Signal) {
        self.inner.signal_group(sig);
    }

    fn signal_all(&mut self, sig: Signal) {
        // Every stop goes through here: told first, so the watchdog leaves a session the
        // server closes meanwhile to leaderrun.
        if sig != Signal::SIGCONT {
            self.watchdog.stopping();
            self.stopping = true;
        }
        self.inner.signal_all(sig);
    }

    /// A tree the watchdog stopped while leaderrun was frozen did not exit on its own: its end
    /// is held back (as still running, [`TreeState::fenced`]) until the supervisor stops it for
    /// the term's end, so the exit is not taken for COMMAND's own (which would end a
    /// `--restart never` leaderrun). Mostly leaderrun finds its proof lapsed when it runs
    /// again; where the watchdog knew only an older proof (leaderrun stopped right after a
    /// check, before telling it), the supervisor gives the term up. At most [`HOLD_BACK`].
    fn poll(&mut self) -> TreeState {
        let state = self.inner.poll();
        if state.main.is_some() && !self.stopping {
            let since = match self.held_back {
                Some(since) => Some(since),
                None if self.watchdog.stopped_the_tree() => Some(std::time::Instant::now()),
                None => None,
            };
            self.held_back = since;
            if since.is_some_and(|at| at.elapsed() < HOLD_BACK) {
                return TreeState {
                    main: None,
                    stopped: None,
                    empty: false,
                    fenced: true,
                    unguarded: false,
                };
            }
        }
        if state.empty && self.reported {
            self.reported = false;
            self.watchdog.tree(None);
        }
        // A main child that exited leaves its helpers to the stop that follows anyway.
        if !state.empty && state.main.is_none() && !self.stopping && self.watchdog.unguarded() {
            return TreeState {
                unguarded: true,
                ..state
            };
        }
        state
    }
}

impl Drop for WatchedTree {
    fn drop(&mut self) {
        // The inner tree is killed (if it was not empty) when it drops, before we say so.
        let inner = std::mem::replace(&mut self.inner, Box::new(Gone));
        drop(inner);
        if self.reported {
            self.watchdog.tree(None);
        }
    }
}

/// What is left in a [`WatchedTree`] once its tree was dropped.
#[derive(Debug)]
pub(super) struct Gone;

impl Tree for Gone {
    fn pid(&self) -> u32 {
        0
    }
    fn signal_group(&mut self, _: Signal) {}
    fn signal_all(&mut self, _: Signal) {}
    fn poll(&mut self) -> TreeState {
        TreeState {
            empty: true,
            ..TreeState::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::Duration;

    use nix::sys::signal::Signal;

    use super::{SpawnError, Spawner, Tree, Watchdog, WatchdogPlan, WatchedSpawner};
    use crate::elector::SessionKeeper;
    use crate::process::child::Announcement;

    /// Counts the starts it is asked for; starts nothing.
    struct Counting(usize);

    impl Spawner for Counting {
        fn spawn(
            &mut self,
            _env: &[(&'static str, String)],
            _announce: Option<Announcement<'_>>,
            _exec_by: Option<std::time::Duration>,
        ) -> Result<Box<dyn Tree>, SpawnError> {
            self.0 += 1;
            Err(SpawnError::NotFound {
                program: "counted".into(),
            })
        }
        fn reap_strays(&mut self) {}
    }

    /// With no watchdog able to run (here: none is started after `shutdown`), a grant's
    /// session is not taken (the elector then gives the lock back) and COMMAND is not started.
    #[test]
    fn without_a_watchdog_no_session_is_kept_and_no_command_starts() {
        let watchdog = Arc::new(Watchdog::new(WatchdogPlan {
            grace: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            stop_signal: Signal::SIGTERM,
            cgroup: None,
        }));
        watchdog.shutdown();
        let (socket, _peer) = UnixStream::pair().unwrap();
        let err = watchdog.keep(socket.as_fd()).unwrap_err();
        assert!(err.to_string().contains("no watchdog runs"), "{err}");
        assert!(watchdog.lock().session.is_none());
        let mut spawner = WatchedSpawner {
            inner: Counting(0),
            watchdog,
        };
        let err = spawner.spawn(&[], None, None).expect_err("no start");
        assert!(matches!(err, SpawnError::Unguarded), "{err}");
        assert_eq!(err.exit_code(), 125);
        assert_eq!(spawner.inner.0, 0, "COMMAND was started without a watchdog");
    }
}
