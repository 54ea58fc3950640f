//! The lock key (docs/guarantees.md#the-lock-key-and-slots): the seed's two-int4 session advisory
//! lock, and the stable mapping from a lock name to an id; the text of the standby statements that
//! take the key or wait for it (`try_sql`, `wait_sql`; crate-internal).

/// Default lock class: `1886156915` = `0x706C7873`, ASCII `plxs` (the seed's leader lock).
pub const DEFAULT_LOCK_CLASS: i32 = 1_886_156_915;
/// Default lock id within the class: `1` (the seed's leader lock).
pub const DEFAULT_LOCK_ID: i32 = 1;

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

impl LockKey {
    /// The key of slot `slot` of a lock with slots (`--slots N`,
    /// docs/guarantees.md#the-lock-key-and-slots): slot 0 is the key itself, slot k is `(class + k,
    /// id)` (wrapping int4 addition). Varying the class keeps the slots clear of the neighbouring
    /// ids that other jobs of the same class use.
    pub fn slot(self, slot: u32) -> LockKey {
        LockKey {
            class: self.class.wrapping_add(slot as i32),
            id: self.id,
        }
    }

    /// The bigint key of the step-down request for this key (`leaderrun step-down`): pg_locks
    /// shows it with `objsubid = 1`, `objid` = id and `classid` = class XOR 0x20000000.
    ///
    /// Not the bigint whose halves are the class and the id: the seed promises the
    /// repositories that their transaction locks (`pg_advisory_xact_lock(bigint)`) never
    /// collide with the leader lock, "not even the bigint whose halves equal the pair", and
    /// with that bigint as the request, such a transaction made the leader step down at every
    /// other check. Like [`LockKey::queue_key`], never a slot's key (`objsubid = 2`), a place
    /// in a line, or another slot's request (their classes differ from these by less than the
    /// number of slots, these by at least 0x20000000 less that).
    pub fn step_down_request(self) -> i64 {
        (i64::from(self.class ^ STEP_DOWN_FLIP) << 32) | i64::from(self.id as u32)
    }

    /// The `classid` in pg_locks of [`LockKey::step_down_request`]: unsigned, as oid shows it.
    pub fn step_down_class(self) -> u32 {
        (self.step_down_request() >> 32) as u32
    }

    /// The bigint key of place `place` (1 … [`QUEUE_PLACES`]) in the line of standbys for this
    /// key: the holder of place 1, the queue head, waits for this key in the server's lock
    /// queue; the holder of place p > 1 waits for place p − 1; every other standby tries the
    /// key and the places once per check interval. So however many standbys there are, at
    /// most [`QUEUE_PLACES`] wait in the server's queues
    /// (docs/field-notes.md#every-waiter-costs-a-deadlock-check), and a release moves the whole
    /// line up at once.
    ///
    /// pg_locks shows it with `objsubid = 1`, `objid` = id and `classid` = class XOR
    /// 0x80000000 (place 1) or XOR 0x40000000 (place 2): never a slot's key (those have
    /// `objsubid = 2`), nor a step-down request or another place of the same lock's slots
    /// (their classes differ from these by less than the number of slots).
    pub fn queue_key(self, place: u32) -> i64 {
        let flip = (0x8000_0000u32 >> (place.clamp(1, 2) - 1)) as i32;
        (i64::from(self.class ^ flip) << 32) | i64::from(self.id as u32)
    }
}

/// The bit a step-down request's class differs by from its slot's ([`LockKey::step_down_request`]).
const STEP_DOWN_FLIP: i32 = 0x2000_0000;

/// How many standbys of one slot wait in the server's lock queues: the queue head, which
/// waits for the slot's key, and one behind it, which waits for the head's place, so that two
/// hand-overs in a row both reach a waiting standby at once ([`LockKey::queue_key`]).
pub const QUEUE_PLACES: u32 = 2;

/// The most slots a lock can have (`--slots`, [`crate::Config::slots`]): a standby's try names
/// every slot's key, so a statement for many more would not fit an interval, or memory.
pub const MAX_SLOTS: u32 = 1024;

