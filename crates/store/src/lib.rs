//! agent-stream's PostgreSQL layer: connections (TLS as libpq reads `sslmode`),
//! migrations from `sql/`, tenants and API keys ([`auth`]), runs, the one row writer
//! ([`append`](mod@append): single appends, group commit and import all write through
//! it) and the one read path ([`events`]), retention, and the private cluster of the
//! embedded default ([`embedded`]). Every tenant-facing query runs as the non-owner
//! service role inside a transaction scoped to one tenant, so row-level security is the
//! last line of defence.
//!
//! Builds on `agent-stream-core` (the event model and the guard every write goes
//! through); knows nothing of live delivery or transports.

#![warn(missing_docs)]

pub mod append;
pub mod auth;
pub mod db;
pub mod embedded;
pub mod error;
pub mod events;
pub mod group;
pub mod import;
pub mod metrics;
pub mod migrate;
pub mod retention;
pub mod rows;
pub mod run_key;
pub mod runs;
pub mod tenants;
pub mod tls;

pub use append::{append, AppendOutcome, Guards};
pub use db::{Db, DbConfig};
pub use runs::RunInfo;

pub use error::{Error, ErrorCode, Rejection, Result};

/// The target of the spans only traces want (an append, its commit, its notification,
/// a delivery): the log leaves them out, and with no OpenTelemetry exporter they are not
/// built at all. The log's lines keep the request span's context (method, path, request
/// id, whose path names the run); formatting these spans' fields for a log that seldom
/// prints them was 15% of a single append's instructions at the default level
/// (docs/benchmarks-log.md, 2026-12-05 18:00).
pub const TRACES: &str = "agent_stream::traces";
