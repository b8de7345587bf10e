//! `native`: agent-stream's own envelope (seed 004), one item per event, named by its
//! type. Merged deltas keep the last event's id, ts and seq and say where they started
//! in `first_seq`, so a client can tell a merge from a gap.

use super::{concat_at, same_at, Class, Encoder, Out, Step};
use crate::domain::EventBody;

/// The native encoder.
pub struct Native;

impl Encoder for Native {
    fn needs_view(&self) -> bool {
        false
    }

    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>) {
        let e = step.event;
        let class = match e.body {
            EventBody::TextDelta(_) => Class::Text,
            EventBody::ReasoningDelta(_) => Class::Reasoning,
            _ => Class::Control,
        };
        let data = match step.wire {
            // The envelope does not depend on the subscriber: render it once per page.
            Some(w) => super::Data::Wire(
                w.get_or_init(|| super::Wire::new(serde_json::to_vec(e).unwrap_or_default())).clone(),
            ),
            None => super::Data::Json(serde_json::to_value(e).unwrap_or_default()),
        };
        let event = Some(e.body.type_name());
        out.push(Out { seq: e.seq, first_seq: e.seq, event, data, class, terminal: false });
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let (Some(a), Some(b)) = (pending.json(), next.json()) else { return false };
        // Deltas merge when they land in the same block: same kind, child and message.
        if !same_at(a, b, &[&["type"], &["child_id"], &["payload", "message_id"]]) {
            return false;
        }
        let first = pending.first_seq;
        let super::Data::Json(a) = &mut pending.data else { return false };
        if !concat_at(a, b, &["payload", "text"]) {
            return false;
        }
        for k in ["id", "ts", "seq"] {
            a[k] = b[k].clone();
        }
        a["first_seq"] = first.into();
        true
    }

    fn annotate_dropped(&self, data: &mut serde_json::Value, dropped: u64) {
        data["payload"]["dropped_count"] = dropped.into();
    }
}
