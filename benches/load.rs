//! The load tool (issue 6), scenario by scenario, each next to its raw-PostgreSQL
//! baseline measured in the same run.
//!
//!     cargo bench --bench load -- ingest-single
//!     cargo bench --bench load -- fanout
//!
//! `ingest-single`: 64 producers, each appending single ~100-byte text deltas to its own
//! run over HTTP as fast as answers come, for 5 s, with group commit on (4 lanes) and
//! off; baseline: single-row autocommit INSERTs of the same rows into a table like
//! `agent_run_events` from 16 and from 64 connections.
//!
//! `fanout`: a separate `agent-stream serve` process (the release binary); 1,000 and then
//! 10,000 idle SSE subscribers of one run, for the server's resident memory per
//! subscriber; then 1,000 subscribers while a producer appends 1,000 control events a
//! second (batches of 10 every 10 ms) for 3 s: append-sent → receipt latency (receipt
//! read off the SSE `id:` line), the server's CPU, and live-delivery SELECTs per append
//! (from `/metrics`). Needs PostgreSQL like the tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_stream::app::{App, Settings};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use serde_json::{json, Value};

const SECS: u64 = 5;
const PRODUCERS: usize = 64;

async fn raw_inserts(url: &str, schema: &str, clients: usize) -> f64 {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let table = format!("\"{schema}\".raw_{clients}");
    c.batch_execute(&format!("CREATE TABLE {table} (LIKE \"{schema}\".agent_run_events INCLUDING ALL)"))
        .await
        .expect("table");
    let rows = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for k in 0..clients {
        let (url, table, rows) = (url.to_owned(), table.clone(), rows.clone());
        tasks.push(tokio::spawn(async move {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            tokio::spawn(conn);
            let stmt = c
                .prepare(&format!(
                    "INSERT INTO {table} (tenant_id, run_id, seq, id, ts, type, payload) VALUES ('t', $1, $2, $3, now(), 'text.delta', $4)"
                ))
                .await
                .expect("prepare");
            let run = format!("run{k}");
            let mut seq = 0i64;
            while Instant::now() < deadline {
                seq += 1;
                let payload = json!({"text": format!("token {seq} lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod")});
                c.execute(&stmt, &[&run, &seq, &ulid::Ulid::new().to_string(), &payload]).await.expect("insert");
                rows.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    rows.load(Ordering::Relaxed) as f64 / SECS as f64
}

async fn service_appends(url: &str, schema: &str, lanes: usize) -> (f64, u64, u64) {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, &format!("load{lanes}"), &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let pool = Db::new(&DbConfig { url: url.to_owned(), schema: schema.to_owned(), max_connections: 32 })
        .expect("pool");
    let settings = Settings { group_commit_lanes: lanes, append_rate: None, ..Default::default() };
    let app = App::new(pool, settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = agent_stream::http::router(app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::builder().pool_max_idle_per_host(PRODUCERS).build().expect("client");
    let mut runs = vec![];
    for _ in 0..PRODUCERS {
        let v: Value = http
            .post(format!("{base}/v1/runs"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        runs.push(v["run_id"].as_str().unwrap().to_owned());
    }
    let ok = Arc::new(AtomicU64::new(0));
    let groups_before = app.metrics.commit_groups.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for run in runs {
        let (http, base, key, ok) = (http.clone(), base.clone(), key.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = json!([{"type": "text.delta", "payload": {"text": format!("token {n} lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod")}}]);
                let r = http.post(format!("{base}/v1/runs/{run}/events")).bearer_auth(&key).json(&body).send().await;
                if r.is_ok_and(|r| r.status() == 201) {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let appends = ok.load(Ordering::Relaxed);
    let groups = app.metrics.commit_groups.load(Ordering::Relaxed) - groups_before;
    (appends as f64 / SECS as f64, appends, groups)
}

/// User + system CPU seconds of a process.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// Opens `n` SSE streams of `run`; each task records (seq, receipt µs) until `stop`.
async fn subscribe(
    base: &str,
    key: &str,
    run: &str,
    n: usize,
    t0: Instant,
) -> (Vec<tokio::task::JoinHandle<Vec<(i64, u64)>>>, Arc<tokio::sync::Notify>) {
    use futures::StreamExt;
    let stop = Arc::new(tokio::sync::Notify::new());
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (url, key, stop, ready, http) = (
            format!("{base}/v1/runs/{run}/stream?detail=full"),
            key.to_owned(),
            stop.clone(),
            ready.clone(),
            http.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut got = vec![];
            let Ok(r) = http.get(url).bearer_auth(key).send().await else {
                ready.add_permits(1);
                return got;
            };
            let mut body = r.bytes_stream();
            let mut buf = String::new();
            let mut first = true;
            loop {
                let chunk = tokio::select! {
                    c = body.next() => c,
                    _ = stop.notified() => break,
                };
                let Some(Ok(chunk)) = chunk else { break };
                let now = t0.elapsed().as_micros() as u64;
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(i) = buf.find("\n\n") {
                    if let Some(seq) = buf[..i]
                        .lines()
                        .find_map(|l| l.strip_prefix("id:"))
                        .and_then(|v| v.trim().parse::<i64>().ok())
                    {
                        got.push((seq, now));
                    }
                    buf.drain(..i + 2);
                }
                if first {
                    first = false;
                    ready.add_permits(1);
                }
            }
            got
        }));
    }
    let _ = ready.acquire_many(n as u32).await.map(|p| p.forget());
    (tasks, stop)
}

async fn fanout(url: &str, schema: &str) {
    if let Ok((_, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, "fanout", &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let mut server = support::serve(url, schema, &["--append-rate", "0", "--retention-interval", "0"]).await;
    let (pid, base) = (server.pid, server.base.clone());
    let http = reqwest::Client::new();
    let new_run = || async {
        let v: Value = http
            .post(format!("{base}/v1/runs"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run = v["run_id"].as_str().unwrap().to_owned();
        let body = json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]);
        http.post(format!("{base}/v1/runs/{run}/events")).bearer_auth(&key).json(&body).send().await.unwrap();
        run
    };
    println!("date: {}", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let t0 = Instant::now();
    // Memory per idle subscriber.
    println!("| idle SSE subscribers | server RSS | RSS per subscriber | target |");
    println!("|---|---|---|---|");
    let rss0 = support::status_kib(pid, "VmRSS:");
    println!("| 0 | {:.1} MiB | - | - |", rss0 as f64 / 1024.0);
    for n in [1_000usize, 10_000] {
        let run = new_run().await;
        let (tasks, stop) = subscribe(&base, &key, &run, n, t0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss = support::status_kib(pid, "VmRSS:");
        let per = (rss.saturating_sub(rss0)) as f64 / n as f64;
        println!(
            "| {n} | {:.1} MiB | {per:.1} KiB | ≤ 64 KiB: {} |",
            rss as f64 / 1024.0,
            if per <= 64.0 { "met" } else { "not met" }
        );
        stop.notify_waiters();
        drop(tasks);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Latency with 1,000 subscribers at 1,000 events/s.
    let subs = 1_000usize;
    let run = new_run().await;
    let (tasks, stop) = subscribe(&base, &key, &run, subs, t0).await;
    let m0 = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let (cpu0, wall0) = (cpu_secs(pid), Instant::now());
    let mut sent: std::collections::HashMap<i64, u64> = Default::default();
    let mut appends = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for b in 0..300u64 {
        tick.tick().await;
        let body = Value::Array(
            (0..10).map(|i| json!({"type": "custom.tick", "payload": {"n": b * 10 + i}})).collect(),
        );
        let at = t0.elapsed().as_micros() as u64;
        let r: Value = http
            .post(format!("{base}/v1/runs/{run}/events"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        appends += 1;
        for seq in r["first_seq"].as_i64().unwrap_or(0)..=r["last_seq"].as_i64().unwrap_or(-1) {
            sent.insert(seq, at);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu, wall) = (cpu_secs(pid) - cpu0, wall0.elapsed().as_secs_f64());
    let m1 = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    stop.notify_waiters();
    let mut lat = vec![];
    let mut received = 0usize;
    for t in tasks {
        for (seq, at) in t.await.unwrap_or_default() {
            if let Some(s) = sent.get(&seq) {
                lat.push(at.saturating_sub(*s) as f64 / 1000.0);
                received += 1;
            }
        }
    }
    let reads = metric(&m1, "agent_stream_live_reads_total") - metric(&m0, "agent_stream_live_reads_total");
    let (p50, p99) = (support::pct(&mut lat, 0.5), support::pct(&mut lat, 0.99));
    let max = lat.last().copied().unwrap_or(f64::NAN);
    println!();
    println!("| 1,000 subscribers, 1,000 events/s (10 per 10 ms) for 3 s | value |");
    println!("|---|---|");
    println!("| append sent → receipt p50 / p99 / max | {p50:.2} / {p99:.2} / {max:.2} ms (target p99 < 10 ms: {}) |", if p99 < 10.0 { "met" } else { "not met" });
    println!("| events received / expected | {received} / {} |", sent.len() * subs);
    println!("| server CPU | {:.0}% of one core |", 100.0 * cpu / wall);
    println!(
        "| live-delivery SELECTs per append | {:.2} ({reads:.0} for {appends} appends) |",
        reads / appends as f64
    );
    let _ = server.child.kill().await;
}

#[path = "support/mod.rs"]
mod support;

#[tokio::main]
async fn main() {
    let scenario =
        std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "ingest-single".into());
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
    if tokio_postgres::connect(&url, tokio_postgres::NoTls).await.is_err() {
        eprintln!("load: no PostgreSQL at {url}; set DATABASE_URL. Skipping.");
        return;
    }
    if scenario != "ingest-single" && scenario != "fanout" {
        eprintln!("load: unknown scenario `{scenario}`; known: ingest-single, fanout");
        std::process::exit(2);
    }
    let schema = format!("bench_load_{}", std::process::id());
    migrate::migrate(&url, &schema).await.expect("migrate");
    if scenario == "fanout" {
        fanout(&url, &schema).await;
        let owner = db::connect_owner(&url, &schema).await.expect("owner");
        let _ = owner.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
        return;
    }
    let raw16 = raw_inserts(&url, &schema, 16).await;
    let raw64 = raw_inserts(&url, &schema, 64).await;
    let (grouped, g_appends, g_groups) = service_appends(&url, &schema, 4).await;
    let (alone, _, _) = service_appends(&url, &schema, 0).await;
    println!("date: {}", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    println!("| ingest-single ({SECS} s each) | rows/s | vs raw, 16 clients |");
    println!("|---|---|---|");
    println!("| raw single-row autocommit INSERT, 16 clients (baseline) | {raw16:.0} | 1.00 |");
    println!("| raw single-row autocommit INSERT, 64 clients | {raw64:.0} | {:.2} |", raw64 / raw16);
    println!("| HTTP append, 64 producers, group commit (4 lanes) | {grouped:.0} | {:.2} |", grouped / raw16);
    println!("| HTTP append, 64 producers, one commit per append | {alone:.0} | {:.2} |", alone / raw16);
    println!(
        "group commit: {g_appends} appends in {g_groups} transactions ({:.1} per commit)",
        g_appends as f64 / g_groups.max(1) as f64
    );
    let owner = db::connect_owner(&url, &schema).await.expect("owner");
    let _ = owner.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
}
