//! `many-runs`: many concurrent runs, each with a token-by-token producer and one SSE
//! subscriber (issue "Token-by-token producers at full speed").
//!
//! `MANY_RUNS` runs (default 1,000), each with a producer appending a single
//! `text.delta` every 50 ms (20 deltas/s per run, 20,000 events/s in all at the
//! default, each producer at a random phase: [`phase`]) for `MANY_SECS` seconds
//! (default 10), and one SSE subscriber per run
//! (`detail=full`, so every event is a frame and its receipt can be timed). Reported:
//! the appends achieved against those offered (each producer's answered appends over
//! its own span, summed), append sent → receipt p50/p99 (receipt timed at the socket
//! read), events received against appended, the cores used by the server, by every
//! `postgres` process and by this tool (they share the machine), the server's RSS, the
//! service's transactions a second and events in each, the server threads' time spent
//! runnable but waiting for a core per second they ran (`support::runqueue_wait_secs`:
//! what the other processes on the two cores cost the server; the floor's row has its
//! own), live-delivery
//! SELECTs per second and per append (at most one read per run wake-up is the target),
//! the receipt p50/p99 of the appends sent once the pass has settled ([`SETTLING`]
//! after its first), and the receipt p99 of each second's appends, by when they were
//! sent (where in the pass the tail is). The baselines, in the same run: bare NOTIFY →
//! LISTEN latency between two connections, and the same producers and readers against
//! the [`floor`](super::floor), a server that only forwards each line to its run's
//! subscriber (what this machine and this tool allow at all). The scenario runs twice:
//! producers sending single appends (`POST /v1/runs/{id}/events`, one request each),
//! then producers writing each delta as a line of one long-lived streaming append
//! (`POST /v1/runs/{id}/events/stream`); `MANY_MODE=single` or `MANY_MODE=streaming`
//! runs one of them; `MANY_LANES=n` gives the server `n` group-commit lanes (default 2,
//! the server's own); `MANY_PASSES=n` measures n pairs of passes and prints the spread
//! of their p99s (min, median, max, and how many are within the target);
//! `MANY_PHASE=open` has each producer tick from its open instead of at a random phase.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::http::Conn;
use super::support::{self, AckLine, BareAppend, BareConn, SseReader};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};

/// Time between two appends of one producer (20 a second).
const EVERY: Duration = Duration::from_millis(50);

/// How long after its first append a pass counts as settled: every run's streaming
/// append has opened (each reads its run) and its first group has committed. The
/// target is read over the whole pass; the settled figure says how much of the
/// distance is the start, when the runs all begin within the same second.
const SETTLING: Duration = Duration::from_secs(2);

/// When a producer's first tick is due: at a random point of the first [`EVERY`] after
/// now. Token producers are independent of each other; ticking from the moment a
/// producer's connection opened would line up every producer whose open was answered in
/// the same instant, and a thousand opens are answered in a few bursts: their ticks then
/// fall together every 50 ms, a burst no real fleet sends. The floor's p99 went from
/// 5.7-15.7 ms to 0.8-1.2 ms with random phases (docs/benchmarks-log.md, 2026-11-30
/// 02:03), so most of that was the tool's own bursts. `MANY_PHASE=open` ticks from the open,
/// as before.
fn phase() -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    if std::env::var("MANY_PHASE").is_ok_and(|v| v == "open") {
        return now;
    }
    now + Duration::from_micros(rand::random::<u64>() % EVERY.as_micros() as u64)
}

/// How long a producer was appending: from its first tick to its last append, plus the
/// interval that append stood for. Producers start one after another while 1,000
/// connections open, so the pass's wall time is longer than any producer's; rates are
/// taken over each producer's own span (the wall time made an on-time pass of 1,000
/// runs look like 0.87 of the offered rate).
fn span(first: Option<Instant>, last: Option<Instant>) -> Duration {
    match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f) + EVERY,
        _ => Duration::ZERO,
    }
}

/// What one producer did: appends answered, over how long ([`span`]), and what each
/// took. Each producer keeps its own, merged once the pass is over: a map shared by
/// 1,000 producers was a lock taken 20,000 times a second by the tool being measured.
#[derive(Default)]
struct Produced {
    appends: u64,
    span: Duration,
    /// (seq, when its append was sent, µs from the pass's `t0`) of each answered append.
    sent: Vec<(i64, u64)>,
    /// Append sent → its answer (201, or the acknowledgement line), in ms: how long the
    /// commit took as the producer saw it, apart from the delivery to the subscriber.
    committed: Vec<f64>,
}

