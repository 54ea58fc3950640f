//! Connecting as libpq does: the hosts of a [`ConnectPlan`] one after the other, each with its
//! own timeout, password and TLS decision, `target_session_attrs` checked on each, the
//! connection driven on its own task. `status` and `doctor` connect through here too.

use std::os::fd::RawFd;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_postgres::{Client, NoTls};

use crate::error::Error;
use crate::pg::conninfo::{Address, ConnectPlan, HostTarget, SessionAttrs};
use crate::pg::tls::TlsSettings;

/// A connected client, a receiver that resolves when the connection ends (with its error, if
/// any), and the task that drives the connection (abort it to close the socket at once, when
/// no other copy of the socket is kept).
pub type Connected = (
    Client,
    oneshot::Receiver<Option<tokio_postgres::Error>>,
    JoinHandle<()>,
);

/// The socket of a connection just made, and what the server told of itself in its startup
/// answer.
#[derive(Debug)]
pub(crate) struct Link {
    /// A copy of the connection's socket, made before the connection's task took the socket:
    /// always this connection's, where the task's own number could name another file once the
    /// task ended and closed it. Whoever holds it keeps the socket open: drop it with the
    /// connection.
    pub(crate) fd: std::os::fd::OwnedFd,
    /// The host of the list this connection reached, as [`host_endpoint`] names it (for the
    /// log: with several hosts, which one the lock is held on).
    ///
    /// [`host_endpoint`]: crate::pg::conninfo::host_endpoint
    pub(crate) endpoint: String,
    /// The server's major version, from the `server_version` it reports at startup
    /// (PostgreSQL's manual, "Protocol Flow", ParameterStatus: `15.4 (Debian …)`, `18beta1`);
    /// `None` when it reported none or one that does not start with a number.
    pub(crate) server_major: Option<u32>,
}

/// The major version in a reported `server_version`: its leading number (`15` of `15.4`,
/// `9` of `9.6.24`, `18` of `18beta1`).
pub(crate) fn server_major(reported: &str) -> Option<u32> {
    let digits = reported.len()
        - reported
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    reported[..digits].parse().ok()
}

/// Connects with `config` and `tls`, as libpq does: the hosts of the plan
/// ([`crate::pg::conninfo::ConnectPlan`]) one after the other (shuffled with
/// `load_balance_hosts=random`), each attempt with its own timeout (`connect_timeout`, else
/// `bound`), its own password and its own TLS decision (none on a Unix socket); a host whose
/// socket does not connect in time, or that does not suit `target_session_attrs`, passes the
/// turn to the next; a server's refusal (authentication, unknown database, TLS) ends the
/// attempt, as with libpq. The connection is driven on its own task. `target` is the redacted
/// description used when no host was tried.
///
/// # Errors
/// [`Error::Connect`] when the server refuses, TLS verification fails or authentication
/// fails; [`Error::Socket`] when no host's socket connected; [`Error::NotSuitable`];
/// [`Error::Tls`] when the TLS settings cannot be used; [`Error::Timeout`].
pub async fn connect(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    target: &str,
    bound: Duration,
) -> Result<Connected, Error> {
    connect_socket(config, tls, target, bound, None, None)
        .await
        .map(|(connected, _)| connected)
}

/// When the standby check in flight last began a step ([`crate::Elector::stepped_at`]).
#[derive(Debug, Default)]
pub(crate) struct Steps(std::sync::Mutex<Option<tokio::time::Instant>>);

