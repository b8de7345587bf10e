//! Operability: readiness, metrics, and keys revoked under open streams.

use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::tenants;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

#[tokio::test]
async fn readyz_reports_database_and_listener_and_metrics_count_what_happened() {
    let t = TestApp::new().await;
    // The listener connects in the background; readiness follows within moments.
    let mut ready = Value::Null;
    for _ in 0..50 {
        let r = t.http.get(format!("{}/readyz", t.base)).send().await.expect("readyz");
        let status = r.status();
        ready = r.json().await.expect("json");
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready, json!({"ready": true, "database": true, "listener": true}));
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, {"type": "text.delta", "payload": {"text": "x"}}]))
        .await;
    let (status, _) = t.append(&t.key_a, &run, &json!([{"type": "nope"}])).await;
    assert!(status.is_client_error());
    let text =
        t.http.get(format!("{}/metrics", t.base)).send().await.expect("metrics").text().await.expect("text");
    assert_eq!(metric(&text, "agent_stream_appends_total"), 1.0);
    assert_eq!(metric(&text, "agent_stream_events_appended_total"), 2.0);
    assert_eq!(metric(&text, "agent_stream_commit_groups_total"), 1.0);
    assert!(metric(&text, "agent_stream_append_bytes_total") > 50.0);
    assert_eq!(metric(&text, "agent_stream_listener_up"), 1.0);
    assert_eq!(metric(&text, "agent_stream_subscribers"), 0.0);
    // Parse errors are refused before the append path; the counter covers the path's own refusals.
    let (status, _) = t
        .append(&t.key_a, &run, &json!([{"type": "tool.end", "payload": {"call_id": "x", "ok": true}}]))
        .await;
    assert!(status.is_client_error());
    let text =
        t.http.get(format!("{}/metrics", t.base)).send().await.expect("metrics").text().await.expect("text");
    assert_eq!(metric(&text, "agent_stream_appends_rejected_total"), 1.0);
}

/// A key revoked while its SSE stream is open stops that stream within 5 seconds.
#[tokio::test]
async fn a_revoked_key_stops_its_open_stream_within_5_s() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let key = t.key_for_a(&[Scope::Read]).await;
    let r = t
        .http
        .get(format!("{}/v1/runs/{run}/stream?detail=full", t.base))
        .bearer_auth(&key.secret)
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.bytes_stream();
    // The reconnect hint comes first, on its own; then the first frame.
    let mut got = String::new();
    while !got.contains("id: 1\n") {
        let chunk = body.next().await.expect("first frame").expect("bytes");
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    let metrics = t.http.get(format!("{}/metrics", t.base)).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&metrics, "agent_stream_subscribers"), 1.0);
    let owner = t.db.owner().await;
    assert!(tenants::revoke_key(&owner, &key.key_id).await.expect("revoke"));
    let revoked = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(8), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    let took = revoked.elapsed();
    assert!(ended.is_ok() && took < Duration::from_secs(5), "the stream ended {took:?} after the revocation");
    // Appends made with other keys meanwhile were not delivered to it, and the key is dead.
    let r = t.http.get(format!("{}/v1/runs/{run}", t.base)).bearer_auth(&key.secret).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = t.http.get(format!("{}/metrics", t.base)).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&metrics, "agent_stream_subscribers"), 0.0);
}

/// A tenant over its append rate gets 429 with Retry-After and nothing is written;
/// other tenants are unaffected, and the bucket refills.
#[tokio::test]
async fn appends_over_the_tenant_rate_get_429_with_retry_after() {
    use agent_stream::app::Settings;
    use agent_stream::ratelimit::RateLimit;
    let settings =
        Settings { append_rate: Some(RateLimit { per_sec: 2.0, burst: 4.0 }), ..Default::default() };
    let t = TestApp::with_settings(settings).await;
    let run = t.create_run(&t.key_a).await;
    let delta = json!([{"type": "text.delta", "payload": {"text": "x"}}]);
    let mut statuses = vec![];
    let mut retry_after = None;
    for _ in 0..6 {
        let r = t
            .http
            .post(format!("{}/v1/runs/{run}/events", t.base))
            .bearer_auth(&t.key_a)
            .json(&delta)
            .send()
            .await
            .expect("append");
        statuses.push(r.status().as_u16());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            retry_after = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body: Value = r.json().await.expect("json");
            assert_eq!(body["error"]["code"], "RATE-LIMITED");
        }
    }
    let written = statuses.iter().filter(|s| **s == 201).count() as i64;
    let limited = statuses.iter().filter(|s| **s == 429).count();
    eprintln!("statuses {statuses:?}");
    assert!(limited >= 1 && written <= 5, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 429), "no 5xx: {statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, written, "a refused append wrote nothing");
    let other = t.create_run(&t.key_b).await;
    t.append_ok(&t.key_b, &other, delta.clone()).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    t.append_ok(&t.key_a, &run, delta).await;
}

