//! `typed` (seed 003): one `AgentEvent` union.
//!
//! - `reasoning.delta` → `{type: "thought", content}`; `text.delta` →
//!   `{type: "stream", content}`;
//! - `tool.start` → `{type: "tool_call", toolName, toolArgs}` (arguments as JSON
//!   text); `tool.progress` → `{type: "tool_progress", toolName, data}`; `tool.end` →
//!   `{type: "tool_result", toolName, output, isError?}` (output as text; a failed
//!   call's output is its error);
//! - the run's end: `done` → `{type: "final"}`; `aborted` or `error` →
//!   `{type: "error", error}` with the reason.
//! - A child run is a sub-agent behind a tool (seed 003 §7): its text deltas are
//!   `tool_progress` of the tool named after the child, and its end is a
//!   `tool_result` whose output is all the text it streamed.
//!
//! Other events have no counterpart in seed 003 and are not sent.

use serde_json::{json, Value};

use super::{as_text, concat_at, Class, Encoder, Out, Step};
use crate::domain::{EventBody, RunState};

/// The typed encoder.
pub struct Typed;

impl Encoder for Typed {
    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        let seq = e.seq;
        if let Some(child) = &e.child_id {
            match &e.body {
                EventBody::TextDelta(d) => out.push(Out::of(
                    seq,
                    Class::Text,
                    json!({"type": "tool_progress", "toolName": child, "data": d.text}),
                )),
                EventBody::Lifecycle(l) if l.state.is_terminal() => {
                    let text: String = v
                        .messages
                        .iter()
                        .filter(|m| m.child_id.as_ref() == Some(child))
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
        let item: Option<(Class, Value)> = match &e.body {
            EventBody::ReasoningDelta(d) => {
                Some((Class::Reasoning, json!({"type": "thought", "content": d.text})))
            }
            EventBody::TextDelta(d) => Some((Class::Text, json!({"type": "stream", "content": d.text}))),
            EventBody::ToolStart(p) => Some((
                Class::Control,
                json!({"type": "tool_call", "toolName": p.tool, "toolArgs": p.input.to_string()}),
            )),
            EventBody::ToolProgress(p) => Some((
                Class::Control,
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
                Some((Class::Control, r))
            }
            EventBody::Lifecycle(l) => match l.state {
                RunState::Done => Some((Class::Control, json!({"type": "final"}))),
                RunState::Aborted | RunState::Error => {
                    let error = l.reason.clone().unwrap_or_else(|| format!("run {}", l.state.as_str()));
                    Some((Class::Control, json!({"type": "error", "error": error})))
                }
                _ => None,
            },
            _ => None,
        };
        if let Some((class, data)) = item {
            out.push(Out::of(seq, class, data));
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let (Some(a), Some(b)) = (pending.json(), next.json()) else { return false };
        let kind = a["type"].as_str();
        if kind != b["type"].as_str() || !matches!(kind, Some("thought" | "stream")) {
            return false;
        }
        let super::Data::Json(a) = &mut pending.data else { return false };
        concat_at(a, b, &["content"])
    }
}