impl Produced {
    /// Appends answered per second of the producer's span (0 for one that never sent).
    fn rate(&self) -> f64 {
        if self.span.is_zero() {
            0.0
        } else {
            self.appends as f64 / self.span.as_secs_f64()
        }
    }
}

/// One streaming producer: one long-lived `POST /v1/runs/{id}/events/stream` on a bare
/// connection ([`BareAppend`]), a line every 50 ms for `secs`, written and its
/// acknowledgements read by this one task; each acknowledged line's seq is recorded with
/// the time it was written.
async fn stream_producer(addr: String, key: String, run: String, secs: u64, t0: Instant) -> Produced {
    let Ok(mut stream) = BareAppend::open(&addr, &run, &key).await else { return Produced::default() };
    // When line k + 1 was written (µs from `t0`).
    let mut written: Vec<u64> = Vec::with_capacity(secs as usize * 20 + 1);
    let mut tick = tokio::time::interval_at(phase(), EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut first, mut last, mut writing) = (None, None, true);
    let (mut out, mut acks, mut line) = (Produced::default(), Vec::new(), String::new());
    loop {
        tokio::select! {
            _ = tick.tick(), if writing => {
                if Instant::now() >= deadline {
                    writing = false;
                    if stream.finish().await.is_err() {
                        break;
                    }
                    continue;
                }
                line.clear();
                let n = written.len() + 1;
                let _ = write!(line, r#"{{"type":"text.delta","payload":{{"text":"token {n} "}}}}"#);
                written.push(t0.elapsed().as_micros() as u64);
                if stream.write_line(line.as_bytes()).await.is_err() {
                    break;
                }
                first = first.or(Some(Instant::now()));
                last = Some(Instant::now());
            }
            r = stream.read_acks(&mut acks) => {
                let mut open = r.unwrap_or(false);
                let now = t0.elapsed().as_micros() as u64;
                for a in acks.drain(..) {
                    match a {
                        // The stream has no blank lines, so line k of a group has seq first_seq + k.
                        AckLine::Committed { first_seq, first_line, count } => {
                            for k in 0..count {
                                let Some(at) = (first_line + k).checked_sub(1).and_then(|i| written.get(i as usize)) else {
                                    continue;
                                };
                                out.sent.push((first_seq + k as i64, *at));
                                out.committed.push(now.saturating_sub(*at) as f64 / 1000.0);
                            }
                            out.appends += count;
                        }
                        AckLine::Done => open = false,
                        AckLine::Other(l) => {
                            eprintln!("run {run}: the streaming append ended with {l}");
                            open = false;
                        }
                    }
                }
                if !open {
                    break;
                }
            }
        }
    }
    out.span = span(first, last);
    out
}

/// Runs the scenario against `schema` of `url`, measuring `bin serve`: with single
/// appends, then with streaming appends (`MANY_MODE=single` or `streaming` for one).
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let mode = std::env::var("MANY_MODE").unwrap_or_default();
    if mode != "streaming" {
        run_mode(bin, url, schema, false).await;
    }
    if mode != "single" {
        run_mode(bin, url, schema, true).await;
    }
}

