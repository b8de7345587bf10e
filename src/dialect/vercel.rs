//! `vercel`: the AI SDK UI message stream v1 (the `ai` package's `UIMessageChunk`s), one
//! assistant message per run.
//!
//! - A stream read from the start opens with `start {messageId: run id}` and
//!   `start-step`; the run's end sends `finish-step` and then `finish`
//!   (`finishReason: "stop"`, done), `abort` (aborted) or `error` (error), and
//!   `data: [DONE]`.
//! - Each text or thinking block of a message is a text or reasoning part
//!   (`text-start/delta/end`, `reasoning-start/delta/end`) with id
//!   `<message>:<block>`; a part ends when the message moves to another block or ends.
//! - Tool calls are dynamic tools: `tool-input-available` at the start, progress as
//!   `preliminary` outputs, then `tool-output-available` or `tool-output-error`.
//! - Everything without a chunk of its own is a `data-*` part that updates in place
//!   by id: `data-lifecycle`, `data-step`, `data-plan`, `data-subagent` (a child's
//!   spawn and end), `data-compaction`, `data-message` (a user or system message), and
//!   `data-<name>` for `custom.<name>`.
//! - Step boundaries are not `finish-step`: a message may stay open across a step,
//!   and the SDK ends every open part at `finish-step`.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{as_text, concat_at, Class, Data, Encoder, Out, RunCtx, Step};
use crate::domain::event::Role;
use crate::domain::{EventBody, RunState};
use crate::projection::view::{BlockKind, MessageView};
use crate::projection::{Change, RunView};

/// The vercel encoder: the open part of each message.
#[derive(Default)]
pub struct Vercel {
    open: HashMap<String, (String, BlockKind)>,
    texted: std::collections::HashSet<String>,
}

fn message_key(m: &MessageView) -> String {
    super::scoped_id(m.child_id.as_deref(), &m.id)
}

impl Vercel {
    fn end_part(&mut self, out: &mut Vec<Out>, seq: i64, key: &str) {
        if let Some((id, kind)) = self.open.remove(key) {
            let t = if kind == BlockKind::Text { "text-end" } else { "reasoning-end" };
            out.push(Out::control(seq, json!({"type": t, "id": id})));
        }
    }

    /// Makes the message's last block the open part, ending the previous one.
    fn open_last_block(
        &mut self,
        out: &mut Vec<Out>,
        seq: i64,
        m: &MessageView,
    ) -> Option<(String, BlockKind)> {
        let key = message_key(m);
        let last = m.blocks.len().checked_sub(1)?;
        let kind = m.blocks[last].kind;
        if kind == BlockKind::ToolCall {
            return None;
        }
        let id = format!("{key}:{last}");
        if self.open.get(&key).map(|(i, _)| i) != Some(&id) {
            self.end_part(out, seq, &key);
            let t = if kind == BlockKind::Text { "text-start" } else { "reasoning-start" };
            out.push(Out::control(seq, json!({"type": t, "id": id})));
            self.open.insert(key, (id.clone(), kind));
        }
        Some((id, kind))
    }

    fn interrupted(&mut self, out: &mut Vec<Out>, seq: i64, v: &RunView) {
        let (messages, tools) = v.interrupted();
        for i in messages {
            self.end_part(out, seq, &message_key(&v.messages[*i]));
        }
        for i in tools {
            let t = &v.tools[*i];
            out.push(Out::control(
                seq,
                json!({"type": "tool-output-error", "toolCallId": super::scoped_id(t.child_id.as_deref(), &t.call_id), "errorText": "interrupted", "dynamic": true}),
            ));
        }
    }
}

fn data_part(name: &str, id: Option<String>, data: Value) -> Value {
    let mut v = json!({"type": format!("data-{name}"), "data": data});
    if let Some(id) = id {
        v["id"] = id.into();
    }
    v
}

