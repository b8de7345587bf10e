//! `/readyz` (can this process serve: database and listener up) and `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::app::AppRef;

/// `GET /readyz`: 200 when the database answers within 2 s and the LISTEN connection
/// is up; 503 naming what is down otherwise (load balancers stop sending traffic).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = crate::http::openapi::Readiness),
        (status = 503, description = "Not ready: what is down", body = crate::http::openapi::Readiness),
    ))]
pub(crate) async fn ready(State(app): State<AppRef>) -> Response {
    let db = tokio::time::timeout(Duration::from_secs(2), async {
        let c = app.db.pool.get().await.ok()?;
        c.simple_query("SELECT 1").await.ok().map(|_| ())
    })
    .await
    .ok()
    .flatten()
    .is_some();
    let listener = app.live.listening();
    let status = if db && listener { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({"ready": db && listener, "database": db, "listener": listener}))).into_response()
}

/// `GET /metrics`: the OpenMetrics text format (Prometheus reads it).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)", content_type = "application/openmetrics-text", body = String)))]
pub(crate) async fn metrics(State(app): State<AppRef>) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], crate::metrics::render(&app)).into_response()
}

/// `GET /healthz`: the process answers (liveness; no database involved).
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "`ok`", body = String)))]
pub(crate) async fn alive() -> &'static str {
    "ok"
}
