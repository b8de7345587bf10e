//! View updates: what each event changed, as snapshots of the changed records, each
//! with the seq that produced it. Built from the reducer's [`Change`], never by folding
//! again.
//!
//! A client rebuilds the `run` query's view at any seq by folding updates in order:
//! `SNAPSHOT` replaces the whole view; `MESSAGE`, `TOOL` and `CHILD` upsert by
//! `(childId, id)`, `(childId, callId)` and `childId`, appending new ones at the end;
//! `TRANSITION` appends to `lifecycle.transitions` and sets `lifecycle.state` to
//! `runState`; `STEP` appends; `PLAN` and `COMPACTION` replace; `SEQ` changes nothing else.
//! Every update sets the view's `seq`, so every event yields at least one update.

use std::sync::Arc;

use serde::Serialize;

use super::reduce::{Change, RunView};
use super::view::*;
use crate::domain::RunState;

/// Which record an update carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum UpdateKind {
    /// The whole view (first update of a subscription that asked for a snapshot).
    Snapshot,
    /// A message, as it is now.
    Message,
    /// A tool call, as it is now.
    Tool,
    /// The plan, as it is now.
    Plan,
    /// A new lifecycle transition.
    Transition,
    /// A new step boundary.
    Step,
    /// A child run, as it is now.
    Child,
    /// The compaction state, as it is now.
    Compaction,
    /// An event that changed no record (a custom event): only the view's seq moves.
    Seq,
}

/// One change to a run's view, with the seq of the event that made it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::SimpleObject))]
pub struct ViewUpdate {
    /// Seq of the event that made the change (several updates may share one).
    pub seq: i64,
    /// Which record this carries.
    pub kind: UpdateKind,
    /// `SNAPSHOT`: the whole view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view: Option<Arc<RunView>>,
    /// `MESSAGE`: the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<MessageView>,
    /// `TOOL`: the tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolView>,
    /// `PLAN`: the plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanView>,
    /// `TRANSITION`: the transition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transition: Option<Transition>,
    /// `TRANSITION`: the run's own state after it (unchanged by a child's transition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state: Option<RunState>,
    /// `STEP`: the step boundary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepView>,
    /// `CHILD`: the child run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<ChildView>,
    /// `COMPACTION`: the compaction state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionView>,
}

impl ViewUpdate {
    fn new(seq: i64, kind: UpdateKind) -> ViewUpdate {
        ViewUpdate {
            seq,
            kind,
            view: None,
            message: None,
            tool: None,
            plan: None,
            transition: None,
            run_state: None,
            step: None,
            child: None,
            compaction: None,
        }
    }

    /// The whole view as one update.
    pub fn snapshot(view: Arc<RunView>) -> ViewUpdate {
        ViewUpdate { view: Some(view.clone()), ..ViewUpdate::new(view.seq, UpdateKind::Snapshot) }
    }

    fn of_message(seq: i64, m: &MessageView) -> ViewUpdate {
        ViewUpdate { message: Some(m.clone()), ..ViewUpdate::new(seq, UpdateKind::Message) }
    }

    fn of_tool(seq: i64, t: &ToolView) -> ViewUpdate {
        ViewUpdate { tool: Some(t.clone()), ..ViewUpdate::new(seq, UpdateKind::Tool) }
    }

    fn of_child(seq: i64, c: &ChildView) -> ViewUpdate {
        ViewUpdate { child: Some(c.clone()), ..ViewUpdate::new(seq, UpdateKind::Child) }
    }
}

/// The updates for `change`, which the event at `seq` made to `view` (already applied).
pub fn updates(view: &RunView, seq: i64, change: Change) -> Vec<ViewUpdate> {
    match change {
        Change::Nothing | Change::Refused => vec![ViewUpdate::new(seq, UpdateKind::Seq)],
        Change::Message(i) => vec![ViewUpdate::of_message(seq, &view.messages[i])],
        Change::Tool { tool, message } => {
            let mut out: Vec<ViewUpdate> =
                message.map(|i| ViewUpdate::of_message(seq, &view.messages[i])).into_iter().collect();
            out.push(ViewUpdate::of_tool(seq, &view.tools[tool]));
            out
        }
        Change::Lifecycle { child } => {
            let mut out = vec![ViewUpdate {
                transition: view.lifecycle.transitions.last().cloned(),
                run_state: view.lifecycle.state,
                ..ViewUpdate::new(seq, UpdateKind::Transition)
            }];
            out.extend(child.map(|i| ViewUpdate::of_child(seq, &view.children[i])));
            let (messages, tools) = view.interrupted();
            out.extend(messages.iter().map(|i| ViewUpdate::of_message(seq, &view.messages[*i])));
            out.extend(tools.iter().map(|i| ViewUpdate::of_tool(seq, &view.tools[*i])));
            out
        }
        Change::Step => {
            vec![ViewUpdate { step: view.steps.last().cloned(), ..ViewUpdate::new(seq, UpdateKind::Step) }]
        }
        Change::Child { child, parent } => {
            let mut out: Vec<ViewUpdate> =
                parent.map(|i| ViewUpdate::of_child(seq, &view.children[i])).into_iter().collect();
            out.push(ViewUpdate::of_child(seq, &view.children[child]));
            out
        }
        Change::Plan => {
            vec![ViewUpdate { plan: view.plan.clone(), ..ViewUpdate::new(seq, UpdateKind::Plan) }]
        }
        Change::Compaction => vec![ViewUpdate {
            compaction: Some(view.compaction.clone()),
            ..ViewUpdate::new(seq, UpdateKind::Compaction)
        }],
    }
}
