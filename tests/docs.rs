//! The committed man page and completions match the CLI definition.

use std::path::Path;

#[test]
fn generated_docs_are_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let regenerate = std::env::var_os("LEADERRUN_REGENERATE").is_some();
    let mut stale = Vec::new();
    for (what, file) in leaderrun::cli::docs::FILES {
        let path = root.join(file);
        let fresh = leaderrun::cli::docs::render(what);
        if regenerate {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &fresh).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(&fresh[..]) {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} no longer match the CLI; regenerate with: \
         LEADERRUN_REGENERATE=1 cargo test --test tests generated_docs"
    );
}

#[test]
fn the_man_page_has_the_contract_sections() {
    let man = String::from_utf8(leaderrun::cli::docs::man_page()).unwrap();
    for section in [
        "EXIT STATUS",
        "ENVIRONMENT",
        "SIGNALS",
        "EXAMPLES",
        "OPTIONS",
    ] {
        assert!(
            man.contains(&format!(".SH \"{section}\"")) || man.contains(&format!(".SH {section}")),
            "{section} missing"
        );
    }
    for needle in [
        "LEADERRUN_CHECK_INTERVAL",
        "LEADERRUN_TAKEOVER_DELAY",
        "124",
        "127",
        "PR_SET_PDEATHSIG",
    ] {
        assert!(man.contains(needle), "{needle} missing from the man page");
    }
}

#[test]
fn the_synopsis_puts_no_subcommand_after_command() {
    let man = String::from_utf8(leaderrun::cli::docs::man_page()).unwrap();
    let synopsis = man
        .split(".SH SYNOPSIS")
        .nth(1)
        .and_then(|rest| rest.split(".SH").next())
        .expect("a SYNOPSIS section");
    for line in [
        "\\fBleaderrun\\fR [OPTIONS] \\-\\- COMMAND [ARG...]",
        "\\fBleaderrun\\fR [OPTIONS] \\-c STRING",
        "\\fBleaderrun\\fR status [\\-\\-json] [OPTIONS]",
        "\\fBleaderrun\\fR doctor [OPTIONS]",
    ] {
        assert!(synopsis.contains(line), "{line:?} not in {synopsis}");
    }
    assert!(
        !synopsis.to_lowercase().contains("subcommand"),
        "{synopsis}"
    );
}

/// The SUBCOMMANDS section shows a valued option with its value, as the usage does.
#[test]
fn the_subcommands_show_the_values_of_their_options() {
    let man = String::from_utf8(leaderrun::cli::docs::man_page()).unwrap();
    for line in [
        "\\fBleaderrun status [\\-\\-json] [OPTIONS]\\fR",
        "\\fBleaderrun doctor [\\-\\-scratch\\-id ID] [OPTIONS]\\fR",
        "\\fBleaderrun step\\-down [\\-\\-slot K] [OPTIONS]\\fR",
    ] {
        assert!(man.contains(line), "{line:?} not in the man page");
    }
}

/// `-h` names each variable without a dangling `=` (or a value from the environment), and the
/// man page's `--dsn` fallbacks begin with `LEADERRUN_DSN`.
#[test]
fn help_shows_env_names_without_values_and_the_dsn_fallbacks_in_order() {
    for flag in ["-h", "--help"] {
        let out = crate::support::leaderrun()
            .arg(flag)
            .env("LEADERRUN_LOCK_ID", "7")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("[env: LEADERRUN_LOCK_CLASS]"), "{help}");
        assert!(help.contains("[env: LEADERRUN_LOCK_ID]"), "{help}");
        assert!(!help.contains("=]"), "{help}");
    }
    let man = String::from_utf8(leaderrun::cli::docs::man_page()).unwrap();
    assert!(
        man.contains("When absent, LEADERRUN_DSN, then PLEXSPHERE_DSN, then DATABASE_URL"),
        "the --dsn fallbacks"
    );
}

/// The README says `--help` shows an example for each option: every option of the command and
/// of each subcommand has an `Example:` in its long help (`-h`, `-V` and COMMAND aside).
#[test]
fn every_option_has_an_example() {
    use clap::CommandFactory;
    let command = leaderrun::cli::Cli::command();
    let mut missing = Vec::new();
    for (name, sub) in std::iter::once(("leaderrun", &command))
        .chain(command.get_subcommands().map(|sub| (sub.get_name(), sub)))
    {
        for arg in sub.get_arguments().filter(|a| !a.is_positional()) {
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            if !help.contains("Example:") {
                missing.push(format!("{name} --{}", arg.get_id()));
            }
        }
    }
    assert!(missing.is_empty(), "no example: {missing:?}");
}
