//! Projections: the one reducer ([`RunView::apply`]) and the view shapes every surface
//! serves. GraphQL queries, subscriptions, SSE, JSONL and the analysts' SQL views all
//! agree with this fold.

mod reduce;
pub mod view;

pub use reduce::RunView;

#[cfg(test)]
mod reduce_tests;
