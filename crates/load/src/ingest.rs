//! `ingest`: batched appends from 1, 4 and 16 producers, in batches of 1, 100 and 1,000
//! `text.delta` events of 100 bytes each on the wire, against raw PostgreSQL.
//!
//! The service is a separate `agent-stream serve` process (release binary, rate limit
//! off, default 4 group-commit lanes and pool of 32), so its CPU is read apart from the
//! producers'. Each producer appends to a run of its own (`POST /v1/runs/{run}/events`,
//! one JSON array per batch, built once before timing), back to back; every answer must
//! be 201 with the seqs that follow the producer's previous batch, else it is counted as
//! failed and shown.
//!
//! Baseline, for each (producers, batch) cell, with as many connections as producers and
//! the same rows in the same batches, each batch autocommitted, into tables made with
//! `CREATE TABLE ... (LIKE agent_run_events INCLUDING ALL)` (same indexes, no row
//! security):
//! - raw INSERT: the append path's own `INSERT ... SELECT FROM unnest(...)` (payloads as
//!   `text[]`, cast to jsonb per row);
//! - COPY (batches over 1 only): `COPY ... FROM STDIN`, text format.
//!
//! The target cell runs [`ROUNDS`] rounds of one [`SLICE`] per side and the others
//! [`OTHER_ROUNDS`], the order reversed every round, so load drift on the shared machine hits baseline and service alike. A rate is
//! the rows of completed batches over the wall time until the last producer finished.
//! After each cell the rows the service stored for the cell's runs are counted in SQL and
//! must equal the rows the producers counted. A warm-up cell (4 × 100, one round) runs
//! first and is not reported. Issue 6's target: 4 producers × 1,000-event batches reach
//! at least 0.60 of raw INSERT. About 1 min 30 s once built.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};
use bytes::Bytes;
use chrono::Utc;
use serde_json::{json, Value};

use super::http::Conn;
use super::support;

const PRODUCERS: [usize; 3] = [1, 4, 16];
const BATCHES: [usize; 3] = [1, 100, 1_000];
/// Rounds for the target cell; each side runs one slice per round. The other cells have
/// no target and run [`OTHER_ROUNDS`], which keeps the scenario near a minute and a half
/// (it took 2 min 35 s with four rounds everywhere).
const ROUNDS: usize = 4;
/// Rounds for the cells without a target: two, so that a linear drift in the machine's
/// load still falls on both sides alike.
const OTHER_ROUNDS: usize = 2;
const SLICE: Duration = Duration::from_millis(1_500);
/// Wire size of each event in the HTTP body, in bytes.
const EVENT_BYTES: usize = 100;
/// The cell issue 6 sets a target for, and the target (HTTP / raw INSERT).
const TARGET_CELL: (usize, usize) = (4, 1_000);
const TARGET: f64 = 0.60;

const COLUMNS: &str = "tenant_id, run_id, seq, id, ts, type, child_id, payload, idempotency_key, message_id";
/// What the service derives for a run of bare text deltas: one implicit message opened
/// by the first delta, so the baseline stores the same column.
const MESSAGE_ID: &str = "msg-1";

/// The rows every producer sends, built once: event `i` of a batch is the same on
/// every side.
struct Rows {
    /// `{"text": ...}` as the append path stores it.
    payloads: Vec<Value>,
    /// The same payloads as COPY text fields.
    copy_fields: Vec<String>,
    /// HTTP bodies by batch size.
    bodies: Vec<(usize, Bytes)>,
}

impl Rows {
    fn new() -> Rows {
        let max = BATCHES.iter().copied().max().unwrap_or(1);
        let overhead = r#"{"type":"text.delta","payload":{"text":""}}"#.len();
        let texts: Vec<String> =
            (0..max).map(|i| agent_stream_core::testkit::prose(i, EVENT_BYTES - overhead)).collect();
        let payloads: Vec<Value> = texts.iter().map(|t| json!({"text": t})).collect();
        let copy_fields = payloads.iter().map(|p| p.to_string().replace('\\', "\\\\")).collect();
        let bodies = BATCHES
            .iter()
            .map(|&n| {
                let events: Vec<Value> = texts[..n]
                    .iter()
                    .map(|t| json!({"type": "text.delta", "payload": {"text": t}}))
                    .collect();
                let body = serde_json::to_vec(&events).expect("body");
                assert_eq!(body.len(), n * (EVENT_BYTES + 1) + 1, "events of {EVENT_BYTES} bytes");
                (n, Bytes::from(body))
            })
            .collect();
        Rows { payloads, copy_fields, bodies }
    }

