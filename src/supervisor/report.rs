//! What the supervisor reports: a run's end counted and readiness kept up to date (`record`),
//! and the environment COMMAND is given ([`child_env`]).

use super::{Election, Supervisor, Why};
use crate::cli::metrics::ChildExit;
use std::time::SystemTime;

use crate::elector::Term;
use crate::history::{Outcome, RunEnd};
use crate::process::child::{ExitStatus, Spawner};

/// The environment COMMAND gets on top of the inherited one (docs/guarantees.md#the-child-process).
pub fn child_env(term: &Term) -> Vec<(&'static str, String)> {
    let mut env = vec![("LEADERRUN_TERM", term.number().to_string())];
    if let Some(lease) = term.lease() {
        env.push(("LEADERRUN_LOCK", lease.lock.to_string()));
        env.push(("LEADERRUN_SLOT", lease.slot.to_string()));
        env.push(("LEADERRUN_FENCING_TOKEN", lease.fencing_token.to_string()));
        env.push(("LEADERRUN_BACKEND_PID", lease.backend_pid.to_string()));
    }
    env
}

impl<E: Election, S: Spawner> Supervisor<E, S> {
    /// Counts a start of COMMAND that failed (exec or fork refused, `err`), for the due time
    /// `due`, as a run that failed at once: `leaderrun_child_start_failures_total`, readiness,
    /// and a history row (`failed`, with the exit status a shell would give: 127, 126, 125),
    /// so that a due time that ran nothing shows why.
    pub(super) fn record_failed_start(
        &mut self,
        term: &Term,
        due: Option<SystemTime>,
        err: &crate::process::child::SpawnError,
    ) {
        self.metrics.child_start_failed();
        self.health
            .run_failed(term.number(), crate::Chain(err).to_string());
        if let (Some(history), Some(lease)) = (&self.history, term.lease()) {
            let now = SystemTime::now();
            let run = history.run_started(crate::history::RunStart {
                slot: lease.slot,
                term: term.number(),
                fencing_token: lease.fencing_token,
                started_at: now,
                due_at: due,
            });
            history.run_ended(
                run,
                RunEnd {
                    ended_at: now,
                    status: ExitStatus::Code(i32::from(err.exit_code())),
                    outcome: Outcome::Failed,
                },
            );
        }
    }

    /// Counts a run's end and keeps readiness (the seed's table) up to date.
    pub(super) fn record(&mut self, term: &Term, why: Why, status: ExitStatus) {
        let outcome = match why {
            Why::Demoted => Outcome::Lost,
            Why::TimedOut => Outcome::Failed,
            Why::Exited | Why::Shutdown if status.success() => Outcome::Ok,
            Why::Exited | Why::Shutdown => Outcome::Failed,
        };
        if outcome == Outcome::Ok {
            self.metrics.run_succeeded(SystemTime::now());
        }
        // Queued, never awaited: the history is off the fence's path.
        if let (Some(history), Some(run)) = (&self.history, self.history_run.take()) {
            history.run_ended(
                run,
                RunEnd {
                    ended_at: SystemTime::now(),
                    status,
                    outcome,
                },
            );
        }
        match why {
            Why::Exited if status.success() => {
                self.metrics.child_exited(ChildExit::Success);
                self.health.run_succeeded();
            }
            Why::Exited => {
                self.metrics.child_exited(ChildExit::Failure);
                self.health
                    .run_failed(term.number(), format!("COMMAND exited with {status}"));
            }
            Why::TimedOut => {
                self.metrics.child_exited(ChildExit::Stopped);
                let limit = humantime::format_duration(self.plan.timeout.unwrap_or_default());
                self.health.run_failed(
                    term.number(),
                    format!("COMMAND ran longer than --timeout {limit}"),
                );
            }
            Why::Demoted | Why::Shutdown => self.metrics.child_exited(ChildExit::Stopped),
        }
    }
}
