//! A COMMIT whose answer never comes. A proxy between the service and PostgreSQL cuts
//! the connection that sends COMMIT, either just after passing it on (the server
//! commits, the service never hears) or just before (the server never sees it). An
//! append must then be answered as what really happened, and stored exactly once or
//! not at all: never twice, as when a committed group used to be redone. When the
//! database also stays unreachable, the answer must say the outcome is unknown and how
//! to learn it: a retry with the same idempotency keys.

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
/// As `AFTER`, and then the database is unreachable: every connection through the
/// proxy closes and new ones are refused until [`CommitCutter::up`].
const AFTER_THEN_DOWN: u8 = 3;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A TCP proxy to the test's PostgreSQL that, once armed, cuts the first connection
/// sending a `COMMIT` query.
struct CommitCutter {
    /// Connection string through the proxy.
    url: String,
    mode: Arc<AtomicU8>,
    cuts: Arc<AtomicUsize>,
    /// True while the database is "down"; its receivers end every relay.
    down: tokio::sync::watch::Sender<bool>,
}

impl CommitCutter {
    async fn start(target: &str) -> CommitCutter {
        let cfg: tokio_postgres::Config = target.parse().expect("connection string");
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let host = cfg.get_hosts().first().cloned().expect("a host");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            // Plain: the proxy reads the protocol to find COMMIT, which TLS would hide.
            "host=127.0.0.1 port={} user={} dbname={} sslmode=disable",
            listener.local_addr().expect("addr").port(),
            cfg.get_user().unwrap_or("postgres"),
            cfg.get_dbname().unwrap_or("postgres"),
        );
        let (mode, cuts) = (Arc::new(AtomicU8::new(OFF)), Arc::new(AtomicUsize::new(0)));
        let down = tokio::sync::watch::Sender::new(false);
        let (m, c, d) = (mode.clone(), cuts.clone(), down.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *d.borrow() {
                    continue;
                }
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
                tokio::spawn(relay(client, upstream, m.clone(), c.clone(), d.clone()));
            }
        });
        CommitCutter { url, mode, cuts, down }
    }

    fn arm(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Connections cut so far, counted once the server has closed its side (so what
    /// it was sent has been read and acted on); waits up to 10 s for the first.
    async fn cuts(&self) -> usize {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.cuts.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        self.cuts.load(Ordering::SeqCst)
    }

    /// The database is reachable again.
    fn up(&self) {
        self.down.send_replace(false);
    }
}

/// Relays one connection, reading the client's messages to find COMMIT.
async fn relay(
    client: tokio::net::TcpStream,
    upstream: Box<dyn Stream>,
    mode: Arc<AtomicU8>,
    cuts: Arc<AtomicUsize>,
    down: tokio::sync::watch::Sender<bool>,
) {
    let mut is_down = down.subscribe();
    let (mut from_client, to_client) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(upstream);
    // The server's side is read to its end even after a cut, so the proxy never closes
    // it with data unread (a reset, which could discard the COMMIT before the server
    // reads it); after a cut what it says is dropped and the client's socket closed.
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
    let back = tokio::spawn(async move {
        let mut to_client = Some(to_client);
        let mut chunk = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut chunk).await {
            if *cut_rx.borrow() {
                to_client = None;
            }
            if let Some(w) = to_client.as_mut() {
                if w.write_all(&chunk[..n]).await.is_err() {
                    to_client = None;
                }
            }
        }
    });
    let (mut buf, mut started) = (Vec::<u8>::new(), false);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            r = from_client.read(&mut chunk) => r,
            _ = is_down.wait_for(|d| *d) => break,
        };
        let n = match read {
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
                    cut = Some(if armed == BEFORE { at } else { at + len });
                    if armed == AFTER_THEN_DOWN {
                        down.send_replace(true);
                    }
                    break;
                }
            }
            at += len;
        }
        let upto = cut.unwrap_or(at);
        if cut.is_some() {
            // Set before the COMMIT goes out, so its answer cannot reach the client.
            cut_tx.send_replace(true);
        }
        if to_server.write_all(&buf[..upto]).await.is_err() {
            break;
        }
        if cut.is_some() {
            // The client hears nothing more; the server reads what it was sent, then the
            // end of the connection, as when a network path dies.
            let _ = to_server.shutdown().await;
            drop(from_client);
            let _ = back.await;
            cuts.fetch_add(1, Ordering::SeqCst);
            return;
        }
        buf.drain(..upto);
    }
    back.abort();
}

