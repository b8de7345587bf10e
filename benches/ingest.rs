//! The HTTP append path against raw PostgreSQL, in the same run on the same machine.
//!
//! - `ingest/http_append` (A): `POST /v1/runs/{run}/events` with a JSON array of 1,000
//!   `text.delta` events of 100 bytes each, through the real router, pool, row-level
//!   security and append transaction.
//! - `ingest/raw_insert` (B, the baseline): the same 1,000 rows in one autocommitted
//!   `INSERT ... SELECT FROM unnest(...)` (the statement the append path uses) on the
//!   owner connection into `bench_raw`, a copy of `agent_run_events` with its indexes but
//!   without row-level security or foreign keys.
//! - `ingest/raw_copy` (C): the same rows with `COPY bench_raw FROM STDIN` (text format)
//!   on the owner connection: the fastest way rows get into PostgreSQL.
//!
//! The database is found like the integration tests find it: `DATABASE_URL`, else
//! `host=127.0.0.1 port=5432 user=postgres dbname=test`. With neither reachable the bench
//! says so and exits 0. It works in its own schema (`bench_<unix secs>_<pid>`), dropped at
//! the end. After criterion's report it prints one summary line with rows/s and ratios.
//!
//! Run with `cargo bench --bench ingest`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_stream::app::{App, Settings};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use criterion::{Criterion, Throughput};
use futures::SinkExt;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

/// Events (rows) per batch.
const BATCH: usize = 1_000;
/// Wire size of each event, in bytes.
const EVENT_BYTES: usize = 100;
/// Batches appended to one run before the next run starts.
const BATCHES_PER_RUN: usize = 50;

const GROUP: &str = "ingest";
const A: &str = "http_append";
const B: &str = "raw_insert";
const C: &str = "raw_copy";

const WORDS: &[&str] = &[
    "the", "agent", "reads", "page", "and", "compares", "prices", "across", "three", "shops,", "then",
    "writes", "a", "short", "summary", "for", "user.", "Next", "it", "checks", "shipping", "costs",
];

/// Deterministic prose of exactly `len` ASCII bytes; `n` varies the words.
fn text(n: usize, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    let mut i = n;
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[i % WORDS.len()]);
        i = i.wrapping_mul(7).wrapping_add(3);
    }
    s.truncate(len);
    s
}

/// The texts of one batch: each event `{"type":"text.delta","payload":{"text":...}}` is
/// exactly `EVENT_BYTES` long.
fn texts() -> Vec<String> {
    let overhead = r#"{"type":"text.delta","payload":{"text":""}}"#.len();
    (0..BATCH).map(|i| text(i, EVENT_BYTES - overhead)).collect()
}

struct Env {
    rt: Runtime,
    url: String,
    schema: String,
    owner: tokio_postgres::Client,
    http: reqwest::Client,
    base: String,
    key: String,
    tenant: String,
}

async fn find_database() -> Option<String> {
    let candidates = match std::env::var("DATABASE_URL") {
        Ok(url) => vec![url],
        Err(_) => vec!["host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3".to_owned()],
    };
    for url in candidates {
        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok(_) => return Some(url),
            Err(e) => eprintln!("ingest bench: cannot connect to `{url}`: {e}"),
        }
    }
    None
}

fn setup() -> Option<Env> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().ok()?;
    let Some(url) = rt.block_on(find_database()) else {
        println!(
            "ingest bench skipped: no PostgreSQL reachable (set DATABASE_URL, or run one on \
             127.0.0.1:5432 with user postgres and database test)"
        );
        return None;
    };
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let schema = format!("bench_{secs}_{}", std::process::id());
    let env = rt.block_on(async {
        migrate::migrate(&url, &schema).await.expect("migrate");
        let mut owner = db::connect_owner(&url, &schema).await.expect("owner connection");
        let issued =
            tenants::create_tenant(&mut owner, "bench", &[Scope::Read, Scope::Write]).await.expect("tenant");
        let pool = Db::new(&DbConfig { url: url.clone(), schema: schema.clone(), max_connections: 4 })
            .expect("pool");
        let app = App::new(pool, Settings::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let router = agent_stream::http::router(app);
        tokio::spawn(async move { axum::serve(listener, router).await });

        // The baseline table: LIKE ... INCLUDING ALL copies columns, defaults, CHECK
        // constraints and indexes, but not foreign keys or row-level security.
        owner.batch_execute("CREATE TABLE bench_raw (LIKE agent_run_events INCLUDING ALL)").await.expect("bench_raw");
        let row = owner
            .query_one(
                "SELECT c.relrowsecurity,
                        (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid),
                        (SELECT count(*) FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'f'),
                        (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)
                 FROM pg_class c WHERE c.oid = 'bench_raw'::regclass",
                &[],
            )
            .await
            .expect("inspect bench_raw");
        let (rls, policies, fks, indexes): (bool, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("bench_raw: row security {rls}, {policies} policies, {fks} foreign keys, {indexes} indexes");
        assert!(!rls && policies == 0 && fks == 0, "bench_raw must be a plain table");

        Env {
            rt: tokio::runtime::Handle::current().block_on(async { unreachable_rt() }),
            url: url.clone(),
            schema: schema.clone(),
            owner,
            http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client"),
            base,
            key: issued.secret,
            tenant: issued.tenant_id,
        }
    });
    Some(env)
}
