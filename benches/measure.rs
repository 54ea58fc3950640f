//! The measurements of the `handover` benchmark, shared with the smoke test in the test suite.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::proxy::Proxy;
use crate::support::{
    alive, leaderrun, unique_lock_id, wait_for, watchdog_of, Cluster, Replica, Scratch, CLASS,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

const CHILD: &str = "echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     trap 'echo \"ended $$ $(date +%s%N)\" >> \"$EVENTS\"; exit 0' TERM\n\
     while :; do sleep 0.01; done";

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One measured quantity over N runs (milliseconds unless `unit` says otherwise).
pub struct Row {
    pub name: String,
    pub unit: &'static str,
    pub samples: Vec<f64>,
    pub note: String,
}

impl Row {
    pub fn stats(&self) -> Option<(f64, f64, f64, f64)> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v = self.samples.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let pick = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((v[0], pick(0.5), pick(0.95), v[v.len() - 1]))
    }
}

fn start_pair(
    cluster: &Cluster,
    interval: &str,
    dsn: Option<String>,
) -> (Scratch, Vec<Replica>, i32) {
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", CHILD);
    let script = script.to_str().unwrap().to_owned();
    let mut replicas = Vec::new();
    // The first replica (through `dsn` when given) leads; the second waits directly.
    let mut cmd = leaderrun();
    cmd.args([
        "-q",
        "--dsn",
        &dsn.unwrap_or_else(|| cluster.dsn()),
        "--lock-id",
        &id.to_string(),
    ])
    .args(["--check-interval", interval, "--", &script]);
    replicas.push(Replica::spawn(cmd));
    scratch.wait_starts(1, Duration::from_secs(10));
    replicas.push(Replica::start(
        cluster,
        id,
        interval,
        &["-q", "--", &script],
    ));
    // The standby must be waiting in the lock queue before anything is measured.
    wait_queued(cluster, id);
    (scratch, replicas, id)
}

/// Waits until a session waits in the server's queue for lock `id` (of the default class).
fn wait_queued(cluster: &Cluster, id: i32) {
    wait_for(
        "the standby in the lock queue",
        Duration::from_secs(10),
        || {
            let rows = cluster.sql(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND classid = ({CLASS}::bigint & 4294967295)::text::oid \
                 AND objid = ({id}::bigint & 4294967295)::text::oid \
                 AND objsubid = 2 AND NOT granted"
            ));
            (rows[0].parse::<usize>().unwrap_or(0) >= 1).then_some(())
        },
    )
}

/// When process `pid` exits, as seen by a thread blocked on its pidfd: a tight upper bound on
/// its death (a poll loop may be scheduled late and report it after the new child's start).
fn death_watch(pid: i32) -> mpsc::Receiver<f64> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        fd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    let fd = fd as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the descriptor is ours and closed once.
        while unsafe { libc::poll(&mut pfd, 1, -1) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        let _ = tx.send(now_s());
        unsafe { libc::close(fd) };
    });
    rx
}

/// Handover after SIGTERM of the leader: old child's end → new child's start.
pub fn graceful(cluster: &Cluster, interval: &str, runs: usize) -> Row {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let (scratch, replicas, _) = start_pair(cluster, interval, None);
        let first = scratch.starts()[0].clone();
        replicas[0].signal(Signal::SIGTERM);
        let second = scratch.wait_starts(2, Duration::from_secs(30))[1].clone();
        let ended = wait_for(
            &format!(
                "end stamp of {} in {:?}; old leader's log:\n{}",
                first.pid,
                scratch.events(),
                replicas[0].log()
            ),
            Duration::from_secs(5),
            || scratch.stamp("ended", first.pid),
        );
        let began = wait_for("start stamp", Duration::from_secs(5), || {
            scratch.stamp("began", second.pid)
        });
        samples.push((began - ended) * 1e3);
    }
    Row {
        name: format!("handover after SIGTERM, interval {interval}"),
        unit: "ms",
        samples,
        note: "old child stopped → new child started".into(),
    }
}

