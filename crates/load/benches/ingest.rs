//! The HTTP append path against raw PostgreSQL, in the same run on the same machine.
//!
//! - `ingest/http_append` (A): `POST /v1/runs/{run}/events` with a JSON array of 1,000
//!   `text.delta` events of 100 bytes each, through the real router, pool, row-level
//!   security and append transaction. A new run every 50 batches (made outside the timing).
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
//! the end. After criterion's report, a second pass runs A, B and C interleaved (one batch
//! of each per round, so load changes on a shared machine hit all three alike) and prints
//! one summary line with rows/s and ratios, then where each batch's CPU time went (this
//! process, client and server, versus the PostgreSQL backends).
//!
//! Run with `cargo bench --bench ingest`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_stream::app::{App, Settings};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, migrate, tenants, Db, DbConfig};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use criterion::{Criterion, Throughput};
use serde_json::{json, Value};

use agent_stream_load::support;
use tokio::runtime::Runtime;

/// Events (rows) per batch.
const BATCH: usize = 1_000;
/// Wire size of each event, in bytes.
const EVENT_BYTES: usize = 100;
/// Batches appended to one run before the next run starts.
const BATCHES_PER_RUN: usize = 50;
/// Rounds of the interleaved pass after criterion (one batch of A, B and C each).
const ROUNDS: usize = 100;
/// How the service's pooled connections name themselves, to find their backends.
const APP_NAME: &str = "agent_stream_bench";

const GROUP: &str = "ingest";
const A: &str = "http_append";
const B: &str = "raw_insert";
const C: &str = "raw_copy";

const COLUMNS: &str = "tenant_id, run_id, seq, id, ts, type, child_id, payload, idempotency_key";

use agent_stream_core::testkit::prose as text;

/// The service's allocator (see `agent_stream::alloc`).
#[global_allocator]
static GLOBAL: agent_stream::Allocator = agent_stream::Allocator;

/// The texts of one batch: each event `{"type":"text.delta","payload":{"text":...}}` is
/// exactly `EVENT_BYTES` long.
fn texts() -> Vec<String> {
    let overhead = r#"{"type":"text.delta","payload":{"text":""}}"#.len();
    (0..BATCH).map(|i| text(i, EVENT_BYTES - overhead)).collect()
}

/// Everything the scenarios share.
struct Env {
    schema: String,
    owner: tokio_postgres::Client,
    http: reqwest::Client,
    base: String,
    key: String,
    tenant: String,
    /// The HTTP body of scenario A.
    body: Bytes,
    /// The rows of scenarios B and C (payloads as the append path stores them).
    texts: Vec<String>,
}

/// Which run the next batch goes to, and at which seq it starts.
struct Cursor {
    /// Names the raw scenarios' runs (`<prefix>-<n>`); A creates real runs instead.
    prefix: &'static str,
    batches: usize,
    run: String,
}

impl Cursor {
    fn new(prefix: &'static str) -> Self {
        Cursor { prefix, batches: 0, run: String::new() }
    }

    /// Advances a raw scenario by one batch, naming a new run every `BATCHES_PER_RUN`.
    fn next_raw(&mut self) {
        if self.next() {
            self.run = format!("{}-{}", self.prefix, self.batches);
        }
    }

    /// Advances by one batch; true when a new run starts with it.
    fn next(&mut self) -> bool {
        let fresh = self.batches % BATCHES_PER_RUN == 0;
        self.batches += 1;
        fresh
    }

    /// First seq of the batch just counted by `next`.
    fn first_seq(&self) -> i64 {
        (((self.batches - 1) % BATCHES_PER_RUN) * BATCH) as i64 + 1
    }
}

async fn find_database() -> Option<String> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3".to_owned()
    });
    match agent_stream::storage::db::connect(&url).await {
        Ok(_) => Some(url),
        Err(e) => {
            println!("ingest bench skipped: cannot connect to PostgreSQL at `{url}`: {e}");
            println!(
                "  set DATABASE_URL, or run PostgreSQL on 127.0.0.1:5432 (user postgres, database test)"
            );
            None
        }
    }
}

/// The URL with an application name, so the service's backends can be told apart.
fn with_app_name(url: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}application_name={APP_NAME}")
    } else {
        format!("{url} application_name={APP_NAME}")
    }
}

