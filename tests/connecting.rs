//! Connecting as libpq does, through the binary and the library against a real PostgreSQL:
//! failover past a hung host within its `connect_timeout`, `target_session_attrs`, the
//! database that some setting must name, passwords that no error carries, and a Unix socket
//! whatever `sslmode` says.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::libpq::Fake;
use crate::support::proxy::Proxy;
use crate::support::{leaderrun, secs, unique_lock_id, Cluster, Replica, Scratch};

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_hung_first_host_fails_over_within_its_connect_timeout() {
    let cluster = Cluster::shared();
    // The old primary accepts the connection and never answers.
    let hung = Proxy::start(cluster.addr());
    hung.blackhole();
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres connect_timeout=2",
        hung.port(),
        cluster.addr().port()
    );
    let started = Instant::now();
    let out = leaderrun()
        .args([
            "-v",
            "--once",
            "--dsn",
            &dsn,
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The start line names every host with its own port; the grant's, the host it holds on.
    let (first, second) = (hung.port(), cluster.addr().port());
    let line = |needle: &str| {
        text(&out)
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} line: {}", text(&out)))
            .to_owned()
    };
    assert!(
        line("campaigning").contains(&format!(
            "server=postgres@127.0.0.1:{first},127.0.0.1:{second}/postgres "
        )),
        "{}",
        text(&out)
    );
    assert!(
        line("lock acquired").contains(&format!("server=postgres@127.0.0.1:{second}/postgres ")),
        "{}",
        text(&out)
    );
    // One connect_timeout on the first host, then the second leads at once.
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(4500),
        "led after {took:?}: {}",
        text(&out)
    );
}

#[test]
fn target_session_attrs_have_libpq_14_meanings() {
    // A primary whose sessions are read-only by default is still a primary.
    let cluster = Cluster::shared();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (attrs, suits) in [
        ("any", true),
        ("primary", true),
        ("read-only", true),
        ("prefer-standby", true),
        ("read-write", false),
        ("standby", false),
    ] {
        let dsn = format!(
            "{} options='-c default_transaction_read_only=on' target_session_attrs={attrs}",
            cluster.dsn()
        );
        let settings = leaderrun::pg::conninfo::resolve(Some(&dsn), &|_| None).unwrap();
        let result = rt.block_on(leaderrun::elector::connect(
            &settings.config,
            &settings.tls,
            "test",
            Duration::from_secs(5),
        ));
        match result {
            Ok(_) => assert!(suits, "{attrs}: connected"),
            Err(err) => {
                let shown = leaderrun::Chain(&err).to_string();
                assert!(!suits, "{attrs}: {shown}");
                assert!(
                    shown.contains(&format!("the server is not {attrs}")),
                    "{attrs}: {shown}"
                );
            }
        }
    }
}

#[test]
fn a_run_needs_a_setting_that_names_the_database() {
    let cluster = Cluster::shared();
    let port = cluster.addr().port().to_string();
    let id = unique_lock_id().to_string();
    let scratch = tempfile::tempdir().unwrap();
    let services = scratch.path().join("services");
    std::fs::write(
        &services,
        format!("[named]\nhost=127.0.0.1\nport={port}\nuser=postgres\ndbname=postgres\n[unnamed]\nhost=127.0.0.1\nport={port}\nuser=postgres\n"),
    )
    .unwrap();
    let run = |dsn: Option<&str>, env: &[(&str, &str)]| {
        let mut cmd = leaderrun();
        cmd.args(["-v", "--once", "--lock-id", &id]);
        if let Some(dsn) = dsn {
            cmd.args(["--dsn", dsn]);
        }
        cmd.env("PGSERVICEFILE", &services)
            .env("PGSYSCONFDIR", scratch.path())
            .envs(env.iter().copied());
        let out = cmd.args(["--", "true"]).output().unwrap();
        (out.status.code(), text(&out))
    };
    let no_db = format!("host=127.0.0.1 port={port} user=postgres");
    let pg = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", "postgres"),
    ];
    for (dsn, env) in [
        (Some(no_db.as_str()), vec![]),
        (None, pg.to_vec()),
        // An empty LEADERRUN_DSN is not a setting, nor an empty PGDATABASE.
        (None, [pg.to_vec(), vec![("LEADERRUN_DSN", "")]].concat()),
        (None, [pg.to_vec(), vec![("PGDATABASE", "")]].concat()),
        (Some("service=unnamed"), vec![]),
    ] {
        let (code, out) = run(dsn, &env);
        assert_eq!(code, Some(125), "{dsn:?} {env:?}: {out}");
        assert!(
            out.contains("no setting names the database")
                && out.contains("PGDATABASE")
                && out.contains("dbname"),
            "{out}"
        );
    }
    let with_db = format!("{no_db} dbname=postgres");
    for (dsn, env, from) in [
        (Some(with_db.as_str()), vec![], "dsn_from=--dsn"),
        (
            None,
            [pg.to_vec(), vec![("PGDATABASE", "postgres")]].concat(),
            "dsn_from=PG*",
        ),
        (
            None,
            vec![("LEADERRUN_DSN", with_db.as_str())],
            "dsn_from=LEADERRUN_DSN",
        ),
        (
            None,
            vec![("LEADERRUN_DSN", ""), ("PLEXSPHERE_DSN", with_db.as_str())],
            "dsn_from=PLEXSPHERE_DSN",
        ),
        (
            None,
            vec![("DATABASE_URL", with_db.as_str())],
            "dsn_from=DATABASE_URL",
        ),
        (Some("service=named"), vec![], "dsn_from=--dsn"),
        (None, vec![("PGSERVICE", "named")], "dsn_from=PG*"),
    ] {
        let (code, out) = run(dsn, &env);
        assert_eq!(code, Some(0), "{dsn:?} {env:?}: {out}");
        let start = out
            .lines()
            .find(|l| l.contains("campaigning for"))
            .unwrap_or_else(|| panic!("no start line: {out}"));
        assert!(start.contains(from), "{from}: {start}");
    }
}

