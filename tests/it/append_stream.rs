//! The streaming append, `POST /v1/runs/{run_id}/events/stream`: lines acknowledged as
//! they commit, a bad line's error with its line number and nothing after it written,
//! a reconnect after a cut made safe by idempotency keys, and the batch route's
//! rules for keys, scopes, tenants, rate limits and sizes.

use std::time::Duration;

use agent_stream::app::Settings;
use agent_stream::auth::Scope;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::common::TestApp;

/// An open streaming append: lines go up through `lines`, answer lines come back.
struct Stream {
    lines: futures::channel::mpsc::UnboundedSender<std::result::Result<bytes::Bytes, std::io::Error>>,
    answer: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
}

impl Stream {
    async fn open(t: &TestApp, key: &str, run: &str) -> Stream {
        let (status, s) = Self::try_open(t, key, run, "application/x-ndjson").await;
        assert_eq!(status, StatusCode::OK);
        s.expect("stream")
    }

    async fn try_open(t: &TestApp, key: &str, run: &str, ct: &str) -> (StatusCode, Option<Stream>) {
        let (lines, rx) = futures::channel::mpsc::unbounded();
        let r = t
            .http
            .post(format!("{}/v1/runs/{run}/events/stream", t.base))
            .bearer_auth(key)
            .header("content-type", ct)
            .body(reqwest::Body::wrap_stream(rx))
            .send()
            .await
            .expect("send");
        let status = r.status();
        if status != StatusCode::OK {
            return (status, None);
        }
        assert_eq!(r.headers()["content-type"], "application/x-ndjson");
        (status, Some(Stream { lines, answer: r.bytes_stream().boxed(), buf: vec![] }))
    }

    /// Writes `text` as it is (lines, or part of one).
    fn write(&self, text: &str) {
        self.lines.unbounded_send(Ok(bytes::Bytes::from(text.to_owned()))).expect("the body is open");
    }

    /// Writes one event as a line.
    fn event(&self, v: &Value) {
        self.write(&format!("{v}\n"));
    }

    /// Ends the body.
    fn end(&mut self) {
        self.lines.close_channel();
    }

    /// The next answer line (within 20 s); `None` at the end of the answer.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("answer lines are JSON"));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.answer.next())
                .await
                .expect("an answer line within 20 s");
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c.expect("answer chunk")),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "a partial answer line: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
            }
        }
    }

    /// Every answer line up to the end.
    async fn rest(&mut self) -> Vec<Value> {
        let mut out = vec![];
        while let Some(v) = self.next().await {
            out.push(v);
        }
        out
    }
}

fn delta(i: usize) -> Value {
    json!({"type": "text.delta", "payload": {"text": format!("t{i} ")}, "key": format!("k{i}")})
}

fn running() -> Value {
    json!({"type": "run.lifecycle", "payload": {"state": "running"}, "key": "start"})
}

/// The acknowledgements of `answer` cover lines 1..=n in order with seqs 1..=n (the
/// body has no blank lines); returns whether any was a replay.
fn acks_cover(answer: &[Value], n: u64) -> bool {
    let (mut line, mut seq, mut replayed) = (1u64, 1i64, false);
    for a in answer.iter().filter(|a| a.get("count").is_some()) {
        let count = a["count"].as_u64().expect("count");
        assert_eq!(a["first_line"], json!(line), "{a}");
        assert_eq!(a["last_line"], json!(line + count - 1), "{a}");
        assert_eq!(a["first_seq"], json!(seq), "{a}");
        assert_eq!(a["last_seq"], json!(seq + count as i64 - 1), "{a}");
        replayed |= a["replayed"] == json!(true);
        line += count;
        seq += count as i64;
    }
    assert_eq!(line, n + 1, "acknowledged lines: {answer:?}");
    replayed
}

#[tokio::test]
async fn lines_are_acknowledged_as_they_commit_and_the_end_says_done() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    // The first line's acknowledgement comes while the body is still open.
    s.event(&running());
    let first = s.next().await.expect("an acknowledgement");
    assert_eq!(
        first,
        json!({"first_seq": 1, "last_seq": 1, "count": 1, "first_line": 1, "last_line": 1, "replayed": false})
    );
    // Then a burst, which commits in groups (fewer acknowledgements than lines).
    let n = 300;
    let mut burst = String::new();
    for i in 2..=n {
        burst.push_str(&format!("{}\n", delta(i)));
    }
    s.write(&burst);
    s.end();
    let mut answer = vec![first];
    answer.extend(s.rest().await);
    let done = answer.pop().expect("a last line");
    assert_eq!(done, json!({"done": {"lines": n, "events": n}}));
    assert!(!acks_cover(&answer, n as u64));
    assert!(answer.len() < n, "{} acknowledgements for {n} lines: they commit in groups", answer.len());
    let stored = t.events(&t.key_a, &run).await;
    assert_eq!(stored.len(), n);
    for (i, e) in stored.iter().enumerate().skip(1) {
        assert_eq!(e["payload"]["text"], json!(format!("t{} ", i + 1)));
    }
}

