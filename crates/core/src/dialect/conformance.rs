//! Conformance: each dialect encodes the runs its seed's own examples describe, and the
//! items are compared with those examples field by field. (The agui and vercel streams
//! are also checked by the official npm packages in `tests/it`'s Node test.)

use serde_json::{json, Value};

use super::{Encoding, Format, RunCtx};
use crate::projection::RunView;
use crate::testkit::stored;

/// All JSON items of `inputs` (stored as seqs 1, 2, …) in `format`, from the start.
fn encode(format: Format, inputs: &[Value]) -> Vec<(i64, Value)> {
    let run = RunCtx { run_id: "run".into(), root_run_id: "run".into() };
    let mut enc = Encoding::new(format, run, RunView::new());
    let mut out: Vec<(i64, Value)> =
        enc.open().into_iter().filter_map(|o| o.json().map(|v| (o.seq, v.clone()))).collect();
    for e in stored(inputs) {
        out.extend(enc.push(&e).into_iter().filter_map(|o| o.json().map(|v| (o.seq, v.clone()))));
    }
    out
}

fn items(format: Format, inputs: &[Value]) -> Vec<Value> {
    encode(format, inputs).into_iter().map(|(_, v)| v).collect()
}

/// `got` has every field of `want` with the same value (it may have more).
fn has_fields(got: &Value, want: &Value) {
    match want {
        Value::Object(w) => {
            for (k, v) in w {
                let g = got.get(k).unwrap_or_else(|| panic!("missing `{k}` in {got}"));
                has_fields(g, v);
            }
        }
        _ => assert_eq!(got, want),
    }
}

#[test]
fn native_is_seed_004s_envelope() {
    let out =
        encode(Format::Native, &[json!({"type": "reasoning.delta", "payload": {"text": "Let me check..."}})]);
    let v = &out[0].1;
    let keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 7);
    for k in ["id", "ts", "type", "run_id", "child_id", "seq", "payload"] {
        assert!(keys.contains(&k), "{k}");
    }
    has_fields(
        v,
        &json!({"type": "reasoning.delta", "run_id": "run", "child_id": null, "seq": 1, "payload": {"text": "Let me check..."}}),
    );
    assert!(
        v["ts"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 24),
        "RFC 3339 with ms: {}",
        v["ts"]
    );
}

#[test]
fn multica_follows_seed_000s_examples() {
    let out = items(
        Format::Multica,
        &[
            json!({"type": "message.start", "payload": {"message_id": "019abc12", "role": "assistant"}}),
            json!({"type": "text.delta", "payload": {"text": "Here is the partial response so far..."}}),
            json!({"type": "reasoning.delta", "payload": {"text": "Let me consider..."}}),
            json!({"type": "message.end", "payload": {"message_id": "019abc12", "stop_reason": "end_turn"}}),
            json!({"type": "tool.start", "payload": {"call_id": "toolu_01ABC", "tool": "Bash", "input": {"command": "ls -la"}}}),
            json!({"type": "tool.end", "payload": {"call_id": "toolu_01ABC", "ok": true, "output": "file1.txt\nfile2.txt\n"}}),
            json!({"type": "compaction.start", "payload": {}}),
            json!({"type": "compaction.end", "payload": {"removed": 24, "kept": 8, "tokens_removed": 45000, "tokens_kept": 12000, "reason": "tokens"}}),
        ],
    );
    let envelope = |v: &Value| (v["streamId"].clone(), v["agentId"].clone());
    assert_eq!(
        out[0],
        json!({"streamId": "019abc12", "agentId": "run", "event": {"type": "message_start", "message": {"role": "assistant", "content": []}}})
    );
    // Every update is the whole accumulated content, in block order.
    assert_eq!(
        out[1]["event"],
        json!({"type": "message_update", "message": {"role": "assistant", "content": [
        {"type": "text", "text": "Here is the partial response so far..."}]}})
    );
    assert_eq!(
        out[2]["event"],
        json!({"type": "message_update", "message": {"role": "assistant", "content": [
        {"type": "text", "text": "Here is the partial response so far..."},
        {"type": "thinking", "thinking": "Let me consider..."}]}})
    );
    assert_eq!(out[3]["event"]["type"], "message_end");
    assert_eq!(out[3]["event"]["message"]["stopReason"], "end_turn");
    assert_eq!(envelope(&out[3]), (json!("019abc12"), json!("run")));
    assert_eq!(
        out[4]["event"],
        json!({"type": "tool_execution_start", "toolCallId": "toolu_01ABC", "toolName": "Bash", "args": {"command": "ls -la"}})
    );
    assert_eq!(
        out[5]["event"],
        json!({"type": "tool_execution_end", "toolCallId": "toolu_01ABC", "result": "file1.txt\nfile2.txt\n", "isError": false})
    );
    assert_eq!(
        out[6],
        json!({"streamId": "compaction:run", "agentId": "run", "event": {"type": "compaction_start"}})
    );
    assert_eq!(
        out[7],
        json!({"streamId": "compaction:run", "agentId": "run", "event": {
        "type": "compaction_end", "removed": 24, "kept": 8, "tokensRemoved": 45000, "tokensKept": 12000, "reason": "tokens"}})
    );
    assert_eq!(out.len(), 8);
}

