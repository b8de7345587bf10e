//! The floor of `fanout`: a server that does nothing but what fan-out cannot avoid, so
//! the service's latency can be read against what this machine allows at all.
//!
//! It takes the producer's appends to the run it created last (`POST .../events`, answered at once with the seqs,
//! no database, no validation) and writes each one's frames, built once, as one chunk
//! to every open `GET .../stream` (chunked SSE, `id:` lines the same readers parse):
//! one write per subscriber per append, the least any HTTP server can do over TCP. It
//! runs as a process of its own (`agent-stream-load floor-sse-server --listen ADDR`), on
//! the same two-worker tokio runtime as the service, so the subscribers, the producer
//! and the machine's cores are shared exactly as they are with the service.
//!
//! Hand-written on raw sockets rather than on hyper on purpose: a framework's cost per
//! write is part of what the service is measured for, and must not be in the floor.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, Mutex};

/// The one run's log: every frame so far, and the pages sent to subscribers.
struct Log {
    frames: Vec<u8>,
    next_seq: i64,
    pages: broadcast::Sender<Bytes>,
}

impl Log {
    fn new() -> Log {
        Log { frames: vec![], next_seq: 1, pages: broadcast::channel(1024).0 }
    }
}

/// Serves the floor on `listen` until killed.
pub async fn serve(listen: &str) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let log = Arc::new(Mutex::new(Log::new()));
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(connection(stream, log.clone()));
    }
}

/// One connection: keep-alive requests until a stream request, which it then serves.
async fn connection(mut stream: TcpStream, log: Arc<Mutex<Log>>) -> std::io::Result<()> {
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
        match (method, path) {
            ("GET", p) if p.contains("/stream") => return subscriber(stream, &log).await,
            ("POST", "/v1/runs") => {
                // A new run: the log starts over (and the last run's subscribers end).
                let mut log = log.lock().await;
                *log = Log::new();
                answer(&mut stream, "201 Created", br#"{"run_id":"floor"}"#).await?
            }
            ("POST", p) if p.ends_with("/events") => {
                let seqs = append(&log, &body).await;
                answer(&mut stream, "201 Created", seqs.as_bytes()).await?;
            }
            // `/healthz`, `/metrics` (no series: the floor reads nothing and has no buckets).
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
/// them, sends them to every subscriber as one chunk, and gives the seqs as the service
/// answers them.
async fn append(log: &Mutex<Log>, body: &[u8]) -> String {
    let events: Vec<serde_json::Value> = serde_json::from_slice(body).unwrap_or_default();
    let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut log = log.lock().await;
    let first = log.next_seq;
    let mut page = Vec::with_capacity(events.len() * 200);
    for e in &events {
        let seq = log.next_seq;
        log.next_seq += 1;
        let data = serde_json::json!({"seq": seq, "run_id": "floor", "id": ulid::Ulid::new().to_string(),
            "ts": ts, "type": e["type"], "payload": e["payload"]});
        page.extend_from_slice(
            format!("id: {seq}\nevent: {}\ndata: {data}\n\n", e["type"].as_str().unwrap_or("")).as_bytes(),
        );
    }
    log.frames.extend_from_slice(&page);
    // No subscriber yet is not an error.
    let _ = log.pages.send(chunk(&page));
    format!(r#"{{"first_seq":{first},"last_seq":{}}}"#, log.next_seq - 1)
}

/// `bytes` as one HTTP/1.1 chunk.
fn chunk(bytes: &[u8]) -> Bytes {
    let mut c = format!("{:x}\r\n", bytes.len()).into_bytes();
    c.extend_from_slice(bytes);
    c.extend_from_slice(b"\r\n");
    Bytes::from(c)
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

    use crate::http::Conn;
    use crate::support::SseReader;

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

    /// The floor must be read exactly as the service is: every seq once, in order, from
    /// the history and then from each page, and a new run starting over at 1.
    #[tokio::test]
    async fn the_floor_serves_history_then_each_append_once_in_order() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let addr = format!("127.0.0.1:{port}");
        tokio::spawn({
            let addr = addr.clone();
            async move { super::serve(&addr).await }
        });
        let base = format!("http://{addr}");
        let mut http = loop {
            if let Ok(c) = Conn::open(&base).await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for _ in 0..2 {
            let r = http.send(hyper::Method::POST, "/v1/runs", Some("k"), None).await.expect("run");
            assert_eq!(r.status, 201);
            let a = http.post("/v1/runs/floor/events", "k", ticks(2)).await.expect("append").json();
            assert_eq!((a["first_seq"].as_i64(), a["last_seq"].as_i64()), (Some(1), Some(2)));
            let mut sub = SseReader::open(&addr, "/v1/runs/floor/stream", "k").await.expect("stream");
            let mut ids = vec![];
            read_to(&mut sub, &mut ids, 2).await;
            let a = http.post("/v1/runs/floor/events", "k", ticks(3)).await.expect("append").json();
            assert_eq!((a["first_seq"].as_i64(), a["last_seq"].as_i64()), (Some(3), Some(5)));
            read_to(&mut sub, &mut ids, 5).await;
            assert_eq!(ids, [1, 2, 3, 4, 5]);
        }
    }
}
