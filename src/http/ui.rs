//! The run inspector: a browser page at `/ui/` (a run at `/ui/runs/{run_id}`) and the
//! stateless fold it uses to replay a JSONL export from disk (`POST /v1/fold`).
//!
//! The page is hand-written HTML, CSS and JavaScript (ES modules) under `src/http/ui/`,
//! built into the binary with `include_str!`: no CDN, no network, and no npm or bundler in
//! the build (a crate such as rust-embed would add a proc-macro for four files).
//!
//! The page never folds events: it renders the views the server's reducer produces
//! (`runView` over GraphQL WebSocket, or this module's fold for a file), applying each
//! `ViewUpdate` by id as the update rules in `projection::updates` say.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use super::extract::{read_body, Caller};
use crate::app::AppRef;
use crate::domain::{Event, Origin, Resolution, RunGuard};
use crate::error::{Error, ErrorCode};
use crate::projection::{updates, RunView};

/// The page's shell: the same for the list and for a run (the script reads the path).
const INDEX: &str = include_str!("ui/index.html");

/// The page's scripts and styles: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", "text/javascript; charset=utf-8", include_str!("ui/app.js")),
    ("view.js", "text/javascript; charset=utf-8", include_str!("ui/view.js")),
    ("gqlws.js", "text/javascript; charset=utf-8", include_str!("ui/gqlws.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("ui/style.css")),
];

/// Largest JSONL body `POST /v1/fold` takes. The answer carries every update (a
/// message's update holds its whole text so far), so it is kept well under the import's
/// limit: a bigger export is imported (`POST /v1/runs/import`) and replayed from there.
pub const FOLD_LIMIT: usize = 16 << 20;

/// Largest answer `POST /v1/fold` builds. A message's update carries its whole text so
/// far, so the answer can grow with the square of a message's length: a 16 MiB file of
/// one-character deltas would make tens of GB. Past this the fold stops and refuses.
pub const FOLD_ANSWER_LIMIT: usize = 64 << 20;

/// Folds running at once; the rest wait their turn. Each holds its body and answer
/// (up to 80 MiB), so a burst of them is bounded in memory as well as in CPU.
static FOLDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// A strong validator for a body: the page and its assets change only with the binary.
fn etag(body: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    body.hash(&mut h);
    format!("\"{:016x}\"", h.finish())
}

/// A static body with its type, revalidated on every use (`no-cache` + ETag): the
/// names carry no version, so a browser must not keep an old script after an upgrade,
/// but an unchanged one costs a 304.
fn cached(headers: &HeaderMap, content_type: &'static str, body: &'static str) -> Response {
    let tag = etag(body);
    let common = [
        (header::CACHE_CONTROL, "no-cache".to_owned()),
        (header::ETAG, tag.clone()),
        (header::HeaderName::from_static("x-content-type-options"), "nosniff".to_owned()),
    ];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (common, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// `GET /ui/`: the run inspector's page.
#[utoipa::path(get, path = "/ui/", tag = "ui", responses(
    (status = 200, description = "The run inspector (HTML); the key comes from a form or `#key=`", content_type = "text/html", body = String),
    (status = 304, description = "Not modified (If-None-Match)"),
))]
pub(crate) async fn index(headers: HeaderMap) -> Response {
    cached(&headers, "text/html; charset=utf-8", INDEX)
}

/// `GET /ui/runs/{run_id}`: the same page, opened on one run.
#[utoipa::path(get, path = "/ui/runs/{run_id}", tag = "ui", params(("run_id" = String, Path, description = "The run id (a ULID)")), responses(
    (status = 200, description = "The run inspector (HTML), opened on the run", content_type = "text/html", body = String),
    (status = 304, description = "Not modified (If-None-Match)"),
))]
pub(crate) async fn run_page(headers: HeaderMap) -> Response {
    cached(&headers, "text/html; charset=utf-8", INDEX)
}

/// `GET /ui/assets/{name}`: a script or style of the page, or `404 NOT-FOUND`.
#[utoipa::path(get, path = "/ui/assets/{name}", tag = "ui", params(("name" = String, Path, description = "app.js, view.js, gqlws.js or style.css")), responses(
    (status = 200, description = "The asset", content_type = "text/javascript", body = String),
    (status = 304, description = "Not modified (If-None-Match)"),
    (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
))]
pub(crate) async fn asset(
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => cached(&headers, content_type, body),
        None => super::error::HttpError::from(Error::reject(
            ErrorCode::NotFound,
            format!("no inspector asset `{}`", name.chars().take(60).collect::<String>()),
        ))
        .into_response(),
    }
}

