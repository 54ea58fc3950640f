//! `--http-addr`: `/metrics`, `/healthz` and `/readyz` (README, "Metrics and probes").
//!
//! No client of the port can stop the leader or hold up its probes, so everything a client can
//! make the server keep is bounded:
//!
//! - One thread serves every connection: a single-threaded tokio runtime of its own, apart from
//!   the election's, so a busy port cannot delay a check and a stuck check cannot stall the port.
//! - At most [`MAX_CONNECTIONS`] connections are open, and at most a quarter of the process's
//!   descriptor limit ([`connection_limit`]), so the port never takes the descriptors the
//!   election and COMMAND's start need. A new connection is always admitted and the oldest is
//!   closed to make room: clients that hold connections (idle, slow, not reading) cannot lock
//!   a probe out, since a probe's connection is the newest. A probe is closed unanswered only
//!   when the server accepts that many connections between its connect and its request (the
//!   accept loop admits [`ACCEPT_BATCH`] per turn, and once its request is in, a probe is
//!   answered in the next turn). Any smarter choice of whom to close favours one kind of
//!   attacker: sparing connections that carry requests spared a flood of pipelined ones, and
//!   closed a probe whose request was still on its way.
//! - A request head must arrive within [`HEAD_TIMEOUT`] (a connection's first one, and each
//!   next one on a kept-alive connection, counted from the end of the previous response), and
//!   fit in [`HEAD_BUFFER`] bytes with at most [`MAX_HEADERS`] headers (else 431).
//! - A connection lives at most [`CONNECTION_LIFETIME`] and carries at most
//!   [`MAX_REQUESTS_PER_CONNECTION`] requests, and each connection gets one request per turn
//!   among all of them: a client that pipelines requests and never reads the answers holds one
//!   slot at most that long, and a flood waits its turn behind the probes instead of starving
//!   them.
//! - The accept loop takes up to [`ACCEPT_BATCH`] waiting connections per turn (a quarter of
//!   the connection limit): fast enough that a probe's connection does not wait in the
//!   kernel's queue behind a flood of them, and few enough that every connection it admits is
//!   served before newer ones can evict it. The connections a batch evicts close as it ends,
//!   so for that moment the port holds up to one batch of descriptors above the limit.
//! - The kernel queues up to [`BACKLOG`] connections for it, so clients connecting at once
//!   wait their turn rather than have their SYN dropped (a second's wait each).
//! - A `/metrics` rendering (about 150 µs: the process collector reads `/proc`) answers every
//!   `/metrics` request of the next [`METRICS_REUSE`]: scrapers in parallel, or pipelined, cost
//!   one rendering per that time, not one each.
//! - Request bodies are never read into memory: every endpoint ignores its body, and hyper
//!   then closes a connection whose body was not read rather than wait for it, so an announced
//!   `Content-Length` (however large) costs nothing.
//! - A failed `accept` never ends the server. Out of descriptors (the rest of the process took
//!   them), it closes its oldest connection and tries again; with none open, or out of memory,
//!   it tries again every [`ACCEPT_RETRY`]: the port serves again as soon as the cause is gone.
//!
//! `GET` and `HEAD` work; other methods get 405, other paths 404, an HTTP/1.1 request without
//! `Host` 400 (RFC 9112).
//!
//! Why hyper's HTTP/1 server and not tiny_http, which served the port before: tiny_http gives
//! each connection a thread of its own with no bound on their number (2000 idle connections:
//! 2005 threads, and the port refused everyone for good once the descriptors ran out), has no
//! limit on the time a request head may take, and aborted the process on a request announcing
//! a huge body; none of that can be changed from outside it. hyper serves connections as
//! tasks on the one thread above and leaves accepting, admission and time limits to us.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::cli::health::Health;
use crate::cli::metrics::Metrics;
use crate::elector::Elector;

/// Connections open at once, at most (fewer under a low descriptor limit, see
/// [`connection_limit`]); a new one closes the oldest. With 32, a flood of silent connections
/// closed a probe that took a millisecond to send its request before it came (1 in 200).
pub const MAX_CONNECTIONS: usize = 128;

