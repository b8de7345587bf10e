//! The HTTP transport: routes, middleware and the error mapping; also the run
//! inspector's page at `/ui/` (`ui`).

mod agui;
mod append_stream;
mod bus;
mod chat;
mod durable;
mod edge;
pub mod error;
pub mod extract;
pub mod grpc;
mod health;
mod jsonl;
mod keys;
pub mod openapi;
mod replay;
mod runs;
mod seed;
mod sse;
mod stream;
mod traced;
mod ui;
mod ws;

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use crate::app::AppRef;
use crate::error::{Error, ErrorCode};

static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Builds the whole HTTP service: REST routes, GraphQL, health.
pub fn router(app: AppRef) -> Router {
    let cors = cors(&app.settings.cors_origins);
    Router::new()
        .route("/healthz", get(health::alive))
        .route("/readyz", get(health::ready))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/schema/events.json", get(openapi::events_schema))
        .route("/v1/runs", post(runs::create).get(runs::list_runs))
        .route("/v1/runs/{run_id}", get(runs::get))
        .route("/v1/runs/{run_id}/events", post(runs::append).get(runs::list))
        .route("/v1/runs/{run_id}/events/stream", post(append_stream::append_stream))
        .route("/v1/runs/{run_id}/view", get(runs::view))
        .route("/v1/runs/{run_id}/stream", get(stream::stream))
        .route("/v1/runs/{run_id}/replay", get(replay::replay))
        .route("/v1/runs/{run_id}/events.jsonl", get(jsonl::export))
        .route("/v1/runs/import", post(jsonl::import))
        .route("/v1/events.jsonl", get(jsonl::export_all))
        .route("/v1/keys", get(keys::list).post(keys::create))
        .route("/v1/keys/{key_id}", axum::routing::delete(keys::revoke))
        .route("/v1/agui", post(agui::run))
        .route("/v1/durable/runs/{run_id}", get(durable::read))
        .route("/v1/chat", post(chat::send))
        .route("/v1/chat/{run_id}/stream", get(chat::resume))
        .merge(seed::routes())
        .merge(ui::routes())
        .merge(grpc::routes())
        .merge(crate::graphql::routes())
        // After every route: axum gives this to the routes present when it is called.
        .method_not_allowed_fallback(|method: Method| async move {
            error::HttpError::from(Error::reject(
                ErrorCode::MethodNotAllowed,
                format!("this route does not answer {method}; the Allow header lists the methods it does"),
            ))
        })
        .fallback(|| async {
            error::HttpError::from(Error::reject(
                ErrorCode::NotFound,
                "no such route; see the README for the API",
            ))
        })
        .with_state(app.clone())
        // One `layer` call for the whole stack: each call wraps every route in a box of
        // its own, cloned and called through on every request (six of them cost a
        // `GET /healthz` about as much as the request itself; docs/benchmarks-log.md,
        // 2026-11-30 15:07). Outermost first.
        .layer(
            tower::ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(REQUEST_ID.clone(), MakeRequestUuid))
                .layer(traced::TracedLayer::new(REQUEST_ID.clone()))
                .layer(PropagateRequestIdLayer::new(REQUEST_ID.clone()))
                .layer(cors)
                .layer(edge::EdgeLayer::new(app.metrics.clone())),
        )
}

fn cors(origins: &Option<Vec<String>>) -> CorsLayer {
    // `*` in the list means any origin (tower-http refuses it inside a list).
    let allow = match origins {
        Some(list) if !list.iter().any(|o| o == "*") => {
            AllowOrigin::list(list.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
        }
        _ => AllowOrigin::any(),
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([REQUEST_ID.clone()])
        .max_age(Duration::from_secs(600))
}
