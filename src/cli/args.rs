//! The clap definition of leaderrun's command line ([`Cli`], [`Action`]) and the parsers of its
//! values (durations, signals, addresses). Long because it is the help text: every option's
//! documentation is the `--help`, man page and completion text generated from it.

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use nix::sys::signal::Signal;

use crate::cli::exit_codes::FAILURE as EXIT_FAILURE;
use crate::pg::lock::{DEFAULT_LOCK_CLASS, DEFAULT_LOCK_ID};
use crate::supervisor::Restart;

const ABOUT: &str =
    "Run COMMAND on exactly one machine of many, elected by a PostgreSQL advisory lock";

const LONG_ABOUT: &str = "\
Run COMMAND on exactly one machine of many.

Every copy of leaderrun campaigns for the same PostgreSQL session advisory lock on (CLASS, ID). \
The copy that holds it is the leader and runs COMMAND for as long as it leads; when it loses the \
lock it stops COMMAND (stop signal, then SIGKILL after the grace period) and goes back to standby, \
and COMMAND starts afresh in its next term. When COMMAND exits on its own, leaderrun releases the \
lock and exits with COMMAND's status.

How the lock is taken: --once tries it once with pg_try_advisory_lock(CLASS, ID) and never waits. \
Standbys of the other modes (default, --every, --wait) wait for it in the server's lock queue with \
pg_advisory_lock(CLASS, ID), bounded by lock_timeout = one check interval: when the holder \
releases the lock or its session ends, the server grants it to the first waiter at once; when the \
wait times out, that check counts as refused and the standby queues again. In pg_stat_activity a \
waiting standby is an active session waiting on an advisory Lock; that is by design.";

const AFTER_LONG_HELP: &str = "\
Examples:
  leaderrun --dsn postgres://app@db.internal/plexsphere --lock-name reconcile -- ./reconcile-loop
  LEADERRUN_DSN='host=db user=app dbname=plexsphere' leaderrun --lock-id 7 -- sh -c 'exec worker'
  leaderrun --once --min-hold 5m --lock-name nightly-report -- /usr/local/bin/nightly-report
                                                                   (crontab on every host)
  leaderrun --every 5m --tick-at-grant --timeout 4m --lock-name sweep -- /app/sweep
                                                                   (container entrypoint)
  leaderrun --schedule '30 3 * * 1-5' --tz Europe/Berlin --history --lock-name report -- ./report
                                                                   (a crontab line, on every host)
  leaderrun -n -E 75 --lock-name backup -c 'pg_dump app | gzip > /backup/app.gz'
                                                                   (flock(1) habits)

Without --lock-id or --lock-name the key is the plexsphere background leader lock, the plexsphere \
API's own: give every job of yours a key of its own.

Short forms: -n --once, -w --wait, -E --conflict-exit-code, -c 'STRING' (COMMAND is sh -c STRING), as flock(1); -s --stop-signal, -k --grace, as timeout(1). Durations take a unit (30s, not 30); --takeover-delay and --min-hold, whose default is zero, also take a bare 0.

Advisory locks are per database: copies connected to different databases do not exclude each other. leaderrun refuses to run (exit 125) unless a setting names the database: dbname in the DSN, PGDATABASE, or a service.

The child gets LEADERRUN_TERM, LEADERRUN_LOCK (class:id), LEADERRUN_SLOT, LEADERRUN_FENCING_TOKEN and \
LEADERRUN_BACKEND_PID in its environment. LEADERRUN_TERM counts the terms of one leaderrun process \
(every new leader process says term 1); LEADERRUN_FENCING_TOKEN is the number that grows across \
all replicas (txid_current() at the grant): compare that one, never the term, to reject a stale \
leader's writes.

Logging: INFO by default, WARN with --once/--wait, so a one-shot that led prints only what COMMAND \
prints plus WARN/ERROR lines when something is wrong (cron mails nothing); -v shows the rest. A \
standby says at INFO who holds the lock (host, pid, since when), once and, while it is one of the \
two standbys in line, again when the holder changes.

Exit status: COMMAND's status; 128+N when it died of signal N (143 for a leader stopped by \
SIGTERM: a systemd unit needs SuccessExitStatus=143); the conflict code when \
--once/--wait did not lead or lost leadership mid-run; 0 when stopped by INT/TERM while standby; \
124 when --timeout stopped COMMAND; 125 when leaderrun itself failed (usage, bad DSN, database \
unreachable in --once/--wait); 126 COMMAND not executable; 127 COMMAND not found.

Pass passwords through PGPASSWORD or ~/.pgpass: a password in --dsn is visible in ps.";

/// The forms of the command line, one a line: `--help`'s usage and the man page's SYNOPSIS.
/// A subcommand never follows COMMAND: everything after `--` is COMMAND's.
pub const USAGE: &str = "leaderrun [OPTIONS] -- COMMAND [ARG...]
       leaderrun [OPTIONS] -c STRING
       leaderrun status [--json] [OPTIONS]
       leaderrun doctor [OPTIONS]
       leaderrun step-down [OPTIONS]";