/// How long a request head may take to arrive, and how long a kept-alive connection may stay
/// idle between requests.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one connection may stay open, however it is used.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(5);

/// Requests one connection may carry; the last one's response says `Connection: close`.
pub const MAX_REQUESTS_PER_CONNECTION: u32 = 100;

/// The read buffer of a connection, in bytes: a request head must fit in it (hyper's minimum).
pub const HEAD_BUFFER: usize = 8192;

/// Headers one request may have.
pub const MAX_HEADERS: usize = 32;

/// Connections accepted per turn of the accept loop, at most; a quarter of the connection
/// limit when that is less, so that a connection is served before a later batch can evict it.
pub const ACCEPT_BATCH: usize = 8;

/// The kernel's queue of connections not yet accepted (`listen(2)`'s backlog; the kernel caps
/// it at `net.core.somaxconn`). std's 128 let a few hundred clients connecting at once fill it,
/// and a probe's SYN was then dropped and sent again a second later.
pub const BACKLOG: u32 = 1024;

/// How long one `/metrics` rendering answers later `/metrics` requests.
pub const METRICS_REUSE: Duration = Duration::from_millis(5);

/// The pause before `accept` is tried again after it failed (e.g. `EMFILE`).
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

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

/// The address could not be bound (in use, not permitted, not local), or the server's thread
/// or runtime could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve HTTP on {addr}: {reason}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// What the OS said.
    pub reason: String,
}

/// Binds `addr` and serves on a thread of its own. Returns the bound address (useful with
/// port 0).
///
/// # Errors
/// [`BindError`] when the address cannot be bound, e.g. the port is in use, or the thread or
/// its runtime cannot be started.
pub fn serve(addr: SocketAddr, observed: Observed) -> Result<SocketAddr, BindError> {
    let fail = |reason: String| BindError { addr, reason };
    // Bound before the runtime exists: a runtime dropped on the caller's (the election's
    // runtime) would panic.
    let every = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, addr.port()));
    let (socket, addr) = match addr {
        SocketAddr::V4(_) => (tokio::net::TcpSocket::new_v4(), addr),
        // `[::]` (also what `:PORT` means) is every interface, IPv4 too: the socket takes
        // IPv4 connections as mapped addresses whatever `net.ipv6.bindv6only` says. A kernel
        // without IPv6 has no such socket; then every interface is every IPv4 one.
        _ if addr == every => match tokio::net::TcpSocket::new_v6() {
            Ok(socket) => {
                nix::sys::socket::setsockopt(
                    &socket,
                    nix::sys::socket::sockopt::Ipv6V6Only,
                    &false,
                )
                .map_err(|e| fail(e.to_string()))?;
                (Ok(socket), addr)
            }
            Err(err) if err.raw_os_error() == Some(libc::EAFNOSUPPORT) => (
                tokio::net::TcpSocket::new_v4(),
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port())),
            ),
            Err(err) => (Err(err), addr),
        },
        SocketAddr::V6(_) => (tokio::net::TcpSocket::new_v6(), addr),
    };
    let socket = socket.map_err(|e| fail(e.to_string()))?;
    // As std's bind does: a restarted leaderrun rebinds a port in TIME_WAIT.
    socket
        .set_reuseaddr(true)
        .map_err(|e| fail(e.to_string()))?;
    socket.bind(addr).map_err(|e| fail(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(format!("cannot start its runtime: {e}")))?;
    let listening = {
        let _context = runtime.enter();
        socket.listen(BACKLOG)
    };
    let listener = match listening {
        Ok(listener) => listener,
        Err(err) => {
            runtime.shutdown_background();
            return Err(fail(err.to_string()));
        }
    };
    let bound = listener.local_addr().unwrap_or(addr);
    let limit = connection_limit();
    // The runtime reaches the thread through a slot, so that a thread that cannot start leaves
    // it here to be shut down (dropped inside the closure, on the caller's runtime, it would
    // panic).
    let slot = Arc::new(Mutex::new(Some(runtime)));
    let handed = slot.clone();
    let started = std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let runtime = handed.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(runtime) = runtime {
                runtime.block_on(accept_loop(listener, limit, observed))
            }
        });
    match started {
        Ok(_) => Ok(bound),
        Err(err) => {
            let runtime = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(runtime) = runtime {
                runtime.shutdown_background();
            }
            Err(fail(format!("cannot start its thread: {err}")))
        }
    }
}

