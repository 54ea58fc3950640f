//! From parsed arguments to checked [`Settings`]: what clap's attributes cannot say (conflicts
//! across sources, the DSN's sources in order, the mode and the log level).

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::args::{Action, Cli};
use crate::pg::lock::{lock_id_for_name, LockKey};
use crate::supervisor::{Mode, Restart};

/// The checked settings of a run.
#[derive(Debug)]
pub struct Settings {
    /// Resolved connection settings.
    pub connect: tokio_postgres::Config,
    /// `sslmode` and certificates.
    pub tls: crate::pg::tls::TlsSettings,
    /// The advisory lock key.
    pub lock: LockKey,
    /// `--slots` (1 … 1024).
    pub slots: u32,
    /// Check interval, grace and the lock session's `idle_session_timeout`: the timing model,
    /// checked.
    pub timing: crate::timing::Timing,
    /// First signal of a stop for demotion, `--timeout` and leftovers.
    pub stop_signal: Signal,
    /// COMMAND and its arguments, as given (`sh -c STRING` for `-c STRING`).
    pub command: Vec<OsString>,
    /// `-c STRING`: COMMAND is [`crate::process::child::SHELL`], not looked up on `PATH`.
    pub shell: bool,
    /// The mode.
    pub mode: Mode,
    /// `--takeover-delay` (zero when not given).
    pub takeover_delay: Duration,
    /// `--timeout`.
    pub timeout: Option<Duration>,
    /// `--cgroup`: run COMMAND in a cgroup of its own even where moving it there is slow.
    pub cgroup: bool,
    /// `--pid-namespace`: run COMMAND under an init of its own PID namespace.
    pub pid_namespace: bool,
    /// `--conflict-exit-code`.
    pub conflict_exit_code: u8,
    /// `--http-addr`.
    pub http_addr: Option<crate::cli::args::HttpAddr>,
    /// Where the database name came from (`default`: none was given; it is the user's name).
    pub database_from: &'static str,
    /// Which setting gave the DSN: `--dsn`, `LEADERRUN_DSN`, `PLEXSPHERE_DSN`, `DATABASE_URL`,
    /// or `PG*` when none did (the `PG*` variables and a service alone).
    pub dsn_from: String,
    /// `--tick-at-grant`.
    pub tick_at_grant: bool,
    /// `--schedule` in its zone.
    pub schedule: Option<crate::supervisor::schedule::Schedule>,
    /// `--history`.
    pub history: bool,
    /// `--history-table` (also what `status` reads).
    pub history_table: crate::history::TableName,
    /// `--history-keep`.
    pub history_keep: Duration,
}

