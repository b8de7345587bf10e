//! `agui`: AG-UI protocol 1.0 events, valid under `@ag-ui/core`'s `EventSchemas` and in
//! the order `@ag-ui/client`'s `verifyEvents` accepts.
//!
//! - Every stream opens with `RUN_STARTED {threadId: root run, runId}` and a
//!   `STATE_SNAPSHOT` of the run's state `{lifecycle, plan}` (the run's lifecycle state
//!   and its current plan, as in the view), kept current with `STATE_DELTA`s. The run's
//!   end closes whatever is open and sends `RUN_FINISHED` (`outcome` success for done,
//!   cancelled for aborted) or `RUN_ERROR` (error).
//! - Messages: `TEXT_MESSAGE_START {messageId, role}` (user, assistant and system keep
//!   their role), `TEXT_MESSAGE_CONTENT` per text delta (or one with the whole text
//!   when it came with `message.end`), `TEXT_MESSAGE_END`. A message's reasoning is one
//!   reasoning message, `<message>:reasoning`, opened at its first reasoning delta and
//!   ended with the message.
//! - Tool calls: `TOOL_CALL_START` (with `parentMessageId` when an assistant message
//!   was open), one `TOOL_CALL_ARGS` holding the input as JSON text (`{}` without
//!   input), `TOOL_CALL_END`; `tool.end` is a `TOOL_CALL_RESULT` (id `<call>:result`,
//!   content the output as text, or the error). A call cut off by the run's end gets the
//!   result `interrupted`.
//! - A step boundary is a `STEP_STARTED` / `STEP_FINISHED` pair named
//!   `step <index> (<kind>)`.
//! - Children are sub-agents: `SUBAGENT_STARTED` at spawn, their events tagged with
//!   `subagentRunId`, and `SUBAGENT_FINISHED` or `SUBAGENT_ERROR` at their end.
//! - Lifecycle changes that do not end the run, plans, compaction, tool progress and
//!   custom events are also `CUSTOM {name, value}` (a custom event's name without
//!   `custom.`); they are not part of the messages or the state.
//! - Children's message and call ids are prefixed with the child id.
//!
//! Lanes: one per text message and one per reasoning message.
//!
//! Resume (resync): a resumed stream is an AG-UI run of its own. It opens with
//! `RUN_STARTED`, the `STATE_SNAPSHOT` at the cursor and a `MESSAGES_SNAPSHOT` of every
//! message at the cursor (text, reasoning and tool messages, in the order the client
//! built them), then starts again what is still open (`TEXT_MESSAGE_START`,
//! `REASONING_MESSAGE_START` with the same ids, `SUBAGENT_STARTED`), then continues
//! after the cursor. `@ag-ui/client` replaces messages by id from a snapshot, so a
//! client that saw part of an event, or a whole lane more than the cursor says, still
//! ends with each text once. Two things it does not replace, handled here:
//! - a snapshot with no reasoning message leaves the client's reasoning messages alone,
//!   so a client that got reasoning deltas ahead of the cursor (a merged frame) is not
//!   sent those deltas again ([`Encoder::kept_through_resync`]);
//! - a new client gets no `MESSAGES_SNAPSHOT` (its own input messages stay), but a
//!   client cut inside the run's first event does, an empty one.

use serde_json::{json, Map, Value};

use super::{
    args_text, as_text, concat_at, lane, millis, scoped_id, Class, Encoder, Out, Resume, RunCtx, Step,
};
use crate::domain::event::Role;
use crate::domain::{EventBody, RunState};
use crate::projection::view::{MessageStatus, MessageView, ToolStatus, ToolView};
use crate::projection::{Change, RunView};

/// The AG-UI encoder.
pub struct Agui;

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

fn message_id(m: &MessageView) -> String {
    scoped_id(m.child_id.as_deref(), &m.id)
}

fn reasoning_id(m: &MessageView) -> String {
    format!("{}:reasoning", message_id(m))
}

fn call_id(t: &ToolView) -> String {
    scoped_id(t.child_id.as_deref(), &t.call_id)
}

/// The assistant message a call was made in, if any (AG-UI attaches calls to those).
fn parent_message(v: &RunView, t: &ToolView) -> Option<String> {
    let m = v.message(t.child_id.as_deref(), t.message_id.as_deref()?)?;
    (m.role == Role::Assistant).then(|| message_id(m))
}

/// What `TOOL_CALL_RESULT` says of a call that ended (or was cut off).
fn result_content(t: &ToolView) -> String {
    match t.status {
        ToolStatus::Success => as_text(&t.output),
        ToolStatus::Error if t.error.is_null() => "error".to_owned(),
        ToolStatus::Error => as_text(&t.error),
        ToolStatus::Interrupted | ToolStatus::Running => "interrupted".to_owned(),
    }
}

