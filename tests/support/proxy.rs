//! A TCP proxy that can forward, blackhole (stop forwarding in both directions while keeping
//! every socket open, like a partition) and cut (close every connection). A recording proxy
//! also keeps what the server sent on each connection, to read the server's own answers to a
//! client (see [`messages`]), and counts the client's flights (round trips) on each. A
//! severing proxy ends the client's side of a connection together with a chosen answer and
//! keeps the server's side open ([`Proxy::severing`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const FORWARD: u8 = 0;
const BLACKHOLE: u8 = 1;

/// What one connection carried: the bytes the server sent, and the client's flights.
#[derive(Default)]
struct Carried {
    from_server: Vec<u8>,
    /// Runs of client bytes, each ended by bytes from the server: one per round trip the
    /// client waited for, and one for what it sent last.
    client_flights: usize,
    /// The direction of the last bytes: `true` from the client.
    last_from_client: Option<bool>,
}

type Recording = Arc<Mutex<Carried>>;

pub struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    /// Per connection, in accept order; `None` unless recording.
    recordings: Option<Arc<Mutex<Vec<Recording>>>>,
}

/// Where a severing proxy ends a connection's client side: with the server's answer that
/// completes the `nth` occurrence of `pattern` in what the server sent on it.
#[derive(Clone)]
struct Sever {
    pattern: Vec<u8>,
    nth: usize,
    /// Instead of ending the client's side: forward that answer, then blackhole the proxy
    /// ([`Proxy::blackholing_after`]).
    blackhole: bool,
    /// Set once the client's side is ended: from then on nothing reaches the server, and the
    /// server's side stays open (its session, and any lock, with it).
    done: Arc<AtomicBool>,
}

/// Whether the connection of `sever_at` has been severed already.
fn severed(sever_at: &Option<Sever>) -> bool {
    sever_at
        .as_ref()
        .is_some_and(|s| s.done.load(Ordering::Acquire))
}

