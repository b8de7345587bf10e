//! Projections: the one reducer ([`RunView::apply`]) and the view shapes every surface
//! serves. GraphQL queries, subscriptions, SSE, JSONL and the analysts' SQL views all
//! agree with this fold; [`updates`](fn@updates) turns what each event changed into view updates.

mod reduce;
pub mod updates;
pub mod view;

pub use reduce::{Change, RunView};
pub use updates::{updates, UpdateKind, ViewUpdate};

#[cfg(test)]
mod reduce_tests;
#[cfg(test)]
mod updates_tests;
