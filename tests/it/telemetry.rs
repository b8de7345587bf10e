//! OpenTelemetry: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the service sends its spans
//! over OTLP, and one trace, continued from the producer's `traceparent`, shows the
//! append, its commit, the notify and each subscriber's delivery. The collector here is
//! an in-process OTLP/HTTP receiver (JSON encoding).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use crate::common::TestApp;

/// Starts an OTLP/HTTP receiver; returns its base URL and what it received.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    keep.lock().expect("lock").push(v);
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, got)
}

/// Every span received: (trace id, span id, parent span id, name, attributes).
fn spans(batches: &[Value]) -> Vec<(String, String, String, String, Value)> {
    let mut out = vec![];
    for b in batches {
        for rs in b["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let text = |k: &str| s[k].as_str().unwrap_or_default().to_lowercase();
                    out.push((
                        text("traceId"),
                        text("spanId"),
                        text("parentSpanId"),
                        text("name"),
                        s["attributes"].clone(),
                    ));
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn one_trace_follows_an_append_from_traceparent_to_each_delivery() {
    let t = TestApp::new().await;
    let (otlp, got) = receiver().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--schema", &t.db.schema])
        .args(["--retention-interval", "0"])
        .env("DATABASE_URL", &t.db.url)
        .env("AGENT_STREAM_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agent-stream");
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if reqwest::get(format!("{base}/healthz")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = t.create_run(&t.key_a).await;
    let sse = t
        .http
        .get(format!("{base}/v1/runs/{run}/stream?detail=full"))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .expect("stream");
    let mut sse = sse.bytes_stream();
    // The subscriber is attached before the append.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = t
        .http
        .post(format!("{base}/v1/runs/{run}/events"))
        .bearer_auth(&t.key_a)
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .json(&json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
        .send()
        .await
        .expect("append");
    assert_eq!(r.status(), 201);
    let mut text = String::new();
    while !text.contains("\"running\"") {
        let chunk =
            tokio::time::timeout(Duration::from_secs(10), sse.next()).await.expect("sse").expect("more");
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    // More appends, each in its own trace. The row writer wakes the subscriber as it
    // commits, often before the appender's task has registered its trace: each delivery
    // must still land in its append's trace.
    let more: Vec<String> = (0..20).map(|i| format!("5ca1ab1e{i:024x}")).collect();
    for (i, tr) in more.iter().enumerate() {
        let r = t
            .http
            .post(format!("{base}/v1/runs/{run}/events"))
            .bearer_auth(&t.key_a)
            .header("traceparent", format!("00-{tr}-00f067aa0ba902b7-01"))
            .json(&json!([{"type": "text.delta", "payload": {"text": format!("t{i}-")}}]))
            .send()
            .await
            .expect("append");
        assert_eq!(r.status(), 201);
    }
    while !text.contains("t19-") {
        let chunk =
            tokio::time::timeout(Duration::from_secs(10), sse.next()).await.expect("sse").expect("more");
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    drop(sse);
    // A graceful stop sends what is buffered.
    let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("stops");

    let all = spans(&got.lock().expect("lock"));
    let ours: Vec<_> = all.iter().filter(|s| s.0 == trace).collect();
    let names: Vec<&str> = ours.iter().map(|s| s.3.as_str()).collect();
    for name in ["request", "append", "commit", "notify", "deliver"] {
        assert!(names.contains(&name), "no `{name}` span in the producer's trace: {names:?} (all: {all:?})");
    }
    let find = |name: &str| ours.iter().find(|s| s.3 == name).expect("span");
    // The request continues the producer's span; append, commit and notify hang below it.
    assert_eq!(find("request").2, "00f067aa0ba902b7");
    assert_eq!(find("append").2, find("request").1);
    assert_eq!(find("commit").2, find("append").1);
    assert_eq!(find("notify").2, find("append").1);
    // Each delivery hangs below the notify that woke its subscriber.
    assert_eq!(find("deliver").2, find("notify").1);
    assert!(find("deliver").4.to_string().contains("sse"), "{}", find("deliver").4);
    for tr in &more {
        let of = |name: &str| all.iter().find(|s| &s.0 == tr && s.3 == name);
        let (Some(notify), Some(deliver)) = (of("notify"), of("deliver")) else {
            panic!(
                "trace {tr} lacks its notify or deliver span: {:?}",
                all.iter().filter(|s| &s.0 == tr).map(|s| &s.3).collect::<Vec<_>>()
            );
        };
        assert_eq!(deliver.2, notify.1, "trace {tr}: the delivery hangs below its notify");
    }
}