/// Every run of 4 characters of `password`.
fn fragments(password: &str) -> Vec<String> {
    let chars: Vec<char> = password.chars().collect();
    chars
        .windows(4)
        .map(|w| w.iter().collect::<String>())
        .collect()
}

/// A DSN, variables, and the password it carries.
type Input<'a> = (String, Vec<(&'a str, String)>, &'a str);

#[test]
fn no_error_carries_any_part_of_a_password() {
    let fake = Fake::start();
    let dir = fake.dir.path().to_owned();
    let (a, r) = (fake.a, fake.r);
    let pgpass = dir.join("pgpass");
    std::fs::write(&pgpass, "*:*:*:*:Pf7Kq2Wv\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let services = dir.join("services");
    std::fs::write(
        &services,
        format!("[bad]\nhost=127.0.0.1\nport={a}\ndbname=d\npassword=Sv3Xn8Lq\nSv3Xn8Lq\n[badkey]\npassword=Kb4Rt7Zm\nKb4Rt7Zm=1\n"),
    )
    .unwrap();
    // (DSN, environment, password): each goes through a different error path.
    let cases: Vec<Input> = vec![
        // Malformed URLs and DSNs around a password.
        ("postgresql://u:Qz8?Vk3w@127.0.0.1:notaport/d".to_owned(), vec![], "Qz8?Vk3w"),
        (format!("postgresql://u:Hy6Tm4Rc@127.0.0.1:{a}/d?&&x=1"), vec![], "Hy6Tm4Rc"),
        (format!("postgresql://u:Jw2Np9Ds@127.0.0.1:{a}/d?Jw2Np9Ds"), vec![], "Jw2Np9Ds"),
        (format!("postgresql://u:Lm5%zzBx@127.0.0.1:{a}/d"), vec![], "Lm5%zzBx"),
        (format!("postgresql://u:Ce7Gh3Ua@127.0.0.1:{a}/d?Ce7Gh3Ua=1"), vec![], "Ce7Gh3Ua"),
        (format!("postgresql://u:Fo1Ij5Ye@127.0.0.1:{a}/d?sslmode=Fo1Ij5Ye"), vec![], "Fo1Ij5Ye"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d password=Tq4 Wz6Ep"), vec![], "Tq4 Wz6Ep"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d password=Nu8Ak2Ho Nu8Ak2Ho=x"), vec![], "Nu8Ak2Ho"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d password='Rb3Ys7Mi"), vec![], "Rb3Ys7Mi"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d password=Gd9Vc1Pt connect_timeout=Gd9Vc1Pt"), vec![], "Gd9Vc1Pt"),
        ("host=127.0.0.1 port=Xe5Bl8Qo user=u dbname=d password=Xe5Bl8Qo".to_owned(), vec![], "Xe5Bl8Qo"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d password=Wa2Ku6Zr hostaddr=Wa2Ku6Zr"), vec![], "Wa2Ku6Zr"),
        ("service=bad".to_owned(), vec![("PGSERVICEFILE", services.display().to_string())], "Sv3Xn8Lq"),
        ("service=badkey".to_owned(), vec![("PGSERVICEFILE", services.display().to_string())], "Kb4Rt7Zm"),
        // Nothing listens.
        (format!("host=127.0.0.1 port={r} user=u dbname=d password=Ob6Dj3Wn"), vec![], "Ob6Dj3Wn"),
        (format!("postgresql://u:Ip4%3FEs9@127.0.0.1:{r}/d"), vec![], "Ip4?Es9"),
        // The server refuses the password (explicit, PGPASSWORD, .pgpass).
        (format!("postgresql://u:Uh8?Ml2Ta@127.0.0.1:{a}/d"), vec![], "Uh8?Ml2Ta"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d"), vec![("PGPASSWORD", "Yc5Nf1Gs".to_owned())], "Yc5Nf1Gs"),
        (format!("host=127.0.0.1 port={a} user=u dbname=d"), vec![("PGPASSFILE", pgpass.display().to_string())], "Pf7Kq2Wv"),
    ];
    let mut checked = 0;
    for (dsn, env, password) in &cases {
        for args in [
            vec!["--once", "--", "true"],
            vec!["status"],
            vec!["doctor"],
            vec!["step-down"],
        ] {
            for via_env in [false, true] {
                let mut cmd = leaderrun();
                cmd.env("HOME", &dir).env("PGSYSCONFDIR", &dir);
                for (k, v) in env {
                    cmd.env(k, v);
                }
                if via_env {
                    cmd.env("LEADERRUN_DSN", dsn);
                } else {
                    cmd.args(["--dsn", dsn]);
                }
                let out = cmd.args(["-vv"]).args(&args).output().unwrap();
                let shown = text(&out);
                assert_ne!(out.status.code(), Some(0), "{dsn} {args:?}: {shown}");
                for part in fragments(password) {
                    assert!(
                        !shown.contains(&part),
                        "{args:?} with {dsn:?} shows {part:?} of the password:\n{shown}"
                    );
                }
                checked += 1;
            }
        }
    }
    // The server saw the refused passwords whole: they were sent, and not shown.
    let seen = fake.passwords();
    for password in ["Uh8?Ml2Ta", "Yc5Nf1Gs", "Pf7Kq2Wv"] {
        assert!(
            seen.iter().any(|(_, p)| p.as_deref() == Some(password)),
            "{password} never reached the server: {seen:?}"
        );
    }
    assert_eq!(checked, cases.len() * 8);
}

#[test]
fn leaderrun_knows_its_sessions_whatever_their_application_name() {
    use crate::support::{wait_for, Replica};
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let start = || {
        let mut cmd = leaderrun();
        cmd.env("PGAPPNAME", "psqlish")
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
            .args(["--check-interval", "1s", "--", "sleep", "60"]);
        Replica::spawn(cmd)
    };
    let leader = start();
    leader.wait_log(
        "background leader lock acquired",
        1,
        Duration::from_secs(10),
    );
    let standby = start();
    wait_for(
        "the standby in the lock queue",
        Duration::from_secs(10),
        || (cluster.waiters(id) == 1).then_some(()),
    );
    let out = crate::support::status(cluster, id, true);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &report["leader"];
    assert_eq!(l["application_name"], "psqlish", "{report}");
    assert_eq!(l["leaderrun"], true, "{report}");
    assert_eq!(l["leaderrun_pid"], leader.pid(), "{report}");
    let s = &report["standbys"][0];
    assert_eq!(s["leaderrun"], true, "{report}");
    assert_eq!(s["leaderrun_pid"], standby.pid(), "{report}");
    let table =
        String::from_utf8_lossy(&crate::support::status(cluster, id, false).stdout).into_owned();
    assert!(
        table.contains(&format!("leaderrun pid {}", leader.pid())),
        "{table}"
    );
    let out = crate::support::step_down(cluster, id);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    standby.wait_log(
        "background leader lock acquired",
        1,
        Duration::from_secs(10),
    );
}

#[test]
fn a_unix_socket_connects_without_tls_whatever_sslmode_says() {
    let cluster = Cluster::shared();
    for mode in ["prefer", "require"] {
        let dsn = format!(
            "host={} port={} user=postgres dbname=postgres sslmode={mode}",
            cluster.socket_dir().display(),
            cluster.addr().port()
        );
        let out = leaderrun()
            .args([
                "--once",
                "--dsn",
                &dsn,
                "--lock-id",
                &unique_lock_id().to_string(),
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The physical floor of a one-shot is a connect plus about one round trip (BENCHMARKS.md):
/// its check travels with the session's set-up (timers pinned, statements prepared, the try),
/// so after the startup a direct lock session carries three flights in all: set-up with the
/// try, the unlock, and the Terminate. Counted on the wire, through a recording proxy (which
/// makes the session indirect: one flight more).
#[test]
fn a_one_shot_tries_in_the_set_up_flight() {
    let cluster = Cluster::shared();
    let proxy = Proxy::recording(cluster.addr());
    let marker = std::env::temp_dir().join(format!("leaderrun-flights-{}", unique_lock_id()));
    let out = leaderrun()
        .args([
            "--once",
            "--dsn",
            &format!("{} sslmode=disable", proxy.dsn()),
            "--lock-id",
            &unique_lock_id().to_string(),
            "--",
            "touch",
            marker.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(marker.exists(), "COMMAND ran");
    let _ = std::fs::remove_file(&marker);
    // Startup, set-up with the try, unlock, Terminate. Through a proxy the server sees
    // another address than the socket's, so the session is not direct
    // (docs/field-notes.md#transaction-mode-poolers-move-the-session): its first try takes
    // nothing there, the lock is tried again guarded (one flight more), and the grant is tested
    // with a second session three times, each right after a statement of the lock session
    // (three flights more on each: startup, three tests and Terminate on the second). The last flights may reach the proxy after leaderrun
    // exited: the counts are read until they are the expected ones or 5 s passed.
    let deadline = Instant::now() + Duration::from_secs(5);
    let flights = loop {
        let flights = proxy.client_flights();
        if flights == [8, 5] || Instant::now() > deadline {
            break flights;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(flights, [8, 5], "client flights per connection");
}

/// A host list whose primary is down leads nowhere on the standby that answers, and once the
/// primary is back the next check connects from the first host again, as libpq would, and
/// leads there; the refusal names the standby it reached, not the list.
#[test]
fn a_host_list_leaves_a_hot_standby_once_the_primary_is_back() {
    use crate::support::{secs, Replica, Scratch};
    let primary = Cluster::start_private();
    let Some(standby) = Cluster::standby_of(
        &primary,
        "connecting::a_host_list_leaves_a_hot_standby_once_the_primary_is_back",
    ) else {
        return;
    };
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        primary.addr().port(),
        standby.addr().port()
    );
    primary.stop();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "200ms", "--"])
        .arg(&job);
    let replica = Replica::spawn(cmd);
    replica.wait_log("is in recovery", 2, secs(10.0));
    assert!(scratch.starts().is_empty(), "led on a standby");
    assert!(
        replica.log().contains(&format!(
            "server postgres@127.0.0.1:{}/postgres is in recovery",
            standby.addr().port()
        )),
        "{}",
        replica.log()
    );
    primary.start();
    let led = scratch.wait_starts(1, secs(15.0))[0].clone();
    assert_eq!(
        primary.sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {}",
            led.backend_pid
        )),
        ["1"],
        "led elsewhere than on the primary"
    );
}

/// A host of the list that cannot take connections now (SQLSTATE 57P03: a server shutting
/// down, as here, or starting up, or a standby with `hot_standby` off) passes the turn to the
/// next host, as libpq's does; before, its answer ended the whole list (the one-shot exited 125
/// after its retries, a standby never led). Alone, it stays the answer.
#[test]
fn a_host_that_cannot_take_connections_now_passes_the_turn() {
    use crate::support::wait_for;
    let closing = Cluster::start_private();
    let open = Cluster::shared();
    // A smart shutdown waits for this session's end, and refuses new sessions meanwhile.
    let mut session = closing.psql_session();
    wait_for("the psql session", secs(10.0), || {
        (closing.client_backends().len() == 1).then_some(())
    });
    closing.begin_smart_shutdown();
    let refused = |dsn: &str| {
        let out = std::process::Command::new(closing.psql_path())
            .args(["-X", "-A", "-t", "-c", "SELECT 1", dsn])
            .output()
            .expect("run psql");
        String::from_utf8_lossy(&out.stderr).contains("shutting down")
    };
    wait_for("the server to refuse new sessions", secs(10.0), || {
        refused(&closing.dsn()).then_some(())
    });
    let id = unique_lock_id().to_string();
    let run = |dsn: &str| {
        leaderrun()
            .args(["--dsn", dsn, "--lock-id", &id, "--check-interval", "300ms"])
            .args(["-E", "3", "--once", "--", "sh", "-c", "echo led"])
            .output()
            .expect("run leaderrun")
    };
    let list = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        closing.addr().port(),
        open.addr().port()
    );
    let out = run(&list);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim()
        ),
        (Some(0), "led"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // When no host of the list answers, the server that cannot take connections now is the
    // error told (a one-shot tries again soon on it), not the next host's refusal.
    let fake = Fake::start();
    let out = run(&format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        closing.addr().port(),
        fake.r
    ));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("57P03"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&closing.dsn());
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("57P03"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = session.kill();
    let _ = session.wait();
}

/// A resolver that never answers holds up no stop request: INT/TERM while a host name is
/// looked up ends leaderrun at once (exit 0, as a stopped standby), whether the name is the
/// DSN's host (a continuous run, a one-shot) or `--http-addr`'s (looked up at start-up, where
/// a stop request is acted on). Before, the lookup ran on a blocking thread that the runtime
/// waited for at exit, and `--http-addr`'s while the command line was parsed with every signal
/// blocked: the stop took as long as the resolver took to give up (30 s here, no answer at
/// all). Each run gets a mount namespace of its own whose `/etc/resolv.conf` names a UDP
/// socket of this test that reads queries and never answers (root only). `status`, whose
/// connect gave up after its `connect_timeout`, exits then too.
#[test]
fn a_resolver_that_never_answers_holds_up_no_stop() {
    use std::ffi::CString;
    use std::os::unix::process::CommandExt;

    const TEST: &str = "connecting::a_resolver_that_never_answers_holds_up_no_stop";
    if !nix::unistd::geteuid().is_root() {
        crate::support::cluster::skip(TEST, "needs root for a mount namespace of its own");
        return;
    }
    let scratch = crate::support::Scratch::new();
    // Port 53 of a loopback address no resolver uses.
    let hole = (0..50)
        .find_map(|_| {
            let ip = format!("127.{}.{}.{}", fastrand::u8(1..255), fastrand::u8(..), 53);
            std::net::UdpSocket::bind((ip.as_str(), 53)).ok()
        })
        .expect("a loopback address with port 53 free");
    hole.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let conf = scratch.file("resolv.conf");
    std::fs::write(
        &conf,
        format!(
            "nameserver {}\noptions timeout:30 attempts:1\n",
            hole.local_addr().unwrap().ip()
        ),
    )
    .unwrap();
    let conf = CString::new(conf.to_str().unwrap()).unwrap();
    let cluster = Cluster::shared();
    let name = "leaderrun-test-resolver.example";
    let by_ip = cluster.dsn();
    let by_name = format!("host={name} port=5432 dbname=postgres user=postgres");
    let cases: [(&str, &[&str], libc::c_int); 3] = [
        (
            "the DSN's host, continuous",
            &["--dsn", &by_name],
            libc::SIGTERM,
        ),
        (
            "the DSN's host, --once",
            &["--once", "--dsn", &by_name],
            libc::SIGINT,
        ),
        (
            "--http-addr",
            &["--dsn", &by_ip, "--http-addr", &format!("{name}:9464")],
            libc::SIGTERM,
        ),
    ];
    let in_own_mounts = |cmd: &mut std::process::Command| {
        let conf = conf.clone();
        // SAFETY: unshare and mount only, async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let ok = libc::unshare(libc::CLONE_NEWNS) == 0
                    && libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) == 0
                    && libc::mount(
                        conf.as_ptr(),
                        c"/etc/resolv.conf".as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) == 0;
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    };
    // Root in a container may still be refused a mount namespace.
    let mut probe = std::process::Command::new("true");
    in_own_mounts(&mut probe);
    if let Err(err) = probe.status() {
        crate::support::cluster::skip(TEST, &format!("no mount namespace: {err}"));
        return;
    }
    for (what, args, sig) in cases {
        // Queries of an earlier case still arriving.
        let mut buf = [0u8; 512];
        while hole.recv(&mut buf).is_ok() {}
        let mut cmd = leaderrun();
        cmd.args(args)
            .args(["--lock-id", &unique_lock_id().to_string(), "--", "true"]);
        in_own_mounts(&mut cmd);
        let mut replica = crate::support::Replica::spawn(cmd);
        crate::support::wait_for(
            &format!("{what}: a query at the resolver"),
            crate::support::secs(10.0),
            || hole.recv(&mut buf).ok(),
        );
        let sent = Instant::now();
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(replica.pid(), sig) };
        let status = replica.wait_exit(crate::support::secs(5.0));
        assert_eq!(
            status.code(),
            Some(0),
            "{what}: {status:?} {:?} after the stop\n{}",
            sent.elapsed(),
            replica.log()
        );
    }
    // A subcommand whose connect timed out exits then, not when the lookup ends.
    let mut cmd = leaderrun();
    cmd.args(["status", "--dsn", &format!("{by_name} connect_timeout=1")])
        .args(["--lock-id", &unique_lock_id().to_string()]);
    in_own_mounts(&mut cmd);
    let mut status = crate::support::Replica::spawn(cmd);
    let exit = status.wait_exit(crate::support::secs(5.0));
    assert_eq!(exit.code(), Some(125), "{exit:?}\n{}", status.log());
}

/// A host name's lookup that cannot start a thread (`RLIMIT_NPROC` reached, as when COMMAND
/// filled the user's process limit) is a failed attempt at that host, with the reason, tried
/// again at the next check; once there is room the name resolves and the replica leads. Before,
/// tokio's `spawn_blocking` panicked ("OS can't spawn worker thread"): the election stopped
/// with exit 125 at the first check. leaderrun runs as a uid of its own limited to one task,
/// so no thread or fork of its own can start, whatever start-up did before the first check;
/// the test then raises the limit from outside (`prlimit`).
#[test]
fn a_name_lookup_without_a_thread_is_a_failed_attempt() {
    const TEST: &str = "connecting::a_name_lookup_without_a_thread_is_a_failed_attempt";
    const UID: u32 = 54_322;
    let scratch = crate::support::Scratch::new();
    let Some(mut cmd) = crate::support::leaderrun_as(&scratch, TEST, UID, (1, 64)) else {
        return;
    };
    let dsn = format!(
        "host=localhost port={} user=postgres dbname=postgres",
        Cluster::shared().addr().port()
    );
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "200ms", "--", "echo", "led"]);
    let mut replica = crate::support::Replica::spawn(cmd);
    replica.wait_log(
        "cannot resolve localhost: no thread for the lookup: Resource temporarily unavailable",
        2,
        crate::support::secs(10.0),
    );
    let log = replica.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(replica.running(), "{log}");
    // Room for the thread, the watchdog and COMMAND: the soft limit raised to the hard one, by
    // a process of the same uid and gid (this test lacks CAP_SYS_RESOURCE where a container
    // drops it); its own limit is this test's, so it runs beside leaderrun's one task.
    let pid = replica.pid();
    let room = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    let mut raise = std::process::Command::new("true");
    // SAFETY: setgroups, setgid, setuid and prlimit only, async-signal-safe, between fork
    // and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut raise, move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(UID) != 0
                || libc::setuid(UID) != 0
                || libc::prlimit(pid, libc::RLIMIT_NPROC, &room, std::ptr::null_mut()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let raised = raise.status().expect("raise leaderrun's RLIMIT_NPROC");
    assert!(raised.success(), "{raised:?}");
    let status = replica.wait_exit(crate::support::secs(15.0));
    let log = replica.log();
    assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
    assert_eq!(replica.stdout(), "led\n", "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A fake server that answers every startup with AuthenticationOk and then sends one kind of
/// message without end (never `ReadyForQuery`), until the client goes.
struct FloodServer {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FloodServer {
    fn start(message: Vec<u8>) -> FloodServer {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        // A batch of the message: one write carries many.
        let batch = std::sync::Arc::new(message.repeat((64 * 1024 / message.len()).max(1)));
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let batch = batch.clone();
                let stopped = stopped.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    loop {
                        let mut len = [0u8; 4];
                        if stream.read_exact(&mut len).is_err() {
                            return;
                        }
                        let len = u32::from_be_bytes(len) as usize;
                        if !(8..=10_000).contains(&len) {
                            return;
                        }
                        let mut body = vec![0; len - 4];
                        if stream.read_exact(&mut body).is_err() {
                            return;
                        }
                        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
                        if code == 80_877_103 || code == 80_877_104 {
                            if stream.write_all(b"N").is_err() {
                                return;
                            }
                            continue;
                        }
                        break;
                    }
                    // AuthenticationOk, then the flood.
                    if stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0]).is_err() {
                        return;
                    }
                    while !stopped.load(Ordering::Relaxed) && stream.write_all(&batch).is_ok() {}
                });
            }
        });
        FloodServer { port, stop }
    }

    fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=u dbname=d sslmode=disable",
            self.port
        )
    }
}