#[test]
fn chunks_follows_seed_001s_three_phases() {
    let out = items(
        Format::Chunks,
        &[
            json!({"type": "message.start", "payload": {"message_id": "msg-001", "role": "assistant"}}),
            json!({"type": "text.delta", "payload": {"text": "Hello"}}),
            json!({"type": "text.delta", "payload": {"text": " World"}}),
            json!({"type": "text.delta", "payload": {"text": "!"}}),
            json!({"type": "message.end", "payload": {"message_id": "msg-001"}}),
        ],
    );
    assert_eq!(out.len(), 5);
    has_fields(
        &out[0],
        &json!({"type": "message.start", "payload": {"sessionId": "run", "messageId": "msg-001", "role": "agent"}}),
    );
    assert!(out[0]["payload"]["timestamp"].is_string());
    for (i, t) in ["Hello", " World", "!"].iter().enumerate() {
        assert_eq!(
            out[i + 1],
            json!({"type": "message.chunk", "payload": {"messageId": "msg-001", "content": {"type": "text", "text": t}}})
        );
    }
    has_fields(
        &out[4],
        &json!({"type": "message.end", "payload": {"messageId": "msg-001", "content": {"type": "text", "text": "Hello World!"}, "isComplete": true}}),
    );
    assert!(out[4]["payload"]["timestamp"].is_string());
}

#[test]
fn hier_follows_seed_002s_scenarios() {
    // Scenario 2: one streamed message.
    let out = items(
        Format::Hier,
        &[
            json!({"type": "text.delta", "payload": {"text": "Hello", "message_id": "M1"}}),
            json!({"type": "text.delta", "payload": {"text": " World", "message_id": "M1"}}),
            json!({"type": "text.delta", "payload": {"text": "!", "message_id": "M1"}}),
        ],
    );
    for (i, t) in ["Hello", " World", "!"].iter().enumerate() {
        has_fields(
            &out[i],
            &json!({"chunk_id": format!("C{}", i + 1), "message_id": "M1", "type": "text", "props": {"content": t}, "delta": true}),
        );
    }
    // Scenario 3: thinking, a tool call and text in one block.
    let out = items(
        Format::Hier,
        &[
            json!({"type": "reasoning.delta", "payload": {"text": "Let me", "message_id": "M1"}}),
            json!({"type": "reasoning.delta", "payload": {"text": " think", "message_id": "M1"}}),
            json!({"type": "tool.start", "payload": {"call_id": "M2", "tool": "search"}}),
            json!({"type": "text.delta", "payload": {"text": "Hel", "message_id": "M3"}}),
            json!({"type": "text.delta", "payload": {"text": "lo", "message_id": "M3"}}),
        ],
    );
    let shape: Vec<(String, String, String, String)> = out
        .iter()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or("-").to_owned();
            (s("chunk_id"), s("message_id"), s("block_id"), s("type"))
        })
        .collect();
    // A message's thinking is a message of its own, so merging by id never mixes it
    // into the visible text.
    let want = [
        ("C1", "M1:thinking", "B1", "thinking"),
        ("C2", "M1:thinking", "B1", "thinking"),
        ("C3", "M2", "B1", "tool_call"),
        ("C4", "M3", "B1", "text"),
        ("C5", "M3", "B1", "text"),
    ];
    assert_eq!(shape, want.map(|(a, b, c, d)| (a.into(), b.into(), c.into(), d.into())).to_vec());
    // Scenarios 4 and 5: blocks are steps, threads are children.
    let out = items(
        Format::Hier,
        &[
            json!({"type": "text.delta", "payload": {"text": "a", "message_id": "M1"}}),
            json!({"type": "step.boundary", "payload": {"step_index": 1, "step_kind": "text-only"}}),
            json!({"type": "child.spawn", "payload": {"child_id": "T2"}}),
            json!({"type": "text.delta", "child_id": "T2", "payload": {"text": "News: ...", "message_id": "M2"}}),
            json!({"type": "text.delta", "payload": {"text": "b", "message_id": "M3"}}),
        ],
    );
    has_fields(&out[0], &json!({"block_id": "B1", "message_id": "M1"}));
    assert!(out[0].get("thread_id").is_none(), "the run itself has no thread");
    // A child's blocks and messages are named in its thread: no collision with the run's B1.
    has_fields(
        &out[3],
        &json!({"block_id": "T2/B1", "thread_id": "T2", "message_id": "T2/M2", "props": {"content": "News: ..."}}),
    );
    has_fields(&out[4], &json!({"block_id": "B2", "message_id": "M3"}));
}

