//! leaderrun's own descriptor limit (`RLIMIT_NOFILE`): made sure of at start, before anything
//! is opened, and given back to COMMAND as it was
//! (docs/process-model.md#enough-descriptors).
//!
//! A leaderrun that runs out of descriptors partway cannot look at COMMAND's tree (its
//! children are read from `/proc`), and a tree it cannot see gone is a tree that may still run:
//! it then waited out the grace and the wait after SIGKILL, said the tree was still there, and
//! exited late. So the limit is settled before campaigning, once: enough, raised to enough
//! within the hard limit, or refused.

use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The descriptors leaderrun keeps free for itself below its soft limit. With every option a
/// leader holds about 25 (the lock session and the watchdog's copy of it, the pair to the
/// watchdog and pidfds, the runtime's, the history's session, the cgroup's, the init's pipe,
/// the probe port) and needs 2 more to read its children; the rest is room for a reconnect
/// beside the old session, a name lookup, TLS files and the probe port's clients (a quarter of
/// the soft limit, `cli::http::connection_limit`).
pub const NEEDED: u64 = 64;

/// `u64::MAX`: the soft limit was not raised; otherwise the soft limit leaderrun started with.
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(u64::MAX);

/// What [`reserve`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The soft limit leaves [`NEEDED`] descriptors free.
    Enough,
    /// The soft limit was raised from `from` to `to` (within `hard`); COMMAND gets `from` back.
    Raised {
        /// The soft limit leaderrun started with.
        from: u64,
        /// The soft limit it runs with.
        to: u64,
        /// The hard limit, unchanged.
        hard: u64,
    },
    /// Not even the hard limit leaves [`NEEDED`] descriptors free.
    Short {
        /// The soft limit.
        soft: u64,
        /// The hard limit.
        hard: u64,
        /// The descriptors open at start (stdio and whatever was inherited) below the limit
        /// that would do.
        in_use: u64,
        /// The lowest limit that would leave [`NEEDED`] free.
        needed: u64,
    },
    /// The limit cannot be read or set (no such limit): nothing was changed.
    Unknown,
}

impl std::fmt::Display for Reserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Reserve::Enough => write!(f, "enough descriptors"),
            Reserve::Raised { from, to, hard } => write!(
                f,
                "raised the soft descriptor limit from {from} to {to} (hard {hard}); COMMAND \
                 gets {from}"
            ),
            Reserve::Short {
                soft,
                hard,
                in_use,
                needed,
            } => write!(
                f,
                "too few file descriptors: the limit (RLIMIT_NOFILE) is {soft} (hard {hard}) \
                 and {in_use} are open at start; leaderrun needs {NEEDED} of its own to watch \
                 COMMAND's tree and hold the lock: raise it to at least {needed} (ulimit -n)"
            ),
            Reserve::Unknown => write!(f, "the descriptor limit cannot be read"),
        }
    }
}

/// Makes sure [`NEEDED`] descriptor numbers are free below the soft limit: raises the soft limit
/// as far as that takes, never past the hard limit, and notes the original for COMMAND
/// ([`original_soft`]). Call once, first thing, while the process is one thread (the count
/// looks at each number in turn: a descriptor another thread opens meanwhile is not seen).
///
/// Raised no further than needed: the user's low limit is kept as far as leaderrun can run
/// with it (the probe port's share of connections follows the soft limit).
pub fn reserve() -> Reserve {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Reserve::Unknown;
    };
    // Descriptors are handed out lowest number first: what counts is the free numbers below
    // the limit, not how many are open (one inherited above the limit takes no room).
    let Some(needed) = lowest_limit_leaving(NEEDED) else {
        return Reserve::Unknown;
    };
    if needed <= soft {
        return Reserve::Enough;
    }
    if needed > hard {
        return Reserve::Short {
            soft,
            hard,
            in_use: needed - NEEDED,
            needed,
        };
    }
    if setrlimit(Resource::RLIMIT_NOFILE, needed, hard).is_err() {
        return Reserve::Short {
            soft,
            hard,
            in_use: needed - NEEDED,
            needed,
        };
    }
    ORIGINAL_SOFT.store(soft, Ordering::Release);
    Reserve::Raised {
        from: soft,
        to: needed,
        hard,
    }
}

