//! leaderrun's own exit statuses (docs/guarantees.md#exit-codes). COMMAND's status, 128 + N for a
//! signal death and the conflict code (`--conflict-exit-code`, default 0) are the others.

/// `--timeout` expired and COMMAND was stopped, as `timeout(1)` has it.
pub const TIMEOUT: u8 = 124;
/// leaderrun itself failed: usage error, bad DSN, database unreachable in a one-shot, HTTP
/// port in use.
pub const FAILURE: u8 = 125;
/// COMMAND was found but is not executable.
pub const NOT_EXECUTABLE: u8 = 126;
/// COMMAND was not found.
pub const NOT_FOUND: u8 = 127;