impl Steps {
    /// A step begins now.
    pub(crate) fn begin(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// When the latest step began.
    pub(crate) fn last(&self) -> Option<tokio::time::Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection to the first host of a plan begun before the elector runs: a one-shot's
/// socket connects, and the session's first message goes out, while leaderrun is still
/// starting up, so the server starts its backend and authenticates it (most of a connect's
/// time) meanwhile. The first attempt at that very address or socket path takes it; a socket
/// nobody took closes when this drops (a server that trusts the client logs nothing for a
/// client that hung up before its first query; one that asked for a password, or began TLS,
/// logs the lost client, so the binary begins no early connect for a COMMAND that cannot run).
///
/// What goes out early is exactly what the driver would send first (`Prelude`): the startup
/// message where the session is plaintext (a Unix socket, `sslmode=disable`), the `SSLRequest`
/// for `sslmode=prefer` over TCP and, once the server has answered `N`, the startup message
/// after it. Nothing is sent early for the modes that require TLS.
#[derive(Debug, Default)]
pub struct EarlyConnect {
    socket: std::sync::Mutex<Option<Early>>,
}

#[derive(Debug)]
struct Early {
    target: EarlyTarget,
    fd: std::os::fd::OwnedFd,
    prelude: Prelude,
    /// The startup message the prelude sends, empty when it sends none: an attempt whose own
    /// differs (another user, database or application name) does not take the socket.
    startup: Vec<u8>,
}

#[derive(Debug, PartialEq)]
enum EarlyTarget {
    Tcp(std::net::SocketAddr),
    Unix(std::path::PathBuf),
}

/// The first bytes of a session, sent (and the answer to an `SSLRequest` read) on the early
/// socket before the driver took it over. The driver's first writes must repeat [`sent`]
/// byte for byte; [`Primed`] absorbs them and hands it the answer read early.
///
/// [`sent`]: Prelude::sent
#[derive(Debug, Default)]
pub(super) struct Prelude {
    /// On the wire already.
    sent: Vec<u8>,
    /// Still to send, as soon as the socket takes it (a TCP socket still connecting does not).
    unsent: Vec<u8>,
    /// The startup message that follows the server's `N` to the `SSLRequest`.
    after_no_tls: Vec<u8>,
    /// The server's one-byte answer to the `SSLRequest`, read early.
    answer: Option<u8>,
    /// Why the connect failed, when a send showed it first (refused, unreachable): the attempt
    /// reports it as its own connect would have, and the next host is tried.
    failed: Option<std::io::Error>,
}

impl Prelude {
    /// The server closed the connection after accepting it: what is left counts as sent (the
    /// driver's own writes would have gone nowhere too) and no answer is waited for, so the
    /// driver's first read meets the end and reports it as it would without this prelude.
    fn connection_lost(&mut self) {
        self.sent.append(&mut self.unsent);
        self.after_no_tls.clear();
    }

    /// Sends what the socket takes now and reads the answer to a sent `SSLRequest` if it has
    /// come; never waits. A failure is left for the driver to meet on its first read or write.
    fn advance(&mut self, fd: RawFd) {
        loop {
            if self.failed.is_some() {
                return;
            }
            if !self.unsent.is_empty() {
                // SAFETY: send from a live buffer of the given length, never blocking, no SIGPIPE.
                let n = unsafe {
                    libc::send(
                        fd,
                        self.unsent.as_ptr().cast(),
                        self.unsent.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                if n > 0 {
                    self.sent.extend(self.unsent.drain(..n as usize));
                    continue;
                }
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    _ if n == 0 || err.kind() == std::io::ErrorKind::WouldBlock => {}
                    // The server closed a connection it had accepted (a forwarder whose
                    // backend is down): the driver's own write, made before that close, would
                    // have gone nowhere too. The bytes count as sent, and the driver reads the
                    // end itself and reports it as it would have.
                    Some(libc::EPIPE | libc::ECONNRESET) => self.connection_lost(),
                    // The connect itself failed (refused, unreachable, timed out): a socket
                    // error is returned once, then cleared, so it is kept for the attempt.
                    _ => self.failed = Some(err),
                }
                return;
            }
            if self.after_no_tls.is_empty() || self.answer.is_some() {
                return;
            }
            let mut byte = 0u8;
            // SAFETY: recv of one byte into a live byte, never blocking.
            let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
            if n != 1 {
                // No answer yet; or the connection ended, which the driver then reads itself.
                if n == 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
                {
                    self.after_no_tls.clear();
                }
                return;
            }
            self.answer = Some(byte);
            if byte == b'N' {
                // No TLS: the driver sends the startup message next, in plaintext.
                self.unsent = std::mem::take(&mut self.after_no_tls);
            } else {
                // 'S': TLS follows, the driver's own; anything else the driver reads as
                // tokio-postgres does (as no TLS, then the server's error).
                self.after_no_tls.clear();
                return;
            }
        }
    }
}

/// The startup message tokio-postgres sends for `config` (its `connect_raw`: the same
/// parameters in the same order, encoded by the same crate); `None` without a user, which the
/// driver would look up itself. A unit test holds the two equal.
fn startup_message(config: &tokio_postgres::Config) -> Option<Vec<u8>> {
    let mut params = vec![("client_encoding", "UTF8"), ("user", config.get_user()?)];
    if let Some(dbname) = config.get_dbname() {
        params.push(("database", dbname));
    }
    if let Some(options) = config.get_options() {
        params.push(("options", options));
    }
    if let Some(name) = config.get_application_name() {
        params.push(("application_name", name));
    }
    let mut buf = bytes::BytesMut::new();
    postgres_protocol::message::frontend::startup_message(params, &mut buf).ok()?;
    Some(buf.to_vec())
}

/// The `SSLRequest` message.
fn ssl_request() -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    postgres_protocol::message::frontend::ssl_request(&mut buf);
    buf.to_vec()
}

impl EarlyConnect {
    /// Starts a non-blocking connect to the first host `connect` and `tls` name (as
    /// [`connect`] tries them), when it needs no name lookup: a Unix socket, `hostaddr`, or a
    /// host that is an IP address, and sends what it may of the session's first messages
    /// ([`EarlyConnect::advance`] sends the rest). `None` when the hosts are tried in random
    /// order (`load_balance_hosts=random`), when a lookup would be needed, or when the socket
    /// cannot be started (the first attempt then connects as always). Needs no runtime.
    pub fn start(
        connect: &tokio_postgres::Config,
        tls: &TlsSettings,
    ) -> Option<std::sync::Arc<EarlyConnect>> {
        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType, SockaddrStorage};
        use std::os::fd::AsRawFd;
        let plan = if tls.plan.hosts.is_empty() {
            plan_of(connect)
        } else {
            tls.plan.clone()
        };
        if plan.random_order {
            return None;
        }
        let host = plan.hosts.first()?;
        let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
        let startup = startup_message(connect).unwrap_or_default();
        let mut prelude = Prelude::default();
        // A TCP connect completes later (the socket turns writable); a Unix one at once, or
        // fails (EAGAIN with a full backlog: then the first attempt connects as always).
        let (target, fd) = match &host.address {
            Address::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{}", host.port));
                let addr = nix::sys::socket::UnixAddr::new(&path).ok()?;
                let fd = socket(AddressFamily::Unix, SockType::Stream, flags, None).ok()?;
                nix::sys::socket::connect(fd.as_raw_fd(), &addr).ok()?;
                // Never TLS on a Unix socket (libpq's rule, and `attempt`'s).
                prelude.unsent = startup.clone();
                (EarlyTarget::Unix(path), fd)
            }
            Address::Tcp { name, addr } => {
                let ip = addr.or_else(|| name.parse().ok())?;
                let addr = std::net::SocketAddr::new(ip, host.port);
                let family = if ip.is_ipv4() {
                    AddressFamily::Inet
                } else {
                    AddressFamily::Inet6
                };
                let fd = socket(family, SockType::Stream, flags, None).ok()?;
                match nix::sys::socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
                    Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
                    Err(_) => return None,
                }
                match tls.mode {
                    crate::pg::tls::SslMode::Disable => prelude.unsent = startup.clone(),
                    crate::pg::tls::SslMode::Prefer => {
                        prelude.unsent = ssl_request();
                        prelude.after_no_tls = startup.clone();
                    }
                    // TLS or nothing: the handshake is the driver's, from its first byte.
                    _ => {}
                }
                (EarlyTarget::Tcp(addr), fd)
            }
        };
        // Nothing early without the startup message (no user: the driver looks it up), and
        // no startup message kept where nothing is sent early (the modes that require TLS).
        let startup =
            if startup.is_empty() || prelude.unsent.is_empty() && prelude.after_no_tls.is_empty() {
                prelude = Prelude::default();
                Vec::new()
            } else {
                startup
            };
        prelude.advance(fd.as_raw_fd());
        Some(std::sync::Arc::new(EarlyConnect {
            socket: std::sync::Mutex::new(Some(Early {
                target,
                fd,
                prelude,
                startup,
            })),
        }))
    }

    /// Sends what the early socket may send by now (a TCP socket that finished connecting,
    /// the startup message after the server's `N`). Never waits: call it now and then while
    /// starting up.
    pub fn advance(&self) {
        use std::os::fd::AsRawFd;
        let mut slot = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(early) = slot.as_mut() {
            early.prelude.advance(early.fd.as_raw_fd());
        }
    }

    /// The early TCP socket's own address (the port the server sees it from); `None` for a
    /// Unix socket, or once an attempt took it.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        use nix::sys::socket::{getsockname, SockaddrStorage};
        let slot = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        let early = slot.as_ref()?;
        if !matches!(early.target, EarlyTarget::Tcp(_)) {
            return None;
        }
        let local =
            getsockname::<SockaddrStorage>(std::os::fd::AsRawFd::as_raw_fd(&early.fd)).ok()?;
        local
            .as_sockaddr_in()
            .map(|v4| std::net::SocketAddr::V4((*v4).into()))
            .or_else(|| {
                local
                    .as_sockaddr_in6()
                    .map(|v6| std::net::SocketAddr::V6((*v6).into()))
            })
    }

    /// Whether the whole startup message is on its way on the early socket (the server
    /// authenticates the session meanwhile); false before, for `sslmode=prefer` until the
    /// server's `N` came and was read ([`EarlyConnect::advance`]), for a server that chose TLS,
    /// for the modes that require it, and once an attempt took the socket.
    pub fn startup_sent(&self) -> bool {
        let slot = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().is_some_and(|early| {
            !early.startup.is_empty()
                && early.prelude.unsent.is_empty()
                && early.prelude.sent.ends_with(&early.startup)
        })
    }

    /// Whether a connect attempt took the socket.
    pub fn is_taken(&self) -> bool {
        self.socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The socket begun for `target`, with what it sent, when the attempt's own startup
    /// message (of `config`) is the one it sent; otherwise it stays (and closes unused).
    fn take(
        &self,
        target: &EarlyTarget,
        config: &tokio_postgres::Config,
    ) -> Option<(std::os::fd::OwnedFd, Prelude)> {
        use std::os::fd::AsRawFd;
        let mut slot = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        let fits = slot.as_ref().is_some_and(|early| {
            early.target == *target
                && (early.startup.is_empty()
                    || startup_message(config).as_deref() == Some(early.startup.as_slice()))
        });
        if !fits {
            return None;
        }
        let mut early = slot.take()?;
        early.prelude.advance(early.fd.as_raw_fd());
        Some((early.fd, early.prelude))
    }

    /// The early TCP socket to `addr`, once connected (within `deadline`), with what it sent;
    /// `None` when there is none for `addr`. `Some(Err)`: its connect failed (as a new one
    /// would).
    async fn take_tcp(
        &self,
        addr: std::net::SocketAddr,
        config: &tokio_postgres::Config,
        deadline: tokio::time::Instant,
    ) -> Option<Result<(tokio::net::TcpStream, Prelude), Option<std::io::Error>>> {
        let (fd, mut prelude) = self.take(&EarlyTarget::Tcp(addr), config)?;
        let stream = match tokio::net::TcpStream::from_std(std::net::TcpStream::from(fd)) {
            Ok(stream) => stream,
            Err(err) => return Some(Err(Some(err))),
        };
        // As tokio's own connect: writable once the handshake is done, then its outcome.
        match tokio::time::timeout_at(deadline, stream.writable()).await {
            Err(_) => return Some(Err(None)),
            Ok(Err(err)) => return Some(Err(Some(err))),
            Ok(Ok(())) => {}
        }
        if let Some(err) = prelude.failed.take() {
            return Some(Err(Some(err)));
        }
        Some(match stream.take_error() {
            Ok(None) => {
                // Connected by now: what could not be sent while it connected goes now.
                prelude.advance(std::os::fd::AsRawFd::as_raw_fd(&stream));
                match prelude.failed.take() {
                    Some(err) => Err(Some(err)),
                    None => Ok((stream, prelude)),
                }
            }
            // Connected, then closed by the server before the driver took over (a forwarder
            // whose backend is down): the driver meets the end as it would have, had it
            // connected just now, and the attempt ends as libpq's does (no next host).
            Ok(Some(err)) | Err(err)
                if matches!(err.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) =>
            {
                prelude.connection_lost();
                Ok((stream, prelude))
            }
            Ok(Some(err)) | Err(err) => Err(Some(err)),
        })
    }

    /// The early Unix socket to `path` (connected already), with what it sent; `None` when
    /// there is none.
    fn take_unix(
        &self,
        path: &std::path::Path,
        config: &tokio_postgres::Config,
    ) -> Option<std::io::Result<(tokio::net::UnixStream, Prelude)>> {
        let (fd, mut prelude) = self.take(&EarlyTarget::Unix(path.to_owned()), config)?;
        if let Some(err) = prelude.failed.take() {
            return Some(Err(err));
        }
        Some(
            tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
                .map(|stream| (stream, prelude)),
        )
    }
}

