//! The controlling terminal: who owns its foreground (docs/field-notes.md#the-terminals-foreground,
//! docs/guarantees.md#the-child-process).
//!
//! When leaderrun has a controlling terminal and its process group is that terminal's
//! foreground group at start, leaderrun hands the foreground to each child's process group
//! (while its own group has it: after `bg` the shell keeps it, from later children too) and
//! takes it back when the child is gone, so Ctrl-C, Ctrl-Z and reading the terminal behave as
//! if leaderrun were not there. The terminal is `/dev/tty`, not stdin: with stdin redirected
//! (`< /dev/null`) a child that opens `/dev/tty` (an ssh or sudo prompt) must still be in the
//! foreground, or it stops on SIGTTIN. Started in the background, leaderrun hands it to no
//! child until the shell gives leaderrun's group the foreground (`fg`): a child that reads the
//! terminal before stops leaderrun with it, as a shell's background job stops, and `fg`
//! continues both with the child in the foreground. Without a controlling terminal leaderrun
//! never touches one.
//!
//! In a pipeline (`leaderrun -- report | less`: stdout a pipe that another process of
//! leaderrun's own group reads), the command after leaderrun may be a pager that reads the
//! terminal itself: a child handed the foreground would leave it stopped on SIGTTIN, and the
//! job with it. There a child gets the foreground only once it asks for it, by stopping on
//! SIGTTIN or SIGTTOU (a `sudo` or `ssh` prompt), and keeps it for its life; until then Ctrl-C
//! and Ctrl-Z reach leaderrun's group, and leaderrun passes them on. A pipe read by a process
//! outside the group (a log collector, a test harness) is no pipeline of the job's.
//!
//! The terminal's modes are kept as a job-control shell keeps them for its job: a child that
//! died of a signal (killed on a demotion, a shutdown, a `--timeout`, SIGKILL at the grace) may
//! have left the terminal raw or without echo, and is not there to undo it; the shell would put
//! its modes back, but it sees leaderrun exit with a status, or not at all while leaderrun leads
//! on. So leaderrun puts back the modes it found (`Terminal::settle_modes`) before the next
//! child starts or the shell reads again; a child that exited on its own keeps what it set
//! (`stty` as COMMAND), as in a shell.
//!
//! Handing the foreground over from what is then a background group raises SIGTTOU, so
//! leaderrun ignores SIGTTOU for itself; the child gets the default back before exec (unless
//! it was ignored at entry).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::fcntl::{open, OFlag};
use nix::sys::signal::{signal, SigHandler, Signal};
use nix::sys::stat::Mode;
use nix::sys::termios::{tcgetattr, tcsetattr, SetArg, Termios};
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};
use tracing::debug;

/// A controlling terminal whose foreground leaderrun owned at start.
#[derive(Debug)]
pub struct Terminal {
    tty: OwnedFd,
    own_group: Pid,
    /// What [`Terminal::owns_foreground`] found last (at first: the claim's answer).
    in_foreground: std::sync::atomic::AtomicBool,
    /// The modes to put back after a child that died of a signal: read at the claim, and
    /// again after each child that exited on its own (`None`: they could not be read).
    modes: std::sync::Mutex<Option<Termios>>,
    /// Whether the current child started in a pipeline ([`Terminal::for_new_child`]): it gets
    /// the foreground only once it asks.
    pipeline: std::sync::atomic::AtomicBool,
    /// Whether the current child asked for the foreground (stopped on SIGTTIN or SIGTTOU).
    child_asked: std::sync::atomic::AtomicBool,
}

