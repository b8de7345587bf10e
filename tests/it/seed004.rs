//! Seed 004's test contract (§7, T1–T5), one test per line of the seed, against a real
//! server, over the seed's own path `/v1/agent/runs/{id}/stream` (SSE and the WebSocket
//! profile):
//!
//! | seed 004 §7 | test |
//! |---|---|
//! | T1 Round-trip: marshal → unmarshal → equal (Go + JS clients) | [`t1_round_trip_marshal_unmarshal_equal`] |
//! | T2 Ordering: client receiving events out-of-seq detects gap | [`t2_ordering_a_client_detects_a_gap`] |
//! | T3 Reconnect: send Last-Event-ID, get events ≥ seq+1 | [`t3_reconnect_with_last_event_id_gets_events_after_it`] |
//! | T4 Throughput: 1000 deltas/run aggregated to ≤10/s by default | [`t4_throughput_a_thousand_deltas_aggregated_to_ten_frames_a_second`] |
//! | T5 Multi-child: parent stream intercalates child events without corrupting ordering per child_id | [`t5_multi_child_ordering_per_child_id`] |
//!
//! T1's clients: Rust (serde_json, the service's own typed `Event`, tokio-tungstenite)
//! and JavaScript (the `ws` npm package on Node 22, tests/node/seed004_ws.mjs). There is
//! no Go toolchain in this repository's CI, so no Go client: the JSON it would parse is
//! the bytes checked here.
//!
//! T4 on tokio's paused clock, where the bound is exact rather than measured under load,
//! is `src/http/stream.rs`'s `a_thousand_deltas_in_one_second_come_out_as_at_most_ten_frames`;
//! a slow client whose gaps are exactly the `dropped_count` (T2 with R4) is
//! `live::a_client_that_cannot_keep_up_loses_reasoning_then_text_never_control_events`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::{every_type, TestApp};
use crate::seed_profile::{ws_drain, ws_open};

/// One SSE frame: its `id:`, `event:` and `data:` JSON.
#[derive(Debug, Clone)]
struct Frame {
    id: String,
    event: Option<String>,
    data: Value,
}

/// Parses whole SSE frames off `buf`, leaving a partial frame in it.
fn parse_frames(buf: &mut String) -> Vec<Frame> {
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
            out.push(Frame { id, event, data: serde_json::from_str(&data).expect("JSON data") });
        }
    }
    out
}

/// The seed's stream of a finished run, whole: status and frames.
async fn sse(t: &TestApp, run: &str, query: &str, last_event_id: Option<&str>) -> (StatusCode, Vec<Frame>) {
    let mut req = t.http.get(format!("{}/v1/agent/runs/{run}/stream{query}", t.base)).bearer_auth(&t.key_a);
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let r = req.send().await.expect("send");
    let status = r.status();
    let mut text = r.text().await.expect("body");
    (status, parse_frames(&mut text))
}

/// The stored log, through the read path (`GET /v1/runs/{id}/events`).
async fn stored(t: &TestApp, run: &str) -> Vec<Value> {
    t.events(&t.key_a, run).await
}

/// A client's gap detector (seed 004 §2: "gap = dropped event"): each frame must start
/// right after the previous one ended (`first_seq`, for a merged frame, else `seq`).
/// Returns the gaps as (expected seq, received seq).
fn gaps(frames: &[Value]) -> Vec<(i64, i64)> {
    let mut next = None;
    let mut out = vec![];
    for f in frames {
        let seq = f["seq"].as_i64().expect("seq");
        let first = f["first_seq"].as_i64().unwrap_or(seq);
        if let Some(n) = next {
            if first != n {
                out.push((n, first));
            }
        }
        next = Some(seq + 1);
    }
    out
}