impl Drop for FloodServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A backend message: its tag, its length, its body.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// What listens on the port sends notices or `ParameterStatus` messages without end after the
/// authentication: tokio-postgres keeps every one of them until the session is ready, so
/// leaderrun grew by hundreds of MB a second until the attempt's time ran out (1.9 GB in 5 s).
/// Now the attempt fails once the server has sent more than `STARTUP_BYTES`, at once and in a
/// few MB.
#[test]
fn a_server_that_floods_the_startup_is_cut_off_in_bounded_memory() {
    let notice = message(
        b'N',
        &[b"SNOTICE\0C00000\0M".as_slice(), &[b'y'; 1000], b"\0\0"].concat(),
    );
    // Every name new, as a map of parameters keeps each one.
    let mut parameters = Vec::new();
    for i in 0..300 {
        parameters.extend(message(
            b'S',
            format!("p{i:06}\0{}\0", "x".repeat(200)).as_bytes(),
        ));
    }
    for (what, flood) in [("notices", notice), ("parameters", parameters)] {
        let server = FloodServer::start(flood);
        let mut child = leaderrun()
            .args(["--once", "--check-interval", "20s", "--dsn", &server.dsn()])
            .args(["--", "true"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = Instant::now();
        let mut peak_kb = 0u64;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            let rss_kb = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
                })
                .unwrap_or(0);
            peak_kb = peak_kb.max(rss_kb);
            if peak_kb > 200 * 1024 || started.elapsed() > Duration::from_secs(15) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what}: leaderrun grew to {} MB in {:?} and was killed",
                    peak_kb / 1024,
                    started.elapsed()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut log = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
        assert_eq!(status.code(), Some(125), "{what}: {log}");
        assert!(
            log.contains("before the session was ready"),
            "{what}: {log}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: {:?}: {log}",
            started.elapsed()
        );
    }
}

