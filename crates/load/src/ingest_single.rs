//! `ingest-single`: 64 producers, each appending single ~100-byte text deltas to its
//! own run over HTTP as fast as answers come, for 5 s, with group commit on (4 lanes, the
//! default; `INGEST_LANES=n` for another count) and off; baseline: single-row autocommit INSERTs of the same rows into a table like
//! `agent_run_events` from 16 and from 64 connections. The service is a separate
//! `agent-stream serve` process (release binary, rate limit off), so its CPU is read
//! apart from the producers'; the rows it stored are counted in SQL after each run and
//! must equal the appends answered 201.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};
use serde_json::json;

use super::http::Conn;
use super::support;

const SECS: u64 = 5;
const PRODUCERS: usize = 64;
/// The server's count of group-commit transactions.
const GROUPS: &str = "agent_stream_commit_groups_total";

async fn raw_inserts(url: &str, schema: &str, clients: usize) -> f64 {
    let c = support::connect(url).await;
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
            let c = support::connect(&url).await;
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

/// What one service run did.
struct Service {
    /// Appends answered 201 per second.
    rate: f64,
    appends: u64,
    /// Answers other than 201 (or no answer).
    failed: u64,
    /// Transactions that committed them.
    groups: u64,
    /// Server CPU over the run, in cores.
    cpu: f64,
}

/// 64 producers against a separate `agent-stream serve` with `lanes` group-commit lanes
/// (0: one transaction per append). Checks in SQL that the rows stored equal the 201s.
async fn service_appends(bin: &Path, url: &str, schema: &str, lanes: usize) -> Service {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let issued = tenants::create_tenant(&mut owner, &format!("load{lanes}"), &[Scope::Read, Scope::Write])
        .await
        .expect("tenant");
    let key = issued.secret;
    let server = support::serve(
        bin,
        url,
        schema,
        &["--append-rate", "0", "--retention-interval", "0", "--group-commit-lanes", &lanes.to_string()],
    )
    .await;
    let base = server.base.clone();
    let mut http = Conn::open(&base).await.expect("connect");
    let mut runs = vec![];
    for _ in 0..PRODUCERS {
        runs.push(support::create_run(&mut http, &key).await);
    }
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let groups_before = support::scrape(&mut http, GROUPS).await;
    let cpu0 = support::cpu_secs(server.pid);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for run in runs {
        let (base, key, ok, failed) = (base.clone(), key.clone(), ok.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let mut http = Conn::open(&base).await.expect("connect");
            let path = format!("/v1/runs/{run}/events");
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = json!([{"type": "text.delta", "payload": {"text": format!("token {n} lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod")}}]);
                let r = http.post(&path, &key, body.to_string().into()).await;
                let counter = if r.as_ref().is_ok_and(|r| r.status == 201) { &ok } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
                if r.is_err() {
                    // The connection is gone: a new one for the next append.
                    match Conn::open(&base).await {
                        Ok(c) => http = c,
                        Err(_) => break,
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (support::cpu_secs(server.pid) - cpu0) / secs;
    let groups = support::scrape(&mut http, GROUPS).await - groups_before;
    let appends = ok.load(Ordering::Relaxed);
    let stored: i64 = owner
        .query_one("SELECT count(*) FROM agent_run_events WHERE tenant_id = $1", &[&issued.tenant_id])
        .await
        .expect("count")
        .get(0);
    assert_eq!(stored as u64, appends, "rows stored must equal appends answered 201");
    Service {
        rate: appends as f64 / secs,
        appends,
        failed: failed.load(Ordering::Relaxed),
        groups: groups as u64,
        cpu,
    }
}

/// Runs the scenario in `schema` against `bin serve` and prints its table.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let raw16 = raw_inserts(url, schema, 16).await;
    let raw64 = raw_inserts(url, schema, 64).await;
    let lanes = std::env::var("INGEST_LANES").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let grouped = service_appends(bin, url, schema, lanes).await;
    let alone = service_appends(bin, url, schema, 0).await;
    println!("| ingest-single ({SECS} s each) | rows/s | vs raw, 16 clients | server CPU (cores) | failed |");
    println!("|---|---|---|---|---|");
    println!("| raw single-row autocommit INSERT, 16 clients (baseline) | {raw16:.0} | 1.00 | - | - |");
    println!("| raw single-row autocommit INSERT, 64 clients | {raw64:.0} | {:.2} | - | - |", raw64 / raw16);
    let name = format!("group commit ({lanes} lanes)");
    for (name, s) in [(name.as_str(), &grouped), ("one commit per append", &alone)] {
        println!(
            "| HTTP append, 64 producers, {name} | {:.0} | {:.2} | {:.2} | {} |",
            s.rate,
            s.rate / raw16,
            s.cpu,
            s.failed
        );
    }
    println!(
        "group commit: {} appends in {} transactions ({:.1} per commit); target >= 2x raw: {} ({:.2}x)",
        grouped.appends,
        grouped.groups,
        grouped.appends as f64 / grouped.groups.max(1) as f64,
        if grouped.rate >= 2.0 * raw16 { "met" } else { "not met" },
        grouped.rate / raw16
    );
}
