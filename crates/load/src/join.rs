//! `join`: what joining a long run costs (issue "One shape, enforced by the compiler").
//!
//! `JOIN_SUBSCRIBERS` (default 100) subscribers join a live run at its head, all at
//! once, per transport: SSE native, SSE `agui`, SSE `vercel`, GraphQL `runEvents`
//! native and in `agui`, and GraphQL `runView`. As soon as every request is sent, one
//! event is appended; a subscriber's time to first event runs from its request to the
//! receipt of that event, so it holds whatever its join cost (reads, folds) plus the
//! delivery. Per cell: time to first event p50/p99, the server's CPU seconds from the
//! first request to the last receipt, live-delivery SELECTs and view-cache folds (from
//! `/metrics`). Each cell runs on a fresh server (a cold view cache), over a run of
//! `JOIN_EVENTS` (default 100,000) events and, as the baseline in the same run, over a
//! run of 100 events: the ratio says how the join cost grows with the log.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::Conn;
use super::support::{self, SseReader};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};

/// How a subscriber joins.
#[derive(Clone, Copy)]
enum How {
    /// `GET /v1/runs/{id}/stream` with `Last-Event-ID` and a `format`.
    Sse(&'static str),
    /// GraphQL over `graphql-transport-ws`: `runEvents` (with a format) or `runView`.
    Ws(&'static str),
}

impl How {
    fn name(self) -> String {
        match self {
            How::Sse(f) => format!("SSE {f}"),
            How::Ws("") => "GraphQL runEvents native".into(),
            How::Ws("view") => "GraphQL runView".into(),
            How::Ws(f) => format!("GraphQL runEvents {f}"),
        }
    }
}

const HOWS: [How; 6] =
    [How::Sse("native"), How::Sse("agui"), How::Sse("vercel"), How::Ws(""), How::Ws("agui"), How::Ws("view")];

/// Appends a running run of `n` events (reasoning, text, a tool call and a message end
/// every 100) and returns its id.
async fn long_run(http: &mut Conn, key: &str, n: usize) -> String {
    let run = support::create_run(http, key).await;
    let path = format!("/v1/runs/{run}/events");
    let mut batch = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
    let mut written = 0;
    let mut i = 0;
    while written + batch.len() < n {
        let m = format!("m{}", i / 100);
        batch.push(match i % 100 {
            97 => json!({"type": "tool.start", "payload": {"call_id": format!("c{i}"), "tool": "search"}}),
            98 => json!({"type": "tool.end", "payload": {"call_id": format!("c{}", i - 1), "ok": true}}),
            99 => json!({"type": "message.end", "payload": {"message_id": m}}),
            k if k % 5 == 0 => {
                json!({"type": "reasoning.delta", "payload": {"text": "thinking ", "message_id": m}})
            }
            _ => json!({"type": "text.delta", "payload": {"text": "word ", "message_id": m}}),
        });
        i += 1;
        if batch.len() == 1000 {
            let r = http.post(&path, key, Value::Array(std::mem::take(&mut batch)).to_string().into()).await;
            let r = r.expect("append");
            assert_eq!(r.status, 201, "{}", r.text());
            written += 1000;
        }
    }
    if !batch.is_empty() {
        let r = http.post(&path, key, Value::Array(batch).to_string().into()).await.expect("append");
        assert_eq!(r.status, 201, "{}", r.text());
    }
    run
}

/// One subscriber: joins at `head` and returns the ms from its request to the receipt
/// of `head + 1`.
async fn join_one(how: How, addr: &str, key: &str, run: &str, head: i64) -> Result<f64, String> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let t0 = Instant::now();
    let want = head + 1;
    match how {
        How::Sse(format) => {
            let path = format!("/v1/runs/{run}/stream?format={format}&detail=full&after_seq={head}");
            let mut r = SseReader::open(addr, &path, key).await.map_err(|e| e.to_string())?;
            let mut ids = vec![];
            loop {
                ids.clear();
                let open = r.read_ids(&mut ids).await.map_err(|e| e.to_string())?;
                // Dialect ids may carry a part (`S.K`): the seq is what comes first.
                if ids.iter().any(|&id| id >= want) {
                    return Ok(t0.elapsed().as_secs_f64() * 1e3);
                }
                if !open {
                    return Err("the stream ended first".into());
                }
            }
        }
        How::Ws(what) => {
            let mut ws = support::graphql_ws(addr, key).await?;
            let query = match what {
                "view" => "subscription($r: ID!, $a: Int) { runView(runId: $r, afterSeq: $a) { seq } }".to_owned(),
                "" => "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a) { seq } }".to_owned(),
                f => format!(
                    "subscription($r: ID!, $a: Int) {{ runEvents(runId: $r, afterSeq: $a, format: \"{f}\") {{ seq }} }}"
                ),
            };
            let sub = json!({"id": "1", "type": "subscribe", "payload": {"query": query, "variables": {"r": run, "a": head}}});
            ws.send(Message::text(sub.to_string())).await.map_err(|e| e.to_string())?;
            while let Some(m) = ws.next().await {
                let Ok(Message::Text(t)) = m else { continue };
                let seq: Option<i64> = t
                    .split("\"seq\":")
                    .nth(1)
                    .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
                if seq.is_some_and(|s| s >= want) {
                    return Ok(t0.elapsed().as_secs_f64() * 1e3);
                }
                if t.contains("\"error") {
                    return Err(t.to_string());
                }
            }
            Err("the socket closed first".into())
        }
    }
}

/// Where a cell runs: the server binary, the database and the tenant's key.
struct Env<'a> {
    bin: &'a Path,
    url: &'a str,
    schema: &'a str,
    key: &'a str,
}

