//! The watchdog: nothing of COMMAND outlives leaderrun, and the lock never moves before it is
//! dead (contract §5, FIELD-NOTES child 5).
//!
//! # Theory of operation
//!
//! `PR_SET_PDEATHSIG` kills only COMMAND's direct child when leaderrun dies, and the kernel
//! closes leaderrun's descriptors, and with them the lock session, before it signals anyone:
//! after `kill -9` of a leader, the rest of a `sh -c 'worker & worker; wait'` tree would run on
//! beside the next leader's child. So a small helper process, the watchdog, is started before
//! the first child. It is leaderrun's own binary, exec'd in a session of its own (terminal
//! signals and a stop of leaderrun's process group do not reach it), and it holds:
//!
//! * one end of a `SOCK_SEQPACKET` pair from leaderrun, over which it learns the process group
//!   (and cgroup) of the running tree, a heartbeat carrying the end of the current proof, and,
//!   at every grant, a duplicate of the lock session's socket (`SCM_RIGHTS`);
//! * that duplicate: while the watchdog holds it, the server does not see the session end.
//!
//! When leaderrun dies (end of file on the pair), the watchdog SIGKILLs the tree at once (the
//! process group, and the cgroup where there is one), waits until it is gone (at most
//! [`KILL_WAIT`]), and only then exits, closing its copy of the socket: the server frees the lock
//! after the tree is dead. SIGKILL at once, not the stop signal and the grace: nobody is left to
//! wait for the child's status, and the server's `idle_session_timeout` runs from the last
//! check, so there is no time for a grace. When leaderrun is alive but stops answering (SIGSTOP,
//! a debugger) while a tree runs, the watchdog waits until the proof of the last check has run
//! out and no heartbeat came for a while, then stops the tree as a demotion would (stop signal,
//! grace, SIGKILL): within the safe window plus the grace, before the server can free the lock.
//! A freeze of the whole machine stops the watchdog too; that case is left to the fencing token.
//!
//! When leaderrun ends the session on purpose (demotion after the tree is dead, shutdown) it
//! tells the watchdog first, which closes its copy and acknowledges. If the watchdog dies,
//! leaderrun starts a new one at once and hands it what it holds (tree, session, heartbeat);
//! COMMAND is never started while no watchdog runs (see [`Watchdog::ready`]).

use std::ffi::OsString;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use nix::unistd::Pid;
use tracing::{debug, warn};

use crate::elector::{boottime, SessionKeeper};
use crate::process::cgroup::Cgroup;
use crate::process::child::{SpawnError, Spawner, Tree, TreeState};

/// `argv[0]` of the watchdog process: how `main` recognises it, and how `ps` shows it.
pub const ARGV0: &str = "leaderrun-watchdog";
/// How long the watchdog waits for a killed tree to be gone before it gives up on it.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long leaderrun waits for the watchdog to acknowledge that it dropped its copy of the
/// session: it answers in microseconds unless it is dead or stopped.
pub const RELEASE_WAIT: Duration = Duration::from_millis(500);

/// The descriptor the watchdog finds its end of the pair on.
const CONTROL_FD: RawFd = 3;

/// One message on the pair: a kind byte and a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Message {
    /// A tree runs in this process group (0: none).
    Tree(i32),
    /// leaderrun is alive; the current proof ends at this boottime (ns; 0: no term).
    Beat(u64),
    /// The session's socket comes with this message.
    Session,
    /// Close the session copy and acknowledge.
    Release,
    /// The acknowledgement.
    Released,
    /// leaderrun is stopping the tree it reported (a demotion, a shutdown, a timeout).
    Stopping,
    /// The watchdog stopped the tree itself (leaderrun froze, or did not act on a session the
    /// server closed).
    Stopped,
}

impl Message {
    fn encode(self) -> [u8; 9] {
        let (kind, value) = match self {
            Message::Tree(pgid) => (b'T', pgid as u64),
            Message::Beat(ns) => (b'H', ns),
            Message::Session => (b'S', 0),
            Message::Release => (b'R', 0),
            Message::Released => (b'A', 0),
            Message::Stopping => (b'K', 0),
            Message::Stopped => (b'W', 0),
        };
        let mut out = [0u8; 9];
        out[0] = kind;
        out[1..].copy_from_slice(&value.to_le_bytes());
        out
    }

