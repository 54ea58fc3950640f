//! The seed's election: campaign, term, check, demote, unlock.
//!
//! # Theory of operation
//!
//! An [`Elector`] owns at most one PostgreSQL session (with slots, a queue head also keeps one
//! for each other slot it heads, docs/election.md#slots). [`Elector::run`] checks once when it
//! starts and then every check interval:
//!
//! * **Standby.** The check runs `pg_try_advisory_lock(class, id)` (guarded by
//!   `pg_is_in_recovery()`) on the elector's one session, opening it first when there is none.
//!   A refused try leaves the session as it was, so a standby costs the server one session and
//!   one statement per interval. A failed connect or statement is logged at WARN as
//!   `leader: acquire lock connection: <cause>`, the session is thrown away (a try that failed
//!   or timed out on the client may still have been granted on the server, see
//!   docs/field-notes.md#a-timed-out-try-may-have-been-granted) and the replica stays a standby.
//! * **Grant.** The session becomes the lock session. Its `idle_session_timeout` (the seed's
//!   bound on an orphaned lock session) was pinned when it connected, before its first try, so
//!   a grant never runs without it even for a moment. A fencing token is read
//!   (`txid_current()`, docs/field-notes.md#the-fencing-number-comes-from-the-server, made
//!   durable before the answer, docs/field-notes.md#a-fencing-number-must-survive-a-crash), and a new
//!   [`Term`] begins.
//! * **Leader.** The check proves ownership in one round trip: the backend that answers is the
//!   one the lock was granted to, it holds the granted `pg_locks` row for (current database,
//!   class, id, objsubid 2), and the server is not in recovery
//!   (docs/field-notes.md#a-live-session-is-not-a-held-lock). A check that fails or does not answer
//!   within one interval demotes. The session is also watched between checks: when the server
//!   closes it (terminated backend, restart), the leader demotes at once instead of at its next
//!   check (docs/field-notes.md#the-lock-goes-with-the-session).
//! * **Demotion** ends the term with [`TermEnd::LeadershipLost`], turns [`Elector::is_leader`]
//!   false, sets the gauge to 0, closes the session and logs a WARN line with the cause. The
//!   lock is never tried again on that session (docs/field-notes.md#try-lock-requests-stack).
//! * **Cancel** ends the term with [`TermEnd::Resigned`], runs `pg_advisory_unlock` under a
//!   2-second bound that outlives the cancellation, and closes the session.
//! * **Panic or drop.** When `run` unwinds (or its future is dropped) the term ends with
//!   [`TermEnd::LeadershipLost`] and the session is closed without unlocking, since it may be
//!   mid-statement; the server frees the lock when the socket closes. While a [`TermHold`] of
//!   the term lives (or of an ended term whose holds the dropped `run` was waiting for), the
//!   session is kept on a task of its own until the holds are dropped, bounded by
//!   `idle_session_timeout`, as in every other release.
//!
//! # Layout
//!
//! * this module: [`Config`], the [`Elector`] API (the seed's `Run`, `Term`, `Do`, `IsLeader`)
//!   and the tally of checks;
//! * [`term`]: a term, its proof and its holds;
//! * `connecting`: connecting as libpq does, host by host ([`connect`], shared with `status`
//!   and `doctor`);
//! * `session`: the lock session: the pinned timers and the prepared, bounded statements (their
//!   text is [`crate::pg::lock`]'s, e.g. [`standby_comment`]);
//! * `campaign`: one call of [`Elector::run`]: checks, grants, demotion, release;
//! * `metrics`: the election's Prometheus metrics.

mod campaign;
mod connecting;
mod metrics;
mod session;
pub mod term;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use prometheus::Registry;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};

use crate::error::Error;
use crate::pg::tls::TlsSettings;
use crate::timing::Timing;

pub use crate::pg::lock::standby_comment;
pub use crate::pg::lock::{LockKey, DEFAULT_LOCK_CLASS, DEFAULT_LOCK_ID, MAX_SLOTS};
pub use connecting::{connect, Connected, EarlyConnect};
pub use session::{boottime, CLIENT_CONNECTION_CHECK};
pub use term::{Lease, Term, TermControl, TermEnd, TermHold};

