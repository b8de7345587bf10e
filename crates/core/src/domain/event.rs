//! The canonical event: seed 004's envelope with a typed payload for the brief's vocabulary.
//!
//! On the wire an event is `{id, ts, type, run_id, child_id, seq, payload}`. In Rust the
//! `type` and `payload` pair is one [`EventBody`] variant, so a consumer matches once and
//! never re-parses. Payload structs refuse unknown fields: a typo in a producer's field
//! name is an error at append time, not a silently missing value in every view.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use ulid::Ulid;

use super::lifecycle::RunState;

/// Prefix shared by every producer-defined event type (`custom.<name>`).
pub const CUSTOM_PREFIX: &str = "custom.";

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The human (or calling system) side.
    User,
    /// The agent.
    Assistant,
    /// Instructions injected by the runtime.
    System,
}

/// `run.lifecycle`: one event per state change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// The state entered.
    pub state: RunState,
    /// Why, for people ("user clicked pause").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `message.start`: a logical message (one bubble) opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MessageStart {
    /// Producer-chosen id, unique within the run (or child).
    pub message_id: String,
    /// Who speaks.
    pub role: Role,
}

/// `message.end`: the message is complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MessageEnd {
    /// The message to end; absent means the current open message of the run or child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Why generation stopped (`end_turn`, `max_tokens`, `tool_use`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The full text; must equal the accumulated text when deltas were sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// `text.delta` and `reasoning.delta`: a piece of visible text or of thinking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// The piece of text.
    pub text: String,
    /// The message it belongs to; absent means the current open message (opened implicitly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// A JSON value of a payload (tool input, progress data, output, error), shared between
/// the log's event and the views that show it. Folding a run used to deep-copy each one
/// into the view: a third of the view's memory in the generated mixed run (294 → 196 MiB,
/// docs/benchmarks-log.md, `bench fold`).
pub type SharedValue = std::sync::Arc<Value>;

fn is_null(v: &SharedValue) -> bool {
    v.is_null()
}

/// JSON `null` as a [`SharedValue`], without an allocation per call.
pub fn shared_null() -> SharedValue {
    static NULL: std::sync::LazyLock<SharedValue> = std::sync::LazyLock::new(SharedValue::default);
    NULL.clone()
}

/// `tool.start`: a tool invocation begins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolStart {
    /// Correlates start, progress and end.
    pub call_id: String,
    /// The tool's name (`browser.navigate`).
    pub tool: String,
    /// The call's arguments.
    #[serde(default = "shared_null", skip_serializing_if = "is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub input: SharedValue,
    /// The versioned skill the call comes from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_id: Option<String>,
}

/// `tool.progress`: intermediate data from a running tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolProgress {
    /// The running call.
    pub call_id: String,
    /// Whatever the tool reports.
    #[serde(default = "shared_null", skip_serializing_if = "is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub data: SharedValue,
}

/// `tool.end`: the invocation completed, successfully or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolEnd {
    /// The call that ended.
    pub call_id: String,
    /// Success flag.
    pub ok: bool,
    /// The result (may be omitted on error or when large; see `blob_ref`).
    #[serde(default = "shared_null", skip_serializing_if = "is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub output: SharedValue,
    /// An error code or object when `ok` is false.
    #[serde(default = "shared_null", skip_serializing_if = "is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub error: SharedValue,
    /// Wall time of the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Where a large output is stored instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob_ref: Option<String>,
}

/// The kinds of step seed 004 names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Planning.
    Plan,
    /// Model call plus the tool calls it asked for.
    ToolRoundtrip,
    /// Model call producing text only.
    TextOnly,
    /// The parent dispatched sub-runs.
    FanOut,
    /// The parent merged sub-run results.
    FanIn,
    /// The final step.
    Done,
}

/// `step.boundary`: the agent finished a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StepBoundary {
    /// Index of the step that finished.
    pub step_index: u32,
    /// What kind of step it was.
    pub step_kind: StepKind,
    /// Checkpoint captured at the boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
}

/// `child.spawn`: the run dispatches a sub-run whose events follow with `child_id` set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ChildSpawn {
    /// The child's id, used as `child_id` on its events.
    pub child_id: String,
    /// The child's instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Tools the child may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_allowed: Option<Vec<String>>,
}

