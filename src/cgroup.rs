//! A cgroup v2 group of COMMAND's own, where leaderrun may create one (root, or a delegated
//! subtree): every descendant of COMMAND stays in it, also one that left the process group with
//! `setsid`, so a stop reaches all of them and `cgroup.kill` ends them at once (Linux 5.14+).
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
    /// `unified` one of a hybrid setup). `None` when there is none or it is not writable.
    pub fn create() -> Option<Cgroup> {
        let dir = own_cgroup_dir()?.join(format!("leaderrun-{}", std::process::id()));
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

    /// Whether any live process is left in the group (`cgroup.events`: `populated`).
    pub fn populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(events) => !events.lines().any(|l| l == "populated 0"),
            Err(_) => false,
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

/// leaderrun's own cgroup v2 directory: the `0::PATH` line of `/proc/self/cgroup` under the
/// cgroup2 mount point from `/proc/self/mountinfo`.
fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS"
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2").then(|| left.split_whitespace().nth(4))?
    })?;
    let dir = Path::new(mount).join(path.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}
