//! The shapes of a run's views. One definition serves every surface: serde gives the
//! JSON of REST, SSE and JSONL; the GraphQL derives give the `Run` fields.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::event::{Decision, PlanStep, Role, SharedValue, StepKind};
use crate::domain::RunState;

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Still receiving deltas.
    Streaming,
    /// Ended normally.
    Complete,
    /// Ended with `stop_reason = "error"`.
    Failed,
    /// Still open when its run (or child) reached a terminal state.
    Interrupted,
}

/// What a content block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Visible text.
    Text,
    /// Reasoning ("thinking").
    Thinking,
    /// A reference to a tool call made while the message was open.
    ToolCall,
}

/// One content block of a message; consecutive deltas of one kind share a block.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
pub struct Block {
    /// Text, thinking or tool call.
    pub kind: BlockKind,
    /// The text of a text or thinking block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The call of a tool-call block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// One logical message: the same bubble live and after a refresh.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "Message"))]
pub struct MessageView {
    /// Message id (producer's, or `msg-<seq>` when opened implicitly by a delta).
    pub id: String,
    /// The child it belongs to, if any.
    pub child_id: Option<String>,
    /// Who speaks (`assistant` for implicitly opened messages).
    pub role: Role,
    /// Streaming, complete, failed or interrupted.
    pub status: MessageStatus,
    /// Content blocks in order.
    pub blocks: Vec<Block>,
    /// All visible text, concatenated.
    pub text: String,
    /// All reasoning, concatenated.
    pub reasoning: String,
    /// Why generation stopped.
    pub stop_reason: Option<String>,
    /// True when a delta opened it without `message.start`.
    pub implicit: bool,
    /// Seq of the event that opened it.
    pub started_seq: i64,
    /// Seq of its `message.end` (or of the terminal lifecycle event that interrupted it).
    pub ended_seq: Option<i64>,
    /// Seq of its first visible text: a text delta, or the end that carried the whole
    /// text. Dialects open a text part there, live and when they rebuild a client's
    /// state from the view on resume, so both agree on where the part sits.
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    pub first_text_seq: Option<i64>,
    /// Seq of its first reasoning delta (see `first_text_seq`).
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    pub first_reasoning_seq: Option<i64>,
}

impl MessageView {
    /// True when the text came whole with `message.end`, not as deltas.
    pub fn text_from_end(&self) -> bool {
        self.first_text_seq.is_some() && self.first_text_seq == self.ended_seq
    }
}

/// Status of a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// Started, not ended.
    Running,
    /// Ended with `ok = true`.
    Success,
    /// Ended with `ok = false`.
    Error,
    /// Still running when its run (or child) reached a terminal state.
    Interrupted,
}

/// One tool call, by `call_id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "ToolCall"))]
pub struct ToolView {
    /// Correlation id.
    pub call_id: String,
    /// The child it belongs to, if any.
    pub child_id: Option<String>,
    /// Tool name.
    pub tool: String,
    /// Arguments.
    pub input: SharedValue,
    /// Skill that made the call.
    pub skill_id: Option<String>,
    /// Running, success, error or interrupted.
    pub status: ToolStatus,
    /// Number of `tool.progress` events.
    pub progress_count: u32,
    /// Data of the latest `tool.progress`.
    pub last_progress: SharedValue,
    /// Result.
    pub output: SharedValue,
    /// Error code or object.
    pub error: SharedValue,
    /// Wall time reported by the producer.
    pub duration_ms: Option<u64>,
    /// Where a large output is stored.
    pub blob_ref: Option<String>,
    /// The message that was open when the call started.
    pub message_id: Option<String>,
    /// Seq of `tool.start`.
    pub started_seq: i64,
    /// Seq of `tool.end` (or of the terminal event that interrupted it).
    pub ended_seq: Option<i64>,
}

/// A decision on a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
pub struct PlanDecisionView {
    /// Approved or rejected.
    pub decision: Decision,
    /// Why.
    pub reason: Option<String>,
    /// Key id of whoever decided.
    pub decided_by: Option<String>,
    /// Seq of the `plan.decision` event.
    pub seq: i64,
}

/// The current plan of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "Plan"))]
pub struct PlanView {
    /// Plan id.
    pub id: String,
    /// The child that proposed it, if any.
    pub child_id: Option<String>,
    /// Steps in order.
    pub steps: Vec<PlanStep>,
    /// Estimated total cost (given, or the sum of the steps' estimates).
    pub est_total_cost_usd: Option<f64>,
    /// Seq of the proposal.
    pub proposed_seq: i64,
    /// How many proposals the run has made so far (re-plans included).
    pub proposals: u32,
    /// The decision, once made.
    pub decision: Option<PlanDecisionView>,
}

/// One lifecycle change.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "LifecycleTransition"))]
pub struct Transition {
    /// Seq of the `run.lifecycle` event.
    pub seq: i64,
    /// When it happened.
    pub ts: DateTime<Utc>,
    /// Set when a child's lifecycle changed.
    pub child_id: Option<String>,
    /// Previous state (null for the first).
    pub from: Option<RunState>,
    /// New state.
    pub to: RunState,
    /// Why.
    pub reason: Option<String>,
}

/// The run's lifecycle.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "Lifecycle"))]
pub struct LifecycleView {
    /// The run's current state (null before its first `run.lifecycle`).
    pub state: Option<RunState>,
    /// Every transition of the run and its children, in order.
    pub transitions: Vec<Transition>,
}

/// A step boundary.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "Step"))]
pub struct StepView {
    /// Seq of the `step.boundary`.
    pub seq: i64,
    /// When.
    pub ts: DateTime<Utc>,
    /// The child whose step ended, if any.
    pub child_id: Option<String>,
    /// Index of the step.
    pub step_index: u32,
    /// Kind of step.
    pub step_kind: StepKind,
    /// Checkpoint captured.
    pub checkpoint_id: Option<String>,
    /// Messages of the same scope still open at the boundary; they continue in the next step.
    pub open_message_ids: Vec<String>,
}

/// A spawned child (sub-run inside this run's log).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "ChildRun"))]
pub struct ChildView {
    /// Child id.
    pub child_id: String,
    /// The child that spawned it (null: the run itself).
    pub parent_child_id: Option<String>,
    /// Its instructions.
    pub prompt: Option<String>,
    /// Tools it may use.
    pub tools_allowed: Option<Vec<String>>,
    /// Its lifecycle state.
    pub state: Option<RunState>,
    /// Seq of `child.spawn`.
    pub spawned_seq: i64,
    /// Ids of the children it spawned, in order (the tree's edges).
    pub children: Vec<String>,
}

/// Statistics of one compaction (seed 000's CompactionStats).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
pub struct CompactionStats {
    /// Messages removed.
    pub removed: u64,
    /// Messages kept.
    pub kept: u64,
    /// Tokens freed.
    pub tokens_removed: Option<u64>,
    /// Tokens remaining.
    pub tokens_kept: Option<u64>,
    /// Trigger.
    pub reason: String,
    /// Seq of `compaction.end`.
    pub seq: i64,
}

/// Compaction state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "Compaction"))]
pub struct CompactionView {
    /// True between `compaction.start` and `compaction.end`.
    pub active: bool,
    /// Compactions completed.
    pub count: u32,
    /// Tokens freed by all compactions.
    pub tokens_removed_total: u64,
    /// The most recent compaction's statistics.
    pub last: Option<CompactionStats>,
}