/// The password file is read again before every connection after the first, as libpq reads
/// it at every connection: a password rotated in the file (by an agent, a mounted secret)
/// together with the role's is used from the next reconnect on. Before, the password read
/// at start was sent for good: once the server ended the session, every check failed with
/// 28P01 until leaderrun was restarted, while psql connected with the same file.
#[test]
fn a_password_rotated_in_the_password_file_is_used_at_the_next_connection() {
    let cluster = Cluster::shared();
    cluster.require_password("rotuser", "first-pw");
    let scratch = Scratch::new();
    let passfile = scratch.file("pgpass");
    let port = cluster.addr().port();
    let write = |password: &str| {
        std::fs::write(
            &passfile,
            format!("127.0.0.1:{port}:*:rotuser:{password}\n"),
        )
        .unwrap();
        let mut perms = std::fs::metadata(&passfile).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
        std::fs::set_permissions(&passfile, perms).unwrap();
    };
    write("first-pw");
    let script = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.env("PGPASSFILE", &passfile).args([
        "--dsn",
        &format!("host=127.0.0.1 port={port} user=rotuser dbname=postgres"),
        "--lock-id",
        &unique_lock_id().to_string(),
        "--check-interval",
        "200ms",
        "--",
        script.to_str().unwrap(),
    ]);
    let mut leader = Replica::spawn(cmd);
    scratch.wait_starts(1, secs(10.0));
    write("second-pw");
    cluster.sql("ALTER ROLE rotuser PASSWORD 'second-pw'");
    cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'rotuser'");
    // The session ended: the child is stopped, and the next connection, with the file's new
    // password, leads again (a new term).
    let starts = scratch.wait_starts(2, secs(15.0));
    assert_eq!((starts[0].term, starts[1].term), (1, 2), "{starts:?}");
    leader.signal(nix::sys::signal::Signal::SIGTERM);
    leader.wait_exit(secs(10.0));
    let log = leader.log();
    assert!(
        !log.contains("second-pw") && !log.contains("first-pw"),
        "{log}"
    );
}

