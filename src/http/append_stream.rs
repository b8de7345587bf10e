//! `POST /v1/runs/{run_id}/events/stream`: the streaming append. One long-lived request
//! per run: the producer writes NDJSON events as they come (chunked transfer), and the
//! answer is an NDJSON stream of acknowledgements written as the events commit.
//!
//! The contract (README, "Streaming appends"): a stream stores exactly what appending
//! its lines one at a time, in order, and stopping at the first refused line would
//! store. Lines are committed in groups: while one group commits, the lines that arrive
//! wait, and become the next group when it is answered, so a group is whatever came in
//! during one commit (no timer), and every group goes through [`App::append_streamed`] (the
//! rate limit, the group-commit lanes, the one row writer, notifications). A group is
//! all or nothing, so when one is refused because of its `i`-th line, the lines before
//! it are committed as a group of their own and the rest is tried again: the refused
//! line's error is then exactly the one it gets alone, and every line before it is
//! committed and acknowledged. Nothing after a refused line is written; the answer's
//! last line says how the stream ended (`done` or `error`).
//!
//! [`App::append`]: crate::app::App::append

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use super::extract::{framing, Caller, Params};
use crate::app::AppRef;
use crate::auth::{Principal, Scope};
use crate::domain::{Batch, Framing, NewEvent};
use crate::error::{Error, ErrorCode, Result};
use crate::storage::AppendOutcome;

/// Answer lines buffered towards a slow reader before the stream stops reading lines.
const ANSWER_BUFFER: usize = 64;

/// The streaming append takes no query parameters (unknown ones are `PARAM-INVALID`).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {}

/// `POST /v1/runs/{run_id}/events/stream` with an NDJSON body, read as it arrives.
#[utoipa::path(post, path = "/v1/runs/{run_id}/events/stream", tag = "events", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), StreamParams),
    request_body(content((String = "application/x-ndjson")),
        description = "NDJSON, one event per line (as on `POST /v1/runs/{run_id}/events`), sent as it is produced (chunked transfer); blank lines are ignored"),
    responses(
        (status = 200, description = "NDJSON, written as the events commit: one acknowledgement per committed group \
            `{\"first_seq\",\"last_seq\",\"count\",\"first_line\",\"last_line\",\"replayed\"}`; \
            then `{\"done\":{\"lines\",\"events\"}}` when the body ended and everything in it committed, \
            or `{\"error\":{\"code\",\"message\",\"line\"}}` for the first refused line, after which nothing is read or written",
            content_type = "application/x-ndjson", body = String),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn append_stream(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(_params): Params<StreamParams>,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    // Whatever can be refused before the first line is refused with a status, as on
    // the batch route; after the 200, refusals are error lines.
    who.require(Scope::Write)?;
    if framing(&headers)? != Framing::Ndjson {
        return Err(Error::reject(
            ErrorCode::UnsupportedMediaType,
            "a streaming append is NDJSON: send Content-Type: application/x-ndjson, one event per line",
        )
        .into());
    }
    let limit = app.settings.max_body_bytes;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit).into());
    }
    // A run this process has just written to, created or locked exists: its stream opens
    // without a read. A thousand streams opening at once otherwise queue a thousand reads
    // ahead of the lanes' commits for the pool's connections (docs/benchmarks-log.md,
    // 2026-11-29 22:10).
    let run_id = crate::storage::runs::parse_run_id(&run_id)?;
    if !app.guards.head_known(&who.tenant_id, &run_id) {
        crate::storage::runs::get_run(&app.db, &who.tenant_id, &run_id).await?;
    }
    // Asking for the body once before answering makes hyper send `100 Continue` ahead of
    // the 200 to a client that waits for it (curl does, for a body of unknown length);
    // a client that sees a final answer first stops sending.
    let mut data = body.into_data_stream();
    let first = match futures::poll!(data.next()) {
        std::task::Poll::Ready(item) => Some(item),
        std::task::Poll::Pending => None,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(ANSWER_BUFFER);
    let session = Session::new(app, who, &run_id, tx);
    tokio::spawn(session.run(data, first));
    let lines = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-store")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn too_large(limit: usize) -> Error {
    Error::reject(
        ErrorCode::BodyTooLarge,
        format!("the request body exceeds the limit of {limit} bytes; go on in a new stream"),
    )
}

