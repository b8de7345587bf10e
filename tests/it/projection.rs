//! Projections over real stored runs: the GraphQL and REST views equal the reducer's
//! fold, the analysts' SQL views agree with it, control mutations, the read API.

use agent_stream::domain::Event;
use agent_stream::projection::RunView;
use agent_stream_core::testkit::generated_run;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};

use crate::common::TestApp;

pub(crate) const VIEW_FIELDS: &str = "
  seq anomalies
  lifecycle { state transitions { seq ts childId from to reason } }
  messages { id childId role status blocks { kind text callId } text reasoning stopReason implicit startedSeq endedSeq }
  tools { callId childId tool input skillId status progressCount lastProgress output error durationMs blobRef messageId startedSeq endedSeq }
  plan { id childId steps { id title intent estTools estCostUsd } estTotalCostUsd proposedSeq proposals
         decision { decision reason decidedBy seq } }
  steps { seq ts childId stepIndex stepKind checkpointId openMessageIds }
  children { childId parentChildId prompt toolsAllowed state spawnedSeq children }
  compaction { active count tokensRemovedTotal last { removed kept tokensRemoved tokensKept reason seq } }";

fn snake(k: &str) -> String {
    let mut out = String::new();
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// GraphQL's camelCase keys and SCREAMING enums, in serde's snake_case form.
fn normalize(v: &Value, key: &str) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (snake(k), normalize(v, &snake(k)))).collect::<Map<_, _>>())
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| normalize(x, key)).collect()),
        Value::String(s)
            if ["status", "kind", "role", "state", "from", "to", "decision", "intent"].contains(&key) =>
        {
            json!(s.to_lowercase())
        }
        Value::String(s) if key == "step_kind" => json!(s.to_lowercase().replace('_', "-")),
        // GraphQL's DateTime scalar writes `+00:00`, serde `Z`: compare instants.
        Value::String(s) if key == "ts" => json!(ts(s)),
        other => other.clone(),
    }
}

fn ts(s: &str) -> String {
    let t = chrono::DateTime::parse_from_rfc3339(s).expect("rfc3339");
    t.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Serde's form of the view, without the fields GraphQL omits when null.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), strip_nulls(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Appends a generated run in batches of varying size; returns the run id.
async fn store_generated(t: &TestApp, seed: u64, steps: usize) -> String {
    let run = t.create_run(&t.key_a).await;
    let events = generated_run(seed, steps);
    let mut i = 0;
    let mut size = 1;
    while i < events.len() {
        let end = (i + size).min(events.len());
        t.append_ok(&t.key_a, &run, Value::Array(events[i..end].to_vec())).await;
        i = end;
        size = size % 7 + 1;
    }
    run
}

async fn reducer_view(t: &TestApp, run: &str) -> RunView {
    let events: Vec<Event> = t
        .events(&t.key_a, run)
        .await
        .into_iter()
        .map(|e| serde_json::from_value(e).expect("event"))
        .collect();
    RunView::fold(&events)
}

#[tokio::test]
async fn graphql_and_rest_views_equal_the_reducers_fold() {
    let t = TestApp::new().await;
    for seed in 0..8u64 {
        let run = store_generated(&t, seed, 60 + seed as usize * 10).await;
        let expected = reducer_view(&t, &run).await;
        assert_eq!(expected.anomalies, 0);
        let want = serde_json::to_value(&expected).unwrap();

        let rest = t.get_json(&t.key_a, &format!("/v1/runs/{run}/view")).await;
        assert_eq!(rest, want, "seed {seed}: REST view");

        let q = format!("query($id: ID!) {{ run(id: $id) {{ lastSeq view {{ {VIEW_FIELDS} }} }} }}");
        let v = t.graphql(Some(&t.key_a), &q, json!({"id": run})).await;
        assert!(v.get("errors").is_none(), "{v}");
        let got = normalize(&v["data"]["run"]["view"], "");
        assert_eq!(strip_nulls(&got), strip_nulls(&normalize(&want, "")), "seed {seed}: GraphQL view");
        assert_eq!(v["data"]["run"]["lastSeq"], json!(expected.seq));
    }
}

/// Rows of `sql` (one `jsonb_build_array(...)` column, `$1` = run id) as JSON arrays.
async fn sql_rows(c: &tokio_postgres::Client, sql: &str, run: &str) -> Vec<Value> {
    c.query(sql, &[&run]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}")).iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn sql_views_agree_with_the_reducer() {
    let t = TestApp::new().await;
    let owner = t.db.owner().await;
    for seed in 100..110u64 {
        let run = store_generated(&t, seed, 80).await;
        let view = reducer_view(&t, &run).await;

        let sql = sql_rows(
            &owner,
            "SELECT jsonb_build_array(message_id, child_id, role, status, text, reasoning, stop_reason, implicit,
                                      started_seq, ended_seq)
             FROM messages WHERE run_id = $1 ORDER BY started_seq",
            &run,
        )
        .await;
        let ours: Vec<Value> = view
            .messages
            .iter()
            .map(|m| {
                json!([
                    m.id,
                    m.child_id,
                    m.role,
                    m.status,
                    m.text,
                    m.reasoning,
                    m.stop_reason,
                    m.implicit,
                    m.started_seq,
                    m.ended_seq
                ])
            })
            .collect();
        assert_eq!(sql, ours, "seed {seed}: messages");

        let sql = sql_rows(
            &owner,
            "SELECT jsonb_build_array(call_id, child_id, tool, status, progress_count, duration_ms, message_id,
                                      started_seq, ended_seq)
             FROM tool_calls WHERE run_id = $1 ORDER BY started_seq",
            &run,
        )
        .await;
        let ours: Vec<Value> = view
            .tools
            .iter()
            .map(|c| {
                json!([
                    c.call_id,
                    c.child_id,
                    c.tool,
                    c.status,
                    c.progress_count,
                    c.duration_ms,
                    c.message_id,
                    c.started_seq,
                    c.ended_seq
                ])
            })
            .collect();
        assert_eq!(sql, ours, "seed {seed}: tool calls");

        let sql = sql_rows(
            &owner,
            "SELECT jsonb_build_array(seq, child_id, from_state, to_state, reason)
             FROM lifecycle_transitions WHERE run_id = $1 ORDER BY seq",
            &run,
        )
        .await;
        let ours: Vec<Value> = view
            .lifecycle
            .transitions
            .iter()
            .map(|x| json!([x.seq, x.child_id, x.from, x.to, x.reason]))
            .collect();
        assert_eq!(sql, ours, "seed {seed}: transitions");

        let sql = sql_rows(
            &owner,
            "SELECT jsonb_build_array(state, event_count, message_count, tool_call_count)
             FROM run_summary WHERE run_id = $1",
            &run,
        )
        .await;
        let ours = json!([view.lifecycle.state, view.seq, view.messages.len(), view.tools.len()]);
        assert_eq!(sql, vec![ours], "seed {seed}: summary");
    }
}