impl Terminal {
    /// Claims the controlling terminal; `None` without one. Started in the background,
    /// leaderrun hands it to no child until the shell gives it leaderrun's group (`fg`).
    /// Ignores SIGTTOU for leaderrun. The descriptor is close-on-exec: it never reaches
    /// COMMAND.
    pub fn claim() -> Option<Terminal> {
        let tty = open(
            "/dev/tty",
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let own_group = getpgrp();
        let foreground = tcgetpgrp(tty.as_fd()).ok()?;
        // 0: the group is not in this PID namespace (leaderrun as the init of one that
        // `unshare -fp` made, on the caller's terminal), or the terminal has none. Nothing
        // then tells leaderrun's job from another, and taking the terminal back would fail:
        // it is left alone, and Ctrl-C reaches leaderrun, which passes it on.
        if own_group.as_raw() == 0 || foreground.as_raw() == 0 {
            return None;
        }
        let in_foreground = foreground == own_group;
        // SAFETY: installing SIG_IGN has no handler code to be unsafe.
        unsafe {
            let _ = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        }
        let modes = tcgetattr(tty.as_fd()).ok();
        Some(Terminal {
            modes: std::sync::Mutex::new(modes),
            pipeline: std::sync::atomic::AtomicBool::new(false),
            child_asked: std::sync::atomic::AtomicBool::new(false),
            tty,
            own_group,
            in_foreground: std::sync::atomic::AtomicBool::new(in_foreground),
        })
    }

    /// The terminal's descriptor for a child about to start, to take the foreground before
    /// exec: while leaderrun's group has the foreground, and not in a pipeline (the module's
    /// docs), where the new child first has to ask for it. Looked at for each child, not at the
    /// claim: the shell may start the pipeline's next command after leaderrun's exec.
    pub fn for_new_child(&self) -> Option<RawFd> {
        use std::sync::atomic::Ordering::Relaxed;
        self.child_asked.store(false, Relaxed);
        let owns = self.owns_foreground();
        // Looked at in the background too: `fg` of `leaderrun … | less &` hands the running
        // child the terminal (the reaper's poll, a resume) unless it is in a pipeline, and a
        // child started in the background was taken for none, which left the pager stopped
        // on SIGTTIN for good.
        let pipeline = stdout_read_by_own_group();
        self.pipeline.store(pipeline, Relaxed);
        (owns && !pipeline).then(|| self.tty.as_raw_fd())
    }

    /// Whether the current child is to have the foreground whenever leaderrun's group has it
    /// (a resume, `fg`): always, but in a pipeline only once it asked
    /// ([`Terminal::give_on_request`]).
    pub fn child_may_have_it(&self) -> bool {
        !self.pipeline.load(std::sync::atomic::Ordering::Relaxed)
            || self.child_asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands the foreground to the current child's `group`, which stopped on SIGTTIN or
    /// SIGTTOU (it reads or sets the terminal), while leaderrun's group has it; from then on
    /// it has the foreground for its life ([`Terminal::child_may_have_it`]). Whether it worked.
    pub fn give_on_request(&self, group: Pid) -> bool {
        if !self.owns_foreground() || !self.give_to(group) {
            return false;
        }
        self.child_asked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Whether leaderrun's own group is the foreground group now: after a resume, `fg` gave it
    /// back to us, `bg` left it with the shell.
    pub fn owns_foreground(&self) -> bool {
        // A terminal that cannot be asked (hung up) keeps the last answer, for the hangup's
        // own event to decide on.
        let Ok(foreground) = tcgetpgrp(self.tty.as_fd()) else {
            return false;
        };
        let owns = foreground == self.own_group;
        self.in_foreground
            .store(owns, std::sync::atomic::Ordering::Relaxed);
        owns
    }

    /// Whether leaderrun's job (its group, or the child's it handed the terminal to) was in
    /// the foreground when last looked at: at the claim, at each spawn, after each resume
    /// from job control and each SIGCONT, and once a second ([`Terminal::look`]). A hung-up
    /// terminal can no longer be asked.
    pub fn job_in_foreground(&self) -> bool {
        self.in_foreground
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes `group` the foreground process group. The child also does this itself before exec
    /// (so it never reads the terminal from the background); this call covers a resume and a
    /// `fg`. Whether it worked.
    pub fn give_to(&self, group: Pid) -> bool {
        match tcsetpgrp(self.tty.as_fd(), group) {
            Ok(()) => true,
            Err(err) => {
                debug!(
                    pgid = group.as_raw(),
                    "cannot hand the terminal to the child: {err}"
                );
                false
            }
        }
    }

    /// Notes whether leaderrun's job, its own group or `child`'s (the group it hands the
    /// terminal to), is the foreground now, for a later hangup
    /// ([`Terminal::job_in_foreground`]): `fg` of a job started with `&` changes that without
    /// any spawn or stop of leaderrun's, and without a signal when the job runs. Called after
    /// a SIGCONT and once a second. Whether leaderrun's own group has it, so that the child may
    /// be handed it.
    pub fn look(&self, child: Option<Pid>) -> bool {
        // A hung-up terminal cannot be asked: the last answer stands, for the hangup's own
        // event (which may come after this look) to decide on.
        let Ok(foreground) = tcgetpgrp(self.tty.as_fd()) else {
            return false;
        };
        let own = foreground == self.own_group;
        // A group the child's tree made and handed the terminal to (COMMAND a job-control
        // shell: `bash -i`, `sh -c 'set -m; …'`) is the job's too.
        let job = own
            || child == Some(foreground)
            || (child.is_some() && group_is_in_own_tree(foreground));
        self.in_foreground
            .store(job, std::sync::atomic::Ordering::Relaxed);
        own
    }

    /// Makes leaderrun's own group the foreground group again when `child_group` (a group we
    /// handed it to) has it, or, while leaderrun's job had the terminal, a group the child's
    /// tree handed it on to (COMMAND a job-control shell), alive or gone with the tree; never
    /// takes it from the shell after `bg`. Left with a gone group, the terminal's Ctrl-C and
    /// Ctrl-Z would reach nobody and the next term's child would start in the background.
    /// Whether it took it back (the job's group had it, and handing it back worked).
    pub fn take_back(&self, child_group: Pid) -> bool {
        let Ok(foreground) = tcgetpgrp(self.tty.as_fd()) else {
            return false;
        };
        let ours = foreground == child_group
            || (foreground != self.own_group
                && self.job_in_foreground()
                && (group_is_gone(foreground) || group_is_in_own_tree(foreground)));
        if !ours {
            return false;
        }
        match tcsetpgrp(self.tty.as_fd(), self.own_group) {
            Ok(()) => {
                self.in_foreground
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                true
            }
            Err(err) => {
                debug!("cannot take the terminal back: {err}");
                false
            }
        }
    }

    /// Once a child that had the foreground is gone, does with the terminal's modes what a
    /// job-control shell does when its foreground job ends: after one that died of a signal
    /// (`killed`), which may have left the terminal raw or without echo, puts back the modes
    /// last kept; after one that exited on its own, keeps its modes as they are now. Never
    /// waits for output to drain (`TCSANOW`): a stalled terminal must not hold leaderrun.
    pub fn settle_modes(&self, killed: bool) {
        let mut modes = self
            .modes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !killed {
            if let Ok(now) = tcgetattr(self.tty.as_fd()) {
                *modes = Some(now);
            }
            return;
        }
        if let Some(kept) = modes.as_ref() {
            if let Err(err) = tcsetattr(self.tty.as_fd(), SetArg::TCSANOW, kept) {
                debug!("cannot put the terminal's modes back: {err}");
            }
        }
    }

    /// Watches the terminal for its hangup (its window closed, its ssh session ended): the
    /// kernel then sends SIGHUP to the foreground group (COMMAND's) and to the session's
    /// leader (the shell), which need not pass it on to leaderrun's job before it dies.
    /// Registered for errors only: input on the terminal does not wake leaderrun. `None`
    /// when the descriptor cannot be watched. Call within the runtime.
    pub fn watch_hangup(&self) -> Option<Hangup> {
        let fd = self.tty.try_clone().ok()?;
        // SAFETY: an `OwnedFd` stays open, and the same descriptor, until the watch drops it.
        unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::ERROR) }
            .ok()
            .map(Hangup)
    }
}

/// Whether stdout is a pipe that another process of leaderrun's own group holds open: the
/// command after leaderrun in a shell's pipeline, which reads it. Any of its descriptors, not
/// only its stdin: `read < /dev/tty` in a shell moves stdin aside for the read. A scan of every
/// process (and the descriptors of the group's): called only at a spawn, with a terminal and
/// stdout a pipe. leaderrun's parent is no command after it: a parent that reads leaderrun's
/// stdout captures it (`x=$(leaderrun …)`, popen(3), a harness's `subprocess` with a pipe) and
/// waits on the pipe, not on the terminal, so the child gets the foreground as without a pipe.
fn stdout_read_by_own_group() -> bool {
    let Ok(ours) = std::fs::read_link("/proc/self/fd/1") else {
        return false;
    };
    if !ours.as_os_str().as_encoded_bytes().starts_with(b"pipe:") {
        return false;
    }
    let me = std::process::id() as i32;
    let parent = std::os::unix::process::parent_id() as i32;
    let group = getpgrp().as_raw();
    all_pids()
        // leaderrun's own children (the watchdog) are no command of the pipeline, nor is the
        // parent that captures its output.
        .filter(|&pid| {
            pid != me
                && pid != parent
                && parent_and_group(pid).is_some_and(|(p, g)| g == group && p != me)
        })
        .any(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == ours))
        })
}

