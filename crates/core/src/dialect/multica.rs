//! `multica` (seed 000): every item is a `StreamPayload { streamId, agentId, event }`.
//!
//! - `streamId` is the message id (a child's prefixed with the child id); tool events
//!   use the message they were called from (else the run); compaction uses
//!   `compaction:{agentId}`.
//! - `agentId` is the child id for a child's events, else the run id.
//! - `message_start` / `message_end` keep the message's role (`user`, `assistant`,
//!   `system`); `message_update` carries the message's full accumulated content (text,
//!   thinking and toolCall blocks), not a delta, so any update can replace the bubble.
//! - Tool call ids are scoped like message ids (`<child>/<call>` for a child's calls):
//!   seed 000's store keys tool executions by `toolCallId` alone. `tool_execution_end`
//!   carries the output, or for a failed call the error as the producer sent it.
//! - A message that ends because its run ended is closed with `stopReason:
//!   "interrupted"`; a tool call that never ended gets `tool_execution_end` with
//!   `isError: true` and the result `"interrupted"`.
//! - Events seed 000 has no event for (lifecycle, steps, plans, children, tool
//!   progress, custom) are not sent.
//!
//! Lanes: one per message (`streamId`); merging keeps the later snapshot.
//!
//! Resume (exact): the stream continues with the first item the client has not seen.
//! Since every update is a whole snapshot, the next update of a message also repairs a
//! client that lost its copy.

use serde_json::{json, Value};

use super::{lane, scoped_id, Class, Encoder, Out, Step};
use crate::domain::event::Role;
use crate::domain::EventBody;
use crate::projection::view::{BlockKind, MessageView, ToolView};
use crate::projection::{Change, RunView};

/// The multica encoder.
pub struct Multica;

fn role(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
    }
}

fn agent_id(step: &Step<'_>, child: Option<&str>) -> String {
    child.map_or_else(|| step.run.run_id.clone(), str::to_owned)
}

/// The message's content blocks in seed 000's shapes.
fn content(view: &RunView, m: &MessageView) -> Vec<Value> {
    m.blocks
        .iter()
        .map(|b| match b.kind {
            BlockKind::Text => json!({"type": "text", "text": b.text.clone().unwrap_or_default()}),
            BlockKind::Thinking => json!({"type": "thinking", "thinking": b.text.clone().unwrap_or_default()}),
            BlockKind::ToolCall => {
                let id = b.call_id.clone().unwrap_or_default();
                let tool = view.tool(m.child_id.as_deref(), &id);
                json!({
                    "type": "toolCall",
                    "id": scoped_id(m.child_id.as_deref(), &id),
                    "name": tool.map(|t| t.tool.clone()).unwrap_or_default(),
                    "arguments": tool.map(|t| &*t.input).filter(|v| v.is_object()).cloned().unwrap_or_else(|| json!({})),
                })
            }
        })
        .collect()
}

fn payload(step: &Step<'_>, stream_id: String, child: Option<&str>, event: Value) -> Value {
    json!({"streamId": stream_id, "agentId": agent_id(step, child), "event": event})
}

fn message_event(step: &Step<'_>, m: &MessageView, kind: &str, stop: Option<&str>) -> Value {
    let mut message = json!({"role": role(m.role), "content": content(step.view, m)});
    if kind == "message_start" {
        message["content"] = json!([]);
    }
    if let Some(s) = stop {
        message["stopReason"] = s.into();
    }
    payload(
        step,
        scoped_id(m.child_id.as_deref(), &m.id),
        m.child_id.as_deref(),
        json!({"type": kind, "message": message}),
    )
}

fn tool_stream(step: &Step<'_>, t: &ToolView) -> String {
    t.message_id.as_deref().map_or_else(|| step.run.run_id.clone(), |m| scoped_id(t.child_id.as_deref(), m))
}

fn tool_end(step: &Step<'_>, t: &ToolView, result: Value, is_error: bool) -> Value {
    payload(
        step,
        tool_stream(step, t),
        t.child_id.as_deref(),
        json!({"type": "tool_execution_end", "toolCallId": scoped_id(t.child_id.as_deref(), &t.call_id), "result": result, "isError": is_error}),
    )
}

impl Encoder for Multica {
    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        let seq = e.seq;
        match (&e.body, step.change) {
            (EventBody::MessageStart(_), Change::Message(i)) => {
                out.push(Out::control(seq, message_event(step, &v.messages[i], "message_start", None)));
            }
            (EventBody::TextDelta(_) | EventBody::ReasoningDelta(_), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.started_seq == seq {
                    // Opened by this delta (no message.start): the client still needs a start.
                    out.push(Out::control(seq, message_event(step, m, "message_start", None)));
                }
                let class =
                    if matches!(e.body, EventBody::TextDelta(_)) { Class::Text } else { Class::Reasoning };
                let key = scoped_id(m.child_id.as_deref(), &m.id);
                out.push(Out::delta(
                    seq,
                    class,
                    lane(("multica", &key)),
                    message_event(step, m, "message_update", None),
                ));
            }
            (EventBody::MessageEnd(_), Change::Message(i)) => {
                let m = &v.messages[i];
                out.push(Out::control(seq, message_event(step, m, "message_end", m.stop_reason.as_deref())));
            }
            (EventBody::ToolStart(_), Change::Tool { tool, .. }) => {
                let t = &v.tools[tool];
                out.push(Out::control(
                    seq,
                    payload(
                        step,
                        tool_stream(step, t),
                        t.child_id.as_deref(),
                        json!({"type": "tool_execution_start", "toolCallId": scoped_id(t.child_id.as_deref(), &t.call_id), "toolName": t.tool, "args": t.input}),
                    ),
                ));
            }
            (EventBody::ToolEnd(p), Change::Tool { tool, .. }) => {
                let t = &v.tools[tool];
                let result = if p.ok {
                    (*t.output).clone()
                } else if t.error.is_null() {
                    json!("the tool failed")
                } else {
                    (*t.error).clone()
                };
                out.push(Out::control(seq, tool_end(step, t, result, !p.ok)));
            }
            (EventBody::CompactionStart(_), _) => {
                let agent = agent_id(step, e.child_id.as_deref());
                out.push(Out::control(
                    seq,
                    payload(
                        step,
                        format!("compaction:{agent}"),
                        e.child_id.as_deref(),
                        json!({"type": "compaction_start"}),
                    ),
                ));
            }
            (EventBody::CompactionEnd(p), _) => {
                let agent = agent_id(step, e.child_id.as_deref());
                let mut ev = json!({"type": "compaction_end", "removed": p.removed, "kept": p.kept, "reason": p.reason});
                if let Some(t) = p.tokens_removed {
                    ev["tokensRemoved"] = t.into();
                }
                if let Some(t) = p.tokens_kept {
                    ev["tokensKept"] = t.into();
                }
                out.push(Out::control(
                    seq,
                    payload(step, format!("compaction:{agent}"), e.child_id.as_deref(), ev),
                ));
            }
            (EventBody::Lifecycle(_), Change::Lifecycle { .. }) => {
                let (messages, tools) = v.interrupted();
                for i in messages {
                    out.push(Out::control(
                        seq,
                        message_event(step, &v.messages[*i], "message_end", Some("interrupted")),
                    ));
                }
                for i in tools {
                    out.push(Out::control(seq, tool_end(step, &v.tools[*i], json!("interrupted"), true)));
                }
            }
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        // Updates are snapshots: the later one replaces the earlier.
        pending.data = next.data.clone();
        true
    }

    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        data["droppedCount"] = dropped.into();
    }
}