/// `leaderrun [OPTIONS] -- COMMAND [ARG...]`
#[derive(Debug, Parser)]
#[command(
    name = "leaderrun",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    allow_negative_numbers = true,
    subcommand_negates_reqs = true,
    subcommand_value_name = "SUBCOMMAND",
    override_usage = USAGE
)]
pub struct Cli {
    /// PostgreSQL connection string (URL or keyword/value); the lock is per database
    ///
    /// `postgres://user@host:5432/dbname?sslmode=disable` or
    /// `host=db user=app dbname=plexsphere`. When absent, LEADERRUN_DSN, then PLEXSPHERE_DSN,
    /// then DATABASE_URL, then PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGAPPNAME,
    /// PGCONNECT_TIMEOUT and PGSSLMODE are used, with psql's defaults (Unix socket, OS user),
    /// and PGPASSFILE (else ~/.pgpass) and PGSERVICE as psql reads them. Fields the DSN leaves
    /// out are taken from the PG* variables too.
    ///
    /// Advisory locks are per database: copies connected to different databases of one server
    /// do not exclude each other, so every copy must name the same database: leaderrun refuses
    /// to run (exit 125) when no setting names it (dbname in the DSN, PGDATABASE, or a service).
    ///
    /// Example: --dsn 'host=127.0.0.1 user=postgres dbname=plexsphere'
    #[arg(
        long,
        value_name = "DSN",
        env = "LEADERRUN_DSN",
        global = true,
        hide_env_values = true,
        help_heading = "Connection"
    )]
    pub dsn: Option<String>,

    /// First int4 of the advisory lock key
    ///
    /// Default 1886156915 (0x706C7873, ASCII "plxs"), the plexsphere leader lock.
    ///
    /// Example: --lock-class 42
    #[arg(
        long,
        value_name = "INT4",
        env = "LEADERRUN_LOCK_CLASS",
        global = true,
        default_value_t = DEFAULT_LOCK_CLASS,
        allow_negative_numbers = true,
        help_heading = "Lock"
    )]
    pub lock_class: i32,

    /// Second int4 of the advisory lock key
    ///
    /// Copies that share class and id (and database) elect one leader among them. Any int4,
    /// negative ones too, in every form after status and doctor as well.
    ///
    /// Example: --lock-id 7, --lock-id -5
    #[arg(
        long,
        value_name = "INT4",
        env = "LEADERRUN_LOCK_ID",
        global = true,
        default_value_t = DEFAULT_LOCK_ID,
        allow_negative_numbers = true,
        help_heading = "Lock"
    )]
    pub lock_id: i32,

    /// Derive the lock id from NAME instead of giving --lock-id
    ///
    /// The id is the first 4 bytes of SHA-256 of the UTF-8 NAME, read as a big-endian int4 (a
    /// fixed mapping that never changes between builds or servers); the class stays --lock-class.
    /// The id in use is logged and shown in LEADERRUN_LOCK.
    ///
    /// Example: --lock-name nightly-report   (id 1732491792)
    #[arg(
        long,
        value_name = "NAME",
        env = "LEADERRUN_LOCK_NAME",
        global = true,
        value_parser = clap::builder::NonEmptyStringValueParser::new(),
        allow_negative_numbers = true,
        conflicts_with = "lock_id",
        help_heading = "Lock"
    )]
    pub lock_name: Option<String>,

    /// At most N replicas lead at once, each on a slot of its own
    ///
    /// Slot k (0 … N-1) is the key (CLASS + k, ID): slot 0 is the key itself. Each leader gets
    /// LEADERRUN_SLOT; every rule of the single lock holds per slot. All replicas of one lock
    /// must give the same N, and so must status and step-down.
    ///
    /// Example: --slots 3
    #[arg(
        long,
        value_name = "N",
        env = "LEADERRUN_SLOTS",
        global = true,
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=crate::pg::lock::MAX_SLOTS as i64),
        help_heading = "Lock"
    )]
    pub slots: u32,

    /// Standby retry period, leader verification period, and timeout of one verification
    ///
    /// A duration with a unit: 500ms, 5s, 2m.
    ///
    /// Example: --check-interval 1s
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_CHECK_INTERVAL",
        global = true,
        default_value = "5s",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        help_heading = "Timing"
    )]
    pub check_interval: Duration,

    /// Time between the stop signal and SIGKILL [default: the check interval]
    ///
    /// -k as in timeout(1), but with a unit.
    ///
    /// Example: --grace 30s, -k 30s
    #[arg(
        short = 'k',
        long,
        value_name = "DUR",
        env = "LEADERRUN_GRACE",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        help_heading = "Timing"
    )]
    pub grace: Option<Duration>,

    /// First signal sent to COMMAND's process group on demotion, on --timeout, on shutdown, and
    /// to helpers left behind when COMMAND exits
    ///
    /// With the default (TERM), the INT or TERM that starts a shutdown is passed on as it is;
    /// any other stop signal begins the shutdown's stop instead (as a container's STOPSIGNAL
    /// is used by docker stop). SIGKILL
    /// follows after the grace period. A name with or without SIG (TERM, SIGINT, hup) or a
    /// number.
    ///
    /// -s as in timeout(1).
    ///
    /// Example: --stop-signal INT, -s INT
    #[arg(
        short = 's',
        long,
        value_name = "SIG",
        env = "LEADERRUN_STOP_SIGNAL",
        default_value = "TERM",
        value_parser = parse_signal,
        help_heading = "Timing"
    )]
    pub stop_signal: Signal,

    /// A new leader verifies its lock this long before it starts COMMAND [default: 0s]
    ///
    /// Gives a demoted leader elsewhere time to stop its child first. A bare 0 (or 0s) is the
    /// default: none.
    ///
    /// Example: --takeover-delay 10s
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_TAKEOVER_DELAY",
        value_parser = parse_duration_or_zero,
        allow_hyphen_values = true,
        help_heading = "Timing"
    )]
    pub takeover_delay: Option<Duration>,

    /// Longest one run of COMMAND may take; then it is stopped like on demotion
    ///
    /// Exit 124 with --once/--wait and in the default mode (unless --restart restarts it); a
    /// failed tick under --every.
    ///
    /// Example: --timeout 15m
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_TIMEOUT",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        help_heading = "Timing"
    )]
    pub timeout: Option<Duration>,

    /// Run COMMAND in a cgroup v2 group of its own, so that a descendant that left its
    /// process group (setsid) is stopped with the rest
    ///
    /// Needs a cgroup v2 hierarchy where leaderrun may create a group next to its own (root,
    /// or a delegated subtree); without one, COMMAND runs as without the flag. Moving a process
    /// into a cgroup can cost the first start of a term about 10 ms on kernels whose cgroup2
    /// mount lacks favordynmods; where it has them, leaderrun uses a group of its own even
    /// without the flag. Without a group, a descendant that left the process group is stopped
    /// only once it has been re-parented to leaderrun.
    ///
    /// Example: --cgroup -- ./server   (whose workers call setsid)
    #[arg(long, env = "LEADERRUN_CGROUP", help_heading = "Timing")]
    pub cgroup: bool,

    /// Run COMMAND under an init of leaderrun's, PID 1 of a PID namespace of its own, so that
    /// nothing of its tree outlives leaderrun, even killed together with its watchdog
    ///
    /// When that init dies (it dies with leaderrun, by its parent-death signal) the kernel kills
    /// every process of the namespace, descendants that left the process group or the session
    /// included. COMMAND sees itself as pid 2 and its parent as 1 (/proc is not remounted: ps
    /// still shows the machine's pids); its environment, descriptors, signals, terminal and exit
    /// status are as without the flag. Needs CAP_SYS_ADMIN (root, or root of a user namespace);
    /// without it leaderrun exits 125 at start.
    ///
    /// Example: unshare --user --map-root-user leaderrun --pid-namespace -- ./job
    #[arg(
        long,
        env = "LEADERRUN_PID_NAMESPACE",
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = "Timing"
    )]
    pub pid_namespace: bool,

    /// With --once/--wait: keep the lock at least this long after acquiring it [default: 0s]
    ///
    /// Even when COMMAND ends sooner, so a host whose cron fires a little later finds the lock
    /// held and skips instead of running the job twice. A bare 0 (or 0s) is the default: none.
    ///
    /// Example: --once --min-hold 1m
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_MIN_HOLD",
        value_parser = parse_duration_or_zero,
        allow_hyphen_values = true,
        help_heading = "Timing"
    )]
    pub min_hold: Option<Duration>,

    /// One check, then run COMMAND (leading) or exit with the conflict code (not leading)
    ///
    /// Nothing is printed when another host leads, so a cron job on every host mails nothing
    /// from the hosts that skip. A database that cannot be reached exits 125. -n as in flock(1).
    ///
    /// Example: leaderrun --once -- /usr/local/bin/nightly-report, leaderrun -n -c 'make report'
    #[arg(
        short = 'n',
        long,
        env = "LEADERRUN_ONCE",
        // The environment form takes 1/0, true/false, yes/no, on/off; anything else is an error.
        // Its conflicts are checked in `validate`, on the value: LEADERRUN_ONCE=0 is no --once.
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = "Modes"
    )]
    pub once: bool,

    /// Like --once, but campaign for at most DUR before giving up with the conflict code
    ///
    /// Wall-clock time across reconnects; 125 when the database could not be reached at all, or
    /// when no check got an answer about the lock (a hot standby), as --once.
    /// -w as in flock(1), but with a unit.
    ///
    /// Example: --wait 30s, -w 30s
    #[arg(
        short = 'w',
        long,
        value_name = "DUR",
        env = "LEADERRUN_WAIT",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        conflicts_with = "every",
        help_heading = "Modes"
    )]
    pub wait: Option<Duration>,

    /// Ticker: while leading, run COMMAND once per period
    ///
    /// Runs never overlap (a tick that falls due while the last run goes on is skipped and
    /// logged); a non-zero exit is a failed tick (WARN) and ticking goes on, until signalled.
    ///
    /// The period is at least 1ms, the resolution of leaderrun's timers.
    ///
    /// Example: --every 5m
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_EVERY",
        value_parser = parse_period,
        allow_hyphen_values = true,
        help_heading = "Modes"
    )]
    pub every: Option<Duration>,

    /// Cron schedule: while leading, run COMMAND at each due time of EXPR
    ///
    /// Five fields (minute hour day-of-month month day-of-week), six with seconds first, or
    /// @hourly, @daily, @weekly, @monthly, @yearly; read in --tz ZONE, else TZ, else
    /// /etc/localtime, with daylight-saving changes handled as cron does (a fixed time in the
    /// spring-forward gap runs right after it, once; a fixed time in the repeated hour runs
    /// once). Only the leader runs a due time, and it falls to whoever leads at that moment: a
    /// replica that becomes leader later does not run one that passed (see --catch-up), and
    /// with --history it skips a due time of its first 10 minutes that the history shows a
    /// replica whose clock is ahead started already. Runs
    /// never overlap: a due time that comes while the last run goes on is skipped with a WARN;
    /// --timeout bounds each run; a failed run is a WARN and the schedule goes on, until
    /// signalled. status shows the next due time.
    ///
    /// Example: --schedule '30 3 * * *', --schedule '*/10 * * * * *', --schedule @hourly
    #[arg(
        long,
        value_name = "EXPR",
        env = "LEADERRUN_SCHEDULE",
        // Global, for status's next due time: so its conflicts are checked in `validate`.
        global = true,
        help_heading = "Modes"
    )]
    pub schedule: Option<String>,

    /// The time zone --schedule is read in [default: TZ, else /etc/localtime]
    ///
    /// Any form TZ takes: an IANA name (Europe/Berlin, UTC), a POSIX TZ rule
    /// (EST5EDT,M3.2.0,M11.1.0, '<+14>-14'), or the path of a zone file
    /// (/usr/share/zoneinfo/Europe/Berlin, a regular file of at most 1 MiB); each also after a
    /// leading colon. Typed without --schedule it is refused (125), by the subcommands too.
    ///
    /// Example: --tz Europe/Berlin
    #[arg(
        long,
        value_name = "ZONE",
        env = "LEADERRUN_TZ",
        global = true,
        help_heading = "Modes"
    )]
    pub tz: Option<String>,

    /// With --schedule and --history: a new leader whose term begins within DUR after a due
    /// time that no replica started runs it once, at once
    ///
    /// Whether a replica started it is read from the history (its due_at); when the history
    /// cannot be read, the due time is not run. A run that a leader started in the last
    /// milliseconds before it was killed may not have reached the history yet, and runs again.
    ///
    /// Example: --schedule '0 3 * * *' --history --catch-up 1h
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_CATCH_UP",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        help_heading = "Modes"
    )]
    pub catch_up: Option<Duration>,

    /// Record each run of COMMAND (any mode) in a table of the lock's database
    ///
    /// One row per run: lock class, id and slot, host, leaderrun pid, term, fencing token,
    /// due time (with --schedule), start, end, exit code or signal, outcome (ok, failed, lost,
    /// running) and whether the term was lost. leaderrun creates the table if it may (the
    /// README gives the SQL for a DBA). Writes go through a session and a queue of their own:
    /// a slow or failing write never delays a start, a stop or a release and never fails the
    /// job (one WARN per streak of failures). A run whose leader vanished shows as running
    /// until a later leader marks it lost. The leader deletes rows older than --history-keep.
    ///
    /// Example: --every 1h --history
    #[arg(
        long,
        env = "LEADERRUN_HISTORY",
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = "History"
    )]
    pub history: bool,

    /// The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session's
    /// default schema]
    ///
    /// status reads the last runs from it.
    ///
    /// Example: --history-table ops.job_runs
    #[arg(
        long,
        value_name = "NAME",
        env = "LEADERRUN_HISTORY_TABLE",
        global = true,
        value_parser = clap::value_parser!(crate::history::TableName),
        help_heading = "History"
    )]
    pub history_table: Option<crate::history::TableName>,

    /// Rows of the history older than this are deleted by the leader [default: 30d]
    ///
    /// Example: --history-keep 90d
    #[arg(
        long,
        value_name = "DUR",
        env = "LEADERRUN_HISTORY_KEEP",
        value_parser = parse_duration,
        allow_hyphen_values = true,
        help_heading = "History"
    )]
    pub history_keep: Option<Duration>,

    /// With --every: also run COMMAND at once when this copy becomes leader, then on the cadence
    ///
    /// Without it a new leader runs COMMAND at the next tick after its grant (up to one period
    /// later). With it the grant is the term's first run (after --takeover-delay, if any); the
    /// ticker keeps its cadence from start, and a tick that falls due while that run goes on
    /// is skipped, as always (runs never overlap).
    ///
    /// Example: --every 5m --tick-at-grant
    #[arg(
        long,
        env = "LEADERRUN_TICK_AT_GRANT",
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = "Modes"
    )]
    pub tick_at_grant: bool,

    /// Default mode: what to do when COMMAND exits while leading
    ///
    /// never (the default): release the lock and exit with its status. on-failure: restart it
    /// after a non-zero exit, a death by signal or a --timeout. always: restart it after every
    /// exit.
    /// Restarts stay in the same term, after a back-off that starts at 500ms, doubles up to 30s,
    /// and starts over after a run that lasted 10s or more.
    ///
    /// Example: --restart on-failure
    #[arg(
        long,
        value_name = "POLICY",
        env = "LEADERRUN_RESTART",
        value_enum,
        conflicts_with_all = ["wait", "every"],
        help_heading = "Modes"
    )]
    pub restart: Option<RestartPolicy>,

    /// Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)
    ///
    /// -E as in flock(1).
    ///
    /// Example: --conflict-exit-code 75, -E 75
    #[arg(
        short = 'E',
        long,
        value_name = "N",
        env = "LEADERRUN_CONFLICT_EXIT_CODE",
        default_value_t = 0,
        help_heading = "Modes"
    )]
    pub conflict_exit_code: u8,

    /// Log more: one level per -v (INFO → DEBUG → TRACE)
    ///
    /// The default level is INFO, and WARN with --once/--wait, so that a one-shot that led
    /// prints only what COMMAND prints plus WARN/ERROR lines when something is wrong (cron mails
    /// nothing on a good night); -v shows the INFO lines there. RUST_LOG decides when neither
    /// -v nor -q is given.
    ///
    /// Example: -v, -vv, --once -v
    #[arg(
        short,
        long,
        action = clap::ArgAction::Count,
        conflicts_with = "quiet",
        global = true,
        help_heading = "Logging"
    )]
    pub verbose: u8,

    /// Log less: one level per -q (INFO → WARN → ERROR)
    ///
    /// -q shows warnings and errors only, -qq errors only (with --once/--wait, whose default is
    /// already WARN, -q shows errors only).
    ///
    /// Example: -q, -qq
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = "Logging")]
    pub quiet: u8,

    /// Log line format on stderr: text, or json (one object per line with timestamp, level,
    /// message and fields)
    ///
    /// Example: --log-format json
    #[arg(
        long,
        value_name = "FORMAT",
        env = "LEADERRUN_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        global = true,
        help_heading = "Logging"
    )]
    pub log_format: LogFormat,

    /// Serve /metrics, /healthz and /readyz on this address (off by default)
    ///
    /// HOST:PORT (the first address HOST resolves to) or IP:PORT (an IPv6 address in
    /// brackets); the IPv6 any-address :: listens on IPv6 and IPv4 alike. :PORT means every
    /// interface, IPv6 and IPv4 (the any-address ::, or 0.0.0.0 on a machine without IPv6):
    /// whoever can reach the machine can read the metrics and probes; give 127.0.0.1:PORT or
    /// the pod's address to keep it local.
    ///
    /// Clients cannot hold the port up: at most 128 connections at once (a new one closes the
    /// oldest), 2 s for a request's head, 5 s and 100 requests per connection, request bodies
    /// never read.
    ///
    /// /healthz is a liveness probe: 200 while leaderrun's check loop runs (within 3 check
    /// intervals, and the grace while a demoted leader stops COMMAND; a check that tries host
    /// after host counts each one), also while the database is down for many intervals, since
    /// restarting leaderrun would not bring the database back. To alert on an unreachable database, use
    /// the gauge leaderrun_seconds_since_last_successful_check, e.g. a Prometheus rule with
    /// expr: leaderrun_seconds_since_last_successful_check > 60.
    ///
    /// /readyz is 503 with the error until a check has reached the server and while checks
    /// fail to reach it (wrong password, missing database, nothing listening), so a bad
    /// secret never turns a replica Ready.
    ///
    /// Example: --http-addr 0.0.0.0:9464
    #[arg(
        long,
        value_name = "ADDR",
        env = "LEADERRUN_HTTP_ADDR",
        value_parser = parse_http_addr,
        help_heading = "Observing"
    )]
    pub http_addr: Option<HttpAddr>,

    /// Who leads right now, or whether the lock works through these settings
    #[command(subcommand)]
    pub action: Option<Action>,

    /// Run `sh -c STRING` as COMMAND (instead of COMMAND after --)
    ///
    /// As flock(1) -c: for a shell command line in a crontab. The shell is /bin/sh, as
    /// system(3) runs it, whatever PATH holds. The shell's whole tree is stopped on demotion
    /// like any COMMAND's.
    ///
    /// Example: leaderrun -n -c 'pg_dump app | gzip > /backup/app.gz'
    #[arg(
        short = 'c',
        value_name = "STRING",
        // The word after -c is the script, whatever it starts with (getopt, flock).
        allow_hyphen_values = true,
        conflicts_with = "command",
        help_heading = "Modes"
    )]
    pub shell_command: Option<OsString>,

    /// The command to run while this copy leads, and its arguments (no shell)
    #[arg(
        value_name = "COMMAND",
        required_unless_present = "shell_command",
        num_args = 1..,
        trailing_var_arg = true
    )]
    pub command: Vec<OsString>,
}

