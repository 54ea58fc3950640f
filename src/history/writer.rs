//! The history writer: a bounded queue in front of a task with a connection of its own (see
//! [`crate::history`]).
//!
//! One file because it is one task: its connection, its queue and the statements it runs on
//! them (create, insert, finish, mark lost, prune) share the same failure handling.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::Client;
use tracing::{debug, info, warn};

use super::{Outcome, TableName};
use crate::error::{Chain, Error};
use crate::pg::lock::LockKey;
use crate::pg::tls::TlsSettings;
use crate::pg::within;
use crate::process::child::ExitStatus;

/// Writes waiting for the writer at most; a write that finds the queue full is dropped.
pub const QUEUE: usize = 256;

/// How often the leader deletes rows older than `--history-keep` while it leads (besides at
/// the start of every term).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Rows one statement of the pruning deletes at most, at first: a batch that runs past the
/// session's `statement_timeout` (a slow or busy server, a short check interval) is cut to a
/// quarter for the next, down to [`PRUNE_BATCH_MIN`], so that a backlog still shrinks.
const PRUNE_BATCH: i64 = 1000;

/// The smallest batch of the pruning ([`PRUNE_BATCH`]).
const PRUNE_BATCH_MIN: i64 = 10;

/// Where the history table is: its schema, and whether that schema is named as the session's
/// role (`"$user"` of the `search_path`); no row when it does not exist. `$1`: the table's
/// name as SQL text (`TableName`'s display).
const WHERE_SQL: &str = "SELECT n.nspname::pg_catalog.text, \
     n.nspname OPERATOR(pg_catalog.=) CURRENT_USER \
     FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n \
       ON n.oid OPERATOR(pg_catalog.=) c.relnamespace \
     WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)";

/// After a failed connect, writes are dropped without a new attempt for this long, so a
/// database that is down costs one attempt per second, not one per queued write.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// How much earlier than its due time a run's `started_at` may be, at most, as
/// [`History::was_started`] looks for it (a due time's timer may fire a few milliseconds
/// early; the rest is slack for a clock set meanwhile).
const STARTED_EARLY: Duration = Duration::from_secs(60);

/// What the writer needs: where to connect, the table, the key whose runs it writes.
#[derive(Clone, Debug)]
pub struct HistorySettings {
    /// The lock's connection settings (the history lives in the lock's database).
    pub connect: tokio_postgres::Config,
    /// Their TLS part.
    pub tls: TlsSettings,
    /// `--history-table`.
    pub table: TableName,
    /// `--history-keep`.
    pub keep: Duration,
    /// The lock (its base key: slot 0's; rows carry the slot).
    pub lock: LockKey,
    /// `--schedule` and its zone's name, stored with each run so `status` can tell the next
    /// due time without being given the schedule.
    pub schedule: Option<(String, String)>,
    /// Bound of one statement (and of a connect): the session's `statement_timeout`; the
    /// client gives up a little later.
    pub bound: Duration,
}

/// The start of a run.
#[derive(Clone, Debug)]
pub struct RunStart {
    /// The slot of the term.
    pub slot: u32,
    /// The term's number in this process.
    pub term: u64,
    /// The term's fencing token.
    pub fencing_token: i64,
    /// When COMMAND started.
    pub started_at: SystemTime,
    /// The due time of a scheduled run.
    pub due_at: Option<SystemTime>,
}

/// The end of a run.
#[derive(Clone, Copy, Debug)]
pub struct RunEnd {
    /// When the tree was gone.
    pub ended_at: SystemTime,
    /// How the main child ended.
    pub status: ExitStatus,
    /// The outcome.
    pub outcome: Outcome,
}

/// A run [`History::run_started`] handed out, to pass to [`History::run_ended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunId(u64);

enum Op {
    Start {
        id: u64,
        run: RunStart,
    },
    End {
        id: u64,
        end: RunEnd,
    },
    TermBegan {
        slot: u32,
        fencing_token: i64,
    },
    Started {
        slot: u32,
        due_at: SystemTime,
        reply: oneshot::Sender<Option<bool>>,
    },
    Flush {
        reply: oneshot::Sender<()>,
    },
    TermOver,
}

