#![warn(missing_docs)]
//! `leaderrun`: run a command on exactly one machine of many, elected by a PostgreSQL session
//! advisory lock.
//!
//! # Theory of operation
//!
//! Every copy campaigns for the same session advisory lock, `pg_try_advisory_lock(class, id)`.
//! The copy whose session holds it is the leader; the others are standbys and try again every
//! check interval, except for a line of two ([`Config::wait_for_release`]) that waits in the
//! server's lock queues so that a release reaches a standby at once. With
//! [`Config::slots`] N > 1 up to N copies lead at once, each on a slot of its own
//! ([`LockKey::slot`]). The election is [`Elector`], a Rust rendering of the plexsphere background
//! leader (`Run`, `Term`, `Do`, `IsLeader`): see [`elector`] for its rules and the sources they
//! come from. Programs that embed the election use it directly:
//!
//! ```no_run
//! use leaderrun::{Config, Done, Elector};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), leaderrun::Error> {
//! let connect = "host=127.0.0.1 user=app dbname=plexsphere".parse().expect("valid DSN");
//! let elector = Elector::new(Config::new(connect))?;
//! let cancel = CancellationToken::new();
//! let election = tokio::spawn({
//!     let (elector, cancel) = (elector.clone(), cancel.clone());
//!     async move { elector.run(cancel).await }
//! });
//! if let Done::Lost = elector.do_as_leader(|term| async move { term.ended().await }).await {
//!     // Leadership moved elsewhere while the work ran; not a failure.
//! }
//! cancel.cancel();
//! election.await.expect("election task")?;
//! # Ok(()) }
//! ```
//!
//! The binary builds on it. [`supervisor`] is one loop that owns COMMAND's life: every input
//! (signals, terms, deadlines, ticks, the child's exit) is one event, each mode a small policy
//! over them, and the product's three rules are written once each: COMMAND starts or continues
//! only while its [`Term`] is proven (the safe window of the last check that proved the lock is
//! open, [`Term::hold`]), the lock is released on purpose only after every [`TermHold`], and so
//! COMMAND's whole tree, is gone, and no INT/TERM is lost. [`process::child`] knows processes (own
//! process group, one reaper, leftovers found among leaderrun's own children), [`process::signals`]
//! takes in the signals leaderrun acts on, [`timing`] is the timing model as one checked value,
//! [`watchdog`] is the helper process that kills the tree and holds the lock session until it
//! is dead when leaderrun itself dies or freezes, [`process::cgroup`] gives COMMAND a cgroup of its own
//! where that is cheap or asked for, [`cli::runner`] builds the real parts, [`cli`] is the command line and [`pg::conninfo`] resolves
//! connection settings the way psql does.

#[cfg(feature = "cli")]
pub mod cli;
pub mod elector;
pub mod error;
pub mod pg;
#[cfg(feature = "cli")]
pub mod process;
#[cfg(feature = "cli")]
pub mod supervisor;
pub mod timing;
#[cfg(feature = "cli")]
pub mod watchdog;

pub use elector::{
    CheckOutcome, Checks, Config, Done, Elector, Lease, LockKey, Term, TermControl, TermEnd,
    TermHold,
};
pub use error::{Chain, Error};
pub use timing::Timing;