/// `leaderrun status` and `leaderrun doctor`.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Who leads right now: the leader's host, pid and backend, since when, and the standbys
    ///
    /// Runs the pg_locks query for the lock key joined to pg_stat_activity: the leader's host and
    /// leaderrun pid (from its application_name, leaderrun@HOST:PID) beside its backend pid,
    /// client address, since when it leads, its term and its fencing token (which grows across
    /// all replicas), and each waiting standby with its host, pid and backend pid. A holder
    /// that is not leaderrun (a psql session, the plexsphere API's own Elector) is the leader
    /// too, shown as "not leaderrun: application_name=...". With track_activities off for the
    /// leader's session, the server shows none of its statements: the term, since and fencing
    /// token are unknown, and it says so ("activity  not tracked"). Exit 0 when a leader holds the lock,
    /// 1 when none does, 125 on error. When the history table exists (--history-table), the
    /// key's last runs follow (host, start, duration, exit), and the next due time of
    /// --schedule (else of the schedule the newest run was made under).
    ///
    /// Example: leaderrun status --json --lock-id 7
    Status {
        /// Print one JSON object (stable field names, listed in the README) instead of a table
        ///
        /// lock, lock_class, lock_id, database, server, in_recovery, slots; leader: null, or
        /// (pid, leaderrun, activity_tracked, host, leaderrun_pid, application_name, client_addr,
        /// client_port, backend_start, term, since, leading_seconds, fencing_token, slot, lock);
        /// slot_leaders: every slot, in order (slot, lock, leader); waiters: backend pids;
        /// standbys (backend_pid, queued, place, slot, other_slot, leaderrun, host,
        /// leaderrun_pid, application_name, client_addr, waiting_since); untracked_sessions: a
        /// count;
        /// more_slots_held: slot numbers; runs: from the history table, newest first (host, pid,
        /// slot, term, fencing_token, due_at, started_at, ended_at, exit_code, signal, outcome,
        /// lost); schedule, tz, next_due_at.
        ///
        /// Example: leaderrun status --json | jq -r .leader.host
        #[arg(long)]
        json: bool,
    },
    /// Prove that the lock excludes through these connection settings
    ///
    /// Opens two sessions and checks that the second cannot take a lock the first holds (on a
    /// scratch id of the same class, so a running leader is not disturbed), that the server is
    /// not in recovery, that the role may read pg_locks (the leader's check reads it), that a
    /// grant's fencing token can be taken and flushed to the WAL (the
    /// role may run pg_logical_emit_message; a synchronous standby the commit waits for
    /// streams), that a session keeps its backend (no
    /// transaction-mode pooler), whether it reaches the server directly (a proxy or pooler
    /// between is a warning), that
    /// the server's major is supported (14 to 18) and idle_session_timeout can be set (a
    /// warning each on PostgreSQL 13, which runs with a weaker bound), and shows the database the
    /// lock lives in, TLS and who holds the real key. When no setting names the database (no
    /// dbname, PGDATABASE or service), the checks run in the database named after the user
    /// (psql's default) and the database finding fails (FAIL, exit 1), since leaderrun refuses to
    /// run with such settings. Exit 0 when all hold
    /// (warnings included), 1 when one fails, 125 when it cannot connect.
    ///
    /// The scratch key is CLASS:ID with an id derived from this process unless --scratch-id
    /// names one; doctor says which it took. On a server where ids are allotted, pick one that
    /// is yours and free.
    ///
    /// Example: leaderrun doctor --dsn postgres://app@pgbouncer.internal:6432/plexsphere
    Doctor {
        /// The id (int4) of the scratch key doctor takes and releases, in the lock's class
        /// (default: one derived from doctor's pid)
        ///
        /// Example: --scratch-id 8001
        #[arg(long, value_name = "ID", allow_negative_numbers = true)]
        scratch_id: Option<i32>,
    },
    /// Ask the current leader to hand over (a planned switchover, e.g. to drain a host)
    ///
    /// Takes the step-down request: a bigint advisory lock ((CLASS XOR 0x20000000) << 32 | ID,
    /// objsubid 1 in pg_locks; never the leader lock, nor the bigint CLASS << 32 | ID that
    /// applications may lock in their transactions). The leader sees it at its next check, stops its child (stop signal, grace),
    /// releases the lock and stays out of the campaign for one check interval, so a waiting
    /// standby takes over within milliseconds. Exit 0 when another replica leads afterwards,
    /// 1 when none took over within a minute (or none leads, or the holder is not leaderrun,
    /// which cannot be asked, or no standby is there to take over, and the leader is not
    /// asked), 125 on error. Only a live standby counts: a queued wait whose process has
    /// exited is dropped by the server within 250 ms (PostgreSQL 14 and later), and step-down
    /// looks twice.
    ///
    /// Example: leaderrun step-down --lock-id 7
    StepDown {
        /// With --slots N: the slot whose leader is asked (0 … N-1)
        ///
        /// Example: --slots 3 --slot 1
        #[arg(long, value_name = "K", default_value_t = 0)]
        slot: u32,
    },
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `--restart`'s values, as clap knows them; [`Restart`] is the supervisor's own. The doc
/// comments are the help text of each value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartPolicy {
    /// Release the lock and exit with COMMAND's status.
    Never,
    /// Restart after a non-zero exit, a death by signal or a timeout.
    OnFailure,
    /// Restart after every exit.
    Always,
}

