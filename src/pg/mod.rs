//! The PostgreSQL layer of the library: connection settings resolved the way libpq and psql
//! resolve them ([`conninfo`]), TLS for those connections ([`tls`]), the advisory lock's key and
//! the SQL that takes and releases it ([`lock`]), and the query that names the lock's holder
//! ([`holder`]). The elector builds on these; nothing here knows about COMMAND or the binary.

pub mod conninfo;
pub mod holder;
pub mod lock;
pub mod tls;
