//! Seed 004's wire surface as a client written against the seed finds it: its paths
//! (`/v1/agent/runs/{id}/stream`, `/v1/agent/runs/{id}/approve_plan`), the WebSocket
//! profile on the stream's path (subprotocol `koder-agent-stream-v1`), and its error codes.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use agent_stream::app::AppRef;

use crate::common::TestApp;

/// A WebSocket client's connection.
pub(crate) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the seed's WebSocket profile on `base` for `run`: `query` is the query string
/// (with its `?`), `headers` extra handshake headers. The handshake's error on refusal.
pub(crate) async fn ws_open(
    base: &str,
    key: &str,
    run: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let url = format!("{}/v1/agent/runs/{run}/stream{query}", base.replace("http://", "ws://"));
    let mut req = url.into_client_request().expect("request");
    let h = req.headers_mut();
    h.insert("Authorization", format!("Bearer {key}").parse().expect("header"));
    h.insert("Sec-WebSocket-Protocol", "koder-agent-stream-v1".parse().expect("header"));
    for (k, v) in headers {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = k.parse().expect("header name");
        h.insert(name, v.parse().expect("header"));
    }
    let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()),
        Some("koder-agent-stream-v1"),
        "the server speaks the subprotocol the client opted in with"
    );
    Ok(ws)
}

/// What the socket gives next: a text frame's JSON, or the close code.
#[derive(Debug)]
pub(crate) enum Got {
    Frame(Value),
    Closed(u16),
}

/// The next text frame or the close (pings skipped); a binary frame fails the test.
pub(crate) async fn ws_next(ws: &mut Ws) -> Got {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ws.next()).await.expect("a frame within 20 s");
        match m {
            None => panic!("the connection ended without a close frame"),
            Some(Err(e)) => panic!("ws error: {e}"),
            Some(Ok(Message::Text(t))) => return Got::Frame(serde_json::from_str(&t).expect("a JSON frame")),
            Some(Ok(Message::Close(f))) => return Got::Closed(f.map_or(1005, |f| u16::from(f.code))),
            Some(Ok(Message::Binary(_))) => panic!("binary frames are forbidden by the profile"),
            Some(Ok(_)) => {}
        }
    }
}

/// Every frame until the close: the frames and the close code.
pub(crate) async fn ws_drain(ws: &mut Ws) -> (Vec<Value>, u16) {
    let mut frames = vec![];
    loop {
        match ws_next(ws).await {
            Got::Frame(v) => frames.push(v),
            Got::Closed(code) => return (frames, code),
        }
    }
}

/// The refusal of a handshake: HTTP status and our error code.
fn refused(r: Result<Ws, tokio_tungstenite::tungstenite::Error>) -> (u16, String) {
    match r {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body: Value =
                resp.body().as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
            (resp.status().as_u16(), body["error"]["code"].as_str().unwrap_or_default().to_owned())
        }
        Err(e) => panic!("not an HTTP refusal: {e}"),
        Ok(_) => panic!("the handshake was accepted"),
    }
}

async fn running_run(t: &TestApp) -> String {
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    run
}

fn delta(text: &str) -> Value {
    json!({"type": "text.delta", "payload": {"text": text}})
}

/// A service instance on the test's schema at `addr` (`127.0.0.1:0` for any port):
/// its app, base URL and server task.
pub(crate) async fn instance(t: &TestApp, addr: &str) -> (AppRef, String, tokio::task::JoinHandle<()>) {
    use agent_stream::storage::{Db, DbConfig};
    let pool = Db::new(&DbConfig { url: t.db.url.clone(), schema: t.db.schema.clone(), max_connections: 6 })
        .expect("pool");
    let app = agent_stream::app::App::new(pool, t.app.settings.clone());
    let (base, task) = crate::common::serve_app(addr, app.clone()).await;
    (app, base, task)
}