async fn setup() -> Option<Env> {
    let url = find_database().await?;
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    agent_stream::storage::db::sweep_old_schemas(&url, "bench", secs).await;
    let schema = format!("bench_{secs}_{}", std::process::id());
    migrate::migrate(&url, &schema).await.expect("migrate");
    let mut owner = db::connect_owner(&url, &schema).await.expect("owner connection");
    let issued =
        tenants::create_tenant(&mut owner, "bench", &[Scope::Read, Scope::Write]).await.expect("tenant");
    let pool = Db::new(&DbConfig { url: with_app_name(&url), schema: schema.clone(), max_connections: 4 })
        .expect("pool");
    let app = App::new(pool, Settings::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = agent_stream::http::router(app);
    let serve = agent_stream::server::serve_http(
        agent_stream::server::no_delay(listener),
        router,
        std::future::pending(),
    );
    tokio::spawn(serve);

    // The baseline table: LIKE ... INCLUDING ALL copies columns, defaults, CHECK
    // constraints and indexes, but neither foreign keys nor row-level security.
    owner
        .batch_execute("CREATE TABLE bench_raw (LIKE agent_run_events INCLUDING ALL)")
        .await
        .expect("create bench_raw");
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
    let (rls, policies, fks, indexes): (bool, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    println!(
        "schema {schema}; bench_raw: row security {rls}, {policies} policies, \
         {fks} foreign keys, {indexes} indexes"
    );
    assert!(!rls && policies == 0 && fks == 0, "bench_raw must be a plain table");

    let texts = texts();
    let events: Vec<Value> =
        texts.iter().map(|t| json!({"type": "text.delta", "payload": {"text": t}})).collect();
    let body = serde_json::to_vec(&events).expect("body");
    assert_eq!(body.len(), BATCH * (EVENT_BYTES + 1) + 1);

    Some(Env {
        schema,
        owner,
        http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client"),
        base,
        key: issued.secret,
        tenant: issued.tenant_id,
        body: Bytes::from(body),
        texts,
    })
}

async fn teardown(env: &Env) {
    let sql = format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE", env.schema);
    match env.owner.batch_execute(&sql).await {
        Ok(()) => println!("dropped schema {}", env.schema),
        Err(e) => eprintln!("could not drop schema {}: {e}", env.schema),
    }
}

impl Env {
    async fn create_run(&self) -> String {
        let mut http = agent_stream_load::http::Conn::open(&self.base).await.expect("connect");
        support::create_run(&mut http, &self.key).await
    }

    /// Scenario A: one batch over HTTP; the time of the request alone.
    async fn http_append(&self, cur: &mut Cursor) -> Duration {
        if cur.next() {
            cur.run = self.create_run().await;
        }
        let url = format!("{}/v1/runs/{}/events", self.base, cur.run);
        let t = Instant::now();
        let r = self
            .http
            .post(url)
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
            .body(self.body.clone())
            .send()
            .await
            .expect("append");
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let took = t.elapsed();
        assert_eq!(status, reqwest::StatusCode::CREATED, "append: {v}");
        assert_eq!(v["last_seq"].as_i64(), Some(cur.first_seq() + BATCH as i64 - 1), "{v}");
        took
    }

    /// Scenario B: one multi-row INSERT, autocommit.
    async fn raw_insert(
        &self,
        cur: &mut Cursor,
        rows: &RawRows,
        stmt: &tokio_postgres::Statement,
    ) -> Duration {
        cur.next_raw();
        let first = cur.first_seq();
        let seqs: Vec<i64> = (first..first + BATCH as i64).collect();
        let t = Instant::now();
        let n = self
            .owner
            .execute(
                stmt,
                &[
                    &self.tenant,
                    &cur.run,
                    &rows.now,
                    &seqs,
                    &rows.ids,
                    &rows.types,
                    &rows.children,
                    &rows.payloads,
                    &rows.keys,
                ],
            )
            .await
            .expect("insert");
        let took = t.elapsed();
        assert_eq!(n, BATCH as u64);
        took
    }

    /// Scenario C: one COPY, autocommit. The text is built before the clock starts.
    async fn raw_copy(&self, cur: &mut Cursor, rows: &RawRows) -> Duration {
        cur.next_raw();
        let first = cur.first_seq();
        let mut data = String::with_capacity(BATCH * 160);
        for (i, p) in rows.payloads.iter().enumerate() {
            let json = p.to_string().replace('\\', "\\\\");
            data.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\ttext.delta\t\\N\t{json}\t\\N\n",
                self.tenant,
                cur.run,
                first + i as i64,
                rows.ids[i],
                rows.now.to_rfc3339()
            ));
        }
        let sql = format!("COPY bench_raw ({COLUMNS}) FROM STDIN");
        let t = Instant::now();
        let n = support::copy_in(&self.owner, &sql, data).await;
        let took = t.elapsed();
        assert_eq!(n, BATCH as u64);
        took
    }
}

