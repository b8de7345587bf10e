//! `vercel`: the AI SDK UI message stream v1 (the `ai` package's `UIMessageChunk`s), one
//! assistant message per run.
//!
//! - Every stream opens with `start {messageId: run id}` and `start-step`; the run's end
//!   sends `finish-step` and then `finish` (`finishReason: "stop"`, done), `abort`
//!   (aborted) or `error` (error), and `data: [DONE]`.
//! - An assistant message's text is one text part (`text-start/delta/end`, id
//!   `<message>:text`) and its reasoning one reasoning part (`reasoning-*`, id
//!   `<message>:reasoning`), each opened at its first content and ended with the
//!   message. Text that came only with `message.end` is sent whole then.
//! - User and system messages are not the assistant's output: each is a
//!   `data-message` part `{role, text, status, childId}` (id: the message), sent when
//!   it ends (or is cut off by the run's end); their deltas are not sent.
//! - Tool calls are dynamic tools: `tool-input-available` at the start, progress as
//!   `preliminary` outputs, then `tool-output-available` or `tool-output-error`
//!   (`interrupted` when the run ended first).
//! - The rest are `data-*` parts that update in place by id, each carrying the view's
//!   current record: `data-lifecycle` `{state, reason}` (every change of the run's own
//!   state, its end included), `data-step` (per step), `data-plan` (id `plan`: the
//!   current plan and its decision), `data-subagent` (a child: `{childId,
//!   parentChildId, prompt, toolsAllowed, state}`), `data-compaction`. A
//!   `custom.<name>` event is a transient `data-<name>` chunk (delivered to `onData`,
//!   not kept in the message: custom events are not projected).
//! - Step boundaries are not `finish-step`: a message may stay open across a step, and
//!   the SDK ends every open part at `finish-step`.
//!
//! Lanes: one per text part and one per reasoning part.
//!
//! Resume (resync): a resumed stream is a complete replay, as the AI SDK's
//! `DefaultChatTransport` expects by default (`resumeStreamIsReplay`: the client resets
//! its message at the replay's `start`). It is compacted: every part as it is at the
//! cursor, in the order the parts were created (each text whole, the latest value of
//! each data part), then the stream continues after the cursor.

use serde_json::{json, Value};

use super::{as_text, concat_at, lane, scoped_id, Class, Data, Encoder, Out, Resume, RunCtx, Step};
use crate::domain::event::Role;
use crate::domain::{EventBody, RunState};
use crate::projection::view::{MessageStatus, MessageView, StepView, ToolStatus, ToolView};
use crate::projection::{Change, RunView};

/// The vercel encoder.
pub struct Vercel;

fn message_key(m: &MessageView) -> String {
    scoped_id(m.child_id.as_deref(), &m.id)
}

fn text_id(m: &MessageView) -> String {
    format!("{}:text", message_key(m))
}

fn reasoning_id(m: &MessageView) -> String {
    format!("{}:reasoning", message_key(m))
}

fn call_id(t: &ToolView) -> String {
    scoped_id(t.child_id.as_deref(), &t.call_id)
}

fn data_part(name: &str, id: &str, data: Value) -> Value {
    json!({"type": format!("data-{name}"), "id": id, "data": data})
}

/// A user or system message as a data part.
fn message_part(m: &MessageView) -> Value {
    let data = json!({"role": m.role, "text": m.text, "status": m.status, "childId": m.child_id});
    data_part("message", &message_key(m), data)
}

fn lifecycle_part(v: &RunView) -> Value {
    let t = v.root_transition();
    data_part(
        "lifecycle",
        "lifecycle",
        json!({"state": t.map(|t| t.to), "reason": t.and_then(|t| t.reason.clone())}),
    )
}

fn subagent_part(v: &RunView, child: &str) -> Option<Value> {
    let c = v.child(child)?;
    let data = json!({"childId": c.child_id, "parentChildId": c.parent_child_id, "prompt": c.prompt, "toolsAllowed": c.tools_allowed, "state": c.state});
    Some(data_part("subagent", child, data))
}

fn step_id(s: &StepView) -> String {
    scoped_id(s.child_id.as_deref(), &format!("step-{}", s.step_index))
}

fn step_part(s: &StepView) -> Value {
    let data = json!({"stepIndex": s.step_index, "stepKind": s.step_kind, "checkpointId": s.checkpoint_id, "childId": s.child_id});
    data_part("step", &step_id(s), data)
}

fn plan_part(v: &RunView) -> Value {
    data_part("plan", "plan", json!(v.plan))
}

fn compaction_part(v: &RunView) -> Value {
    data_part("compaction", "compaction", json!(v.compaction))
}