/// The handle the supervisor writes through; cheap to clone. Every method returns at once
/// (the queries wait only as long as the caller bounds them), and none can fail the caller.
#[derive(Clone)]
pub struct History {
    tx: mpsc::Sender<Op>,
    next: Arc<AtomicU64>,
    /// Set while writes are being dropped for a full queue: one WARN per streak.
    dropping: Arc<AtomicBool>,
    table: Arc<str>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("table", &self.table)
            .finish()
    }
}

impl History {
    /// Starts the writer task on the current runtime; it connects at its first write and
    /// ends when the last handle is dropped.
    pub fn spawn(settings: HistorySettings) -> History {
        let (tx, rx) = mpsc::channel(QUEUE);
        let table: Arc<str> = settings.table.to_string().into();
        tokio::spawn(Writer::new(settings).run(rx));
        History {
            tx,
            next: Arc::new(AtomicU64::new(1)),
            dropping: Arc::new(AtomicBool::new(false)),
            table,
        }
    }

    /// Queues the row of a run that just started.
    pub fn run_started(&self, run: RunStart) -> RunId {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.send(Op::Start { id, run });
        RunId(id)
    }

    /// Queues the end of run `id`.
    pub fn run_ended(&self, id: RunId, end: RunEnd) {
        self.send(Op::End { id: id.0, end });
    }

    /// A term began on `slot` with `fencing_token`: queue the marking of runs of vanished
    /// leaders as lost, and the deletion of old rows.
    pub fn term_began(&self, slot: u32, fencing_token: i64) {
        self.send(Op::TermBegan {
            slot,
            fencing_token,
        });
    }

    /// Whether any replica started a run for `due_at` on `slot`, as far as the table says;
    /// `None` when that cannot be told within `bound` (the database is unreachable, the
    /// writer is busy with writes that wait).
    ///
    /// The question is queued when this is called, not when the answer is first awaited: a
    /// question asked before [`History::term_began`] is answered before the term's own writes
    /// (which may wait for locks on the table that a read does not wait for).
    pub fn was_started(
        &self,
        slot: u32,
        due_at: SystemTime,
        bound: Duration,
    ) -> impl std::future::Future<Output = Option<bool>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.send(Op::Started {
            slot,
            due_at,
            reply,
        });
        async move {
            if !sent {
                return None;
            }
            tokio::time::timeout(bound, answer).await.ok()?.ok()?
        }
    }

    /// The term is over and this replica a standby again: once the writes queued so far are
    /// done, the writer's session closes (the next term's first write opens one), so that a
    /// standby holds no session but its lock's. A full queue drops it (the session then stays
    /// open until the next `term_over`).
    pub fn term_over(&self) {
        self.send(Op::TermOver);
    }

    /// Waits up to `bound` for every write queued so far (at exit, after the lock is
    /// released: the last run's end is worth a moment, not a hang).
    pub async fn flush(&self, bound: Duration) {
        let (reply, done) = oneshot::channel();
        let sent = tokio::time::timeout(bound, self.tx.send(Op::Flush { reply })).await;
        if matches!(sent, Ok(Ok(()))) {
            let _ = tokio::time::timeout(bound, done).await;
        }
    }

    fn send(&self, op: Op) -> bool {
        match self.tx.try_send(op) {
            Ok(()) => {
                if self.dropping.swap(false, Ordering::Relaxed) {
                    info!(table = %self.table, "history: the queue has room again");
                }
                true
            }
            Err(_) => {
                if !self.dropping.swap(true, Ordering::Relaxed) {
                    warn!(
                        table = %self.table,
                        "history: {QUEUE} writes wait for the database; dropping history \
                         writes until it catches up (the run goes on)"
                    );
                }
                false
            }
        }
    }
}

/// What the writer knows of a run it was told of.
struct Known {
    run: RunStart,
    /// The row's `id`, once its insert succeeded.
    row: Option<i64>,
}

struct Writer {
    settings: HistorySettings,
    host: String,
    pid: i32,
    table: String,
    client: Option<Client>,
    /// Whether the table is known to exist (checked on each new connection until it is).
    ensured: bool,
    runs: HashMap<u64, Known>,
    /// In a streak of failures: one WARN at its start, one INFO at its end.
    failing: bool,
    reconnect_after: Option<Instant>,
    last_prune: Option<Instant>,
    /// Rows the next statement of the pruning deletes at most ([`PRUNE_BATCH`]).
    prune_batch: i64,
}

