//! The library's `Elector` against a real PostgreSQL: term, do_as_leader, is_leader, the gauge,
//! concurrent runs and the panic path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderrun::{Config, Done, Elector, Error, LockKey, TermEnd};
use prometheus::Registry;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{unique_lock_id, Cluster, CLASS};

const WAIT: Duration = Duration::from_secs(5);

fn config(id: i32, registry: Option<Registry>) -> Config {
    let mut config = Config::new(Cluster::shared().config());
    config.lock = LockKey { class: CLASS, id };
    config.check_interval = Duration::from_millis(200);
    config.registry = registry;
    config
}

struct Running {
    elector: Elector,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), Error>>,
}

fn run(elector: &Elector) -> Running {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (elector, cancel) = (elector.clone(), cancel.clone());
        async move { elector.run(cancel).await }
    });
    Running {
        elector: elector.clone(),
        cancel,
        task,
    }
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        timeout(WAIT, self.task)
            .await
            .expect("run returns after cancel")
            .expect("run did not panic")
            .expect("run returns Ok");
        assert!(!self.elector.is_leader());
    }
}

fn gauge_values(registry: &Registry) -> Vec<f64> {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == leaderrun::elector::GAUGE_NAME)
        .flat_map(|f| f.get_metric().iter().map(|m| m.get_gauge().get_value()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_do_and_is_leader_follow_the_seed() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let a = Elector::new(config(id, None)).unwrap();
    let b = Elector::new(config(id, None)).unwrap();
    assert!(!a.is_leader());
    assert!(a.term().is_ended(), "a standby's term has already ended");
    assert_eq!(a.term().number(), 0);

    let run_a = run(&a);
    let term = timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    assert!(a.is_leader());
    assert_eq!(term.number(), 1);
    let lease = term.lease().expect("a leader's term has a lease").clone();
    assert_eq!(cluster.lock_holders(CLASS, id), vec![lease.backend_pid]);

    let run_b = run(&b);
    // Standby: the work is not run.
    let called = AtomicBool::new(false);
    let done = b
        .do_as_leader(|_| async { called.store(true, Ordering::SeqCst) })
        .await;
    assert_eq!(done, Done::Standby);
    assert!(!called.load(Ordering::SeqCst));
    assert!(b.term().is_ended());

    // Leader, leadership held: ran, with the work's result.
    assert_eq!(a.do_as_leader(|_| async { 42 }).await, Done::Ran(42));

    // Leader, leadership lost while the work runs: not a failure. The lock session is
    // terminated; the term must end on the connection's EOF, well before a 10-interval bound.
    let killer = cluster.client().await;
    let done = a
        .do_as_leader(|term| async move {
            killer
                .execute("SELECT pg_terminate_backend($1)", &[&lease.backend_pid])
                .await
                .unwrap();
            timeout(Duration::from_secs(2), term.ended()).await
        })
        .await;
    assert_eq!(done, Done::Lost);
    assert_eq!(term.end_cause(), Some(TermEnd::LeadershipLost));
    assert!(!a.is_leader());

    // Someone leads again (b, or a on its next check), with a greater fencing token.
    let next = timeout(WAIT, async {
        tokio::select! {
            t = a.wait_for_term() => t,
            t = b.wait_for_term() => t,
        }
    })
    .await
    .expect("a new leader");
    assert!(next.lease().unwrap().fencing_token > lease.fencing_token);

    // Cancelling the leader resigns: the term ends as Resigned and the other takes over.
    let (leader_run, other) = if a.is_leader() {
        (run_a, run_b)
    } else {
        (run_b, run_a)
    };
    leader_run.stop().await;
    assert_eq!(next.end_cause(), Some(TermEnd::Resigned));
    timeout(WAIT, other.elector.wait_for_term())
        .await
        .expect("the other replica takes over after a release");
    other.stop().await;
    assert!(cluster.lock_holders(CLASS, id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_concurrent_run_is_refused_and_a_later_one_works() {
    let elector = Elector::new(config(unique_lock_id(), None)).unwrap();
    let first = run(&elector);
    timeout(WAIT, elector.wait_for_term()).await.expect("leads");
    let second = elector.run(CancellationToken::new()).await;
    assert!(matches!(second, Err(Error::AlreadyRunning)), "{second:?}");
    assert!(elector.is_leader(), "the refused call disturbed nothing");
    first.stop().await;

    let again = run(&elector);
    let term = timeout(WAIT, elector.wait_for_term())
        .await
        .expect("leads again");
    assert_eq!(term.number(), 2);
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_sharing_a_registry_write_one_series() {
    let id = unique_lock_id();
    let shared = Registry::new();
    let own = Registry::new();
    let a = Elector::new(config(id, Some(shared.clone()))).unwrap();
    let b = Elector::new(config(id, Some(shared.clone()))).unwrap();
    let c = Elector::new(config(id, Some(own.clone()))).unwrap();
    assert_eq!(gauge_values(&shared), [0.0]);
    assert_eq!(gauge_values(&own), [0.0]);

    let run_a = run(&a);
    timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    let run_b = run(&b);
    let run_c = run(&c);
    assert_eq!(gauge_values(&shared), [1.0]);
    assert_eq!(gauge_values(&own), [0.0]);

    // a resigns, b or c takes over; the shared series follows whoever of a and b leads.
    run_a.stop().await;
    let b_or_c = timeout(WAIT, async {
        tokio::select! {
            _ = b.wait_for_term() => "b",
            _ = c.wait_for_term() => "c",
        }
    })
    .await
    .expect("a new leader");
    match b_or_c {
        "b" => {
            assert_eq!(gauge_values(&shared), [1.0]);
            assert_eq!(gauge_values(&own), [0.0]);
        }
        _ => {
            assert_eq!(gauge_values(&shared), [0.0]);
            assert_eq!(gauge_values(&own), [1.0]);
        }
    }
    run_b.stop().await;
    run_c.stop().await;
    assert_eq!(gauge_values(&shared), [0.0]);
    assert_eq!(gauge_values(&own), [0.0]);
}

/// A layer that records every event and panics (once) on the first successful leader check.
#[derive(Clone, Default)]
struct PanicOnCheck {
    events: Arc<Mutex<Vec<(tracing::Level, String)>>>,
    fired: Arc<AtomicBool>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicOnCheck {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        self.events.lock().unwrap().push((level, message.0.clone()));
        if message.0 == "leader check ok" && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("injected panic in the election");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_run_ends_the_term_and_abandons_the_lock() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let registry = Registry::new();
    let elector = Elector::new(config(id, Some(registry.clone()))).unwrap();
    let layer = PanicOnCheck::default();
    let subscriber = tracing_subscriber::registry().with(layer.clone());
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.run(CancellationToken::new()).await }.with_subscriber(subscriber)
    });
    let term = timeout(WAIT, elector.wait_for_term()).await.expect("leads");
    let backend = term.lease().unwrap().backend_pid;
    let joined = timeout(WAIT, task).await.expect("run ends by the panic");
    assert!(joined.expect_err("run panicked").is_panic());

    assert_eq!(term.end_cause(), Some(TermEnd::LeadershipLost));
    assert!(!elector.is_leader());
    assert_eq!(gauge_values(&registry), [0.0]);
    assert!(layer.events.lock().unwrap().contains(&(
        tracing::Level::WARN,
        "background leader lock abandoned after a panic".into()
    )));
    // The session was closed without unlock: the server frees the lock with the session.
    timeout(WAIT, async {
        while !cluster.lock_holders(CLASS, id).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the abandoned lock is freed");
    assert!(cluster
        .sql(&format!(
            "SELECT 1 FROM pg_stat_activity WHERE pid = {backend}"
        ))
        .is_empty());

    // A later run works.
    let again = run(&elector);
    timeout(WAIT, elector.wait_for_term())
        .await
        .expect("leads after the panic");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_leaders_failure_no_longer_fails_readiness() {
    let cluster = Cluster::shared();
    let elector = Elector::new(config(unique_lock_id(), None)).unwrap();
    let health = leaderrun::cli::health::Health::new(&leaderrun::Timing::new(
        Duration::from_millis(200),
        Duration::from_millis(200),
    ));
    assert_eq!(
        health.readiness(&elector),
        Err("booted, no check yet".to_owned())
    );
    let running = run(&elector);
    let term = timeout(WAIT, elector.wait_for_term()).await.expect("leads");
    assert_eq!(health.readiness(&elector), Ok("leader, term 1".to_owned()));
    health.run_failed(term.number(), "COMMAND exited with exit code 3".into());
    assert_eq!(
        health.readiness(&elector),
        Err("COMMAND exited with exit code 3".to_owned())
    );
    // Demoted: a standby has no outcome of its own.
    let killer = cluster.client().await;
    let pid = term.lease().unwrap().backend_pid;
    killer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    timeout(WAIT, term.ended()).await.expect("demoted");
    assert_eq!(health.readiness(&elector), Ok("standby".to_owned()));
    // Leading again, in a new term: the old term's failure does not come back.
    let next = timeout(WAIT, elector.wait_for_term())
        .await
        .expect("leads again");
    assert_eq!(next.number(), 2);
    assert_eq!(health.readiness(&elector), Ok("leader, term 2".to_owned()));
    running.stop().await;
}

/// `Config::early_connect`: the first session of the elector is the socket begun before the
/// elector was built (a one-shot's connect overlaps its start-up), with its startup message
/// sent before the elector existed: over TCP in plaintext, over TCP with `sslmode=prefer` (the
/// SSLRequest, the server's `N`, then the startup message) and over the Unix socket. The
/// server sees the lock session at that socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_session_is_the_connect_begun_early() {
    use leaderrun::pg::tls::SslMode;
    let cluster = Cluster::shared();
    let unix: tokio_postgres::Config = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.socket_dir().display(),
        cluster.addr().port()
    )
    .parse()
    .unwrap();
    for (form, connect, mode) in [
        ("TCP, sslmode=disable", cluster.config(), SslMode::Disable),
        ("TCP, sslmode=prefer", cluster.config(), SslMode::Prefer),
        ("Unix socket", unix, SslMode::Prefer),
    ] {
        let mut config = config(unique_lock_id(), None);
        config.connect = connect;
        config.tls.mode = mode;
        let early = leaderrun::elector::EarlyConnect::start(&config.connect, &config.tls)
            .expect("an IP address or a socket path needs no lookup");
        let local = early.local_addr();
        assert_eq!(local.is_some(), form.starts_with("TCP"), "{form}");
        // The startup message goes out before the elector exists (for prefer, once the
        // server said N); the server authenticates the session meanwhile.
        let deadline = std::time::Instant::now() + WAIT;
        while !early.startup_sent() && std::time::Instant::now() < deadline {
            early.advance();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            early.startup_sent(),
            "{form}: the startup message went early"
        );
        assert!(!early.is_taken());
        config.early_connect = Some(early.clone());
        let elector = Elector::new(config).unwrap();
        let running = run(&elector);
        let term = timeout(WAIT, elector.wait_for_term())
            .await
            .unwrap_or_else(|_| panic!("{form}: leads"));
        assert!(
            early.is_taken(),
            "{form}: the first attempt took the early socket"
        );
        let backend = term.lease().expect("a lease").backend_pid;
        let port = cluster.sql(&format!(
            "SELECT coalesce(client_port, -1) FROM pg_stat_activity WHERE pid = {backend}"
        ));
        let expected = local.map_or(-1, |a| i32::from(a.port()));
        assert_eq!(
            port,
            [expected.to_string()],
            "{form}: the lock session is the early socket"
        );
        running.stop().await;
    }
}

/// A [`SessionKeeper`](leaderrun::elector::SessionKeeper) as the binary's watchdog is one: it
/// holds a duplicate of the lock session's socket from the grant until it is released.
#[derive(Debug, Default)]
struct CopyKeeper {
    copy: Mutex<Option<std::os::fd::OwnedFd>>,
    kept: std::sync::atomic::AtomicUsize,
}

impl leaderrun::elector::SessionKeeper for CopyKeeper {
    fn keep(&self, socket: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        *self.copy.lock().unwrap() = Some(socket.try_clone_to_owned()?);
        self.kept.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
    fn release(&self, _wait: bool) {
        self.copy.lock().unwrap().take();
    }
}

/// A caller that drops `run`'s future while the elector gives the lock back (its unlock held
/// up by a partition) must not leave the keeper's copy of the socket behind: the copy would
/// keep the session, and the lock, alive for good. Before, the session of a resignation was
/// dropped without telling the keeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_mid_resignation_has_the_keeper_drop_its_copy() {
    use crate::support::proxy::Proxy;
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.addr());
    let id = unique_lock_id();
    let keeper = Arc::new(CopyKeeper::default());
    let mut config = config(id, None);
    config.connect = proxy.dsn().parse().unwrap();
    config.keeper = Some(keeper.clone());
    let elector = Elector::new(config).unwrap();
    let running = run(&elector);
    let term = timeout(WAIT, elector.wait_for_term()).await.expect("leads");
    assert_eq!(keeper.kept.load(Ordering::Acquire), 1);
    assert!(keeper.copy.lock().unwrap().is_some());
    // The partition holds the resignation's unlock (bounded by 2 s) while the future is
    // dropped: the session is the resignation's own then, out of the campaign's hands.
    proxy.blackhole();
    running.cancel.cancel();
    timeout(WAIT, async {
        while term.end_cause().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the term ends at the cancel");
    running.task.abort();
    let _ = running.task.await;
    assert!(
        keeper.copy.lock().unwrap().is_none(),
        "the keeper still holds a copy of a dropped session's socket"
    );
    // With every copy closed, the proxy passes the close on once it forwards again: the
    // server ends the session (not only the lock, which the held-up unlock may free).
    proxy.forward();
    let backend = term.lease().unwrap().backend_pid;
    timeout(WAIT, async {
        while !cluster
            .sql(&format!(
                "SELECT 1 FROM pg_stat_activity WHERE pid = {backend}"
            ))
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the dropped session ends on the server");
    assert!(cluster.lock_holders(CLASS, id).is_empty());
}

/// A run dropped while it waits for an ended term's holds (after a cancel, and after a
/// demotion: here a give-up) hands the session on, and the lock stays until the holds are
/// dropped, as when the run is not dropped and as when it is dropped while leading. Before, the
/// dropped wait closed the session at once, freeing the lock under live work (a caller's
/// shutdown timeout around `run` does this), and left `is_releasing` true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_while_it_waits_for_the_holds_keeps_the_lock_until_they_drop() {
    let cluster = Cluster::shared();
    for demoted in [false, true] {
        let id = unique_lock_id();
        let elector = Elector::new(config(id, None)).unwrap();
        let running = run(&elector);
        let term = timeout(WAIT, elector.wait_for_term()).await.expect("leads");
        let hold = term.hold().expect("a hold on a proven term");
        if demoted {
            term.give_up();
        } else {
            running.cancel.cancel();
        }
        timeout(WAIT, async {
            while !elector.is_releasing() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the run waits for the hold");
        running.task.abort();
        let _ = running.task.await;
        assert!(
            !elector.is_releasing(),
            "demoted {demoted}: still releasing"
        );
        // Well inside the wait's bound (idle_session_timeout, 4 × 200 ms).
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            cluster.lock_holders(CLASS, id).len(),
            1,
            "demoted {demoted}: the lock was freed under a live hold"
        );
        drop(hold);
        timeout(WAIT, async {
            while !cluster.lock_holders(CLASS, id).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the lock is freed once the hold is dropped");
    }
}

/// A [`SessionKeeper`](leaderrun::elector::SessionKeeper) that cannot keep anything, as the
/// binary's watchdog is when no descriptor is left or no watchdog can run.
#[derive(Debug, Default)]
struct RefusingKeeper {
    refused: std::sync::atomic::AtomicUsize,
    released: std::sync::atomic::AtomicUsize,
}

impl leaderrun::elector::SessionKeeper for RefusingKeeper {
    fn keep(&self, _socket: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        self.refused.fetch_add(1, Ordering::AcqRel);
        Err(std::io::Error::from_raw_os_error(libc::EMFILE))
    }
    fn release(&self, _wait: bool) {
        self.released.fetch_add(1, Ordering::AcqRel);
    }
}

/// A grant whose session the keeper cannot keep begins no term (a killed process would hand
/// the lock on at once, its work maybe still running) and gives the lock back: the check
/// fails with the keeper's error, the next one tries again, and a replica whose keeper works
/// leads meanwhile. Before, the term began with a WARN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_keeper_cannot_keep_begins_no_term_and_gives_the_lock_back() {
    let id = unique_lock_id();
    let refusing = Arc::new(RefusingKeeper::default());
    let registry = Registry::new();
    let mut config_a = config(id, Some(registry.clone()));
    config_a.keeper = Some(refusing.clone());
    let a = Elector::new(config_a).unwrap();
    let terms_started = || -> f64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "leaderrun_terms_started_total")
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
            .sum()
    };
    let running_a = run(&a);
    timeout(WAIT, async {
        while refusing.refused.load(Ordering::Acquire) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every check is granted and refused by the keeper, again and again");
    assert_eq!(
        terms_started(),
        0.0,
        "a term began on a grant the keeper refused"
    );
    assert!(!a.is_leader());
    let checks = a.checks();
    assert!(checks.failed >= 2, "{checks:?}");
    let error = checks.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("cannot hand the lock session to the watchdog")
            && error.contains("Too many open files"),
        "{error}"
    );
    // Nothing was kept, so nothing is released.
    assert_eq!(refusing.released.load(Ordering::Acquire), 0);

    // The lock is given back each time, not held by the refused session: another replica leads.
    let keeper_b = Arc::new(CopyKeeper::default());
    let mut config_b = config(id, None);
    config_b.keeper = Some(keeper_b.clone());
    let b = Elector::new(config_b).unwrap();
    let running_b = run(&b);
    timeout(WAIT, b.wait_for_term())
        .await
        .expect("a replica whose keeper works leads beside one whose keeper refuses");
    assert_eq!(keeper_b.kept.load(Ordering::Acquire), 1);
    assert_eq!(terms_started(), 0.0);
    running_b.stop().await;
    running_a.stop().await;
    assert!(keeper_b.copy.lock().unwrap().is_none());
}

/// `is_leader` is bounded by the term's safe window, not only by the campaign's flag: with the
/// campaign's runtime blocked (an application that starves it, a frozen process), the flag stays
/// set, and another replica leads once the server ended the session; `is_leader` must say false
/// by the time the window has passed (docs/election.md, the seed's `IsLeader`).
#[test]
fn is_leader_turns_false_once_the_safe_window_passes_while_the_campaign_cannot_run() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    // A 1 s interval: a's window (2 s from its grant) outlasts the test thread's first look,
    // however loaded the machine, and b still leads within the 5 s waits.
    let slow = |id| {
        let mut config = config(id, None);
        config.check_interval = Duration::from_secs(1);
        config
    };
    let a = Elector::new(slow(id)).unwrap();
    let (leading_tx, leading_rx) = std::sync::mpsc::channel();
    let (unblock_tx, unblock_rx) = std::sync::mpsc::channel::<()>();
    let cancel_a = CancellationToken::new();
    let thread_a = std::thread::spawn({
        let (a, cancel_a) = (a.clone(), cancel_a.clone());
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let run = rt.spawn({
                let (a, cancel_a) = (a.clone(), cancel_a.clone());
                async move { a.run(cancel_a).await }
            });
            rt.block_on(async {
                let term = timeout(WAIT, a.wait_for_term()).await.expect("a leads");
                leading_tx.send(term).unwrap();
                // The fault: this runtime's only thread blocks, so the campaign cannot run.
                unblock_rx.recv().unwrap();
            });
            rt.block_on(async { timeout(WAIT, run).await })
        }
    });
    let term = leading_rx.recv_timeout(WAIT).expect("a leads");
    assert!(a.is_leader());
    let lease = term.lease().unwrap().clone();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The server ends a's session (the lock is freed at once); b takes the lock.
        let admin = cluster.client().await;
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&lease.backend_pid])
            .await
            .unwrap();
        let b = Elector::new(slow(id)).unwrap();
        let run_b = run(&b);
        timeout(WAIT, b.wait_for_term()).await.expect("b leads");
        // a's campaign has not run: its term still stands, and its flag is set.
        assert!(!term.is_ended(), "a's campaign ran: the fault did not hold");
        let deadline = tokio::time::Instant::now() + WAIT;
        while a.is_leader() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a says it leads {WAIT:?} after b took the lock"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(b.is_leader() && !term.is_proven());
        unblock_tx.send(()).unwrap();
        cancel_a.cancel();
        let ran = thread_a
            .join()
            .unwrap()
            .expect("a's run returns after cancel");
        ran.expect("a's run did not panic")
            .expect("a's run returns Ok");
        run_b.stop().await;
    });
}

/// `do_as_leader` says `Ran` only when leadership held until the work returned: work that
/// kept the campaign from running (here it blocks its runtime's only thread) past the term's
/// safe window cannot say so, since meanwhile the server may have ended the session and
/// another replica led. Before, the term had not ended yet (its campaign could not run), and
/// the result was `Ran` while b led.
#[test]
fn do_as_leader_is_lost_when_the_safe_window_passed_while_the_work_ran() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let slow = |id| {
        let mut config = config(id, None);
        config.check_interval = Duration::from_secs(1);
        config
    };
    let a = Elector::new(slow(id)).unwrap();
    let (leading_tx, leading_rx) = std::sync::mpsc::channel();
    let (unblock_tx, unblock_rx) = std::sync::mpsc::channel::<()>();
    let cancel_a = CancellationToken::new();
    let thread_a = std::thread::spawn({
        let (a, cancel_a) = (a.clone(), cancel_a.clone());
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let run = rt.spawn({
                let (a, cancel_a) = (a.clone(), cancel_a.clone());
                async move { a.run(cancel_a).await }
            });
            let done = rt.block_on(async {
                timeout(WAIT, a.wait_for_term()).await.expect("a leads");
                a.do_as_leader(|term| async move {
                    leading_tx.send(term).unwrap();
                    // The work blocks the runtime's only thread: the campaign cannot run.
                    unblock_rx.recv().unwrap();
                })
                .await
            });
            (done, rt.block_on(async { timeout(WAIT, run).await }))
        }
    });
    let term = leading_rx.recv_timeout(WAIT).expect("a leads");
    let lease = term.lease().unwrap().clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let admin = cluster.client().await;
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&lease.backend_pid])
            .await
            .unwrap();
        let b = Elector::new(slow(id)).unwrap();
        let run_b = run(&b);
        timeout(WAIT, b.wait_for_term()).await.expect("b leads");
        assert!(!term.is_ended(), "a's campaign ran: the fault did not hold");
        while term.proven_until().unwrap() > leaderrun::elector::boottime() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        unblock_tx.send(()).unwrap();
        cancel_a.cancel();
        let (done, ran) = thread_a.join().unwrap();
        assert_eq!(done, Done::Lost, "a's work overlapped b's term");
        ran.expect("a's run returns after cancel")
            .expect("a's run did not panic")
            .expect("a's run returns Ok");
        run_b.stop().await;
    });
}

