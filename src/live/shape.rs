//! Throughput shaping (seed 004 §4, R1–R3): consecutive deltas of one message merge
//! into one frame per window, so a client gets at most about 10 delta frames a second
//! per run; every other event flushes what is pending and goes out at once, never
//! merged or delayed. Works on encoded items, so every dialect is shaped alike; the
//! dialect says which of its items merge. Pure: the caller owns the clock.

use std::time::Duration;

use crate::dialect::{Class, Encoding, Out};

/// How long deltas gather before they go out as one frame (10 frames/s).
pub const WINDOW: Duration = Duration::from_millis(100);

/// Merges consecutive delta items between flushes; the dialect decides what merges.
#[derive(Default)]
pub struct Aggregator {
    pending: Option<Out>,
}

impl Aggregator {
    /// True while merged deltas wait for their window to close.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes one item; returns the items to send now, in order.
    pub fn push(&mut self, enc: &Encoding, o: Out) -> Vec<Out> {
        if o.class == Class::Control {
            // Control-plane items: flush first to keep the order, then send at once.
            let mut out: Vec<Out> = self.flush().into_iter().collect();
            out.push(o);
            return out;
        }
        if let Some(p) = &mut self.pending {
            if enc.merge(p, &o) {
                return vec![];
            }
        }
        let out = self.flush().into_iter().collect();
        self.pending = Some(o);
        out
    }

    /// The pending merged deltas, if any.
    pub fn flush(&mut self) -> Option<Out> {
        self.pending.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Format, RunCtx};
    use crate::projection::RunView;
    use crate::testkit::stored;
    use serde_json::json;

    fn frames(events: Vec<crate::domain::Event>) -> Vec<Out> {
        let mut enc = Encoding::new(Format::Native, RunCtx::default(), RunView::new());
        let mut agg = Aggregator::default();
        let mut frames = vec![];
        for e in events {
            for o in enc.push(&e) {
                frames.extend(agg.push(&enc, o));
            }
        }
        frames.extend(agg.flush());
        frames
    }

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
        let frames = frames(events);
        let shape: Vec<(i64, i64, String)> = frames
            .iter()
            .map(|f| {
                let text = f.json().and_then(|v| v["payload"]["text"].as_str()).unwrap_or("-").to_owned();
                (f.first_seq, f.seq, text)
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
        assert_eq!(frames[0].json().map(|v| v["first_seq"].clone()), Some(json!(1)));
        assert_eq!(frames[0].json().map(|v| v["seq"].clone()), Some(json!(2)));
        assert!(frames[1].json().is_some_and(|v| v.get("first_seq").is_none()));
    }

    #[test]
    fn deltas_of_different_messages_or_children_do_not_merge() {
        let events = stored(&[
            json!({"type": "child.spawn", "payload": {"child_id": "k"}}),
            json!({"type": "text.delta", "payload": {"text": "a", "message_id": "m1"}}),
            json!({"type": "text.delta", "payload": {"text": "b", "message_id": "m2"}}),
            json!({"type": "text.delta", "child_id": "k", "payload": {"text": "c", "message_id": "m2"}}),
        ]);
        assert_eq!(frames(events).len(), 4);
    }
}
