//! Reference clients for the resume tests: what a client of each dialect holds after
//! reading a stream's items.
//!
//! - [`Generic`], for the exact dialects: every control item, in order, and per lane
//!   what its deltas add up to (their text concatenated, or for multica's snapshots the
//!   latest one). A repeated or lost delta, or a repeated control item, shows.
//! - [`AguiClient`]: `@ag-ui/client`'s default apply, for the events this service
//!   sends (messages built from starts, contents, tool calls and results, replaced by
//!   id from a `MESSAGES_SNAPSHOT`; state from snapshots and deltas).
//! - [`VercelClient`]: the `ai` package's `processUIMessageStream` for our chunks, with
//!   `DefaultChatTransport`'s replay rule (a `start` resets the message).
//!
//! The Node tests check the AG-UI and AI SDK models against the real packages.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{Class, Format, Lane, Out};

/// What a client of `format` holds after `items`, continuing `state` (a client that
/// resumes keeps what it had).
pub fn fold(format: Format, state: &mut Client, items: &[Out]) {
    for o in items {
        match state {
            Client::Generic(g) => g.apply(format, o),
            Client::Agui(a) => {
                if let Some(v) = o.to_json() {
                    a.apply(&v)
                }
            }
            Client::Vercel(c) => {
                if let Some(v) = o.to_json() {
                    c.apply(&v)
                }
            }
        }
    }
}

/// A new client of `format`.
pub fn client(format: Format) -> Client {
    match format {
        Format::Agui => Client::Agui(AguiClient::default()),
        Format::Vercel => Client::Vercel(VercelClient::default()),
        _ => Client::Generic(Generic::default()),
    }
}

/// A client's state (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Client {
    /// Control items and lanes.
    Generic(Generic),
    /// `@ag-ui/client`'s messages and state.
    Agui(AguiClient),
    /// The AI SDK's UI message.
    Vercel(VercelClient),
}

/// Control items in order, and what each lane's deltas add up to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generic {
    /// Every control item's JSON, in order.
    pub controls: Vec<Value>,
    /// Per lane: the concatenated delta text (multica: the latest snapshot).
    pub lanes: BTreeMap<Lane, Value>,
}

/// Where a dialect's delta keeps its text.
fn delta_path(format: Format, v: &Value) -> &'static [&'static str] {
    match format {
        Format::Native => &["payload", "text"],
        Format::Chunks => &["payload", "content", "text"],
        Format::Hier => &["props", "content"],
        Format::Typed if v["type"] == "tool_progress" => &["data"],
        Format::Typed => &["content"],
        _ => &["delta"],
    }
}

impl Generic {
    fn apply(&mut self, format: Format, o: &Out) {
        let Some(v) = o.to_json() else { return };
        match (o.class, o.lane) {
            (Class::Control, _) | (_, None) => {
                // Merging and `dropped_count` change the terminal item's extras only.
                let mut v = v;
                if let Some(p) = v.get_mut("payload").and_then(Value::as_object_mut) {
                    p.remove("dropped_count");
                }
                self.controls.push(v)
            }
            (_, Some(lane)) if format == Format::Multica => {
                self.lanes.insert(lane, v);
            }
            (_, Some(lane)) => {
                let piece =
                    super::pointer(&v, delta_path(format, &v)).and_then(Value::as_str).unwrap_or_default();
                let entry = self.lanes.entry(lane).or_insert_with(|| json!(""));
                if let Value::String(s) = entry {
                    s.push_str(piece);
                }
            }
        }
    }
}

/// `@ag-ui/client`'s `defaultApplyEvents`, for the events this service sends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AguiClient {
    /// `agent.messages`.
    pub messages: Vec<Value>,
    /// `agent.state`.
    pub state: Value,
}

fn with_subagent(mut m: Value, e: &Value) -> Value {
    if let Some(s) = e.get("subagentRunId").filter(|s| !s.is_null()) {
        m["subagentRunId"] = s.clone();
    }
    m
}

impl AguiClient {
    fn find(&mut self, id: &Value) -> Option<&mut Value> {
        self.messages.iter_mut().find(|m| &m["id"] == id)
    }

