//! The watchdog: nothing of COMMAND outlives leaderrun, and the lock never moves before it is
//! dead (docs/guarantees.md#the-child-process,
//! docs/field-notes.md#pdeathsig-follows-the-forking-thread).
//!
//! # Theory of operation
//!
//! `PR_SET_PDEATHSIG` kills only COMMAND's direct child when leaderrun dies, and the kernel
//! closes leaderrun's descriptors, and with them the lock session, before it signals anyone:
//! after `kill -9` of a leader, the rest of a `sh -c 'worker & worker; wait'` tree would run on
//! beside the next leader's child. So a small helper process, the watchdog, is started before
//! the first child, in a session of its own (terminal signals and a stop of leaderrun's process
//! group do not reach it). In the run mode `main` forks it before any other thread exists and
//! the child runs the watchdog's loop at once, without an exec ([`EarlyWatchdog`]; it waits for
//! its settings, the plan, which [`Watchdog::adopt`] sends). A replacement started later, when
//! threads exist, is leaderrun's own binary exec'd as [`ARGV0`]. It holds:
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
//! grace, SIGKILL): at most 2 intervals + half an interval + the grace after the last good
//! check (the safe window, the heartbeat's stall, the grace), before the server can free the
//! lock (docs/guarantees.md#the-timing-model).
//! A freeze of the whole machine stops the watchdog too; that case is left to the fencing token.
//!
//! When leaderrun ends the session on purpose (demotion after the tree is dead, shutdown) it
//! tells the watchdog first, which closes its copy and acknowledges. If the watchdog dies,
//! leaderrun starts a new one at once and hands it what it holds (tree, session, heartbeat);
//! COMMAND is never started while no watchdog runs (see [`Watchdog::ready`]).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

mod client;
mod helper;
mod protocol;

pub use client::{use_json_logs, EarlyWatchdog, Watchdog, WatchdogPlan, WatchedSpawner};
pub use helper::main;

/// `argv[0]` of an exec'd watchdog process: how `main` recognises it, and how `ps` shows it (a
/// forked one writes it over its copy of leaderrun's arguments).
pub const ARGV0: &str = "leaderrun-watchdog";
/// How long the watchdog waits for a killed tree to be gone before it gives up on it.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long leaderrun waits for the watchdog to acknowledge that it dropped its copy of the
/// session: it answers in microseconds unless it is dead or stopped.
pub const RELEASE_WAIT: Duration = Duration::from_millis(500);

/// How long the watchdog leaves a lock session the server closed to leaderrun before it stops
/// the tree itself: a leaderrun that runs sees the same end of file and says it is stopping
/// (as a rule within a millisecond), so that the tree gets one stop signal, not two.
pub const SESSION_CLOSED_DEFER: Duration = Duration::from_millis(100);

/// Whether this process was started as the watchdog (`argv[0]` is [`ARGV0`]).
pub fn is_watchdog() -> bool {
    std::env::args_os().next().is_some_and(|a| a == ARGV0)
}

/// A pidfd for `pid`, `None` where the kernel has none (before 5.3) or it is gone.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: the kernel just gave us this descriptor.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}
