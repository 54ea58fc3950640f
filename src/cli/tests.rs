//! The command line's parsing and checks, without a process: durations, signals, conflicts,
//! the DSN's sources, the modes.

use std::time::Duration;

use clap::{CommandFactory, Parser};
use nix::sys::signal::Signal;

use super::*;
use crate::pg::lock::{lock_id_for_name, LockKey, DEFAULT_LOCK_CLASS};

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("5").unwrap_err().contains("unit"));
    assert!(parse_duration("0s").unwrap_err().contains("zero"));
    // A unit-less zero is told what a zero with a unit would be told.
    assert!(parse_duration("0").unwrap_err().contains("zero"));
    assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
    assert!(parse_duration("-1s").unwrap_err().contains("negative"));
    assert!(parse_duration("-.5s").unwrap_err().contains("negative"));
    // The value left out: the next option is not a negative duration.
    for word in ["--once", "--", "-n"] {
        let err = parse_duration(word).unwrap_err();
        assert!(err.contains("the duration is missing"), "{word}: {err}");
    }
    assert!(parse_duration("soon").is_err());
    assert!(parse_duration("2years").unwrap_err().contains("a year"));
    // A year, however it is spelt, is at most a year.
    for year in ["365d", "1y", "1year", "12months"] {
        assert!(parse_duration(year).is_ok(), "{year}");
    }
    assert!(parse_duration("13months").unwrap_err().contains("a year"));
    // A period under the timers' resolution would fall due at every wake-up.
    assert_eq!(parse_period("1ms"), Ok(Duration::from_millis(1)));
    assert!(parse_period("999us").unwrap_err().contains("at least 1ms"));
    assert!(parse_period("1ns").unwrap_err().contains("at least 1ms"));
    assert!(parse_period("0s").unwrap_err().contains("zero"));
}

#[test]
fn mode_selection_and_conflicts() {
    let parse = |args: &[&str]| {
        let mut all = vec!["leaderrun"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        Cli::try_parse_from(all).and_then(|c| c.validate().map(|()| c))
    };
    assert_eq!(
        parse(&[]).unwrap().mode(),
        Mode::WhileLeader {
            restart: Restart::Never
        }
    );
    assert_eq!(
        parse(&["-n", "--min-hold", "10s"]).unwrap().mode(),
        Mode::OneShot {
            wait: None,
            min_hold: Duration::from_secs(10)
        }
    );
    assert_eq!(
        parse(&["--every", "1m"]).unwrap().mode(),
        Mode::Every {
            period: Duration::from_secs(60)
        }
    );
    for bad in [
        &["--once", "--every", "1m"][..],
        &["--once", "--wait", "1m"],
        &["--wait", "1m", "--every", "1m"],
        &["--min-hold", "10s"],
        &["--every", "1m", "--min-hold", "10s"],
        &["--tick-at-grant"],
        &["--once", "--tick-at-grant"],
        &["--restart", "always", "--once"],
        &["--restart", "sometimes"],
        &["--lock-name", "x", "--lock-id", "3"],
        &["--conflict-exit-code", "256"],
        &["--conflict-exit-code", "-1"],
        &["--every", "0s"],
        &["--timeout", "0s"],
        &["--wait", "-5s"],
        &["--check-interval", "10days"],
        &["--check-interval", "1s", "--grace", "30days"],
        &["--lock-name", ""],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} was accepted");
    }
    let cli = parse(&["--lock-name", "nightly-report", "--lock-class", "7"]).unwrap();
    assert_eq!(
        cli.lock(),
        LockKey {
            class: 7,
            id: 1_732_491_792
        }
    );
    assert_eq!(
        parse(&["--takeover-delay", "0s"]).unwrap().takeover_delay,
        Some(Duration::ZERO)
    );
}

#[test]
fn one_shots_log_one_step_quieter() {
    use tracing::Level;
    let level = |args: &[&str]| parse_checked(args).unwrap().log_level();
    assert_eq!(level(&["--", "t"]), Level::INFO);
    assert_eq!(level(&["-q", "--", "t"]), Level::WARN);
    assert_eq!(level(&["-qq", "--", "t"]), Level::ERROR);
    assert_eq!(level(&["-v", "--", "t"]), Level::DEBUG);
    assert_eq!(level(&["--every", "1m", "--", "t"]), Level::INFO);
    assert_eq!(level(&["-n", "--", "t"]), Level::WARN);
    assert_eq!(level(&["-w", "5s", "--", "t"]), Level::WARN);
    assert_eq!(level(&["-n", "-v", "--", "t"]), Level::INFO);
    assert_eq!(level(&["-n", "-vv", "--", "t"]), Level::DEBUG);
    assert_eq!(level(&["-n", "-q", "--", "t"]), Level::ERROR);
    assert_eq!(level(&["status"]), Level::INFO);
}

