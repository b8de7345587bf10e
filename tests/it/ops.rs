//! Operability: readiness, metrics, and keys revoked under open streams.

use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::tenants;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

/// The sum of a metric's samples whose labels include every pair of `labels` (all of a
/// family's series with none); 0 for a family with no series yet.
fn metric_with(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut found = text.lines().any(|l| l.starts_with(&format!("# TYPE {name} ")));
    let mut sum = 0.0;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.strip_prefix(name) else { continue };
        let (labelled, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ").unwrap_or(("", "")),
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        if labels.iter().all(|(k, v)| labelled.split(',').any(|p| p == format!("{k}=\"{v}\""))) {
            sum += value.trim().parse::<f64>().unwrap_or_else(|_| panic!("bad sample `{l}`"));
            found = true;
        }
    }
    assert!(found, "no metric {name} {labels:?} in\n{text}");
    sum
}

fn metric(text: &str, name: &str) -> f64 {
    metric_with(text, name, &[])
}

async fn scrape(t: &TestApp) -> String {
    let r = t.http.get(format!("{}/metrics", t.base)).send().await.expect("metrics");
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    r.text().await.expect("text")
}

/// Every line of the exposition is a comment or `name{labels} value` with a number, and
/// it ends with `# EOF` (OpenMetrics).
fn check_exposition(text: &str) {
    assert_eq!(text.lines().last(), Some("# EOF"));
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("`{l}`"));
        assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "`{l}`");
        let name = series.split('{').next().unwrap_or_default();
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "`{l}`"
        );
        assert!(series.ends_with('}') || !series.contains('{'), "`{l}`");
    }
}

#[tokio::test]
async fn metrics_histograms_move_with_appends_deliveries_and_requests() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let t = TestApp::new().await;
    let before = scrape(&t).await;
    check_exposition(&before);
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(metric(&before, name) > 0.0, "{name}");
    }
    assert_eq!(
        metric_with(&before, "agent_stream_build_info", &[("version", env!("CARGO_PKG_VERSION"))]),
        1.0
    );

    let run = t.create_run(&t.key_a).await;
    // One subscriber on each transport.
    let sse = t
        .http
        .get(format!("{}/v1/runs/{run}/stream?detail=full", t.base))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .expect("stream");
    let mut sse = sse.bytes_stream();
    let mut req =
        format!("{}/graphql/ws", t.base.replace("http://", "ws://")).into_client_request().expect("req");
    req.headers_mut().insert("Sec-WebSocket-Protocol", "graphql-transport-ws".parse().expect("header"));
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("ws");
    let init =
        json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {}", t.key_a)}});
    ws.send(Message::Text(init.to_string().into())).await.expect("init");
    let sub = json!({"id": "1", "type": "subscribe", "payload": {"query": "subscription($r: ID!) { runEvents(runId: $r) { seq } }", "variables": {"r": run}}});
    ws.send(Message::Text(sub.to_string().into())).await.expect("subscribe");
    let mut subscribed = false;
    for _ in 0..100 {
        let m = scrape(&t).await;
        if metric_with(&m, "agent_stream_subscribers", &[("transport", "sse")]) == 1.0
            && metric_with(&m, "agent_stream_subscribers", &[("transport", "graphql_ws")]) == 1.0
        {
            subscribed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(subscribed, "both subscribers counted by transport");

    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    // Both read to the run's end.
    let mut text = String::new();
    while !text.contains("\"done\"") {
        let chunk =
            tokio::time::timeout(Duration::from_secs(10), sse.next()).await.expect("sse").expect("more");
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    let mut seqs = 0;
    while seqs < 2 {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("ws").expect("open") {
            Ok(Message::Text(m)) if m.contains("\"next\"") => seqs += 1,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let (status, _) = t.append(&t.key_a, &run, &json!([{"type": "nope"}])).await;
    assert!(status.is_client_error());

    let after = scrape(&t).await;
    check_exposition(&after);
    let count = |name: &str, labels: &[(&str, &str)]| metric_with(&after, &format!("{name}_count"), labels);
    assert_eq!(count("agent_stream_append_duration_seconds", &[("outcome", "written")]), 2.0);
    assert!(metric_with(&after, "agent_stream_append_duration_seconds_sum", &[("outcome", "written")]) > 0.0);
    assert_eq!(metric(&after, "agent_stream_commit_group_size_count"), 2.0);
    assert_eq!(metric_with(&after, "agent_stream_commit_group_size_bucket", &[("le", "1.0")]), 2.0);
    // Each append went out as a group of its own: two waits in the lane, two groups, and
    // neither is longer than the appends took in the service.
    let took = metric_with(&after, "agent_stream_append_duration_seconds_sum", &[("outcome", "written")]);
    for name in ["agent_stream_commit_wait_seconds", "agent_stream_commit_duration_seconds"] {
        assert_eq!(metric(&after, &format!("{name}_count")), 2.0, "{name}");
        let sum = metric(&after, &format!("{name}_sum"));
        assert!((0.0..=took).contains(&sum), "{name}: {sum} s against {took} s in all");
    }
    assert!(metric(&after, "agent_stream_commit_duration_seconds_sum") > 0.0, "a commit takes time");
    assert_eq!(count("agent_stream_delivery_latency_seconds", &[("transport", "sse")]), 2.0);
    assert_eq!(count("agent_stream_delivery_latency_seconds", &[("transport", "graphql_ws")]), 2.0);
    assert!(metric(&after, "agent_stream_notification_lag_seconds_count") >= 1.0);
    // Requests by the route's template, never the raw path.
    let appends = [("route", "/v1/runs/{run_id}/events"), ("method", "POST")];
    assert_eq!(
        count("agent_stream_http_request_duration_seconds", &[appends[0], appends[1], ("status", "201")]),
        2.0
    );
    assert_eq!(
        count("agent_stream_http_request_duration_seconds", &[appends[0], appends[1], ("status", "422")]),
        1.0
    );
    assert!(!after.contains(&run), "no run id in any label");
    assert!(
        count("agent_stream_http_request_duration_seconds", &[("route", "/metrics"), ("status", "200")])
            >= 1.0
    );
    let _ = t.http.get(format!("{}/no/such/thing", t.base)).send().await.expect("send");
    let last = scrape(&t).await;
    assert_eq!(
        metric_with(
            &last,
            "agent_stream_http_request_duration_seconds_count",
            &[("route", "unmatched"), ("status", "404")]
        ),
        1.0
    );
    drop(ws);
    drop(sse);
    let mut gone = false;
    for _ in 0..100 {
        let m = scrape(&t).await;
        if metric(&m, "agent_stream_subscribers") == 0.0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "closed subscriptions are no longer counted");
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
