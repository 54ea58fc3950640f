//! The elector's session (with slots, a queue head's extra heads too: `campaign::heads`): the
//! timers pinned on it, the lock statements prepared on it, and statements bounded by a deadline
//! (docs/field-notes.md#half-open-connections-and-pinned-timers).
//! Connecting is in `connecting`; the statements' text in [`crate::pg::lock`].

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_postgres::{Client, Statement, ToStatement};
use tracing::warn;

use super::connecting::{connect_socket, Steps};
use super::Config;
use crate::error::Error;
use crate::pg::lock::{
    can_check, give_back_sql, on_backend, try_sql, wait_sql, Guard, Held, LockKey, QUEUE_PLACES,
};
use crate::pg::within;

/// Client-side TCP timers (docs/field-notes.md#half-open-connections-and-pinned-timers): keepalives
/// so a vanished server is noticed between checks, and `TCP_USER_TIMEOUT` so a check stuck in
/// retransmission fails within 2 check intervals instead of the kernel's minutes. Keepalives
/// idle after one check interval, probe every half interval, 3 probes; a connection string's
/// `keepalives_idle`, `keepalives_interval` or `keepalives_count` that is shorter wins (it
/// only notices a vanished server sooner), a longer one is an upper bound already met.
pub(crate) fn pin_client_timers(config: &mut Config) {
    let interval = config.effective_check_interval();
    let second = Duration::from_secs(1);
    // The kernel takes at most 32767 s for keepalive times and i32::MAX ms for TCP_USER_TIMEOUT.
    let keepalive_max = Duration::from_secs(32_767);
    // tokio-postgres' defaults (2 hours, none, none) are longer than ours: ours win then.
    let idle = interval
        .clamp(second, keepalive_max)
        .min(config.connect.get_keepalives_idle());
    let probe = (interval / 2).clamp(second, keepalive_max);
    let probe = config
        .connect
        .get_keepalives_interval()
        .map_or(probe, |asked| asked.min(probe));
    let probes = config
        .connect
        .get_keepalives_retries()
        .map_or(3, |asked| asked.min(3));
    config
        .connect
        .keepalives(true)
        .keepalives_idle(idle)
        .keepalives_interval(probe)
        .keepalives_retries(probes)
        .tcp_user_timeout(
            interval
                .saturating_mul(2)
                .min(Duration::from_millis(i32::MAX as u64)),
        );
}

/// How soon the server notices that the client of a session in a statement (a standby's wait
/// in the lock queue) is gone: `client_connection_check_interval`, PostgreSQL 14 and later.
/// `leaderrun step-down` looks at the standbys twice, this far apart and more, so that only
/// live ones count.
pub const CLIENT_CONNECTION_CHECK: Duration = Duration::from_millis(250);

/// The server-side timers pinned on every session right after connect (see
/// docs/field-notes.md#half-open-connections-and-pinned-timers): role or database defaults may
/// differ, so they are set with `set_config` and read back. Values are in the GUCs' base units (ms,
/// or s for the keepalives); the two `deferrable` settings and `jit`, which are not timers but
/// could make every statement wait, are `off`, and so is `exit_on_error`, which would make any
/// failed statement end the session and so free the lock.
pub(crate) fn server_timers(config: &Config) -> Vec<(&'static str, String)> {
    // Rounded up: a timer a hair shorter than asked could free the lock inside the model's
    // margin (docs/guarantees.md#timing-settings).
    let ms = |d: Duration| {
        d.as_nanos()
            .div_ceil(1_000_000)
            .clamp(1, i32::MAX as u128)
            .to_string()
    };
    let secs = |d: Duration| d.as_secs_f64().ceil().clamp(1.0, 32_767.0).to_string();
    let bound = config.io_bound();
    let idle = config.effective_idle_session_timeout();
    vec![
        // Off, and first: a role or database default (PostgreSQL 17 and later) would end a
        // standby's session in the middle of its wait in the lock queue, which lasts up to an
        // interval by design, and a FATAL error takes the session with it. `statement_timeout`
        // and `idle_in_transaction_session_timeout` bound everything it would. First, because
        // a default already runs from the start of this very round trip, and a `SET` of 0
        // stops it (docs/field-notes.md#a-transaction-timeout-ends-the-session).
        ("transaction_timeout", "0".to_owned()),
        // Off, before any statement that may fail: a role's or database's `exit_on_error`
        // turns every ERROR into a FATAL one, so a check that failed on a live session (a
        // cancel, a timed-out lock wait, a privilege taken) would end the session and free the
        // lock while COMMAND's tree still runs, and every timed-out wait of a standby in line
        // would end its session (docs/field-notes.md#exit_on_error-ends-the-session-at-any-error).
        ("exit_on_error", "off".to_owned()),
        // Not deferrable, for this round trip's own transaction and every later one: with a
        // role's or database's `default_transaction_isolation = serializable`,
        // `default_transaction_read_only = on` and `default_transaction_deferrable = on`, every
        // statement that reads (this round trip's last, the try, the check) first waits for a
        // safe snapshot, as long as any serializable transaction that writes is open
        // (docs/field-notes.md#a-deferrable-transaction-waits-for-every-writer). A `SET` takes
        // no snapshot, so this one still may.
        ("transaction_deferrable", "off".to_owned()),
        ("default_transaction_deferrable", "off".to_owned()),
        // A role's or database's `jit_above_cost` of 0 would JIT-compile every statement of
        // the election, a quarter to half a second of the server's CPU each on a small machine:
        // longer than a short interval (docs/field-notes.md#jit-compiles-every-statement-it-may).
        ("jit", "off".to_owned()),
        // A waiting standby's statement lasts up to one interval (lock_timeout) by design.
        (
            "statement_timeout",
            ms(bound + config.effective_check_interval()),
        ),
        ("lock_timeout", ms(config.effective_check_interval())),
        ("idle_in_transaction_session_timeout", ms(idle)),
        // The seed's bound on an orphaned lock session, from the moment the session may ask
        // for the lock (docs/field-notes.md#a-grant-can-reach-a-client-that-stopped-listening): a
        // grant that reaches a client that stopped listening is freed within it. A standby is never
        // idle that long: it runs a statement every interval, or waits in one.
        ("idle_session_timeout", ms(idle)),
        // A standby's wait in the lock queue lasts up to an interval, and a backend in a wait
        // reads nothing from its client: without this (PostgreSQL 14 and later) a waiter whose
        // process is gone stays in the queue until its wait times out, and `leaderrun
        // step-down` would count it as a standby that can take over.
        (
            "client_connection_check_interval",
            ms(CLIENT_CONNECTION_CHECK),
        ),
        // The server's own fallback for a vanished client (and the only bound before
        // PostgreSQL 14): about idle_session_timeout in all.
        ("tcp_keepalives_idle", secs(idle / 2)),
        ("tcp_keepalives_interval", secs(idle / 8)),
        ("tcp_keepalives_count", "4".to_owned()),
        ("tcp_user_timeout", ms(idle)),
    ]
}