/// Seed 004's paths are first-class: the stream (SSE) and the planning gate's approval,
/// with the same keys, scopes and answers as ours.
#[tokio::test]
async fn the_seeds_paths_stream_and_approve_plans() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "run.lifecycle", "payload": {"state": "planning"}},
            {"type": "plan.proposal", "payload": {"plan": {"id": "p1", "steps": [{"id": "s1", "title": "Research", "intent": "research"}]}}},
            {"type": "run.lifecycle", "payload": {"state": "awaiting_approval"}},
        ]),
    )
    .await;
    let approve = |key: Option<&str>, run: &str, body: Option<Value>| {
        let mut req = t.http.post(format!("{}/v1/agent/runs/{run}/approve_plan", t.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.expect("send");
            (r.status(), r.json::<Value>().await.unwrap_or_default())
        }
    };
    // Keys and scopes as on our routes.
    assert_eq!(approve(None, &run, None).await.0, StatusCode::UNAUTHORIZED);
    let reader = t.key_for_a(&[agent_stream::auth::Scope::Read]).await;
    let (s, v) = approve(Some(&reader.secret), &run, None).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("AUTH-SCOPE")));
    let (s, v) = approve(Some(&t.key_b), &run, None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("RUN-NOT-FOUND")),
        "another tenant's run"
    );
    let (s, v) = approve(Some(&t.key_a), &run, Some(json!({"reason": "ok", "extra": 1}))).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("BODY-MALFORMED")));
    assert_eq!(t.events(&t.key_a, &run).await.len(), 3, "a refused approval writes nothing");
    // The approval: plan.decision and running, answered with the run.
    let (s, v) = approve(Some(&t.key_a), &run, Some(json!({"reason": "looks good"}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["run_id"].as_str(), v["state"].as_str(), v["last_seq"].as_i64()),
        (Some(run.as_str()), Some("running"), Some(5))
    );
    let events = t.events(&t.key_a, &run).await;
    assert_eq!(events[3]["type"], "plan.decision");
    assert_eq!(events[3]["payload"]["decision"], "approved");
    assert_eq!(events[3]["payload"]["reason"], "looks good");
    assert_eq!(events[4]["payload"]["state"], "running");
    // A second approval: nothing is pending any more.
    let (s, v) = approve(Some(&t.key_a), &run, None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("LIFECYCLE-ILLEGAL-TRANSITION"))
    );

    // The stream on the seed's path is our SSE stream: same frames, same resume.
    t.append_ok(
        &t.key_a,
        &run,
        json!([delta("hi"), {"type": "run.lifecycle", "payload": {"state": "done"}}]),
    )
    .await;
    let seed = t.get_text(&t.key_a, &format!("/v1/agent/runs/{run}/stream?detail=full&after_seq=2")).await;
    let ours = t.get_text(&t.key_a, &format!("/v1/runs/{run}/stream?detail=full&after_seq=2")).await;
    assert_eq!(seed.0, StatusCode::OK);
    let strip = |s: &str| {
        s.lines().filter(|l| l.starts_with("id:") || l.starts_with("event:")).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(strip(&seed.1), strip(&ours.1));
    assert!(seed.1.contains("event: plan.decision") && seed.1.contains("\"dropped_count\":0"));
    let r = t
        .http
        .get(format!("{}/v1/agent/runs/{run}/stream", t.base))
        .bearer_auth(&t.key_a)
        .header("Last-Event-ID", "7")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "a finished run with nothing after the cursor");
    let (s, _) = t.get_text(&t.key_b, &format!("/v1/agent/runs/{run}/stream")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The WebSocket profile: the native envelope as text frames, `Detail: full` for raw
/// mode, resumed with `after_seq` across a service restart (the socket of the stopping
/// instance closes with 1001; the restarted one on the same address continues), every
/// event exactly once, closed with 1000 after the terminal event.
#[tokio::test]
async fn the_websocket_profile_resumes_across_a_service_restart() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let (app1, base, task1) = instance(&t, "127.0.0.1:0").await;
    let mut ws = ws_open(&base, &t.key_a, &run, "", &[("Detail", "full")]).await.expect("handshake");
    let mut seqs = vec![];
    for i in 0..5 {
        t.append_ok(&t.key_a, &run, json!([delta(&format!("a{i}"))])).await;
    }
    while seqs.len() < 6 {
        let Got::Frame(f) = ws_next(&mut ws).await else { panic!("closed early") };
        for k in ["id", "ts", "type", "run_id", "child_id", "seq", "payload"] {
            assert!(f.get(k).is_some(), "envelope field {k} in {f}");
        }
        assert_eq!(f["run_id"], run.as_str());
        seqs.push(f["seq"].as_i64().expect("seq"));
    }
    // The service restarts: the old instance stops, a new one takes its address.
    app1.shut_down();
    match ws_next(&mut ws).await {
        Got::Closed(code) => assert_eq!(code, 1001, "going away: resume"),
        Got::Frame(f) => panic!("a frame after the shutdown: {f}"),
    }
    task1.abort();
    let _ = task1.await;
    for i in 0..5 {
        t.append_ok(&t.key_a, &run, json!([delta(&format!("b{i}"))])).await;
    }
    let addr = base.trim_start_matches("http://").to_owned();
    let (_app2, base2, _task2) = instance(&t, &addr).await;
    assert_eq!(base2, base, "the restarted service listens where the old one did");
    let last = *seqs.last().expect("frames");
    let mut ws = ws_open(&base2, &t.key_a, &run, &format!("?after_seq={last}&detail=full"), &[])
        .await
        .expect("reconnect");
    for i in 0..3 {
        t.append_ok(&t.key_a, &run, json!([delta(&format!("c{i}"))])).await;
    }
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    let (frames, code) = ws_drain(&mut ws).await;
    assert_eq!(code, 1000, "closed normally after the terminal event");
    seqs.extend(frames.iter().map(|f| f["seq"].as_i64().expect("seq")));
    assert_eq!(seqs, (1..=15).collect::<Vec<i64>>(), "every event once, in order");
    let last = frames.last().expect("terminal");
    assert_eq!(
        (last["type"].as_str(), last["payload"]["dropped_count"].as_i64()),
        (Some("run.lifecycle"), Some(0))
    );
    // Resumed with Last-Event-ID in the handshake instead.
    let mut ws = ws_open(&base2, &t.key_a, &run, "", &[("Last-Event-ID", "13"), ("Detail", "full")])
        .await
        .expect("handshake");
    let (frames, code) = ws_drain(&mut ws).await;
    assert_eq!(
        (frames.iter().map(|f| f["seq"].as_i64().unwrap_or(0)).collect::<Vec<_>>(), code),
        (vec![14, 15], 1000)
    );
}

