//! The event model: envelope, vocabulary, lifecycle table, input parsing and the
//! append-side guard. Pure code: no I/O, no clock.

pub mod event;
pub mod guard;
pub mod input;
pub mod jsonl;
pub mod lifecycle;
pub mod text;

pub use event::{Event, EventBody};
pub use guard::{Origin, Resolution, RunGuard};
pub use input::{Batch, Framing, Limits, NewEvent};
pub use lifecycle::RunState;

#[cfg(test)]
mod guard_tests;