/// The [`server_timers`] a server of major `server_major` has ([`added_in`]); all of them
/// when the major is unknown.
pub(crate) fn server_timers_on(
    config: &Config,
    server_major: Option<u32>,
) -> Vec<(&'static str, String)> {
    server_timers(config)
        .into_iter()
        .filter(|(name, _)| server_major.map_or(true, |major| major >= added_in(name)))
        .collect()
}

/// The PostgreSQL major that added `setting`, one of [`server_timers`]: a `SET` of it fails on
/// an older server (the release notes of 17, 14, 12 and 11; the others are older than any server this
/// connects to).
fn added_in(setting: &str) -> u32 {
    match setting {
        "transaction_timeout" => 17,
        "jit" => 11,
        "idle_session_timeout" | "client_connection_check_interval" => 14,
        "tcp_user_timeout" => 12,
        _ => 0,
    }
}

/// `synchronous_standby_names` when a commit of this session waits for a synchronous standby:
/// the names set and `synchronous_commit` one of `on`, `remote_write`, `remote_apply`
/// (PostgreSQL's manual, "Synchronous Replication"); the same rule as
/// [`SYNC_STANDBYS`](crate::pg::lock::SYNC_STANDBYS), on the values `SHOW` gave.
pub(crate) fn sync_standbys(names: &str, commit: &str) -> Option<String> {
    (!names.is_empty() && matches!(commit, "on" | "remote_write" | "remote_apply"))
        .then(|| names.to_owned())
}

/// The last statement of the pin's round trip: the backend's pid and, over TCP, the client's
/// address and port and the server's port as the backend sees them (NULL over a Unix socket),
/// which tell whether the session is direct (no pooler between), then [`can_check!`](crate::pg::lock::can_check).
const BACKEND_SQL: &str = concat!(
    "SELECT pg_catalog.pg_backend_pid(), \
     pg_catalog.host(pg_catalog.inet_client_addr()), pg_catalog.inet_client_port(), \
     pg_catalog.inet_server_port(), ",
    can_check!()
);

/// What [`BACKEND_SQL`]'s row says, from the messages of the simple query that ran it: the
/// backend's pid, how the server sees a TCP session (`None` over a Unix socket), and whether
/// the role may read what the leader's check reads (only a clear "no" counts: a replica never
/// refuses to lead on an unread answer).
fn identity(messages: &[tokio_postgres::SimpleQueryMessage]) -> (Option<i32>, Option<Seen>, bool) {
    use tokio_postgres::SimpleQueryMessage;
    let last = messages.iter().rev().find_map(|m| match m {
        SimpleQueryMessage::Row(row) if row.len() == 5 => Some(row),
        _ => None,
    });
    let backend_pid = last.and_then(|row| row.get(0)?.parse::<i32>().ok());
    let seen = last.and_then(|row| {
        Some(Seen {
            client: (row.get(1)?.to_owned(), row.get(2)?.parse::<i32>().ok()?),
            server_port: row.get(3)?.parse::<i32>().ok()?,
        })
    });
    let can_check = last.and_then(|row| row.get(4)) != Some("f");
    (backend_pid, seen, can_check)
}

/// Whether a new session of `config` to `target` is direct ([`reaches_directly`]): the check
/// of a replica that found a transaction-mode pooler a moment ago asks this first
/// ([`crate::elector::pooler_backoff`]).
pub(crate) async fn is_direct_session(
    config: &Config,
    target: &str,
    steps: &Steps,
) -> Result<bool, Error> {
    reaches_directly(
        &config.connect,
        &config.tls,
        target,
        config.io_bound(),
        config.early_connect.as_deref(),
        Some(steps),
    )
    .await
}

/// Whether a new session of `connect` and `tls` to `target` is direct ([`is_direct`]), asked
/// with [`BACKEND_SQL`] alone: no `SET`, which behind a transaction-mode pooler would stay on
/// a server connection other clients use next (a `statement_timeout` of ours cancelling their
/// statements). The session is closed again; each step is bounded by
/// `bound`, and `steps` (when given) is told when the statement begins.
///
/// # Errors
/// The connect's ([`connect_socket`]), [`Error::Query`] or [`Error::Timeout`] of the statement.
pub(crate) async fn reaches_directly(
    connect: &tokio_postgres::Config,
    tls: &crate::pg::tls::TlsSettings,
    target: &str,
    bound: Duration,
    early: Option<&super::connecting::EarlyConnect>,
    steps: Option<&Steps>,
) -> Result<bool, Error> {
    let ((client, _closed, _task), link) =
        connect_socket(connect, tls, target, bound, early, steps).await?;
    if let Some(steps) = steps {
        steps.begin();
    }
    session_is_direct(&client, &link, bound).await
}

