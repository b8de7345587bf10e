//! Seed 004's paths (the Koder Agent Stream Protocol), served by the same handlers and
//! the same key checks as ours:
//!
//! - `GET /v1/agent/runs/{run_id}/stream`: `GET /v1/runs/{run_id}/stream` (SSE), or, with
//!   `Upgrade: websocket`, the seed's WebSocket profile ([`super::ws`]) on the same tail;
//! - `POST /v1/agent/runs/{run_id}/approve_plan`: the GraphQL `approvePlan` mutation
//!   (AICORE-126's planning gate) over REST.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::handler::Handler;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::extract::{read_body, Caller};
use crate::app::{AppRef, Control};
use crate::error::{Error, ErrorCode};

/// The seed's routes, merged into the service's router.
pub(super) fn routes() -> Router<AppRef> {
    Router::new()
        .route("/v1/agent/runs/{run_id}/stream", get(stream))
        .route("/v1/agent/runs/{run_id}/approve_plan", post(approve_plan))
}

/// True for a WebSocket handshake (`Upgrade: websocket`, any case).
fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket")))
}

/// One path, two profiles (seed 004 §5.1 and §5.2): a WebSocket handshake gets the
/// WebSocket profile, anything else our SSE stream, each with its own extractors.
#[utoipa::path(get, path = "/v1/agent/runs/{run_id}/stream", tag = "seed 004", security(("bearer" = []), ("access_token" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"),
        ("after_seq" = Option<String>, Query, description = "Resume after this seq or stream id"),
        ("detail" = Option<String>, Query, description = "`full` for raw mode (every event), `default` for merged deltas"),
        ("format" = Option<String>, Query, description = "A dialect (SSE only): native, multica, chunks, hier, typed, agui, vercel"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this stream position (wins over `after_seq`)"),
        ("Detail" = Option<String>, Header, description = "`full` in a WebSocket handshake: raw mode")),
    responses(
        (status = 200, description = "Server-Sent Events, as `GET /v1/runs/{run_id}/stream`", content_type = "text/event-stream", body = String),
        (status = 101, description = "The WebSocket profile (subprotocol `koder-agent-stream-v1`): one text frame per item, the native envelope"),
        (status = 204, description = "The run has ended and nothing is after the cursor"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 416, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn stream(State(app): State<AppRef>, req: Request) -> Response {
    if is_websocket(req.headers()) {
        super::ws::upgrade.call(req, app).await
    } else {
        super::stream::stream.call(req, app).await
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/agent/runs/{run_id}/approve_plan` with an optional `{"reason": "..."}`:
/// writes `plan.decision` (approved) and `run.lifecycle` → `running` under the run's
/// lock, as `approvePlan` does; answers with the run.
#[utoipa::path(post, path = "/v1/agent/runs/{run_id}/approve_plan", tag = "seed 004", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)")),
    request_body(content = Object, content_type = "application/json", description = "Optional: `{\"reason\": \"...\"}`"),
    responses(
        (status = 200, description = "The plan is approved and the run is running again: the run", body = Object),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn approve_plan(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    let bytes = read_body(&headers, body, 64 << 10).await?;
    let req: ApproveBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        ApproveBody::default()
    } else {
        let malformed =
            |e: serde_json::Error| Error::reject(ErrorCode::BodyMalformed, format!("invalid body: {e}"));
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).map_err(malformed)?;
        crate::domain::text::check_json("body", &mut v)?;
        serde_json::from_value(v).map_err(malformed)?
    };
    app.control(&who, &run_id, Control::ApprovePlan(req.reason)).await?;
    Ok(Json(app.run(&who, &run_id).await?).into_response())
}