    #[inline(always)]
    fn decode(buf: &[u8]) -> Option<Message> {
        if buf.len() != 9 {
            return None;
        }
        let value = u64::from_le_bytes(buf[1..9].try_into().ok()?);
        Some(match buf[0] {
            b'T' => Message::Tree(value as i32),
            b'H' => Message::Beat(value),
            b'S' => Message::Session,
            b'R' => Message::Release,
            b'A' => Message::Released,
            b'K' => Message::Stopping,
            b'W' => Message::Stopped,
            _ => return None,
        })
    }
}

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

struct Link {
    fd: OwnedFd,
    pid: u32,
    /// Its pidfd (Linux 5.3): its exit is seen at once, and it is reaped before leaderrun exits.
    pidfd: Option<OwnedFd>,
}

#[derive(Default)]
struct Held {
    link: Option<Link>,
    tree: i32,
    session: Option<OwnedFd>,
    beat: u64,
    /// Releases sent without waiting whose acknowledgements are still to come.
    unanswered: usize,
    /// [`Watchdog::shutdown`] ran: no new watchdog is started.
    closed: bool,
    /// leaderrun is stopping the reported tree.
    stopping: bool,
}

/// The members of process group `pgid` that are not zombies (`None` without `/proc`: then
/// every member counts). Once leaderrun is gone its tree's zombies belong to whoever
/// inherited them, which may reap them late; they run nothing.
fn live_members(pgid: i32) -> Option<Vec<i32>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(
        dir.flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| is_live_member(pid, pgid))
            .collect(),
    )
}

/// Whether `pid` is a member of process group `pgid` and not a zombie.
fn is_live_member(pid: i32, pgid: i32) -> bool {
    // One system call rules out nearly every process (a machine with a thousand standbys has
    // thousands); only members of the group have their state read.
    if nix::unistd::getpgid(Some(Pid::from_raw(pid))) != Ok(Pid::from_raw(pgid)) {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return false;
    };
    let mut fields = rest.split(' ');
    let state = fields.next();
    let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
    pgrp == Some(pgid) && !matches!(state, Some("Z") | Some("X"))
}

/// Waits until every live member of process group `pgid` has exited (a zombie counts), at
/// most `within`: one scan of `/proc` finds them, then `poll` on their pidfds (Linux 5.3)
/// wakes at each exit. A group that was sent SIGKILL gains no members (a fork under way gets
/// the signal too), so the members found are all there is to wait for; after a stop signal
/// (`killed` false) a member may still start others, so the group is scanned again once the
/// known ones are gone. `Some(true)`: all are gone; `Some(false)`: some are left at the
/// deadline; `None`: it cannot tell (no `/proc`, or no pidfds), and the caller polls.
fn wait_group_exit(pgid: i32, within: Duration, killed: bool) -> Option<bool> {
    let deadline = boottime() + within;
    loop {
        if matches!(killpg(Pid::from_raw(pgid), None), Err(Errno::ESRCH)) {
            return Some(true);
        }
        let members = live_members(pgid)?;
        if members.is_empty() {
            return Some(true);
        }
        if !wait_exits(pgid, &members, deadline)? {
            return Some(false);
        }
        if killed {
            return Some(true);
        }
    }
}

/// Waits until `members` of process group `pgid` have exited or `deadline` (boottime) passed;
/// `Some(true)` when they have. `None`: no pidfds here.
fn wait_exits(pgid: i32, members: &[i32], deadline: Duration) -> Option<bool> {
    let mut pidfds = Vec::new();
    for &pid in members {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            match Errno::last() {
                Errno::ESRCH => continue,
                _ => return None,
            }
        }
        // SAFETY: the kernel just gave us this descriptor.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        // The pid may have been reused between the scan and the open.
        if is_live_member(pid, pgid) {
            pidfds.push(pidfd);
        }
    }
    while !pidfds.is_empty() {
        let left = deadline.saturating_sub(boottime());
        if left.is_zero() {
            return Some(false);
        }
        let mut fds: Vec<PollFd<'_>> = pidfds
            .iter()
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
        let exited: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut exited = exited.into_iter();
        pidfds.retain(|_| !exited.next().unwrap_or(false));
    }
    Some(true)
}

