//! The seed's election: campaign, term, check, demote, unlock.
//!
//! # Theory of operation
//!
//! An [`Elector`] owns at most one PostgreSQL session. [`Elector::run`] checks once when it
//! starts and then every check interval:
//!
//! * **Standby.** The check runs `pg_try_advisory_lock(class, id)` (guarded by
//!   `pg_is_in_recovery()`) on the elector's one session, opening it first when there is none.
//!   A refused try leaves the session as it was, so a standby costs the server one session and
//!   one statement per interval. A failed connect or statement is logged at WARN as
//!   `leader: acquire lock connection: <cause>`, the session is thrown away (a try that failed
//!   or timed out on the client may still have been granted on the server, FIELD-NOTES
//!   PostgreSQL 3) and the replica stays a standby.
//! * **Grant.** The session becomes the lock session: `idle_session_timeout` is set on it (the
//!   seed's bound on an orphaned lock session), a fencing token is read
//!   (`txid_current()`, FIELD-NOTES PostgreSQL 12), and a new [`Term`] begins.
//! * **Leader.** The check proves ownership in one round trip: the backend that answers is the
//!   one the lock was granted to, it holds the granted `pg_locks` row for (current database,
//!   class, id, objsubid 2), and the server is not in recovery (FIELD-NOTES PostgreSQL 1). A
//!   check that fails or does not answer within one interval demotes. The session is also
//!   watched between checks: when the server closes it (terminated backend, restart), the
//!   leader demotes at once instead of at its next check (FIELD-NOTES PostgreSQL 4).
//! * **Demotion** ends the term with [`TermEnd::LeadershipLost`], turns [`Elector::is_leader`]
//!   false, sets the gauge to 0, closes the session and logs a WARN line with the cause. The
//!   lock is never tried again on that session (FIELD-NOTES PostgreSQL 2).
//! * **Cancel** ends the term with [`TermEnd::Resigned`], runs `pg_advisory_unlock` under a
//!   2-second bound that outlives the cancellation, and closes the session.
//! * **Panic or drop.** When `run` unwinds (or its future is dropped) the term ends with
//!   [`TermEnd::LeadershipLost`] and the session is closed without unlocking, since it may be
//!   mid-statement; the server frees the lock when the socket closes.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant, MissedTickBehavior};
use tokio_postgres::{Client, NoTls, Statement, ToStatement};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use crate::error::{Chain, Error};
use crate::tls::TlsSettings;

/// Default lock class: `1886156915` = `0x706C7873`, ASCII `plxs` (the seed's leader lock).
pub const DEFAULT_LOCK_CLASS: i32 = 1_886_156_915;
/// Default lock id within the class: `1` (the seed's leader lock).
pub const DEFAULT_LOCK_ID: i32 = 1;
/// Default check interval, the seed's `DefaultCheckInterval`: 5 s.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Bound on the `pg_advisory_unlock` that runs after cancellation (the seed's 2-second context).
pub const UNLOCK_BOUND: Duration = Duration::from_secs(2);
/// Name of the leadership gauge, from the seed's Metric table.
pub const GAUGE_NAME: &str = "plexsphere_background_leader";

/// A session advisory lock key in PostgreSQL's two-int4 form, `pg_try_advisory_lock(class, id)`.
///
/// `pg_locks` shows it with `classid = class`, `objid = id` (both as `oid`, so a negative int4
/// appears as its unsigned 32-bit value) and `objsubid = 2`. Displays as `class:id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    /// First int4 of the key (`classid` in `pg_locks`).
    pub class: i32,
    /// Second int4 of the key (`objid` in `pg_locks`).
    pub id: i32,
}

impl Default for LockKey {
    /// The seed's leader lock, `(1886156915, 1)`.
    fn default() -> Self {
        LockKey {
            class: DEFAULT_LOCK_CLASS,
            id: DEFAULT_LOCK_ID,
        }
    }
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.class, self.id)
    }
}

/// How an [`Elector`] connects, which lock it campaigns for, and how often it checks: the seed's
/// `leader.Config` in Rust terms.
#[derive(Clone, Debug)]
pub struct Config {
    /// Connection settings of the one session the lock is tried and held on (instead of the
    /// seed's pool). Its `connect_timeout`, when set, bounds connecting and every standby
    /// statement; otherwise the check interval does (contract §8).
    pub connect: tokio_postgres::Config,
    /// TLS: libpq's `sslmode` (including `verify-ca`/`verify-full`) and certificates. Default:
    /// `prefer`, as libpq.
    pub tls: TlsSettings,
    /// The advisory lock key; default [`LockKey::default`], the seed's `(1886156915, 1)`.
    pub lock: LockKey,
    /// How often a standby tries the lock and the leader verifies it, and how long the leader's
    /// check may take before it fails. Zero uses [`DEFAULT_CHECK_INTERVAL`], as the seed says.
    pub check_interval: Duration,
    /// `idle_session_timeout` set on the lock session at the grant. `None` uses the seed's
    /// value, 4 × check interval. The binary raises it to 3 × interval + grace when the grace
    /// is longer than one interval (contract §3). Rounded up to whole milliseconds.
    pub idle_session_timeout: Option<Duration>,
    /// A standby waits for the lock in the server's queue (`pg_advisory_lock` bounded by
    /// `lock_timeout` = one check interval) instead of trying it once per interval, so a
    /// released lock, whether unlocked or freed by a dying session, is granted to a standby at
    /// once. Still one session and about one statement per interval. `false` (the default)
    /// is the seed's fixed-interval `pg_try_advisory_lock`.
    pub wait_for_release: bool,
    /// Span the elector's events are emitted in: the seed's `Logger`. A tracing target must be
    /// a compile-time constant, so events always carry the target `leaderrun::elector`; give
    /// the span fields (a name, a replica id) to tell electors apart. Default: a disabled span.
    pub span: tracing::Span,
    /// Registry that receives the `plexsphere_background_leader` gauge (no labels; 1 while
    /// leading, 0 otherwise; the seed's Metric table) and the election's own metrics:
    /// `leaderrun_terms_started_total`, `leaderrun_checks_total{outcome}`,
    /// `leaderrun_check_duration_seconds` and `leaderrun_demotions_total{cause}`. `None`
    /// registers nothing. Electors that share a registry share these, and so write one series.
    pub registry: Option<Registry>,
}

impl Config {
    /// Settings with the seed's defaults for everything but the connection.
    pub fn new(connect: tokio_postgres::Config) -> Self {
        Config {
            connect,
            tls: TlsSettings::default(),
            lock: LockKey::default(),
            check_interval: DEFAULT_CHECK_INTERVAL,
            idle_session_timeout: None,
            wait_for_release: false,
            span: tracing::Span::none(),
            registry: None,
        }
    }

