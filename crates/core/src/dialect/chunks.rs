//! `chunks` (seed 001): the three phases of a message.
//!
//! - `message.start {sessionId, messageId, role, timestamp}`: `sessionId` is the run
//!   id, `role` is `agent` for assistant messages (seed 001: "always 'agent' for
//!   streaming"), else the message's role (`user`, `system`); a message a delta opened
//!   (text or reasoning) gets its start right before that delta's chunk, if any.
//! - `message.chunk {messageId, content: {type: "text", text}}` per text delta.
//! - `message.end {messageId, content: {type: "text", text}, isComplete, timestamp}`
//!   with the complete text. A message cut off by the end of its run ends with
//!   `isComplete: false` (seed 001's "mark as failed").
//!
//! Seed 001 covers messages only: reasoning, tools and control events are not sent.
//! A child's message ids are prefixed with the child id.
//!
//! Lanes: one per message. Resume (exact): the stream continues with the first item the
//! client has not seen; `message.end` carries the complete text either way.

use serde_json::{json, Value};

use super::{concat_at, lane, scoped_id, Class, Encoder, Out, Step};
use crate::domain::event::Role;
use crate::domain::EventBody;
use crate::projection::view::MessageView;
use crate::projection::Change;

/// The chunks encoder.
pub struct Chunks;

fn start(step: &Step<'_>, m: &MessageView) -> Value {
    let role = match m.role {
        Role::Assistant => "agent",
        Role::User => "user",
        Role::System => "system",
    };
    json!({"type": "message.start", "payload": {
        "sessionId": step.run.run_id,
        "messageId": scoped_id(m.child_id.as_deref(), &m.id),
        "role": role,
        "timestamp": step.event.ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }})
}

fn end(step: &Step<'_>, m: &MessageView, complete: bool) -> Value {
    json!({"type": "message.end", "payload": {
        "messageId": scoped_id(m.child_id.as_deref(), &m.id),
        "content": {"type": "text", "text": m.text},
        "isComplete": complete,
        "timestamp": step.event.ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }})
}

impl Encoder for Chunks {
    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        match (&e.body, step.change) {
            (EventBody::MessageStart(_), Change::Message(i)) => {
                out.push(Out::control(e.seq, start(step, &v.messages[i])))
            }
            (EventBody::TextDelta(_) | EventBody::ReasoningDelta(_), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.started_seq == e.seq {
                    out.push(Out::control(e.seq, start(step, m)));
                }
                if let EventBody::TextDelta(d) = &e.body {
                    let id = scoped_id(m.child_id.as_deref(), &m.id);
                    let item = json!({"type": "message.chunk", "payload": {
                        "messageId": id,
                        "content": {"type": "text", "text": d.text},
                    }});
                    out.push(Out::delta(e.seq, Class::Text, lane(("chunks", &id)), item));
                }
            }
            (EventBody::MessageEnd(_), Change::Message(i)) => {
                out.push(Out::control(e.seq, end(step, &v.messages[i], true)))
            }
            (EventBody::Lifecycle(_), Change::Lifecycle { .. }) => {
                for i in v.interrupted().0 {
                    out.push(Out::control(e.seq, end(step, &v.messages[*i], false)));
                }
            }
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
        let super::Data::Json(a) = &mut pending.data else { return false };
        concat_at(a, b, &["payload", "content", "text"])
    }
}