/// One parsed line.
struct Line {
    /// Its number in the body, from 1 (blank lines count).
    no: u64,
    /// Its length in bytes.
    bytes: usize,
    event: NewEvent,
}

/// The acknowledgement of a committed group (fields in this order on the wire).
#[derive(Serialize)]
struct Ack {
    first_seq: i64,
    last_seq: i64,
    /// Lines (events) in the group.
    count: usize,
    first_line: u64,
    last_line: u64,
    /// True when the group was a retry answered from the stored events.
    replayed: bool,
}

impl Ack {
    /// The acknowledgement's line, newline included: what `Serialize` writes (a test
    /// holds the two equal), written directly because every committed group of every
    /// stream gets one, and serde's map machinery was ~2% of a streamed line
    /// (docs/benchmarks-log.md, 2026-12-06 06:16).
    fn line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        let mut n = itoa::Buffer::new();
        out.extend_from_slice(b"{\"first_seq\":");
        out.extend_from_slice(n.format(self.first_seq).as_bytes());
        out.extend_from_slice(b",\"last_seq\":");
        out.extend_from_slice(n.format(self.last_seq).as_bytes());
        out.extend_from_slice(b",\"count\":");
        out.extend_from_slice(n.format(self.count).as_bytes());
        out.extend_from_slice(b",\"first_line\":");
        out.extend_from_slice(n.format(self.first_line).as_bytes());
        out.extend_from_slice(b",\"last_line\":");
        out.extend_from_slice(n.format(self.last_line).as_bytes());
        out.extend_from_slice(if self.replayed {
            b",\"replayed\":true}\n"
        } else {
            b",\"replayed\":false}\n"
        });
        out
    }
}

/// Why the stream stops reading: the first line that cannot be appended and its error.
struct Stop {
    line: u64,
    error: Error,
}

/// What reading the body gives.
type Chunk = std::result::Result<Bytes, axum::Error>;

