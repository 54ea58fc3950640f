//! `--history`: one row per run of COMMAND in the database the lock lives in
//! (docs/guarantees.md#modes).
//!
//! # Theory of operation
//!
//! The table (`--history-table`, default [`DEFAULT_TABLE`] in the session's default schema)
//! holds one row per run: the lock (class, id, slot), the host and leaderrun pid, the term and
//! its fencing token, the due time a scheduled run was for, start and end, the exit code or
//! signal, the outcome ([`Outcome`]) and whether the run ended because the term was lost.
//! leaderrun creates it when it may ([`TableName::create_sql`]; the README gives the same SQL
//! for a DBA).
//!
//! Writes are off the fence's path: the supervisor hands each write to a [`History`] handle,
//! which puts it on a bounded queue and returns at once ([`History::run_started`],
//! [`History::run_ended`]); a task of its own ([`writer`]) writes them on a connection of its
//! own, every statement bounded by `statement_timeout` and `lock_timeout` on that session and
//! a client-side bound. A full queue drops the write, a failed write is dropped after one
//! retry on a fresh connection; either is one WARN per streak of failures and the run goes on.
//! A start row whose write failed is written whole when the run ends.
//!
//! A run whose leader vanished (`kill -9`, a cut-off host) stays `running` until a later
//! leader of the same key and slot marks it `lost`: at the start of every term, a leader marks
//! the `running` rows whose fencing token is lower than its own (the token grows across every
//! later term of any replica, so those runs' terms are over and their trees are dead). The
//! leader also deletes the key's rows older than `--history-keep` then, and at most once an
//! hour while it leads.

pub mod writer;

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::Client;

use crate::error::Error;
use crate::pg::lock::LockKey;
use crate::pg::within;

pub use writer::{History, HistorySettings, RunEnd, RunId, RunStart};

/// The default `--history-table`.
pub const DEFAULT_TABLE: &str = "leaderrun_runs";

/// The default `--history-keep`: 30 days.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many runs `status` shows.
pub const STATUS_RUNS: i64 = 10;

/// How a run ended, as the `outcome` column and `status --json` spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// COMMAND exited with code 0.
    Ok,
    /// COMMAND exited non-zero, died of a signal, or ran longer than `--timeout`.
    Failed,
    /// The term ended while COMMAND ran (it was stopped), or its leader vanished and a later
    /// leader marked it.
    Lost,
    /// Not finished, or its leader vanished and no later leader has marked it yet.
    Running,
}

impl Outcome {
    /// The column's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Lost => "lost",
            Outcome::Running => "running",
        }
    }

    fn parse(s: &str) -> Outcome {
        match s {
            "ok" => Outcome::Ok,
            "failed" => Outcome::Failed,
            "lost" => Outcome::Lost,
            _ => Outcome::Running,
        }
    }
}

