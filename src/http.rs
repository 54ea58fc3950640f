//! `--http-addr`: `/metrics`, `/healthz` and `/readyz` on tiny_http (contract §7).
//!
//! The server runs on threads of its own, started before the first check, so nothing a client
//! does can stall the election: tiny_http reads requests on its own threads, and each response
//! is written from a short-lived thread (at most [`MAX_IN_FLIGHT`] at once; beyond that the
//! request gets a 503 at once). `GET` and `HEAD` work; other methods get 405, other paths 404.
//!
//! A known limit of tiny_http 0.12: it reads each connection with a blocking read, without
//! timeouts, on a pool that grows only when no thread is idle. A burst of connections that
//! send nothing can queue later requests behind them until those clients go away. That delays
//! probes, never the election, which runs on its own runtime. (A receive timeout on the
//! listening socket would be copied to accepted connections, but it also makes tiny_http's
//! accept loop give up after one idle period, so it is not used.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::elector::Elector;
use crate::health::Health;
use crate::metrics::Metrics;

/// Responses being written at once, at most.
pub const MAX_IN_FLIGHT: usize = 32;

/// What the endpoints read.
#[derive(Clone)]
pub struct Observed {
    /// The election.
    pub elector: Elector,
    /// The registry `/metrics` serves.
    pub metrics: Metrics,
    /// Liveness and readiness.
    pub health: Arc<Health>,
}

/// The address could not be bound (in use, not permitted, not local).
#[derive(Debug, thiserror::Error)]
#[error("cannot serve HTTP on {addr}: {reason}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// What the OS said.
    pub reason: String,
}

/// Binds `addr` and serves on background threads. Returns the bound address (useful with
/// port 0).
///
/// # Errors
/// [`BindError`] when the address cannot be bound, e.g. the port is in use.
pub fn serve(addr: SocketAddr, observed: Observed) -> Result<SocketAddr, BindError> {
    let fail = |reason: String| BindError { addr, reason };
    let server = Server::http(addr).map_err(|e| fail(e.to_string()))?;
    let bound = server.server_addr().to_ip().unwrap_or(addr);
    let in_flight = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                if in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    let _ = request.respond(text(503, "busy\n".to_owned()));
                    continue;
                }
                let observed = observed.clone();
                let done = in_flight.clone();
                let spawned = std::thread::Builder::new()
                    .name("http-response".into())
                    .spawn(move || {
                        respond(request, &observed);
                        done.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    // The request went with the failed closure; count it as done.
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })
        .map_err(|e| fail(e.to_string()))?;
    Ok(bound)
}

fn text(status: u16, body: String) -> Response<std::io::Cursor<Vec<u8>>> {
    let header =
        Header::from_bytes("Content-Type", "text/plain; charset=utf-8").expect("static header");
    Response::from_string(body)
        .with_status_code(status)
        .with_header(header)
}

fn respond(request: Request, observed: &Observed) {
    let path = request.url().split('?').next().unwrap_or("").to_owned();
    let known = matches!(path.as_str(), "/metrics" | "/healthz" | "/readyz");
    let response = if !known {
        text(404, "not found\n".to_owned())
    } else if !matches!(request.method(), Method::Get | Method::Head) {
        let allow = Header::from_bytes("Allow", "GET, HEAD").expect("static header");
        text(405, "method not allowed\n".to_owned()).with_header(allow)
    } else {
        match path.as_str() {
            "/metrics" => {
                let header =
                    Header::from_bytes("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                        .expect("static header");
                Response::from_string(observed.metrics.render(&observed.elector))
                    .with_header(header)
            }
            "/healthz" => probe(observed.health.liveness(&observed.elector)),
            _ => probe(observed.health.readiness(&observed.elector)),
        }
    };
    let _ = request.respond(response);
}

fn probe(result: Result<String, String>) -> Response<std::io::Cursor<Vec<u8>>> {
    match result {
        Ok(body) => text(200, format!("{body}\n")),
        Err(reason) => text(503, format!("{reason}\n")),
    }
}
