//! GraphQL: createRun, appendEvents and run share the HTTP API's rules and codes;
//! the checked-in SDL matches the code.

use serde_json::{json, Value};

use crate::common::TestApp;

const CREATE: &str =
    "mutation($parent: ID) { createRun(parentRunId: $parent) { id parentRunId rootRunId lastSeq state } }";
const APPEND: &str = "mutation($run: ID!, $events: [EventInput!]!, $expected: Int) {
    appendEvents(runId: $run, events: $events, expectedLastSeq: $expected) { firstSeq lastSeq replayed } }";
const RUN: &str = "query($id: ID!) { run(id: $id) { id lastSeq state } }";

fn err_code(v: &Value) -> (Option<&str>, Option<u64>) {
    let e = &v["errors"][0]["extensions"];
    (e["code"].as_str(), e["index"].as_u64())
}

#[tokio::test]
async fn create_append_and_read_over_graphql() {
    let t = TestApp::new().await;
    let v = t.graphql(Some(&t.key_a), CREATE, json!({})).await;
    let run = v["data"]["createRun"]["id"].as_str().expect("run id").to_owned();
    assert_eq!(v["data"]["createRun"]["lastSeq"], 0);
    let events = json!([
        {"type": "run.lifecycle", "payload": {"state": "running"}},
        {"type": "text.delta", "payload": {"text": "hi"}, "key": "g1"},
        {"type": "child.spawn", "payload": {"child_id": "k"}},
        {"type": "text.delta", "payload": {"text": "child"}, "childId": "k"}
    ]);
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": events, "expected": 0})).await;
    assert_eq!(v["data"]["appendEvents"], json!({"firstSeq": 1, "lastSeq": 4, "replayed": false}), "{v}");
    let retry = json!([{"type": "text.delta", "payload": {"text": "hi"}, "key": "g1"}]);
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": retry})).await;
    assert_eq!(v["data"]["appendEvents"], json!({"firstSeq": 2, "lastSeq": 2, "replayed": true}), "{v}");
    let v = t.graphql(Some(&t.key_a), RUN, json!({"id": run})).await;
    assert_eq!(v["data"]["run"], json!({"id": run, "lastSeq": 4, "state": "RUNNING"}));
    // What GraphQL wrote, HTTP reads.
    let stored = t.events(&t.key_a, &run).await;
    assert_eq!(stored[3]["child_id"], "k");
    // Sub-runs.
    let v = t.graphql(Some(&t.key_a), CREATE, json!({"parent": run})).await;
    assert_eq!(v["data"]["createRun"]["rootRunId"], json!(run));
}

#[tokio::test]
async fn graphql_errors_carry_the_same_codes() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let bad = json!([
        {"type": "custom.ok", "payload": {}},
        {"type": "tool.end", "payload": {"call_id": "nope", "ok": true}}
    ]);
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": bad})).await;
    assert_eq!(err_code(&v), (Some("TOOL-UNKNOWN-CALL"), Some(1)), "{v}");
    let unknown = json!([{"type": "nope", "payload": {}}]);
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": unknown})).await;
    assert_eq!(err_code(&v), (Some("EVENT-UNKNOWN-TYPE"), Some(0)), "{v}");
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": []})).await;
    assert_eq!(err_code(&v).0, Some("BATCH-EMPTY"));
    let ok = json!([{"type": "custom.ok", "payload": {}}]);
    let v = t.graphql(Some(&t.key_a), APPEND, json!({"run": run, "events": ok, "expected": 5})).await;
    assert_eq!(err_code(&v).0, Some("SEQ-CONFLICT"));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 0);
    // Auth.
    let v = t.graphql(None, RUN, json!({"id": run})).await;
    assert_eq!(err_code(&v).0, Some("AUTH-MISSING"));
    let v = t
        .graphql(
            Some("ask_000000000000_000000000000000000000000000000000000000000000000"),
            RUN,
            json!({"id": run}),
        )
        .await;
    assert_eq!(err_code(&v).0, Some("AUTH-INVALID"));
    // Another tenant's run: null, like a missing one.
    let v = t.graphql(Some(&t.key_b), RUN, json!({"id": run})).await;
    assert_eq!(v["data"]["run"], Value::Null);
    assert!(v.get("errors").is_none());
    let v = t.graphql(Some(&t.key_b), APPEND, json!({"run": run, "events": ok})).await;
    assert_eq!(err_code(&v).0, Some("RUN-NOT-FOUND"));
    // Introspection needs no key (GraphiQL).
    let v = t.graphql(None, "{ __schema { queryType { name } } }", json!({})).await;
    assert_eq!(v["data"]["__schema"]["queryType"]["name"], "Query");
}

#[test]
fn checked_in_sdl_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/graphql/schema.graphql");
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    let built = agent_stream::graphql::sdl();
    assert!(
        checked_in == built,
        "graphql/schema.graphql differs from the schema the code builds; regenerate it with\n  cargo run -q -- schema > graphql/schema.graphql"
    );
}

#[tokio::test]
async fn graphiql_is_served_at_get_graphql() {
    let t = TestApp::new().await;
    let r = t.http.get(format!("{}/graphql", t.base)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let body = r.text().await.unwrap();
    assert!(body.contains("graphiql") || body.contains("GraphiQL"), "{}", &body[..body.len().min(300)]);
}