/// `--history-table NAME`: `table` or `schema.table`, each an SQL identifier of letters,
/// digits and `_` (not starting with a digit), at most 63 bytes. Names are folded to lower
/// case, as PostgreSQL folds an unquoted name, and quoted when used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            name: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl std::str::FromStr for TableName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let ident = |part: &str| -> Result<String, String> {
            let ok = !part.is_empty()
                && part.len() <= 63
                && !part.starts_with(|c: char| c.is_ascii_digit())
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ok {
                Ok(part.to_ascii_lowercase())
            } else {
                Err(format!(
                    "{s:?} is not a table name: give NAME or SCHEMA.NAME of letters, digits \
                     and _ (at most 63 each)"
                ))
            }
        };
        match s.split_once('.') {
            Some((schema, name)) => Ok(TableName {
                schema: Some(ident(schema)?),
                name: ident(name)?,
            }),
            None => Ok(TableName {
                schema: None,
                name: ident(s)?,
            }),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl TableName {
    /// The quoted name for SQL text.
    pub fn sql(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// Whether the name carries its schema (`schema.table`); an unqualified one is found, and
    /// created, through the session's `search_path`.
    pub fn is_qualified(&self) -> bool {
        self.schema.is_some()
    }

    /// The statements that create the table and its index, as leaderrun runs them and the
    /// README gives them to a DBA.
    pub fn create_sql(&self) -> String {
        let table = self.sql();
        // PostgreSQL cuts a name at 63 bytes: the index of a 63-byte table would be named as
        // the table itself, and `IF NOT EXISTS` would skip it. The names are ASCII.
        let index = format!("\"{}_key\"", &self.name[..self.name.len().min(63 - 4)]);
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n\
             \x20 id            bigserial PRIMARY KEY,\n\
             \x20 lock_class    integer NOT NULL,\n\
             \x20 lock_id       integer NOT NULL,\n\
             \x20 slot          integer NOT NULL DEFAULT 0,\n\
             \x20 host          pg_catalog.text NOT NULL,\n\
             \x20 pid           integer NOT NULL,\n\
             \x20 term          bigint NOT NULL,\n\
             \x20 fencing_token bigint NOT NULL,\n\
             \x20 due_at        timestamp with time zone,\n\
             \x20 started_at    timestamp with time zone NOT NULL,\n\
             \x20 ended_at      timestamp with time zone,\n\
             \x20 exit_code     integer,\n\
             \x20 signal        pg_catalog.text,\n\
             \x20 outcome       pg_catalog.text NOT NULL\n\
             \x20   CHECK (outcome OPERATOR(pg_catalog.=) ANY (ARRAY['ok', 'failed', 'lost', 'running'])),\n\
             \x20 lost          boolean NOT NULL DEFAULT false,\n\
             \x20 schedule      pg_catalog.text,\n\
             \x20 tz            pg_catalog.text\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {index} ON {table} (lock_class, lock_id, started_at);\n"
        )
    }
}

/// One run as `status` shows it; field names are stable (`status --json` `runs`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Run {
    /// The host the run was on.
    pub host: String,
    /// The pid of the leaderrun process that ran it.
    pub pid: i32,
    /// The slot it ran on.
    pub slot: i32,
    /// The term of that leaderrun process (1, 2, … within the process).
    pub term: i64,
    /// The term's fencing token.
    pub fencing_token: i64,
    /// The due time a scheduled run was for (RFC 3339, UTC), null for other runs.
    pub due_at: Option<String>,
    /// When COMMAND started (RFC 3339 with milliseconds, UTC).
    pub started_at: String,
    /// When it ended; null while running (and for a run of a vanished leader).
    pub ended_at: Option<String>,
    /// Its exit code; null when it died of a signal or has not finished.
    pub exit_code: Option<i32>,
    /// The signal it died of (`SIGTERM`), else null.
    pub signal: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
    /// Whether it ended because the term was lost.
    pub lost: bool,
}

impl Run {
    /// Its duration, when it has ended.
    pub fn duration(&self) -> Option<Duration> {
        let start = humantime::parse_rfc3339(&self.started_at).ok()?;
        let end = humantime::parse_rfc3339(self.ended_at.as_deref()?).ok()?;
        end.duration_since(start).ok()
    }
}

/// The last second RFC 3339 can spell (9999-12-31T23:59:59Z), in seconds since the epoch.
const RFC3339_MAX: f64 = 253_402_300_799.0;

/// Seconds since the epoch as an RFC 3339 time with milliseconds, UTC. The table is anyone's:
/// PostgreSQL's `infinity` and `-infinity` are spelled as PostgreSQL spells them, and a time
/// before 1970 or after the year 9999 is clamped to the nearest one RFC 3339 can spell.
fn rfc3339(secs: f64) -> String {
    if secs == f64::INFINITY {
        return "infinity".to_owned();
    }
    if secs == f64::NEG_INFINITY {
        return "-infinity".to_owned();
    }
    // NaN (never from a timestamp) is the epoch.
    let secs = if secs.is_nan() {
        0.0
    } else {
        secs.clamp(0.0, RFC3339_MAX)
    };
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs);
    humantime::format_rfc3339_millis(t).to_string()
}

/// What `status` reads: the key's last `limit` runs, newest first, and the schedule the newest
/// scheduled run was made under (expression and zone), if any.
#[derive(Debug, Default)]
pub struct Recent {
    /// The runs, newest first.
    pub runs: Vec<Run>,
    /// `(schedule, tz)` of the newest run that had one.
    pub schedule: Option<(String, String)>,
}

