//! `GET /v1/runs/{run_id}/stream`: the run's events as Server-Sent Events, catch-up
//! then live, resumable.
//!
//! Every event carries `id: <seq>`. A reconnect resumes after `Last-Event-ID` (which
//! wins over `?after_seq=`, since EventSource reconnects with its original URL). The
//! stream reads rows with `seq > cursor` through the one read path, waking on the live
//! hub, so history and live are the same loop. It ends after the run's terminal
//! lifecycle event; a reconnect to a finished run with nothing left gets 204, which
//! tells EventSource to stop.

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
use crate::auth::Principal;
use crate::domain::{Event, EventBody};
use crate::error::{Error, ErrorCode, Result};
use crate::storage::events::Filter;

/// Events read per round trip.
const PAGE: i64 = 500;
/// Keep-alive comment interval (seed 004 §5.1).
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Reconnect delay suggested to clients.
const RETRY: Duration = Duration::from_secs(2);
/// Longest wait without a wake-up before re-reading anyway.
const REREAD: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {
    #[serde(default)]
    after_seq: Option<i64>,
    #[serde(default, rename = "access_token")]
    _access_token: Option<String>,
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

/// `GET /v1/runs/{run_id}/stream[?after_seq=N]`
pub(crate) async fn stream(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<StreamParams>,
    headers: HeaderMap,
) -> Result<Response> {
    let cursor = resume_point(&headers, p.after_seq)?;
    let run = app.run(&who, &run_id).await?;
    if run.state.is_some_and(|s| s.is_terminal()) && run.last_seq <= cursor {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // Join the run's shared feed before catching up: a page read after this point
    // reaches us, and the catch-up covers everything before it.
    let pages = app.live.join(&app.db, &who.tenant_id, &run.run_id, cursor);
    let state =
        Tail { app, who, run_id: run.run_id, cursor, pages, catching_up: true, done: false, first: true };
    Ok(Sse::new(events(state))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response())
}

struct Tail {
    app: AppRef,
    who: Principal,
    run_id: String,
    cursor: i64,
    pages: tokio::sync::broadcast::Receiver<crate::live::Page>,
    /// Reading on our own (after joining, after a gap, after lagging) until caught up.
    catching_up: bool,
    done: bool,
    first: bool,
}

fn is_run_end(e: &Event) -> bool {
    e.child_id.is_none() && matches!(&e.body, EventBody::Lifecycle(l) if l.state.is_terminal())
}

fn events(state: Tail) -> impl Stream<Item = std::result::Result<SseEvent, Infallible>> {
    futures::stream::unfold(state, |mut t| async move {
        if t.done {
            return None;
        }
        let evs = next_events(&mut t).await?;
        let mut out = Vec::with_capacity(evs.len());
        let from = t.cursor;
        for e in evs.iter().filter(|e| e.seq > from) {
            let mut sse = SseEvent::default().id(e.seq.to_string()).event(e.body.type_name());
            if t.first {
                sse = sse.retry(RETRY);
                t.first = false;
            }
            match sse.json_data(e) {
                Ok(s) => out.push(Ok(s)),
                Err(err) => tracing::error!(error = %err, "encoding an event"),
            }
            t.cursor = e.seq;
            if is_run_end(e) {
                t.done = true;
                break;
            }
        }
        Some((futures::stream::iter(out), t))
    })
    .flatten()
}

/// The next events after the cursor: our own reads while catching up, then the shared
/// feed's pages. `None` ends the stream (the client resumes with Last-Event-ID).
async fn next_events(t: &mut Tail) -> Option<Vec<Event>> {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        if t.catching_up {
            t.app.live.feeds.count_read();
            match t.app.events(&t.who, &t.run_id, t.cursor, PAGE, &Filter::default()).await {
                Ok((_, evs)) if evs.is_empty() => t.catching_up = false,
                Ok((_, evs)) => return Some(evs),
                Err(e) => {
                    tracing::warn!(error = %e, run = %t.run_id, "stream read failed; closing");
                    return None;
                }
            }
        }
        match tokio::time::timeout(REREAD, t.pages.recv()).await {
            Ok(Ok(page)) => match page.first() {
                // A page that starts beyond our cursor: we joined between two reads.
                Some(first) if first.seq > t.cursor + 1 => t.catching_up = true,
                _ if page.last().is_some_and(|e| e.seq > t.cursor) => return Some(page.to_vec()),
                _ => {}
            },
            // Fell behind the feed's buffer: read on our own, then rejoin the flow.
            Ok(Err(RecvError::Lagged(_))) => t.catching_up = true,
            Ok(Err(RecvError::Closed)) => {
                t.pages = t.app.live.join(&t.app.db, &t.who.tenant_id, &t.run_id, t.cursor);
                t.catching_up = true;
            }
            // Quiet for a while: check the rows anyway (cheap, and covers a lost wake-up).
            Err(_) => t.catching_up = true,
        }
    }
}