    fn body(&self, batch: usize) -> Bytes {
        self.bodies.iter().find(|(n, _)| *n == batch).map(|(_, b)| b.clone()).expect("body of this size")
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Insert,
    Copy,
    Http,
}

/// One baseline connection and the run it writes.
struct RawProducer {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    run: String,
    /// Last seq written to `run`, per table.
    inserted: i64,
    copied: i64,
    /// Distinguishes this producer's ids from the others' in the same millisecond.
    tag: u128,
    ids: u128,
}

/// One HTTP producer: its connection, its run and the last seq the service gave it.
struct HttpProducer {
    http: Conn,
    run: String,
    last_seq: i64,
}

/// What a slice of one side did.
#[derive(Default)]
struct Tally {
    rows: u64,
    secs: f64,
    failed: u64,
    first_failure: Option<String>,
    service_cpu: f64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.rows += o.rows;
        self.secs += o.secs;
        self.failed += o.failed;
        self.first_failure = self.first_failure.take().or(o.first_failure);
        self.service_cpu += o.service_cpu;
    }

    fn rate(&self) -> f64 {
        self.rows as f64 / self.secs.max(1e-9)
    }
}

struct Env {
    url: String,
    schema: String,
    tenant: String,
    key: String,
    base: String,
    pid: u32,
    rows: Arc<Rows>,
}

impl RawProducer {
    async fn connect(env: &Env, run: String, tag: u128) -> RawProducer {
        let client = support::connect(&env.url).await;
        let insert = client
            .prepare(&format!(
                "INSERT INTO \"{}\".raw_insert ({COLUMNS})
                 SELECT $1, $2, u.seq, u.id, $3, u.type, u.child_id, u.payload::jsonb, u.key, u.message_id
                 FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
                      AS u(seq, id, type, child_id, payload, key, message_id)",
                env.schema
            ))
            .await
            .expect("prepare insert");
        RawProducer { client, insert, run, inserted: 0, copied: 0, tag, ids: 0 }
    }

    /// Monotonic ULIDs at `ms`, unique across producers.
    fn ids(&mut self, ms: u64, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                self.ids += 1;
                ulid::Ulid::from_parts(ms, (self.tag << 64) | self.ids).to_string()
            })
            .collect()
    }

    async fn insert(&mut self, tenant: &str, rows: &Rows, n: usize) -> u64 {
        let now = Utc::now();
        let ids = self.ids(u64::try_from(now.timestamp_millis()).unwrap_or(0), n);
        let seqs: Vec<i64> = (self.inserted + 1..=self.inserted + n as i64).collect();
        let types = vec!["text.delta"; n];
        let none: Vec<Option<&str>> = vec![None; n];
        let mids = vec![Some(MESSAGE_ID); n];
        // As text, like the append path; `to_string` is the client's work on both sides.
        let payloads: Vec<String> = rows.payloads[..n].iter().map(Value::to_string).collect();
        let wrote = self
            .client
            .execute(
                &self.insert,
                &[&tenant, &self.run, &now, &seqs, &ids, &types, &none, &payloads, &none, &mids],
            )
            .await
            .expect("raw insert");
        assert_eq!(wrote, n as u64, "raw insert row count");
        self.inserted += n as i64;
        wrote
    }

    async fn copy(&mut self, schema: &str, tenant: &str, rows: &Rows, n: usize) -> u64 {
        let now = Utc::now();
        let ts = now.to_rfc3339();
        let ids = self.ids(u64::try_from(now.timestamp_millis()).unwrap_or(0), n);
        let mut data = String::with_capacity(n * 200);
        for (i, id) in ids.iter().enumerate() {
            let seq = self.copied + 1 + i as i64;
            let p = &rows.copy_fields[i];
            data.push_str(&format!(
                "{tenant}\t{}\t{seq}\t{id}\t{ts}\ttext.delta\t\\N\t{p}\t\\N\t{MESSAGE_ID}\n",
                self.run
            ));
        }
        let sql = format!("COPY \"{schema}\".raw_copy ({COLUMNS}) FROM STDIN");
        let wrote = support::copy_in(&self.client, &sql, data).await;
        assert_eq!(wrote, n as u64, "copy row count");
        self.copied += n as i64;
        wrote
    }
}

impl Env {
    async fn producer(&self) -> HttpProducer {
        let mut http = Conn::open(&self.base).await.expect("connect");
        let run = support::create_run(&mut http, &self.key).await;
        HttpProducer { http, run, last_seq: 0 }
    }

