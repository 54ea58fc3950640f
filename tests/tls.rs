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
        let psql = std::process::Command::new(cluster.psql_path())
            .env_clear()
            .env("HOME", "/nonexistent")
            .args(["-X", "-w", "-q", "-c", "select 1", "-d", &dsn])
            .output()
            .unwrap();
        assert_eq!(psql.status.success(), code == 0, "psql {mode}: {psql:?}");
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