/// One cell: `n` subscribers join `run` (at `head`) over `how` on a fresh server.
async fn cell(env: &Env<'_>, how: How, run: &str, head: i64, n: usize) -> Row {
    let key = env.key;
    let server =
        support::serve(env.bin, env.url, env.schema, &["--append-rate", "0", "--retention-interval", "0"])
            .await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut http = Conn::open(&server.base).await.expect("connect");
    let reads0 = support::scrape(&mut http, "agent_stream_live_reads_total").await;
    let folds0 = support::scrape(&mut http, "agent_stream_view_folded_events_total").await;
    let cpu0 = support::cpu_secs(server.pid);
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (addr, key, run) = (addr.clone(), key.to_owned(), run.to_owned());
        tasks.push(tokio::spawn(async move { join_one(how, &addr, &key, &run, head).await }));
    }
    // Every request is on its way (spawned tasks connect at once); then the event.
    tokio::task::yield_now().await;
    let r = http
        .post(
            &format!("/v1/runs/{run}/events"),
            key,
            json!([{"type": "step.boundary", "payload": {"step_index": 0, "step_kind": "text-only"}}])
                .to_string()
                .into(),
        )
        .await
        .expect("append");
    assert_eq!(r.status, 201, "{}", r.text());
    let (mut ms, mut failed) = (vec![], 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    for t in tasks {
        match tokio::time::timeout_at(deadline, t).await {
            Ok(Ok(Ok(v))) => ms.push(v),
            Ok(Ok(Err(e))) => {
                eprintln!("{}: {e}", how.name());
                failed += 1;
            }
            _ => failed += 1,
        }
    }
    let cpu = support::cpu_secs(server.pid) - cpu0;
    let reads = support::scrape(&mut http, "agent_stream_live_reads_total").await - reads0;
    let folds = support::scrape(&mut http, "agent_stream_view_folded_events_total").await - folds0;
    // The appended event moved the head for the next cell on this run.
    Row { p50: support::pct(&mut ms, 0.5), p99: support::pct(&mut ms, 0.99), cpu, reads, folds, failed }
}

struct Row {
    p50: f64,
    p99: f64,
    cpu: f64,
    reads: f64,
    folds: f64,
    failed: usize,
}

/// Runs the scenario against `schema` of `url`, measuring `bin serve`.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, "join", &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let n: usize = std::env::var("JOIN_SUBSCRIBERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let events: usize = std::env::var("JOIN_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let setup = support::serve(bin, url, schema, &["--append-rate", "0", "--retention-interval", "0"]).await;
    let mut http = Conn::open(&setup.base).await.expect("connect");
    let short = long_run(&mut http, &key, 100).await;
    let long = long_run(&mut http, &key, events).await;
    drop(setup);
    println!("{n} subscribers join a live run at its head, all at once; one event is appended as the last request goes out");
    println!("| transport | run | time to first event p50 / p99 | server CPU | live reads | events folded | failed | p99 ratio long/short |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut heads = std::collections::HashMap::new();
    // `JOIN_ONLY=agui` keeps the transports whose name contains it.
    let only = std::env::var("JOIN_ONLY").unwrap_or_default();
    for how in HOWS.into_iter().filter(|h| h.name().contains(&only)) {
        let mut short_p99 = f64::NAN;
        for (name, run, len) in [("100 events", &short, 100usize), ("long", &long, events)] {
            let head = *heads.entry(run.clone()).or_insert(len as i64);
            let row = cell(&Env { bin, url, schema, key: &key }, how, run, head, n).await;
            heads.insert(run.clone(), head + 1);
            let ratio = if name == "long" { format!("{:.2}", row.p99 / short_p99) } else { "-".into() };
            if name != "long" {
                short_p99 = row.p99;
            }
            let label = if name == "long" { format!("{len} events") } else { name.into() };
            println!(
                "| {} | {label} | {:.1} / {:.1} ms | {:.2} s | {:.0} | {:.0} | {} | {ratio} |",
                how.name(),
                row.p50,
                row.p99,
                row.cpu,
                row.reads,
                row.folds,
                row.failed
            );
        }
    }
}