/// Ends `to` (the client's side) with `bytes`: corked, so the answer and the end of the
/// connection leave in one segment and the client reads both at once.
fn sever(to: &mut TcpStream, bytes: &[u8]) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option of its size.
    unsafe {
        libc::setsockopt(
            to.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let _ = to.write_all(bytes);
    let _ = to.shutdown(Shutdown::Write);
}

/// Connects `client` to `target` and forwards both ways. While the proxy is blackholed the
/// connection is held, not made: a partition keeps the SYN from the server too, so the server
/// starts no backend for it until the path is back. (A backend that starts while PostgreSQL
/// shuts down and never gets its startup packet holds the postmaster's fast shutdown for
/// `authentication_timeout`, 60 s by default, through 17: the fault run's slow restarts.)
fn connect(
    client: TcpStream,
    target: SocketAddr,
    mode: Arc<AtomicU8>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    carried: Option<Recording>,
    sever_at: Option<Sever>,
) {
    while mode.load(Ordering::Acquire) == BLACKHOLE {
        std::thread::sleep(Duration::from_millis(10));
    }
    let Ok(server) = TcpStream::connect(target) else {
        // Refused, as the server itself would refuse it: the client sees its connection end.
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    streams.lock().unwrap().push(server.try_clone().unwrap());
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (m2, carried2, sever_at2) = (mode.clone(), carried.clone(), sever_at.clone());
    std::thread::spawn(move || pump(s2, c2, m2, carried2, false, sever_at2));
    pump(client, server, mode, carried, true, sever_at);
}

/// Forwards `from` to `to`; with `record`, notes the bytes before forwarding them (so a
/// reply is always noted after what it answers), `from_client` saying which side `from` is.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mode: Arc<AtomicU8>,
    record: Option<Recording>,
    from_client: bool,
    sever_at: Option<Sever>,
) {
    from.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    let mut seen = 0;
    loop {
        if severed(&sever_at) {
            // Severed: the server's side stays open and is told nothing.
            return;
        }
        if mode.load(Ordering::Acquire) == BLACKHOLE {
            // Leave the bytes in the kernel's buffers: nothing gets through, nothing closes.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                if !severed(&sever_at) {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(_) if severed(&sever_at) => {
                return;
            }
            Ok(n) => {
                // A read that was under way when the path was blackholed: its bytes wait for
                // the path to come back, as a partition's would.
                while mode.load(Ordering::Acquire) == BLACKHOLE {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if let Some(record) = &record {
                    let mut carried = record.lock().unwrap();
                    if from_client && carried.last_from_client != Some(true) {
                        carried.client_flights += 1;
                    }
                    carried.last_from_client = Some(from_client);
                    if !from_client {
                        carried.from_server.extend_from_slice(&buf[..n]);
                    }
                }
                if let Some(sever_at) = sever_at.as_ref().filter(|_| !from_client) {
                    let chunk = &buf[..n];
                    seen += chunk
                        .windows(sever_at.pattern.len())
                        .filter(|w| *w == sever_at.pattern.as_slice())
                        .count();
                    // The answer is complete at its ReadyForQuery ('Z', length 5, status).
                    let ready = n >= 6 && chunk[n - 6..n - 1] == [b'Z', 0, 0, 0, 5];
                    if seen >= sever_at.nth && ready && sever_at.blackhole {
                        // Forwarded, then nothing more: in this thread, so that no client can
                        // send another flight through before the path is blackholed.
                        let _ = to.write_all(chunk);
                        mode.store(BLACKHOLE, Ordering::Release);
                        continue;
                    }
                    if seen >= sever_at.nth && ready {
                        sever_at.done.store(true, Ordering::Release);
                        sever(&mut to, chunk);
                        return;
                    }
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                if !severed(&sever_at) {
                    let _ = to.shutdown(Shutdown::Both);
                }
                return;
            }
        }
    }
}

/// Why a test that partitions through a [`Proxy`] needs `idle_session_timeout` (PostgreSQL 14
/// and later): the proxy's sockets keep answering the server's TCP keepalives, so only that
/// setting frees the lock of a leader behind it.
pub const PARTITION_NEEDS_IDLE_SESSION_TIMEOUT: &str =
    "the test partitions through a userspace proxy, whose sockets keep answering the \
     server's TCP keepalives, so only idle_session_timeout frees the lock here \
     (safety::the_lock_session_carries_tcp_timers_and_13_says_so_once covers 13's TCP bound)";

impl Proxy {
    /// Listens on 127.0.0.1 (any free port) and forwards each connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        Proxy::start_with(target, false, None)
    }

    /// Like [`Proxy::start`], and keeps every byte the server sends on each connection.
    pub fn recording(target: SocketAddr) -> Proxy {
        Proxy::start_with(target, true, None)
    }

    /// Like [`Proxy::start`], and on each connection ends the client's side together with the
    /// server's answer that completes the `nth` occurrence of `pattern` (the answer and the end
    /// in one TCP segment), while the server's side stays open, its session and any lock with
    /// it, until [`Proxy::cut`]: a client that finds its connection ended right after an answer
    /// whose effects the server still keeps.
    #[allow(dead_code)]
    pub fn severing(target: SocketAddr, pattern: &[u8], nth: usize) -> Proxy {
        Proxy::start_with(target, false, Some((pattern.to_vec(), nth, false)))
    }

    /// Like [`Proxy::start`], and blackholes every connection ([`Proxy::blackhole`]) right
    /// after it forwarded the server's answer that completes the first occurrence of `pattern`:
    /// the client has that answer, and nothing it sends after it gets through.
    #[allow(dead_code)]
    pub fn blackholing_after(target: SocketAddr, pattern: &[u8]) -> Proxy {
        Proxy::start_with(target, false, Some((pattern.to_vec(), 1, true)))
    }

    /// Whether the proxy is blackholed now.
    #[allow(dead_code)]
    pub fn is_blackholed(&self) -> bool {
        self.mode.load(Ordering::Acquire) == BLACKHOLE
    }

    fn start_with(
        target: SocketAddr,
        record: bool,
        sever_at: Option<(Vec<u8>, usize, bool)>,
    ) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let recordings = record.then(|| Arc::new(Mutex::new(Vec::new())));
        let (m, st, rec) = (mode.clone(), streams.clone(), recordings.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                st.lock().unwrap().push(client.try_clone().unwrap());
                let carried = rec.as_ref().map(|all: &Arc<Mutex<Vec<Recording>>>| {
                    let one = Recording::default();
                    all.lock().unwrap().push(one.clone());
                    one
                });
                let sever_at = sever_at.clone().map(|(pattern, nth, blackhole)| Sever {
                    pattern,
                    nth,
                    blackhole,
                    done: Arc::new(AtomicBool::new(false)),
                });
                let (m, st) = (m.clone(), st.clone());
                // A thread per connection: one that waits for the path to come back must not
                // hold up the accept of the next.
                std::thread::spawn(move || connect(client, target, m, st, carried, sever_at));
            }
        });
        Proxy {
            addr,
            mode,
            streams,
            recordings,
        }
    }

    /// What the server sent so far on each connection, in the order they were accepted.
    pub fn server_bytes(&self) -> Vec<Vec<u8>> {
        let all = self.recordings.as_ref().expect("a recording proxy");
        let all = all.lock().unwrap();
        all.iter()
            .map(|r| r.lock().unwrap().from_server.clone())
            .collect()
    }

    /// How many flights the client sent on each connection so far, in accept order: the
    /// round trips it waited for, and its last flight (a Terminate, say).
    #[allow(dead_code)]
    pub fn client_flights(&self) -> Vec<usize> {
        let all = self.recordings.as_ref().expect("a recording proxy");
        let all = all.lock().unwrap();
        all.iter()
            .map(|r| r.lock().unwrap().client_flights)
            .collect()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A DSN that reaches the cluster through this proxy (as `postgres`, database `postgres`).
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port()
        )
    }

    pub fn forward(&self) {
        self.mode.store(FORWARD, Ordering::Release);
    }

    pub fn blackhole(&self) {
        self.mode.store(BLACKHOLE, Ordering::Release);
    }

    /// Closes every connection made so far.
    #[allow(dead_code)]
    pub fn cut(&self) {
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// The messages of a PostgreSQL server's side of a connection (`sslmode=disable`, so it starts
/// with the first typed message): `(type, body)`; a trailing partial message is left out.
pub fn messages(mut bytes: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        if len < 4 || bytes.len() < 1 + len {
            break;
        }
        out.push((bytes[0], &bytes[5..1 + len]));
        bytes = &bytes[1 + len..];
    }
    out
}

/// The columns of a DataRow (`D`) body; `None` for SQL NULL.
pub fn data_row(mut body: &[u8]) -> Vec<Option<&[u8]>> {
    let mut cols = Vec::new();
    let n = i16::from_be_bytes(body[..2].try_into().unwrap());
    body = &body[2..];
    for _ in 0..n {
        let len = i32::from_be_bytes(body[..4].try_into().unwrap());
        body = &body[4..];
        if len < 0 {
            cols.push(None);
        } else {
            cols.push(Some(&body[..len as usize]));
            body = &body[len as usize..];
        }
    }
    cols
}