#[tokio::test]
async fn a_refused_line_is_answered_with_its_line_and_nothing_after_it_is_written() {
    let t = TestApp::new().await;
    // A validation error in the middle of a group: lines before it commit, it and the
    // lines after it do not (line 5 is blank: lines are counted as they are in the body).
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    let bad = json!({"type": "tool.end", "payload": {"call_id": "nope", "ok": true}});
    s.write(&format!(
        "{}\n{}\n{}\n{}\n\n{bad}\n{}\n{}\n",
        running(),
        delta(2),
        delta(3),
        delta(4),
        delta(7),
        delta(8)
    ));
    let answer = s.rest().await;
    let (error, acks) = answer.split_last().expect("lines");
    acks_cover(acks, 4);
    assert_eq!(error["error"]["code"], json!("TOOL-UNKNOWN-CALL"), "{error}");
    assert_eq!(error["error"]["line"], json!(6), "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("nope"));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 4);

    // A line that is not an event: the same, whether or not the lines before it are
    // still committing when it is read.
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.write(&format!(
        "{}\n{}\n{{\"type\": \"text.delta\", \"payload\": \n{}\n",
        running(),
        delta(2),
        delta(4)
    ));
    let answer = s.rest().await;
    let (error, acks) = answer.split_last().expect("lines");
    acks_cover(acks, 2);
    assert_eq!(error["error"]["code"], json!("EVENT-MALFORMED"), "{error}");
    assert_eq!(error["error"]["line"], json!(3));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 2);

    // A refused first line: nothing written at all.
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.write(&format!("{}\n{}\n", json!({"type": "no.such", "payload": {}}), running()));
    let answer = s.rest().await;
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0]["error"]["code"], json!("EVENT-UNKNOWN-TYPE"));
    assert_eq!(answer[0]["error"]["line"], json!(1));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 0);

    // After a run's terminal event, the next line is RUN-CLOSED.
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    let done = json!({"type": "run.lifecycle", "payload": {"state": "done"}});
    s.write(&format!("{}\n{done}\n{}\n", running(), delta(3)));
    let answer = s.rest().await;
    let (error, acks) = answer.split_last().expect("lines");
    acks_cover(acks, 2);
    assert_eq!(error["error"]["code"], json!("RUN-CLOSED"), "{error}");
    assert_eq!(error["error"]["line"], json!(3));
}

#[tokio::test]
async fn a_repeated_key_is_a_retry_of_its_line_and_a_changed_one_is_refused() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    let changed = json!({"type": "text.delta", "payload": {"text": "other"}, "key": "k2"});
    s.write(&format!("{}\n{}\n{}\n{}\n{changed}\n", running(), delta(2), delta(2), delta(3)));
    let answer = s.rest().await;
    let acks: Vec<&Value> = answer.iter().filter(|a| a.get("count").is_some()).collect();
    // Line 3 repeats line 2: answered with line 2's seq, nothing written.
    let line3 = acks.iter().find(|a| a["first_line"] == json!(3)).expect("line 3 acknowledged");
    assert_eq!((line3["first_seq"].clone(), line3["replayed"].clone()), (json!(2), json!(true)));
    let line4 = acks.iter().find(|a| a["last_line"] == json!(4)).expect("line 4 acknowledged");
    assert_eq!(line4["last_seq"], json!(3));
    let error = answer.last().expect("lines");
    assert_eq!(error["error"]["code"], json!("IDEMPOTENCY-MISMATCH"), "{error}");
    assert_eq!(error["error"]["line"], json!(5));
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 3);
}

#[tokio::test]
async fn retried_lines_stored_apart_are_each_acknowledged_with_their_own_seq() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.event(&running());
    assert_eq!(s.next().await.expect("ack")["last_seq"], json!(1));
    s.end();
    assert_eq!(s.rest().await, vec![json!({"done": {"lines": 1, "events": 1}})]);
    t.append_ok(&t.key_a, &run, json!([{"type": "text.delta", "payload": {"text": "between "}}])).await;
    t.append_ok(&t.key_a, &run, json!([delta(3)])).await;
    // Lines 1 and 2 are stored at seqs 1 and 3: one acknowledgement could not say which
    // line has which, so each gets its own.
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.write(&format!("{}\n{}\n", running(), delta(3)));
    s.end();
    let answer = s.rest().await;
    assert_eq!(
        answer,
        vec![
            json!({"first_seq": 1, "last_seq": 1, "count": 1, "first_line": 1, "last_line": 1, "replayed": true}),
            json!({"first_seq": 3, "last_seq": 3, "count": 1, "first_line": 2, "last_line": 2, "replayed": true}),
            json!({"done": {"lines": 2, "events": 0}}),
        ]
    );
}