/// Whether the session `client`, connected over `link`, is direct ([`is_direct`]), asked with
/// [`BACKEND_SQL`] alone (no `SET`), bounded by `bound`, and asked again when the role's own
/// `statement_timeout` cancels it (up to [`crate::pg::BOUND_SESSION_TRIES`] times). `doctor`
/// asks it of its first session.
///
/// # Errors
/// [`Error::Query`] or [`Error::Timeout`] of the statement.
pub(crate) async fn session_is_direct(
    client: &Client,
    link: &super::connecting::Link,
    bound: Duration,
) -> Result<bool, Error> {
    let messages = crate::pg::until_not_cancelled(|_| {
        within("who answers", bound, client.simple_query(BACKEND_SQL))
    })
    .await?;
    let (backend_pid, seen, _) = identity(&messages);
    Ok(is_direct(
        link.fd.as_fd(),
        seen.as_ref(),
        backend_pid.unwrap_or_default(),
    ))
}

/// Says, once per process, that the server has no `idle_session_timeout` (PostgreSQL 13):
/// at WARN for the long-running modes, at DEBUG when [`Config::warn_weaker_server`] is off.
fn weaker_server(config: &Config) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let bound = humantime::format_duration(config.effective_idle_session_timeout());
    if config.warn_weaker_server {
        warn!(
            target: "leaderrun::elector",
            "leader: the server has no idle_session_timeout (PostgreSQL 13; supported: 14 to 18): \
             the lock session's TCP keepalives and tcp_user_timeout free the lock of a leader cut \
             off by the network within about {bound}, but a leader frozen with its connection \
             open keeps it until it wakes"
        );
    } else {
        tracing::debug!(
            target: "leaderrun::elector",
            "leader: the server has no idle_session_timeout (PostgreSQL 13): a frozen leader \
             keeps the lock until it wakes; a cut-off one loses it within about {bound}"
        );
    }
}

/// A setting as PostgreSQL shows it (`20s`, `1500ms`, `1min`, `4`) in whole `base` units
/// (1 ms or 1 s, the setting's own unit); `None` when it is not a number with a time unit
/// PostgreSQL uses.
pub(crate) fn shown_in_base_units(shown: &str, base: Duration) -> Option<u64> {
    let digits = shown.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let number: u64 = digits.trim().parse().ok()?;
    let unit = match &shown[digits.len()..] {
        "" => return Some(number),
        "us" => Duration::from_micros(1),
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        _ => return None,
    };
    Some((unit.as_nanos() * u128::from(number) / base.as_nanos()) as u64)
}

/// A database session of an elector, with its connection driven on its own task: the one it
/// tries and holds the lock on, or an extra head of a queue head with slots
/// (docs/election.md#slots).
pub(crate) struct Session {
    /// `None` only while [`Session::close`] runs.
    pub(crate) client: Option<Client>,
    pub(crate) backend_pid: i32,
    /// The standby's try ([`try_sql`]), prepared once per session so each check is one round
    /// trip; `None` until the session's second try when its first ran in the set-up flight
    /// ([`Session::open_and_try`]).
    pub(crate) try_lock: Option<Statement>,
    /// The waits of the places in the line ([`wait_sql`]), by (slot, place), prepared when
    /// this session first held that place (for one slot: at connect).
    pub(crate) waits: Vec<((u32, u32), Statement)>,
    /// The place (slot, place) in the line of standbys ([`LockKey::queue_key`]) this session
    /// holds: it waits in the server's queue, for the lock or for the place ahead.
    pub(crate) place: Option<(u32, u32)>,
    /// The key this session was granted, while it leads.
    pub(crate) granted: Option<LockKey>,
    /// The leader's check ([`LOCK_ROW_SQL`](super::campaign::LOCK_ROW_SQL) after a comment),
    /// set at the grant; its text carries the term, so that `pg_stat_activity.query` of the
    /// lock session tells `leaderrun status` since when it leads.
    pub(crate) check: Option<String>,
    /// Resolves when the connection task ends: the server closed the session or the socket
    /// broke. Polled at most until it resolves (the session is discarded then).
    pub(crate) closed: oneshot::Receiver<Option<tokio_postgres::Error>>,
    pub(crate) task: JoinHandle<()>,
    /// A copy of the connection's socket ([`Link::fd`](super::connecting::Link)): the one the
    /// watchdog is given at a grant. Dropped with the session, so it never keeps a session
    /// open that the elector closed.
    pub(crate) fd: std::os::fd::OwnedFd,
    /// Which host of the list the session reached (`USER@HOST:PORT/DBNAME`).
    pub(crate) endpoint: String,
    /// The keeper ([`Config::keeper`](crate::Config)) that was given a copy of the socket at
    /// the grant: it drops the copy before the session closes ([`Session::release_copy`], or
    /// the drop of a session that nobody released, as when a caller drops `Elector::run`'s
    /// future mid-resignation), or the copy would keep the session, and the lock, alive.
    pub(crate) keeper: Option<std::sync::Arc<dyn crate::elector::SessionKeeper>>,
    /// No pooler can sit between this session and its server backend ([`is_direct`], from
    /// what the pin read back). A session that is not direct may share its backend with other
    /// clients' sessions: its tries and waits are guarded
    /// ([`SHARED_BACKEND`](crate::pg::lock::SHARED_BACKEND)), and it leads only on a grant of
    /// a guarded one.
    pub(crate) direct: bool,
    /// The server's `synchronous_standby_names` when its commits, a grant's too, wait for a
    /// synchronous standby ([`SYNC_STANDBYS`](crate::pg::lock::SYNC_STANDBYS)), read when the
    /// timers are pinned: a try that times out says so ([`Session::explain`]).
    pub(crate) sync_standbys: Option<String>,
    /// Whether the session's role may read what the leader's check reads ([`can_check!`](crate::pg::lock::can_check)),
    /// as the pin found it: a grant on a session that may not is given back, no term begins.
    pub(crate) can_check: bool,
}

