//! The controlling terminal: who owns its foreground (docs/field-notes.md#the-terminals-foreground,
//! docs/guarantees.md#the-child-process).
//!
//! When leaderrun has a controlling terminal and its process group is that terminal's
//! foreground group at start, leaderrun hands the foreground to each child's process group
//! (while its own group has it: after `bg` the shell keeps it, from later children too) and
//! takes it back when the child is gone, so Ctrl-C, Ctrl-Z and reading the terminal behave as
//! if leaderrun were not there. The terminal is `/dev/tty`, not stdin: with stdin redirected
//! (`< /dev/null`) a child that opens `/dev/tty` (an ssh or sudo prompt) must still be in the
//! foreground, or it stops on SIGTTIN. Started in the background (or without a terminal)
//! leaderrun never touches it.
//!
//! Handing the foreground over from what is then a background group raises SIGTTOU, so
//! leaderrun ignores SIGTTOU for itself; the child gets the default back before exec (unless
//! it was ignored at entry).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::fcntl::{open, OFlag};
use nix::sys::signal::{signal, SigHandler, Signal};
use nix::sys::stat::Mode;
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};
use tracing::debug;

/// A controlling terminal whose foreground leaderrun owned at start.
#[derive(Debug)]
pub struct Terminal {
    tty: OwnedFd,
    own_group: Pid,
}

impl Terminal {
    /// Claims the controlling terminal when leaderrun's group is its foreground group; `None`
    /// otherwise (no controlling terminal, or started in the background). Ignores SIGTTOU for
    /// leaderrun. The descriptor is close-on-exec: it never reaches COMMAND.
    pub fn claim() -> Option<Terminal> {
        let tty = open(
            "/dev/tty",
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let own_group = getpgrp();
        if tcgetpgrp(tty.as_fd()).ok()? != own_group {
            return None;
        }
        // SAFETY: installing SIG_IGN has no handler code to be unsafe.
        unsafe {
            let _ = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        }
        Some(Terminal { tty, own_group })
    }

    /// The terminal's descriptor, for the child to take the foreground before exec.
    pub fn fd(&self) -> RawFd {
        self.tty.as_raw_fd()
    }

    /// Whether leaderrun's own group is the foreground group now: after a resume, `fg` gave it
    /// back to us, `bg` left it with the shell.
    pub fn owns_foreground(&self) -> bool {
        tcgetpgrp(self.tty.as_fd()).is_ok_and(|g| g == self.own_group)
    }

    /// Makes `group` the foreground process group. The child also does this itself before exec
    /// (so it never reads the terminal from the background); this call covers a resume.
    pub fn give_to(&self, group: Pid) {
        if let Err(err) = tcsetpgrp(self.tty.as_fd(), group) {
            debug!(
                pgid = group.as_raw(),
                "cannot hand the terminal to the child: {err}"
            );
        }
    }

    /// Makes leaderrun's own group the foreground group again when `child_group` (a group we
    /// handed it to) has it; never takes it from the shell after `bg`.
    pub fn take_back(&self, child_group: Pid) {
        if tcgetpgrp(self.tty.as_fd()).is_ok_and(|g| g == child_group) {
            if let Err(err) = tcsetpgrp(self.tty.as_fd(), self.own_group) {
                debug!("cannot take the terminal back: {err}");
            }
        }
    }
}