const CONTROL: &str = "mutation($run: ID!, $reason: String) {
  approvePlan(runId: $run, reason: $reason) { state view { plan { decision { decision reason decidedBy } } } } }";

async fn gql_control(t: &TestApp, op: &str, run: &str, extra: &str) -> Value {
    let args = if op == "redirectRun" { "instruction: \"use the cache\"" } else { "reason: \"because\"" };
    let q = format!("mutation($run: ID!) {{ {op}(runId: $run, {args}) {{ state lastSeq {extra} }} }}");
    t.graphql(Some(&t.key_a), &q, json!({"run": run})).await
}

#[tokio::test]
async fn control_mutations_append_the_right_events_and_refuse_illegal_ones() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([
        {"type": "run.lifecycle", "payload": {"state": "planning"}},
        {"type": "plan.proposal", "payload": {"plan": {"id": "p1", "steps": [{"id": "s", "title": "t", "intent": "research"}]}}},
        {"type": "run.lifecycle", "payload": {"state": "awaiting_approval"}}
    ]))
    .await;
    // Reject: back to planning; then a new plan, approve: running.
    let v = gql_control(&t, "rejectPlan", &run, "").await;
    assert_eq!(v["data"]["rejectPlan"]["state"], "PLANNING", "{v}");
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "plan.proposal", "payload": {"plan": {"id": "p2", "steps": []}}},
            {"type": "run.lifecycle", "payload": {"state": "awaiting_approval"}}
        ]),
    )
    .await;
    let v = t.graphql(Some(&t.key_a), CONTROL, json!({"run": run, "reason": "ok"})).await;
    assert_eq!(v["data"]["approvePlan"]["state"], "RUNNING", "{v}");
    let decision = &v["data"]["approvePlan"]["view"]["plan"]["decision"];
    assert_eq!(decision["decision"], "APPROVED");
    assert_eq!(decision["reason"], "ok");
    assert!(decision["decidedBy"].as_str().is_some_and(|k| t.key_a.contains(k)));
    // Approving again: no plan is awaiting a decision (and the run is running).
    let v = t.graphql(Some(&t.key_a), CONTROL, json!({"run": run})).await;
    assert_eq!(v["errors"][0]["extensions"]["code"], "LIFECYCLE-ILLEGAL-TRANSITION", "{v}");

    let v = gql_control(&t, "resumeRun", &run, "").await;
    assert_eq!(
        v["errors"][0]["extensions"]["code"], "LIFECYCLE-ILLEGAL-TRANSITION",
        "running cannot resume: {v}"
    );
    assert_eq!(gql_control(&t, "pauseRun", &run, "").await["data"]["pauseRun"]["state"], "PAUSED");
    assert_eq!(gql_control(&t, "resumeRun", &run, "").await["data"]["resumeRun"]["state"], "RUNNING");
    let v = gql_control(&t, "redirectRun", &run, "view { messages { role text } }").await;
    assert_eq!(v["data"]["redirectRun"]["state"], "REDIRECTING", "{v}");
    let msgs = v["data"]["redirectRun"]["view"]["messages"].as_array().unwrap();
    assert_eq!(msgs.last().unwrap(), &json!({"role": "USER", "text": "use the cache"}));
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    assert_eq!(gql_control(&t, "abortRun", &run, "").await["data"]["abortRun"]["state"], "ABORTED");
    let v = gql_control(&t, "pauseRun", &run, "").await;
    assert_eq!(v["errors"][0]["extensions"]["code"], "RUN-CLOSED");

    let types: Vec<String> =
        t.events(&t.key_a, &run).await.iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect();
    assert_eq!(types.iter().filter(|t| *t == "plan.decision").count(), 2);
    // A read-only key cannot control a run.
    let read = t.key_for_a(&[agent_stream::auth::Scope::Read]).await.secret;
    let v = t.graphql(Some(&read), CONTROL, json!({"run": run})).await;
    assert_eq!(v["errors"][0]["extensions"]["code"], "AUTH-SCOPE");
}