    /// The check interval in effect: [`Config::check_interval`], or the default when zero.
    pub fn effective_check_interval(&self) -> Duration {
        if self.check_interval.is_zero() {
            DEFAULT_CHECK_INTERVAL
        } else {
            self.check_interval
        }
    }

    /// The `idle_session_timeout` in effect: the configured one, else 4 × check interval.
    pub fn effective_idle_session_timeout(&self) -> Duration {
        self.idle_session_timeout
            .unwrap_or(self.effective_check_interval() * 4)
    }

    /// Bound on connecting and on a standby's statements: the DSN's `connect_timeout` when
    /// set, else the check interval (contract §8).
    pub fn io_bound(&self) -> Duration {
        self.connect
            .get_connect_timeout()
            .copied()
            .filter(|d| !d.is_zero())
            .unwrap_or_else(|| self.effective_check_interval())
    }
}

/// Why a [`Term`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermEnd {
    /// The replica lost the lock, or could not prove it held it (the seed's
    /// `ErrLeadershipLost`); also the cause after a panic in [`Elector::run`].
    LeadershipLost,
    /// [`Elector::run`] was cancelled and released the lock on purpose.
    Resigned,
}

impl std::fmt::Display for TermEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TermEnd::LeadershipLost => "leadership lost",
            TermEnd::Resigned => "leadership released",
        })
    }
}

/// What a leader knows about the lock it was granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The key that was granted.
    pub lock: LockKey,
    /// `pg_backend_pid()` of the lock session.
    pub backend_pid: i32,
    /// `txid_current()` taken on the lock session right after the grant: greater than the
    /// token of every earlier term of any replica on the same cluster (FIELD-NOTES PostgreSQL 12).
    pub fencing_token: i64,
    /// `current_database()` of the lock session (advisory locks are per database).
    pub database: String,
    /// Wall-clock time of the grant.
    pub granted_at: SystemTime,
}

struct TermInner {
    number: u64,
    lease: Option<Lease>,
    token: CancellationToken,
    end: OnceLock<TermEnd>,
    /// End of the safe window of the last check that proved the lock, as nanoseconds of
    /// [`boottime`]; 0 when nothing proved it.
    proven_until: AtomicU64,
    /// Holds on the term, and whether new ones are refused (the term ended).
    holds: watch::Sender<Holds>,
}

#[derive(Debug, Default)]
struct Holds {
    count: usize,
    closed: bool,
}

/// One continuous period of leadership, or the ended placeholder a standby hands out.
///
/// The seed's `Term(parent)`: cheap to clone; [`Term::ended`] resolves when leadership ends,
/// and [`Term::end_cause`] then tells why. On a standby, [`Elector::term`] returns a term that
/// has already ended (number 0, no lease).
///
/// # Proof and holds: the two rules every user of a term passes through
///
/// * A term carries its **proof**: the end of the safe window of the last check that proved
///   the lock ([`Term::proven_until`], on CLOCK_BOOTTIME). Work may start or continue only
///   while [`Term::is_proven`]: past the window the server may already have given the lock
///   away (contract §8, FIELD-NOTES PostgreSQL 6 and child 14). Once a window has passed it
///   never reopens; the term is as good as ended.
/// * Work that runs under a term takes a [`TermHold`] ([`Term::hold`], refused outside the
///   proof). While the lock may still be held, the elector releases it (unlock, or closing a
///   live session after a failed check) only once every hold is dropped, i.e. after the work
///   is dead (FIELD-NOTES PostgreSQL 13). The wait is bounded by the session's
///   `idle_session_timeout`, after which the server has freed an idle session's lock anyway.
#[derive(Clone)]
pub struct Term(Arc<TermInner>);

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.0.number)
            .field("lease", &self.0.lease)
            .field("end", &self.0.end.get())
            .field("proven_until", &self.proven_until())
            .finish()
    }
}

/// Work running under a [`Term`]: while any hold of a term lives, the lock is not released on
/// purpose. Drop it when the work (for the binary: COMMAND's whole tree) is dead.
#[derive(Debug)]
pub struct TermHold {
    term: Term,
}

impl TermHold {
    /// The term this hold is on.
    pub fn term(&self) -> &Term {
        &self.term
    }
}

impl Drop for TermHold {
    fn drop(&mut self) {
        self.term.0.holds.send_modify(|h| h.count -= 1);
    }
}

/// The issuing side of a [`Term`]: proves it, ends it, and waits for its holds. The
/// [`Elector`] is one issuer; tests of code that runs under terms are another.
#[derive(Debug)]
pub struct TermControl {
    term: Term,
}

impl TermControl {
    /// The term this controls.
    pub fn term(&self) -> &Term {
        &self.term
    }