impl From<RestartPolicy> for Restart {
    fn from(policy: RestartPolicy) -> Restart {
        match policy {
            RestartPolicy::Never => Restart::Never,
            RestartPolicy::OnFailure => Restart::OnFailure,
            RestartPolicy::Always => Restart::Always,
        }
    }
}

/// The command-line definition as `--help` shows it: [`Cli`]'s, with the values of the
/// environment variables hidden, so that `-h` shows `[env: LEADERRUN_LOCK_CLASS]`, not a
/// dangling `[env: LEADERRUN_LOCK_CLASS=]` (or a value from the environment, maybe a secret).
pub fn command() -> clap::Command {
    command_for(true)
}

/// The subcommands' names, as [`Action`] spells them.
pub(super) const SUBCOMMANDS: [&str; 3] = ["status", "doctor", "step-down"];

/// [`command`], with the options that every subcommand takes too (`global`) copied into the
/// subcommands only when `subcommands`: clap copies each of them, help texts and all, into
/// each subcommand as it builds the command, which took a one-shot 0.13 ms, a tenth of what
/// leaderrun adds to the job (BENCHMARKS.md). A command line that names no subcommand needs no
/// copy: the options are the top level's either way.
fn command_for(subcommands: bool) -> clap::Command {
    use clap::CommandFactory;
    Cli::command().mut_args(|arg| {
        let arg = arg.hide_env_values(true);
        // An empty variable is no setting, as for the DSN (`LEADERRUN_SCHEDULE=${S:-}` in a
        // compose file or a script must not conflict with `--once`, nor fail a duration's
        // parse): clap would take the empty value, so the option forgets its variable.
        let empty = arg
            .get_env()
            .and_then(std::env::var_os)
            .is_some_and(|value| value.is_empty());
        let arg = if empty { arg.env(None) } else { arg };
        if subcommands {
            arg
        } else {
            arg.global(false)
        }
    })
}

