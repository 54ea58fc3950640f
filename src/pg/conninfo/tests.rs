//! The resolution rules one case each: precedence of DSN, service, `PG*` and defaults, the
//! two syntaxes, `.pgpass` matching and permissions, host lists, refused keywords.

use super::*;
use std::collections::HashMap;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| map.get(k).cloned()
}

fn no_home() -> Vec<(&'static str, &'static str)> {
    // No ~/.pgpass, ~/.pg_service.conf or ~/.postgresql of the machine running the tests.
    vec![
        ("PGSERVICEFILE", "/nonexistent"),
        ("PGSYSCONFDIR", "/nonexistent"),
    ]
}

/// The first host's password.
fn password(c: &ConnSettings) -> Option<&str> {
    c.tls.plan.hosts[0]
        .password
        .as_deref()
        .map(|p| std::str::from_utf8(p).unwrap())
}

fn resolve_with(dsn: Option<&str>, vars: &[(&str, &str)]) -> Result<ConnSettings, ConnInfoError> {
    let mut all = no_home();
    all.extend_from_slice(vars);
    let e = env(&all);
    resolve(dsn, &e)
}

/// psql's documented behaviour, one row per case: DSN, environment, expected description.
#[test]
fn resolution_table() {
    type Case<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (
            Some("postgres://app@db.example:6543/plexsphere"),
            &[],
            "host=db.example port=6543 dbname=plexsphere user=app",
        ),
        (
            Some("postgresql://db/x"),
            &[("PGUSER", "u")],
            "host=db port=5432 dbname=x user=u",
        ),
        (
            Some("postgresql:///x?host=%2Fvar%2Frun%2Fpostgresql"),
            &[("PGUSER", "u")],
            "host=/var/run/postgresql port=5432 dbname=x user=u",
        ),
        (
            Some("postgresql://%2Ftmp:5433/x"),
            &[("PGUSER", "u")],
            "host=/tmp port=5433 dbname=x user=u",
        ),
        (
            Some("postgresql://a:5432,b:5433/x?user=u"),
            &[],
            "host=a,b port=5432,5433 dbname=x user=u",
        ),
        (
            Some("postgresql://[::1]:5433/x?user=u"),
            &[],
            "host=::1 port=5433 dbname=x user=u",
        ),
        (
            Some("host=h dbname='my db' user=u"),
            &[],
            "host=h port=5432 dbname=my db user=u",
        ),
        (
            Some("host = h  user=u"),
            &[("PGDATABASE", "envdb"), ("PGPORT", "7777")],
            "host=h port=7777 dbname=envdb user=u",
        ),
        (
            None,
            &[("PGHOST", "envhost"), ("PGUSER", "alice")],
            "host=envhost port=5432 dbname=alice user=alice",
        ),
        (
            None,
            &[
                ("PLEXSPHERE_DSN", "host=plex user=u"),
                ("DATABASE_URL", "host=url user=u"),
            ],
            "host=plex port=5432 dbname=u user=u",
        ),
        (
            None,
            &[("PLEXSPHERE_DSN", ""), ("DATABASE_URL", "host=url user=u")],
            "host=url port=5432 dbname=u user=u",
        ),
    ];
    for (dsn, vars, expected) in cases {
        let got = resolve_with(*dsn, vars).unwrap_or_else(|e| panic!("{dsn:?}: {e}"));
        assert_eq!(describe(&got.config), *expected, "{dsn:?} {vars:?}");
    }
}

#[test]
fn dsn_fields_win_and_the_environment_fills_the_rest() {
    let c = resolve_with(
        Some("postgres://app@db/x"),
        &[("PGUSER", "envuser"), ("PGPASSWORD", "s3cret")],
    )
    .unwrap();
    assert_eq!(c.config.get_user(), Some("app"));
    assert_eq!(password(&c), Some("s3cret"));
    let c = resolve_with(Some("postgres://u:p%40ss@db/x"), &[]).unwrap();
    assert_eq!(password(&c), Some("p@ss"));
}

#[test]
fn defaults_like_psql() {
    let c = resolve_with(None, &[("PGUSER", "alice")]).unwrap();
    let d = describe(&c.config);
    assert!(d.starts_with("host=/"), "{d}");
    assert!(c
        .config
        .get_application_name()
        .is_some_and(|a| a.starts_with("leaderrun@")));
    assert_eq!(c.tls.mode, SslMode::Prefer);
    let c = resolve_with(Some("host=h user=u application_name=mine"), &[]).unwrap();
    assert_eq!(c.config.get_application_name(), Some("mine"));
    // Empty, from the DSN or PGAPPNAME, is set (no fallback, no default) and not sent, as
    // libpq sends none.
    let c = resolve_with(Some("host=h user=u application_name=''"), &[]).unwrap();
    assert_eq!(c.config.get_application_name(), None);
    let c = resolve_with(
        Some("host=h user=u fallback_application_name=fb"),
        &[("PGAPPNAME", "")],
    )
    .unwrap();
    assert_eq!(c.config.get_application_name(), None);
}

