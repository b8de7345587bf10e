//! `agui`: AG-UI protocol 1.0 events, valid under `@ag-ui/core`'s `EventSchemas` and in
//! the order AG-UI's verifier accepts.
//!
//! - A stream read from the start opens with `RUN_STARTED {threadId: root run, runId}`;
//!   the run's end closes whatever is open and sends `RUN_FINISHED` (`outcome`
//!   success for done, cancelled for aborted) or `RUN_ERROR` (error).
//! - Messages: `TEXT_MESSAGE_START/CONTENT/END`; reasoning deltas are reasoning
//!   messages of their own (`REASONING_MESSAGE_START/CONTENT/END`, id
//!   `<message>:reasoning:<block>`), opened at the first reasoning delta of a block
//!   and closed when text resumes or the message ends.
//! - Tool calls: `TOOL_CALL_START` (with `parentMessageId`), one `TOOL_CALL_ARGS`
//!   holding the input as JSON text, `TOOL_CALL_END`; `tool.end` is a
//!   `TOOL_CALL_RESULT` (id `<call>:result`). A call cut off by the run's end gets
//!   the result `interrupted`.
//! - A step boundary is a `STEP_STARTED` / `STEP_FINISHED` pair named
//!   `step <index> (<kind>)`.
//! - Children are sub-agents: `SUBAGENT_STARTED` at spawn, their events tagged with
//!   `subagentRunId`, and `SUBAGENT_FINISHED` or `SUBAGENT_ERROR` at their end.
//! - Lifecycle changes that do not end the run, plans, compaction, tool progress and
//!   custom events are `CUSTOM {name, value}` (a custom event's name without `custom.`).
//! - Children's message and call ids are prefixed with the child id.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::{as_text, concat_at, millis, scoped_id, Class, Encoder, Out, RunCtx, Step};
use crate::domain::event::Role;
use crate::domain::{EventBody, RunState};
use crate::projection::view::{MessageView, ToolView};
use crate::projection::{Change, RunView};

/// The AG-UI encoder: which reasoning messages are open, which messages have text.
#[derive(Default)]
pub struct Agui {
    reasoning: HashMap<String, String>,
    texted: HashSet<String>,
}

fn ev(kind: &str, step: &Step<'_>, fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), kind.into());
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    m.insert("timestamp".into(), millis(step.event).into());
    if let Some(c) = &step.event.child_id {
        if !kind.starts_with("RUN_") && !kind.starts_with("SUBAGENT_") {
            m.insert("subagentRunId".into(), c.clone().into());
        }
    }
    Value::Object(m)
}

fn role(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
    }
}

impl Agui {
    fn push(&self, out: &mut Vec<Out>, step: &Step<'_>, kind: &str, fields: Value) {
        out.push(Out::control(step.event.seq, ev(kind, step, fields)));
    }

    fn close_reasoning(&mut self, out: &mut Vec<Out>, step: &Step<'_>, mid: &str) {
        if let Some(rid) = self.reasoning.remove(mid) {
            self.push(out, step, "REASONING_MESSAGE_END", json!({"messageId": rid}));
        }
    }

    fn start_message(&self, out: &mut Vec<Out>, step: &Step<'_>, m: &MessageView) {
        let mid = scoped_id(m.child_id.as_deref(), &m.id);
        self.push(out, step, "TEXT_MESSAGE_START", json!({"messageId": mid, "role": role(m.role)}));
    }

    fn end_message(&mut self, out: &mut Vec<Out>, step: &Step<'_>, m: &MessageView) {
        let mid = scoped_id(m.child_id.as_deref(), &m.id);
        self.close_reasoning(out, step, &mid);
        self.push(out, step, "TEXT_MESSAGE_END", json!({"messageId": mid}));
        self.texted.remove(&mid);
    }

    fn result(&self, out: &mut Vec<Out>, step: &Step<'_>, t: &ToolView, content: String) {
        let call = scoped_id(t.child_id.as_deref(), &t.call_id);
        self.push(
            out,
            step,
            "TOOL_CALL_RESULT",
            json!({"messageId": format!("{call}:result"), "toolCallId": call, "content": content, "role": "tool"}),
        );
    }

