//! A process group's live members, and waiting for them to exit: what the watchdog and a
//! [`crate::process::child::Child`] dropped before its tree was seen empty wait on after a
//! signal, without reaping anything (the zombies are their parent's to reap).

use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::killpg;
use nix::unistd::Pid;

use crate::elector::boottime;

/// The members of process group `pgid` that are not zombies (`None` without `/proc`, or with
/// another PID namespace's: then every member counts). Once leaderrun is gone its tree's zombies belong to whoever
/// inherited them, which may reap them late; they run nothing.
pub(crate) fn live_members(pgid: i32) -> Option<Vec<i32>> {
    // Another namespace's procfs lists pids that are not ours: none would match.
    if !crate::process::procfs::own() {
        return None;
    }
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(
        dir.flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| is_live_member(pid, pgid))
            .collect(),
    )
}

/// Whether `pid` is a member of process group `pgid` and not a zombie.
pub(crate) fn is_live_member(pid: i32, pgid: i32) -> bool {
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
pub(crate) fn wait_group_exit(pgid: i32, within: Duration, killed: bool) -> Option<bool> {
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
pub(crate) fn wait_exits(pgid: i32, members: &[i32], deadline: Duration) -> Option<bool> {
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

/// Whether `pid` is a process that is not a zombie (a pid that is gone is not).
pub(crate) fn is_live(pid: i32) -> bool {
    // Where /proc/PID is another process (another namespace's procfs), a zombie counts.
    if !crate::process::procfs::own() {
        return nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok();
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !matches!(rest.split(' ').next(), Some("Z") | Some("X")))
    })
}
