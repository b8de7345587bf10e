//! `stuck`: clients that stop reading (issue 25, item 8). 20 subscribers of one run
//! that never read a byte, while 40,000 events of about 2 KB are appended, against a
//! separate `agent-stream serve`; the baseline, in the same run, is the same appends
//! with no subscriber at all.
//!
//! Reported per transport: the server's resident memory before, at its highest during
//! the appends, and once the stuck subscribers were cut off (the server closes a
//! GraphQL WebSocket that takes nothing for `--ws-stall-secs`; the clients keep their
//! connections open), and the growth per stuck subscriber above the baseline's.
//! Transports: GraphQL `runEvents` over WebSocket, and SSE (`/stream?detail=full`),
//! whose stuck readers hold at most the page in hand and the chunks hyper queues.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::http::Conn;
use super::support;
use agent_stream::auth::Scope;
use agent_stream::storage::{db, tenants};

/// Stuck subscribers per cell.
const STUCK: usize = 20;
/// Append batches of [`BATCH`] events.
const BATCHES: usize = 40;
const BATCH: usize = 1_000;
/// The server's stall time for WebSockets and its pool idle time, both short so the
/// "after" column is read soon after the appends.
const STALL_SECS: &str = "3";
const POOL_IDLE_SECS: &str = "2";

/// How the stuck subscribers connect.
#[derive(Clone, Copy)]
enum Transport {
    /// No subscriber: the baseline.
    None,
    /// GraphQL `runEvents` over `graphql-transport-ws`.
    Ws,
    /// `GET /v1/runs/{id}/stream?detail=full`, read up to its response head.
    Sse,
}

/// Runs the scenario in `schema` and prints its table.
pub async fn run(bin: &Path, url: &str, schema: &str) {
    let mut owner = db::connect_owner(url, schema).await.expect("owner");
    let key =
        tenants::create_tenant(&mut owner, "stuck", &[Scope::Read, Scope::Write]).await.expect("tenant");
    println!("{STUCK} subscribers that never read; {BATCHES} appends of {BATCH} events of ~2 KB (~80 MB)");
    println!("| subscribers | server RSS before (MiB) | highest during the appends (MiB) | 10 s after the appends (MiB) | growth at the highest, per stuck subscriber above the baseline (MiB) |");
    println!("|---|---|---|---|---|");
    let mut baseline = 0.0;
    for how in [Transport::None, Transport::Ws, Transport::Sse] {
        let (before, peak, after) = cell(how, bin, url, schema, &key.secret).await;
        let mib = |k: u64| k as f64 / 1024.0;
        let growth = mib(peak.saturating_sub(before));
        let label = match how {
            Transport::None => {
                baseline = growth;
                "none (baseline)".to_owned()
            }
            Transport::Ws => format!("{STUCK} over WebSocket"),
            Transport::Sse => format!("{STUCK} over SSE"),
        };
        let per = match how {
            Transport::None => "".to_owned(),
            _ => format!("{:.2}", (growth - baseline) / STUCK as f64),
        };
        println!("| {label} | {:.1} | {:.1} | {:.1} | {per} |", mib(before), mib(peak), mib(after));
    }
}

/// One row: a fresh server, a warm-up, the stuck subscribers, the appends. Returns the
/// server's RSS before, at its highest, and 10 s after (KiB).
async fn cell(how: Transport, bin: &Path, url: &str, schema: &str, key: &str) -> (u64, u64, u64) {
    let server = support::serve(
        bin,
        url,
        schema,
        &["--ws-stall-secs", STALL_SECS, "--pool-idle-secs", POOL_IDLE_SECS],
    )
    .await;
    let mut http = Conn::open(&server.base).await.expect("connect");
    let run = support::create_run(&mut http, key).await;
    let start = json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]);
    append(&mut http, key, &run, start.to_string().into_bytes()).await;
    // Warm the append path first, so the figures are about the subscribers.
    for b in 0..10 {
        append(&mut http, key, &run, batch(b)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = support::status_kib(server.pid, "VmRSS:");
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut held = vec![];
    let mut held_sse = vec![];
    for _ in 0..STUCK {
        match how {
            Transport::Ws => held.push(stuck_ws(&addr, key, &run).await),
            Transport::Sse => held_sse.push(stuck_sse(&addr, key, &run).await),
            Transport::None => {}
        }
    }
    let mut peak = before;
    for b in 0..BATCHES {
        append(&mut http, key, &run, batch(100 + b)).await;
        peak = peak.max(support::status_kib(server.pid, "VmRSS:"));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = support::status_kib(server.pid, "VmRSS:");
    drop(held);
    drop(held_sse);
    (before, peak, after)
}

async fn append(http: &mut Conn, key: &str, run: &str, body: Vec<u8>) {
    let r = http.post(&format!("/v1/runs/{run}/events"), key, body.into()).await.expect("append");
    assert!(r.status.is_success(), "append: {}", r.text());
}

/// [`BATCH`] custom events of about 2 KB each.
fn batch(tag: usize) -> Vec<u8> {
    let pad = "q".repeat(2000);
    let events: Vec<_> = (0..BATCH)
        .map(|i| json!({"type": "custom.blob", "payload": {"tag": tag, "i": i, "pad": pad}}))
        .collect();
    serde_json::to_vec(&events).expect("json")
}

/// A `runEvents` subscriber that sends init and subscribe, then never reads.
async fn stuck_ws(
    addr: &str,
    key: &str,
    run: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let mut req = format!("ws://{addr}/graphql/ws").into_client_request().expect("request");
    req.headers_mut().insert("sec-websocket-protocol", "graphql-transport-ws".parse().expect("header"));
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("ws connect");
    let init = json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {key}")}});
    ws.send(Message::text(init.to_string())).await.expect("init");
    let sub = json!({"id": "1", "type": "subscribe", "payload": {
        "query": "subscription($r: ID!) { runEvents(runId: $r, afterSeq: 10001) { seq type payload } }",
        "variables": {"r": run}}});
    ws.send(Message::text(sub.to_string())).await.expect("subscribe");
    ws
}

/// An SSE subscriber (from seq 10,001, like the WebSocket one) that reads the response
/// head with a 4 KiB receive buffer, then never reads again.
async fn stuck_sse(addr: &str, key: &str, run: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut s = socket.connect(addr.parse().expect("addr")).await.expect("connect");
    let req = format!(
        "GET /v1/runs/{run}/stream?detail=full&after_seq=10001 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("request");
    let mut head = [0u8; 512];
    let n = s.read(&mut head).await.expect("head");
    assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    s
}
