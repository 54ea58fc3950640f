//! The HTTP port under abuse, through the binary against a real PostgreSQL: a huge announced
//! body, a client that pipelines and never reads, idle connections beyond the descriptor
//! limit, a slowloris. In each the leader keeps leading, COMMAND keeps running, `/healthz` and
//! `/readyz` answer fast (the figures are printed), and the port serves again afterwards.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use leaderrun::cli::http::{
    CONNECTION_LIFETIME, HEAD_TIMEOUT, MAX_CONNECTIONS, MAX_REQUESTS_PER_CONNECTION,
};

use crate::support::{
    leaderrun, probe_addr, secs, unique_lock_id, wait_for, Cluster, Replica, Scratch,
};

/// The bound (docs/guarantees.md#observing-a-replica) for a probe's answer while others misbehave.
const PROBE_BOUND: Duration = Duration::from_millis(100);
/// What a single probe may take on a loaded 2-core machine (other tests and builds running):
/// the median must meet [`PROBE_BOUND`], the worst of several this.
const PROBE_WORST: Duration = Duration::from_millis(250);
/// Probes per measurement.
const PROBES: usize = 16;
/// Scheduling slack on top of the server's time limits.
const SLACK: Duration = Duration::from_secs(3);

/// One HTTP/1.0 request on a new connection; the status code (0 for none) and how long the
/// whole exchange took, from connect to the server's close.
fn timed(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let (status, _, took) = timed_answer(addr, path);
    (status, took)
}

/// A probe's status, body and round-trip time.
fn timed_answer(addr: SocketAddr, path: &str) -> (u16, String, Duration) {
    let begun = Instant::now();
    let mut stream = TcpStream::connect_timeout(&addr, secs(2.0)).expect("connect to the port");
    stream.set_read_timeout(Some(secs(2.0))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let took = begun.elapsed();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    (status, body.to_owned(), took)
}

/// [`PROBES`] probes, `/healthz` and `/readyz` in turn: each must answer its probe (below); the
/// median must be within [`PROBE_BOUND`] and the worst within [`PROBE_WORST`], in at least one
/// of [`ROUNDS`] rounds. The rest of the suite shares the 2 cores: a round can read slow because
/// the scheduler gave leaderrun's one HTTP thread no CPU, which is no property of the server
/// (in CI the flood's median once read 141 ms); a server that keeps probes waiting behind a
/// flood fails every round. Prints the figures.
///
/// `/healthz` must be 200. `/readyz` must be 200, or 503 for a check that failed to reach the
/// server in time: starved of CPU the same way, a 200 ms leader check can miss its deadline,
/// and then the leader is demoted and rightly not ready (CI saw it once on PostgreSQL 14). That
/// is the election's answer, not the port's; any other answer fails.
fn probes_answer_fast(addr: SocketAddr, during: &str) {
    const ROUNDS: usize = 3;
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let mut times: Vec<Duration> = (0..PROBES)
            .map(|i| {
                let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
                let (status, body, took) = timed_answer(addr, path);
                let demoted = path == "/readyz"
                    && status == 503
                    && body.starts_with("cannot reach the server");
                if demoted {
                    println!("{path} during {during}: 503, {body}");
                }
                assert!(
                    status == 200 || demoted,
                    "{path} during {during} answered {status}: {body}"
                );
                took
            })
            .collect();
        times.sort();
        let (median, worst) = (times[PROBES / 2], times[PROBES - 1]);
        println!(
            "probes during {during}: median {:.1} ms, max {:.1} ms over {PROBES}",
            median.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3
        );
        if median <= PROBE_BOUND && worst <= PROBE_WORST {
            return;
        }
        rounds.push((median, worst));
    }
    panic!("probes during {during}, (median, max) of each round: {rounds:?}");
}

/// Whether the server closed (or reset) this connection, waiting up to `within`.
fn closed_by_server(stream: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fd = libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut fd, 1, ms) };
        if fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
}

fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

fn descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A leader serving the port, with `exec sleep 600` as COMMAND, started and ready.
struct Leading {
    replica: Replica,
    scratch: Scratch,
    addr: SocketAddr,
    child: i32,
}

impl Leading {
    fn start(descriptor_limit: Option<u64>) -> Leading {
        Leading::start_on("127.0.0.1:0", descriptor_limit)
    }