/// Options that exclude each other on their values, which [`Cli::validate`] checks (a
/// `LEADERRUN_ONCE=0` is no `--once`, so clap cannot): each with the options it excludes.
/// Clap's own exclusions (`conflicts_with`) are read from the command.
const VALUE_CONFLICTS: [(&str, &[&str]); 2] = [
    ("once", &["wait", "every", "restart"]),
    (
        "schedule",
        &["every", "once", "wait", "restart", "tick_at_grant"],
    ),
];

/// The options set by their variable (`LEADERRUN_ONCE=1`) that exclude an option typed on
/// the command line (`--wait 30s`): the flag wins, as it does over its own variable, so their
/// variables are set aside rather than refused as a conflict the user never typed. Two
/// variables that exclude each other are still refused. Costs a second parse only when an
/// option's variable is set.
fn overridden_by_flags(command: &clap::Command, raw: &[OsString]) -> Vec<clap::Id> {
    use clap::parser::ValueSource;
    let from_env: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|arg| arg.get_env().and_then(std::env::var_os).is_some())
        .collect();
    if from_env.is_empty() {
        return Vec::new();
    }
    // What was typed: the same command line, no variable read. A command line that fails
    // here fails the real parse too, which says why.
    let Ok(typed) = command
        .clone()
        .mut_args(|arg| arg.env(None))
        .try_get_matches_from(raw)
    else {
        return Vec::new();
    };
    let on_command_line = |id: &str| {
        matches!(
            typed.try_get_raw(id).map(|_| typed.value_source(id)),
            Ok(Some(ValueSource::CommandLine))
        )
    };
    let excludes = |a: &str, b: &str| {
        VALUE_CONFLICTS.iter().any(|(one, others)| {
            (*one == a && others.contains(&b)) || (*one == b && others.contains(&a))
        })
    };
    // Clap keeps an exclusion on the option that declares it: asked both ways.
    let clap_excludes = |a: &clap::Arg, b: &clap::Arg| {
        let names = |x: &clap::Arg, y: &clap::Arg| {
            command
                .get_arg_conflicts_with(x)
                .iter()
                .any(|c| c.get_id() == y.get_id())
        };
        names(a, b) || names(b, a)
    };
    from_env
        .into_iter()
        .filter(|arg| {
            let id = arg.get_id().as_str();
            !on_command_line(id)
                && command.get_arguments().any(|other| {
                    on_command_line(other.get_id().as_str())
                        && (excludes(id, other.get_id().as_str()) || clap_excludes(arg, other))
                })
        })
        .map(|arg| arg.get_id().clone())
        .collect()
}