/// One pass: single appends (`streaming` false) or one streaming append per run.
async fn run_mode(bin: &Path, url: &str, schema: &str, streaming: bool) {
    support::raise_open_files();
    let runs: usize = std::env::var("MANY_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000);
    let secs: u64 = std::env::var("MANY_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let name = if streaming { "many-streaming" } else { "many" };
    let key =
        tenants::create_tenant(&mut owner, name, &[Scope::Read, Scope::Write]).await.expect("tenant").secret;
    let mut bare = support::bare_notify(url, 300, Duration::from_millis(5)).await;
    println!(
        "baseline, bare NOTIFY → LISTEN (300 notifications): p50 {:.2} ms, p99 {:.2} ms",
        support::pct(&mut bare, 0.5),
        support::pct(&mut bare, 0.99)
    );
    // `MANY_LANES=n`: group-commit lanes of the server (default: its own default, 2).
    let lanes = std::env::var("MANY_LANES").unwrap_or_else(|_| "2".to_owned());
    let args = ["--append-rate", "0", "--retention-interval", "0", "--group-commit-lanes", &lanes];
    let how = if streaming {
        "writing one text.delta line to its streaming append"
    } else {
        "appending one text.delta"
    };
    println!(
        "{runs} runs, each a producer {how} every 50 ms for {secs} s and one SSE subscriber (`detail=full`); {lanes} group-commit lanes"
    );
    // `MANY_PASSES=n`: n pairs of passes (the service's, then the floor's), and the
    // spread of their p99s: on a shared machine one pass's p99 moves by half between
    // consecutive passes of the same binary, so a target is read over several.
    let passes: usize = std::env::var("MANY_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let mut p99s = Vec::with_capacity(passes);
    for _ in 0..passes {
        p99s.push(pair(&Setup { bin, url, schema, args: &args, key: &key, runs, secs, streaming }).await);
        // Each pass starts from empty tables, as one pass per invocation does: a log
        // grown by the passes before is another scenario (passes got slower as it grew).
        owner.batch_execute("TRUNCATE agent_run_events, runs").await.expect("truncate");
    }
    if passes > 1 {
        let (mut ours, mut floors): (Vec<f64>, Vec<f64>) = p99s.into_iter().unzip();
        let within = ours.iter().filter(|p| **p <= TARGET_MS).count();
        let spread = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
            format!("{:.1} / {median:.1} / {:.1}", v[0], v[n - 1])
        };
        println!(
            "whole-pass receipt p99 over {passes} passes, min / median / max (ms): agent-stream {}, within {TARGET_MS} ms in {within} of {passes}; the floor {}",
            spread(&mut ours),
            spread(&mut floors)
        );
    }
}

/// The target for a whole pass's append → receipt p99, in ms (issue 22).
const TARGET_MS: f64 = 25.0;

/// What every pass of a run of the scenario shares.
struct Setup<'a> {
    bin: &'a Path,
    url: &'a str,
    schema: &'a str,
    /// The server's arguments.
    args: &'a [&'a str],
    key: &'a str,
    runs: usize,
    secs: u64,
    streaming: bool,
}

