//! `ingest-single`: 64 producers (`INGEST_PRODUCERS=n` for another count), each
//! appending single ~100-byte text deltas to its own run over HTTP as fast as answers
//! come, for 5 s, with group commit on (2 lanes, the default; `INGEST_LANES=n` for another
//! count) and off; baseline: single-row autocommit INSERTs of the same rows into a table
//! like `agent_run_events` from 16 and from 64 connections. The service is a separate
//! `agent-stream serve` process (release binary, rate limit off), so its CPU is read
//! apart from the producers'; the rows it stored are counted in SQL after each run and
//! must equal the appends answered 201. A last row streams the same deltas through the
//! streaming append (`POST /v1/runs/{id}/events/stream`, one long-lived request per
//! producer, up to 64 events unacknowledged), whose events acknowledged per second are
//! set against the same baseline. An HTTP/2 row sends the same single appends, a
//! request each, multiplexed over one shared cleartext HTTP/2 connection
//! (`INGEST_H2_CONNS=n` for more), as a client process running many runs may.
//! `INGEST_IDLE_RUNS=n` gives each pass's tenant `n`
//! finished runs besides the producers' (what a tenant has after a while in service).
//! A ceiling row: as many connections as producers asking `GET /healthz` of the same server,
//! the most requests per second any HTTP append could be answered at here. A last line
//! shares out the CPU (every `postgres` process, the service, the producers) per row of
//! the baseline and of group commit, against what the 2× target leaves per append, and
//! a lower bound on any HTTP single append's cost here: the ceiling's request, server and
//! clients, plus PostgreSQL's cost per row in a raw pass of transactions of as many
//! single-row appends as there are producers (the largest group they can form), one
//! transaction at a time as a lane sends them.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};
use bytes::Bytes;
use serde_json::json;

use super::http::{Answer, AppendStream, Conn, H2Conn};
use super::support::{self, BareConn};

