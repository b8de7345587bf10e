//! Every validation rule: its status, stable code and offending index, and that the
//! rejected batch wrote nothing (the valid events before the bad one included).

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

struct Case {
    name: &'static str,
    setup: Value,
    batch: Value,
    status: StatusCode,
    code: &'static str,
    index: Option<u64>,
}

fn ok_prefix() -> Value {
    json!({"type": "custom.ok", "payload": {}})
}

fn cases() -> Vec<Case> {
    let running = json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]);
    let c = |name, setup: Value, batch: Value, status, code, index| Case {
        name,
        setup,
        batch,
        status,
        code,
        index,
    };
    vec![
        c(
            "unknown type",
            json!([]),
            json!([ok_prefix(), {"type": "text.deltaa", "payload": {"text": "x"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-UNKNOWN-TYPE",
            Some(1),
        ),
        c(
            "bad custom name",
            json!([]),
            json!([{"type": "custom.", "payload": {}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(0),
        ),
        c(
            "missing field",
            json!([]),
            json!([ok_prefix(), {"type": "tool.start", "payload": {"call_id": "c"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(1),
        ),
        c(
            "wrong field type",
            json!([]),
            json!([{"type": "step.boundary", "payload": {"step_index": "one", "step_kind": "plan"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(0),
        ),
        c(
            "unknown payload field",
            json!([]),
            json!([{"type": "text.delta", "payload": {"text": "x", "txet": "y"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(0),
        ),
        c(
            "bad enum value",
            json!([]),
            json!([{"type": "run.lifecycle", "payload": {"state": "sleeping"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(0),
        ),
        c(
            "server-assigned field",
            json!([]),
            json!([{"type": "custom.x", "payload": {}, "seq": 9}]),
            StatusCode::BAD_REQUEST,
            "EVENT-MALFORMED",
            Some(0),
        ),
        c(
            "event not an object",
            json!([]),
            json!([ok_prefix(), 42]),
            StatusCode::BAD_REQUEST,
            "EVENT-MALFORMED",
            Some(1),
        ),
        c(
            "tool.end for unknown call",
            running.clone(),
            json!([ok_prefix(), {"type": "tool.end", "payload": {"call_id": "nope", "ok": true}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOOL-UNKNOWN-CALL",
            Some(1),
        ),
        c(
            "tool.progress for unknown call",
            json!([]),
            json!([{"type": "tool.progress", "payload": {"call_id": "nope"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOOL-UNKNOWN-CALL",
            Some(0),
        ),
        c(
            "second tool.start",
            json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}]),
            json!([ok_prefix(), {"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOOL-DUPLICATE-CALL",
            Some(1),
        ),
        c(
            "second tool.start in one batch",
            json!([]),
            json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}, {"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOOL-DUPLICATE-CALL",
            Some(1),
        ),
        c(
            "tool.end twice",
            json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}, {"type": "tool.end", "payload": {"call_id": "c", "ok": true}}]),
            json!([{"type": "tool.end", "payload": {"call_id": "c", "ok": true}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "TOOL-CALL-ENDED",
            Some(0),
        ),
        c(
            "delta to an ended message",
            json!([{"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}}, {"type": "message.end", "payload": {"message_id": "m"}}]),
            json!([ok_prefix(), {"type": "text.delta", "payload": {"text": "late", "message_id": "m"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "MESSAGE-ENDED",
            Some(1),
        ),
        c(
            "second message.start",
            json!([{"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}}]),
            json!([{"type": "message.start", "payload": {"message_id": "m", "role": "user"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "MESSAGE-DUPLICATE",
            Some(0),
        ),
        c(
            "message.end with nothing open",
            json!([]),
            json!([{"type": "message.end", "payload": {}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "MESSAGE-UNKNOWN",
            Some(0),
        ),
        c(
            "message.end text mismatch",
            json!([{"type": "text.delta", "payload": {"text": "abc"}}]),
            json!([{"type": "message.end", "payload": {"text": "abd"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "MESSAGE-TEXT-MISMATCH",
            Some(0),
        ),
        c(
            "illegal lifecycle transition",
            running.clone(),
            json!([ok_prefix(), {"type": "run.lifecycle", "payload": {"state": "planning"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "LIFECYCLE-ILLEGAL-TRANSITION",
            Some(1),
        ),
        c(
            "terminal state first",
            json!([]),
            json!([{"type": "run.lifecycle", "payload": {"state": "done"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "LIFECYCLE-ILLEGAL-TRANSITION",
            Some(0),
        ),
        c(
            "append after done",
            json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, {"type": "run.lifecycle", "payload": {"state": "done"}}]),
            json!([ok_prefix()]),
            StatusCode::CONFLICT,
            "RUN-CLOSED",
            Some(0),
        ),
        c(
            "append after aborted",
            json!([{"type": "run.lifecycle", "payload": {"state": "planning"}}, {"type": "run.lifecycle", "payload": {"state": "aborted"}}]),
            json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]),
            StatusCode::CONFLICT,
            "RUN-CLOSED",
            Some(0),
        ),
        c(
            "append after error in the same batch",
            running.clone(),
            json!([{"type": "run.lifecycle", "payload": {"state": "error", "reason": "boom"}}, ok_prefix()]),
            StatusCode::CONFLICT,
            "RUN-CLOSED",
            Some(1),
        ),
        c(
            "child never spawned",
            json!([]),
            json!([ok_prefix(), {"type": "text.delta", "child_id": "ghost", "payload": {"text": "x"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "CHILD-UNKNOWN",
            Some(1),
        ),
        c(
            "child spawned twice",
            json!([{"type": "child.spawn", "payload": {"child_id": "k"}}]),
            json!([{"type": "child.spawn", "payload": {"child_id": "k"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "CHILD-DUPLICATE",
            Some(0),
        ),
        c(
            "producer writes plan.decision",
            json!([{"type": "plan.proposal", "payload": {"plan": {"id": "p", "steps": []}}}]),
            json!([{"type": "plan.decision", "payload": {"plan_id": "p", "decision": "approved"}}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-RESERVED",
            Some(0),
        ),
        c(
            "event over the size limit",
            json!([]),
            json!([ok_prefix(), {"type": "text.delta", "payload": {"text": "x".repeat(1_100_000)}}]),
            StatusCode::PAYLOAD_TOO_LARGE,
            "EVENT-TOO-LARGE",
            Some(1),
        ),
        c("empty batch", json!([]), json!([]), StatusCode::BAD_REQUEST, "BATCH-EMPTY", None),
        c(
            "repeated key in a batch",
            json!([]),
            json!([{"type": "custom.a", "payload": {}, "key": "k"}, {"type": "custom.b", "payload": {}, "key": "k"}]),
            StatusCode::BAD_REQUEST,
            "IDEMPOTENCY-KEY-REPEATED",
            Some(1),
        ),
        c(
            "empty child id",
            json!([]),
            json!([{"type": "custom.a", "payload": {}, "child_id": ""}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "EVENT-INVALID-PAYLOAD",
            Some(0),
        ),
        c(
            "unknown body field",
            json!([]),
            json!({"events": [ok_prefix()], "expected": 3}),
            StatusCode::BAD_REQUEST,
            "BODY-MALFORMED",
            None,
        ),
    ]
}

#[tokio::test]
async fn every_rule_has_a_code_and_a_rejected_batch_writes_nothing() {
    let t = TestApp::new().await;
    for case in cases() {
        let run = t.create_run(&t.key_a).await;
        if !case.setup.as_array().unwrap().is_empty() {
            t.append_ok(&t.key_a, &run, case.setup.clone()).await;
        }
        let before = t.stored_count(&t.tenant_a, &run).await;
        let (status, body) = t.append(&t.key_a, &run, &case.batch).await;
        assert_eq!(status, case.status, "{}: {body}", case.name);
        let err = &body["error"];
        assert_eq!(err["code"], case.code, "{}: {body}", case.name);
        assert_eq!(err["index"].as_u64(), case.index, "{}: {body}", case.name);
        let msg = err["message"].as_str().unwrap_or_default();
        assert!(msg.len() > 10, "{}: the message should explain: {body}", case.name);
        assert_eq!(t.stored_count(&t.tenant_a, &run).await, before, "{}: nothing may be written", case.name);
        let run_row = t.get_json(&t.key_a, &format!("/v1/runs/{run}")).await;
        assert_eq!(run_row["last_seq"], json!(before), "{}: last_seq unchanged", case.name);
    }
}

#[tokio::test]
async fn a_valid_append_after_a_rejection_continues_the_sequence() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}]))
        .await;
    let (s, _) = t
        .append(
            &t.key_a,
            &run,
            &json!([
                {"type": "tool.end", "payload": {"call_id": "c", "ok": true}},
                {"type": "tool.end", "payload": {"call_id": "c", "ok": true}}
            ]),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // The rejected batch's first event (a legal tool.end) did not count: it is legal now.
    assert_eq!(
        t.append_ok(&t.key_a, &run, json!([{"type": "tool.end", "payload": {"call_id": "c", "ok": true}}]))
            .await,
        (2, 2)
    );
}

#[tokio::test]
async fn framing_errors() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let url = format!("{}/v1/runs/{run}/events", t.base);
    let send = |ct: Option<&'static str>, body: Vec<u8>| {
        let mut r = t.http.post(&url).bearer_auth(&t.key_a).body(body);
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        async move {
            let r = r.send().await.unwrap();
            let s = r.status();
            let v: Value = r.json().await.unwrap();
            (s, v["error"]["code"].as_str().unwrap_or_default().to_owned())
        }
    };
    let ev = br#"[{"type":"custom.a","payload":{}}]"#.to_vec();
    assert_eq!(
        send(None, ev.clone()).await,
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "BODY-UNSUPPORTED-MEDIA-TYPE".into())
    );
    assert_eq!(
        send(Some("text/plain"), ev.clone()).await,
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "BODY-UNSUPPORTED-MEDIA-TYPE".into())
    );
    assert_eq!(
        send(Some("application/json"), b"[{\"type\":".to_vec()).await,
        (StatusCode::BAD_REQUEST, "BODY-MALFORMED".into())
    );
    assert_eq!(
        send(Some("application/json"), b"\"events\"".to_vec()).await,
        (StatusCode::BAD_REQUEST, "BODY-MALFORMED".into())
    );
    assert_eq!(
        send(Some("application/json"), vec![b'[', 0xff, 0xfe, b']']).await,
        (StatusCode::BAD_REQUEST, "BODY-MALFORMED".into())
    );
    assert_eq!(
        send(Some("application/x-ndjson"), b"{\"type\":\"custom.a\"}\nnot json\n".to_vec()).await,
        (StatusCode::BAD_REQUEST, "EVENT-MALFORMED".into())
    );
    // Over the 16 MiB body limit: refused from Content-Length, before the body is read.
    let big = vec![b' '; (16 << 20) + 1];
    assert_eq!(
        send(Some("application/json"), big).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "BODY-TOO-LARGE".into())
    );
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 0);
}

#[tokio::test]
async fn a_streamed_body_is_cut_off_at_the_limit() {
    let settings = agent_stream::app::Settings { max_body_bytes: 1024, ..Default::default() };
    let t = TestApp::with_settings(settings).await;
    let run = t.create_run(&t.key_a).await;
    // No Content-Length: a chunked body that never ends within the limit.
    let chunks = futures::stream::iter((0..100).map(|_| Ok::<_, std::io::Error>(vec![b' '; 100])));
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "BODY-TOO-LARGE");
}

#[tokio::test]
async fn bad_ids_and_parameters_are_client_errors() {
    let t = TestApp::new().await;
    let r = t
        .http
        .get(format!("{}/v1/runs/not-a-ulid/events", t.base))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let run = t.create_run(&t.key_a).await;
    for q in ["after_seq=-1", "after_seq=abc", "limit=0", "limit=99999999999999999999", "bogus=1"] {
        let r = t
            .http
            .get(format!("{}/v1/runs/{run}/events?{q}", t.base))
            .bearer_auth(&t.key_a)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{q}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "PARAM-INVALID", "{q}");
    }
    let r = t.http.get(format!("{}/v1/nothing", t.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "NOT-FOUND");
}