/// R1 and R2 on the WebSocket: by default a thousand deltas become a few merged frames
/// whose text is whole; `Detail: full` sends every one; control events are never merged.
#[tokio::test]
async fn the_websocket_profile_merges_deltas_unless_detail_full() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let batch: Vec<Value> = (0..1000).map(|i| delta(&format!("{i},"))).collect();
    t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}, {"type": "run.lifecycle", "payload": {"state": "done"}}]),
    )
    .await;
    let want: String = (0..1000).map(|i| format!("{i},")).collect();
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[]).await.expect("handshake");
    let (frames, code) = ws_drain(&mut ws).await;
    assert_eq!(code, 1000);
    let deltas: Vec<&Value> = frames.iter().filter(|f| f["type"] == "text.delta").collect();
    assert!(deltas.len() <= 10, "{} merged frames", deltas.len());
    let text: String = deltas.iter().map(|f| f["payload"]["text"].as_str().unwrap_or_default()).collect();
    assert_eq!(text, want);
    assert_eq!(frames.iter().filter(|f| f["type"] == "tool.start").count(), 1);
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[("Detail", "full")]).await.expect("handshake");
    let (frames, _) = ws_drain(&mut ws).await;
    assert_eq!(frames.len(), 1003, "every event its own frame");
    assert!(frames.iter().enumerate().all(|(i, f)| f["seq"] == i as i64 + 1 && f.get("resume_id").is_none()));
}

/// Refusals before the upgrade are HTTP answers with our codes; after it, close codes.
#[tokio::test]
async fn the_websocket_profile_refuses_clearly() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    // No subprotocol offered.
    let mut req = format!("{}/v1/agent/runs/{run}/stream", t.base.replace("http://", "ws://"))
        .into_client_request()
        .expect("req");
    req.headers_mut().insert("Authorization", format!("Bearer {}", t.key_a).parse().expect("h"));
    assert_eq!(
        refused(tokio_tungstenite::connect_async(req).await.map(|(w, _)| w)),
        (400, "PARAM-INVALID".into())
    );
    assert_eq!(
        refused(
            ws_open(
                &t.base,
                "ask_000000000000_000000000000000000000000000000000000000000000000",
                &run,
                "",
                &[]
            )
            .await
        ),
        (401, "AUTH-INVALID".into())
    );
    assert_eq!(refused(ws_open(&t.base, &t.key_b, &run, "", &[]).await), (404, "RUN-NOT-FOUND".into()));
    assert_eq!(
        refused(ws_open(&t.base, &t.key_a, &run, "?after_seq=9", &[]).await),
        (416, "CURSOR-BEYOND-END".into())
    );
    assert_eq!(
        refused(ws_open(&t.base, &t.key_a, &run, "?format=vercel", &[]).await),
        (400, "PARAM-INVALID".into())
    );
    assert_eq!(
        refused(ws_open(&t.base, &t.key_a, &run, "", &[("Detail", "some")]).await),
        (400, "PARAM-INVALID".into())
    );
    // A binary frame from the client ends the socket with 1003; a text frame with 1008.
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[]).await.expect("handshake");
    assert!(matches!(ws_next(&mut ws).await, Got::Frame(f) if f["seq"] == 1));
    ws.send(Message::Binary(vec![1, 2, 3].into())).await.expect("send");
    assert!(matches!(ws_next(&mut ws).await, Got::Closed(1003)));
    let mut ws = ws_open(&t.base, &t.key_a, &run, "?after_seq=1", &[]).await.expect("handshake");
    ws.send(Message::Text("{}".into())).await.expect("send");
    assert!(matches!(ws_next(&mut ws).await, Got::Closed(1008)));
    // A finished run with nothing after the cursor: accepted, then closed normally.
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    let mut ws = ws_open(&t.base, &t.key_a, &run, "?after_seq=2", &[]).await.expect("handshake");
    assert!(matches!(ws_next(&mut ws).await, Got::Closed(1000)));
}

