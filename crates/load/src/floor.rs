//! The floor of `fanout`: a server that does nothing but what fan-out cannot avoid, so
//! the service's latency can be read against what this machine allows at all.
//!
//! It makes runs (`POST /v1/runs`), takes a run's appends (`POST .../events`, answered
//! at once with the seqs, no database, no validation) and the lines of a streaming
//! append (`POST .../events/stream`, a chunked NDJSON body answered line by line with
//! acknowledgements shaped like the service's), and writes each append's frames, built
//! once, as one chunk to every open `GET .../stream` of its run (chunked SSE, `id:`
//! lines the same readers parse): one write per subscriber per append, the least any
//! HTTP server can do over TCP. It serves `fanout` (one run, many subscribers) and
//! `many-runs` (many runs, a producer and a subscriber each). It
//! runs as a process of its own (`agent-stream-load floor-sse-server --listen ADDR`), on
//! the same two-worker tokio runtime as the service, so the subscribers, the producer
//! and the machine's cores are shared exactly as they are with the service.
//!
//! Hand-written on raw sockets rather than on hyper on purpose: a framework's cost per
//! write is part of what the service is measured for, and must not be in the floor.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, Mutex};

/// One run's log: every frame so far, and the pages sent to its subscribers.
struct Log {
    run_id: String,
    frames: Vec<u8>,
    next_seq: i64,
    pages: broadcast::Sender<Bytes>,
}

impl Log {
    fn new(run_id: String) -> Log {
        Log { run_id, frames: vec![], next_seq: 1, pages: broadcast::channel(1024).0 }
    }
}

/// Every run made so far, by id.
#[derive(Default)]
struct Runs {
    made: u64,
    logs: HashMap<String, Arc<Mutex<Log>>>,
}

type Shared = Arc<std::sync::Mutex<Runs>>;

/// The log of the run `path` (`/v1/runs/{id}/...`) names, if the floor made it.
fn log_of(runs: &Shared, path: &str) -> Option<Arc<Mutex<Log>>> {
    let id = path.strip_prefix("/v1/runs/")?.split(['/', '?']).next()?;
    runs.lock().unwrap_or_else(|p| p.into_inner()).logs.get(id).cloned()
}

/// Serves the floor on `listen` until killed.
pub async fn serve(listen: &str) -> anyhow::Result<()> {
    // With the service's backlog: a burst of subscribers must meet the same kernel queue.
    let addr: std::net::SocketAddr = listen.parse()?;
    serve_on(agent_stream::server::listen(addr)?).await
}

/// Serves the floor on a bound `listener` until killed (a caller that needs the port
/// before the floor runs binds it first, so no one else can take it in between).
pub async fn serve_on(listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let runs = Shared::default();
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(connection(stream, runs.clone()));
    }
}

