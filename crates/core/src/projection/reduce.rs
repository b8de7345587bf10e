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

use rustc_hash::FxHashMap;

use super::view::*;
use crate::domain::event::{shared_null, EventBody, Role};
use crate::domain::{Event, Origin, Resolution, RunGuard};

/// Scope key: the run itself is `""`, a child its (non-empty) id. Keying nested maps
/// by `&str` lets every lookup borrow instead of allocating a key.
const ROOT: &str = "";

/// The value for scope `k`, created on first use (allocating the key only then).
fn scoped<'a, V: Default>(map: &'a mut FxHashMap<String, V>, k: &str) -> &'a mut V {
    if !map.contains_key(k) {
        map.insert(k.to_owned(), V::default());
    }
    map.get_mut(k).expect("inserted above")
}

/// All views of one run at `seq`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
#[cfg_attr(feature = "graphql", graphql(name = "RunView"))]
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
    #[cfg_attr(feature = "graphql", graphql(skip))]
    guard: RunGuard,
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    message_ix: FxHashMap<String, FxHashMap<String, usize>>,
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    tool_ix: FxHashMap<String, FxHashMap<String, usize>>,
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    child_ix: FxHashMap<String, usize>,
    /// Indexes of streaming messages per scope, so steps and terminal states touch only
    /// what is open, not every message of the run.
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    open_messages: FxHashMap<String, Vec<usize>>,
    /// Indexes of running tool calls per scope.
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    running_tools: FxHashMap<String, Vec<usize>>,
    /// What the latest terminal lifecycle event interrupted (message and tool indexes),
    /// for [`Change::Lifecycle`] consumers.
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    interrupted: (Vec<usize>, Vec<usize>),
    /// Step boundaries per scope, so a dialect can name the block an event is in
    /// without counting `steps`.
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    step_counts: FxHashMap<String, u32>,
    /// Seq of the run's first plan proposal (the plan's place in a client's list).
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    plan_first_seq: Option<i64>,
    /// Seq of the run's first compaction event (likewise).
    #[serde(skip)]
    #[cfg_attr(feature = "graphql", graphql(skip))]
    compaction_first_seq: Option<i64>,
}

