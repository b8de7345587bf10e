//! Live delivery latency: append → SSE subscribers of one run, next to bare
//! NOTIFY → LISTEN measured in the same run on the same server.
//!
//!     cargo bench --bench fanout
//!
//! For 1, 100 and 1000 SSE subscribers (`detail=full`, read by a bare socket reader) the producer appends one small
//! event every 5 ms (300 events) through the same two calls the HTTP handler makes:
//! `storage::append` (validate, insert, commit) and `Live::committed` (wake-up). The
//! time between them is the commit time; a subscriber's latency is its receipt of that
//! seq minus the commit time. The baseline sends 300 `NOTIFY`s from one connection to
//! a `LISTEN`ing one and times each from send (an autocommit statement: its commit) to
//! receipt.
//!
//! A second table measures what NOTIFY does to insert throughput: 16 connections each
//! insert single rows in autocommit for a few seconds, (a) plain, (b) with a
//! `pg_notify` in every inserting transaction (per-commit notification), (c) plain,
//! while one other connection sends one coalesced NOTIFY every 3 ms, as the service's
//! notifier does. Needs PostgreSQL like the tests (`DATABASE_URL`, else 127.0.0.1:5432).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_stream::app::{App, Settings};
use agent_stream::auth::Scope;
use agent_stream::domain::{Batch, Framing, Origin};
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use serde_json::json;

/// The service's allocator (see `agent_stream::Allocator`).
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;

const EVENTS: usize = 300;
const SPACING: Duration = Duration::from_millis(5);

use agent_stream_load::support;
use support::{pct, SseReader};

async fn reachable(url: &str) -> bool {
    agent_stream::storage::db::connect(url).await.is_ok()
}

fn micros_since(base: Instant) -> u64 {
    base.elapsed().as_micros() as u64
}

