//! The reducer: one pure fold from a run's ordered events to its [`RunView`].
//!
//! `apply` takes one event; folding a log is applying its events in seq order, so the
//! incremental view and the batch view are the same function of the same prefix.
//! No I/O and no clock: times come from the events.
//!
//! Legality and message resolution are not decided here but by the append-side
//! [`RunGuard`], which the view carries along: the view asks the guard what each event
//! means (which message a delta joins) and renders the answer. An event the guard
//! refuses cannot be in a log agent-stream wrote; if one appears anyway (a foreign log),
//! it leaves the view unchanged and is counted in `anomalies`.
//!
//! Edge cases, as defined here (each has a named test in `reduce_tests`):
//! - a delta without `message_id` joins the current (most recently opened, still open)
//!   message of its run or child; with none open it opens `msg-<seq>`, role assistant;
//! - `message.end` whose `text` differs from the streamed text is refused at append
//!   (MESSAGE-TEXT-MISMATCH); with no streamed text, the end's text is the content;
//! - an empty message (start, end, no deltas) is a complete message with no blocks;
//! - messages of several children interleave freely: each child has its own current
//!   message, and blocks never cross children;
//! - a step boundary with a message still open records the open ids; the message stays
//!   streaming and continues into the next step;
//! - a terminal lifecycle event (done, aborted, error) of the run marks every message
//!   still streaming and every tool call still running `interrupted`; of a child, only
//!   that child's;
//! - a plan decided twice: the second decision is refused at append (PLAN-NOT-PENDING),
//!   so the view keeps the first;
//! - compaction: `active` between start and end; each end adds its stats to `last` and
//!   its `tokens_removed` to the total.

use std::collections::HashMap;

use super::view::*;
use crate::domain::event::{EventBody, Role};
use crate::domain::{Event, Origin, Resolution, RunGuard};

type Scope = Option<String>;

/// All views of one run at `seq`.
#[derive(Debug, Clone, Default, serde::Serialize, async_graphql::SimpleObject)]
#[graphql(name = "RunView")]
pub struct RunView {
    /// Seq of the last event folded in (0 for an empty run).
    pub seq: i64,
    /// Lifecycle state and transitions.
    pub lifecycle: LifecycleView,
    /// Messages in the order they were opened.
    pub messages: Vec<MessageView>,
    /// Tool calls in the order they started.
    pub tools: Vec<ToolView>,
    /// The latest plan.
    pub plan: Option<PlanView>,
    /// Step boundaries in order.
    pub steps: Vec<StepView>,
    /// Spawned children in spawn order; `children`/`parent_child_id` form the tree.
    pub children: Vec<ChildView>,
    /// Compaction state.
    pub compaction: CompactionView,
    /// Events the guard refused (never in a log written by agent-stream).
    pub anomalies: u64,
    #[serde(skip)]
    #[graphql(skip)]
    guard: RunGuard,
    #[serde(skip)]
    #[graphql(skip)]
    message_ix: HashMap<(Scope, String), usize>,
    #[serde(skip)]
    #[graphql(skip)]
    tool_ix: HashMap<(Scope, String), usize>,
    #[serde(skip)]
    #[graphql(skip)]
    child_ix: HashMap<String, usize>,
}

impl PartialEq for RunView {
    /// Views are equal when everything they show is equal; indexes and the guard are
    /// derived from the same events and are not compared.
    fn eq(&self, o: &Self) -> bool {
        self.seq == o.seq
            && self.lifecycle == o.lifecycle
            && self.messages == o.messages
            && self.tools == o.tools
            && self.plan == o.plan
            && self.steps == o.steps
            && self.children == o.children
            && self.compaction == o.compaction
            && self.anomalies == o.anomalies
    }
}

