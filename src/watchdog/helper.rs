//! The watchdog process itself ([`main`]): its loop ([`Guard`]) over the pair's messages, the
//! tree's process group and the escape tracking of descendants that left it, written to touch
//! few pages ([`write_now`], no tracing subscriber).
//!
//! One file, although long: the loop, the scans of the tree's group and the escape tracking are
//! one state machine over one state ([`Guard`]), and none of it runs outside the watchdog
//! process.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::elector::boottime;
use crate::process::cgroup::Cgroup;
use crate::process::group::{live_members, wait_group_exit};

use super::protocol::*;
use super::{pidfd_open, KILL_WAIT, SESSION_CLOSED_DEFER};

/// One log line on stderr in leaderrun's format (`--log-format`): the watchdog has no tracing
/// subscriber, so that its loop stays small; its lines are rare, and written without waiting
/// ([`write_now`]). `message` is a literal, so no text from outside (COMMAND, the
/// environment, the server) reaches a line: there is nothing to escape, and no newline can
/// split one (the text format of leaderrun's own lines escapes, see `cli::logging`).
#[cold]
pub(super) fn say(level: &str, message: &'static str) {
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
pub(super) static WATCHDOG_JSON: AtomicBool = AtomicBool::new(false);

/// The watchdog process started by exec (a replacement, started while leaderrun has threads):
/// `leaderrun-watchdog GRACE_MS STALL_MS STOP_SIGNAL CGROUP|- text|json LEADERRUN_PID`, its end
/// of the pair on descriptor 3. Runs until leaderrun is gone.
pub fn main() -> ExitCode {
    become_watchdog();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The tree is walked from leaderrun's children only while leaderrun is our parent: had it
    // died before we got here, our parent would be init, whose children are not the tree's.
    let root = args
        .get(5)
        .and_then(|a| a.parse::<i32>().ok())
        .filter(|&pid| pid == nix::unistd::getppid().as_raw())
        .unwrap_or(0);
    // SAFETY: leaderrun put our end of the pair on descriptor 3 before exec.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    guard_for(&args, root).run(control.as_fd());
    ExitCode::SUCCESS
}

/// The watchdog forked at leaderrun's start, before any other thread existed
/// ([`super::EarlyWatchdog::fork`]): the same loop as [`main`], without an exec. `control` is its
/// end of the pair, `leaderrun` the pid that forked it. It waits for its settings (the plan,
/// the first message on the pair, sent once leaderrun has read its own) and then guards; it
/// ends with `_exit`, so nothing of leaderrun's start-up state (stdio buffers, exit handlers)
/// runs twice. Never returns.
pub(super) fn forked_main(control: OwnedFd, leaderrun: i32) -> ! {
    become_watchdog();
    // SAFETY: an empty mask (leaderrun blocked every signal across the fork; an exec'd
    // watchdog starts with none blocked, as std's spawn leaves it), and /dev/null on stdin and
    // stdout, as the exec'd watchdog has them: nothing waits on output, and a pipe on
    // leaderrun's stdout is not held open by the watchdog.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > 1 {
                libc::close(null);
            }
        }
    }
    show_as_watchdog();
    let root = if nix::unistd::getppid().as_raw() == leaderrun {
        leaderrun
    } else {
        0
    };
    if let Some(args) = receive_plan(control.as_fd()) {
        guard_for(&args, root).run(control.as_fd());
    }
    // SAFETY: _exit ends the process at once, running nothing of leaderrun's.
    unsafe { libc::_exit(0) }
}

/// Waits for the plan message ([`PLAN`]) and returns its arguments (those of [`main`] but the
/// last); `None` at end of file (leaderrun is gone before it sent one: there is nothing to
/// guard) or when the pair fails.
fn receive_plan(control: BorrowedFd<'_>) -> Option<Vec<String>> {
    let mut buf = vec![0u8; 8192];
    loop {
        // SAFETY: recv into a live buffer of the length given.
        let n = unsafe { libc::recv(control.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            if Errno::last() == Errno::EINTR {
                continue;
            }
            return None;
        }
        let n = n as usize;
        if n == 0 {
            return None;
        }
        if buf[0] != PLAN {
            continue;
        }
        return Some(
            buf[1..n]
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        );
    }
}

/// The dispositions and name of a watchdog, exec'd or forked.
fn become_watchdog() {
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
        // A line written to a stderr file at `RLIMIT_FSIZE` raises it, and its default action
        // would end the watchdog just after it stopped a frozen leaderrun's tree; ignored, the
        // write fails with EFBIG and the line is dropped like any other.
        libc::SIGXFSZ,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // `/proc/PID/comm` says what it is, not "exe" or "leaderrun", and without the word
    // "leaderrun": `pkill -9 leaderrun` and `killall leaderrun` match that name, and a
    // watchdog killed with leaderrun cannot kill the tree. `ps` shows its argv[0],
    // `leaderrun-watchdog` (for a forked one, see [`show_as_watchdog`]).
    // SAFETY: PR_SET_NAME with a NUL-terminated name of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"lr-watchdog".as_ptr(), 0, 0, 0);
    }
    set_policy();
}