/// Failover latency (event → new child) and overlap (old child's death − new child's start).
pub fn failover(cluster: &Cluster, how: &str, runs: usize) -> (Row, Row) {
    let (mut latency, mut overlap) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let proxy = Proxy::start(cluster.addr());
        let via = (how == "partition").then(|| {
            format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres",
                proxy.port()
            )
        });
        let interval = if how == "partition" { "1s" } else { "5s" };
        let (scratch, replicas, _) = start_pair(cluster, interval, via);
        let first = scratch.starts()[0].clone();
        let died = death_watch(first.pid);
        let at = now_s();
        match how {
            "kill -9" => replicas[0].signal(Signal::SIGKILL),
            "pg_terminate_backend" => cluster.terminate_backend(first.backend_pid),
            _ => proxy.blackhole(),
        }
        let mut old_dead = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        let new_start = loop {
            if old_dead.is_none() {
                if let Ok(exited) = died.try_recv() {
                    old_dead = Some(scratch.stamp("ended", first.pid).unwrap_or(exited));
                }
            }
            let starts = scratch.starts();
            if starts.len() >= 2 && old_dead.is_some() {
                let pid = starts[1].pid;
                break wait_for("start stamp", Duration::from_secs(5), || {
                    scratch.stamp("began", pid)
                });
            }
            assert!(Instant::now() < deadline, "{how}: no failover");
            std::thread::sleep(Duration::from_millis(1));
        };
        let began = new_start;
        latency.push((began - at) * 1e3);
        overlap.push((old_dead.unwrap() - began) * 1e3);
        drop(replicas);
    }
    (
        Row {
            name: format!("failover after {how}"),
            unit: "ms",
            samples: latency,
            note: if how == "partition" {
                "interval 1s; bounded by idle_session_timeout (4 s)".into()
            } else {
                "interval 5s (default)".into()
            },
        },
        Row {
            name: format!("overlap after {how}"),
            unit: "ms",
            samples: overlap,
            note: "old child's death − new child's start; ≤ 0 means none".into(),
        },
    )
}

fn timed(runs: usize, mut f: impl FnMut()) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

pub fn one_shot(cluster: &Cluster, runs: usize) -> Vec<Row> {
    let lockfile = std::env::temp_dir().join("leaderrun-bench.lock");
    let runs = runs * 4;
    let bin = env!("CARGO_BIN_EXE_leaderrun");
    let unix = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.socket_dir().display(),
        cluster.addr().port()
    );
    let mut rows = vec![
        Row {
            name: "`true`".into(),
            unit: "ms",
            samples: timed(runs, || {
                Command::new("true").status().unwrap();
            }),
            note: String::new(),
        },
        Row {
            name: "`flock -n FILE true`".into(),
            unit: "ms",
            samples: timed(runs, || {
                Command::new("flock")
                    .arg("-n")
                    .arg(&lockfile)
                    .arg("true")
                    .status()
                    .unwrap();
            }),
            note: String::new(),
        },
    ];
    for (name, dsn) in [("TCP loopback", cluster.dsn()), ("Unix socket", unix)] {
        let id = unique_lock_id().to_string();
        let samples = timed(runs, || {
            let out = Command::new(bin)
                .args([
                    "-q",
                    "--once",
                    "--dsn",
                    &dsn,
                    "--lock-id",
                    &id,
                    "--",
                    "true",
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        });
        rows.push(Row {
            name: format!("`leaderrun --once -- true`, {name}"),
            unit: "ms",
            samples,
            note: String::new(),
        });
    }
    rows
}

/// A tree of three that ticks every 10 ms while it lives: the main child, a worker in its
/// process group, and a `setsid` descendant; none of them reacts to TERM.
const TREE: &str = "export EVENTS\n\
     echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
     sh -c 'trap \"\" TERM; while :; do echo \"tick $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done' &\n\
     setsid sh -c 'trap \"\" TERM; while :; do echo \"tick $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done' &\n\
     trap '' TERM\n\
     while :; do echo \"tick $$ $(date +%s%N)\" >> \"$EVENTS\"; sleep 0.01; done";

/// Failover after `kill -9` or SIGSTOP of leaderrun alone, for a tree of three (see [`TREE`]):
/// latency (event → new child) and overlap (the old tree's last tick − the new child's start).
pub fn tree_failover(cluster: &Cluster, how: &str, runs: usize) -> (Row, Row) {
    let (mut latency, mut overlap) = (Vec::new(), Vec::new());
    let interval = "1s";
    for _ in 0..runs {
        let id = unique_lock_id();
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", TREE);
        let script = script.to_str().unwrap().to_owned();
        let leader = Replica::start(cluster, id, interval, &["-q", "--cgroup", "--", &script]);
        let first = scratch.wait_starts(1, Duration::from_secs(10))[0].clone();
        let standby = Replica::start(cluster, id, interval, &["-q", "--cgroup", "--", &script]);
        wait_queued(cluster, id);
        let at = now_s();
        leader.signal(if how == "kill -9" {
            Signal::SIGKILL
        } else {
            Signal::SIGSTOP
        });
        let second = scratch.wait_starts(2, Duration::from_secs(30))[1].clone();
        let began = wait_for("start stamp", Duration::from_secs(5), || {
            scratch.stamp("began", second.pid)
        });
        // Let the new tree tick a while: an old process still alive would tick too.
        std::thread::sleep(Duration::from_millis(200));
        let new_tree = |pid: i32| -> bool {
            let mut p = pid;
            for _ in 0..16 {
                if p == standby.pid() {
                    return true;
                }
                let Some(ppid) = std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| s.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok())
                else {
                    return false;
                };
                p = ppid;
            }
            false
        };
        let last_old = scratch
            .events()
            .iter()
            .filter_map(|l| l.strip_prefix("tick "))
            .filter_map(|l| {
                let (pid, ns) = l.split_once(' ')?;
                let pid: i32 = pid.parse().ok()?;
                (pid != second.pid && !new_tree(pid))
                    .then(|| ns.parse::<f64>().ok().map(|n| n / 1e9))?
            })
            .fold(f64::MIN, f64::max);
        latency.push((began - at) * 1e3);
        overlap.push((last_old - began) * 1e3);
        let _ = first;
        if how != "kill -9" {
            leader.signal(Signal::SIGCONT);
        }
        drop(standby);
        drop(leader);
    }
    (
        Row {
            name: format!("failover after {how}, tree of three"),
            unit: "ms",
            samples: latency,
            note: format!("interval {interval}, --cgroup; group worker and setsid descendant"),
        },
        Row {
            name: format!("overlap after {how}, tree of three"),
            unit: "ms",
            samples: overlap,
            note: "old tree's last sign of life − new child's start; ≤ 0 means none".into(),
        },
    )
}