/// leaderrun's handle on its watchdog process. Cheap to share; every call is a non-blocking
/// send of a few bytes, except [`SessionKeeper::release`], which waits for the answer.
pub struct Watchdog {
    plan: WatchdogPlan,
    held: Mutex<Held>,
    /// Woken at every start of a watchdog process, for [`Watchdog::watch`].
    started: tokio::sync::Notify,
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
        }
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
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
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
            .arg(self.plan.grace.as_millis().to_string())
            .arg(self.plan.stall.as_millis().to_string())
            .arg((self.plan.stop_signal as i32).to_string())
            .arg(
                self.plan
                    .cgroup
                    .as_ref()
                    .map_or_else(|| OsString::from("-"), |d| d.as_os_str().to_owned()),
            )
            .arg(if JSON_LOGS.load(Ordering::Relaxed) {
                "json"
            } else {
                "text"
            })
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
        crate::process::child::set_helper(Some(pid));
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
            held.link = None;
        }
        self.respawn(held)
    }

    /// A new watchdog, born knowing the tree, the session and the last heartbeat.
    fn respawn(&self, held: &mut Held) -> bool {
        if held.closed {
            return false;
        }
        let link = match self.spawn(held) {
            Ok(link) => link,
            Err(err) => {
                warn!("cannot start the watchdog: {err}");
                crate::process::child::set_helper(None);
                return false;
            }
        };
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

    /// A duplicate of the current watchdog's pidfd (`None` while none runs, or without pidfds):
    /// readable once it has exited, so its death is noticed at once.
    pub fn pidfd(&self) -> Option<OwnedFd> {
        let held = self.lock();
        held.link.as_ref()?.pidfd.as_ref()?.try_clone().ok()
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
            let Some(pidfd) = self.pidfd() else {
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

impl SessionKeeper for Watchdog {
    fn keep(&self, socket: BorrowedFd<'_>) {
        let copy = match socket.try_clone_to_owned() {
            Ok(copy) => copy,
            Err(err) => {
                warn!("cannot duplicate the lock session's socket for the watchdog: {err}");
                return;
            }
        };
        let mut held = self.lock();
        let sent = held.link.as_ref().is_some_and(|link| {
            send_on(link.fd.as_fd(), Message::Session, Some(copy.as_fd())).is_ok()
        });
        held.session = Some(copy);
        if !sent {
            // No watchdog yet (or it died): start one now; it gets the session as part of
            // what is held.
            if held.link.take().is_some() {
                warn!("the watchdog is gone; starting a new one");
            }
            self.respawn(&mut held);
        }
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
        let link = {
            let mut held = self.lock();
            held.closed = true;
            held.link.take()
        };
        let Some(Link { fd, pid, pidfd }) = link else {
            return;
        };
        drop(fd);
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
        crate::process::child::set_helper(None);
    }
}

/// A pidfd for `pid`, `None` where the kernel has none (before 5.3) or it is gone.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: the kernel just gave us this descriptor.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}

/// Sends one message, never blocking and never raising SIGPIPE.
fn send_on(
    fd: BorrowedFd<'_>,
    message: Message,
    attach: Option<BorrowedFd<'_>>,
) -> nix::Result<()> {
    let bytes = message.encode();
    let iov = [IoSlice::new(&bytes)];
    let raw: [RawFd; 1] = [attach.map_or(-1, |f| f.as_raw_fd())];
    let cmsgs: &[ControlMessage<'_>] = if attach.is_some() {
        &[ControlMessage::ScmRights(&raw)]
    } else {
        &[]
    };
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => {}
            Err(err) => return Err(err),
        }
    }
}

/// Receives one message (and a descriptor sent with it) within `within`. `Ok(None)`: the other
/// end is gone.
fn receive(
    fd: BorrowedFd<'_>,
    within: Duration,
) -> nix::Result<Option<(Message, Option<OwnedFd>)>> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = within.as_millis().min(i32::MAX as u128) as i32;
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(0) => return Err(Errno::ETIMEDOUT),
        Ok(_) => {}
        Err(err) => return Err(err),
    }
    let mut buf = [0u8; 16];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut attached = None;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: the kernel just gave us this descriptor.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                attached.get_or_insert(owned);
            }
        }
    }
    let n = msg.bytes;
    if n == 0 {
        return Ok(None);
    }
    Ok(Message::decode(&buf[..n]).map(|m| (m, attached)))
}

