//! `GET /v1/durable/runs/{run_id}`: a run's log as a Durable Stream (ElectricSQL's
//! protocol for offset-addressed resumable HTTP streams), read path, JSON mode, so
//! `@durable-streams/client`'s `stream()` reads and tails a run.
//!
//! - Messages are the stored events (the native envelope); bodies are JSON arrays.
//! - Offsets are opaque to clients: 16 digits, the seq of the last event covered
//!   (`0000000000000000` before the first). `-1` is the start, `now` the current end.
//! - Catch-up (no `live`): up to [`PAGE`] events after the offset, with
//!   `Stream-Next-Offset`, `Stream-Up-To-Date` when they reach the run's last event,
//!   `Stream-Closed: true` when the run has also ended, an `ETag` naming the range
//!   (`If-None-Match` gets `304`), and `Cache-Control` (a page behind the end never
//!   changes: cacheable for a minute by the client only, since it needs the key; at the
//!   end: `no-store`).
//! - `live=long-poll`: the same when there is something after the offset; otherwise it
//!   waits up to [`LONG_POLL`] for the next commit, then answers `204` with the offset
//!   (`Stream-Up-To-Date`; `Stream-Closed` once the run has ended).
//! - `live=sse`: `event: data` frames (a JSON array of events each) and after each an
//!   `event: control` `{streamNextOffset, upToDate, streamClosed}`; the stream ends after
//!   the run's terminal event (`streamClosed: true`).
//!
//! Events come from the one read path (`App::events`, and a `Tail` for live reads).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;

use super::extract::{Caller, Params};
use crate::app::AppRef;
use crate::error::{Error, ErrorCode, Result};
use crate::live::Tail;

/// Events one response holds at most.
const PAGE: i64 = 1000;
/// How long a long-poll waits for a commit before answering `204`.
const LONG_POLL: Duration = Duration::from_secs(20);

const NEXT_OFFSET: &str = "stream-next-offset";
const UP_TO_DATE: &str = "stream-up-to-date";
const CLOSED: &str = "stream-closed";

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct DurableParams {
    /// Where to read from: `-1` (the start), an offset this service sent, or `now`.
    #[serde(default)]
    offset: Option<String>,
    /// `long-poll` or `sse` to wait for new events; absent for catch-up.
    #[serde(default)]
    live: Option<String>,
    /// Echoed by clients for CDN request collapsing; not used.
    #[serde(default)]
    #[allow(dead_code)]
    cursor: Option<String>,
}

/// The offset of the position after `seq`.
fn offset(seq: i64) -> String {
    format!("{seq:016}")
}

/// The seq an offset names (`now` resolves to `last`).
fn parse_offset(s: Option<&str>, last: i64) -> Result<i64> {
    let bad = || {
        Error::reject(
            ErrorCode::InvalidParameter,
            "`offset` must be -1, now, or a Stream-Next-Offset this stream sent",
        )
    };
    let seq = match s {
        None | Some("-1") => 0,
        Some("now") => last,
        Some(s) if s.len() == 16 && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().map_err(|_| bad())?,
        Some(_) => return Err(bad()),
    };
    if seq > last {
        return Err(Error::reject(
            ErrorCode::CursorBeyondEnd,
            format!("offset {seq} is beyond the run's last event (seq {last})"),
        ));
    }
    Ok(seq)
}

/// `GET /v1/durable/runs/{run_id}?offset=&live=`
#[utoipa::path(get, path = "/v1/durable/runs/{run_id}", tag = "clients", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), DurableParams, ("If-None-Match" = Option<String>, Header, description = "An `ETag` of this range: `304` when it is unchanged")),
    responses(
        (status = 200, description = "Durable Streams JSON mode: a JSON array of events, with `Stream-Next-Offset` (and `Stream-Up-To-Date`, `Stream-Closed`); with `live=sse`, `data` and `control` events", body = Vec<crate::http::openapi::Event>),
        (status = 204, description = "A long-poll that saw no commit in time (`Stream-Next-Offset` unchanged)"),
        (status = 304, description = "Unchanged since the `ETag` sent"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn read(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<DurableParams>,
    headers: HeaderMap,
) -> super::error::ApiResult<Response> {
    let run = app.run(&who, &run_id).await?;
    let from = parse_offset(p.offset.as_deref(), run.last_seq)?;
    match p.live.as_deref() {
        None => Ok(page(&app, &who, &run.run_id, from, &headers).await?),
        Some("long-poll") => {
            let ended = run.state.is_some_and(|s| s.is_terminal());
            if from < run.last_seq {
                return Ok(page(&app, &who, &run.run_id, from, &headers).await?);
            }
            if ended {
                return Ok(empty(from, true));
            }
            let mut tail = Tail::new(app.live.clone(), who.clone(), run.run_id.clone(), from);
            match tokio::time::timeout(LONG_POLL, tail.next_batch()).await {
                Ok(Some(_)) => Ok(page(&app, &who, &run.run_id, from, &headers).await?),
                // Timed out, or the tail ended (shutdown, revoked key): the client asks again.
                _ => Ok(empty(from, false)),
            }
        }
        Some("sse") => Ok(sse(&app, who, run, from)),
        Some(other) => Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!("`live` must be long-poll or sse, not `{}`", other.chars().take(40).collect::<String>()),
        )
        .into()),
    }
}