/// One connection: keep-alive requests until a stream or a streaming append, which it
/// then serves.
async fn connection(mut stream: TcpStream, runs: Shared) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        }
        let body = buf[head_end..head_end + length].to_vec();
        buf.drain(..head_end + length);
        let mut words = head.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if method == "POST" && path == "/v1/runs" {
            let id = {
                let mut runs = runs.lock().unwrap_or_else(|p| p.into_inner());
                runs.made += 1;
                let id = format!("floor-{}", runs.made);
                runs.logs.insert(id.clone(), Arc::new(Mutex::new(Log::new(id.clone()))));
                id
            };
            answer(&mut stream, "201 Created", format!(r#"{{"run_id":"{id}"}}"#).as_bytes()).await?;
            continue;
        }
        if !path.starts_with("/v1/runs/") {
            // `/healthz`, `/metrics` (no series: the floor reads nothing and has no buckets).
            answer(&mut stream, "200 OK", b"").await?;
            continue;
        }
        let Some(log) = log_of(&runs, path) else {
            answer(&mut stream, "404 Not Found", br#"{"error":{"code":"run_not_found"}}"#).await?;
            continue;
        };
        let route = path.split('?').next().unwrap_or("");
        match method {
            "GET" if route.ends_with("/stream") => return subscriber(stream, &log).await,
            "POST" if route.ends_with("/events/stream") => return streaming(stream, buf, &log).await,
            "POST" if route.ends_with("/events") => {
                let events: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap_or_default();
                let (first, last) = append(&log, &events).await;
                let seqs = format!(r#"{{"first_seq":{first},"last_seq":{last}}}"#);
                answer(&mut stream, "201 Created", seqs.as_bytes()).await?;
            }
            _ => answer(&mut stream, "200 OK", b"").await?,
        }
    }
}

async fn answer(stream: &mut TcpStream, status: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(&[head.as_bytes(), body].concat()).await
}

/// Frames the appended events (shaped like the service's `detail=full` frames), keeps
/// them, sends them to the run's subscribers as one chunk, and gives their seqs.
async fn append(log: &Mutex<Log>, events: &[serde_json::Value]) -> (i64, i64) {
    let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut log = log.lock().await;
    let first = log.next_seq;
    let mut page = Vec::with_capacity(events.len() * 200);
    for e in events {
        let seq = log.next_seq;
        log.next_seq += 1;
        let data = serde_json::json!({"seq": seq, "run_id": log.run_id, "id": ulid::Ulid::new().to_string(),
            "ts": ts, "type": e["type"], "payload": e["payload"]});
        page.extend_from_slice(
            format!("id: {seq}\nevent: {}\ndata: {data}\n\n", e["type"].as_str().unwrap_or("")).as_bytes(),
        );
    }
    log.frames.extend_from_slice(&page);
    // No subscriber yet is not an error.
    let _ = log.pages.send(chunk(&page));
    (first, log.next_seq - 1)
}

/// `bytes` as one HTTP/1.1 chunk.
fn chunk(bytes: &[u8]) -> Bytes {
    let mut c = format!("{:x}\r\n", bytes.len()).into_bytes();
    c.extend_from_slice(bytes);
    c.extend_from_slice(b"\r\n");
    Bytes::from(c)
}

/// A streaming append: decodes the chunked body (`buf` holds what came after the
/// request's head), appends each line as it completes as one event, and answers it
/// at once with one acknowledgement line (`first_seq`, `last_seq`, `count`,
/// `first_line`, `last_line`, as the service's): the least a streaming append can do.
async fn streaming(mut stream: TcpStream, mut buf: Vec<u8>, log: &Mutex<Log>) -> std::io::Result<()> {
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        .await?;
    let (mut chunks, mut body, mut line_no) = (crate::support::Dechunker::default(), Vec::new(), 0u64);
    loop {
        chunks.feed(&mut buf, &mut body);
        let ended = chunks.ended();
        let mut acks = Vec::new();
        while let Some(i) = body.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = body.drain(..=i).collect();
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(&line) else { continue };
            line_no += 1;
            let (seq, _) = append(log, std::slice::from_ref(&event)).await;
            let ack = format!(
                r#"{{"first_seq":{seq},"last_seq":{seq},"count":1,"first_line":{line_no},"last_line":{line_no},"replayed":false}}"#
            );
            acks.extend_from_slice(&chunk(format!("{ack}\n").as_bytes()));
        }
        if ended {
            acks.extend_from_slice(b"0\r\n\r\n");
        }
        if !acks.is_empty() {
            stream.write_all(&acks).await?;
        }
        if ended || stream.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    }
}

/// Answers the stream: its history, then each page as it comes, one write per page.
async fn subscriber(mut stream: TcpStream, log: &Mutex<Log>) -> std::io::Result<()> {
    let (history, mut pages) = {
        let log = log.lock().await;
        // No chunk for no history: an empty chunk would end the body.
        let history = if log.frames.is_empty() { Bytes::new() } else { chunk(&log.frames) };
        (history, log.pages.subscribe())
    };
    let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(&[&head[..], &history].concat()).await?;
    // A lagging subscriber is cut, as the service would: the readers count what is missing.
    while let Ok(page) = pages.recv().await {
        stream.write_all(&page).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::http::{AppendStream, Conn};
    use crate::support::{AckLine, BareAppend, BareConn, SseReader};

    /// Reads until `ids` holds `n` seqs, within 5 s.
    async fn read_to(sub: &mut SseReader, ids: &mut Vec<i64>, n: usize) {
        while ids.len() < n {
            let r = tokio::time::timeout(Duration::from_secs(5), sub.read_ids(ids)).await;
            assert!(r.expect("a frame within 5 s").expect("read"), "the stream ended early");
        }
    }

    fn ticks(n: usize) -> bytes::Bytes {
        let e: Vec<_> =
            (0..n).map(|i| serde_json::json!({"type": "custom.tick", "payload": {"n": i}})).collect();
        bytes::Bytes::from(serde_json::Value::Array(e).to_string())
    }

    /// The floor must be read exactly as the service is: each run's seqs once, in
    /// order, from the history and then from each page, whether they came as appends or
    /// as the lines of a streaming append, and each run apart from the others.
    #[tokio::test]
    async fn the_floor_serves_history_then_each_append_once_in_order() {
        // Bound here and handed over: a port probed and released could be taken by
        // another test before the floor binds it (seen once in CI as a reset).
        let listener = agent_stream::server::listen("127.0.0.1:0".parse().expect("address")).expect("listen");
        let addr = listener.local_addr().expect("port").to_string();
        tokio::spawn(super::serve_on(listener));
        let base = format!("http://{addr}");
        let mut http = Conn::open(&base).await.expect("the floor accepts");
        let missing = http.post("/v1/runs/nope/events", "k", ticks(1)).await.expect("append");
        assert_eq!(missing.status, 404);
        for _ in 0..2 {
            let r = http.send(hyper::Method::POST, "/v1/runs", Some("k"), None).await.expect("run");
            assert_eq!(r.status, 201);
            let run = r.json()["run_id"].as_str().expect("run_id").to_owned();
            let events = format!("/v1/runs/{run}/events");
            let a = http.post(&events, "k", ticks(2)).await.expect("append").json();
            assert_eq!((a["first_seq"].as_i64(), a["last_seq"].as_i64()), (Some(1), Some(2)));
            let mut sub =
                SseReader::open(&addr, &format!("/v1/runs/{run}/stream"), "k").await.expect("stream");
            let mut ids = vec![];
            read_to(&mut sub, &mut ids, 2).await;
            let a = http.post(&events, "k", ticks(3)).await.expect("append").json();
            assert_eq!((a["first_seq"].as_i64(), a["last_seq"].as_i64()), (Some(3), Some(5)));
            read_to(&mut sub, &mut ids, 5).await;
            // Two lines of a streaming append: each acknowledged and delivered at once.
            let mut lines = AppendStream::open(&base, &run, "k").await.expect("streaming append");
            for n in 1..=2u64 {
                lines.send(br#"{"type":"text.delta","payload":{"text":"a"}}"#).await.expect("line");
                let ack = tokio::time::timeout(Duration::from_secs(5), lines.next())
                    .await
                    .expect("an acknowledgement within 5 s")
                    .expect("read")
                    .expect("a line");
                assert_eq!(
                    (ack["first_seq"].as_i64(), ack["first_line"].as_u64()),
                    (Some(5 + n as i64), Some(n))
                );
                assert_eq!(ack["count"].as_u64(), Some(1));
            }
            read_to(&mut sub, &mut ids, 7).await;
            // A single append through the bare client ingest-single's producers use,
            // twice on its one connection, then an answer that is not a 201.
            let mut conn = BareConn::new(&base);
            for seq in [8, 9] {
                let a = conn.post(&events, "k", &ticks(1)).await.expect("bare append");
                assert_eq!(a.status, 201);
                assert_eq!(a.json()["first_seq"].as_i64(), Some(seq));
            }
            let a = conn.post("/v1/runs/nope/events", "k", &ticks(1)).await.expect("bare append");
            assert_eq!((a.status.as_u16(), a.json()["error"]["code"].as_str()), (404, Some("run_not_found")));
            read_to(&mut sub, &mut ids, 9).await;
            // The same through the bare client many-runs' producers use: each line
            // acknowledged with its seq and its number, then the end of the answer once
            // the body ends.
            let mut bare = BareAppend::open(&addr, &run, "k").await.expect("bare streaming append");
            let mut acks = vec![];
            for n in 1..=2u64 {
                bare.write_line(br#"{"type":"text.delta","payload":{"text":"b"}}"#).await.expect("line");
                while acks.len() < n as usize {
                    let open = tokio::time::timeout(Duration::from_secs(5), bare.read_acks(&mut acks))
                        .await
                        .expect("an acknowledgement within 5 s")
                        .expect("read");
                    assert!(open, "the answer ended early");
                }
                assert_eq!(
                    acks[n as usize - 1],
                    AckLine::Committed { first_seq: 9 + n as i64, first_line: n, count: 1 }
                );
            }
            bare.finish().await.expect("end the body");
            let open = tokio::time::timeout(Duration::from_secs(5), bare.read_acks(&mut acks))
                .await
                .expect("the end within 5 s")
                .expect("read");
            assert!(!open && acks.len() == 2, "the answer ends with the body: {acks:?}");
            read_to(&mut sub, &mut ids, 11).await;
            assert_eq!(ids, (1..=11).collect::<Vec<i64>>());
        }
    }
}
