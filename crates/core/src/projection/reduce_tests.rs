//! The reducer's edge cases, one named test each, and the fold properties.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::view::{BlockKind, MessageStatus, ToolStatus};
use super::RunView;
use crate::domain::event::Decision;
use crate::domain::RunState;

use crate::testkit::stored as log;

fn fold(inputs: &[Value]) -> RunView {
    RunView::fold(&log(inputs))
}

fn delta(text: &str) -> Value {
    json!({"type": "text.delta", "payload": {"text": text}})
}

#[test]
fn delta_without_message_id_joins_the_current_open_message_or_opens_one() {
    let v = fold(&[
        delta("a"),
        json!({"type": "message.start", "payload": {"message_id": "m2", "role": "assistant"}}),
        delta("b"),
        json!({"type": "message.end", "payload": {"message_id": "m2"}}),
        delta("c"),
    ]);
    assert_eq!(v.messages.len(), 2);
    let implicit = v.message(None, "msg-1").expect("implicit message");
    assert!(implicit.implicit);
    assert_eq!(implicit.text, "ac", "after m2 ends, msg-1 is the current open message again");
    assert_eq!(v.message(None, "m2").expect("m2").text, "b");
    assert_eq!(v.anomalies, 0);
}

#[test]
fn message_end_with_different_text_is_not_in_a_valid_log() {
    // Refused at append (MESSAGE-TEXT-MISMATCH); in a foreign log it is an anomaly that
    // changes nothing, so the message keeps streaming its real text.
    let v = fold(&[delta("abc"), json!({"type": "message.end", "payload": {"text": "abd"}})]);
    assert_eq!(v.anomalies, 1);
    let m = v.message(None, "msg-1").expect("message");
    assert_eq!((m.text.as_str(), m.status), ("abc", MessageStatus::Streaming));
    // With no streamed text, the end's text is the content.
    let v = fold(&[
        json!({"type": "message.start", "payload": {"message_id": "u", "role": "user"}}),
        json!({"type": "message.end", "payload": {"message_id": "u", "text": "hello"}}),
    ]);
    let m = v.message(None, "u").expect("message");
    assert_eq!((m.text.as_str(), m.status, m.blocks.len()), ("hello", MessageStatus::Complete, 1));
}

#[test]
fn empty_message_is_complete_with_no_blocks() {
    let v = fold(&[
        json!({"type": "message.start", "payload": {"message_id": "e", "role": "assistant"}}),
        json!({"type": "message.end", "payload": {"message_id": "e", "stop_reason": "end_turn"}}),
    ]);
    let m = v.message(None, "e").expect("message");
    assert_eq!(m.status, MessageStatus::Complete);
    assert!(m.blocks.is_empty() && m.text.is_empty());
    assert_eq!(m.stop_reason.as_deref(), Some("end_turn"));
}

#[test]
fn interleaved_messages_of_several_children_stay_apart() {
    let mut inputs = vec![
        json!({"type": "child.spawn", "payload": {"child_id": "a"}}),
        json!({"type": "child.spawn", "payload": {"child_id": "b"}}),
    ];
    for i in 0..10 {
        for c in ["a", "b"] {
            inputs.push(json!({"type": "text.delta", "child_id": c, "payload": {"text": format!("{c}{i}")}}));
        }
        inputs.push(delta("r"));
    }
    let v = fold(&inputs);
    assert_eq!(v.messages.len(), 3);
    for c in ["a", "b"] {
        let m = v.messages.iter().find(|m| m.child_id.as_deref() == Some(c)).expect("child message");
        assert_eq!(m.text, (0..10).map(|i| format!("{c}{i}")).collect::<String>());
        assert_eq!(m.blocks.len(), 1, "consecutive deltas of one kind share a block");
    }
    assert_eq!(v.messages.iter().find(|m| m.child_id.is_none()).expect("root").text, "r".repeat(10));
}

#[test]
fn step_boundary_with_a_message_still_open() {
    let v = fold(&[
        delta("before "),
        json!({"type": "step.boundary", "payload": {"step_index": 1, "step_kind": "text-only"}}),
        delta("after"),
        json!({"type": "message.end", "payload": {}}),
    ]);
    assert_eq!(v.steps[0].open_message_ids, vec!["msg-1".to_owned()]);
    let m = v.message(None, "msg-1").expect("message");
    assert_eq!((m.text.as_str(), m.status), ("before after", MessageStatus::Complete));
}

