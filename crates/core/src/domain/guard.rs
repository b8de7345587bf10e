//! The append-side state machine: which event may follow which in a run's log.
//!
//! The guard holds only what validation needs (states, open message ids, tool call
//! states, pending plans), never message text: an open message keeps the length and a
//! running FNV-1a hash of its text, enough to check `message.end.text` against what was
//! streamed without holding the text itself.
//!
//! Its maps are persistent (`imbl`), so cloning a guard is O(1). The append path applies
//! a batch to a clone and keeps the clone only when the whole batch passed and the
//! transaction committed; a rejected batch leaves the original untouched.
//!
//! The guard also *resolves* events: a delta without `message_id` belongs to the current
//! open message of its run or child, opened implicitly when there is none. That
//! resolution is returned to the caller so the projection uses the very same rule.

use std::sync::Arc;

use imbl::Vector;
use rustc_hash::FxBuildHasher;

/// Persistent map (O(1) clone) with a fast hasher: keys are producer ids, and a
/// guard is private to the service, so flooding resistance buys nothing here.
type PMap<K, V> = imbl::HashMap<K, V, FxBuildHasher>;

use super::event::EventBody;
use super::lifecycle::RunState;
use crate::error::{ErrorCode, Rejection};

/// Who is appending: producers may not write service-only events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// An agent runtime over HTTP or GraphQL.
    Producer,
    /// The service itself (plan decisions, control mutations).
    Service,
}

/// What an event refers to once implicit rules are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Nothing to resolve.
    None,
    /// The event belongs to this message (for `tool.start`: the call was made while this
    /// message was the current open one of its scope).
    Message {
        /// The message id (producer-given, or `msg-<seq>` when opened implicitly).
        id: String,
        /// True when this event opened the message implicitly.
        implicit: bool,
    },
}

/// Ids are shared (`Arc<str>`), not owned strings: every append applies to a clone of
/// the cached guard, so the first change to a map copies the nodes on its path, keys
/// included, and a copied `String` key is an allocation (up to 32 per node in a run
/// with many messages or tool calls) where an `Arc` is a count.
#[derive(Debug, Clone, Default)]
struct ScopeState {
    state: Option<RunState>,
    /// Open message ids, most recently opened last: the last is "the current open message".
    open: Vector<Arc<str>>,
    pending_plan: Option<Arc<str>>,
    messages: PMap<Arc<str>, Msg>,
    tools: PMap<Arc<str>, Tool>,
}

#[derive(Debug, Clone, Copy)]
enum Msg {
    Open { text_len: usize, text_hash: u64 },
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Running,
    Ended,
}

/// Validation state of one run's log after `last_seq` events.
#[derive(Debug, Clone)]
pub struct RunGuard {
    last_seq: i64,
    /// The run's own scope, kept out of the map: every event checks it.
    root: ScopeState,
    children: PMap<Arc<str>, ScopeState>,
}