impl RunView {
    /// The view of a run with no events.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds a whole ordered log.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut v = Self::new();
        for e in events {
            v.apply(e);
        }
        v
    }

    /// Folds one more event into the view.
    pub fn apply(&mut self, e: &Event) {
        let child = e.child_id.as_deref();
        let resolution = match self.guard.apply(e.seq, child, &e.body, Origin::Service) {
            Ok(r) => r,
            Err(_) => {
                self.anomalies += 1;
                self.seq = self.seq.max(e.seq);
                return;
            }
        };
        self.seq = e.seq;
        let scope: Scope = e.child_id.clone();
        match &e.body {
            EventBody::Lifecycle(p) => {
                let from = match child {
                    None => self.lifecycle.state,
                    Some(c) => self.child_ix.get(c).and_then(|i| self.children[*i].state),
                };
                self.lifecycle.transitions.push(Transition {
                    seq: e.seq,
                    ts: e.ts,
                    child_id: e.child_id.clone(),
                    from,
                    to: p.state,
                    reason: p.reason.clone(),
                });
                match child {
                    None => self.lifecycle.state = Some(p.state),
                    Some(c) => {
                        if let Some(i) = self.child_ix.get(c) {
                            self.children[*i].state = Some(p.state);
                        }
                    }
                }
                if p.state.is_terminal() {
                    self.interrupt(child, e.seq);
                }
            }
            EventBody::MessageStart(p) => {
                self.open_message(scope, p.message_id.clone(), p.role, false, e.seq);
            }
            EventBody::TextDelta(p) | EventBody::ReasoningDelta(p) => {
                let Resolution::Message { id, implicit } = resolution else { return };
                let i = match self.message_ix.get(&(scope.clone(), id.clone())) {
                    Some(i) if !implicit => *i,
                    _ => self.open_message(scope, id, Role::Assistant, true, e.seq),
                };
                let kind = if matches!(e.body, EventBody::TextDelta(_)) {
                    BlockKind::Text
                } else {
                    BlockKind::Thinking
                };
                let m = &mut self.messages[i];
                match kind {
                    BlockKind::Text => m.text.push_str(&p.text),
                    _ => m.reasoning.push_str(&p.text),
                }
                match m.blocks.last_mut() {
                    Some(Block { kind: k, text: Some(t), .. }) if *k == kind => t.push_str(&p.text),
                    _ => m.blocks.push(Block { kind, text: Some(p.text.clone()), call_id: None }),
                }
            }
            EventBody::MessageEnd(p) => {
                let Resolution::Message { id, .. } = resolution else { return };
                if let Some(i) = self.message_ix.get(&(scope, id)).copied() {
                    let m = &mut self.messages[i];
                    if let Some(text) = &p.text {
                        if m.text.is_empty() && !text.is_empty() {
                            // A non-streaming producer: the end carries the whole content.
                            m.text = text.clone();
                            m.blocks.push(Block {
                                kind: BlockKind::Text,
                                text: Some(text.clone()),
                                call_id: None,
                            });
                        }
                    }
                    m.stop_reason = p.stop_reason.clone();
                    m.status = if p.stop_reason.as_deref() == Some("error") {
                        MessageStatus::Failed
                    } else {
                        MessageStatus::Complete
                    };
                    m.ended_seq = Some(e.seq);
                }
            }
            EventBody::ToolStart(p) => {
                let message_id = match resolution {
                    Resolution::Message { id, .. } => Some(id),
                    Resolution::None => None,
                };
                if let Some(mid) = &message_id {
                    if let Some(i) = self.message_ix.get(&(scope.clone(), mid.clone())) {
                        self.messages[*i].blocks.push(Block {
                            kind: BlockKind::ToolCall,
                            text: None,
                            call_id: Some(p.call_id.clone()),
                        });
                    }
                }
                self.tool_ix.insert((scope, p.call_id.clone()), self.tools.len());
                self.tools.push(ToolView {
                    call_id: p.call_id.clone(),
                    child_id: e.child_id.clone(),
                    tool: p.tool.clone(),
                    input: p.input.clone(),
                    skill_id: p.skill_id.clone(),
                    status: ToolStatus::Running,
                    progress_count: 0,
                    last_progress: serde_json::Value::Null,
                    output: serde_json::Value::Null,
                    error: serde_json::Value::Null,
                    duration_ms: None,
                    blob_ref: None,
                    message_id,
                    started_seq: e.seq,
                    ended_seq: None,
                });
            }
            EventBody::ToolProgress(p) => {
                if let Some(i) = self.tool_ix.get(&(scope, p.call_id.clone())) {
                    let t = &mut self.tools[*i];
                    t.progress_count += 1;
                    t.last_progress = p.data.clone();
                }
            }
            EventBody::ToolEnd(p) => {
                if let Some(i) = self.tool_ix.get(&(scope, p.call_id.clone())) {
                    let t = &mut self.tools[*i];
                    t.status = if p.ok { ToolStatus::Success } else { ToolStatus::Error };
                    t.output = p.output.clone();
                    t.error = p.error.clone();
                    t.duration_ms = p.duration_ms;
                    t.blob_ref = p.blob_ref.clone();
                    t.ended_seq = Some(e.seq);
                }
            }
            EventBody::StepBoundary(p) => {
                let open_message_ids = self
                    .messages
                    .iter()
                    .filter(|m| m.status == MessageStatus::Streaming && m.child_id == e.child_id)
                    .map(|m| m.id.clone())
                    .collect();
                self.steps.push(StepView {
                    seq: e.seq,
                    ts: e.ts,
                    child_id: e.child_id.clone(),
                    step_index: p.step_index,
                    step_kind: p.step_kind,
                    checkpoint_id: p.checkpoint_id.clone(),
                    open_message_ids,
                });
            }
            EventBody::ChildSpawn(p) => {
                if let Some(parent) = child.and_then(|c| self.child_ix.get(c)) {
                    self.children[*parent].children.push(p.child_id.clone());
                }
                self.child_ix.insert(p.child_id.clone(), self.children.len());
                self.children.push(ChildView {
                    child_id: p.child_id.clone(),
                    parent_child_id: e.child_id.clone(),
                    prompt: p.prompt.clone(),
                    tools_allowed: p.tools_allowed.clone(),
                    state: None,
                    spawned_seq: e.seq,
                    children: vec![],
                });
            }
            EventBody::PlanProposal(p) => {
                let proposals = self.plan.as_ref().map_or(0, |pl| pl.proposals) + 1;
                let est_total_cost_usd = p.plan.est_total_cost_usd.or_else(|| {
                    let costs: Vec<f64> = p.plan.steps.iter().filter_map(|s| s.est_cost_usd).collect();
                    (!costs.is_empty()).then(|| costs.iter().sum())
                });
                self.plan = Some(PlanView {
                    id: p.plan.id.clone(),
                    child_id: e.child_id.clone(),
                    steps: p.plan.steps.clone(),
                    est_total_cost_usd,
                    proposed_seq: e.seq,
                    proposals,
                    decision: None,
                });
            }
            EventBody::PlanDecision(p) => {
                if let Some(plan) = self.plan.as_mut().filter(|pl| pl.id == p.plan_id) {
                    plan.decision = Some(PlanDecisionView {
                        decision: p.decision,
                        reason: p.reason.clone(),
                        decided_by: p.decided_by.clone(),
                        seq: e.seq,
                    });
                }
            }
            EventBody::CompactionStart(_) => self.compaction.active = true,
            EventBody::CompactionEnd(p) => {
                let c = &mut self.compaction;
                c.active = false;
                c.count += 1;
                c.tokens_removed_total += p.tokens_removed.unwrap_or(0);
                c.last = Some(CompactionStats {
                    removed: p.removed,
                    kept: p.kept,
                    tokens_removed: p.tokens_removed,
                    tokens_kept: p.tokens_kept,
                    reason: p.reason.clone(),
                    seq: e.seq,
                });
            }
            EventBody::Custom { .. } => {}
        }
    }

    fn open_message(&mut self, scope: Scope, id: String, role: Role, implicit: bool, seq: i64) -> usize {
        let i = self.messages.len();
        self.messages.push(MessageView {
            id: id.clone(),
            child_id: scope.clone(),
            role,
            status: MessageStatus::Streaming,
            blocks: vec![],
            text: String::new(),
            reasoning: String::new(),
            stop_reason: None,
            implicit,
            started_seq: seq,
            ended_seq: None,
        });
        self.message_ix.insert((scope, id), i);
        i
    }

    /// A terminal state: what is still open in the scope (all scopes, for the run
    /// itself) will never finish.
    fn interrupt(&mut self, child: Option<&str>, seq: i64) {
        let in_scope = |c: &Option<String>| child.is_none() || c.as_deref() == child;
        for m in
            self.messages.iter_mut().filter(|m| m.status == MessageStatus::Streaming && in_scope(&m.child_id))
        {
            m.status = MessageStatus::Interrupted;
            m.ended_seq = Some(seq);
        }
        for t in self.tools.iter_mut().filter(|t| t.status == ToolStatus::Running && in_scope(&t.child_id)) {
            t.status = ToolStatus::Interrupted;
            t.ended_seq = Some(seq);
        }
    }

    /// The run's own lifecycle state.
    pub fn state(&self) -> Option<crate::domain::RunState> {
        self.lifecycle.state
    }

    /// A message by child scope and id.
    pub fn message(&self, child: Option<&str>, id: &str) -> Option<&MessageView> {
        self.message_ix.get(&(child.map(str::to_owned), id.to_owned())).map(|i| &self.messages[*i])
    }

    /// A tool call by child scope and call id.
    pub fn tool(&self, child: Option<&str>, call_id: &str) -> Option<&ToolView> {
        self.tool_ix.get(&(child.map(str::to_owned), call_id.to_owned())).map(|i| &self.tools[*i])
    }

    /// Rough heap size of what the view shows, for cache accounting.
    pub fn approx_bytes(&self) -> usize {
        let msgs: usize = self.messages.iter().map(|m| 200 + m.text.len() * 2 + m.reasoning.len() * 2).sum();
        let tools: usize =
            self.tools.iter().map(|t| 300 + t.input.to_string().len() + t.output.to_string().len()).sum();
        1024 + msgs + tools + self.lifecycle.transitions.len() * 96 + self.steps.len() * 128
    }
}
