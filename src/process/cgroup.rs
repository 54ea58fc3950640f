//! A cgroup v2 group of COMMAND's own, where leaderrun may create one (root, or a delegated
//! subtree): every descendant of COMMAND stays in it, also one that left the process group with
//! `setsid`, so a stop reaches all of them and `cgroup.kill` ends them at once (Linux 5.14+),
//! unless root moves it out again (`systemd-run --scope`): what is outside is found as without
//! a cgroup (docs/process-model.md#cgroups).
//! Without one, what left the group is reached only once it has been re-parented to leaderrun.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;
use tracing::debug;

/// COMMAND's cgroup: `<leaderrun's own cgroup>/leaderrun-<pid>`, removed again on drop.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    procs: CString,
}

impl Cgroup {
    /// Creates the group next to leaderrun's own, on the cgroup v2 hierarchy (also the
    /// `unified` one of a hybrid setup). `None` when there is none or it is not writable, and
    /// unless `forced`, also when moving a process into it is slow: without the cgroup2
    /// mount option `favordynmods`, the first move after a quiet spell waits for an RCU grace
    /// period (about 10 ms here), which every handover would pay.
    pub fn create(forced: bool) -> Option<Cgroup> {
        let (mount, path) = own_cgroup()?;
        if !forced && !mount.favordynmods {
            debug!("no cgroup of COMMAND's own: moving into one is slow here (no favordynmods); --cgroup forces one");
            return None;
        }
        let dir = mount.dir.join(path.trim_start_matches('/'));
        let dir = dir.join(format!("leaderrun-{}", std::process::id()));
        if let Err(err) = std::fs::create_dir(&dir) {
            debug!(dir = %dir.display(), "no cgroup of COMMAND's own: {err}");
            return None;
        }
        if !dir.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
        Some(Cgroup { dir, procs })
    }

    /// Adopts an existing group (the watchdog is handed the one leaderrun made).
    pub fn open(dir: &Path) -> Option<Cgroup> {
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
        dir.join("cgroup.kill").exists().then(|| Cgroup {
            dir: dir.to_owned(),
            procs,
        })
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs` as a C string, for the child to move itself in before exec (writing "0"
    /// moves the writer).
    pub fn procs_path(&self) -> &CString {
        &self.procs
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<Pid> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_ascii_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect()
    }

    /// Whether any live process is left in the group (`cgroup.events`: `populated`). A group
    /// that cannot be read but for being gone (no descriptor left, `EMFILE`) counts as
    /// populated: "empty" would release the lock while the tree may run.
    pub fn populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(events) => !events.lines().any(|l| l == "populated 0"),
            Err(err) => err.kind() != std::io::ErrorKind::NotFound,
        }
    }

    /// SIGKILLs every process in the group, wherever it went (`cgroup.kill`).
    pub fn kill(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Fails while processes are left; the watchdog or the next start cleans up then.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The cgroup2 mount point and whether it favours dynamic changes.
struct Mount {
    dir: PathBuf,
    favordynmods: bool,
}

/// leaderrun's cgroup v2 mount and its own path in it: the `0::PATH` line of
/// `/proc/self/cgroup`, the cgroup2 line of `/proc/self/mountinfo`.
fn own_cgroup() -> Option<(Mount, String)> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .to_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS"
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next()? != "cgroup2" {
            return None;
        }
        let superopts = right.nth(1).unwrap_or("");
        Some(Mount {
            dir: PathBuf::from(left.split_whitespace().nth(4)?),
            favordynmods: superopts.split(',').any(|o| o == "favordynmods"),
        })
    })?;
    mount.dir.is_dir().then_some((mount, path))
}
