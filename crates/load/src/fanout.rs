//! `fanout`: 1, 100, 1,000 and 10,000 subscribers of one run, over SSE, over GraphQL
//! `runEvents` on `graphql-transport-ws`, and over seed 004's WebSocket profile
//! (`koder-agent-stream-v1`), against a separate `agent-stream serve`
//! process (the release binary; a fresh one per transport). Per cell: the server's
//! resident memory per subscriber once all are delivering; then a producer offers
//! 1,000 control events a second (10 per append every 10 ms; control events are never
//! shed or merged) for a window of 3 s (1 s at 10,000; each append waits for its answer,
//! so a saturated server gets fewer, and the table gives the rate reached), and the
//! backlog gets up to 20 s to drain:
//! append sent → receipt latency (receipt timed at the socket read, the seq read off
//! the frame without parsing it) and what it is made of (per event: append sent → its
//! first receipt, and first → last receipt, the sweep over the subscribers), events
//! received against expected, the server's CPU,
//! and live-delivery SELECTs per append (from `/metrics`; the producer starts once the
//! subscribers' joining reads, reported per subscriber, have stopped). The baselines, in the same
//! run: bare NOTIFY → LISTEN latency between two connections; and, for SSE up to 1,000
//! subscribers, the same producer and readers against the [`floor`](super::floor), a
//! server that only writes each append's frames to every socket: the latency no server
//! can beat on this machine, with these readers sharing its cores.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};
use serde_json::{json, Value};

use super::http::Conn;
use super::support::{self, SseReader};

/// The server's count of live-delivery SELECTs.
const READS: &str = "agent_stream_live_reads_total";
/// The server's own delivery latency: an event's `ts` to its hand-over to a subscriber's
/// transport (before the socket write), in doubling buckets.
const DELIVERY: &str = "agent_stream_delivery_latency_seconds";

/// How subscribers connect.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    /// `GET /v1/runs/{id}/stream?detail=full`, read by [`SseReader`].
    Sse,
    /// GraphQL `runEvents` over `graphql-transport-ws`.
    Ws,
    /// Seed 004's WebSocket profile, `koder-agent-stream-v1` on
    /// `/v1/agent/runs/{id}/stream?detail=full`.
    Native,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Sse => "SSE",
            Transport::Ws => "WebSocket",
            Transport::Native => "WebSocket profile",
        }
    }
}

/// Receipts one subscriber recorded: (seq, µs since `t0`).
type Receipts = Vec<(i64, u64)>;

/// Opens `n` subscriptions of `run` from seq 0. Returns once each has received seq 1
/// (so the server is delivering to all of them); each task then records every seq it
/// gets, bumps `count`, and ends at `stop`.
async fn subscribe(
    how: Transport,
    base: &str,
    key: &str,
    run: &str,
    n: usize,
    t0: Instant,
    count: Arc<AtomicU64>,
) -> (Vec<tokio::task::JoinHandle<Receipts>>, tokio::sync::watch::Sender<bool>) {
    // A watch, not a Notify: a task busy reading when the stop comes still sees it.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let addr = base.trim_start_matches("http://").to_owned();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (addr, key, run, mut stop, ready, count) =
            (addr.clone(), key.to_owned(), run.to_owned(), stopped.clone(), ready.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = vec![];
            let mut sub = match Sub::open(how, &addr, &key, &run).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("subscriber failed: {e}");
                    ready.add_permits(1);
                    return got;
                }
            };
            let mut ids = vec![];
            let mut first = true;
            loop {
                ids.clear();
                let open = tokio::select! {
                    r = sub.read(&mut ids) => r,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let now = t0.elapsed().as_micros() as u64;
                if first && ids.contains(&1) {
                    first = false;
                    ready.add_permits(1);
                }
                count.fetch_add(ids.len() as u64, Ordering::Relaxed);
                got.extend(ids.iter().map(|seq| (*seq, now)));
                if !open {
                    break;
                }
            }
            if first {
                ready.add_permits(1);
            }
            got
        }));
    }
    let _ = ready.acquire_many(n as u32).await.map(|p| p.forget());
    (tasks, stop)
}

