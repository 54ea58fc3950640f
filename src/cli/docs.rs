//! Generated documents: the man page and shell completions, both from the clap definition.
//!
//! [`render`] produces `man/leaderrun.1` and the files in `completions/` ([`FILES`]). The
//! committed copies are checked by a test that fails when they drift from the CLI and names the
//! command that regenerates them: `LEADERRUN_REGENERATE=1 cargo test --test tests generated_docs`.
//! (No hidden flag: clap_complete would list it in the completions.)

use clap::CommandFactory;
use roff::{bold, italic, roman, Roff};

use crate::cli::Cli;

/// One generated document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generate {
    /// The man page, roff.
    Man,
    /// bash completion.
    CompleteBash,
    /// zsh completion.
    CompleteZsh,
    /// fish completion.
    CompleteFish,
    /// elvish completion.
    CompleteElvish,
    /// PowerShell completion.
    CompletePowershell,
}

/// Every generated document and where its committed copy lives, relative to the repository.
pub const FILES: [(Generate, &str); 6] = [
    (Generate::Man, "man/leaderrun.1"),
    (Generate::CompleteBash, "completions/leaderrun.bash"),
    (Generate::CompleteZsh, "completions/_leaderrun"),
    (Generate::CompleteFish, "completions/leaderrun.fish"),
    (Generate::CompleteElvish, "completions/leaderrun.elv"),
    (Generate::CompletePowershell, "completions/_leaderrun.ps1"),
];

/// Renders one document.
pub fn render(what: Generate) -> Vec<u8> {
    use clap_complete::Shell;
    let shell = match what {
        Generate::Man => return man_page(),
        Generate::CompleteBash => Shell::Bash,
        Generate::CompleteZsh => Shell::Zsh,
        Generate::CompleteFish => Shell::Fish,
        Generate::CompleteElvish => Shell::Elvish,
        Generate::CompletePowershell => Shell::PowerShell,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "leaderrun", &mut out);
    out
}

fn section(roff: &mut Roff, title: &str) {
    roff.control("SH", [title]);
}

fn paragraph(roff: &mut Roff, text: &str) {
    roff.control("PP", []).text([roman(text)]);
}

fn item(roff: &mut Roff, tag: &str, text: &str) {
    roff.control("TP", []).text([bold(tag)]).text([roman(text)]);
}