/// Resident and proportional set size of `pid`, MiB.
fn rss_pss(pid: i32) -> (f64, f64) {
    let kb = |file: &str, key: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("status", "VmRSS:"), kb("smaps_rollup", "Pss:"))
}

fn proc_cpu_rss(pid: i32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, r)| r.split(' ').collect())
        .unwrap_or_default();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let cpu = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    (cpu / ticks, rss_kb / 1024.0)
}

fn postgres_cpu() -> f64 {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| proc_cpu_rss(pid).0)
        .sum()
}

pub fn footprint(cluster: &Cluster, standbys: &[usize], window: Duration) -> Vec<Row> {
    let mut rows = Vec::new();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 3600");
    let script = script.to_str().unwrap().to_owned();
    let mut cmd = leaderrun();
    cmd.args(["-v", "--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
        .args(["--", &script]);
    let leader = Replica::spawn(cmd);
    scratch.wait_starts(1, Duration::from_secs(10));
    let standby = Replica::start(cluster, id, "5s", &["-q", "--", &script]);
    std::thread::sleep(Duration::from_millis(500));
    let (l0, s0) = (proc_cpu_rss(leader.pid()), proc_cpu_rss(standby.pid()));
    std::thread::sleep(window);
    let (l1, s1) = (proc_cpu_rss(leader.pid()), proc_cpu_rss(standby.pid()));
    let per_hour = 3600.0 / window.as_secs_f64();
    rows.push(Row {
        name: "leader: RSS".into(),
        unit: "MiB",
        samples: vec![l1.1],
        note: "default interval".into(),
    });
    if let Some(watchdog) = watchdog_of(leader.pid()) {
        let (lr, lp) = rss_pss(leader.pid());
        let (wr, wp) = rss_pss(watchdog);
        rows.push(Row {
            name: "leader with its watchdog: RSS, summed".into(),
            unit: "MiB",
            samples: vec![lr + wr],
            note: format!(
                "leader {lr:.1} + watchdog {wr:.1}; VmRSS, shared pages counted twice; budget 6 MiB"
            ),
        });
        rows.push(Row {
            name: "leader with its watchdog: PSS, summed".into(),
            unit: "MiB",
            samples: vec![lp + wp],
            note: format!(
                "leader {lp:.1} + watchdog {wp:.1}; smaps_rollup Pss, shared pages split"
            ),
        });
    }
    rows.push(Row {
        name: "leader: CPU per hour".into(),
        unit: "s",
        samples: vec![(l1.0 - l0.0) * per_hour],
        note: format!("from a {}s window", window.as_secs()),
    });
    rows.push(Row {
        name: "idle standby: RSS".into(),
        unit: "MiB",
        samples: vec![s1.1],
        note: "default interval".into(),
    });
    rows.push(Row {
        name: "idle standby: CPU per hour".into(),
        unit: "s",
        samples: vec![(s1.0 - s0.0) * per_hour],
        note: format!("from a {}s window", window.as_secs()),
    });
    drop(standby);
    for &n in standbys {
        let many: Vec<Replica> = (0..n)
            .map(|_| Replica::start(cluster, id, "5s", &["-q", "--", &script]))
            .collect();
        wait_for("all standbys connected", Duration::from_secs(120), || {
            let rows = cluster.sql(&format!("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {id} AND NOT granted"));
            (rows[0].parse::<usize>().unwrap_or(0) >= n).then_some(())
        });
        let sessions = cluster
            .sql("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'leaderrun@%'")
            [0]
        .clone();
        let cpu0 = postgres_cpu();
        let t = Instant::now();
        std::thread::sleep(window);
        let cpu = (postgres_cpu() - cpu0) / t.elapsed().as_secs_f64();
        rows.push(Row {
            name: format!("server with {n} standbys: CPU"),
            unit: "cores",
            samples: vec![cpu],
            note: format!("{sessions} leaderrun sessions"),
        });
        drop(many);
    }
    // The leader's check latency meanwhile, from its own histogram.
    let log = leader.log();
    let latencies: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("leader check ok"))
        .filter_map(|l| {
            l.split("latency_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    rows.push(Row {
        name: "leader check latency during the runs above".into(),
        unit: "ms",
        samples: latencies,
        note: "1 ms resolution".into(),
    });
    rows
}

/// `etcdctl lock --ttl 5` side by side (Debian's etcd-server and etcd-client), when installed:
/// handover after SIGTERM and after `kill -9` of the holder, with the overlap window.
pub fn etcd(runs: usize) -> Vec<Row> {
    let installed = ["etcd", "etcdctl"].iter().all(|b| {
        Command::new("which")
            .arg(b)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !installed {
        return vec![Row {
            name: "`etcdctl lock` handover".into(),
            unit: "ms",
            samples: Vec::new(),
            note: "skipped: etcd/etcdctl not installed (Debian: etcd-server, etcd-client)".into(),
        }];
    }
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (client, peer) = (free(), free());
    let data = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{client}");
    let mut etcd = Command::new("etcd")
        .arg("--data-dir")
        .arg(data.path())
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    wait_for("etcd to answer", Duration::from_secs(20), || {
        Command::new("etcdctl")
            .args(["--endpoints", &endpoint, "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()
            .filter(|s| s.success())
    });
    let mut rows = Vec::new();
    for (how, sig) in [("SIGTERM", Signal::SIGTERM), ("kill -9", Signal::SIGKILL)] {
        let (mut latency, mut overlap) = (Vec::new(), Vec::new());
        let mut missed = 0;
        for run in 0..runs {
            let scratch = Scratch::new();
            let script = scratch.child_script("child.sh", CHILD);
            let name = format!("bench-{how}-{run}-{}", std::process::id());
            let lock = || {
                let mut cmd = Command::new("etcdctl");
                cmd.args(["--endpoints", &endpoint, "lock", "--ttl", "5", &name])
                    .arg(&script)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                cmd.spawn().expect("etcdctl lock")
            };
            let mut holder = lock();
            scratch.wait_starts(1, Duration::from_secs(10));
            let mut waiter = lock();
            std::thread::sleep(Duration::from_millis(300));
            let first = scratch.starts()[0].clone();
            let at = now_s();
            let _ = nix::sys::signal::kill(Pid::from_raw(holder.id() as i32), sig);
            // etcdctl may not hand over at all (it keeps its lease while its command runs):
            // give it 15 s, three lease TTLs.
            let deadline = Instant::now() + Duration::from_secs(15);
            let second = loop {
                if let Some(second) = scratch.starts().get(1).cloned() {
                    break Some(second);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            let Some(second) = second else {
                missed += 1;
                let _ = nix::sys::signal::kill(Pid::from_raw(first.pid), Signal::SIGKILL);
                for child in [&mut holder, &mut waiter] {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                continue;
            };
            let began = wait_for("start stamp", Duration::from_secs(5), || {
                scratch.stamp("began", second.pid)
            });
            latency.push((began - at) * 1e3);
            // How long the old child outlived the new one's start (capped at 2 s, then killed).
            let dead = wait_for("old child", Duration::from_secs(3), || {
                if !alive(first.pid) {
                    Some(scratch.stamp("ended", first.pid).unwrap_or_else(now_s))
                } else if now_s() - began > 2.0 {
                    Some(began + 2.0)
                } else {
                    None
                }
            });
            overlap.push((dead - began) * 1e3);
            for pid in [first.pid, second.pid] {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            for child in [&mut holder, &mut waiter] {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        rows.push(Row {
            name: format!("`etcdctl lock --ttl 5` failover after {how} of the holder"),
            unit: "ms",
            samples: latency,
            note: if missed > 0 {
                format!("etcd 3.4 from Debian, one local member; {missed} of {runs} runs: no handover within 15 s")
            } else {
                "etcd 3.4 from Debian, one local member".into()
            },
        });
        rows.push(Row {
            name: format!("`etcdctl lock` overlap after {how} of the holder"),
            unit: "ms",
            samples: overlap,
            note: "old child's death − new child's start; 2000 = old child still running after 2 s"
                .into(),
        });
    }
    let _ = etcd.kill();
    let _ = etcd.wait();
    rows
}