/// T1 — Round-trip: marshal → unmarshal → equal. Every event type, as stored, is the
/// same JSON on every surface of the seed's path (SSE `data:`, WebSocket frames, the
/// JSONL export), survives serialise → parse unchanged, parses into the service's typed
/// `Event` and serialises back byte-for-byte; and the `ws` npm client (JavaScript) gets
/// and round-trips the same events.
#[tokio::test]
async fn t1_round_trip_marshal_unmarshal_equal() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, every_type()).await;
    let log = stored(&t, &run).await;
    assert_eq!(log.len(), every_type().as_array().map_or(0, Vec::len));
    let types: std::collections::BTreeSet<&str> = log.iter().filter_map(|e| e["type"].as_str()).collect();
    for seed_type in [
        "reasoning.delta",
        "text.delta",
        "tool.start",
        "tool.end",
        "step.boundary",
        "child.spawn",
        "plan.proposal",
        "run.lifecycle",
    ] {
        assert!(types.contains(seed_type), "the seed's {seed_type} is covered");
    }
    for e in &log {
        let text = serde_json::to_string(e).expect("marshal");
        assert_eq!(
            &serde_json::from_str::<Value>(&text).expect("unmarshal"),
            e,
            "marshal → unmarshal → equal"
        );
        let typed: agent_stream::domain::Event = serde_json::from_str(&text).expect("the typed Event");
        assert_eq!(serde_json::to_value(&typed).expect("marshal the typed Event"), *e, "typed round trip");
    }
    // The terminal event carries `dropped_count` on a stream (R4), not in the log.
    let without_count = |mut v: Value| {
        if let Some(p) = v["payload"].as_object_mut() {
            p.remove("dropped_count");
        }
        v
    };
    let (status, frames) = sse(&t, &run, "?detail=full", None).await;
    assert_eq!(status, StatusCode::OK);
    let over_sse: Vec<Value> = frames.iter().map(|f| without_count(f.data.clone())).collect();
    assert_eq!(over_sse, log, "SSE data: is the stored envelope");
    assert!(frames.iter().zip(&log).all(|(f, e)| f.event.as_deref() == e["type"].as_str()));
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[("Detail", "full")]).await.expect("handshake");
    let (over_ws, code) = ws_drain(&mut ws).await;
    assert_eq!(code, 1000);
    assert_eq!(over_ws.into_iter().map(without_count).collect::<Vec<_>>(), log, "WebSocket frames too");
    let (_, jsonl) = t.get_text(&t.key_a, &format!("/v1/runs/{run}/events.jsonl")).await;
    let lines: Vec<Value> = jsonl.lines().map(|l| serde_json::from_str(l).expect("line")).collect();
    assert_eq!(&lines[..log.len()], log.as_slice(), "JSONL replay (§5.4) too");

    // JavaScript: the `ws` npm package.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    crate::live::npm_ci(&dir);
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(crate::live::node_bin(&dir))
            .arg(dir.join("seed004_ws.mjs"))
            .args([&t.base, &t.key_a, &run])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node within 30 s")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.pop(), Some("close 1000"), "{stdout}");
    let in_js: Vec<Value> =
        lines.iter().map(|l| without_count(serde_json::from_str(l).expect("json"))).collect();
    assert_eq!(in_js, log, "what JavaScript parsed and printed is the stored log");
}