/// The watchdog's scheduling. Under the normal policy, SCHED_BATCH: a fair share of the CPU,
/// but no preemption of the process that woke it (every message leaderrun sends wakes the
/// watchdog, and on a shared core each one took the core from leaderrun at once). Under a
/// real-time policy (`chrt -f`), which COMMAND inherits too, one priority above leaderrun's:
/// a COMMAND that spins at that priority on every CPU it may use starves leaderrun's checks,
/// and a watchdog of a lower policy with them (a SCHED_BATCH one ran only in the kernel's
/// real-time throttling gap, 50 ms a second, after the server had freed the lock); above it,
/// the watchdog still stops the tree when the proof runs out
/// (docs/process-model.md#the-watchdog). Best effort: a failure leaves the policy as it is.
fn set_policy() {
    // SAFETY: reads and sets this process's own policy with valid sched_params.
    unsafe {
        let policy = libc::sched_getscheduler(0);
        if policy < 0 {
            return;
        }
        match policy & !libc::SCHED_RESET_ON_FORK {
            libc::SCHED_OTHER => {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
            }
            rt @ (libc::SCHED_FIFO | libc::SCHED_RR) => {
                let mut param = libc::sched_param { sched_priority: 0 };
                if libc::sched_getparam(0, &mut param) == 0
                    && param.sched_priority < libc::sched_get_priority_max(rt)
                {
                    param.sched_priority += 1;
                    libc::sched_setscheduler(0, policy, &param);
                }
            }
            _ => {}
        }
    }
}

/// Makes a forked watchdog's command line (`/proc/PID/cmdline`, what `ps` and `pgrep -f` show)
/// read `leaderrun-watchdog`, as an exec'd one's does, instead of a copy of leaderrun's: its
/// argument strings are overwritten in place (the area `/proc/self/stat` names, fields 48 and
/// 49), truncated where they were shorter, the rest zeroed. A `--dsn` with a password is no
/// longer shown twice. The area is this process's own copy (written after the fork).
fn show_as_watchdog() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return;
    };
    // `rest` starts at field 3 (state); arg_start and arg_end are fields 48 and 49.
    let mut fields = rest.split_ascii_whitespace().skip(45);
    let (Some(Ok(start)), Some(Ok(end))) = (
        fields.next().map(str::parse::<usize>),
        fields.next().map(str::parse::<usize>),
    ) else {
        return;
    };
    if start == 0 || end <= start {
        return;
    }
    let name = super::ARGV0.as_bytes();
    let len = end - start;
    // SAFETY: [start, end) is this process's argument area (on its stack, writable), which
    // nothing reads after this but the kernel for /proc/PID/cmdline.
    unsafe {
        let area = std::slice::from_raw_parts_mut(start as *mut u8, len);
        area.fill(0);
        let n = name.len().min(len.saturating_sub(1));
        area[..n].copy_from_slice(&name[..n]);
    }
}

/// The watchdog's state from its arguments (see [`main`]) and leaderrun's pid (`root`, 0: not
/// our parent any more).
fn guard_for(args: &[String], root: i32) -> Guard {
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
    Guard {
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
    }
}