    /// Records a check that proved the lock: the proof now runs until `until` (on
    /// [`boottime`]). Refused (returns false) when the proof had already run out: a passed
    /// safe window never reopens, so a late answer cannot revive a term whose work may
    /// already have been stopped elsewhere.
    pub fn prove(&self, until: Duration) -> bool {
        let now = boottime().as_nanos() as u64;
        let until = until.as_nanos() as u64;
        let mut current = self.term.0.proven_until.load(Ordering::Acquire);
        loop {
            if current <= now || self.term.is_ended() {
                return false;
            }
            match self.term.0.proven_until.compare_exchange(
                current,
                current.max(until),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    /// Ends the proof now, before the term can be ended: for an issuer that learns the lock may
    /// be gone (and for tests of what runs under a term). Like a passed window, it never
    /// reopens.
    pub fn revoke_proof(&self) {
        self.term.0.proven_until.store(1, Ordering::Release);
    }

    /// Ends the term once (later calls keep the first cause) and refuses new holds.
    pub fn end(&self, cause: TermEnd) {
        self.term.0.holds.send_modify(|h| h.closed = true);
        let _ = self.term.0.end.set(cause);
        self.term.0.token.cancel();
    }

    /// Waits until every [`TermHold`] is dropped, at most `bound`; true when they all were.
    pub async fn released(&self, bound: Duration) -> bool {
        let mut rx = self.term.0.holds.subscribe();
        let released = timeout(bound, rx.wait_for(|h| h.count == 0)).await.is_ok();
        released
    }

    /// Holds alive now.
    pub fn holds(&self) -> usize {
        self.term.0.holds.borrow().count
    }
}

impl Term {
    /// Begins term `number` with `lease`, proven until `proven_until` (on [`boottime`]).
    /// Returns the term to hand out and the control its issuer keeps.
    pub fn issue(number: u64, lease: Option<Lease>, proven_until: Duration) -> (Term, TermControl) {
        let (holds, _) = watch::channel(Holds::default());
        let term = Term(Arc::new(TermInner {
            number,
            lease,
            token: CancellationToken::new(),
            end: OnceLock::new(),
            proven_until: AtomicU64::new(proven_until.as_nanos() as u64),
            holds,
        }));
        (term.clone(), TermControl { term })
    }

    fn standby() -> Term {
        let (term, control) = Term::issue(0, None, Duration::ZERO);
        control.term.0.token.cancel();
        control.term.0.holds.send_modify(|h| h.closed = true);
        term
    }

    /// The term's number: 1, 2, … in the order this elector was granted the lock; 0 for the
    /// placeholder a standby hands out.
    pub fn number(&self) -> u64 {
        self.0.number
    }

    /// What the leader knows about its lock; `None` on a standby's placeholder.
    pub fn lease(&self) -> Option<&Lease> {
        self.0.lease.as_ref()
    }

    /// Whether the term is over (always true for a standby's placeholder).
    pub fn is_ended(&self) -> bool {
        self.0.token.is_cancelled()
    }

    /// End of the safe window of the last check that proved the lock, on [`boottime`];
    /// `None` when no check did.
    pub fn proven_until(&self) -> Option<Duration> {
        match self.0.proven_until.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Whether the term lasts and the safe window of its last proof is still open now: the
    /// one condition under which work may start or continue (contract §8).
    pub fn is_proven(&self) -> bool {
        !self.is_ended() && self.proven_until().is_some_and(|until| boottime() < until)
    }

    /// Takes a hold for work that starts now; `None` when the term is not proven (ended, or
    /// its safe window passed). See the type's docs.
    pub fn hold(&self) -> Option<TermHold> {
        if !self.is_proven() {
            return None;
        }
        let mut taken = false;
        self.0.holds.send_if_modified(|h| {
            if !h.closed {
                h.count += 1;
                taken = true;
            }
            taken
        });
        taken.then(|| TermHold { term: self.clone() })
    }

    /// Why the term ended; `None` while it lasts and for a standby's placeholder.
    pub fn end_cause(&self) -> Option<TermEnd> {
        self.0.end.get().copied()
    }

    /// Resolves when the term ends; returns the cause ([`TermEnd::LeadershipLost`] for a
    /// standby's placeholder, which never led).
    pub async fn ended(&self) -> TermEnd {
        self.0.token.cancelled().await;
        self.end_cause().unwrap_or(TermEnd::LeadershipLost)
    }

    /// The term's cancellation token, for code that already speaks tokio-util: it is cancelled
    /// when the term ends. Use [`CancellationToken::child_token`] to combine it with your own.
    pub fn token(&self) -> &CancellationToken {
        &self.0.token
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
    /// Round-trip time of the latest check's statement.
    pub last_latency: Duration,
    /// The latest failure, with its cause chain.
    pub last_error: Option<String>,
    /// Sessions opened so far: non-zero once the server has been reached at all.
    pub sessions_opened: u64,
}

struct Shared {
    config: Config,
    checks: watch::Sender<Checks>,
    target: String,
    leader: AtomicBool,
    running: AtomicBool,
    terms: AtomicU64,
    current: watch::Sender<Term>,
    metrics: Option<Arc<ElectorMetrics>>,
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
    /// [`Error::Metrics`] when the metrics cannot be registered on [`Config::registry`].
    pub fn new(config: Config) -> Result<Elector, Error> {
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
                target: crate::conninfo::describe(&config.connect),
                config,
                leader: AtomicBool::new(false),
                running: AtomicBool::new(false),
                terms: AtomicU64::new(0),
                current,
                metrics,
            }),
        })
    }

    /// The configuration this elector was built with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Whether this replica holds the lock right now: one atomic load, lock-free, safe from any
    /// thread (the seed's `IsLeader`).
    pub fn is_leader(&self) -> bool {
        self.shared.leader.load(Ordering::Acquire)
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
        drop(hold);
        if term.end_cause() == Some(TermEnd::LeadershipLost) {
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
    /// On cancel, ends the term, unlocks under [`UNLOCK_BOUND`] and closes the session.
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
            session: None,
            term: None,
            finished: false,
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

/// The election's metrics on one registry.
struct ElectorMetrics {
    leader: IntGauge,
    terms: IntCounter,
    checks: IntCounterVec,
    check_seconds: Histogram,
    demotions: IntCounterVec,
}

impl ElectorMetrics {
    fn new() -> Result<ElectorMetrics, prometheus::Error> {
        Ok(ElectorMetrics {
            leader: IntGauge::new(GAUGE_NAME, "1 while this replica leads, 0 otherwise")?,
            terms: IntCounter::new(
                "leaderrun_terms_started_total",
                "Terms this replica began (lock grants).",
            )?,
            checks: IntCounterVec::new(
                Opts::new(
                    "leaderrun_checks_total",
                    "Checks by outcome: granted, refused, verified, lost, failed.",
                ),
                &["outcome"],
            )?,
            check_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "leaderrun_check_duration_seconds",
                    "Time one check took, connect included.",
                )
                .buckets(vec![
                    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ]),
            )?,
            demotions: IntCounterVec::new(
                Opts::new(
                    "leaderrun_demotions_total",
                    "Demotions by cause: session_closed, timeout, check_failed, lock_not_held, \
                     backend_changed, in_recovery, safe_window_passed, abandoned.",
                ),
                &["cause"],
            )?,
        })
    }

    fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.leader.clone()))?;
        registry.register(Box::new(self.terms.clone()))?;
        registry.register(Box::new(self.checks.clone()))?;
        registry.register(Box::new(self.check_seconds.clone()))?;
        registry.register(Box::new(self.demotions.clone()))?;
        Ok(())
    }
}

/// The label of a demotion's cause in `leaderrun_demotions_total`.
fn demotion_cause(err: &Error) -> &'static str {
    match err {
        Error::SessionClosed(_) => "session_closed",
        Error::Timeout { .. } => "timeout",
        Error::LockNotHeld { .. } => "lock_not_held",
        Error::BackendChanged { .. } => "backend_changed",
        Error::InRecovery { .. } => "in_recovery",
        Error::SafeWindowPassed { .. } => "safe_window_passed",
        e if e.is_closed() => "session_closed",
        _ => "check_failed",
    }
}