/// A run deleted by retention leaves a tombstone: every read and resume of it answers
/// `410 RUN-EXPIRED` with seed 004's `KAI-STREAM-CONN-0002` (SSE with `Last-Event-ID`,
/// the WebSocket handshake, the log, the view, GraphQL), not `404` as for a run that never
/// was; another tenant still gets `404`.
#[tokio::test]
async fn a_run_deleted_by_retention_answers_410_with_kai_stream_conn_0002() {
    use agent_stream::storage::retention::{sweep, Policy};
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    t.append_ok(&t.key_a, &run, json!([delta("x"), {"type": "run.lifecycle", "payload": {"state": "done"}}]))
        .await;
    let mut owner = t.db.owner().await;
    owner
        .execute("UPDATE runs SET ended_at = now() - interval '100 days' WHERE run_id = $1", &[&run])
        .await
        .expect("age");
    assert_eq!(sweep(&mut owner, Policy::default(), false).await.expect("sweep").runs.len(), 1);
    let gone = |r: reqwest::Response| async move {
        let status = r.status();
        let v: Value = r.json().await.unwrap_or_default();
        assert_eq!(status, StatusCode::GONE, "{v}");
        assert_eq!(v["error"]["code"], "RUN-EXPIRED");
        assert_eq!(v["error"]["kai_code"], "KAI-STREAM-CONN-0002");
    };
    for path in ["", "/events", "/view", "/stream", "/events.jsonl"] {
        gone(
            t.http
                .get(format!("{}/v1/runs/{run}{path}", t.base))
                .bearer_auth(&t.key_a)
                .send()
                .await
                .expect("send"),
        )
        .await;
    }
    let resume = t
        .http
        .get(format!("{}/v1/agent/runs/{run}/stream", t.base))
        .bearer_auth(&t.key_a)
        .header("Last-Event-ID", "2");
    gone(resume.send().await.expect("send")).await;
    assert_eq!(
        refused(ws_open(&t.base, &t.key_a, &run, "?after_seq=2", &[]).await),
        (410, "RUN-EXPIRED".into())
    );
    let v = t.graphql(Some(&t.key_a), "query($id: ID!) { run(id: $id) { id } }", json!({"id": run})).await;
    assert_eq!(v["errors"][0]["extensions"]["code"], "RUN-EXPIRED", "{v}");
    assert_eq!(v["errors"][0]["extensions"]["kai_code"], "KAI-STREAM-CONN-0002", "{v}");
    let (s, body) = t.get_text(&t.key_b, &format!("/v1/runs/{run}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    // A run that never was is still unknown.
    let (s, _) = t.get_text(&t.key_a, "/v1/runs/01HZ7K3M0000000000000000AA").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Seed 004's protocol codes ride beside ours on the write path, where an event can be
/// malformed or of an unknown type: `KAI-STREAM-PROTO-0001` and `-0002`.
#[tokio::test]
async fn malformed_and_unknown_events_carry_kai_stream_proto_codes() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    for (events, code, kai) in [
        (
            json!([{"type": "text.delta", "payload": {"text": "x"}, "seq": 9}]),
            "EVENT-MALFORMED",
            "KAI-STREAM-PROTO-0001",
        ),
        (
            json!([{"type": "text.delta", "payload": {"txt": "x"}}]),
            "EVENT-INVALID-PAYLOAD",
            "KAI-STREAM-PROTO-0001",
        ),
        (json!([{"type": "thought.delta", "payload": {}}]), "EVENT-UNKNOWN-TYPE", "KAI-STREAM-PROTO-0002"),
    ] {
        let (s, v) = t.append(&t.key_a, &run, &events).await;
        assert!(s.is_client_error(), "{s}");
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["kai_code"].as_str()),
            (Some(code), Some(kai)),
            "{v}"
        );
    }
    let (_, v) = t.append(&t.key_a, &run, &json!([])).await;
    assert!(v["error"].get("kai_code").is_none(), "only where the seed has a code: {v}");
    assert_eq!(t.events(&t.key_a, &run).await.len(), 1, "nothing written");
}

