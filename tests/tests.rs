//! One integration test binary (one link instead of many): the library against a real
//! PostgreSQL, and the real `leaderrun` binary against a real PostgreSQL.

mod support;

mod child;
mod connecting;
mod docs;
mod election;
mod exits;
mod failover;
mod fence;
mod http;
mod libpq;
mod logs;
mod metrics;
mod modes;
mod probes;
mod rules;
mod safety;
mod scale;
mod status;
mod terminal;
mod tls;

// The smoke test uses only part of the benchmark's measurements.
mod bench_smoke;
#[allow(dead_code)]
#[path = "../benches/measure.rs"]
mod measure;