/// The agent state this dialect keeps: the run's lifecycle state and current plan.
fn state(v: &RunView) -> Value {
    json!({"lifecycle": v.lifecycle.state, "plan": v.plan})
}

/// The event that ends a run in `state` (done, aborted or error).
fn run_end(run: &RunCtx, state: RunState, reason: Option<&str>) -> Value {
    match state {
        RunState::Error => {
            json!({"type": "RUN_ERROR", "message": reason.unwrap_or("the run failed"), "code": "error"})
        }
        RunState::Aborted => {
            json!({"type": "RUN_FINISHED", "threadId": run.root_run_id, "runId": run.run_id, "outcome": {"type": "cancelled"}})
        }
        _ => {
            json!({"type": "RUN_FINISHED", "threadId": run.root_run_id, "runId": run.run_id, "outcome": {"type": "success"}})
        }
    }
}

/// Adds `subagentRunId` to an item a child's entity opens outside of any event.
fn tagged(mut item: Value, child: Option<&str>) -> Value {
    if let Some(c) = child {
        item["subagentRunId"] = c.into();
    }
    item
}

/// The messages a client that followed the stream up to the view holds, in the order it
/// built them (`@ag-ui/client`'s default apply): what a resumed stream's
/// `MESSAGES_SNAPSHOT` carries.
fn messages(v: &RunView) -> Vec<Value> {
    // What created or changed the client's list, by the seq (and order within the
    // event) of the item that did it.
    enum Rec {
        Text(usize),
        Reasoning(usize),
        Call(usize),
        Result(usize),
    }
    let mut recs: Vec<(i64, u8, usize, Rec)> = vec![];
    for (i, m) in v.messages.iter().enumerate() {
        // A reasoning delta that opens its message starts the reasoning message first.
        recs.push((m.started_seq, 1, i, Rec::Text(i)));
        if let Some(s) = m.first_reasoning_seq {
            recs.push((s, 0, i, Rec::Reasoning(i)));
        }
    }
    for (i, t) in v.tools.iter().enumerate() {
        recs.push((t.started_seq, 2, i, Rec::Call(i)));
        if let Some(s) = t.ended_seq {
            recs.push((s, 3, i, Rec::Result(i)));
        }
    }
    recs.sort_by_key(|r| (r.0, r.1, r.2));
    let mut out: Vec<Value> = vec![];
    for (_, _, _, rec) in recs {
        match rec {
            Rec::Text(i) => {
                let m = &v.messages[i];
                out.push(tagged(
                    json!({"id": message_id(m), "role": role(m.role), "content": m.text}),
                    m.child_id.as_deref(),
                ));
            }
            Rec::Reasoning(i) => {
                let m = &v.messages[i];
                out.push(tagged(
                    json!({"id": reasoning_id(m), "role": "reasoning", "content": m.reasoning}),
                    m.child_id.as_deref(),
                ));
            }
            Rec::Call(i) => {
                let t = &v.tools[i];
                let call = json!({"id": call_id(t), "type": "function", "function": {"name": t.tool, "arguments": args_text(&t.input)}});
                let parent = parent_message(v, t)
                    .and_then(|p| out.iter().position(|m| m["id"] == p.as_str() && m["role"] == "assistant"));
                match parent {
                    Some(p) => match out[p].get_mut("toolCalls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => out[p]["toolCalls"] = json!([call]),
                    },
                    None => out.push(tagged(
                        json!({"id": call_id(t), "role": "assistant", "toolCalls": [call]}),
                        t.child_id.as_deref(),
                    )),
                }
            }
            Rec::Result(i) => {
                let t = &v.tools[i];
                let id = call_id(t);
                let msg = tagged(
                    json!({"id": format!("{id}:result"), "toolCallId": id, "role": "tool", "content": result_content(t)}),
                    t.child_id.as_deref(),
                );
                // As the client does: right after the assistant message that made the call,
                // after any results already there.
                let owner = out.iter().position(|m| {
                    m["role"] == "assistant"
                        && m["toolCalls"].as_array().is_some_and(|c| c.iter().any(|c| c["id"] == id.as_str()))
                });
                match owner {
                    Some(o) => {
                        let mut at = o + 1;
                        while at < out.len() && out[at]["role"] == "tool" {
                            at += 1;
                        }
                        out.insert(at, msg);
                    }
                    None => out.push(msg),
                }
            }
        }
    }
    out
}