/// What one event changed in a [`RunView`]: indexes into its lists, so consumers (the
/// `runView` subscription, the dialect encoders) render what changed without folding
/// the event a second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing shown changed (custom events).
    Nothing,
    /// The guard refused the event (only in a foreign log); counted in `anomalies`.
    Refused,
    /// A message opened, grew or ended.
    Message(usize),
    /// A tool call started, progressed or ended; a start also adds a block to the
    /// message that was open.
    Tool {
        /// Index in `tools`.
        tool: usize,
        /// Index in `messages` of the message that got a tool-call block.
        message: Option<usize>,
    },
    /// A lifecycle transition (the last in `lifecycle.transitions`); a child's also
    /// changes its `children` entry; a terminal one may interrupt messages and tools
    /// (see [`RunView::interrupted`]).
    Lifecycle {
        /// Index in `children` of the child whose state changed.
        child: Option<usize>,
    },
    /// A step boundary (the last in `steps`).
    Step,
    /// A child was spawned; its parent child (if any) got a new edge.
    Child {
        /// Index in `children`.
        child: usize,
        /// Index in `children` of the spawning child.
        parent: Option<usize>,
    },
    /// The plan was proposed or decided.
    Plan,
    /// Compaction started or ended.
    Compaction,
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

    /// Folds one more event into the view and says what it changed.
    pub fn apply(&mut self, e: &Event) -> Change {
        let child = e.child_id.as_deref();
        let resolution = match self.guard.apply(e.seq, child, &e.body, Origin::Service) {
            Ok(r) => r,
            Err(_) => {
                self.anomalies += 1;
                self.seq = self.seq.max(e.seq);
                return Change::Refused;
            }
        };
        self.seq = e.seq;
        let sk = child.unwrap_or(ROOT);
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
                let ci = child.and_then(|c| self.child_ix.get(c).copied());
                match ci {
                    None => self.lifecycle.state = Some(p.state),
                    Some(i) => self.children[i].state = Some(p.state),
                }
                self.interrupted.0.clear();
                self.interrupted.1.clear();
                if p.state.is_terminal() {
                    self.interrupt(child, e.seq);
                }
                Change::Lifecycle { child: ci }
            }
            EventBody::MessageStart(p) => Change::Message(self.open_message(
                e.child_id.as_ref(),
                p.message_id.clone(),
                p.role,
                false,
                e.seq,
            )),
            EventBody::TextDelta(p) | EventBody::ReasoningDelta(p) => {
                let Resolution::Message { id, implicit } = resolution else { return Change::Nothing };
                let i = match self.message_ix.get(sk).and_then(|m| m.get(id.as_str())) {
                    Some(i) if !implicit => *i,
                    _ => self.open_message(e.child_id.as_ref(), id, Role::Assistant, true, e.seq),
                };
                let kind = if matches!(e.body, EventBody::TextDelta(_)) {
                    BlockKind::Text
                } else {
                    BlockKind::Thinking
                };
                let m = &mut self.messages[i];
                match kind {
                    BlockKind::Text => {
                        m.text.push_str(&p.text);
                        m.first_text_seq.get_or_insert(e.seq);
                    }
                    _ => {
                        m.reasoning.push_str(&p.text);
                        m.first_reasoning_seq.get_or_insert(e.seq);
                    }
                }
                match m.blocks.last_mut() {
                    Some(Block { kind: k, text: Some(t), .. }) if *k == kind => t.push_str(&p.text),
                    _ => m.blocks.push(Block { kind, text: Some(p.text.clone()), call_id: None }),
                }
                Change::Message(i)
            }
            EventBody::MessageEnd(p) => {
                let Resolution::Message { id, .. } = resolution else { return Change::Nothing };
                let Some(i) = self.message_ix.get(sk).and_then(|m| m.get(id.as_str())).copied() else {
                    return Change::Nothing;
                };
                remove_index(self.open_messages.get_mut(sk), i);
                let m = &mut self.messages[i];
                if let Some(text) = &p.text {
                    if m.text.is_empty() && !text.is_empty() {
                        // A non-streaming producer: the end carries the whole content.
                        m.text = text.clone();
                        m.first_text_seq = Some(e.seq);
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
                Change::Message(i)
            }
            EventBody::ToolStart(p) => {
                let message_id = match resolution {
                    Resolution::Message { id, .. } => Some(id),
                    Resolution::None => None,
                };
                let message = message_id
                    .as_ref()
                    .and_then(|mid| self.message_ix.get(sk).and_then(|m| m.get(mid.as_str())).copied());
                if let Some(i) = message {
                    self.messages[i].blocks.push(Block {
                        kind: BlockKind::ToolCall,
                        text: None,
                        call_id: Some(p.call_id.clone()),
                    });
                }
                let i = self.tools.len();
                scoped(&mut self.running_tools, sk).push(i);
                scoped(&mut self.tool_ix, sk).insert(p.call_id.clone(), i);
                self.tools.push(ToolView {
                    call_id: p.call_id.clone(),
                    child_id: e.child_id.clone(),
                    tool: p.tool.clone(),
                    input: p.input.clone(),
                    skill_id: p.skill_id.clone(),
                    status: ToolStatus::Running,
                    progress_count: 0,
                    last_progress: shared_null(),
                    output: shared_null(),
                    error: shared_null(),
                    duration_ms: None,
                    blob_ref: None,
                    message_id,
                    started_seq: e.seq,
                    ended_seq: None,
                });
                Change::Tool { tool: i, message }
            }
            EventBody::ToolProgress(p) => {
                let Some(i) = self.tool_ix.get(sk).and_then(|m| m.get(p.call_id.as_str())).copied() else {
                    return Change::Nothing;
                };
                let t = &mut self.tools[i];
                t.progress_count += 1;
                t.last_progress = p.data.clone();
                Change::Tool { tool: i, message: None }
            }
            EventBody::ToolEnd(p) => {
                let Some(i) = self.tool_ix.get(sk).and_then(|m| m.get(p.call_id.as_str())).copied() else {
                    return Change::Nothing;
                };
                remove_index(self.running_tools.get_mut(sk), i);
                let t = &mut self.tools[i];
                t.status = if p.ok { ToolStatus::Success } else { ToolStatus::Error };
                t.output = p.output.clone();
                t.error = p.error.clone();
                t.duration_ms = p.duration_ms;
                t.blob_ref = p.blob_ref.clone();
                t.ended_seq = Some(e.seq);
                Change::Tool { tool: i, message: None }
            }
            EventBody::StepBoundary(p) => {
                *scoped(&mut self.step_counts, sk) += 1;
                let open_message_ids = self
                    .open_messages
                    .get(sk)
                    .map(|ix| ix.iter().map(|i| self.messages[*i].id.clone()).collect())
                    .unwrap_or_default();
                self.steps.push(StepView {
                    seq: e.seq,
                    ts: e.ts,
                    child_id: e.child_id.clone(),
                    step_index: p.step_index,
                    step_kind: p.step_kind,
                    checkpoint_id: p.checkpoint_id.clone(),
                    open_message_ids,
                });
                Change::Step
            }
            EventBody::ChildSpawn(p) => {
                let parent = child.and_then(|c| self.child_ix.get(c).copied());
                if let Some(pi) = parent {
                    self.children[pi].children.push(p.child_id.clone());
                }
                let ci = self.children.len();
                self.child_ix.insert(p.child_id.clone(), ci);
                self.children.push(ChildView {
                    child_id: p.child_id.clone(),
                    parent_child_id: e.child_id.clone(),
                    prompt: p.prompt.clone(),
                    tools_allowed: p.tools_allowed.clone(),
                    state: None,
                    spawned_seq: e.seq,
                    children: vec![],
                });
                Change::Child { child: ci, parent }
            }
            EventBody::PlanProposal(p) => {
                self.plan_first_seq.get_or_insert(e.seq);
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
                Change::Plan
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
                Change::Plan
            }
            EventBody::CompactionStart(_) => {
                self.compaction_first_seq.get_or_insert(e.seq);
                self.compaction.active = true;
                Change::Compaction
            }
            EventBody::CompactionEnd(p) => {
                self.compaction_first_seq.get_or_insert(e.seq);
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
                Change::Compaction
            }
            EventBody::Custom { .. } => Change::Nothing,
        }
    }

    fn open_message(
        &mut self,
        child: Option<&String>,
        id: String,
        role: Role,
        implicit: bool,
        seq: i64,
    ) -> usize {
        let sk = child.map_or(ROOT, |c| c.as_str());
        let i = self.messages.len();
        self.messages.push(MessageView {
            id: id.clone(),
            child_id: child.cloned(),
            role,
            status: MessageStatus::Streaming,
            blocks: vec![],
            text: String::new(),
            reasoning: String::new(),
            stop_reason: None,
            implicit,
            started_seq: seq,
            ended_seq: None,
            first_text_seq: None,
            first_reasoning_seq: None,
        });
        scoped(&mut self.open_messages, sk).push(i);
        scoped(&mut self.message_ix, sk).insert(id, i);
        i
    }

    /// A terminal state: what is still open in the scope (all scopes, for the run
    /// itself) will never finish.
    fn interrupt(&mut self, child: Option<&str>, seq: i64) {
        let in_scope = |c: &String| child.is_none() || Some(c.as_str()) == child;
        let scopes: Vec<String> = self.open_messages.keys().filter(|s| in_scope(s)).cloned().collect();
        for scope in scopes {
            for i in self.open_messages.remove(&scope).unwrap_or_default() {
                let m = &mut self.messages[i];
                m.status = MessageStatus::Interrupted;
                m.ended_seq = Some(seq);
                self.interrupted.0.push(i);
            }
        }
        let scopes: Vec<String> = self.running_tools.keys().filter(|s| in_scope(s)).cloned().collect();
        for scope in scopes {
            for i in self.running_tools.remove(&scope).unwrap_or_default() {
                let t = &mut self.tools[i];
                t.status = ToolStatus::Interrupted;
                t.ended_seq = Some(seq);
                self.interrupted.1.push(i);
            }
        }
        // Scopes come out of a hash map: sort, so every consumer (and a client rebuilding
        // its state from the view) sees the interrupted in one order, the order they opened.
        self.interrupted.0.sort_unstable();
        self.interrupted.1.sort_unstable();
    }

    /// Messages and tool calls (indexes) the latest terminal lifecycle event
    /// interrupted; empty after any other lifecycle event.
    pub fn interrupted(&self) -> (&[usize], &[usize]) {
        (&self.interrupted.0, &self.interrupted.1)
    }

    /// The run's own lifecycle state.
    pub fn state(&self) -> Option<crate::domain::RunState> {
        self.lifecycle.state
    }

    /// A message by child scope and id.
    pub fn message(&self, child: Option<&str>, id: &str) -> Option<&MessageView> {
        self.message_ix.get(child.unwrap_or(ROOT)).and_then(|m| m.get(id)).map(|i| &self.messages[*i])
    }

    /// Step boundaries seen so far in a scope (the run itself: `None`).
    pub fn steps_in(&self, child: Option<&str>) -> u32 {
        self.step_counts.get(child.unwrap_or(ROOT)).copied().unwrap_or(0)
    }

    /// Seq of the run's first plan proposal.
    pub fn plan_first_seq(&self) -> Option<i64> {
        self.plan_first_seq
    }

    /// Seq of the run's first compaction event.
    pub fn compaction_first_seq(&self) -> Option<i64> {
        self.compaction_first_seq
    }

    /// The run's own latest transition (not a child's).
    pub fn root_transition(&self) -> Option<&Transition> {
        self.lifecycle.transitions.iter().rev().find(|t| t.child_id.is_none())
    }

    /// A child by id.
    pub fn child(&self, child_id: &str) -> Option<&ChildView> {
        self.child_ix.get(child_id).map(|i| &self.children[*i])
    }

    /// A tool call by child scope and call id.
    pub fn tool(&self, child: Option<&str>, call_id: &str) -> Option<&ToolView> {
        self.tool_ix.get(child.unwrap_or(ROOT)).and_then(|m| m.get(call_id)).map(|i| &self.tools[*i])
    }

    /// Rough heap size of what the view shows, for cache accounting.
    pub fn approx_bytes(&self) -> usize {
        let msgs: usize = self.messages.iter().map(|m| 200 + m.text.len() * 2 + m.reasoning.len() * 2).sum();
        let tools: usize =
            self.tools.iter().map(|t| 300 + t.input.to_string().len() + t.output.to_string().len()).sum();
        1024 + msgs + tools + self.lifecycle.transitions.len() * 96 + self.steps.len() * 128
    }
}

/// Removes `i` from an index list (open messages or running tools are few; a linear
/// scan beats any structure here).
fn remove_index(list: Option<&mut Vec<usize>>, i: usize) {
    if let Some(list) = list {
        if let Some(pos) = list.iter().position(|x| *x == i) {
            list.remove(pos);
        }
    }
}