/// T2 — Ordering: a client receiving events out of seq detects the gap. Seqs are
/// gapless per run, so a client that checks each frame starts right after the last one
/// ended sees no gap: raw (`detail=full`, every event a frame: the seed's "gap = dropped
/// event") over SSE and the WebSocket, and merged frames of one lane (`first_seq` to
/// `seq`); and it does see one when a frame is missing. (Merged frames of several lanes
/// interleave their ranges, so there a gap shows per lane, and the SSE `id` /
/// `resume_id` carries the exact position: T3.)
#[tokio::test]
async fn t2_ordering_a_client_detects_a_gap() {
    let t = TestApp::new().await;
    let run_of = |reasoning: bool| {
        let mut events = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
        for i in 0..60 {
            let ty = if reasoning && i % 3 == 0 { "reasoning.delta" } else { "text.delta" };
            events.push(json!({"type": ty, "payload": {"text": format!("{i} ")}}));
            if i % 20 == 19 {
                events.push(json!({"type": "step.boundary", "payload": {"step_index": i / 20, "step_kind": "text-only"}}));
            }
        }
        events.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
        Value::Array(events)
    };
    for (reasoning, query) in [(true, "?detail=full"), (false, "?detail=full"), (false, "")] {
        let run = t.create_run(&t.key_a).await;
        let (_, last) = t.append_ok(&t.key_a, &run, run_of(reasoning)).await;
        let (_, frames) = sse(&t, &run, query, None).await;
        let data: Vec<Value> = frames.into_iter().map(|f| f.data).collect();
        assert_eq!(gaps(&data), vec![], "no gap on {query:?}");
        assert_eq!(data.last().and_then(|f| f["seq"].as_i64()), Some(last), "through the end");
        // The detector works: drop one frame from the middle.
        let mut cut = data.clone();
        let removed = cut.remove(data.len() / 2);
        let first = removed["first_seq"].as_i64().or(removed["seq"].as_i64()).expect("seq");
        assert_eq!(
            gaps(&cut),
            vec![(first, removed["seq"].as_i64().expect("seq") + 1)],
            "a missing frame is a gap"
        );
        if reasoning {
            let mut ws =
                ws_open(&t.base, &t.key_a, &run, "", &[("Detail", "full")]).await.expect("handshake");
            let (frames, _) = ws_drain(&mut ws).await;
            assert_eq!((gaps(&frames), frames.len() as i64), (vec![], last), "no gap over the WebSocket");
        }
    }
}

