//! The measurements of the `handover` benchmark (`benches/handover.rs`), here in the test
//! support so that both the benchmark and the test suite's smoke test (`tests/bench_smoke.rs`)
//! take them from one owner: the benchmark includes this support, never the other way round.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::floor::{
    floor_connect, floor_session, FLOOR_CHILD_ENV, FLOOR_ENV, FLOOR_HOLD_ENV, FLOOR_ID_ENV,
    LIBRARY_ENV,
};
use super::proxy::Proxy;
use super::{
    alive, leaderrun, unique_lock_id, wait_for, watchdog_of, Cluster, Replica, Scratch, CLASS,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// The child of the handover and failover rows: it first writes `alive OLD NEW` for each
/// earlier child it finds still running (not a zombie: an overlap, looked at with shell builtins
/// only), then stamps its start, and its end on SIGTERM.
const CHILD: &str = "while read -r kind pid rest; do\n\
       [ \"$kind\" = began ] && [ -r /proc/$pid/stat ] || continue\n\
       read -r _ _ state _ < /proc/$pid/stat 2>/dev/null || continue\n\
       [ \"$state\" = Z ] || [ \"$state\" = X ] || echo \"alive $pid $$\" >> \"$EVENTS\"\n\
     done 2>/dev/null < \"$EVENTS\"\n\
     echo \"began $$ $(date +%s%N)\" >> \"$EVENTS\"\n\
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
        let via = (how == "partition").then(|| proxy.dsn());
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
        // The old child's death is known only when this process noticed it, which on a loaded
        // machine is late; whether it was alive when the new child started, the new child
        // itself looked (`CHILD`): that decides the sign, the stamps the size.
        let alive = scratch
            .events()
            .iter()
            .any(|l| l.starts_with(&format!("alive {} ", first.pid)));
        let stamped = (old_dead.unwrap() - began) * 1e3;
        overlap.push(if alive {
            stamped.max(0.001)
        } else {
            stamped.min(0.0)
        });
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
            note: "old child's death − new child's start; ≤ 0 means none (the sign from the new child's own look at the old one)".into(),
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

/// `leaderrun-bench-clients` (`benches/clients.rs`), once [`build_product`] built it.
static CLIENTS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The floor clients' binary ([`build_product`]); panics before it is built.
fn clients() -> &'static std::path::Path {
    CLIENTS
        .get()
        .expect("the floor clients' binary: the benchmark builds it first (build_product)")
}

/// Builds `leaderrun` exactly as users build it (`cargo build --release --locked`, no
/// dev-dependency's feature unified in), then the floor clients with the same profile and
/// dependencies (`--features bench-clients`, a second build: the first stays the product's),
/// in cargo's own target directory, and has every measurement run these two
/// ([`super::measure_product_build`]). Cargo's output goes to stderr. Panics when a build
/// fails. Only the benchmark calls it: `cargo bench` built its `leaderrun` with the
/// dev-dependencies' features (tokio's `rt-multi-thread` and `test-util`), and its floor
/// clients were the benchmark's binary itself (BENCHMARKS.md, fifteenth pass).
pub fn build_product() {
    super::measure_product_build(cargo_build(&[], "leaderrun"));
    let _ = CLIENTS.set(cargo_build(
        &["--features", "bench-clients"],
        "leaderrun-bench-clients",
    ));
}

/// `cargo build --release --locked ARGS --bin NAME` of this package, in cargo's own target
/// directory; the executable's path as cargo reports it.
fn cargo_build(args: &[&str], name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .args(args)
        .args(["--bin", name])
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo");
    assert!(output.status.success(), "cargo build of {name} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo named no executable for {name}"))
}