/// The intent of a plan step, for the UI's icon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Gathering information.
    Research,
    /// Creating new content.
    Write,
    /// Changing existing content.
    Edit,
    /// Running something.
    Execute,
    /// Checking results.
    Verify,
    /// Reporting back.
    Report,
    /// Anything else.
    Other,
}

/// One step of a proposed plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "PlanStep"))]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// Step id within the plan.
    pub id: String,
    /// What the step does, for people.
    pub title: String,
    /// What kind of work it is.
    pub intent: Intent,
    /// Tools it expects to use.
    #[serde(default)]
    pub est_tools: Vec<String>,
    /// Estimated cost.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "exact_f64")]
    pub est_cost_usd: Option<f64>,
}

/// A plan as proposed for review.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Plan id, named again by the decision.
    pub id: String,
    /// The run it was made for (informational; the envelope's run_id is authoritative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The steps in order.
    pub steps: Vec<PlanStep>,
    /// Estimated total cost.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "exact_f64")]
    pub est_total_cost_usd: Option<f64>,
}

/// A float field that keeps exactly what it was sent: a number a 64-bit float cannot
/// hold (`0.30000000000000004441`, a 30-digit integer) is refused rather than rounded,
/// and the value is written as PostgreSQL's `jsonb` returns it, so a stored event and a
/// retried one compare equal.
mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(f) => {
                let text = format!("{f:?}");
                let canon = crate::domain::text::canonical_number(&text).ok().flatten().unwrap_or(text);
                match serde_json::from_str::<serde_json::Number>(&canon) {
                    Ok(n) => s.serialize_some(&n),
                    Err(_) => s.serialize_some(f),
                }
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        use serde::de::Error;
        let Some(n) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
        let f: f64 = n.as_str().parse().map_err(D::Error::custom)?;
        if !crate::domain::text::same_value(n.as_str(), f) {
            return Err(D::Error::custom(format!(
                "{} is not exactly a 64-bit float (which keeps about 17 significant digits); send it rounded",
                crate::domain::text::echo(n.as_str())
            )));
        }
        Ok(Some(f))
    }
}

/// `plan.proposal`: the agent proposes a plan for human review.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanProposal {
    /// The plan.
    pub plan: Plan,
}

/// What a user decided about a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Go ahead.
    Approved,
    /// Re-plan.
    Rejected,
}

/// `plan.decision`: written by the service when a user decides; producers may not send it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PlanDecision {
    /// The proposal decided on.
    pub plan_id: String,
    /// The decision.
    pub decision: Decision,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The API key id that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

/// `compaction.start`: context compaction has begun.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompactionStart {
    /// What triggered it, if known up front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `compaction.end`: compaction finished, with seed 000's statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompactionEnd {
    /// Messages removed.
    pub removed: u64,
    /// Messages kept.
    pub kept: u64,
    /// Estimated tokens freed (absent in count mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_removed: Option<u64>,
    /// Estimated tokens remaining (absent in count mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_kept: Option<u64>,
    /// What triggered it: `tokens`, `count` or `summary`.
    pub reason: String,
}

/// The `type` and typed `payload` of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// `run.lifecycle`
    Lifecycle(Lifecycle),
    /// `message.start`
    MessageStart(MessageStart),
    /// `message.end`
    MessageEnd(MessageEnd),
    /// `text.delta`
    TextDelta(Delta),
    /// `reasoning.delta`
    ReasoningDelta(Delta),
    /// `tool.start`
    ToolStart(ToolStart),
    /// `tool.progress`
    ToolProgress(ToolProgress),
    /// `tool.end`
    ToolEnd(ToolEnd),
    /// `step.boundary`
    StepBoundary(StepBoundary),
    /// `child.spawn`
    ChildSpawn(ChildSpawn),
    /// `plan.proposal`
    PlanProposal(PlanProposal),
    /// `plan.decision`
    PlanDecision(PlanDecision),
    /// `compaction.start`
    CompactionStart(CompactionStart),
    /// `compaction.end`
    CompactionEnd(CompactionEnd),
    /// `custom.<name>`: stored and streamed, never projected.
    Custom {
        /// The part after `custom.`.
        name: String,
        /// Any JSON.
        payload: Value,
    },
}

/// Every built-in event type name, in the brief's order.
pub const EVENT_TYPES: &[&str] = &[
    "run.lifecycle",
    "message.start",
    "message.end",
    "text.delta",
    "reasoning.delta",
    "tool.start",
    "tool.progress",
    "tool.end",
    "step.boundary",
    "child.spawn",
    "plan.proposal",
    "plan.decision",
    "compaction.start",
    "compaction.end",
];