/// Whether this process was started as the watchdog (`argv[0]` is [`ARGV0`]).
pub fn is_watchdog() -> bool {
    std::env::args_os().next().is_some_and(|a| a == ARGV0)
}

/// Whether leaderrun logs JSON lines (`--log-format json`): the watchdog's own lines follow.
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Makes watchdogs started from now on write their lines as JSON objects, like leaderrun's
/// `--log-format json`, instead of text lines.
pub fn use_json_logs(json: bool) {
    JSON_LOGS.store(json, Ordering::Relaxed);
}

/// One log line on stderr in leaderrun's format (`--log-format`): the watchdog has no tracing
/// subscriber, so that its loop stays small; its lines are rare, and written without waiting
/// ([`write_now`]).
#[cold]
fn say(level: &str, message: &str) {
    let timestamp = humantime::format_rfc3339_micros(std::time::SystemTime::now());
    let line = if WATCHDOG_JSON.load(Ordering::Relaxed) {
        format!(
            "{{\"timestamp\":\"{timestamp}\",\"level\":\"{level}\",\"message\":{}}}\n",
            serde_json::Value::from(message)
        )
    } else {
        format!("{timestamp} {level:>5} {message}\n")
    };
    write_now(&line);
}

/// In the watchdog process: its lines are JSON (its fifth argument is `json`).
static WATCHDOG_JSON: AtomicBool = AtomicBool::new(false);

/// The watchdog process: `leaderrun-watchdog GRACE_MS STALL_MS STOP_SIGNAL CGROUP|- text|json
/// LEADERRUN_PID`, its end of the pair on descriptor 3. Runs until leaderrun is gone.
pub fn main() -> ExitCode {
    // Nothing but leaderrun's end of file or SIGKILL ends it: INT/TERM/HUP to a whole process
    // group or cgroup reach leaderrun too, whose exit is the watchdog's cue.
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // `ps` and `/proc/PID/comm` show what it is, not "exe".
    // SAFETY: PR_SET_NAME with a NUL-terminated name of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"leaderrun-wd".as_ptr(), 0, 0, 0);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ms =
        |i: usize| Duration::from_millis(args.get(i).and_then(|a| a.parse().ok()).unwrap_or(1000));
    let (grace, stall) = (ms(0), ms(1));
    let stop_signal = args
        .get(2)
        .and_then(|a| a.parse::<i32>().ok())
        .and_then(|n| Signal::try_from(n).ok())
        .unwrap_or(Signal::SIGTERM);
    WATCHDOG_JSON.store(args.get(4).is_some_and(|f| f == "json"), Ordering::Relaxed);
    let cgroup = args
        .get(3)
        .filter(|a| *a != "-")
        .and_then(|d| Cgroup::open(std::path::Path::new(d)));
    // The tree is walked from leaderrun's children only while leaderrun is our parent: had it
    // died before we got here, our parent would be init, whose children are not the tree's.
    let root = args
        .get(5)
        .and_then(|a| a.parse::<i32>().ok())
        .filter(|&pid| pid == nix::unistd::getppid().as_raw())
        .unwrap_or(0);
    // SAFETY: leaderrun put our end of the pair on descriptor 3 before exec.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    let mut guard = Guard {
        escaped: Escaped {
            root,
            me: std::process::id() as i32,
            known: Vec::new(),
            next_scan: 0,
        },
        tree: 0,
        session: None,
        closed_at: None,
        stopping: false,
        proof: 0,
        last_beat: now_ns(),
        stall: stall.as_nanos() as u64,
        grace,
        stop_signal,
        cgroup,
    };
    guard.run(control.as_fd());
    ExitCode::SUCCESS
}