    fn append(&mut self, id: &Value, field: &str, e: &Value) {
        if let Some(m) = self.find(id) {
            let s =
                m[field].as_str().unwrap_or_default().to_owned() + e["delta"].as_str().unwrap_or_default();
            m[field] = s.into();
        }
    }

    /// Applies one event.
    pub fn apply(&mut self, e: &Value) {
        match e["type"].as_str().unwrap_or_default() {
            "STATE_SNAPSHOT" => self.state = e["snapshot"].clone(),
            "STATE_DELTA" => {
                for op in e["delta"].as_array().into_iter().flatten() {
                    let key = op["path"].as_str().unwrap_or_default().trim_start_matches('/');
                    self.state[key] = op["value"].clone();
                }
            }
            "MESSAGES_SNAPSHOT" => {
                let snap: Vec<Value> = e["messages"].as_array().cloned().unwrap_or_default();
                let has_reasoning = snap.iter().any(|m| m["role"] == "reasoning");
                let by_id = |id: &Value| snap.iter().find(|m| &m["id"] == id).cloned();
                let mut kept: Vec<Value> = self
                    .messages
                    .iter()
                    .filter(|m| by_id(&m["id"]).is_some() || (m["role"] == "reasoning" && !has_reasoning))
                    .map(|m| by_id(&m["id"]).unwrap_or_else(|| m.clone()))
                    .collect();
                for m in &snap {
                    if !kept.iter().any(|k| k["id"] == m["id"]) {
                        kept.push(m.clone());
                    }
                }
                self.messages = kept;
            }
            "TEXT_MESSAGE_START" if self.find(&e["messageId"]).is_none() => {
                let role = if e["role"].is_null() { json!("assistant") } else { e["role"].clone() };
                self.messages
                    .push(with_subagent(json!({"id": e["messageId"], "role": role, "content": ""}), e));
            }
            "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT" => {
                let id = e["messageId"].clone();
                self.append(&id, "content", e);
            }
            "REASONING_MESSAGE_START" if self.find(&e["messageId"]).is_none() => {
                let m = json!({"id": e["messageId"], "role": "reasoning", "content": ""});
                self.messages.push(with_subagent(m, e));
            }
            "TOOL_CALL_START" => {
                let id = &e["toolCallId"];
                let owned =
                    |m: &Value| m["toolCalls"].as_array().is_some_and(|c| c.iter().any(|c| &c["id"] == id));
                if self.messages.iter().any(owned) {
                    return;
                }
                let call = json!({"id": id, "type": "function", "function": {"name": e["toolCallName"], "arguments": ""}});
                let parent = e["parentMessageId"].clone();
                let target = (!parent.is_null())
                    .then(|| self.messages.iter().position(|m| m["id"] == parent && m["role"] == "assistant"))
                    .flatten();
                match target {
                    Some(i) => match self.messages[i].get_mut("toolCalls").and_then(Value::as_array_mut) {
                        Some(c) => c.push(call),
                        None => self.messages[i]["toolCalls"] = json!([call]),
                    },
                    None => {
                        let mid = if parent.is_null() { id.clone() } else { parent };
                        let m = json!({"id": mid, "role": "assistant", "toolCalls": [call]});
                        self.messages.push(with_subagent(m, e));
                    }
                }
            }
            "TOOL_CALL_ARGS" => {
                let id = e["toolCallId"].clone();
                for m in &mut self.messages {
                    for c in m.get_mut("toolCalls").and_then(Value::as_array_mut).into_iter().flatten() {
                        if c["id"] == id {
                            let s = c["function"]["arguments"].as_str().unwrap_or_default().to_owned()
                                + e["delta"].as_str().unwrap_or_default();
                            c["function"]["arguments"] = s.into();
                        }
                    }
                }
            }
            "TOOL_CALL_RESULT" => {
                let id = e["toolCallId"].clone();
                let role = if e["role"].is_null() { json!("tool") } else { e["role"].clone() };
                let msg = with_subagent(
                    json!({"id": e["messageId"], "toolCallId": id, "role": role, "content": e["content"]}),
                    e,
                );
                let owner = self.messages.iter().position(|m| {
                    m["role"] == "assistant"
                        && m["toolCalls"].as_array().is_some_and(|c| c.iter().any(|c| c["id"] == id))
                });
                match owner {
                    Some(o) => {
                        let mut at = o + 1;
                        while at < self.messages.len() && self.messages[at]["role"] == "tool" {
                            at += 1;
                        }
                        self.messages.insert(at, msg);
                    }
                    None => self.messages.push(msg),
                }
            }
            _ => {}
        }
    }
}

