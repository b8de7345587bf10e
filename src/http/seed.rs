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
async fn stream(State(app): State<AppRef>, req: Request) -> Response {
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
async fn approve_plan(
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