/// A server for the test's schema whose database connections go through a new proxy,
/// with `lanes` group-commit lanes; returns the proxy and the server's base URL.
async fn behind_proxy(t: &TestApp, lanes: usize) -> (CommitCutter, String) {
    let proxy = CommitCutter::start(&t.db.url).await;
    let pool = Db::new(&DbConfig { url: proxy.url.clone(), schema: t.db.schema.clone(), max_connections: 4 })
        .expect("pool");
    let app = App::new(pool, Settings { group_commit_lanes: lanes, ..Settings::default() });
    let (base, _) = crate::common::serve_app("127.0.0.1:0", app).await;
    (proxy, base)
}

/// One case: an app on the proxy with `lanes` group-commit lanes, one keyless append
/// cut at its COMMIT in `mode`; returns the answer and the rows stored.
async fn case(t: &TestApp, lanes: usize, mode: u8) -> (StatusCode, Value, i64) {
    let (proxy, base) = behind_proxy(t, lanes).await;
    // Before arming: the run (its own COMMIT) and the key, cached from then on.
    let run = t.create_run(&t.key_a).await;
    let one = json!([{"type": "custom.tick", "payload": {"n": 1}}]);
    proxy.arm(mode);
    let (status, body) = t.append_at(&base, &t.key_a, &run, &one).await;
    assert_eq!(proxy.cuts().await, 1, "the proxy cut the COMMIT (lanes {lanes}, mode {mode})");
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

/// The connection breaks after COMMIT went out and the database stays unreachable, so
/// the service cannot learn what happened: it says so (503, retry with the same keys),
/// and the retry, once the database is back, finds the append stored: `replayed`.
#[tokio::test]
async fn an_unknown_outcome_says_so_and_a_keyed_retry_finds_it() {
    let t = TestApp::new().await;
    for lanes in [4, 0] {
        let (proxy, base) = behind_proxy(&t, lanes).await;
        let run = t.create_run(&t.key_a).await;
        let keyed = json!([{"type": "custom.tick", "payload": {"n": 1}, "key": "tick-1"}]);
        proxy.arm(AFTER_THEN_DOWN);
        let (status, body) = t.append_at(&base, &t.key_a, &run, &keyed).await;
        assert_eq!(proxy.cuts().await, 1, "lanes {lanes}: the proxy cut the COMMIT");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "lanes {lanes}: {body}");
        assert_eq!(body["error"]["code"], "SERVICE-UNAVAILABLE", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("same idempotency keys"),
            "lanes {lanes}: the answer says what to do: {body}"
        );
        assert_eq!(t.stored_count(&t.tenant_a, &run).await, 1, "the commit did go through");
        proxy.up();
        let (status, body) = t.append_at(&base, &t.key_a, &run, &keyed).await;
        assert_eq!(status, StatusCode::OK, "lanes {lanes}: {body}");
        assert_eq!(body["replayed"], true, "lanes {lanes}: the retry finds the stored append: {body}");
        assert_eq!(t.stored_count(&t.tenant_a, &run).await, 1, "still once");
    }
}

/// The same cuts on a group that goes out in one round trip (the run's head cached by
/// the lane from an earlier append, so BEGIN, the gated UPDATE, the INSERT and COMMIT
/// are sent together): settled exactly as on the locking path.
#[tokio::test]
async fn a_cut_commit_of_a_one_round_trip_group_is_settled_the_same() {
    let t = TestApp::new().await;
    for mode in [AFTER, BEFORE] {
        let (proxy, base) = behind_proxy(&t, 4).await;
        let run = t.create_run(&t.key_a).await;
        let one = json!([{"type": "custom.tick", "payload": {"n": 1}}]);
        let (status, body) = t.append_at(&base, &t.key_a, &run, &one).await;
        assert_eq!((status, body["first_seq"].as_i64()), (StatusCode::CREATED, Some(1)), "{body}");
        proxy.arm(mode);
        let (status, body) = t.append_at(&base, &t.key_a, &run, &one).await;
        assert_eq!(proxy.cuts().await, 1, "the proxy cut the COMMIT (mode {mode})");
        // AFTER: committed unheard, answered as stored; BEFORE: not stored, redone alone.
        assert_eq!(status, StatusCode::CREATED, "mode {mode}: {body}");
        assert_eq!(body["first_seq"], 2, "mode {mode}: {body}");
        assert_eq!(t.stored_count(&t.tenant_a, &run).await, 2, "mode {mode}: stored once");
        let (next, body) = t.append_at(&base, &t.key_a, &run, &one).await;
        assert_eq!((next, body["first_seq"].as_i64()), (StatusCode::CREATED, Some(3)), "mode {mode}: {body}");
    }
}
