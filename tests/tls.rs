//! TLS against a test cluster with its own CA: libpq's sslmode semantics and client
//! certificates, through `leaderrun --once -- true` (0: connected and led; 125: could not).

use crate::support::{leaderrun, unique_lock_id, Cluster};

fn once(dsn: &str) -> (Option<i32>, String) {
    let out = leaderrun()
        .args([
            "--dsn",
            dsn,
            "--check-interval",
            "2s",
            "--lock-id",
            &unique_lock_id().to_string(),
        ])
        .args(["--once", "--", "true"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether psql (libpq itself) connects with `dsn`, in an environment of no files of the
/// machine's user, and what it said: the verdict leaderrun must agree with.
fn psql_connects(cluster: &Cluster, dsn: &str) -> (bool, String) {
    let psql = std::process::Command::new(cluster.psql_path())
        .env_clear()
        .env("HOME", "/nonexistent")
        .args(["-X", "-w", "-q", "-c", "select 1", "-d", dsn])
        .output()
        .unwrap();
    (
        psql.status.success(),
        String::from_utf8_lossy(&psql.stderr).into_owned(),
    )
}

#[test]
fn sslmodes_verify_what_libpq_verifies() {
    let cluster = Cluster::start_private();
    let Some(certs) = cluster.enable_tls("tls::sslmodes_verify_what_libpq_verifies") else {
        return;
    };
    let port = cluster.addr().port();
    let base = |host: &str, extra: &str| {
        format!("host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres {extra}")
    };
    let ca = certs.file("ca.crt");
    let other = certs.file("other-ca.crt");
    let cases = [
        // (host name the client verifies, settings, expected exit, expected in the error)
        (
            "localhost",
            format!("sslmode=verify-full sslrootcert={ca}"),
            0,
            "",
        ),
        (
            "wronghost",
            format!("sslmode=verify-full sslrootcert={ca}"),
            125,
            "not valid for name",
        ),
        (
            "localhost",
            format!("sslmode=verify-full sslrootcert={other}"),
            125,
            "UnknownIssuer",
        ),
        (
            "wronghost",
            format!("sslmode=verify-ca sslrootcert={ca}"),
            0,
            "",
        ),
        (
            "localhost",
            format!("sslmode=verify-ca sslrootcert={other}"),
            125,
            "UnknownIssuer",
        ),
        ("wronghost", "sslmode=require".to_owned(), 0, ""),
        // require with a root named behaves like verify-ca (libpq).
        (
            "localhost",
            format!("sslmode=require sslrootcert={other}"),
            125,
            "UnknownIssuer",
        ),
        ("localhost", "sslmode=prefer".to_owned(), 0, ""),
    ];
    for (host, settings, code, needle) in cases {
        let dsn = base(host, &settings);
        let (got, stderr) = once(&dsn);
        assert_eq!(got, Some(code), "{dsn}: {stderr}");
        assert!(stderr.contains(needle), "{dsn}: {stderr}");
    }
}

#[test]
fn client_certificate_authentication() {
    let cluster = Cluster::start_private();
    let Some(certs) = cluster.enable_tls("tls::client_certificate_authentication") else {
        return;
    };
    let port = cluster.addr().port();
    let dsn = |extra: &str| {
        format!(
            "host=localhost hostaddr=127.0.0.1 port={port} user=certuser dbname=postgres \
             sslmode=verify-full sslrootcert={} {extra}",
            certs.file("ca.crt")
        )
    };
    let with_cert = dsn(&format!(
        "sslcert={} sslkey={}",
        certs.file("client.crt"),
        certs.file("client.key")
    ));
    let (code, stderr) = once(&with_cert);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = once(&dsn(""));
    assert_eq!(code, Some(125), "without a certificate: {stderr}");
    // A key of this user's that others may read is refused, as psql refuses it (before, it
    // was used). libpq looks at the mode of a key owned by the current user or root only.
    let key = certs.file("client.key");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&key).unwrap());
    let me = nix::unistd::geteuid().as_raw();
    let mode = |uid: u32, m: u32| {
        std::os::unix::fs::chown(&key, Some(uid), None).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    mode(me, 0o644);
    let (code, stderr) = once(&with_cert);
    mode(owner, 0o600);
    assert_eq!(code, Some(125), "a key readable by all: {stderr}");
    assert!(
        stderr.contains("has group or world access (mode 0644)"),
        "{stderr}"
    );
    // And a leader over TLS shows up encrypted in pg_stat_ssl.
    let status = leaderrun()
        .args(["doctor", "--dsn", &with_cert])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("the session is encrypted (TLS)"), "{text}");
}

#[test]
fn prefer_asks_again_in_plaintext_when_the_server_refuses_tls_as_libpq_does() {
    let cluster = Cluster::start_private();
    if cluster
        .enable_tls("tls::prefer_asks_again_in_plaintext_when_the_server_refuses_tls_as_libpq_does")
        .is_none()
    {
        return;
    }
    cluster.sql("CREATE ROLE plainuser LOGIN SUPERUSER");
    // This role may log in without TLS only.
    cluster.prepend_hba(
        "hostssl all plainuser 127.0.0.1/32 reject\nhost all plainuser 127.0.0.1/32 trust",
    );
    let port = cluster.addr().port();
    for (mode, code) in [("prefer", 0), ("disable", 0), ("require", 125)] {
        let dsn =
            format!("host=127.0.0.1 port={port} user=plainuser dbname=postgres sslmode={mode}");
        let (connected, said) = psql_connects(&cluster, &dsn);
        assert_eq!(connected, code == 0, "psql {mode}: {said}");
        let (got, stderr) = once(&dsn);
        assert_eq!(got, Some(code), "{mode}: {stderr}");
    }
    // Refused over TLS (a wrong password) and then in plaintext (no pg_hba.conf line): both
    // refusals are said, as psql says both; the first is the one to fix.
    cluster.sql("CREATE ROLE tlsonly LOGIN PASSWORD 'right-pw'");
    cluster.prepend_hba(
        "hostssl all tlsonly 127.0.0.1/32 scram-sha-256\nhostnossl all tlsonly 127.0.0.1/32 reject",
    );
    let dsn = format!("host=127.0.0.1 port={port} user=tlsonly dbname=postgres password=wrong-pw");
    let (got, stderr) = once(&dsn);
    assert_eq!(got, Some(125), "{stderr}");
    assert!(
        stderr.contains("over TLS the server said: password authentication failed")
            && stderr.contains("no encryption"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-pw"), "{stderr}");
}

/// `sslmode=prefer` (and `require`) with a root certificate named check the server's chain, as
/// libpq does; `prefer` then goes on in plaintext when the check fails, and `verify-full` with
/// an address alone (`hostaddr`, no `host`) is refused, as libpq refuses it
/// (docs/guarantees.md#database-and-connection-settings).
#[test]
fn a_named_root_is_checked_in_prefer_too_and_prefer_falls_back_to_plaintext_as_libpq_does() {
    let cluster = Cluster::start_private();
    let Some(certs) = cluster.enable_tls(
        "tls::a_named_root_is_checked_in_prefer_too_and_prefer_falls_back_to_plaintext_as_libpq_does",
    ) else {
        return;
    };
    let port = cluster.addr().port();
    let psql = cluster.psql_path();
    let plain = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=disable");
    // Whether the session psql (libpq) opens with `dsn` is encrypted.
    let psql_ssl = |dsn: &str| {
        let out = std::process::Command::new(&psql)
            .env_clear()
            .env("HOME", "/nonexistent")
            .args([
                "-X",
                "-w",
                "-Atc",
                "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
            ])
            .args(["-d", dsn])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {dsn}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // Whether leaderrun's lock session with `dsn` is encrypted, as COMMAND reads it.
    let leaderrun_ssl = |dsn: &str| {
        let query = format!(
            "{} -X -w -Atc \"select ssl from pg_stat_ssl where pid = $LEADERRUN_BACKEND_PID\" -d '{plain}'",
            psql.display()
        );
        let out = leaderrun()
            .env_clear()
            .env("HOME", "/nonexistent")
            .env("PATH", "/usr/bin:/bin")
            .args(["--dsn", dsn, "--check-interval", "2s"])
            .args(["--lock-id", &unique_lock_id().to_string()])
            .args(["--once", "--", "sh", "-c", &query])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{dsn}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let (ca, other) = (certs.file("ca.crt"), certs.file("other-ca.crt"));
    for (root, encrypted) in [(&ca, "t"), (&other, "f")] {
        let dsn = format!(
            "host=localhost hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
             sslmode=prefer sslrootcert={root}"
        );
        assert_eq!(psql_ssl(&dsn), encrypted, "psql, {dsn}");
        assert_eq!(leaderrun_ssl(&dsn), encrypted, "leaderrun, {dsn}");
    }
    // The fallback is only a second try: refused in plaintext too, both reasons are said.
    cluster.sql("CREATE ROLE tlsuser LOGIN SUPERUSER");
    cluster.prepend_hba("hostnossl all tlsuser 127.0.0.1/32 reject");
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={port} user=tlsuser dbname=postgres \
         sslmode=prefer sslrootcert={other}"
    );
    let (connected, said) = psql_connects(&cluster, &dsn);
    assert!(!connected, "psql connected: {said}");
    let (code, stderr) = once(&dsn);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(
        stderr.contains("over TLS the handshake failed") && stderr.contains("UnknownIssuer"),
        "{stderr}"
    );
    // verify-full needs a name to check: an address alone is refused, by both.
    let dsn = format!(
        "hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=verify-full \
         sslrootcert={ca}"
    );
    // (psql refuses too; through Debian's pg_wrapper, which sets PGHOST to its socket
    // directory, it says that directory's name does not match instead.)
    let (connected, said) = psql_connects(&cluster, &dsn);
    assert!(!connected, "psql: {said}");
    let (code, stderr) = once(&dsn);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("host name must be specified"), "{stderr}");
}

/// Server certificates as PostgreSQL's manual makes them ("Creating Certificates"), and the
/// name rules of libpq: for each, psql and leaderrun must both connect or both refuse
/// (docs/guarantees.md#database-and-connection-settings).
#[test]
fn server_certificates_psql_accepts_leaderrun_accepts() {
    let cluster = Cluster::start_private();
    let Some(certs) = cluster.enable_tls("tls::server_certificates_psql_accepts_leaderrun_accepts")
    else {
        return;
    };
    let port = cluster.addr().port();
    let agree = |host: &str, settings: &str, code: i32, needle: &str| {
        let dsn = format!(
            "host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres {settings}"
        );
        let (connected, said) = psql_connects(&cluster, &dsn);
        assert_eq!(connected, code == 0, "psql {dsn}: {said}");
        let (got, stderr) = once(&dsn);
        assert_eq!(got, Some(code), "{dsn}: {stderr}");
        assert!(stderr.contains(needle), "{dsn}: {stderr}");
    };
    let ca = certs.file("ca.crt");

    // The manual's self-signed certificate, copied to the client as its root: OpenSSL 3
    // marks it CA:TRUE, which webpki alone refuses as a server's.
    certs.self_signed("self", "localhost", &[]);
    cluster.serve_certificate(&certs, "self");
    let own = format!("sslrootcert={}", certs.file("self.crt"));
    agree("localhost", &format!("sslmode=verify-full {own}"), 0, "");
    agree("LocalHost", &format!("sslmode=verify-full {own}"), 0, "");
    agree("wronghost", &format!("sslmode=verify-ca {own}"), 0, "");
    agree("localhost", &format!("sslmode=require {own}"), 0, "");
    agree(
        "wronghost",
        &format!("sslmode=verify-full {own}"),
        125,
        "not valid for name",
    );
    // Trusted as it stands, but not for a TLS server.
    certs.self_signed("client-only", "localhost", &["extendedKeyUsage=clientAuth"]);
    cluster.serve_certificate(&certs, "client-only");
    agree(
        "localhost",
        &format!(
            "sslmode=verify-ca sslrootcert={}",
            certs.file("client-only.crt")
        ),
        125,
        "InvalidPurpose",
    );
    // Neither is it trusted through another root.
    agree(
        "localhost",
        &format!("sslmode=verify-ca sslrootcert={ca}"),
        125,
        "",
    );

    // The manual's CA-signed certificate: a Common Name, no alternative names.
    certs.signed("cn-only", "localhost", "basicConstraints=CA:FALSE\n");
    cluster.serve_certificate(&certs, "cn-only");
    let full = format!("sslmode=verify-full sslrootcert={ca}");
    agree("localhost", &full, 0, "");
    agree("otherhost", &full, 125, "only valid for localhost");

    // An alternative name hides the Common Name from a host of its kind.
    certs.signed(
        "alt-hides-cn",
        "localhost",
        "subjectAltName=DNS:other.test\nbasicConstraints=CA:FALSE\n",
    );
    cluster.serve_certificate(&certs, "alt-hides-cn");
    agree("localhost", &full, 125, "only valid for other.test");
    agree("other.test", &full, 0, "");

    // A wildcard stands for one whole first label.
    certs.signed(
        "wildcard",
        "nobody",
        "subjectAltName=DNS:*.pg.test\nbasicConstraints=CA:FALSE\n",
    );
    cluster.serve_certificate(&certs, "wildcard");
    agree("db.pg.test", &full, 0, "");
    agree("DB.PG.test", &full, 0, "");
    agree("a.db.pg.test", &full, 125, "not valid for name");
    agree("pg.test", &full, 125, "not valid for name");
}

/// `sslrootcert=system` (libpq 16): the system's roots, `verify-full` by default, and a weaker
/// `sslmode` refused before any connection.
#[test]
fn sslrootcert_system_means_the_systems_roots_and_verify_full() {
    let cluster = Cluster::start_private();
    if cluster
        .enable_tls("tls::sslrootcert_system_means_the_systems_roots_and_verify_full")
        .is_none()
    {
        return;
    }
    let port = cluster.addr().port();
    let dsn = |extra: &str| {
        format!(
            "host=localhost hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
             sslrootcert=system {extra}"
        )
    };
    // The test CA is in no system store: verified, and refused.
    let (code, stderr) = once(&dsn(""));
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
    for weaker in ["disable", "prefer", "require", "verify-ca"] {
        let (code, stderr) = once(&dsn(&format!("sslmode={weaker}")));
        assert_eq!(code, Some(125), "{weaker}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "weaker sslmode \"{weaker}\" may not be used with sslrootcert=system"
            )),
            "{weaker}: {stderr}"
        );
    }
}

/// `channel_binding=require` (SCRAM-SHA-256-PLUS over TLS): leaderrun binds the session to the
/// server's certificate as libpq does, and refuses without TLS as libpq does.
#[test]
fn channel_binding_require_binds_to_the_servers_certificate() {
    let cluster = Cluster::start_private();
    if cluster
        .enable_tls("tls::channel_binding_require_binds_to_the_servers_certificate")
        .is_none()
    {
        return;
    }
    cluster.sql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE bound LOGIN SUPERUSER PASSWORD 'bound-pw'",
    );
    cluster.prepend_hba("host all bound 127.0.0.1/32 scram-sha-256");
    let port = cluster.addr().port();
    for (mode, code) in [("require", 0), ("prefer", 0), ("disable", 125)] {
        let dsn = format!(
            "host=127.0.0.1 port={port} user=bound dbname=postgres password=bound-pw \
             channel_binding=require sslmode={mode}"
        );
        let (connected, said) = psql_connects(&cluster, &dsn);
        assert_eq!(connected, code == 0, "psql {mode}: {said}");
        let (got, stderr) = once(&dsn);
        assert_eq!(got, Some(code), "{mode}: {stderr}");
    }
}