impl Encoder for Vercel {
    fn begin(&mut self, run: &RunCtx, out: &mut Vec<Out>) {
        out.push(Out::control(0, json!({"type": "start", "messageId": run.run_id})));
        out.push(Out::control(0, json!({"type": "start-step"})));
    }

    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        let seq = e.seq;
        let call_id = |c: &str| super::scoped_id(e.child_id.as_deref(), c);
        match (&e.body, step.change) {
            (EventBody::TextDelta(d) | EventBody::ReasoningDelta(d), Change::Message(i)) => {
                let m = &v.messages[i];
                if matches!(e.body, EventBody::TextDelta(_)) {
                    self.texted.insert(message_key(m));
                }
                if let Some((id, kind)) = self.open_last_block(out, seq, m) {
                    let (t, class) =
                        if kind == BlockKind::Text { ("text-delta", Class::Text) } else { ("reasoning-delta", Class::Reasoning) };
                    out.push(Out::of(seq, class, json!({"type": t, "id": id, "delta": d.text})));
                }
            }
            (EventBody::MessageEnd(p), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.role != Role::Assistant {
                    let data = json!({"role": m.role, "text": m.text, "childId": m.child_id});
                    out.push(Out::control(seq, data_part("message", Some(message_key(m)), data)));
                    return;
                }
                let key = message_key(m);
                if !self.texted.contains(&key) && p.text.as_deref().is_some_and(|t| !t.is_empty()) {
                    // Text that came only with the end (no deltas) is a whole part now.
                    if let Some((id, _)) = self.open_last_block(out, seq, m) {
                        out.push(Out::control(seq, json!({"type": "text-delta", "id": id, "delta": m.text})));
                    }
                }
                self.texted.remove(&key);
                self.end_part(out, seq, &key);
            }
            (EventBody::ToolStart(p), _) => out.push(Out::control(
                seq,
                json!({"type": "tool-input-available", "toolCallId": call_id(&p.call_id), "toolName": p.tool, "input": p.input, "dynamic": true}),
            )),
            (EventBody::ToolProgress(p), _) => out.push(Out::control(
                seq,
                json!({"type": "tool-output-available", "toolCallId": call_id(&p.call_id), "output": p.data, "preliminary": true, "dynamic": true}),
            )),
            (EventBody::ToolEnd(p), _) => {
                let item = if p.ok {
                    json!({"type": "tool-output-available", "toolCallId": call_id(&p.call_id), "output": p.output, "dynamic": true})
                } else {
                    let err = if p.error.is_null() { "the tool failed".to_owned() } else { as_text(&p.error) };
                    json!({"type": "tool-output-error", "toolCallId": call_id(&p.call_id), "errorText": err, "dynamic": true})
                };
                out.push(Out::control(seq, item));
            }
            (EventBody::ChildSpawn(p), _) => {
                let data = json!({"status": "spawned", "prompt": p.prompt, "parentChildId": e.child_id});
                out.push(Out::control(seq, data_part("subagent", Some(p.child_id.clone()), data)));
            }
            (EventBody::Lifecycle(l), Change::Lifecycle { .. }) => {
                if l.state.is_terminal() {
                    self.interrupted(out, seq, v);
                }
                match (&e.child_id, l.state.is_terminal()) {
                    (Some(c), _) => {
                        let data = json!({"status": l.state, "reason": l.reason});
                        out.push(Out::control(seq, data_part("subagent", Some(c.clone()), data)));
                    }
                    (None, false) => {
                        out.push(Out::control(seq, data_part("lifecycle", Some("lifecycle".into()), e.body.payload())));
                    }
                    (None, true) => {
                        for key in self.open.keys().cloned().collect::<Vec<_>>() {
                            self.end_part(out, seq, &key);
                        }
                        out.push(Out::control(seq, json!({"type": "finish-step"})));
                        let reason = l.reason.clone();
                        out.push(Out::control(
                            seq,
                            match l.state {
                                RunState::Done => json!({"type": "finish", "finishReason": "stop"}),
                                RunState::Aborted => json!({"type": "abort", "reason": reason.unwrap_or_else(|| "aborted".into())}),
                                _ => json!({"type": "error", "errorText": reason.unwrap_or_else(|| "the run failed".into())}),
                            },
                        ));
                        out.push(Out { data: Data::Text("[DONE]"), ..Out::control(seq, Value::Null) });
                    }
                }
            }
            (EventBody::StepBoundary(p), _) => {
                let id = super::scoped_id(e.child_id.as_deref(), &format!("step-{}", p.step_index));
                out.push(Out::control(seq, data_part("step", Some(id), e.body.payload())));
            }
            (EventBody::PlanProposal(p), _) => {
                out.push(Out::control(seq, data_part("plan", Some(p.plan.id.clone()), e.body.payload())))
            }
            (EventBody::PlanDecision(p), _) => {
                out.push(Out::control(seq, data_part("plan-decision", Some(p.plan_id.clone()), e.body.payload())))
            }
            (EventBody::CompactionStart(_) | EventBody::CompactionEnd(_), _) => {
                let mut data = e.body.payload();
                data["active"] = matches!(e.body, EventBody::CompactionStart(_)).into();
                out.push(Out::control(seq, data_part("compaction", Some("compaction".into()), data)));
            }
            (EventBody::Custom { .. }, _) => {
                let name = e.body.type_name();
                let name = name.strip_prefix("custom.").unwrap_or(&name).to_owned();
                out.push(Out::control(seq, data_part(&name, None, e.body.payload())));
            }
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let (Some(a), Some(b)) = (pending.json(), next.json()) else { return false };
        let kind = a["type"].as_str();
        if kind != b["type"].as_str()
            || !matches!(kind, Some("text-delta" | "reasoning-delta"))
            || a["id"] != b["id"]
        {
            return false;
        }
        let Data::Json(a) = &mut pending.data else { return false };
        concat_at(a, b, &["delta"])
    }

    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        match data["type"].as_str() {
            Some("finish") => data["messageMetadata"] = json!({"droppedCount": dropped}),
            _ => data["droppedCount"] = dropped.into(),
        }
    }
}