/// Why a `type`/`payload` pair could not become an [`EventBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The type is not in the vocabulary.
    UnknownType(String),
    /// The payload does not fit the type's shape.
    InvalidPayload(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::UnknownType(t) => write!(
                f,
                "unknown event type `{t}`; expected one of {} or `custom.<name>`",
                EVENT_TYPES.join(", ")
            ),
            BodyError::InvalidPayload(m) => f.write_str(m),
        }
    }
}

fn typed<T: serde::de::DeserializeOwned>(type_name: &str, payload: Value) -> Result<T, BodyError> {
    serde_json::from_value(payload)
        .map_err(|e| BodyError::InvalidPayload(format!("invalid `{type_name}` payload: {e}")))
}

/// A custom name is a non-empty token of letters, digits and `_ - . :`.
fn valid_custom_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// True for a `type` a stored event can have: one of [`EVENT_TYPES`] or a valid
/// `custom.<name>` (filters refuse anything else rather than match nothing).
pub fn is_event_type(name: &str) -> bool {
    EVENT_TYPES.contains(&name) || name.strip_prefix(CUSTOM_PREFIX).is_some_and(valid_custom_name)
}

impl EventBody {
    /// Builds a typed body from the wire's `type` and `payload`.
    pub fn parse(type_name: &str, payload: Value) -> Result<Self, BodyError> {
        use EventBody::*;
        Ok(match type_name {
            "run.lifecycle" => Lifecycle(typed(type_name, payload)?),
            "message.start" => MessageStart(typed(type_name, payload)?),
            "message.end" => MessageEnd(typed(type_name, payload)?),
            "text.delta" => TextDelta(typed(type_name, payload)?),
            "reasoning.delta" => ReasoningDelta(typed(type_name, payload)?),
            "tool.start" => ToolStart(typed(type_name, payload)?),
            "tool.progress" => ToolProgress(typed(type_name, payload)?),
            "tool.end" => ToolEnd(typed(type_name, payload)?),
            "step.boundary" => StepBoundary(typed(type_name, payload)?),
            "child.spawn" => ChildSpawn(typed(type_name, payload)?),
            "plan.proposal" => PlanProposal(typed(type_name, payload)?),
            "plan.decision" => PlanDecision(typed(type_name, payload)?),
            "compaction.start" => CompactionStart(typed(type_name, payload)?),
            "compaction.end" => CompactionEnd(typed(type_name, payload)?),
            other => match other.strip_prefix(CUSTOM_PREFIX) {
                Some(name) if valid_custom_name(name) => Custom { name: name.to_owned(), payload },
                Some(_) => {
                    return Err(BodyError::InvalidPayload(format!(
                        "invalid custom event type `{other}`: the name after `custom.` must be 1-128 \
                         letters, digits or `_-.:`"
                    )))
                }
                None => return Err(BodyError::UnknownType(super::text::echo(other))),
            },
        })
    }

    /// The wire `type`, e.g. `tool.start` or `custom.heartbeat`.
    pub fn type_name(&self) -> std::borrow::Cow<'static, str> {
        use std::borrow::Cow::Borrowed;
        use EventBody::*;
        match self {
            Lifecycle(_) => Borrowed("run.lifecycle"),
            MessageStart(_) => Borrowed("message.start"),
            MessageEnd(_) => Borrowed("message.end"),
            TextDelta(_) => Borrowed("text.delta"),
            ReasoningDelta(_) => Borrowed("reasoning.delta"),
            ToolStart(_) => Borrowed("tool.start"),
            ToolProgress(_) => Borrowed("tool.progress"),
            ToolEnd(_) => Borrowed("tool.end"),
            StepBoundary(_) => Borrowed("step.boundary"),
            ChildSpawn(_) => Borrowed("child.spawn"),
            PlanProposal(_) => Borrowed("plan.proposal"),
            PlanDecision(_) => Borrowed("plan.decision"),
            CompactionStart(_) => Borrowed("compaction.start"),
            CompactionEnd(_) => Borrowed("compaction.end"),
            Custom { name, .. } => std::borrow::Cow::Owned(format!("{CUSTOM_PREFIX}{name}")),
        }
    }

    /// The payload as JSON, in its canonical form (absent optionals omitted).
    pub fn payload(&self) -> Value {
        if let EventBody::Custom { payload, .. } = self {
            return payload.clone();
        }
        serde_json::to_value(PayloadRef(self)).unwrap_or_else(|e| serialisation_bug(e, Value::Null))
    }

    /// [`EventBody::payload`] as JSON text, written straight from the typed payload (the
    /// append path stores this; building a `Value` first would be a second conversion).
    pub fn payload_text(&self) -> String {
        serde_json::to_string(&PayloadRef(self)).unwrap_or_else(|e| serialisation_bug(e, "null".to_owned()))
    }

    /// Length of [`EventBody::payload_text`], counted without building it: what a
    /// page of events holds, for byte limits on buffers.
    pub fn payload_len(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += b.len();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut n = Count(0);
        let _ = serde_json::to_writer(&mut n, &PayloadRef(self));
        n.0
    }

    /// True for the control-plane events that SSE never batches or drops.
    pub fn is_control(&self) -> bool {
        !matches!(self, EventBody::TextDelta(_) | EventBody::ReasoningDelta(_) | EventBody::Custom { .. })
    }
}