/// Parses `raw` (the program's name first) into a checked [`Cli`]: clap's parse, then
/// [`Cli::validate`] and the mistyped-subcommand check. Options are copied into the
/// subcommands (`command_for`) when any word of `raw` is a subcommand's name (as an option's
/// value or COMMAND's too: a copy too many costs only time). A subcommand reads none of a
/// run's variables (`--once`, `--every`, `--history`, …: `RUN_ENVIRONMENT`).
///
/// # Errors
/// clap's error, ready to print: a usage error, or the help or version asked for.
pub fn parse_from(raw: &[OsString]) -> Result<Cli, clap::Error> {
    let subcommands = raw
        .iter()
        .skip(1)
        .any(|word| SUBCOMMANDS.iter().any(|name| word == name));
    let command = command_for(subcommands);
    if subcommands {
        // `status`, `doctor` and `step-down` typed into the environment of a job configured by
        // its variables (`docker exec`, `kubectl exec`, a unit's `Environment=`): the run's
        // settings there mean nothing to them and are not read at all, so that not even a
        // value the run would refuse fails them. Typed on their command line, a run's option
        // is still refused ([`Cli::validate`]). A subcommand's name that is COMMAND's word
        // (`leaderrun -- status`) parses again below, with every variable.
        let aside = command.clone().mut_args(|arg| {
            if RUN_ENVIRONMENT.contains(&arg.get_id().as_str()) {
                arg.env(None)
            } else {
                arg
            }
        });
        match parse_with(aside, raw) {
            Ok(cli) if cli.action.is_some() => return Ok(cli),
            Err(err)
                if matches!(
                    err.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) =>
            {
                return Err(err)
            }
            _ => {}
        }
    }
    parse_with(command, raw)
}

/// The options of a run that `status`, `doctor` and `step-down` do not read from the
/// environment ([`parse_from`]).
pub(super) const RUN_ENVIRONMENT: [&str; 15] = [
    "once",
    "wait",
    "every",
    "tick_at_grant",
    "restart",
    "timeout",
    "min_hold",
    "takeover_delay",
    "grace",
    "http_addr",
    "cgroup",
    "pid_namespace",
    "catch_up",
    "history",
    "history_keep",
];

/// [`parse_from`]'s parse with `command`: the flags typed win over the variables of options
/// they exclude ([`overridden_by_flags`]), then clap's parse, [`Cli::validate`] and the
/// mistyped-subcommand check.
fn parse_with(command: clap::Command, raw: &[OsString]) -> Result<Cli, clap::Error> {
    let overridden = overridden_by_flags(&command, raw);
    let command = if overridden.is_empty() {
        command
    } else {
        command.mut_args(|arg| {
            if overridden.contains(arg.get_id()) {
                arg.env(None)
            } else {
                arg
            }
        })
    };
    command
        .try_get_matches_from(raw)
        .map_err(|err| match err.kind() {
            clap::error::ErrorKind::InvalidUtf8 => not_utf8(raw).unwrap_or(err),
            _ => err,
        })
        .and_then(|matches| {
            let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
            cli.check_typed_modifiers(|id| {
                matches!(
                    matches.try_get_raw(id).map(|_| matches.value_source(id)),
                    Ok(Some(clap::parser::ValueSource::CommandLine))
                )
            })?;
            Ok(cli)
        })
        .and_then(|cli| {
            cli.validate()?;
            cli.check_mistyped_subcommand(raw, std::env::var_os("PATH").as_deref())?;
            Ok(cli)
        })
}