#[test]
fn ssl_settings() {
    let c = resolve_with(
        Some("postgresql://h/x?user=u&sslmode=verify-full&sslrootcert=/r.pem&sslcert=/c.pem&sslkey=/k.pem"),
        &[],
    )
    .unwrap();
    assert_eq!(
        c.tls,
        TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some("/r.pem".into()),
            // As libpq: a client certificate that does not exist is none, and its key unread.
            client_cert: None,
            client_key: None,
            plan: c.tls.plan.clone(),
        }
    );
    assert_eq!(
        c.config.get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    let c = resolve_with(Some("host=h user=u"), &[("PGSSLMODE", "verify-ca")]).unwrap();
    assert_eq!(c.tls.mode, SslMode::VerifyCa);
    assert!(resolve_with(Some("host=h sslmode=sometimes"), &[]).is_err());
    // requiressl in a connection string is sslmode, the later of the two winning (libpq).
    for (dsn, mode) in [
        ("host=h sslmode=disable requiressl=1", SslMode::Require),
        ("host=h requiressl=1 sslmode=disable", SslMode::Disable),
        ("host=h sslmode=require requiressl=0", SslMode::Prefer),
        (
            "postgresql://h/d?sslmode=disable&requiressl=1",
            SslMode::Require,
        ),
    ] {
        assert_eq!(
            resolve_with(Some(dsn), &[]).unwrap().tls.mode,
            mode,
            "{dsn}"
        );
    }
    // PGREQUIRESSL yields to sslmode and PGSSLMODE.
    let c = resolve_with(Some("host=h sslmode=disable"), &[("PGREQUIRESSL", "1")]).unwrap();
    assert_eq!(c.tls.mode, SslMode::Disable);
    let c = resolve_with(Some("host=h"), &[("PGREQUIRESSL", "1")]).unwrap();
    assert_eq!(c.tls.mode, SslMode::Require);
    // libpq 16: the system's roots make verify-full the default and refuse anything weaker.
    let c = resolve_with(Some("host=h user=u dbname=d sslrootcert=system"), &[]).unwrap();
    assert_eq!(c.tls.mode, SslMode::VerifyFull);
    let c = resolve_with(
        Some("host=h user=u dbname=d"),
        &[("PGSSLROOTCERT", "system")],
    )
    .unwrap();
    assert_eq!(c.tls.mode, SslMode::VerifyFull);
    for weaker in ["require", "verify-ca"] {
        let err = resolve_with(
            Some(&format!(
                "host=h dbname=d sslrootcert=system sslmode={weaker}"
            )),
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("may not be used with sslrootcert=system"),
            "{err}"
        );
    }
}