const SECS: u64 = 5;
/// Producers of the service's passes, one run and connection each: 64 (the issue's
/// figure), or `INGEST_PRODUCERS`. Each waits for its answer before the next append, so
/// how many there are bounds how many appends a commit can gather.
fn producers() -> usize {
    std::env::var("INGEST_PRODUCERS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(64)
}
/// The server's count of group-commit transactions.
const GROUPS: &str = "agent_stream_commit_groups_total";

/// Rows per second, and the cores the database and this tool used meanwhile.
async fn raw_inserts(url: &str, schema: &str, clients: usize) -> (f64, support::Cores) {
    let c = support::connect(url).await;
    let table = format!("\"{schema}\".raw_{clients}");
    c.batch_execute(&format!("CREATE TABLE {table} (LIKE \"{schema}\".agent_run_events INCLUDING ALL)"))
        .await
        .expect("table");
    let rows = Arc::new(AtomicU64::new(0));
    let meter = support::CpuMeter::start(None);
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
    let cores = meter.cores();
    (rows.load(Ordering::Relaxed) as f64 / SECS as f64, cores)
}

/// Transactions of `rows` single-row appends, one run each, from one client: BEGIN,
/// the INSERT of the service's column-array form and COMMIT in one round trip, one
/// transaction at a time, as one lane sends a tenant's groups. Rows per second and the
/// cores meanwhile. With `rows` the producer count this is the database's share of a
/// single append at the largest group those producers can form: each waits for its
/// answer, so no commit can gather more appends than there are producers.
async fn raw_groups(url: &str, schema: &str, rows: usize) -> (f64, support::Cores) {
    let c = support::connect(url).await;
    let table = format!("\"{schema}\".raw_groups_{rows}");
    c.batch_execute(&format!("CREATE TABLE {table} (LIKE \"{schema}\".agent_run_events INCLUDING ALL)"))
        .await
        .expect("table");
    let stmt = c
        .prepare(&format!(
            "INSERT INTO {table} (tenant_id, run_id, seq, id, ts, type, payload)
             SELECT 't', u.run_id, u.seq, u.id, u.ts, u.type, u.payload::jsonb
             FROM unnest($1::text[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[], $6::text[])
                  AS u(run_id, seq, id, ts, type, payload)"
        ))
        .await
        .expect("prepare");
    let runs: Vec<String> = (0..rows).map(|_| ulid::Ulid::new().to_string()).collect();
    let (c, stmt, runs) = (&c, &stmt, &runs);
    timed_groups(rows, |seq| async move {
        let seqs = vec![seq; rows];
        let ids: Vec<String> = (0..rows).map(|_| ulid::Ulid::new().to_string()).collect();
        let ts = vec![chrono::Utc::now(); rows];
        let types = vec!["text.delta"; rows];
        let payloads: Vec<String> = (0..rows).map(|_| delta(seq as u64)["payload"].to_string()).collect();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [runs, &seqs, &ids, &ts, &types, &payloads];
        let (begun, inserted, committed) =
            futures::join!(c.batch_execute("BEGIN"), c.execute(stmt, &params), c.batch_execute("COMMIT"));
        begun.expect("begin");
        inserted.expect("insert");
        committed.expect("commit");
    })
    .await
}

/// Runs `transaction` (one commit of `rows` rows, given the seq its rows take) one after
/// another for [`SECS`]: rows per second, and the cores meanwhile.
async fn timed_groups<F, Fut>(rows: usize, mut transaction: F) -> (f64, support::Cores)
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = ()>,
{
    let meter = support::CpuMeter::start(None);
    let deadline = Instant::now() + Duration::from_secs(SECS);
    let mut seq = 0i64;
    while Instant::now() < deadline {
        seq += 1;
        transaction(seq).await;
    }
    let cores = meter.cores();
    (seq as f64 * rows as f64 / SECS as f64, cores)
}

/// The same transactions as [`raw_groups`], in the service's own form: a connection of
/// its pool (its role, so row-level security applies), the tenant's `SET LOCAL`, and
/// the one-round-trip INSERT that claims its runs' writer keys (`Rows::claiming_statement`,
/// every column the service writes) into the schema's `agent_run_events`. Set beside
/// [`raw_groups`] in the same run, it says what the service's statement costs the
/// database beyond the rows themselves.
async fn service_shaped_groups(url: &str, schema: &str, rows: usize) -> (f64, support::Cores) {
    use agent_stream::domain::input::{parse_event, Limits};
    use agent_stream::storage::rows::{writer_keys, Rows};
    let pool = agent_stream::storage::Db::new(&agent_stream::storage::DbConfig {
        url: url.to_owned(),
        schema: schema.to_owned(),
        max_connections: 1,
    })
    .expect("pool");
    let c = pool.pool.get().await.expect("a service connection");
    let tenant = ulid::Ulid::new().to_string();
    let runs: Vec<String> = (0..rows).map(|_| ulid::Ulid::new().to_string()).collect();
    let keys = writer_keys(&runs);
    let (c, tenant, runs, keys) = (&c, &tenant, &runs, &keys);
    timed_groups(rows, |seq| async move {
        let mut batch = Rows::with_capacity(tenant, rows);
        let event =
            parse_event(delta(seq as u64).to_string().as_bytes(), Limits::default()).expect("a delta");
        for run in runs {
            batch.push(run, seq, ulid::Ulid::new(), chrono::Utc::now(), &event, Some(run.clone()), None);
        }
        let (begun, scoped, inserted, committed) = batch.commit_claimed(c, keys).await.expect("prepare");
        begun.expect("begin");
        scoped.expect("scope");
        inserted.expect("insert");
        committed.expect("commit");
    })
    .await
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
    /// CPU over the run: the server's, the database's, the producers'.
    cores: support::Cores,
}

/// A tenant, `agent-stream serve` with `lanes` group-commit lanes (rate limit off) and
/// one run per producer: what both service passes start from, and what they are read
/// against when they end.
struct Pass {
    owner: tokio_postgres::Client,
    tenant_id: String,
    key: String,
    server: support::Server,
    http: Conn,
    runs: Vec<String>,
    groups_before: f64,
    meter: support::CpuMeter,
    t0: Instant,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Pass {
    async fn start(bin: &Path, url: &str, schema: &str, tenant: &str, lanes: usize) -> Pass {
        let mut owner = db::connect_owner(url, schema).await.expect("owner");
        let issued =
            tenants::create_tenant(&mut owner, tenant, &[Scope::Read, Scope::Write]).await.expect("tenant");
        idle_runs(&owner, &issued.tenant_id).await;
        let server = support::serve(
            bin,
            url,
            schema,
            &["--append-rate", "0", "--retention-interval", "0", "--group-commit-lanes", &lanes.to_string()],
        )
        .await;
        let mut http = Conn::open(&server.base).await.expect("connect");
        let mut runs = vec![];
        for _ in 0..producers() {
            runs.push(support::create_run(&mut http, &issued.secret).await);
        }
        let groups_before = support::scrape(&mut http, GROUPS).await;
        let meter = support::CpuMeter::start(Some(server.pid));
        Pass {
            owner,
            tenant_id: issued.tenant_id,
            key: issued.secret,
            server,
            http,
            runs,
            groups_before,
            meter,
            t0: Instant::now(),
            ok: Arc::new(AtomicU64::new(0)),
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Reads CPU and commits, and gives the rate of `ok` answers over `secs`.
    async fn measure(&mut self, secs: f64) -> Service {
        let cores = self.meter.cores();
        let groups = support::scrape(&mut self.http, GROUPS).await - self.groups_before;
        let appends = self.ok.load(Ordering::Relaxed);
        Service {
            rate: appends as f64 / secs,
            appends,
            failed: self.failed.load(Ordering::Relaxed),
            groups: groups as u64,
            cores,
        }
    }

    /// [`Pass::measure`], after which it checks in SQL that the rows stored equal the
    /// appends answered plus `late` (stored after the window).
    async fn finish(mut self, secs: f64, late: u64) -> Service {
        let service = self.measure(secs).await;
        let stored: i64 = self
            .owner
            .query_one("SELECT count(*) FROM agent_run_events WHERE tenant_id = $1", &[&self.tenant_id])
            .await
            .expect("count")
            .get(0);
        assert_eq!(stored as u64, service.appends + late, "rows stored must equal the events acknowledged");
        service
    }
}

/// Gives the tenant `INGEST_IDLE_RUNS` finished runs (default none) besides the
/// producers' own, as a tenant has after a while in service: what an append costs must
/// not grow with them. Analyzed, as autovacuum would have.
async fn idle_runs(owner: &tokio_postgres::Client, tenant: &str) {
    let n: i64 = std::env::var("INGEST_IDLE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if n == 0 {
        return;
    }
    owner
        .execute(
            "INSERT INTO runs (tenant_id, run_id, root_run_id, state, ended_at)
             SELECT $1, 'idle_' || i, 'idle_' || i, 'done', now() FROM generate_series(1, $2::bigint) i",
            &[&tenant, &n],
        )
        .await
        .expect("idle runs");
    owner.batch_execute("ANALYZE runs").await.expect("analyze");
}

/// One ~100-byte text delta, the `n`-th of its producer.
fn delta(n: u64) -> serde_json::Value {
    json!({"type": "text.delta", "payload": {"text": format!("token {n} lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod")}})
}

/// The producers against a separate `agent-stream serve` with `lanes` group-commit lanes
/// (0: one transaction per append). Checks in SQL that the rows stored equal the 201s.
async fn service_appends(bin: &Path, url: &str, schema: &str, lanes: usize) -> Service {
    let pass = Pass::start(bin, url, schema, &format!("load{lanes}"), lanes).await;
    let mut producers = vec![];
    for _ in &pass.runs {
        producers.push(Reconnecting { conn: BareConn::new(&pass.server.base) });
    }
    produce(pass, producers).await
}

/// The same producers appending single events, each request its own, over `conns`
/// shared HTTP/2 connections (cleartext) instead of one HTTP/1.1 connection each: what a
/// client process running many runs sends when its HTTP client speaks HTTP/2. Checked in
/// SQL like [`service_appends`].
async fn service_appends_h2(bin: &Path, url: &str, schema: &str, lanes: usize, conns: usize) -> Service {
    let pass = Pass::start(bin, url, schema, &format!("h2load{lanes}"), lanes).await;
    let mut shared = vec![];
    for _ in 0..conns.max(1) {
        shared.push(H2Conn::open(&pass.server.base).await.expect("connect over HTTP/2"));
    }
    let producers = (0..pass.runs.len()).map(|i| shared[i % shared.len()].clone()).collect();
    produce(pass, producers).await
}

/// How a producer sends its appends, one request each.
trait Poster: Send + 'static {
    /// `POST path` with a JSON body as `key`.
    fn post(
        &mut self,
        path: &str,
        key: &str,
        json: Bytes,
    ) -> impl Future<Output = anyhow::Result<Answer>> + Send;
    /// After a request got no answer: whether to go on.
    fn recover(&mut self) -> impl Future<Output = bool> + Send;
}

/// One HTTP/1.1 connection of its own ([`BareConn`]), opened again when it breaks.
struct Reconnecting {
    conn: BareConn,
}

impl Poster for Reconnecting {
    async fn post(&mut self, path: &str, key: &str, json: Bytes) -> anyhow::Result<Answer> {
        Ok(self.conn.post(path, key, &json).await?)
    }

    async fn recover(&mut self) -> bool {
        // The connection is gone: a new one for the next append.
        self.conn.reopen().await
    }
}

impl Poster for H2Conn {
    async fn post(&mut self, path: &str, key: &str, json: Bytes) -> anyhow::Result<Answer> {
        H2Conn::post(self, path, key, json).await
    }

    async fn recover(&mut self) -> bool {
        // The shared connection is gone for every producer on it.
        false
    }
}

/// Each of `pass`'s runs appended to by its producer, as fast as answers come, for
/// [`SECS`]; then the pass read against the rows stored.
async fn produce<P: Poster>(pass: Pass, producers: Vec<P>) -> Service {
    let deadline = pass.t0 + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for (run, mut http) in pass.runs.clone().into_iter().zip(producers) {
        let key = pass.key.clone();
        let (ok, failed) = (pass.ok.clone(), pass.failed.clone());
        tasks.push(tokio::spawn(async move {
            let path = format!("/v1/runs/{run}/events");
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = json!([delta(n)]);
                let r = http.post(&path, &key, body.to_string().into()).await;
                let counter = if r.as_ref().is_ok_and(|r| r.status == 201) { &ok } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
                if r.is_err() && !http.recover().await {
                    break;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let secs = pass.t0.elapsed().as_secs_f64();
    pass.finish(secs, 0).await
}

/// The ceiling of any single-event append over HTTP here: as many connections as producers
/// asking `GET /healthz` (no body, no authentication, no database) of the same server
/// as fast as answers come. An append cannot be answered faster than a request that
/// does nothing, so it sets what the 2× target can be held against on this machine.
async fn service_ceiling(bin: &Path, url: &str, schema: &str, lanes: usize) -> Service {
    let mut pass = Pass::start(bin, url, schema, "ceiling", lanes).await;
    let deadline = pass.t0 + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for _ in 0..producers() {
        let base = pass.server.base.clone();
        let (ok, failed) = (pass.ok.clone(), pass.failed.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut http) = Conn::open(&base).await else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            while Instant::now() < deadline {
                let r = http.get("/healthz", None).await;
                let counter = if r.is_ok_and(|r| r.status == 200) { &ok } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let secs = pass.t0.elapsed().as_secs_f64();
    // Nothing is stored to check: a `GET /healthz` pass is only measured.
    pass.measure(secs).await
}

/// Events a streaming producer may have written and not yet seen acknowledged: a token
/// producer writes without waiting; the window only keeps the measurement to what the
/// service commits rather than what it buffers.
const WINDOW: usize = 64;

/// The producers, each with one streaming append (`POST /v1/runs/{id}/events/stream`)
/// writing single text deltas as lines, up to [`WINDOW`] unacknowledged, against a
/// separate server with `lanes` group-commit lanes. The rate counts acknowledged events;
/// the rows stored are checked against them in SQL.
async fn service_streams(bin: &Path, url: &str, schema: &str, lanes: usize) -> Service {
    let pass = Pass::start(bin, url, schema, "stream", lanes).await;
    let deadline = pass.t0 + Duration::from_secs(SECS);
    let mut tasks = vec![];
    for run in pass.runs.clone() {
        let (base, key) = (pass.server.base.clone(), pass.key.clone());
        let (ok, failed) = (pass.ok.clone(), pass.failed.clone());
        tasks.push(tokio::spawn(async move {
            use futures::SinkExt;
            let Ok(stream) = AppendStream::open(&base, &run, &key).await else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let (mut lines, mut acks) = stream.split();
            let window = Arc::new(tokio::sync::Semaphore::new(WINDOW));
            let writer = {
                let window = window.clone();
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let Ok(permit) = window.acquire().await else { break };
                        permit.forget();
                        n += 1;
                        let line = delta(n);
                        if lines.send(super::http::frame(line.to_string().as_bytes())).await.is_err() {
                            break;
                        }
                    }
                    // Dropping `lines` ends the body: the answer ends with `done`.
                })
            };
            let mut ended = false;
            while let Ok(Some(a)) = acks.next().await {
                if let Some(n) = a["count"].as_u64() {
                    if Instant::now() <= deadline {
                        ok.fetch_add(n, Ordering::Relaxed);
                    } else {
                        // Committed after the window: counted as stored, not in the rate.
                        late_acks(n);
                    }
                    window.add_permits(n as usize);
                } else {
                    ended = a.get("done").is_some();
                    if !ended {
                        eprintln!("streaming append ended with {a}");
                    }
                    break;
                }
            }
            if !ended {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            let _ = writer.await;
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    pass.finish(SECS as f64, LATE.swap(0, Ordering::Relaxed)).await
}

/// Events acknowledged after the measuring window (stored, not counted in the rate).
static LATE: AtomicU64 = AtomicU64::new(0);

fn late_acks(n: u64) {
    LATE.fetch_add(n, Ordering::Relaxed);
}

/// Runs the scenario in `schema` against `bin serve` and prints its table.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let (raw16, raw_cores) = raw_inserts(url, schema, 16).await;
    let (raw64, _) = raw_inserts(url, schema, 64).await;
    let n = producers();
    let (grouped_raw, grouped_raw_cores) = raw_groups(url, schema, n).await;
    let (shaped, shaped_cores) = service_shaped_groups(url, schema, n).await;
    let lanes = std::env::var("INGEST_LANES").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let grouped = service_appends(bin, url, schema, lanes).await;
    let h2_conns = std::env::var("INGEST_H2_CONNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let h2 = service_appends_h2(bin, url, schema, lanes, h2_conns).await;
    let alone = service_appends(bin, url, schema, 0).await;
    let streamed = service_streams(bin, url, schema, lanes).await;
    let ceiling = service_ceiling(bin, url, schema, lanes).await;
    println!("| ingest-single ({SECS} s each) | rows/s | vs raw, 16 clients | server CPU (cores) | failed |");
    println!("|---|---|---|---|---|");
    println!("| raw single-row autocommit INSERT, 16 clients (baseline) | {raw16:.0} | 1.00 | - | - |");
    println!("| raw single-row autocommit INSERT, 64 clients | {raw64:.0} | {:.2} | - | - |", raw64 / raw16);
    println!(
        "| raw transactions of {n} single-row appends (one client, one transaction at a time) | {grouped_raw:.0} | {:.2} | - | - |",
        grouped_raw / raw16
    );
    println!(
        "| the same transactions in the service's form (its role and policy, the tenant's `SET LOCAL`, the claiming INSERT) | {shaped:.0} | {:.2} | - | - |",
        shaped / raw16
    );
    let name = format!("group commit ({lanes} lanes)");
    for (name, s) in [(name.as_str(), &grouped), ("one commit per append", &alone)] {
        println!(
            "| HTTP append, {n} producers, {name} | {:.0} | {:.2} | {:.2} | {} |",
            s.rate,
            s.rate / raw16,
            s.cores.server,
            s.failed
        );
    }
    println!(
        "| HTTP/2 append, {n} producers over {h2_conns} shared connection(s), group commit ({lanes} lanes) | {:.0} | {:.2} | {:.2} | {} |",
        h2.rate,
        h2.rate / raw16,
        h2.cores.server,
        h2.failed
    );
    println!(
        "| ceiling: `GET /healthz`, {n} clients, nothing done (no append can be faster) | {:.0} | {:.2} | {:.2} | {} |",
        ceiling.rate,
        ceiling.rate / raw16,
        ceiling.cores.server,
        ceiling.failed
    );
    println!(
        "| streaming append (`/events/stream`), {n} producers, {WINDOW} unacknowledged each, {lanes} lanes | {:.0} | {:.2} | {:.2} | {} |",
        streamed.rate,
        streamed.rate / raw16,
        streamed.cores.server,
        streamed.failed
    );
    println!(
        "streaming: {} events in {} transactions ({:.1} per commit)",
        streamed.appends,
        streamed.groups,
        streamed.appends as f64 / streamed.groups.max(1) as f64
    );
    // The target is read at the 64 producers; another count is a different pass.
    let verdict = match (n, grouped.rate >= 2.0 * raw16) {
        (64, true) => "target >= 2x raw: met",
        (64, false) => "target >= 2x raw: not met",
        _ => "the target (>= 2x raw) is read at 64 producers",
    };
    println!(
        "group commit, {n} producers: {} appends in {} transactions ({:.1} per commit), {:.2}x raw; {verdict}",
        grouped.appends,
        grouped.groups,
        grouped.appends as f64 / grouped.groups.max(1) as f64,
        grouped.rate / raw16
    );
    let (pg2, load2, service2) = h2.cores.per_item_us(h2.rate);
    println!(
        "HTTP/2: {} appends in {} transactions ({:.1} per commit), {:.2}x raw; CPU per append, µs: PostgreSQL {pg2:.1}, service {service2:.1}, producers {load2:.1}, {:.1} in all",
        h2.appends,
        h2.groups,
        h2.appends as f64 / h2.groups.max(1) as f64,
        h2.rate / raw16,
        pg2 + service2 + load2
    );
    println!(
        "HTTP appends reach {:.2} of the ceiling; the ceiling itself is {:.2}x raw",
        grouped.rate / ceiling.rate,
        ceiling.rate / raw16
    );
    // What the 2x target asks of the machine: all of its CPU, producers included,
    // shared out over twice the baseline's rows.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (raw_pg, raw_load, _) = raw_cores.per_item_us(raw16);
    let (pg, load, service) = grouped.cores.per_item_us(grouped.rate);
    let budget = cores as f64 * 1e6 / (2.0 * raw16);
    println!(
        "CPU per row, µs: raw (16 clients): PostgreSQL {raw_pg:.1}, clients {raw_load:.1}; group commit: PostgreSQL {pg:.1}, service {service:.1}, producers {load:.1}, {:.1} in all; 2x raw leaves {budget:.1} in all on this machine's {cores} cores",
        pg + service + load,
    );
    // A lower bound on what any single append over HTTP costs here: a request that does
    // nothing (the ceiling's server and clients) plus the database's cost per row in a
    // transaction of as many single-row appends as there are producers, the largest
    // group they can form. Over the budget, no service, however lean, reaches 2x with
    // these producers sharing the machine. (Bounds before 2026-12-02 took the database's
    // cost per row at the streaming pass's groups of ~820, which closed-loop producers
    // of single appends cannot form: a commit's fixed cost, its WAL flush most of it,
    // spread over 820 rows instead of 64.)
    let (_, ceiling_load, ceiling_server) = ceiling.cores.per_item_us(ceiling.rate);
    let (streamed_pg, _, _) = streamed.cores.per_item_us(streamed.rate);
    let (group_pg, _, _) = grouped_raw_cores.per_item_us(grouped_raw);
    let (shaped_pg, _, _) = shaped_cores.per_item_us(shaped);
    let bound = ceiling_server + ceiling_load + group_pg;
    println!(
        "PostgreSQL per row, µs: {group_pg:.1} in raw transactions of {n}, {shaped_pg:.1} in the same in the service's form, {streamed_pg:.1} in the streaming pass's groups, {pg:.1} in the service's single-append groups"
    );
    println!(
        "least CPU per single HTTP append in all, µs: a `GET /healthz` (server {ceiling_server:.1}, clients {ceiling_load:.1}) + PostgreSQL per row in transactions of {n} ({group_pg:.1}) = {bound:.1}, {:.2}x the {budget:.1} that 2x raw leaves{}",
        bound / budget,
        if bound > budget { ": 2x raw is out of reach for any service on this machine in this run" } else { "" }
    );
}