/// A resigned term's work that outlives the release's bound (`idle_session_timeout`, after
/// which the lock is given up under it) did not hold leadership until it returned:
/// `do_as_leader` says `Lost`. Before, the term had ended `Resigned` and the result was `Ran`
/// although b led while the work ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_as_leader_is_lost_when_the_lock_was_released_under_the_work() {
    let id = unique_lock_id();
    let a = Elector::new(config(id, None)).unwrap();
    let b = Elector::new(config(id, None)).unwrap();
    let running_a = run(&a);
    timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let work = tokio::spawn({
        let (a, b) = (a.clone(), b.clone());
        async move {
            a.do_as_leader(|_term| async move {
                started_tx.send(()).unwrap();
                // Ignores the term's end until b leads.
                timeout(WAIT, b.wait_for_term()).await.expect("b leads");
            })
            .await
        }
    });
    let running_b = run(&b);
    timeout(WAIT, started).await.unwrap().unwrap();
    running_a.cancel.cancel();
    let done = timeout(WAIT, work)
        .await
        .expect("the work returns")
        .unwrap();
    assert_eq!(done, Done::Lost, "a's work overlapped b's term");
    timeout(WAIT, running_a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    running_b.stop().await;
}

/// The server may end a resigning leader's session while the release still waits for the
/// work (its `idle_session_timeout` counts from the last check, before the cancel; here a
/// terminated backend): the lock is gone, b leads, and `do_as_leader` says `Lost`. Before, the
/// release went on waiting, unaware, and the work's result was `Ran`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_as_leader_is_lost_when_the_server_ends_the_session_during_the_release() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let mut slow = config(id, None);
    slow.check_interval = Duration::from_secs(1);
    let a = Elector::new(slow).unwrap();
    let b = Elector::new(config(id, None)).unwrap();
    let running_a = run(&a);
    let term = timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let work = tokio::spawn({
        let (a, b) = (a.clone(), b.clone());
        async move {
            a.do_as_leader(|_term| async move {
                started_tx.send(()).unwrap();
                timeout(WAIT, b.wait_for_term()).await.expect("b leads");
            })
            .await
        }
    });
    timeout(WAIT, started).await.unwrap().unwrap();
    running_a.cancel.cancel();
    timeout(WAIT, async {
        while !a.is_releasing() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a waits for the work");
    let admin = cluster.client().await;
    admin
        .execute(
            "SELECT pg_terminate_backend($1)",
            &[&term.lease().unwrap().backend_pid],
        )
        .await
        .unwrap();
    let running_b = run(&b);
    let done = timeout(WAIT, work)
        .await
        .expect("the work returns")
        .unwrap();
    assert_eq!(done, Done::Lost, "a's work overlapped b's term");
    timeout(WAIT, running_a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    running_b.stop().await;
}

/// The seed promises the repositories that their transaction locks never collide with the
/// leader lock, "not even the bigint whose halves equal the pair": a transaction that holds
/// that bigint must not look like `leaderrun step-down`'s request to a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_lock_on_the_bigint_of_the_pair_is_not_a_step_down_request() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let a = Elector::new(config(id, None)).unwrap();
    let running = run(&a);
    let term = timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    let mut admin = cluster.client().await;
    let tx = admin.transaction().await.unwrap();
    let pair = (i64::from(CLASS) << 32) | i64::from(id as u32);
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&pair])
        .await
        .unwrap();
    // Ten of the leader's checks while the transaction holds it: not one demotes.
    let mut checks = a.watch_checks();
    let from = checks.borrow().total;
    timeout(WAIT, checks.wait_for(|c| c.total >= from + 10))
        .await
        .expect("ten checks")
        .unwrap();
    assert!(!term.is_ended(), "ended: {:?}", term.end_cause());
    assert!(a.is_leader());
    tx.rollback().await.unwrap();
    // The request leaderrun step-down takes is still seen (its own key).
    let request = LockKey { class: CLASS, id }.step_down_request();
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&request])
        .await
        .unwrap();
    timeout(WAIT, term.ended())
        .await
        .expect("the request demotes");
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&request])
        .await
        .unwrap();
    running.stop().await;
}

