//! Hostile input: every malformed request gets a 4xx with a stable code, never a 5xx
//! or a dropped connection, and writes nothing. Ends with the counts.

use serde_json::{json, Value};

use crate::common::TestApp;

#[tokio::test]
async fn hostile_http_and_graphql_input_gets_4xx_with_a_code_and_writes_nothing() {
    let settings = agent_stream::app::Settings {
        max_body_bytes: 64 << 10,
        limits: agent_stream::domain::Limits { max_event_bytes: 8 << 10, max_batch_events: 100 },
        ..Default::default()
    };
    let t = TestApp::with_settings(settings).await;
    let run = t.create_run(&t.key_a).await;
    let events = format!("{}/v1/runs/{run}/events", t.base);
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let huge = "x".repeat(20 << 10);
    // (what, method, url, content type, body, extra header)
    type Case = (
        &'static str,
        &'static str,
        String,
        Option<&'static str>,
        Vec<u8>,
        Option<(&'static str, &'static str)>,
    );
    let json_ct = Some("application/json");
    let cases: Vec<Case> = vec![
        ("malformed JSON", "POST", events.clone(), json_ct, br#"[{"type":"#.to_vec(), None),
        (
            "invalid UTF-8",
            "POST",
            events.clone(),
            json_ct,
            b"[{\"type\":\"text.delta\",\"payload\":{\"text\":\"\xff\xfe\"}}]".to_vec(),
            None,
        ),
        (
            "wrong content type",
            "POST",
            events.clone(),
            Some("text/plain"),
            br#"[{"type":"text.delta","payload":{"text":"a"}}]"#.to_vec(),
            None,
        ),
        (
            "no content type",
            "POST",
            events.clone(),
            None,
            br#"[{"type":"text.delta","payload":{"text":"a"}}]"#.to_vec(),
            None,
        ),
        ("body over the limit", "POST", events.clone(), json_ct, vec![b' '; 100 << 10], None),
        (
            "deep nesting",
            "POST",
            events.clone(),
            json_ct,
            format!(r#"[{{"type":"custom.x","payload":{{"a":{deep}}}}}]"#).into_bytes(),
            None,
        ),
        (
            "huge string",
            "POST",
            events.clone(),
            json_ct,
            format!(r#"[{{"type":"text.delta","payload":{{"text":"{huge}"}}}}]"#).into_bytes(),
            None,
        ),
        (
            "too many events",
            "POST",
            events.clone(),
            json_ct,
            serde_json::to_vec(&vec![json!({"type": "text.delta", "payload": {"text": "a"}}); 101]).unwrap(),
            None,
        ),
        (
            "unknown event field",
            "POST",
            events.clone(),
            json_ct,
            br#"[{"type":"text.delta","payload":{"text":"a"},"bogus":1}]"#.to_vec(),
            None,
        ),
        (
            "unknown payload field",
            "POST",
            events.clone(),
            json_ct,
            br#"[{"type":"text.delta","payload":{"text":"a","bogus":1}}]"#.to_vec(),
            None,
        ),
        (
            "server field sent",
            "POST",
            events.clone(),
            json_ct,
            br#"[{"type":"text.delta","seq":7,"payload":{"text":"a"}}]"#.to_vec(),
            None,
        ),
        (
            "unknown type",
            "POST",
            events.clone(),
            json_ct,
            br#"[{"type":"rm.rf","payload":{}}]"#.to_vec(),
            None,
        ),
        (
            "number for a string",
            "POST",
            events.clone(),
            json_ct,
            br#"[{"type":"text.delta","payload":{"text":12}}]"#.to_vec(),
            None,
        ),
        (
            "NUL in JSON",
            "POST",
            events.clone(),
            json_ct,
            b"[{\"type\":\"text.delta\",\"payload\":{\"text\":\"a\"}}]\0".to_vec(),
            None,
        ),
        ("empty batch", "POST", events.clone(), json_ct, b"[]".to_vec(), None),
        (
            "negative expected_last_seq",
            "POST",
            format!("{events}?expected_last_seq=-1"),
            json_ct,
            br#"[{"type":"text.delta","payload":{"text":"a"}}]"#.to_vec(),
            None,
        ),
        ("negative after_seq", "GET", format!("{events}?after_seq=-1"), None, vec![], None),
        (
            "overflowing after_seq",
            "GET",
            format!("{events}?after_seq=99999999999999999999999"),
            None,
            vec![],
            None,
        ),
        ("non-numeric after_seq", "GET", format!("{events}?after_seq=abc"), None, vec![], None),
        ("zero limit", "GET", format!("{events}?limit=0"), None, vec![], None),
        ("huge limit", "GET", format!("{events}?limit=99999999"), None, vec![], None),
        ("unknown query parameter", "GET", format!("{events}?bogus=1"), None, vec![], None),
        (
            "bad Last-Event-ID",
            "GET",
            format!("{}/v1/runs/{run}/stream", t.base),
            None,
            vec![],
            Some(("last-event-id", "abc")),
        ),
        (
            "negative Last-Event-ID",
            "GET",
            format!("{}/v1/runs/{run}/stream", t.base),
            None,
            vec![],
            Some(("last-event-id", "-3")),
        ),
        (
            "negative stream after_seq",
            "GET",
            format!("{}/v1/runs/{run}/stream?after_seq=-5", t.base),
            None,
            vec![],
            None,
        ),
        ("bad detail", "GET", format!("{}/v1/runs/{run}/stream?detail=all", t.base), None, vec![], None),
        ("bad format", "GET", format!("{}/v1/runs/{run}/stream?format=xml", t.base), None, vec![], None),
        ("bad replay speed", "GET", format!("{}/v1/runs/{run}/replay?speed=-1", t.base), None, vec![], None),
        ("non-ULID run id", "GET", format!("{}/v1/runs/not-a-ulid/events", t.base), None, vec![], None),
        (
            "UUID run id",
            "POST",
            format!("{}/v1/runs/123e4567-e89b-12d3-a456-426614174000/events", t.base),
            json_ct,
            br#"[{"type":"text.delta","payload":{"text":"a"}}]"#.to_vec(),
            None,
        ),
        (
            "SQL in run id",
            "GET",
            format!("{}/v1/runs/'%3B%20DROP%20TABLE%20runs%3B--", t.base),
            None,
            vec![],
            None,
        ),
        (
            "unknown parent",
            "POST",
            format!("{}/v1/runs", t.base),
            json_ct,
            br#"{"parent_run_id":"01ARZ3NDEKTSV4RRFFQ69G5FAV"}"#.to_vec(),
            None,
        ),
        (
            "unknown create field",
            "POST",
            format!("{}/v1/runs", t.base),
            json_ct,
            br#"{"parent":"x"}"#.to_vec(),
            None,
        ),
        (
            "bad import",
            "POST",
            format!("{}/v1/runs/import", t.base),
            Some("application/x-ndjson"),
            b"{\"seq\":1}\n".to_vec(),
            None,
        ),
        (
            "bad export range",
            "GET",
            format!("{}/v1/runs/{run}/events.jsonl?from_seq=-1", t.base),
            None,
            vec![],
            None,
        ),
        ("bad export since", "GET", format!("{}/v1/events.jsonl?since=1e9", t.base), None, vec![], None),
        ("unknown route", "GET", format!("{}/v1/nothing/here", t.base), None, vec![], None),
    ];
    let (mut fours, mut fives, mut dropped) = (0, 0, 0);
    for (what, method, url, ct, body, header) in cases {
        let mut req = match method {
            "POST" => t.http.post(&url).body(body),
            _ => t.http.get(&url),
        }
        .bearer_auth(&t.key_a);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let Ok(r) = req.send().await else {
            dropped += 1;
            eprintln!("{what}: connection dropped");
            continue;
        };
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if status.is_server_error() {
            fives += 1;
        }
        assert!(status.is_client_error(), "{what}: {status} {body}");
        assert!(
            body["error"]["code"]
                .as_str()
                .is_some_and(|c| c.chars().all(|c| c.is_ascii_uppercase() || c == '-')),
            "{what}: {body}"
        );
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
        fours += 1;
    }
    // GraphQL: limits and the standard errors shape with extensions.code.
    let deep_query = format!("{{ {}__typename{} }}", "run(id: \"x\") { view { ".repeat(8), " } }".repeat(8));
    let gql_cases = vec![
        ("query too deep", json!({"query": deep_query})),
        ("syntax error", json!({"query": "{ run(id: "})),
        ("unknown field", json!({"query": "{ nothing }"})),
        (
            "bad variable",
            json!({"query": "query($n: Int) { events(runId: \"x\", first: $n) { edges { cursor } } }", "variables": {"n": "abc"}}),
        ),
        (
            "append without write",
            json!({"query": "mutation { appendEvents(runId: \"01ARZ3NDEKTSV4RRFFQ69G5FAV\", events: []) { lastSeq } }"}),
        ),
        ("batch too large", Value::Array(vec![json!({"query": "{ __typename }"}); 11])),
    ];
    for (what, body) in gql_cases {
        let r = t.http.post(format!("{}/graphql", t.base)).bearer_auth(&t.key_a).json(&body).send().await;
        let Ok(r) = r else {
            dropped += 1;
            continue;
        };
        let status = r.status();
        if status.is_server_error() {
            fives += 1;
        }
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let errors = if v.is_array() { v[0]["errors"].clone() } else { v["errors"].clone() };
        assert!(errors.as_array().is_some_and(|e| !e.is_empty()), "{what}: {v}");
        assert!(errors[0]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {v}");
        assert!(errors[0]["extensions"]["code"].is_string(), "{what}: {v}");
    }
    let (rows, runs) = (t.count_rows("agent_run_events").await, t.count_rows("runs").await);
    eprintln!(
        "hostile requests: {fours} answered 4xx, 5xx = {fives}, dropped = {dropped}, rows written = {rows}"
    );
    assert_eq!((fives, dropped, rows, runs), (0, 0, 0, 1));
}

/// The hostile corpus (issue 25): each class of hostile value, in every endpoint's
/// inputs (paths, query strings, headers, bodies, GraphQL arguments and variables,
/// WebSocket messages), against a separate `agent-stream serve` process. Asserts no
/// answer of 500 or more, no dropped connection, not one row written, and the server's
/// resident memory back within 10% of its baseline once the attack is over.
///
/// The baseline is taken after two rehearsals of the corpus: the first call of a code
/// path (an error path, say) brings the binary's pages for it in once, and the first
/// requests of each size grow the allocator's and the connections' buffers to what
/// such requests need; both would otherwise count as growth. The attack is then the
/// corpus twice more: what it leaves behind beyond that is what the attack cost.
#[tokio::test]
async fn the_hostile_corpus_gets_no_5xx_writes_nothing_and_leaves_memory_as_it_was() {
    use crate::process::Serve;
    use agent_stream::auth::Scope;
    use std::time::Duration;
    let t = TestApp::new().await;
    let admin = t.key_for_a(&[Scope::Read, Scope::Write, Scope::Admin]).await.secret;
    let server =
        Serve::start(&t, &["--pool-idle-secs", "2", "--ws-stall-secs", "3", "--max-body-bytes", "4194304"])
            .await;
    let base = server.base.clone();
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    // Warm the ordinary paths once, then take the baseline.
    for path in [format!("/v1/runs/{run}"), format!("/v1/runs/{run}/events"), format!("/v1/runs/{run}/view")]
    {
        let _ = t.http.get(format!("{base}{path}")).bearer_auth(&t.key_a).send().await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = server.rss_kib();
    let counts = || async {
        (t.count_rows("agent_run_events").await, t.count_rows("runs").await, t.count_rows("api_keys").await)
    };
    let before = counts().await;

    // The classes, as JSON values and as raw text for URLs and headers.
    let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    let values: Vec<(&str, Value)> = vec![
        ("NUL", json!("a\u{0}b")),
        ("long string", json!("x".repeat(2 << 20))),
        ("long id", json!("i".repeat(300))),
        ("empty", json!("")),
        ("SQL", json!("'; DROP TABLE agent_run_events; --")),
        ("control characters", json!("\u{1}\u{7}\u{1b}[31m\r\n\t")),
        ("unicode oddities", json!("\u{feff}\u{200b}\u{202e}\u{fffd}\u{ffff}𝕏")),
        ("negative zero", serde_json::from_str("-0").unwrap()),
        ("huge number", serde_json::from_str("1e999999").unwrap()),
        ("big integer", serde_json::from_str("123456789012345678901234567890").unwrap()),
        ("negative", json!(-1)),
        ("i64 max", json!(i64::MAX)),
        ("float", json!(1.5)),
        ("null", Value::Null),
        ("bool", json!(true)),
        ("array", json!([1, "two", null])),
        ("object", json!({"$where": "1", "__proto__": {"x": 1}})),
        ("deep", serde_json::from_str(&deep(100)).unwrap()),
    ];
    let raw: Vec<(&str, String)> = vec![
        ("NUL", "%00".into()),
        ("long", "x".repeat(16 << 10)),
        ("SQL", "%27%3B%20DROP%20TABLE%20runs%3B--".into()),
        ("bad percent", "%ZZ%".into()),
        ("invalid UTF-8", "%FF%FE".into()),
        ("slashes", "..%2F..%2Fetc%2Fpasswd".into()),
        ("negative", "-1".into()),
        ("huge", "99999999999999999999999999".into()),
        ("float", "1e-300".into()),
        ("empty", "".into()),
        ("unicode", "%E2%80%AE%EF%BB%BF".into()),
    ];
    let (mut fives, mut dropped, mut writes) = (vec![], vec![], vec![]);
    let (mut total, mut cut_off, mut ws_cases, mut retried) = (0, 0, 0, 0);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let (mut baseline, mut rss_rehearsed, mut anon_baseline) = (0, 0, 0);
    let mut per_pass = vec![];
    for pass in 0..4 {
        per_pass.push(server.rss_kib());
        if pass == 2 {
            // After the rehearsal: the baseline.
            tokio::time::sleep(Duration::from_secs(6)).await;
            baseline = server.rss_kib();
            rss_rehearsed = baseline;
            anon_baseline = server.anon_kib();
        }
        type Req = (String, reqwest::RequestBuilder);
        let mut reqs: Vec<Req> = vec![];
        // A client of its own, whose connections close when the attack is over.
        let attacker = reqwest::Client::new();
        let h = &attacker;
        let get = |path: String, key: &str| {
            (format!("GET {}", &path[..path.len().min(80)]), h.get(format!("{base}{path}")).bearer_auth(key))
        };
        let post = |path: &str, key: &str, ct: &str, body: Vec<u8>| {
            let shown = String::from_utf8_lossy(&body[..body.len().min(160)]).into_owned();
            (
                format!("POST {path} {shown}"),
                h.post(format!("{base}{path}")).bearer_auth(key).header("content-type", ct).body(body),
            )
        };
        // Paths and query strings.
        for (what, v) in &raw {
            let _ = what;
            for path in [
                format!("/v1/runs/{v}"),
                format!("/v1/runs/{v}/events"),
                format!("/v1/runs/{v}/view"),
                format!("/v1/runs/{v}/stream"),
                format!("/v1/runs/{run}/events?after_seq={v}"),
                format!("/v1/runs/{run}/events?limit={v}"),
                format!("/v1/runs/{run}/events?{v}={v}"),
                format!("/v1/runs/{run}/stream?after_seq={v}"),
                format!("/v1/runs/{run}/stream?format={v}"),
                format!("/v1/runs/{run}/stream?detail={v}"),
                format!("/v1/runs/{run}/replay?speed={v}"),
                format!("/v1/runs/{run}/events.jsonl?from_seq={v}"),
                format!("/v1/runs/{run}/events.jsonl?child_id={v}"),
                format!("/v1/runs/{run}/events.jsonl?types={v}"),
                format!("/v1/runs/{run}/events.jsonl?format={v}"),
                format!("/v1/events.jsonl?since={v}"),
                format!("/v1/keys?{v}"),
                format!("/v1/nothing/{v}"),
                format!("/readyz?{v}"),
            ] {
                reqs.push(get(path, &t.key_a));
            }
            reqs.push((
                format!("DELETE key {what}"),
                h.delete(format!("{base}/v1/keys/{v}")).bearer_auth(&admin),
            ));
            reqs.push((
                format!("stream with Last-Event-ID {what}"),
                h.get(format!("{base}/v1/runs/{run}/stream"))
                    .bearer_auth(&t.key_a)
                    .header("last-event-id", v.replace('%', "")),
            ));
            reqs.push((format!("bad bearer {what}"), h.get(format!("{base}/v1/runs/{run}")).bearer_auth(v)));
        }
        // Bodies.
        let events = format!("/v1/runs/{run}/events");
        for (_, v) in &values {
            let bodies: Vec<Value> = vec![
                // Every event below is refused for some reason besides the value, so only the
                // checks decide whether they answer 4xx rather than 5xx.
                json!([{"type": v, "payload": {}}]),
                json!([{"type": "text.delta", "payload": v}]),
                json!([{"type": "tool.end", "payload": {"call_id": v, "ok": true}}]),
                json!([{"type": "message.end", "payload": {"message_id": v}}]),
                json!([{"type": "run.lifecycle", "payload": {"state": v}}]),
                json!([{"type": "custom.x", "payload": {"a": v}, "seq": 1}]),
                json!([{"type": "custom.x", "payload": {"a": v}, "key": v, "child_id": "never-spawned"}]),
                // (A null child is no child: a plain delta, so the value goes with a bad key.)
                json!([{"type": "text.delta", "payload": {"text": "a"}, "child_id": v, "key": ""}]),
                json!({"events": v, "expected_last_seq": v}),
                json!({"events": [{"type": "custom.x", "payload": {"v": v}}], "expected_last_seq": -5}),
                json!([{"type": "plan.proposal", "payload": {"plan": {"id": v, "steps": [{"id": "s", "title": "t", "intent": v}]}}}]),
            ];
            for b in bodies {
                reqs.push(post(&events, &t.key_a, "application/json", serde_json::to_vec(&b).unwrap()));
                let mut nd = serde_json::to_vec(&b).unwrap();
                nd.push(b'\n');
                reqs.push(post(&events, &t.key_a, "application/x-ndjson", nd));
            }
            // (A null parent is a plain run: not hostile.)
            if !v.is_null() {
                reqs.push(post(
                    "/v1/runs",
                    &t.key_a,
                    "application/json",
                    serde_json::to_vec(&json!({"parent_run_id": v})).unwrap(),
                ));
            }
            reqs.push(post(
                "/v1/keys",
                &admin,
                "application/json",
                serde_json::to_vec(&json!({"scopes": [v], "label": v})).unwrap(),
            ));
            reqs.push(post(
                "/v1/keys",
                &admin,
                "application/json",
                serde_json::to_vec(&json!({"scopes": v, "label": "x"})).unwrap(),
            ));
            let line = json!({"ts": v, "type": "text.delta", "seq": 1, "payload": {"text": v}});
            reqs.push(post(
                "/v1/runs/import",
                &t.key_a,
                "application/x-ndjson",
                serde_json::to_vec(&line).unwrap(),
            ));
            let line = json!({"ts": "2026-01-01T00:00:00Z", "type": "text.delta", "seq": v, "payload": {"text": "a"}});
            reqs.push(post(
                "/v1/runs/import",
                &t.key_a,
                "application/x-ndjson",
                serde_json::to_vec(&line).unwrap(),
            ));
            // GraphQL: variables and literals.
            let gql =
                |q: &str, vars: Value| serde_json::to_vec(&json!({"query": q, "variables": vars})).unwrap();
            for (q, vars) in [
                ("query($v: ID!) { run(id: $v) { id } }", json!({"v": v})),
                ("query($r: ID!, $v: String) { events(runId: $r, childId: $v) { edges { cursor } } }", json!({"r": run, "v": v})),
                ("query($r: ID!, $v: [String!]) { events(runId: $r, types: $v) { edges { cursor } } }", json!({"r": run, "v": [v]})),
                ("query($v: Int) { runs(first: $v) { edges { cursor } } }", json!({"v": v})),
                ("mutation($r: ID!, $v: JSON) { appendEvents(runId: $r, events: [{type: \"tool.end\", payload: $v}]) { lastSeq } }", json!({"r": run, "v": v})),
                ("mutation($r: ID!, $v: String) { approvePlan(runId: $r, reason: $v) { id } }", json!({"r": run, "v": v})),
                ("mutation($v: ID) { createRun(parentRunId: $v) { id } }", json!({"v": v})),
            ] {
                if v.is_null() && q.contains("createRun") {
                    continue;
                }
                reqs.push(post("/graphql", &t.key_a, "application/json", gql(q, vars)));
            }
        }
        // Raw bodies that are not JSON at all.
        for (what, body) in [
            ("invalid UTF-8", b"[{\"type\":\"text.delta\",\"payload\":{\"text\":\"\xff\xfe\"}}]".to_vec()),
            ("truncated", b"[{\"type\":".to_vec()),
            ("deep array", deep(100_000).into_bytes()),
            ("lone surrogate", br#"[{"type":"text.delta","payload":{"text":"\ud800"}}]"#.to_vec()),
            ("over the body limit", vec![b'['; 5 << 20]),
            ("empty", vec![]),
        ] {
            let _ = what;
            for (path, key, ct) in [
                (events.as_str(), &t.key_a, "application/json"),
                (events.as_str(), &t.key_a, "application/x-ndjson"),
                ("/v1/runs", &t.key_a, "application/json"),
                ("/v1/runs/import", &t.key_a, "application/x-ndjson"),
                ("/v1/keys", &admin, "application/json"),
                ("/graphql", &t.key_a, "application/json"),
            ] {
                // (An empty body to POST /v1/runs is a plain run: not hostile.)
                if body.is_empty() && path == "/v1/runs" {
                    continue;
                }
                reqs.push(post(path, key, ct, body.clone()));
            }
        }
        total += reqs.len();
        for (what, req) in reqs {
            let req = req.timeout(Duration::from_secs(20)).build().expect("request");
            let size = req.body().and_then(|b| b.as_bytes()).map_or(0, <[u8]>::len);
            // The body limit of the route (README): 16 KiB for keys, 64 KiB for a run.
            let limit = match req.url().path() {
                "/v1/keys" => 16 << 10,
                "/v1/runs" => 64 << 10,
                _ => 4 << 20,
            };
            let again = req.try_clone();
            let mut answer = attacker.execute(req).await;
            if let (Err(e), Some(again)) = (&answer, again) {
                // The keep-alive race: the server closed a pooled connection (after a
                // 413, say) just as the client sent this request on it. The same request
                // on a new connection tells that race from a request the server drops,
                // which it drops again.
                if !e.is_timeout() && size <= limit {
                    retried += 1;
                    answer = reqwest::Client::new().execute(again).await;
                }
            }
            match answer {
                Ok(r) => {
                    let s = r.status();
                    // Streams that are (rightly) open are not read to the end.
                    *statuses.entry(s.as_u16()).or_default() += 1;
                    if s.is_server_error() {
                        fives.push(format!("{what}: {s}"));
                    }
                    if s.is_success() && what.starts_with("POST") && !what.starts_with("POST /graphql") {
                        writes.push(format!("{what}: {s}"));
                    }
                }
                Err(e) if e.is_timeout() => {}
                // A body over the limit is refused before it is read: the server answers 413
                // and closes, and a client still sending may see the close first.
                Err(_) if size > limit => cut_off += 1,
                Err(e) => dropped.push(format!("{what}: {e}")),
            }
        }
        drop(attacker);
        // WebSockets: hostile handshakes and messages.
        use futures::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        for (_, v) in &values {
            for first in [
                json!({"type": "connection_init", "payload": v}),
                json!({"type": "connection_init", "payload": {"Authorization": v}}),
                json!({"type": v}),
                json!({"id": v, "type": "subscribe", "payload": {"query": "subscription { runsActivity { kind } }"}}),
            ] {
                let mut socket = crate::attack::ws::open(&base).await;
                let _ = socket.send(Message::Text(first.to_string().into())).await;
                let _ = socket.send(Message::Binary(vec![0xff, 0x00, 0xfe].into())).await;
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    crate::attack::ws::close_code(&mut socket, 5),
                )
                .await;
                ws_cases += 1;
            }
            let mut socket = crate::attack::ws::acked(&t, &t.key_a).await;
            let sub = json!({"id": "1", "type": "subscribe", "payload": {"query": "subscription($r: ID!, $v: Int) { runEvents(runId: $r, afterSeq: $v) { seq } }", "variables": {"r": v, "v": v}}});
            let _ = socket.send(Message::Text(sub.to_string().into())).await;
            let _ = crate::attack::ws::next(&mut socket, 10).await;
            ws_cases += 1;
        }
    }
    let ok = reqwest::get(format!("{base}/healthz")).await.map(|r| r.status().is_success()).unwrap_or(false);
    // The attack is over: idle connections close after 2 s and the allocator returns
    // what it freed when its threads idle; give it up to 20 s, watching.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (after, samples) = server.rss_settling(baseline + baseline / 10).await;
    eprintln!("anonymous memory {anon_baseline} KiB at the baseline; after the attack (RSS, anon) each second: {samples:?}");
    let after_counts = counts().await;
    eprintln!(
        "hostile corpus, 4 passes (RSS at the start of each: {per_pass:?} KiB): {total} HTTP requests {statuses:?} ({cut_off} cut off while sending a body over the limit, {retried} sent again on a \
         new connection after a keep-alive race), {ws_cases} WebSocket cases; 5xx {}, dropped {}; rows (events, runs, keys) {before:?} -> \
         {after_counts:?}; server RSS {rss_before} KiB before the rehearsal, {rss_rehearsed} KiB after it (the \
         baseline), {after} KiB after the attack",
        fives.len(),
        dropped.len()
    );
    assert!(writes.is_empty(), "accepted writes: {writes:#?}");
    assert!(ok, "the server still answers");
    assert!(fives.is_empty(), "answers of 500 or more: {fives:#?}");
    assert!(dropped.is_empty(), "dropped connections: {dropped:#?}");
    assert_eq!(after_counts, before, "not one row was written");
    assert!(after <= baseline + baseline / 10, "memory came back within 10%: {baseline} -> {after} KiB");
}