impl Agui {
    fn push(&self, out: &mut Vec<Out>, step: &Step<'_>, kind: &str, fields: Value) {
        out.push(Out::control(step.event.seq, ev(kind, step, fields)));
    }

    fn end_message(&self, out: &mut Vec<Out>, step: &Step<'_>, m: &MessageView) {
        if m.first_reasoning_seq.is_some() {
            self.push(out, step, "REASONING_MESSAGE_END", json!({"messageId": reasoning_id(m)}));
        }
        self.push(out, step, "TEXT_MESSAGE_END", json!({"messageId": message_id(m)}));
    }

    fn result(&self, out: &mut Vec<Out>, step: &Step<'_>, t: &ToolView) {
        let call = call_id(t);
        self.push(
            out,
            step,
            "TOOL_CALL_RESULT",
            json!({"messageId": format!("{call}:result"), "toolCallId": call, "content": result_content(t), "role": "tool"}),
        );
    }

    /// Closes what the terminal event of a scope interrupted.
    fn close_interrupted(&self, out: &mut Vec<Out>, step: &Step<'_>, v: &RunView) {
        let (messages, tools) = v.interrupted();
        for i in messages {
            self.end_message(out, step, &v.messages[*i]);
        }
        for i in tools {
            self.result(out, step, &v.tools[*i]);
        }
    }

    fn state_delta(&self, out: &mut Vec<Out>, step: &Step<'_>, path: &str, value: Value) {
        self.push(
            out,
            step,
            "STATE_DELTA",
            json!({"delta": [{"op": "replace", "path": path, "value": value}]}),
        );
    }

    fn custom(&self, out: &mut Vec<Out>, step: &Step<'_>) {
        let e = step.event;
        let name = e.body.type_name();
        let name = name.strip_prefix("custom.").unwrap_or(&name).to_owned();
        self.push(out, step, "CUSTOM", json!({"name": name, "value": e.body.payload()}));
    }
}

impl Encoder for Agui {
    fn resume(&self) -> Resume {
        Resume::Resync
    }

