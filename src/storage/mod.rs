//! Postgres: connections, migrations, tenants and keys, runs, the append path and the
//! read path. Every tenant-facing query runs as the non-owner service role inside a
//! transaction scoped to one tenant, so row-level security is the last line of defence.

pub mod append;
pub mod db;
pub mod embedded;
pub mod events;
pub mod group;
pub mod import;
pub mod migrate;
pub mod retention;
pub mod runs;
pub mod tenants;
pub mod views;

pub use append::{append, AppendOutcome, Guards};
pub use db::{Db, DbConfig};
pub use runs::RunInfo;