/// One event of a folded file, as the replay clock needs it (no payload).
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Tick {
    seq: i64,
    #[schema(value_type = String)]
    ts: chrono::DateTime<chrono::Utc>,
    #[serde(rename = "type")]
    ty: String,
}

/// The answer of `POST /v1/fold`: the empty view, then every update the reducer made,
/// each with the seq of its event. Applying the updates with seq <= n to `initial`
/// gives the view after event n.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Folded {
    /// Seq of the last event.
    last_seq: i64,
    /// The view before the first event.
    #[schema(value_type = crate::http::openapi::View)]
    initial: RunView,
    /// Each event's seq, time and type, in order.
    events: Vec<Tick>,
    /// The view's changes, in order (`ViewUpdate`, as the `runView` subscription sends
    /// them), each serialized once as it is made so the answer's size is known.
    #[schema(value_type = Vec<Object>)]
    updates: Vec<Box<serde_json::value::RawValue>>,
    /// The view after the last event.
    #[schema(value_type = crate::http::openapi::View)]
    view: RunView,
}

/// Checks an export line by line as an import does and folds it with the reducer.
fn fold(body: &[u8], limits: crate::domain::input::Limits) -> crate::error::Result<Folded> {
    let lines = crate::domain::jsonl::parse_export(body, limits).map_err(Error::Rejected)?;
    let (initial, mut view) = (RunView::new(), RunView::new());
    let mut guard = RunGuard::default();
    let (mut ticks, mut ups) = (Vec::with_capacity(lines.len()), Vec::new());
    let mut answer = 0usize;
    for (i, (line, l)) in lines.into_iter().enumerate() {
        let seq = i as i64 + 1;
        // Service origin, as an import: the file may hold plan decisions.
        let res =
            guard.apply(seq, l.event.child_id.as_deref(), &l.event.body, Origin::Service).map_err(|r| {
                Error::Rejected(crate::error::Rejection {
                    message: format!("line {line}: {}", r.message),
                    index: Some(line - 1),
                    ..r
                })
            })?;
        let message_id = match res {
            Resolution::Message { id, .. } => Some(id),
            Resolution::None => None,
        };
        let e = Event {
            id: ulid::Ulid::from_parts(l.ts.timestamp_millis().max(0) as u64, seq as u128),
            ts: l.ts,
            run_id: String::new(),
            child_id: l.event.child_id,
            seq,
            body: l.event.body,
            message_id,
        };
        ticks.push(Tick { seq, ts: e.ts, ty: e.body.type_name().into_owned() });
        let change = view.apply(&e);
        for u in updates(&view, seq, change) {
            let raw = serde_json::value::to_raw_value(&u).map_err(|e| {
                Error::reject(ErrorCode::Internal, format!("an update did not serialize: {e}"))
            })?;
            answer += raw.get().len();
            if answer > FOLD_ANSWER_LIMIT {
                return Err(Error::reject(
                    ErrorCode::BodyTooLarge,
                    format!(
                        "line {line}: folding this export makes an answer over {} MiB (every update of a message carries its text so far); import it (POST /v1/runs/import) and replay the stored run instead",
                        FOLD_ANSWER_LIMIT >> 20
                    ),
                ));
            }
            ups.push(raw);
        }
    }
    Ok(Folded { last_seq: ticks.len() as i64, initial, events: ticks, updates: ups, view })
}

/// `POST /v1/fold` with a JSONL export: the reducer's views of it, stored nowhere.
#[utoipa::path(post, path = "/v1/fold", tag = "jsonl", security(("bearer" = [])),
    request_body(content = String, content_type = "application/x-ndjson", description = "A native JSONL export (at most 16 MiB)"),
    responses(
        (status = 200, description = "The file folded by the reducer: every view update, nothing stored", body = Folded),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn fold_export(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    who.require(crate::auth::Scope::Read)?;
    let bytes = read_body(&headers, body, FOLD_LIMIT.min(app.settings.max_import_bytes)).await?;
    let limits = app.settings.limits;
    let _turn =
        FOLDS.acquire().await.map_err(|_| Error::reject(ErrorCode::Internal, "the fold queue closed"))?;
    // Folding 10,000s of events is CPU work: keep it off the async workers.
    let folded = tokio::task::spawn_blocking(move || fold(&bytes, limits))
        .await
        .map_err(|e| Error::reject(ErrorCode::Internal, format!("the fold stopped: {e}")))??;
    Ok(Json(folded).into_response())
}

/// The inspector's routes.
pub fn routes() -> Router<AppRef> {
    Router::new()
        .route("/ui/", get(index))
        .route("/ui/runs/{run_id}", get(run_page))
        .route("/ui/assets/{name}", get(asset))
        .route("/v1/fold", post(fold_export))
}