/// The column arrays of the raw scenarios, built once.
struct RawRows {
    now: DateTime<Utc>,
    ids: Vec<String>,
    types: Vec<String>,
    children: Vec<Option<String>>,
    payloads: Vec<String>,
    keys: Vec<Option<String>>,
}

impl RawRows {
    fn new(texts: &[String]) -> Self {
        let now = Utc::now();
        let ms = u64::try_from(now.timestamp_millis()).unwrap_or(0);
        let ids = (0..BATCH).map(|i| ulid::Ulid::from_parts(ms, i as u128).to_string()).collect();
        RawRows {
            now,
            ids,
            types: vec!["text.delta".to_owned(); BATCH],
            children: vec![None; BATCH],
            // The canonical payload the append path stores for these events, sent as
            // text and cast per row as the append path does.
            payloads: texts.iter().map(|t| json!({"text": t}).to_string()).collect(),
            keys: vec![None; BATCH],
        }
    }
}

fn prepare_insert(rt: &Runtime, env: &Env) -> tokio_postgres::Statement {
    rt.block_on(env.owner.prepare(&format!(
        "INSERT INTO bench_raw ({COLUMNS})
             SELECT $1, $2, u.seq, u.id, $3, u.type, u.child_id, u.payload::jsonb, u.key
             FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
                  AS u(seq, id, type, child_id, payload, key)"
    )))
    .expect("prepare insert")
}

fn bench(c: &mut Criterion, rt: &Runtime, env: &Env, rows: &RawRows) {
    let insert = prepare_insert(rt, env);

    let mut g = c.benchmark_group(GROUP);
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(3));
    g.measurement_time(Duration::from_secs(12));
    let mut cur = Cursor::new("raw");
    g.bench_function(B, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += env.raw_insert(&mut cur, rows, &insert).await;
                }
                total
            })
        })
    });
    let mut cur = Cursor::new("http");
    g.bench_function(A, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += env.http_append(&mut cur).await;
                }
                total
            })
        })
    });
    let mut cur = Cursor::new("copy");
    g.bench_function(C, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += env.raw_copy(&mut cur, rows).await;
                }
                total
            })
        })
    });
    g.finish();
}

/// True under `cargo bench` (criterion's `--bench`), false in `cargo test --benches`.
fn criterion_measured() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Criterion's point estimate for one benchmark of this run, in seconds per batch.
fn estimate(since: SystemTime, id: &str) -> Option<f64> {
    let home = std::env::var_os("CRITERION_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("criterion")
    });
    let path = home.join(GROUP).join(id).join("new").join("estimates.json");
    let meta = std::fs::metadata(&path).ok()?;
    if meta.modified().ok()? < since {
        return None; // left by an earlier run (this one was filtered out)
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    let ns = v["slope"]["point_estimate"].as_f64().or_else(|| v["mean"]["point_estimate"].as_f64())?;
    Some(ns / 1e9)
}

/// utime + stime of a process, in clock ticks (USER_HZ, 100 per second on Linux).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, whole line).
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

async fn backend_pids(env: &Env) -> Vec<u32> {
    let rows = env
        .owner
        .query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&APP_NAME])
        .await
        .unwrap_or_default();
    rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect()
}

fn ticks_of(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|p| cpu_ticks(*p)).sum()
}

/// What one scenario took in the interleaved pass.
#[derive(Default)]
struct Tally {
    /// Wall time of each batch, in seconds.
    walls: Vec<f64>,
    /// CPU ticks of this process during its batches (None when /proc is unreadable).
    own: Option<u64>,
    /// CPU ticks of the PostgreSQL backends that served it.
    pg: Option<u64>,
}

impl Tally {
    fn new() -> Self {
        Tally { walls: vec![], own: Some(0), pg: Some(0) }
    }

    fn add(&mut self, wall: Duration, own: Option<u64>, pg: Option<u64>) {
        self.walls.push(wall.as_secs_f64());
        self.own = self.own.zip(own).map(|(a, b)| a + b);
        self.pg = self.pg.zip(pg).map(|(a, b)| a + b);
    }

