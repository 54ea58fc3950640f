//! The campaign's pure helpers: which failed tries are a server momentarily unable to take a
//! session (retried soon, not counted as a failure of the election), and the first check's
//! random spread. The loop itself runs against a real server in the integration tests.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use super::{is_transient, jitter};
use crate::error::Error;

/// The driver's error for a server that answers the startup message with an ErrorResponse
/// carrying SQLSTATE `code` (a one-shot fake server on the loopback).
fn refused_with(code: &str) -> tokio_postgres::Error {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = code.to_owned();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // The startup message: a length (itself included), then the rest.
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).unwrap();
        let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
        stream.read_exact(&mut rest).unwrap();
        let mut fields = Vec::new();
        for (kind, value) in [
            (b'S', "FATAL"),
            (b'V', "FATAL"),
            (b'C', code.as_str()),
            (b'M', "not now"),
        ] {
            fields.push(kind);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut message = vec![b'E'];
        message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(&fields);
        stream.write_all(&message).unwrap();
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .connect_timeout(Duration::from_secs(5));
    let err = runtime
        .block_on(config.connect(tokio_postgres::NoTls))
        .err()
        .expect("the fake server refuses every session");
    server.join().unwrap();
    err
}

#[test]
fn a_full_or_starting_server_is_transient_on_connect_and_on_a_query() {
    for code in ["53300", "57P03"] {
        let connect = Error::Connect {
            target: "host=127.0.0.1".to_owned(),
            source: refused_with(code),
        };
        assert!(is_transient(&connect), "{code} on connect");
        let query = Error::Query {
            what: "try advisory lock",
            source: refused_with(code),
        };
        assert!(is_transient(&query), "{code} on a query");
    }
}

#[test]
fn other_failures_are_not_transient() {
    // An authentication failure, a missing database: the server will not change its mind.
    for code in ["28P01", "3D000", "53200"] {
        let connect = Error::Connect {
            target: "host=127.0.0.1".to_owned(),
            source: refused_with(code),
        };
        assert!(!is_transient(&connect), "{code}");
    }
    let timeout = Error::Timeout {
        what: "connect",
        after: Duration::from_secs(1),
    };
    assert!(!is_transient(&timeout));
    assert!(!is_transient(&Error::SessionClosed(None)));
    assert!(!is_transient(&Error::StepDownRequested));
}

#[test]
fn jitter_stays_between_5_ms_and_its_bound_and_spreads() {
    for max in [
        Duration::from_millis(6),
        Duration::from_millis(250),
        Duration::from_secs(5),
    ] {
        let draws: Vec<Duration> = (0..200).map(|_| jitter(max)).collect();
        for &d in &draws {
            assert!(
                d >= Duration::from_millis(5) && d <= max,
                "{d:?} of {max:?}"
            );
        }
        if max >= Duration::from_millis(250) {
            // A herd starting together must not draw one value: 200 draws over 245 ms or
            // more take many.
            let mut distinct = draws.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(distinct.len() > 100, "{} distinct of 200", distinct.len());
        }
    }
    // A bound at or below the floor gives the floor.
    for max in [Duration::ZERO, Duration::from_millis(5)] {
        assert_eq!(jitter(max), Duration::from_millis(5));
    }
}

/// A leader demoted because its check's answer came too late reports the time since the last
/// check that proved the lock, not that check's own round trip: "no check has proved the lock
/// for 358ms (more than 2 check intervals)" at a 200 ms interval said less than it claimed.
#[test]
fn a_passed_window_is_reported_from_the_last_proof() {
    use super::leader::since_last_proof;
    let ms = Duration::from_millis;
    // Proved at 1000 ms with a 400 ms window; the late answer is handled at 1450 ms.
    assert_eq!(since_last_proof(ms(1450), ms(1400), ms(400)), Some(ms(450)));
    // A revoked proof (its end set to 1 ns) is no check's.
    assert_eq!(
        since_last_proof(ms(1450), Duration::from_nanos(1), ms(400)),
        None
    );
}

#[test]
fn every_name_in_the_holder_and_check_statements_is_the_catalogs() {
    crate::pg::assert_qualified(super::HOLDER_SQL);
    crate::pg::assert_qualified(super::LOCK_ROW_SQL);
}