impl Default for RunGuard {
    fn default() -> Self {
        Self::new()
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

impl RunGuard {
    /// The guard of a run with no events.
    pub fn new() -> Self {
        RunGuard { last_seq: 0, root: ScopeState::default(), children: PMap::default() }
    }

    /// Seq of the last event applied.
    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }

    /// The run's own lifecycle state (`None` until its first `run.lifecycle`).
    pub fn state(&self) -> Option<RunState> {
        self.root.state
    }

    /// The plan awaiting a decision in the run (`child` = None) or a child, if any.
    pub fn pending_plan(&self, child: Option<&str>) -> Option<&str> {
        match child {
            None => self.root.pending_plan.as_deref(),
            Some(c) => self.children.get(c).and_then(|s| s.pending_plan.as_deref()),
        }
    }

    /// The lifecycle state of a child scope.
    pub fn child_state(&self, child: &str) -> Option<RunState> {
        self.children.get(child).and_then(|s| s.state)
    }

    /// Checks `body` as the event at `seq` and, if it is legal, records it.
    ///
    /// On error the guard may be partly updated; callers apply batches to a clone.
    pub fn apply(
        &mut self,
        seq: i64,
        child_id: Option<&str>,
        body: &EventBody,
        origin: Origin,
    ) -> Result<Resolution, Rejection> {
        self.check_open(child_id)?;
        if let EventBody::ChildSpawn(p) = body {
            if self.children.contains_key(p.child_id.as_str()) {
                return Err(Rejection::new(
                    ErrorCode::ChildDuplicate,
                    format!("child `{}` was already spawned", p.child_id),
                ));
            }
            self.children.insert(p.child_id.as_str().into(), ScopeState::default());
            self.last_seq = seq;
            return Ok(Resolution::None);
        }
        let name = || scope_name(child_id);
        let sc = match child_id {
            None => &mut self.root,
            Some(c) => match self.children.get_mut(c) {
                Some(sc) => sc,
                // check_open guarantees the scope exists.
                None => return Err(Rejection::new(ErrorCode::ChildUnknown, "unknown child")),
            },
        };
        let res = match body {
            EventBody::Lifecycle(p) => {
                if !RunState::can_move(sc.state, p.state) {
                    let from = sc.state.map_or("new", RunState::as_str);
                    let allowed: Vec<&str> =
                        RunState::successors(sc.state).iter().map(|s| s.as_str()).collect();
                    return Err(Rejection::new(
                        ErrorCode::LifecycleIllegal,
                        format!(
                            "{} cannot move from `{from}` to `{}`; allowed next states: {}",
                            name(),
                            p.state,
                            if allowed.is_empty() { "none".to_owned() } else { allowed.join(", ") }
                        ),
                    ));
                }
                sc.state = Some(p.state);
                if p.state.is_terminal() {
                    // Later events of this scope are refused by check_open, so open
                    // messages need no closing here; the projection marks them interrupted.
                    sc.open.clear();
                    sc.pending_plan = None;
                }
                Resolution::None
            }
            EventBody::MessageStart(p) => {
                if sc.messages.contains_key(p.message_id.as_str()) {
                    return Err(Rejection::new(
                        ErrorCode::MessageDuplicate,
                        format!("message `{}` was already started", p.message_id),
                    ));
                }
                let id: Arc<str> = p.message_id.as_str().into();
                sc.messages.insert(id.clone(), Msg::Open { text_len: 0, text_hash: FNV_OFFSET });
                sc.open.push_back(id);
                Resolution::Message { id: p.message_id.clone(), implicit: false }
            }
            EventBody::TextDelta(p) | EventBody::ReasoningDelta(p) => {
                let (id, implicit) = delta_target(sc, seq, p.message_id.as_deref())?;
                if let EventBody::TextDelta(_) = body {
                    if let Some(Msg::Open { text_len, text_hash }) = sc.messages.get_mut(id.as_str()) {
                        *text_len += p.text.len();
                        *text_hash = fnv1a(*text_hash, p.text.as_bytes());
                    }
                }
                Resolution::Message { id, implicit }
            }
            EventBody::MessageEnd(p) => {
                let id = match &p.message_id {
                    Some(id) => id.clone(),
                    None => sc.open.last().map(|id| id.to_string()).ok_or_else(|| {
                        Rejection::new(
                            ErrorCode::MessageUnknown,
                            format!("`message.end` without message_id, but {} has no open message", name()),
                        )
                    })?,
                };
                match sc.messages.get(id.as_str()) {
                    None => {
                        return Err(Rejection::new(
                            ErrorCode::MessageUnknown,
                            format!("message `{id}` was never started"),
                        ))
                    }
                    Some(Msg::Closed) => return Err(ended_message(&id)),
                    Some(Msg::Open { text_len, text_hash }) => {
                        if let Some(text) = &p.text {
                            // With no streamed text the end's text *is* the content (a
                            // non-streaming producer); otherwise it must match exactly.
                            if *text_len > 0
                                && (*text_len != text.len()
                                    || *text_hash != fnv1a(FNV_OFFSET, text.as_bytes()))
                            {
                                return Err(Rejection::new(
                                    ErrorCode::MessageTextMismatch,
                                    format!(
                                        "`message.end.text` of `{id}` ({} bytes) differs from the {text_len} bytes of text streamed for it",
                                        text.len()
                                    ),
                                ));
                            }
                        }
                    }
                }
                if let Some(m) = sc.messages.get_mut(id.as_str()) {
                    *m = Msg::Closed;
                }
                if let Some(pos) = sc.open.iter().rposition(|m| **m == *id) {
                    sc.open.remove(pos);
                }
                Resolution::Message { id, implicit: false }
            }
            EventBody::ToolStart(p) => {
                if sc.tools.contains_key(p.call_id.as_str()) {
                    return Err(Rejection::new(
                        ErrorCode::ToolDuplicateCall,
                        format!("tool call `{}` was already started", p.call_id),
                    ));
                }
                sc.tools.insert(p.call_id.as_str().into(), Tool::Running);
                match sc.open.last() {
                    Some(id) => Resolution::Message { id: id.to_string(), implicit: false },
                    None => Resolution::None,
                }
            }
            EventBody::ToolProgress(p) => {
                running_tool(sc, &p.call_id, "tool.progress")?;
                Resolution::None
            }
            EventBody::ToolEnd(p) => {
                running_tool(sc, &p.call_id, "tool.end")?;
                if let Some(t) = sc.tools.get_mut(p.call_id.as_str()) {
                    *t = Tool::Ended;
                }
                Resolution::None
            }
            EventBody::PlanProposal(p) => {
                sc.pending_plan = Some(p.plan.id.as_str().into());
                Resolution::None
            }
            EventBody::PlanDecision(p) => {
                if origin == Origin::Producer {
                    return Err(Rejection::new(
                        ErrorCode::Reserved,
                        "`plan.decision` is written by the service when a user approves or rejects a plan; producers cannot append it",
                    ));
                }
                if sc.pending_plan.as_deref() != Some(p.plan_id.as_str()) {
                    return Err(Rejection::new(
                        ErrorCode::PlanNotPending,
                        format!("plan `{}` is not awaiting a decision", p.plan_id),
                    ));
                }
                sc.pending_plan = None;
                Resolution::None
            }
            EventBody::ChildSpawn(_)
            | EventBody::StepBoundary(_)
            | EventBody::CompactionStart(_)
            | EventBody::CompactionEnd(_)
            | EventBody::Custom { .. } => Resolution::None,
        };
        self.last_seq = seq;
        Ok(res)
    }

    /// Refuses anything after the run, or the event's child, reached a terminal state.
    fn check_open(&self, child: Option<&str>) -> Result<(), Rejection> {
        if let Some(st) = self.state().filter(|s| s.is_terminal()) {
            return Err(Rejection::new(
                ErrorCode::RunClosed,
                format!("the run ended with state `{st}`; nothing can be appended after it"),
            ));
        }
        if let Some(child) = child {
            match self.children.get(child) {
                None => {
                    return Err(Rejection::new(
                        ErrorCode::ChildUnknown,
                        format!("child `{child}` was never spawned; send `child.spawn` first"),
                    ))
                }
                Some(s) => {
                    if let Some(st) = s.state.filter(|st| st.is_terminal()) {
                        let msg =
                            format!("child `{child}` ended with state `{st}`; nothing can be appended to it");
                        return Err(Rejection::new(ErrorCode::RunClosed, msg));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Finds (or implicitly opens) the message a delta belongs to.
fn delta_target(sc: &mut ScopeState, seq: i64, explicit: Option<&str>) -> Result<(String, bool), Rejection> {
    let id = match explicit {
        Some(id) => match sc.messages.get(id) {
            Some(Msg::Open { .. }) => return Ok((id.to_owned(), false)),
            Some(Msg::Closed) => return Err(ended_message(id)),
            None => id.to_owned(),
        },
        None => match sc.open.last() {
            Some(id) => return Ok((id.to_string(), false)),
            None => format!("msg-{seq}"),
        },
    };
    if sc.messages.contains_key(id.as_str()) {
        // Only reachable when a producer used our implicit id scheme themselves.
        return Err(ended_message(&id));
    }
    let key: Arc<str> = id.as_str().into();
    sc.messages.insert(key.clone(), Msg::Open { text_len: 0, text_hash: FNV_OFFSET });
    sc.open.push_back(key);
    Ok((id, true))
}

fn running_tool(sc: &ScopeState, call_id: &str, what: &str) -> Result<(), Rejection> {
    match sc.tools.get(call_id) {
        Some(Tool::Running) => Ok(()),
        Some(Tool::Ended) => Err(Rejection::new(
            ErrorCode::ToolCallEnded,
            format!("`{what}` for tool call `{call_id}`, which already ended"),
        )),
        None => Err(Rejection::new(
            ErrorCode::ToolUnknownCall,
            format!("`{what}` for tool call `{call_id}`, which was never started"),
        )),
    }
}

fn ended_message(id: &str) -> Rejection {
    Rejection::new(ErrorCode::MessageEnded, format!("message `{id}` already ended"))
}

fn scope_name(child: Option<&str>) -> String {
    match child {
        None => "the run".to_owned(),
        Some(c) => format!("child `{c}`"),
    }
}
