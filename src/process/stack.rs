//! leaderrun's own stack limit (`RLIMIT_STACK`, `ulimit -s`): raised at start when it is too
//! small for leaderrun's main thread, and given back to COMMAND as it was
//! (docs/process-model.md#enough-stack).
//!
//! The main thread's stack grows on demand up to the soft limit, read at each growth: with
//! `ulimit -s 100` or less, leaderrun's start-up overflowed it (exit 134, "thread 'main' has
//! overflowed its stack", or a bare SIGSEGV, 139), after its watchdog was forked, which was
//! then left to the parent as a zombie. A parent may set such a limit for the programs it
//! runs; COMMAND is one of them, so it gets the limit back.

use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// The stack leaderrun's main thread is given room to grow to when the limit is lower and may
/// be raised: start-up needs about a tenth of it (1 MiB; a thread's default stack is 2 MiB, the
/// main thread's usual limit 8 MiB).
pub const NEEDED: u64 = 1 << 20;

/// Below this, and not to be raised, leaderrun refuses to start (125): the release build ran
/// with 108 KiB on every path tried, so 256 KiB leaves room for paths not tried (a TLS
/// handshake runs on the main thread too); a debug build needs about 450 KiB for a one-shot.
pub const MINIMUM: u64 = if cfg!(debug_assertions) {
    512 << 10
} else {
    256 << 10
};

/// `u64::MAX`: not raised; otherwise the soft limit leaderrun started with.
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(u64::MAX);
/// The hard limit leaderrun started with, when it raised that too (root only).
static ORIGINAL_HARD: AtomicU64 = AtomicU64::new(u64::MAX);

/// What [`reserve`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The soft limit is [`NEEDED`] or more (or unlimited).
    Enough,
    /// Raised from `from` bytes to [`NEEDED`]; COMMAND gets `from` back.
    Raised {
        /// The soft limit leaderrun started with, in bytes.
        from: u64,
    },
    /// Below [`MINIMUM`], and the hard limit keeps it there.
    Short {
        /// The soft limit, in bytes.
        soft: u64,
        /// The hard limit, in bytes.
        hard: u64,
    },
    /// The limit could not be read.
    Unknown,
}

impl std::fmt::Display for Reserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reserve::Enough => write!(f, "the stack limit is enough"),
            Reserve::Raised { from } => write!(
                f,
                "raised the stack limit from {} KiB (COMMAND gets it back)",
                from / 1024
            ),
            Reserve::Short { soft, hard } => write!(
                f,
                "the stack limit (ulimit -s) is {} KiB, its hard limit {} KiB: leaderrun needs \
                 {} KiB at least; raise the hard limit (ulimit -Hs) or leave it as the system \
                 sets it",
                soft / 1024,
                hard / 1024,
                MINIMUM / 1024
            ),
            Reserve::Unknown => write!(f, "the stack limit could not be read"),
        }
    }
}

/// Makes sure the main thread may grow its stack to [`NEEDED`]: the soft limit is raised to
/// it, and the hard limit too where leaderrun may (`CAP_SYS_RESOURCE`); the original is noted
/// for COMMAND ([`original`]). A limit that cannot be raised is kept when it is [`MINIMUM`] or
/// more ([`Reserve::Enough`]), else [`Reserve::Short`]. Call first thing in `main`, before any
/// fork.
pub fn reserve() -> Reserve {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_STACK) else {
        return Reserve::Unknown;
    };
    if soft == RLIM_INFINITY || soft >= NEEDED {
        return Reserve::Enough;
    }
    // The hard limit with it where leaderrun may; else the soft one as far as the hard goes.
    let raised = [(NEEDED, hard.max(NEEDED)), (hard.min(NEEDED), hard)]
        .into_iter()
        .find(|&(to, max)| to > soft && setrlimit(Resource::RLIMIT_STACK, to, max).is_ok());
    match raised {
        Some((to, max)) if to >= MINIMUM => {
            ORIGINAL_SOFT.store(soft, Ordering::Release);
            if max != hard {
                ORIGINAL_HARD.store(hard, Ordering::Release);
            }
            Reserve::Raised { from: soft }
        }
        Some(_) => {
            // Still too small: put back as it was, and refused.
            let _ = setrlimit(Resource::RLIMIT_STACK, soft, hard);
            Reserve::Short { soft, hard }
        }
        None if soft >= MINIMUM => Reserve::Enough,
        None => Reserve::Short { soft, hard },
    }
}

/// The stack limit COMMAND starts with when [`reserve`] raised leaderrun's; `None` when it was
/// not raised (COMMAND inherits leaderrun's as it is).
pub fn original() -> Option<libc::rlimit> {
    let soft = ORIGINAL_SOFT.load(Ordering::Acquire);
    if soft == u64::MAX {
        return None;
    }
    let (_, now) = getrlimit(Resource::RLIMIT_STACK).ok()?;
    let hard = match ORIGINAL_HARD.load(Ordering::Acquire) {
        u64::MAX => now,
        hard => hard,
    };
    Some(libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    })
}