/// A socket whose first bytes were sent before the driver took it ([`Prelude`]): the
/// driver's writes that repeat them are absorbed, and its first read gets the answer to the
/// `SSLRequest` that was read early. A write that differs fails the attempt (it cannot: the
/// socket is taken only by an attempt whose startup message is the one sent).
pub(super) struct Primed<S> {
    inner: S,
    sent: Vec<u8>,
    absorbed: usize,
    answer: Option<u8>,
}

impl<S> Primed<S> {
    pub(super) fn new(inner: S, prelude: Prelude) -> Primed<S> {
        Primed {
            inner,
            sent: prelude.sent,
            absorbed: 0,
            answer: prelude.answer,
        }
    }
}

impl<S: std::os::fd::AsRawFd> std::os::fd::AsRawFd for Primed<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Primed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(byte) = self.answer.take() {
                buf.put_slice(&[byte]);
                return std::task::Poll::Ready(Ok(()));
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Primed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.absorbed < this.sent.len() && !buf.is_empty() {
            let n = buf.len().min(this.sent.len() - this.absorbed);
            if buf[..n] != this.sent[this.absorbed..this.absorbed + n] {
                return std::task::Poll::Ready(Err(std::io::Error::other(
                    "the session's first message differs from the one sent early",
                )));
            }
            this.absorbed += n;
            return std::task::Poll::Ready(Ok(n));
        }
        std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The plan of a configuration built without the resolver (tests, embedders): its hosts and
/// ports, one password for all.
pub(super) fn plan_of(config: &tokio_postgres::Config) -> ConnectPlan {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let addrs = config.get_hostaddrs();
    let hosts = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| HostTarget {
            address: match h {
                Host::Unix(dir) => Address::Unix(dir.clone()),
                Host::Tcp(name) => Address::Tcp {
                    name: name.clone(),
                    addr: addrs.get(i).copied(),
                },
            },
            port: ports.get(i).or(ports.first()).copied().unwrap_or(5432),
            password: config.get_password().map(<[u8]>::to_vec),
            passfile: None,
        })
        .collect();
    ConnectPlan {
        hosts,
        connect_timeout: config.get_connect_timeout().copied(),
        ..ConnectPlan::default()
    }
}

/// One host, redacted: `host=H port=P dbname=D user=U` (with `hostaddr=` when given).
pub(super) fn host_description(config: &tokio_postgres::Config, host: &HostTarget) -> String {
    let mut out = match &host.address {
        Address::Unix(dir) => format!("host={}", dir.display()),
        Address::Tcp { name, addr: None } => format!("host={name}"),
        Address::Tcp {
            name,
            addr: Some(addr),
        } if name.is_empty() => format!("hostaddr={addr}"),
        Address::Tcp {
            name,
            addr: Some(addr),
        } => format!("host={name} hostaddr={addr}"),
    };
    out.push_str(&format!(" port={}", host.port));
    if let Some(db) = config.get_dbname() {
        out.push_str(&format!(" dbname={db}"));
    }
    if let Some(user) = config.get_user() {
        out.push_str(&format!(" user={user}"));
    }
    out
}

/// Why one host's attempt ended: try its next address (else the next host), skip to the next
/// host, or stop (the server refused).
pub(super) enum Attempt {
    Next(Error),
    /// The next host, this one's other addresses left untried, as libpq does for a server that
    /// cannot take connections now (SQLSTATE 57P03: starting up, shutting down, a standby with
    /// `hot_standby` off) and for one that does not suit `target_session_attrs` (libpq's
    /// `fe-connect.c`, `try_next_host`).
    NextHost(Error),
    Stop(Error),
}

/// [`connect`], and the connection's [`Link`]: a copy of its socket, the lock session's by
/// construction, which keeps the socket open until it is dropped too. `early`: a socket begun
/// before ([`EarlyConnect`]), used by the attempt at its address. `steps`: told of each
/// attempt as it begins.
pub(crate) async fn connect_socket(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    target: &str,
    bound: Duration,
    early: Option<&EarlyConnect>,
    steps: Option<&Steps>,
) -> Result<(Connected, Link), Error> {
    let plan = if tls.plan.hosts.is_empty() {
        plan_of(config)
    } else {
        tls.plan.clone()
    };
    let mut order: Vec<usize> = (0..plan.hosts.len()).collect();
    if plan.random_order {
        use std::hash::{BuildHasher, Hasher};
        for i in (1..order.len()).rev() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_usize(i);
            order.swap(i, hasher.finish() as usize % (i + 1));
        }
    }
    let per_host = plan.connect_timeout.unwrap_or(bound);
    let any_tcp = plan
        .hosts
        .iter()
        .any(|h| matches!(h.address, Address::Tcp { .. }));
    let connector = if tls.enabled() && any_tcp {
        Some(connector_off_the_runtime(tls, per_host).await?)
    } else {
        None
    };
    let passes: &[SessionAttrs] = match plan.attrs {
        SessionAttrs::PreferStandby => &[SessionAttrs::Standby, SessionAttrs::Any],
        ref other => std::slice::from_ref(other),
    };
    let mut last = None;
    // The first server that could not take connections now (57P03): when no host answers,
    // that is the error told, so a one-shot still tries again soon (a primary restarting
    // behind a list whose other hosts are standbys or down), and says which host it was.
    let mut cannot_connect_now = None;
    for wanted in passes {
        for &i in &order {
            let host = &plan.hosts[i];
            match attempt(
                config,
                tls,
                connector.as_ref(),
                host,
                *wanted,
                per_host,
                early,
                steps,
            )
            .await
            {
                Ok((connected, mut link)) => {
                    link.endpoint = crate::pg::conninfo::host_endpoint(config, host);
                    return Ok((connected, link));
                }
                // A Unix socket that is not there says the least of all failures (no
                // server uses that directory): it does not hide an earlier host's error,
                // e.g. the default socket directory's when `/tmp`, tried after it, has none.
                // A server's refusal that passes the turn is 57P03 (`handshake`).
                Err(Attempt::NextHost(err @ Error::Connect { .. }))
                    if cannot_connect_now.is_none() =>
                {
                    cannot_connect_now = Some(err)
                }
                Err(Attempt::Next(err) | Attempt::NextHost(err))
                    if last.is_none() || !is_missing_socket(&err) =>
                {
                    last = Some(err)
                }
                Err(Attempt::Next(_) | Attempt::NextHost(_)) => {}
                Err(Attempt::Stop(err)) => return Err(err),
            }
        }
    }
    Err(cannot_connect_now
        .or(last)
        .unwrap_or_else(|| Error::Socket {
            target: target.to_owned(),
            source: std::io::Error::other("no host to connect to"),
        }))
}