/// One subscriber's connection.
enum Sub {
    Sse(SseReader),
    Ws(Box<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>>),
}

impl Sub {
    async fn open(how: Transport, addr: &str, key: &str, run: &str) -> Result<Sub, String> {
        use futures::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        match how {
            Transport::Sse => SseReader::open(addr, &format!("/v1/runs/{run}/stream?detail=full"), key)
                .await
                .map(Sub::Sse)
                .map_err(|e| e.to_string()),
            Transport::Ws => {
                let mut ws = support::graphql_ws(addr, key).await?;
                let sub = json!({"id": "1", "type": "subscribe", "payload": {
                    "query": "subscription($r: ID!) { runEvents(runId: $r) { seq } }",
                    "variables": {"r": run}}});
                ws.send(Message::text(sub.to_string())).await.map_err(|e| e.to_string())?;
                Ok(Sub::Ws(Box::new(ws)))
            }
            Transport::Native => Ok(Sub::Ws(Box::new(support::profile_ws(addr, key, run).await?))),
        }
    }

    /// Waits for the next read; appends the seqs it completed. False once closed.
    async fn read(&mut self, ids: &mut Vec<i64>) -> bool {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        match self {
            Sub::Sse(r) => r.read_ids(ids).await.unwrap_or(false),
            Sub::Ws(ws) => match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    // `{"id":"1","type":"next","payload":{"data":{"runEvents":{"seq":N}}}}`, or
                    // the profile's `{"seq":N,...}`: the seq is read off the text, as a
                    // client would route it.
                    if let Some(seq) = t
                        .split("\"seq\":")
                        .nth(1)
                        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                    {
                        ids.push(seq);
                    }
                    true
                }
                Some(Ok(_)) => true,
                _ => false,
            },
        }
    }
}