    /// Started with `--http-addr http_addr` (its port 0: the log says which it bound).
    fn start_on(http_addr: &str, descriptor_limit: Option<u64>) -> Leading {
        let cluster = Cluster::shared();
        let scratch = Scratch::new();
        let job = scratch.child_script("job.sh", "exec sleep 600");
        let mut cmd = leaderrun();
        cmd.args(["--dsn", &cluster.dsn()])
            .args(["--lock-id", &unique_lock_id().to_string()])
            .args(["--check-interval", "200ms", "--http-addr", http_addr])
            .arg("--")
            .arg(&job);
        if let Some(limit) = descriptor_limit {
            crate::support::descriptor_limit(&mut cmd, limit);
        }
        let replica = Replica::spawn(cmd);
        let child = scratch.wait_starts(1, secs(10.0))[0].pid;
        let addr = probe_addr(&replica);
        wait_for("the leader to be ready", secs(5.0), || {
            (timed(addr, "/readyz").0 == 200).then_some(())
        });
        Leading {
            replica,
            scratch,
            addr,
            child,
        }
    }

    /// Still leading in its first term with its first child, which still runs; nothing in
    /// the log says it panicked.
    fn still_leads(&mut self) {
        assert!(
            self.replica.running(),
            "leaderrun exited:\n{}",
            self.replica.log()
        );
        let starts = self.scratch.starts();
        assert_eq!(
            starts.len(),
            1,
            "COMMAND restarted: {starts:?}; log:\n{}",
            self.replica.log()
        );
        assert!(crate::support::alive(self.child), "COMMAND died");
        let log = self.replica.log();
        assert!(!log.contains("panicked"), "{log}");
        assert!(!log.contains("demot"), "{log}");
    }
}