/// Whether `err` is a Unix socket file that does not exist.
fn is_missing_socket(err: &Error) -> bool {
    matches!(err, Error::Socket { target, source }
        if target.starts_with("host=/") && source.kind() == std::io::ErrorKind::NotFound)
}

/// One host: each of its addresses in turn, each within `per_host` (each told to `steps` as
/// it begins).
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempt(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    connector: Option<&crate::pg::tls::MakeRustlsConnect>,
    host: &HostTarget,
    wanted: SessionAttrs,
    per_host: Duration,
    early: Option<&EarlyConnect>,
    steps: Option<&Steps>,
) -> Result<(Connected, Link), Attempt> {
    use tokio_postgres::tls::MakeTlsConnect;
    let target = host_description(config, host);
    let begin = |deadline: tokio::time::Instant| {
        if let Some(steps) = steps {
            steps.begin();
        }
        deadline
    };
    begin(tokio::time::Instant::now());
    let mut config = config.clone();
    // libpq reads the password file at every connection: a password rotated in it is used
    // from the next connection on. Off the runtime's thread (a file on a hung mount), one
    // reading at a time, and within PASSFILE_READ_WAIT; a reading still in flight, or one
    // that takes longer, leaves the last password read.
    let password = match &host.passfile {
        Some(passfile) if passfile.stale() => {
            if passfile.begin_reading() {
                let reader = passfile.clone();
                let wait = PASSFILE_READ_WAIT.min(per_host / 2);
                match timeout(wait, off_thread(move || reader.password_now())).await {
                    Ok(Ok(now)) => now,
                    Ok(Err(_)) => {
                        passfile.end_reading();
                        passfile.last()
                    }
                    // Still reading: it ends on its own, and says so.
                    Err(_) => passfile.last(),
                }
            } else {
                passfile.last()
            }
        }
        _ => host.password.clone(),
    };
    if let Some(password) = password {
        config.password(password);
    }
    let timed_out = |target: &str| {
        Attempt::Next(Error::Socket {
            target: target.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "timed out after {} (per host: connect_timeout, else the check interval)",
                    humantime::format_duration(per_host)
                ),
            ),
        })
    };
    let socket_err = |source: std::io::Error| {
        Attempt::Next(Error::Socket {
            target: target.clone(),
            source,
        })
    };
    let (name, addrs) = match &host.address {
        Address::Unix(dir) => {
            let path = dir.join(format!(".s.PGSQL.{}", host.port));
            let deadline = begin(tokio::time::Instant::now() + per_host);
            let connected = match early.and_then(|e| e.take_unix(&path, &config)) {
                Some(connected) => Ok(connected),
                None => tokio::time::timeout_at(deadline, tokio::net::UnixStream::connect(&path))
                    .await
                    .map(|c| c.map(|stream| (stream, Prelude::default()))),
            };
            let (stream, prelude) = match connected {
                Err(_) => return Err(timed_out(&target)),
                Ok(Err(err)) => return Err(socket_err(err)),
                Ok(Ok(connected)) => connected,
            };
            // libpq never uses TLS over a Unix socket, whatever sslmode says.
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            let stream = Primed::new(stream, prelude);
            return handshake(&config, stream, None, wanted, deadline, &target).await;
        }
        Address::Tcp {
            name,
            addr: Some(addr),
        } => (
            name.clone(),
            vec![std::net::SocketAddr::new(*addr, host.port)],
        ),
        Address::Tcp { name, addr: None } => {
            match timeout(per_host, lookup_host(name, host.port, spawn_lookup)).await {
                Err(_) => return Err(timed_out(&target)),
                Ok(Err(err)) => return Err(socket_err(err)),
                Ok(Ok(addrs)) => (name.clone(), addrs),
            }
        }
    };
    // libpq checks a verify-full certificate against the host name only: an address alone
    // (`hostaddr` without `host`) is refused, never matched against the certificate.
    if name.is_empty() && tls.mode == crate::pg::tls::SslMode::VerifyFull {
        return Err(Attempt::Stop(Error::Socket {
            target: target.clone(),
            source: std::io::Error::other(
                "host name must be specified for a verified SSL connection (sslmode=verify-full \
                 checks the certificate against host, and only hostaddr is set)",
            ),
        }));
    }
    // The name TLS is given: the host name, else the address (used for nothing but SNI,
    // which rustls sends for names only). A host that is no DNS name (`host='x y'
    // hostaddr=…`, `host=-db`) is given as its address too, unless verify-full checks it:
    // libpq takes any name there and uses it for nothing else, and rustls refuses to start
    // a handshake with it ("invalid dns name"), which refused a session psql opens.
    let unusable = |name: &str| {
        tls.mode != crate::pg::tls::SslMode::VerifyFull
            && rustls::pki_types::ServerName::try_from(name).is_err()
    };
    let server_name = if name.is_empty() || unusable(&name) {
        addrs
            .first()
            .map(|a| a.ip().to_string())
            .unwrap_or_default()
    } else {
        name
    };
    config.ssl_mode(if tls.enabled() {
        tls.driver_mode()
    } else {
        tokio_postgres::config::SslMode::Disable
    });
    let mut last = None;
    for addr in addrs {
        let deadline = begin(tokio::time::Instant::now() + per_host);
        let connected = match early {
            Some(early) => early.take_tcp(addr, &config, deadline).await,
            None => None,
        };
        let connected = match connected {
            Some(Ok(connected)) => Ok(Ok(connected)),
            Some(Err(None)) => Err(()),
            Some(Err(Some(err))) => Ok(Err(err)),
            None => tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr))
                .await
                .map(|c| c.map(|stream| (stream, Prelude::default())))
                .map_err(|_| ()),
        };
        let (stream, prelude) = match connected {
            Err(()) => {
                last = Some(timed_out(&target));
                continue;
            }
            Ok(Err(err)) => {
                last = Some(socket_err(err));
                continue;
            }
            Ok(Ok(connected)) => connected,
        };
        let _ = stream.set_nodelay(true);
        set_tcp_timers(&stream, &config);
        let stream = Primed::new(stream, prelude);
        let over_tls = std::sync::Arc::new(crate::pg::tls::Handshake::default());
        let tls_connect = match connector {
            Some(c) if tls.enabled() => Some(
                MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(
                    &mut c.clone(),
                    &server_name,
                )
                .map_err(|e| {
                    Attempt::Stop(Error::Socket {
                        target: target.clone(),
                        source: std::io::Error::other(e.to_string()),
                    })
                })?
                .noting(over_tls.clone()),
            ),
            _ => None,
        };
        match handshake(&config, stream, tls_connect, wanted, deadline, &target).await {
            Err(Attempt::Next(err)) => last = Some(Attempt::Next(err)),
            // Not this host now, whichever address (and not in plaintext either).
            Err(Attempt::NextHost(err)) => return Err(Attempt::NextHost(err)),
            // libpq's sslmode=prefer: a server that refused the session over TLS (a
            // `hostnossl` line in pg_hba.conf), or whose handshake failed (a certificate
            // the named root does not vouch for), is asked once more in plaintext.
            Err(Attempt::Stop(Error::Connect { source, .. }))
                if tls.mode == crate::pg::tls::SslMode::Prefer
                    && over_tls.began()
                    && (source.as_db_error().is_some() || over_tls.failed()) =>
            {
                let deadline = begin(tokio::time::Instant::now() + per_host);
                let stream =
                    match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr))
                        .await
                    {
                        Err(_) => return Err(timed_out(&target)),
                        Ok(Err(err)) => return Err(socket_err(err)),
                        Ok(Ok(stream)) => stream,
                    };
                let _ = stream.set_nodelay(true);
                set_tcp_timers(&stream, &config);
                let mut plain = config.clone();
                plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                match handshake(&plain, stream, None, wanted, deadline, &target).await {
                    Err(Attempt::Next(err)) => last = Some(Attempt::Next(err)),
                    // Refused in plaintext too: both refusals are the answer, as psql prints
                    // both (the first is often the one that says what to fix: a wrong
                    // password over TLS, then no pg_hba.conf line without it).
                    Err(Attempt::Stop(Error::Connect {
                        target,
                        source: plain_err,
                    })) => {
                        // The guard above made sure it is the server's own error, or the
                        // handshake's (its causes are the reason). Either is outside text, cut
                        // to half of what `Chain` shows of this error's whole text
                        // (crate::error::MAX_TEXT_BYTES), so the SQLSTATE after it stays.
                        let half = crate::error::MAX_TEXT_BYTES / 2;
                        let said = source.as_db_error().map_or_else(
                            || {
                                let mut chain = source.to_string();
                                let mut cause = std::error::Error::source(&source);
                                while let Some(c) = cause {
                                    chain.push_str(&format!(": {c}"));
                                    cause = c.source();
                                }
                                format!("the handshake failed: {}", crate::error::cut(&chain, half))
                            },
                            |db| {
                                format!(
                                    "the server said: {} (SQLSTATE {})",
                                    crate::error::cut(db.message(), half),
                                    db.code().code()
                                )
                            },
                        );
                        return Err(Attempt::Stop(Error::Connect {
                            target: format!("{target} (in plaintext; over TLS {said})"),
                            source: plain_err,
                        }));
                    }
                    other => return other,
                }
            }
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| socket_err(std::io::Error::other("the name has no address"))))
}