/// One cell of the table: `n` subscribers over `how`, a producer at 1,000 events/s
/// for `secs`, then up to [`DRAIN`] for the backlog. `floor`: `server` is the
/// [`floor`](super::floor), which reads nothing and has no metrics to read.
async fn cell(how: Transport, server: &support::Server, key: &str, n: usize, secs: u64, floor: bool) {
    let (pid, base) = (server.pid, server.base.clone());
    let mut http = Conn::open(&base).await.expect("connect");
    let mut watch = Conn::open(&base).await.expect("connect");
    let run = support::create_run(&mut http, key).await;
    let path = format!("/v1/runs/{run}/events");
    let body = json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]);
    let r = http.post(&path, key, body.to_string().into()).await.expect("append");
    assert_eq!(r.status, 201, "{}", r.text());
    let t0 = Instant::now();
    let count = Arc::new(AtomicU64::new(0));
    let rss0 = support::status_kib(pid, "VmRSS:");
    let joined0 = support::scrape(&mut watch, READS).await;
    let (tasks, stop) = subscribe(how, &base, key, &run, n, t0, count.clone()).await;
    eprintln!("{} {n}: subscribed in {:.1} s", how.name(), t0.elapsed().as_secs_f64());
    // Settle: joining costs reads per subscriber, once; appends must not, so the
    // producer starts once every subscriber made its joining read (its history, here
    // one event, which reaches the run's last seq) and reads have been still for a
    // second. Stillness alone was not enough at 10,000 WebSocket subscribers, when
    // joining took two reads: their connections were too busy to ask for the second
    // within a second.
    let mut reads0 = support::scrape(&mut watch, READS).await;
    // The floor joins without reads: nothing to wait for but a quiet second.
    let joining = if floor { 0.0 } else { joined0 + n as f64 };
    let (mut still, settle_until) = (0, Instant::now() + Duration::from_secs(60));
    while (still < 4 || reads0 < joining) && Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = support::scrape(&mut watch, READS).await;
        still = if now == reads0 { still + 1 } else { 0 };
        reads0 = now;
    }
    if reads0 < joining {
        eprintln!("{} {n}: joining reads not finished after 60 s; measuring anyway", how.name());
    }
    let join_reads = (reads0 - joined0) / n as f64;
    let rss = support::status_kib(pid, "VmRSS:");
    let per_sub = rss.saturating_sub(rss0) as f64 / n as f64;
    let label = match how {
        Transport::Sse => "transport=\"sse\"",
        Transport::Ws => "transport=\"graphql_ws\"",
        Transport::Native => "transport=\"seed_ws\"",
    };
    let delivery0 =
        support::buckets(&watch.get("/metrics", None).await.expect("metrics").text(), DELIVERY, label);
    let (cpu0, wall0) = (support::cpu_secs(pid), Instant::now());
    let mut sent: std::collections::HashMap<i64, u64> = Default::default();
    let mut appends = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    // A fixed window, not a fixed count: a saturated server slows each append down, and
    // the table reports the rate the producer reached.
    let window = Duration::from_secs(secs);
    for b in 0.. {
        tick.tick().await;
        if wall0.elapsed() >= window {
            break;
        }
        let body = Value::Array(
            (0..10).map(|i| json!({"type": "custom.tick", "payload": {"n": b * 10 + i}})).collect(),
        );
        let at = t0.elapsed().as_micros() as u64;
        let r: Value = match http.post(&path, key, body.to_string().into()).await {
            Ok(r) if r.status == 201 => r.json(),
            Ok(r) => panic!("append failed: {} {}", r.status, r.text()),
            Err(e) => panic!("append failed: {e}"),
        };
        appends += 1;
        for seq in r["first_seq"].as_i64().unwrap_or(0)..=r["last_seq"].as_i64().unwrap_or(-1) {
            sent.insert(seq, at);
        }
    }
    let produced = wall0.elapsed().as_secs_f64();
    eprintln!("{} {n}: produced for {produced:.1} s", how.name());
    // Everyone got seq 1 before the producer started.
    let expected = (sent.len() * n) as u64 + n as u64;
    let drain_until = Instant::now() + DRAIN;
    while count.load(Ordering::Relaxed) < expected && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (cpu, wall) = (support::cpu_secs(pid) - cpu0, wall0.elapsed().as_secs_f64());
    // One sample for both: the reads and the latency buckets at the same moment.
    let sample = watch.get("/metrics", None).await.expect("metrics").text();
    let (reads1, delivery1) = (support::metric(&sample, READS), support::buckets(&sample, DELIVERY, label));
    let inside = |p| support::bucket_quantile(&delivery0, &delivery1, p) * 1000.0;
    let (inside50, inside99) = (inside(0.5), inside(0.99));
    let _ = stop.send(true);
    eprintln!("{} {n}: drained after {:.1} s", how.name(), wall0.elapsed().as_secs_f64());
    let mut lat = vec![];
    // Per event, its first and last receipt over the subscribers: what the latency is
    // made of, the way to the first socket against the sweep over all of them.
    // (sent, first receipt, last receipt) by seq.
    let mut spread: std::collections::HashMap<i64, (u64, u64, u64)> = Default::default();
    for t in tasks {
        for (seq, at) in t.await.unwrap_or_default() {
            if let Some(s) = sent.get(&seq) {
                lat.push(at.saturating_sub(*s) as f64 / 1000.0);
                let e = spread.entry(seq).or_insert((*s, at, at));
                (e.1, e.2) = (e.1.min(at), e.2.max(at));
            }
        }
    }
    let (mut first, mut sweep): (Vec<f64>, Vec<f64>) = spread
        .values()
        .map(|(s, lo, hi)| (lo.saturating_sub(*s) as f64 / 1000.0, (hi - lo) as f64 / 1000.0))
        .unzip();
    eprintln!(
        "{} {n}: per event, append sent → first receipt p50 / p99 {:.2} / {:.2} ms; first → last receipt (the sweep) p50 / p99 {:.2} / {:.2} ms",
        if floor { "SSE floor" } else { how.name() },
        support::pct(&mut first, 0.5),
        support::pct(&mut first, 0.99),
        support::pct(&mut sweep, 0.5),
        support::pct(&mut sweep, 0.99),
    );
    let received = lat.len();
    let reads = reads1 - reads0;
    let (p50, p99) = (support::pct(&mut lat, 0.5), support::pct(&mut lat, 0.99));
    let max = lat.last().copied().unwrap_or(f64::NAN);
    let target = if how == Transport::Sse && n == 1_000 {
        if p99 < 10.0 {
            " (target < 10: met)"
        } else {
            " (target < 10: not met)"
        }
    } else {
        ""
    };
    let name = if floor { "SSE floor (no service, see `floor`)" } else { how.name() };
    // The floor reads nothing and keeps no buckets: those columns are not measured.
    let (inside, reads, join_reads) = if floor {
        ("-".to_owned(), "-".to_owned(), "-".to_owned())
    } else {
        (
            format!("≤ {inside50:.1} / ≤ {inside99:.1}"),
            format!("{:.2}", reads / appends as f64),
            format!("{join_reads:.2}"),
        )
    };
    println!(
        "| {name} | {n} | {:.0} | {per_sub:.1} KiB | {p50:.2} / {p99:.2}{target} / {max:.2} | {inside} | {received} / {} | {:.0}% | {:.2} µs | {reads} | {join_reads} |",
        sent.len() as f64 / produced,
        sent.len() * n,
        100.0 * cpu / wall,
        cpu * 1e6 / received.max(1) as f64,
    );
}

