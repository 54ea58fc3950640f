//! The controlling terminal: who owns its foreground (FIELD-NOTES child 9, contract §5).
//!
//! When stdin is a terminal and leaderrun's process group is the terminal's foreground group at
//! start, leaderrun hands the foreground to each child's process group and takes it back when
//! the child is gone, so Ctrl-C, Ctrl-Z and reading stdin behave as if leaderrun were not there.
//! Started in the background (or without a terminal) it never touches the terminal.
//!
//! Handing the foreground over from what is then a background group raises SIGTTOU, so
//! leaderrun ignores SIGTTOU for itself; the child gets the default back before exec.

use std::os::fd::BorrowedFd;

use nix::sys::signal::{signal, SigHandler, Signal};
use nix::unistd::{getpgrp, isatty, tcgetpgrp, tcsetpgrp, Pid};
use tracing::debug;

/// A terminal whose foreground leaderrun owned at start.
#[derive(Debug)]
pub struct Terminal {
    own_group: Pid,
}

fn stdin() -> BorrowedFd<'static> {
    // SAFETY: fd 0 stays open for the life of the process (we never close it).
    unsafe { BorrowedFd::borrow_raw(0) }
}

impl Terminal {
    /// Claims the terminal on stdin when leaderrun's group is its foreground group; `None`
    /// otherwise (no terminal, or started in the background). Ignores SIGTTOU for leaderrun.
    pub fn claim() -> Option<Terminal> {
        if !isatty(stdin()).unwrap_or(false) {
            return None;
        }
        let own_group = getpgrp();
        if tcgetpgrp(stdin()).ok()? != own_group {
            return None;
        }
        // SAFETY: installing SIG_IGN has no handler code to be unsafe.
        unsafe {
            let _ = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        }
        Some(Terminal { own_group })
    }

    /// Makes `group` the foreground process group. The child also does this itself before exec
    /// (so it never reads the terminal from the background); this call covers a resume.
    pub fn give_to(&self, group: Pid) {
        if let Err(err) = tcsetpgrp(stdin(), group) {
            debug!(
                pgid = group.as_raw(),
                "cannot hand the terminal to the child: {err}"
            );
        }
    }

    /// Makes leaderrun's own group the foreground group again.
    pub fn take_back(&self) {
        if let Err(err) = tcsetpgrp(stdin(), self.own_group) {
            debug!("cannot take the terminal back: {err}");
        }
    }
}