/// The lock id `--lock-name NAME` stands for: the first 4 bytes of SHA-256 of the UTF-8 NAME,
/// big-endian, as a signed int4. Fixed forever (docs/field-notes.md#lock-names-need-a-fixed-hash):
/// never a hasher whose output may change between builds, never the server's `hashtext()`.
pub fn lock_id_for_name(name: &str) -> i32 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(name.as_bytes());
    i32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// Text of the standby's try, for a lock of `slots` slots
/// (docs/guarantees.md#the-lock-key-and-slots), one round trip: every slot's key with
/// `pg_try_advisory_lock`, in slot order, then, with `line`, every place in the line of standbys
/// ([`LockKey::queue_key`]), place by place. `CASE` stops at the first that is granted, so a
/// session takes at most one of them. A hot standby grants advisory locks of its own, so nothing is
/// tried there (docs/field-notes.md#a-hot-standby-grants-its-own-locks). `OFFSET 0` keeps the
/// planner from evaluating the `CASE` (and its locks) more than once.
///
/// One row: `r` (int4: the slot granted, 0 … N−1; p·N + k: place p in the line of slot k;
/// −1: refused; NULL: in recovery), the fencing token (int8, `txid_current()` taken after the
/// grant, in the same statement, and flushed to the WAL before the answer ([`DURABLE_TOKEN`]);
/// NULL unless a slot was granted), `current_database()`. The leading comment is how
/// `leaderrun status` finds standbys in `pg_stat_activity`. `guard`: what the server checks
/// before anything is tried ([`Guard`]).
pub(crate) fn try_sql(lock: LockKey, slots: u32, line: bool, guard: &Guard) -> String {
    let mut cases = String::new();
    for slot in 0..slots {
        cases.push_str(&try_case(lock.slot(slot), slot));
    }
    if line {
        for place in 1..=QUEUE_PLACES {
            for slot in 0..slots {
                cases.push_str(&format!(
                    " WHEN pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int8) THEN {}",
                    lock.slot(slot).queue_key(place),
                    place * slots + slot
                ));
            }
        }
    }
    statement(lock, slots, &cases, "-1", guard)
}

/// Text of the wait of the standby at place `place` in the line of slot `slot`: it waits in
/// the server's queue with `pg_advisory_lock`, bounded by `lock_timeout` (one check
/// interval), for the slot's key (place 1, the queue head; the other slots are tried first)
/// or for the place ahead of it, so a release, or the holder's session dying, reaches it at
/// once. Once granted, the same statement gives its old place back, so the one behind moves
/// up at once too. The row is [`try_sql`]'s, with `r` the slot granted or the new code of
/// this session (place − 1); `guard` as there.
pub(crate) fn wait_sql(lock: LockKey, slots: u32, slot: u32, place: u32, guard: &Guard) -> String {
    let key = lock.slot(slot);
    let mut cases = String::new();
    let target = if place <= 1 {
        if slots > 1 {
            // A free slot is taken at once; the place is given back with it.
            for other in 0..slots {
                let other_key = lock.slot(other);
                cases.push_str(&format!(
                    " WHEN pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int4, \
                     ({})::pg_catalog.int4) THEN (SELECT {other} WHERE \
                     pg_catalog.pg_advisory_unlock(({})::pg_catalog.int8) IS NOT NULL)",
                    other_key.class,
                    other_key.id,
                    key.queue_key(place)
                ));
            }
        }
        format!(
            "({})::pg_catalog.int4, ({})::pg_catalog.int4",
            key.class, key.id
        )
    } else {
        format!("({})::pg_catalog.int8", key.queue_key(place - 1))
    };
    let moved = (place.max(1) - 1) * slots + slot;
    // CASE orders the two: the old place is given back only once the wait was granted.
    let wait = format!(
        "CASE WHEN (SELECT true FROM (SELECT pg_catalog.pg_advisory_lock({target})) AS waited) \
         THEN (SELECT {moved} WHERE pg_catalog.pg_advisory_unlock(({})::pg_catalog.int8) \
         IS NOT NULL) END",
        key.queue_key(place)
    );
    statement(lock, slots, &cases, &wait, guard)
}