/// The man page: clap_mangen's sections plus EXIT STATUS, ENVIRONMENT, SIGNALS and EXAMPLES,
/// which follow docs/guarantees.md. The ENVIRONMENT list of options is read off the clap
/// definition.
pub fn man_page() -> Vec<u8> {
    let command = Cli::command();
    let man = clap_mangen::Man::new(command.clone()).date("");
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = man.render_title(&mut out);
    let _ = man.render_name_section(&mut out);
    // Our own SYNOPSIS: clap_mangen's lists every flag and puts the subcommand after
    // COMMAND, where it would be one of COMMAND's arguments.
    let mut synopsis = Roff::new();
    section(&mut synopsis, "SYNOPSIS");
    for (n, line) in crate::cli::USAGE.lines().enumerate() {
        let line = line.trim();
        let rest = line.strip_prefix("leaderrun").unwrap_or(line);
        if n > 0 {
            synopsis.control("br", []);
        }
        synopsis.text([bold("leaderrun"), roman(rest)]);
    }
    out.extend_from_slice(synopsis.render().as_bytes());
    let _ = man.render_description_section(&mut out);
    let _ = man.render_options_section(&mut out);

    let mut roff = Roff::new();
    // Our own SUBCOMMANDS section: clap_mangen's points to leaderrun-status(1) pages that are
    // not generated.
    section(&mut roff, "SUBCOMMANDS");
    for sub in command.get_subcommands() {
        let name = sub.get_name();
        // Each option as its usage shows it: a valued one with its VALUE (`[--slot K]`),
        // which the long name alone would leave out.
        let args: Vec<String> = sub
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let value = if a.get_action().takes_values() {
                    let names = a.get_value_names().map(|names| names.join(" "));
                    format!(
                        " {}",
                        names.unwrap_or_else(|| a.get_id().as_str().to_uppercase())
                    )
                } else {
                    String::new()
                };
                Some(format!("[--{long}{value}]"))
            })
            .collect();
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(ToString::to_string)
            .unwrap_or_default();
        item(
            &mut roff,
            &format!("leaderrun {name} {} [OPTIONS]", args.join(" ")),
            &about,
        );
    }
    section(&mut roff, "EXIT STATUS");
    for (code, text) in [
        ("COMMAND's status", "COMMAND exited on its own."),
        ("128+N", "COMMAND was ended by signal N. For SIGINT, leaderrun (when not PID 1) dies of SIGINT itself, so a calling shell loop stops; the shell shows 130. A leader stopped by SIGTERM (systemctl stop) passes it on and exits 143 when COMMAND dies of it: give a systemd unit SuccessExitStatus=143."),
        ("conflict code", "--once/--wait did not lead, or lost leadership while COMMAND ran (--conflict-exit-code, default 0)."),
        ("0", "Stopped by INT or TERM while standby."),
        ("124", "--timeout expired and COMMAND was stopped (--once/--wait and the default mode)."),
        ("125", "leaderrun itself failed: usage error, bad DSN, database unreachable or authentication failed in --once/--wait, HTTP port in use, no watchdog can run."),
        ("126", "COMMAND was found but cannot be run: not executable, or exec failed."),
        ("127", "COMMAND was not found."),
    ] {
        item(&mut roff, code, text);
    }
    paragraph(
        &mut roff,
        "leaderrun status exits 0 when a leader holds the lock, 1 when none does, 125 on error. \
         leaderrun doctor exits 0 when every check holds, 1 when one fails, 125 when it cannot connect.",
    );

    section(&mut roff, "ENVIRONMENT");
    paragraph(
        &mut roff,
        "An option given on the command line wins over its variable. An empty variable is no \
         setting: LEADERRUN_SCHEDULE= leaves --schedule unset (COMMAND still gets it as it came).",
    );
    for arg in command.get_arguments() {
        if let Some(env) = arg.get_env() {
            let flag = arg.get_long().map(|l| format!("--{l}")).unwrap_or_default();
            item(
                &mut roff,
                &env.to_string_lossy(),
                &format!("Same as {flag}."),
            );
        }
    }
    for (var, text) in [
        ("PLEXSPHERE_DSN, DATABASE_URL", "Used in this order when neither --dsn nor LEADERRUN_DSN is given."),
        ("PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGAPPNAME, PGCONNECT_TIMEOUT, PGSSLMODE", "Fill in what the DSN leaves out, as for psql. Pass passwords here or in ~/.pgpass, not in --dsn, which ps shows."),
        ("PGPASSFILE, PGSERVICE, PGSERVICEFILE, PGSYSCONFDIR", "The password file (default ~/.pgpass, used only when its mode is 0600 or stricter) and the service file (default ~/.pg_service.conf, then PGSYSCONFDIR/pg_service.conf), as for psql."),
        ("RUST_LOG", "Log filter (e.g. leaderrun=debug) when neither -v nor -q is given."),
        ("NOTIFY_SOCKET, WATCHDOG_USEC", "Set by systemd: READY=1 after the first check, STATUS= on every change, STOPPING=1 on shutdown, WATCHDOG=1 while the check loop is healthy."),
        ("LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES", "Not passed on to COMMAND (its descriptors above 2 are closed), nor are NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID. Everything else is: LEADERRUN_DSN and PG* (PGPASSWORD too) included."),
        ("LEADERRUN_TERM, LEADERRUN_LOCK, LEADERRUN_SLOT, LEADERRUN_FENCING_TOKEN, LEADERRUN_BACKEND_PID", "Given to COMMAND: the term number of this one process (1, 2, ...; every new leader process says term 1), the key it holds as class:id, its slot (0 ... N-1 with --slots N; slot k is the key CLASS+k:ID), the fencing token (a number from PostgreSQL that is greater for every later term of any replica: the one to compare across replicas), and the lock session's backend pid."),
    ] {
        item(&mut roff, var, text);
    }

    section(&mut roff, "SIGNALS");
    for (sig, text) in [
        ("INT, TERM", "Passed on to COMMAND's process group (with a --stop-signal other than TERM, that signal instead), then shutdown: grace, SIGKILL, pg_advisory_unlock, exit with COMMAND's status (0 as a standby). A second one while stopping sends SIGKILL at once."),
        ("HUP, QUIT, USR1, USR2, WINCH, ALRM", "Passed on to COMMAND's process group; ignored while standby."),
        ("TSTP", "Passed on; when COMMAND stops, leaderrun stops the rest of its own job (a pipeline's other commands, the script that runs it) and itself, so the shell shows the job stopped; fg resumes both."),
        ("PIPE", "Ignored."),
        ("CHLD", "Reaps: leaderrun is a child subreaper (or PID 1) and reaps every orphan."),
    ] {
        item(&mut roff, sig, text);
    }
    paragraph(
        &mut roff,
        "COMMAND runs in its own process group; when leaderrun owns the terminal's foreground at start, \
         the child's group gets it. A stop sends the stop signal and SIGCONT to the group and to adopted \
         orphans, then SIGKILL after the grace. On shutdown the INT or TERM received is passed on as it is \
         with the default stop signal (TERM); any other stop signal begins the shutdown's stop instead. A signal that was ignored when leaderrun started (nohup) stays ignored and \
         is not passed on; COMMAND inherits it ignored (SIGPIPE and SIGCHLD included). The child gets \
         PR_SET_PDEATHSIG(SIGKILL).",
    );

    section(&mut roff, "SAFETY");
    paragraph(
        &mut roff,
        "COMMAND starts or continues only inside the safe window of a check that proved the lock (2 \
         check intervals from its send time, on CLOCK_BOOTTIME). Whenever the lock may still be held, \
         COMMAND's whole tree is stopped before the lock is released. No INT or TERM is lost, whatever \
         leaderrun is doing when it arrives.",
    );
    paragraph(
        &mut roff,
        "A watchdog process (leaderrun-watchdog) holds a copy of the lock session's socket. When \
         leaderrun is killed, it SIGKILLs COMMAND's process group (and its cgroup, where leaderrun could \
         make one) and closes the socket only after the tree is dead; when leaderrun is stopped alone, \
         it stops the tree within 2.5 check intervals plus the grace after the last good check, before the server's \
         idle_session_timeout can free the lock; when the server ends the session of a stopped \
         leaderrun, it stops the tree 100 ms later. leaderrun sees a dead watchdog at once and starts \
         another. A session the server ends itself frees the lock within the old tree's stop time. \
         Left to LEADERRUN_FENCING_TOKEN: a freeze of the whole machine, a stopped leaderrun whose \
         watchdog was killed, and leaderrun and its watchdog killed together (then only COMMAND's \
         direct child dies, unless COMMAND runs in a PID namespace of its own, --pid-namespace, or \
         leaderrun is PID 1 of one). Log output never \
         holds leaderrun up: lines stderr does not take are dropped and counted \
         (leaderrun_log_lines_dropped_total).",
    );
    paragraph(
        &mut roff,
        "A transaction-mode connection pooler (PgBouncer pool_mode=transaction) cannot carry a \
         session advisory lock: a session that is not a direct connection takes nothing on a \
         server backend other than its own or on one that holds the lock already, every grant on \
         it is tested with a second session, and each finding of such a pooler is an ERROR line; \
         for a minute after one (or 12 check intervals) nothing is tried through it, and what it \
         took is given back on the backend that holds it, so replicas connected directly are not \
         kept out. These are tests, not a proof: do not run leaderrun through such a pooler \
         (doctor fails it). Session-mode pooling works. status, step-down and doctor may \
         be pointed at such a pooler: they leave no timer, prepared statement or lock on its \
         server connections, but for the scratch key of a doctor interrupted between its \
         grant and its give-back.",
    );

    section(&mut roff, "LOCKS");
    paragraph(
        &mut roff,
        "Everything leaderrun locks for a key (CLASS, ID) with --slots N, as pg_locks shows it \
         (locktype advisory, objid ID as an unsigned number, in the DSN's database):",
    );
    for (what, text) in [
        (
            "slot k (0 ... N-1)",
            "pg_advisory_lock(CLASS+k, ID): classid CLASS+k (wrapping), objsubid 2. Slot 0 is the \
             key itself, the seed's leader lock by default. --once tries it with \
             pg_try_advisory_lock.",
        ),
        (
            "queue head of slot k",
            "bigint lock, classid (CLASS+k) XOR 0x80000000, objsubid 1: its holder waits for slot \
             k in the server's queue (lock_timeout = one interval).",
        ),
        (
            "second in line for slot k",
            "bigint lock, classid (CLASS+k) XOR 0x40000000, objsubid 1: its holder waits for the \
             queue head's place. Every other standby tries the slots and the places once per \
             interval, so two standbys per slot wait in the server's queues however many there \
             are.",
        ),
        (
            "step-down request for slot k",
            "bigint lock, classid (CLASS+k) XOR 0x20000000, objsubid 1 (leaderrun step-down); \
             never the bigint whose halves are the pair (CLASS << 32 | ID), which applications \
             may take as a transaction lock.",
        ),
    ] {
        item(&mut roff, what, text);
    }

    section(&mut roff, "EXAMPLES");
    for (text, example) in [
        (
            "Run a worker on exactly one of many hosts:",
            "leaderrun --dsn postgres://app@db/plexsphere --lock-name worker -- ./worker",
        ),
        (
            "A nightly cron job on every host that runs once:",
            "leaderrun --once --min-hold 5m --lock-name nightly-report -- /usr/local/bin/nightly-report",
        ),
        (
            "A container entrypoint that sweeps every five minutes on the leader:",
            "leaderrun --every 5m --tick-at-grant --timeout 4m --lock-name sweep -- /app/sweep",
        ),
        (
            "A cron line (30 3 * * 1-5) as a schedule on every host, recorded in the lock's database:",
            "leaderrun --schedule '30 3 * * 1-5' --tz Europe/Berlin --history --catch-up 30m --lock-name nightly-report -- /usr/local/bin/nightly-report",
        ),
        ("Who leads:", "leaderrun status --lock-id 7"),
        (
            "Does the lock exclude through a pooler?",
            "leaderrun doctor --dsn postgres://app@pgbouncer:6432/plexsphere",
        ),
    ] {
        roff.control("PP", []).text([roman(text)]);
        roff.control("RS", ["4"])
            .text([italic(example)])
            .control("RE", []);
    }
    out.extend_from_slice(roff.render().as_bytes());
    let _ = man.render_version_section(&mut out);
    out
}