impl Session {
    /// Connects and pins the timers, in one round trip after the startup (on PostgreSQL's own
    /// Unix socket the lock statements are prepared in the same flight; elsewhere each is
    /// prepared when first needed, on a direct session only).
    pub(crate) async fn open(config: &Config, target: &str) -> Result<Session, Error> {
        let (session, _) = Session::open_with(config, target, false, None).await?;
        Ok(session)
    }

    /// [`Session::open`] with the standby's first try ([`try_sql`], unprepared) in the same
    /// flight, after the timers: a new session's first check costs no round trip of its own.
    /// The server runs the flight in order, so the try runs under the pinned timers; a session
    /// whose pinning failed is never used, and dropping it frees whatever the try took. The
    /// try is sent before the pin's answer tells whether the session is direct, so it takes
    /// something only where the server sees our socket's ends ([`Guard::Direct`]; `r` is
    /// [`NOT_DIRECT`](crate::pg::lock::NOT_DIRECT) elsewhere); over a Unix socket it is sent only when the
    /// listener is PostgreSQL's ([`listener_is_postgres`]). Returns the session and the try's
    /// answer (its row, or why it failed: the caller handles that as any failed try, on a
    /// session it may not reuse; `None` when no try was sent). `steps` is told of each step.
    pub(crate) async fn open_and_try(
        config: &Config,
        target: &str,
        steps: &Steps,
    ) -> Result<(Session, Option<Result<tokio_postgres::Row, Error>>), Error> {
        Session::open_with(config, target, true, Some(steps)).await
    }

    /// What this session's tries and waits have the server check ([`Guard`]): nothing on a
    /// direct session, the pinned backend and its locks on any other.
    pub(crate) fn guard(&self) -> Guard {
        if self.direct {
            Guard::None
        } else {
            Guard::Shared {
                backend_pid: self.backend_pid,
            }
        }
    }

    /// This session's wait at `place` (slot, place) in the line ([`wait_sql`], with its
    /// [`Session::guard`]).
    pub(crate) fn wait_text(&self, config: &Config, place: (u32, u32)) -> String {
        wait_sql(
            config.lock,
            config.effective_slots(),
            place.0,
            place.1,
            &self.guard(),
        )
    }