/// Text of a queue head's look for slots with no head, for a lock of `slots` slots (N > 1;
/// docs/election.md#slots): one row, one `pg_locks` read, an int4[] of the slots, in order,
/// whose key is held and whose place 1 in line ([`LockKey::queue_key`]) is not, so that no
/// standby waits for that key in the server's queue. A standby that heads another slot's line
/// waits for those as well, each on a session of its own ([`head_sql`]). A free slot is not
/// listed: the head's wait takes it at once.
pub(crate) fn headless_sql(lock: LockKey, slots: u32) -> String {
    let rows: Vec<String> = (0..slots)
        .map(|k| {
            let key = lock.slot(k);
            // pg_locks shows the halves as oid: compared as int8, unsigned.
            format!(
                "({k}, {}, {})",
                key.class as u32,
                (key.queue_key(1) >> 32) as u32
            )
        })
        .collect();
    format!(
        concat!(
            "{} {} WITH held AS (SELECT classid::pg_catalog.int8 AS class, objsubid \
             FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted \
             AND objid::pg_catalog.int8 OPERATOR(pg_catalog.=) {} \
             AND database OPERATOR(pg_catalog.=) ",
            current_database_oid!(),
            ") SELECT ARRAY(SELECT s.k FROM (VALUES {}) AS s(k, slot_class, place_class) \
             WHERE EXISTS (SELECT 1 FROM held WHERE class OPERATOR(pg_catalog.=) s.slot_class \
             AND objsubid OPERATOR(pg_catalog.=) 2) \
             AND NOT EXISTS (SELECT 1 FROM held WHERE class OPERATOR(pg_catalog.=) s.place_class \
             AND objsubid OPERATOR(pg_catalog.=) 1) ORDER BY s.k)"
        ),
        standby_comment(lock),
        super::holder::identity_comment(),
        lock.id as u32,
        rows.join(", ")
    )
}

/// Text of the try that makes a session the queue head of slot `slot`: one row, whether it
/// was granted place 1 in that slot's line ([`LockKey::queue_key`]). The head then waits with
/// [`wait_sql`] for `(slot, 1)`, as a head that took its place with [`try_sql`] does.
pub(crate) fn head_sql(lock: LockKey, slot: u32) -> String {
    format!(
        "{} {} SELECT pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int8)",
        standby_comment(lock),
        super::holder::identity_comment(),
        lock.slot(slot).queue_key(1)
    )
}

fn try_case(key: LockKey, code: u32) -> String {
    format!(
        " WHEN pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int4, ({})::pg_catalog.int4) \
         THEN {code}",
        key.class, key.id
    )
}

/// What a try or wait has the server check before it takes anything, for a session that may
/// not be direct (docs/field-notes.md#transaction-mode-poolers-move-the-session): behind a
/// transaction-mode pooler a client's statements run on server backends other clients use
/// too, and a lock taken there may never be given back (the give-back can land on another
/// backend). So nothing is taken where that can happen, and the row says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// None: the session is direct ([`is_direct`](crate::elector::session::is_direct)), its
    /// backend is nobody else's.
    None,
    /// A session's first try, sent with its set-up before the server's answer tells whether
    /// it is direct: it takes something only where the server sees the client's address and
    /// port as our socket's own and took the connection on the port our socket reached (the
    /// test `is_direct` makes, made by the server); elsewhere `r` is [`NOT_DIRECT`].
    Direct {
        /// Our socket's local address, as `host(inet_client_addr())` shows it.
        client_addr: std::net::IpAddr,
        /// Our socket's local port.
        client_port: u16,
        /// The port our socket reached.
        server_port: u16,
    },
    /// A session that is not direct: the statement refuses a backend other than the one its
    /// timers were pinned on (`r` = [`MOVED_BACKEND`]) and one that already holds a slot
    /// (`r` = [`SHARED_BACKEND`]); its row has a fourth column, `pg_backend_pid()`.
    Shared {
        /// `pg_backend_pid()` of the pin.
        backend_pid: i32,
    },
}

/// `r` of a guarded try or wait whose server backend held a slot of the lock before it asked:
/// another client's session shares the backend (a transaction-mode pooler), and a grant there
/// would only count that client's lock up once more (PostgreSQL grants a session lock again
/// to the backend that holds it: the manual, "Advisory Locks"). Nothing is taken, and nothing
/// may be given back: the lock is the other client's.
pub(crate) const SHARED_BACKEND: i32 = -1000;