/// The client-side TCP timers of `config` (keepalives, `TCP_USER_TIMEOUT`) on a socket this
/// module opened (tokio-postgres sets them only on sockets it opens itself).
pub(super) fn set_tcp_timers(stream: &tokio::net::TcpStream, config: &tokio_postgres::Config) {
    use nix::sys::socket::{setsockopt, sockopt};
    let secs = |d: Duration| d.as_secs().clamp(1, 32_767) as u32;
    if config.get_keepalives() {
        let _ = setsockopt(stream, sockopt::KeepAlive, &true);
        let _ = setsockopt(
            stream,
            sockopt::TcpKeepIdle,
            &secs(config.get_keepalives_idle()),
        );
        if let Some(interval) = config.get_keepalives_interval() {
            let _ = setsockopt(stream, sockopt::TcpKeepInterval, &secs(interval));
        }
        if let Some(count) = config.get_keepalives_retries() {
            let _ = setsockopt(stream, sockopt::TcpKeepCount, &count);
        }
    }
    if let Some(t) = config.get_tcp_user_timeout() {
        let ms = t.as_millis().min(u128::from(u32::MAX)) as u32;
        let _ = setsockopt(stream, sockopt::TcpUserTimeout, &ms);
    }
}

/// The most bytes a server may send before its session is ready (`ReadyForQuery` after the
/// startup): its TLS handshake, authentication, `ParameterStatus` and notices, a few KiB as a
/// rule. tokio-postgres keeps every `ParameterStatus` and every notice of the startup in memory
/// until the session is ready, with no bound but the time, so a server (or whatever listens on
/// the port) that sends them without end made leaderrun grow by hundreds of MB a second until
/// `connect_timeout`, else the check interval, ran out (1.9 GB in the default 5 s).
pub const STARTUP_BYTES: usize = 8 * 1024 * 1024;

/// A stream whose reads fail once more than [`STARTUP_BYTES`] have come before `ready` is set
/// (see there); after that it is the stream itself.
struct Capped<S> {
    inner: S,
    read: usize,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<S: std::os::fd::AsRawFd> std::os::fd::AsRawFd for Capped<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Capped<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(())))
            && !self.ready.load(std::sync::atomic::Ordering::Relaxed)
        {
            self.read = self.read.saturating_add(buf.filled().len() - before);
            if self.read > STARTUP_BYTES {
                return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                    "the server sent more than {} MiB before the session was ready \
                     (a flood of notices or parameters; is this a PostgreSQL server?)",
                    STARTUP_BYTES / (1024 * 1024)
                ))));
            }
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Capped<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The startup and authentication on a connected socket, then the `target_session_attrs`
/// check, all by `deadline`. The server may send at most [`STARTUP_BYTES`] before its session
/// is ready.
pub(super) async fn handshake<S>(
    config: &tokio_postgres::Config,
    stream: S,
    tls: Option<crate::pg::tls::RustlsConnect>,
    wanted: SessionAttrs,
    deadline: tokio::time::Instant,
    target: &str,
) -> Result<(Connected, Link), Attempt>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + std::os::fd::AsRawFd + 'static,
{
    // SAFETY: the stream is ours and open for this whole statement.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(stream.as_raw_fd()) }
        .try_clone_to_owned()
        .map_err(|source| {
            Attempt::Next(Error::Socket {
                target: target.to_owned(),
                source,
            })
        })?;
    let timed_out = || {
        Attempt::Next(Error::Socket {
            target: target.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the server did not answer in time (per host: connect_timeout, else the check interval)",
            ),
        })
    };
    let refused = |source: tokio_postgres::Error| {
        let cannot_connect_now =
            source.code() == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW);
        let err = Error::Connect {
            target: target.to_owned(),
            source,
        };
        if cannot_connect_now {
            Attempt::NextHost(err)
        } else {
            Attempt::Stop(err)
        }
    };
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = Capped {
        inner: stream,
        read: 0,
        ready: ready.clone(),
    };
    let server_major;
    let connected = match tls {
        Some(tls) => {
            match tokio::time::timeout_at(deadline, config.connect_raw(stream, tls)).await {
                Err(_) => return Err(timed_out()),
                Ok(Err(source)) => return Err(refused(source)),
                Ok(Ok((client, connection))) => {
                    server_major = connection
                        .parameter("server_version")
                        .and_then(self::server_major);
                    spawned(client, connection)
                }
            }
        }
        None => match tokio::time::timeout_at(deadline, config.connect_raw(stream, NoTls)).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(source)) => return Err(refused(source)),
            Ok(Ok((client, connection))) => {
                server_major = connection
                    .parameter("server_version")
                    .and_then(self::server_major);
                spawned(client, connection)
            }
        },
    };
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let link = Link {
        fd,
        endpoint: String::new(),
        server_major,
    };
    let (query, needs_on, name) = match wanted {
        SessionAttrs::Any | SessionAttrs::PreferStandby => return Ok((connected, link)),
        SessionAttrs::ReadWrite => ("SHOW transaction_read_only", "off", "read-write"),
        SessionAttrs::ReadOnly => ("SHOW transaction_read_only", "on", "read-only"),
        SessionAttrs::Primary => ("SELECT pg_catalog.pg_is_in_recovery()", "f", "primary"),
        SessionAttrs::Standby => ("SELECT pg_catalog.pg_is_in_recovery()", "t", "standby"),
    };
    // The role's own `statement_timeout` (a millisecond) may cancel the look: asked again, as
    // the pin is. `None`: past the deadline.
    let answer = crate::pg::until_not_cancelled(|_| async {
        match tokio::time::timeout_at(deadline, connected.0.simple_query(query)).await {
            Err(_) => Ok(None),
            Ok(answer) => answer.map(Some).map_err(|source| Error::Query {
                what: "check target_session_attrs",
                source,
            }),
        }
    })
    .await;
    let value = match answer {
        Ok(None) => return Err(timed_out()),
        Err(err) => return Err(Attempt::NextHost(err)),
        Ok(Some(messages)) => messages.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        }),
    };
    if value.as_deref() == Some(needs_on) {
        Ok((connected, link))
    } else {
        connected.2.abort();
        Err(Attempt::NextHost(Error::NotSuitable {
            target: target.to_owned(),
            wanted: name,
        }))
    }
}