    /// Gives `held` back, the grant being on this session's pinned backend. A direct
    /// session sends one unlock. On one that is not direct the unlock runs only on that
    /// backend ([`give_back_sql`]): behind a transaction-mode pooler a statement may land on
    /// another, and a count left on a pooled backend keeps every replica out for as long as the
    /// pooler keeps that server connection (docs/field-notes.md#transaction-mode-poolers-move-the-session).
    /// So it is sent again, [`crate::pg::lock::GIVE_BACK_PAUSE`] apart, until the grant's backend answers or
    /// `bound` passes: a pooler that hands out its server connections in turn reaches that
    /// one within a round of them. Nothing is left open (no transaction, no other session) for
    /// the pooler to hand on. Returns whether the grant's backend ran the unlock; a WARN names
    /// the backend when it did not.
    pub(crate) async fn give_back(&self, held: Held, bound: Duration) -> bool {
        let Some(client) = self.client.as_ref() else {
            return false;
        };
        if self.direct {
            let unlock = format!("SELECT {}", held.unlock_call());
            return within("unlock", bound, client.simple_query(&unlock))
                .await
                .is_ok();
        }
        let sql = give_back_sql(held, self.backend_pid);
        let sql = &sql;
        let landed = on_backend(bound, |left| async move {
            let messages = within(
                "give-back on the grant's backend",
                left,
                client.simple_query(sql),
            )
            .await?;
            Ok(messages.iter().any(
                |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0).is_some()),
            ))
        })
        .await;
        if landed {
            return true;
        }
        warn!(
            target: "leaderrun::elector",
            lock = %held,
            "leader: cannot give the lock back on server backend {}: this session's statements \
             ran on other backends (a transaction-mode pooler) or failed; it stays held there \
             until the pooler closes that server connection (SELECT pg_terminate_backend({}) \
             frees it at once)",
            self.backend_pid,
            self.backend_pid
        );
        false
    }

    async fn open_with(
        config: &Config,
        target: &str,
        try_now: bool,
        steps: Option<&Steps>,
    ) -> Result<(Session, Option<Result<tokio_postgres::Row, Error>>), Error> {
        let bound = config.io_bound();
        let ((client, closed, task), link) = connect_socket(
            &config.connect,
            &config.tls,
            target,
            bound,
            config.early_connect.as_deref(),
            steps,
        )
        .await?;
        if let Some(steps) = steps {
            steps.begin();
        }
        let mut session = Session {
            fd: link.fd,
            endpoint: link.endpoint.clone(),
            client: Some(client),
            backend_pid: 0,
            try_lock: None,
            waits: Vec::new(),
            place: None,
            granted: None,
            check: None,
            closed,
            task,
            keeper: None,
            direct: false,
            sync_standbys: None,
            can_check: true,
        };
        // One round trip for all of it: the timers are set and read back in one simple query,
        // and the statements are prepared in the same flight (tokio-postgres pipelines
        // requests that are in flight together; the server answers them in order).
        let slots = config.effective_slots();
        // Whether the session is direct is known only from the pin's answer: the flight's
        // try takes something only where the server sees our socket's ends, and one that is
        // not direct sends its guarded statements unprepared. The flight prepares only on
        // PostgreSQL's own Unix socket: behind a transaction-mode pooler a named statement
        // stays on the shared server connection, where it piles up check after check and
        // collides with the next client's of the same name; over TCP a direct session
        // prepares each statement when it first needs it.
        let flight_guard = first_try_guard(session.fd.as_fd());
        let prepare_now = flight_guard == Some(Guard::None);
        let try_now = try_now && flight_guard.is_some();
        let try_sql = try_sql(
            config.lock,
            slots,
            config.wait_for_release,
            flight_guard.as_ref().unwrap_or(&Guard::None),
        );
        let places: Vec<(u32, u32)> = if config.wait_for_release && slots == 1 && prepare_now {
            (1..=QUEUE_PLACES).map(|place| (0, place)).collect()
        } else {
            Vec::new()
        };
        let Some(client) = session.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        let prepared = async {
            let texts: Vec<String> = places
                .iter()
                .map(|&(slot, place)| wait_sql(config.lock, slots, slot, place, &Guard::None))
                .collect();
            // The try is prepared only when it does not run in this flight: a session whose
            // first try runs here (a one-shot's only one) prepares it at its second
            // (`try_acquire_inner`), and a fresh backend's parse of it is not paid twice.
            let (try_lock, waits) = tokio::join!(
                async {
                    if try_now || !prepare_now {
                        Ok(None)
                    } else {
                        client.prepare(&try_sql).await.map(Some)
                    }
                },
                futures_util::future::join_all(texts.iter().map(|sql| client.prepare(sql)))
            );
            let waits = waits.into_iter().collect::<Result<Vec<_>, _>>()?;
            Ok((try_lock?, places.iter().copied().zip(waits).collect()))
        };
        // join! polls in the order written, and each request is sent at its first poll: the
        // timers go first, the try last.
        let first_try = async {
            if try_now {
                Some(
                    within(
                        "try advisory lock",
                        bound,
                        client.query_typed(&try_sql, &[]),
                    )
                    .await,
                )
            } else {
                None
            }
        };
        let (pinned, prepared, answer) = tokio::join!(
            session.pin_timers(config, bound, link.server_major),
            within("prepare the lock statements", bound, prepared),
            first_try
        );
        let answer = answer.map(|rows| {
            rows.and_then(|mut rows| match rows.len() {
                1 => Ok(rows.remove(0)),
                n => Err(Error::UnexpectedRows {
                    what: "try advisory lock",
                    rows: n,
                }),
            })
        });
        let pinned = pinned?;
        (
            session.backend_pid,
            session.sync_standbys,
            session.can_check,
        ) = (pinned.backend_pid, pinned.sync_standbys, pinned.can_check);
        session.direct = is_direct(
            session.fd.as_fd(),
            pinned.seen.as_ref(),
            session.backend_pid,
        );
        let (try_lock, waits) = prepared?;
        // Prepared unguarded: a direct session's only.
        if session.direct {
            session.try_lock = try_lock;
            session.waits = waits;
        }
        Ok((session, answer))
    }

    /// Sets [`server_timers`] with `SET` and reads them back with `SHOW`, in one simple query
    /// (one round trip, one implicit transaction: a failed statement takes back every setting);
    /// a value the server did not take is logged at WARN. `SET` and `SHOW` are utility
    /// statements: a fresh backend neither plans them nor looks up functions for them, which a
    /// `SELECT` of `set_config` over the same settings cost it (0.2 to 0.8 ms of the one-shot,
    /// BENCHMARKS.md). Only settings the server has are named ([`added_in`] against
    /// `server_major`; without `idle_session_timeout` the weaker bound is said,
    /// [`weaker_server`]); an unknown major is taken as one that has them all. Returns what
    /// the same round trip read besides ([`Pinned`]).
    pub(crate) async fn pin_timers(
        &self,
        config: &Config,
        bound: Duration,
        server_major: Option<u32>,
    ) -> Result<Pinned, Error> {
        use tokio_postgres::SimpleQueryMessage;
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        let timers = server_timers_on(config, server_major);
        if timers
            .iter()
            .all(|(name, _)| *name != "idle_session_timeout")
        {
            weaker_server(config);
        }
        // Every name is one of ours and every value a number we formatted: nothing to quote.
        let mut sql = String::new();
        for (name, value) in &timers {
            sql.push_str(&format!("SET {name} = {value}; "));
        }
        for (name, _) in &timers {
            sql.push_str(&format!("SHOW {name}; "));
        }
        sql.push_str("SHOW synchronous_standby_names; SHOW synchronous_commit; ");
        sql.push_str(BACKEND_SQL);
        let messages = within("pin session timers", bound, client.simple_query(&sql)).await?;
        // SHOW answers with a column named after the setting.
        let shown: Vec<(String, String)> = messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some((
                    row.columns().first()?.name().to_owned(),
                    row.get(0).unwrap_or_default().to_owned(),
                )),
                _ => None,
            })
            .collect();
        let value = |name: &str| {
            shown
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        for (name, wanted) in &timers {
            let Some(shown) = value(name) else { continue };
            let base = if name.starts_with("tcp_keepalives_") {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(1)
            };
            let taken = shown_in_base_units(shown, base);
            // The TCP settings show 0 where the backend's client is not on TCP (a Unix
            // socket): they do not apply there.
            if name.starts_with("tcp_") && taken == Some(0) {
                continue;
            }
            if taken.is_some_and(|t| wanted.parse::<u64>().ok() != Some(t)) {
                warn!(
                    target: "leaderrun::elector",
                    "leader: the server did not take {name} = {wanted} (it has {})",
                    crate::error::cut(shown, crate::error::MAX_TEXT_BYTES)
                );
            }
        }
        let standbys = sync_standbys(
            value("synchronous_standby_names").unwrap_or_default(),
            value("synchronous_commit").unwrap_or_default(),
        );
        let (backend_pid, seen, can_check) = identity(&messages);
        match backend_pid {
            Some(backend_pid) => Ok(Pinned {
                backend_pid,
                sync_standbys: standbys,
                seen,
                can_check,
            }),
            None => Err(Error::UnexpectedRows {
                what: "pin session timers",
                rows: shown.len(),
            }),
        }
    }

    /// `err` of a statement on this session, with what the server adds to a timeout: on a
    /// server whose commits wait for a synchronous standby, a try or a wait that timed out may
    /// be a grant waiting for that standby ([`Error::AwaitingStandby`]).
    pub(crate) fn explain(&self, err: Error) -> Error {
        match (err, &self.sync_standbys) {
            (Error::Timeout { what, after }, Some(standbys)) => Error::AwaitingStandby {
                what,
                after,
                standbys: standbys.clone(),
            },
            (err, _) => err,
        }
    }

    /// Prepares a statement, bounded by `bound`.
    pub(crate) async fn prepare(
        &self,
        what: &'static str,
        bound: Duration,
        sql: &str,
    ) -> Result<Statement, Error> {
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        within(what, bound, client.prepare(sql)).await
    }

    /// Runs one statement that returns one row, bounded by `bound`.
    pub(crate) async fn bounded<S: ToStatement + ?Sized>(
        &self,
        what: &'static str,
        bound: Duration,
        sql: &S,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, Error> {
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        within(what, bound, client.query_one(sql, params)).await
    }

    /// Runs one statement that returns one row, unprepared (the extended protocol's unnamed
    /// statement: parse, bind and execute in one round trip), bounded by `bound`.
    pub(crate) async fn bounded_typed(
        &self,
        what: &'static str,
        bound: Duration,
        sql: &str,
        params: &[(
            &(dyn tokio_postgres::types::ToSql + Sync),
            tokio_postgres::types::Type,
        )],
    ) -> Result<tokio_postgres::Row, Error> {
        let Some(client) = self.client.as_ref() else {
            return Err(Error::SessionClosed(None));
        };
        let mut rows = within(what, bound, client.query_typed(sql, params)).await?;
        match rows.len() {
            1 => Ok(rows.remove(0)),
            n => Err(Error::UnexpectedRows { what, rows: n }),
        }
    }

    /// Closes the session politely (Terminate message). With `wait` (the lock may still be
    /// held: its unlock failed) it waits up to 1 s for the server to close the socket, so that
    /// the lock reaches the standbys before `run` returns; without, it returns once Terminate
    /// is on its way (a server's backend takes a millisecond or two to exit, which a one-shot
    /// need not wait for).
    pub(crate) async fn close(mut self, wait: bool) {
        // Dropping the only client makes the connection send Terminate and finish.
        drop(self.client.take());
        let bound = if wait {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(20)
        };
        let _ = timeout(bound, &mut self.task).await;
        // Drop aborts the task if it is still running.
    }
}

