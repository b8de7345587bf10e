//! `GET /v1/runs/{run_id}/replay?speed=N`: a stored run as SSE at N× the pace it was
//! recorded at, in any dialect, resumable with `Last-Event-ID` like the live stream.
//! It covers the log as stored when the request came.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::extract::{Caller, Params};
use super::stream::{resume_point, sse_response, Sending, Source};
use crate::app::{check_cursor, AppRef, Shedding};
use crate::auth::Principal;
use crate::dialect::Format;
use crate::domain::Event;
use crate::error::{Error, ErrorCode};
use crate::live::shed::Shedder;
use crate::live::Batch;
use crate::storage::events::Filter;

/// Highest replay speed.
const MAX_SPEED: f64 = 10_000.0;
/// Events read per page.
const PAGE: i64 = 500;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayParams {
    /// Pace: N times the recorded pace, > 0 and at most 10000 (default 1).
    #[serde(default)]
    speed: Option<f64>,
    /// Resume after this stream position (`Last-Event-ID` wins).
    #[serde(default)]
    after_seq: Option<String>,
    /// The dialect: native (default), multica, chunks, hier, typed, agui or vercel.
    #[serde(default)]
    format: Option<String>,
}

/// Reads the stored log in pages and hands out one event at a time, sleeping for the
/// recorded gap divided by the speed.
struct Paced {
    app: AppRef,
    who: Principal,
    run_id: String,
    cursor: i64,
    upto: i64,
    speed: f64,
    page: std::collections::VecDeque<Event>,
    last_ts: Option<DateTime<Utc>>,
    /// The request's span: the stream is polled outside it (`super::traced`).
    span: tracing::Span,
}

impl Source for Paced {
    async fn next_batch(&mut self) -> Option<Batch> {
        let mut stopping = self.app.stopping();
        if *stopping.borrow_and_update() {
            return None;
        }
        if self.page.is_empty() {
            if self.cursor >= self.upto {
                return None;
            }
            let limit = PAGE.min(self.upto - self.cursor);
            match self.app.events(&self.who, &self.run_id, self.cursor, limit, &Filter::default()).await {
                Ok((_, evs)) if !evs.is_empty() => self.page.extend(evs),
                Ok(_) => return None,
                Err(e) => {
                    tracing::warn!(parent: &self.span, error = %e, "replay read failed; closing (resume with Last-Event-ID)");
                    return None;
                }
            }
        }
        let e = self.page.pop_front()?;
        if let Some(prev) = self.last_ts {
            let gap = (e.ts - prev).to_std().unwrap_or_default();
            // `gap / speed` overflows a Duration at tiny speeds (`1e-300`), where
            // `div_f64` panics: such a speed asks for an endless wait, so wait that.
            let wait = Duration::try_from_secs_f64(gap.as_secs_f64() / self.speed).unwrap_or(Duration::MAX);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // Shutting down: end now; the client resumes after its last id.
                _ = stopping.changed() => return None,
            }
        }
        self.last_ts = Some(e.ts);
        self.cursor = e.seq;
        Some(Batch::from(vec![e]))
    }

    fn behind(&self, _seq: i64) -> i64 {
        0
    }
}

/// `GET /v1/runs/{run_id}/replay[?speed=N][&format=][&after_seq=]`
#[utoipa::path(get, path = "/v1/runs/{run_id}/replay", tag = "live", security(("bearer" = []), ("access_token" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), ReplayParams, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this stream position (wins over `after_seq`)")),
    responses(
        (status = 200, description = "The stored run as Server-Sent Events, paced", content_type = "text/event-stream", body = String),
        (status = 204, description = "Nothing is after the cursor"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 416, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn replay(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<ReplayParams>,
    headers: HeaderMap,
) -> super::error::ApiResult<Response> {
    let speed = p.speed.unwrap_or(1.0);
    if !(speed > 0.0 && speed <= MAX_SPEED) {
        return Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!("`speed` must be more than 0 and at most {MAX_SPEED}"),
        )
        .into());
    }
    let cursor = resume_point(&headers, p.after_seq.as_deref())?;
    let format = Format::parse(p.format.as_deref())?;
    let run = app.run(&who, &run_id).await?;
    check_cursor(&run, &cursor)?;
    if run.last_seq <= cursor.complete_seq() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let base = cursor.complete_seq();
    let enc = app.encoding(&who, &run, format, &cursor).await?;
    let source = Paced {
        app,
        who,
        run_id: run.run_id.clone(),
        cursor: base,
        upto: run.last_seq,
        speed,
        page: Default::default(),
        last_ts: None,
        span: tracing::Span::current(),
    };
    // Replay shows every event at its pace: no merging, no shedding.
    let shedder = Shedder::new(Shedding::default(), false);
    Ok(sse_response(Sending::new(source, enc, true, shedder), format))
}
