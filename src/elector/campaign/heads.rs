//! A queue head's wait with `--slots N` (docs/election.md#slots): the standby at the head of
//! one slot's line also heads the line of every slot that has no head, each on a session of
//! its own (its extra heads, `Role::Standby::heads`), so that a release of any slot reaches it
//! at once, as it does with one slot. Whichever session is granted a slot first becomes the
//! lock session; every other one is closed before the term begins, which gives its place (and
//! any grant it may have had at the same moment, under which nothing ran) back.

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_postgres::Row;
use tracing::debug;

use super::standby::lock_timeout_is_refusal;
use super::{Campaign, Role};
use crate::elector::session::Session;
use crate::elector::Shared;
use crate::error::{Chain, Error};
use crate::pg::lock::{head_sql, headless_sql, wait_sql};

/// How one of the check's waits ended.
enum Waited {
    /// The wait of the session in line (`Role::Standby::session`).
    Main(Result<Option<Row>, Error>),
    /// The wait of the extra head of `slot`: `Err(None)` when it could not take the place
    /// (another standby heads that line now).
    Extra {
        slot: u32,
        result: Result<Option<Row>, Option<Error>>,
    },
}

/// An extra head of one slot, for one check: the slot, and its session once it is open and
/// holds place 1 in that slot's line.
type Head = (u32, OnceCell<Session>);

impl Campaign<'_> {
    /// The wait of the queue head at `place` (slot, place 1) of a lock with slots: the wait
    /// of its own session ([`Self::wait_in_line`]'s), and at the same time one on each of its
    /// extra heads; before them, when it does not head every slot yet, one statement
    /// ([`headless_sql`]) asks which slots have no head, and an extra head is opened for each
    /// (at most N − 1 in all). Returns the grant (the session it came on is the standby's
    /// session now, and every other one is closed) or `None` when every wait timed out on
    /// the server (the extra heads are kept for the next check).
    pub(crate) async fn wait_as_heads(&mut self, place: (u32, u32)) -> Result<Option<Row>, Error> {
        let statement = self.prepared_wait(place).await?;
        let shared = self.shared;
        let config = &shared.config;
        let bound = config.io_bound();
        let slots = config.effective_slots();
        let mut heads: Vec<Head> = self
            .role
            .take_heads()
            .into_iter()
            .filter_map(|s| s.place.map(|(slot, _)| (slot, OnceCell::new_with(Some(s)))))
            .collect();
        let Some(session) = self.role.session() else {
            return Err(Error::SessionClosed(None));
        };
        if heads.len() + 1 < slots as usize {
            let row = session
                .bounded_typed(
                    "find the slots with no head",
                    bound,
                    &headless_sql(config.lock, slots),
                    &[],
                )
                .await?;
            for slot in row.get::<_, Vec<i32>>(0) {
                let Ok(slot) = u32::try_from(slot) else {
                    continue;
                };
                if slot < slots && slot != place.0 && heads.iter().all(|(s, _)| *s != slot) {
                    debug!(target: "leaderrun::elector", lock = %config.lock.slot(slot), "slot with no head in line: heading it on a session of its own too");
                    heads.push((slot, OnceCell::new()));
                }
            }
        }
        let wait = config.effective_check_interval() + bound;
        // Queued as soon as sent (see `wait_in_line`).
        shared.checks.send_modify(|c| c.waiting = true);
        let wait_started = Instant::now();
        let mut main = None;
        let mut winner = None;
        // The extra heads whose wait timed out on the server: kept for the next check.
        let mut timed_out = Vec::new();
        {
            let mut pending: FuturesUnordered<BoxFuture<'_, Waited>> = FuturesUnordered::new();
            pending.push(Box::pin(async {
                Waited::Main(lock_timeout_is_refusal(
                    session
                        .bounded("wait for the advisory lock", wait, &statement, &[])
                        .await,
                ))
            }));
            for (slot, cell) in &heads {
                pending.push(Box::pin(extra_head(shared, cell, *slot)));
            }
            while let Some(waited) = pending.next().await {
                match waited {
                    Waited::Main(Ok(Some(row))) => {
                        winner = Some((None, row));
                        break;
                    }
                    Waited::Main(result) => {
                        let failed = result.is_err();
                        main = Some(result);
                        if failed {
                            break;
                        }
                    }
                    Waited::Extra {
                        slot,
                        result: Ok(Some(row)),
                    } => {
                        winner = Some((Some(slot), row));
                        break;
                    }
                    Waited::Extra {
                        slot,
                        result: Ok(None),
                    } => timed_out.push(slot),
                    Waited::Extra {
                        slot,
                        result: Err(err),
                    } => {
                        if let Some(err) = err {
                            // Thrown away, as any session whose statement failed: it may hold a
                            // grant we never saw.
                            debug!(target: "leaderrun::elector", lock = %config.lock.slot(slot), "extra queue head closed: {}", Chain(&err));
                        }
                    }
                }
            }
            // Every wait still in flight is abandoned here; its session is closed below.
        }
        let waited = wait_started.elapsed();
        self.waited += waited;
        if let Some(metrics) = &shared.metrics {
            metrics.wait_seconds.observe(waited.as_secs_f64());
        }
        let mut sessions: Vec<(u32, Session)> = heads
            .into_iter()
            .filter_map(|(slot, cell)| cell.into_inner().map(|s| (slot, s)))
            .collect();
        match winner {
            // The term begins on the session in line; the extra heads are closed first.
            Some((None, row)) => {
                for (_, loser) in sessions {
                    loser.close_now().await;
                }
                Ok(Some(row))
            }
            // The term begins on the extra head; the session in line and the other extra heads
            // are closed first, which gives their places (and any grant of a wait still in
            // flight) back.
            Some((Some(slot), row)) => {
                let Some(at) = sessions.iter().position(|(s, _)| *s == slot) else {
                    return Err(Error::SessionClosed(None));
                };
                let (_, granted) = sessions.swap_remove(at);
                let mut losers: Vec<Session> = sessions.into_iter().map(|(_, s)| s).collect();
                if let Role::Standby { session, .. } = &mut self.role {
                    losers.extend(session.replace(granted));
                }
                for loser in losers {
                    loser.close_now().await;
                }
                Ok(Some(row))
            }
            None => match main {
                Some(Ok(_)) => {
                    // Only the heads whose wait timed out on the server are kept; every other
                    // one failed: closed.
                    let mut kept = Vec::new();
                    for (slot, session) in sessions {
                        if timed_out.contains(&slot) {
                            kept.push(session);
                        } else {
                            session.close_now().await;
                        }
                    }
                    if let Role::Standby { heads, .. } = &mut self.role {
                        *heads = kept;
                    }
                    Ok(None)
                }
                // The caller throws the session in line away; the extra heads go with it.
                Some(Err(err)) => Err(err),
                None => Err(Error::SessionClosed(None)),
            },
        }
    }
}