/// `r` of a first try ([`Guard::Direct`]) on a session the server does not see as ours: a
/// pooler or a port forward sits between. Nothing is taken; the session tries again guarded
/// ([`Guard::Shared`]) once its pin has said which backend it is on.
pub(crate) const NOT_DIRECT: i32 = -1001;

/// `r` of a guarded try or wait ([`Guard::Shared`]) that ran on another server backend than
/// the one the session's timers were pinned on: the session moves between backends (a
/// transaction-mode pooler). Nothing is taken.
pub(crate) const MOVED_BACKEND: i32 = -1002;

/// The guard of [`SHARED_BACKEND`]: whether this backend holds a slot's key already, read from
/// `pg_locks` before anything is tried. Only sessions that are not direct carry it
/// (docs/field-notes.md#transaction-mode-poolers-move-the-session): PostgreSQL parses and plans
/// the `pg_locks` view on every fresh backend whether the guard runs or not, 0.35–0.5 ms of a
/// one-shot (BENCHMARKS.md, issue 18, seventh pass).
fn shared_backend_case(lock: LockKey, slots: u32) -> String {
    let classes: Vec<String> = (0..slots)
        .map(|k| (lock.slot(k).class as u32).to_string())
        .collect();
    format!(
        " WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
         WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted \
         AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() \
         AND objsubid OPERATOR(pg_catalog.=) 2 AND objid::pg_catalog.int8 OPERATOR(pg_catalog.=) {} \
         AND classid::pg_catalog.int8 OPERATOR(pg_catalog.=) ANY (ARRAY[{}]::pg_catalog.int8[])) \
         THEN {SHARED_BACKEND}",
        lock.id as u32,
        classes.join(", ")
    )
}

/// The `CASE` branches that come before any try for `guard`.
fn guard_cases(lock: LockKey, slots: u32, guard: &Guard) -> String {
    match guard {
        Guard::None => String::new(),
        Guard::Direct {
            client_addr,
            client_port,
            server_port,
        } => format!(
            // An address is digits, dots, colons and hex: nothing to quote. `IS NOT TRUE`:
            // NULL (the server sees a Unix socket's client) is not direct either.
            " WHEN (pg_catalog.inet_client_port() OPERATOR(pg_catalog.=) {client_port} \
             AND pg_catalog.inet_server_port() OPERATOR(pg_catalog.=) {server_port} \
             AND pg_catalog.host(pg_catalog.inet_client_addr()) OPERATOR(pg_catalog.=) \
             '{}'::pg_catalog.text) IS NOT TRUE THEN {NOT_DIRECT}",
            client_addr.to_canonical()
        ),
        Guard::Shared { backend_pid } => format!(
            " WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) {backend_pid} \
             THEN {MOVED_BACKEND}{}",
            shared_backend_case(lock, slots)
        ),
    }
}

fn statement(lock: LockKey, slots: u32, cases: &str, otherwise: &str, guard: &Guard) -> String {
    let guards = guard_cases(lock, slots, guard);
    // A guarded statement also says which backend answered it: a grant there is the
    // session's only when its backend is the one its timers were pinned on.
    let backend = if matches!(guard, Guard::Shared { .. }) {
        ", pg_catalog.pg_backend_pid()"
    } else {
        ""
    };
    format!(
        "{} {} SELECT t.r, CASE WHEN t.r OPERATOR(pg_catalog.>=) 0 \
         AND t.r OPERATOR(pg_catalog.<=) {} THEN ({DURABLE_TOKEN}) END, \
         pg_catalog.current_database(){backend} FROM (SELECT CASE WHEN \
         pg_catalog.pg_is_in_recovery() THEN NULL{guards}{cases} ELSE {otherwise} END AS r \
         OFFSET 0) AS t",
        standby_comment(lock),
        super::holder::identity_comment(),
        slots - 1
    )
}