#[tokio::test]
async fn a_stream_cut_in_the_middle_is_resent_whole_and_each_event_is_stored_once() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let n = 200;
    let lines: Vec<String> =
        (1..=n).map(|i| if i == 1 { running().to_string() } else { delta(i).to_string() }).collect();
    // The first connection: a chunked body, cut off in the middle of line 151 once some
    // lines are stored; the socket is dropped without the body's last chunk.
    let host = t.base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    let head = format!(
        "POST /v1/runs/{run}/events/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
        t.key_a
    );
    tcp.write_all(head.as_bytes()).await.expect("head");
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
    for l in &lines[..100] {
        tcp.write_all(chunk(&format!("{l}\n")).as_bytes()).await.expect("line");
    }
    let stored = async {
        while t.stored_count(&t.tenant_a, &run).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), stored).await.expect("lines committed");
    let mut more = lines[100..150].iter().map(|l| format!("{l}\n")).collect::<String>();
    more.push_str(&lines[150][..10]);
    tcp.write_all(chunk(&more).as_bytes()).await.expect("more");
    drop(tcp);
    // Let the first stream finish what it had in hand.
    let mut before = -1;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = t.stored_count(&t.tenant_a, &run).await;
        if now == before {
            break;
        }
        before = now;
    }
    assert!((1..=150).contains(&before), "{before} events stored before the reconnect");
    // The reconnect resends everything: what was stored is answered as a retry, the
    // rest is written, and every event is stored once, in order.
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.write(&lines.iter().map(|l| format!("{l}\n")).collect::<String>());
    s.end();
    let mut answer = s.rest().await;
    assert_eq!(answer.pop(), Some(json!({"done": {"lines": n, "events": n - before as usize}})));
    assert!(acks_cover(&answer, n as u64), "the stored lines are answered as retries");
    let stored = t.events(&t.key_a, &run).await;
    assert_eq!(stored.len(), n);
    for (i, e) in stored.iter().enumerate() {
        assert_eq!(e["seq"], json!(i + 1));
        if i > 0 {
            assert_eq!(e["payload"]["text"], json!(format!("t{} ", i + 1)));
        }
    }
}

#[tokio::test]
async fn the_batch_routes_rules_hold_for_keys_tenants_types_and_sizes() {
    let settings = Settings { max_body_bytes: 4096, ..Settings::default() };
    let t = TestApp::with_settings(settings).await;
    let run = t.create_run(&t.key_a).await;
    // A read-only key, another tenant's key, no key, a body that is not NDJSON.
    let read_only = t.key_for_a(&[Scope::Read]).await;
    assert_eq!(
        Stream::try_open(&t, &read_only.secret, &run, "application/x-ndjson").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(Stream::try_open(&t, &t.key_b, &run, "application/x-ndjson").await.0, StatusCode::NOT_FOUND);
    assert_eq!(Stream::try_open(&t, "nope", &run, "application/x-ndjson").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        Stream::try_open(&t, &t.key_a, &run, "application/json").await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let r = t
        .http
        .post(format!("{}/v1/runs/{run}/events/stream", t.base))
        .bearer_auth(&t.key_a)
        .header("content-type", "application/x-ndjson")
        .body(vec![b'\n'; 5000])
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE, "a declared length over the limit");
    // Undeclared, the limit is met mid-stream: what came before it is stored.
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.event(&running());
    assert_eq!(s.next().await.expect("ack")["last_seq"], json!(1));
    for i in 2..100 {
        s.event(&delta(i));
    }
    let answer = s.rest().await;
    let (error, acks) = answer.split_last().expect("lines");
    assert_eq!(error["error"]["code"], json!("BODY-TOO-LARGE"), "{error}");
    let acked: u64 = acks.iter().map(|a| a["count"].as_u64().unwrap_or(0)).sum::<u64>() + 1;
    assert_eq!(error["error"]["line"], json!(acked + 1), "the line the limit fell in");
    assert_eq!(t.stored_count(&t.tenant_a, &run).await as u64, acked);
    assert_eq!(t.stored_count(&t.tenant_b, &run).await, 0);
}

#[tokio::test]
async fn the_rate_limit_counts_each_group_as_an_append() {
    let rate = agent_stream::ratelimit::RateLimit { per_sec: 0.001, burst: 1.0 };
    let t = TestApp::with_settings(Settings { append_rate: Some(rate), ..Settings::default() }).await;
    let run = {
        // The run is made directly: creating one does not take from the bucket.
        t.create_run(&t.key_a).await
    };
    let mut s = Stream::open(&t, &t.key_a, &run).await;
    s.event(&running());
    assert_eq!(s.next().await.expect("ack")["count"], json!(1));
    s.event(&delta(2));
    let error = s.next().await.expect("an error");
    assert_eq!(error["error"]["code"], json!("RATE-LIMITED"), "{error}");
    assert_eq!(error["error"]["line"], json!(2));
    assert_eq!(s.next().await, None);
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 1);
}
