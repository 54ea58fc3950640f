//! The benchmark's floor clients: programs that do what a row of leaderrun does with no
//! leaderrun in the path, and the library's election as a program of its own. They are one
//! binary, `leaderrun-bench-clients` (`benches/clients.rs`, behind the `bench-clients`
//! feature), which the benchmark builds as `cargo build --release` builds `leaderrun`: no
//! dev-dependency's feature reaches either, so a row and its floor are built alike
//! (BENCHMARKS.md, fifteenth pass). The in-process floor and the handover floors' waiting
//! sessions use [`floor_connect`] and [`floor_session`] from the benchmark itself. Each mode is
//! chosen by an environment variable holding the DSN; panics on any failure (a benchmark's
//! client has nothing to recover).

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The lock class of every floor session (leaderrun's default class).
pub const CLASS: i32 = leaderrun::elector::DEFAULT_LOCK_CLASS;

/// With this variable set (to a DSN) the clients' binary is the one-shot floor's client
/// ([`floor_client`]).
pub const FLOOR_ENV: &str = "LEADERRUN_BENCH_FLOOR_DSN";

/// With this variable set (to a DSN) the clients' binary is the library row's client
/// ([`library_client`]), on lock `(CLASS, id)` (`id` from [`FLOOR_ID_ENV`]).
pub const LIBRARY_ENV: &str = "LEADERRUN_BENCH_LIBRARY_DSN";

/// With this variable set (to a DSN) the clients' binary is a floor's holder
/// ([`floor_holder`]): it takes the lock `(CLASS, id)` (`id` from [`FLOOR_ID_ENV`]), says
/// `held` on stdout and sleeps until killed; with [`FLOOR_CHILD_ENV`] it runs that child too.
pub const FLOOR_HOLD_ENV: &str = "LEADERRUN_BENCH_FLOOR_HOLD_DSN";

/// The lock id of [`FLOOR_HOLD_ENV`]'s holder and of [`LIBRARY_ENV`]'s election.
pub const FLOOR_ID_ENV: &str = "LEADERRUN_BENCH_FLOOR_ID";

/// A child script for [`FLOOR_HOLD_ENV`]'s holder to run as leaderrun runs COMMAND: started
/// once the lock is held, in a group of its own, announced as `held PID`; when it exits the
/// holder unlocks, closes its session and exits, with no check, watchdog or tree proof.
pub const FLOOR_CHILD_ENV: &str = "LEADERRUN_BENCH_FLOOR_CHILD";

/// Runs the client the environment names; `false` when it names none.
pub fn run_from_env() -> bool {
    let var = |name| std::env::var(name).ok();
    if let Some(dsn) = var(FLOOR_ENV) {
        floor_client(&dsn);
    } else if let Some(dsn) = var(LIBRARY_ENV) {
        library_client(&dsn);
    } else if let Some(dsn) = var(FLOOR_HOLD_ENV) {
        floor_holder(&dsn);
    } else {
        return false;
    }
    true
}

fn lock_id() -> i32 {
    std::env::var(FLOOR_ID_ENV).unwrap().parse().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The least a one-shot must do, for the floor rows: connect without TLS (no SSLRequest), try
/// the lock, release it, and close; two round trips after the startup, as a program built on
/// the same driver and runtime as leaderrun.
pub fn floor_client(dsn: &str) {
    runtime().block_on(floor_session(dsn));
}

/// The election a one-shot runs, as the contract asks for it, through the crate's library
/// ([`leaderrun::Elector`], as `leaderrun --once` configures it): connect as libpq does
/// (`sslmode=prefer`: the SSLRequest first), pin the session's timers, try with the durable
/// fencing token, release, close. No COMMAND, no watchdog, no command line: between this and
/// the floor process is what the contract's election costs, between this and `leaderrun
/// --once -- true` what the tool adds around it.
pub fn library_client(dsn: &str) {
    let id = lock_id();
    runtime().block_on(async {
        let mut config = leaderrun::Config::new(dsn.parse().unwrap());
        config.lock = leaderrun::LockKey { class: CLASS, id };
        config.warn_weaker_server = false;
        let elector = leaderrun::Elector::new(config).unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let run = elector.run(cancel.clone());
        tokio::pin!(run);
        tokio::select! {
            term = elector.wait_for_term() => assert!(term.lease().is_some()),
            ended = &mut run => panic!("the campaign ended before leading: {ended:?}"),
        }
        cancel.cancel();
        run.await.unwrap();
    });
}

/// A floor's holder process (see [`FLOOR_HOLD_ENV`]).
pub fn floor_holder(dsn: &str) {
    let id = lock_id();
    let child = std::env::var_os(FLOOR_CHILD_ENV);
    runtime().block_on(async {
        let (client, task) = floor_connect(dsn).await;
        client
            .simple_query(&format!("SELECT pg_advisory_lock({CLASS}, {id})"))
            .await
            .unwrap();
        let Some(script) = child else {
            println!("held");
            return std::future::pending::<()>().await;
        };
        let mut child = Command::new(script).process_group(0).spawn().unwrap();
        println!("held {}", child.id());
        // Nothing else runs on this runtime meanwhile: the session has no news to read.
        child.wait().unwrap();
        client
            .simple_query(&format!("SELECT pg_advisory_unlock({CLASS}, {id})"))
            .await
            .unwrap();
        drop(client);
        let _ = task.await;
    });
}

/// A floor row's session: connected without TLS, its connection driven on a task of its own.
pub async fn floor_connect(
    dsn: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    (client, tokio::spawn(connection))
}

/// One floor session: connect without TLS, try, unlock, close.
pub async fn floor_session(dsn: &str) {
    let (client, task) = floor_connect(dsn).await;
    client
        .simple_query("SELECT pg_try_advisory_lock(7, 7)")
        .await
        .unwrap();
    client
        .simple_query("SELECT pg_advisory_unlock(7, 7)")
        .await
        .unwrap();
    drop(client);
    let _ = task.await;
}
