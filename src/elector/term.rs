//! A term of leadership, its proof and its holds (see [`Term`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::session::boottime;

use crate::pg::lock::LockKey;

/// Why a [`Term`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermEnd {
    /// The replica lost the lock, or could not prove it held it (the seed's
    /// `ErrLeadershipLost`); also the cause after a panic in [`Elector::run`](crate::Elector::run).
    LeadershipLost,
    /// [`Elector::run`](crate::Elector::run) was cancelled and released the lock on purpose.
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
    /// The key that was granted: the slot's key ([`LockKey::slot`]).
    pub lock: LockKey,
    /// The slot that was granted, 0 … N−1 (`LEADERRUN_SLOT`); 0 for a lock of one slot.
    pub slot: u32,
    /// `pg_backend_pid()` of the lock session.
    pub backend_pid: i32,
    /// `txid_current()` taken on the lock session right after the grant, and flushed to the
    /// server's WAL before the answer: greater than the token of every earlier term of any
    /// replica on the same cluster, across a crash of the server too
    /// (docs/field-notes.md#the-fencing-number-comes-from-the-server,
    /// docs/field-notes.md#a-fencing-number-must-survive-a-crash).
    pub fencing_token: i64,
    /// `current_database()` of the lock session (advisory locks are per database).
    pub database: String,
    /// Wall-clock time of the grant.
    pub granted_at: SystemTime,
}

pub(crate) struct TermInner {
    pub(crate) number: u64,
    pub(crate) lease: Option<Lease>,
    pub(crate) token: CancellationToken,
    pub(crate) end: OnceLock<TermEnd>,
    /// End of the safe window of the last check that proved the lock, as nanoseconds of
    /// [`boottime`]; 0 when nothing proved it.
    pub(crate) proven_until: AtomicU64,
    /// Holds on the term, and whether new ones are refused (the term ended).
    pub(crate) holds: watch::Sender<Holds>,
    /// Its holder gave it up ([`Term::give_up`]): the next check ends it.
    pub(crate) given_up: std::sync::atomic::AtomicBool,
    /// The elector's lock-free copy of the proof (`Elector::is_leader` reads it), which a
    /// give-up clears at once rather than at the next check.
    pub(crate) mirror: OnceLock<Arc<AtomicU64>>,
    /// The lock session was released while holds of the term still lived (the release's wait
    /// for them ran out): work under the term outlived the lock.
    pub(crate) released_under_holds: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
pub(crate) struct Holds {
    pub(crate) count: usize,
    pub(crate) closed: bool,
}

/// One continuous period of leadership, or the ended placeholder a standby hands out.
///
/// The seed's `Term(parent)`: cheap to clone; [`Term::ended`] resolves when leadership ends,
/// and [`Term::end_cause`] then tells why. On a standby, [`Elector::term`](crate::Elector::term)
/// returns a term that has already ended (number 0, no lease).
///
/// # Proof and holds: the two rules every user of a term passes through
///
/// * A term carries its **proof**: the end of the safe window of the last check that proved
///   the lock ([`Term::proven_until`], on CLOCK_BOOTTIME). Work may start or continue only
///   while [`Term::is_proven`]: past the window the server may already have given the lock
///   away (docs/guarantees.md#safety-guarantees, docs/field-notes.md#measuring-the-safe-window and
///   #a-resumed-process-wakes-with-every-timer-due). Once a window has passed it never reopens; the
///   term is as good as ended.
/// * Work that runs under a term takes a [`TermHold`] ([`Term::hold`], refused outside the
///   proof). While the lock may still be held, the elector releases it (unlock, or closing a
///   live session after a failed check) only once every hold is dropped, i.e. after the work
///   is dead (docs/field-notes.md#a-failed-check-is-not-a-lost-lock). The wait is bounded by the
///   session's `idle_session_timeout`, after which the server has freed an idle session's lock
///   anyway.
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

/// Rule 1, *start or continue only on a proven lock* (docs/guarantees.md#the-three-rules): work
/// running under a [`Term`]. The one way to get a hold is [`Term::hold`], which refuses once the
/// term ended or the safe window of its last proof passed, and the binary starts COMMAND only
/// with a hold in hand.
///
/// Rule 2's half in the elector: while any hold of a term lives, the lock is not released on
/// purpose. Drop it when the work (for the binary: COMMAND's whole tree, which the supervisor's
/// `Run` owns together with the hold) is dead.
#[derive(Debug)]
pub struct TermHold {
    pub(crate) term: Term,
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
/// [`Elector`](crate::Elector) is one issuer; tests of code that runs under terms are another.
#[derive(Debug)]
pub struct TermControl {
    pub(crate) term: Term,
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
        self.term.mirror_proof();
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

