//! Seed 004's gRPC server-stream profile (`agent.v1.AgentRun/Stream`) on the HTTP listen
//! address, through the client generated from `proto/` over tonic's HTTP/2 transport.

use serde_json::{json, Value};
use tonic::Code;

use agent_stream::http::grpc::pb::agent_run_client::AgentRunClient;
use agent_stream::http::grpc::pb::{Event, StreamRequest};

use crate::common::TestApp;

type Client = AgentRunClient<tonic::transport::Channel>;

async fn client(base: &str) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(base.to_owned())
        .expect("endpoint")
        .connect()
        .await
        .expect("HTTP/2 cleartext to the HTTP listen address");
    AgentRunClient::new(channel)
}

fn request(key: Option<&str>, run: &str, after_seq: i64, detail_full: bool) -> tonic::Request<StreamRequest> {
    let mut r = tonic::Request::new(StreamRequest {
        run_id: run.to_owned(),
        after_seq,
        detail_full,
        resume_id: String::new(),
    });
    if let Some(k) = key {
        r.metadata_mut().insert("authorization", format!("Bearer {k}").parse().expect("metadata"));
    }
    r
}

/// Every message until the end: the events, and the status if it ended with one.
async fn drain(mut s: tonic::Streaming<Event>) -> (Vec<Event>, Option<tonic::Status>) {
    let mut out = vec![];
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(20), s.message()).await.expect("20 s") {
            Ok(Some(e)) => out.push(e),
            Ok(None) => return (out, None),
            Err(st) => return (out, Some(st)),
        }
    }
}

fn delta(text: &str) -> Value {
    json!({"type": "text.delta", "payload": {"text": text}})
}

/// History then live, every event the stored envelope (payload as JSON bytes, numbers
/// exact), resumed with `after_seq`; a clean end after the terminal event.
#[tokio::test]
async fn the_grpc_profile_streams_history_then_live_and_resumes() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([{"type": "run.lifecycle", "payload": {"state": "running"}},
               {"type": "custom.n", "payload": {"big": 123456789012345678901234567890u128, "tiny": 1e-300}}]),
    )
    .await;
    let mut c = client(&t.base).await;
    let mut s = c.stream(request(Some(&t.key_a), &run, 0, true)).await.expect("stream").into_inner();
    let first = s.message().await.expect("ok").expect("an event");
    assert_eq!((first.seq, first.r#type.as_str(), first.run_id.as_str()), (1, "run.lifecycle", run.as_str()));
    let second = s.message().await.expect("ok").expect("an event");
    let payload: Value = serde_json::from_slice(&second.payload).expect("JSON payload");
    assert_eq!(payload["big"].to_string(), "123456789012345678901234567890", "numbers exact, not doubles");
    assert_eq!(
        payload["tiny"].to_string(),
        format!("0.{}1", "0".repeat(299)),
        "1e-300 in PostgreSQL's notation"
    );
    // Live.
    t.append_ok(
        &t.key_a,
        &run,
        json!([delta("a"), delta("b"), {"type": "run.lifecycle", "payload": {"state": "done"}}]),
    )
    .await;
    let (rest, end) = drain(s).await;
    assert!(end.is_none(), "a clean end after the terminal event: {end:?}");
    let log = t.events(&t.key_a, &run).await;
    let all: Vec<Event> = [first, second].into_iter().chain(rest).collect();
    assert_eq!(all.len(), log.len());
    for (e, l) in all.iter().zip(&log) {
        assert_eq!(e.id, l["id"].as_str().unwrap_or_default());
        assert_eq!(e.ts, l["ts"].as_str().unwrap_or_default());
        assert_eq!(e.seq, l["seq"].as_i64().unwrap_or_default());
        assert_eq!(e.child_id, None);
        let mut p: Value = serde_json::from_slice(&e.payload).expect("json");
        if let Some(o) = p.as_object_mut() {
            o.remove("dropped_count");
        }
        assert_eq!(p, l["payload"]);
    }
    let (tail, end) =
        drain(c.stream(request(Some(&t.key_a), &run, 3, true)).await.expect("stream").into_inner()).await;
    assert_eq!((tail.iter().map(|e| e.seq).collect::<Vec<_>>(), end.is_none()), (vec![4, 5], true));
    // Merged by default (R1): a thousand deltas in a few messages, text whole.
    let run = t.create_run(&t.key_a).await;
    let mut batch = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
    batch.extend((0..1000).map(|i| delta(&format!("{i},"))));
    batch.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
    let (events, _) =
        drain(c.stream(request(Some(&t.key_a), &run, 0, false)).await.expect("stream").into_inner()).await;
    let deltas: Vec<&Event> = events.iter().filter(|e| e.r#type == "text.delta").collect();
    assert!(deltas.len() <= 10, "{} merged messages", deltas.len());
    let text: String = deltas
        .iter()
        .map(|e| {
            serde_json::from_slice::<Value>(&e.payload).expect("json")["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(text, (0..1000).map(|i| format!("{i},")).collect::<String>());
    assert_eq!(deltas[0].first_seq, 2);
}

/// Refusals are gRPC statuses with our code in `x-error-code`; the same path without
/// `application/grpc` is our 415; a stream cut by a shutdown ends with UNAVAILABLE, so
/// the client resumes instead of taking it for the end.
#[tokio::test]
async fn the_grpc_profile_refuses_with_statuses_and_tells_a_cut_from_an_end() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let mut c = client(&t.base).await;
    let refused = |r: Result<tonic::Response<tonic::Streaming<Event>>, tonic::Status>| match r {
        Ok(_) => panic!("accepted"),
        Err(s) => (
            s.code(),
            s.metadata().get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned(),
        ),
    };
    assert_eq!(
        refused(c.stream(request(None, &run, 0, true)).await),
        (Code::Unauthenticated, "AUTH-MISSING".into())
    );
    assert_eq!(
        refused(c.stream(request(Some(&t.key_b), &run, 0, true)).await),
        (Code::NotFound, "RUN-NOT-FOUND".into())
    );
    assert_eq!(
        refused(c.stream(request(Some(&t.key_a), &run, 9, true)).await),
        (Code::OutOfRange, "CURSOR-BEYOND-END".into())
    );
    assert_eq!(
        refused(c.stream(request(Some(&t.key_a), &run, -1, true)).await),
        (Code::InvalidArgument, "PARAM-INVALID".into())
    );
    assert_eq!(
        refused(c.stream(request(Some(&t.key_a), "nope", 0, true)).await),
        (Code::InvalidArgument, "PARAM-INVALID".into())
    );
    let r = t
        .http
        .post(format!("{}/agent.v1.AgentRun/Stream", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), reqwest::StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (app, base, _task) = crate::seed_profile::instance(&t, "127.0.0.1:0").await;
    let mut c = client(&base).await;
    let mut s = c.stream(request(Some(&t.key_a), &run, 0, true)).await.expect("stream").into_inner();
    assert_eq!(s.message().await.expect("ok").expect("event").seq, 1);
    app.shut_down();
    let (rest, end) = drain(s).await;
    assert!(rest.is_empty());
    assert_eq!(end.map(|s| s.code()), Some(Code::Unavailable), "cut, not ended: resume");
}