fn tool_input(t: &ToolView) -> Value {
    json!({"type": "tool-input-available", "toolCallId": call_id(t), "toolName": t.tool, "input": &*t.input, "dynamic": true})
}

/// The chunk that gives a call its current output, if it has one.
fn tool_output(t: &ToolView) -> Option<Value> {
    let id = call_id(t);
    Some(match t.status {
        ToolStatus::Running if t.progress_count > 0 => {
            json!({"type": "tool-output-available", "toolCallId": id, "output": &*t.last_progress, "preliminary": true, "dynamic": true})
        }
        ToolStatus::Running => return None,
        ToolStatus::Success => {
            json!({"type": "tool-output-available", "toolCallId": id, "output": &*t.output, "dynamic": true})
        }
        ToolStatus::Error => {
            let err = if t.error.is_null() { "the tool failed".to_owned() } else { as_text(&t.error) };
            json!({"type": "tool-output-error", "toolCallId": id, "errorText": err, "dynamic": true})
        }
        ToolStatus::Interrupted => {
            json!({"type": "tool-output-error", "toolCallId": id, "errorText": "interrupted", "dynamic": true})
        }
    })
}

/// The chunks that end the run's message: `finish-step`, then `finish`, `abort` or
/// `error`, then `[DONE]`.
fn finish(out: &mut Vec<Out>, seq: i64, state: RunState, reason: Option<String>) {
    out.push(Out::control(seq, json!({"type": "finish-step"})));
    out.push(Out::control(
        seq,
        match state {
            RunState::Done => json!({"type": "finish", "finishReason": "stop"}),
            RunState::Aborted => {
                json!({"type": "abort", "reason": reason.unwrap_or_else(|| "aborted".into())})
            }
            _ => json!({"type": "error", "errorText": reason.unwrap_or_else(|| "the run failed".into())}),
        },
    ));
    out.push(Out { data: Data::Text("[DONE]"), ..Out::control(seq, Value::Null) });
}

impl Vercel {
    /// Ends the open parts of a message (interrupted, or ended).
    fn end_parts(out: &mut Vec<Out>, seq: i64, m: &MessageView) {
        if m.first_reasoning_seq.is_some() {
            out.push(Out::control(seq, json!({"type": "reasoning-end", "id": reasoning_id(m)})));
        }
        if m.first_text_seq.is_some() {
            out.push(Out::control(seq, json!({"type": "text-end", "id": text_id(m)})));
        }
    }

    /// What the terminal event of a scope cut off.
    fn interrupted(out: &mut Vec<Out>, seq: i64, v: &RunView) {
        let (messages, tools) = v.interrupted();
        for i in messages {
            let m = &v.messages[*i];
            match m.role {
                Role::Assistant => Self::end_parts(out, seq, m),
                _ => out.push(Out::control(seq, message_part(m))),
            }
        }
        for i in tools {
            out.extend(tool_output(&v.tools[*i]).map(|o| Out::control(seq, o)));
        }
    }
}

impl Encoder for Vercel {
    fn resume(&self) -> Resume {
        Resume::Resync
    }