/// Sets the protocol's headers.
fn stream_headers(h: &mut HeaderMap, next: i64, up_to_date: bool, closed: bool) {
    h.insert(NEXT_OFFSET, HeaderValue::from_str(&offset(next)).unwrap_or(HeaderValue::from_static("")));
    if up_to_date {
        h.insert(UP_TO_DATE, HeaderValue::from_static("true"));
    }
    if closed {
        h.insert(CLOSED, HeaderValue::from_static("true"));
    }
}

/// `204`: nothing after `from` (yet).
fn empty(from: i64, closed: bool) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    stream_headers(r.headers_mut(), from, true, closed);
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// One page of events after `from`.
async fn page(
    app: &AppRef,
    who: &crate::auth::Principal,
    run_id: &str,
    from: i64,
    headers: &HeaderMap,
) -> Result<Response> {
    let (run, events) = app.events(who, run_id, from, PAGE, &Default::default()).await?;
    let next = events.last().map_or(from, |e| e.seq);
    let up_to_date = next >= run.last_seq;
    let closed = up_to_date && run.state.is_some_and(|s| s.is_terminal());
    let etag = format!("\"{}:{from}:{next}{}\"", run.run_id, if closed { ":closed" } else { "" });
    let cache = if up_to_date && !closed { "no-store" } else { "private, max-age=60" };
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        stream_headers(r.headers_mut(), next, up_to_date, closed);
        r.headers_mut()
            .insert(header::ETAG, HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("")));
        return Ok(r);
    }
    let body =
        serde_json::to_vec(&events).map_err(|e| Error::Internal(anyhow::anyhow!("encoding events: {e}")))?;
    let mut r = Response::new(axum::body::Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::ETAG, HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("")));
    stream_headers(h, next, up_to_date, closed);
    Ok(r)
}

/// One SSE frame.
fn frame(event: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

fn control(next: i64, up_to_date: bool, closed: bool) -> Bytes {
    let v =
        serde_json::json!({"streamNextOffset": offset(next), "upToDate": up_to_date, "streamClosed": closed});
    frame("control", &v.to_string())
}

/// `live=sse`: data and control events from a [`Tail`], ending after the run's end.
fn sse(app: &AppRef, who: crate::auth::Principal, run: crate::storage::RunInfo, from: i64) -> Response {
    let ended = run.state.is_some_and(|s| s.is_terminal());
    let at_end = from >= run.last_seq;
    let tail = Tail::new(app.live.clone(), who, run.run_id, from);
    // Caught up at the start: say so at once (and, for an ended run, that it is closed).
    let first = at_end.then(|| control(from, true, ended));
    let state = (tail, first, ended && at_end);
    let body = futures::stream::unfold(state, |(mut tail, first, finished)| async move {
        if let Some(c) = first {
            return Some((c, (tail, None, finished)));
        }
        if finished {
            return None;
        }
        let batch = tail.next_batch().await?;
        let events = batch.events();
        let closed = events.last().is_some_and(crate::domain::Event::is_run_end);
        let next = tail.cursor();
        let json = serde_json::to_string(events).unwrap_or_else(|_| "[]".to_owned());
        let mut chunk = frame("data", &json).to_vec();
        chunk.extend_from_slice(&control(next, tail.behind() == 0, closed));
        Some((Bytes::from(chunk), (tail, None, closed)))
    });
    let mut r = super::sse::response(body);
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