/// Client-side TCP timers (FIELD-NOTES PostgreSQL 5): keepalives so a vanished server is
/// noticed between checks, and `TCP_USER_TIMEOUT` so a check stuck in retransmission fails
/// within 2 check intervals instead of the kernel's minutes.
fn pin_client_timers(config: &mut Config) {
    let interval = config.effective_check_interval();
    let second = Duration::from_secs(1);
    // The kernel takes at most 32767 s for keepalive times and i32::MAX ms for TCP_USER_TIMEOUT.
    let keepalive_max = Duration::from_secs(32_767);
    config
        .connect
        .keepalives(true)
        .keepalives_idle(interval.clamp(second, keepalive_max))
        .keepalives_interval((interval / 2).clamp(second, keepalive_max))
        .keepalives_retries(3)
        .tcp_user_timeout((interval * 2).min(Duration::from_millis(i32::MAX as u64)));
}

/// The server-side timers pinned on every session right after connect (FIELD-NOTES
/// PostgreSQL 5): role or database defaults may differ, so they are set with `set_config` and
/// read back. Values are in the GUCs' base units (ms, or s for the keepalives).
fn server_timers(config: &Config) -> Vec<(&'static str, String)> {
    let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128).to_string();
    let secs = |d: Duration| d.as_secs_f64().ceil().clamp(1.0, 32_767.0).to_string();
    let bound = config.io_bound();
    let idle = config.effective_idle_session_timeout();
    vec![
        // A waiting standby's statement lasts up to one interval (lock_timeout) by design.
        (
            "statement_timeout",
            ms(bound + config.effective_check_interval()),
        ),
        ("lock_timeout", ms(config.effective_check_interval())),
        ("idle_in_transaction_session_timeout", ms(idle)),
        // The seed's bound on an orphaned lock session, from the moment the session may ask
        // for the lock (FIELD-NOTES PostgreSQL 14): a grant that reaches a client that stopped
        // listening is freed within it. A standby is never idle that long: it runs a statement
        // every interval, or waits in one.
        ("idle_session_timeout", ms(idle)),
        // The server's own fallback for a vanished client (and the only bound before
        // PostgreSQL 14): about idle_session_timeout in all.
        ("tcp_keepalives_idle", secs(idle / 2)),
        ("tcp_keepalives_interval", secs(idle / 8)),
        ("tcp_keepalives_count", "4".to_owned()),
        ("tcp_user_timeout", ms(idle)),
    ]
}

/// Finds the election metrics already registered on `registry`, or registers new ones.
///
/// prometheus' `AlreadyReg` does not hand back the existing collector (Go's does), so electors
/// remember which registries they registered on. Registry identity is tested by registering a
/// throw-away collector with a unique name on one registry and seeing whether the other
/// refuses it as already registered; both registrations are undone at once.
fn shared_metrics(registry: &Registry) -> Result<Arc<ElectorMetrics>, Error> {
    static KNOWN: Mutex<Vec<(Registry, Arc<ElectorMetrics>)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    for (other, metrics) in known.iter() {
        if same_registry(other, registry) {
            return Ok(metrics.clone());
        }
    }
    let metrics = Arc::new(ElectorMetrics::new().map_err(Error::Metrics)?);
    metrics.register(registry).map_err(Error::Metrics)?;
    known.push((registry.clone(), metrics.clone()));
    Ok(metrics)
}

fn same_registry(a: &Registry, b: &Registry) -> bool {
    use prometheus::core::{Collector, Desc};
    use prometheus::proto::MetricFamily;

    #[derive(Clone)]
    struct Probe(Desc);
    impl Collector for Probe {
        fn desc(&self) -> Vec<&Desc> {
            vec![&self.0]
        }
        fn collect(&self) -> Vec<MetricFamily> {
            Vec::new()
        }
    }

    static PROBES: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "leaderrun_registry_probe_{}",
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let Ok(desc) = Desc::new(
        name,
        "identity probe".into(),
        Vec::new(),
        Default::default(),
    ) else {
        return false;
    };
    let probe = Probe(desc);
    if a.register(Box::new(probe.clone())).is_err() {
        return false;
    }
    let same = matches!(
        b.register(Box::new(probe.clone())),
        Err(prometheus::Error::AlreadyReg)
    );
    if !same {
        let _ = b.unregister(Box::new(probe.clone()));
    }
    let _ = a.unregister(Box::new(probe));
    same
}

/// A connected client, a receiver that resolves when the connection ends (with its error, if
/// any), and the task that drives the connection (abort it to close the socket at once).
pub type Connected = (
    Client,
    oneshot::Receiver<Option<tokio_postgres::Error>>,
    JoinHandle<()>,
);

/// Connects with `config` and `tls`, bounded by `bound`; the connection is driven on its own
/// task. `target` is the redacted description used in errors.
///
/// # Errors
/// [`Error::Connect`] when the server refuses, TLS verification fails or authentication
/// fails; [`Error::Tls`] when the TLS settings cannot be used; [`Error::Timeout`].
pub async fn connect(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    target: &str,
    bound: Duration,
) -> Result<Connected, Error> {
    let mut config = config.clone();
    // libpq never uses TLS over a Unix socket, whatever sslmode says.
    let unix_only = config
        .get_hosts()
        .iter()
        .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let use_tls = tls.enabled() && !unix_only;
    config.ssl_mode(if use_tls {
        tls.driver_mode()
    } else {
        tokio_postgres::config::SslMode::Disable
    });
    if use_tls {
        let connector = tls.connector().map_err(Error::Tls)?;
        drive(
            timeout(bound, config.connect(connector)).await,
            target,
            bound,
        )
    } else {
        drive(timeout(bound, config.connect(NoTls)).await, target, bound)
    }
}

/// What a connect bounded by a timeout yields.
type Bounded<S, T> = Result<
    Result<(Client, tokio_postgres::Connection<S, T>), tokio_postgres::Error>,
    tokio::time::error::Elapsed,
>;

/// Spawns the connection future of a finished connect.
fn drive<S, T>(connected: Bounded<S, T>, target: &str, bound: Duration) -> Result<Connected, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = match connected {
        Ok(Ok(pair)) => pair,
        Ok(Err(source)) => {
            return Err(Error::Connect {
                target: target.to_owned(),
                source,
            })
        }
        Err(_) => {
            return Err(Error::Timeout {
                what: "connect",
                after: bound,
            })
        }
    };
    let (tx, closed) = oneshot::channel();
    let task = tokio::spawn(async move {
        let _ = tx.send(connection.await.err());
    });
    Ok((client, closed, task))
}