/// The first check's random delay: none for `--once`, a quarter interval (at most 1 s) for the
/// long-running modes, and for `--wait DUR` at most a quarter of DUR, so the wait always sees
/// a check (a delay as long as the wait made a reachable database exit 125).
#[test]
fn the_first_check_spread_fits_the_mode() {
    let spread = |args: &[&str]| {
        let mut all = vec!["--dsn", "host=h dbname=d"];
        all.extend_from_slice(args);
        let cli = parse_checked(&all).unwrap();
        let settings = cli.settings(&|_| None).unwrap();
        crate::cli::runner::elector_config(&settings).first_check_spread
    };
    let ms = Duration::from_millis;
    assert_eq!(spread(&["-n", "--", "t"]), Duration::ZERO);
    assert_eq!(spread(&["--", "t"]), ms(1000));
    assert_eq!(spread(&["--check-interval", "2s", "--", "t"]), ms(500));
    assert_eq!(spread(&["--wait", "1s", "--", "t"]), ms(250));
    assert_eq!(spread(&["--wait", "1m", "--", "t"]), ms(1000));
}

#[test]
fn http_addresses() {
    let resolved = |text: &str| parse_http_addr(text).unwrap().resolve().unwrap();
    assert_eq!(resolved("127.0.0.1:9464").port(), 9464);
    assert_eq!(resolved(":9464").to_string(), "[::]:9464");
    assert_eq!(resolved("[::1]:9464").to_string(), "[::1]:9464");
    // A name is only looked up when resolved (at start-up, where a stop request is acted on).
    assert_eq!(
        parse_http_addr("localhost:9464").unwrap(),
        HttpAddr::Name("localhost".into(), 9464)
    );
    assert!(resolved("localhost:9464").ip().is_loopback());
    for bad in [
        "9464",
        "localhost",
        "host:port",
        ":",
        "a b:1",
        "[::1:9464",
        "h:70000",
    ] {
        assert!(parse_http_addr(bad).is_err(), "{bad}");
    }
}

#[test]
fn signals() {
    assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
    assert_eq!(parse_signal("sigint"), Ok(Signal::SIGINT));
    assert_eq!(parse_signal("hup"), Ok(Signal::SIGHUP));
    assert_eq!(parse_signal("15"), Ok(Signal::SIGTERM));
    assert!(parse_signal("NOPE").is_err());
    assert!(parse_signal("STOP").is_err());
    assert!(parse_signal("chld").is_err());
    assert_eq!(parse_signal("KILL"), Ok(Signal::SIGKILL));
    assert!(parse_signal("99").is_err());
}

fn parse_checked(args: &[&str]) -> Result<Cli, clap::Error> {
    let all: Vec<std::ffi::OsString> = std::iter::once("leaderrun")
        .chain(args.iter().copied())
        .map(Into::into)
        .collect();
    super::args::parse_from(&all)
}

#[test]
fn short_forms_mean_the_long_ones() {
    let short =
        parse_checked(&["-w", "30s", "-E", "75", "-s", "INT", "-k", "3s", "--", "t"]).unwrap();
    let long = parse_checked(&[
        "--wait",
        "30s",
        "--conflict-exit-code",
        "75",
        "--stop-signal",
        "INT",
        "--grace",
        "3s",
        "--",
        "t",
    ])
    .unwrap();
    for cli in [&short, &long] {
        assert_eq!(cli.wait, Some(Duration::from_secs(30)));
        assert_eq!(cli.conflict_exit_code, 75);
        assert_eq!(cli.stop_signal, Signal::SIGINT);
        assert_eq!(cli.grace, Some(Duration::from_secs(3)));
        assert_eq!(cli.command, ["t"]);
    }
    // Attached values and bundling, as getopt users type them.
    let cli = parse_checked(&["-nE75", "-sKILL", "-k1s", "--", "t"]).unwrap();
    assert!(cli.once);
    assert_eq!(cli.conflict_exit_code, 75);
    assert_eq!(cli.stop_signal, Signal::SIGKILL);
    assert_eq!(cli.grace, Some(Duration::from_secs(1)));
    // The short forms check their values like the long ones.
    for bad in [
        &["-w", "30", "--", "t"][..],
        &["-w", "0s", "--", "t"],
        &["-E", "256", "--", "t"],
        &["-s", "STOP", "--", "t"],
        &["-k", "0s", "--", "t"],
        &["-k", "5", "--", "t"],
        &["-n", "-w", "5s", "--", "t"],
    ] {
        assert!(parse_checked(bad).is_err(), "{bad:?} was accepted");
    }
    // No short letter is used twice (clap's debug_assert checks that too) and -v/-q/-h/-V
    // keep their meaning.
    let cli = parse_checked(&["-v", "-n", "--", "t"]).unwrap();
    assert_eq!(cli.verbose, 1);
    let shorts: Vec<char> = Cli::command()
        .get_arguments()
        .filter_map(clap::Arg::get_short)
        .collect();
    for letter in ['n', 'w', 'E', 'c', 's', 'k', 'v', 'q'] {
        assert_eq!(
            shorts.iter().filter(|&&c| c == letter).count(),
            1,
            "-{letter} in {shorts:?}"
        );
    }
}