/// The status code of the answer on `stream`, or 0 when it closed without one.
fn status_of(stream: &mut TcpStream) -> u16 {
    stream.set_read_timeout(Some(secs(5.0))).unwrap();
    let mut head = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match stream.read(&mut head[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    String::from_utf8_lossy(&head[..got])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_huge_announced_body_is_never_read_nor_ends_anything() {
    let mut leading = Leading::start(None);
    let huge = "99999999999999";
    let cases: [(&str, u16); 5] = [
        // A known path and method: answered, the body ignored.
        (
            &format!("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {huge}\r\n\r\n"),
            200,
        ),
        (
            &format!("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {huge}\r\n\r\n"),
            405,
        ),
        (
            "PUT /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             ffffffffffffff\r\n",
            405,
        ),
        // Past u64: a bad request.
        (
            "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
            400,
        ),
        (
            &format!("GET /nope HTTP/1.0\r\nContent-Length: {huge}\r\n\r\n"),
            404,
        ),
    ];
    // A head larger than the server's buffer, or with too many headers: refused, not grown.
    let long_head = format!(
        "GET /healthz HTTP/1.1\r\nX-Long: {}\r\n\r\n",
        "a".repeat(16 << 10)
    );
    let many_headers = format!(
        "GET /healthz HTTP/1.1\r\n{}\r\n",
        "X-Many: a\r\n".repeat(64)
    );
    let too_large = [(long_head.as_str(), 431), (many_headers.as_str(), 431)];
    for (request, expected) in cases.into_iter().chain(too_large) {
        let mut stream = TcpStream::connect(leading.addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        // Some of the body it announced; the server must not wait for the rest.
        let _ = stream.write_all(&[b'a'; 64 * 1024]);
        assert_eq!(status_of(&mut stream), expected, "{request:?}");
        assert!(
            closed_by_server(&stream, CONNECTION_LIFETIME + SLACK),
            "{request:?}: the connection stayed open"
        );
    }
    probes_answer_fast(leading.addr, "after huge bodies");
    leading.still_leads();
}

/// Writes `request` over and over, never reading, until the server stops taking them: whether
/// it stalled (the answers filled the buffers) rather than closed the connection, and how many
/// requests were written.
fn pipeline_until_stopped(stream: &TcpStream, request: &[u8]) -> (bool, usize) {
    stream.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    let mut writer = stream;
    let stalled = loop {
        match writer.write(request) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
            Err(_) => break false,
        }
        assert!(
            sent < 256 << 20,
            "the server kept reading {sent} bytes of requests"
        );
    };
    (stalled, sent / request.len())
}

#[test]
fn clients_that_pipeline_and_never_read_hold_up_no_probe() {
    let mut leading = Leading::start(None);
    let addr = leading.addr;
    // A client that reads: pipelined requests are answered in order, up to the limit per
    // connection; the last answer says it closes.
    let mut reader = TcpStream::connect(addr).unwrap();
    reader.set_read_timeout(Some(secs(5.0))).unwrap();
    let pipelined = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        .repeat(MAX_REQUESTS_PER_CONNECTION as usize + 10);
    reader.write_all(pipelined.as_bytes()).unwrap();
    let mut answers = String::new();
    let _ = reader.read_to_string(&mut answers);
    assert_eq!(
        answers.matches("HTTP/1.1 200 OK").count(),
        MAX_REQUESTS_PER_CONNECTION as usize,
        "{answers}"
    );
    assert_eq!(answers.matches("connection: close").count(), 1, "{answers}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two clients, each pipelining requests on one connection until the server stops taking
    // them, then on a new one, keeping every connection open and never reading an answer.
    // One pipelines scrapes, the other probes: a probe is answered at once only as a
    // connection's first request (before, every pipelined probe was, up to hyper's 16 a turn
    // per connection, and a flood of them held the real probes past 200 ms).
    let abusers: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let request: &[u8] = if i == 0 {
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                } else {
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                };
                let mut held = Vec::new();
                let (mut stalled, mut sent) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && held.len() < 200 {
                    let stream = TcpStream::connect(addr).expect("a non-reader's connect");
                    let (stopped_reading, requests) = pipeline_until_stopped(&stream, request);
                    stalled += usize::from(stopped_reading);
                    sent += requests;
                    held.push((Instant::now(), stream));
                }
                (held, stalled, sent)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    probes_answer_fast(addr, "two pipelining non-readers");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for abuser in abusers {
        let (held, stalled, sent) = abuser.join().unwrap();
        println!(
            "a non-reader pipelined {sent} requests on {} connections, {stalled} of which \
             the server stopped reading (the others it closed)",
            held.len()
        );
        // Each is closed by the server: after its request limit, or at its time limit.
        for (opened, stream) in &held {
            let left =
                (*opened + CONNECTION_LIFETIME + SLACK).saturating_duration_since(Instant::now());
            assert!(
                closed_by_server(stream, left),
                "a non-reader's connection outlived the time limit"
            );
        }
    }
    probes_answer_fast(addr, "after the non-readers");
    leading.still_leads();
}

/// Two ways of asking `/metrics` too often, at once: a client that keeps opening connections,
/// pipelines a hundred scrapes on each, never reads and drops each after half a second, and
/// many scrapers in parallel, each on a new connection. Every probe still answers fast: the
/// accept loop takes several waiting connections per turn, its backlog holds everyone
/// connecting at once, and one rendering answers the scrapes of the next few milliseconds.
/// Before, the probes waited up to 0.9 s behind the first and a second (a dropped SYN) behind
/// the second.
#[test]
fn a_flood_of_scrapes_holds_up_no_probe() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    const SCRAPERS: usize = 32;
    /// Stops the flood's threads however the test ends: left running after a failed
    /// assertion, 33 threads that reconnect at once to a closed port kept both cores busy for
    /// the rest of the suite.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    /// The flood's clients stand for remote ones: on this machine they run at nice 19, so
    /// that 33 busy client threads on 2 cores measure how the server shares its work, not
    /// how the scheduler shares the CPU between leaderrun and its attackers (at nice 0, with
    /// the rest of the suite running, the probes' median read 0.1–0.6 s).
    fn flooder() {
        // SAFETY: setpriority on this thread's own id.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
    }
    let mut leading = Leading::start(None);
    let addr = leading.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let scraped = Arc::new(AtomicUsize::new(0));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            flooder();
            let requests = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100);
            let mut held: std::collections::VecDeque<(Instant, TcpStream)> = Default::default();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(stream) = TcpStream::connect_timeout(&addr, secs(1.0)) {
                    stream.set_nonblocking(true).unwrap();
                    let _ = (&stream).write(requests.as_bytes());
                    held.push_back((Instant::now(), stream));
                }
                while held
                    .front()
                    .is_some_and(|(at, _)| at.elapsed() > Duration::from_millis(500))
                {
                    held.pop_front();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|_| {
            let (stop, scraped) = (stop.clone(), scraped.clone());
            std::thread::spawn(move || {
                flooder();
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = TcpStream::connect_timeout(&addr, secs(1.0)) else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = stream.set_read_timeout(Some(secs(2.0)));
                    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
                    let mut answer = Vec::new();
                    let _ = stream.read_to_end(&mut answer);
                    if answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200") {
                        scraped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    wait_for("the scrapers to get answers", secs(10.0), || {
        (scraped.load(Ordering::Relaxed) >= 500).then_some(())
    });
    probes_answer_fast(
        addr,
        &format!("a pipelining flood and {SCRAPERS} parallel scrapers"),
    );
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    for scraper in scrapers {
        scraper.join().unwrap();
    }
    println!("scrapes answered: {}", scraped.load(Ordering::Relaxed));
    probes_answer_fast(addr, "after the flood");
    leading.still_leads();
}

/// A flood of connections that send nothing closes no probe's connection before its request
/// is answered, also a probe that takes a millisecond between its connect and its request (a
/// client on a busy machine): the server keeps enough connections that the flood must have
/// 128 accepted within that moment. Before, with 32, a flood closed about one probe in two
/// hundred unanswered (in half the runs of this test).
#[test]
fn a_flood_of_silent_connections_closes_no_probe_unanswered() {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const PROBES: usize = 200;
    /// Per flooding thread: more than the server keeps, within a test's descriptors.
    const HELD: usize = 150;
    let mut leading = Leading::start(None);
    let addr = leading.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut held, mut opened) = (VecDeque::new(), 0usize);
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(stream) = TcpStream::connect_timeout(&addr, secs(1.0)) {
                        held.push_back(stream);
                        opened += 1;
                    }
                    if held.len() > HELD {
                        held.pop_front();
                    }
                }
                opened
            })
        })
        .collect();
    let unanswered = (0..PROBES)
        .filter(|i| {
            let mut stream = TcpStream::connect_timeout(&addr, secs(5.0)).expect("connect");
            stream.set_read_timeout(Some(secs(5.0))).unwrap();
            // The client's moment (a busy machine): the flood goes on meanwhile.
            std::thread::sleep(Duration::from_millis(1));
            let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
            let _ = write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
            let mut raw = Vec::new();
            let _ = stream.read_to_end(&mut raw);
            !raw.starts_with(b"HTTP/1.")
        })
        .count();
    stop.store(true, Ordering::Relaxed);
    let opened: usize = flooders.into_iter().map(|f| f.join().unwrap()).sum();
    println!("{opened} silent connections opened; {unanswered} of {PROBES} probes unanswered");
    assert_eq!(unanswered, 0, "probes closed without an answer");
    probes_answer_fast(addr, "after the flood of silent connections");
    leading.still_leads();
}

