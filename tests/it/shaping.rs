//! Seed 004 §4 over real sockets: R1 per run with interleaved producers in every
//! dialect, R4 for a reader with a small receive buffer that sleeps per frame, and
//! cursors beyond a run's end.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use crate::common::TestApp;

/// One SSE frame as received.
#[derive(Debug, Clone)]
struct Frame {
    id: String,
    event: Option<String>,
    data: Value,
    at: Instant,
}

/// Parses the frames in `buf`, leaving an incomplete one there.
fn frames(buf: &mut String, at: Instant) -> Vec<Frame> {
    let mut out = vec![];
    while let Some(end) = buf.find("\n\n") {
        let block: String = buf.drain(..end + 2).collect();
        let (mut id, mut event, mut data) = (String::new(), None, String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.to_owned();
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if !data.is_empty() {
            let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
            out.push(Frame { id, event, data, at });
        }
    }
    out
}

/// Reads a whole SSE response (until the server ends it), noting when each frame came.
async fn read_all(r: reqwest::Response) -> Vec<Frame> {
    let mut body = r.bytes_stream();
    let (mut buf, mut out) = (String::new(), vec![]);
    while let Some(chunk) =
        tokio::time::timeout(Duration::from_secs(30), body.next()).await.expect("a frame in 30 s")
    {
        buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
        out.extend(frames(&mut buf, Instant::now()));
    }
    out
}

/// Is this item a delta frame in its dialect?
fn is_delta(format: &str, f: &Frame) -> bool {
    let t = f.data["type"].as_str().unwrap_or_default();
    match format {
        "native" => matches!(f.event.as_deref(), Some("text.delta" | "reasoning.delta")),
        "multica" => f.data["event"]["type"] == "message_update",
        "chunks" => t == "message.chunk",
        "hier" => f.data["delta"] == true,
        "typed" => t == "thought" || t == "stream" || (t == "tool_progress" && f.data["data"].is_string()),
        "agui" => t == "TEXT_MESSAGE_CONTENT" || t == "REASONING_MESSAGE_CONTENT",
        "vercel" => t == "text-delta" || t == "reasoning-delta",
        _ => unreachable!(),
    }
}

/// The most frames in any stretch of `window` (by arrival).
fn most_in(frames: &[&Frame], window: Duration) -> usize {
    (0..frames.len())
        .map(|i| frames[i..].iter().take_while(|f| f.at.duration_since(frames[i].at) < window).count())
        .max()
        .unwrap_or(0)
}

const FORMATS: [&str; 7] = ["native", "multica", "chunks", "hier", "typed", "agui", "vercel"];

/// Seed 004 R1 per run: two messages, their reasoning, and two children streaming at
/// once, ~400 deltas a second for three seconds. Every dialect's default stream sends at
/// most 10 delta frames in any second, and a `detail=full` stream sends every event.
#[tokio::test]
async fn interleaved_producers_get_at_most_ten_delta_frames_a_second_in_every_dialect() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let setup = json!([
        {"type": "run.lifecycle", "payload": {"state": "running"}},
        {"type": "message.start", "payload": {"message_id": "m1", "role": "assistant"}},
        {"type": "message.start", "payload": {"message_id": "m2", "role": "assistant"}},
        {"type": "child.spawn", "payload": {"child_id": "k1"}},
        {"type": "run.lifecycle", "child_id": "k1", "payload": {"state": "running"}},
        {"type": "child.spawn", "payload": {"child_id": "k2"}},
        {"type": "run.lifecycle", "child_id": "k2", "payload": {"state": "running"}},
    ]);
    t.append_ok(&t.key_a, &run, setup).await;
    let mut readers = vec![];
    for format in FORMATS {
        for detail in ["", "&detail=full"] {
            let url = format!("{}/v1/runs/{run}/stream?format={format}{detail}", t.base);
            let r = t.http.get(url).bearer_auth(&t.key_a).send().await.expect("stream");
            assert_eq!(r.status(), StatusCode::OK);
            readers.push((format, !detail.is_empty(), tokio::spawn(read_all(r))));
        }
    }
    // 3 s of producers: each round one event per lane-source, every 20 ms.
    let started = Instant::now();
    let (mut deltas, mut reasoning) = (0, 0);
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let mut batch = vec![
            json!({"type": "text.delta", "payload": {"message_id": "m1", "text": format!("a{round} ")}}),
            json!({"type": "text.delta", "payload": {"message_id": "m2", "text": format!("b{round} ")}}),
            json!({"type": "text.delta", "child_id": "k1", "payload": {"text": format!("c{round} ")}}),
            json!({"type": "text.delta", "child_id": "k2", "payload": {"text": format!("d{round} ")}}),
        ];
        if round % 5 == 0 {
            batch.push(json!({"type": "reasoning.delta", "payload": {"message_id": "m1", "text": "hmm "}}));
            reasoning += 1;
        }
        deltas += batch.len();
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rate = deltas as f64 / started.elapsed().as_secs_f64();
    // Let the last window close: the end's control events would flush what is pending
    // (order first), which is allowed beyond the 10 a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, last) = t
        .append_ok(
            &t.key_a,
            &run,
            json!([
                {"type": "message.end", "payload": {"message_id": "m1"}},
                {"type": "message.end", "payload": {"message_id": "m2"}},
                {"type": "run.lifecycle", "payload": {"state": "done"}},
            ]),
        )
        .await;
    assert!(rate > 100.0, "the producers streamed {rate:.0} deltas/s: not enough to test shaping");
    for (format, full, reader) in readers {
        let got = reader.await.expect("reader");
        let delta_frames: Vec<&Frame> = got.iter().filter(|f| is_delta(format, f)).collect();
        if full {
            // Every event its own item: as many delta items as deltas (seed 001 has no
            // reasoning).
            let want = if format == "chunks" { deltas - reasoning } else { deltas };
            assert_eq!(delta_frames.len(), want, "{format} detail=full");
            continue;
        }
        // By arrival, with 100 ms of slack for the reader's own scheduling.
        let most = most_in(&delta_frames, Duration::from_millis(900));
        eprintln!(
            "{format}: {} delta frames for {deltas} deltas ({rate:.0}/s); at most {most} in a second",
            delta_frames.len()
        );
        assert!(most <= 10, "{format}: {most} delta frames within a second");
        assert!(delta_frames.len() >= 10, "{format}: deltas still flow ({} frames)", delta_frames.len());
        assert!(
            got.last().is_some_and(|f| f.id == last.to_string() || f.data == "[DONE]"),
            "{format}: ends at the run's end"
        );
    }
}