/// Serialises a body's payload (one match for both [`EventBody::payload`] forms).
struct PayloadRef<'a>(&'a EventBody);

impl Serialize for PayloadRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use EventBody::*;
        match self.0 {
            Lifecycle(p) => p.serialize(s),
            MessageStart(p) => p.serialize(s),
            MessageEnd(p) => p.serialize(s),
            TextDelta(p) | ReasoningDelta(p) => p.serialize(s),
            ToolStart(p) => p.serialize(s),
            ToolProgress(p) => p.serialize(s),
            ToolEnd(p) => p.serialize(s),
            StepBoundary(p) => p.serialize(s),
            ChildSpawn(p) => p.serialize(s),
            PlanProposal(p) => p.serialize(s),
            PlanDecision(p) => p.serialize(s),
            CompactionStart(p) => p.serialize(s),
            CompactionEnd(p) => p.serialize(s),
            Custom { payload, .. } => payload.serialize(s),
        }
    }
}

/// Serialising plain structs of strings, numbers and Values cannot fail; a failure would
/// be a bug in this file, so surface it loudly in debug builds.
fn serialisation_bug<T>(e: serde_json::Error, fallback: T) -> T {
    debug_assert!(false, "payload serialisation failed: {e}");
    fallback
}

/// A stored event: the envelope the service assigns plus the producer's body.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// ULID, monotonic per run.
    pub id: Ulid,
    /// Server time of the append, millisecond precision.
    pub ts: DateTime<Utc>,
    /// The run whose log holds the event.
    pub run_id: String,
    /// Set when the event comes from a sub-run dispatched with `child.spawn`.
    pub child_id: Option<String>,
    /// Per-run gapless position, from 1.
    pub seq: i64,
    /// Type and payload.
    pub body: EventBody,
    /// The message a message event, delta or `tool.start` resolved to when it was
    /// appended (server-derived, stored beside the event; not part of the envelope).
    /// `None` for other events and for events not read from the log.
    pub message_id: Option<String>,
}

impl Event {
    /// True for the run's own terminal lifecycle event: nothing follows it in the log.
    pub fn is_run_end(&self) -> bool {
        self.child_id.is_none() && matches!(&self.body, EventBody::Lifecycle(l) if l.state.is_terminal())
    }

    /// The envelope as JSON text, byte for byte what `Serialize` writes with
    /// `serde_json` (a test holds the two equal).
    pub fn to_json(&self) -> Vec<u8> {
        // The envelope is ~150 bytes: one allocation for it and a short payload.
        let mut out = Vec::with_capacity(256);
        self.write_json(&mut out);
        out
    }

    /// [`Event::to_json`], appended to `out`. Written field by field because every live
    /// event is rendered once per page: through serde's map machinery each key and each
    /// value went through the string escaper, and the envelope (ULID, time, seq, the
    /// vocabulary's names) needs none; it was ~5% of a streamed line's instructions
    /// (docs/benchmarks-log.md, 2026-12-06 06:16). The payload still goes through serde.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut ulid = [0u8; ulid::ULID_LEN];
        out.extend_from_slice(b"{\"id\":\"");
        out.extend_from_slice(self.id.array_to_str(&mut ulid).as_bytes());
        out.extend_from_slice(b"\",\"ts\":");
        match millis_text(&self.ts) {
            Some(text) => {
                out.push(b'"');
                out.extend_from_slice(&text);
                out.push(b'"');
            }
            None => json_str(out, &self.ts.to_rfc3339_opts(SecondsFormat::Millis, true)),
        }
        out.extend_from_slice(b",\"type\":");
        json_str(out, &self.body.type_name());
        out.extend_from_slice(b",\"run_id\":");
        json_str(out, &self.run_id);
        out.extend_from_slice(b",\"child_id\":");
        match &self.child_id {
            Some(c) => json_str(out, c),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"seq\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
        out.extend_from_slice(b",\"payload\":");
        if let Err(e) = serde_json::to_writer(&mut *out, &PayloadRef(&self.body)) {
            serialisation_bug(e, ());
            out.extend_from_slice(b"null");
        }
        out.push(b'}');
    }
}