/// A root certificate that blocked when read (a FIFO nobody writes to, as a hung mount blocks)
/// and is then put right under the same name is read again without a restart: a reading that
/// has blocked for several connect bounds is left to itself and one more is begun (two at
/// most per set of files). Before, every later attempt joined the blocked reading, and
/// leaderrun never connected again until restarted.
#[test]
fn a_root_certificate_that_blocked_is_read_again_once_put_right() {
    use crate::support::{secs, Replica, Scratch};
    let cluster = Cluster::start_private();
    let Some(certs) =
        cluster.enable_tls("tls::a_root_certificate_that_blocked_is_read_again_once_put_right")
    else {
        return;
    };
    let scratch = Scratch::new();
    let root = scratch.file("root.crt");
    nix::unistd::mkfifo(&root, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let port = cluster.addr().port();
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
         sslmode=verify-ca sslrootcert={}",
        root.display()
    );
    let script = scratch.child_script("child.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &dsn, "--lock-id", &unique_lock_id().to_string()])
        .args(["--check-interval", "200ms", "--"])
        .arg(&script);
    let replica = Replica::spawn(cmd);
    replica.wait_log("reading the TLS files did not finish within", 2, secs(10.0));
    // Put right: a regular file takes the FIFO's name (as a mount that comes back would).
    let fixed = scratch.file("root.crt.new");
    std::fs::copy(certs.file("ca.crt"), &fixed).unwrap();
    std::fs::rename(&fixed, &root).unwrap();
    let started = scratch.wait_starts(1, secs(15.0));
    assert_eq!(started.len(), 1, "{}", replica.log());
}
