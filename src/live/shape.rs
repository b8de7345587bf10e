//! Throughput shaping (seed 004 §4, R1–R3): consecutive deltas of one message merge
//! into one frame per window, so a client gets at most about 10 delta frames a second
//! per run; every other event flushes what is pending and goes out at once, never
//! merged or delayed. Pure: the caller owns the clock.

use std::time::Duration;

use crate::domain::event::Delta;
use crate::domain::{Event, EventBody};

/// How long deltas gather before they go out as one frame (10 frames/s).
pub const WINDOW: Duration = Duration::from_millis(100);

/// What goes on the wire: one event, or consecutive deltas merged into one whose `seq`
/// (and SSE id) is the last seq it covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The event; for merged deltas, the last one with the concatenated text.
    pub event: Event,
    /// The first seq the frame covers (`event.seq` when nothing was merged).
    pub first_seq: i64,
}

impl Frame {
    fn single(event: Event) -> Frame {
        Frame { first_seq: event.seq, event }
    }

    /// The envelope as JSON; merged frames also carry `first_seq`, so a client can
    /// tell a merge from a gap.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.event).unwrap_or_default();
        if self.first_seq != self.event.seq {
            v["first_seq"] = self.first_seq.into();
        }
        v
    }
}

/// Merges deltas between flushes.
#[derive(Default)]
pub struct Aggregator {
    pending: Option<Frame>,
}

fn delta(e: &Event) -> Option<&Delta> {
    match &e.body {
        EventBody::TextDelta(d) | EventBody::ReasoningDelta(d) => Some(d),
        _ => None,
    }
}

/// Deltas merge when they would land in the same block: same kind, child and message.
fn mergeable(a: &Event, b: &Event) -> bool {
    match (delta(a), delta(b)) {
        (Some(x), Some(y)) => {
            std::mem::discriminant(&a.body) == std::mem::discriminant(&b.body)
                && a.child_id == b.child_id
                && x.message_id == y.message_id
        }
        _ => false,
    }
}

impl Aggregator {
    /// True while merged deltas wait for their window to close.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes one event; returns the frames to send now, in order.
    pub fn push(&mut self, e: Event) -> Vec<Frame> {
        if delta(&e).is_none() {
            // Control-plane (and custom) events: flush first to keep the order, then
            // send at once.
            let mut out: Vec<Frame> = self.flush().into_iter().collect();
            out.push(Frame::single(e));
            return out;
        }
        match &mut self.pending {
            Some(p) if mergeable(&p.event, &e) => {
                let text = delta(&e).map(|d| d.text.clone()).unwrap_or_default();
                match &mut p.event.body {
                    EventBody::TextDelta(d) | EventBody::ReasoningDelta(d) => d.text.push_str(&text),
                    _ => {}
                }
                p.event.id = e.id;
                p.event.ts = e.ts;
                p.event.seq = e.seq;
                vec![]
            }
            _ => {
                let out = self.flush().into_iter().collect();
                self.pending = Some(Frame::single(e));
                out
            }
        }
    }

    /// The pending merged deltas, if any.
    pub fn flush(&mut self) -> Option<Frame> {
        self.pending.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::stored;
    use serde_json::json;

    #[test]
    fn deltas_merge_control_events_flush_and_pass() {
        let events = stored(&[
            json!({"type": "text.delta", "payload": {"text": "a"}}),
            json!({"type": "text.delta", "payload": {"text": "b"}}),
            json!({"type": "reasoning.delta", "payload": {"text": "r"}}),
            json!({"type": "text.delta", "payload": {"text": "c"}}),
            json!({"type": "tool.start", "payload": {"call_id": "x", "tool": "t"}}),
            json!({"type": "text.delta", "payload": {"text": "d"}}),
            json!({"type": "text.delta", "payload": {"text": "e"}}),
        ]);
        let mut agg = Aggregator::default();
        let mut frames = vec![];
        for e in events {
            frames.extend(agg.push(e));
        }
        frames.extend(agg.flush());
        let shape: Vec<(i64, i64, String)> = frames
            .iter()
            .map(|f| {
                (f.first_seq, f.event.seq, f.event.body.payload()["text"].as_str().unwrap_or("-").to_owned())
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (1, 2, "ab".into()),
                (3, 3, "r".into()),
                (4, 4, "c".into()),
                (5, 5, "-".into()),
                (6, 7, "de".into())
            ]
        );
        assert_eq!(frames[0].to_json()["first_seq"], 1);
        assert!(frames[1].to_json().get("first_seq").is_none());
    }

    #[test]
    fn deltas_of_different_messages_or_children_do_not_merge() {
        let events = stored(&[
            json!({"type": "child.spawn", "payload": {"child_id": "k"}}),
            json!({"type": "text.delta", "payload": {"text": "a", "message_id": "m1"}}),
            json!({"type": "text.delta", "payload": {"text": "b", "message_id": "m2"}}),
            json!({"type": "text.delta", "child_id": "k", "payload": {"text": "c", "message_id": "m2"}}),
        ]);
        let mut agg = Aggregator::default();
        let mut n = 0;
        for e in events {
            n += agg.push(e).len();
        }
        n += agg.flush().into_iter().count();
        assert_eq!(n, 4);
    }
}
