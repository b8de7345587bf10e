//! Regressions from the attack review (issue 25): each test fails on the code before
//! the fix it names.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;
use crate::process::Serve;

/// `--cors-origin '*'` panicked while the router was built; it now means any origin.
#[tokio::test]
async fn a_star_cors_origin_allows_any_origin() {
    let settings = agent_stream::app::Settings { cors_origins: Some(vec!["*".into()]), ..Default::default() };
    let t = TestApp::with_settings(settings).await;
    let r = t
        .http
        .get(format!("{}/healthz", t.base))
        .header("origin", "https://anywhere.example")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()), Some("*"));
}

/// `/replay?speed=1e-300` panicked on the second event ("cannot convert float seconds to
/// Duration") and cut the stream; it now waits, as the speed asks.
#[tokio::test]
async fn a_tiny_replay_speed_waits_instead_of_panicking() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "text.delta", "payload": {"text": "a"}}])).await;
    let mut r = t
        .http
        .get(format!("{}/v1/runs/{run}/replay?speed=1e-300", t.base))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let mut got = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    loop {
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Err(_) => break,
            Ok(Ok(Some(c))) => got.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => panic!("the stream ended early: {got}"),
            Ok(Err(e)) => panic!("the stream broke (a panic on the server?): {e}; got {got}"),
        }
    }
    assert!(got.contains("id: 1\n"), "the first event comes at once: {got}");
    assert!(!got.contains("id: 2\n"), "the second waits: {got}");
}

/// Asserts a refusal with `code` and no 5xx; returns the body.
async fn refused(r: reqwest::Response, code: &str, what: &str) -> Value {
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert!(status.is_client_error(), "{what}: {status} {body}");
    assert_eq!(body["error"]["code"], code, "{what}: {status} {body}");
    body
}

/// The first GraphQL error's code.
fn gql_code(v: &Value) -> &str {
    v["errors"][0]["extensions"]["code"].as_str().unwrap_or("")
}

