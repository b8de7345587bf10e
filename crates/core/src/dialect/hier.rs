//! `hier` (seed 002): flat messages placed in the chunk / message / block / thread
//! hierarchy, which maps onto the log as chunk = seq (`C<seq>`), message = message id,
//! block = step, thread = child run (absent for the run itself).
//!
//! - Blocks: the n-th step of a scope (counted from 1; a step ends at each
//!   `step.boundary`, which belongs to the block it ends) is `B<n>` in the run itself and
//!   `<child>/B<n>` in a child, so block ids are unique across the run and its children
//!   (seed 002: "unique within entire Agent stream") and follow from the log alone.
//! - Messages: a child's message and call ids are prefixed with the child id, like its
//!   blocks. A message's thinking is a message of its own, `<message>:thinking`, so a
//!   client that merges chunks by `message_id` never mixes reasoning into visible text.
//! - `text.delta` → `{type: "text", props: {content}, delta: true}`;
//!   `reasoning.delta` → `{type: "thinking", …}`.
//! - `tool.start` → `tool_call` (`props: {id, name, arguments}`), `tool.progress` →
//!   `loading` (`props: {id, data}`), `tool.end` → `tool_result`
//!   (`props: {id, ok, output, error}`); their `message_id` is the call id.
//! - Every other event keeps its own type, with its payload as `props`.
//!
//! Lanes: a delta's type, message, block and thread. A merged chunk is named by the last
//! chunk it covers. Resume (exact): the stream continues with the first item the client
//! has not seen, and block ids are computed from the log, so they do not restart.

use serde_json::{json, Value};

use super::{concat_at, lane, scoped_id, Class, Encoder, Out, Step};
use crate::domain::EventBody;
use crate::projection::Change;

/// The hier encoder.
pub struct Hier;

impl Encoder for Hier {
    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let e = step.event;
        let child = e.child_id.as_deref();
        // The view already counts this event if it is a boundary: it ends that block.
        let steps = step.view.steps_in(child);
        let n = if matches!(e.body, EventBody::StepBoundary(_)) { steps } else { steps + 1 };
        let block = scoped_id(child, &format!("B{n}"));
        let message_of = |id: &str| Value::String(scoped_id(child, id));
        let resolved = || match step.change {
            Change::Message(i) => Some(step.view.messages[i].id.clone()),
            _ => e.message_id.clone(),
        };
        let (kind, props, message_id, class): (String, Value, Option<Value>, Class) = match &e.body {
            EventBody::TextDelta(d) => {
                ("text".into(), json!({"content": d.text}), resolved().map(|m| message_of(&m)), Class::Text)
            }
            EventBody::ReasoningDelta(d) => (
                "thinking".into(),
                json!({"content": d.text}),
                resolved().map(|m| message_of(&format!("{m}:thinking"))),
                Class::Reasoning,
            ),
            EventBody::ToolStart(p) => (
                "tool_call".into(),
                json!({"id": p.call_id, "name": p.tool, "arguments": p.input}),
                Some(message_of(&p.call_id)),
                Class::Control,
            ),
            EventBody::ToolProgress(p) => (
                "loading".into(),
                json!({"id": p.call_id, "data": p.data}),
                Some(message_of(&p.call_id)),
                Class::Control,
            ),
            EventBody::ToolEnd(p) => (
                "tool_result".into(),
                json!({"id": p.call_id, "ok": p.ok, "output": p.output, "error": p.error}),
                Some(message_of(&p.call_id)),
                Class::Control,
            ),
            EventBody::MessageStart(_) | EventBody::MessageEnd(_) => (
                e.body.type_name().into_owned(),
                e.body.payload(),
                resolved().map(|m| message_of(&m)),
                Class::Control,
            ),
            _ => (e.body.type_name().into_owned(), e.body.payload(), None, Class::Control),
        };
        let delta = class != Class::Control;
        let mut m =
            json!({"type": kind, "props": props, "chunk_id": format!("C{}", e.seq), "block_id": block});
        if let Some(mid) = &message_id {
            m["message_id"] = mid.clone();
        }
        if let Some(c) = child {
            m["thread_id"] = c.into();
        }
        if delta {
            m["delta"] = true.into();
            out.push(Out::delta(e.seq, class, lane(("hier", &kind, &message_id, &block, child)), m));
        } else {
            out.push(Out::control(e.seq, m));
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
        let chunk = b["chunk_id"].clone();
        let super::Data::Json(a) = &mut pending.data else { return false };
        if !concat_at(a, b, &["props", "content"]) {
            return false;
        }
        // The merged chunk is named by the last chunk it covers (its seq).
        a["chunk_id"] = chunk;
        true
    }
}