    /// Runs every raw producer until `SLICE` is over; producers come back for the next.
    async fn raw_slice(
        &self,
        side: Side,
        producers: Vec<RawProducer>,
        n: usize,
    ) -> (Tally, Vec<RawProducer>) {
        let t0 = Instant::now();
        let deadline = t0 + SLICE;
        let tasks: Vec<_> = producers
            .into_iter()
            .map(|mut p| {
                let (rows, tenant, schema) = (self.rows.clone(), self.tenant.clone(), self.schema.clone());
                tokio::spawn(async move {
                    let mut wrote = 0;
                    while Instant::now() < deadline {
                        wrote += match side {
                            Side::Insert => p.insert(&tenant, &rows, n).await,
                            _ => p.copy(&schema, &tenant, &rows, n).await,
                        };
                    }
                    (wrote, p)
                })
            })
            .collect();
        let mut back = Vec::with_capacity(tasks.len());
        let mut rows = 0;
        for t in tasks {
            let (wrote, p) = t.await.expect("raw producer");
            rows += wrote;
            back.push(p);
        }
        (Tally { rows, secs: t0.elapsed().as_secs_f64(), ..Default::default() }, back)
    }

    async fn http_slice(&self, producers: Vec<HttpProducer>, n: usize) -> (Tally, Vec<HttpProducer>) {
        let body = self.rows.body(n);
        let cpu0 = support::cpu_secs(self.pid);
        let t0 = Instant::now();
        let deadline = t0 + SLICE;
        let tasks: Vec<_> = producers
            .into_iter()
            .map(|mut p| {
                let (base, key, body) = (self.base.clone(), self.key.clone(), body.clone());
                let path = format!("/v1/runs/{}/events", p.run);
                tokio::spawn(async move {
                    let mut t = Tally::default();
                    while Instant::now() < deadline {
                        let answer = match p.http.post(&path, &key, body.clone()).await {
                            Ok(r) => (r.status, r.text()),
                            Err(e) => {
                                t.failed += 1;
                                t.first_failure.get_or_insert_with(|| format!("request: {e}"));
                                // The connection is gone: a new one for the next append.
                                match Conn::open(&base).await {
                                    Ok(c) => p.http = c,
                                    Err(_) => break,
                                }
                                continue;
                            }
                        };
                        let v: Value = serde_json::from_str(&answer.1).unwrap_or(Value::Null);
                        let want = (p.last_seq + 1, p.last_seq + n as i64);
                        let got = (v["first_seq"].as_i64(), v["last_seq"].as_i64());
                        if answer.0 == hyper::StatusCode::CREATED && got == (Some(want.0), Some(want.1)) {
                            t.rows += n as u64;
                            p.last_seq = want.1;
                        } else {
                            t.failed += 1;
                            t.first_failure.get_or_insert_with(|| {
                                format!("{}: {} (expected seqs {}..={})", answer.0, answer.1, want.0, want.1)
                            });
                            // Resynchronise on what the service says, if anything.
                            if let Some(last) = got.1 {
                                p.last_seq = last;
                            }
                        }
                    }
                    (t, p)
                })
            })
            .collect();
        let mut tally = Tally::default();
        let mut back = Vec::with_capacity(tasks.len());
        for t in tasks {
            let (t, p) = t.await.expect("http producer");
            tally.add(t);
            back.push(p);
        }
        tally.secs = t0.elapsed().as_secs_f64();
        tally.service_cpu = support::cpu_secs(self.pid) - cpu0;
        (tally, back)
    }

    /// One (producers, batch) cell: the sides alternate, `rounds` slices each.
    async fn cell(&self, producers: usize, n: usize, rounds: usize, cell: usize) -> [Tally; 3] {
        let mut raw = Vec::with_capacity(producers);
        for k in 0..producers {
            raw.push(RawProducer::connect(self, format!("cell{cell}-p{k}"), (cell * 100 + k) as u128).await);
        }
        let mut web = Vec::with_capacity(producers);
        for _ in 0..producers {
            web.push(self.producer().await);
        }
        let mut sides = vec![Side::Insert, Side::Http];
        if n > 1 {
            sides.insert(1, Side::Copy);
        }
        let mut out: [Tally; 3] = Default::default();
        for _ in 0..rounds {
            for &side in &sides {
                let (t, i) = match side {
                    Side::Http => {
                        let (t, back) = self.http_slice(std::mem::take(&mut web), n).await;
                        web = back;
                        (t, 2)
                    }
                    _ => {
                        let (t, back) = self.raw_slice(side, std::mem::take(&mut raw), n).await;
                        raw = back;
                        (t, usize::from(side == Side::Copy))
                    }
                };
                out[i].add(t);
            }
            sides.reverse();
        }
        self.check_stored(&web, out[2].rows).await;
        out
    }

