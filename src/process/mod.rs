//! The process layer of the binary: COMMAND as a child in a process group of its own and its one
//! reaper ([`child`]), an optional cgroup for its tree ([`cgroup`]), the signals leaderrun acts on
//! ([`signals`]), the controlling terminal handed to COMMAND's group ([`terminal`]), COMMAND under an init of its
//! own PID namespace ([`pidns`], `--pid-namespace`), the vfork-style start of COMMAND
//! (`spawn`), the
//! memory settings leaderrun applies to itself ([`memory`]), its descriptor limit
//! ([`descriptors`]) and stack limit ([`stack`]), the children it was handed at start, which are not COMMAND's
//! ([`inherited`]). Nothing here knows about the
//! election: the supervisor and the watchdog tie the two together.

pub mod cgroup;
pub mod child;
pub mod descriptors;
pub mod group;
pub mod inherited;
pub mod memory;
pub mod pidns;
pub mod procfs;
pub mod signals;
pub(crate) mod spawn;
pub mod stack;
pub mod terminal;
