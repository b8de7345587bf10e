//! `native`: agent-stream's own envelope (seed 004), one item per event, named by its
//! type. Merged deltas keep the last event's id, ts and seq and say where they started
//! in `first_seq`, so a client can tell a merge from a gap.
//!
//! Lanes: a delta's kind, child and the message it resolved to (the server-derived
//! message id stored with it), so deltas of interleaved messages, reasoning streams and
//! children merge each into their own frame.
//!
//! Resume (exact): one item per event, so an id is the seq of the event, or a merged
//! frame's cursor; a resumed stream starts with the first event the client has not got.

use super::{concat_at, lane, Class, Encoder, Out, Step};
use crate::domain::EventBody;

/// The native encoder.
pub struct Native;

impl Encoder for Native {
    fn needs_view(&self) -> bool {
        false
    }

    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let e = step.event;
        let (class, lane) = match &e.body {
            EventBody::TextDelta(_) => (Class::Text, Some(lane(("text", &e.child_id, &e.message_id)))),
            EventBody::ReasoningDelta(_) => {
                (Class::Reasoning, Some(lane(("reasoning", &e.child_id, &e.message_id))))
            }
            _ => (Class::Control, None),
        };
        let data = match step.wire {
            // The envelope does not depend on the subscriber: render it once per page.
            Some(w) => super::Data::Wire(w.get_or_init(|| super::Wire::new(e.to_json())).clone()),
            None => super::Data::Json(serde_json::to_value(e).unwrap_or_default()),
        };
        let mut o = Out::control(e.seq, serde_json::Value::Null);
        o.data = data;
        o.class = class;
        o.lane = lane;
        o.event = Some(e.body.type_name());
        out.push(o);
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
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
