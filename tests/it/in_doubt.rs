//! A COMMIT whose answer never comes. A proxy between the service and PostgreSQL cuts
//! the connection that sends COMMIT, either just after passing it on (the server
//! commits, the service never hears) or just before (the server never sees it). An
//! append must then be answered as what really happened, and stored exactly once or
//! not at all: never twice, as when a committed group used to be redone.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use agent_stream::app::{App, Settings};
use agent_stream::storage::{Db, DbConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::common::TestApp;

const OFF: u8 = 0;
/// Cut after passing COMMIT on: the transaction commits unseen.
const AFTER: u8 = 1;
/// Cut instead of passing COMMIT on: the transaction rolls back.
const BEFORE: u8 = 2;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A TCP proxy to the test's PostgreSQL that, once armed, cuts the first connection
/// sending a `COMMIT` query.
struct CommitCutter {
    /// Connection string through the proxy.
    url: String,
    mode: Arc<AtomicU8>,
    cuts: Arc<AtomicUsize>,
}

impl CommitCutter {
    async fn start(target: &str) -> CommitCutter {
        let cfg: tokio_postgres::Config = target.parse().expect("connection string");
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let host = cfg.get_hosts().first().cloned().expect("a host");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "host=127.0.0.1 port={} user={} dbname={}",
            listener.local_addr().expect("addr").port(),
            cfg.get_user().unwrap_or("postgres"),
            cfg.get_dbname().unwrap_or("postgres"),
        );
        let (mode, cuts) = (Arc::new(AtomicU8::new(OFF)), Arc::new(AtomicUsize::new(0)));
        let (m, c) = (mode.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream: Box<dyn Stream> = match &host {
                    tokio_postgres::config::Host::Tcp(h) => {
                        Box::new(tokio::net::TcpStream::connect((h.as_str(), port)).await.expect("upstream"))
                    }
                    tokio_postgres::config::Host::Unix(dir) => Box::new(
                        tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                            .await
                            .expect("upstream"),
                    ),
                };
                tokio::spawn(relay(client, upstream, m.clone(), c.clone()));
            }
        });
        CommitCutter { url, mode, cuts }
    }

    fn arm(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

/// Relays one connection, reading the client's messages to find COMMIT.
async fn relay(
    client: tokio::net::TcpStream,
    upstream: Box<dyn Stream>,
    mode: Arc<AtomicU8>,
    cuts: Arc<AtomicUsize>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(upstream);
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let (mut buf, mut started) = (Vec::<u8>::new(), false);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from_client.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        // Whole messages only: the start-up message has no type byte, the rest do.
        let mut at = 0;
        let mut cut = None;
        loop {
            let rest = &buf[at..];
            let (len, typed) = if started { (rest.get(1..5), true) } else { (rest.get(0..4), false) };
            let Some(len) = len else { break };
            let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize + usize::from(typed);
            if rest.len() < len {
                break;
            }
            if !typed {
                let code = rest.get(4..8).map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")));
                // An SSL or GSS request is followed by the real start-up message.
                started = !matches!(code, Some(80877103 | 80877104));
            } else if rest[0] == b'Q' && rest[5..].starts_with(b"COMMIT") {
                let armed = mode.swap(OFF, Ordering::SeqCst);
                if armed != OFF {
                    cut = Some(if armed == AFTER { at + len } else { at });
                    break;
                }
            }
            at += len;
        }
        let upto = cut.unwrap_or(at);
        if to_server.write_all(&buf[..upto]).await.is_err() {
            break;
        }
        if cut.is_some() {
            cuts.fetch_add(1, Ordering::SeqCst);
            // The client hears nothing more; the server gets end of file after what it
            // was sent, as when a network path dies.
            back.abort();
            let _ = to_server.shutdown().await;
            return;
        }
        buf.drain(..upto);
    }
    back.abort();
}

/// One case: an app on the proxy with `lanes` group-commit lanes, one keyless append
/// cut at its COMMIT in `mode`; returns the answer and the rows stored.
async fn case(t: &TestApp, lanes: usize, mode: u8) -> (StatusCode, Value, i64) {
    let proxy = CommitCutter::start(&t.db.url).await;
    let pool = Db::new(&DbConfig { url: proxy.url.clone(), schema: t.db.schema.clone(), max_connections: 4 })
        .expect("pool");
    let app = App::new(pool, Settings { group_commit_lanes: lanes, ..Settings::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let router = agent_stream::http::router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    // Before arming: the run (its own COMMIT) and the key, cached from then on.
    let run = t.create_run(&t.key_a).await;
    let one = json!([{"type": "custom.tick", "payload": {"n": 1}}]);
    proxy.arm(mode);
    let (status, body) = t.append_at(&base, &t.key_a, &run, &one).await;
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "the proxy cut the COMMIT (lanes {lanes}, mode {mode})");
    let stored = t.stored_count(&t.tenant_a, &run).await;
    // The run goes on from what is stored, through the same app.
    let (next, body2) = t.append_at(&base, &t.key_a, &run, &one).await;
    assert_eq!(next, StatusCode::CREATED, "{body2}");
    assert_eq!(body2["first_seq"], stored + 1, "the next append follows what is stored: {body2}");
    (status, body, stored)
}

#[tokio::test]
async fn a_commit_that_took_effect_unheard_is_answered_as_stored_and_stored_once() {
    let t = TestApp::new().await;
    for lanes in [4, 0] {
        let (status, body, stored) = case(&t, lanes, AFTER).await;
        assert_eq!(status, StatusCode::CREATED, "lanes {lanes}: {body}");
        assert_eq!((body["first_seq"].as_i64(), body["last_seq"].as_i64()), (Some(1), Some(1)), "{body}");
        assert_eq!(stored, 1, "lanes {lanes}: stored exactly once, not redone");
    }
}

#[tokio::test]
async fn a_commit_that_never_arrived_stores_nothing_twice() {
    let t = TestApp::new().await;
    // Group commit redoes the append alone: one copy, answered 201.
    let (status, body, stored) = case(&t, 4, BEFORE).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(stored, 1, "redone once");
    // A single append says it was not stored, and it was not.
    let (status, body, stored) = case(&t, 0, BEFORE).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "SERVICE-UNAVAILABLE", "{body}");
    assert_eq!(stored, 0);
}