use campaign::{Campaign, Role};
#[cfg(feature = "cli")]
pub(crate) use connecting::connect_socket;
use metrics::{shared_metrics, Registered};
use session::pin_client_timers;
#[cfg(feature = "cli")]
pub(crate) use session::session_is_direct;

/// Default check interval, the seed's `DefaultCheckInterval`: 5 s.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Bound on the `pg_advisory_unlock` that runs after cancellation (the seed's 2-second context).
pub const UNLOCK_BOUND: Duration = Duration::from_secs(2);

/// How long after a check found a transaction-mode pooler an elector tries nothing on a session
/// that is not direct ([`Error::PoolerFound`]): a minute, or 12 check intervals when that is
/// longer. Each grant through such a pooler could leave a count on a pooled backend that keeps
/// every replica out (docs/field-notes.md#transaction-mode-poolers-move-the-session); a finding
/// that came from a passing fault (a session-mode pooler's leftover lock, a second session
/// that reached a hot standby) is tried again after it.
pub(crate) fn pooler_backoff(check_interval: Duration) -> Duration {
    (check_interval * 12).max(Duration::from_secs(60))
}
/// Name of the leadership gauge, from the seed's Metric table.
pub const GAUGE_NAME: &str = "plexsphere_background_leader";

/// Keeps a copy of the lock session's socket, so that the session, and the lock, outlive this
/// process until the work under the term is dead: the binary's watchdog (`watchdog::Watchdog`,
/// feature `cli`). The elector hands it the socket at every grant and takes it back
/// before the session closes: on purpose, and also when the session is dropped otherwise (a
/// caller dropped [`Elector::run`]'s future, a panic).
pub trait SessionKeeper: Send + Sync + std::fmt::Debug {
    /// The lock was granted on the session whose socket is `socket`: keep a duplicate.
    ///
    /// # Errors
    /// When no duplicate can be kept (no descriptor left, no keeper runs): the elector then
    /// begins no term on this grant and closes the session, which gives the lock back
    /// ([`Error::Keeper`]). A term whose session lived only in this process would hand the
    /// lock on the moment the process dies, while its work may still run.
    fn keep(&self, socket: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>;
    /// The session is about to be closed: drop the duplicate first. With `wait`, return only
    /// once it is dropped (bounded), since until then the session, and maybe the lock, lives
    /// on; without, for a session the server already ended, return at once.
    fn release(&self, wait: bool);
}

/// How an [`Elector`] connects, which lock it campaigns for, and how often it checks: the seed's
/// `leader.Config` in Rust terms.
#[derive(Clone, Debug)]
pub struct Config {
    /// Connection settings of the one session the lock is tried and held on (instead of the
    /// seed's pool). Its `connect_timeout`, when set, bounds each host's connect attempt and
    /// every standby statement; otherwise the check interval does
    /// (docs/guarantees.md#safety-guarantees). The hosts, their passwords and
    /// `target_session_attrs` are in [`Config::tls`]'s plan.
    pub connect: tokio_postgres::Config,
    /// TLS: libpq's `sslmode` (including `verify-ca`/`verify-full`) and certificates. Default:
    /// `prefer`, as libpq.
    pub tls: TlsSettings,
    /// The advisory lock key; default [`LockKey::default`], the seed's `(1886156915, 1)`.
    pub lock: LockKey,
    /// How many replicas may lead at once, each on a slot of its own (`--slots N`,
    /// docs/guarantees.md#the-lock-key-and-slots): slot k is the key [`LockKey::slot`]`(k)`. 0 and
    /// 1 both mean one slot, the seed's single leader. At most [`MAX_SLOTS`] (1024, as
    /// `--slots`): [`Elector::new`] refuses more. Every replica of one lock must use the same
    /// number.
    pub slots: u32,
    /// How often a standby tries the lock and the leader verifies it, and how long the leader's
    /// check may take before it fails. Zero uses [`DEFAULT_CHECK_INTERVAL`], as the seed says.
    pub check_interval: Duration,
    /// `idle_session_timeout` pinned on every session when it connects, before its first try,
    /// so it is in force from the grant on. `None` uses the seed's
    /// value, 4 × check interval. The binary raises it to 3 × interval + grace when the grace
    /// is longer than one interval (docs/guarantees.md#timing-settings). Rounded up to whole
    /// milliseconds.
    pub idle_session_timeout: Option<Duration>,
    /// A released lock, whether unlocked or freed by a dying session, is granted to a standby
    /// at once. Per slot a line of two ([`crate::pg::lock::QUEUE_PLACES`]) waits in the server's
    /// queues (`pg_advisory_lock` bounded by `lock_timeout` = one check interval): the queue
    /// head for the lock, the second for the head's place ([`LockKey::queue_key`]), so two
    /// hand-overs in a row both reach a waiting standby. Every other standby tries the lock
    /// and the places once per interval, so however many standbys there are, two wait
    /// (docs/field-notes.md#every-waiter-costs-a-deadlock-check: every waiter costs a deadlock
    /// check that walks the queue). Still one session and about one statement per interval. `false`
    /// (the default) is the seed's fixed-interval `pg_try_advisory_lock`.
    pub wait_for_release: bool,
    /// Longest random delay before the first check of [`Elector::run`], so that a fleet
    /// started at the same moment (a deployment, a host's boot) does not connect at the same
    /// moment: each replica waits a random time in [0, this]. Zero (the default): check at
    /// once. The binary uses a quarter interval, at most 1 s, except for `--once`.
    pub first_check_spread: Duration,
    /// Log a standby check that could not reach a usable server at WARN, the seed's `leader:
    /// acquire lock connection: <cause>` (the default). `false` logs it at DEBUG, for a caller
    /// that reports the failure itself: `leaderrun --once` prints one ERROR line with the
    /// cause instead of the same text twice.
    pub warn_failed_tries: bool,
    /// With [`Config::warn_failed_tries`], also log at WARN a try the server refused because it
    /// is momentarily full or starting up (SQLSTATE 53300, 57P03) (the default). `false` logs
    /// those at DEBUG, for `leaderrun --wait`: a cron herd that fills the server for a moment is
    /// no error, and mails nothing (CONTRACT's `--once`).
    pub warn_transient_tries: bool,
    /// After a try the server refused because it is momentarily full or starting up (SQLSTATE
    /// 53300, 57P03), try again soon, with a jitter of up to an eighth of the interval, for up
    /// to one interval (docs/field-notes.md#full-and-starting-servers-are-transient): for a
    /// one-shot, which decides on its first interval, so that a cron herd against a small
    /// `max_connections` gets through. `false` (the default), for a campaign that goes on:
    /// the next try is at the next check, as after any failure; a full server is not hammered
    /// by every standby, each trying every few hundred milliseconds.
    pub retry_transient_soon: bool,
    /// Say once per process, at WARN, that the server has no `idle_session_timeout`
    /// (PostgreSQL 13, outside the supported 14–18), with the weaker bound that leaves: the
    /// default, for the long-running modes. `false` says it at DEBUG, for `leaderrun --once`,
    /// which cron runs over and over and which should stay quiet (`doctor` says it too).
    pub warn_weaker_server: bool,
    /// Span the elector's events are emitted in: the seed's `Logger`. A tracing target must be
    /// a compile-time constant, so events always carry the target `leaderrun::elector`; give
    /// the span fields (a name, a replica id) to tell electors apart. Default: a disabled span.
    pub span: tracing::Span,
    /// Registry that receives the `plexsphere_background_leader` gauge (no labels; 1 while
    /// leading, 0 otherwise; the seed's Metric table) and the election's own metrics:
    /// `leaderrun_slot` (the slot led on, −1 while standby), `leaderrun_terms_started_total`,
    /// `leaderrun_checks_total{outcome}`, `leaderrun_check_duration_seconds` (a check's own time,
    /// without a standby's wait in the lock queue), `leaderrun_lock_wait_seconds` (that wait) and
    /// `leaderrun_demotions_total{cause}`. Every labelled series exists from the start at 0. `None`
    /// registers nothing. Electors that share a registry share these, and so write one series
    /// (the seed's `New` reuses the gauge); the last of them dropped takes them off the registry.
    /// A registry on which something else holds one of these names is refused
    /// ([`Error::Metrics`], the registry left as it was): prometheus for Rust does not hand back
    /// an existing collector, as Go's does, so an application's own
    /// `plexsphere_background_leader` cannot be written to.
    pub registry: Option<Registry>,
    /// Keeps a copy of the lock session's socket (see [`SessionKeeper`]); `None`: nobody.
    pub keeper: Option<std::sync::Arc<dyn SessionKeeper>>,
    /// A connect to the first host begun before the elector was built
    /// ([`EarlyConnect::start`]): the first session's attempt at that host uses it. For a
    /// program whose first check must come as early as it can (a one-shot); `None`: every
    /// session connects when it is opened.
    pub early_connect: Option<std::sync::Arc<EarlyConnect>>,
}

impl Config {
    /// Settings with the seed's defaults for everything but the connection.
    pub fn new(connect: tokio_postgres::Config) -> Self {
        Config {
            connect,
            tls: TlsSettings::default(),
            lock: LockKey::default(),
            slots: 1,
            check_interval: DEFAULT_CHECK_INTERVAL,
            idle_session_timeout: None,
            wait_for_release: false,
            first_check_spread: Duration::ZERO,
            warn_failed_tries: true,
            warn_transient_tries: true,
            retry_transient_soon: false,
            warn_weaker_server: true,
            span: tracing::Span::none(),
            registry: None,
            keeper: None,
            early_connect: None,
        }
    }

