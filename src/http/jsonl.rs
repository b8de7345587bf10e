//! JSONL: `GET /v1/runs/{run_id}/events.jsonl`, `GET /v1/events.jsonl` (tenant-wide)
//! and `POST /v1/runs/import`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::extract::{read_body, Caller, Params};
use crate::app::AppRef;
use crate::dialect::Format;
use crate::error::{Error, ErrorCode, Result};
use crate::export::{export_run, export_tenant, RunExport, CHANNEL};
use crate::storage::events::Filter;

const JSONL: &str = "application/x-ndjson";

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportParams {
    /// First seq (inclusive).
    #[serde(default)]
    from_seq: Option<i64>,
    /// Last seq (inclusive).
    #[serde(default)]
    to_seq: Option<i64>,
    /// Only this child's events.
    #[serde(default)]
    child_id: Option<String>,
    /// Comma-separated types.
    #[serde(default)]
    types: Option<String>,
    /// The dialect: native (default; lines are the stored envelope) or another.
    #[serde(default)]
    format: Option<String>,
}

/// A body fed by a background export through a bounded channel (constant memory).
///
/// The status line has gone out before the export can fail, so a failure (the
/// database went away, say) ends the body with an error: hyper then drops the
/// connection without the chunked body's last chunk, and every HTTP client reports a
/// truncated transfer instead of a clean end. A clean end also carries the native
/// format's end line (see [`crate::export`]).
fn streamed<F>(produce: F) -> Response
where
    F: FnOnce(tokio::sync::mpsc::Sender<bytes::Bytes>) -> futures::future::BoxFuture<'static, Result<u64>>,
{
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
    let job = tokio::spawn(produce(tx));
    // The request's: the body is polled outside it (`super::traced`).
    let span = tracing::Span::current();
    let outcome = futures::stream::once(async move {
        let failed = match job.await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(parent: &span, error = %failed, "JSONL export stopped early; cutting the response off");
        Some(Err(std::io::Error::other(format!("export failed: {failed}"))))
    })
    .filter_map(futures::future::ready);
    let data = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
    ([(header::CONTENT_TYPE, JSONL)], Body::from_stream(data.chain(outcome))).into_response()
}

use futures::{FutureExt, StreamExt};

/// `GET /v1/runs/{run_id}/events.jsonl[?from_seq=][&to_seq=][&child_id=][&types=a,b][&format=]`
#[utoipa::path(get, path = "/v1/runs/{run_id}/events.jsonl", tag = "jsonl", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), ExportParams),
    responses(
        (status = 200, description = "The run's log as JSONL; a native export ends with its `export_end` line", content_type = "application/x-ndjson", body = String),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 416, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn export(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<ExportParams>,
) -> super::error::ApiResult<Response> {
    let opts = RunExport {
        from_seq: p.from_seq,
        to_seq: p.to_seq,
        filter: Filter::new(
            p.types
                .map(|t| t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()),
            p.child_id,
        )?,
        format: Format::parse(p.format.as_deref())?,
    };
    opts.check()?;
    // Errors that can be answered with a status come before the body starts.
    let run = app.run(&who, &run_id).await?;
    opts.check_run(&run)?;
    Ok(streamed(move |tx| export_run(app, who, run, opts, tx).boxed()))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantParams {
    /// Events stored at or after this time (RFC 3339).
    #[serde(default)]
    since: Option<String>,
    /// Events stored before this time (RFC 3339).
    #[serde(default)]
    until: Option<String>,
}

fn time(name: &str, v: Option<&str>) -> Result<Option<DateTime<Utc>>> {
    match v {
        None => Ok(None),
        Some(s) => DateTime::parse_from_rfc3339(s).map(|t| Some(t.with_timezone(&Utc))).map_err(|_| {
            Error::reject(
                ErrorCode::InvalidParameter,
                format!("`{name}` must be an RFC 3339 time such as 2026-01-31T00:00:00Z"),
            )
        }),
    }
}

/// `GET /v1/events.jsonl[?since=][&until=]`: every event of the caller's tenant stored
/// in `[since, until)`, by run and seq.
#[utoipa::path(get, path = "/v1/events.jsonl", tag = "jsonl", security(("bearer" = [])), params(TenantParams),
    responses(
        (status = 200, description = "Every event of the tenant in [since, until), by run and seq, as JSONL", content_type = "application/x-ndjson", body = String),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn export_all(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Params(p): Params<TenantParams>,
) -> super::error::ApiResult<Response> {
    who.require(crate::auth::Scope::Read)?;
    let since = time("since", p.since.as_deref())?;
    let until = time("until", p.until.as_deref())?;
    if since.zip(until).is_some_and(|(s, u)| u < s) {
        return Err(Error::reject(ErrorCode::InvalidParameter, "`until` must not be before `since`").into());
    }
    Ok(streamed(move |tx| export_tenant(app, who, since, until, tx).boxed()))
}

/// `POST /v1/runs/import` with an export (JSONL): a new run with the same log.
#[utoipa::path(post, path = "/v1/runs/import", tag = "jsonl", security(("bearer" = [])),
    request_body(content = String, content_type = "application/x-ndjson", description = "A native JSONL export"),
    responses(
        (status = 201, description = "The new run", body = crate::http::openapi::Run),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn import(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    who.require(crate::auth::Scope::Write)?;
    let bytes = read_body(&headers, body, app.settings.max_import_bytes).await?;
    let run = app.import(&who, &bytes).await?;
    Ok((StatusCode::CREATED, Json(run)).into_response())
}
