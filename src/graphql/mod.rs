//! The GraphQL transport: schema, routes (`POST /graphql`, GraphiQL at `GET /graphql`)
//! and the mapping of our errors into GraphQL's `errors[].extensions.code`.

mod checks;
mod error;
mod schema;
mod shared;
mod subscription;
pub(crate) mod ws;

use async_graphql::Schema;
use async_graphql_axum::GraphQLResponse;
use axum::extract::State;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;

use crate::app::AppRef;
use crate::error::{Error, ErrorCode};
use crate::http::extract::presented_key;
pub use schema::{Mutation, Query};
pub use subscription::Subscription;

/// The executable schema.
pub type AgentSchema = Schema<Query, Mutation, Subscription>;

/// Deepest query accepted.
pub const MAX_DEPTH: usize = 12;
/// Most expensive query accepted (async-graphql's default cost of 1 per field).
pub const MAX_COMPLEXITY: usize = 2_000;
/// Most operations in one batched request (a JSON array of requests).
pub const MAX_BATCH: usize = 10;

/// Builds the schema (without per-request data).
pub fn build_schema() -> AgentSchema {
    Schema::build(Query, Mutation, Subscription)
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .extension(checks::RefuseNul)
        .extension(checks::ExactNumbers)
        .finish()
}

/// The SDL the code defines; `graphql/schema.graphql` must equal it.
pub fn sdl() -> String {
    build_schema().sdl()
}

/// The caller of a GraphQL request, resolved before execution. Resolvers turn a failure
/// into an error only when they need a caller, so GraphiQL can introspect without a key.
pub(crate) type CallerResult = Result<crate::auth::Principal, crate::error::Rejection>;

/// Largest `POST /graphql` body read without a valid key: enough for any query and for
/// GraphiQL's introspection, so a caller without a key cannot make the server hold more.
pub const ANONYMOUS_BODY_LIMIT: usize = 64 << 10;

/// An error answered before execution, in GraphQL's `errors` shape with our code.
fn request_error(e: Error) -> axum::response::Response {
    let code = e.code();
    let (message, _) = e.public_parts();
    let body = serde_json::json!({"errors": [{"message": message, "extensions": {"code": code.as_str()}}]});
    (crate::http::error::status(code), axum::Json(body)).into_response()
}

#[utoipa::path(post, path = "/graphql", tag = "graphql", security((), ("bearer" = [])),
    request_body(content = crate::http::openapi::GraphqlRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "A GraphQL response; errors in `errors[].extensions.code`", body = crate::http::openapi::GraphqlResponse),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn graphql(
    State(app): State<AppRef>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let caller: CallerResult = match presented_key(&parts) {
        Ok(key) => match app.authenticate(key.as_deref()).await {
            Ok(p) => Ok(p),
            Err(crate::error::Error::Rejected(r)) => Err(r),
            Err(e) => return request_error(e),
        },
        Err(crate::error::Error::Rejected(r)) => Err(r),
        Err(e) => return request_error(e),
    };
    let ct = parts.headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        let shown = if mime.is_empty() {
            "none".to_owned()
        } else {
            format!("`{}`", crate::domain::text::echo(mime))
        };
        return request_error(Error::reject(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Type {shown} is not accepted: send the request as application/json"),
        ));
    }
    // The limit applies before anything is read; without a valid key it is small.
    let limit = if caller.is_ok() { app.settings.max_body_bytes } else { ANONYMOUS_BODY_LIMIT };
    let bytes = match crate::http::extract::read_body(&parts.headers, body, limit).await {
        Ok(b) => b,
        Err(e) => return request_error(e),
    };
    let gql: async_graphql::BatchRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return request_error(Error::reject(
                ErrorCode::BodyMalformed,
                format!(
                "the body is not a GraphQL request ({{\"query\": \"...\", \"variables\": {{...}}}}, or an \
                     array of them): {e}"
            ),
            ))
        }
    };
    if let async_graphql::BatchRequest::Batch(ops) = &gql {
        if ops.len() > MAX_BATCH {
            return request_error(Error::reject(
                ErrorCode::InvalidParameter,
                format!("a batch may hold at most {MAX_BATCH} operations; this one has {}", ops.len()),
            ));
        }
    }
    let schema = build_schema_cached();
    let gql = match gql {
        async_graphql::BatchRequest::Single(r) => {
            async_graphql::BatchRequest::Single(r.data(app.clone()).data(caller))
        }
        async_graphql::BatchRequest::Batch(ops) => async_graphql::BatchRequest::Batch(
            ops.into_iter().map(|r| r.data(app.clone()).data(caller.clone())).collect(),
        ),
    };
    let mut resp = schema.execute_batch(gql).await;
    match &mut resp {
        async_graphql::BatchResponse::Single(r) => with_codes(r),
        async_graphql::BatchResponse::Batch(rs) => rs.iter_mut().for_each(with_codes),
    }
    GraphQLResponse::from(resp).into_response()
}