#[test]
fn idle_connections_beyond_the_descriptor_limit_add_no_thread_nor_close_the_port() {
    // Fewer descriptors than the idle clients below: the server must keep to its share.
    let limit = 96;
    let mut leading = Leading::start(Some(limit));
    let pid = leading.replica.pid();
    let (threads_before, fds_before) = (threads(pid), descriptors(pid));
    // Four times what the server keeps under that limit (a quarter of it).
    let idle: Vec<TcpStream> = (0..limit as usize)
        .map(|_| TcpStream::connect(leading.addr).unwrap())
        .collect();
    // Half a request on some, nothing on the others.
    for mut stream in idle.iter().step_by(2) {
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHo").unwrap();
    }
    probes_answer_fast(leading.addr, &format!("{} idle connections", idle.len()));
    let (threads_during, fds_during) = (threads(pid), descriptors(pid));
    println!(
        "with {} idle connections (descriptor limit {limit}): threads {threads_before} -> \
         {threads_during}, descriptors {fds_before} -> {fds_during}",
        idle.len()
    );
    assert!(
        threads_during <= threads_before + 1,
        "{threads_during} threads"
    );
    assert!(fds_during < limit as usize, "{fds_during} descriptors");
    // The oldest were closed to make room; the rest time out as idle.
    assert!(closed_by_server(&idle[0], Duration::ZERO));
    for stream in &idle {
        assert!(
            closed_by_server(stream, HEAD_TIMEOUT + SLACK),
            "an idle connection stayed open"
        );
    }
    drop(idle);
    probes_answer_fast(leading.addr, "after the idle clients left");
    leading.still_leads();
}

