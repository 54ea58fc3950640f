//! Children leaderrun was handed by the program that exec'd it: `sh -c 'sidecar & exec
//! leaderrun -- job'` (a common container entrypoint) leaves `sidecar` a child of leaderrun. It
//! is not COMMAND's, so it is never stopped, waited for or killed as an orphan of COMMAND's tree
//! (docs/process-model.md#what-stopped-means); it is only reaped when it exits. Its own orphans,
//! re-parented to leaderrun later, cannot be told from COMMAND's and are stopped with the tree.

use std::sync::OnceLock;

use nix::unistd::Pid;

/// The children at start, each with its start time (clock ticks since boot, `/proc/PID/stat`
/// field 22), which tells it from a later process that reuses its pid.
static AT_START: OnceLock<Vec<(i32, u64)>> = OnceLock::new();

/// Reads this process's children, once, before it starts any of its own (`main` calls it
/// first; the watchdog forked after it keeps the list). Without a `/proc` that names this
/// namespace's processes none are known, and every child counts as COMMAND's, as before.
pub fn record() {
    AT_START.get_or_init(|| {
        if !crate::process::procfs::own() {
            return Vec::new();
        }
        crate::process::child::own_children(None)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|pid| Some((pid.as_raw(), start_time(pid.as_raw())?)))
            .collect()
    });
}

/// Whether `pid` is one of the children leaderrun had at start, still the same process.
pub fn is_inherited(pid: i32) -> bool {
    AT_START.get().is_some_and(|at_start| {
        at_start
            .iter()
            .any(|&(p, start)| p == pid && start_time(pid) == Some(start))
    })
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold blanks and parentheses: count from its closing one.
    stat.rsplit_once(") ")?.1.split(' ').nth(19)?.parse().ok()
}

/// The pids of `pids` that are not [inherited](is_inherited).
pub(crate) fn without_inherited(pids: Vec<Pid>) -> Vec<Pid> {
    if !AT_START.get().is_some_and(|at_start| !at_start.is_empty()) {
        return pids;
    }
    pids.into_iter()
        .filter(|pid| !is_inherited(pid.as_raw()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_time_is_the_same_each_time_and_none_without_a_process() {
        let own = std::process::id() as i32;
        let start = start_time(own).expect("this process's start time");
        assert!(start > 0);
        assert_eq!(start_time(own), Some(start));
        assert_eq!(start_time(i32::MAX), None);
    }
}