/// Drives a connection on its own task.
pub(super) fn spawned<S, T>(
    client: Client,
    connection: tokio_postgres::Connection<S, T>,
) -> Connected
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, closed) = oneshot::channel();
    let task = tokio::spawn(async move {
        let _ = tx.send(connection.await.err());
    });
    (client, closed, task)
}

/// The TLS connector; built on a thread of its own when it reads files
/// ([`TlsSettings::reads_files`]): a file can block for good (a FIFO nobody writes to, a hung
/// NFS mount), and the runtime's thread must go on acting on signals and the fence meanwhile.
/// Its answer is awaited `within` the connect's bound: a reading that takes longer fails this
/// attempt, as a host that does not answer does, and is left behind, blocked (the process's
/// exit ends it). A reading of the same files still in flight is joined, not started again
/// ([`TLS_READS`]), until it has blocked for [`TLS_READ_STALE_BOUNDS`] bounds: then one more is
/// begun, so that a file put right under the same name is read without a restart
/// ([`TLS_READS_PER_FILES`] at most). A hung mount holds two threads, not one more per check,
/// and sessions that connect at once (a slot's extra heads, the history's) share one reading. Without the bound
/// the attempt waited for good, and the campaign with it, saying nothing.
async fn connector_off_the_runtime(
    tls: &TlsSettings,
    within: Duration,
) -> Result<crate::pg::tls::MakeRustlsConnect, Error> {
    use crate::pg::tls::TlsError;
    if !tls.reads_files() {
        return tls.connector().map_err(Error::Tls);
    }
    let files = TlsFiles::of(tls);
    let (found, answer) = oneshot::channel();
    let (begun, start) = {
        let mut reads = TLS_READS.lock().unwrap_or_else(|p| p.into_inner());
        let same = reads.iter().filter(|r| r.files == files).count();
        let newest = reads
            .iter_mut()
            .filter(|r| r.files == files)
            .max_by_key(|r| r.begun);
        match newest {
            // A reading that has blocked for several bounds is left to itself and one more is
            // begun, so that a file put right under the same name (the FIFO replaced, the
            // mount back) is read without a restart; never more than two per set of files.
            Some(read)
                if read.begun.elapsed() < within.saturating_mul(TLS_READ_STALE_BOUNDS)
                    || same >= TLS_READS_PER_FILES =>
            {
                // Callers whose bound passed left their senders: no pile-up.
                read.waiting.retain(|w| !w.is_closed());
                read.waiting.push(found);
                (Some(read.begun), None)
            }
            _ => {
                let id = TLS_READ_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                reads.push(TlsRead {
                    id,
                    files: files.clone(),
                    begun: std::time::Instant::now(),
                    waiting: vec![found],
                });
                (None, Some(id))
            }
        }
    };
    let begun = begun.unwrap_or_else(std::time::Instant::now);
    if let Some(id) = start {
        // Answers everyone waiting when the thread ends, or when it never started.
        let reading = TlsReading {
            id,
            files,
            built: None,
        };
        let settings = tls.clone();
        let started = std::thread::Builder::new()
            .name("tls-files".into())
            .spawn(move || {
                let mut reading = reading;
                reading.built = Some(settings.connector());
            });
        if let Err(err) = started {
            return Err(Error::Tls(TlsError::Thread(err)));
        }
    }
    match timeout(within, answer).await {
        Ok(Ok(connector)) => connector.map_err(Error::Tls),
        Ok(Err(_)) => Err(Error::Tls(TlsError::Thread(std::io::Error::other(
            "it ended without an answer",
        )))),
        Err(_) => Err(Error::Tls(TlsError::Thread(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "reading the TLS files did not finish within {} (begun {} ago; a FIFO nobody \
                 writes to, a hung mount?)",
                humantime::format_duration(within),
                humantime::format_duration(round_ms(begun.elapsed()))
            ),
        )))),
    }
}

/// What a TLS connector reads: connects that read the same files share one reading.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TlsFiles {
    mode: crate::pg::tls::SslMode,
    root_cert: Option<std::path::PathBuf>,
    client_cert: Option<std::path::PathBuf>,
    client_key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    fn of(tls: &TlsSettings) -> TlsFiles {
        TlsFiles {
            mode: tls.mode,
            root_cert: tls.root_cert.clone(),
            client_cert: tls.client_cert.clone(),
            client_key: tls.client_key.clone(),
        }
    }
}

type TlsAnswer = Result<crate::pg::tls::MakeRustlsConnect, crate::pg::tls::TlsError>;

/// A reading of TLS files in flight: when it began, and who waits for its answer.
struct TlsRead {
    id: u64,
    files: TlsFiles,
    begun: std::time::Instant,
    waiting: Vec<oneshot::Sender<TlsAnswer>>,
}

/// The readings of TLS files in flight.
static TLS_READS: std::sync::Mutex<Vec<TlsRead>> = std::sync::Mutex::new(Vec::new());

/// Tells the readings in [`TLS_READS`] apart (two may read the same files).
static TLS_READ_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// After how many of its connect's bounds a reading still in flight is left to itself and a
/// later attempt begins another ([`TLS_READS_PER_FILES`] at most).
const TLS_READ_STALE_BOUNDS: u32 = 5;

/// Readings of one set of TLS files in flight at most: one that blocks for good (a hung
/// mount) and one more.
const TLS_READS_PER_FILES: usize = 2;

/// A reading in [`TLS_READS`]: when dropped, it is taken off, and everyone waiting gets
/// `built` (an error when there is none: the thread never started, or panicked).
struct TlsReading {
    id: u64,
    files: TlsFiles,
    built: Option<TlsAnswer>,
}