#[test]
fn service_file_fills_what_the_dsn_leaves_out() {
    let dir = std::env::temp_dir().join(format!("leaderrun-svc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("services.conf");
    std::fs::write(&file, "# comment\n[other]\nhost=nope\n[plex]\nhost=svc-host\nport=6000\ndbname=svcdb\nuser=svcuser\n").unwrap();
    let f = file.to_str().unwrap();
    let c = resolve_with(Some("service=plex dbname=mine"), &[("PGSERVICEFILE", f)]).unwrap();
    assert_eq!(
        describe(&c.config),
        "host=svc-host port=6000 dbname=mine user=svcuser"
    );
    let c = resolve_with(None, &[("PGSERVICEFILE", f), ("PGSERVICE", "plex")]).unwrap();
    assert_eq!(
        describe(&c.config),
        "host=svc-host port=6000 dbname=svcdb user=svcuser"
    );
    let err = resolve_with(Some("service=missing"), &[("PGSERVICEFILE", f)]).unwrap_err();
    assert!(err.to_string().contains("service \"missing\" not found"));
    // Lines that are not UTF-8 elsewhere in the file leave the service found; one among the
    // service's own settings is refused, not ignored.
    std::fs::write(
        &file,
        b"# caf\xe9\n[other]\nhost=caf\xe9\n[plex]\nhost=svc-host\ndbname=svcdb\n[caf\xe9]\nhost=x\n",
    )
    .unwrap();
    let c = resolve_with(Some("service=plex"), &[("PGSERVICEFILE", f)]).unwrap();
    assert_eq!(c.config.get_dbname(), Some("svcdb"));
    std::fs::write(&file, b"[plex]\nhost=caf\xe9\n").unwrap();
    let err = resolve_with(Some("service=plex"), &[("PGSERVICEFILE", f)]).unwrap_err();
    assert!(
        err.to_string().contains("line 2 is not UTF-8 text"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn where_the_database_and_the_password_came_from() {
    let c = resolve_with(Some("host=h user=u"), &[]).unwrap();
    assert_eq!((c.database_from, c.password_from), ("default", None));
    let c = resolve_with(Some("host=h user=u dbname=d password=p"), &[]).unwrap();
    assert_eq!(c.database_from, "dsn");
    assert_eq!(c.password_from.as_deref(), Some("--dsn"));
    let c = resolve_with(Some("postgres://u:p@h/d"), &[]).unwrap();
    assert_eq!(c.password_from.as_deref(), Some("--dsn"));
    // The same value in LEADERRUN_DSN came from the environment, not from argv.
    let c = resolve_with(
        Some("host=h user=u password=p"),
        &[("LEADERRUN_DSN", "host=h user=u password=p")],
    )
    .unwrap();
    assert_eq!(c.password_from.as_deref(), Some("LEADERRUN_DSN"));
    let c = resolve_with(
        Some("host=h user=u"),
        &[("PGDATABASE", "d"), ("PGPASSWORD", "p")],
    )
    .unwrap();
    assert_eq!(c.database_from, "PGDATABASE");
    assert_eq!(c.password_from.as_deref(), Some("PGPASSWORD"));
}

#[test]
fn pgpass_rules() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("leaderrun-pgpass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pgpass");
    std::fs::write(
        &file,
        "# comment\nother:*:*:*:wrong\ndb:5432:app:u:first\ndb:*:*:u:second\nlocalhost:*:*:*:sock\\:et\n::1:*:*:u:six\n\\:\\:2:*:*:u:escaped\n*:*:*:*:any\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let look = |h: &str, p: &str, d: &str, u: &str| pgpass_lookup(&file, h, p, d, u);
    assert_eq!(look("db", "5432", "app", "u").as_deref(), Some("first"));
    assert_eq!(look("db", "6000", "x", "u").as_deref(), Some("second"));
    assert_eq!(
        look("/var/run/postgresql", "5432", "x", "v").as_deref(),
        Some("sock:et")
    );
    assert_eq!(look("elsewhere", "1", "x", "v").as_deref(), Some("any"));
    // An unescaped colon matches a colon of the host, as libpq's matcher reads it; escaped too.
    assert_eq!(look("::1", "5432", "x", "u").as_deref(), Some("six"));
    assert_eq!(look("::2", "5432", "x", "u").as_deref(), Some("escaped"));
    assert_eq!(look("fe80::1", "5432", "x", "u").as_deref(), Some("any"));
    // Through the resolver, with passfile= and with PGPASSFILE.
    let f = file.to_str().unwrap();
    let c = resolve_with(
        Some(&format!("host=db user=u dbname=app passfile={f}")),
        &[],
    )
    .unwrap();
    assert_eq!(password(&c), Some("first"));
    let c = resolve_with(Some("host=db user=u dbname=app"), &[("PGPASSFILE", f)]).unwrap();
    assert_eq!(password(&c), Some("first"));
    // An explicit password wins over the file.
    let c = resolve_with(
        Some("host=db user=u dbname=app password=given"),
        &[("PGPASSFILE", f)],
    )
    .unwrap();
    assert_eq!(password(&c), Some("given"));
    // Lines that are not UTF-8 (Latin-1) are read as libpq reads them, as bytes: the file is
    // not ignored for them, and such a password is the file's bytes.
    std::fs::write(
        &file,
        b"# caf\xe9\nother:*:*:*:p\xe4ss\ndb:5432:app:u:first\nlatin:*:*:*:p\xe9ss\n",
    )
    .unwrap();
    assert_eq!(look("db", "5432", "app", "u").as_deref(), Some("first"));
    assert_eq!(
        pgpass_password(&file, "latin", "5432", "app", "u"),
        Some(b"p\xe9ss".to_vec())
    );
    let c = resolve_with(Some("host=latin user=u dbname=app"), &[("PGPASSFILE", f)]).unwrap();
    assert_eq!(
        c.tls.plan.hosts[0].password.as_deref(),
        Some(&b"p\xe9ss"[..])
    );
    // Not a plain file (a directory here; a FIFO nobody writes to would block): ignored.
    assert_eq!(pgpass_password(&dir, "db", "5432", "app", "u"), None);
    // Readable by others: ignored.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(look("db", "5432", "app", "u"), None);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `HOME` and `PGPASSFILE` are paths, read as bytes (`resolve_with_paths`): one that is not
/// UTF-8 names the password file, as libpq takes it; the text lookup is never asked for them.
#[test]
fn path_variables_are_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let home = std::ffi::OsStr::from_bytes(b"/home/caf\xe9");
    let passfile = std::ffi::OsStr::from_bytes(b"/run/secrets/pg\xff");
    let text = env(&no_home());
    let asked = std::cell::RefCell::new(Vec::new());
    let env = |name: &str| {
        asked.borrow_mut().push(name.to_owned());
        text(name)
    };
    let file = |given: &[(&str, &std::ffi::OsStr)]| {
        let c = resolve_with_paths(Some("host=db user=u dbname=app"), &env, &|name| {
            given
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_os_string())
                .or_else(|| text(name).map(Into::into))
        })
        .unwrap();
        c.tls.plan.hosts[0].passfile.as_ref().unwrap().file.clone()
    };
    assert_eq!(
        file(&[("HOME", home)]),
        std::path::Path::new(home).join(".pgpass")
    );
    assert_eq!(
        file(&[("HOME", home), ("PGPASSFILE", passfile)]),
        std::path::Path::new(passfile)
    );
    assert!(
        !asked
            .borrow()
            .iter()
            .any(|n| PATH_VARIABLES.contains(&n.as_str())),
        "{asked:?}"
    );
}

#[test]
fn errors_never_echo_the_dsn() {
    for bad in [
        "nonsense",
        "mysql://u:hunter2@h/db",
        "postgres://u:hunter2@h:notaport/db",
        "postgres://postgres:hun/ter2@127.0.0.1/postgres",
        "postgres://u:hunter2@127.0.0.1/d?&&",
        "postgres://u:hunter2@127.0.0.1/d?hunter2",
        "host=h password=hunter2 hunter2",
        "host=h password=hunter 2=x",
        "host=h password=hunter2 sslmode=hunter2",
        "host=h password=hunter2 connect_timeout=hunter2",
        "host=h password=hunter2 keepalives_idle=hunter2",
        "host=h password=hunter2 target_session_attrs=hunter2",
        "host=h password=hunter2 frobnicate=1",
        "host=h password='hunter2",
        // A password's unencoded '@' or '/': the rest would be a host or a database name
        // that every message about the server shows.
        "postgres://pw:hunter@2@127.0.0.1:5432/d",
        "postgres://localhost:55999/hunter2@127.0.0.1:5432/d",
        "postgres://u:hunter2@host@127.0.0.1/d",
    ] {
        let err = resolve_with(Some(bad), &[]).unwrap_err();
        let shown = crate::error::Chain(&err).to_string();
        assert!(shown.starts_with("invalid"), "{shown}");
        assert!(!shown.contains("hunter"), "{shown}");
    }
    // libpq takes a '?' in a URL's password as part of it.
    let c = resolve_with(Some("postgres://u:hun?ter2@127.0.0.1/d"), &[]).unwrap();
    assert_eq!(password(&c), Some("hun?ter2"));
    // Only libpq's two prefixes make a URL: a keyword value may hold "://".
    let c = resolve_with(Some("host=h dbname=d password=ab://cd"), &[]).unwrap();
    assert_eq!(password(&c), Some("ab://cd"));
    // ... and percent-encoded, an '@' is a password's or a database name's.
    let c = resolve_with(Some("postgres://u:hunter%402@127.0.0.1/d%40b"), &[]).unwrap();
    assert_eq!(password(&c), Some("hunter@2"));
    assert_eq!(c.config.get_dbname(), Some("d@b"));
}

/// `keepalives_idle`, `_interval` and `_count` reach the driver's settings (the elector takes
/// the shorter of each and its own); 0 is refused, as Linux's setsockopt refuses it for libpq.
#[test]
fn keepalive_settings_are_read_and_checked() {
    let c = resolve_with(
        Some("host=h dbname=d keepalives_idle=2 keepalives_interval=1 keepalives_count=9"),
        &[],
    )
    .unwrap();
    assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(2));
    assert_eq!(
        c.config.get_keepalives_interval(),
        Some(Duration::from_secs(1))
    );
    assert_eq!(c.config.get_keepalives_retries(), Some(9));
    for bad in [
        "keepalives_idle=0",
        "keepalives_interval=-1",
        "keepalives_count=x",
        "keepalives_idle=40000",
    ] {
        let err = resolve_with(Some(&format!("host=h dbname=d {bad}")), &[]).unwrap_err();
        let shown = crate::error::Chain(&err).to_string();
        assert!(shown.contains("1 to 32767"), "{bad}: {shown}");
    } // keepalives: an integer, as libpq reads it; 0 (off) is refused, never quietly kept on.
    assert!(resolve_with(Some("host=h dbname=d keepalives=1"), &[]).is_ok());
    let err = resolve_with(Some("host=h dbname=d keepalives=abc"), &[]).unwrap_err();
    assert!(matches!(err, ConnInfoError::Value { .. }), "{err}");
    let err = resolve_with(Some("host=h dbname=d keepalives=0"), &[]).unwrap_err();
    assert!(matches!(err, ConnInfoError::Unsupported { .. }), "{err}");
}

/// An unsupported `gssencmode` is named with its value, or in words when the settings hold a
/// password (no value of such settings is shown).
#[test]
fn an_unsupported_gssencmode_reads_whole_with_or_without_a_password() {
    let plain = resolve_with(Some("host=h dbname=d gssencmode=require"), &[]).unwrap_err();
    let plain = crate::error::Chain(&plain).to_string();
    assert!(
        plain.contains("gssencmode=\"require\" is not supported"),
        "{plain}"
    );
    let secret = resolve_with(
        Some("host=h dbname=d password=secretpw gssencmode=require"),
        &[],
    )
    .unwrap_err();
    let secret = crate::error::Chain(&secret).to_string();
    assert!(
        secret.contains("a gssencmode other than disable is not supported"),
        "{secret}"
    );
    assert!(
        !secret.contains("secretpw") && !secret.contains("the value"),
        "{secret}"
    );
}

/// libpq 18's protocol range, as a keyword or its variable: taken when it holds 3.0 (the one
/// version leaderrun speaks), refused as not supported when it does not, refused when libpq
/// would not know the value either.
#[test]
fn a_protocol_range_is_taken_only_when_it_holds_3_0() {
    for (setting, value, taken) in [
        ("min_protocol_version", "3.0", true),
        ("min_protocol_version", "3.2", false),
        ("min_protocol_version", "latest", false),
        ("max_protocol_version", "3.0", true),
        ("max_protocol_version", "3.2", true),
        ("max_protocol_version", "latest", true),
        ("max_protocol_version", "2.0", false),
    ] {
        let var = if setting == "min_protocol_version" {
            "PGMINPROTOCOLVERSION"
        } else {
            "PGMAXPROTOCOLVERSION"
        };
        let by_keyword = resolve_with(Some(&format!("host=h dbname=d {setting}='{value}'")), &[]);
        let by_variable = resolve_with(Some("host=h dbname=d"), &[(var, value)]);
        for (how, got) in [("keyword", by_keyword), ("variable", by_variable)] {
            match got {
                Ok(_) => assert!(taken, "{setting}={value:?} as a {how} was taken"),
                Err(err) => {
                    assert!(!taken, "{setting}={value:?} as a {how}: {err}");
                    assert!(
                        matches!(err, ConnInfoError::Unsupported { .. }),
                        "{setting}={value:?} as a {how}: {err}"
                    );
                }
            }
        }
    }
}

#[test]
fn endpoint_is_one_word() {
    let c = resolve_with(Some("postgresql://app:secret@db:6543/plexsphere"), &[]).unwrap();
    assert_eq!(endpoint(&c.config), "app@db:6543/plexsphere");
    // Each host with its own port; one port serves all.
    let c = resolve_with(Some("host=db1,::1 port=5432,5433 user=u dbname=d"), &[]).unwrap();
    assert_eq!(endpoint(&c.config), "u@db1:5432,[::1]:5433/d");
    let c = resolve_with(Some("host=db1,db2 port=6000 user=u dbname=d"), &[]).unwrap();
    assert_eq!(endpoint(&c.config), "u@db1:6000,db2:6000/d");
    let hosts = &c.tls.plan.hosts;
    assert_eq!(host_endpoint(&c.config, &hosts[1]), "u@db2:6000/d");
    let c = resolve_with(Some("hostaddr=127.0.0.1 port=7 user=u dbname=d"), &[]).unwrap();
    assert_eq!(
        host_endpoint(&c.config, &c.tls.plan.hosts[0]),
        "u@127.0.0.1:7/d"
    );
}

#[test]
fn application_name_fits_namedatalen() {
    assert_eq!(application_name("web-1", 42), "leaderrun@web-1:42");
    let long = "h".repeat(100);
    let name = application_name(&long, 4_194_304);
    assert_eq!(name.len(), 63);
    assert!(name.ends_with(":4194304"));
    let multibyte = "ü".repeat(40);
    let name = application_name(&multibyte, 1);
    assert!(name.len() <= 63);
}

/// The OS user is the name of the effective uid's password entry; a uid without one is refused
/// (psql: "local user with ID N does not exist"), never replaced by `$USER` or `postgres`.
#[test]
fn the_os_user_is_the_uids_password_entry_and_none_is_refused() {
    let me = nix::unistd::geteuid();
    if let Ok(Some(entry)) = nix::unistd::User::from_uid(me) {
        assert_eq!(os_user(me).unwrap(), entry.name);
    }
    let stranger = nix::unistd::Uid::from_raw(3_999_999_999);
    assert!(matches!(nix::unistd::User::from_uid(stranger), Ok(None)));
    let err = os_user(stranger).unwrap_err().to_string();
    assert!(
        err.starts_with("local user with ID 3999999999 does not exist"),
        "{err}"
    );
    assert!(err.contains("PGUSER"), "{err}");
}

/// Found by running the same inputs through psql (libpq 15) and leaderrun against real
/// servers: a keyword value ends at C's white space only, as libpq's `isspace` in the C
/// locale; a no-break space stays in the value (psql then asks for the user `u\u{a0}dbname=d`,
/// where leaderrun connected as `u` to `d`).
#[test]
fn keyword_values_end_at_c_white_space_only() {
    let c = resolve_with(Some("host=h user=u\u{a0}dbname=d"), &[]).unwrap();
    assert_eq!(c.config.get_user(), Some("u\u{a0}dbname=d"));
    assert_eq!(c.database_from, "default");
    let c = resolve_with(Some("host=h user=u\u{2003}dbname=d"), &[]).unwrap();
    assert_eq!(c.config.get_user(), Some("u\u{2003}dbname=d"));
    // C's own: blank, tab, newline, vertical tab, form feed, carriage return.
    for blank in [" ", "\t", "\n", "\u{b}", "\u{c}", "\r"] {
        let c = resolve_with(Some(&format!("host=h{blank}user=u{blank}dbname=d")), &[]).unwrap();
        assert_eq!(
            (c.config.get_user(), c.config.get_dbname()),
            (Some("u"), Some("d")),
            "{blank:?}"
        );
    }
}

/// A URL's query as libpq reads it (conninfo_uri_parse_params): a second `=` in a parameter
/// is refused (`?options=-c%20x=y`; leaderrun took it), `ssl=true` is `sslmode=require`
/// (leaderrun refused it as an unknown option), and a bracketed address is percent-decoded
/// like every other host.
#[test]
fn url_parameters_as_libpq_reads_them() {
    for url in [
        "postgresql://u@h/d?application_name=a=b",
        "postgresql://u@h/d?options=-c%20search_path=x",
        "postgresql://u:secret@h/d?password=a=b",
    ] {
        let err = resolve_with(Some(url), &[]).unwrap_err();
        assert!(err.to_string().contains("a second '='"), "{url}: {err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    let c = resolve_with(Some("postgresql://u@h/d?options=-c%20search_path%3Dx"), &[]).unwrap();
    assert_eq!(c.config.get_options(), Some("-c search_path=x"));
    let c = resolve_with(Some("postgresql://u@h/d?ssl=true"), &[]).unwrap();
    assert_eq!(c.tls.mode, SslMode::Require);
    let c = resolve_with(Some("postgresql://u@h/d?ssl=true&sslmode=verify-ca"), &[]).unwrap();
    assert_eq!(c.tls.mode, SslMode::VerifyCa);
    for url in ["postgresql://u@h/d?ssl=false", "postgresql://u@h/d?ssl=1"] {
        let err = resolve_with(Some(url), &[]).unwrap_err();
        assert!(
            err.to_string().contains("invalid connection option"),
            "{url}: {err}"
        );
    }
    // A keyword/value DSN has no `ssl`.
    assert!(resolve_with(Some("host=h ssl=true"), &[]).is_err());
    let c = resolve_with(Some("postgresql://u@[%3A%3A1]:6000/d"), &[]).unwrap();
    assert_eq!(describe(&c.config), "host=::1 port=6000 dbname=d user=u");
}

/// A URL's errors quote its keywords and values unless it holds a password, wherever the
/// password is (`user:password@`, `?password=`, a percent-encoded key): a user alone holds
/// none. Before, any `@` hid them ("invalid connection option (not shown: the DSN holds a
/// password)" for `postgres://app@db/x?bogus=1`).
#[test]
fn a_url_with_a_user_and_no_password_quotes_what_is_wrong() {
    for (url, says) in [
        ("postgresql://app@h/d?bogus=1", "\"bogus\""),
        ("postgresql://app@h/d?sslmode=nope", "\"nope\""),
        ("postgresql://app:@h/d?bogus=1", "\"bogus\""),
    ] {
        let err = resolve_with(Some(url), &[]).unwrap_err().to_string();
        assert!(err.contains(says), "{url}: {err}");
    }
    for url in [
        "postgresql://app:s3cret@h/d?bogus=1",
        "postgresql://app@h/d?password=s3cret&bogus=1",
        "postgresql://app@h/d?%70assword=s3cret&bogus=1",
        "postgresql://app@h/d?%70assword=s3cret&sslmode=s3cret",
    ] {
        let err = resolve_with(Some(url), &[]).unwrap_err().to_string();
        assert!(
            err.contains("not shown") || err.contains("the value"),
            "{url}: {err}"
        );
        assert!(
            !err.contains("bogus") && !err.contains("s3cret"),
            "{url}: {err}"
        );
    }
}

/// A service file's section header as libpq matches it (the name, then `]`; the rest of the
/// line plays no part), and an empty service name is a name. Before, `[plex] # comment` was no
/// header of `plex`, so leaderrun took the system-wide file's `[plex]`: another server, user
/// and database than psql's.
#[test]
fn service_headers_and_empty_names_as_libpq_reads_them() {
    let dir = std::env::temp_dir().join(format!("leaderrun-svc-hdr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("services.conf");
    std::fs::write(
        dir.join("pg_service.conf"),
        "[plex]\nhost=system-host\ndbname=sysdb\n[]\nhost=system-empty\ndbname=e\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let d = dir.to_str().unwrap();
    let vars = [("PGSERVICEFILE", f), ("PGSYSCONFDIR", d)];
    for header in ["[plex] # the main one", "[plex]x", "  [plex]\t", "[plex]]"] {
        std::fs::write(
            &file,
            format!("[plexx]\nhost=no\n{header}\nhost=user-host\ndbname=db\n"),
        )
        .unwrap();
        let c = resolve_with(Some("service=plex user=u"), &vars).unwrap();
        assert_eq!(
            describe(&c.config),
            "host=user-host port=5432 dbname=db user=u",
            "{header:?}"
        );
    }
    std::fs::write(&file, "[plexx]\nhost=no\n[ plex]\nhost=no\n").unwrap();
    let c = resolve_with(Some("service=plex user=u"), &vars).unwrap();
    assert_eq!(
        describe(&c.config),
        "host=system-host port=5432 dbname=sysdb user=u"
    );
    // `service=''` and `PGSERVICE=` name the section `[]`, else no service is found.
    let c = resolve_with(Some("service='' user=u"), &vars).unwrap();
    assert_eq!(
        describe(&c.config),
        "host=system-empty port=5432 dbname=e user=u"
    );
    let c = resolve_with(Some("user=u"), &[vars[0], vars[1], ("PGSERVICE", "")]).unwrap();
    assert_eq!(
        describe(&c.config),
        "host=system-empty port=5432 dbname=e user=u"
    );
    let none = [("PGSERVICEFILE", f), ("PGSYSCONFDIR", "/nonexistent")];
    for (dsn, vars) in [
        ("host=h dbname=d service=", &none[..]),
        ("postgresql://h/d?service=", &none[..]),
        (
            "host=h dbname=d",
            &[none[0], none[1], ("PGSERVICE", "")][..],
        ),
    ] {
        let err = resolve_with(Some(dsn), vars).unwrap_err();
        assert!(
            err.to_string()
                .contains("definition of service \"\" not found"),
            "{dsn}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `hostaddr` list with no host names counts the hosts, as libpq counts them: leaderrun
/// refused it ("could not match 1 host names to 2 hostaddr values"), where psql connects.
#[test]
fn a_hostaddr_list_needs_no_host_names() {
    for dsn in [
        "hostaddr=127.0.0.1,::1 port=6000,6001 user=u dbname=d",
        "host='' hostaddr=127.0.0.1,::1 port=6000,6001 user=u dbname=d",
    ] {
        let c = resolve_with(Some(dsn), &[]).unwrap();
        let hosts: Vec<_> = c
            .tls
            .plan
            .hosts
            .iter()
            .map(|h| (h.address.clone(), h.port))
            .collect();
        assert_eq!(
            hosts,
            [
                (
                    Address::Tcp {
                        name: String::new(),
                        addr: Some("127.0.0.1".parse().unwrap())
                    },
                    6000
                ),
                (
                    Address::Tcp {
                        name: String::new(),
                        addr: Some("::1".parse().unwrap())
                    },
                    6001
                ),
            ],
            "{dsn}"
        );
    }
    let c = resolve_with(
        Some("hostaddr=127.0.0.1,::1 port=6000 user=u dbname=d"),
        &[],
    )
    .unwrap();
    assert_eq!(c.tls.plan.hosts.len(), 2);
    // Names, when given, are as many as the addresses (libpq's error).
    let err = resolve_with(Some("host=a hostaddr=127.0.0.1,::1 user=u dbname=d"), &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("could not match 1 host names to 2 hostaddr values"),
        "{err}"
    );
    let err = resolve_with(
        Some("hostaddr=127.0.0.1,::1 port=1,2,3 user=u dbname=d"),
        &[],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("could not match 3 port numbers to 2 hosts"),
        "{err}"
    );
}

/// libpq's integers are C `int`s: `connect_timeout=2147483648` is "invalid integer value"
/// there, and was a timeout of 68 years here.
#[test]
fn integer_settings_fit_a_c_int() {
    let c = resolve_with(Some("host=h dbname=d connect_timeout=2147483647"), &[]).unwrap();
    assert_eq!(
        c.tls.plan.connect_timeout,
        Some(Duration::from_secs(2_147_483_647))
    );
    for value in ["2147483648", "99999999999", "-2147483649"] {
        let err = resolve_with(
            Some(&format!("host=h dbname=d connect_timeout={value}")),
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("invalid connect_timeout"),
            "{value}: {err}"
        );
    }
    let c = resolve_with(Some("host=h dbname=d port='\u{b}6000\t'"), &[]).unwrap();
    assert_eq!(c.config.get_ports(), [6000]);
}

/// TLS files as libpq reads them (initialize_SSL): a named root that does not exist is an
/// error for `verify-ca`/`verify-full` and no check at all for `prefer`/`require` (leaderrun
/// refused the session); a client certificate that does not exist is none; one that exists
/// needs its key (`~/.postgresql/postgresql.key` unless named), which is read, not skipped.
#[test]
fn tls_files_that_do_not_exist_as_libpq_reads_them() {
    let home = [("HOME", "/nonexistent-home")];
    for mode in ["prefer", "require"] {
        let c = resolve_with(
            Some(&format!(
                "host=h dbname=d sslmode={mode} sslrootcert=/nonexistent/root.crt"
            )),
            &home,
        )
        .unwrap();
        assert_eq!(c.tls.root_cert, None, "{mode}");
    }
    for mode in ["verify-ca", "verify-full"] {
        let c = resolve_with(
            Some(&format!(
                "host=h dbname=d sslmode={mode} sslrootcert=/nonexistent/root.crt"
            )),
            &home,
        )
        .unwrap();
        assert_eq!(
            c.tls.root_cert,
            Some("/nonexistent/root.crt".into()),
            "{mode}"
        );
        assert!(c.tls.connector().is_err(), "{mode}");
    }
    let c = resolve_with(
        Some("host=h dbname=d sslcert=/nonexistent/c.crt sslkey=/nonexistent/c.key"),
        &home,
    )
    .unwrap();
    assert_eq!((c.tls.client_cert, c.tls.client_key), (None, None));
    let dir = std::env::temp_dir().join(format!("leaderrun-tlsfiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = dir.join("c.crt");
    std::fs::write(&cert, "not read here").unwrap();
    let c = resolve_with(
        Some(&format!("host=h dbname=d sslcert={}", cert.display())),
        &home,
    )
    .unwrap();
    assert_eq!(
        (c.tls.client_cert.clone(), c.tls.client_key.clone()),
        (
            Some(cert.clone()),
            Some("/nonexistent-home/.postgresql/postgresql.key".into())
        )
    );
    assert!(c.tls.connector().is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// libpq 14 reads a host that starts with `@` as a Unix socket in the abstract namespace
/// (psql connects); leaderrun took it for a host name, whose lookup failed, so a list went on to
/// its next host. Refused as not supported; with `hostaddr` it is only a name, as in libpq.
#[test]
fn an_abstract_socket_host_is_refused_as_unsupported() {
    for dsn in [
        "host=@pg port=6000 user=u dbname=d",
        "host=@pg,db port=6000 user=u dbname=d",
        "postgresql://u@%40pg:6000/d",
    ] {
        let err = resolve_with(Some(dsn), &[]).unwrap_err();
        assert!(
            matches!(err, ConnInfoError::Unsupported { .. })
                && err.to_string().contains("abstract namespace"),
            "{dsn}: {err}"
        );
    }
    let err = resolve_with(Some("user=u dbname=d"), &[("PGHOST", "db,@pg")]).unwrap_err();
    assert!(err.to_string().contains("(from PGHOST"), "{err}");
    let c = resolve_with(Some("host=@pg hostaddr=127.0.0.1 user=u dbname=d"), &[]).unwrap();
    assert_eq!(c.tls.plan.hosts.len(), 1);
}