/// A raw HTTP/1.1 SSE client whose socket receive buffer is small and which sleeps
/// after every frame: a reader that cannot keep up, as the kernel sees it.
struct SlowReader {
    body: BufReader<tokio::net::TcpStream>,
    buf: String,
    sleep: Duration,
}

impl SlowReader {
    async fn open(base: &str, path: &str, key: &str, sleep: Duration) -> SlowReader {
        let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().expect("addr");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("small receive buffer");
        let mut tcp = socket.connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.expect("request");
        let mut body = BufReader::new(tcp);
        let mut line = String::new();
        loop {
            line.clear();
            body.read_line(&mut line).await.expect("head");
            if line == "\r\n" {
                break;
            }
            assert!(!line.starts_with("HTTP/1.1") || line.contains(" 200 "), "{line}");
        }
        SlowReader { body, buf: String::new(), sleep }
    }

    /// The next frames (one chunk of the chunked body), after sleeping per frame.
    async fn next(&mut self) -> Option<Vec<Frame>> {
        loop {
            let mut size = String::new();
            self.body.read_line(&mut size).await.ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                return None;
            }
            let mut chunk = vec![0; n + 2];
            self.body.read_exact(&mut chunk).await.ok()?;
            self.buf.push_str(std::str::from_utf8(&chunk[..n]).expect("utf-8"));
            let got = frames(&mut self.buf, Instant::now());
            if !got.is_empty() {
                tokio::time::sleep(self.sleep * got.len() as u32).await;
                return Some(got);
            }
        }
    }
}