/// The boottime clock ([`boottime`]) in nanoseconds, for the watchdog's loop. This and
/// [`next_message`] call libc directly and are inlined into [`Guard::run`], so the loop that
/// runs between heartbeats touches few pages of the binary (see
/// [`crate::process::memory::drop_start_up_pages`]).
#[inline(always)]
pub(super) fn now_ns() -> u64 {
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
pub(super) fn write_now(line: &str) {
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
pub(super) enum Step {
    /// The server closed the lock session (end of file or an error on the watched copy).
    SessionClosed,
    /// A message, the descriptor that came with it, and its sender's pid (`SCM_CREDENTIALS`,
    /// as this PID namespace sees it; `None` without them).
    Message(Message, Option<OwnedFd>, Option<i32>),
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
pub(super) fn next_message(fd: RawFd, within_ns: u64, session: RawFd) -> Step {
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
    // Room for the sender's credentials (every datagram has them: `SO_PASSCRED`) and a
    // control message with one descriptor (as `cmsg_space!(libc::ucred, [RawFd; 1])`), aligned
    // for `cmsghdr`; more descriptors than that are closed by the kernel.
    let mut space = [0u64; 8];
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
    let mut sender = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled; each SCM_RIGHTS entry
    // holds descriptors the kernel just gave us, an SCM_CREDENTIALS entry one ucred.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
                && (*cmsg).cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as usize
            {
                let creds = libc::CMSG_DATA(cmsg).cast::<libc::ucred>().read_unaligned();
                // 0: a sender outside this PID namespace, which names no process here.
                sender = (creds.pid > 0).then_some(creds.pid);
            }
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
        Some(message) => Step::Message(message, attached, sender),
        None => Step::Nothing,
    }
}

/// How long the watchdog's pair must be quiet before it gives back its start-up pages: 50 ms.
pub(super) const QUIET_NS: u64 = 50_000_000;

/// The watchdog's state (times in boottime nanoseconds).
pub(super) struct Guard {
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
pub(super) const ESCAPE_SCAN_NS: u64 = 25_000_000;

/// Children of `pid`'s threads, read from `/proc/PID/task/*/children` (Linux 3.5 with
/// `CONFIG_PROC_CHILDREN`); nothing when that cannot be read.
pub(super) fn children_of(pid: i32, out: &mut Vec<i32>) {
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
pub(super) fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Sends `sig` through a pidfd (Linux 5.1): never to a process that reused the pid.
pub(super) fn pidfd_signal(pidfd: &OwnedFd, sig: Signal) {
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
pub(super) struct Escaped {
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
    /// that escaped: outside `cgroup` when there is one (whose members `cgroup.kill` reaches:
    /// a pidfd for each would only fill the descriptor table), whatever its process group
    /// (one that left the cgroup alone is reached by the group's signals, but its exit is
    /// waited for here); else outside process group `tree`. Forgets those that exited.
    fn scan(&mut self, tree: i32, cgroup: Option<&Cgroup>) {
        self.next_scan = now_ns().saturating_add(ESCAPE_SCAN_NS);
        self.known.retain(|(_, pidfd)| !exited(pidfd));
        // A procfs of another PID namespace names other processes by our pids: `/proc/1`
        // would be the machine's init, not leaderrun as PID 1 of a namespace.
        if self.root == 0
            || nix::unistd::getppid().as_raw() != self.root
            || !crate::process::procfs::own()
        {
            return;
        }
        let members = |c: &Cgroup| -> Vec<i32> { c.pids().into_iter().map(Pid::as_raw).collect() };
        let first = cgroup.map(members);
        let mut candidates = Vec::new();
        let mut stack = vec![self.root];
        let mut seen = std::collections::HashSet::new();
        while let Some(pid) = stack.pop() {
            let mut children = Vec::new();
            children_of(pid, &mut children);
            for child in children {
                if child == self.me || !seen.insert(child) {
                    continue;
                }
                // What leaderrun was handed at start (`sidecar & exec leaderrun`) is not
                // COMMAND's, nor is what runs below it.
                if pid == self.root && crate::process::inherited::is_inherited(child) {
                    continue;
                }
                stack.push(child);
                let outside = match &first {
                    Some(members) => !members.contains(&child),
                    None => nix::unistd::getpgid(Some(Pid::from_raw(child)))
                        .is_ok_and(|g| g.as_raw() != tree),
                };
                if outside {
                    candidates.push(child);
                }
            }
        }
        // A process forked after the members were read is in the cgroup but not in that
        // list: read it again before taking a pidfd for each.
        if let Some(again) = cgroup.filter(|_| !candidates.is_empty()).map(members) {
            candidates.retain(|pid| !again.contains(pid));
        }
        for child in candidates {
            self.add(child);
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
            // Also with a cgroup: a descendant may leave it (root may write any
            // cgroup.procs), and only this walk finds it then.
            {
                if let Some(scan) = self.escaped.scan_in(self.tree) {
                    let next = if scan == 0 {
                        self.escaped.scan(self.tree, self.cgroup.as_ref());
                        ESCAPE_SCAN_NS
                    } else {
                        scan
                    };
                    wait = wait.min(next);
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
                Step::Message(message, fd, sender) => self.handle(control, message, fd, sender),
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
                // Said before the stop signal: leaderrun, once it runs again, must find this
                // in the pair before it can see the tree's end, or it takes that end for
                // COMMAND's own exit (and a `--restart never` leaderrun would exit with it).
                let _ = send_on(control, Message::Stopped, None);
                self.stop_tree();
                say(
                    "WARN",
                    "watchdog: the server closed the lock session and leaderrun did not act; \
                     stopped COMMAND's tree",
                );
            }
            if self.freeze_in() == Some(0) {
                // Act first: the line may not get out at all. The message goes before the
                // stop signal, as above.
                let _ = send_on(control, Message::Stopped, None);
                self.stop_tree();
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
    fn handle(
        &mut self,
        control: BorrowedFd<'_>,
        message: Message,
        fd: Option<OwnedFd>,
        sender: Option<i32>,
    ) {
        let announced = matches!((message, sender), (Message::Announce, Some(_)));
        let message = match (message, sender) {
            // The tree's leader itself, before its exec: its group is the tree.
            (Message::Announce, Some(pid)) => Message::Tree(pid),
            (message, _) => message,
        };
        match message {
            Message::Tree(pgid) => {
                // A tree was just reported: leaderrun is alive now (or its spawn is under way:
                // the tree's own announcement, sent inside the safe window, so the clock moves
                // by at most the stall). Heartbeats come only while a tree runs, so the freeze
                // clock starts here.
                if pgid != self.tree {
                    // A tree that announced itself before its exec has nothing outside its
                    // group yet: its first walk is one period away (a walk now would only
                    // compete with COMMAND's start for the CPU). One reported by leaderrun
                    // alone (this watchdog replaces one that died) may have: walked now.
                    self.escaped.next_scan = if announced {
                        now_ns().saturating_add(ESCAPE_SCAN_NS)
                    } else {
                        0
                    };
                }
                self.tree = pgid;
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
            // Without its sender's pid it names nothing; leaderrun's report follows.
            Message::Released | Message::Announce => {}
        }
    }

    /// Whether anything of the tree is left: a live member of its process group (zombies do
    /// not count: the killed processes are leaderrun's children, which a frozen leaderrun
    /// does not reap), or any member of its cgroup (a zombie is no longer in one). Both,
    /// with a cgroup: a process may leave the cgroup and stay in the group (root may write
    /// any `cgroup.procs`, as `systemd-run --scope` does), or the group and stay in the
    /// cgroup (`setsid`).
    fn alive(&self) -> bool {
        let group = self.tree != 0
            && !matches!(killpg(Pid::from_raw(self.tree), None), Err(Errno::ESRCH))
            && live_members(self.tree).map_or(true, |m| !m.is_empty());
        group || self.cgroup.as_ref().is_some_and(Cgroup::populated)
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
        // Wake at the group's exits instead of polling (with a thousand standbys on the
        // machine one scan of `/proc` takes milliseconds); a cgroup's members outside the
        // group are looked at below.
        let mut group_gone = self.tree == 0;
        if self.tree != 0 {
            let left = deadline.saturating_sub(boottime());
            match wait_group_exit(self.tree, left, killed) {
                Some(false) => return false,
                Some(true) if self.cgroup.is_none() => return true,
                Some(true) => group_gone = true,
                None => {}
            }
        }
        // SIGKILLed processes are gone within a fraction of a millisecond as a rule: look
        // again soon, then less often (the lock waits on this, after `kill -9` of leaderrun).
        // Once the group was seen gone only the cgroup is left to look at: a scan of `/proc`
        // for the group at every turn would keep the watchdog busy on a crowded machine.
        let mut pause = Duration::from_micros(100);
        let left = |guard: &Self| match (group_gone, &guard.cgroup) {
            (true, Some(cgroup)) => cgroup.populated(),
            _ => guard.alive(),
        };
        while left(self) {
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
        self.escaped.scan(self.tree, self.cgroup.as_ref());
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