#[test]
fn typed_follows_seed_003s_example_flow() {
    let out = items(
        Format::Typed,
        &[
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            json!({"type": "reasoning.delta", "payload": {"text": "I need to list the files in src directory..."}}),
            json!({"type": "tool.start", "payload": {"call_id": "c1", "tool": "run_shell_command", "input": {"command": "ls -l src"}}}),
            json!({"type": "tool.progress", "payload": {"call_id": "c1", "data": {"subtype": "stdout_chunk", "content": "..."}}}),
            json!({"type": "tool.end", "payload": {"call_id": "c1", "ok": true, "output": "{\"stdout\":\"...\",\"stderr\":\"\"}"}}),
            json!({"type": "reasoning.delta", "payload": {"text": "I have the list of files. Now I will formulate the answer."}}),
            json!({"type": "text.delta", "payload": {"text": "The `src`"}}),
            json!({"type": "text.delta", "payload": {"text": " directory contains:"}}),
            json!({"type": "text.delta", "payload": {"text": " `client` and `server`."}}),
            json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
        ],
    );
    assert_eq!(
        out,
        vec![
            json!({"type": "thought", "content": "I need to list the files in src directory..."}),
            json!({"type": "tool_call", "toolName": "run_shell_command", "toolArgs": "{\"command\":\"ls -l src\"}"}),
            json!({"type": "tool_progress", "toolName": "run_shell_command", "data": {"subtype": "stdout_chunk", "content": "..."}}),
            json!({"type": "tool_result", "toolName": "run_shell_command", "output": "{\"stdout\":\"...\",\"stderr\":\"\"}"}),
            json!({"type": "thought", "content": "I have the list of files. Now I will formulate the answer."}),
            json!({"type": "stream", "content": "The `src`"}),
            json!({"type": "stream", "content": " directory contains:"}),
            json!({"type": "stream", "content": " `client` and `server`."}),
            json!({"type": "final"}),
        ]
    );
    let failed = items(
        Format::Typed,
        &[
            json!({"type": "run.lifecycle", "payload": {"state": "error", "reason": "tool browser failed 3 times"}}),
        ],
    );
    assert_eq!(failed, vec![json!({"type": "error", "error": "tool browser failed 3 times"})]);
}