#[tokio::test]
async fn runs_and_events_connections_filter_and_paginate() {
    let t = TestApp::new().await;
    let mut ids = vec![];
    for i in 0..5 {
        let run = t.create_run(&t.key_a).await;
        if i % 2 == 0 {
            t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
                .await;
        }
        ids.push(run);
    }
    t.create_run(&t.key_b).await;
    let q = "query($after: String, $state: RunState) { runs(first: 2, after: $after, state: $state) {
        edges { cursor node { id state } } pageInfo { hasNextPage endCursor } } }";
    let mut seen = vec![];
    let mut after = Value::Null;
    loop {
        let v = t.graphql(Some(&t.key_a), q, json!({"after": after})).await;
        let conn = &v["data"]["runs"];
        assert!(conn["edges"].is_array(), "{v}");
        for e in conn["edges"].as_array().unwrap() {
            seen.push(e["node"]["id"].as_str().unwrap().to_owned());
        }
        if !conn["pageInfo"]["hasNextPage"].as_bool().unwrap() {
            break;
        }
        after = conn["pageInfo"]["endCursor"].clone();
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first, "all of tenant a's runs, newest first, none of b's");
    let v = t.graphql(Some(&t.key_a), q, json!({"state": "RUNNING"})).await;
    assert!(v["data"]["runs"]["edges"].is_array(), "{v}");
    // Time filters: everything was created within the last minute, nothing in the future.
    let tq = "query($after: DateTime, $before: DateTime) { runs(first: 100, createdAfter: $after, createdBefore: $before) { edges { node { id } } } }";
    let now = chrono::Utc::now();
    let recent = t
        .graphql(Some(&t.key_a), tq, json!({"after": (now - chrono::Duration::minutes(1)).to_rfc3339()}))
        .await;
    assert_eq!(recent["data"]["runs"]["edges"].as_array().map(Vec::len), Some(5), "{recent}");
    let none = t
        .graphql(Some(&t.key_a), tq, json!({"after": (now + chrono::Duration::minutes(1)).to_rfc3339()}))
        .await;
    assert_eq!(none["data"]["runs"]["edges"].as_array().map(Vec::len), Some(0), "{none}");
    let before = t
        .graphql(Some(&t.key_a), tq, json!({"before": (now - chrono::Duration::minutes(1)).to_rfc3339()}))
        .await;
    assert_eq!(before["data"]["runs"]["edges"].as_array().map(Vec::len), Some(0), "{before}");
    let running: Vec<&str> = v["data"]["runs"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(running, vec![ids[4].as_str(), ids[2].as_str()]);

    let run = &ids[0];
    t.append_ok(
        &t.key_a,
        run,
        json!([
            {"type": "child.spawn", "payload": {"child_id": "k"}},
            {"type": "text.delta", "child_id": "k", "payload": {"text": "a"}},
            {"type": "text.delta", "payload": {"text": "b"}},
            {"type": "text.delta", "child_id": "k", "payload": {"text": "c"}}
        ]),
    )
    .await;
    let q = "query($run: ID!, $after: Int, $types: [String!], $child: String) {
        events(runId: $run, afterSeq: $after, first: 10, types: $types, childId: $child) {
          edges { cursor node { seq type childId payload } } pageInfo { hasNextPage } } }";
    let v = t.graphql(Some(&t.key_a), q, json!({"run": run, "types": ["text.delta"], "child": "k"})).await;
    assert!(v["data"]["events"]["edges"].is_array(), "{v}");
    let seqs: Vec<i64> = v["data"]["events"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![3, 5]);
    let v = t.graphql(Some(&t.key_a), q, json!({"run": run, "after": 3})).await;
    let seqs: Vec<i64> = v["data"]["events"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![4, 5]);
    assert_eq!(v["data"]["events"]["edges"][0]["node"]["payload"], json!({"text": "b"}));
    // Another tenant reads nothing of it.
    let v = t.graphql(Some(&t.key_b), q, json!({"run": run})).await;
    assert_eq!(v["errors"][0]["extensions"]["code"], "RUN-NOT-FOUND");
}