/// clap's "invalid UTF-8 was detected in one or more arguments" names neither the option nor
/// where its value came from: the same error, naming the option whose value is not UTF-8
/// text, typed (`--tz=<bytes>`, `--tz <bytes>`, `-s<bytes>`) or set by its variable (a note
/// then names the variable, as for any usage error over one). The value itself is not
/// shown: it may be a DSN that holds a password. `None` when no such option is found.
fn not_utf8(raw: &[OsString]) -> Option<clap::Error> {
    let mut command = command_for(true);
    // The subcommands' own options (`--scratch-id`, `--slot`) too.
    let args: Vec<clap::Arg> = command
        .get_arguments()
        .chain(
            command
                .get_subcommands()
                .flat_map(clap::Command::get_arguments),
        )
        .cloned()
        .collect();
    let long = |name: &[u8]| {
        args.iter()
            .find(|arg| arg.get_long().is_some_and(|l| l.as_bytes() == name))
    };
    // In a cluster (`-ns VALUE`, `-nsVALUE`) the first option that takes a value takes the
    // rest: its flags before it are options of their own.
    let short = |cluster: &[u8]| {
        for c in cluster {
            let arg = args
                .iter()
                .find(|arg| arg.get_short() == Some(*c as char))?;
            if arg.get_action().takes_values() {
                return Some(arg);
            }
        }
        None
    };
    // COMMAND's words and -c's script are not UTF-8 text by right.
    let words: Vec<&[u8]> = option_words(raw).collect();
    let mut found = None;
    for (at, word) in words.iter().enumerate() {
        if std::str::from_utf8(word).is_ok() {
            continue;
        }
        found = if let Some(rest) = word.strip_prefix(b"--") {
            long(rest.split(|b| *b == b'=').next().unwrap_or_default())
        } else if let Some(cluster) = word.strip_prefix(b"-") {
            short(cluster)
        } else {
            at.checked_sub(1)
                .map(|before| words[before])
                .and_then(|before| match before {
                    [b'-', b'-', name @ ..] => long(name),
                    [b'-', cluster @ ..] => short(cluster),
                    _ => None,
                })
        };
        // -c's script is bytes as given.
        found = found
            .filter(|arg| arg.get_value_parser().type_id() != std::any::TypeId::of::<OsString>());
        if found.is_some() {
            break;
        }
    }
    let found = found.or_else(|| {
        // A variable whose option was typed is not read.
        args.iter().filter(|arg| !typed(arg, &words)).find(|arg| {
            arg.get_env()
                .and_then(std::env::var_os)
                .is_some_and(|value| !value.is_empty() && value.to_str().is_none())
        })
    })?;
    let name = match (found.get_long(), found.get_short()) {
        (Some(long), _) => format!("--{long}"),
        (None, Some(short)) => format!("-{short}"),
        (None, None) => return None,
    };
    let value = found
        .get_value_names()
        .and_then(|names| names.first())
        .filter(|_| found.get_action().takes_values())
        .map(|v| format!(" <{v}>"))
        .unwrap_or_default();
    Some(command.error(
        clap::error::ErrorKind::InvalidUtf8,
        format!("invalid value for '{name}{value}': not UTF-8 text"),
    ))
}

/// Parses the process arguments ([`parse_from`]). `Err` carries the exit status once help or
/// the version was printed (0) or the usage error was (125, docs/guarantees.md#exit-codes): the
/// caller exits with it, after ending what it started (the run mode's watchdog is forked before
/// the parse).
pub fn parse() -> Result<Cli, u8> {
    let raw: Vec<OsString> = std::env::args_os().collect();
    parse_from(&raw).map_err(|err| {
        use std::io::IsTerminal;
        // Rendered here and written by leaderrun's one way to its output (clap's own `print`
        // goes through std's stdout, which fails on a stdout left non-blocking and full),
        // coloured as the log is: on a terminal, unless NO_COLOR or TERM=dumb says otherwise.
        let to_stderr = err.use_stderr();
        let terminal = if to_stderr {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        let styled = err.render();
        let text = if super::logging::colours_here(terminal) {
            styled.ansi().to_string()
        } else {
            styled.to_string()
        };
        // (A usage error's message goes to stderr: when that fails nothing can be said.)
        if to_stderr {
            let mut text = text;
            for note in environment_notes(&err.to_string(), &raw) {
                text.push_str(&format!("note: {note}\n"));
            }
            let _ = super::output::stderr(&text);
            return EXIT_FAILURE;
        }
        // `--help` and `--version` exit 0 only when their text was written (or its reader
        // went away, `| head`): a full disk or a broken terminal is a failure.
        match super::output::stdout(&text) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                let _ = super::output::stderr(&format!("leaderrun: cannot write to stdout: {e}\n"));
                EXIT_FAILURE
            }
            _ => 0,
        }
    })
}

/// The words of `raw` that may be options: after the program's name, before `--` (COMMAND's
/// words are not options).
fn option_words(raw: &[OsString]) -> impl Iterator<Item = &[u8]> {
    use std::os::unix::ffi::OsStrExt;
    raw.iter()
        .skip(1)
        .map(|word| word.as_bytes())
        .take_while(|word| *word != b"--")
}

/// Whether `arg` was typed among `words` ([`option_words`]): `--long`, `--long=VALUE`, or its
/// short form alone or in a cluster (`-n`, `-vn`). Then its variable is not read.
fn typed(arg: &clap::Arg, words: &[&[u8]]) -> bool {
    words.iter().any(|word| {
        let long = arg.get_long().is_some_and(|long| {
            word.strip_prefix(b"--")
                .is_some_and(|rest| rest.split(|b| *b == b'=').next() == Some(long.as_bytes()))
        });
        let short = arg.get_short().is_some_and(|short| {
            word.len() > 1 && word[0] == b'-' && word[1] != b'-' && word.contains(&(short as u8))
        });
        long || short
    })
}

