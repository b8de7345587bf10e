//! `GET /v1/runs/{run_id}/stream`: the run's events as Server-Sent Events, catch-up
//! then live, resumable.
//!
//! Every frame carries `id: <seq>` (for merged deltas, the last seq they cover). A
//! reconnect resumes after `Last-Event-ID` (which wins over `?after_seq=`, since
//! EventSource reconnects with its original URL). Events come from a [`Tail`], the
//! shared catch-up-then-live cursor. By default consecutive deltas of one message are
//! merged into at most one frame per 100 ms window (seed 004 R1); `?detail=full` sends
//! every event. Control events are never merged or delayed. The stream ends after the
//! run's terminal lifecycle event; a reconnect to a finished run with nothing left gets
//! 204, which tells EventSource to stop.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::extract::{Caller, Params};
use crate::app::AppRef;
use crate::error::{Error, ErrorCode, Result};
use crate::live::shape::{Aggregator, Frame, WINDOW};
use crate::live::Tail;

/// Keep-alive comment interval (seed 004 §5.1).
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Reconnect delay suggested to clients.
const RETRY: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {
    #[serde(default)]
    after_seq: Option<i64>,
    #[serde(default)]
    detail: Option<String>,
}

fn resume_point(headers: &HeaderMap, after_seq: Option<i64>) -> Result<i64> {
    let header = headers.get("last-event-id").map(|v| {
        v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()).filter(|n| *n >= 0).ok_or_else(|| {
            Error::reject(
                ErrorCode::InvalidParameter,
                "`Last-Event-ID` must be a seq (an integer, 0 or more)",
            )
        })
    });
    match (header, after_seq) {
        (Some(h), _) => h,
        (None, Some(a)) if a >= 0 => Ok(a),
        (None, Some(_)) => Err(Error::reject(ErrorCode::InvalidParameter, "`after_seq` must be 0 or more")),
        (None, None) => Ok(0),
    }
}

/// `GET /v1/runs/{run_id}/stream[?after_seq=N][&detail=full]`
pub(crate) async fn stream(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<StreamParams>,
    headers: HeaderMap,
) -> Result<Response> {
    let cursor = resume_point(&headers, p.after_seq)?;
    let raw = match p.detail.as_deref() {
        None | Some("default") => false,
        Some("full") => true,
        Some(other) => {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                format!("`detail` must be `full` or `default`, not `{other}`"),
            ))
        }
    };
    let run = app.run(&who, &run_id).await?;
    if run.state.is_some_and(|s| s.is_terminal()) && run.last_seq <= cursor {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let tail = Tail::new(app, who, run.run_id, cursor);
    let state =
        Sending { tail, agg: Aggregator::default(), window_end: None, raw, first: true, ended: false };
    Ok(Sse::new(frames(state))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response())
}

struct Sending {
    tail: Tail,
    agg: Aggregator,
    /// When the pending merged deltas must go out.
    window_end: Option<tokio::time::Instant>,
    /// `detail=full`: every event as it is, no merging.
    raw: bool,
    first: bool,
    ended: bool,
}

impl Sending {
    /// The next frames to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Vec<Frame>> {
        loop {
            if self.ended {
                return self.agg.flush().map(|f| vec![f]);
            }
            let batch = match self.window_end {
                Some(end) => match tokio::time::timeout_at(end, self.tail.next_batch()).await {
                    Ok(b) => b,
                    Err(_) => {
                        // The window closed: the merged deltas go out.
                        self.window_end = None;
                        return self.agg.flush().map(|f| vec![f]);
                    }
                },
                None => self.tail.next_batch().await,
            };
            let Some(batch) = batch else {
                self.ended = true;
                continue;
            };
            if self.raw {
                return Some(batch.into_iter().map(|e| Frame { first_seq: e.seq, event: e }).collect());
            }
            let mut out = vec![];
            for e in batch {
                out.extend(self.agg.push(e));
            }
            if !self.agg.has_pending() {
                self.window_end = None;
            } else if self.window_end.is_none() {
                self.window_end = Some(tokio::time::Instant::now() + WINDOW);
            }
            if !out.is_empty() {
                return Some(out);
            }
        }
    }
}

fn frames(state: Sending) -> impl Stream<Item = std::result::Result<SseEvent, Infallible>> {
    futures::stream::unfold(state, |mut s| async move {
        let frames = s.next().await?;
        let mut out = Vec::with_capacity(frames.len());
        for f in frames {
            let mut sse = SseEvent::default().id(f.event.seq.to_string()).event(f.event.body.type_name());
            if s.first {
                sse = sse.retry(RETRY);
                s.first = false;
            }
            match sse.json_data(f.to_json()) {
                Ok(e) => out.push(Ok(e)),
                Err(err) => tracing::error!(error = %err, "encoding an event"),
            }
        }
        Some((futures::stream::iter(out), s))
    })
    .flatten()
}
