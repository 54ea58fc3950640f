//! systemd's notification protocol (`NOTIFY_SOCKET`), docs/guarantees.md#observing-a-replica.
//!
//! READY=1 after the first check; STATUS= on every change (`leader, term N`, `standby`,
//! `no database: <cause>`); STOPPING=1 on shutdown; WATCHDOG=1 every half
//! `WATCHDOG_USEC` while the check loop is healthy (so a wedged loop gets restarted). Without
//! `NOTIFY_SOCKET` nothing is sent.
//!
//! Every datagram is sent without waiting: this runs on the thread that stops COMMAND, and a
//! notification socket whose reader stopped reading (its queue holds about ten datagrams)
//! would block a plain `send`, and with it the election, the stops and the signals (found by
//! hand: a leader froze in `sendto` and its watchdog stopped COMMAND). A datagram the socket
//! does not take is dropped; READY=1 and the latest STATUS= are sent again until one goes
//! through, WATCHDOG=1 at its next ping.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::debug;

use crate::cli::health::Health;
use crate::elector::{CheckOutcome, Elector};

/// How often READY=1 or a STATUS= the socket did not take is sent again.
const RETRY: Duration = Duration::from_millis(100);

/// Sends `states` in one datagram to `NOTIFY_SOCKET` (a path, or `@name` in the abstract
/// namespace, as libsystemd reads it), never waiting: true when the socket took it.
fn send(states: &[NotifyState]) -> bool {
    use std::fmt::Write as _;
    use std::os::unix::ffi::OsStrExt;
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return true;
    };
    let mut message = String::new();
    for state in states {
        let _ = writeln!(message, "{state}");
    }
    let sent = (|| {
        let bytes = target.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(&target)?,
        };
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        socket.send_to_addr(message.as_bytes(), &addr)
    })();
    match sent {
        Ok(_) => true,
        Err(err) => {
            debug!("systemd notify failed: {err}");
            false
        }
    }
}

/// The STATUS= text for the elector's state now.
pub fn status_line(elector: &Elector) -> String {
    let checks = elector.checks();
    let term = elector.term();
    // A wait queued on the server reached it, whatever the check before said: as /readyz.
    if !term.is_ended() {
        format!("leader, term {}", term.number())
    } else if checks.waiting {
        "standby".to_owned()
    } else if checks.last == Some(CheckOutcome::Failed) {
        format!("no database: {}", checks.last_error.unwrap_or_default())
    } else if checks.total == 0 {
        "starting".to_owned()
    } else {
        "standby".to_owned()
    }
}

/// Follows the elector and tells systemd; runs until the task is dropped. Returns at once when
/// `NOTIFY_SOCKET` is not set.
pub async fn follow(elector: Elector, health: std::sync::Arc<Health>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = watchdog_period();
    let mut checks = elector.watch_checks();
    // Demotions that come without a check (the server closed the session, the safe window
    // passed) change the term, not the tally: follow both.
    let mut terms = elector.watch_term();
    let mut ready = false;
    let mut last_status = String::new();
    // Whether the latest READY=1 or STATUS= still waits for the socket to take it.
    let mut owed = false;
    let mut ping = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETRY), if owed => {}
            changed = checks.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = terms.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = ping.tick(), if watchdog.is_some() => {
                if health.liveness(&elector).is_ok() {
                    let _ = send(&[NotifyState::Watchdog]);
                }
                continue;
            }
        }
        // READY=1 after the first check, not the first connect; a standby's wait queued on
        // the server is its first check, as for /readyz: that check returns only when the
        // wait times out, a whole interval later (docs/guarantees.md#observing-a-replica).
        let checks = elector.checks();
        if checks.total == 0 && !checks.waiting {
            continue;
        }
        let status = status_line(&elector);
        if !ready {
            ready = send(&[NotifyState::Ready, NotifyState::Status(&status)]);
            owed = !ready;
            if ready {
                last_status = status;
            }
        } else if status != last_status || owed {
            owed = !send(&[NotifyState::Status(&status)]);
            if !owed {
                last_status = status;
            }
        }
    }
}

/// Half of `WATCHDOG_USEC`, when systemd asks for pings: as libsystemd's
/// `sd_watchdog_enabled`, `WATCHDOG_PID`, when set, must be this process (sd-notify's own
/// helper also insists on it being set).
fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(50)))
}

/// STOPPING=1: leaderrun is shutting down.
pub fn stopping() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = send(&[NotifyState::Stopping]);
    }
}
