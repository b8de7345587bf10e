//! agent-stream: the durable, multi-tenant event log and live stream for AI-agent runs.
//!
//! # Map
//! - [`domain`] — the event model: envelope and typed payloads ([`domain::event`]), the
//!   lifecycle table ([`domain::lifecycle`]), parsing producer batches
//!   ([`domain::input`]) and the append-side state machine ([`domain::guard`]). Pure code.
//! - [`storage`] — Postgres: the pool that runs as a non-owner role under row-level
//!   security ([`storage::db`]), migrations from `sql/` ([`storage::migrate`]), tenants
//!   and keys, runs, the append path ([`storage::append`](mod@storage::append)) and the one read path
//!   ([`storage::events`]); plus the private cluster of the embedded default
//!   ([`storage::embedded`]).
//! - [`app`] — the operations every transport shares (authenticate, create run, append,
//!   read), with scope checks.
//! - [`http`] and [`graphql`] — transports: thin adapters over [`app`], each with one
//!   mapping from [`error::Error`] to its wire format.
//! - [`server`] — wiring: configuration, start-up (migrate, dev tenant), graceful stop.
//! - [`cli`] — the `agent-stream` command line, which the binary calls.
//! - [`alloc`] — the allocator the binary installs (mimalloc) and its settings.
//! - [`load`] — the load tool, `agent-stream bench <scenario>` (BENCHMARKS.md), and
//!   what the criterion benches share with it.
//!
//! # Data flow of an append
//! HTTP body or GraphQL input → [`domain::input`] parses and checks each event →
//! [`app::App::append`] checks the key's scope → [`storage::append`](fn@storage::append) locks the run row,
//! answers idempotent retries, checks `expected_last_seq`, runs the batch through the
//! run's [`domain::RunGuard`], inserts the rows and commits. Nothing is stored unless
//! every event passed.

pub mod alloc;
pub mod app;
pub mod auth;
pub mod cli;
pub mod dialect;
pub mod domain;
pub mod error;
pub mod export;
pub mod graphql;
pub mod http;
pub mod live;
pub mod load;
pub mod metrics;
pub mod projection;
pub mod ratelimit;
pub mod server;
pub mod storage;
#[doc(hidden)]
pub mod testkit;

pub use error::{Error, ErrorCode, Result};

pub use alloc::Allocator;
