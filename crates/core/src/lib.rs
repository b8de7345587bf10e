//! agent-stream's core: what a run is and how every client sees it, with no I/O.
//!
//! - [`domain`]: the event model (envelope and typed payloads, the lifecycle table),
//!   parsing producer batches and JSONL exports, and the append-side state machine
//!   ([`domain::RunGuard`]) that every write goes through.
//! - [`projection`]: the one reducer ([`projection::RunView::apply`]) folding a run's
//!   events into its views, and the view updates subscriptions send.
//! - [`dialect`]: one stateless encoder per client protocol over that fold, stream
//!   positions ([`dialect::Cursor`]), exact resume ([`dialect::resume`]) and R1 shaping
//!   ([`dialect::shape`]).
//! - [`error`]: the stable error codes and [`error::Rejection`], what these layers answer
//!   when input is refused.
//!
//! Arrows: `domain` <- `projection` <- `dialect`. Nothing here reads a clock other than
//! the caller's, opens a socket or touches a database; the store, live and service
//! crates build on it. The GraphQL derives on the model are behind the `graphql`
//! feature; generated runs for tests and benches behind `testkit`.

#![warn(missing_docs)]

pub mod dialect;
pub mod domain;
pub mod error;
pub mod projection;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use error::{ErrorCode, Rejection};