    fn kept_through_resync(&self, v: &RunView) -> &'static [Class] {
        // `@ag-ui/client` keeps its reasoning messages through a MESSAGES_SNAPSHOT that
        // has none: a client cut inside a merged frame keeps reasoning the view at the
        // base does not have yet, and must not get it again.
        if v.messages.iter().any(|m| m.first_reasoning_seq.is_some()) {
            &[]
        } else {
            &[Class::Reasoning]
        }
    }

    fn open(&self, run: &RunCtx, v: &RunView, past: bool, out: &mut Vec<Out>) {
        let item = |data: Value| Out::control(v.seq, data);
        out.push(item(json!({"type": "RUN_STARTED", "threadId": run.root_run_id, "runId": run.run_id})));
        out.push(item(json!({"type": "STATE_SNAPSHOT", "snapshot": state(v)})));
        if v.seq == 0 && !past {
            // A new client: nothing to replace (and its own input messages stay).
            return;
        }
        out.push(item(json!({"type": "MESSAGES_SNAPSHOT", "messages": messages(v)})));
        if let Some(end) = v.state().filter(|s| s.is_terminal()) {
            // Resumed inside the run's last event: the snapshot holds it; end the run.
            out.push(item(run_end(run, end, v.root_transition().and_then(|t| t.reason.as_deref()))));
            return;
        }
        // Start again, under the same ids, what the client will see continue.
        for m in v.messages.iter().filter(|m| m.status == MessageStatus::Streaming) {
            let child = m.child_id.as_deref();
            out.push(item(tagged(
                json!({"type": "TEXT_MESSAGE_START", "messageId": message_id(m), "role": role(m.role)}),
                child,
            )));
            if m.first_reasoning_seq.is_some() {
                out.push(item(tagged(
                    json!({"type": "REASONING_MESSAGE_START", "messageId": reasoning_id(m), "role": "reasoning"}),
                    child,
                )));
            }
        }
        let active = |c: &str| v.child(c).is_some_and(|c| !c.state.is_some_and(RunState::is_terminal));
        for c in v.children.iter().filter(|c| active(&c.child_id)) {
            let mut f = json!({"type": "SUBAGENT_STARTED", "subagentRunId": c.child_id, "name": c.child_id});
            if let Some(p) = &c.prompt {
                f["description"] = p.clone().into();
            }
            // The verifier knows only subagents started in this stream.
            if let Some(p) = c.parent_child_id.as_deref().filter(|p| active(p)) {
                f["parentSubagentRunId"] = p.into();
            }
            out.push(item(f));
        }
    }

    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>) {
        let (e, v) = (step.event, step.view);
        match (&e.body, step.change) {
            (EventBody::MessageStart(_), Change::Message(i)) => {
                let m = &v.messages[i];
                self.push(
                    out,
                    step,
                    "TEXT_MESSAGE_START",
                    json!({"messageId": message_id(m), "role": role(m.role)}),
                );
            }
            (EventBody::TextDelta(d) | EventBody::ReasoningDelta(d), Change::Message(i)) => {
                let m = &v.messages[i];
                // Reasoning first: a resumed client keeps a reasoning message the snapshot
                // does not know yet (`@ag-ui/client` keeps client-only reasoning), so a
                // message opened with it must come after it, as it does on resume.
                if m.first_reasoning_seq == Some(e.seq) {
                    self.push(
                        out,
                        step,
                        "REASONING_MESSAGE_START",
                        json!({"messageId": reasoning_id(m), "role": "reasoning"}),
                    );
                }
                if m.started_seq == e.seq {
                    self.push(
                        out,
                        step,
                        "TEXT_MESSAGE_START",
                        json!({"messageId": message_id(m), "role": role(m.role)}),
                    );
                }
                if matches!(e.body, EventBody::TextDelta(_)) {
                    let mid = message_id(m);
                    let item = ev("TEXT_MESSAGE_CONTENT", step, json!({"messageId": mid, "delta": d.text}));
                    out.push(Out::delta(e.seq, Class::Text, lane(("agui", &mid)), item));
                } else {
                    let rid = reasoning_id(m);
                    let item =
                        ev("REASONING_MESSAGE_CONTENT", step, json!({"messageId": rid, "delta": d.text}));
                    out.push(Out::delta(e.seq, Class::Reasoning, lane(("agui", &rid)), item));
                }
            }
            (EventBody::MessageEnd(_), Change::Message(i)) => {
                let m = &v.messages[i];
                if m.text_from_end() {
                    // A producer that sends the whole text with the end, not as deltas.
                    self.push(
                        out,
                        step,
                        "TEXT_MESSAGE_CONTENT",
                        json!({"messageId": message_id(m), "delta": m.text}),
                    );
                }
                self.end_message(out, step, m);
            }
            (EventBody::ToolStart(_), Change::Tool { tool, .. }) => {
                let t = &v.tools[tool];
                let call = call_id(t);
                let mut start = json!({"toolCallId": call, "toolCallName": t.tool});
                if let Some(m) = parent_message(v, t) {
                    start["parentMessageId"] = m.into();
                }
                self.push(out, step, "TOOL_CALL_START", start);
                self.push(
                    out,
                    step,
                    "TOOL_CALL_ARGS",
                    json!({"toolCallId": call, "delta": args_text(&t.input)}),
                );
                self.push(out, step, "TOOL_CALL_END", json!({"toolCallId": call}));
            }
            (EventBody::ToolEnd(_), Change::Tool { tool, .. }) => self.result(out, step, &v.tools[tool]),
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
                        for c in v.children.iter().filter(|c| !c.state.is_some_and(|s| s.is_terminal())) {
                            self.push(
                                out,
                                step,
                                "SUBAGENT_ERROR",
                                json!({"subagentRunId": c.child_id, "message": "the run ended first", "code": "interrupted"}),
                            );
                        }
                        self.state_delta(out, step, "/lifecycle", json!(l.state));
                        let mut end = run_end(step.run, l.state, l.reason.as_deref());
                        end["timestamp"] = millis(e).into();
                        out.push(Out::control(e.seq, end));
                    }
                }
            }
            (EventBody::Lifecycle(l), _) => {
                self.custom(out, step);
                if e.child_id.is_none() {
                    self.state_delta(out, step, "/lifecycle", json!(l.state));
                }
            }
            (EventBody::PlanProposal(_) | EventBody::PlanDecision(_), _) => {
                self.custom(out, step);
                self.state_delta(out, step, "/plan", json!(v.plan));
            }
            (EventBody::ToolProgress(_), _)
            | (EventBody::CompactionStart(_) | EventBody::CompactionEnd(_), _)
            | (EventBody::Custom { .. }, _) => self.custom(out, step),
            _ => {}
        }
    }

    fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        let Some(b) = next.json() else { return false };
        let ts = b["timestamp"].clone();
        let super::Data::Json(a) = &mut pending.data else { return false };
        a["timestamp"] = ts;
        concat_at(a, b, &["delta"])
    }

    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        data["metadata"] = json!({"agent-stream": {"dropped_count": dropped}});
    }
}
