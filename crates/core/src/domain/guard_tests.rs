//! Unit tests of the guard's rules (the integration suite repeats them over HTTP).

use serde_json::json;

use super::event::EventBody;
use super::guard::{Origin, Resolution, RunGuard};
use crate::error::ErrorCode;

fn ev(t: &str, p: serde_json::Value) -> EventBody {
    EventBody::parse(t, p).expect("valid test event")
}

/// Applies `(child, type, payload)` in order; returns the first error's code and index.
fn run(events: &[(Option<&str>, &str, serde_json::Value)]) -> Result<RunGuard, (ErrorCode, usize)> {
    let mut g = RunGuard::new();
    for (i, (child, t, p)) in events.iter().enumerate() {
        g.apply(i as i64 + 1, *child, &ev(t, p.clone()), Origin::Producer).map_err(|r| (r.code, i))?;
    }
    Ok(g)
}

#[test]
fn implicit_message_and_resolution() {
    let mut g = RunGuard::new();
    let r = g.apply(1, None, &ev("text.delta", json!({"text": "a"})), Origin::Producer).unwrap();
    assert_eq!(r, Resolution::Message { id: "msg-1".into(), implicit: true });
    let r = g.apply(2, None, &ev("text.delta", json!({"text": "b"})), Origin::Producer).unwrap();
    assert_eq!(r, Resolution::Message { id: "msg-1".into(), implicit: false });
    g.apply(3, None, &ev("message.end", json!({"text": "ab"})), Origin::Producer).unwrap();
    let e =
        g.apply(4, None, &ev("text.delta", json!({"text": "c", "message_id": "msg-1"})), Origin::Producer);
    assert_eq!(e.unwrap_err().code, ErrorCode::MessageEnded);
}

#[test]
fn end_text_must_match_streamed_text() {
    let bad = run(&[
        (None, "message.start", json!({"message_id": "m", "role": "assistant"})),
        (None, "text.delta", json!({"text": "hello "})),
        (None, "reasoning.delta", json!({"text": "hmm"})),
        (None, "text.delta", json!({"text": "world"})),
        (None, "message.end", json!({"message_id": "m", "text": "hello world!"})),
    ]);
    assert_eq!(bad.unwrap_err(), (ErrorCode::MessageTextMismatch, 4));
    let ok = run(&[
        (None, "message.start", json!({"message_id": "m", "role": "assistant"})),
        (None, "text.delta", json!({"text": "hello "})),
        (None, "text.delta", json!({"text": "world"})),
        (None, "message.end", json!({"message_id": "m", "text": "hello world"})),
    ]);
    assert!(ok.is_ok());
    // No streamed text: the end's text is the content.
    let whole = run(&[
        (None, "message.start", json!({"message_id": "m", "role": "user"})),
        (None, "message.end", json!({"message_id": "m", "text": "hi"})),
    ]);
    assert!(whole.is_ok());
}

#[test]
fn lifecycle_table_and_terminal_states() {
    assert_eq!(
        run(&[(None, "run.lifecycle", json!({"state": "done"}))]).unwrap_err(),
        (ErrorCode::LifecycleIllegal, 0)
    );
    let closed = run(&[
        (None, "run.lifecycle", json!({"state": "running"})),
        (None, "run.lifecycle", json!({"state": "done"})),
        (None, "custom.note", json!({})),
    ]);
    assert_eq!(closed.unwrap_err(), (ErrorCode::RunClosed, 2));
}

#[test]
fn children_have_their_own_scope() {
    let g = run(&[
        (None, "run.lifecycle", json!({"state": "running"})),
        (None, "child.spawn", json!({"child_id": "c1"})),
        (Some("c1"), "run.lifecycle", json!({"state": "running"})),
        (Some("c1"), "tool.start", json!({"call_id": "t", "tool": "x"})),
        (None, "tool.start", json!({"call_id": "t", "tool": "x"})),
        (Some("c1"), "run.lifecycle", json!({"state": "done"})),
        (None, "tool.end", json!({"call_id": "t", "ok": true})),
    ]);
    assert!(g.is_ok(), "{g:?}");
    let e = run(&[(Some("ghost"), "text.delta", json!({"text": "x"}))]);
    assert_eq!(e.unwrap_err(), (ErrorCode::ChildUnknown, 0));
    let e = run(&[
        (None, "child.spawn", json!({"child_id": "c1"})),
        (Some("c1"), "run.lifecycle", json!({"state": "running"})),
        (Some("c1"), "run.lifecycle", json!({"state": "aborted"})),
        (Some("c1"), "text.delta", json!({"text": "x"})),
    ]);
    assert_eq!(e.unwrap_err(), (ErrorCode::RunClosed, 3));
}

#[test]
fn plan_decisions_are_the_services_to_write() {
    let proposal = (None, "plan.proposal", json!({"plan": {"id": "p1", "steps": []}}));
    let decision = json!({"plan_id": "p1", "decision": "approved"});
    assert_eq!(
        run(&[proposal.clone(), (None, "plan.decision", decision.clone())]).unwrap_err(),
        (ErrorCode::Reserved, 1)
    );
    let mut g = run(&[proposal]).unwrap();
    let d = ev("plan.decision", decision);
    g.apply(2, None, &d, Origin::Service).unwrap();
    assert_eq!(g.apply(3, None, &d, Origin::Service).unwrap_err().code, ErrorCode::PlanNotPending);
}
