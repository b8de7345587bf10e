//! `typed` (seed 003): one `AgentEvent` union.
//!
//! - `reasoning.delta` → `{type: "thought", content}`; `text.delta` →
//!   `{type: "stream", content}` — of assistant messages only: seed 003 has no roles,
//!   and `stream` is "a chunk of the agent's final response", so user and system
//!   messages are never sent as part of it;
//! - `tool.start` → `{type: "tool_call", toolName, toolArgs}` (arguments as JSON text,
//!   `{}` for a call without arguments); `tool.progress` → `{type: "tool_progress",
//!   toolName, data}`; `tool.end` → `{type: "tool_result", toolName, output, isError?}`
//!   (output as text; a failed call's output is its error);
//! - the run's end: `done` → `{type: "final"}`; `aborted` or `error` →
//!   `{type: "error", error}` with the reason.
//! - A child run is a sub-agent behind a tool (seed 003 §7): its assistant text deltas
//!   are `tool_progress` of the tool named after the child, and its end is a
//!   `tool_result` whose output is all the text it streamed.
//!
//! Other events have no counterpart in seed 003 and are not sent.
//!
//! Lanes: `thought`, `stream`, and each child's progress. Resume (exact): the stream
//! continues with the first item the client has not seen.

use serde_json::json;

use super::{args_text, as_text, concat_at, lane, Class, Encoder, Out, Step};
use crate::domain::event::Role;
use crate::domain::{EventBody, RunState};
use crate::projection::Change;

/// The typed encoder.
pub struct Typed;

impl Encoder for Typed {
    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        let seq = e.seq;
        // Deltas of messages that are not the agent's own are nobody's output here.
        let from_assistant = || match step.change {
            Change::Message(i) => v.messages[i].role == Role::Assistant,
            _ => false,
        };
        if let Some(child) = &e.child_id {
            match &e.body {
                EventBody::TextDelta(d) if from_assistant() => out.push(Out::delta(
                    seq,
                    Class::Text,
                    lane(("typed", "tool_progress", child)),
                    json!({"type": "tool_progress", "toolName": child, "data": d.text}),
                )),
                EventBody::Lifecycle(l) if l.state.is_terminal() => {
                    let text: String = v
                        .messages
                        .iter()
                        .filter(|m| m.child_id.as_ref() == Some(child) && m.role == Role::Assistant)
                        .map(|m| m.text.as_str())
                        .collect();
                    let mut r = json!({"type": "tool_result", "toolName": child, "output": text});
                    if l.state != RunState::Done {
                        r["isError"] = true.into();
                    }
                    out.push(Out::control(seq, r));
                }
                _ => {}
            }
            return;
        }
        let tool_name = |call_id: &str| v.tool(None, call_id).map(|t| t.tool.clone()).unwrap_or_default();
        match &e.body {
            EventBody::ReasoningDelta(d) if from_assistant() => out.push(Out::delta(
                seq,
                Class::Reasoning,
                lane(("typed", "thought")),
                json!({"type": "thought", "content": d.text}),
            )),
            EventBody::TextDelta(d) if from_assistant() => out.push(Out::delta(
                seq,
                Class::Text,
                lane(("typed", "stream")),
                json!({"type": "stream", "content": d.text}),
            )),
            EventBody::MessageEnd(p) => {
                // A producer that sends the whole text with the end, not as deltas.
                if let Change::Message(i) = step.change {
                    let m = &v.messages[i];
                    if m.role == Role::Assistant && m.text_from_end() && p.text.is_some() {
                        out.push(Out::control(seq, json!({"type": "stream", "content": m.text})));
                    }
                }
            }
            EventBody::ToolStart(p) => out.push(Out::control(
                seq,
                json!({"type": "tool_call", "toolName": p.tool, "toolArgs": args_text(&p.input)}),
            )),
            EventBody::ToolProgress(p) => out.push(Out::control(
                seq,
                json!({"type": "tool_progress", "toolName": tool_name(&p.call_id), "data": p.data}),
            )),
            EventBody::ToolEnd(p) => {
                let mut r = json!({"type": "tool_result", "toolName": tool_name(&p.call_id)});
                if p.ok {
                    r["output"] = as_text(&p.output).into();
                } else {
                    let err = if p.error.is_null() { &p.output } else { &p.error };
                    r["output"] = as_text(err).into();
                    r["isError"] = true.into();
                }
                out.push(Out::control(seq, r));
            }
            EventBody::Lifecycle(l) => match l.state {
                RunState::Done => out.push(Out::control(seq, json!({"type": "final"}))),
                RunState::Aborted | RunState::Error => {
                    let error = l.reason.clone().unwrap_or_else(|| format!("run {}", l.state.as_str()));
                    out.push(Out::control(seq, json!({"type": "error", "error": error})));
                }
                _ => {}
            },
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
        let path: &[&str] = if b["type"] == "tool_progress" { &["data"] } else { &["content"] };
        let super::Data::Json(a) = &mut pending.data else { return false };
        concat_at(a, b, path)
    }
}