/// `s` as a JSON string: copied between quotes when nothing in it needs an escape (ids,
/// names), else through serde_json's escaper, so the text is serde_json's either way.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else if let Err(e) = serde_json::to_writer(&mut *out, s) {
        serialisation_bug(e, ());
    }
}

/// The envelope as it appears on the wire, as read.
#[derive(Deserialize)]
struct Wire<'a> {
    id: Ulid,
    ts: DateTime<Utc>,
    #[serde(rename = "type")]
    type_name: std::borrow::Cow<'a, str>,
    run_id: std::borrow::Cow<'a, str>,
    child_id: Option<std::borrow::Cow<'a, str>>,
    seq: i64,
    payload: Value,
}

/// The envelope as written: the payload straight from its type, as the append path
/// stores it ([`EventBody::payload_text`]), rather than through a `Value` built for
/// the purpose (a live event is written once per page and dialect; the `Value` and its
/// map were half of the envelope's cost).
#[derive(Serialize)]
struct WireOut<'a> {
    id: Ulid,
    #[serde(serialize_with = "ts_millis")]
    ts: DateTime<Utc>,
    #[serde(rename = "type")]
    type_name: std::borrow::Cow<'a, str>,
    run_id: &'a str,
    child_id: Option<&'a str>,
    seq: i64,
    payload: PayloadRef<'a>,
}

fn ts_millis<S: Serializer>(ts: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    match millis_text(ts) {
        Some(text) => s.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?),
        None => s.serialize_str(&ts.to_rfc3339_opts(SecondsFormat::Millis, true)),
    }
}