/// Whether no process is left in `group` (`kill(-group, 0)` finds none).
fn group_is_gone(group: Pid) -> bool {
    nix::sys::signal::killpg(group, None) == Err(nix::errno::Errno::ESRCH)
}

/// (parent, process group) of the process `pid`, from `/proc`.
fn parent_and_group(pid: i32) -> Option<(i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = text.rsplit_once(") ")?.1.split(' ').skip(1);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The pids `/proc` lists (empty when it cannot be read).
fn all_pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// Whether a member of `group` descends from leaderrun (orphans of COMMAND are re-parented to
/// it), read from `/proc`: the group is one COMMAND's tree made. A scan of every process:
/// called only when the foreground is neither leaderrun's group nor the child's.
fn group_is_in_own_tree(group: Pid) -> bool {
    let me = std::process::id() as i32;
    let descends = |mut pid: i32| {
        // Bounded: a parent chain read while processes come and go may loop.
        for _ in 0..256 {
            let Some((parent, _)) = parent_and_group(pid) else {
                return false;
            };
            if parent == me {
                return true;
            }
            if parent <= 1 {
                return false;
            }
            pid = parent;
        }
        false
    };
    // The group's leader is usually there to ask first.
    if parent_and_group(group.as_raw()).is_some_and(|(_, g)| g == group.as_raw()) {
        return descends(group.as_raw());
    }
    all_pids()
        .filter(|&pid| parent_and_group(pid).is_some_and(|(_, g)| g == group.as_raw()))
        .any(descends)
}

/// Stops the other members of leaderrun's process group (the rest of a pipeline:
/// `leaderrun -- job | less`) with `sig`, the signal that stopped the child: the terminal's
/// Ctrl-Z, or the kernel's SIGTTIN, reaches a whole job, but while the child's group has the
/// terminal only it gets the signal. A shell shows a job stopped only once none of its
/// processes runs: without this, leaderrun stopped itself and the shell waited on for the
/// rest of the pipeline, the prompt never came back, and the term ran out while stopped.
/// leaderrun and its own children (the watchdog, a PID namespace's init) are left out.
pub fn stop_rest_of_own_group(sig: nix::sys::signal::Signal) {
    let me = std::process::id() as i32;
    let group = getpgrp().as_raw();
    for pid in all_pids().filter(|&pid| pid != me) {
        if parent_and_group(pid).is_some_and(|(parent, g)| g == group && parent != me) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
        }
    }
}