    /// The number of slots in effect: [`Config::slots`], at least 1.
    pub fn effective_slots(&self) -> u32 {
        self.slots.max(1)
    }

    /// The check interval in effect: [`Config::check_interval`], or the default when zero.
    pub fn effective_check_interval(&self) -> Duration {
        if self.check_interval.is_zero() {
            DEFAULT_CHECK_INTERVAL
        } else {
            self.check_interval
        }
    }

    /// The timing model of this election ([`Timing`]): the check interval in effect, a grace of
    /// one interval (the elector stops nothing itself; the binary's grace is in its own
    /// `Timing`), and [`Config::effective_idle_session_timeout`].
    pub fn timing(&self) -> Timing {
        let interval = self.effective_check_interval();
        let mut timing = Timing::new(interval, interval);
        timing.idle_session_timeout = self.effective_idle_session_timeout();
        timing
    }

    /// The leader's safe window, [`Timing::safe_window`]: 2 check intervals from the send time
    /// of the last check that proved the lock (docs/field-notes.md#measuring-the-safe-window).
    pub fn safe_window(&self) -> Duration {
        self.timing().safe_window()
    }

    /// The `idle_session_timeout` in effect: the configured one, else 4 × check interval.
    pub fn effective_idle_session_timeout(&self) -> Duration {
        self.idle_session_timeout
            .unwrap_or(self.effective_check_interval().saturating_mul(4))
    }