/// The boottime clock ([`boottime`]) in nanoseconds, for the watchdog's loop. This and
/// [`next_message`] call libc directly and are inlined into [`Guard::run`], so the loop that
/// runs between heartbeats touches few pages of the binary (see [`unmap_start_up_pages`]).
#[inline(always)]
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe {
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Writes `line` to stderr without ever waiting and without any error ending the watchdog: the
/// line is dropped when stderr cannot take it at once (a reader that stopped reading, a closed
/// pipe, a closed descriptor). Its descriptor is shared with leaderrun and COMMAND, so its own
/// flags are not touched: a pipe, FIFO or terminal is opened anew through `/proc/self/fd/2`
/// with `O_NONBLOCK`, a socket is sent to with `MSG_DONTWAIT`, a regular file (which does not
/// block) is written as it is; anything else is not written.
fn write_now(line: &str) {
    let bytes = line.as_bytes();
    // SAFETY: fstat into a zeroed stat; write/send/open/close on descriptors we own or on 2,
    // with live buffers. SIGPIPE is ignored in the watchdog and MSG_NOSIGNAL is set.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(2, &mut st) != 0 {
            return;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {
                libc::write(2, bytes.as_ptr().cast(), bytes.len());
            }
            libc::S_IFSOCK => {
                libc::send(
                    2,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                );
            }
            libc::S_IFIFO | libc::S_IFCHR => {
                let fd = libc::open(
                    c"/proc/self/fd/2".as_ptr(),
                    libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                    libc::close(fd);
                }
            }
            _ => {}
        }
    }
}

/// What one wait on the pair brought.
enum Step {
    /// The server closed the lock session (end of file or an error on the watched copy).
    SessionClosed,
    /// A message, and the descriptor that came with it.
    Message(Message, Option<OwnedFd>),
    /// Nothing within the time (or a signal, or a message that is not one).
    Nothing,
    /// End of file: leaderrun is gone.
    Eof,
    /// The pair failed.
    Failed,
}

/// Waits at most `within_ns` for one message on `fd`, or for the peer of `session` (-1:
/// none) to close it: [`receive`] with raw calls and a buffer on the stack. Only `POLLRDHUP`
/// is asked of the session's socket, which is never read here (its bytes are leaderrun's).
#[inline(always)]
fn next_message(fd: RawFd, within_ns: u64, session: RawFd) -> Step {
    let ms = within_ns.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
    let mut pollfds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: session,
            events: libc::POLLRDHUP,
            revents: 0,
        },
    ];
    let n = if session >= 0 { 2 } else { 1 };
    // SAFETY: `n` valid pollfds.
    let ready = unsafe { libc::poll(pollfds.as_mut_ptr(), n, ms) };
    let interrupted = || Errno::last() == Errno::EINTR;
    if ready == 0 || (ready < 0 && interrupted()) {
        return Step::Nothing;
    }
    if ready < 0 {
        return Step::Failed;
    }
    if pollfds[0].revents == 0 {
        return if pollfds[1].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            Step::SessionClosed
        } else {
            Step::Nothing
        };
    }
    let mut buf = [0u8; 16];
    // Room for a control message with one descriptor (as `cmsg_space!([RawFd; 1])`), aligned
    // for `cmsghdr`; more descriptors than that are closed by the kernel.
    let mut space = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space) as _;
    // SAFETY: msg points at live buffers of the sizes it names.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return if interrupted() {
            Step::Nothing
        } else {
            Step::Failed
        };
    }
    let mut attached = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled; each SCM_RIGHTS entry
    // holds descriptors the kernel just gave us.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    let owned = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    attached.get_or_insert(owned);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 {
        return Step::Eof;
    }
    match Message::decode(&buf[..n as usize]) {
        Some(message) => Step::Message(message, attached),
        None => Step::Nothing,
    }
}

/// How long the watchdog's pair must be quiet before it gives back its start-up pages: 50 ms.
const QUIET_NS: u64 = 50_000_000;

/// How long the watchdog leaves a lock session the server closed to leaderrun before it stops
/// the tree itself: a leaderrun that runs sees the same end of file and says it is stopping
/// (as a rule within a millisecond), so that the tree gets one stop signal, not two.
pub const SESSION_CLOSED_DEFER: Duration = Duration::from_millis(100);

/// The watchdog's state (times in boottime nanoseconds).
struct Guard {
    tree: i32,
    session: Option<OwnedFd>,
    /// When the server closed the session copy, while leaderrun had not said it is stopping.
    closed_at: Option<u64>,
    /// leaderrun said it is stopping the tree.
    stopping: bool,
    proof: u64,
    last_beat: u64,
    stall: u64,
    grace: Duration,
    stop_signal: Signal,
    cgroup: Option<Cgroup>,
    /// Descendants of leaderrun that left the tree's process group (no cgroup here).
    escaped: Escaped,
}