impl Drop for TlsReading {
    fn drop(&mut self) {
        let waiting = {
            let mut reads = TLS_READS.lock().unwrap_or_else(|p| p.into_inner());
            match reads
                .iter()
                .position(|r| r.id == self.id && r.files == self.files)
            {
                Some(i) => reads.swap_remove(i).waiting,
                None => Vec::new(),
            }
        };
        let built = self.built.take().unwrap_or_else(|| {
            Err(crate::pg::tls::TlsError::Thread(std::io::Error::other(
                "it ended without an answer",
            )))
        });
        let mut waiting = waiting.into_iter();
        let last = waiting.next_back();
        for waiter in waiting {
            let _ = waiter.send(match &built {
                Ok(connector) => Ok(connector.clone()),
                Err(err) => Err(err.duplicate()),
            });
        }
        if let Some(waiter) = last {
            let _ = waiter.send(built);
        }
    }
}

/// A duration cut to whole milliseconds, for a log line.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// A blocking job handed to a thread of its own: [`lookup_host`]'s getaddrinfo.
type LookupJob = Box<dyn FnOnce() + Send>;

/// Starts a lookup on a thread of its own, left detached: a lookup that outlives its
/// connect's timeout ends on its own, and the process's exit waits for none.
/// `std::thread::Builder::spawn` returns the OS's refusal (`RLIMIT_NPROC` reached, no room for
/// a stack under `RLIMIT_AS`) where tokio's `spawn_blocking` (under `tokio::net::lookup_host`)
/// panicked and ended the election.
fn spawn_lookup(job: LookupJob) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("lookup".into())
        .spawn(job)
        .map(drop)
}

/// How long a connection waits for its reading of the password file (a local file takes
/// microseconds; one on a hung mount never answers, and the connect must go on).
const PASSFILE_READ_WAIT: Duration = Duration::from_millis(500);

/// Runs `job` on a thread of its own ([`spawn_lookup`]'s), its answer awaited here: blocking
/// file I/O that must not hold the runtime's thread. A job that outlives its caller's
/// timeout ends on its own.
///
/// # Errors
/// The OS refused the thread, or the job ended without an answer (a panic).
async fn off_thread<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let (found, answer) = oneshot::channel();
    spawn_lookup(Box::new(move || {
        let _ = found.send(job());
    }))?;
    answer
        .await
        .map_err(|_| std::io::Error::other("the thread ended without an answer"))
}

/// What a lookup answers, in a form every waiter of one lookup can get a copy of
/// (`std::io::Error` is not `Clone`): the addresses, or the error's kind and text.
type LookupAnswer = Result<Vec<std::net::SocketAddr>, (std::io::ErrorKind, String)>;

/// The lookups in flight, each with the callers waiting for it. A later caller joins the
/// youngest lookup of its name and port while that one is younger than
/// [`LOOKUP_JOIN_WINDOW`], or once [`LOOKUPS_PER_NAME`] of them are in flight; only then does
/// it start another. So a resolver that never answers (a hung NSS module, a DNS server that
/// drops queries) holds at most that many threads per name of the settings, not one per
/// check for as long as it hangs, and one lookup that hangs where a fresh one would answer
/// (an nscd connection gone bad) does not keep the name unresolved for good.
static LOOKUPS: std::sync::Mutex<Vec<Lookup>> = std::sync::Mutex::new(Vec::new());

/// How long a lookup in flight is joined rather than started again.
const LOOKUP_JOIN_WINDOW: Duration = Duration::from_secs(10);

/// The most lookups of one name and port in flight at once.
const LOOKUPS_PER_NAME: usize = 4;

/// One lookup in flight.
struct Lookup {
    /// Tells it from another lookup of the same name.
    id: u64,
    key: LookupKey,
    started: std::time::Instant,
    waiting: Waiters,
}

/// A lookup's host name and port.
type LookupKey = (String, u16);

/// The callers waiting for one lookup's answer.
type Waiters = Vec<oneshot::Sender<LookupAnswer>>;

/// Takes its lookup off [`LOOKUPS`] if the job ends without answering (dropped unrun, or a
/// panic), so its waiters hear that it ended instead of waiting for good.
struct Unanswered {
    id: Option<u64>,
    name: String,
}

impl Unanswered {
    /// Takes the lookup's waiters off [`LOOKUPS`] to give them its answer.
    fn answered(mut self) -> Waiters {
        self.id.take().map(take_lookup).unwrap_or_default()
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            drop(take_lookup(id));
        }
    }
}

/// The addresses of a host name, looked up (getaddrinfo) on a thread that `spawn` starts,
/// the answer awaited here: the runtime's thread goes on meanwhile, and the caller's timeout
/// bounds the wait. A recent lookup of the same name and port still in flight is joined, not
/// started again ([`LOOKUPS`]). An IP literal is parsed without a thread, as tokio's
/// `lookup_host` did. A thread that cannot be started fails this lookup like any other
/// lookup failure (the host's attempt fails, the next check tries again), never panics.
async fn lookup_host(
    name: &str,
    port: u16,
    spawn: impl FnOnce(LookupJob) -> std::io::Result<()>,
) -> std::io::Result<Vec<std::net::SocketAddr>> {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return Ok(vec![std::net::SocketAddr::new(ip, port)]);
    }
    let (found, answer) = oneshot::channel();
    let key = (name.to_owned(), port);
    let id = {
        // A poisoned table only means a panic elsewhere while it was held; its entries
        // are still whole (every change is one push or one removal).
        let mut lookups = LOOKUPS.lock().unwrap_or_else(|p| p.into_inner());
        let mut same: Vec<&mut Lookup> = lookups.iter_mut().filter(|l| l.key == key).collect();
        let count = same.len();
        let youngest = same.iter_mut().max_by_key(|l| l.started);
        match youngest {
            Some(lookup)
                if lookup.started.elapsed() < LOOKUP_JOIN_WINDOW || count >= LOOKUPS_PER_NAME =>
            {
                // Callers whose timeout passed left their senders: no pile-up.
                lookup.waiting.retain(|w| !w.is_closed());
                lookup.waiting.push(found);
                None
            }
            _ => {
                let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lookups.push(Lookup {
                    id,
                    key,
                    started: std::time::Instant::now(),
                    waiting: vec![found],
                });
                Some(id)
            }
        }
    };
    let Some(id) = id else {
        return wait_lookup(name, answer).await;
    };
    // The table is not held here: a job dropped unrun (a refused thread too) takes its entry
    // off it, and whoever joined meanwhile hears that it ended without an answer.
    let unanswered = Unanswered {
        id: Some(id),
        name: name.to_owned(),
    };
    let started = spawn(Box::new(move || {
        use std::net::ToSocketAddrs;
        let found: LookupAnswer = (unanswered.name.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|err| (err.kind(), err.to_string()));
        for waiter in unanswered.answered() {
            let _ = waiter.send(found.clone());
        }
    }));
    if let Err(err) = started {
        return Err(std::io::Error::new(
            err.kind(),
            format!("cannot resolve {name}: no thread for the lookup: {err}"),
        ));
    }
    wait_lookup(name, answer).await
}

/// The answer of the lookup of `name` that `answer` waits for.
async fn wait_lookup(
    name: &str,
    answer: oneshot::Receiver<LookupAnswer>,
) -> std::io::Result<Vec<std::net::SocketAddr>> {
    match answer.await {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err((kind, text))) => Err(std::io::Error::new(kind, text)),
        Err(_) => Err(std::io::Error::other(format!(
            "cannot resolve {name}: the lookup's thread ended without an answer"
        ))),
    }
}