/// Whether leaderrun's process group is orphaned (POSIX: no member has a parent in another
/// group of the same session), read from `/proc`: then no shell can continue it, and a job
/// control stop would last for good (the kernel discards SIGTSTP, SIGTTIN and SIGTTOU for such a
/// group, but not the SIGSTOP that [`suspend_self`](crate::process::signals::suspend_self)
/// raises). `false` when `/proc` cannot be read. A scan of every process: called only when a
/// child stopped.
pub fn own_group_is_orphaned() -> bool {
    let group = getpgrp().as_raw();
    let Ok(session) = nix::unistd::getsid(None) else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    // (parent, group, session) of a process.
    let stat = |pid: &str| -> Option<(i32, i32, i32)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = text.rsplit_once(") ")?.1.split(' ').skip(1);
        let parent = fields.next()?.parse().ok()?;
        let group = fields.next()?.parse().ok()?;
        let session = fields.next()?.parse().ok()?;
        Some((parent, group, session))
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Some((parent, member_group, _)) = stat(pid) else {
            continue;
        };
        if member_group != group {
            continue;
        }
        if let Some((_, parent_group, parent_session)) = stat(&parent.to_string()) {
            if parent_group != group && parent_session == session.as_raw() {
                return false;
            }
        }
    }
    true
}

/// A watch on the terminal for its hangup ([`Terminal::watch_hangup`]).
#[derive(Debug)]
pub struct Hangup(tokio::io::unix::AsyncFd<OwnedFd>);

/// Resolves once the watched terminal has hung up (a hung-up terminal reports `POLLERR`);
/// pending for ever without a watch.
pub async fn hung_up(watch: Option<&Hangup>) {
    match watch {
        Some(Hangup(fd)) => {
            let _ = fd.ready(tokio::io::Interest::ERROR).await;
        }
        None => std::future::pending().await,
    }
}
