//! `bench slow-readers`: what a subscriber that stops reading costs the server (seed
//! 004 R4; issue "Every dialect exact").
//!
//! A run streams 20,000 deltas of 2 KiB (reasoning and text alternating, a tool call
//! every 100) to `SLOW_READERS` (default 20) SSE subscribers in each of three phases,
//! each on a fresh server:
//! - **baseline**: the subscribers read everything as it comes;
//! - **stuck**: they read the response head, then never read again (a frozen tab);
//! - **slow**: a 4 KiB receive buffer and 5 ms per frame, `detail=full`.
//!
//! Reported: the server's RSS growth per subscriber in each phase (and the stuck
//! phase's ratio to the baseline's), the RSS after the stuck subscribers closed, and for
//! the slow readers how many deltas they lost and how far behind the head they got.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::http::Conn;
use super::support::{self, SseReader};
use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};

const EVENTS: usize = 20_000;
const BATCH: usize = 100;

/// Appends the phase's run: `EVENTS` deltas of 2 KiB in batches, then `done`.
async fn produce(http: &mut Conn, key: &str, run: &str) {
    let path = format!("/v1/runs/{run}/events");
    let text = "x".repeat(2048);
    for b in 0..EVENTS / BATCH {
        let mut batch: Vec<Value> = (0..BATCH)
            .map(|i| {
                let kind = if i % 2 == 0 { "reasoning.delta" } else { "text.delta" };
                json!({"type": kind, "payload": {"text": text, "message_id": format!("m{b}")}})
            })
            .collect();
        batch.push(json!({"type": "tool.start", "payload": {"call_id": format!("c{b}"), "tool": "t"}}));
        batch.push(json!({"type": "tool.end", "payload": {"call_id": format!("c{b}"), "ok": true}}));
        batch.push(json!({"type": "message.end", "payload": {"message_id": format!("m{b}")}}));
        let r = http.post(&path, key, Value::Array(batch).to_string().into()).await.expect("append");
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let done = json!([{"type": "run.lifecycle", "payload": {"state": "done"}}]);
    let r = http.post(&path, key, done.to_string().into()).await.expect("append");
    assert_eq!(r.status, 201, "{}", r.text());
}

/// A connection that asked for the stream, read its head, and stopped reading.
async fn stuck(addr: &str, path: &str, key: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut s = socket.connect(addr.parse().expect("addr")).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("request");
    let mut head = [0u8; 512];
    let n = s.read(&mut head).await.expect("head");
    assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    s
}

/// One phase on a fresh server: (RSS growth per subscriber in KiB, RSS after, extra).
async fn phase(bin: &std::path::Path, url: &str, schema: &str, key: &str, name: &str, n: usize) {
    let mut server =
        support::serve(bin, url, schema, &["--append-rate", "0", "--retention-interval", "0"]).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut http = Conn::open(&server.base).await.expect("connect");
    let run = support::create_run(&mut http, key).await;
    let r = http
        .post(
            &format!("/v1/runs/{run}/events"),
            key,
            json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]).to_string().into(),
        )
        .await
        .expect("append");
    assert_eq!(r.status, 201);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = support::status_kib(server.pid, "VmRSS:");
    let path = format!("/v1/runs/{run}/stream?detail=full");
    let t0 = Instant::now();
    match name {
        "stuck" => {
            let mut held = vec![];
            for _ in 0..n {
                held.push(stuck(&addr, &path, key).await);
            }
            produce(&mut http, key, &run).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss = support::status_kib(server.pid, "VmRSS:");
            drop(held);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = support::status_kib(server.pid, "VmRSS:");
            println!(
                "| stuck (never read) | {n} | {:.0} KiB | {:.0} MiB → {:.0} MiB with them → {:.0} MiB after they closed |",
                rss.saturating_sub(rss0) as f64 / n as f64,
                rss0 as f64 / 1024.0,
                rss as f64 / 1024.0,
                after as f64 / 1024.0
            );
        }
        "baseline" => {
            let mut tasks = vec![];
            for _ in 0..n {
                let mut r = SseReader::open(&addr, &path, key).await.expect("stream");
                tasks.push(tokio::spawn(async move {
                    let mut ids = vec![];
                    while r.read_ids(&mut ids).await.unwrap_or(false) {
                        ids.clear();
                    }
                }));
            }
            let watch_pid = server.pid;
            let peak = tokio::spawn(async move {
                let mut peak = 0;
                for _ in 0..600 {
                    peak = peak.max(support::status_kib(watch_pid, "VmRSS:"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peak
            });
            produce(&mut http, key, &run).await;
            for t in tasks {
                let _ = t.await;
            }
            let rss = support::status_kib(server.pid, "VmRSS:");
            peak.abort();
            println!(
                "| baseline (reads everything) | {n} | {:.0} KiB | {:.0} MiB → {:.0} MiB, all read in {:.1} s |",
                rss.saturating_sub(rss0) as f64 / n as f64,
                rss0 as f64 / 1024.0,
                rss as f64 / 1024.0,
                t0.elapsed().as_secs_f64()
            );
        }
        _ => {
            // Slow: a small receive buffer and 5 ms per frame.
            let mut tasks = vec![];
            for _ in 0..n {
                let s = stuck(&addr, &path, key).await;
                tasks.push(tokio::spawn(slow_read(s)));
            }
            produce(&mut http, key, &run).await;
            let rss = support::status_kib(server.pid, "VmRSS:");
            let mut got = (0u64, 0u64);
            for t in tasks {
                let (frames, dropped) = t.await.unwrap_or((0, 0));
                got = (got.0 + frames, got.1 + dropped);
            }
            println!(
                "| slow (4 KiB buffer, 5 ms per frame) | {n} | {:.0} KiB | {:.0} MiB → {:.0} MiB; each got {:.0} frames and was told it lost {:.0} deltas |",
                rss.saturating_sub(rss0) as f64 / n as f64,
                rss0 as f64 / 1024.0,
                rss as f64 / 1024.0,
                got.0 as f64 / n as f64,
                got.1 as f64 / n as f64,
            );
        }
    }
    let _ = server.child.kill().await;
}

/// Reads frames at 5 ms each until the end; returns (frames, the dropped_count).
async fn slow_read(mut s: tokio::net::TcpStream) -> (u64, u64) {
    let (mut buf, mut frames, mut dropped) = (Vec::new(), 0u64, 0u64);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
            let frame = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 2);
            if frame.contains("\"dropped_count\":") {
                dropped = frame
                    .split("\"dropped_count\":")
                    .nth(1)
                    .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                    .unwrap_or(0);
                return (frames + 1, dropped);
            }
            if frame.contains("data:") {
                frames += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    (frames, dropped)
}

/// Runs the scenario against `schema` of `url`, measuring `bin serve`.
pub async fn run(bin: &std::path::Path, url: &str, schema: &str) {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key = tenants::create_tenant(&mut owner, "slow", &[Scope::Read, Scope::Write])
        .await
        .expect("tenant")
        .secret;
    let n: usize = std::env::var("SLOW_READERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    println!("{EVENTS} deltas of 2 KiB (plus a tool call and a message end per {BATCH}), `detail=full`, one fresh server per phase");
    println!("| subscribers | n | server RSS growth per subscriber | server RSS |");
    println!("|---|---|---|---|");
    for name in ["baseline", "stuck", "slow"] {
        phase(bin, url, schema, &key, name, n).await;
    }
}