    /// Closes what the terminal event of a scope interrupted.
    fn close_interrupted(&mut self, out: &mut Vec<Out>, step: &Step<'_>, v: &RunView) {
        let (messages, tools) = v.interrupted();
        for i in messages {
            self.end_message(out, step, &v.messages[*i]);
        }
        for i in tools {
            self.result(out, step, &v.tools[*i], "interrupted".into());
        }
    }
}

impl Encoder for Agui {
    fn begin(&mut self, run: &RunCtx, out: &mut Vec<Out>) {
        out.push(Out::control(
            0,
            json!({"type": "RUN_STARTED", "threadId": run.root_run_id, "runId": run.run_id}),
        ));
    }

    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        match (&e.body, step.change) {
            (EventBody::MessageStart(_), Change::Message(i)) => self.start_message(out, step, &v.messages[i]),
            (EventBody::TextDelta(d) | EventBody::ReasoningDelta(d), Change::Message(i)) => {
                let m = &v.messages[i];
                let mid = scoped_id(m.child_id.as_deref(), &m.id);
                if m.started_seq == e.seq {
                    self.start_message(out, step, m);
                }
                if matches!(e.body, EventBody::TextDelta(_)) {
                    self.close_reasoning(out, step, &mid);
                    self.texted.insert(mid.clone());
                    let item = ev("TEXT_MESSAGE_CONTENT", step, json!({"messageId": mid, "delta": d.text}));
                    out.push(Out::of(e.seq, Class::Text, item));
                } else {
                    let rid = match self.reasoning.get(&mid) {
                        Some(rid) => rid.clone(),
                        None => {
                            let rid = format!("{mid}:reasoning:{}", m.blocks.len());
                            self.push(
                                out,
                                step,
                                "REASONING_MESSAGE_START",
                                json!({"messageId": rid, "role": "reasoning"}),
                            );
                            self.reasoning.insert(mid, rid.clone());
                            rid
                        }
                    };
                    let item =
                        ev("REASONING_MESSAGE_CONTENT", step, json!({"messageId": rid, "delta": d.text}));
                    out.push(Out::of(e.seq, Class::Reasoning, item));
                }
            }
            (EventBody::MessageEnd(p), Change::Message(i)) => {
                let m = &v.messages[i];
                let mid = scoped_id(m.child_id.as_deref(), &m.id);
                if !self.texted.contains(&mid) && p.text.as_deref().is_some_and(|t| !t.is_empty()) {
                    // A producer that sends the whole text with the end, not as deltas.
                    self.close_reasoning(out, step, &mid);
                    self.push(out, step, "TEXT_MESSAGE_CONTENT", json!({"messageId": mid, "delta": m.text}));
                }
                self.end_message(out, step, m);
            }
            (EventBody::ToolStart(_), Change::Tool { tool, .. }) => {
                let t = &v.tools[tool];
                let call = scoped_id(t.child_id.as_deref(), &t.call_id);
                let mut start = json!({"toolCallId": call, "toolCallName": t.tool});
                // AG-UI attaches calls to assistant messages only.
                let parent = t.message_id.as_deref().filter(|m| {
                    v.message(t.child_id.as_deref(), m).is_some_and(|m| m.role == Role::Assistant)
                });
                if let Some(m) = parent {
                    start["parentMessageId"] = scoped_id(t.child_id.as_deref(), m).into();
                }
                self.push(out, step, "TOOL_CALL_START", start);
                self.push(
                    out,
                    step,
                    "TOOL_CALL_ARGS",
                    json!({"toolCallId": call, "delta": t.input.to_string()}),
                );
                self.push(out, step, "TOOL_CALL_END", json!({"toolCallId": call}));
            }
            (EventBody::ToolEnd(p), Change::Tool { tool, .. }) => {
                let t = &v.tools[tool];
                let content = if p.ok {
                    as_text(&t.output)
                } else if t.error.is_null() {
                    "error".to_owned()
                } else {
                    as_text(&t.error)
                };
                self.result(out, step, t, content);
            }
            (EventBody::StepBoundary(p), _) => {
                let kind = serde_json::to_value(p.step_kind)
                    .ok()
                    .and_then(|k| k.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let name = format!("step {} ({kind})", p.step_index);
                self.push(out, step, "STEP_STARTED", json!({"stepName": name}));
                self.push(out, step, "STEP_FINISHED", json!({"stepName": name}));
            }
            (EventBody::ChildSpawn(p), _) => {
                let mut f = json!({"subagentRunId": p.child_id, "name": p.child_id});
                if let Some(prompt) = &p.prompt {
                    f["description"] = prompt.clone().into();
                }
                if let Some(parent) = &e.child_id {
                    f["parentSubagentRunId"] = parent.clone().into();
                }
                self.push(out, step, "SUBAGENT_STARTED", f);
            }
            (EventBody::Lifecycle(l), Change::Lifecycle { .. }) if l.state.is_terminal() => {
                self.close_interrupted(out, step, v);
                match &e.child_id {
                    Some(c) => {
                        let f = match l.state {
                            RunState::Done => ("SUBAGENT_FINISHED", json!({"subagentRunId": c})),
                            _ => (
                                "SUBAGENT_ERROR",
                                json!({"subagentRunId": c, "message": l.reason.clone().unwrap_or_else(|| l.state.as_str().into()), "code": l.state.as_str()}),
                            ),
                        };
                        self.push(out, step, f.0, f.1);
                    }
                    None => {
                        for rid in std::mem::take(&mut self.reasoning).into_values() {
                            self.push(out, step, "REASONING_MESSAGE_END", json!({"messageId": rid}));
                        }
                        for c in v.children.iter().filter(|c| !c.state.is_some_and(|s| s.is_terminal())) {
                            self.push(
                                out,
                                step,
                                "SUBAGENT_ERROR",
                                json!({"subagentRunId": c.child_id, "message": "the run ended first", "code": "interrupted"}),
                            );
                        }
                        let ids = json!({"threadId": step.run.root_run_id, "runId": step.run.run_id});
                        match l.state {
                            RunState::Error => self.push(
                                out,
                                step,
                                "RUN_ERROR",
                                json!({"message": l.reason.clone().unwrap_or_else(|| "the run failed".into()), "code": "error"}),
                            ),
                            RunState::Aborted => {
                                let mut f = ids;
                                f["outcome"] = json!({"type": "cancelled"});
                                self.push(out, step, "RUN_FINISHED", f);
                            }
                            _ => {
                                let mut f = ids;
                                f["outcome"] = json!({"type": "success"});
                                self.push(out, step, "RUN_FINISHED", f);
                            }
                        }
                    }
                }
            }
            (EventBody::Lifecycle(_) | EventBody::ToolProgress(_), _)
            | (EventBody::PlanProposal(_) | EventBody::PlanDecision(_), _)
            | (EventBody::CompactionStart(_) | EventBody::CompactionEnd(_), _)
            | (EventBody::Custom { .. }, _) => {
                let name = e.body.type_name();
                let name = name.strip_prefix("custom.").unwrap_or(&name).to_owned();
                self.push(out, step, "CUSTOM", json!({"name": name, "value": e.body.payload()}));
            }
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let (Some(a), Some(b)) = (pending.json(), next.json()) else { return false };
        let kind = a["type"].as_str();
        if kind != b["type"].as_str()
            || !matches!(kind, Some("TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT"))
            || a["messageId"] != b["messageId"]
        {
            return false;
        }
        let ts = b["timestamp"].clone();
        let super::Data::Json(a) = &mut pending.data else { return false };
        a["timestamp"] = ts;
        concat_at(a, b, &["delta"])
    }

    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        data["metadata"] = json!({"agent-stream": {"dropped_count": dropped}});
    }
}