/// Gives errors raised before execution (syntax, validation, depth and complexity
/// limits) a code too, so every error a client sees has `extensions.code`.
fn with_codes(r: &mut async_graphql::Response) {
    for e in &mut r.errors {
        // Validation messages quote the query's names whole.
        if e.message.len() > crate::error::MAX_MESSAGE {
            e.message = crate::error::cap_message(&e.message);
        }
        let ext = e.extensions.get_or_insert_with(Default::default);
        if ext.get("code").is_none() {
            ext.set("code", "QUERY-INVALID");
        }
    }
}

fn build_schema_cached() -> &'static AgentSchema {
    static SCHEMA: std::sync::OnceLock<AgentSchema> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(build_schema)
}

/// GraphiQL, pointed at `/graphql` and `/graphql/ws`. A static page rather than
/// async-graphql's `graphiql` feature: that renders the same page through handlebars,
/// which cost the first build about 17 s of compiling on the critical path.
#[utoipa::path(get, path = "/graphql", tag = "graphql", responses((status = 200, description = "GraphiQL", content_type = "text/html", body = String)))]
pub(crate) async fn graphiql() -> impl IntoResponse {
    Html(include_str!("graphiql.html"))
}

/// GraphiQL's scripts and styles, built into the binary (see `assets/README.md`): the
/// page works without internet access. The names carry their versions, so a browser
/// may keep them for good.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "graphiql-4.1.2.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/graphiql-4.1.2.min.js"),
    ),
    ("graphiql-4.1.2.min.css", "text/css; charset=utf-8", include_bytes!("assets/graphiql-4.1.2.min.css")),
    (
        "react-18.3.1.production.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/react-18.3.1.production.min.js"),
    ),
    (
        "react-dom-18.3.1.production.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/react-dom-18.3.1.production.min.js"),
    ),
];

/// `GET /graphql/assets/{name}`: one of [`ASSETS`], or `404 NOT-FOUND`.
#[utoipa::path(get, path = "/graphql/assets/{name}", tag = "graphql", params(("name" = String, Path, description = "An asset of GraphiQL's page")),
    responses(
        (status = 200, description = "The asset", content_type = "text/javascript", body = String),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn graphiql_asset(
    axum::extract::Path(name): axum::extract::Path<String>,
) -> axum::response::Response {
    use axum::http::header;
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
            ],
            *body,
        )
            .into_response(),
        None => crate::http::error::HttpError::from(crate::error::Error::reject(
            crate::error::ErrorCode::NotFound,
            format!("no GraphiQL asset `{name}`"),
        ))
        .into_response(),
    }
}

/// `GET /graphql` (GraphiQL), `POST /graphql`, and the WebSocket at `/graphql/ws`.
pub fn routes() -> Router<AppRef> {
    Router::new()
        .route("/graphql", get(graphiql).post(graphql))
        .route("/graphql/ws", get(ws::graphql_ws))
        .route("/graphql/assets/{name}", get(graphiql_asset))
}
