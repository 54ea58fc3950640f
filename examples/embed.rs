//! A program that embeds the election: it campaigns for the lock, and while it leads it runs
//! its work (here, a line a second), printing each term's number and fencing token.
//!
//! ```text
//! cargo run --example embed --no-default-features -- 'host=db user=app dbname=plexsphere' 60
//! EMBED_DSN=postgres://app@db/plexsphere cargo run --example embed --no-default-features
//! ```
//!
//! The first argument (or `EMBED_DSN`) is a libpq connection string, key=value or URL; the
//! second is how long to take part, in seconds (default 60). Run two copies against the same
//! database: one leads, the other waits, and takes over within a check interval (5 s) of the
//! first one's exit.

use std::time::Duration;

use leaderrun::CancellationToken;
use leaderrun::{Config, Done, Elector, Term};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dsn = args
        .next()
        .or_else(|| std::env::var("EMBED_DSN").ok())
        .ok_or("usage: embed DSN [SECONDS] (or set EMBED_DSN)")?;
    let seconds: u64 = args.next().map_or(Ok(60), |s| s.parse())?;
    let connect: leaderrun::tokio_postgres::Config = dsn.parse()?;

    let elector = Elector::new(Config::new(connect))?;
    let cancel = CancellationToken::new();
    let election = tokio::spawn({
        let (elector, cancel) = (elector.clone(), cancel.clone());
        async move { elector.run(cancel).await }
    });
    // Taking part ends after `seconds`: cancelling the election ends a running term
    // (resigned), which ends the work, and then the loop.
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            cancel.cancel();
        }
    });

    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            term = elector.wait_for_term() => {
                describe(&term);
                // The work runs only inside the term's proof, and the lock is not released
                // on purpose before it returned.
                match elector.do_as_leader(work).await {
                    Done::Ran(()) => println!("term {}: work finished", term.number()),
                    Done::Lost => println!("term {}: lost during the work", term.number()),
                    // The proof lapsed before the work could start: the term is about to
                    // end (within a check interval); wait for that, not for the same term.
                    Done::Standby => {
                        term.ended().await;
                    }
                }
            }
        }
    }

    // The election unlocks and closes its session before it returns.
    election.await??;
    Ok(())
}

/// Prints what a term is: its number and the lease the grant gave.
fn describe(term: &Term) {
    match term.lease() {
        Some(lease) => println!(
            "leading: term {}, fencing token {}, slot {}, backend pid {}, database {}",
            term.number(),
            lease.fencing_token,
            lease.slot,
            lease.backend_pid,
            lease.database
        ),
        None => println!("leading: term {}", term.number()),
    }
}

/// The work done while leading: a line a second until the term ends. A real program passes
/// the fencing token to whatever it writes to, so that a stale leader's writes are refused.
async fn work(term: Term) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            cause = term.ended() => {
                println!("term {} ended: {cause:?}", term.number());
                return;
            }
            _ = ticks.tick() => println!("term {}: working", term.number()),
        }
    }
}