/// The one database session of an elector, with its connection driven on its own task.
struct Session {
    /// `None` only while [`Session::close`] runs.
    client: Option<Client>,
    backend_pid: i32,
    /// The standby's try, prepared once per session so each check is one round trip.
    try_lock: Option<Statement>,
    /// The leader's check, prepared at the grant; its text carries the term, so that
    /// `pg_stat_activity.query` of the lock session tells `leaderrun status` since when it leads.
    check: Option<Statement>,
    /// Resolves when the connection task ends: the server closed the session or the socket
    /// broke. Polled at most until it resolves (the session is discarded then).
    closed: oneshot::Receiver<Option<tokio_postgres::Error>>,
    task: JoinHandle<()>,
}

impl Session {
    async fn open(config: &Config, target: &str) -> Result<Session, Error> {
        let bound = config.io_bound();
        let (client, closed, task) = connect(&config.connect, &config.tls, target, bound).await?;
        let mut session = Session {
            client: Some(client),
            backend_pid: 0,
            try_lock: None,
            check: None,
            closed,
            task,
        };
        session.backend_pid = session.pin_timers(config, bound).await?;
        // One round trip: a hot standby grants advisory locks of its own, so never even try
        // there (FIELD-NOTES PostgreSQL 7). NULL means "in recovery".
        // With `wait_for_release` the standby waits in the server's lock queue, bounded by
        // `lock_timeout` (one interval): a released lock is granted to it at once.
        let sql = if config.wait_for_release {
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL \
             ELSE (SELECT true FROM (SELECT pg_advisory_lock($1, $2)) AS waited) END"
        } else {
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL \
             ELSE pg_try_advisory_lock($1, $2) END"
        };
        session.try_lock = Some(
            session
                .prepare("prepare the lock statement", bound, sql)
                .await?,
        );
        Ok(session)
    }

    /// Sets [`server_timers`] and reads them back from `pg_settings`; a value the server did
    /// not take is logged at WARN (the TCP ones only matter, and only stick, over TCP). Returns
    /// `pg_backend_pid()`, read in the same round trip.
    async fn pin_timers(&self, config: &Config, bound: Duration) -> Result<i32, Error> {
        let timers = server_timers(config);
        let names: Vec<&str> = timers.iter().map(|(n, _)| *n).collect();
        let values: Vec<&str> = timers.iter().map(|(_, v)| v.as_str()).collect();
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        // Only settings the server has: idle_session_timeout is new in PostgreSQL 14.
        let set = "SELECT set_config(w.name, w.value, false) \
                   FROM unnest($1::text[], $2::text[]) AS w(name, value) \
                   WHERE EXISTS (SELECT 1 FROM pg_settings s WHERE s.name = w.name)";
        let read = "SELECT name, setting, inet_server_addr() IS NULL, pg_backend_pid() \
                    FROM pg_settings WHERE name = ANY($1::text[])";
        let both = async {
            client.query(set, &[&names, &values]).await?;
            client.query(read, &[&names]).await
        };
        let rows = match timeout(bound, both).await {
            Ok(Ok(rows)) => rows,
            Ok(Err(source)) => {
                return Err(Error::Query {
                    what: "pin session timers",
                    source,
                })
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: "pin session timers",
                    after: bound,
                })
            }
        };
        let mut backend_pid = None;
        if !rows
            .iter()
            .any(|r| r.get::<_, String>(0) == "idle_session_timeout")
        {
            warn!(
                target: "leaderrun::elector",
                "leader: server has no idle_session_timeout (PostgreSQL before 14): \
                 an orphaned lock session is bounded only by TCP keepalives"
            );
        }
        for row in rows {
            let name: String = row.get(0);
            let setting: String = row.get(1);
            let unix_socket: bool = row.get(2);
            backend_pid = Some(row.get::<_, i32>(3));
            if unix_socket && name.starts_with("tcp_") {
                continue;
            }
            let wanted = timers.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
            if wanted.is_some_and(|w| *w != setting) {
                warn!(
                    target: "leaderrun::elector",
                    "leader: the server did not take {name} = {} (it has {setting})",
                    wanted.map(String::as_str).unwrap_or_default()
                );
            }
        }
        match backend_pid {
            Some(pid) => Ok(pid),
            None => Ok(self
                .bounded("read backend pid", bound, "SELECT pg_backend_pid()", &[])
                .await?
                .get(0)),
        }
    }

    /// Prepares a statement, bounded by `bound`.
    async fn prepare(
        &self,
        what: &'static str,
        bound: Duration,
        sql: &str,
    ) -> Result<Statement, Error> {
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        match timeout(bound, client.prepare(sql)).await {
            Ok(Ok(statement)) => Ok(statement),
            Ok(Err(source)) => Err(Error::Query { what, source }),
            Err(_) => Err(Error::Timeout { what, after: bound }),
        }
    }

    /// Runs one statement that returns one row, bounded by `bound`.
    async fn bounded<S: ToStatement + ?Sized>(
        &self,
        what: &'static str,
        bound: Duration,
        sql: &S,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, Error> {
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        match timeout(bound, client.query_one(sql, params)).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(source)) => Err(Error::Query { what, source }),
            Err(_) => Err(Error::Timeout { what, after: bound }),
        }
    }

    /// Closes the session politely (Terminate message) and waits briefly for the socket to
    /// close, so that a released lock reaches the standbys before `run` returns.
    async fn close(mut self) {
        // Dropping the only client makes the connection send Terminate and finish.
        drop(self.client.take());
        let _ = timeout(Duration::from_secs(1), &mut self.task).await;
        // Drop aborts the task if it is still running.
    }
}

impl Drop for Session {
    /// A dropped session (demotion, failed try, panic) closes its socket now, which makes the
    /// server end the backend and free any lock it held.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Resolves when the session's connection ends; pending forever without a session.
async fn session_closed(session: &mut Option<Session>) -> Option<tokio_postgres::Error> {
    match session {
        Some(s) => (&mut s.closed).await.unwrap_or(None),
        None => std::future::pending().await,
    }
}

/// Reads CLOCK_BOOTTIME: monotonic, and it keeps running while the machine sleeps
/// (FIELD-NOTES PostgreSQL 6), unlike tokio's clock.
pub fn boottime() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default()
}

/// How one check phase of the campaign ended.
enum Phase {
    Checked(Result<(), Error>),
    Unsafe,
    Cancelled,
}

/// One call of [`Elector::run`]: the state that must be cleaned up however the call ends.
struct Campaign<'a> {
    shared: &'a Shared,
    session: Option<Session>,
    /// The term while leading. Its proof ends 2 check intervals after the send time of the
    /// last check that proved the lock (or of the grant); past it the server may already have
    /// given the lock away (contract §8), so the leader demotes without asking.
    term: Option<TermControl>,
    /// Set when `run` returns normally; a `Campaign` dropped without it was unwound by a panic
    /// or dropped mid-await.
    finished: bool,
}

