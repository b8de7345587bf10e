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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportParams {
    #[serde(default)]
    from_seq: Option<i64>,
    #[serde(default)]
    to_seq: Option<i64>,
    #[serde(default)]
    child_id: Option<String>,
    /// Comma-separated types.
    #[serde(default)]
    types: Option<String>,
    #[serde(default)]
    format: Option<String>,
}

/// A body fed by a background export through a bounded channel (constant memory).
fn streamed<F>(produce: F) -> Response
where
    F: FnOnce(tokio::sync::mpsc::Sender<bytes::Bytes>) -> futures::future::BoxFuture<'static, Result<u64>>,
{
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
    let job = produce(tx);
    tokio::spawn(async move {
        if let Err(e) = job.await {
            // The status line is gone; the client sees a body cut short.
            tracing::warn!(error = %e, "JSONL export stopped early");
        }
    });
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    ([(header::CONTENT_TYPE, JSONL)], body).into_response()
}

use futures::{FutureExt, StreamExt};

/// `GET /v1/runs/{run_id}/events.jsonl[?from_seq=][&to_seq=][&child_id=][&types=a,b][&format=]`
pub(crate) async fn export(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<ExportParams>,
) -> Result<Response> {
    let opts = RunExport {
        from_seq: p.from_seq,
        to_seq: p.to_seq,
        filter: Filter {
            types: p
                .types
                .map(|t| t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()),
            child_id: p.child_id,
        },
        format: Format::parse(p.format.as_deref())?,
    };
    opts.check()?;
    // Errors that can be answered with a status come before the body starts.
    let run = app.run(&who, &run_id).await?;
    Ok(streamed(move |tx| export_run(app, who, run, opts, tx).boxed()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantParams {
    #[serde(default)]
    since: Option<String>,
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
pub(crate) async fn export_all(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Params(p): Params<TenantParams>,
) -> Result<Response> {
    who.require(crate::auth::Scope::Read)?;
    let since = time("since", p.since.as_deref())?;
    let until = time("until", p.until.as_deref())?;
    if since.zip(until).is_some_and(|(s, u)| u < s) {
        return Err(Error::reject(ErrorCode::InvalidParameter, "`until` must not be before `since`"));
    }
    Ok(streamed(move |tx| export_tenant(app, who, since, until, tx).boxed()))
}

/// `POST /v1/runs/import` with an export (JSONL): a new run with the same log.
pub(crate) async fn import(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    who.require(crate::auth::Scope::Write)?;
    let bytes = read_body(&headers, body, app.settings.max_import_bytes).await?;
    let run = app.import(&who, &bytes).await?;
    Ok((StatusCode::CREATED, Json(run)).into_response())
}
