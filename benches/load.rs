//! The load tool (issue 6), scenario by scenario, each next to its raw-PostgreSQL
//! baseline measured in the same run.
//!
//!     cargo bench --bench load -- ingest-single     # the only scenario so far
//!
//! `ingest-single`: 64 producers, each appending single ~100-byte text deltas to its own
//! run over HTTP as fast as answers come, for 5 s, with group commit on (4 lanes) and
//! off; baseline: single-row autocommit INSERTs of the same rows into a table like
//! `agent_run_events` from 16 and from 64 connections. Needs PostgreSQL like the tests.

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
    if scenario != "ingest-single" {
        eprintln!("load: unknown scenario `{scenario}`; known: ingest-single");
        std::process::exit(2);
    }
    let schema = format!("bench_load_{}", std::process::id());
    migrate::migrate(&url, &schema).await.expect("migrate");
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