/// A NUL character anywhere used to reach PostgreSQL and come back as `500 INTERNAL`;
/// every place refuses it with `TEXT-NUL` and writes nothing.
#[tokio::test]
async fn a_nul_character_is_refused_everywhere_with_one_code() {
    use agent_stream::auth::Scope;
    let t = TestApp::new().await;
    let admin = t.key_for_a(&[Scope::Read, Scope::Write, Scope::Admin]).await.secret;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "run.lifecycle", "payload": {"state": "running"}},
            {"type": "child.spawn", "payload": {"child_id": "kid"}}
        ]),
    )
    .await;
    let rows = t.count_rows("agent_run_events").await;
    let nul = "a\u{0}b";
    let appends = [
        ("payload text", json!([{"type": "text.delta", "payload": {"text": nul}}])),
        ("custom payload key", json!([{"type": "custom.x", "payload": {nul: 1}}])),
        ("nested payload", json!([{"type": "custom.x", "payload": {"a": [1, {"b": nul}]}}])),
        ("idempotency key", json!([{"type": "text.delta", "payload": {"text": "x"}, "key": nul}])),
        ("message id", json!([{"type": "message.start", "payload": {"message_id": nul, "role": "user"}}])),
        ("call id", json!([{"type": "tool.start", "payload": {"call_id": nul, "tool": "t"}}])),
        ("tool name", json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": nul}}])),
        ("child id", json!([{"type": "text.delta", "child_id": nul, "payload": {"text": "x"}}])),
        ("reason", json!([{"type": "run.lifecycle", "payload": {"state": "paused", "reason": nul}}])),
        (
            "tool input",
            json!([{"type": "tool.start", "payload": {"call_id": "c", "tool": "t", "input": {"q": nul}}}]),
        ),
    ];
    for (what, body) in appends {
        let r =
            t.http.post(format!("{}/v1/runs/{run}/events", t.base)).bearer_auth(&t.key_a).json(&body).send();
        let v = refused(r.await.expect("send"), "TEXT-NUL", what).await;
        assert_eq!(v["error"]["index"], 0, "{what}: {v}");
    }
    let line = |payload: Value| {
        json!({"id": "01J", "ts": "2026-01-01T00:00:00.000Z", "type": "text.delta", "run_id": "x",
               "child_id": null, "seq": 1, "payload": payload})
        .to_string()
    };
    let r = t
        .http
        .post(format!("{}/v1/runs/import", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/x-ndjson")
        .body(line(json!({"text": nul})))
        .send();
    refused(r.await.expect("send"), "TEXT-NUL", "import line").await;
    let r = t
        .http
        .post(format!("{}/v1/keys", t.base))
        .bearer_auth(&admin)
        .json(&json!({"scopes": ["read"], "label": nul}));
    refused(r.send().await.expect("send"), "TEXT-NUL", "key label").await;
    let r = t.http.delete(format!("{}/v1/keys/%00", t.base)).bearer_auth(&admin).send();
    refused(r.await.expect("send"), "TEXT-NUL", "key id").await;
    for q in ["child_id=%00", "types=%00", "types=text.delta,%00", "format=%00"] {
        let r = t.http.get(format!("{}/v1/runs/{run}/events.jsonl?{q}", t.base)).bearer_auth(&t.key_a).send();
        refused(r.await.expect("send"), "TEXT-NUL", q).await;
    }
    let gql = [
        ("appendEvents payload", "mutation($r: ID!, $e: [EventInput!]!) { appendEvents(runId: $r, events: $e) { lastSeq } }",
         json!({"r": run, "e": [{"type": "text.delta", "payload": {"text": nul}}]})),
        ("appendEvents literal", &*format!("mutation {{ appendEvents(runId: \"{run}\", events: [{{type: \"text.delta\", payload: {{text: \"a\\u0000b\"}}}}]) {{ lastSeq }} }}"), json!({})),
        ("events childId", "query($r: ID!, $c: String) { events(runId: $r, childId: $c) { edges { cursor } } }", json!({"r": run, "c": nul})),
        ("events types", "query($r: ID!, $t: [String!]) { events(runId: $r, types: $t) { edges { cursor } } }", json!({"r": run, "t": [nul]})),
        ("pauseRun", "mutation($r: ID!, $why: String) { pauseRun(runId: $r, reason: $why) { id } }", json!({"r": run, "why": nul})),
        ("redirectRun", "mutation($r: ID!, $i: String!) { redirectRun(runId: $r, instruction: $i) { id } }", json!({"r": run, "i": nul})),
    ];
    for (what, query, vars) in gql {
        let v = t.graphql(Some(&t.key_a), query, vars).await;
        assert_eq!(gql_code(&v), "TEXT-NUL", "{what}: {v}");
    }
    assert_eq!(t.count_rows("agent_run_events").await, rows, "nothing was written");
    assert_eq!(t.count_rows("api_keys").await, 3, "no key was issued");
}

/// A POST to `/graphql` as `key` (or none) with a raw body; status and JSON body.
async fn post_graphql(
    t: &TestApp,
    key: Option<&str>,
    ct: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut req = t.http.post(format!("{}/graphql", t.base)).body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    let r = req.send().await.expect("send");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `POST /graphql` read bodies of any size, with or without a key (a 400 MB body took
/// the server from 129 MB to 1.05 GB). The limit applies before reading: the service's
/// body limit with a key, 64 KiB without one; over it, 413 in GraphQL's error shape.
#[tokio::test]
async fn graphql_bodies_are_limited_before_they_are_read() {
    let settings = agent_stream::app::Settings { max_body_bytes: 1 << 20, ..Default::default() };
    let t = TestApp::with_settings(settings).await;
    let padded = |n: usize| {
        json!({"query": "{ __typename }", "variables": {"pad": "x".repeat(n)}}).to_string().into_bytes()
    };
    let json_ct = Some("application/json");
    let (s, v) = post_graphql(&t, Some(&t.key_a), json_ct, padded(4 << 20)).await;
    assert_eq!((s, gql_code(&v)), (StatusCode::PAYLOAD_TOO_LARGE, "BODY-TOO-LARGE"), "{v}");
    let (s, v) = post_graphql(&t, None, json_ct, padded(100 << 10)).await;
    assert_eq!((s, gql_code(&v)), (StatusCode::PAYLOAD_TOO_LARGE, "BODY-TOO-LARGE"), "{v}");
    // A streamed body without Content-Length is cut off at the limit too.
    let chunks = futures::stream::iter((0..64).map(|_| Ok::<_, std::io::Error>(vec![b' '; 64 << 10])));
    let r = t
        .http
        .post(format!("{}/graphql", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    // Under the limits, both still work.
    let (s, v) = post_graphql(&t, Some(&t.key_a), json_ct, padded(512 << 10)).await;
    assert_eq!((s, &v["data"]["__typename"]), (StatusCode::OK, &json!("Query")), "{v}");
    let (s, v) = post_graphql(&t, None, json_ct, padded(10 << 10)).await;
    assert_eq!((s, &v["data"]["__typename"]), (StatusCode::OK, &json!("Query")), "{v}");
}

/// GraphQL request errors were plain-text 400s without a code, and `text/plain` bodies
/// were accepted: now each gets the standard shape with `extensions.code`.
#[tokio::test]
async fn graphql_request_errors_have_the_standard_shape_and_a_code() {
    let t = TestApp::new().await;
    type Case<'a> = (&'a str, Option<&'a str>, &'a [u8], StatusCode, &'a str);
    let cases: [Case; 6] = [
        (
            "invalid JSON",
            Some("application/json"),
            b"{\"query\": ",
            StatusCode::BAD_REQUEST,
            "BODY-MALFORMED",
        ),
        (
            "null query",
            Some("application/json"),
            b"{\"query\": null}",
            StatusCode::BAD_REQUEST,
            "BODY-MALFORMED",
        ),
        ("not an object", Some("application/json"), b"42", StatusCode::BAD_REQUEST, "BODY-MALFORMED"),
        (
            "text/plain",
            Some("text/plain"),
            b"{\"query\": \"{ __typename }\"}",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "BODY-UNSUPPORTED-MEDIA-TYPE",
        ),
        (
            "form",
            Some("application/x-www-form-urlencoded"),
            b"query=%7B__typename%7D",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "BODY-UNSUPPORTED-MEDIA-TYPE",
        ),
        (
            "no content type",
            None,
            b"{\"query\": \"{ __typename }\"}",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "BODY-UNSUPPORTED-MEDIA-TYPE",
        ),
    ];
    for (what, ct, body, status, code) in cases {
        let (s, v) = post_graphql(&t, Some(&t.key_a), ct, body.to_vec()).await;
        assert_eq!((s, gql_code(&v)), (status, code), "{what}: {v}");
        assert!(v["errors"][0]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {v}");
    }
    let (s, v) = post_graphql(
        &t,
        Some(&t.key_a),
        Some("application/json; charset=utf-8"),
        b"{\"query\": \"{ __typename }\"}".to_vec(),
    )
    .await;
    assert_eq!((s, &v["data"]["__typename"]), (StatusCode::OK, &json!("Query")), "{v}");
}

/// `url` with `application_name` set, in either connection-string form.
fn with_app_name(url: &str, name: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}application_name={name}")
    } else {
        format!("{url} application_name={name}")
    }
}

/// A server on the test's schema whose pool connections carry `app_name`, so the test
/// can find and kill exactly its backends.
async fn server_named(t: &TestApp, app_name: &str) -> String {
    use agent_stream::storage::{Db, DbConfig};
    let pool = Db::new(&DbConfig {
        url: with_app_name(&t.db.url, app_name),
        schema: t.db.schema.clone(),
        max_connections: 4,
    })
    .expect("pool");
    crate::common::serve_app("127.0.0.1:0", agent_stream::app::App::new(pool, t.app.settings.clone())).await.0
}

/// Killing the export's database connection mid-stream gave the client a 200 and a
/// clean end of the body with a fraction of the lines. Now the body is cut off as an
/// error, and only a whole export ends with its `export_end` line.
#[tokio::test]
async fn an_export_that_fails_midway_ends_in_an_error_not_a_clean_end() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let pad = "z".repeat(4000);
    for b in 0..5 {
        let events: Vec<Value> = (0..1000)
            .map(|i| json!({"type": "custom.blob", "payload": {"i": b * 1000 + i, "pad": pad}}))
            .collect();
        t.append_ok(&t.key_a, &run, Value::Array(events)).await;
    }
    let name = format!("export-{}", &t.db.schema);
    let base = server_named(&t, &name).await;
    for path in [format!("/v1/runs/{run}/events.jsonl"), "/v1/events.jsonl".to_owned()] {
        let mut r = t.http.get(format!("{base}{path}")).bearer_auth(&t.key_a).send().await.expect("send");
        assert_eq!(r.status(), StatusCode::OK);
        let mut got = r.chunk().await.expect("first chunk").expect("some data").to_vec();
        // The reader stalls, so the export waits on it with its query open; kill that backend.
        let owner = t.db.owner().await;
        let mut killed = 0;
        for _ in 0..100 {
            let row = owner
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE application_name = $1 AND state <> 'idle' AND query LIKE '%agent_run_events%'",
                    &[&name],
                )
                .await
                .expect("terminate");
            killed = row.get::<_, i64>(0);
            if killed > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(killed, 1, "{path}: the export's backend was found");
        let ended = loop {
            match tokio::time::timeout(Duration::from_secs(30), r.chunk()).await.expect("no hang") {
                Ok(Some(c)) => got.extend_from_slice(&c),
                Ok(None) => break "a clean end",
                Err(_) => break "an error",
            }
        };
        let text = String::from_utf8_lossy(&got);
        let lines = text.lines().count();
        assert!(lines < 5000, "{path}: the export was cut short ({lines} lines)");
        assert_eq!(ended, "an error", "{path}: the client must see the failure ({lines} lines read)");
        assert!(!text.contains("export_end"), "{path}: no end line on a partial export");
    }
}

pub mod ws {
    //! GraphQL WebSocket helpers: raw frames, so tests see close codes.

    use futures::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    use crate::common::TestApp;

    pub type Ws =
        tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    /// What the server sent next.
    #[derive(Debug)]
    pub enum Got {
        /// A protocol message (keep-alives skipped).
        Msg(Value),
        /// A close frame with its code and reason.
        Closed(u16, #[allow(dead_code)] String),
        /// The connection ended without a close frame.
        Gone,
    }

    pub async fn open(base: &str) -> Ws {
        let mut req =
            format!("{}/graphql/ws", base.replace("http://", "ws://")).into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", "graphql-transport-ws".parse().unwrap());
        tokio_tungstenite::connect_async(req).await.expect("ws connect").0
    }

    pub async fn send(ws: &mut Ws, v: Value) {
        let _ = ws.send(Message::Text(v.to_string().into())).await;
    }

    /// An acknowledged connection as `key`.
    pub async fn acked(t: &TestApp, key: &str) -> Ws {
        let mut ws = open(&t.base).await;
        send(
            &mut ws,
            json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {key}")}}),
        )
        .await;
        match next(&mut ws, 10).await {
            Got::Msg(m) if m["type"] == "connection_ack" => ws,
            other => panic!("no ack: {other:?}"),
        }
    }

    pub async fn subscribe(ws: &mut Ws, id: &str, query: &str, variables: Value) {
        send(ws, json!({"id": id, "type": "subscribe", "payload": {"query": query, "variables": variables}}))
            .await;
    }

    /// The next message within `secs` seconds (panics if none comes).
    pub async fn next(ws: &mut Ws, secs: u64) -> Got {
        loop {
            let m = tokio::time::timeout(std::time::Duration::from_secs(secs), ws.next())
                .await
                .unwrap_or_else(|_| panic!("nothing from the server in {secs} s"));
            match m {
                None | Some(Err(_)) => return Got::Gone,
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).expect("json");
                    if !matches!(v["type"].as_str(), Some("ka" | "ping" | "pong")) {
                        return Got::Msg(v);
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    return f.map_or(Got::Closed(1005, String::new()), |f| {
                        Got::Closed(f.code.into(), f.reason.to_string())
                    })
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads until the socket closes (within `secs`); the close code, or 0 if it just ended.
    pub async fn close_code(ws: &mut Ws, secs: u64) -> u16 {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now()).as_secs().max(1);
            match next(ws, left).await {
                Got::Closed(code, _) => return code,
                Got::Gone => return 0,
                Got::Msg(_) if tokio::time::Instant::now() >= deadline => panic!("still open after {secs} s"),
                Got::Msg(_) => {}
            }
        }
    }
}

/// A revoked key kept working on a GraphQL WebSocket opened before the revocation:
/// `runsActivity` still delivered and a `createRun` wrote a run more than 6 s later.
/// Now the socket closes with 4403 within the README's 5 s, and no operation runs on it
/// once the revocation has taken effect.
#[tokio::test]
async fn a_revoked_key_closes_its_websocket_within_5_s_and_runs_nothing_more() {
    use agent_stream::auth::Scope;
    use agent_stream::storage::tenants;
    let t = TestApp::new().await;
    let key = t.key_for_a(&[Scope::Read, Scope::Write]).await;
    let mut socket = ws::acked(&t, &key.secret).await;
    ws::subscribe(&mut socket, "a", "subscription { runsActivity { kind run { id } } }", json!({})).await;
    let create = json!({"query": "mutation { createRun { id } }"});
    ws::send(&mut socket, json!({"id": "c1", "type": "subscribe", "payload": create})).await;
    let mut created = 0;
    while created == 0 {
        if let ws::Got::Msg(m) = ws::next(&mut socket, 10).await {
            created += usize::from(m["id"] == "c1" && m["type"] == "next");
        }
    }
    let runs = t.count_rows("runs").await;
    let owner = t.db.owner().await;
    assert!(tenants::revoke_key(&owner, &key.key_id).await.expect("revoke"));
    let revoked = std::time::Instant::now();
    // Once the key cache has expired (2 s), an operation on the socket must not run.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    ws::send(&mut socket, json!({"id": "c2", "type": "subscribe", "payload": create})).await;
    // Activity from other writers keeps coming until the close.
    let other = t.create_run(&t.key_a).await;
    let code = loop {
        match ws::next(&mut socket, 10).await {
            ws::Got::Closed(code, _) => break code,
            ws::Got::Gone => break 0,
            ws::Got::Msg(m) => assert_ne!(m["id"], "c2", "an operation ran after the revocation: {m}"),
        }
    };
    let took = revoked.elapsed();
    assert_eq!(code, 4403, "closed as Forbidden");
    assert!(took < Duration::from_secs(5), "closed {took:?} after the revocation");
    assert_eq!(t.count_rows("runs").await, runs + 1, "only `{other}` was created after the revocation");
}

/// A refused `connection_init` closed with 1002; graphql-ws clients expect 4401 (no
/// key) and 4403 (a bad key).
#[tokio::test]
async fn a_refused_connection_init_closes_with_4401_or_4403() {
    let t = TestApp::new().await;
    for (payload, want) in [
        (json!({}), 4401),
        (
            json!({"Authorization": "Bearer ask_000000000000_000000000000000000000000000000000000000000"}),
            4403,
        ),
        (json!({"Authorization": "Bearer nonsense"}), 4403),
    ] {
        let mut socket = ws::open(&t.base).await;
        ws::send(&mut socket, json!({"type": "connection_init", "payload": payload})).await;
        assert_eq!(ws::close_code(&mut socket, 10).await, want, "{payload}");
    }
    // An operation before the acknowledgement: 4401 too.
    let mut socket = ws::open(&t.base).await;
    ws::subscribe(&mut socket, "1", "{ __typename }", json!({})).await;
    assert_eq!(ws::close_code(&mut socket, 10).await, 4401);
}

/// Sockets that never sent `connection_init` were held forever (2,000 for 70 s); they
/// are now closed with 4408 after 3 s, like graphql-ws's `connectionInitWaitTimeout`.
#[tokio::test]
async fn a_socket_without_connection_init_is_closed_with_4408() {
    let t = TestApp::new().await;
    let mut socket = ws::open(&t.base).await;
    let started = std::time::Instant::now();
    assert_eq!(ws::close_code(&mut socket, 10).await, 4408);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(2900) && took < Duration::from_secs(6), "{took:?}");
}

/// There was no cap on subscriptions per socket (5,000 accepted) or sockets per key.
#[tokio::test]
async fn subscriptions_per_socket_and_sockets_per_key_are_capped() {
    let settings = agent_stream::app::Settings {
        ws: agent_stream::app::WsLimits { max_operations: 3, max_sockets_per_key: 2, ..Default::default() },
        ..Default::default()
    };
    let t = TestApp::with_settings(settings).await;
    let run = t.create_run(&t.key_a).await;
    let sub = "subscription($r: ID!) { runEvents(runId: $r) { seq } }";
    let mut socket = ws::acked(&t, &t.key_a).await;
    for id in ["1", "2", "3", "4"] {
        ws::subscribe(&mut socket, id, sub, json!({"r": run})).await;
    }
    // The four start concurrently (async-graphql polls new subscriptions in no set
    // order): exactly one of them is refused, whichever came last.
    let refused = match ws::next(&mut socket, 10).await {
        ws::Got::Msg(m) if m["payload"]["errors"].is_array() => m,
        other => panic!("one of them is refused: {other:?}"),
    };
    assert_eq!(refused["payload"]["errors"][0]["extensions"]["code"], "SUBSCRIPTIONS-LIMIT", "{refused}");
    let refused_id = refused["id"].as_str().unwrap_or_default().to_owned();
    let mut open: Vec<String> =
        ["1", "2", "3", "4"].iter().map(|s| s.to_string()).filter(|i| *i != refused_id).collect();
    // Completing one frees its slot.
    let completed = open.remove(0);
    ws::send(&mut socket, json!({"id": completed, "type": "complete"})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ws::subscribe(&mut socket, "5", sub, json!({"r": run})).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        match ws::next(&mut socket, 10).await {
            ws::Got::Msg(m) if m["type"] == "next" => {
                assert!(m["payload"]["errors"].is_null(), "{m}");
                seen.insert(m["id"].as_str().unwrap_or_default().to_owned());
            }
            ws::Got::Msg(_) => {}
            other => panic!("{other:?}"),
        }
    }
    open.push("5".into());
    assert_eq!(seen, open.into_iter().collect());
    // A second socket is fine; a third with the same key is closed with 4429.
    let _second = ws::acked(&t, &t.key_a).await;
    let mut third = ws::open(&t.base).await;
    ws::send(
        &mut third,
        json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {}", t.key_a)}}),
    )
    .await;
    assert_eq!(ws::close_code(&mut third, 10).await, 4429);
    // Another key is counted on its own.
    let _other_key = ws::acked(&t, &t.key_b).await;
    // Closing one frees its place.
    drop(socket);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _again = ws::acked(&t, &t.key_a).await;
}

/// `n` events of about 2 KB each.
fn two_kb(n: usize, tag: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"type": "custom.blob", "payload": {"tag": tag, "i": i, "pad": "q".repeat(2000)}}))
            .collect(),
    )
}

/// Stuck GraphQL WebSockets: 20 clients subscribe to a run and stop reading while
/// 40,000 events of 2 KB are appended. Before, they took the server from 78 MB to
/// 516 MB, which it kept after they closed. Now each holds at most its write buffer and
/// the page in hand, a socket that takes nothing for the stall time is closed with 1013
/// (a reason to resume from), and the memory goes back even while the clients keep
/// their connections open.
#[tokio::test]
async fn stuck_websocket_clients_are_closed_and_the_memory_comes_back() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let server = Serve::start(&t, &["--pool-idle-secs", "2", "--ws-stall-secs", "3"]).await;
    // Warm up the append path, so the figure is about the sockets.
    for b in 0..10 {
        t.append_ok_at(&server.base, &t.key_a, &run, two_kb(1000, b)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let base_rss = server.rss_kib();
    let sub = "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a) { seq type payload } }";
    let mut stuck = vec![];
    for _ in 0..20 {
        let mut socket = ws::open(&server.base).await;
        let init =
            json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {}", t.key_a)}});
        ws::send(&mut socket, init).await;
        ws::subscribe(&mut socket, "1", sub, json!({"r": run, "a": 10_001})).await;
        stuck.push(socket);
    }
    let started = std::time::Instant::now();
    let mut peak = 0;
    for b in 0..40 {
        t.append_ok_at(&server.base, &t.key_a, &run, two_kb(1000, 100 + b)).await;
        peak = peak.max(server.rss_kib());
    }
    let took = started.elapsed();
    // The stall time (3 s) closes the stuck sockets, and the close frame gets 1 s more.
    let (subscribers, closed_after) = server.subscribers_gone().await;
    // Within 10% of the baseline, or 8 MiB of a small one (the debug build starts
    // near 20 MB, where allocator and runtime slack alone is a few MB). Idle pool
    // connections go after 2 s; light traffic lets the allocator hand memory back.
    let slack = (base_rss / 10).max(8 << 10);
    let (after, samples) = server.rss_settling(base_rss + slack).await;
    eprintln!(
        "20 stuck WebSockets, 40,000 events of 2 KB appended in {took:.1?}: closed {closed_after:.1?} after them; \
         server RSS {base_rss} KiB -> peak {peak} KiB -> {after} KiB with the clients' connections still open \
         ({subscribers} subscribers left)"
    );
    assert_eq!(subscribers, 0.0, "the stuck sockets were closed");
    assert!(
        after <= base_rss + slack,
        "memory came back: {base_rss} -> {after} KiB; (rss, anon) samples {samples:?}"
    );
    // A client that reads again finds the events the server had sent, in order from
    // its cursor, then the end: 1013 if the close frame still fitted, else the end of
    // the connection. It resumes after the last seq it got.
    for mut socket in stuck.drain(..3) {
        let mut seqs = vec![];
        let end = loop {
            match ws::next(&mut socket, 30).await {
                ws::Got::Msg(m) if m["type"] == "next" => {
                    seqs.push(m["payload"]["data"]["runEvents"]["seq"].as_i64().unwrap_or(-1))
                }
                ws::Got::Msg(_) => {}
                ws::Got::Closed(code, _) => break code,
                ws::Got::Gone => break 0,
            }
        };
        assert!(matches!(end, 1013 | 0), "{end}");
        let first = 10_002;
        assert_eq!(seqs, (first..first + seqs.len() as i64).collect::<Vec<_>>(), "a prefix from the cursor");
        assert!(seqs.len() < 40_000, "the client had stopped reading");
    }
}

/// Stuck SSE readers: 20 clients with a 4 KiB receive buffer read the response head of
/// a live stream and then nothing, while 20,000 events of 2 KB are appended. Each holds
/// at most its page and a few chunks while it is connected; once it has taken nothing
/// for the stall time, the kernel drops its connection (TCP_USER_TIMEOUT), its stream
/// ends, and the memory comes back. Before, they were held for as long as the clients
/// kept their sockets open (20 of them took the server from 78 MB to 630 MB).
#[tokio::test]
async fn stuck_sse_readers_are_dropped_after_the_stall_time_and_the_memory_comes_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let server = Serve::start(&t, &["--pool-idle-secs", "2", "--ws-stall-secs", "3"]).await;
    for b in 0..5 {
        t.append_ok_at(&server.base, &t.key_a, &run, two_kb(1000, b)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let base_rss = server.rss_kib();
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut stuck = vec![];
    for _ in 0..20 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("rcvbuf");
        let mut s = socket.connect(addr.parse().expect("addr")).await.expect("connect");
        let req = format!(
            "GET /v1/runs/{run}/stream?detail=full&after_seq=5001 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
            t.key_a
        );
        s.write_all(req.as_bytes()).await.expect("request");
        let mut head = [0u8; 256];
        let n = s.read(&mut head).await.expect("head");
        assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
        stuck.push(s);
    }
    // The most readers held at once while the events went out (on a slow database the
    // appends outlast the stall time, and the first readers go before the last append).
    let (mut peak, mut held) = (0, 0.0f64);
    for b in 0..20 {
        t.append_ok_at(&server.base, &t.key_a, &run, two_kb(1000, 100 + b)).await;
        peak = peak.max(server.rss_kib());
        held = held.max(server.subscribers().await);
    }
    // The stall time is 3 s, after which the kernel drops each reader's connection.
    let (left, dropped_after) = server.subscribers_gone().await;
    let slack = (base_rss / 10).max(8 << 10);
    let (after, _) = server.rss_settling(base_rss + slack).await;
    eprintln!(
        "20 stuck SSE readers, 20,000 events of 2 KB: at most {held} subscribers held during the appends; \
         all dropped {dropped_after:.1?} after them; server RSS {base_rss} KiB -> peak {peak} KiB -> {after} KiB with the \
         clients' sockets still open on their side"
    );
    assert_eq!(held, 20.0, "the readers were connected while the events went out");
    assert_eq!(left, 0.0, "the stuck readers' streams ended");
    assert!(after <= base_rss + slack, "memory came back: {base_rss} -> {after} KiB");
    // A reader that reads again gets a prefix of the stream from its cursor, then the
    // end of the connection: it resumes from the last id it got.
    let mut s = stuck.remove(0);
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let ids: Vec<i64> = text.lines().filter_map(|l| l.strip_prefix("id:")?.trim().parse().ok()).collect();
    assert!(ids.len() < 20_000, "the reader had stopped reading");
    assert_eq!(ids, (5_002..5_002 + ids.len() as i64).collect::<Vec<_>>(), "a prefix from the cursor");
}

/// A connection as `user` (password `pw`; `None`: the owner) whose notifications
/// arrive on the receiver.
async fn login_listening(
    t: &TestApp,
    user: Option<&str>,
) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    use futures::StreamExt;
    let mut cfg: tokio_postgres::Config = t.db.url.parse().expect("url");
    if let Some(user) = user {
        cfg.user(user).password("pw");
    }
    let (c, mut conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    (c, rx)
}

/// An owner connection listening on the schema's live channel (as another process's
/// listener does), whose notifications arrive on the receiver.
pub(crate) async fn owner_listening(
    t: &TestApp,
) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    let owner = t.db.owner().await;
    let secret = agent_stream::live::Secret::load(&owner).await.expect("secret");
    let (c, heard) = login_listening(t, None).await;
    c.batch_execute(&format!("SET search_path TO \"{}\"; LISTEN \"{}\"", t.db.schema, secret.channel()))
        .await
        .expect("listen");
    (c, heard)
}

/// An analyst login of tenant `tenant` for this test.
async fn analyst(t: &TestApp, tenant: &str) -> String {
    let role = format!("an_{}_{tenant}", t.db.schema.to_lowercase());
    let mut owner = t.db.owner().await;
    agent_stream::storage::tenants::create_analyst(&mut owner, tenant, &role, Some("pw"))
        .await
        .expect("analyst");
    role
}

/// The NOTIFY channel was open to every login: an analyst could LISTEN and read every
/// tenant's tenant id, run id and seq as they committed. Now the channel's name and its
/// payloads are keyed by a secret only the owner reads, and carry no ids or seqs.
#[tokio::test]
async fn an_analyst_login_learns_nothing_from_the_notify_channel() {
    let t = TestApp::new().await;
    let role = analyst(&t, "a").await;
    let (c, mut heard) = login_listening(&t, Some(&role)).await;
    let guessed = format!("agent_stream_{}", t.db.schema);
    c.batch_execute(&format!("LISTEN \"{guessed}\"")).await.expect("LISTEN is not refused by PostgreSQL");
    let err =
        c.query_one("SELECT secret FROM live_secret", &[]).await.expect_err("the secret is the owner's");
    assert_eq!(err.code(), Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{err:?}");
    // The owner (an operator) listens on the real channel, to see what is sent.
    let (_oc, mut real) = owner_listening(&t).await;
    // Tenant b writes through two instances, so the notifier speaks.
    let other = t.second_instance().await;
    let run_b = t.create_run(&t.key_b).await;
    for base in [t.base.clone(), other] {
        t.append_ok_at(&base, &t.key_b, &run_b, json!([{"type": "custom.x", "payload": {"secret": "of b"}}]))
            .await;
    }
    let (_, payload) = tokio::time::timeout(Duration::from_secs(5), real.recv())
        .await
        .expect("a notification")
        .expect("open");
    for leak in [t.tenant_b.as_str(), run_b.as_str(), "of b"] {
        assert!(!payload.contains(leak), "the payload carries `{leak}`: {payload}");
    }
    assert!(!payload.split_whitespace().any(|w| w == "1" || w == "2"), "no seq: {payload}");
    let got = tokio::time::timeout(Duration::from_secs(1), heard.recv()).await;
    assert!(got.is_err(), "the analyst heard: {got:?}");
}

/// A forged wake-up (`pg_notify` with seq 9223372036854775807) pinned a run's hub at
/// that seq, and its subscribers then waited for the 4 s re-read. Now nothing in a
/// notification decides what a subscriber reads or when.
#[tokio::test]
async fn a_forged_notify_changes_no_subscribers_latency_or_data() {
    let t = TestApp::new().await;
    let role = analyst(&t, "b").await;
    let (forger, _) = login_listening(&t, Some(&role)).await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let mut socket = ws::acked(&t, &t.key_a).await;
    let sub = "subscription($r: ID!) { runEvents(runId: $r) { seq type } }";
    ws::subscribe(&mut socket, "1", sub, json!({"r": run})).await;
    async fn next_seq(socket: &mut ws::Ws) -> i64 {
        match ws::next(socket, 10).await {
            ws::Got::Msg(m) => m["payload"]["data"]["runEvents"]["seq"].as_i64().unwrap_or(-1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(next_seq(&mut socket).await, 1);
    // Forge: the old channel and line format, and garbage on the real channel (which an
    // analyst cannot name; an operator's mistake could still put junk there).
    let owner = t.db.owner().await;
    let real = agent_stream::live::Secret::load(&owner).await.expect("secret").channel();
    let old = format!("agent_stream_{}", t.db.schema);
    for (chan, payload) in [
        (old.as_str(), format!("{} {run} 9223372036854775807 0", t.tenant_a)),
        (real.as_str(), format!("{} {run} 9223372036854775807 0", t.tenant_a)),
        (real.as_str(), "0123456789abcdef01234567 0123456789abcdef01234567 0".to_owned()),
        (real.as_str(), "\n\n  garbage ☃ \n".to_owned()),
    ] {
        forger.execute("SELECT pg_notify($1, $2)", &[&chan, &payload]).await.expect("notify");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = t.second_instance().await;
    let mut slowest = Duration::ZERO;
    for (i, base) in [&t.base, &other, &t.base, &other, &t.base].into_iter().enumerate() {
        let sent = std::time::Instant::now();
        t.append_ok_at(base, &t.key_a, &run, json!([{"type": "custom.tick", "payload": {"i": i}}])).await;
        assert_eq!(next_seq(&mut socket).await, i as i64 + 2, "each event once, in order");
        slowest = slowest.max(sent.elapsed());
    }
    assert!(slowest < Duration::from_millis(1000), "a delivery waited {slowest:?} (the 4 s re-read?)");
}

/// Numbers were silently altered: a 30-digit integer was stored as
/// `1.2345678901234568e29`, and `-0` and `1e-400` became `0.0`. Now numbers are stored
/// exactly as sent (in PostgreSQL's decimal notation: `1e2` reads back as `100`), and
/// what `jsonb` cannot hold exactly is refused; every surface returns the same text.
#[tokio::test]
async fn numbers_are_stored_exactly_and_read_back_the_same_everywhere() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let tiny = format!("0.{}1", "0".repeat(399));
    let sent = r#"{"big":123456789012345678901234567890,"tiny":1e-400,"scaled":1.50,"exp":1e2,"neg":-1.5E-3,"f":0.1,"i":-7}"#;
    let want = [
        "\"big\":123456789012345678901234567890".to_owned(),
        format!("\"tiny\":{tiny}"),
        "\"scaled\":1.50".to_owned(),
        "\"exp\":100".to_owned(),
        "\"neg\":-0.0015".to_owned(),
        "\"f\":0.1".to_owned(),
        "\"i\":-7".to_owned(),
    ];
    let check = |what: &str, text: &str| {
        // The native export passes payloads through as PostgreSQL prints them (`"a": 1`).
        let text = text.replace("\": ", "\":");
        for w in &want {
            assert!(text.contains(w.as_str()), "{what}: `{w}` not in {}", &text[..text.len().min(600)]);
        }
    };
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let body = format!(r#"[{{"type":"custom.n","payload":{sent},"key":"k1"}}]"#);
    let post = |body: String| {
        t.http
            .post(format!("{}/v1/runs/{run}/events", t.base))
            .bearer_auth(&t.key_a)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = post(body.clone()).await.expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    // A retry with the same text is a retry, though the stored text is written another way.
    let r = post(body).await.expect("send");
    assert_eq!(r.status(), StatusCode::OK, "replayed, not a mismatch");
    let (_, page) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events")).await;
    check("GET events", &page);
    let (_, jsonl) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    check("JSONL export", &jsonl);
    let (_, sse) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/replay?speed=10000")).await;
    check("SSE replay", &sse);
    let q = "query($r: ID!) { events(runId: $r) { edges { node { seq payload } } } }";
    let v = t.graphql(Some(&t.key_a), q, json!({"r": run})).await;
    check("GraphQL events", &v.to_string());
    let mut socket = ws::acked(&t, &t.key_a).await;
    ws::subscribe(
        &mut socket,
        "1",
        "subscription($r: ID!) { runEvents(runId: $r, afterSeq: 1) { payload } }",
        json!({"r": run}),
    )
    .await;
    match ws::next(&mut socket, 10).await {
        ws::Got::Msg(m) => check("GraphQL runEvents", &m.to_string()),
        other => panic!("{other:?}"),
    }
    // The same numbers through GraphQL: as variables, and as literals in the query.
    let vars: Value = serde_json::from_str(&format!(
        r#"{{"r": "{run}", "e": [{{"type": "custom.v", "payload": {sent}}}]}}"#
    ))
    .unwrap();
    let m = "mutation($r: ID!, $e: [EventInput!]!) { appendEvents(runId: $r, events: $e) { lastSeq } }";
    let v = t.graphql(Some(&t.key_a), m, vars).await;
    assert_eq!(v["data"]["appendEvents"]["lastSeq"], 3, "{v}");
    let literal = format!(
        "mutation {{ appendEvents(runId: \"{run}\", events: [{{type: \"custom.l\", payload: {{big: 123456789012345678901234567890, tiny: 1e-400, scaled: 1.50, exp: 1e2, neg: -1.5E-3, f: 0.1, i: -7}}}}]) {{ lastSeq }} }}"
    );
    let v = t.graphql(Some(&t.key_a), &literal, json!({})).await;
    assert_eq!(v["data"]["appendEvents"]["lastSeq"], 4, "{v}");
    let (_, page) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events?after_seq=2")).await;
    assert_eq!(page.matches("123456789012345678901234567890").count(), 2, "{page}");
    check("GraphQL appends read back", &page.replace("\"custom.l\"", "").replace("\"custom.v\"", ""));
    // What jsonb cannot hold exactly is refused, naming the number.
    let rows = t.count_rows("agent_run_events").await;
    for (payload, code) in [
        (r#"{"z": -0}"#, "EVENT-NUMBER-UNSTORABLE"),
        (r#"{"z": [1, -0.0]}"#, "EVENT-NUMBER-UNSTORABLE"),
        (r#"{"z": 1e200000}"#, "EVENT-NUMBER-UNSTORABLE"),
        (r#"{"z": 1e-20000}"#, "EVENT-NUMBER-UNSTORABLE"),
    ] {
        let r = post(format!(r#"[{{"type":"custom.bad","payload":{payload}}}]"#)).await.expect("send");
        let v = refused(r, code, payload).await;
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("event.payload.z")), "{v}");
    }
    // A float field keeps what a 64-bit float holds, or refuses the rest.
    let plan = |cost: &str| {
        format!(
            r#"[{{"type":"plan.proposal","payload":{{"plan":{{"id":"p","steps":[{{"id":"s","title":"t","intent":"other","est_cost_usd":{cost}}}]}}}}}}]"#
        )
    };
    let r = post(plan("0.30000000000000004441")).await.expect("send");
    refused(r, "EVENT-INVALID-PAYLOAD", "an inexact float").await;
    assert_eq!(t.count_rows("agent_run_events").await, rows, "nothing was written");
    let r = post(plan("1e-7")).await.expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let (_, page) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events?after_seq=4")).await;
    assert!(page.contains("\"est_cost_usd\":0.0000001"), "{page}");
}

/// At `debug`, the logs carried API key hashes and event data (the PostgreSQL driver
/// logs every statement's parameters there). They carry neither now, at any level.
#[tokio::test]
async fn debug_logs_carry_no_key_hashes_and_no_event_data() {
    use sha2::Digest;
    let t = TestApp::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let log = std::env::temp_dir().join(format!("agent-stream-debug-{}.log", t.db.schema));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--schema",
            &t.db.schema,
            "--retention-interval",
            "0",
        ])
        .env("DATABASE_URL", &t.db.url)
        .env("AGENT_STREAM_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if reqwest::get(format!("{base}/healthz")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = {
        let r = t.http.post(format!("{base}/v1/runs")).bearer_auth(&t.key_a).send().await.expect("create");
        r.json::<Value>().await.expect("json")["run_id"].as_str().expect("id").to_owned()
    };
    let needle = "needle-in-the-payload-7f3a";
    t.append_ok_at(&base, &t.key_a, &run, json!([{"type": "custom.secret", "payload": {"text": needle}}]))
        .await;
    let q = json!({"query": "query($r: ID!) { events(runId: $r) { edges { node { payload } } } }", "variables": {"r": run}});
    let r =
        t.http.post(format!("{base}/graphql")).bearer_auth(&t.key_a).json(&q).send().await.expect("graphql");
    assert!(r.text().await.expect("body").contains(needle));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = child.kill().await;
    let text = std::fs::read_to_string(&log).expect("log");
    let _ = std::fs::remove_file(&log);
    assert!(text.lines().filter(|l| l.contains("DEBUG")).count() >= 3, "debug is on: {text}");
    let hash = hex::encode(sha2::Sha256::digest(t.key_a.as_bytes()));
    for (what, secret) in
        [("event data", needle), ("the key hash", hash.as_str()), ("the key", t.key_a.as_str())]
    {
        assert!(!text.contains(secret), "the log carries {what}");
    }
    // Byte-array renderings of the hash, as Debug would print them.
    let bytes = format!("{:?}", &sha2::Sha256::digest(t.key_a.as_bytes())[..4]);
    assert!(!text.contains(bytes.trim_end_matches(']')), "the log carries the key hash's bytes");
}

/// Smaller holes: the keys API took duplicate (and no) scopes; import ignored a `key`
/// without checking it; a 900 KB unknown type was echoed back whole.
#[tokio::test]
async fn keys_scopes_import_keys_and_echoes_are_checked() {
    use agent_stream::auth::Scope;
    let t = TestApp::new().await;
    let admin = t.key_for_a(&[Scope::Admin]).await.secret;
    let keys = t.count_rows("api_keys").await;
    for scopes in [json!(["read", "read"]), json!(["write", "admin", "write"]), json!([])] {
        let r =
            t.http.post(format!("{}/v1/keys", t.base)).bearer_auth(&admin).json(&json!({"scopes": scopes}));
        refused(r.send().await.expect("send"), "PARAM-INVALID", &scopes.to_string()).await;
    }
    assert_eq!(t.count_rows("api_keys").await, keys, "no key was issued");
    // An export line never has an idempotency key; import refuses one.
    let line = json!({"ts": "2026-01-01T00:00:00.000Z", "type": "text.delta", "seq": 1, "payload": {"text": "a"}, "key": "k"});
    let r = t
        .http
        .post(format!("{}/v1/runs/import", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/x-ndjson")
        .body(line.to_string());
    refused(r.send().await.expect("send"), "EVENT-MALFORMED", "import with a key").await;
    // Echoes of the input are cut short.
    let run = t.create_run(&t.key_a).await;
    let huge = "t".repeat(900 << 10);
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!([{"type": huge, "payload": {}}]))
        .send()
        .await
        .expect("send");
    let v = refused(r, "EVENT-UNKNOWN-TYPE", "a 900 KB type").await;
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.len() < 1200, "the message is {} bytes", m.len());
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events", t.base))
        .bearer_auth(&t.key_a)
        .json(&json!([{"type": "text.delta", "payload": {"text": "a", huge.clone(): 1}}]))
        .send()
        .await
        .expect("send");
    let v = refused(r, "EVENT-INVALID-PAYLOAD", "a 900 KB field name").await;
    assert!(v["error"]["message"].as_str().unwrap_or_default().len() < 1200, "{}", v.to_string().len());
    let q = format!("{{ {huge} }}");
    let v = t.graphql(Some(&t.key_a), &q, json!({})).await;
    assert!(v["errors"][0]["message"].as_str().is_some_and(|m| m.len() < 1200), "{}", v.to_string().len());
}

/// Analyst logins could connect to the cluster's other databases (PostgreSQL grants
/// CONNECT to PUBLIC). Creating one now closes them to PUBLIC, and grants CONNECT to the
/// logins that had it, so nobody else loses access.
#[tokio::test]
async fn an_analyst_login_cannot_connect_to_other_databases() {
    let t = TestApp::new().await;
    let owner = t.db.owner().await;
    let bystander = format!("by_{}", t.db.schema.to_lowercase());
    owner.batch_execute(&format!("CREATE ROLE \"{bystander}\" LOGIN PASSWORD 'pw'")).await.expect("role");
    let others: Vec<String> = owner
        .query(
            "SELECT datname::text FROM pg_database WHERE datallowconn AND datname <> current_database()",
            &[],
        )
        .await
        .expect("databases")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let can = |role: String, db: String| {
        let owner = &owner;
        async move {
            owner
                .query_one("SELECT has_database_privilege($1, $2, 'CONNECT')", &[&role, &db])
                .await
                .expect("privilege")
                .get::<_, bool>(0)
        }
    };
    let before: Vec<bool> =
        futures::future::join_all(others.iter().map(|d| can(bystander.clone(), d.clone()))).await;
    let role = analyst(&t, "a").await;
    for (db, had) in others.iter().zip(before) {
        assert!(!can(role.clone(), db.clone()).await, "the analyst may connect to `{db}`");
        assert_eq!(can(bystander.clone(), db.clone()).await, had, "`{bystander}` kept its access to `{db}`");
        // And the server agrees.
        let mut cfg: tokio_postgres::Config = t.db.url.parse().expect("url");
        cfg.user(&role).password("pw").dbname(db);
        assert!(cfg.connect(tokio_postgres::NoTls).await.is_err(), "connected to `{db}`");
    }
    // Its own database still works.
    let mut cfg: tokio_postgres::Config = t.db.url.parse().expect("url");
    cfg.user(&role).password("pw");
    assert!(cfg.connect(tokio_postgres::NoTls).await.is_ok());
    owner
        .batch_execute(&format!("DROP OWNED BY \"{bystander}\"; DROP ROLE \"{bystander}\""))
        .await
        .expect("drop");
}