const LOCK_ROW_SQL: &str = "SELECT pg_backend_pid(), \
     EXISTS (SELECT 1 FROM pg_locks \
             WHERE locktype = 'advisory' \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND classid = $1 AND objid = $2 AND objsubid = 2 \
               AND pid = pg_backend_pid() AND granted), \
     pg_is_in_recovery()";

impl Campaign<'_> {
    async fn run(&mut self, cancel: &CancellationToken) {
        let interval = self.shared.config.effective_check_interval();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Compares the safe window with CLOCK_BOOTTIME often, so a resume after a suspend or a
        // SIGSTOP is noticed even before the (monotonic) check timer fires.
        let mut safety = tokio::time::interval(
            (interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(250)),
        );
        safety.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = safety.tick() => {
                    if self.window_passed() {
                        self.demote_unsafe().await;
                        ticker.reset();
                    }
                    continue;
                }
                closed = session_closed(&mut self.session) => {
                    let led = self.term.is_some();
                    self.on_session_closed(closed);
                    if led {
                        ticker.reset();
                    }
                    continue;
                }
                _ = ticker.tick() => {}
            }
            let leading = self.term.is_some();
            let proven_until = self.term.as_ref().and_then(|t| t.term().proven_until());
            let phase = {
                let check = async {
                    if self.term.is_some() {
                        self.verify().await
                    } else {
                        self.try_acquire().await;
                        Ok(())
                    }
                };
                tokio::pin!(check);
                loop {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break Phase::Cancelled,
                        _ = safety.tick(), if leading => {
                            if proven_until.is_some_and(|until| boottime() >= until) {
                                break Phase::Unsafe;
                            }
                        }
                        result = &mut check => break Phase::Checked(result),
                    }
                }
            };
            match phase {
                Phase::Checked(Ok(())) => {}
                Phase::Checked(Err(err)) => {
                    // The check failed on a live session: the lock may still be held, so the
                    // work stops before it is released (FIELD-NOTES PostgreSQL 13).
                    self.demote(&err).await;
                    // The next try is one full interval away.
                    ticker.reset();
                }
                Phase::Unsafe => {
                    // The check in flight is abandoned; the session goes once the work is dead.
                    self.demote_unsafe().await;
                    ticker.reset();
                }
                Phase::Cancelled => {
                    // A try that was in flight may have been granted on the server: a standby
                    // drops its session (closing it frees any such grant). A leader keeps its
                    // session so that `resign` can unlock it.
                    if self.term.is_none() {
                        self.session = None;
                    }
                    return;
                }
            }
        }
    }

    /// Whether the leader's safe window (2 check intervals from the send time of its last good
    /// check, on CLOCK_BOOTTIME) has passed.
    fn window_passed(&self) -> bool {
        self.term
            .as_ref()
            .is_some_and(|t| t.term().proven_until().is_some_and(|u| boottime() >= u))
    }

    /// Demotes because the safe window passed, without a round trip.
    async fn demote_unsafe(&mut self) {
        let Some(until) = self.term.as_ref().and_then(|t| t.term().proven_until()) else {
            return;
        };
        let window = self.shared.config.effective_check_interval() * 2;
        let since = boottime().saturating_sub(until) + window;
        self.demote(&Error::SafeWindowPassed { since }).await;
    }

    /// The server ended the session: the lock is gone with it, so there is nothing to hold
    /// back; the term ends at once (FIELD-NOTES PostgreSQL 4).
    fn on_session_closed(&mut self, cause: Option<tokio_postgres::Error>) {
        self.session = None;
        if let Some(control) = self.end_term(TermEnd::LeadershipLost) {
            let cause = Error::SessionClosed(cause);
            self.count_demotion(&cause);
            warn!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "background leader lock lost: {}",
                Chain(&cause)
            );
        } else {
            debug!(target: "leaderrun::elector", "standby session closed by the server; reconnecting at the next check");
        }
    }

    async fn try_acquire(&mut self) {
        let started = Instant::now();
        let sent = boottime();
        match self.try_acquire_inner(started, sent).await {
            // begin_term recorded it, before publishing the term.
            Ok(CheckOutcome::Granted) => {}
            Ok(outcome) => self.record(outcome, started, None),
            Err(err @ Error::InRecovery { .. }) => {
                error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(err @ Error::SharedBackend) => {
                error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                // Closing the client does not end a pooled server session: give the lock back.
                if let Some(session) = self.session.take() {
                    let lock = self.shared.config.lock;
                    let _ = session
                        .bounded(
                            "unlock",
                            UNLOCK_BOUND,
                            "SELECT pg_advisory_unlock($1, $2)",
                            &[&lock.class, &lock.id],
                        )
                        .await;
                }
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
            Err(err) => {
                // FIELD-NOTES PostgreSQL 3: whatever failed, the session may hold a grant we
                // never saw; never reuse it.
                self.session = None;
                warn!(target: "leaderrun::elector", "leader: acquire lock connection: {}", Chain(&err));
                self.record(CheckOutcome::Failed, started, Some(&err));
            }
        }
    }

    /// Publishes one check's outcome in [`Checks`].
    fn record(&self, outcome: CheckOutcome, started: Instant, error: Option<&Error>) {
        let now = Instant::now();
        if let Some(metrics) = &self.shared.metrics {
            let label = match outcome {
                CheckOutcome::Granted => "granted",
                CheckOutcome::Refused => "refused",
                CheckOutcome::Verified => "verified",
                CheckOutcome::Lost => "lost",
                CheckOutcome::Failed => "failed",
            };
            metrics.checks.with_label_values(&[label]).inc();
            metrics.check_seconds.observe((now - started).as_secs_f64());
        }
        self.shared.checks.send_modify(|checks| {
            checks.total += 1;
            match outcome {
                CheckOutcome::Refused => checks.refused += 1,
                CheckOutcome::Failed => checks.failed += 1,
                _ => {}
            }
            checks.last = Some(outcome);
            checks.last_at = Some(now);
            checks.last_latency = now - started;
            if !matches!(outcome, CheckOutcome::Failed | CheckOutcome::Lost) {
                checks.last_success_at = Some(now);
            }
            if let Some(err) = error {
                checks.last_error = Some(Chain(err).to_string());
            }
        });
    }

    async fn try_acquire_inner(
        &mut self,
        started: Instant,
        sent: Duration,
    ) -> Result<CheckOutcome, Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        if self.session.is_none() {
            self.session = Some(Session::open(config, &self.shared.target).await?);
            self.shared.checks.send_modify(|c| c.sessions_opened += 1);
        }
        let Some(session) = self.session.as_ref() else {
            return Ok(CheckOutcome::Failed);
        };
        let Some(statement) = session.try_lock.as_ref() else {
            return Ok(CheckOutcome::Failed);
        };
        let lock = config.lock;
        // A waiting try ends on the server (lock_timeout, one interval) before the client's
        // bound; only a client-side timeout means "unknown outcome" (FIELD-NOTES PostgreSQL 3).
        let bound = if config.wait_for_release {
            config.effective_check_interval() + bound
        } else {
            bound
        };
        let row = match session
            .bounded(
                "try advisory lock",
                bound,
                statement,
                &[&lock.class, &lock.id],
            )
            .await
        {
            Err(Error::Query { source, .. })
                if config.wait_for_release
                    && source.code()
                        == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
            {
                debug!(target: "leaderrun::elector", lock = %lock, "lock held by another session for a whole interval; standing by");
                return Ok(CheckOutcome::Refused);
            }
            other => other?,
        };
        match row.get::<_, Option<bool>>(0) {
            None => Err(Error::InRecovery {
                server: self.shared.target.clone(),
            }),
            Some(false) => {
                debug!(target: "leaderrun::elector", lock = %lock, "lock held by another session; standing by");
                Ok(CheckOutcome::Refused)
            }
            Some(true) => self
                .begin_term(started, sent)
                .await
                .map(|()| CheckOutcome::Granted),
        }
    }

    /// The lock was granted on the current session: make it the lock session and start a term.
    ///
    /// `started` and `sent` are the check's start (monotonic) and send time (boottime): the
    /// check is recorded and the safe window set before the term is published, so nobody
    /// observes a term without the check that granted it.
    async fn begin_term(&mut self, started: Instant, sent: Duration) -> Result<(), Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        if self.session.is_none() {
            return Ok(());
        }
        let idle = config.effective_idle_session_timeout();
        // Behind a transaction-mode pooler two client sessions can share one server backend,
        // and a session lock then excludes nothing. Prove exclusion once per grant with a
        // second session (FIELD-NOTES PostgreSQL 8).
        self.probe_exclusion().await?;
        let Some(session) = self.session.as_ref() else {
            return Ok(());
        };
        let row = session
            .bounded(
                "read fencing token",
                bound,
                "SELECT txid_current(), current_database()",
                &[],
            )
            .await?;
        let number = self.shared.terms.load(Ordering::Acquire) + 1;
        let lease = Lease {
            lock: config.lock,
            backend_pid: session.backend_pid,
            fencing_token: row.get(0),
            database: row.get(1),
            granted_at: SystemTime::now(),
        };
        // The comment is what `leaderrun status` reads back from pg_stat_activity.query; every
        // value in it is a number or a timestamp we formatted.
        let check_sql = format!(
            "/* leaderrun term={number} since={} fencing_token={} */ {LOCK_ROW_SQL}",
            humantime::format_rfc3339_seconds(lease.granted_at),
            lease.fencing_token
        );
        let check = session
            .prepare("prepare the leader check", bound, &check_sql)
            .await?;
        if let Some(session) = self.session.as_mut() {
            session.check = Some(check);
        }
        self.shared.terms.store(number, Ordering::Release);
        // The grant is the term's first proof: its window counts from the try's send time.
        let (term, control) = Term::issue(
            number,
            Some(lease.clone()),
            sent + config.effective_check_interval() * 2,
        );
        self.term = Some(control);
        self.shared.leader.store(true, Ordering::Release);
        if let Some(metrics) = &self.shared.metrics {
            metrics.leader.set(1);
            metrics.terms.inc();
        }
        self.record(CheckOutcome::Granted, started, None);
        self.shared.current.send_replace(term);
        info!(
            target: "leaderrun::elector",
            term = number,
            backend_pid = lease.backend_pid,
            database = %lease.database,
            server = %crate::conninfo::endpoint(&self.shared.config.connect),
            lock = %lease.lock,
            fencing_token = lease.fencing_token,
            idle_session_timeout_ms = idle.as_millis() as u64,
            "background leader lock acquired"
        );
        Ok(())
    }

    /// Opens a second session and tries the lock this session was just granted: it must be
    /// refused. Granted means both sessions reached one server backend (a transaction-mode
    /// pooler); the probe's extra hold is released again.
    async fn probe_exclusion(&self) -> Result<(), Error> {
        let config = &self.shared.config;
        let bound = config.io_bound();
        let lock = config.lock;
        let (client, _closed, _task) =
            connect(&config.connect, &config.tls, &self.shared.target, bound).await?;
        // The simple protocol: no named prepared statement that a pooler could mix up; the
        // key is two integers.
        let try_sql = format!("SELECT pg_try_advisory_lock({}, {})", lock.class, lock.id);
        let unlock_sql = format!("SELECT pg_advisory_unlock({}, {})", lock.class, lock.id);
        let granted = match timeout(bound, client.simple_query(&try_sql)).await {
            Ok(Ok(messages)) => messages.iter().any(|m| {
                matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("t"))
            }),
            Ok(Err(source)) => {
                return Err(Error::Query {
                    what: "probe exclusion",
                    source,
                })
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: "probe exclusion",
                    after: bound,
                })
            }
        };
        if granted {
            let _ = timeout(bound, client.simple_query(&unlock_sql)).await;
            return Err(Error::SharedBackend);
        }
        Ok(())
    }

    /// The leader's check: proves in one round trip that this session still holds the lock.
    /// `Err` is the cause to demote with; the session is left as it is for [`Self::demote`].
    async fn verify(&mut self) -> Result<(), Error> {
        let Some(session) = self.session.as_ref() else {
            return Ok(());
        };
        let Some(statement) = session.check.as_ref() else {
            return Ok(());
        };
        // After a suspend or a SIGSTOP: no round trip once the safe window has passed.
        if self.window_passed() {
            let until = self
                .term
                .as_ref()
                .and_then(|t| t.term().proven_until())
                .unwrap_or_default();
            let window = self.shared.config.effective_check_interval() * 2;
            return Err(Error::SafeWindowPassed {
                since: boottime().saturating_sub(until) + window,
            });
        }
        let sent = boottime();
        let config = &self.shared.config;
        let bound = config.effective_check_interval().min(config.io_bound());
        let lock = config.lock;
        // pg_locks shows the int4 halves as oid, i.e. unsigned.
        let (class, id) = (lock.class as u32, lock.id as u32);
        let started = Instant::now();
        let result = session
            .bounded("leader check", bound, statement, &[&class, &id])
            .await
            .and_then(|row| {
                let pid: i32 = row.get(0);
                let held: bool = row.get(1);
                let in_recovery: bool = row.get(2);
                if pid != session.backend_pid {
                    Err(Error::BackendChanged {
                        granted_to: session.backend_pid,
                        now: pid,
                    })
                } else if in_recovery {
                    Err(Error::InRecovery {
                        server: self.shared.target.clone(),
                    })
                } else if !held {
                    Err(Error::LockNotHeld {
                        lock,
                        backend_pid: pid,
                    })
                } else {
                    Ok(())
                }
            });
        let window = config.effective_check_interval() * 2;
        // An answer that arrives after the window closed proves nothing any more.
        let result = result.and_then(|()| match &self.term {
            Some(control) if !control.prove(sent + window) => Err(Error::SafeWindowPassed {
                since: boottime().saturating_sub(sent),
            }),
            _ => Ok(()),
        });
        match result {
            Ok(()) => {
                self.record(CheckOutcome::Verified, started, None);
                debug!(target: "leaderrun::elector", latency_ms = started.elapsed().as_millis() as u64, "leader check ok");
                Ok(())
            }
            Err(err) => {
                if matches!(err, Error::BackendChanged { .. } | Error::InRecovery { .. }) {
                    error!(target: "leaderrun::elector", "leader: {}", Chain(&err));
                }
                self.record(CheckOutcome::Lost, started, Some(&err));
                Err(err)
            }
        }
    }

    fn count_demotion(&self, cause: &Error) {
        if let Some(metrics) = &self.shared.metrics {
            metrics
                .demotions
                .with_label_values(&[demotion_cause(cause)])
                .inc();
        }
    }

    /// The seed's demotion, with the release after the work: end the term (every holder sees
    /// it at once), log the cause, and close the session only once every [`TermHold`] is
    /// dropped, since a session that is still open may still hold the lock (FIELD-NOTES
    /// PostgreSQL 13). Nothing is sent on the session meanwhile, so the server's
    /// `idle_session_timeout` bounds the wait; so does this one.
    async fn demote(&mut self, cause: &Error) {
        let Some(control) = self.end_term(TermEnd::LeadershipLost) else {
            return;
        };
        self.count_demotion(cause);
        warn!(
            target: "leaderrun::elector",
            term = control.term().number(),
            "background leader lock lost: {}",
            Chain(cause)
        );
        let session = self.session.take();
        self.release_after_holds(&control, session.is_some()).await;
        drop(session);
    }

    /// Waits for the holds of `control`'s term, bounded by `idle_session_timeout`.
    async fn release_after_holds(&self, control: &TermControl, may_hold_lock: bool) {
        if control.holds() == 0 || !may_hold_lock {
            return;
        }
        debug!(
            target: "leaderrun::elector",
            term = control.term().number(),
            "keeping the lock session until the term's work has stopped"
        );
        let bound = self.shared.config.effective_idle_session_timeout();
        if !control.released(bound).await {
            warn!(
                target: "leaderrun::elector",
                term = control.term().number(),
                "the work of the term still runs after idle_session_timeout ({}); \
                 releasing the lock session anyway",
                humantime::format_duration(bound)
            );
        }
    }

    /// Ends the current term, if any: IsLeader false, gauge 0, standby placeholder published.
    fn end_term(&mut self, cause: TermEnd) -> Option<TermControl> {
        let control = self.term.take()?;
        self.shared.leader.store(false, Ordering::Release);
        if let Some(metrics) = &self.shared.metrics {
            metrics.leader.set(0);
        }
        self.shared.current.send_replace(Term::standby());
        control.end(cause);
        Some(control)
    }

    /// After cancellation: end the term, unlock under the 2-second bound, close.
    async fn resign(&mut self) {
        let control = self.end_term(TermEnd::Resigned);
        if let Some(control) = &control {
            self.release_after_holds(control, self.session.is_some())
                .await;
        }
        let Some(session) = self.session.take() else {
            return;
        };
        if let Some(control) = control {
            let term = control.term();
            let lock = self.shared.config.lock;
            match session
                .bounded(
                    "unlock",
                    UNLOCK_BOUND,
                    "SELECT pg_advisory_unlock($1, $2)",
                    &[&lock.class, &lock.id],
                )
                .await
            {
                Ok(_) => info!(
                    target: "leaderrun::elector",
                    term = term.number(),
                    lock = %lock,
                    "background leader lock released"
                ),
                Err(err) => warn!(
                    target: "leaderrun::elector",
                    term = term.number(),
                    "leader: unlock failed; the server frees the lock when the session closes: {}",
                    Chain(&err)
                ),
            }
        }
        session.close().await;
    }
}