/// Merged frames over the WebSocket: a frame sent before the end of its window carries
/// `resume_id`; resuming from each frame's position (`resume_id`, else `seq`) with
/// `after_seq` gives exactly the rest, so text before plus text after is the whole text.
#[tokio::test]
async fn the_websocket_profile_resumes_from_merged_frames_with_resume_id() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut events = vec![];
    for i in 0..40 {
        events.push(json!({"type": "text.delta", "payload": {"text": format!("t{i},")}}));
        events.push(json!({"type": "reasoning.delta", "payload": {"text": format!("r{i},")}}));
    }
    events.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    t.append_ok(&t.key_a, &run, Value::Array(events)).await;
    let text_of = |frames: &[Value], ty: &str| -> String {
        frames
            .iter()
            .filter(|f| f["type"] == ty)
            .map(|f| f["payload"]["text"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[]).await.expect("handshake");
    let (whole, code) = ws_drain(&mut ws).await;
    assert_eq!(code, 1000);
    let with_resume_id = whole.iter().filter(|f| f.get("resume_id").is_some()).count();
    assert!(with_resume_id > 0, "two lanes merged in one window: the first frame is not at a plain seq");
    let (text, reasoning) = (text_of(&whole, "text.delta"), text_of(&whole, "reasoning.delta"));
    assert_eq!(text, (0..40).map(|i| format!("t{i},")).collect::<String>());
    for i in 0..whole.len() - 1 {
        let at = match whole[i].get("resume_id") {
            Some(id) => id.as_str().expect("a string").to_owned(),
            None => whole[i]["seq"].to_string(),
        };
        let mut ws =
            ws_open(&t.base, &t.key_a, &run, &format!("?after_seq={at}"), &[]).await.expect("resume");
        let (rest, _) = ws_drain(&mut ws).await;
        let seen = &whole[..=i];
        assert_eq!(text_of(seen, "text.delta") + &text_of(&rest, "text.delta"), text, "resumed at {at}");
        assert_eq!(
            text_of(seen, "reasoning.delta") + &text_of(&rest, "reasoning.delta"),
            reasoning,
            "at {at}"
        );
    }
}

/// A key revoked while its socket is open closes the socket with 4403 (within 5 s).
#[tokio::test]
async fn a_revoked_key_closes_the_websocket_with_4403() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let key = t.key_for_a(&[agent_stream::auth::Scope::Read]).await;
    let mut ws = ws_open(&t.base, &key.secret, &run, "", &[]).await.expect("handshake");
    assert!(matches!(ws_next(&mut ws).await, Got::Frame(f) if f["seq"] == 1));
    let owner = t.db.owner().await;
    assert!(agent_stream::storage::tenants::revoke_key(&owner, &key.key_id).await.expect("revoke"));
    let started = std::time::Instant::now();
    assert!(matches!(ws_next(&mut ws).await, Got::Closed(4403)));
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
}

/// A socket with frames going out gets no ping; one that has been silent for the
/// keep-alive interval (15 s, the SSE keep-alive's) gets one, counted from its last frame.
#[tokio::test]
async fn the_websocket_profile_pings_only_after_the_keepalive_interval_of_silence() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[]).await.expect("handshake");
    assert!(matches!(ws_next(&mut ws).await, Got::Frame(f) if f["seq"] == 1));
    // Busy for 18 s, a frame every 3 s: a ping per 15 s of wall clock would show up here.
    let mut last_frame = std::time::Instant::now();
    for i in 0..6 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        t.append_ok(&t.key_a, &run, json!([delta(&format!("d{i}"))])).await;
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame");
        match m {
            Some(Ok(Message::Text(_))) => {}
            Some(Ok(Message::Ping(_))) => panic!("a ping {:?} after the last frame", last_frame.elapsed()),
            other => panic!("{other:?}"),
        }
        last_frame = std::time::Instant::now();
    }
    // Then silence: the ping comes 15 s after the last frame.
    let m = tokio::time::timeout(Duration::from_secs(25), ws.next()).await.expect("a ping within 25 s");
    let after = last_frame.elapsed();
    assert!(matches!(m, Some(Ok(Message::Ping(_)))), "{m:?}");
    assert!(after >= Duration::from_millis(14_500) && after < Duration::from_secs(20), "{after:?}");
}