    /// The rows the service stored for the cell's runs must be the rows it answered 201 for.
    async fn check_stored(&self, web: &[HttpProducer], counted: u64) {
        let owner = db::connect_owner(&self.url, &self.schema).await.expect("owner");
        let runs: Vec<&str> = web.iter().map(|p| p.run.as_str()).collect();
        let stored: i64 = owner
            .query_one(
                "SELECT count(*) FROM agent_run_events WHERE tenant_id = $1 AND run_id = ANY($2)",
                &[&self.tenant, &runs],
            )
            .await
            .expect("count stored rows")
            .get(0);
        assert_eq!(stored as u64, counted, "rows stored by the service vs rows answered 201");
    }
}

fn fmt_rate(r: f64) -> String {
    let r = r.round() as u64;
    let (k, u) = (r / 1000, r % 1000);
    if k > 0 {
        format!("{k},{u:03}")
    } else {
        u.to_string()
    }
}

/// Runs the scenario in `schema` against `bin serve` and prints its table.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let issued =
        tenants::create_tenant(&mut owner, "ingest", &[Scope::Read, Scope::Write]).await.expect("tenant");
    owner
        .batch_execute(
            "CREATE TABLE raw_insert (LIKE agent_run_events INCLUDING ALL);
             CREATE TABLE raw_copy (LIKE agent_run_events INCLUDING ALL);",
        )
        .await
        .expect("baseline tables");
    let mut server =
        support::serve(bin, url, schema, &["--append-rate", "0", "--retention-interval", "0"]).await;
    let env = Env {
        url: url.to_owned(),
        schema: schema.to_owned(),
        tenant: issued.tenant_id,
        key: issued.secret,
        base: server.base.clone(),
        pid: server.pid,
        rows: Arc::new(Rows::new()),
    };
    // Warm the server, its pool and PostgreSQL's caches; not reported.
    let mut cell = 0;
    let _ = env.cell(4, 100, 1, cell).await;

    let mut lines = vec![];
    let mut failed = 0;
    let mut target = None;
    for &producers in &PRODUCERS {
        for &n in &BATCHES {
            cell += 1;
            let rounds = if (producers, n) == TARGET_CELL { ROUNDS } else { OTHER_ROUNDS };
            let [ins, copy, http] = env.cell(producers, n, rounds, cell).await;
            if let Some(f) = &http.first_failure {
                eprintln!("load: ingest {producers}×{n}: {} failed appends, first: {f}", http.failed);
            }
            failed += http.failed;
            let ratio = http.rate() / ins.rate();
            let mark = if (producers, n) == TARGET_CELL {
                let met = ratio >= TARGET;
                target = Some((ratio, met));
                format!("≥ {TARGET:.2}: **{}**", if met { "met" } else { "not met" })
            } else {
                String::new()
            };
            let line = format!(
                "| {producers} | {n} | {} | {} | {}{} | {ratio:.2} | {:.0}% | {mark} |",
                fmt_rate(ins.rate()),
                if n > 1 { fmt_rate(copy.rate()) } else { "-".to_owned() },
                fmt_rate(http.rate()),
                if http.failed > 0 { format!(" ({} failed)", http.failed) } else { String::new() },
                100.0 * http.service_cpu / http.secs,
            );
            eprintln!("{line}");
            lines.push(line);
        }
    }
    println!(
        "ingest: alternating rounds of {:.1} s per side, {ROUNDS} in the target cell and \
         {OTHER_ROUNDS} in the others; \
         events of {EVENT_BYTES} bytes; service CPU in % of one core while HTTP ran",
        SLICE.as_secs_f64()
    );
    println!("| producers | batch | raw INSERT rows/s | COPY rows/s | HTTP rows/s | HTTP / INSERT | service CPU | target |");
    println!("|---|---|---|---|---|---|---|---|");
    for l in lines {
        println!("{l}");
    }
    if let Some((ratio, met)) = target {
        println!(
            "target ({} producers × {} events, HTTP ≥ {TARGET:.2} × raw INSERT): {} ({ratio:.2}); failed appends: {failed}",
            TARGET_CELL.0,
            TARGET_CELL.1,
            if met { "met" } else { "not met" }
        );
    }
    let _ = server.child.kill().await;
}