#[test]
fn dash_c_runs_its_string_with_sh() {
    let cli = parse_checked(&["-n", "-c", "echo a | tr a b; exit 3"]).unwrap();
    assert!(cli.command.is_empty());
    assert_eq!(cli.command_line(), ["sh", "-c", "echo a | tr a b; exit 3"]);
    let settings = cli
        .settings(&|name| (name == "PGDATABASE").then(|| "d".into()))
        .unwrap();
    assert_eq!(settings.command, ["sh", "-c", "echo a | tr a b; exit 3"]);
    // A string that looks like an option is still the script.
    let cli = parse_checked(&["-c", "--help"]).unwrap();
    assert_eq!(cli.command_line(), ["sh", "-c", "--help"]);
    // Without -c, COMMAND is the words after --, untouched.
    let cli = parse_checked(&["--", "sh", "-c", "exit 3"]).unwrap();
    assert_eq!(cli.command_line(), ["sh", "-c", "exit 3"]);
    for bad in [
        &["-c", "true", "--", "false"][..],
        &["-c", "true", "false"],
        &["-c"],
        &["-c", "true", "status"],
        &["status", "-c", "true"],
    ] {
        assert!(parse_checked(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn a_bare_zero_only_where_the_default_is_zero() {
    for zero in ["0", "0s", "0ms", " 0 "] {
        let cli = parse_checked(&["--takeover-delay", zero, "--", "t"]).unwrap();
        assert_eq!(cli.takeover_delay, Some(Duration::ZERO), "{zero:?}");
        let cli = parse_checked(&["-n", "--min-hold", zero, "--", "t"]).unwrap();
        assert_eq!(
            cli.mode(),
            Mode::OneShot {
                wait: None,
                min_hold: Duration::ZERO
            },
            "{zero:?}"
        );
    }
    assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
    assert!(parse_duration_or_zero("5").unwrap_err().contains("unit"));
    assert!(parse_duration_or_zero("00").unwrap_err().contains("unit"));
    assert!(parse_duration_or_zero("-0").is_err());
    for option in ["--takeover-delay", "--min-hold"] {
        assert!(parse_checked(&["-n", option, "5", "--", "t"]).is_err());
    }
    for option in [
        "--check-interval",
        "--grace",
        "-k",
        "--timeout",
        "--wait",
        "-w",
        "--every",
    ] {
        for zero in ["0", "0s"] {
            assert!(
                parse_checked(&[option, zero, "--", "t"]).is_err(),
                "{option} {zero} was accepted"
            );
        }
    }
}

#[test]
fn lock_options_parse_alike_in_every_subcommand() {
    let key = |class, id| LockKey { class, id };
    let forms: [(&[&str], LockKey); 6] = [
        (&["--lock-id", "-5"], key(DEFAULT_LOCK_CLASS, -5)),
        (&["--lock-id=-5"], key(DEFAULT_LOCK_CLASS, -5)),
        (
            &["--lock-class", "-7", "--lock-id", "-2147483648"],
            key(-7, i32::MIN),
        ),
        (&["--lock-class=-1", "--lock-id", "3"], key(-1, 3)),
        (
            &["--lock-name", "-5", "--lock-class", "-9"],
            key(-9, lock_id_for_name("-5")),
        ),
        (
            &["--lock-name=-x"],
            key(DEFAULT_LOCK_CLASS, lock_id_for_name("-x")),
        ),
    ];
    for (args, want) in forms {
        let run = [args, &["--", "t"][..]].concat();
        let status = [&["status"][..], args].concat();
        let status_json = [&["status"][..], args, &["--json"]].concat();
        let doctor = [&["doctor"][..], args].concat();
        let before = [args, &["status"][..]].concat();
        for line in [&run, &status, &status_json, &doctor, &before] {
            let cli = parse_checked(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert_eq!(cli.lock(), want, "{line:?}");
        }
    }
    for sub in [&[][..], &["status"], &["doctor"]] {
        for bad in [
            &["--lock-id", "2147483648"][..],
            &["--lock-id", "-2147483649"],
            &["--lock-class", "-x"],
            &["--lock-id", "--lock-class"],
            &["--lock-name", "-5", "--lock-id", "-5"],
        ] {
            let mut line = sub.to_vec();
            line.extend_from_slice(bad);
            if sub.is_empty() {
                line.extend_from_slice(&["--", "t"]);
            }
            assert!(parse_checked(&line).is_err(), "{line:?} was accepted");
        }
    }
}

#[test]
fn command_after_double_dash_keeps_its_flags() {
    let cli =
        Cli::try_parse_from(["leaderrun", "--lock-id", "-5", "--", "sh", "-c", "exit 3"]).unwrap();
    assert_eq!(cli.lock_id, -5);
    assert_eq!(cli.command, ["sh", "-c", "exit 3"]);
    assert!(Cli::try_parse_from(["leaderrun", "--lock-id", "2147483648", "--", "true"]).is_err());
    assert!(Cli::try_parse_from(["leaderrun"]).is_err());
}

/// `RUN_ENVIRONMENT` (the variables a subcommand leaves unread) and `Cli::validate` (the
/// options a subcommand refuses typed) name the same options: one added to a run and to only
/// one of the two would make a subcommand read a run's variable, or refuse it only as one.
#[test]
fn the_run_options_a_subcommand_refuses_are_those_whose_variables_it_leaves_unread() {
    let sample = |arg: &clap::Arg| -> Vec<String> {
        let long = format!("--{}", arg.get_long().expect("a long name"));
        if !arg.get_action().takes_values() {
            return vec![long];
        }
        let value = match arg
            .get_value_names()
            .and_then(|v| v.first())
            .map(|v| v.as_str())
        {
            Some("DUR") => "1s",
            Some("ADDR") => "127.0.0.1:1",
            Some("POLICY") => "always",
            _ => return Vec::new(),
        };
        vec![long, value.to_owned()]
    };
    let command = Cli::command();
    let mut refused = Vec::new();
    for arg in command.get_arguments().filter(|a| a.get_env().is_some()) {
        let words = sample(arg);
        if words.is_empty() {
            continue;
        }
        let mut raw = vec![
            "leaderrun".to_owned(),
            "--dsn".into(),
            "host=h dbname=d".into(),
        ];
        raw.extend(words);
        raw.push("status".into());
        let raw: Vec<std::ffi::OsString> = raw.into_iter().map(Into::into).collect();
        if parse_from(&raw).is_err() {
            refused.push(arg.get_id().as_str().to_owned());
        }
    }
    let mut unread: Vec<String> = args::RUN_ENVIRONMENT
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    refused.sort();
    unread.sort();
    assert_eq!(refused, unread);
}

/// `--tz`'s help names each form a zone may take, as `TZ` takes it, and each example it gives
/// loads, after a colon too. It named IANA names only, while POSIX rules and zone files were
/// taken as well.
#[test]
fn the_tz_help_names_every_form_it_takes() {
    use crate::supervisor::schedule::named_zone;
    let command = Cli::command();
    let tz = command
        .get_arguments()
        .find(|arg| arg.get_id() == "tz")
        .unwrap();
    let help = tz.get_long_help().unwrap().to_string();
    for form in [
        "an IANA name",
        "a POSIX TZ rule",
        "the path of a zone file",
        "leading colon",
    ] {
        assert!(help.contains(form), "{form:?} not in {help}");
    }
    for example in [
        "Europe/Berlin",
        "UTC",
        "EST5EDT,M3.2.0,M11.1.0",
        "<+14>-14",
        "/usr/share/zoneinfo/Europe/Berlin",
    ] {
        assert!(help.contains(example), "{example:?} not in {help}");
        if example.starts_with('/') && !std::path::Path::new(example).exists() {
            continue;
        }
        for zone in [example.to_owned(), format!(":{example}")] {
            assert!(named_zone(&zone, "--tz").is_ok(), "{zone}");
        }
    }
}