/// Takes a finished lookup's waiters off [`LOOKUPS`].
fn take_lookup(id: u64) -> Waiters {
    let mut lookups = LOOKUPS.lock().unwrap_or_else(|p| p.into_inner());
    match lookups.iter().position(|l| l.id == id) {
        Some(at) => lookups.swap_remove(at).waiting,
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The major of a reported `server_version`, whatever follows it.
    #[test]
    fn the_major_is_the_leading_number_of_server_version() {
        assert_eq!(server_major("15.20 (Debian 15.20-0+deb12u1)"), Some(15));
        assert_eq!(server_major("9.6.24"), Some(9));
        assert_eq!(server_major("18beta1"), Some(18));
        assert_eq!(server_major("13.23"), Some(13));
        assert_eq!(server_major(""), None);
        assert_eq!(server_major("v15"), None);
    }

    /// What the early socket sends is what tokio-postgres itself sends first: the startup
    /// message byte for byte (a driver that changed it would fail every early attempt), and
    /// the SSLRequest.
    #[tokio::test]
    async fn the_early_messages_are_the_drivers_own() {
        for dsn in [
            "host=h user=u dbname=d application_name=leaderrun@x:1",
            "host=h user=u dbname=d options='-c a=b' application_name=x",
            "host=h user=u",
        ] {
            let config: tokio_postgres::Config = dsn.parse().unwrap();
            let ours = startup_message(&config).unwrap();
            let (client, mut server) = tokio::io::duplex(4096);
            let driver = tokio::spawn({
                let config = config.clone();
                async move { config.connect_raw(client, NoTls).await.map(|_| ()) }
            });
            let mut theirs = vec![0u8; ours.len()];
            server.read_exact(&mut theirs).await.unwrap();
            assert_eq!(theirs, ours, "{dsn}");
            drop(server);
            assert!(driver.await.unwrap().is_err(), "the server end closed");
        }
        assert_eq!(ssl_request(), [0, 0, 0, 8, 4, 210, 22, 47]);
        let no_user: tokio_postgres::Config = "host=h dbname=d".parse().unwrap();
        assert_eq!(
            startup_message(&no_user),
            None,
            "the driver's own user lookup"
        );
    }

    /// A lookup that gets no thread fails with the OS's reason and the host's name, never
    /// panics (tokio's `spawn_blocking` did: "OS can't spawn worker thread", the election
    /// ended with exit 125); an IP literal asks for no thread at all; a name is looked up on
    /// the thread. The binary under `RLIMIT_NPROC`:
    /// `connecting::a_name_lookup_without_a_thread_is_a_failed_attempt`.
    #[tokio::test]
    async fn a_lookup_without_a_thread_fails_and_an_address_needs_none() {
        let refused = |_: LookupJob| Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        let err = lookup_host("localhost", 5432, refused).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        assert!(
            err.to_string()
                .starts_with("cannot resolve localhost: no thread for the lookup: Resource"),
            "{err}"
        );
        for (ip, port) in [("127.0.0.1", 1), ("::1", 2)] {
            let addrs = lookup_host(ip, port, refused).await.unwrap();
            assert_eq!(
                addrs,
                [std::net::SocketAddr::new(ip.parse().unwrap(), port)]
            );
        }
        let addrs = lookup_host("localhost", 3, spawn_lookup).await.unwrap();
        assert!(
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 3),
            "{addrs:?}"
        );
        let dropped = lookup_host("localhost", 4, |job: LookupJob| {
            drop(job);
            Ok(())
        });
        let err = dropped.await.unwrap_err();
        assert!(err.to_string().contains("ended without an answer"), "{err}");
    }

    /// A name whose lookup has not answered gets no second thread (a resolver that hangs held
    /// one more thread per check, for as long as it hung): the callers meanwhile join the
    /// lookup in flight and all get its answer; a lookup that ended unanswered lets its
    /// callers go, and the next one starts a thread again.
    #[tokio::test]
    async fn a_lookup_in_flight_is_joined_not_started_again() {
        use std::sync::{Arc, Mutex};
        // Polled once: pending, or its answer.
        async fn now<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
            timeout(Duration::ZERO, fut).await.ok()
        }
        let held: Arc<Mutex<Vec<LookupJob>>> = Arc::default();
        let hold = |held: &Arc<Mutex<Vec<LookupJob>>>| {
            let held = Arc::clone(held);
            move |job: LookupJob| {
                held.lock().unwrap().push(job);
                Ok(())
            }
        };
        let a = lookup_host("localhost", 8, hold(&held));
        let b = lookup_host("localhost", 8, hold(&held));
        let other_port = lookup_host("localhost", 9, hold(&held));
        tokio::pin!(a, b, other_port);
        for fut in [&mut a, &mut b] {
            assert!(now(fut.as_mut()).await.is_none(), "answered unasked");
        }
        assert!(now(other_port.as_mut()).await.is_none());
        let jobs = std::mem::take(&mut *held.lock().unwrap());
        assert_eq!(jobs.len(), 2, "one thread for port 8, one for port 9");
        for job in jobs {
            std::thread::spawn(job).join().unwrap();
        }
        for fut in [a, b, other_port] {
            let addrs = fut.await.unwrap();
            assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()));
        }

        let c = lookup_host("localhost", 10, hold(&held));
        let d = lookup_host("localhost", 10, hold(&held));
        tokio::pin!(c, d);
        assert!(now(c.as_mut()).await.is_none());
        assert!(now(d.as_mut()).await.is_none());
        drop(std::mem::take(&mut *held.lock().unwrap()));
        for fut in [c, d] {
            let err = fut.await.unwrap_err();
            assert!(err.to_string().contains("ended without an answer"), "{err}");
        }
        let again = lookup_host("localhost", 10, spawn_lookup).await.unwrap();
        assert!(!again.is_empty());
    }

    /// A peer that closed the connection after accepting it is not a failed connect: what the
    /// prelude had left counts as sent and no answer is awaited, so the driver's first read
    /// meets the end and reports it as it would have (libpq ends the attempt there too). (A
    /// refused connect stays the attempt's own error: `logs::slips_get_hints_that_say_what_to_check`.)
    #[test]
    fn a_peer_gone_after_the_accept_is_left_to_the_driver() {
        use std::os::fd::AsRawFd;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(theirs);
        let mut prelude = Prelude {
            unsent: ssl_request(),
            after_no_tls: b"startup".to_vec(),
            ..Prelude::default()
        };
        prelude.advance(ours.as_raw_fd());
        assert!(prelude.failed.is_none(), "{:?}", prelude.failed);
        assert_eq!(prelude.sent, ssl_request());
        assert!(prelude.unsent.is_empty() && prelude.after_no_tls.is_empty());
    }

    /// A primed socket absorbs the driver's writes that repeat what went early (split as the
    /// driver likes), passes on the rest, hands over the answer read early first, and fails a
    /// write that differs instead of sending it.
    #[tokio::test]
    async fn a_primed_socket_absorbs_what_was_sent_and_replays_the_answer() {
        let (inner, mut server) = tokio::io::duplex(4096);
        let prelude = Prelude {
            sent: b"hello".to_vec(),
            answer: Some(b'N'),
            ..Prelude::default()
        };
        let mut primed = Primed::new(inner, prelude);
        server.write_all(b"rest").await.unwrap();
        let mut first = [0u8; 1];
        primed.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"N");
        let mut rest = [0u8; 4];
        primed.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"rest");
        primed.write_all(b"he").await.unwrap();
        primed.write_all(b"llo, world").await.unwrap();
        primed.flush().await.unwrap();
        let mut passed = [0u8; 7];
        server.read_exact(&mut passed).await.unwrap();
        assert_eq!(
            &passed, b", world",
            "only what was not sent early reaches the socket"
        );

        let (inner, _server) = tokio::io::duplex(64);
        let prelude = Prelude {
            sent: b"hello".to_vec(),
            ..Prelude::default()
        };
        let mut primed = Primed::new(inner, prelude);
        let err = primed.write_all(b"help").await.unwrap_err();
        assert!(err.to_string().contains("differs"), "{err}");
    }
}