/// For a usage error whose text names an option that was not typed but set by its variable
/// (`LEADERRUN_CHECK_INTERVAL=5` in a unit's environment): one note per such option naming the
/// variable, since the error names only the flag, which the user never typed.
fn environment_notes(error: &str, raw: &[OsString]) -> Vec<String> {
    let words: Vec<&[u8]> = option_words(raw).collect();
    command_for(false)
        .get_arguments()
        .filter_map(|arg| {
            let long = format!("--{}", arg.get_long()?);
            let var = arg.get_env()?.to_str()?.to_owned();
            std::env::var_os(&var).filter(|value| !value.is_empty())?;
            let was_typed = typed(arg, &words);
            // The flag as a whole word of the message: `--wait` is not in `--wait-for`.
            let named = error.match_indices(&long).any(|(at, _)| {
                !error[at + long.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '-')
            });
            (named && !was_typed).then(|| {
                format!("{long} was set by {var} in the environment, not on the command line")
            })
        })
        .collect()
}

/// The longest duration any option takes: one year, in every spelling of it. humantime reads
/// `1y` as 365.25 days and a month as 30.44 days, so the bound is twelve of its months (365.28
/// days): `365d`, `1y`, `1year` and `12months` are all taken, not refused as more than a year.
pub const MAX_DURATION: Duration = Duration::from_secs(12 * 2_630_016);

/// Parses a positive duration with a unit (`500ms`, `5s`, `2m`); zero, negative, unit-less and
/// longer-than-a-year values are refused (docs/guarantees.md#timing-settings).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if let Some(rest) = trimmed.strip_prefix('-') {
        // Durations take hyphen values (to say "negative" of `-1s`), so an option typed where
        // the value was left out (`--timeout --once`, `--wait --`) arrives here as the value.
        if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return Err("must not be negative".into());
        }
        return Err(format!(
            "the duration is missing: {trimmed:?} is an option, not a duration such as 30s"
        ));
    }
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // A zero would be refused with its unit too: say that, not how to add one.
        if trimmed == "0" {
            return Err("must be greater than zero".into());
        }
        return Err(format!("needs a unit, e.g. {trimmed}s or {trimmed}ms"));
    }
    let duration = humantime::parse_duration(trimmed).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    if duration > MAX_DURATION {
        return Err("must be at most a year".into());
    }
    Ok(duration)
}

/// Parses `--every`'s period: a [`parse_duration`] of at least 1 ms. leaderrun's timers
/// tick in whole milliseconds, so a shorter period would fall due again at every wake-up:
/// a loop that never sleeps.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    let period = parse_duration(text)?;
    if period < Duration::from_millis(1) {
        return Err("must be at least 1ms (the resolution of leaderrun's timers)".into());
    }
    Ok(period)
}

/// `--http-addr` as given: an address, or a host name to look up before the port is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpAddr {
    /// `IP:PORT`, or `:PORT` as `[::]:PORT` (every interface).
    Addr(std::net::SocketAddr),
    /// `HOST:PORT`: looked up by [`HttpAddr::resolve`], not while the command line is parsed
    /// (with every signal blocked, a resolver that does not answer held a stop request for as
    /// long as it took to give up).
    Name(String, u16),
}

impl HttpAddr {
    /// The address to bind: the first one a name resolves to.
    ///
    /// # Errors
    /// The lookup's error, or `NotFound` when the name resolves to no address.
    pub fn resolve(&self) -> std::io::Result<std::net::SocketAddr> {
        use std::net::ToSocketAddrs;
        match self {
            HttpAddr::Addr(addr) => Ok(*addr),
            HttpAddr::Name(host, port) => (host.as_str(), *port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{host:?} resolves to no address"),
                    )
                }),
        }
    }
}

impl std::fmt::Display for HttpAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpAddr::Addr(addr) => addr.fmt(f),
            HttpAddr::Name(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

/// Parses `--http-addr`: `IP:PORT`, `HOST:PORT` (the first address the name resolves to,
/// looked up later: [`HttpAddr::resolve`]) or `:PORT` (every interface: `[::]:PORT`, which the
/// server binds for IPv6 and IPv4 alike, or `0.0.0.0:PORT` where the machine has no IPv6; see
/// `http::serve`).
pub fn parse_http_addr(text: &str) -> Result<HttpAddr, String> {
    let text = text.trim();
    let expected = "expected HOST:PORT, IP:PORT or :PORT";
    let full = match text.strip_prefix(':') {
        Some(port) => format!("[::]:{port}"),
        None => text.to_owned(),
    };
    if let Ok(addr) = full.parse::<std::net::SocketAddr>() {
        return Ok(HttpAddr::Addr(addr));
    }
    let (host, port) = full
        .rsplit_once(':')
        .ok_or_else(|| format!("no port; {expected}"))?;
    let port = port
        .parse::<u16>()
        .map_err(|e| format!("port {port:?}: {e}; {expected}"))?;
    if host.is_empty() || host.contains([':', '[', ']', '/']) || host.contains(char::is_whitespace)
    {
        return Err(format!("{text:?} is no address; {expected}"));
    }
    Ok(HttpAddr::Name(host.to_owned(), port))
}

/// Like [`parse_duration`], but zero is allowed, with or without a unit (`--takeover-delay 0`,
/// `--min-hold 0s`: their defaults). Other unit-less values are still refused.
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    match parse_duration(text) {
        Err(e) if e.contains("zero") => Ok(Duration::ZERO),
        other => other,
    }
}

/// Parses a stop signal given as `TERM`, `SIGTERM`, `term` or a number. Signals that cannot
/// end a process (job-control stops, SIGCONT, and those ignored by default: CHLD, URG, WINCH)
/// are refused, since the first step of every stop would then do nothing. SIGKILL is accepted.
pub fn parse_signal(text: &str) -> Result<Signal, String> {
    let trimmed = text.trim();
    let signal = if let Ok(number) = trimmed.parse::<i32>() {
        Signal::try_from(number).map_err(|_| format!("no signal number {number}"))?
    } else {
        let upper = trimmed.to_ascii_uppercase();
        let name = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        name.parse::<Signal>()
            .map_err(|_| format!("unknown signal {trimmed:?}"))?
    };
    use Signal::*;
    if matches!(
        signal,
        SIGSTOP | SIGTSTP | SIGTTIN | SIGTTOU | SIGCONT | SIGCHLD | SIGURG | SIGWINCH
    ) {
        return Err(format!(
            "{} does not end a process; use TERM, INT, HUP, QUIT, USR1, USR2 or KILL",
            signal.as_str()
        ));
    }
    Ok(signal)
}
