//! `leaderrun-bench-clients`: the benchmark's floor clients and the library's election, each a
//! process of its own (`tests/support/floor.rs`). Built only with the `bench-clients` feature,
//! by the benchmark itself, as `cargo build --release` builds `leaderrun`; never installed.

#[path = "../tests/support/floor.rs"]
mod floor;

fn main() {
    assert!(
        floor::run_from_env(),
        "set one of {}, {} or {} to a DSN",
        floor::FLOOR_ENV,
        floor::LIBRARY_ENV,
        floor::FLOOR_HOLD_ENV
    );
}
