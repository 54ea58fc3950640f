//! One integration test binary (one link instead of many): the library against a real
//! PostgreSQL, and the real `leaderrun` binary against a real PostgreSQL.

mod support;

mod binary;
mod child;
mod docs;
mod election;
mod modes;
mod operate;
mod safety;
mod terminal;
mod tls;