    /// Bound on each host's connect attempt and on a standby's statements: the DSN's
    /// `connect_timeout` when set, else the check interval (docs/guarantees.md#safety-guarantees).
    pub fn io_bound(&self) -> Duration {
        self.connect
            .get_connect_timeout()
            .copied()
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| self.effective_check_interval())
    }
}

/// The three outcomes of [`Elector::do_as_leader`], the seed's `Do` table.
#[derive(Debug, PartialEq, Eq)]
pub enum Done<T> {
    /// The replica was a standby; the work was not run (the seed's `(false, nil)`).
    Standby,
    /// The work ran and leadership held until it returned (the seed's `(true, err)`).
    Ran(T),
    /// Leadership was lost while the work ran; not a failure (the seed's `(false, nil)` after
    /// a loss, logged at INFO).
    Lost,
}

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutcome {
    /// A standby's try was granted: a term began.
    Granted,
    /// A standby's try was refused: another session holds the lock.
    Refused,
    /// The leader proved it still holds the lock.
    Verified,
    /// The leader's check failed: it was demoted.
    Lost,
    /// Connecting or the statement failed (or the server is in recovery); still a standby.
    Failed,
}

/// A running tally of the elector's checks, for probes, metrics and one-shot modes.
#[derive(Clone, Debug, Default)]
pub struct Checks {
    /// Checks completed since the elector was built (all outcomes).
    pub total: u64,
    /// Standby checks that found the lock held elsewhere.
    pub refused: u64,
    /// Checks that could not reach a usable server.
    pub failed: u64,
    /// Outcome of the latest check.
    pub last: Option<CheckOutcome>,
    /// When the latest check finished (monotonic clock).
    pub last_at: Option<Instant>,
    /// When the latest check that got an answer from the server finished (anything but
    /// [`CheckOutcome::Failed`] and [`CheckOutcome::Lost`]).
    pub last_success_at: Option<Instant>,
    /// Time the latest check took, connect included, without its wait in the lock queue.
    pub last_latency: Duration,
    /// The latest failure, with its cause chain.
    pub last_error: Option<String>,
    /// Whether the latest check got an answer from the server in time: false for a
    /// [`CheckOutcome::Failed`] one, and for a [`CheckOutcome::Lost`] one that timed out or
    /// whose answer came after its safe window (a lost lock the server reported, or a session
    /// it closed, reached it).
    pub last_reached: bool,
    /// Whether the latest failure was the server's answer that rules leading out through
    /// these settings ([`Error::rules_out_leading`]: a pooler, a hot standby, a privilege),
    /// rather than a failure to reach it.
    pub last_ruled_out: bool,
    /// Sessions opened so far: non-zero once the server has been reached at all.
    pub sessions_opened: u64,
    /// A standby's wait is queued in the server's lock queue right now (cleared when the check
    /// that sent it is recorded, with its outcome).
    pub waiting: bool,
    /// The latest failure met a server that was momentarily full (`too many connections`,
    /// SQLSTATE 53300) or starting up (57P03): worth trying again soon (docs/guarantees.md#modes).
    pub last_transient: bool,
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) checks: watch::Sender<Checks>,
    pub(crate) target: String,
    pub(crate) leader: AtomicBool,
    /// The current term's proof, as its [`Term::proven_until`] (boottime nanoseconds; 0: none),
    /// mirrored here so that [`Elector::is_leader`] takes no lock.
    /// Shared with the term ([`Term::give_up`] clears it at once).
    pub(crate) proven_until: std::sync::Arc<AtomicU64>,
    pub(crate) running: AtomicBool,
    /// A demoted term's holds are being waited for before its session is released.
    pub(crate) releasing: AtomicBool,
    /// When the last such wait ended.
    pub(crate) released_at: std::sync::Mutex<Option<Instant>>,
    /// When the standby check in flight last began a step ([`Elector::stepped_at`]).
    pub(crate) steps: connecting::Steps,
    pub(crate) terms: AtomicU64,
    /// When a check last found a pooler that moves sessions between server backends or
    /// shares them between clients: for [`pooler_backoff`] from then on this elector tries
    /// nothing on a session that is not direct ([`Error::PoolerFound`]).
    pub(crate) pooler_found: std::sync::Mutex<Option<Instant>>,
    pub(crate) current: watch::Sender<Term>,
    pub(crate) metrics: Option<Arc<Registered>>,
}