impl Cli {
    /// Checks what clap's attributes cannot say.
    ///
    /// # Errors
    /// A clap error (printed like clap's own) for `--min-hold` without `--once`/`--wait`.
    pub fn validate(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        let run_only = self.once
            || self.wait.is_some()
            || self.every.is_some()
            || self.tick_at_grant
            || self.restart.is_some()
            || self.timeout.is_some()
            || self.min_hold.is_some()
            || self.takeover_delay.is_some()
            || self.grace.is_some()
            || self.http_addr.is_some()
            || self.cgroup
            || self.pid_namespace
            || self.catch_up.is_some()
            || self.history
            || self.history_keep.is_some()
            || self.shell_command.is_some()
            || !self.command.is_empty();
        if self.action.is_some() && run_only {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "status, doctor and step-down take only connection, lock and logging options \
                 (to run a program named status or doctor: leaderrun [OPTIONS] -- status)",
            ));
        }
        // On the values, not in clap: LEADERRUN_ONCE=0 is no --once.
        if self.once {
            let other = [
                (self.wait.is_some(), "--wait <DUR>"),
                (self.every.is_some(), "--every <DUR>"),
                (self.restart.is_some(), "--restart <POLICY>"),
            ];
            if let Some((_, flag)) = other.iter().find(|(given, _)| *given) {
                return Err(Cli::command().error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("the argument '--once' cannot be used with '{flag}'"),
                ));
            }
        }
        if let Err(err) = self.timing().check() {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ValueValidation,
                format!("--check-interval/--grace: {err}"),
            ));
        }
        if self.schedule.is_some() {
            let other = [
                (self.every.is_some(), "--every"),
                (self.once, "--once"),
                (self.wait.is_some(), "--wait"),
                (self.restart.is_some(), "--restart"),
                (self.tick_at_grant, "--tick-at-grant"),
            ];
            if let Some((_, flag)) = other.iter().find(|(given, _)| *given) {
                return Err(Cli::command().error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("--schedule cannot be used with {flag}"),
                ));
            }
        }
        if self.catch_up.is_some() && (self.schedule.is_none() || !self.history) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--catch-up needs --schedule and --history (whether a replica started a due \
                 time is read from the history)",
            ));
        }
        if let Err(err) = self.parsed_schedule() {
            return Err(Cli::command().error(clap::error::ErrorKind::ValueValidation, err));
        }
        if self.tick_at_grant && self.every.is_none() {
            return Err(Cli::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--tick-at-grant only applies with --every",
            ));
        }
        if self.min_hold.is_some() && !self.once && self.wait.is_none() {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--min-hold only applies with --once or --wait",
            ));
        }
        Ok(())
    }

    /// Refuses an option of a run typed without the option it modifies (`--tz` without
    /// `--schedule`, `--history-keep` or `--history-table` without `--history`), which would
    /// otherwise be taken and do nothing: a `--history-table` typed without `--history` records
    /// no run, though whoever typed it expects a history. Set by its variable, such an option is
    /// left alone: one environment may serve several jobs (a compose file's common
    /// `LEADERRUN_TZ`), and `status` reads `LEADERRUN_HISTORY_TABLE`. `typed` says whether an
    /// option (by its id) was given on the command line.
    ///
    /// `status`, `doctor` and `step-down` read `--history-table` alone (`status` shows the
    /// runs) and refuse `--history-keep` as a run's ([`Cli::validate`]), but `--tz` only
    /// applies with `--schedule` there too: `status` reads the zone only for the next due time
    /// of its `--schedule` (a stored schedule is read in the zone it was stored with), so a
    /// `--tz` typed alone, valid or not, would be taken and do nothing.
    ///
    /// # Errors
    /// A clap error (exit 125) that names the option it needs.
    pub(super) fn check_typed_modifiers(
        &self,
        typed: impl Fn(&str) -> bool,
    ) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        let applies = |id: &str| self.action.is_none() || id == "tz";
        let needs = [
            ("tz", "--tz", self.schedule.is_some(), "--schedule"),
            ("history_keep", "--history-keep", self.history, "--history"),
            (
                "history_table",
                "--history-table",
                self.history,
                "--history",
            ),
        ];
        match needs
            .iter()
            .find(|(id, _, given, _)| applies(id) && typed(id) && !given)
        {
            Some((_, flag, _, needed)) => Err(Cli::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                format!("{flag} only applies with {needed}"),
            )),
            None => Ok(()),
        }
    }

    /// A COMMAND that is a near miss of a subcommand (`leaderrun statsu`), not found on
    /// `path`, and not written after `--`, is a typo of the subcommand, not a program to run
    /// (which would exit 127 after a moment): a usage error that names the subcommand. `raw`
    /// is the whole command line, program name first.
    ///
    /// # Errors
    /// A clap error (exit 125) with "did you mean …?".
    pub fn check_mistyped_subcommand(
        &self,
        raw: &[OsString],
        path: Option<&std::ffi::OsStr>,
    ) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        let Some(word) = self.command.first().and_then(|w| w.to_str()) else {
            return Ok(());
        };
        if self.action.is_some() || word.contains('/') {
            return Ok(());
        }
        // After `--` it is COMMAND, whatever it looks like.
        if raw.windows(2).any(|w| w[0] == "--" && w[1] == *word) {
            return Ok(());
        }
        let Some(meant) = super::args::SUBCOMMANDS
            .into_iter()
            .filter(|name| *name != word && strsim::damerau_levenshtein(name, word) <= 2)
            .min_by_key(|name| strsim::damerau_levenshtein(name, word))
        else {
            return Ok(());
        };
        if crate::process::child::Command::resolve(vec![word.into()], path).is_ok() {
            return Ok(());
        }
        Err(Cli::command().error(
            clap::error::ErrorKind::InvalidSubcommand,
            format!(
                "unrecognized subcommand '{word}': did you mean {meant}? (to run a program \
                 named {word}: leaderrun [OPTIONS] -- {word})"
            ),
        ))
    }

    /// The lock key in use: `--lock-class` with `--lock-id`, or the id derived from
    /// `--lock-name` ([`lock_id_for_name`]).
    pub fn lock(&self) -> LockKey {
        LockKey {
            class: self.lock_class,
            id: self
                .lock_name
                .as_deref()
                .map_or(self.lock_id, lock_id_for_name),
        }
    }

    /// The timing model for `--check-interval` and `--grace` (default: one interval).
    pub fn timing(&self) -> crate::timing::Timing {
        crate::timing::Timing::new(
            self.check_interval,
            self.grace.unwrap_or(self.check_interval),
        )
    }

    /// The mode the flags select.
    pub fn mode(&self) -> Mode {
        if let Some(period) = self.every {
            Mode::Every { period }
        } else if self.schedule.is_some() {
            Mode::Schedule {
                catch_up: self.catch_up,
            }
        } else if self.once || self.wait.is_some() {
            Mode::OneShot {
                wait: self.wait,
                min_hold: self.min_hold.unwrap_or(Duration::ZERO),
            }
        } else {
            Mode::WhileLeader {
                restart: self.restart.map_or(Restart::Never, Restart::from),
            }
        }
    }

    /// `--schedule` parsed in its zone (`--tz`, `TZ`, `/etc/localtime`); `None` without it.
    ///
    /// # Errors
    /// The message of an invalid expression or an unknown zone.
    pub fn parsed_schedule(&self) -> Result<Option<crate::supervisor::schedule::Schedule>, String> {
        use crate::supervisor::schedule::{zone, Schedule};
        let Some(expr) = &self.schedule else {
            return Ok(None);
        };
        let tz = zone(self.tz.as_deref()).map_err(|e| e.to_string())?;
        Schedule::parse(expr, tz)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// COMMAND and its arguments: the words after `--`, or `sh -c STRING` for `-c STRING`.
    pub fn command_line(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(script) => vec!["sh".into(), "-c".into(), script.clone()],
            None => self.command.clone(),
        }
    }

    /// [`Cli::settings_with_paths`] from this process's environment: the variables that name
    /// a file or a directory ([`crate::pg::conninfo::PATH_VARIABLES`]: `HOME`, `PGPASSFILE`, …)
    /// as bytes, as libpq reads them, the others as text.
    ///
    /// # Errors
    /// As [`Cli::settings`], and [`ConnInfoError::NotUnicode`] for a variable it reads as text
    /// that is set to bytes that are not UTF-8 (taken as unset, it would connect elsewhere).
    ///
    /// [`ConnInfoError::NotUnicode`]: crate::pg::conninfo::ConnInfoError::NotUnicode
    pub fn settings_from_env(&self) -> Result<Settings, crate::pg::conninfo::ConnInfoError> {
        let not_unicode = std::cell::RefCell::new(None);
        let env = |name: &str| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                not_unicode
                    .borrow_mut()
                    .get_or_insert_with(|| name.to_owned());
                None
            }
        };
        let settings = self.settings_with_paths(&env, &|name| std::env::var_os(name));
        match not_unicode.into_inner() {
            Some(name) => Err(crate::pg::conninfo::ConnInfoError::NotUnicode { name }),
            None => settings,
        }
    }

    /// Checks the options and resolves the connection settings, every variable looked up by
    /// `env` ([`Cli::settings_with_paths`]).
    ///
    /// # Errors
    /// [`crate::pg::conninfo::ConnInfoError`] for a DSN that does not parse.
    pub fn settings(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, crate::pg::conninfo::ConnInfoError> {
        self.settings_with_paths(env, &|name| env(name).map(OsString::from))
    }

    /// Checks the options and resolves the connection settings: `env` looks up a variable as
    /// text, `paths` one that names a file or a directory as bytes
    /// ([`crate::pg::conninfo::resolve_with_paths`]).
    ///
    /// # Errors
    /// [`crate::pg::conninfo::ConnInfoError`] for a DSN that does not parse.
    pub fn settings_with_paths(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        paths: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Settings, crate::pg::conninfo::ConnInfoError> {
        let resolved = crate::pg::conninfo::resolve_with_paths(self.dsn.as_deref(), env, paths)?;
        // `doctor` diagnoses it instead (a finding).
        if resolved.database_from == "default"
            && !matches!(self.action, Some(Action::Doctor { .. }))
        {
            return Err(crate::pg::conninfo::ConnInfoError::NoDatabase);
        }
        if resolved.password_from.as_deref() == Some("--dsn") {
            const SAID: &str = "the password is written into --dsn, so every user of this \
                 machine can read it in ps; pass it in PGPASSWORD or ~/.pgpass (or the whole DSN \
                 in LEADERRUN_DSN) instead";
            // A one-shot at its default level prints nothing when refused and only what is
            // wrong with its run when it ran (cron mails nothing): there it is said at -v.
            if self.once || self.wait.is_some() {
                tracing::info!("{SAID}");
            } else {
                tracing::warn!("{SAID}");
            }
        }
        Ok(Settings {
            database_from: resolved.database_from,
            dsn_from: resolved.dsn_from.unwrap_or_else(|| "PG*".to_owned()),
            tick_at_grant: self.tick_at_grant,
            connect: resolved.config,
            tls: resolved.tls,
            lock: self.lock(),
            slots: self.slots,
            timing: self.timing(),
            stop_signal: self.stop_signal,
            command: self.command_line(),
            shell: self.shell_command.is_some(),
            mode: self.mode(),
            takeover_delay: self.takeover_delay.unwrap_or(Duration::ZERO),
            timeout: self.timeout,
            conflict_exit_code: self.conflict_exit_code,
            http_addr: self.http_addr.clone(),
            cgroup: self.cgroup,
            pid_namespace: self.pid_namespace,
            // Checked by `validate`; an error here cannot happen but is no reason to panic.
            schedule: self.parsed_schedule().ok().flatten(),
            history: self.history,
            history_table: self.history_table.clone().unwrap_or_default(),
            history_keep: self.history_keep.unwrap_or(crate::history::DEFAULT_KEEP),
        })
    }

    /// The tracing level: the default level of the mode, moved one step per -v (more) or -q
    /// (less).
    ///
    /// The default is INFO, except for the one-shot modes (`--once`, `--wait`), whose default
    /// is WARN: a cron job that led prints only what COMMAND prints, plus WARN/ERROR lines when
    /// something is wrong (docs/guarantees.md#modes), and `-v` shows the INFO lines. This is the
    /// one place that decides it.
    pub fn log_level(&self) -> tracing::Level {
        use tracing::Level;
        const LADDER: [Level; 5] = [
            Level::ERROR,
            Level::WARN,
            Level::INFO,
            Level::DEBUG,
            Level::TRACE,
        ];
        let one_shot = self.action.is_none() && matches!(self.mode(), Mode::OneShot { .. });
        let base: i32 = if one_shot { 1 } else { 2 };
        let step = base + i32::from(self.verbose) - i32::from(self.quiet);
        LADDER[step.clamp(0, LADDER.len() as i32 - 1) as usize]
    }
}