/// Two electors in one process (the seed allows it): the standby's line about the holder says
/// the other elector of this process leads, not that a stale try of its own was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_names_another_elector_of_its_process_as_such() {
    let id = unique_lock_id();
    let a = Elector::new(config(id, None)).unwrap();
    let b = Elector::new(config(id, None)).unwrap();
    let run_a = run(&a);
    timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    // a's first check runs 50 ms after the grant: its session then shows a leader's check.
    let mut checks = a.watch_checks();
    let from = checks.borrow().total;
    timeout(WAIT, checks.wait_for(|c| c.total > from))
        .await
        .expect("a checks")
        .unwrap();
    // Records events, never panics (the panic has fired already, as far as it knows).
    let layer = PanicOnCheck::default();
    layer.fired.store(true, Ordering::SeqCst);
    let subscriber = tracing_subscriber::registry().with(layer.clone());
    let cancel_b = CancellationToken::new();
    let task_b = tokio::spawn({
        let (b, cancel_b) = (b.clone(), cancel_b.clone());
        async move { b.run(cancel_b).await }.with_subscriber(subscriber)
    });
    // Three times the usual bound: on a loaded machine (the whole suite on 2 cores) the
    // holder's query can run past its bound at a few checks in a row.
    let line = timeout(3 * WAIT, async {
        loop {
            let found = layer
                .events
                .lock()
                .unwrap()
                .iter()
                .find(|(_, m)| m.starts_with("the lock is held by"))
                .map(|(_, m)| m.clone());
            if let Some(line) = found {
                return line;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("b says who holds the lock");
    assert!(line.contains("(another elector of this process)"), "{line}");
    assert!(!line.contains("timed out"), "{line}");
    cancel_b.cancel();
    timeout(WAIT, task_b).await.unwrap().unwrap().unwrap();
    run_a.stop().await;
}

/// `Term::give_up`: the campaign ends the term at its next check, releases the lock, and a
/// standby takes it (the binary's use: its watchdog stopped COMMAND's tree on a proven term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_given_up_ends_at_the_next_check_and_the_lock_moves() {
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let a = Elector::new(config(id, None)).unwrap();
    let b = Elector::new(config(id, None)).unwrap();
    let run_a = run(&a);
    let term = timeout(WAIT, a.wait_for_term()).await.expect("a leads");
    let run_b = run(&b);
    let mut checks = b.watch_checks();
    timeout(WAIT, checks.wait_for(|c| c.refused > 0))
        .await
        .expect("b stands by")
        .unwrap();
    assert!(a.is_leader());
    term.give_up();
    // A given-up term proves nothing: is_leader says so at once, not at the next check.
    assert!(!a.is_leader(), "is_leader still true after the give-up");
    timeout(WAIT, term.ended()).await.expect("the term ends");
    assert_eq!(term.end_cause(), Some(TermEnd::LeadershipLost));
    let next = timeout(WAIT, b.wait_for_term()).await.expect("b leads");
    assert_eq!(
        cluster.lock_holders(CLASS, id),
        vec![next.lease().unwrap().backend_pid]
    );
    run_b.stop().await;
    run_a.stop().await;
}

/// A standby second in line that moves up and is then granted, in one check, proves its grant
/// from the send time of the wait that was granted, not from the check's start: each wait may
/// take up to an interval (`lock_timeout`), so the check's window was all but spent at such a
/// grant, and the term was lost before its first check (COMMAND started and was stopped at
/// once). Here the first wait (for place 1) lasts over half an interval before place 1 is given
/// back, and the target is released as soon as the second wait (for it) is queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_moving_up_in_line_is_proven_from_the_granted_wait() {
    const INTERVAL: Duration = Duration::from_millis(500);
    let cluster = Cluster::shared();
    let id = unique_lock_id();
    let place_1 = LockKey { class: CLASS, id }.queue_key(1);
    // pg_locks shows an int8 key as two oids, and a two-int4 key by its halves.
    let (high, low) = ((place_1 >> 32) as u32, place_1 as u32);
    let (holder, ahead, observer) = (
        cluster.client().await,
        cluster.client().await,
        cluster.client().await,
    );
    holder
        .batch_execute(&format!(
            "SELECT pg_catalog.pg_advisory_lock({CLASS}, {id})"
        ))
        .await
        .unwrap();
    ahead
        .batch_execute(&format!(
            "SELECT pg_catalog.pg_advisory_lock({place_1}::int8)"
        ))
        .await
        .unwrap();
    let mut config = config(id, None);
    config.check_interval = INTERVAL;
    config.wait_for_release = true;
    let elector = Elector::new(config).unwrap();
    let running = run(&elector);
    // How long the standby's wait for `key` (a pg_locks condition) has been queued, in ms.
    let waited_ms = |key: String| {
        let observer = &observer;
        async move {
            let sql = format!(
                "SELECT (extract(epoch FROM clock_timestamp() - a.query_start) * 1000)::int8 \
                 FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND {key}"
            );
            observer
                .query_opt(sql.as_str(), &[])
                .await
                .unwrap()
                .map(|row| row.get::<_, i64>(0))
        }
    };
    let for_place_1 = format!("l.classid = {high} AND l.objid = {low} AND l.objsubid = 1");
    let for_target = format!("l.classid = {CLASS} AND l.objid = {id} AND l.objsubid = 2");
    // The wait for place 1, queued for 300–400 ms of its 500 (a later one is waited for).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never waited for place 1 long enough"
        );
        if let Some(ms) = waited_ms(for_place_1.clone()).await {
            if (300..400).contains(&ms) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ahead
        .batch_execute(&format!(
            "SELECT pg_catalog.pg_advisory_unlock({place_1}::int8)"
        ))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while waited_ms(for_target.clone()).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby did not move up to wait for the lock"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    holder
        .batch_execute(&format!(
            "SELECT pg_catalog.pg_advisory_unlock({CLASS}, {id})"
        ))
        .await
        .unwrap();
    let term = timeout(WAIT, elector.wait_for_term())
        .await
        .expect("the standby leads");
    let left = term
        .proven_until()
        .expect("a term's first proof")
        .saturating_sub(leaderrun::elector::boottime());
    // The safe window is 2 intervals (1 s): from the first wait's send, 300 ms of it and more
    // were gone at the grant; from the granted wait's, only the moments since it was queued.
    assert!(
        left > Duration::from_millis(850),
        "the grant's window had {left:?} of {:?} left",
        2 * INTERVAL
    );
    running.stop().await;
}
