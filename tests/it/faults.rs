//! Faults against a real `agent-stream serve` process: SIGKILL in the middle of an
//! append batch, SIGTERM while appends and streams are open, and a client that never
//! reads. Each ends with its counts.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::common::TestApp;
use crate::process::Serve;

fn batch(n: usize, tag: usize) -> Value {
    Value::Array((0..n).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{tag}-{i} {}", "y".repeat(200))}})).collect())
}

/// SIGKILL while big batches are being appended: each batch is stored whole or not at
/// all, and the log stays gapless.
#[tokio::test]
async fn sigkill_mid_batch_leaves_whole_batches_or_none() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let server = Serve::start(&t, &[]).await;
    let http = reqwest::Client::new();
    let (n, batches) = (5_000usize, 6usize);
    let mut sends = vec![];
    for b in 0..batches {
        let (http, url, key, body) =
            (http.clone(), format!("{}/v1/runs/{run}/events", server.base), t.key_a.clone(), batch(n, b));
        sends.push(tokio::spawn(async move {
            http.post(url).bearer_auth(key).json(&body).send().await.map(|r| r.status().as_u16())
        }));
    }
    // Kill once the first batch has committed, with the next ones in flight.
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.stored_count(&t.tenant_a, &run).await == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.signal(nix::sys::signal::Signal::SIGKILL);
    let mut acked = 0;
    for s in sends {
        if let Ok(Ok(201)) = s.await {
            acked += 1;
        }
    }
    let stored = t.stored_count(&t.tenant_a, &run).await;
    let owner = t.db.owner().await;
    let max: Option<i64> = owner
        .query_one("SELECT max(seq) FROM agent_run_events WHERE run_id = $1", &[&run])
        .await
        .expect("max")
        .get(0);
    let last_seq: i64 = owner
        .query_one("SELECT last_seq FROM run_summary WHERE run_id = $1", &[&run])
        .await
        .expect("run")
        .get(0);
    eprintln!(
        "sent {batches} batches of {n}; acknowledged {acked}; stored {stored} events ({} whole batches)",
        stored as usize / n
    );
    assert_eq!(stored as usize % n, 0, "only whole batches are stored");
    assert!(stored as usize >= acked * n, "every acknowledged batch is stored");
    assert_eq!(max.unwrap_or(0), stored, "gapless");
    assert_eq!(last_seq, stored, "the run's head is the log's");
    // The log takes appends again after the crash, continuing the seqs.
    let (first, _) = t.append_ok(&t.key_a, &run, batch(1, 99)).await;
    assert_eq!(first, stored + 1);
}