/// `HOME` and `PGPASSFILE` name files, which libpq takes as bytes: one that is not UTF-8 is
/// used as it is (its `.pgpass`, the password file it names), as psql uses it. Before, either
/// was refused with exit 125 ("HOME is set, but not to valid UTF-8 text"), even on a trust
/// server that needs no file at all.
#[test]
fn a_home_or_pgpassfile_that_is_not_utf8_is_a_path_as_for_libpq() {
    use std::os::unix::ffi::OsStrExt;
    let cluster = Cluster::shared();
    cluster.require_password("bytehome", "byte-home-pw");
    let port = cluster.addr().port();
    let scratch = Scratch::new();
    let home = scratch
        .path()
        .join(std::ffi::OsStr::from_bytes(b"home-\xff"));
    std::fs::create_dir(&home).unwrap();
    let passfile = |path: &std::path::Path| {
        std::fs::write(path, format!("127.0.0.1:{port}:*:bytehome:byte-home-pw\n")).unwrap();
        let mut perms = std::fs::metadata(path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
        std::fs::set_permissions(path, perms).unwrap();
    };
    passfile(&home.join(".pgpass"));
    let elsewhere = scratch
        .path()
        .join(std::ffi::OsStr::from_bytes(b"pgpass-\xfe"));
    passfile(&elsewhere);
    let password_dsn = format!("host=127.0.0.1 port={port} user=bytehome dbname=postgres");
    // No password file anywhere but where PGPASSFILE points.
    let no_home = scratch.file("empty-home");
    std::fs::create_dir(&no_home).unwrap();
    for (what, dsn, env) in [
        (
            "trust, HOME not UTF-8",
            cluster.dsn(),
            vec![("HOME", home.as_os_str())],
        ),
        (
            "HOME's .pgpass",
            password_dsn.clone(),
            vec![("HOME", home.as_os_str())],
        ),
        (
            "PGPASSFILE not UTF-8",
            password_dsn.clone(),
            vec![
                ("HOME", no_home.as_os_str()),
                ("PGPASSFILE", elsewhere.as_os_str()),
            ],
        ),
    ] {
        let out = leaderrun()
            .envs(env)
            .args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
            .args(["--once", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out));
    }
}

/// A TLS file that blocks when read (a FIFO nobody writes to, as a hung NFS mount would
/// block) fails each attempt within its bound, and holds two threads at most, not one per check: the
/// campaign goes on failing its checks, a WARN each, instead of waiting for good without a
/// word (before, the first connect waited for the reading as long as it blocked: no check,
/// no line, `/healthz` failing), and a later attempt waits for the reading in flight instead
/// of starting a second one. TERM ends it as a standby (exit 0).
#[test]
fn a_tls_file_that_blocks_fails_each_check_and_holds_one_thread() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let fifo = scratch.file("root.crt");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut cmd = leaderrun();
    cmd.env("PGSSLROOTCERT", &fifo).args([
        "--dsn",
        &format!("{} sslmode=verify-ca", cluster.dsn()),
        "--lock-id",
        &unique_lock_id().to_string(),
        "--check-interval",
        "200ms",
        "--",
        "true",
    ]);
    let mut standby = Replica::spawn(cmd);
    // Each check waits for a reading in flight within its bound, and fails; one that has
    // blocked for five bounds (1 s here) is left to itself and one more is begun, no more.
    standby.wait_log(
        "reading the TLS files did not finish within",
        10,
        secs(15.0),
    );
    let pid = standby.pid();
    let readers = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == "tls-files")
        })
        .count();
    assert!(
        (1..=2).contains(&readers),
        "{readers} readings of one set of files at once:\n{}",
        standby.log()
    );
    standby.signal(nix::sys::signal::Signal::SIGTERM);
    let status = standby.wait_exit(secs(5.0));
    assert_eq!(status.code(), Some(0), "{}", standby.log());
}

