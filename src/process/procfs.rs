//! Whose pids `/proc` shows. A procfs names processes as the PID namespace it was mounted in
//! sees them: PID 1 of a namespace made without a procfs of its own (`unshare --pid --fork`
//! without `--mount-proc`) reads the machine's pids there, while `kill` and `waitpid` take the
//! namespace's. Read as they are, its own children looked like strangers (the main child and
//! the watchdog counted as orphans that never end) and every orphan's signal went to a pid
//! that is not it (docs/process-model.md#what-stopped-means).

/// How `/proc` names this process's children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// By our own pids: the procfs is this PID namespace's.
    Own,
    /// By another namespace's pids; entry `depth` of a process's `NSpid` line is its pid here.
    Foreign {
        /// The index of this namespace's pid in `NSpid` lines.
        depth: usize,
    },
    /// Not at all: no procfs, or one whose pids cannot be translated (no `NSpid`, Linux < 4.1).
    None,
}

/// How `/proc` names processes now (read each time: a procfs may be mounted or unmounted
/// while leaderrun runs).
pub fn view() -> View {
    let own = std::process::id();
    match std::fs::read_link("/proc/self") {
        Ok(name) if name.to_str() == Some(own.to_string().as_str()) => View::Own,
        Ok(_) => match nspids("self") {
            Some(ids) if ids.last() == Some(&(own as i32)) => View::Foreign {
                depth: ids.len() - 1,
            },
            _ => View::None,
        },
        Err(_) => View::None,
    }
}

/// Whether `/proc/PID` is the process this namespace calls PID.
pub fn own() -> bool {
    view() == View::Own
}

/// The `NSpid` line of `/proc/WHO/status`: the pid in every namespace from the procfs's down.
fn nspids(who: &str) -> Option<Vec<i32>> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_ascii_whitespace()
        .map(|p| p.parse().ok())
        .collect()
}

/// `pids` as `/proc` lists them (in `task/*/children`), as this namespace names them. `None`
/// when one cannot be translated: a partial list could prove a running orphan gone.
pub fn to_own(pids: Vec<i32>) -> Option<Vec<i32>> {
    match view() {
        View::Own => Some(pids),
        View::Foreign { depth } => pids
            .into_iter()
            .map(|p| nspids(&p.to_string())?.get(depth).copied())
            .collect(),
        View::None => None,
    }
}

/// The `/proc` directory of `pid`, a child of this process: `/proc/PID`, or where the procfs
/// is another namespace's, the entry of the child that is `pid` here. `None` when it cannot be
/// found.
pub fn child_dir(pid: i32) -> Option<String> {
    match view() {
        View::Own => Some(format!("/proc/{pid}")),
        View::Foreign { depth } => {
            let tasks = std::fs::read_dir("/proc/self/task").ok()?;
            tasks.flatten().find_map(|task| {
                let list = std::fs::read_to_string(task.path().join("children")).ok()?;
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .find(|p| {
                        nspids(&p.to_string()).and_then(|ids| ids.get(depth).copied()) == Some(pid)
                    })
                    .map(|p| format!("/proc/{p}"))
            })
        }
        View::None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_process_sees_its_own_procfs() {
        // The unit tests run with the machine's /proc (or none).
        assert!(matches!(view(), View::Own | View::None));
        if view() == View::Own {
            assert_eq!(
                to_own(vec![1, std::process::id() as i32]),
                Some(vec![1, std::process::id() as i32])
            );
        }
    }
}