/// The fencing token of a grant, durable before the answer leaves the server
/// (docs/field-notes.md#a-fencing-number-must-survive-a-crash): `txid_current()` assigns the
/// transaction an id, but a transaction that writes no WAL commits asynchronously
/// (PostgreSQL's `RecordTransactionCommit` flushes only when the transaction wrote WAL), so a
/// crash soon after the grant lost the id and the next grant after recovery got the same one
/// again, or a smaller one. A transactional `pg_logical_emit_message` (prefix `leaderrun`, no
/// table, any `wal_level`) makes the transaction write WAL, and `synchronous_commit` for this
/// transaction alone, the server's own value unless it is `off` (then `local`), makes its commit
/// wait for the flush. Evaluated only for a grant (the `CASE` around it); the subquery's
/// `OFFSET 0` keeps its volatile columns, used or not.
pub(crate) const DURABLE_TOKEN: &str = "SELECT g.token FROM (SELECT pg_catalog.txid_current() \
     AS token, pg_catalog.set_config('synchronous_commit', CASE WHEN \
     pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'off' THEN 'local' \
     ELSE pg_catalog.current_setting('synchronous_commit') END, true) AS durable, \
     pg_catalog.pg_logical_emit_message(true, 'leaderrun', 'fencing token') AS logged \
     OFFSET 0) AS g";

/// The oid of the session's database, read off the session's own backend entry
/// (`pg_stat_get_activity`, executable by every role), for the statements that look at other
/// backends' advisory rows: `pg_locks` names their database by oid. Not from `pg_database`, a
/// shared catalog read under a relation lock that takes an entry of the server's lock table
/// (shared relations never take the fast path), which a full lock table (`out of shared
/// memory`), a `VACUUM FULL pg_database` or a DBA's `REVOKE SELECT ON pg_database FROM
/// PUBLIC` refuses (docs/field-notes.md#a-lock-the-check-cannot-see). The leader's check needs
/// neither: it takes the database from its own lock row.
macro_rules! current_database_oid {
    () => {
        "(SELECT a.datid FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) AS a)"
    };
}
pub(crate) use current_database_oid;

/// Whether the session's role may read what the leader's check reads
/// (`LOCK_ROW_SQL`, the campaign's): the `pg_locks` view, and the
/// `pg_lock_status()` it calls, which a view's user must be allowed to execute (PostgreSQL's
/// manual, CREATE VIEW: "the user of a view must have permissions to call all functions used
/// by the view"). Without them every grant's first check fails, and each replica in turn would
/// start COMMAND and stop it again (docs/field-notes.md#a-lock-the-check-cannot-see). Any
/// column's privilege passes: a role that may read some columns is left to the check itself.
macro_rules! can_check {
    () => {
        "pg_catalog.has_any_column_privilege('pg_catalog.pg_locks', 'SELECT') \
         AND pg_catalog.has_function_privilege('pg_catalog.pg_lock_status()', 'EXECUTE')"
    };
}
pub(crate) use can_check;

/// [`can_check!`] alone: asked again at a grant on a session whose pin found it false, so a
/// privilege granted meanwhile counts without a new session.
pub(crate) const CAN_CHECK_SQL: &str = concat!("SELECT ", can_check!());

/// The unlock of slot key `key`, the key written out: sent as the unnamed statement, it needs
/// no round trip of its own.
pub(crate) fn unlock_sql(key: LockKey) -> String {
    format!("SELECT {}", Held::Key(key).unlock_call())
}

/// What a session gives back: a slot's key, or its place in that slot's line of standbys
/// ([`LockKey::queue_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The slot's key (`pg_advisory_lock(int4, int4)`).
    Key(LockKey),
    /// Place `place` (≥ 1) in the line of the slot `key` (`pg_advisory_lock(int8)`).
    Place(LockKey, u32),
}

impl Held {
    /// The unlock call of what is held, every value written out.
    pub(crate) fn unlock_call(self) -> String {
        match self {
            Held::Key(key) => format!(
                "pg_catalog.pg_advisory_unlock(({})::pg_catalog.int4, ({})::pg_catalog.int4)",
                key.class, key.id
            ),
            Held::Place(key, place) => format!(
                "pg_catalog.pg_advisory_unlock(({})::pg_catalog.int8)",
                key.queue_key(place)
            ),
        }
    }
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Key(key) => write!(f, "{key}"),
            Held::Place(key, place) => write!(f, "{key}, place {place} in line"),
        }
    }
}