#[test]
fn slow_clients_are_cut_off_and_hold_up_no_probe() {
    let mut leading = Leading::start(None);
    // Fewer than the server keeps, so only the time limits can end them. The slowloris
    // connections send a request head a byte at a time: the limit on a head ends them.
    let mut slow: Vec<TcpStream> = (0..MAX_CONNECTIONS / 2)
        .map(|_| {
            let mut stream = TcpStream::connect(leading.addr).unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
                .unwrap();
            stream
        })
        .collect();
    // One more sends a whole request every 500 ms, each within the limit on a head, and never
    // reads an answer: the limit on a connection's life ends it.
    let mut steady = TcpStream::connect(leading.addr).unwrap();
    let begun = Instant::now();
    let (mut slow_closed, mut steady_closed) = (None, None);
    let mut tick = 0u32;
    while begun.elapsed() < CONNECTION_LIFETIME + SLACK {
        let mut open = 0;
        for stream in &mut slow {
            if !closed_by_server(stream, Duration::ZERO) {
                open += 1;
                let _ = stream.write_all(b"a");
            }
        }
        if open == 0 && slow_closed.is_none() {
            slow_closed = Some(begun.elapsed());
        }
        if steady_closed.is_none() {
            if closed_by_server(&steady, Duration::ZERO) {
                steady_closed = Some(begun.elapsed());
            } else if tick % 5 == 0 {
                let _ = steady.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
            }
        }
        if slow_closed.is_some() && steady_closed.is_some() {
            break;
        }
        if tick % 5 == 0 && begun.elapsed() < HEAD_TIMEOUT / 2 {
            probes_answer_fast(leading.addr, "a slowloris");
        }
        tick += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let slow_closed = slow_closed.expect("slowloris connections stayed open");
    let steady_closed = steady_closed.expect("the steady non-reader stayed open");
    println!(
        "slowloris connections all closed after {slow_closed:?}, the steady non-reader after \
         {steady_closed:?}"
    );
    assert!(slow_closed >= HEAD_TIMEOUT / 2, "{slow_closed:?}");
    assert!(
        steady_closed + SLACK / 3 >= CONNECTION_LIFETIME,
        "{steady_closed:?}"
    );
    probes_answer_fast(leading.addr, "after the slow clients");
    leading.still_leads();
}

/// RFC 9112 §3.2: an HTTP/1.1 request without `Host` is answered 400; with it, or in
/// HTTP/1.0, the probe answers.
#[test]
fn an_http_1_1_request_without_host_is_a_bad_request() {
    let mut leading = Leading::start(None);
    let ask = |request: &str| {
        let mut stream = TcpStream::connect(leading.addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        status_of(&mut stream)
    };
    assert_eq!(
        ask("GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"),
        400
    );
    assert_eq!(
        ask("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        200
    );
    assert_eq!(ask("GET /healthz HTTP/1.0\r\n\r\n"), 200);
    leading.still_leads();
}

#[test]
fn a_port_that_cannot_be_bound_exits_125_and_runs_nothing() {
    let cluster = Cluster::shared();
    let scratch = Scratch::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let mut cmd = leaderrun();
    cmd.args(["--dsn", &cluster.dsn()])
        .args(["--lock-id", &unique_lock_id().to_string()])
        .args([
            "--check-interval",
            "200ms",
            "--http-addr",
            &addr.to_string(),
        ])
        .arg("--")
        .arg(&job);
    let mut replica = Replica::spawn(cmd);
    let status = replica.wait_exit(secs(10.0));
    assert_eq!(status.code(), Some(125), "log:\n{}", replica.log());
    assert!(replica.log().contains("ERROR"), "{}", replica.log());
    assert!(scratch.starts().is_empty(), "COMMAND ran");
}

/// `:PORT` is every interface, IPv6 and IPv4 alike (docs/guarantees.md#observing-a-replica):
/// the probes answer on 127.0.0.1 and, where this machine has IPv6, on ::1.
#[test]
fn colon_port_serves_every_interface_ipv4_and_ipv6() {
    let leading = Leading::start_on(":0", None);
    let bound = leading.addr;
    let ipv6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    if ipv6 {
        assert_eq!(bound.ip(), std::net::Ipv6Addr::UNSPECIFIED, "{bound}");
    }
    let port = bound.port();
    let mut addrs = vec![SocketAddr::from(([127, 0, 0, 1], port))];
    if ipv6 {
        addrs.push(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)));
    } else {
        println!("no IPv6 on this machine: only 127.0.0.1 checked");
    }
    for addr in addrs {
        let (status, _) = timed(addr, "/healthz");
        assert_eq!(status, 200, "/healthz on {addr}");
    }
}
