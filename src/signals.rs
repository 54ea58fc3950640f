//! Signal intake for the binary.
//!
//! [`install`] registers handlers for every signal leaderrun acts on, before anything is
//! spawned or connected (FIELD-NOTES child 1), and before the async runtime exists. The handlers
//! only write to signal-hook's self-pipe; one thread turns that into a channel the supervisor
//! reads, so a signal that arrives while connecting or campaigning waits in the channel and is
//! acted on (never lost). Handling them explicitly also matters as PID 1, where the kernel drops
//! every signal that has no handler (FIELD-NOTES child 7).

use nix::sys::signal::Signal;
use signal_hook::consts::signal::{
    SIGALRM, SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGUSR1, SIGUSR2, SIGWINCH,
};
use signal_hook::iterator::Signals;
use tokio::sync::mpsc;

/// Signals passed on to the child's process group while it runs (contract §5, plus SIGALRM,
/// which tini passes on too). While standby there is nobody to pass them to and they are
/// ignored, except INT and TERM, which shut down.
///
/// The others leaderrun receives:
/// * SIGTSTP is passed on too; when the child stops, leaderrun stops itself (SIGSTOP) so the
///   calling shell sees the job stopped; `fg` (SIGCONT) resumes leaderrun, which resumes the
///   child. As a standby leaderrun stops itself at once.
/// * SIGPIPE is ignored (Rust's default): a closed stderr must not kill a leader mid-term.
/// * SIGCHLD wakes the reaper.
pub const FORWARDED: [Signal; 8] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
];

/// The receiving end of the installed handlers.
///
/// SIGCHLD is delivered here too (it wakes the reaper); like the kernel, the channel may merge
/// several SIGCHLDs into one.
pub struct SignalStream {
    rx: mpsc::UnboundedReceiver<Signal>,
}

/// Installs the handlers and starts the forwarding thread.
///
/// # Errors
/// The OS error when a handler cannot be installed or the thread cannot start.
pub fn install() -> std::io::Result<SignalStream> {
    let mut signals = Signals::new([
        SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGALRM, SIGTSTP, SIGCHLD,
    ])?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for raw in signals.forever() {
                if let Ok(sig) = Signal::try_from(raw) {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            }
        })?;
    Ok(SignalStream { rx })
}

impl SignalStream {
    /// Next received signal. Pending forever if the forwarding thread is gone (it never ends
    /// while the process runs).
    pub async fn recv(&mut self) -> Signal {
        match self.rx.recv().await {
            Some(sig) => sig,
            None => std::future::pending().await,
        }
    }

    /// A signal that already arrived, without waiting.
    pub fn try_recv(&mut self) -> Option<Signal> {
        self.rx.try_recv().ok()
    }
}

/// Whether `sig` is passed on to the child's group ([`FORWARDED`]).
pub fn is_forwarded(sig: Signal) -> bool {
    FORWARDED.contains(&sig)
}

/// Stops leaderrun itself (job control), unless it is PID 1, which cannot be stopped from
/// inside its namespace. Returns once something sends SIGCONT.
pub fn suspend_self() {
    if std::process::id() != 1 {
        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
    }
}

/// Whether `sig` asks leaderrun to shut down (INT and TERM, contract §5).
pub fn is_shutdown(sig: Signal) -> bool {
    matches!(sig, Signal::SIGINT | Signal::SIGTERM)
}