/// The give-back of `held` on a session that is not direct, whose grant is on server backend
/// `backend_pid` (docs/field-notes.md#transaction-mode-poolers-move-the-session): the unlock
/// runs only there. Behind a transaction-mode pooler the statement may land on another
/// backend, where an unlock would free another client's count of the lock or find nothing;
/// there it answers NULL and the caller sends it again. One row: `true` given back, `false`
/// that backend did not hold it, NULL another backend answered.
pub(crate) fn give_back_sql(held: Held, backend_pid: i32) -> String {
    format!(
        "SELECT CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) {backend_pid} \
         THEN {} END",
        held.unlock_call()
    )
}

/// The pause between two sends of a give-back that landed on another server backend than the
/// grant's ([`on_backend`]): a round trip through a pooler is about a millisecond, and a
/// pooler under load hands its connections on within a few.
pub(crate) const GIVE_BACK_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Sends a statement that runs only on one server backend and answers NULL elsewhere (a
/// `CASE` as [`give_back_sql`]'s) again, [`GIVE_BACK_PAUSE`] apart, until it lands there or
/// `bound` passes; whether it landed. `send(left)` sends it once, bounded by `left`, and says
/// whether a row that is not NULL came back; a statement that fails ends it.
pub(crate) async fn on_backend<F, Fut>(bound: std::time::Duration, mut send: F) -> bool
where
    F: FnMut(std::time::Duration) -> Fut,
    Fut: std::future::Future<Output = Result<bool, crate::error::Error>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match send(left).await {
            Ok(true) => return true,
            // Another backend answered: NULL.
            Ok(false) if left > GIVE_BACK_PAUSE => tokio::time::sleep(GIVE_BACK_PAUSE).await,
            _ => return false,
        }
    }
}

/// The second session's test of a grant on a session that is not direct, whose grant is on
/// server backend `backend_pid`: `true` when this session shares that backend, or was granted
/// `key` (a backend that holds it for someone else, or none does), which is then given back
/// in the same statement (the unlock's `true` is the answer). One statement is one transaction, so a pooler cannot move the
/// give-back to another backend than the grant's.
pub(crate) fn probe_sql(key: LockKey, backend_pid: i32) -> String {
    format!(
        "SELECT CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) {backend_pid} \
         THEN true WHEN pg_catalog.pg_try_advisory_lock(({c})::pg_catalog.int4, \
         ({i})::pg_catalog.int4) THEN pg_catalog.pg_advisory_unlock(({c})::pg_catalog.int4, \
         ({i})::pg_catalog.int4) ELSE false END",
        c = key.class,
        i = key.id
    )
}

/// `synchronous_standby_names` when a commit of this session waits for a synchronous standby
/// (the names set and `synchronous_commit` one of `on`, `remote_write`, `remote_apply`), else
/// NULL: [`DURABLE_TOKEN`] keeps the server's `synchronous_commit` (only `off` becomes `local`),
/// so on such a server every grant waits for that standby, as every commit does
/// (PostgreSQL's manual, "Synchronous Replication"), and a synchronous standby that is down
/// holds every grant. `doctor` asks it (the binary only).
#[cfg(feature = "cli")]
pub(crate) const SYNC_STANDBYS: &str = "CASE WHEN \
     pg_catalog.current_setting('synchronous_standby_names') OPERATOR(pg_catalog.<>) '' \
     AND pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) \
     ANY (ARRAY['on', 'remote_write', 'remote_apply']) \
     THEN pg_catalog.current_setting('synchronous_standby_names') END";

/// What a DBA runs so that a role may take [`DURABLE_TOKEN`] again, for `doctor`'s hint and
/// the error's: PostgreSQL 17 gave `pg_logical_emit_message` a fourth argument (`flush`, with a
/// default), so the function's signature, which `GRANT` names, depends on the major.
pub(crate) const DURABLE_TOKEN_GRANT: &str = "GRANT EXECUTE ON FUNCTION \
     pg_catalog.pg_logical_emit_message(boolean, text, text) TO the role (on PostgreSQL 17 and \
     later: pg_catalog.pg_logical_emit_message(boolean, text, text, boolean))";

