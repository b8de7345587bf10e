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