#[tokio::test]
async fn a_finished_runs_view_is_not_refolded_on_every_read() {
    let t = TestApp::new().await;
    let run = store_generated(&t, 7, 300).await;
    let url = format!("{}/v1/runs/{run}/view", t.base);
    let first: Value = t.http.get(&url).bearer_auth(&t.key_a).send().await.unwrap().json().await.unwrap();
    let folded = t.app.live.views.folded_events();
    assert_eq!(folded as i64, first["seq"].as_i64().unwrap(), "the first read folds the log once");
    for _ in 0..5 {
        let again: Value = t.http.get(&url).bearer_auth(&t.key_a).send().await.unwrap().json().await.unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(t.app.live.views.folded_events(), folded, "later reads fold nothing");
    // A live run: each read folds only the new tail.
    let live = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &live, json!([{"type": "text.delta", "payload": {"text": "a"}}])).await;
    let lurl = format!("{}/v1/runs/{live}/view", t.base);
    t.http.get(&lurl).bearer_auth(&t.key_a).send().await.unwrap();
    let before = t.app.live.views.folded_events();
    t.append_ok(&t.key_a, &live, json!([{"type": "text.delta", "payload": {"text": "b"}}, {"type": "text.delta", "payload": {"text": "c"}}])).await;
    let v: Value = t.http.get(&lurl).bearer_auth(&t.key_a).send().await.unwrap().json().await.unwrap();
    assert_eq!(t.app.live.views.folded_events() - before, 2);
    assert_eq!(v["messages"][0]["text"], "abc");
}

/// Joining a live run at its head in a dialect that renders from the view costs the
/// cached view plus the events after it: of five subscribers, only the first folds the
/// log; two more events are folded once, by the run's feed, and the next joiner folds
/// nothing.
#[tokio::test]
async fn joining_at_the_head_folds_only_what_the_cached_view_lacks() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let deltas: Vec<Value> =
        (0..299).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i} ")}})).collect();
    let (_, last) = t.append_ok(&t.key_a, &run, Value::Array(deltas)).await;
    let join = |format: &'static str, cursor: i64| {
        let (http, url, key) =
            (t.http.clone(), format!("{}/v1/runs/{run}/stream?format={format}", t.base), t.key_a.clone());
        async move {
            let r = http
                .get(url)
                .bearer_auth(key)
                .header("last-event-id", cursor.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            // The stream is open: its start (and so its fold) is done.
            r
        }
    };
    let before = t.app.live.views.folded_events();
    let mut open = vec![];
    for format in ["agui", "vercel", "typed", "agui", "hier"] {
        open.push(join(format, last).await);
    }
    assert_eq!(t.app.live.views.folded_events() - before, last as u64, "one fold of the log for five joins");
    let (_, newest) = t
        .append_ok(
            &t.key_a,
            &run,
            json!([{"type": "text.delta", "payload": {"text": "a"}}, {"type": "text.delta", "payload": {"text": "b"}}]),
        )
        .await;
    // The open streams' feed folds the two new events once, into the cached view
    // (issue 19: one fold per run), so the later joiner folds nothing at all.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while t.app.live.views.folded_events() + t.app.live.feeds.folds() < before + last as u64 + 2 {
        assert!(tokio::time::Instant::now() < deadline, "the feed did not fold the new events");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let before = t.app.live.views.folded_events();
    open.push(join("vercel", newest).await);
    assert_eq!(
        t.app.live.views.folded_events() - before,
        0,
        "a later joiner folds only what the cache lacks: nothing"
    );
}