impl Session {
    /// Closes the session at once, a statement in flight or not, and returns once its socket
    /// is closed (the connection's task has ended, bounded by 100 ms past which it ends anyway,
    /// and the session's own copy is dropped on return): the server then frees whatever the
    /// session held. For a standby's session that
    /// lost the race to another of this replica's sessions, before a term begins on that one.
    pub(crate) async fn close_now(mut self) {
        self.task.abort();
        let _ = timeout(Duration::from_millis(100), &mut self.task).await;
    }
}

impl Session {
    /// Has the keeper that holds a copy of this session's socket drop it, before the session
    /// is closed on purpose; with `wait`, returns once it is dropped (bounded), as
    /// [`SessionKeeper::release`](crate::elector::SessionKeeper::release). Nothing when no
    /// keeper holds one.
    pub(crate) fn release_copy(&mut self, wait: bool) {
        if let Some(keeper) = self.keeper.take() {
            keeper.release(wait);
        }
    }
}

impl Drop for Session {
    /// A dropped session (demotion, failed try, panic, a caller's dropped future) closes its
    /// socket now, which makes the server end the backend and free any lock it held; a copy
    /// the keeper still holds goes first.
    fn drop(&mut self) {
        self.release_copy(true);
        self.task.abort();
    }
}

/// Resolves when the session's connection ends; pending forever without a session.
pub(crate) async fn session_closed(session: Option<&mut Session>) -> Option<tokio_postgres::Error> {
    match session {
        Some(s) => (&mut s.closed).await.unwrap_or(None),
        None => std::future::pending().await,
    }
}

/// Reads CLOCK_BOOTTIME: monotonic, and it keeps running while the machine sleeps
/// (docs/field-notes.md#measuring-the-safe-window), unlike tokio's clock.
pub fn boottime() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default()
}

/// What [`Session::pin_timers`] read besides the timers.
pub(crate) struct Pinned {
    /// `pg_backend_pid()`.
    pub(crate) backend_pid: i32,
    /// The server's synchronous standbys ([`sync_standbys`]).
    pub(crate) sync_standbys: Option<String>,
    /// How the server sees the session's TCP connection; `None` over a Unix socket.
    pub(crate) seen: Option<Seen>,
    /// Whether the role may read what the leader's check reads ([`can_check!`](crate::pg::lock::can_check)).
    pub(crate) can_check: bool,
}