    fn open(&self, run: &RunCtx, v: &RunView, _past: bool, out: &mut Vec<Out>) {
        let seq = v.seq;
        out.push(Out::control(seq, json!({"type": "start", "messageId": run.run_id})));
        out.push(Out::control(seq, json!({"type": "start-step"})));
        // Every part as it is now, where the live stream created it: by the seq (and
        // order within the event) of the chunk that created it.
        let mut parts: Vec<(i64, usize, Vec<Value>)> = vec![];
        for (i, m) in v.messages.iter().enumerate() {
            let open = m.status == MessageStatus::Streaming;
            if m.role != Role::Assistant {
                if let (false, Some(end)) = (open, m.ended_seq) {
                    parts.push((end, i, vec![message_part(m)]));
                }
                continue;
            }
            if let Some(s) = m.first_reasoning_seq {
                let id = reasoning_id(m);
                let mut c = vec![json!({"type": "reasoning-start", "id": id})];
                c.push(json!({"type": "reasoning-delta", "id": id, "delta": m.reasoning}));
                if !open {
                    c.push(json!({"type": "reasoning-end", "id": id}));
                }
                parts.push((s, 0, c));
            }
            if let Some(s) = m.first_text_seq {
                let id = text_id(m);
                let mut c = vec![json!({"type": "text-start", "id": id})];
                c.push(json!({"type": "text-delta", "id": id, "delta": m.text}));
                if !open {
                    c.push(json!({"type": "text-end", "id": id}));
                }
                parts.push((s, 0, c));
            }
        }
        for t in &v.tools {
            parts.push((t.started_seq, 0, std::iter::once(tool_input(t)).chain(tool_output(t)).collect()));
        }
        if let Some(first) = v.lifecycle.transitions.iter().find(|t| t.child_id.is_none()) {
            parts.push((first.seq, 0, vec![lifecycle_part(v)]));
        }
        for c in &v.children {
            parts.extend(subagent_part(v, &c.child_id).map(|p| (c.spawned_seq, 0, vec![p])));
        }
        // A repeated step index updates its part: keep the latest at the first one's place.
        let mut steps: Vec<(String, i64, &StepView)> = vec![];
        for s in &v.steps {
            let id = step_id(s);
            match steps.iter_mut().find(|(i, _, _)| *i == id) {
                Some(slot) => slot.2 = s,
                None => steps.push((id, s.seq, s)),
            }
        }
        parts.extend(steps.into_iter().map(|(_, seq, s)| (seq, 0, vec![step_part(s)])));
        if let Some(s) = v.plan_first_seq() {
            parts.push((s, 0, vec![plan_part(v)]));
        }
        if let Some(s) = v.compaction_first_seq() {
            parts.push((s, 0, vec![compaction_part(v)]));
        }
        parts.sort_by_key(|p| (p.0, p.1));
        out.extend(parts.into_iter().flat_map(|p| p.2).map(|c| Out::control(seq, c)));
        if let Some(end) = v.state().filter(|s| s.is_terminal()) {
            // Resumed inside the run's last event: the replay holds it; finish the message.
            finish(out, seq, end, v.root_transition().and_then(|t| t.reason.clone()));
        }
    }

    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        let seq = e.seq;
        match (&e.body, step.change) {
            (EventBody::TextDelta(d) | EventBody::ReasoningDelta(d), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.role != Role::Assistant {
                    return;
                }
                let (id, first, start, delta, class) = match e.body {
                    EventBody::TextDelta(_) => {
                        (text_id(m), m.first_text_seq, "text-start", "text-delta", Class::Text)
                    }
                    _ => (
                        reasoning_id(m),
                        m.first_reasoning_seq,
                        "reasoning-start",
                        "reasoning-delta",
                        Class::Reasoning,
                    ),
                };
                if first == Some(seq) {
                    out.push(Out::control(seq, json!({"type": start, "id": id})));
                }
                let item = json!({"type": delta, "id": id, "delta": d.text});
                out.push(Out::delta(seq, class, lane(("vercel", &id)), item));
            }
            (EventBody::MessageEnd(_), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.role != Role::Assistant {
                    out.push(Out::control(seq, message_part(m)));
                    return;
                }
                if m.text_from_end() {
                    // Text that came only with the end (no deltas) is a whole part now.
                    let id = text_id(m);
                    out.push(Out::control(seq, json!({"type": "text-start", "id": id})));
                    out.push(Out::control(seq, json!({"type": "text-delta", "id": id, "delta": m.text})));
                }
                Self::end_parts(out, seq, m);
            }
            (EventBody::ToolStart(_), Change::Tool { tool, .. }) => {
                out.push(Out::control(seq, tool_input(&v.tools[tool])));
            }
            (EventBody::ToolProgress(_) | EventBody::ToolEnd(_), Change::Tool { tool, .. }) => {
                out.extend(tool_output(&v.tools[tool]).map(|o| Out::control(seq, o)));
            }
            (EventBody::ChildSpawn(p), _) => {
                out.extend(subagent_part(v, &p.child_id).map(|p| Out::control(seq, p)));
            }
            (EventBody::Lifecycle(l), Change::Lifecycle { .. }) => {
                if l.state.is_terminal() {
                    Self::interrupted(out, seq, v);
                }
                match &e.child_id {
                    Some(c) => out.extend(subagent_part(v, c).map(|p| Out::control(seq, p))),
                    None => {
                        out.push(Out::control(seq, lifecycle_part(v)));
                        if l.state.is_terminal() {
                            finish(out, seq, l.state, l.reason.clone());
                        }
                    }
                }
            }
            (EventBody::StepBoundary(_), Change::Step) => {
                if let Some(s) = v.steps.last() {
                    out.push(Out::control(seq, step_part(s)));
                }
            }
            (EventBody::PlanProposal(_) | EventBody::PlanDecision(_), _) => {
                out.push(Out::control(seq, plan_part(v)));
            }
            (EventBody::CompactionStart(_) | EventBody::CompactionEnd(_), _) => {
                out.push(Out::control(seq, compaction_part(v)));
            }
            (EventBody::Custom { name, payload }, _) => {
                let item = json!({"type": format!("data-{name}"), "data": payload, "transient": true});
                out.push(Out::control(seq, item));
            }
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
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