/// One pass against the service and one against the floor, printed; their whole-pass
/// receipt p99s (ms).
async fn pair(setup: &Setup<'_>) -> (f64, f64) {
    let Setup { bin, url, schema, args, key, runs, secs, streaming } = *setup;
    let server = support::serve(bin, url, schema, args).await;
    let service = pass(&server, key, runs, secs, streaming, false).await;
    drop(server);
    // The floor, in the same run: the same producers and readers against a server that
    // only forwards each line (`floor`), so the machine's own share of the latency shows.
    let mut floor = support::floor().await;
    let bottom = pass(&floor, key, runs, secs, streaming, true).await;
    let _ = floor.child.kill().await;
    println!("| server | appends/s achieved (offered) | ratio to offered | append sent → acknowledged (committed) p50 / p99 (ms) | append sent → receipt p50 / p99 (ms) | received / appended | server CPU | PostgreSQL CPU | load tool CPU | server RSS | live reads/s | live reads per append | server's wait for a core per second run |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!("{}", service.row("agent-stream"));
    println!("{}", bottom.row("floor (no service, see `floor`)"));
    if let Some((per_s, events)) = service.commits {
        println!("agent-stream: {per_s:.0} transactions/s, {events:.1} events each");
    }
    println!(
        "receipt p99: {:.2}× the floor's ({:.2} against {:.2} ms); target p99 ≤ {TARGET_MS} ms",
        service.receipt.1 / bottom.receipt.1.max(f64::MIN_POSITIVE),
        service.receipt.1,
        bottom.receipt.1
    );
    println!(
        "settled (appends sent {} s or more after the first): receipt p50 / p99 {:.2} / {:.2} ms, the floor's {:.2} / {:.2} ms",
        SETTLING.as_secs(),
        service.settled.0,
        service.settled.1,
        bottom.settled.0,
        bottom.settled.1
    );
    for (name, p) in [("agent-stream", &service), ("floor", &bottom)] {
        let seconds: Vec<String> = p.by_second.iter().map(|ms| format!("{ms:.1}")).collect();
        println!(
            "receipt p99 by second of sending from {}, {name} (ms): {}",
            p.began.format("%H:%M:%S%.3f UTC"),
            seconds.join(" ")
        );
    }
    (service.receipt.1, bottom.receipt.1)
}

/// One measured pass's figures.
struct Pass {
    offered: f64,
    achieved: f64,
    /// Append sent → acknowledged, p50 and p99 (ms).
    committed: (f64, f64),
    /// Append sent → receipt, p50 and p99 (ms).
    receipt: (f64, f64),
    /// The same for the appends sent [`SETTLING`] or more after the pass's first.
    settled: (f64, f64),
    /// Receipt p99 (ms) of the appends sent in each second of the pass, from its first.
    by_second: Vec<f64>,
    /// When the producers started, so a slow second can be matched with the database's log.
    began: chrono::DateTime<chrono::Utc>,
    received: usize,
    appended: u64,
    /// Cores used by the server, every `postgres` process, and this load tool, over the
    /// same window: the machine has two, and a queue forms when the three fill them.
    cores: support::Cores,
    rss_mib: f64,
    /// Live reads per second and per append; `None` for the floor, which reads nothing.
    reads: Option<(f64, f64)>,
    /// Transactions committed per second, and events per transaction; `None` for the floor.
    commits: Option<(f64, f64)>,
}

impl Pass {
    fn row(&self, server: &str) -> String {
        let reads = match self.reads {
            Some((per_s, per_append)) => format!("{per_s:.0} | {per_append:.2}"),
            None => "- | -".to_owned(),
        };
        format!(
            "| {server} | {:.0} ({:.0}) | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {} / {} | {:.0}% | {:.0}% | {:.0}% | {:.0} MiB | {reads} | {:.2} |",
            self.achieved,
            self.offered,
            self.achieved / self.offered,
            self.committed.0,
            self.committed.1,
            self.receipt.0,
            self.receipt.1,
            self.received,
            self.appended,
            100.0 * self.cores.server,
            100.0 * self.cores.postgres,
            100.0 * self.cores.load,
            self.rss_mib,
            self.cores.server_waiting / self.cores.server.max(f64::MIN_POSITIVE),
        )
    }
}

/// Makes `runs` runs on `server`, each with its subscriber and its producer, for `secs`,
/// and measures them. `floor`: the server is the [`floor`](super::floor), which has no
/// metrics to read.
async fn pass(
    server: &support::Server,
    key: &str,
    runs: usize,
    secs: u64,
    streaming: bool,
    floor: bool,
) -> Pass {
    let key = key.to_owned();
    let addr = server.base.trim_start_matches("http://").to_owned();
    // The runs, running, each with its subscriber.
    let mut http = Conn::open(&server.base).await.expect("connect");
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        let run = support::create_run(&mut http, &key).await;
        let start = json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]);
        let r = http
            .post(&format!("/v1/runs/{run}/events"), &key, start.to_string().into())
            .await
            .expect("append");
        assert_eq!(r.status, 201, "{}", r.text());
        ids.push(run);
    }
    let t0 = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = Vec::with_capacity(runs);
    for run in &ids {
        let path = format!("/v1/runs/{run}/stream?detail=full&after_seq=1");
        let mut r = SseReader::open(&addr, &path, &key).await.expect("subscribe");
        let mut stopped = stopped.clone();
        readers.push(tokio::spawn(async move {
            let (mut got, mut seqs) = (Vec::new(), Vec::new());
            loop {
                seqs.clear();
                let open = tokio::select! {
                    r = r.read_ids(&mut seqs) => r.unwrap_or(false),
                    _ = stopped.wait_for(|s| *s) => break,
                };
                let at = t0.elapsed().as_micros() as u64;
                got.extend(seqs.iter().map(|s| (*s, at)));
                if !open {
                    break;
                }
            }
            got
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut watch = Conn::open(&server.base).await.expect("connect");
    let reads0 = support::scrape(&mut watch, "agent_stream_live_reads_total").await;
    let commits0 = support::scrape(&mut watch, "agent_stream_commit_groups_total").await;
    let (meter, wall0) = (support::CpuMeter::start(Some(server.pid)), Instant::now());
    let began = chrono::Utc::now();
    // The producers: one connection each, an append every 50 ms for `secs`.
    let mut producers = Vec::with_capacity(runs);
    for run in &ids {
        if streaming {
            producers.push(tokio::spawn(stream_producer(addr.clone(), key.clone(), run.clone(), secs, t0)));
            continue;
        }
        let (base, key, run) = (server.base.clone(), key.clone(), run.clone());
        producers.push(tokio::spawn(async move {
            let mut out = Produced::default();
            // Opened before the first tick, so no append's time holds a connect.
            let mut http = BareConn::new(&base);
            if !http.reopen().await {
                return out;
            }
            let path = format!("/v1/runs/{run}/events");
            let mut tick = tokio::time::interval_at(phase(), EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (deadline, mut n) = (Instant::now() + Duration::from_secs(secs), 0u64);
            let (mut first, mut last) = (None, None);
            while Instant::now() < deadline {
                tick.tick().await;
                first = first.or(Some(Instant::now()));
                last = Some(Instant::now());
                let body = json!([{"type": "text.delta", "payload": {"text": format!("token {n} ")}}]);
                let at = t0.elapsed().as_micros() as u64;
                match http.post(&path, &key, body.to_string().as_bytes()).await {
                    Ok(r) if r.status == 201 => {
                        let ms = (t0.elapsed().as_micros() as u64).saturating_sub(at) as f64 / 1000.0;
                        out.committed.push(ms);
                        if let Some(seq) = r.json()["last_seq"].as_i64() {
                            out.sent.push((seq, at));
                        }
                        n += 1;
                    }
                    _ => break,
                }
            }
            out.appends = n;
            out.span = span(first, last);
            out
        }));
    }
    let (mut appended, mut achieved) = (0u64, 0.0);
    // Per run, in `ids`' order: seq -> when its append was sent.
    let (mut sent, mut committed) = (Vec::with_capacity(runs), Vec::new());
    for p in producers {
        let p = p.await.unwrap_or_default();
        appended += p.appends;
        achieved += p.rate();
        sent.push(p.sent.into_iter().collect::<HashMap<i64, u64>>());
        committed.extend(p.committed);
    }
    // The backlog gets up to 10 s.
    let drain = Instant::now() + Duration::from_secs(10);
    while Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if readers.iter().all(|r| r.is_finished()) {
            break;
        }
        let reads_now = support::scrape(&mut watch, "agent_stream_live_reads_total").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if support::scrape(&mut watch, "agent_stream_live_reads_total").await == reads_now {
            break;
        }
    }
    let (cores, wall) = (meter.cores(), wall0.elapsed().as_secs_f64());
    let reads = support::scrape(&mut watch, "agent_stream_live_reads_total").await - reads0;
    let commits = support::scrape(&mut watch, "agent_stream_commit_groups_total").await - commits0;
    let rss = support::status_kib(server.pid, "VmRSS:");
    let _ = stop.send(true);
    // (sent at, receipt latency in ms) of every append received.
    let mut timed: Vec<(u64, f64)> = vec![];
    for (i, r) in readers.into_iter().enumerate() {
        for (seq, at) in r.await.unwrap_or_default() {
            if let Some(s) = sent.get(i).and_then(|run| run.get(&seq)) {
                timed.push((*s, at.saturating_sub(*s) as f64 / 1000.0));
            }
        }
    }
    let received = timed.len();
    let mut lat: Vec<f64> = timed.iter().map(|(_, ms)| *ms).collect();
    let first_sent = timed.iter().map(|(at, _)| *at).min().unwrap_or(0);
    let mut settled: Vec<f64> = timed
        .iter()
        .filter(|(at, _)| *at >= first_sent + SETTLING.as_micros() as u64)
        .map(|(_, ms)| *ms)
        .collect();
    let mut by_second: Vec<Vec<f64>> = vec![];
    for (at, ms) in &timed {
        let s = ((at - first_sent) / 1_000_000) as usize;
        if by_second.len() <= s {
            by_second.resize_with(s + 1, Vec::new);
        }
        by_second[s].push(*ms);
    }
    Pass {
        by_second: by_second.iter_mut().map(|l| support::pct(l, 0.99)).collect(),
        began,
        offered: runs as f64 * (1000.0 / EVERY.as_millis() as f64),
        achieved,
        committed: (support::pct(&mut committed, 0.5), support::pct(&mut committed, 0.99)),
        receipt: (support::pct(&mut lat, 0.5), support::pct(&mut lat, 0.99)),
        settled: (support::pct(&mut settled, 0.5), support::pct(&mut settled, 0.99)),
        received,
        appended,
        cores,
        rss_mib: rss as f64 / 1024.0,
        reads: (!floor).then(|| (reads / wall, reads / appended.max(1) as f64)),
        commits: (!floor).then(|| (commits / wall, appended as f64 / commits.max(1.0))),
    }
}