    fn median(&self) -> f64 {
        let mut w = self.walls.clone();
        w.sort_by(f64::total_cmp);
        w[w.len() / 2]
    }

    /// Mean CPU per batch, in ms (10 ms ticks, summed over every batch).
    fn cpu_ms(ticks: Option<u64>, batches: usize) -> String {
        ticks.map_or("n/a".to_owned(), |t| format!("{:.1} ms", t as f64 * 10.0 / batches as f64))
    }
}

/// Criterion runs A, B and C one after another, so a change in the machine's load between
/// them moves the ratio. This pass interleaves them instead (one batch of each per round,
/// in rotating order) and reports medians, plus where the CPU time of each went: this
/// process (client and server) versus the PostgreSQL backends that served it.
fn interleaved(
    rt: &Runtime,
    env: &Env,
    rows: &RawRows,
    insert: &tokio_postgres::Statement,
    since: SystemTime,
) {
    rt.block_on(async {
        let me = std::process::id();
        let owner_pid: i32 =
            env.owner.query_one("SELECT pg_backend_pid()", &[]).await.map(|r| r.get(0)).unwrap_or(0);
        let owner_pids = [owner_pid as u32];
        let mut ca = Cursor::new("http");
        let mut cb = Cursor::new("round-raw");
        let mut cc = Cursor::new("round-copy");
        // Warm up each path and the pool once, outside the tallies.
        env.http_append(&mut ca).await;
        env.raw_insert(&mut cb, rows, insert).await;
        env.raw_copy(&mut cc, rows).await;
        let app_pids = backend_pids(env).await;
        let (mut ta, mut tb, mut tc) = (Tally::new(), Tally::new(), Tally::new());
        for round in 0..ROUNDS {
            for k in 0..3 {
                let which = (round + k) % 3;
                let pids: &[u32] = if which == 0 { &app_pids } else { &owner_pids };
                let (own0, pg0) = (cpu_ticks(me), ticks_of(pids));
                let wall = match which {
                    0 => env.http_append(&mut ca).await,
                    1 => env.raw_insert(&mut cb, rows, insert).await,
                    _ => env.raw_copy(&mut cc, rows).await,
                };
                let (own1, pg1) = (cpu_ticks(me), ticks_of(pids));
                let own = own0.zip(own1).map(|(x, y)| y - x);
                let pg = pg0.zip(pg1).map(|(x, y)| y - x);
                [&mut ta, &mut tb, &mut tc][which].add(wall, own, pg);
            }
        }
        let (a, b, c) = (ta.median(), tb.median(), tc.median());
        let rate = |s: f64| BATCH as f64 / s;
        let crit = match (estimate(since, A), estimate(since, B)) {
            (Some(ea), Some(eb)) => format!(
                "criterion (sequential): A {:.0} rows/s, B {:.0} rows/s, A/B {:.2}",
                rate(ea),
                rate(eb),
                eb / ea
            ),
            _ => "criterion estimates n/a".to_owned(),
        };
        println!(
            "SUMMARY ingest, {ROUNDS} interleaved rounds, medians: A http_append {:.0} rows/s | \
             B raw_insert {:.0} rows/s | A/B {:.2} | C raw_copy {:.0} rows/s | A/C {:.2} | {crit}",
            rate(a),
            rate(b),
            b / a,
            rate(c),
            c / a
        );
        println!(
            "per batch (median wall; CPU is the mean over {ROUNDS}): \
             A wall {:.1} ms, this process {}, service backends {} | \
             B wall {:.1} ms, this process {}, owner backend {} | \
             C wall {:.1} ms, this process {}, owner backend {}",
            a * 1e3,
            Tally::cpu_ms(ta.own, ROUNDS),
            Tally::cpu_ms(ta.pg, ROUNDS),
            b * 1e3,
            Tally::cpu_ms(tb.own, ROUNDS),
            Tally::cpu_ms(tb.pg, ROUNDS),
            c * 1e3,
            Tally::cpu_ms(tc.own, ROUNDS),
            Tally::cpu_ms(tc.pg, ROUNDS),
        );
    });
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let Some(env) = rt.block_on(setup()) else {
        return;
    };
    let since = SystemTime::now();
    let rows = RawRows::new(&env.texts);
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &rt, &env, &rows);
    c.final_summary();
    if criterion_measured() {
        interleaved(&rt, &env, &rows, &prepare_insert(&rt, &env), since);
    }
    rt.block_on(teardown(&env));
}
