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
//! use leaderrun::{CancellationToken, Config, Done, Elector};
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
//! # The seed
//!
//! "The seed" in this crate's comments is the design it renders: the background leader of
//! plexsphere (the team's platform, and its database), whose API is `Run` (campaign until
//! cancelled), `Term` (one tenure, ended by demotion or resignation), `Do` (run work only while
//! leading) and `IsLeader`. [`Elector::run`], [`Term`], [`Elector::do_as_leader`] and
//! [`Elector::is_leader`] are those four; the seed's defaults (the lock key `(1886156915, 1)`,
//! the 5-second check interval, the 2-second unlock bound, the leadership gauge) are kept.
//!
//! # The library
//!
//! Built with `--no-default-features` the crate is this part alone, with none of the binary's
//! dependencies (clap, hyper, tracing-subscriber, signal-hook, sd-notify):
//!
//! * [`elector`]: the election ([`Elector`], [`Config`], [`Term`] and its holds, [`Checks`]);
//! * [`pg`]: connection settings resolved the way psql does ([`pg::conninfo`]), TLS
//!   ([`pg::tls`]), the lock key and its SQL ([`pg::lock`]), the holder query ([`pg::holder`]);
//! * [`error`]: [`Error`] and [`Chain`], one line per cause;
//! * [`timing`]: the timing model as one checked value ([`Timing`]).
//!
//! `examples/embed.rs` is a small program that embeds the election.
//!
//! # The binary's layers (feature `cli`, on by default)
//!
//! The `leaderrun` binary builds on the library. These modules are public so that the binary
//! and the integration tests reach them, not as an API for other programs: they may change
//! with the binary.
//!
//! * `supervisor`: one loop owns COMMAND's life: every input (signals, terms, deadlines,
//!   ticks, the child's exit) is one event, each mode a small policy over them, and the
//!   product's three rules are written once each: COMMAND starts or continues only while its
//!   [`Term`] is proven (the safe window of the last check that proved the lock is open,
//!   [`Term::hold`]), the lock is released on purpose only after every [`TermHold`], and so
//!   COMMAND's whole tree, is gone, and no INT/TERM is lost.
//! * `process`: COMMAND as a process tree (own process group, one reaper, leftovers found
//!   among leaderrun's own children), its cgroup where that is cheap or asked for, the signals
//!   leaderrun acts on, the terminal.
//! * `history`: `--history`, one row per run in the lock's database, written off the fence's
//!   path (a session and a bounded queue of their own).
//! * `watchdog`: the helper process that kills the tree and holds the lock session until it is
//!   dead when leaderrun itself dies or freezes.
//! * `cli`: the command line, the run that builds the real parts (`cli::runner`), `status`,
//!   `step-down` and `doctor`, the HTTP endpoints, systemd notification, logging, metrics and
//!   the man page and completions.

// The library.
pub mod elector;
pub mod error;
pub mod pg;
pub mod timing;

#[doc(inline)]
pub use elector::{
    CheckOutcome, Checks, Config, Done, Elector, Lease, LockKey, Term, TermControl, TermEnd,
    TermHold,
};
#[doc(inline)]
pub use error::{Chain, Error};
#[doc(inline)]
pub use timing::Timing;

/// The driver whose [`tokio_postgres::Config`] [`Config::new`] takes, re-exported so that an
/// embedding program uses the very version this crate was built with.
pub use tokio_postgres;
/// The cancellation [`Elector::run`] takes, re-exported for the same reason.
pub use tokio_util::sync::CancellationToken;

// The binary's layers.
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod history;
#[cfg(feature = "cli")]
pub mod process;
#[cfg(feature = "cli")]
pub mod supervisor;
#[cfg(feature = "cli")]
pub mod watchdog;