impl Writer {
    fn new(settings: HistorySettings) -> Writer {
        let name = crate::pg::conninfo::default_application_name();
        let (host, pid) = crate::pg::holder::parse_application_name(&name)
            .unwrap_or_else(|| ("unknown".to_owned(), std::process::id()));
        let table = settings.table.sql();
        Writer {
            settings,
            host,
            pid: pid as i32,
            table,
            client: None,
            ensured: false,
            runs: HashMap::new(),
            failing: false,
            reconnect_after: None,
            last_prune: None,
            prune_batch: PRUNE_BATCH,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        while let Some(op) = rx.recv().await {
            match op {
                Op::Flush { reply } => {
                    let _ = reply.send(());
                }
                Op::TermOver => {
                    if self.client.take().is_some() {
                        debug!("history: session closed (a standby again)");
                    }
                }
                Op::Started {
                    slot,
                    due_at,
                    reply,
                } => {
                    let answer = self.was_started(slot, due_at).await;
                    let _ = reply.send(answer);
                }
                op => self.apply(op).await,
            }
        }
        debug!("history writer done");
    }

    /// Applies one write, retrying once on a fresh connection when the connection was the
    /// problem; a failure is logged (once per streak) and the write dropped.
    async fn apply(&mut self, op: Op) {
        for attempt in 0..2 {
            let result = self.write(&op).await;
            match result {
                Ok(()) => return self.succeeded(),
                Err(err) => {
                    let closed = self.client.as_ref().map_or(true, Client::is_closed);
                    if closed || matches!(err, Error::Timeout { .. }) {
                        self.client = None;
                    }
                    if attempt == 0 && closed && self.reconnect_after.is_none() {
                        continue;
                    }
                    // A run whose end could not be written is not retried later: forget it.
                    if let Op::End { id, .. } = op {
                        self.runs.remove(&id);
                    }
                    return self.failed(&err);
                }
            }
        }
    }

    async fn write(&mut self, op: &Op) -> Result<(), Error> {
        let s = &self.settings;
        let (class, lock_id) = (s.lock.class, s.lock.id);
        let bound = self.client_bound();
        match op {
            Op::Start { id, run } => {
                self.runs.entry(*id).or_insert_with(|| Known {
                    run: run.clone(),
                    row: None,
                });
                self.ensure_client().await?;
                let client = self.client.as_ref().expect("connected");
                let sql = format!(
                    "INSERT INTO {} (lock_class, lock_id, slot, host, pid, term, fencing_token, \
                       due_at, started_at, outcome, schedule, tz) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, $11) RETURNING id",
                    self.table
                );
                let (schedule, tz) = self.schedule();
                let row = within(
                    "history insert",
                    bound,
                    client.query_one(
                        &sql,
                        &[
                            &class,
                            &lock_id,
                            &(run.slot as i32),
                            &self.host,
                            &self.pid,
                            &(run.term as i64),
                            &run.fencing_token,
                            &run.due_at,
                            &run.started_at,
                            &schedule,
                            &tz,
                        ],
                    ),
                )
                .await?;
                if let Some(known) = self.runs.get_mut(id) {
                    known.row = Some(row.get(0));
                }
                self.prune_if_due().await
            }
            Op::End { id, end } => {
                let Some(known) = self.runs.get(id) else {
                    return Ok(());
                };
                let (exit_code, signal) = match end.status {
                    ExitStatus::Code(code) => (Some(code), None),
                    ExitStatus::Signal(sig) => (None, Some(sig.as_str().to_owned())),
                };
                let lost = end.outcome == Outcome::Lost;
                let outcome = end.outcome.as_str();
                let (row, run) = (known.row, known.run.clone());
                self.ensure_client().await?;
                let client = self.client.as_ref().expect("connected");
                match row {
                    Some(row) => {
                        let sql = format!(
                            "UPDATE {} SET ended_at = $2, exit_code = $3, signal = $4, \
                               outcome = $5, lost = $6 WHERE id OPERATOR(pg_catalog.=) $1",
                            self.table
                        );
                        within(
                            "history update",
                            bound,
                            client.execute(
                                &sql,
                                &[&row, &end.ended_at, &exit_code, &signal, &outcome, &lost],
                            ),
                        )
                        .await?;
                    }
                    // The start's insert failed: the whole row now.
                    None => {
                        let sql = format!(
                            "INSERT INTO {} (lock_class, lock_id, slot, host, pid, term, \
                               fencing_token, due_at, started_at, ended_at, exit_code, signal, \
                               outcome, lost, schedule, tz) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                               $14, $15, $16)",
                            self.table
                        );
                        let (schedule, tz) = self.schedule();
                        within(
                            "history insert",
                            bound,
                            client.execute(
                                &sql,
                                &[
                                    &class,
                                    &lock_id,
                                    &(run.slot as i32),
                                    &self.host,
                                    &self.pid,
                                    &(run.term as i64),
                                    &run.fencing_token,
                                    &run.due_at,
                                    &run.started_at,
                                    &end.ended_at,
                                    &exit_code,
                                    &signal,
                                    &outcome,
                                    &lost,
                                    &schedule,
                                    &tz,
                                ],
                            ),
                        )
                        .await?;
                    }
                }
                self.runs.remove(id);
                Ok(())
            }
            Op::TermBegan {
                slot,
                fencing_token,
            } => {
                self.ensure_client().await?;
                let client = self.client.as_ref().expect("connected");
                let sql = format!(
                    "UPDATE {} SET outcome = 'lost', lost = true \
                     WHERE lock_class OPERATOR(pg_catalog.=) $1 \
                       AND lock_id OPERATOR(pg_catalog.=) $2 AND slot OPERATOR(pg_catalog.=) $3 \
                       AND outcome OPERATOR(pg_catalog.=) 'running' \
                       AND fencing_token OPERATOR(pg_catalog.<) $4",
                    self.table
                );
                let marked = within(
                    "history: mark runs of vanished leaders",
                    bound,
                    client.execute(&sql, &[&class, &lock_id, &(*slot as i32), fencing_token]),
                )
                .await?;
                if marked > 0 {
                    info!(
                        runs = marked,
                        "history: marked runs of leaders that vanished as lost"
                    );
                }
                self.last_prune = None;
                self.prune_if_due().await
            }
            Op::Started { .. } | Op::Flush { .. } | Op::TermOver => Ok(()),
        }
    }

    /// Deletes the key's rows older than `--history-keep`, at most once per [`PRUNE_EVERY`].
    /// In batches of [`PRUNE_BATCH`] rows (fewer after one was cancelled), each a statement of
    /// its own, for at most one bound:
    /// a backlog (a `--history-keep` made shorter, a table of millions of rows) is deleted a
    /// part at a time, on the next writes, instead of by one statement that the
    /// `statement_timeout` cancels every time.
    async fn prune_if_due(&mut self) -> Result<(), Error> {
        if self.last_prune.is_some_and(|at| at.elapsed() < PRUNE_EVERY) {
            return Ok(());
        }
        let bound = self.client_bound();
        let (class, lock_id) = (self.settings.lock.class, self.settings.lock.id);
        let keep = self.settings.keep.as_secs_f64();
        let sql = format!(
            "DELETE FROM {table} WHERE id OPERATOR(pg_catalog.=) ANY (ARRAY( \
               SELECT id FROM {table} WHERE lock_class OPERATOR(pg_catalog.=) $1 \
                 AND lock_id OPERATOR(pg_catalog.=) $2 \
                 AND started_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) \
                   pg_catalog.make_interval(secs => $3)) \
               LIMIT $4))",
            table = self.table
        );
        self.ensure_client().await?;
        let client = self.client.as_ref().expect("connected");
        let began = Instant::now();
        let mut deleted = 0;
        loop {
            let limit = self.prune_batch;
            let batch = match within(
                "history: delete old runs",
                bound,
                client.execute(&sql, &[&class, &lock_id, &keep, &limit]),
            )
            .await
            {
                Ok(batch) => batch,
                Err(err) => {
                    // Cancelled by the statement_timeout (or past the client's bound, whose
                    // session is not reused): a smaller batch next time, or the same one would
                    // be cancelled at every write.
                    let cancelled = crate::pg::cancelled(&err);
                    if matches!(&err, Error::Timeout { .. }) {
                        self.prune_batch = (limit / 4).max(PRUNE_BATCH_MIN);
                    }
                    if cancelled && limit > PRUNE_BATCH_MIN {
                        // Housekeeping, not a failed write: the run's row is written all the
                        // same, and the next write deletes on with the smaller batch.
                        self.prune_batch = (limit / 4).max(PRUNE_BATCH_MIN);
                        tracing::debug!(target: "leaderrun::history", batch = self.prune_batch, "history: a batch of old runs took longer than the statement timeout; deleting fewer at a time");
                        return Ok(());
                    }
                    return Err(err);
                }
            };
            deleted += batch;
            if batch < limit as u64 {
                self.last_prune = Some(Instant::now());
                break;
            }
            // More to delete: the next write goes on with it.
            if began.elapsed() >= self.settings.bound {
                break;
            }
        }
        if deleted > 0 {
            debug!(
                rows = deleted,
                "history: deleted runs older than --history-keep"
            );
        }
        Ok(())
    }

    async fn was_started(&mut self, slot: u32, due_at: SystemTime) -> Option<bool> {
        let bound = self.client_bound();
        let (class, lock_id) = (self.settings.lock.class, self.settings.lock.id);
        // A run starts at its due time or after it, by the clock of the leader that computed
        // both: the bound on `started_at` lets the key's index find the row instead of reading
        // all the key's rows (a leader asks this for each due time early in its term).
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE lock_class OPERATOR(pg_catalog.=) $1 \
               AND lock_id OPERATOR(pg_catalog.=) $2 AND slot OPERATOR(pg_catalog.=) $3 \
               AND due_at OPERATOR(pg_catalog.=) $4 AND started_at OPERATOR(pg_catalog.>=) $5)",
            self.table
        );
        let since = due_at.checked_sub(STARTED_EARLY).unwrap_or(due_at);
        let result = async {
            self.ensure_client().await?;
            let client = self.client.as_ref().expect("connected");
            within(
                "history: was the due time started",
                bound,
                client.query_one(&sql, &[&class, &lock_id, &(slot as i32), &due_at, &since]),
            )
            .await
        }
        .await;
        match result {
            Ok(row) => Some(row.get(0)),
            Err(err) => {
                if matches!(err, Error::Timeout { .. }) {
                    self.client = None;
                }
                self.failed(&err);
                None
            }
        }
    }

    fn schedule(&self) -> (Option<String>, Option<String>) {
        match &self.settings.schedule {
            Some((expr, tz)) => (Some(expr.clone()), Some(tz.clone())),
            None => (None, None),
        }
    }

    /// The client's own bound: a little longer than the session's `statement_timeout`, so
    /// the server's cancel normally comes first and the session stays usable.
    fn client_bound(&self) -> Duration {
        self.settings.bound + Duration::from_secs(1)
    }

    /// The writer's session, connected (and the table made) when there is none.
    async fn ensure_client(&mut self) -> Result<(), Error> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
        }
        if self.client.is_none() {
            if let Some(after) = self.reconnect_after {
                if Instant::now() < after {
                    return Err(Error::Timeout {
                        what: "history: reconnect (paused after a failed connect)",
                        after: RECONNECT_PAUSE,
                    });
                }
            }
            match self.connect().await {
                Ok(client) => {
                    self.reconnect_after = None;
                    self.client = Some(client);
                }
                Err(err) => {
                    self.reconnect_after = Some(Instant::now() + RECONNECT_PAUSE);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    async fn connect(&mut self) -> Result<Client, Error> {
        let mut config = self.settings.connect.clone();
        // A session of its own, told apart from the lock session in pg_stat_activity.
        if config.get_application_name() == Some(&crate::pg::conninfo::default_application_name()) {
            let mut name = format!("leaderrun-history@{}:{}", self.host, self.pid);
            while name.len() > 63 {
                name.remove(18);
            }
            config.application_name(&name);
        }
        let target = crate::pg::conninfo::describe(&config);
        let bound = self.settings.bound;
        let (client, _closed, _task) =
            crate::elector::connect(&config, &self.settings.tls, &target, bound).await?;
        crate::pg::bound_session("history: session settings", &client, bound).await?;
        // A hot standby refuses every write with the same read-only error (25006) as a role's
        // or database's default_transaction_read_only, so it is told apart here, once per
        // session: a later read-only error is then that default. The default itself is left in
        // force: a DBA sets it to keep a role from writing or to freeze a database (a migration,
        // a switchover), and a record of runs is not worth writing past that; the run goes on
        // unrecorded, and the WARN says which setting refuses it.
        let recovery = within(
            "history: is the server in recovery",
            bound,
            client.query_one("SELECT pg_catalog.pg_is_in_recovery()", &[]),
        )
        .await?;
        if recovery.get::<_, bool>(0) {
            return Err(Error::HistoryInRecovery { server: target });
        }
        if !self.ensured {
            self.ensure_table(&client).await;
        }
        Ok(client)
    }

    /// Creates the table when it does not exist; without the right to, one WARN that names
    /// the README's SQL (a DBA's table is used as soon as it is there). An unqualified name
    /// that resolves to the role's own schema gets a WARN of its own ([`own_schema_warning`]).
    async fn ensure_table(&mut self, client: &Client) {
        let bound = self.settings.bound;
        let found = within(
            "history: look for the table",
            bound,
            client.query_opt(WHERE_SQL, &[&self.table]),
        )
        .await;
        if let Ok(Some(row)) = &found {
            self.ensured = true;
            self.own_schema_warning(row.get(0), row.get(1));
            return;
        }
        let create = self.settings.table.create_sql();
        match within(
            "history: create the table",
            bound,
            client.batch_execute(&create),
        )
        .await
        {
            Ok(()) => {
                self.ensured = true;
                let created = within(
                    "history: look for the table",
                    bound,
                    client.query_opt(WHERE_SQL, &[&self.table]),
                )
                .await;
                match created {
                    Ok(Some(row)) => {
                        let schema: String = row.get(0);
                        info!(table = %self.settings.table, schema = %schema, "history: created the table");
                        self.own_schema_warning(schema, row.get(1));
                    }
                    _ => info!(table = %self.settings.table, "history: created the table"),
                }
            }
            Err(err) => {
                // A DBA's table helps only when the refusal was the right to create it: a
                // read-only session (its hint says why) could not write into one either.
                let read_only = matches!(&err, Error::Query { source, .. }
                    if source.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION));
                let remedy = if read_only {
                    "runs go on unrecorded until the session may write"
                } else {
                    "a DBA creates it with the SQL in the README (Schedules, The history \
                     table); runs go on unrecorded until it exists"
                };
                warn!(
                    table = %self.settings.table,
                    "history: cannot create the table ({}); {remedy}",
                    Chain(&err)
                );
                // Once per process: a DBA's table is found by the writes themselves. The
                // writes' own failures until then say nothing new (the table is missing, the
                // session read-only): a streak begun, so they go to the debug level and the
                // first write that succeeds says so.
                self.ensured = true;
                self.failing = true;
            }
        }
    }

    /// An unqualified table name that resolves to a schema named as the session's role (the
    /// default `search_path` begins with `"$user"`, the manual's secure pattern of a schema per
    /// user): replicas that log in as other roles resolve it to their own schemas, and their
    /// histories never meet, so `--catch-up` and the due times' look-ups miss each other's
    /// runs (a due time ran twice) and `status` shows one role's runs. Said once per process,
    /// at INFO: one role for every replica is the usual case (and on PostgreSQL 15 and later,
    /// where `public` is not every role's to create in, the common one), and a one-shot's cron
    /// must mail nothing for it.
    fn own_schema_warning(&self, schema: String, own: bool) {
        if !own || self.settings.table.is_qualified() {
            return;
        }
        // The option to give, when the schema's name is one `--history-table` takes as it is.
        let qualified = format!("{schema}.{}", self.settings.table);
        let hint = match qualified.parse::<super::TableName>() {
            Ok(name) if name.to_string() == qualified => format!("--history-table {qualified}"),
            _ => "--history-table SCHEMA.TABLE, a schema every replica shares".to_owned(),
        };
        info!(
            table = %self.settings.table,
            schema = %schema,
            "history: the table is found in the role's own schema (search_path's \"$user\"): \
             replicas that log in as other roles would each use a table of their own; if they \
             do, name the schema every replica uses ({hint})"
        );
    }

    fn succeeded(&mut self) {
        if self.failing {
            self.failing = false;
            info!(table = %self.settings.table, "history: writes succeed again");
        }
    }

    fn failed(&mut self, err: &Error) {
        if !self.failing {
            self.failing = true;
            warn!(
                table = %self.settings.table,
                "history: cannot write the run history ({}); the run goes on, and this is \
                 logged once until a write succeeds",
                Chain(err)
            );
        } else {
            debug!("history: write failed: {}", Chain(err));
        }
    }
}