    /// Records that the lock session is released although holds still live: the wait of
    /// [`TermControl::released`] ran out.
    pub(crate) fn released_under_holds(&self) {
        self.term
            .0
            .released_under_holds
            .store(true, Ordering::Release);
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
            given_up: std::sync::atomic::AtomicBool::new(false),
            mirror: OnceLock::new(),
            released_under_holds: std::sync::atomic::AtomicBool::new(false),
        }));
        (term.clone(), TermControl { term })
    }

    pub(crate) fn standby() -> Term {
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

    /// Whether the term lasts, was not given up ([`Term::give_up`]) and the safe window of its
    /// last proof is still open now: the one condition under which work may start or continue
    /// (docs/guarantees.md#safety-guarantees).
    pub fn is_proven(&self) -> bool {
        !self.is_ended()
            && !self.is_given_up()
            && self.proven_until().is_some_and(|until| boottime() < until)
    }

    /// Gives the term up: the campaign ends it at its next leader check (within one check
    /// interval) as it ends one for `leaderrun step-down`, releases the lock once every hold is
    /// dropped, and tries again only at the check after. For a holder whose work was ended by
    /// something it cannot take back: in the binary, the watchdog stopped COMMAND's tree while
    /// leaderrun did not answer it, although the lock was proven meanwhile
    /// (docs/process-model.md#the-watchdog). From then on [`Term::is_proven`] is false, so no
    /// new hold is given, and `Elector::is_leader` is false at once. Idempotent; nothing on an
    /// ended term.
    pub fn give_up(&self) {
        self.0
            .given_up
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // An ended term no longer owns the mirror (a later term may).
        if let Some(mirror) = self.0.mirror.get().filter(|_| !self.is_ended()) {
            mirror.store(0, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Whether the lock session was released while holds of the term still lived.
    pub(crate) fn was_released_under_holds(&self) -> bool {
        self.0.released_under_holds.load(Ordering::Acquire)
    }

    /// Whether [`Term::give_up`] was called.
    pub fn is_given_up(&self) -> bool {
        self.0.given_up.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Mirrors the term's proof into `mirror` (nanoseconds of [`boottime`]): now, and
    /// [`Term::mirror_proof`] at each later proof; a give-up clears it.
    pub(crate) fn mirror_proof_into(&self, mirror: &Arc<AtomicU64>) {
        let _ = self.0.mirror.set(mirror.clone());
        self.mirror_proof();
    }

    /// Copies the proof to the mirror, or 0 once given up; nothing once the term ended (the
    /// mirror may be a later term's). The flag is read before the store and again after it
    /// (and a give-up sets its flag before it clears the mirror), so a proof that races a
    /// give-up never leaves the mirror set.
    pub(crate) fn mirror_proof(&self) {
        let Some(mirror) = self.0.mirror.get().filter(|_| !self.is_ended()) else {
            return;
        };
        // Given up already: nothing to copy (checked first, so no moment shows the proof).
        let until = match self.is_given_up() {
            true => 0,
            false => self
                .0
                .proven_until
                .load(std::sync::atomic::Ordering::Acquire),
        };
        mirror.store(until, std::sync::atomic::Ordering::SeqCst);
        if until != 0 && self.is_given_up() {
            let _ = mirror.compare_exchange(
                until,
                0,
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
            );
        }
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