/// Retention deletes whole finished runs past their time (done 90 days, aborted/error
/// 30, per-tenant overrides), sub-runs before parents, and nothing else; a dry run
/// deletes nothing and lists exactly what the sweep then deletes.
#[tokio::test]
async fn retention_deletes_whole_expired_runs_and_only_those() {
    use agent_stream::storage::retention::{set_override, sweep, Policy};
    let t = TestApp::new().await;
    let mut owner = t.db.owner().await;
    async fn finished(t: &TestApp, key: &str, state: &str, parent: Option<&str>) -> String {
        let run = match parent {
            None => t.create_run(key).await,
            Some(p) => {
                let r = t
                    .http
                    .post(format!("{}/v1/runs", t.base))
                    .bearer_auth(key)
                    .json(&json!({"parent_run_id": p}))
                    .send()
                    .await
                    .unwrap();
                r.json::<Value>().await.unwrap()["run_id"].as_str().unwrap().to_owned()
            }
        };
        let mut evs = vec![
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            json!({"type": "text.delta", "payload": {"text": "x"}}),
        ];
        if state != "running" {
            evs.push(json!({"type": "run.lifecycle", "payload": {"state": state}}));
        }
        t.append_ok(key, &run, Value::Array(evs)).await;
        run
    }
    async fn age(owner: &tokio_postgres::Client, run: String, days: i32) {
        owner
            .execute(
                "UPDATE runs SET ended_at = now() - make_interval(days => $2) WHERE run_id = $1",
                &[&run, &days],
            )
            .await
            .expect("age");
    }
    let old_done = finished(&t, &t.key_a, "done", None).await;
    let young_done = finished(&t, &t.key_a, "done", None).await;
    let old_aborted = finished(&t, &t.key_a, "aborted", None).await;
    let mid_error = finished(&t, &t.key_a, "error", None).await;
    let running = finished(&t, &t.key_a, "running", None).await;
    let parent = finished(&t, &t.key_a, "done", None).await;
    let child = finished(&t, &t.key_a, "done", Some(&parent)).await;
    let b_old_done = finished(&t, &t.key_b, "done", None).await;
    // A parent past its time with a sub-run that is not: both stay.
    let kept_parent = finished(&t, &t.key_a, "done", None).await;
    let young_child = finished(&t, &t.key_a, "done", Some(&kept_parent)).await;
    age(&owner, kept_parent.clone(), 100).await;
    age(&owner, young_child.clone(), 10).await;
    age(&owner, old_done.clone(), 100).await;
    age(&owner, young_done.clone(), 10).await;
    age(&owner, old_aborted.clone(), 31).await;
    age(&owner, mid_error.clone(), 29).await;
    age(&owner, parent.clone(), 100).await;
    age(&owner, child.clone(), 100).await;
    age(&owner, b_old_done.clone(), 100).await;
    assert!(set_override(&owner, "b", Some(365), None).await.expect("override"));

    let dry = sweep(&mut owner, Policy::default(), true).await.expect("dry run");
    let mut due: Vec<String> = dry.runs.iter().map(|r| r.run_id.clone()).collect();
    due.sort();
    let mut want = vec![old_done.clone(), old_aborted.clone(), child.clone(), parent.clone()];
    want.sort();
    assert_eq!(due, want, "exactly what the sweep deletes, the parent of an expired sub-run too");
    let at = |r: &str| dry.runs.iter().position(|e| e.run_id == r);
    assert!(at(&child) < at(&parent), "the sub-run before its parent");
    async fn stored(t: &TestApp, run: &str) -> i64 {
        t.stored_count(&t.tenant_a, run).await + t.stored_count(&t.tenant_b, run).await
    }
    assert_eq!(stored(&t, &old_done).await, 2 + 1, "a dry run deletes nothing");

    let report = sweep(&mut owner, Policy::default(), false).await.expect("sweep");
    let mut deleted: Vec<String> = report.runs.iter().map(|r| r.run_id.clone()).collect();
    deleted.sort();
    let mut want = vec![old_done.clone(), old_aborted.clone(), child.clone(), parent.clone()];
    want.sort();
    assert_eq!(deleted, want, "the parent goes once its sub-run is gone");
    for run in &want {
        assert_eq!(stored(&t, run).await, 0, "no event of a deleted run is left");
        // Its tombstone: gone, not unknown (seed 004's KAI-STREAM-CONN-0002).
        let r = t.http.get(format!("{}/v1/runs/{run}", t.base)).bearer_auth(&t.key_a).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::GONE);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["kai_code"].as_str()),
            (Some("RUN-EXPIRED"), Some("KAI-STREAM-CONN-0002"))
        );
        let r = t.http.get(format!("{}/v1/runs/{run}", t.base)).bearer_auth(&t.key_b).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "another tenant's tombstone is not found");
    }
    assert_eq!(t.count_rows("run_tombstones").await, 4, "one tombstone per deleted run");
    assert_eq!(deleted, due, "the dry run listed exactly these");
    for run in [&young_done, &mid_error, &running, &kept_parent, &young_child] {
        assert!(stored(&t, run).await > 0, "{run} is kept");
    }
    assert_eq!(t.stored_count(&t.tenant_b, &b_old_done).await, 3, "tenant b keeps done runs for 365 days");
    assert!(sweep(&mut owner, Policy::default(), false).await.expect("again").runs.is_empty(), "idempotent");
}
