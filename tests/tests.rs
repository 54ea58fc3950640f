//! One integration test binary (one link instead of many): the library against a real
//! PostgreSQL, and the real `leaderrun` binary against a real PostgreSQL. Each module is one
//! subject (its header says what it covers); run one with `cargo test --test tests -- NAME::`.
//!
//! * The product's promises: `rules` (the three rules, docs/guarantees.md#the-three-rules),
//!   `safety` (partitions, pauses, fencing tokens, session timers, the role's `search_path`), `faults` (a randomized run
//!   of overlapping kills, freezes, partitions and restarts), `fence` (nothing outside
//!   the election holds up the fence: stderr, reaping, the watchdog killed).
//! * Electing: `failover` (one leader, failover and hand-over), `scale` (many standbys,
//!   `--slots`), `election` (the library's `Elector`), `connecting` and `libpq` (connecting as
//!   libpq does), `tls`.
//! * COMMAND: `child` (groups, orphans, signals, the grace), `pidns` (`--pid-namespace`), `exits` (exit codes), `modes`
//!   (one-shots, `--wait`, the ticker, restarts, timeouts), `terminal` (a real tty).
//! * Operating it: `status` (`status`, `step-down`, `doctor`), `probes` (`/healthz`,
//!   `/readyz`, systemd notification), `metrics` (`/metrics`), `logs` (log lines and
//!   messages), `http` (the HTTP port under abuse), `docs` (man page and completions).
//! * `bench_smoke`: the benchmark's measurements run (they live in `support::measure`).
//! * `support`: the cluster, the binary, [`support::Setup`] (the common set-up), waits with
//!   deadlines; shared with `benches/handover.rs`, which includes it by path.

mod support;

mod bench_smoke;
mod child;
mod connecting;
mod docs;
mod election;
mod exits;
mod failover;
mod faults;
mod fence;
mod http;
mod libpq;
mod logs;
mod metrics;
mod modes;
mod pidns;
mod probes;
mod rules;
mod safety;
mod scale;
mod schedule;
mod status;
mod terminal;
mod tls;