/// The lowest soft limit under which `free` descriptor numbers are unused now: one past the
/// `free`-th unused number. `None` past the largest descriptor number.
///
/// Asked with `poll` (no events, no wait), which marks each number that is not open
/// `POLLNVAL`: a batch of numbers per system call, one for the usual few inherited descriptors,
/// since this runs on every start, a one-shot's included.
fn lowest_limit_leaving(free: u64) -> Option<u64> {
    const BATCH: usize = 128;
    let mut found = 0;
    let mut first: libc::c_int = 0;
    let mut fds = [libc::pollfd {
        fd: 0,
        events: 0,
        revents: 0,
    }; BATCH];
    loop {
        for (k, entry) in fds.iter_mut().enumerate() {
            entry.fd = first.checked_add(k as libc::c_int)?;
            entry.revents = 0;
        }
        // SAFETY: poll reads and writes the array it is given, nothing else. `nfds` above the
        // soft limit is EINVAL: then the numbers are looked at one at a time.
        let polled = unsafe { libc::poll(fds.as_mut_ptr(), BATCH as libc::nfds_t, 0) };
        if polled < 0 {
            return one_at_a_time(first, free - found);
        }
        for entry in &fds {
            if entry.revents & libc::POLLNVAL != 0 {
                found += 1;
                if found == free {
                    return Some(entry.fd as u64 + 1);
                }
            }
        }
        first = first.checked_add(BATCH as libc::c_int)?;
    }
}

/// [`lowest_limit_leaving`] from `first` on, one `fcntl` per number.
fn one_at_a_time(first: libc::c_int, free: u64) -> Option<u64> {
    let mut found = 0;
    for fd in first..=libc::c_int::MAX {
        // SAFETY: F_GETFD only reads the descriptor's flags; EBADF says the number is unused.
        let unused = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        if unused {
            found += 1;
            if found == free {
                return Some(fd as u64 + 1);
            }
        }
    }
    None
}

/// The descriptor limit COMMAND starts with when [`reserve`] raised leaderrun's: the soft limit
/// leaderrun started with and the hard limit. `None` when it was not raised (COMMAND inherits
/// leaderrun's as it is).
pub fn original_soft() -> Option<libc::rlimit> {
    let soft = ORIGINAL_SOFT.load(Ordering::Acquire);
    if soft == u64::MAX {
        return None;
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    Some(libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    })
}

/// Marks every descriptor from `first` up close-on-exec, so that none of them reaches what the
/// caller execs: `close_range(CLOSE_RANGE_CLOEXEC)` (Linux 5.11), one call whatever their
/// number; on older kernels each descriptor below the soft limit (at most 65,536) in turn.
/// Marked, not closed: exec closes them once it succeeds, and a failed exec leaves the caller's
/// report descriptor open. Only raw system calls.
///
/// # Safety
/// For a forked child before exec (async-signal-safe); it changes descriptors others may hold.
pub(crate) unsafe fn close_on_exec_from(first: libc::c_int) {
    // SAFETY: system calls on descriptor numbers and a local rlimit, nothing more.
    unsafe {
        let marked = libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
        if marked == 0 {
            return;
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(65_536) as libc::c_int
        } else {
            1024
        };
        for fd in first..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_of_free_numbers_skips_every_open_one() {
        use std::os::fd::AsRawFd;
        // Other tests' threads open and close descriptors meanwhile: only what this test holds
        // open throughout, and stdin, stdout and stderr, are sure to be open while it counts.
        let held: Vec<std::fs::File> = (0..5)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        for count in [lowest_limit_leaving, |free| one_at_a_time(0, free)] {
            let limit = count(1000).unwrap();
            assert!(
                held.iter().all(|f| (f.as_raw_fd() as u64) < limit),
                "{limit}"
            );
            // At least 3 + 5 numbers below the limit are open; past the first batch too.
            assert!(limit >= 1000 + 8, "{limit}");
            assert!(count(1).unwrap() >= 1);
        }
    }

    #[test]
    fn a_short_limit_says_what_would_do() {
        let short = Reserve::Short {
            soft: 16,
            hard: 16,
            in_use: 3,
            needed: 67,
        };
        let text = short.to_string();
        assert!(text.contains("is 16 (hard 16)"), "{text}");
        assert!(text.contains("at least 67 (ulimit -n)"), "{text}");
    }
}
