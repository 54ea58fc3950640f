//! One integration test binary (one link instead of many): the library against a real
//! PostgreSQL, and the real `leaderrun` binary against a real PostgreSQL.

mod support;

mod bench_smoke;
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