/// Seed 001's checklist: large messages, empty messages, refresh after complete and
/// during streaming, concurrent streams — the same bubbles however the view is read.
#[tokio::test]
async fn seed_001_refresh_checklist() {
    let t = TestApp::new().await;
    let view = |run: String| {
        let (http, base, key) = (t.http.clone(), t.base.clone(), t.key_a.clone());
        async move {
            let v: Value = http
                .get(format!("{base}/v1/runs/{run}/view"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v
        }
    };
    // 1000+ chunks, appended one by one: one message.
    let big = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &big,
        json!([{"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}}]),
    )
    .await;
    let mut full = String::new();
    for chunk in 0..1100 {
        let text = format!("c{chunk} ");
        full.push_str(&text);
        if chunk % 100 == 50 {
            // Refresh during streaming: the partial message is already one bubble.
            let v = view(big.clone()).await;
            assert_eq!(v["messages"].as_array().unwrap().len(), 1);
            assert_eq!(v["messages"][0]["status"], "streaming");
            assert_eq!(v["messages"][0]["text"], json!(full[..full.len() - text.len()]));
        }
        t.append_ok(&t.key_a, &big, json!([{"type": "text.delta", "payload": {"text": text}}])).await;
    }
    t.append_ok(
        &t.key_a,
        &big,
        json!([{"type": "message.end", "payload": {"message_id": "m", "text": full}}]),
    )
    .await;
    // Refresh after complete, twice (cached and uncached must agree).
    let a = view(big.clone()).await;
    let fresh = reducer_view(&t, &big).await;
    assert_eq!(a, serde_json::to_value(&fresh).unwrap());
    assert_eq!(a["messages"][0]["text"], json!(full));
    assert_eq!(a["messages"][0]["status"], "complete");

    // Empty message.
    let empty = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &empty,
        json!([
            {"type": "message.start", "payload": {"message_id": "e", "role": "assistant"}},
            {"type": "message.end", "payload": {"message_id": "e"}}
        ]),
    )
    .await;
    let v = view(empty).await;
    assert_eq!(
        (v["messages"][0]["status"].clone(), v["messages"][0]["text"].clone()),
        (json!("complete"), json!(""))
    );

    // Concurrent streams: two runs written at once keep their own messages.
    let (r1, r2) = (t.create_run(&t.key_a).await, t.create_run(&t.key_a).await);
    let write = |run: String, tag: &'static str| {
        let (http, base, key) = (t.http.clone(), t.base.clone(), t.key_a.clone());
        async move {
            for i in 0..50 {
                let r = http
                    .post(format!("{base}/v1/runs/{run}/events"))
                    .bearer_auth(&key)
                    .json(&json!([{"type": "text.delta", "payload": {"text": format!("{tag}{i},")}}]))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::CREATED);
            }
        }
    };
    futures::join!(write(r1.clone(), "x"), write(r2.clone(), "y"));
    for (run, tag) in [(r1, "x"), (r2, "y")] {
        let v = view(run).await;
        let want: String = (0..50).map(|i| format!("{tag}{i},")).collect();
        assert_eq!(v["messages"].as_array().unwrap().len(), 1);
        assert_eq!(v["messages"][0]["text"], json!(want));
    }
}

#[tokio::test]
async fn the_analyst_role_reads_one_tenant_through_rls() {
    let t = TestApp::new().await;
    let run_a = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run_a, json!([{"type": "text.delta", "payload": {"text": "secret of a"}}])).await;
    let run_b = t.create_run(&t.key_b).await;
    t.append_ok(
        &t.key_b,
        &run_b,
        json!([{"type": "text.delta", "payload": {"text": "b's"}}, {"type": "custom.x", "payload": {}}]),
    )
    .await;
    let role = format!("analyst_{}", t.db.schema.to_lowercase());
    let mut owner = t.db.owner().await;
    agent_stream::storage::tenants::create_analyst(&mut owner, "b", &role, Some("pw")).await.unwrap();

    // Connect as the analyst: the owner's server and database, another user.
    let mut target = agent_stream::storage::db::target(&t.db.url).unwrap();
    target.config.user(&role).password("pw");
    let (c, conn) = target.config.connect(target.tls).await.expect("analyst login");
    tokio::spawn(conn);
    let count = |sql: &'static str| {
        let c = &c;
        async move { c.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0)) }
    };
    assert_eq!(count("SELECT count(*) FROM agent_run_events").await.unwrap(), 2, "b's rows only");
    assert_eq!(count("SELECT count(*) FROM messages").await.unwrap(), 1);
    assert_eq!(count("SELECT count(*) FROM run_summary").await.unwrap(), 1);
    // Setting the service's tenant variable does not open other tenants.
    c.batch_execute(&format!("SET agent_stream.tenant_id = '{}'", t.tenant_a)).await.unwrap();
    assert_eq!(count("SELECT count(*) FROM agent_run_events").await.unwrap(), 2);
    // Read-only.
    let err = c.batch_execute("DELETE FROM agent_run_events").await.unwrap_err();
    assert!(format!("{err:?}").contains("permission denied"), "{err:?}");
    let err = c.batch_execute("SELECT * FROM api_keys").await.unwrap_err();
    assert!(format!("{err:?}").contains("permission denied"), "{err:?}");
    drop(c);
    let _ = owner.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
}