impl Campaign<'_> {
    /// Leaves the election without unlocking: after a panic, or when `run`'s future is dropped
    /// mid-await. The session may be mid-statement, so it is closed instead; the server frees
    /// the lock when the socket closes.
    fn abandon(&mut self, panicked: bool) {
        let led = self.end_term(TermEnd::LeadershipLost);
        let session = self.session.take();
        if let (Some(control), Some(session)) = (&led, session) {
            // Work may still run under the term: the session (and maybe the lock) stays until
            // it is dead, as in every other demotion, on a task of its own since this runs in
            // a drop. Nothing is sent on it: it may be mid-statement.
            if control.holds() > 0 {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let held = TermControl {
                        term: control.term().clone(),
                    };
                    let bound = self.shared.config.effective_idle_session_timeout();
                    runtime.spawn(async move {
                        held.released(bound).await;
                        drop(session);
                    });
                }
            }
        }
        if led.is_some() {
            if let Some(metrics) = &self.shared.metrics {
                metrics.demotions.with_label_values(&["abandoned"]).inc();
            }
            if panicked {
                warn!(target: "leaderrun::elector", "background leader lock abandoned after a panic");
            } else {
                warn!(target: "leaderrun::elector", "background leader lock abandoned: the election was dropped mid-run");
            }
        }
    }
}

impl Drop for Campaign<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.abandon(std::thread::panicking());
        }
        self.shared.running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_interval_uses_the_default() {
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
    fn default_key_is_the_seeds() {
        let key = LockKey::default();
        assert_eq!(key.class, 0x706C_7873);
        assert_eq!(&key.class.to_be_bytes(), b"plxs");
        assert_eq!(key.to_string(), "1886156915:1");
    }

    #[test]
    fn registry_identity() {
        let a = Registry::new();
        let b = Registry::new();
        assert!(same_registry(&a, &a.clone()));
        assert!(!same_registry(&a, &b));
        // Probes leave nothing behind.
        assert!(a.gather().is_empty());
        assert!(b.gather().is_empty());
    }
}