/// Longest wait for the backlog after the producer stops.
const DRAIN: Duration = Duration::from_secs(20);

/// Runs the scenario in `schema` and prints its table. `FANOUT_SIZES=1,100` picks the
/// subscriber counts (default 1, 100, 1000, 10000); `FANOUT_TRANSPORTS=sse,ws,native`
/// picks the transports (default all three; SSE brings its floor).
pub async fn run(bin: &Path, url: &str, schema: &str) {
    // Read first: a mistyped name stops the run before it makes a tenant or a server.
    let transports: Vec<Transport> = match std::env::var("FANOUT_TRANSPORTS") {
        Ok(v) => v
            .split(',')
            .map(|t| match t.trim() {
                "sse" => Transport::Sse,
                "ws" => Transport::Ws,
                "native" => Transport::Native,
                other => panic!("FANOUT_TRANSPORTS: unknown transport {other:?} (known: sse, ws, native)"),
            })
            .collect(),
        Err(_) => vec![Transport::Sse, Transport::Ws, Transport::Native],
    };
    support::raise_open_files();
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, "fanout", &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let sizes: Vec<usize> = std::env::var("FANOUT_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 1_000, 10_000]);
    let mut bare = support::bare_notify(url, 300, Duration::from_millis(5)).await;
    println!(
        "baseline, bare NOTIFY → LISTEN (300 notifications): p50 {:.2} ms, p99 {:.2} ms",
        support::pct(&mut bare, 0.5),
        support::pct(&mut bare, 0.99)
    );
    println!(
        "producer: 1,000 events/s (10 `custom.tick` per append every 10 ms); 3 s, 1 s at 10,000 subscribers"
    );
    println!("| transport | subscribers | events/s the producer achieved (offered 1,000) | server RSS per subscriber (target ≤ 64 KiB for SSE) | append sent → receipt p50 / p99 / max (ms) | inside the server, event ts → handed to the socket, p50 / p99 (ms, bucket bound) | received / expected | server CPU | server CPU per delivered event | live SELECTs per append | SELECTs per subscriber to join |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for how in transports {
        // A fresh server per transport, so one's freed memory does not hide the other's.
        let mut server =
            support::serve(bin, url, schema, &["--append-rate", "0", "--retention-interval", "0"]).await;
        for &n in &sizes {
            cell(how, &server, &key, n, if n >= 10_000 { 1 } else { 3 }, false).await;
        }
        let _ = server.child.kill().await;
        if how == Transport::Sse {
            let mut floor = support::floor().await;
            for &n in sizes.iter().filter(|&&n| n <= 1_000) {
                cell(how, &floor, &key, n, 3, true).await;
            }
            let _ = floor.child.kill().await;
        }
    }
}