#[test]
fn run_ending_interrupts_open_messages_and_tool_calls() {
    for end in ["done", "aborted", "error"] {
        let v = fold(&[
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            delta("partial"),
            json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}),
            json!({"type": "child.spawn", "payload": {"child_id": "k"}}),
            json!({"type": "text.delta", "child_id": "k", "payload": {"text": "kid"}}),
            json!({"type": "run.lifecycle", "payload": {"state": end}}),
        ]);
        assert_eq!(v.state(), RunState::parse(end));
        assert!(v.messages.iter().all(|m| m.status == MessageStatus::Interrupted), "{end}");
        assert_eq!(v.messages[0].ended_seq, Some(6));
        assert_eq!(v.tool(None, "c").expect("tool").status, ToolStatus::Interrupted);
        // The tool call is a block of the message that was open when it started.
        assert_eq!(v.messages[0].blocks[1].kind, BlockKind::ToolCall);
    }
    // A child's end interrupts only the child's.
    let v = fold(&[
        json!({"type": "child.spawn", "payload": {"child_id": "k"}}),
        json!({"type": "run.lifecycle", "child_id": "k", "payload": {"state": "running"}}),
        json!({"type": "text.delta", "child_id": "k", "payload": {"text": "kid"}}),
        delta("root"),
        json!({"type": "run.lifecycle", "child_id": "k", "payload": {"state": "error"}}),
    ]);
    assert_eq!(v.message(Some("k"), "msg-3").expect("child msg").status, MessageStatus::Interrupted);
    assert_eq!(v.message(None, "msg-4").expect("root msg").status, MessageStatus::Streaming);
    assert_eq!(v.children[0].state, Some(RunState::Error));
}

#[test]
fn plan_decided_twice_keeps_the_first_decision() {
    let events = log(&[
        json!({"type": "run.lifecycle", "payload": {"state": "planning"}}),
        json!({"type": "plan.proposal", "payload": {"plan": {"id": "p", "steps": [
            {"id": "s1", "title": "a", "intent": "research", "est_cost_usd": 0.25},
            {"id": "s2", "title": "b", "intent": "write", "est_cost_usd": 0.5}]}}}),
        json!({"type": "plan.decision", "payload": {"plan_id": "p", "decision": "approved"}}),
        json!({"type": "plan.decision", "payload": {"plan_id": "p", "decision": "rejected"}}),
    ]);
    let v = RunView::fold(&events);
    let plan = v.plan.as_ref().expect("plan");
    assert_eq!(plan.decision.as_ref().map(|d| d.decision), Some(Decision::Approved));
    assert_eq!(plan.est_total_cost_usd, Some(0.75), "summed from the steps");
    assert_eq!(v.anomalies, 1, "the second decision is refused");
}

#[test]
fn compaction_stats() {
    let v = fold(&[
        json!({"type": "compaction.start", "payload": {}}),
        json!({"type": "compaction.end", "payload": {"removed": 24, "kept": 8, "tokens_removed": 45000, "tokens_kept": 12000, "reason": "tokens"}}),
        json!({"type": "compaction.start", "payload": {}}),
    ]);
    assert!(v.compaction.active);
    let v2 = fold(&[
        json!({"type": "compaction.start", "payload": {}}),
        json!({"type": "compaction.end", "payload": {"removed": 24, "kept": 8, "tokens_removed": 45000, "tokens_kept": 12000, "reason": "tokens"}}),
        json!({"type": "compaction.end", "payload": {"removed": 2, "kept": 6, "reason": "count"}}),
    ]);
    assert!(!v2.compaction.active);
    assert_eq!((v2.compaction.count, v2.compaction.tokens_removed_total), (2, 45000));
    let last = v2.compaction.last.as_ref().expect("stats");
    assert_eq!((last.removed, last.kept, last.tokens_removed, last.reason.as_str()), (2, 6, None, "count"));
}

#[test]
fn a_thousand_chunk_message_is_one_message() {
    let mut inputs =
        vec![json!({"type": "message.start", "payload": {"message_id": "big", "role": "assistant"}})];
    inputs.extend((0..1500).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i},")}})));
    let full: String = (0..1500).map(|i| format!("{i},")).collect();
    inputs.push(json!({"type": "message.end", "payload": {"message_id": "big", "text": full}}));
    let v = fold(&inputs);
    assert_eq!(v.messages.len(), 1);
    assert_eq!(v.messages[0].text, full);
    assert_eq!(v.messages[0].status, MessageStatus::Complete);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn incremental_fold_equals_batch_fold_at_every_prefix(seed in any::<u64>(), steps in 1usize..120) {
        let events = log(&crate::testkit::generated_run(seed, steps));
        let mut live = RunView::new();
        for k in 0..events.len() {
            live.apply(&events[k]);
            prop_assert_eq!(&live, &RunView::fold(&events[..=k]));
        }
        prop_assert_eq!(live.anomalies, 0, "the generator only emits valid runs");
        prop_assert_eq!(live.seq, events.len() as i64);
    }
}