/// A run with every construct, as the agui and vercel structure tests use it.
fn rich_run() -> Vec<Value> {
    vec![
        json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
        json!({"type": "message.start", "payload": {"message_id": "m1", "role": "assistant"}}),
        json!({"type": "reasoning.delta", "payload": {"text": "think"}}),
        json!({"type": "text.delta", "payload": {"text": "Hello"}}),
        json!({"type": "tool.start", "payload": {"call_id": "c1", "tool": "search", "input": {"q": "x"}}}),
        json!({"type": "tool.progress", "payload": {"call_id": "c1", "data": {"pct": 50}}}),
        json!({"type": "tool.end", "payload": {"call_id": "c1", "ok": true, "output": {"hits": 1}}}),
        json!({"type": "step.boundary", "payload": {"step_index": 0, "step_kind": "tool-roundtrip"}}),
        json!({"type": "child.spawn", "payload": {"child_id": "k1", "prompt": "sub"}}),
        json!({"type": "run.lifecycle", "child_id": "k1", "payload": {"state": "running"}}),
        json!({"type": "text.delta", "child_id": "k1", "payload": {"text": "child says"}}),
        json!({"type": "run.lifecycle", "child_id": "k1", "payload": {"state": "done"}}),
        json!({"type": "text.delta", "payload": {"text": " world"}}),
        json!({"type": "message.end", "payload": {"message_id": "m1", "stop_reason": "end_turn"}}),
        json!({"type": "tool.start", "payload": {"call_id": "c2", "tool": "slow"}}),
        json!({"type": "custom.note", "payload": {"n": 1}}),
        json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
    ]
}