/// SIGTERM drains: the append in flight finishes, open SSE streams end cleanly, the
/// process exits, and a client resumes from its Last-Event-ID on a new process with
/// nothing lost or repeated.
#[tokio::test]
async fn sigterm_drains_appends_and_closes_streams_cleanly() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let mut server = Serve::start(&t, &[]).await;
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{}/v1/runs/{run}/stream?detail=full", server.base))
        .bearer_auth(&t.key_a)
        .send()
        .await
        .expect("stream");
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let reader = tokio::spawn(async move {
        let mut clean = true;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => text.push_str(&String::from_utf8_lossy(&c)),
                Err(_) => {
                    clean = false;
                    break;
                }
            }
        }
        (text, clean)
    });
    // A GraphQL subscription over WebSocket on the same run.
    let ws_task = {
        use futures::SinkExt;
        use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
        let mut req =
            format!("{}/graphql/ws", server.base.replace("http://", "ws://")).into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", "graphql-transport-ws".parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("ws");
        let init =
            json!({"type": "connection_init", "payload": {"Authorization": format!("Bearer {}", t.key_a)}});
        ws.send(Message::Text(init.to_string().into())).await.unwrap();
        let sub = json!({"id": "1", "type": "subscribe", "payload": {"query": "subscription($r: ID!) { runEvents(runId: $r) { seq } }", "variables": {"r": run}}});
        ws.send(Message::Text(sub.to_string().into())).await.unwrap();
        tokio::spawn(async move {
            let (mut seqs, mut completed, mut closed) = (vec![], false, false);
            while let Some(m) = ws.next().await {
                match m {
                    Ok(Message::Text(t)) => {
                        let v: Value = serde_json::from_str(&t).unwrap_or_default();
                        match v["type"].as_str() {
                            Some("next") => {
                                seqs.push(v["payload"]["data"]["runEvents"]["seq"].as_i64().unwrap_or(-1))
                            }
                            Some("complete") => completed = true,
                            _ => {}
                        }
                    }
                    Ok(Message::Close(_)) => closed = true,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            (seqs, completed, closed)
        })
    };
    // An append whose body arrives in two halves, SIGTERM in between: the request is in
    // flight when the shutdown starts, and must still finish.
    let body = serde_json::to_vec(&batch(2_000, 1)).expect("json");
    let (half_tx, half_rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    let (first, second) = body.split_at(body.len() / 2);
    half_tx.send(Ok(first.to_vec())).await.expect("first half");
    let append = {
        let stream = tokio_stream::wrappers::ReceiverStream::new(half_rx);
        let req = http
            .post(format!("{}/v1/runs/{run}/events", server.base))
            .bearer_auth(&t.key_a)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(stream));
        tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal(nix::sys::signal::Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    half_tx.send(Ok(second.to_vec())).await.expect("second half");
    drop(half_tx);
    let status = append.await.expect("task");
    eprintln!("append in flight at SIGTERM answered {status:?}");
    let exited = server.exited(Duration::from_secs(20)).await;
    assert!(exited.is_some_and(|s| s.success()), "the process exits by itself, successfully");
    let (text, clean) =
        tokio::time::timeout(Duration::from_secs(5), reader).await.expect("stream ended").expect("task");
    assert!(clean, "the stream ended with a clean close, not a reset");
    let (ws_seqs, completed, closed) =
        tokio::time::timeout(Duration::from_secs(5), ws_task).await.expect("ws ended").expect("task");
    eprintln!("WebSocket: {} events, complete = {completed}, close frame = {closed}", ws_seqs.len());
    assert!(completed || closed, "the subscription ended with `complete` or a close frame");
    assert_eq!(ws_seqs, (1..=ws_seqs.len() as i64).collect::<Vec<_>>(), "in order, nothing skipped");
    let ids: Vec<i64> =
        text.lines().filter_map(|l| l.strip_prefix("id:")).filter_map(|v| v.trim().parse().ok()).collect();
    let stored = t.stored_count(&t.tenant_a, &run).await;
    assert_eq!(status.ok(), Some(201), "the append in flight finished");
    assert_eq!(stored, 2_001, "all of it");
    // Resume on a new process after the last id received.
    let server2 = Serve::start(&t, &[]).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "done"}}])).await;
    let last = ids.last().copied().unwrap_or(0);
    let rest = http
        .get(format!("{}/v1/runs/{run}/stream?detail=full", server2.base))
        .bearer_auth(&t.key_a)
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .expect("resume")
        .text()
        .await
        .expect("rest");
    let mut all = ids.clone();
    all.extend(
        rest.lines().filter_map(|l| l.strip_prefix("id:")).filter_map(|v| v.trim().parse::<i64>().ok()),
    );
    let total = t.stored_count(&t.tenant_a, &run).await;
    let want: Vec<i64> = (1..=total).collect();
    eprintln!(
        "before SIGTERM {} events received, after resume {}, stored {total}",
        ids.len(),
        all.len() - ids.len()
    );
    assert_eq!(all, want, "received each stored event exactly once across the shutdown");
}