/// A group being committed: its lines and the append's answer to come.
type InFlight = (Vec<Line>, BoxFuture<'static, Result<AppendOutcome>>);

struct Session {
    app: AppRef,
    // Shared with each group's future: a group copies neither.
    who: Arc<Principal>,
    run_id: Arc<str>,
    tx: mpsc::Sender<Bytes>,
    /// Parsed lines not yet in a group.
    pending: VecDeque<Line>,
    /// The bytes of the line being read.
    partial: Vec<u8>,
    /// Lines seen (the number of the last complete one).
    lines: u64,
    /// Body bytes read.
    read: usize,
    /// Events committed (retries answered from the log not counted).
    events: u64,
    eof: bool,
    stop: Option<Stop>,
    /// A group to commit before anything pending: the part of a refused group to
    /// try again on its own.
    next: Option<Vec<Line>>,
}

impl Session {
    fn new(app: AppRef, who: Principal, run_id: &str, tx: mpsc::Sender<Bytes>) -> Session {
        Session {
            app,
            who: Arc::new(who),
            run_id: run_id.into(),
            tx,
            pending: VecDeque::new(),
            partial: vec![],
            lines: 0,
            read: 0,
            events: 0,
            eof: false,
            stop: None,
            next: None,
        }
    }

    async fn run(mut self, mut data: axum::body::BodyDataStream, first: Option<Option<Chunk>>) {
        let mut inflight: Option<InFlight> = None;
        if let Some(chunk) = first {
            self.chunk(chunk);
        }
        loop {
            if inflight.is_none() {
                match self.next_group() {
                    Some(group) => inflight = Some(self.commit(group)),
                    None if self.eof || self.stop.is_some() => break,
                    None => {}
                }
            }
            let reading = !self.eof
                && self.stop.is_none()
                && self.pending.len() < self.app.settings.limits.max_batch_events;
            let answer = async {
                match inflight.as_mut() {
                    Some((_, f)) => f.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                out = answer => {
                    let (group, _) = inflight.take().unwrap_or_else(|| unreachable!("answered without a group"));
                    if !self.answered(group, out).await {
                        return;
                    }
                }
                chunk = data.next(), if reading => self.chunk(chunk),
            }
        }
        let last = match self.stop.take() {
            Some(Stop { line, error }) => {
                let (mut detail, _) = super::error::detail(&error);
                detail["line"] = json!(line);
                json!({ "error": detail })
            }
            None => json!({ "done": { "lines": self.lines, "events": self.events } }),
        };
        let _ = self.send(&last).await;
    }

    /// The next group: a part of a refused group to try again, or the lines pending, up
    /// to a batch's size and short of a key the group already holds (a repeated key is
    /// a retry of the earlier line, which a batch refuses: the next group answers it).
    fn next_group(&mut self) -> Option<Vec<Line>> {
        if let Some(g) = self.next.take() {
            return Some(g);
        }
        let max = self.app.settings.limits.max_batch_events;
        let mut keys = HashSet::new();
        let mut group = vec![];
        while let Some(l) = self.pending.front() {
            if group.len() >= max || l.event.key.as_ref().is_some_and(|k| !keys.insert(k.clone())) {
                break;
            }
            group.extend(self.pending.pop_front());
        }
        (!group.is_empty()).then_some(group)
    }

    /// Starts committing `group` through the append path every producer uses.
    fn commit(&self, group: Vec<Line>) -> InFlight {
        let (app, who, run_id) = (self.app.clone(), self.who.clone(), self.run_id.clone());
        let batch =
            Batch { events: group.iter().map(|l| l.event.clone()).collect(), expected_last_seq: None };
        let bytes: usize = group.iter().map(|l| l.bytes).sum();
        let fut = Box::pin(async move {
            // A key revoked while its stream is open stops the stream at its next group.
            if !app.auth.still_valid(&app.db, &who).await? {
                return Err(Error::reject(ErrorCode::AuthInvalid, "the API key was revoked"));
            }
            let out = app.append_streamed(&who, &run_id, batch).await?;
            if !out.replayed {
                app.metrics.append_bytes.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(out)
        });
        (group, fut)
    }

    /// Answers a group; false when the client is gone.
    async fn answered(&mut self, mut group: Vec<Line>, out: Result<AppendOutcome>) -> bool {
        match out {
            // A retry is answered with the span its stored events occupy; when they are
            // not contiguous (other events came between them), the lines are answered
            // one by one, so each acknowledgement gives every line its own seq.
            Ok(o) if o.replayed && group.len() > 1 && o.last_seq - o.first_seq + 1 != group.len() as i64 => {
                let rest = group.split_off(1);
                self.requeue(rest);
                self.next = Some(group);
                true
            }
            Ok(o) => {
                if !o.replayed {
                    self.events += group.len() as u64;
                }
                let ack = Ack {
                    first_seq: o.first_seq,
                    last_seq: o.last_seq,
                    count: group.len(),
                    first_line: group.first().map_or(0, |l| l.no),
                    last_line: group.last().map_or(0, |l| l.no),
                    replayed: o.replayed,
                };
                self.tx.send(Bytes::from(ack.line())).await.is_ok()
            }
            Err(error) => {
                let index = match &error {
                    Error::Rejected(r) => r.index.filter(|i| *i < group.len()),
                    _ => None,
                };
                match index {
                    // The lines before the refused one commit on their own; the rest is
                    // tried again after them.
                    Some(i) if i > 0 => {
                        let rest = group.split_off(i);
                        self.requeue(rest);
                        self.next = Some(group);
                    }
                    // The first line is to blame, but in a group its error may be the
                    // group's doing (its key is stored and a later line's is not): alone,
                    // it gets its own answer.
                    Some(0) if group.len() > 1 => {
                        let rest = group.split_off(1);
                        self.requeue(rest);
                        self.next = Some(group);
                    }
                    _ => {
                        // Nothing of the group is stored (or, in doubt, it is unknown:
                        // the message says to resend with the same keys); nothing after
                        // it will be.
                        let line = group[index.unwrap_or(0)].no;
                        self.pending.clear();
                        self.stop = Some(Stop { line, error });
                    }
                }
                true
            }
        }
    }

    /// Puts lines back at the front of the pending ones, in order.
    fn requeue(&mut self, lines: Vec<Line>) {
        for l in lines.into_iter().rev() {
            self.pending.push_front(l);
        }
    }

    /// Takes what reading the body gave.
    fn chunk(&mut self, chunk: Option<Chunk>) {
        match chunk {
            Some(Ok(bytes)) => self.take(&bytes),
            Some(Err(e)) => {
                // The connection broke or the chunked framing is bad: lines not yet in a
                // group are not committed (the producer cannot be told about them); the
                // group in flight is answered if it can be.
                self.pending.clear();
                self.next = None;
                let e =
                    Error::reject(ErrorCode::BodyMalformed, format!("could not read the request body: {e}"));
                self.stop = Some(Stop { line: self.lines + 1, error: e });
            }
            None => self.end(),
        }
    }

    /// Takes a chunk of the body: complete lines are parsed, the rest kept.
    fn take(&mut self, mut bytes: &[u8]) {
        let limits = self.app.settings.limits;
        while self.stop.is_none() && !bytes.is_empty() {
            let (piece, complete) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..=i], true),
                None => (bytes, false),
            };
            bytes = &bytes[piece.len()..];
            self.read += piece.len();
            if self.read > self.app.settings.max_body_bytes {
                self.stop =
                    Some(Stop { line: self.lines + 1, error: too_large(self.app.settings.max_body_bytes) });
                return;
            }
            self.partial.extend_from_slice(piece);
            if complete {
                self.line();
            } else if self.partial.len() > limits.max_event_bytes + 2 {
                // A line already over the event limit is refused before its end comes.
                let e = crate::domain::input::parse_event(&self.partial, limits)
                    .err()
                    .map_or_else(|| Error::reject(ErrorCode::EventTooLarge, "event too large"), Error::from);
                self.stop = Some(Stop { line: self.lines + 1, error: e });
            }
        }
    }

    /// The body ended: a last line without a newline counts.
    fn end(&mut self) {
        self.eof = true;
        if !self.partial.is_empty() {
            self.line();
        }
    }

    /// Parses the complete line in `partial`.
    fn line(&mut self) {
        self.lines += 1;
        let raw = std::mem::take(&mut self.partial);
        let text = raw.strip_suffix(b"\n").unwrap_or(&raw);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match crate::domain::input::parse_event(text, self.app.settings.limits) {
            Ok(event) => self.pending.push_back(Line { no: self.lines, bytes: raw.len(), event }),
            Err(r) => self.stop = Some(Stop { line: self.lines, error: r.into() }),
        }
        self.partial = raw;
        self.partial.clear();
    }

    /// Writes one answer line; false when the client is gone.
    async fn send<T: Serialize>(&self, v: &T) -> bool {
        let mut line = serde_json::to_vec(v).unwrap_or_default();
        line.push(b'\n');
        self.tx.send(Bytes::from(line)).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::Ack;

    /// The hand-written acknowledgement is serde's line, byte for byte, at the edges
    /// of every field's range.
    #[test]
    fn ack_line_is_serdes() {
        for (i, v) in [0i64, 1, 9, 10, 99_999, i64::MAX, i64::MIN, -1].into_iter().enumerate() {
            let ack = Ack {
                first_seq: v,
                last_seq: v.wrapping_add(7),
                count: i * 1_000,
                first_line: v.unsigned_abs(),
                last_line: u64::MAX - i as u64,
                replayed: i % 2 == 1,
            };
            let mut serdes = serde_json::to_vec(&ack).expect("json");
            serdes.push(b'\n');
            assert_eq!(String::from_utf8_lossy(&ack.line()), String::from_utf8_lossy(&serdes));
        }
    }
}
