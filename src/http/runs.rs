//! `/v1/runs`: create runs, append events, read runs and their events back.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::{framing, read_body, Caller, Params};
use crate::app::AppRef;
use crate::domain::input::parse_batch;
use crate::error::{Error, ErrorCode};

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRun {
    #[serde(default)]
    parent_run_id: Option<String>,
}

/// `POST /v1/runs` with an optional `{"parent_run_id": ...}` body.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", security(("bearer" = [])),
    request_body(content = Option<CreateRun>, description = "Optional: `parent_run_id` makes a sub-run", content_type = "application/json"),
    responses(
        (status = 201, description = "The new run", body = crate::http::openapi::Run),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn create(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    let bytes = read_body(&headers, body, 64 << 10).await?;
    let req: CreateRun = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreateRun::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::reject(ErrorCode::BodyMalformed, format!("invalid body: {e}")))?
    };
    let run = app.create_run(&who, req.parent_run_id.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(run)).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    /// Page size, 1-1000 (default 20).
    #[serde(default)]
    limit: Option<i64>,
    /// Cursor: the `next_before` of the previous page (a run id); runs older than it.
    #[serde(default)]
    before: Option<String>,
    /// Only runs in this state.
    #[serde(default)]
    #[param(value_type = Option<crate::http::openapi::RunState>)]
    state: Option<crate::domain::lifecycle::RunState>,
    /// Only runs created at or after this time (RFC 3339).
    #[serde(default)]
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only runs created before this time (RFC 3339).
    #[serde(default)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// A page of runs, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RunPage {
    #[schema(value_type = Vec<crate::http::openapi::Run>)]
    runs: Vec<crate::storage::RunInfo>,
    /// The cursor for the next page (`?before=`), or null on the last page.
    next_before: Option<String>,
}

/// `GET /v1/runs`: the caller's runs, newest first; the same query as GraphQL's `runs`.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", security(("bearer" = [])), params(ListParams),
    responses(
        (status = 200, description = "A page of runs, newest first", body = RunPage),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn list_runs(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Params(p): Params<ListParams>,
) -> super::error::ApiResult<Response> {
    let limit = p.limit.unwrap_or(20);
    if !(1..=1000).contains(&limit) {
        return Err(Error::reject(ErrorCode::InvalidParameter, "`limit` must be between 1 and 1000").into());
    }
    let before_run_id = p
        .before
        .map(|c| crate::storage::runs::parse_run_id(&c).map(std::borrow::Cow::into_owned))
        .transpose()?;
    let q = crate::storage::runs::RunQuery {
        state: p.state,
        created_after: p.created_after,
        created_before: p.created_before,
        before_run_id,
        limit: limit + 1,
    };
    let mut runs = app.list_runs(&who, &q).await?;
    let more = runs.len() > limit as usize;
    runs.truncate(limit as usize);
    let next_before = if more { runs.last().map(|r| r.run_id.clone()) } else { None };
    Ok(Json(RunPage { runs, next_before }).into_response())
}

/// `GET /v1/runs/{run_id}`
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs", security(("bearer" = [])), params(("run_id" = String, Path, description = "The run id (a ULID)")),
    responses(
        (status = 200, description = "The run", body = crate::http::openapi::Run),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn get(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
) -> super::error::ApiResult<Response> {
    Ok(Json(app.run(&who, &run_id).await?).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppendParams {
    /// The append succeeds only if the run's last seq is still this (must agree with the body's, if both are given).
    #[serde(default)]
    expected_last_seq: Option<i64>,
}

/// `POST /v1/runs/{run_id}/events` with a JSON array, `{"events": [...]}` or NDJSON.
#[utoipa::path(post, path = "/v1/runs/{run_id}/events", tag = "events", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), AppendParams),
    request_body(content(
        (crate::http::openapi::AppendBody = "application/json"),
        (String = "application/x-ndjson"),
    ), description = "A JSON array of events, `{\"events\": [...], \"expected_last_seq\": n}`, or NDJSON (one event per line)"),
    responses(
        (status = 201, description = "Written", body = crate::http::openapi::Appended),
        (status = 200, description = "An idempotent retry, answered from the stored events (`replayed: true`)", body = crate::http::openapi::Appended),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn append(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(params): Params<AppendParams>,
    // The request itself rather than a `HeaderMap` extractor, which clones every header.
    req: Request,
) -> super::error::ApiResult<Response> {
    let (parts, body) = req.into_parts();
    let framing = framing(&parts.headers)?;
    let bytes = read_body(&parts.headers, body, app.settings.max_body_bytes).await?;
    let mut batch = parse_batch(&bytes, framing, app.settings.limits)?;
    if let Some(expected) = params.expected_last_seq {
        if batch.expected_last_seq.is_some_and(|b| b != expected) {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                "`expected_last_seq` differs between the query string and the body",
            )
            .into());
        }
        batch.expected_last_seq = Some(expected);
    }
    let out = app.append(&who, &run_id, batch).await?;
    if !out.replayed {
        app.metrics.append_bytes.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    let status = if out.replayed { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(out)).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadParams {
    /// Events with `seq` greater than this (default 0).
    #[serde(default)]
    after_seq: i64,
    /// Page size, 1..10000 (default 1000).
    #[serde(default = "default_limit")]
    limit: i64,
}

/// A page of the log; `next_after_seq` is the cursor for the next page.
#[derive(Serialize)]
struct EventPage {
    run_id: String,
    last_seq: i64,
    next_after_seq: i64,
    events: Vec<crate::domain::Event>,
}

fn default_limit() -> i64 {
    1000
}

/// `GET /v1/runs/{run_id}/events?after_seq=&limit=`: a page of the log, in seq order.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", tag = "events", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), ReadParams),
    responses(
        (status = 200, description = "A page of the log in seq order", body = crate::http::openapi::EventPage),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn list(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<ReadParams>,
) -> super::error::ApiResult<Response> {
    let (run, events) = app.events(&who, &run_id, p.after_seq, p.limit, &Default::default()).await?;
    let next = events.last().map_or(p.after_seq, |e| e.seq);
    Ok(Json(EventPage { run_id: run.run_id, last_seq: run.last_seq, next_after_seq: next, events })
        .into_response())
}

/// `GET /v1/runs/{run_id}/view`: the run's views, as the reducer folds them.
#[utoipa::path(get, path = "/v1/runs/{run_id}/view", tag = "runs", security(("bearer" = [])), params(("run_id" = String, Path, description = "The run id (a ULID)")),
    responses(
        (status = 200, description = "The run's views, folded by the reducer", body = crate::http::openapi::View),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn view(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
) -> super::error::ApiResult<Response> {
    let (_, view) = app.view(&who, &run_id).await?;
    Ok(Json(&*view).into_response())
}