/// A participant in the election for one advisory lock: the seed's `Elector`.
///
/// Cheap to clone; clones share state, so [`Elector::is_leader`] and [`Elector::term`] may be
/// called from any task while another one drives [`Elector::run`].
#[derive(Clone)]
pub struct Elector {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("target", &self.shared.target)
            .field("lock", &self.shared.config.lock)
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl Elector {
    /// Builds an elector (the seed's `leader.New`). Connects to nothing yet.
    ///
    /// # Errors
    /// [`Error::Timing`] when [`Config::timing`] fails [`crate::timing::Timing::check`]: the
    /// lock session's `idle_session_timeout` (4 × the check interval unless
    /// [`Config::idle_session_timeout`] says otherwise) is over PostgreSQL's limit,
    /// [`crate::timing::MAX_IDLE_SESSION_TIMEOUT`] (about 24.8 days), so every session would fail
    /// to set it, or not longer than 3 check intervals (the safe window and one interval of
    /// margin), so the server could free the lock while this leader still counts on it;
    /// [`Error::Slots`] when [`Config::slots`] is over [`MAX_SLOTS`];
    /// [`Error::Metrics`] when the metrics cannot be registered on [`Config::registry`].
    pub fn new(config: Config) -> Result<Elector, Error> {
        config.timing().check().map_err(Error::Timing)?;
        if config.slots > MAX_SLOTS {
            return Err(Error::Slots {
                slots: config.slots,
            });
        }
        let metrics = match &config.registry {
            Some(registry) => Some(shared_metrics(registry)?),
            None => None,
        };
        let mut config = config;
        pin_client_timers(&mut config);
        let (current, _) = watch::channel(Term::standby());
        let (checks, _) = watch::channel(Checks::default());
        Ok(Elector {
            shared: Arc::new(Shared {
                checks,
                target: crate::pg::conninfo::describe(&config.connect),
                config,
                leader: AtomicBool::new(false),
                proven_until: std::sync::Arc::new(AtomicU64::new(0)),
                running: AtomicBool::new(false),
                releasing: AtomicBool::new(false),
                released_at: std::sync::Mutex::new(None),
                steps: connecting::Steps::default(),
                terms: AtomicU64::new(0),
                pooler_found: std::sync::Mutex::new(None),
                current,
                metrics,
            }),
        })
    }

    /// The configuration this elector was built with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Whether this replica holds the lock right now, as far as it can know: it leads, and the
    /// safe window of its term's last proving check is still open ([`Term::proven_until`]).
    /// Lock-free, safe from any thread: two atomic loads and a clock read.
    ///
    /// The seed's `IsLeader` reads the loop's flag alone. Here the window bounds it too: a
    /// campaign that cannot run (its runtime starved or blocked, the process frozen) cannot
    /// clear the flag, and the flag alone would say true while another replica, granted the
    /// lock once the server ended this one's session, leads
    /// (docs/guarantees.md#safety-guarantees).
    pub fn is_leader(&self) -> bool {
        self.shared.leader.load(Ordering::Acquire)
            && session::boottime().as_nanos()
                < u128::from(self.shared.proven_until.load(Ordering::Acquire))
    }

    /// Whether the campaign is waiting, right now, for the work of a term that ended to stop
    /// (every [`TermHold`] dropped) before it releases the lock session
    /// (docs/guarantees.md#release-only-after-the-tree-is-dead): no check runs meanwhile, for
    /// at most `idle_session_timeout`. One atomic load.
    pub fn is_releasing(&self) -> bool {
        self.shared.releasing.load(Ordering::Acquire)
    }

    /// When the last wait of [`Elector::is_releasing`] ended (monotonic clock); `None` before
    /// the first. No check ran during it, so a liveness rule that counts from the last check
    /// counts from here too, until the next check is recorded.
    pub fn released_at(&self) -> Option<Instant> {
        *self
            .shared
            .released_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// When a standby's check last began a step (monotonic clock): connecting to one address
    /// of a host, the session's first statements, a try; `None` before the first check. Each
    /// step is bounded (`connect_timeout` when set, else the check interval), and a check may
    /// take several (every host of a list, each address of a name), so one check may outlast
    /// any fixed multiple of the interval while each of its steps keeps to its bound: a
    /// liveness rule that counts from the last check counts from here too.
    pub fn stepped_at(&self) -> Option<Instant> {
        self.shared.steps.last()
    }

    /// The tally of checks so far.
    pub fn checks(&self) -> Checks {
        self.shared.checks.borrow().clone()
    }

    /// A receiver that sees every change of [`Elector::checks`], for waiting on the next check.
    pub fn watch_checks(&self) -> watch::Receiver<Checks> {
        self.shared.checks.subscribe()
    }

    /// A receiver that sees every change of [`Elector::term`]: each term that begins, and the
    /// standby placeholder published when one ends.
    pub fn watch_term(&self) -> watch::Receiver<Term> {
        self.shared.current.subscribe()
    }

    /// The current term (the seed's `Term`): live while leading; already ended on a standby.
    pub fn term(&self) -> Term {
        self.shared.current.borrow().clone()
    }

    /// Waits until this replica leads and returns that term. Returns at once when it already
    /// leads. Waits forever when nothing drives [`Elector::run`].
    pub async fn wait_for_term(&self) -> Term {
        let mut rx = self.shared.current.subscribe();
        let term = match rx.wait_for(|t| !t.is_ended()).await {
            Ok(term) => term.clone(),
            // The sender lives in `self.shared`, which outlives this borrow.
            Err(_) => unreachable!("elector state dropped while borrowed"),
        };
        term
    }

    /// Runs one unit of work on the leader: the seed's `Do` (`do` is a Rust keyword).
    ///
    /// On a standby, `work` is not called and the result is [`Done::Standby`]. On the leader,
    /// `work` gets the term, so it can stop when [`Term::ended`] resolves; when leadership held
    /// until it returned, the result is [`Done::Ran`] with its output; when leadership was
    /// lost meanwhile, [`Done::Lost`], logged at INFO: a demotion never counts as a failure.
    /// Work that returns after its term's safe window passed ([`Term::proven_until`]) without
    /// the term having ended (its campaign could not run: work that blocked the runtime, a
    /// frozen process) is [`Done::Lost`] too: nothing proved the lock until it returned; so is
    /// work that outlived the release's wait after a cancel ([`Elector::run`]: bounded by
    /// `idle_session_timeout`), under which the lock was given up.
    pub async fn do_as_leader<F, Fut>(&self, work: F) -> Done<Fut::Output>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future,
    {
        let term = self.term();
        // The work starts only inside the proof, and the lock is not released on purpose
        // before it returned.
        let Some(hold) = term.hold() else {
            return Done::Standby;
        };
        let output = work(term.clone()).await;
        // A term that has not ended but whose safe window passed (its campaign could not run
        // while the work did, e.g. work that blocked the runtime) did not prove the lock until
        // the work returned: the server may have ended the session, and another replica led.
        let lapsed = term
            .proven_until()
            .map_or(true, |until| session::boottime() >= until);
        drop(hold);
        let cause = term.end_cause();
        if cause == Some(TermEnd::LeadershipLost)
            || (cause.is_none() && lapsed)
            || term.was_released_under_holds()
        {
            let _span = self.shared.config.span.enter();
            info!(
                target: "leaderrun::elector",
                term = term.number(),
                "leader: work interrupted: leadership lost while it ran"
            );
            return Done::Lost;
        }
        Done::Ran(output)
    }

    /// Takes part in the election until `cancel` is cancelled: the seed's `Run`.
    ///
    /// Checks once at start and then every check interval (see the module docs). A failed
    /// connect or statement never ends the call; it is logged and retried at the next check.
    /// On cancel, ends the term ([`TermEnd::Resigned`]), waits for every [`TermHold`] of it to
    /// be dropped (work that ignores the term's end keeps the lock, and `run`, for up to the
    /// lock session's `idle_session_timeout`, 4 check intervals by default; the server's own
    /// timer counts from the last check, so it may end the session, and the lock, up to an
    /// interval sooner, and [`Elector::do_as_leader`] then says [`Done::Lost`]), unlocks under
    /// [`UNLOCK_BOUND`] and closes the session; when the unlock failed, the close waits up to
    /// 1 s more for the server to end the backend, so the lock reaches the standbys before
    /// `run` returns (docs/election.md, "Release"). A leader whose work stops at once returns
    /// within a round trip; at most that wait + 3 s.
    ///
    /// May be called again after an earlier call returned or panicked.
    ///
    /// # Errors
    /// [`Error::AlreadyRunning`] when another `run` on this elector has not returned yet.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), Error> {
        if self.shared.running.swap(true, Ordering::AcqRel) {
            return Err(Error::AlreadyRunning);
        }
        let span = self.shared.config.span.clone();
        let mut campaign = Campaign {
            shared: &self.shared,
            role: Role::default(),
            finished: false,
            waited: Duration::ZERO,
            wait_only: false,
            releasing: None,
        };
        // A panic inside an async fn does not unwind through its locals until the task is
        // dropped, after the runtime caught it; catch it here so the term ends, the session
        // closes and the WARN line is written while the caller's subscriber is still current.
        let outcome = AssertUnwindSafe(
            async {
                campaign.run(&cancel).await;
                campaign.resign().await;
            }
            .instrument(span.clone()),
        )
        .catch_unwind()
        .await;
        campaign.finished = true;
        if let Err(panic) = outcome {
            let _entered = span.enter();
            campaign.abandon(true);
            std::panic::resume_unwind(panic);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn zero_interval_uses_the_default() {
        let mut config = Config::new(tokio_postgres::Config::new());
        config.check_interval = Duration::ZERO;
        assert_eq!(config.effective_check_interval(), DEFAULT_CHECK_INTERVAL);
        assert_eq!(
            config.effective_idle_session_timeout(),
            DEFAULT_CHECK_INTERVAL * 4
        );
        config.check_interval = Duration::from_millis(250);
        assert_eq!(
            config.effective_idle_session_timeout(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn timers_beyond_postgresqls_or_the_models_limits_are_refused_not_a_panic() {
        let config = |interval: Duration, idle: Option<Duration>| {
            let mut config = Config::new(tokio_postgres::Config::new());
            config.check_interval = interval;
            config.idle_session_timeout = idle;
            Elector::new(config)
        };
        for (interval, idle) in [
            (Duration::MAX, None),
            (Duration::from_secs(u64::MAX), None),
            (Duration::from_secs(7 * 24 * 3600), None), // T = 28 days > 24.8
            (Duration::MAX, Some(Duration::from_secs(60))),
            (Duration::from_secs(10), Some(Duration::from_secs(30))), // T = 3i: no margin
        ] {
            let refused = config(interval, idle);
            assert!(
                matches!(refused, Err(Error::Timing(_))),
                "{interval:?} {idle:?}: {refused:?}"
            );
        }
        assert!(config(Duration::from_secs(5 * 24 * 3600), None).is_ok());
        // A standby's try names every slot's key: u32::MAX of them ran out of memory at the
        // first check (an abort, not an error).
        for (slots, ok) in [
            (0, true),
            (MAX_SLOTS, true),
            (MAX_SLOTS + 1, false),
            (u32::MAX, false),
        ] {
            let mut config = Config::new(tokio_postgres::Config::new());
            config.slots = slots;
            let built = Elector::new(config);
            assert_eq!(built.is_ok(), ok, "{slots} slots: {built:?}");
            if !ok {
                assert!(matches!(built, Err(Error::Slots { .. })), "{built:?}");
            }
        }
        assert!(config(Duration::from_millis(100), None).is_ok());
    }

    #[test]
    fn server_timers_round_up_to_whole_milliseconds() {
        let mut config = Config::new(tokio_postgres::Config::new());
        config.check_interval = Duration::from_micros(200_400);
        let timers = session::server_timers(&config);
        let get = |name: &str| timers.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        assert_eq!(get("lock_timeout"), "201");
        assert_eq!(get("idle_session_timeout"), "802");
    }
}