/// Rows/s of single-row autocommit INSERTs from `clients` connections for `secs`.
/// `notify_in_tx`: each insert's transaction also sends a NOTIFY (one round trip, as
/// a simple-query string, so only the commit differs). `side_notifier`: one more
/// connection sends a NOTIFY every 3 ms meanwhile.
async fn insert_rate(
    url: &str,
    table: &str,
    clients: usize,
    secs: u64,
    notify_in_tx: bool,
    side_notifier: bool,
) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = support::connect(url).await;
    listener.batch_execute("LISTEN bench_effect").await.expect("listen");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let rows = Arc::new(AtomicU64::new(0));
    let sql = if notify_in_tx {
        format!(
            "BEGIN; INSERT INTO {table} (v) VALUES ('x'); SELECT pg_notify('bench_effect', 'r 1'); COMMIT"
        )
    } else {
        format!("INSERT INTO {table} (v) VALUES ('x')")
    };
    let mut tasks = vec![];
    for _ in 0..clients {
        let (url, sql, rows) = (url.to_owned(), sql.clone(), rows.clone());
        tasks.push(tokio::spawn(async move {
            let c = support::connect(&url).await;
            while Instant::now() < deadline {
                c.batch_execute(&sql).await.expect("insert");
                rows.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    if side_notifier {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let c = support::connect(&url).await;
            while Instant::now() < deadline {
                c.batch_execute("SELECT pg_notify('bench_effect', 'coalesced')").await.expect("notify");
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    rows.load(Ordering::Relaxed) as f64 / secs as f64
}

async fn notify_effect(url: &str, schema: &str) {
    let c = support::connect(url).await;
    let table = format!("\"{schema}\".notify_effect");
    c.batch_execute(&format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, v text)"))
        .await
        .expect("table");
    let plain = insert_rate(url, &table, 16, 4, false, false).await;
    let per_commit = insert_rate(url, &table, 16, 4, true, false).await;
    let coalesced = insert_rate(url, &table, 16, 4, false, true).await;
    println!();
    println!("NOTIFY and insert throughput, 16 clients, single-row autocommit INSERTs:");
    println!("| case | rows/s | vs plain |");
    println!("|---|---|---|");
    println!("| plain INSERT (baseline) | {plain:.0} | 1.00 |");
    println!("| NOTIFY in every inserting transaction | {per_commit:.0} | {:.2} |", per_commit / plain);
    println!(
        "| plain INSERT + one coalesced NOTIFY per 3 ms (the service's notifier) | {coalesced:.0} | {:.2} |",
        coalesced / plain
    );
}

#[tokio::main]
async fn main() {
    // More sockets than the default soft limit: 1000 client plus 1000 server ends.
    if let Ok((_, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
    if !reachable(&url).await {
        eprintln!("fanout: no PostgreSQL at {url}; set DATABASE_URL. Skipping.");
        return;
    }
    let schema = format!("bench_fanout_{}", std::process::id());
    migrate::migrate(&url, &schema).await.expect("migrate");
    let mut owner = db::connect_owner(&url, &schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, "bench", &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let pool =
        Db::new(&DbConfig { url: url.clone(), schema: schema.clone(), max_connections: 16 }).expect("pool");
    let app = App::new(pool, Settings::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tenant = app.authenticate(Some(&key)).await.expect("key").tenant_id;
    let router = agent_stream::http::router(app.clone());
    let serve = agent_stream::server::serve_http(
        agent_stream::server::no_delay(listener),
        router,
        std::future::pending(),
    );
    tokio::spawn(serve);
    let base_url = format!("http://{addr}");
    let base = Instant::now();

    // The subscribers are clients: they run on a runtime of their own, as a separate
    // process would, so their reads do not queue behind the service's tasks on the
    // service's worker threads. FANOUT_READERS=shared puts them back on the service's.
    let own = std::env::var("FANOUT_READERS").map_or(true, |v| v != "shared");
    let clients = own.then(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("subscribers")
            .enable_all()
            .build()
            .expect("subscriber runtime")
    });
    let spawner = clients.as_ref().map_or_else(tokio::runtime::Handle::current, |rt| rt.handle().clone());

    let mut bare = support::bare_notify(&url, EVENTS, SPACING).await;
    let (b50, b99) = (pct(&mut bare, 0.5), pct(&mut bare, 0.99));
    println!("date: {}", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    println!("baseline NOTIFY->LISTEN: p50 {b50:.2} ms, p99 {b99:.2} ms ({EVENTS} notifications)");
    println!("subscribers on {} runtime", if own { "their own" } else { "the service's" });
    println!("| subscribers | append (to commit) p50 / p99 (ms) | commit->receipt p50 / p99 / max (ms) | p99 vs bare NOTIFY p99 |");
    println!("|---|---|---|---|");

    // FANOUT_SUBS=100 runs one size (for profiling); the default is all three.
    let sizes: Vec<usize> = std::env::var("FANOUT_SUBS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 1000]);
    for subs in sizes {
        let mut http = agent_stream_load::http::Conn::open(&base_url).await.expect("connect");
        let run = support::create_run(&mut http, &key).await;
        // (seq, receipt) per subscriber event, and the commit time per seq.
        let lat: Arc<Mutex<Vec<(i64, u64)>>> = Arc::new(Mutex::new(Vec::with_capacity(subs * EVENTS)));
        let commits: Arc<Mutex<std::collections::HashMap<i64, u64>>> = Default::default();
        let ready = Arc::new(tokio::sync::Barrier::new(subs + 1));
        let mut readers = vec![];
        for _ in 0..subs {
            let (addr, path, key, lat, ready) = (
                addr.to_string(),
                format!("/v1/runs/{run}/stream?detail=full"),
                key.clone(),
                lat.clone(),
                ready.clone(),
            );
            readers.push(spawner.spawn(async move {
                let mut sse = SseReader::open(&addr, &path, &key).await.expect("stream");
                ready.wait().await;
                let mut mine = Vec::with_capacity(EVENTS);
                let mut ids = vec![];
                while mine.len() < EVENTS {
                    ids.clear();
                    let open = sse.read_ids(&mut ids).await.unwrap_or(false);
                    // A frame's `id:` is its seq: a client knows what arrived without
                    // parsing the JSON, so receipt is timed at the socket read.
                    let now = micros_since(base);
                    mine.extend(ids.iter().map(|seq| (*seq, now)));
                    if !open {
                        break;
                    }
                }
                lat.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
            }));
        }
        ready.wait().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut rtt = vec![];
        for _ in 0..EVENTS {
            let body = json!([{"type": "custom.tick", "payload": {}}]).to_string();
            let batch: Batch =
                agent_stream::domain::input::parse_batch(body.as_bytes(), Framing::Json, Default::default())
                    .expect("valid batch");
            let sent = micros_since(base);
            let out =
                agent_stream::storage::append(&app.db, &app.guards, &tenant, &run, &batch, Origin::Producer)
                    .await
                    .expect("append");
            let committed = micros_since(base);
            commits.lock().unwrap_or_else(|p| p.into_inner()).insert(out.last_seq, committed);
            app.live.committed(&tenant, &run, out.last_seq);
            rtt.push((committed - sent) as f64 / 1000.0);
            tokio::time::sleep(SPACING).await;
        }
        for r in readers {
            let _ = tokio::time::timeout(Duration::from_secs(30), r).await;
        }
        let receipts = std::mem::take(&mut *lat.lock().unwrap_or_else(|p| p.into_inner()));
        let commits = std::mem::take(&mut *commits.lock().unwrap_or_else(|p| p.into_inner()));
        let got = receipts.len();
        let mut lat: Vec<f64> = receipts
            .iter()
            .filter_map(|(seq, at)| commits.get(seq).map(|c| at.saturating_sub(*c) as f64 / 1000.0))
            .collect();
        let (l50, l99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
        let lmax = lat.last().copied().unwrap_or(f64::NAN);
        let (r50, r99) = (pct(&mut rtt, 0.5), pct(&mut rtt, 0.99));
        println!("| {subs} | {r50:.2} / {r99:.2} | {l50:.2} / {l99:.2} / {lmax:.2} | {:+.2} ms |", l99 - b99);
        if got != subs * EVENTS {
            println!("  (received {got} of {} events)", subs * EVENTS);
        }
    }
    if std::env::var("FANOUT_SUBS").is_err() {
        notify_effect(&url, &schema).await;
    }
    let _ = owner.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
    if let Some(rt) = clients {
        rt.shutdown_background();
    }
}