/// A TCP session as its server backend sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Seen {
    /// The client's address and port (`host(inet_client_addr())`, `inet_client_port()`).
    pub(crate) client: (String, i32),
    /// The port the server took the connection on (`inet_server_port()`).
    pub(crate) server_port: i32,
}

/// The guard of a session's first try, sent before the pin's answer tells whether the
/// session is direct ([`Guard::Direct`]): over TCP the server compares our socket's ends with
/// the ones it sees, as [`is_direct`] does afterwards; over a Unix socket, where the server
/// sees no address, no try is sent (`None`) unless the listener is PostgreSQL's
/// ([`listener_is_postgres`]), and [`is_direct`] still decides after the pin.
pub(crate) fn first_try_guard(fd: BorrowedFd<'_>) -> Option<Guard> {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let local = getsockname::<SockaddrStorage>(raw).ok()?;
    if local.as_unix_addr().is_some() {
        return listener_is_postgres(fd).then_some(Guard::None);
    }
    let local = inet(Some(local))?;
    let peer = inet(getpeername::<SockaddrStorage>(raw).ok())?;
    Some(Guard::Direct {
        client_addr: local.ip(),
        client_port: local.port(),
        server_port: peer.port(),
    })
}

/// A socket address as an IP one, when it is.
fn inet(address: Option<nix::sys::socket::SockaddrStorage>) -> Option<std::net::SocketAddr> {
    address.and_then(|a| {
        a.as_sockaddr_in()
            .map(|v4| std::net::SocketAddr::V4((*v4).into()))
            .or_else(|| {
                a.as_sockaddr_in6()
                    .map(|v6| std::net::SocketAddr::V6((*v6).into()))
            })
    })
}

/// Whether the process listening behind the Unix socket `fd` (`SO_PEERCRED`, unix(7)) is
/// named `postgres` in this machine's `/proc` (its `comm`, which PostgreSQL's postmaster keeps;
/// a pooler's is its own). Read before the session's first try, whose grant on a pooled
/// backend could not be given back for sure: [`unix_listener_is_parent_of`] is the proof, once
/// the pin has named the backend.
fn listener_is_postgres(fd: BorrowedFd<'_>) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(&fd, PeerCredentials).is_ok_and(|peer| {
        peer.pid() > 0
            && std::fs::read(format!("/proc/{}/comm", peer.pid()))
                .is_ok_and(|comm| comm == b"postgres\n")
    })
}

/// Whether no pooler can sit between the session's socket `fd` and its server backend
/// (docs/field-notes.md#transaction-mode-poolers-move-the-session), given how the server sees
/// the session (`None` over a Unix socket) and the backend that answers on it
/// (`pg_backend_pid()`): a TCP socket whose local address and port are the client's the server
/// sees and whose peer's port is the one the server took the connection on, or a Unix socket
/// whose listener is the backend's parent ([`unix_listener_is_parent_of`]). The server's port
/// rules out a pooler on this host whose own connection to the server got the same local port
/// as ours to the pooler (Linux shares an ephemeral port between connections to different
/// destinations), unless the pooler listens on the server's port number too. Only the port is
/// compared: a DNAT that keeps it (a Kubernetes Service) stays direct.
pub(crate) fn is_direct(fd: BorrowedFd<'_>, seen: Option<&Seen>, backend_pid: i32) -> bool {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let local = getsockname::<SockaddrStorage>(raw).ok();
    let unix = local.as_ref().is_some_and(|a| a.as_unix_addr().is_some());
    match (inet(local), seen) {
        (Some(local), Some(seen)) => {
            let peer = inet(getpeername::<SockaddrStorage>(raw).ok());
            local.ip().to_canonical().to_string() == seen.client.0
                && i32::from(local.port()) == seen.client.1
                && peer.is_some_and(|peer| i32::from(peer.port()) == seen.server_port)
        }
        (None, None) if unix => unix_listener_is_parent_of(fd, backend_pid),
        _ => false,
    }
}