/// One extra head's part of a check: its session is opened the first time ([`open_head`]);
/// then it waits as the head of `slot` ([`wait_sql`] of `(slot, 1)`).
async fn extra_head(shared: &Shared, cell: &OnceCell<Session>, slot: u32) -> Waited {
    let config = &shared.config;
    let session = match cell.get_or_try_init(|| open_head(shared, slot)).await {
        Ok(session) => session,
        Err(err) => {
            return Waited::Extra {
                slot,
                result: Err(err),
            }
        }
    };
    let Some(statement) = session
        .waits
        .iter()
        .find(|(p, _)| *p == (slot, 1))
        .map(|(_, s)| s.clone())
    else {
        return Waited::Extra {
            slot,
            result: Err(Some(Error::SessionClosed(None))),
        };
    };
    let result = session
        .bounded(
            "wait for the advisory lock",
            config.effective_check_interval() + config.io_bound(),
            &statement,
            &[],
        )
        .await;
    Waited::Extra {
        slot,
        result: lock_timeout_is_refusal(result).map_err(Some),
    }
}

/// Opens an extra head's session as every session is opened (timers pinned, statements
/// prepared; counted in `sessions_opened`) and takes place 1 in `slot`'s line with it
/// ([`head_sql`]), its wait prepared in the same flight. `Err(None)`: the session is not
/// direct, or another standby heads
/// that line now, and the session is closed.
async fn open_head(shared: &Shared, slot: u32) -> Result<Session, Option<Error>> {
    let config = &shared.config;
    let bound = config.io_bound();
    let mut session = Session::open(config, &shared.target).await?;
    shared.checks.send_modify(|c| c.sessions_opened += 1);
    // A place is taken only on a direct session, as by the lock session: one left on a
    // pooled backend would hold up every standby behind it
    // (docs/field-notes.md#transaction-mode-poolers-move-the-session).
    if !session.direct {
        debug!(target: "leaderrun::elector", lock = %config.lock.slot(slot), "an extra head's session is not direct: not heading that line");
        return Err(None);
    }
    let wait = wait_sql(
        config.lock,
        config.effective_slots(),
        slot,
        1,
        &crate::pg::lock::Guard::None,
    );
    let take = head_sql(config.lock, slot);
    let (taken, prepared) = tokio::join!(
        session.bounded_typed("take a place in line", bound, &take, &[]),
        session.prepare("prepare the wait in line", bound, &wait)
    );
    let prepared = prepared?;
    if !taken?.get::<_, bool>(0) {
        debug!(target: "leaderrun::elector", lock = %config.lock.slot(slot), "another standby heads the line now");
        return Err(None);
    }
    session.waits.push(((slot, 1), prepared));
    session.place = Some((slot, 1));
    Ok(session)
}