/// How many connections the server keeps open at once: [`MAX_CONNECTIONS`], or a quarter of
/// the soft `RLIMIT_NOFILE` when that is less (at least 4).
pub fn connection_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    share_of(soft)
}

/// The connections kept under a soft descriptor limit of `soft`.
fn share_of(soft: usize) -> usize {
    (soft / 4).clamp(4, MAX_CONNECTIONS)
}

/// The open connections, oldest first, each with its id and the token that closes it.
type Open = Arc<Mutex<VecDeque<(u64, CancellationToken)>>>;

/// Tells the oldest open connection to close, if there is one; true when there was. Its task
/// closes the socket at its next turn: at once when `now` (this task yields to it; the runtime
/// has this one thread), else by the end of this accept batch.
async fn evict_oldest(open: &Open, now: bool) -> bool {
    let oldest = open.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    match oldest {
        Some((_, token)) => {
            token.cancel();
            if now {
                // The cancelled task is queued already: it runs before this one resumes.
                tokio::task::yield_now().await;
            }
            true
        }
        None => false,
    }
}

async fn accept_loop(listener: TcpListener, limit: usize, observed: Observed) -> ! {
    use futures_util::FutureExt;
    let open: Open = Arc::default();
    let rendered: Rendered = Arc::default();
    let batch = ACCEPT_BATCH.min(limit / 4).max(1);
    let mut next_id = 0u64;
    let mut failing = false;
    let mut taken = 0;
    loop {
        // Past the batch, or with nobody waiting, the others get their turn first.
        let waiting = if taken < batch {
            listener.accept().now_or_never()
        } else {
            None
        };
        let accepted = match waiting {
            Some(accepted) => accepted,
            None => {
                taken = 0;
                tokio::task::yield_now().await;
                listener.accept().await
            }
        };
        taken += 1;
        let stream = match accepted {
            Ok((stream, _)) => {
                failing = false;
                stream
            }
            Err(err) => {
                use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
                // That one connection is gone; the next may be fine.
                if matches!(
                    err.kind(),
                    ConnectionAborted | ConnectionReset | Interrupted
                ) {
                    continue;
                }
                // Out of descriptors: make room among our own connections and try again.
                let out_of_descriptors =
                    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if out_of_descriptors && evict_oldest(&open, true).await {
                    continue;
                }
                // Or wait a little, and say so once per streak.
                if !failing {
                    warn!(
                        "HTTP: cannot accept a connection, trying again every {}: {err}",
                        humantime::format_duration(ACCEPT_RETRY)
                    );
                    failing = true;
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // Room first. The evicted sockets close when this batch ends (a yield per eviction
        // would give every connection a turn per accepted one, and a flood of connections
        // would again keep a probe's waiting): the descriptors stay within the limit and one
        // batch.
        let full = open.lock().unwrap_or_else(|e| e.into_inner()).len() >= limit;
        if full {
            evict_oldest(&open, false).await;
        }
        let id = next_id;
        next_id += 1;
        let token = CancellationToken::new();
        open.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((id, token.clone()));
        tokio::spawn(connection(
            stream,
            id,
            token,
            open.clone(),
            observed.clone(),
            rendered.clone(),
        ));
    }
}

/// The latest `/metrics` rendering and when it was made ([`METRICS_REUSE`]).
type Rendered = Arc<Mutex<Option<(std::time::Instant, Bytes)>>>;

/// Serves one connection until it ends, its time is up or a newer one evicts it.
async fn connection(
    stream: TcpStream,
    id: u64,
    token: CancellationToken,
    open: Open,
    observed: Observed,
    rendered: Rendered,
) {
    let served = AtomicU32::new(0);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let probe = matches!(request.uri().path(), "/healthz" | "/readyz");
        let mut response = respond(&request, &observed, &rendered);
        let first = served.load(Ordering::Relaxed) == 0;
        // The body (if any) is dropped unread with the request.
        drop(request);
        if served.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_REQUESTS_PER_CONNECTION {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        async move {
            // One request per turn: a connection with many requests queued (pipelined, or a
            // client that floods) waits behind every other connection before its next one, so
            // a probe waits for one request of each at most. A probe's answer on a connection's
            // first request goes out at once (a probe waits one turn, not two); every later
            // request on a connection waits its turn, probes too, so pipelined probes are one
            // per turn like anything else (hyper itself would answer 16 of them per turn).
            if !(probe && first) {
                tokio::task::yield_now().await;
            }
            Ok::<_, Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(HEAD_BUFFER)
        .max_headers(MAX_HEADERS)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = token.cancelled() => {}
        // Errors are the client's (a reset, a bad request hyper already answered): nothing to
        // report.
        _ = tokio::time::timeout(CONNECTION_LIFETIME, served) => {}
    }
    open.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(other, _)| *other != id);
}

type Reply = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn respond(request: &Request<Incoming>, observed: &Observed, rendered: &Rendered) -> Reply {
    // RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request without a Host.
    if request.version() == hyper::Version::HTTP_11 && !request.headers().contains_key(HOST) {
        return text(StatusCode::BAD_REQUEST, "no Host header\n".to_owned());
    }
    let path = request.uri().path();
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return text(StatusCode::NOT_FOUND, "not found\n".to_owned());
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".to_owned(),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let body = {
                let mut latest = rendered.lock().unwrap_or_else(|e| e.into_inner());
                match &*latest {
                    Some((at, body)) if at.elapsed() < METRICS_REUSE => body.clone(),
                    _ => {
                        let body = Bytes::from(observed.metrics.render(&observed.elector));
                        *latest = Some((std::time::Instant::now(), body.clone()));
                        body
                    }
                }
            };
            let mut response = text(StatusCode::OK, body);
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => probe(observed.health.liveness(&observed.elector)),
        _ => probe(observed.health.readiness(&observed.elector)),
    }
}

fn probe(result: Result<String, String>) -> Reply {
    match result {
        Ok(body) => text(StatusCode::OK, format!("{body}\n")),
        Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` and the README state these bounds in figures; they must be the code's.
    #[test]
    fn the_documented_bounds_are_the_code_s() {
        use clap::CommandFactory;
        let help = crate::cli::Cli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let readme = include_str!("../../README.md");
        let figures = [
            format!("at most {MAX_CONNECTIONS} connections"),
            format!("{} s for a request's head", HEAD_TIMEOUT.as_secs()),
            format!(
                "{} s and {MAX_REQUESTS_PER_CONNECTION} requests per connection",
                CONNECTION_LIFETIME.as_secs()
            ),
        ];
        for figure in &figures {
            assert!(help.contains(figure.as_str()), "--help lacks {figure:?}");
        }
        let rows = [
            format!("| {MAX_CONNECTIONS}, or a quarter of the descriptor limit"),
            format!("| {} s to arrive", HEAD_TIMEOUT.as_secs()),
            format!("{} KiB, {MAX_HEADERS} headers", HEAD_BUFFER / 1024),
            format!(
                "| {} s and {MAX_REQUESTS_PER_CONNECTION} requests",
                CONNECTION_LIFETIME.as_secs()
            ),
            format!("| up to {ACCEPT_BATCH} waiting connections per turn"),
            format!("a backlog of {BACKLOG} in the kernel"),
            format!("every scrape of the next {} ms", METRICS_REUSE.as_millis()),
        ];
        for row in &rows {
            assert!(readme.contains(row.as_str()), "README lacks {row:?}");
        }
    }

    #[test]
    fn the_connection_limit_keeps_to_its_share_of_descriptors() {
        assert_eq!(share_of(1024), MAX_CONNECTIONS);
        assert_eq!(share_of(usize::MAX), MAX_CONNECTIONS);
        assert_eq!(share_of(96), 24);
        assert_eq!(share_of(4096), MAX_CONNECTIONS);
        assert_eq!(share_of(8), 4);
    }
}