#[test]
fn agui_opens_closes_and_nests_in_verifier_order() {
    let out = items(Format::Agui, &rich_run());
    let types: Vec<&str> = out.iter().map(|v| v["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(types.first(), Some(&"RUN_STARTED"));
    assert_eq!(types.last(), Some(&"RUN_FINISHED"));
    assert_eq!(types[1], "STATE_SNAPSHOT", "the state the deltas update");
    let pos = |t: &str| types.iter().position(|x| *x == t).unwrap_or_else(|| panic!("no {t}: {types:?}"));
    let last = |t: &str| types.iter().rposition(|x| *x == t).unwrap_or_else(|| panic!("no {t}: {types:?}"));
    // The message's reasoning is one reasoning message, open alongside its text until
    // the message ends (no start/end churn between reasoning and text).
    assert!(pos("TEXT_MESSAGE_START") < pos("REASONING_MESSAGE_CONTENT"));
    assert!(pos("REASONING_MESSAGE_START") < pos("REASONING_MESSAGE_CONTENT"));
    assert_eq!(types.iter().filter(|t| **t == "REASONING_MESSAGE_START").count(), 1);
    assert!(last("TEXT_MESSAGE_CONTENT") < pos("REASONING_MESSAGE_END"));
    assert!(pos("REASONING_MESSAGE_END") < last("TEXT_MESSAGE_END"));
    assert!(pos("SUBAGENT_STARTED") < pos("SUBAGENT_FINISHED"));
    // The child's text is its own message, tagged with the sub-agent.
    let child: Vec<&Value> = out
        .iter()
        .filter(|v| {
            v.get("subagentRunId").is_some()
                && v["type"] != "SUBAGENT_STARTED"
                && v["type"] != "SUBAGENT_FINISHED"
        })
        .collect();
    assert!(child.iter().any(|v| v["type"] == "TEXT_MESSAGE_CONTENT" && v["delta"] == "child says"));
    // The call still running at the end gets a result, so nothing is pending.
    assert!(out.iter().any(|v| v["type"] == "TOOL_CALL_RESULT"
        && v["toolCallId"] == "c2"
        && v["content"] == "interrupted"));
    // Optional fields are left out, never null.
    assert!(out.iter().all(|v| v.as_object().is_some_and(|m| m.values().all(|x| !x.is_null()))), "{out:#?}");
}

#[test]
fn vercel_is_one_message_with_parts_and_ends_with_done() {
    let run = rich_run();
    let all = encode(Format::Vercel, &run);
    let types: Vec<&str> = all.iter().map(|(_, v)| v["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(&types[..2], &["start", "start-step"]);
    assert_eq!(&types[types.len() - 2..], &["finish-step", "finish"]);
    assert_eq!(
        types.iter().filter(|t| **t == "text-start").count(),
        types.iter().filter(|t| **t == "text-end").count()
    );
    assert!(
        types.contains(&"reasoning-start")
            && types.contains(&"tool-input-available")
            && types.contains(&"data-subagent")
    );
    // Every item keeps the seq it came from (the SSE id), never going back.
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0));
    let mut enc = Encoding::new(Format::Vercel, RunCtx::default(), RunView::new());
    let last = stored(&run).iter().flat_map(|e| enc.push(e)).last().expect("items");
    assert_eq!(last.to_text(), "[DONE]");
}

/// What the issue saw: a user message is never the assistant's output. Dialects with
/// roles keep the user role; `typed` (no roles) leaves it out of `stream`; `vercel`
/// (one assistant message) makes it a data part and keeps it out of the text.
#[test]
fn user_messages_keep_their_role_and_never_become_assistant_output() {
    let run = [
        json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
        json!({"type": "message.start", "payload": {"message_id": "u1", "role": "user"}}),
        json!({"type": "text.delta", "payload": {"message_id": "u1", "text": "Find flights"}}),
        json!({"type": "message.end", "payload": {"message_id": "u1"}}),
        json!({"type": "message.start", "payload": {"message_id": "a1", "role": "assistant"}}),
        json!({"type": "text.delta", "payload": {"message_id": "a1", "text": "Searching."}}),
        json!({"type": "message.end", "payload": {"message_id": "a1"}}),
        json!({"type": "run.lifecycle", "payload": {"state": "done"}}),
    ];
    let typed = items(Format::Typed, &run);
    let streamed: String =
        typed.iter().filter(|v| v["type"] == "stream").map(|v| v["content"].as_str().unwrap_or("")).collect();
    assert_eq!(streamed, "Searching.");
    let vercel = items(Format::Vercel, &run);
    let text: String = vercel
        .iter()
        .filter(|v| v["type"] == "text-delta")
        .map(|v| v["delta"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "Searching.");
    assert!(vercel.iter().any(|v| v["type"] == "data-message"
        && v["data"]["role"] == "user"
        && v["data"]["text"] == "Find flights"));
    // The text part ends with its message, not at the end of the run.
    let end = vercel.iter().position(|v| v["type"] == "text-end").expect("text-end");
    assert!(vercel[end + 1..].iter().all(|v| v["type"] != "text-delta"));
    let agui = items(Format::Agui, &run);
    assert!(agui
        .iter()
        .any(|v| v["type"] == "TEXT_MESSAGE_START" && v["messageId"] == "u1" && v["role"] == "user"));
    let chunks = items(Format::Chunks, &run);
    assert!(chunks.iter().any(|v| v["type"] == "message.start"
        && v["payload"]["messageId"] == "u1"
        && v["payload"]["role"] == "user"));
    let multica = items(Format::Multica, &run);
    assert!(multica.iter().any(|v| v["streamId"] == "u1" && v["event"]["message"]["role"] == "user"));
}

/// Smaller things the issue listed, one assertion each.
#[test]
fn the_smaller_shapes_the_issue_listed() {
    // chunks: a message opened by reasoning alone still starts before it ends.
    let out = items(
        Format::Chunks,
        &[
            json!({"type": "reasoning.delta", "payload": {"text": "hmm"}}),
            json!({"type": "message.end", "payload": {}}),
        ],
    );
    let types: Vec<&str> = out.iter().map(|v| v["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(types, ["message.start", "message.end"]);
    // multica: a child's call ids are scoped (two children's `k1` do not collide), and a
    // failed call's result is the error as sent, not its JSON text.
    let out = items(
        Format::Multica,
        &[
            json!({"type": "child.spawn", "payload": {"child_id": "a"}}),
            json!({"type": "child.spawn", "payload": {"child_id": "b"}}),
            json!({"type": "tool.start", "child_id": "a", "payload": {"call_id": "k1", "tool": "t"}}),
            json!({"type": "tool.start", "child_id": "b", "payload": {"call_id": "k1", "tool": "t"}}),
            json!({"type": "tool.end", "child_id": "a", "payload": {"call_id": "k1", "ok": false, "error": {"code": "KAI-1"}}}),
        ],
    );
    let ids: Vec<&str> = out.iter().filter_map(|v| v["event"]["toolCallId"].as_str()).collect();
    assert_eq!(ids, ["a/k1", "b/k1", "a/k1"]);
    assert_eq!(out[2]["event"]["result"], json!({"code": "KAI-1"}));
    assert_eq!(out[2]["event"]["isError"], true);
    // typed: a tool called without input has `{}` as its arguments.
    let out =
        items(Format::Typed, &[json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}})]);
    assert_eq!(out[0]["toolArgs"], "{}");
}