/// How often, while a tree runs without a cgroup, the watchdog walks leaderrun's descendants
/// for processes that left the tree's process group (`setsid`, `setpgid`): 25 ms.
const ESCAPE_SCAN_NS: u64 = 25_000_000;

/// Children of `pid`'s threads, read from `/proc/PID/task/*/children` (Linux 3.5 with
/// `CONFIG_PROC_CHILDREN`); nothing when that cannot be read.
fn children_of(pid: i32, out: &mut Vec<i32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Sends `sig` through a pidfd (Linux 5.1): never to a process that reused the pid.
fn pidfd_signal(pidfd: &OwnedFd, sig: Signal) {
    // SAFETY: pidfd_send_signal with a live pidfd, a valid signal, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// The part of a tree that the process group does not reach, where there is no cgroup: a
/// grandchild that called `setsid` is in a group of its own, and once leaderrun is killed its
/// parent dies by `PR_SET_PDEATHSIG` and it is re-parented to init, out of every walk. So
/// while the tree runs the watchdog walks leaderrun's descendants every [`ESCAPE_SCAN_NS`] and
/// holds a pidfd of each one outside the group; when it has to kill the tree it stops these
/// (SIGSTOP, so that they start nothing more), walks their own descendants, which are still
/// linked beneath them, and kills all it found. Left out: a process that left the group in
/// the last scan period before leaderrun was killed and whose parent died with it.
struct Escaped {
    /// leaderrun's pid (0: it was gone when the watchdog started; nothing is walked).
    root: i32,
    /// The watchdog's own pid, a child of leaderrun but not of the tree.
    me: i32,
    known: Vec<(i32, OwnedFd)>,
    /// When the next walk is due (boottime nanoseconds).
    next_scan: u64,
}

impl Escaped {
    /// Time until the next walk (nanoseconds), while one is worth doing.
    #[inline(always)]
    fn scan_in(&self, tree: i32) -> Option<u64> {
        (tree != 0 && self.root != 0).then(|| self.next_scan.saturating_sub(now_ns()))
    }

    /// Walks leaderrun's descendants, while leaderrun is our parent still, and adds every one
    /// outside process group `tree`; forgets those that exited.
    fn scan(&mut self, tree: i32) {
        self.next_scan = now_ns().saturating_add(ESCAPE_SCAN_NS);
        self.known.retain(|(_, pidfd)| !exited(pidfd));
        if self.root == 0 || nix::unistd::getppid().as_raw() != self.root {
            return;
        }
        let mut stack = vec![self.root];
        let mut seen = std::collections::HashSet::new();
        while let Some(pid) = stack.pop() {
            let mut children = Vec::new();
            children_of(pid, &mut children);
            for child in children {
                if child == self.me || !seen.insert(child) {
                    continue;
                }
                stack.push(child);
                let outside = nix::unistd::getpgid(Some(Pid::from_raw(child)))
                    .is_ok_and(|g| g.as_raw() != tree);
                if outside {
                    self.add(child);
                }
            }
        }
    }

    fn add(&mut self, pid: i32) -> bool {
        if self.known.iter().any(|(p, _)| *p == pid) {
            return false;
        }
        match pidfd_open(pid as u32) {
            Some(pidfd) => {
                self.known.push((pid, pidfd));
                true
            }
            None => false,
        }
    }

    /// Sends `sig` to every known one. Before SIGKILL, each is stopped first and its own
    /// descendants are added, until no new one turns up: killed at once, their children
    /// would be re-parented to init and escape.
    fn signal(&mut self, sig: Signal) {
        if sig == Signal::SIGKILL {
            for _round in 0..16 {
                for (_, pidfd) in &self.known {
                    pidfd_signal(pidfd, Signal::SIGSTOP);
                }
                let mut below = Vec::new();
                for (pid, _) in &self.known {
                    children_of(*pid, &mut below);
                }
                let mut new = false;
                for pid in below {
                    if pid != self.me {
                        new |= self.add(pid);
                    }
                }
                if !new {
                    break;
                }
            }
        }
        for (_, pidfd) in &self.known {
            pidfd_signal(pidfd, sig);
        }
    }

    /// Waits until every known one has exited, at most until `deadline` (boottime).
    fn gone_by(&mut self, deadline: Duration) -> bool {
        loop {
            self.known.retain(|(_, pidfd)| !exited(pidfd));
            if self.known.is_empty() {
                return true;
            }
            let left = deadline.saturating_sub(boottime());
            if left.is_zero() {
                return false;
            }
            let mut fds: Vec<PollFd<'_>> = self
                .known
                .iter()
                .map(|(_, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            );
        }
    }
}

impl Guard {
    fn run(&mut self, control: BorrowedFd<'_>) {
        // The start-up pages are given back at the first quiet moment, not before the first
        // messages: leaderrun may be waiting for an answer (a short one-shot's release).
        let mut unmapped = false;
        loop {
            let mut wait = self.freeze_in().unwrap_or(3600 * 1_000_000_000);
            if let Some(closed) = self.closed_in() {
                wait = wait.min(closed);
            }
            if !unmapped {
                wait = wait.min(QUIET_NS);
            }
            if self.cgroup.is_none() {
                if let Some(scan) = self.escaped.scan_in(self.tree) {
                    if scan == 0 {
                        self.escaped.scan(self.tree);
                    }
                    wait = wait.min(ESCAPE_SCAN_NS.min(scan.max(1)));
                }
            }
            // The session is watched while a tree runs that leaderrun is not stopping.
            let watched = match &self.session {
                Some(session) if self.tree != 0 && !self.stopping && self.closed_at.is_none() => {
                    session.as_raw_fd()
                }
                _ => -1,
            };
            match next_message(control.as_raw_fd(), wait, watched) {
                Step::Message(message, fd) => self.handle(control, message, fd),
                Step::SessionClosed => {
                    // The lock is free already; the copy keeps nothing alive any more.
                    drop(self.session.take());
                    self.closed_at = Some(now_ns());
                }
                Step::Nothing => {
                    if !unmapped {
                        crate::process::memory::drop_start_up_pages();
                        unmapped = true;
                    }
                }
                Step::Eof => {
                    // leaderrun is gone: the tree dies before our copy of the session closes.
                    self.kill_tree();
                    drop(self.session.take());
                    return;
                }
                Step::Failed => {
                    self.kill_tree();
                    return;
                }
            }
            if self.closed_in() == Some(0) {
                // The server ended the session and leaderrun did not act on it: it is frozen
                // (or its thread is held), and a standby may lead already. Act first.
                self.closed_at = None;
                self.stop_tree();
                let _ = send_on(control, Message::Stopped, None);
                say(
                    "WARN",
                    "watchdog: the server closed the lock session and leaderrun did not act; \
                     stopped COMMAND's tree",
                );
            }
            if self.freeze_in() == Some(0) {
                // Act first: the line may not get out at all.
                self.stop_tree();
                let _ = send_on(control, Message::Stopped, None);
                say(
                    "WARN",
                    "watchdog: leaderrun stopped answering while its lock was unproven; \
                     stopped COMMAND's tree",
                );
            }
        }
    }

    /// Time until the tree is stopped for a session the server closed: only while a tree runs
    /// that leaderrun has not said it is stopping (nanoseconds).
    #[inline(always)]
    fn closed_in(&self) -> Option<u64> {
        let closed = self.closed_at?;
        if self.tree == 0 || self.stopping {
            return None;
        }
        let defer = SESSION_CLOSED_DEFER.as_nanos() as u64;
        Some(closed.saturating_add(defer).saturating_sub(now_ns()))
    }

    /// Time until a freeze is declared: only while a tree runs, once the proof has run out and
    /// no heartbeat came for `stall` (nanoseconds).
    #[inline(always)]
    fn freeze_in(&self) -> Option<u64> {
        if self.tree == 0 {
            return None;
        }
        let beat_end = self.last_beat.saturating_add(self.stall);
        Some(self.proof.max(beat_end).saturating_sub(now_ns()))
    }

    #[inline(always)]
    fn handle(&mut self, control: BorrowedFd<'_>, message: Message, fd: Option<OwnedFd>) {
        match message {
            Message::Tree(pgid) => {
                // A tree was just reported: leaderrun is alive now. Heartbeats come only while
                // a tree runs, so the freeze clock starts here.
                self.tree = pgid;
                self.escaped.next_scan = 0;
                self.stopping = false;
                self.closed_at = None;
                self.last_beat = now_ns();
            }
            Message::Stopping => self.stopping = true,
            Message::Stopped => {}
            Message::Beat(proof) => {
                self.proof = proof;
                self.last_beat = now_ns();
            }
            Message::Session => {
                self.session = fd;
                self.closed_at = None;
            }
            Message::Release => {
                self.closed_at = None;
                drop(self.session.take());
                let _ = send_on(control, Message::Released, None);
            }
            Message::Released => {}
        }
    }

    /// Whether anything of the tree is left. The cgroup knows exactly (a zombie is no longer
    /// in it); without one, the process group counts, zombies included, until whoever
    /// inherited them reaps them.
    fn alive(&self) -> bool {
        match &self.cgroup {
            Some(cgroup) => cgroup.populated(),
            None => {
                self.tree != 0
                    && !matches!(killpg(Pid::from_raw(self.tree), None), Err(Errno::ESRCH))
                    && live_members(self.tree).map_or(true, |m| !m.is_empty())
            }
        }
    }

    fn signal(&mut self, sig: Signal) {
        if self.tree != 0 {
            let _ = killpg(Pid::from_raw(self.tree), sig);
        }
        self.escaped.signal(sig);
        if let Some(cgroup) = &self.cgroup {
            if sig == Signal::SIGKILL {
                cgroup.kill();
            } else {
                for pid in cgroup.pids() {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
        }
    }

    /// Waits until the tree is gone or `within` passed; true when it is gone. `killed`: the
    /// tree was sent SIGKILL (so it starts nothing new).
    fn gone_within(&mut self, within: Duration, killed: bool) -> bool {
        let deadline = boottime() + within;
        if !self.escaped.gone_by(deadline) {
            return false;
        }
        // Without a cgroup: wake at the members' exits instead of polling (with a thousand
        // standbys on the machine one scan of `/proc` takes milliseconds).
        if self.cgroup.is_none() && self.tree != 0 {
            let left = deadline.saturating_sub(boottime());
            if let Some(gone) = wait_group_exit(self.tree, left, killed) {
                return gone;
            }
        }
        // SIGKILLed processes are gone within a fraction of a millisecond as a rule: look
        // again soon, then less often (the lock waits on this, after `kill -9` of leaderrun).
        let mut pause = Duration::from_micros(100);
        while self.alive() {
            if boottime() >= deadline {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        true
    }

    /// leaderrun is gone: SIGKILL at once, wait until the tree is gone.
    fn kill_tree(&mut self) {
        self.signal(Signal::SIGKILL);
        if !self.gone_within(KILL_WAIT, true) {
            say(
                "ERROR",
                "watchdog: COMMAND's tree is still there after SIGKILL",
            );
        }
        self.tree = 0;
    }

    /// leaderrun froze: stop the tree as a demotion would.
    fn stop_tree(&mut self) {
        if self.cgroup.is_none() {
            self.escaped.scan(self.tree);
        }
        self.signal(self.stop_signal);
        self.signal(Signal::SIGCONT);
        if !self.gone_within(self.grace, false) {
            self.signal(Signal::SIGKILL);
        }
        // The killed processes are leaderrun's children: they stay zombies until it reaps
        // them, so only the cgroup can tell that they are gone.
        self.tree = 0;
    }
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
    fn spawn(&mut self, env: &[(&'static str, String)]) -> Result<Box<dyn Tree>, SpawnError> {
        if !self.watchdog.ready() {
            warn!("no watchdog runs: if leaderrun is killed, COMMAND's helpers may outlive it");
        }
        // What the watchdog said of an earlier tree is no news of this one.
        let _ = self.watchdog.stopped_the_tree();
        let tree = self.inner.spawn(env)?;
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
struct WatchedTree {
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
const HOLD_BACK: Duration = Duration::from_secs(5);

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
    /// is held back (as still running) until the supervisor stops it for the term's end that
    /// made the watchdog act, which leaderrun sees as soon as it runs again, so the exit is
    /// not taken for COMMAND's own (which would end a `--restart never` leaderrun). At most
    /// [`HOLD_BACK`].
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
                };
            }
        }
        if state.empty && self.reported {
            self.reported = false;
            self.watchdog.tree(None);
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
struct Gone;

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