/// The comment that starts every standby statement of `lock`: `pg_stat_activity.query`
/// shows it for a standby between its checks and while it waits, which is how `leaderrun
/// status` lists standbys that are not in the lock queue.
pub fn standby_comment(lock: LockKey) -> String {
    format!("/* leaderrun standby lock={lock} */")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_key_is_the_seeds() {
        let key = LockKey::default();
        assert_eq!(key.class, 0x706C_7873);
        assert_eq!(&key.class.to_be_bytes(), b"plxs");
        assert_eq!(key.to_string(), "1886156915:1");
    }

    #[test]
    fn slot_head_and_request_keys_are_distinct_and_documented() {
        let key = LockKey { class: 7, id: -2 };
        assert_eq!(key.slot(0), key);
        assert_eq!(key.slot(2), LockKey { class: 9, id: -2 });
        let top = LockKey {
            class: i32::MAX,
            id: 1,
        };
        assert_eq!(top.slot(1).class, i32::MIN, "wraps");
        // pg_locks halves of the bigint forms: classid = high word, objid = low word.
        let halves = |k: i64| ((k >> 32) as u32, k as u32);
        assert_eq!(
            halves(key.step_down_request()),
            (7 ^ 0x2000_0000, (-2i32) as u32)
        );
        assert_eq!(key.step_down_class(), 7 ^ 0x2000_0000);
        // Never the bigint whose halves are the pair, which the seed gives the repositories.
        assert_ne!(
            key.step_down_request(),
            (7i64 << 32) | i64::from((-2i32) as u32)
        );
        assert_eq!(halves(key.queue_key(1)), (7 ^ 0x8000_0000, (-2i32) as u32));
        assert_eq!(halves(key.queue_key(2)), (7 ^ 0x4000_0000, (-2i32) as u32));
        for class in [0, -1, 1, i32::MAX, i32::MIN, DEFAULT_LOCK_CLASS] {
            let key = LockKey { class, id: 1 };
            let mut seen = std::collections::HashSet::new();
            for j in 0..64 {
                let pair = (i64::from(key.slot(j).class) << 32) | 1;
                assert!(seen.insert(key.slot(j).step_down_request()));
                assert_ne!(key.slot(j).step_down_request(), pair);
                for place in 1..=QUEUE_PLACES {
                    assert!(
                        seen.insert(key.slot(j).queue_key(place)),
                        "{class} {j} {place}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_head_takes_place_one_and_looks_for_every_slot_with_no_head() {
        let lock = LockKey { class: 7, id: -2 };
        let take = head_sql(lock, 1);
        assert!(take.starts_with(&standby_comment(lock)), "{take}");
        assert!(
            take.ends_with(&format!(
                "SELECT pg_catalog.pg_try_advisory_lock(({})::pg_catalog.int8)",
                lock.slot(1).queue_key(1)
            )),
            "{take}"
        );
        let look = headless_sql(lock, 3);
        assert!(look.starts_with(&standby_comment(lock)), "{look}");
        // pg_locks' halves as unsigned numbers: the id, each slot's class and its place 1.
        assert!(
            look.contains(&format!(
                "objid::pg_catalog.int8 OPERATOR(pg_catalog.=) {}",
                (-2i32) as u32
            )),
            "{look}"
        );
        for k in 0..3u32 {
            let row = format!("({k}, {}, {})", 7 + k, (7 + k) ^ 0x8000_0000);
            assert!(look.contains(&row), "{row} in {look}");
        }
    }

    #[test]
    fn only_a_guarded_statement_reads_pg_locks_and_it_reads_them_before_any_try() {
        let lock = LockKey { class: 7, id: -2 };
        let shared = Guard::Shared { backend_pid: 4242 };
        // A direct session's statements: no pg_locks for a fresh backend to parse and plan.
        assert!(!try_sql(lock, 2, true, &Guard::None).contains("pg_locks"));
        assert!(!wait_sql(lock, 2, 0, 1, &Guard::None).contains("pg_locks"));
        for sql in [
            try_sql(lock, 2, true, &shared),
            wait_sql(lock, 2, 1, 1, &shared),
        ] {
            // Every slot's key, unsigned as pg_locks shows it, held by this very backend.
            let guard = sql
                .find(&format!(
                    "pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() \
                     AND objsubid OPERATOR(pg_catalog.=) 2 \
                     AND objid::pg_catalog.int8 OPERATOR(pg_catalog.=) {} \
                     AND classid::pg_catalog.int8 OPERATOR(pg_catalog.=) \
                     ANY (ARRAY[7, 8]::pg_catalog.int8[])) THEN {SHARED_BACKEND}",
                    -2i32 as u32
                ))
                .unwrap_or_else(|| panic!("{sql}"));
            // Another backend than the pin's is refused first: its locks are another client's.
            let moved = sql
                .find(&format!(
                    "WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) 4242 \
                     THEN {MOVED_BACKEND}"
                ))
                .unwrap_or_else(|| panic!("{sql}"));
            // After the recovery check, before anything is taken or waited for.
            assert!(sql.find("pg_is_in_recovery").unwrap() < moved, "{sql}");
            assert!(moved < guard, "{sql}");
            assert!(guard < sql.find("pg_try_advisory_lock").unwrap(), "{sql}");
            assert!(
                guard < sql.find("pg_advisory_lock(").unwrap_or(usize::MAX),
                "{sql}"
            );
            // The backend that answered, as a fourth column.
            assert!(
                sql.contains("pg_catalog.current_database(), pg_catalog.pg_backend_pid() FROM"),
                "{sql}"
            );
        }
        assert!(!try_sql(lock, 1, false, &Guard::None).contains("pg_backend_pid() FROM"));
    }

    /// A session's first try, sent before its pin has told whether it is direct, takes
    /// nothing unless the server sees both of our socket's ends: the test comes before every
    /// try, and reads no catalog view.
    #[test]
    fn a_first_try_takes_nothing_where_the_server_does_not_see_our_socket() {
        let lock = LockKey { class: 7, id: -2 };
        for (address, shown) in [
            ("127.0.0.1", "127.0.0.1"),
            ("::1", "::1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
        ] {
            let guard = Guard::Direct {
                client_addr: address.parse().unwrap(),
                client_port: 40001,
                server_port: 5432,
            };
            let sql = try_sql(lock, 1, true, &guard);
            let test = sql
                .find(&format!(
                    "WHEN (pg_catalog.inet_client_port() OPERATOR(pg_catalog.=) 40001 \
                     AND pg_catalog.inet_server_port() OPERATOR(pg_catalog.=) 5432 \
                     AND pg_catalog.host(pg_catalog.inet_client_addr()) OPERATOR(pg_catalog.=) \
                     '{shown}'::pg_catalog.text) IS NOT TRUE THEN {NOT_DIRECT}"
                ))
                .unwrap_or_else(|| panic!("{sql}"));
            assert!(test < sql.find("pg_try_advisory_lock").unwrap(), "{sql}");
            assert!(!sql.contains("pg_locks"), "{sql}");
            assert!(!sql.contains("pg_backend_pid() FROM"), "{sql}");
        }
    }

    #[test]
    fn every_name_in_the_election_statements_is_the_catalogs() {
        let lock = LockKey { class: 7, id: -2 };
        let mut all = vec![
            headless_sql(lock, 3),
            head_sql(lock, 1),
            unlock_sql(lock),
            give_back_sql(Held::Key(lock), 4242),
            give_back_sql(Held::Place(lock, 2), 4242),
            probe_sql(lock, 4242),
            DURABLE_TOKEN.to_owned(),
        ];
        #[cfg(feature = "cli")]
        all.push(SYNC_STANDBYS.to_owned());
        let guards = [
            Guard::None,
            Guard::Direct {
                client_addr: "::1".parse().unwrap(),
                client_port: 1,
                server_port: 2,
            },
            Guard::Shared { backend_pid: 3 },
        ];
        for guard in &guards {
            for slots in [1, 2] {
                all.push(try_sql(lock, slots, true, guard));
                all.push(try_sql(lock, slots, false, guard));
                for place in 0..3 {
                    all.push(wait_sql(lock, slots, slots - 1, place, guard));
                }
            }
        }
        for sql in all {
            crate::pg::assert_qualified(&sql);
        }
    }

    #[test]
    fn lock_name_golden_values() {
        // Pinned: computed independently (Python hashlib) and never to change.
        assert_eq!(lock_id_for_name("plexsphere"), -1_450_088_986);
        assert_eq!(lock_id_for_name("nightly-report"), 1_732_491_792);
        assert_eq!(lock_id_for_name(""), -474_954_686);
        assert_eq!(lock_id_for_name("ü"), 1_618_244_810);
        assert_eq!(lock_id_for_name("leaderrun"), -690_802_688);
    }
}