/// The AI SDK's `processUIMessageStream` for our chunks (one assistant message).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VercelClient {
    /// The message's id.
    pub id: Value,
    /// Its parts.
    pub parts: Vec<Value>,
    active: BTreeMap<String, usize>,
}

impl VercelClient {
    /// Applies one chunk.
    pub fn apply(&mut self, c: &Value) {
        let id = c["id"].as_str().unwrap_or_default().to_owned();
        match c["type"].as_str().unwrap_or_default() {
            "start" => {
                // DefaultChatTransport's resumed stream is a replay: start afresh.
                *self = VercelClient { id: c["messageId"].clone(), ..Default::default() };
            }
            "start-step" => self.parts.push(json!({"type": "step-start"})),
            t @ ("text-start" | "reasoning-start") => {
                let kind = if t == "text-start" { "text" } else { "reasoning" };
                self.active.insert(format!("{kind}/{id}"), self.parts.len());
                self.parts.push(json!({"type": kind, "text": "", "state": "streaming"}));
            }
            t @ ("text-delta" | "reasoning-delta" | "text-end" | "reasoning-end") => {
                let kind = if t.starts_with("text") { "text" } else { "reasoning" };
                let key = format!("{kind}/{id}");
                let Some(&i) = self.active.get(&key) else {
                    self.parts.push(json!({"error": format!("{t} for a part that is not open: {id}")}));
                    return;
                };
                if t.ends_with("-end") {
                    self.parts[i]["state"] = "done".into();
                    self.active.remove(&key);
                } else {
                    let s = self.parts[i]["text"].as_str().unwrap_or_default().to_owned()
                        + c["delta"].as_str().unwrap_or_default();
                    self.parts[i]["text"] = s.into();
                }
            }
            "tool-input-available" => {
                let part = json!({"type": "dynamic-tool", "toolCallId": c["toolCallId"], "toolName": c["toolName"], "state": "input-available", "input": c["input"]});
                match self.parts.iter().position(|p| p["toolCallId"] == c["toolCallId"]) {
                    Some(i) => self.parts[i] = part,
                    None => self.parts.push(part),
                }
            }
            t @ ("tool-output-available" | "tool-output-error") => {
                let Some(p) = self.parts.iter_mut().find(|p| p["toolCallId"] == c["toolCallId"]) else {
                    self.parts.push(json!({"error": format!("{t} for an unknown tool call")}));
                    return;
                };
                // The SDK sets all three on every update (absent ones to undefined).
                if let Some(p) = p.as_object_mut() {
                    for k in ["output", "preliminary", "errorText"] {
                        p.remove(k);
                    }
                }
                if t == "tool-output-available" {
                    p["state"] = "output-available".into();
                    p["output"] = c["output"].clone();
                    if !c["preliminary"].is_null() {
                        p["preliminary"] = c["preliminary"].clone();
                    }
                } else {
                    p["state"] = "output-error".into();
                    p["errorText"] = c["errorText"].clone();
                }
            }
            t if t.starts_with("data-") => {
                if c["transient"] == true {
                    return;
                }
                let part = json!({"type": t, "id": c["id"], "data": c["data"]});
                match self
                    .parts
                    .iter()
                    .position(|p| p["type"] == t && !c["id"].is_null() && p["id"] == c["id"])
                {
                    Some(i) => self.parts[i] = part,
                    None => self.parts.push(part),
                }
            }
            _ => {}
        }
    }
}