/// T3 — Reconnect: send Last-Event-ID, get events ≥ seq+1. From every position of a
/// finished run, over SSE and over the WebSocket; with merged frames, from every id the
/// stream sent: the text before plus the text after is the whole text, once.
#[tokio::test]
async fn t3_reconnect_with_last_event_id_gets_events_after_it() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut events = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
    for i in 0..12 {
        events.push(json!({"type": "text.delta", "payload": {"text": format!("t{i},")}}));
        events.push(json!({"type": "reasoning.delta", "payload": {"text": format!("r{i},")}}));
        if i % 4 == 3 {
            events.push(json!({"type": "tool.start", "payload": {"call_id": format!("c{i}"), "tool": "t"}}));
            events.push(json!({"type": "tool.end", "payload": {"call_id": format!("c{i}"), "ok": true}}));
        }
    }
    events.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    let (_, n) = t.append_ok(&t.key_a, &run, Value::Array(events)).await;
    for k in 0..=n {
        let id = k.to_string();
        let (status, frames) = sse(&t, &run, "?detail=full", Some(&id)).await;
        let want: Vec<i64> = (k + 1..=n).collect();
        if k == n {
            assert_eq!(status, StatusCode::NO_CONTENT, "nothing after the end of a finished run");
        } else {
            let got: Vec<i64> = frames.iter().filter_map(|f| f.data["seq"].as_i64()).collect();
            assert_eq!(got, want, "SSE after Last-Event-ID {k}");
        }
        let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[("Last-Event-ID", &id), ("Detail", "full")])
            .await
            .expect("ws");
        let (frames, code) = ws_drain(&mut ws).await;
        let got: Vec<i64> = frames.iter().filter_map(|f| f["seq"].as_i64()).collect();
        assert_eq!((got, code), (want, 1000), "WebSocket after Last-Event-ID {k}");
    }
    // Merged frames: resume from every id the default stream sent.
    let text_of = |frames: &[Frame], ty: &str| -> String {
        frames
            .iter()
            .filter(|f| f.data["type"] == ty)
            .map(|f| f.data["payload"]["text"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    let (_, whole) = sse(&t, &run, "", None).await;
    let (text, reasoning) = (text_of(&whole, "text.delta"), text_of(&whole, "reasoning.delta"));
    assert_eq!(text, (0..12).map(|i| format!("t{i},")).collect::<String>());
    for i in 0..whole.len() - 1 {
        let (_, rest) = sse(&t, &run, "", Some(&whole[i].id)).await;
        let seen = &whole[..=i];
        assert_eq!(
            text_of(seen, "text.delta") + &text_of(&rest, "text.delta"),
            text,
            "resumed at {}",
            whole[i].id
        );
        assert_eq!(text_of(seen, "reasoning.delta") + &text_of(&rest, "reasoning.delta"), reasoning);
        let tools = |f: &[Frame]| f.iter().filter(|f| f.data["type"] == "tool.start").count();
        assert_eq!(tools(seen) + tools(&rest), 3, "each control event once");
    }
}

/// T4 — Throughput: 1000 deltas of one run, committed over about a second while a client
/// follows it live, arrive aggregated (≤ 10 delta frames a second, by default), whole and
/// in order; `detail=full` gets all 1000.
#[tokio::test]
async fn t4_throughput_a_thousand_deltas_aggregated_to_ten_frames_a_second() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let open = |query: &'static str| {
        let req = t.http.get(format!("{}/v1/agent/runs/{run}/stream{query}", t.base)).bearer_auth(&t.key_a);
        async move { req.header("Last-Event-ID", "1").send().await.expect("send") }
    };
    let (merged, raw) = (open("").await, open("?detail=full").await);
    // Each client reads on its own task, noting when each frame arrived.
    let follow = |r: reqwest::Response| {
        tokio::spawn(async move {
            let mut body = r.bytes_stream();
            let (mut buf, mut got) = (String::new(), vec![]);
            while let Some(chunk) =
                tokio::time::timeout(Duration::from_secs(30), body.next()).await.expect("30 s")
            {
                buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
                got.extend(parse_frames(&mut buf).into_iter().map(|f| (Instant::now(), f)));
            }
            got
        })
    };
    let (merged, raw) = (follow(merged), follow(raw));
    let started = Instant::now();
    for b in 0..100 {
        let batch: Vec<Value> = (0..10)
            .map(|i| json!({"type": "text.delta", "payload": {"text": format!("{},", b * 10 + i)}}))
            .collect();
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let produced = started.elapsed();
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    let (merged, raw) = (merged.await.expect("merged"), raw.await.expect("raw"));
    let want: String = (0..1000).map(|i| format!("{i},")).collect();
    let deltas: Vec<&(Instant, Frame)> =
        merged.iter().filter(|(_, f)| f.data["type"] == "text.delta").collect();
    let text: String = deltas.iter().map(|(_, f)| f.data["payload"]["text"].as_str().unwrap_or("")).collect();
    assert_eq!(text, want, "whole and in order");
    let span = deltas.last().map(|l| l.0.duration_since(deltas[0].0)).unwrap_or_default();
    let secs = produced.max(span).as_secs_f64();
    eprintln!("T4: 1000 deltas committed over {produced:?}, {} merged frames over {span:?}", deltas.len());
    // At most 10 frames in any second: over `secs` seconds, at most 10 per started second
    // plus the window the stream ends in.
    assert!(deltas.len() as f64 <= 10.0 * (secs.ceil() + 1.0), "{} frames over {secs:.2} s", deltas.len());
    assert!(deltas.len() < 100, "aggregated: {} frames for 1000 deltas", deltas.len());
    let raw: Vec<i64> = raw
        .iter()
        .filter(|(_, f)| f.data["type"] == "text.delta")
        .filter_map(|(_, f)| f.data["seq"].as_i64())
        .collect();
    assert_eq!(raw, (2..=1001).collect::<Vec<i64>>(), "detail=full: every delta, in order");
}

/// T5 — Multi-child: the parent's stream intercalates its children's events (child_id
/// set) without corrupting the order per child_id: each child's text arrives whole and
/// in order, its tool calls start before they end, its seqs only grow and its terminal
/// event comes last; merged (R1 merges per child, never across) and raw, SSE and
/// WebSocket, partly live.
#[tokio::test]
async fn t5_multi_child_ordering_per_child_id() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let kids = ["k1", "k2", "k3"];
    let mut head = vec![json!({"type": "run.lifecycle", "payload": {"state": "running"}})];
    for k in kids {
        head.push(json!({"type": "child.spawn", "payload": {"child_id": k, "prompt": "go"}}));
        head.push(json!({"type": "run.lifecycle", "child_id": k, "payload": {"state": "running"}}));
    }
    t.append_ok(&t.key_a, &run, Value::Array(head)).await;
    // Open the streams before the interleaved part: it arrives live.
    let sse_live = t.http.get(format!("{}/v1/agent/runs/{run}/stream", t.base)).bearer_auth(&t.key_a).send();
    let sse_live = sse_live.await.expect("send");
    let mut ws = ws_open(&t.base, &t.key_a, &run, "", &[]).await.expect("handshake");
    let mut expected: std::collections::BTreeMap<String, String> = Default::default();
    for round in 0..6 {
        let mut batch = vec![];
        for r in 0..5 {
            for (i, k) in kids.iter().enumerate() {
                let text = format!("{k}:{round}.{r},");
                expected.entry(k.to_string()).or_default().push_str(&text);
                batch.push(json!({"type": "text.delta", "child_id": k, "payload": {"text": text}}));
                if (r + i) % 2 == 0 {
                    batch.push(json!({"type": "reasoning.delta", "child_id": k, "payload": {"text": "hm"}}));
                }
            }
            let text = format!("p:{round}.{r},");
            expected.entry("parent".into()).or_default().push_str(&text);
            batch.push(json!({"type": "text.delta", "payload": {"text": text}}));
        }
        for k in kids {
            // The same call id in every child: call ids are scoped to their child.
            batch.push(json!({"type": "tool.start", "child_id": k, "payload": {"call_id": format!("c{round}"), "tool": "t"}}));
            batch.push(json!({"type": "tool.end", "child_id": k, "payload": {"call_id": format!("c{round}"), "ok": true}}));
        }
        t.append_ok(&t.key_a, &run, Value::Array(batch)).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut tail: Vec<Value> = kids
        .iter()
        .map(|k| json!({"type": "run.lifecycle", "child_id": k, "payload": {"state": "done"}}))
        .collect();
    tail.push(json!({"type": "run.lifecycle", "payload": {"state": "done"}}));
    t.append_ok(&t.key_a, &run, Value::Array(tail)).await;

    let check = |name: &str, frames: &[Value]| {
        let lane = |f: &Value| f["child_id"].as_str().unwrap_or("parent").to_owned();
        let mut text: std::collections::BTreeMap<String, String> = Default::default();
        let mut last_seq: std::collections::BTreeMap<String, i64> = Default::default();
        let mut open_calls = std::collections::BTreeSet::new();
        let mut ended = std::collections::BTreeSet::new();
        let mut prev = 0;
        for f in frames {
            let (who, seq) = (lane(f), f["seq"].as_i64().expect("seq"));
            assert!(seq > prev, "{name}: seqs grow across the stream");
            prev = seq;
            assert!(!ended.contains(&who), "{name}: nothing of {who} after its terminal event");
            assert!(last_seq.insert(who.clone(), seq).is_none_or(|s| s < seq), "{name}: {who}'s seqs grow");
            match f["type"].as_str() {
                Some("text.delta") => {
                    text.entry(who).or_default().push_str(f["payload"]["text"].as_str().unwrap_or(""))
                }
                Some("tool.start") => assert!(open_calls.insert((who, f["payload"]["call_id"].to_string()))),
                Some("tool.end") => assert!(
                    open_calls.remove(&(who, f["payload"]["call_id"].to_string())),
                    "{name}: end after start"
                ),
                Some("run.lifecycle") if f["payload"]["state"] == "done" => {
                    ended.insert(who);
                }
                _ => {}
            }
        }
        assert_eq!(text, expected, "{name}: every child's text whole and in order");
        assert!(open_calls.is_empty());
        assert_eq!(ended.len(), 4, "{name}: every child and the parent ended");
    };
    let mut buf = sse_live.text().await.expect("body");
    check("SSE, live, merged", &parse_frames(&mut buf).into_iter().map(|f| f.data).collect::<Vec<_>>());
    let (frames, code) = ws_drain(&mut ws).await;
    assert_eq!(code, 1000);
    check("WebSocket, live, merged", &frames);
    let (_, raw) = sse(&t, &run, "?detail=full", None).await;
    check("SSE, raw", &raw.into_iter().map(|f| f.data).collect::<Vec<_>>());
}