/// Runs each row's measurement `runs` times, round-robin (round *i* starts at row *i* mod the
/// number of rows), so that the machine's drift over the group reaches every row alike: the
/// rows of one group are compared with each other (ratios to a floor), and run one after the
/// other a floor could be measured minutes after its leaderrun row, on a machine that had
/// since turned half as fast. Each measurement starts once the server has no client backend
/// left but those of before the group ([`Cluster::wait_backends_gone`]): started the instant
/// the one before returned, it shared the CPU with that one's backend exiting, which slowed
/// the floor process from 2.9 to 3.5 ms (BENCHMARKS.md, fifth pass). Each measurement's time
/// in ms.
fn interleaved(cluster: &Cluster, runs: usize, rows: &mut [&mut dyn FnMut()]) -> Vec<Vec<f64>> {
    let mut samples = vec![Vec::with_capacity(runs); rows.len()];
    // Sessions open before the group are not its measurements'.
    let kept = cluster.client_backends();
    for round in 0..runs {
        for k in 0..rows.len() {
            let i = (round + k) % rows.len();
            assert!(
                cluster.wait_backends_gone(&kept, Duration::from_secs(5)),
                "a client backend outlived its measurement by 5 s"
            );
            let t = Instant::now();
            (rows[i])();
            samples[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    samples
}

/// The one-shot rows, measured interleaved ([`interleaved`]), `4 runs` each: `true`, `flock`,
/// the floor in this process, with `floor_process` the floor as a process of its own too (the
/// floor clients' binary as [`super::floor::floor_client`]: only the benchmark builds it, so a
/// test that includes this module must pass false), and `leaderrun --once -- true` over TCP,
/// over a Unix socket and with
/// `--pid-namespace` where one can be made; with the floor process, then the TCP row over the
/// floor process of the same round, as a ratio (BENCHMARKS.md, the one-shot's goal).
pub fn one_shot(cluster: &Cluster, runs: usize, floor_process: bool) -> Vec<Row> {
    let lockfile = std::env::temp_dir().join("leaderrun-bench.lock");
    let runs = runs * 4;
    let bin = super::bin();

    let floor_dsn = cluster.dsn();
    let unix = format!(
        "host={} port={} user=postgres dbname=postgres",
        cluster.socket_dir().display(),
        cluster.addr().port()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut true_ = || {
        Command::new("true").status().unwrap();
    };
    let mut flock = || {
        Command::new("flock")
            .arg("-n")
            .arg(&lockfile)
            .arg("true")
            .status()
            .unwrap();
    };
    let mut floor_here = || runtime.block_on(async { floor_session(&floor_dsn).await });
    let mut process = || {
        let status = Command::new(clients())
            .env(FLOOR_ENV, &floor_dsn)
            .status()
            .unwrap();
        assert!(status.success());
    };
    let mut library = || {
        let status = Command::new(clients())
            .env(LIBRARY_ENV, &floor_dsn)
            .env(FLOOR_ID_ENV, unique_lock_id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    };
    // With `--pid-namespace` where this process may make PID namespaces: its price is one more
    // fork and exec per start (the init).
    let namespaced = leaderrun::process::pidns::PidNamespace::new()
        .is_ok()
        .then(|| ("--once --pid-namespace", "TCP loopback", cluster.dsn()));
    let shots: Vec<(&str, &str, String)> = [
        ("--once", "TCP loopback", cluster.dsn()),
        ("--once", "Unix socket", unix),
    ]
    .into_iter()
    .chain(namespaced)
    .collect();
    let mut leaderrun_rows: Vec<Box<dyn FnMut()>> = shots
        .iter()
        .map(|(flags, name, dsn)| {
            let id = unique_lock_id().to_string();
            let (flags, name, dsn) = (*flags, *name, dsn.clone());
            Box::new(move || {
                let out = Command::new(bin)
                    .arg("-q")
                    .args(flags.split(' '))
                    .args(["--dsn", &dsn, "--lock-id", &id, "--", "true"])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }) as Box<dyn FnMut()>
        })
        .collect();
    let mut all: Vec<&mut dyn FnMut()> = vec![&mut true_, &mut flock, &mut floor_here];
    if floor_process {
        all.push(&mut process);
        all.push(&mut library);
    }
    all.extend(
        leaderrun_rows
            .iter_mut()
            .map(|f| &mut **f as &mut dyn FnMut()),
    );
    let mut samples = interleaved(cluster, runs, &mut all).into_iter();
    let mut rows = vec![
        Row {
            name: "`true`".into(),
            unit: "ms",
            samples: samples.next().unwrap(),
            note: String::new(),
        },
        Row {
            name: "`flock -n FILE true`".into(),
            unit: "ms",
            samples: samples.next().unwrap(),
            note: String::new(),
        },
        Row {
            name: "floor: connect, try the lock, unlock, close; in-process, TCP loopback".into(),
            unit: "ms",
            samples: samples.next().unwrap(),
            note: "tokio-postgres, no TLS; no process start".into(),
        },
    ];
    if floor_process {
        rows.push(Row {
            name: FLOOR_PROCESS.into(),
            unit: "ms",
            samples: samples.next().unwrap(),
            note: "the same, as a process that starts, does it and exits (leaderrun-bench-clients)"
                .into(),
        });
        rows.push(Row {
            name: LIBRARY_PROCESS.into(),
            unit: "ms",
            samples: samples.next().unwrap(),
            note: "a process: the crate's Elector leads once and releases (TLS asked, timers \
                   pinned, durable fencing token), no COMMAND or watchdog"
                .into(),
        });
    }
    let first_shot = rows.len();
    for ((flags, name, _), samples) in shots.iter().zip(samples) {
        rows.push(Row {
            name: format!("`leaderrun {flags} -- true`, {name}"),
            unit: "ms",
            samples,
            note: String::new(),
        });
    }
    if !floor_process {
        return rows;
    }
    let floor = rows[first_shot - 2].samples.clone();
    let library = rows[first_shot - 1].samples.clone();
    let tcp = rows[first_shot].samples.clone();
    let ratio = |over: &[f64], under: &[f64]| over.iter().zip(under).map(|(o, u)| o / u).collect();
    rows.push(Row {
        name: "`leaderrun --once -- true`, TCP loopback / the floor process".into(),
        unit: "×",
        samples: ratio(&tcp, &floor),
        note: "each round's run over the floor process of the same round (goal: ≤ ×1.5)".into(),
    });
    rows.push(Row {
        name: "the library's election / the floor process".into(),
        unit: "×",
        samples: ratio(&library, &floor),
        note: "what the contract's election costs over the bare try".into(),
    });
    rows.push(Row {
        name: "`leaderrun --once -- true`, TCP loopback / the library's election".into(),
        unit: "×",
        samples: ratio(&tcp, &library),
        note: "what the tool adds around the election: start-up, watchdog, COMMAND (`true`), \
               the tree's proof"
            .into(),
    });
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

pub fn footprint(cluster: &Cluster, window: Duration) -> Vec<Row> {
    let mut rows = Vec::new();
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let script = scratch.child_script("child.sh", "exec sleep 3600");
    let script = script.to_str().unwrap().to_owned();
    let mut cmd = leaderrun();
    cmd.args(["-q", "--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
        .args(["--", &script]);
    let leader = Replica::spawn(cmd);
    scratch.wait_starts(1, Duration::from_secs(10));
    let standby = Replica::start(cluster, id, "5s", &["-q", "--", &script]);
    wait_queued(cluster, id);
    progress(&format!(
        "leader and standby up; a {}s window",
        window.as_secs()
    ));
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
        name: "waiting standby (queue head): RSS".into(),
        unit: "MiB",
        samples: vec![s1.1],
        note: "default interval".into(),
    });
    rows.push(Row {
        name: "waiting standby (queue head): CPU per hour".into(),
        unit: "s",
        samples: vec![(s1.0 - s0.0) * per_hour],
        note: format!("from a {}s window", window.as_secs()),
    });
    rows
}

/// A line on stderr with the time since the benchmark started, so it is never silent long.
pub fn progress(what: &str) {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(Instant::now);
    eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
}

/// Like [`wait_for`], polling every 200 ms, with a progress line (`status()`) every 5 s.
fn wait_progress(
    what: &str,
    within: Duration,
    mut cond: impl FnMut() -> (bool, String),
) -> Duration {
    let t = Instant::now();
    let mut said = Instant::now();
    loop {
        let (done, status) = cond();
        if done {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < within,
            "timed out after {within:?} waiting for {what} ({status})"
        );
        if said.elapsed() >= Duration::from_secs(5) {
            progress(&format!("  waiting for {what}: {status}"));
            said = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sessions of lock `id` whose last statement is a standby's (`/* leaderrun standby lock=…`):
/// standbys that have made at least one check, queued or between checks.
fn standby_sessions(cluster: &Cluster, id: i32) -> usize {
    let comment = leaderrun::elector::standby_comment(leaderrun::LockKey { class: CLASS, id });
    assert!(!comment.contains('\''));
    cluster.sql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE starts_with(query, '{comment}')"
    ))[0]
        .parse()
        .unwrap_or(0)
}

/// All sessions whose `application_name` says leaderrun.
fn leaderrun_sessions(cluster: &Cluster) -> usize {
    cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'leaderrun@%'")
        [0]
    .parse()
    .unwrap_or(0)
}

/// Waits until the server has no leaderrun session left (the previous step's are closed).
fn wait_sessions_gone(cluster: &Cluster) {
    wait_progress(
        "the previous sessions to close",
        Duration::from_secs(60),
        || {
            let n = leaderrun_sessions(cluster);
            (n == 0, format!("{n} left"))
        },
    );
}

/// leaderrun processes (the binary under test, and its watchdogs) still running.
pub fn leftover_processes() -> Vec<i32> {
    let me = std::process::id() as i32;
    let bin = std::fs::canonicalize(super::bin()).ok();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| Some(exe) == bin)
        })
        .collect()
}

/// Waits up to 10 s for every leaderrun process of this benchmark to be gone; says so when
/// some are left.
pub fn check_all_gone(group: &str) {
    let t = Instant::now();
    loop {
        let left = leftover_processes();
        if left.is_empty() {
            return;
        }
        if t.elapsed() > Duration::from_secs(10) {
            progress(&format!(
                "WARNING: after {group}, {} leaderrun processes still run: {left:?}",
                left.len()
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The time (seconds since the epoch) of the first line of `log` that contains `needle`, from
/// its timestamp (tracing's RFC 3339 UTC, microseconds).
fn log_time(log: &str, needle: &str) -> Option<f64> {
    log.lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|ts| humantime::parse_rfc3339_weak(ts.trim_end_matches('Z')).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
}

/// Standbys whose log says a check failed: (timed out, any failed connect or try).
fn failed_checks(replicas: &[Lean]) -> (usize, usize) {
    let logs: Vec<String> = replicas.iter().map(Lean::log).collect();
    let timed_out = logs.iter().filter(|l| l.contains("timed out")).count();
    let failed = logs
        .iter()
        .filter(|l| l.contains("acquire lock connection") || l.contains("ERROR"))
        .count();
    (timed_out, failed)
}

/// A standby of a large fleet: `leaderrun` started through `posix_spawn` (no `pre_exec`, so
/// the benchmark's address space is not copied: 1000 start in about a second, not a minute)
/// with stderr in a file and no collector threads; killed when dropped.
pub struct Lean {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Lean {
    /// `leaderrun --dsn DSN --lock-id ID --check-interval INTERVAL ARGS...`, logging to
    /// `log`. Call [`default_ignored_signals`] first: the dispositions are inherited.
    pub fn start(cluster: &Cluster, id: i32, interval: &str, args: &[&str], log: PathBuf) -> Lean {
        let mut cmd = Command::new(super::bin());
        // The environment of `support::leaderrun()`.
        super::clear_settings_env(&mut cmd);
        let file = std::fs::File::create(&log).expect("standby log");
        let child = cmd
            .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
            .args(["--check-interval", interval])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn leaderrun");
        Lean { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Lean {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Gives every signal this process ignores (but SIGPIPE, which std resets in each child) its
/// default disposition, so children started without `pre_exec` get the dispositions
/// [`super::default_signals`] would give them (a handled signal is reset by exec).
pub fn default_ignored_signals() {
    for sig in 1..32 {
        if matches!(sig, libc::SIGKILL | libc::SIGSTOP | libc::SIGPIPE) {
            continue;
        }
        // SAFETY: sigaction with a null new action only reads the disposition.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
            {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// The figures of `n` waiting standbys at the default interval, for each `n` of `sizes`: the
/// server's CPU over `window`, the standbys' own, how many timed out or failed to connect when
/// all `n` start in one burst, and (for `n` in `failover_at`) how soon the lock is granted
/// again after `kill -9` of the leader, `runs` times.
pub fn fleet(
    cluster: &Cluster,
    sizes: &[usize],
    failover_at: &[usize],
    window: Duration,
    runs: usize,
    quiet: bool,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut latencies: Vec<f64> = Vec::new();
    // At the default level (INFO) a refused standby also asks who holds the lock, once per
    // check; `-q` (WARN) leaves that out and still shows the failed-connect lines.
    let level = if quiet { "-q" } else { "default log level" };
    let standby_args: &[&str] = if quiet { &["-q"] } else { &[] };
    for &n in sizes {
        wait_sessions_gone(cluster);
        let id = unique_lock_id();
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", CHILD);
        let script = script.to_str().unwrap().to_owned();
        // The leader logs its check latency at DEBUG.
        let mut cmd = leaderrun();
        cmd.args(["-v", "--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
            .args(["--", &script]);
        let first_leader = Replica::spawn(cmd);
        scratch.wait_starts(1, Duration::from_secs(10));
        progress(&format!(
            "{n} standbys ({level}): starting them in one burst"
        ));
        default_ignored_signals();
        let t = Instant::now();
        let mut many: Vec<Lean> = (0..n)
            .map(|i| {
                let log = scratch.file(&format!("standby-{i}.log"));
                let args: Vec<&str> = standby_args
                    .iter()
                    .copied()
                    .chain(["--", &script])
                    .collect();
                Lean::start(cluster, id, "5s", &args, log)
            })
            .collect();
        let spawned = t.elapsed();
        progress(&format!(
            "{n} standbys: spawned in {:.1} s",
            spawned.as_secs_f64()
        ));
        let mut polls = 0;
        let all_checked = spawned
            + wait_progress(
                &format!("{n} standbys to check and 2 to queue"),
                Duration::from_secs(240),
                || {
                    let checked = standby_sessions(cluster, id);
                    let queued = cluster.waiters(id);
                    // Reading every log is not free: for the progress line only (every 5 s).
                    polls += 1;
                    let (timed_out, failed) = if polls % 20 == 0 {
                        failed_checks(&many)
                    } else {
                        (0, 0)
                    };
                    (
                        checked >= n && queued >= 2,
                        format!(
 "{checked} of {n} checked, {queued} queued; at the last log read {timed_out} timed out, {failed} with a failed check"
                        ),
                    )
                },
            );
        progress(&format!(
            "{n} standbys: all checked {:.1} s after the burst began; a {}s CPU window",
            all_checked.as_secs_f64(),
            window.as_secs()
        ));
        let (timed_out_at_start, failed_at_start) = failed_checks(&many);
        let sessions = leaderrun_sessions(cluster);
        let queued = cluster.waiters(id);
        let pids: Vec<i32> = many.iter().map(Lean::pid).collect();
        let client_cpu = |pids: &[i32]| pids.iter().map(|&p| proc_cpu_rss(p).0).sum::<f64>();
        let (cpu0, own0) = (postgres_cpu(), client_cpu(&pids));
        let t = Instant::now();
        let mut slept = Duration::ZERO;
        while slept < window {
            let step = (window - slept).min(Duration::from_secs(5));
            std::thread::sleep(step);
            slept += step;
            if slept < window {
                progress(&format!(
                    "  CPU window: {} s of {}",
                    slept.as_secs(),
                    window.as_secs()
                ));
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let cpu = (postgres_cpu() - cpu0) / secs;
        let own = (client_cpu(&pids) - own0) / secs;
        let (timed_out, failed) = failed_checks(&many);
        let exited = many
            .iter_mut()
            .map(|r| !r.running())
            .filter(|&gone| gone)
            .count();
        let rss: Vec<f64> = pids.iter().map(|&p| proc_cpu_rss(p).1).collect();
        rows.push(Row {
            name: format!("server with {n} waiting standbys ({level}): CPU"),
            unit: "cores",
            samples: vec![cpu],
            note: format!(
 "default interval 5s; {sessions} leaderrun sessions, {queued} of them queued; {secs:.0} s window"
            ),
        });
        rows.push(Row {
            name: format!("{n} waiting standbys ({level}) themselves: CPU, summed"),
            unit: "cores",
            samples: vec![own],
            note: format!(
                "median standby RSS {:.1} MiB",
                Row {
                    name: String::new(),
                    unit: "",
                    samples: rss,
                    note: String::new()
                }
                .stats()
                .map_or(0.0, |s| s.1)
            ),
        });
        rows.push(Row {
            name: format!("standbys that timed out or failed a connect, {n} ({level}) started together"),
            unit: "count",
            samples: vec![failed as f64],
            note: format!(
 "{timed_out} logged \"timed out\", {failed} any failed check, {exited} exited, within {:.0} s of the burst (at the last one's first check: {timed_out_at_start} / {failed_at_start}); all checked {:.1} s after the burst",
                all_checked.as_secs_f64() + secs,
                all_checked.as_secs_f64()
            ),
        });
        if failover_at.contains(&n) {
            let mut leader_pid = first_leader.pid();
            let (mut samples, mut granted) = (Vec::new(), Vec::new());
            for run in 0..runs {
                // The line of two must be full again: the next waiter is the queue head.
                wait_progress("the line of two to refill", Duration::from_secs(30), || {
                    let q = cluster.waiters(id);
                    (q >= 2, format!("{q} queued"))
                });
                let before = scratch.starts().len();
                let at = now_s();
                let _ = nix::sys::signal::kill(Pid::from_raw(leader_pid), Signal::SIGKILL);
                let next = scratch.wait_starts(before + 1, Duration::from_secs(30))[before].clone();
                let began = wait_for("start stamp", Duration::from_secs(5), || {
                    scratch.stamp("began", next.pid)
                });
                samples.push((began - at) * 1e3);
                leader_pid = next.ppid;
                // Its INFO line comes after the grant, the leader check's PREPARE and the
                // watchdog's start, just before COMMAND's.
                // (INFO: not at -q).
                let acquired = if quiet {
                    None
                } else {
                    many.iter().find(|r| r.pid() == next.ppid).map(|r| {
                        wait_for("the lock acquired line", Duration::from_secs(5), || {
                            log_time(&r.log(), "background leader lock acquired")
                        })
                    })
                };
                if let Some(acquired) = acquired {
                    granted.push((acquired - at) * 1e3);
                }
                progress(&format!(
                    "  kill -9 with {n} standbys, run {}: {:.1} ms{}",
                    run + 1,
                    (began - at) * 1e3,
                    acquired.map_or(String::new(), |a| format!(
                        " (lock acquired line at {:.1} ms)",
                        (a - at) * 1e3
                    ))
                ));
            }
            rows.push(Row {
                name: format!(
                    "failover after kill -9 of the leader, {n} waiting standbys ({level})"
                ),
                unit: "ms",
                samples,
                note: "kill → new child started (its `date`); default interval".into(),
            });
            if quiet {
                // The same floor as beside one standby, with this fleet's processes and
                // sessions on the machine.
                progress(&format!("{n} standbys: floor"));
                let mut floor = floor_handover(cluster, runs, FloorEvent::Killed);
                floor.name = format!(
                    "floor: kill -9 of the holding process → a waiting session's grant → child \
                     started, beside {n} waiting standbys ({level})"
                );
                rows.push(floor);
            }
            rows.extend((!quiet).then(|| Row {
                name: format!("… of which kill → the new leader's \"lock acquired\" line, {n} waiting standbys ({level})"),
                unit: "ms",
                samples: granted,
                note: "its log's timestamp (µs); the rest is fork/exec of COMMAND and its `date`".into(),
            }));
        }
        latencies.extend(first_leader.log().lines().filter_map(|l| {
            l.contains("leader check ok").then(|| {
                l.split("latency_ms=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            })?
        }));
        progress(&format!("{n} standbys: stopping them"));
        drop(many);
        drop(first_leader);
    }
    rows.push(Row {
        name: format!("leader check latency beside the standbys above ({level})"),
        unit: "ms",
        samples: latencies,
        note: "the first leader of each size; 1 ms resolution".into(),
    });
    wait_sessions_gone(cluster);
    rows
}

/// A role with `CONNECTION LIMIT 1` (not a superuser, whom the limit does not bind): `--once`
/// runs the job and the default mode leads, over TCP and over the Unix socket.
pub fn connection_limit(cluster: &Cluster, runs: usize) -> Vec<Row> {
    cluster.sql(
        "DO $$ BEGIN CREATE ROLE bench_lim LOGIN CONNECTION LIMIT 1; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    );
    let unix = format!(
        "host={} port={} user=bench_lim dbname=postgres",
        cluster.socket_dir().display(),
        cluster.addr().port()
    );
    let tcp = cluster.dsn().replace("user=postgres", "user=bench_lim");
    let mut rows = Vec::new();
    for (name, dsn) in [("TCP loopback", tcp), ("Unix socket", unix)] {
        for mode in ["--once", "default mode"] {
            let (mut works, mut codes, mut warns) = (Vec::new(), Vec::new(), 0);
            for _ in 0..runs {
                let id = unique_lock_id();
                let scratch = Scratch::new();
                let job = scratch.child_script("job.sh", "exit 0");
                let mut cmd = leaderrun();
                cmd.args(["--dsn", &dsn, "--lock-id", &id.to_string()]);
                if mode == "--once" {
                    cmd.arg("--once");
                }
                cmd.arg("--").arg(&job);
                let mut replica = Replica::spawn(cmd);
                let code = replica.wait_exit(Duration::from_secs(15)).code();
                let ran = scratch.starts().len() == 1;
                works.push(if ran && code == Some(0) { 1.0 } else { 0.0 });
                codes.push(code.map_or("signal".to_owned(), |c| c.to_string()));
                if replica.log().contains("WARN") {
                    warns += 1;
                }
            }
            codes.dedup();
            rows.push(Row {
                name: format!("role with CONNECTION LIMIT 1, {mode}, {name}: ran the job"),
                unit: "1/0",
                samples: works,
                note: format!(
                    "1 = the job ran and leaderrun exited 0; exit codes {}; {warns} runs logged a WARN{}",
                    codes.join(", "),
                    if name == "Unix socket" && warns > 0 {
                        " (no second session for the pooler probe)"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    rows
}

/// `n` copies of `leaderrun --once` released at the same moment against a cluster of its own
/// with `max_connections`, `runs` times: how many ran the job, how many exited with the
/// conflict code (3), how many 125.
pub fn cron_herd(n: usize, max_connections: u32, runs: usize) -> Vec<Row> {
    let cluster = Cluster::start_private_with(max_connections);
    let bin = super::bin();
    let (mut ran, mut conflict, mut failed, mut spans) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut other = Vec::new();
    for run in 0..runs {
        let id = unique_lock_id();
        let scratch = Scratch::new();
        let job = scratch.child_script("job.sh", "exec sleep 600");
        let fifo = scratch.file("go");
        assert!(Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        // Held open for reading and writing, so the herd's opens do not block; closing it is
        // the starting shot (EOF for every `read` at once).
        let gate = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let mut herd: Vec<Replica> = (0..n)
            .map(|_| {
                let mut cmd = leaderrun();
                let mut sh = Command::new("sh");
                for (key, value) in cmd.get_envs() {
                    match value {
                        Some(v) => sh.env(key, v),
                        None => sh.env_remove(key),
                    };
                }
                super::default_signals(&mut sh);
                sh.env("LR_GATE", &fifo)
                    .args(["-c", "read _ < \"$LR_GATE\"; exec \"$0\" \"$@\""])
                    .arg(bin)
                    .args(["--dsn", &cluster.dsn(), "--lock-id", &id.to_string()])
                    .args(["--once", "-E", "3", "--"])
                    .arg(&job);
                cmd = sh;
                Replica::spawn(cmd)
            })
            .collect();
        let fifo_link = std::fs::canonicalize(&fifo).unwrap();
        wait_progress(
            &format!("{n} shells at the gate"),
            Duration::from_secs(30),
            || {
                let at = herd
                    .iter()
                    .filter(|r| {
                        std::fs::read_dir(format!("/proc/{}/fd", r.pid()))
                            .map(|fds| {
                                fds.flatten().any(|fd| {
                                    std::fs::read_link(fd.path()).is_ok_and(|p| p == fifo_link)
                                })
                            })
                            .unwrap_or(false)
                    })
                    .count();
                (at >= n, format!("{at} of {n}"))
            },
        );
        let t = Instant::now();
        drop(gate);
        let runner = scratch.wait_starts(1, Duration::from_secs(30))[0].ppid;
        let mut codes = std::collections::BTreeMap::new();
        for replica in herd.iter_mut().filter(|r| r.pid() != runner) {
            let code = replica.wait_exit(Duration::from_secs(60)).code();
            *codes.entry(code).or_insert(0usize) += 1;
        }
        let span = t.elapsed().as_secs_f64();
        // A second run of the job would have started by now (every other copy has exited).
        let starts = scratch.starts().len();
        ran.push(starts as f64);
        conflict.push(*codes.get(&Some(3)).unwrap_or(&0) as f64);
        failed.push(*codes.get(&Some(125)).unwrap_or(&0) as f64);
        other.push(
            codes
                .iter()
                .filter(|(c, _)| !matches!(c, Some(3) | Some(125)))
                .map(|(_, k)| k)
                .sum::<usize>() as f64,
        );
        spans.push(span * 1e3);
        progress(&format!(
            "  cron herd run {}: job ran {starts}×, exits {codes:?}, last exit after {span:.1} s",
            run + 1
        ));
        drop(herd);
    }
    let what = format!("{n} `--once` at the same moment, max_connections = {max_connections}");
    let rows = vec![
        Row {
            name: format!("{what}: runs of the job"),
            unit: "count",
            samples: ran,
            note: "per herd; goal 1".into(),
        },
        Row {
            name: format!("{what}: conflict exits"),
            unit: "count",
            samples: conflict,
            note: format!("per herd; goal {}", n - 1),
        },
        Row {
            name: format!("{what}: 125 exits"),
            unit: "count",
            samples: failed,
            note: format!(
                "per herd; goal 0; other exit statuses: {}",
                other.iter().sum::<f64>()
            ),
        },
        Row {
            name: format!("{what}: gate → last copy exited"),
            unit: "ms",
            samples: spans,
            note: "default interval 5s (53300 retried for up to one interval)".into(),
        },
    ];
    drop(cluster);
    rows
}

/// One HTTP/1.0 GET; the status code (0 when nothing answered).
fn http_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").is_err() {
        return 0;
    }
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `/readyz` of a standby that waits in the lock queue at the default interval (5 s): the time
/// from its start until `/readyz` says 200, and from its first check (its first wait queued,
/// by its own DEBUG line) until then.
pub fn readyz(cluster: &Cluster, runs: usize) -> Vec<Row> {
    let id = unique_lock_id();
    let scratch = Scratch::new();
    let job = scratch.child_script("job.sh", "exec sleep 600");
    let job = job.to_str().unwrap().to_owned();
    let leader = Replica::start(cluster, id, "5s", &["-q", "--", &job]);
    scratch.wait_starts(1, Duration::from_secs(10));
    let (mut from_start, mut from_check, mut queued) = (Vec::new(), Vec::new(), 0);
    for _ in 0..runs {
        let spawned = now_s();
        let standby = Replica::start(
            cluster,
            id,
            "5s",
            &["-v", "--http-addr", "127.0.0.1:0", "--", &job],
        );
        let addr: std::net::SocketAddr = wait_for(
            "the HTTP address in the log",
            Duration::from_secs(5),
            || {
                let log = standby.log();
                let line = log.lines().find(|l| l.contains("serving /metrics"))?;
                line.split("addr=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            },
        );
        let ready = wait_for("/readyz 200", Duration::from_secs(15), || {
            (http_status(addr, "/readyz") == 200).then(now_s)
        });
        from_start.push((ready - spawned) * 1e3);
        let log = standby.log();
        if let Some(at) = log_time(&log, "in line: waiting in the server's queue") {
            queued += 1;
            from_check.push((ready - at) * 1e3);
        }
        drop(standby);
    }
    drop(leader);
    vec![
        Row {
            name: "standby waiting in the lock queue: start → /readyz 200".into(),
            unit: "ms",
            samples: from_start,
            note: "interval 5s; includes the random first-check spread of up to 1 s".into(),
        },
        Row {
            name: "standby waiting in the lock queue: its wait queued → /readyz 200".into(),
            unit: "ms",
            samples: from_check,
            note: format!(
                "{queued} of {runs} logged the wait; its DEBUG line's time (µs) to the first 200 \
                 of a 10 ms poll; the wait would time out after 5000 ms"
            ),
        },
    ]
}

/// `leaderrun --once -- true` less the median of `true`, sample by sample, from the rows of
/// [`one_shot`].
pub fn one_shot_overhead(rows: &[Row]) -> Vec<Row> {
    let median = |name: &str| rows.iter().find(|r| r.name == name)?.stats().map(|s| s.1);
    let (Some(base), Some(tcp)) = (
        median("`true`"),
        rows.iter()
            .find(|r| r.name == "`leaderrun --once -- true`, TCP loopback"),
    ) else {
        return Vec::new();
    };
    let mut out = vec![Row {
        name: "`leaderrun --once -- true` over `true`, TCP loopback".into(),
        unit: "ms",
        samples: tcp.samples.iter().map(|s| s - base).collect(),
        note: format!("each run less the median of `true` ({base:.1} ms)"),
    }];
    if let Some(floor) = median(FLOOR_PROCESS) {
        out.push(Row {
            name: "`leaderrun --once -- true` over the floor process and `true`, TCP loopback"
                .into(),
            unit: "ms",
            samples: tcp.samples.iter().map(|s| s - base - floor).collect(),
            note: format!(
                "each run less the medians of `true` ({base:.1} ms) and the floor process \
                 ({floor:.1} ms): what leaderrun adds to the least the job needs"
            ),
        });
    }
    out
}

/// The floor row run as a process of its own.
const FLOOR_PROCESS: &str = "floor: connect, try the lock, unlock, close; a process, TCP loopback";

/// The library's election as a process of its own ([`library_client`]).
const LIBRARY_PROCESS: &str =
    "the library's election: connect as libpq, pin, try with the token, release; a process";

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

/// What starts a floor's handover ([`floor_handover`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FloorEvent {
    /// The holder's `pg_advisory_unlock`, timed from just before its send: the lock's own
    /// handover, with no child of the holder's.
    Unlock,
    /// The holder's own child, stopped by SIGTERM to its group, exits; the holder waits for it
    /// (`waitpid`, nothing more) and then unlocks. Timed as leaderrun's handover row is: from
    /// the old child's `ended` stamp (in its TERM trap) to the new child's `began`, so the old
    /// child's own exit after its stamp is in both rows.
    ChildStopped,
    /// `kill -9` of a holder process (the floor clients' binary as
    /// [`super::floor::floor_holder`]).
    Killed,
}

/// The floors of the handover and failover rows: the same events with no leaderrun in the
/// path. A session of this process waits for the lock with `pg_advisory_lock` (as the queue
/// head does) and, once granted, starts the rows' child script, whose `began` stamp ends the
/// measurement. It starts at `event` ([`FloorEvent`]). No TLS, no watchdog, no check.
pub fn floor_handover(cluster: &Cluster, runs: usize, event: FloorEvent) -> Row {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dsn = cluster.dsn();

    let mut samples = Vec::new();
    for _ in 0..runs {
        let id = unique_lock_id();
        let scratch = Scratch::new();
        let script = scratch.child_script("child.sh", CHILD);
        let connect = || async { floor_connect(&dsn).await.0 };
        let lock = format!("SELECT pg_advisory_lock({CLASS}, {id})");
        let mut holder_process = None;
        // The pid of the holder process's child, for `ChildStopped`.
        let mut old = None;
        let holder = runtime.block_on(async {
            if event == FloorEvent::Unlock {
                let client = connect().await;
                client.simple_query(&lock).await.unwrap();
                return Some(client);
            }
            let mut holder = Command::new(clients());
            holder
                .env(FLOOR_HOLD_ENV, &dsn)
                .env(FLOOR_ID_ENV, id.to_string())
                .stdout(Stdio::piped());
            if event == FloorEvent::ChildStopped {
                holder.env(FLOOR_CHILD_ENV, &script);
            }
            let mut child = holder.spawn().unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            let mut words = line.split_whitespace();
            assert_eq!(words.next(), Some("held"), "{line:?}");
            old = words.next().map(|pid| pid.parse::<i32>().unwrap());
            holder_process = Some(child);
            None
        });
        if let Some(pid) = old {
            wait_for(
                "the old child's start stamp",
                Duration::from_secs(5),
                || scratch.stamp("began", pid),
            );
        }
        let waiter = runtime.block_on(connect());
        let (at, child) = runtime.block_on(async {
            let wait = tokio::spawn(async move {
                waiter.simple_query(&lock).await.unwrap();
                let child = Command::new(&script).spawn().unwrap();
                (waiter, child)
            });
            while cluster.waiters(id) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let at = match (&holder, &mut holder_process, old) {
                (Some(client), _, _) => {
                    let at = now_s();
                    client
                        .simple_query(&format!("SELECT pg_advisory_unlock({CLASS}, {id})"))
                        .await
                        .unwrap();
                    Some(at)
                }
                (None, Some(_), Some(pid)) => {
                    // As leaderrun stops COMMAND; the holder waits for it and unlocks.
                    nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
                    None
                }
                (None, Some(process), None) => {
                    let at = now_s();
                    process.kill().unwrap();
                    Some(at)
                }
                _ => unreachable!(),
            };
            let (_waiter, child) = wait.await.unwrap();
            (at, child)
        });
        // Timed from the old child's end stamp, as the leaderrun rows are.
        let at = at.unwrap_or_else(|| {
            let pid = old.expect("a holder's child");
            wait_for("the old child's end stamp", Duration::from_secs(5), || {
                scratch.stamp("ended", pid)
            })
        });
        let pid = child.id() as i32;
        let began = wait_for(
            "the floor child's start stamp",
            Duration::from_secs(5),
            || scratch.stamp("began", pid),
        );
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        if let Some(mut process) = holder_process {
            let _ = process.wait();
        }
        let mut child = child;
        let _ = child.wait();
        samples.push((began - at) * 1e3);
    }
    let (name, note) = match event {
        FloorEvent::Killed => (
            "floor: kill -9 of the holding process → a waiting session's grant → child started",
            "no leaderrun: the holder a process of its own (leaderrun-bench-clients), a session \
             of the benchmark waiting in pg_advisory_lock starts the same child",
        ),
        FloorEvent::Unlock => (
            "floor: unlock → a waiting session's grant → child started",
            "no leaderrun: a session of the benchmark waits in pg_advisory_lock, then starts the \
             same child (its `date`)",
        ),
        FloorEvent::ChildStopped => (
            "floor: the holder's child stopped (TERM to its group) → reaped → unlock → a waiting \
             session's grant → child started",
            "no leaderrun: old child's end stamp → new child's start stamp, as the leaderrun rows \
             are timed; the holder, a process of its own, waits for its child, unlocks, closes \
             and exits",
        ),
    };
    Row {
        name: name.into(),
        unit: "ms",
        samples,
        note: note.into(),
    }
}