/// Seed 004 R4 with a real slow reader: a 4 KiB receive buffer and 2 ms per frame
/// against ~4,000 events/s. It loses reasoning deltas first, then text deltas, never a
/// control event; it stays within the stated distance of the head; and the terminal
/// item's `dropped_count` is exactly the deltas it did not get.
#[tokio::test]
async fn a_slow_reader_loses_reasoning_then_text_and_stays_near_the_head() {
    use agent_stream::app::{Settings, Shedding};
    let shedding = Shedding { reasoning_behind: 200, text_behind: 800 };
    let t = TestApp::with_settings(Settings { shedding, ..Default::default() }).await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let path = format!("/v1/runs/{run}/stream?detail=full");
    let mut reader = SlowReader::open(&t.base, &path, &t.key_a, Duration::from_millis(2)).await;
    let head = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(1));
    let producer = {
        let (t_base, key, run, head) = (t.base.clone(), t.key_a.clone(), run.clone(), head.clone());
        let http = t.http.clone();
        tokio::spawn(async move {
            let text = "x".repeat(200);
            let (mut reasoning, mut text_deltas, mut controls) = (0i64, 0i64, 0i64);
            for b in 0..60 {
                let mut batch = vec![];
                for i in 0..40 {
                    let kind = if i % 2 == 0 { "reasoning.delta" } else { "text.delta" };
                    batch.push(
                        json!({"type": kind, "payload": {"text": text, "message_id": format!("m{b}")}}),
                    );
                }
                reasoning += 20;
                text_deltas += 20;
                batch.push(
                    json!({"type": "tool.start", "payload": {"call_id": format!("c{b}"), "tool": "t"}}),
                );
                batch.push(json!({"type": "tool.end", "payload": {"call_id": format!("c{b}"), "ok": true}}));
                batch.push(json!({"type": "message.end", "payload": {"message_id": format!("m{b}")}}));
                controls += 3;
                let r = http
                    .post(format!("{t_base}/v1/runs/{run}/events"))
                    .bearer_auth(&key)
                    .json(&batch)
                    .send()
                    .await
                    .expect("append");
                let v: Value = r.json().await.expect("json");
                head.store(v["last_seq"].as_i64().expect("seq"), std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let r = http
                .post(format!("{t_base}/v1/runs/{run}/events"))
                .bearer_auth(&key)
                .json(&json!([{"type": "run.lifecycle", "payload": {"state": "done"}}]))
                .send()
                .await
                .expect("append");
            let v: Value = r.json().await.expect("json");
            head.store(v["last_seq"].as_i64().expect("seq"), std::sync::atomic::Ordering::SeqCst);
            (reasoning, text_deltas, controls + 1)
        })
    };
    let (mut got_reasoning, mut got_text, mut got_control) = (0i64, 0i64, 0i64);
    let (mut max_behind, mut dropped) = (0i64, None);
    let mut warned = 0;
    while let Some(batch) = reader.next().await {
        for f in batch {
            if f.event.as_deref() == Some("stream.warning") {
                // Seed 004's KAI-STREAM-BUF-0001: not an event of the log.
                assert_eq!(f.data["payload"]["code"], "KAI-STREAM-BUF-0001");
                warned += 1;
                continue;
            }
            let seq = f.data["seq"].as_i64().expect("seq");
            max_behind = max_behind.max(head.load(std::sync::atomic::Ordering::SeqCst) - seq);
            match f.event.as_deref() {
                Some("reasoning.delta") => got_reasoning += 1,
                Some("text.delta") => got_text += 1,
                _ => got_control += 1,
            }
            if f.data["type"] == "run.lifecycle" && f.data["payload"]["state"] == "done" {
                dropped = f.data["payload"]["dropped_count"].as_i64();
            }
        }
    }
    let (reasoning, text, controls) = producer.await.expect("producer");
    let dropped = dropped.expect("the terminal event carries dropped_count");
    eprintln!(
        "reasoning {got_reasoning}/{reasoning}, text {got_text}/{text}, control {got_control}/{controls}, \
         dropped {dropped}, at most {max_behind} events behind"
    );
    // `running` came before the producer started: one more control event.
    assert_eq!(got_control, controls + 1, "control events are never dropped");
    assert!(dropped > 0, "the slow reader lost deltas");
    assert!(warned > 0, "told the moment it was shed (KAI-STREAM-BUF-0001)");
    assert_eq!(
        dropped,
        (reasoning - got_reasoning) + (text - got_text),
        "dropped_count is what it did not get"
    );
    assert!(
        (got_reasoning as f64 / reasoning as f64) < (got_text as f64 / text as f64),
        "reasoning goes first: kept {got_reasoning}/{reasoning} reasoning, {got_text}/{text} text"
    );
    // The bound (src/live/shed.rs): text_behind, plus a page the stream was already
    // encoding (1,000 events), plus what the socket and hyper hold (~16 KiB + 16 frames).
    let bound = shedding.text_behind + 1000 + 200;
    assert!(max_behind <= bound, "{max_behind} events behind the head, bound {bound}");
}

/// A cursor beyond the run's end is refused with a stable code on every transport,
/// never treated as "nothing yet".
#[tokio::test]
async fn a_cursor_beyond_the_end_is_refused_on_every_transport() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    for (header, query) in [(Some("5"), ""), (None, "?after_seq=5"), (Some("1:5"), ""), (Some("0.1:7"), "")] {
        let mut req = t.http.get(format!("{}/v1/runs/{run}/stream{query}", t.base)).bearer_auth(&t.key_a);
        if let Some(h) = header {
            req = req.header("Last-Event-ID", h);
        }
        let r = req.send().await.expect("send");
        assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE, "{header:?} {query}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["code"], "CURSOR-BEYOND-END");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("last event is seq 1")), "{v}");
    }
    let (status, body) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/replay?after_seq=9")).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    let (status, body) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl?from_seq=3")).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    // One past the end is "nothing yet", not an error.
    let (status, _) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl?from_seq=2")).await;
    assert_eq!(status, StatusCode::OK);
    // A malformed id is a bad parameter, not a position.
    let r = t
        .http
        .get(format!("{}/v1/runs/{run}/stream", t.base))
        .bearer_auth(&t.key_a)
        .header("Last-Event-ID", "1:1")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "PARAM-INVALID");
}