/// Whether the process that listens behind the Unix socket `fd` is the parent of backend
/// `backend_pid`, as this machine's `/proc` shows them: `SO_PEERCRED` names the process that
/// called `listen` (unix(7)), PostgreSQL's postmaster on a direct connection, whose child every
/// backend is; a pooler would be the listener and no backend's parent. The backend must also
/// run a program named `postgres` (its command line, which PostgreSQL rewrites to `postgres: …`
/// and leaves starting with that name): a pid of the server's that this machine's `/proc` does
/// not show as the same process (the server in another PID namespace) must not pass by chance.
/// False whenever anything cannot be read: the caller then proves it with a second session.
pub(crate) fn unix_listener_is_parent_of(fd: BorrowedFd<'_>, backend_pid: i32) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let Ok(peer) = getsockopt(&fd, PeerCredentials) else {
        return false;
    };
    // 0: the listener is in a PID namespace this process cannot see.
    if peer.pid() <= 0 || backend_pid <= 0 || backend_pid == peer.pid() {
        return false;
    }
    let proc_dir = std::path::PathBuf::from(format!("/proc/{backend_pid}"));
    let parent = std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|stat| {
            // The name may hold spaces and parentheses: the fields follow the last ") ".
            let (_, rest) = stat.rsplit_once(") ")?;
            rest.split_ascii_whitespace().nth(1)?.parse::<i32>().ok()
        });
    let postgres = std::fs::read(proc_dir.join("cmdline"))
        .is_ok_and(|cmdline| cmdline.starts_with(b"postgres"));
    parent == Some(peer.pid()) && postgres
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_select_names_the_catalogs_functions() {
        crate::pg::assert_qualified(BACKEND_SQL);
        crate::pg::assert_qualified(crate::pg::lock::CAN_CHECK_SQL);
    }

    /// Over TCP a session is direct only when the server sees our socket's own address and
    /// port as the client's and took the connection on the port our socket reached: a pooler's
    /// connection to the server that happens to use our local port fails the second test.
    #[test]
    fn a_tcp_session_is_direct_only_when_both_ends_are_the_ones_the_server_sees() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server_port = i32::from(listener.local_addr().unwrap().port());
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let local = stream.local_addr().unwrap();
        let client = ("127.0.0.1".to_owned(), i32::from(local.port()));
        let seen = |client: (String, i32), server_port| Seen {
            client,
            server_port,
        };
        let fd = stream.as_fd();
        assert!(is_direct(fd, Some(&seen(client.clone(), server_port)), 0));
        // A pooler on this host listening on another port than the server's.
        assert!(!is_direct(
            fd,
            Some(&seen(client.clone(), server_port + 1)),
            0
        ));
        // Another client port, another client address.
        let other_port = ("127.0.0.1".to_owned(), client.1 + 1);
        assert!(!is_direct(fd, Some(&seen(other_port, server_port)), 0));
        let other_address = ("127.0.0.2".to_owned(), client.1);
        assert!(!is_direct(fd, Some(&seen(other_address, server_port)), 0));
        // Nothing seen (the server reports no TCP client): not direct.
        assert!(!is_direct(fd, None, 0));
    }

    /// A first try's guard names our socket's own ends, the ones [`is_direct`] compares after
    /// the pin; a Unix socket whose listener is not named `postgres` sends no first try.
    #[test]
    fn a_first_try_is_guarded_by_the_ends_of_its_own_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let local = stream.local_addr().unwrap();
        assert_eq!(
            first_try_guard(stream.as_fd()),
            Some(Guard::Direct {
                client_addr: local.ip(),
                client_port: local.port(),
                server_port: listener.local_addr().unwrap().port(),
            })
        );
        // This test process listens: its name is not postgres.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let _unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert_eq!(first_try_guard(client.as_fd()), None);
    }

    #[test]
    fn settings_as_shown_read_back_in_base_units() {
        let ms = Duration::from_millis(1);
        let s = Duration::from_secs(1);
        assert_eq!(shown_in_base_units("20s", ms), Some(20_000));
        assert_eq!(shown_in_base_units("1500ms", ms), Some(1500));
        assert_eq!(shown_in_base_units("1min", ms), Some(60_000));
        assert_eq!(shown_in_base_units("2h", s), Some(7200));
        assert_eq!(shown_in_base_units("10s", s), Some(10));
        assert_eq!(shown_in_base_units("4", s), Some(4));
        assert_eq!(shown_in_base_units("0", ms), Some(0));
        assert_eq!(shown_in_base_units("on", ms), None);
        assert_eq!(shown_in_base_units("5 parsecs", ms), None);
    }

    /// A `SET` names only settings the server's major has.
    #[test]
    fn each_timer_is_set_only_where_the_server_has_it() {
        let config = Config::new("host=h".parse().unwrap());
        let names = |major: Option<u32>| -> Vec<&str> {
            server_timers_on(&config, major)
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        let all = server_timers(&config).len();
        assert_eq!(names(None).len(), all);
        let names = |major: u32| names(Some(major));
        assert!(names(18).contains(&"idle_session_timeout"));
        assert_eq!(names(18).len(), all);
        assert!(!names(13).contains(&"idle_session_timeout"));
        assert!(!names(13).contains(&"client_connection_check_interval"));
        assert!(names(13).contains(&"tcp_user_timeout"));
        assert!(!names(11).contains(&"tcp_user_timeout"));
        assert!(names(11).contains(&"statement_timeout"));
        assert!(names(17).contains(&"transaction_timeout"));
        assert!(!names(16).contains(&"transaction_timeout"));
        assert!(names(11).contains(&"jit"));
        assert!(!names(10).contains(&"jit"));
    }

    /// The synchronous standbys a grant waits for, from the two settings as `SHOW` gives
    /// them: only when names are set and a commit waits for a standby.
    #[test]
    fn a_grant_waits_for_standbys_only_when_commits_do() {
        assert_eq!(sync_standbys("", "on"), None);
        assert_eq!(sync_standbys("s1", "on").as_deref(), Some("s1"));
        assert_eq!(
            sync_standbys("FIRST 1 (a, b)", "remote_apply").as_deref(),
            Some("FIRST 1 (a, b)")
        );
        assert_eq!(sync_standbys("s1", "remote_write").as_deref(), Some("s1"));
        assert_eq!(sync_standbys("s1", "local"), None);
        assert_eq!(sync_standbys("s1", "off"), None);
    }

    /// The lock session's client keepalives: one interval idle, half an interval between
    /// probes, 3 probes; a connection string's shorter values win, its longer ones do not.
    #[test]
    fn client_keepalives_take_the_shorter_of_ours_and_the_dsn() {
        let s = Duration::from_secs;
        let pinned = |dsn: &str| {
            let mut config = Config::new(dsn.parse().unwrap());
            config.check_interval = s(10);
            pin_client_timers(&mut config);
            let c = config.connect;
            (
                c.get_keepalives(),
                c.get_keepalives_idle(),
                c.get_keepalives_interval(),
                c.get_keepalives_retries(),
                c.get_tcp_user_timeout().copied(),
            )
        };
        let ours = (true, s(10), Some(s(5)), Some(3), Some(s(20)));
        assert_eq!(pinned("host=h"), ours);
        assert_eq!(
            pinned("host=h keepalives_idle=60 keepalives_interval=30 keepalives_retries=9"),
            ours
        );
        assert_eq!(
            pinned("host=h keepalives_idle=2 keepalives_interval=1 keepalives_retries=2"),
            (true, s(2), Some(s(1)), Some(2), Some(s(20)))
        );
    }
}