/// A password file line ends, as libpq's `pg_strip_crlf` ends it, before every carriage
/// return and newline at its end: a file converted to CRLF twice (`\r\r\n`), or whose last
/// line ends in `\r` alone, gives the password psql sends. Before, one `\n` and one `\r` were
/// cut, the rest sent as part of the password: refused where psql connected.
#[test]
fn a_password_file_line_loses_every_trailing_carriage_return() {
    let cluster = Cluster::shared();
    cluster.require_password("crlfuser", "crlf-pw");
    let scratch = Scratch::new();
    let port = cluster.addr().port();
    for (i, ending) in ["\r\r\n", "\r\n\r\n", "\r\r"].iter().enumerate() {
        let passfile = scratch.file(&format!("pgpass{i}"));
        std::fs::write(
            &passfile,
            format!("127.0.0.1:{port}:*:crlfuser:crlf-pw{ending}"),
        )
        .unwrap();
        let mut perms = std::fs::metadata(&passfile).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
        std::fs::set_permissions(&passfile, perms).unwrap();
        let dsn = format!("host=127.0.0.1 port={port} user=crlfuser dbname=postgres");
        let psql = std::process::Command::new(crate::support::cluster::psql())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PGPASSFILE", &passfile)
            .args(["-X", "-w", "-c", "select 1", &dsn])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run psql");
        assert!(
            psql.status.success(),
            "{ending:?}: psql:\n{}",
            String::from_utf8_lossy(&psql.stderr)
        );
        let out = leaderrun()
            .env("PGPASSFILE", &passfile)
            .args(["--dsn", &dsn, "--once"])
            .args(["--lock-id", &unique_lock_id().to_string()])
            .args(["--", "echo", "led"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run leaderrun");
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{ending:?}:\n{log}");
        assert_eq!(out.stdout, b"led\n", "{ending:?}:\n{log}");
    }
}

/// With no host set, the default socket directory is tried, then `/tmp`: a server whose
/// socket is in `/tmp` is reached on a machine that has `/var/run/postgresql` too (a Debian
/// host with PostgreSQL's packages), and when neither has the socket, the error names the
/// default directory, not `/tmp`.
#[test]
fn no_host_tries_the_default_socket_directory_then_tmp() {
    let cluster = Cluster::shared();
    let port = cluster.addr().port();
    let socket = format!(".s.PGSQL.{port}");
    let in_tmp = std::path::Path::new("/tmp").join(&socket);
    if std::fs::symlink_metadata(&in_tmp).is_ok() {
        crate::support::cluster::skip(
            "no_host_tries_the_default_socket_directory_then_tmp",
            "/tmp has a socket of this port already",
        );
        return;
    }
    let first = if std::path::Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql"
    } else {
        "/tmp"
    };
    let run = || {
        let out = leaderrun()
            .env("PGPORT", port.to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .args(["--once", "--lock-id", &unique_lock_id().to_string()])
            .args(["--", "true"])
            .output()
            .unwrap();
        (out.status.code(), text(&out))
    };
    // Neither directory has the socket: the error is the default directory's.
    let (code, out) = run();
    assert_eq!(code, Some(125), "{out}");
    assert!(
        out.contains(&format!("connect to host={first} port={port}")),
        "{out}"
    );
    // The server's socket in /tmp (a link to it: the server is the shared one).
    struct Unlink(std::path::PathBuf);
    impl Drop for Unlink {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    std::os::unix::fs::symlink(cluster.socket_dir().join(&socket), &in_tmp).unwrap();
    let _unlink = Unlink(in_tmp);
    let (code, out) = run();
    assert_eq!(code, Some(0), "{out}");
}