/// A client that never reads cannot grow the server's memory without bound: the
/// stream is pulled only as the socket drains, and the rest waits in the database.
#[tokio::test]
async fn a_client_that_never_reads_does_not_grow_server_memory() {
    const ROUNDS: usize = 6;
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "run.lifecycle", "payload": {"state": "running"}}])).await;
    let server = Serve::start(&t, &[]).await;
    // Warm up the append path first, so the comparison is about the streams alone
    // (the allocator keeps what a workload once needed).
    for b in 0..40 {
        t.append_ok_at(&server.base, &t.key_a, &run, batch(1_000, b)).await;
    }
    // Four streams that never read a byte after the headers.
    let mut stalled = vec![];
    for _ in 0..4 {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/runs/{run}/stream?detail=full", server.base))
            .bearer_auth(&t.key_a)
            .send()
            .await
            .expect("stream");
        stalled.push(r);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_kib();
    let started = Instant::now();
    let mut rss = vec![];
    for round in 0..ROUNDS {
        for b in 0..40 {
            // ~220 KB per batch, ~9 MB per round.
            t.append_ok_at(&server.base, &t.key_a, &run, batch(1_000, 100 * round + b)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        rss.push(server.rss_kib());
    }
    eprintln!(
        "appended {} events (~{} MB) in {:.1?} with 4 stalled streams; server RSS {before} -> {rss:?} KiB",
        ROUNDS * 40_000,
        ROUNDS * 9,
        started.elapsed(),
    );
    // Buffering for 4 stalled streams would cost 4 × 9 MB a round. What the server holds
    // is bounded instead (the feed keeps 32 pages of up to 1,000 events, with each
    // page's frames once a stream has sent it, and each stream holds at most one page in
    // hand), but when the bound is reached depends on timing, and the allocator keeps
    // some of what it once needed: one run in CI grew 2.8 MB in the first round and
    // 9.5 MB in the second. So the check is over the later rounds, once the bound is
    // reached: their 27 MB would add 108 MB if buffered, and add next to nothing.
    let settled = rss[ROUNDS - 4];
    let last = rss[ROUNDS - 1];
    assert!(last < settled + 12 * 1024, "RSS kept growing over the last 3 rounds: {before} -> {rss:?} KiB");
    let top = rss.iter().copied().max().unwrap_or(0);
    assert!(top < before + 40 * 1024, "RSS grew from {before} to {rss:?} KiB");
    drop(stalled);
}

/// The database unreachable for 30 s: appends answer 503 with Retry-After (never 500),
/// readiness says the database is down, and the service recovers by itself.
#[tokio::test]
async fn thirty_seconds_without_the_database_gives_503s_then_recovers() {
    use agent_stream::storage::{embedded::Embedded, migrate, tenants, Db, DbConfig};
    if agent_stream::storage::embedded::find_bin_dir().is_err() {
        panic!("this test needs the PostgreSQL server binaries (initdb, pg_ctl)");
    }
    let dir = std::env::temp_dir().join(format!("agent-stream-outage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pg = Embedded::start(&dir).await.expect("private cluster");
    let url = pg.url();
    migrate::migrate(&url, "outage").await.expect("migrate");
    let mut owner = agent_stream::storage::db::connect_owner(&url, "outage").await.expect("owner");
    let key = tenants::create_tenant(
        &mut owner,
        "o",
        &[agent_stream::auth::Scope::Read, agent_stream::auth::Scope::Write],
    )
    .await
    .expect("tenant")
    .secret;
    drop(owner);
    let db =
        Db::new(&DbConfig { url: url.clone(), schema: "outage".into(), max_connections: 4 }).expect("pool");
    let app = agent_stream::app::App::new(db, Default::default());
    let (base, _) = crate::common::serve_app("127.0.0.1:0", app).await;
    let http = reqwest::Client::new();
    let created: Value =
        http.post(format!("{base}/v1/runs")).bearer_auth(&key).send().await.unwrap().json().await.unwrap();
    let run = created["run_id"].as_str().expect("run").to_owned();
    let append = || {
        http.post(format!("{base}/v1/runs/{run}/events"))
            .bearer_auth(&key)
            .json(&json!([{"type": "text.delta", "payload": {"text": "x"}}]))
            .send()
    };
    assert_eq!(append().await.unwrap().status(), 201);

    pg.stop().await.expect("stop");
    let down = Instant::now();
    let (mut sent, mut unavailable, mut other) = (0, 0, vec![]);
    let mut ready_while_down = vec![];
    while down.elapsed() < Duration::from_secs(30) {
        let r = append().await.expect("the service answers");
        sent += 1;
        if r.status() == 503 && r.headers().get("retry-after").is_some() {
            unavailable += 1;
        } else {
            other.push(r.status().as_u16());
        }
        ready_while_down.push(http.get(format!("{base}/readyz")).send().await.unwrap().status().as_u16());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pg = Embedded::start(&dir).await.expect("database back");
    let back = Instant::now();
    let mut recovered = None;
    while back.elapsed() < Duration::from_secs(30) {
        if append().await.map(|r| r.status() == 201).unwrap_or(false) {
            recovered = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ready = false;
    for _ in 0..100 {
        if http.get(format!("{base}/readyz")).send().await.unwrap().status() == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored: i64 = agent_stream::storage::db::connect_owner(&url, "outage")
        .await
        .expect("owner")
        .query_one("SELECT count(*) FROM agent_run_events WHERE run_id = $1", &[&run])
        .await
        .expect("count")
        .get(0);
    pg.stop().await.ok();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "30 s outage: {sent} appends sent, {unavailable} answered 503 + Retry-After, other answers {other:?}; \
         recovered after {recovered:?}; stored {stored} (2 expected)"
    );
    assert!(other.is_empty(), "only 503 while the database is away: {other:?}");
    assert!(ready_while_down.iter().all(|s| *s == 503), "readyz while down: {ready_while_down:?}");
    assert!(recovered.is_some(), "appends work again without a restart of the service");
    assert!(ready, "readyz is 200 again");
    assert_eq!(stored, 2, "the appends refused during the outage wrote nothing");
}