/// Reads the last `limit` runs of `lock` (every slot) from `table`, newest first.
///
/// # Errors
/// [`Error::Query`] when the table cannot be read (it does not exist, no `SELECT` right);
/// [`Error::Timeout`] after `bound`.
pub async fn recent(
    client: &Client,
    table: &TableName,
    lock: LockKey,
    limit: i64,
    bound: Duration,
) -> Result<Recent, Error> {
    let sql = format!(
        "SELECT host, pid, slot, term, fencing_token, \
                extract(epoch FROM due_at)::pg_catalog.float8, \
                extract(epoch FROM started_at)::pg_catalog.float8, \
                extract(epoch FROM ended_at)::pg_catalog.float8, \
                exit_code, signal, outcome, lost, schedule, tz \
         FROM {} WHERE lock_class OPERATOR(pg_catalog.=) $1 \
           AND lock_id OPERATOR(pg_catalog.=) $2 \
         ORDER BY started_at DESC, id DESC LIMIT $3",
        table.sql()
    );
    let rows = within(
        "history query",
        bound,
        // Typed, so sent as the unnamed statement: `status` may read through a pooler.
        client.query_typed(
            &sql,
            &[
                (&lock.class, tokio_postgres::types::Type::INT4),
                (&lock.id, tokio_postgres::types::Type::INT4),
                (&limit, tokio_postgres::types::Type::INT8),
            ],
        ),
    )
    .await?;
    let mut recent = Recent::default();
    for row in &rows {
        // A table of anyone's making: a column of another type, or a NULL where the README's
        // SQL has NOT NULL, is an error to tell, never a panic.
        let read = || -> Result<(Run, Option<String>, Option<String>), tokio_postgres::Error> {
            let due: Option<f64> = row.try_get(5)?;
            let ended: Option<f64> = row.try_get(7)?;
            let outcome: String = row.try_get(10)?;
            let run = Run {
                host: row.try_get(0)?,
                pid: row.try_get(1)?,
                slot: row.try_get(2)?,
                term: row.try_get(3)?,
                fencing_token: row.try_get(4)?,
                due_at: due.map(rfc3339),
                started_at: rfc3339(row.try_get(6)?),
                ended_at: ended.map(rfc3339),
                exit_code: row.try_get(8)?,
                signal: row.try_get(9)?,
                outcome: Outcome::parse(&outcome),
                lost: row.try_get(11)?,
            };
            Ok((run, row.try_get(12)?, row.try_get(13)?))
        };
        let (run, schedule, tz) = read().map_err(|source| Error::Query {
            what: "history query",
            source,
        })?;
        recent.runs.push(run);
        if recent.schedule.is_none() {
            recent.schedule = schedule.map(|s| (s, tz.unwrap_or_default()));
        }
    }
    Ok(recent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        let t: TableName = "leaderrun_runs".parse().unwrap();
        assert_eq!(t, TableName::default());
        assert_eq!(t.sql(), "\"leaderrun_runs\"");
        let t: TableName = "Ops.Job_Runs".parse().unwrap();
        assert_eq!(t.to_string(), "ops.job_runs");
        assert_eq!(t.sql(), "\"ops\".\"job_runs\"");
        for bad in ["", "a b", "1runs", "a.b.c", "runs;drop", "x\"y", ".runs"] {
            assert!(bad.parse::<TableName>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn create_sql_names_the_table_and_its_index() {
        let t: TableName = "ops.job_runs".parse().unwrap();
        let sql = t.create_sql();
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS \"ops\".\"job_runs\" ("));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"job_runs_key\" ON \"ops\".\"job_runs\""));
        // A 63-byte name: the index's name fits in 63 bytes too, and is not the table's.
        let long = "r".repeat(63);
        let t: TableName = long.parse().unwrap();
        let index = format!(
            "CREATE INDEX IF NOT EXISTS \"{}_key\" ON \"{long}\"",
            &long[..59]
        );
        assert!(t.create_sql().contains(&index), "{}", t.create_sql());
    }

    #[test]
    fn durations_of_finished_runs() {
        let run = Run {
            host: "h".into(),
            pid: 1,
            slot: 0,
            term: 1,
            fencing_token: 7,
            due_at: None,
            started_at: rfc3339(100.0),
            ended_at: Some(rfc3339(102.5)),
            exit_code: Some(0),
            signal: None,
            outcome: Outcome::Ok,
            lost: false,
        };
        assert_eq!(run.duration(), Some(Duration::from_millis(2500)));
        assert_eq!(run.started_at, "1970-01-01T00:01:40.000Z");
        let json = serde_json::to_value(&run).unwrap();
        assert_eq!(json["outcome"], "ok");
        assert_eq!(json["ended_at"], "1970-01-01T00:01:42.500Z");
    }

    #[test]
    fn times_no_rfc3339_can_spell() {
        assert_eq!(rfc3339(f64::INFINITY), "infinity");
        assert_eq!(rfc3339(f64::NEG_INFINITY), "-infinity");
        assert_eq!(rfc3339(f64::NAN), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(-5.0), "1970-01-01T00:00:00.000Z");
        // The year 200000, as `extract(epoch FROM ...)` gives it.
        assert_eq!(rfc3339(6_249_223_334_400.0), "9999-12-31T23:59:59.000Z");
        assert_eq!(rfc3339(RFC3339_MAX), "9999-12-31T23:59:59.000Z");
    }
}