/// `ts` as `to_rfc3339_opts(SecondsFormat::Millis, true)` writes it
/// (`2026-11-30T21:05:09.042Z`), for years 0 to 9999 (`None` outside them): written
/// digit by digit because chrono's formatter, with its allocation, cost a live event
/// about as much as the rest of its envelope.
fn millis_text(ts: &DateTime<Utc>) -> Option<[u8; 24]> {
    use chrono::{Datelike, Timelike};
    let year = u32::try_from(ts.year()).ok().filter(|y| *y <= 9999)?;
    // A leap second shows as second 60 in chrono's text as well.
    let (second, nanos) = match ts.nanosecond() {
        n if n >= 1_000_000_000 => (ts.second() + 1, n - 1_000_000_000),
        n => (ts.second(), n),
    };
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u32| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, ts.month());
    put(8, 2, ts.day());
    put(11, 2, ts.hour());
    put(14, 2, ts.minute());
    put(17, 2, second);
    put(20, 3, nanos / 1_000_000);
    Some(out)
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireOut {
            id: self.id,
            ts: self.ts,
            type_name: self.body.type_name(),
            run_id: &self.run_id,
            child_id: self.child_id.as_deref(),
            seq: self.seq,
            payload: PayloadRef(&self.body),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        let body = EventBody::parse(&w.type_name, w.payload).map_err(D::Error::custom)?;
        Ok(Event {
            id: w.id,
            ts: w.ts,
            run_id: w.run_id.into_owned(),
            child_id: w.child_id.map(|c| c.into_owned()),
            seq: w.seq,
            body,
            message_id: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn millis_text_is_chronos() {
        use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
        let mut times: Vec<DateTime<Utc>> = vec![
            DateTime::UNIX_EPOCH,
            Utc::now(),
            NaiveDate::from_ymd_opt(9999, 12, 31)
                .unwrap()
                .and_hms_milli_opt(23, 59, 59, 999)
                .unwrap()
                .and_utc(),
            NaiveDate::from_ymd_opt(2016, 12, 31)
                .unwrap()
                .and_hms_milli_opt(23, 59, 59, 1_500)
                .unwrap()
                .and_utc(),
            NaiveDate::from_ymd_opt(7, 2, 3).unwrap().and_hms_nano_opt(4, 5, 6, 7_999_999).unwrap().and_utc(),
        ];
        // Every field's digits, over a spread of instants.
        let mut t = 0i64;
        for _ in 0..5_000 {
            t = t.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            times.push(DateTime::from_timestamp_millis(t.rem_euclid(253_402_300_799_999)).unwrap());
        }
        for ts in times {
            let ours = super::millis_text(&ts).expect("a year within 0..=9999");
            assert_eq!(std::str::from_utf8(&ours).unwrap(), ts.to_rfc3339_opts(SecondsFormat::Millis, true));
        }
        let far = NaiveDate::from_ymd_opt(10_000, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap().and_utc();
        assert_eq!(super::millis_text(&far), None);
        let json = serde_json::to_value(
            crate::testkit::stored(&crate::testkit::generated_run_mix(1, 1, 0))[0].clone(),
        )
        .unwrap();
        assert!(json["ts"].as_str().is_some_and(|s| s.len() == 24 && s.ends_with('Z')), "{json}");
    }

    /// The envelope writes each payload as its `Value` reads: what a reader gets is the
    /// stored payload, whichever way it was written.
    #[test]
    fn the_envelope_carries_the_payload() {
        let events = crate::testkit::stored(&crate::testkit::generated_run_mix(3, 2000, 0));
        for e in &events {
            let json = serde_json::to_value(e).expect("json");
            assert_eq!(json["payload"], e.body.payload(), "{}", e.body.type_name());
            let back: super::Event = serde_json::from_value(json).expect("read back");
            assert_eq!(back.body, e.body);
        }
    }

    /// The hand-written envelope is serde's, byte for byte: every kind of event, child
    /// and run ids and custom names that need escapes, times outside four-digit years.
    #[test]
    fn write_json_is_serdes() {
        use chrono::NaiveDate;
        let mut events = crate::testkit::stored(&crate::testkit::generated_run_mix(11, 3000, 0));
        let odd = ["with \"quote\"", "back\\slash", "tab\there", "nl\n", "\u{1}", "é ü ✓", ""];
        let n = events.len();
        for (i, s) in odd.iter().enumerate() {
            let mut e = events[i % n].clone();
            e.run_id = (*s).to_owned();
            e.child_id = Some(format!("c{s}"));
            events.push(e);
        }
        let mut custom = events[0].clone();
        custom.body = super::EventBody::Custom {
            name: "odd\"name".to_owned(),
            payload: serde_json::json!({"a": [1, "\u{7f}"]}),
        };
        events.push(custom);
        for year in [0, 10_000, 262_000] {
            let mut e = events[1].clone();
            e.ts =
                NaiveDate::from_ymd_opt(year, 1, 2).unwrap().and_hms_milli_opt(3, 4, 5, 6).unwrap().and_utc();
            events.push(e);
        }
        let mut seqs = events[2].clone();
        seqs.seq = i64::MIN;
        events.push(seqs);
        let mut kinds = std::collections::BTreeSet::new();
        let mut escaped = 0;
        for e in &events {
            let ours = e.to_json();
            let serdes = serde_json::to_vec(e).expect("json");
            assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&serdes));
            kinds.insert(e.body.type_name().into_owned());
            escaped += usize::from(ours.windows(2).any(|w| w[0] == b'\\'));
        }
        assert!(kinds.len() >= 10, "the generated run covers most kinds: {kinds:?}");
        // Those of `odd` that need an escape, and the custom name.
        let needing = odd.iter().filter(|s| s.chars().any(|c| c < ' ' || c == '"' || c == '\\')).count() + 1;
        assert!(escaped >= needing, "the escaping path ran: {escaped} of {needing}");
    }

    /// The text the append path stores is the same JSON as the payload every reader
    /// gets, for every kind of event.
    #[test]
    fn payload_text_is_the_payload() {
        let events = crate::testkit::stored(&crate::testkit::generated_run_mix(7, 3000, 0));
        let mut kinds = std::collections::BTreeSet::new();
        for e in &events {
            let parsed: serde_json::Value = serde_json::from_str(&e.body.payload_text()).expect("json");
            assert_eq!(parsed, e.body.payload(), "{}", e.body.type_name());
            kinds.insert(e.body.type_name().into_owned());
        }
        assert!(kinds.len() >= 10, "the generated run covers most kinds: {kinds:?}");
    }
}
