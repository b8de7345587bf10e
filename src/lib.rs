//! agent-stream: the durable, multi-tenant event log and live stream for AI-agent runs.
//! This crate is the service, the top layer of the workspace:
//!
//! ```text
//! agent-stream-core   event model, append guard, reducer, dialect encoders (no I/O)
//!        ^
//! agent-stream-store  PostgreSQL: migrations, the one row writer, the one read path, keys
//!        ^
//! agent-stream-live   hub, per-run feeds and folds, tails, LISTEN/NOTIFY, shedding
//!        ^
//! agent-stream        operations (app), transports (http, graphql), server, command line
//! ```
//!
//! # Map
//! - [`app`] — the operations every transport shares (authenticate, create run, append,
//!   read, control), with scope checks and rate limits.
//! - [`http`] and [`graphql`] — transports: thin adapters over [`app`], each with one
//!   mapping from [`error::Error`] to its wire format.
//! - [`server`] — wiring: configuration, start-up (migrate, dev tenant, the embedded
//!   cluster's supervisor), graceful stop.
//! - [`cli`] — the `agent-stream` command line, which the binary calls.
//! - [`export`] — JSONL export through a bounded channel.
//! - [`metrics`] — `/metrics` in Prometheus' text format.
//! - [`alloc`] — the allocator the binary installs (mimalloc) and its settings.
//!
//! The lower layers are re-exported under their old names ([`domain`], [`projection`],
//! [`dialect`], [`storage`], [`auth`], [`live`]) so that paths read the same everywhere.
//! The load tool and the criterion benches are the `agent-stream-load` crate; the
//! generated runs of the test kit are `agent_stream_core::testkit` (feature `testkit`).
//!
//! # Data flow of an append
//! HTTP body or GraphQL input → [`domain::input`] parses and checks each event →
//! [`app::App::append`] checks the key's scope → [`storage::append`](fn@storage::append)
//! locks the run row and reads its head from the log, answers idempotent retries, checks
//! `expected_last_seq`, runs the batch through the run's [`domain::RunGuard`], inserts the
//! rows and commits (the events' primary key refuses a seq another process took
//! meanwhile, and the append is built again). Nothing is stored unless every event passed.

#![warn(missing_docs)]

pub use agent_stream_core::{dialect, domain, projection};
pub use agent_stream_live as live;
pub use agent_stream_store as storage;
pub use agent_stream_store::auth;

/// The error every operation returns, and its codes (from the store layer).
pub mod error {
    pub use agent_stream_store::error::*;
}

pub mod alloc;
pub mod app;
pub mod cli;
pub mod export;
pub mod graphql;
pub mod http;
#[cfg(test)]
mod log_capture;
pub mod metrics;
pub mod ratelimit;
pub mod server;
pub mod telemetry;

pub use error::{Error, ErrorCode, Result};

pub use alloc::Allocator;
