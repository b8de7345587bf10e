//! `hier` (seed 002): flat messages placed in the chunk / message / block / thread
//! hierarchy, which maps onto the log as chunk = seq (`C<seq>`), message = message id,
//! block = step (`B<n>`, the n-th step of the scope, counted from 1; a step ends at
//! each `step.boundary`), thread = child run (absent for the run itself).
//!
//! - `text.delta` → `{type: "text", props: {content}, delta: true}`;
//!   `reasoning.delta` → `{type: "thinking", …}`; both with the message id.
//! - `tool.start` → `tool_call` (`props: {id, name, arguments}`), `tool.progress` →
//!   `loading` (`props: {id, data}`), `tool.end` → `tool_result`
//!   (`props: {id, ok, output, error}`); their `message_id` is the call id.
//! - Every other event keeps its own type, with its payload as `props`.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{concat_at, same_at, Class, Encoder, Out, Step};
use crate::domain::EventBody;

/// The hier encoder: counts steps per scope to name blocks.
#[derive(Default)]
pub struct Hier {
    steps: HashMap<String, u32>,
}

impl Encoder for Hier {
    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>) {
        let e = step.event;
        let scope = e.child_id.clone().unwrap_or_default();
        let block = self.steps.get(&scope).copied().unwrap_or(0) + 1;
        let message_of = |id: &str| Value::String(id.to_owned());
        let (kind, props, message_id, class, delta): (String, Value, Option<Value>, Class, bool) =
            match &e.body {
                EventBody::TextDelta(d) | EventBody::ReasoningDelta(d) => {
                    let mid = match step.change {
                        crate::projection::Change::Message(i) => Some(message_of(&step.view.messages[i].id)),
                        _ => d.message_id.as_deref().map(message_of),
                    };
                    let (kind, class) = match e.body {
                        EventBody::TextDelta(_) => ("text", Class::Text),
                        _ => ("thinking", Class::Reasoning),
                    };
                    (kind.into(), json!({"content": d.text}), mid, class, true)
                }
                EventBody::ToolStart(p) => (
                    "tool_call".into(),
                    json!({"id": p.call_id, "name": p.tool, "arguments": p.input}),
                    Some(message_of(&p.call_id)),
                    Class::Control,
                    false,
                ),
                EventBody::ToolProgress(p) => (
                    "loading".into(),
                    json!({"id": p.call_id, "data": p.data}),
                    Some(message_of(&p.call_id)),
                    Class::Control,
                    false,
                ),
                EventBody::ToolEnd(p) => (
                    "tool_result".into(),
                    json!({"id": p.call_id, "ok": p.ok, "output": p.output, "error": p.error}),
                    Some(message_of(&p.call_id)),
                    Class::Control,
                    false,
                ),
                EventBody::MessageStart(p) => (
                    e.body.type_name().into_owned(),
                    e.body.payload(),
                    Some(message_of(&p.message_id)),
                    Class::Control,
                    false,
                ),
                EventBody::MessageEnd(_) => {
                    let mid = match step.change {
                        crate::projection::Change::Message(i) => Some(message_of(&step.view.messages[i].id)),
                        _ => None,
                    };
                    (e.body.type_name().into_owned(), e.body.payload(), mid, Class::Control, false)
                }
                _ => (e.body.type_name().into_owned(), e.body.payload(), None, Class::Control, false),
            };
        let mut m = json!({"type": kind, "props": props, "chunk_id": format!("C{}", e.seq), "block_id": format!("B{block}")});
        if let Some(mid) = message_id {
            m["message_id"] = mid;
        }
        if let Some(c) = &e.child_id {
            m["thread_id"] = c.clone().into();
        }
        if delta {
            m["delta"] = true.into();
        }
        out.push(Out::of(e.seq, class, m));
        if matches!(e.body, EventBody::StepBoundary(_)) {
            self.steps.insert(scope, block);
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let (Some(a), Some(b)) = (pending.json(), next.json()) else { return false };
        if a.get("delta").is_none()
            || !same_at(a, b, &[&["type"], &["message_id"], &["block_id"], &["thread_id"], &["delta"]])
        {
            return false;
        }
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