/// The SQL in docs/analysts.md runs, as an analyst login, and answers from one tenant.
#[tokio::test]
async fn the_documented_analyst_queries_run_and_answer() {
    let t = TestApp::new().await;
    for seed in 200..206 {
        store_generated(&t, seed, 120).await;
    }
    // Tenant b's runs must not leak into a's answers.
    let b_run = t.create_run(&t.key_b).await;
    t.append_ok(
        &t.key_b,
        &b_run,
        json!([
            {"type": "tool.start", "payload": {"call_id": "b", "tool": "b-only-tool"}},
            {"type": "tool.end", "payload": {"call_id": "b", "ok": false, "duration_ms": 5}}
        ]),
    )
    .await;
    // A run stuck in awaiting_approval for two hours (written as the owner to backdate it).
    let stuck = t.create_run(&t.key_a).await;
    let mut owner = t.db.owner().await;
    owner
        .batch_execute(&format!(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload) VALUES
               ('{a}', '{stuck}', 1, '01J0000000000000000000000A', now() - interval '2 hours', 'run.lifecycle', '{{\"state\": \"planning\"}}'),
               ('{a}', '{stuck}', 2, '01J0000000000000000000000B', now() - interval '2 hours', 'run.lifecycle', '{{\"state\": \"awaiting_approval\"}}');
             UPDATE runs SET state = 'awaiting_approval' WHERE run_id = '{stuck}';",
            a = t.tenant_a
        ))
        .await
        .unwrap();
    let role = format!("analyst_{}", t.db.schema.to_lowercase());
    agent_stream::storage::tenants::create_analyst(&mut owner, "a", &role, Some("pw")).await.unwrap();
    let mut target = agent_stream::storage::db::target(&t.db.url).unwrap();
    target.config.user(&role).password("pw");
    let (c, conn) = target.config.connect(target.tls).await.expect("analyst login");
    tokio::spawn(conn);

    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/analysts.md")).unwrap();
    let queries: Vec<&str> =
        doc.split("```sql").skip(1).map(|b| b.split("```").next().unwrap_or_default().trim()).collect();
    assert_eq!(queries.len(), 6, "five questions and the raw-log example");
    let mut answers = vec![];
    for q in &queries {
        let rows = c.query(*q, &[]).await.unwrap_or_else(|e| panic!("{q}\n{e:?}"));
        answers.push(rows);
    }
    let tools: Vec<String> = answers[0].iter().map(|r| r.get("tool")).collect();
    assert!(!tools.is_empty() && !tools.contains(&"b-only-tool".to_owned()), "{tools:?}");
    assert!(!answers[1].is_empty());
    let stuck_runs: Vec<String> = answers[2].iter().map(|r| r.get("run_id")).collect();
    assert_eq!(stuck_runs, vec![stuck]);
    assert!(!answers[3].is_empty(), "compactions happened in the generated runs");
    assert!(!answers[4].is_empty(), "generated runs end with open messages");
    drop(c);
    let _ = owner.batch_execute(&format!("DROP ROLE {role}")).await;
}
