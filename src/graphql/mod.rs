//! The GraphQL transport: schema, routes (`POST /graphql`, GraphiQL at `GET /graphql`)
//! and the mapping of our errors into GraphQL's `errors[].extensions.code`.

mod error;
mod schema;
mod subscription;

use async_graphql::http::{WebSocketProtocols, WsMessage};
use async_graphql::{Data, Schema};
use async_graphql_axum::{GraphQLBatchRequest, GraphQLResponse};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
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
        .finish()
}

/// The SDL the code defines; `graphql/schema.graphql` must equal it.
pub fn sdl() -> String {
    build_schema().sdl()
}

/// The caller of a GraphQL request, resolved before execution. Resolvers turn a failure
/// into an error only when they need a caller, so GraphiQL can introspect without a key.
pub(crate) type CallerResult = Result<crate::auth::Principal, crate::error::Rejection>;

async fn graphql(State(app): State<AppRef>, req: axum::extract::Request) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let caller: CallerResult = match presented_key(&parts) {
        Ok(key) => match app.authenticate(key.as_deref()).await {
            Ok(p) => Ok(p),
            Err(crate::error::Error::Rejected(r)) => Err(r),
            Err(e) => return e.into_response(),
        },
        Err(crate::error::Error::Rejected(r)) => Err(r),
        Err(e) => return e.into_response(),
    };
    let req = axum::extract::Request::from_parts(parts, body);
    let gql = match <GraphQLBatchRequest as axum::extract::FromRequest<()>>::from_request(req, &()).await {
        Ok(r) => r.into_inner(),
        Err(rej) => return rej.into_response(),
    };
    if let async_graphql::BatchRequest::Batch(ops) = &gql {
        if ops.len() > MAX_BATCH {
            let msg = format!("a batch may hold at most {MAX_BATCH} operations; this one has {}", ops.len());
            let body =
                serde_json::json!({"errors": [{"message": msg, "extensions": {"code": "PARAM-INVALID"}}]});
            return (axum::http::StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
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
async fn graphiql() -> impl IntoResponse {
    Html(include_str!("graphiql.html"))
}

/// The key a `connection_init` payload carries: `{"authorization": "Bearer <key>"}`
/// (any capitalisation) or `{"access_token": "<key>"}`.
fn init_key(payload: &serde_json::Value) -> Option<String> {
    let obj = payload.as_object()?;
    for (k, v) in obj {
        let v = v.as_str()?;
        match k.to_ascii_lowercase().as_str() {
            "authorization" => return Some(v.strip_prefix("Bearer ").unwrap_or(v).trim().to_owned()),
            "access_token" | "accesstoken" | "apikey" => return Some(v.trim().to_owned()),
            _ => {}
        }
    }
    None
}

/// `GET /graphql/ws`: subscriptions over WebSocket. The key is checked once, in
/// `connection_init`; a bad key closes the connection before any operation.
async fn graphql_ws(
    State(app): State<AppRef>,
    headers: axum::http::HeaderMap,
    upgrade: WebSocketUpgrade,
) -> axum::response::Response {
    let Some(protocol) = ws_protocol(&headers) else {
        return Error::reject(
            ErrorCode::InvalidParameter,
            "`Sec-WebSocket-Protocol` must offer graphql-transport-ws or graphql-ws",
        )
        .into_response();
    };
    let schema = build_schema_cached().clone();
    // Answer with the protocol the loop will speak: axum alone would pick by the
    // server's order of preference, which can differ from the client's first choice.
    upgrade
        .protocols([protocol.sec_websocket_protocol()])
        .read_buffer_size(WS_READ_BUFFER)
        .on_upgrade(move |socket| serve_ws(socket, schema, protocol, app))
}

/// Read buffer of a GraphQL WebSocket. Clients send small messages (init, subscribe,
/// ping, complete), and a bigger frame still grows the buffer as needed. tungstenite's
/// default, 128 KiB, is zeroed on every read attempt, and the connection tries a read
/// each time it wakes to send an event: at 100 subscribers that memset was a third of
/// the server's CPU, and it made each connection hold 128 KiB resident.
const WS_READ_BUFFER: usize = 4 * 1024;

/// The first GraphQL WebSocket protocol the client offers.
fn ws_protocol(headers: &axum::http::HeaderMap) -> Option<WebSocketProtocols> {
    let offered = headers.get(axum::http::header::SEC_WEBSOCKET_PROTOCOL)?.to_str().ok()?;
    offered.split(',').find_map(|p| p.trim().parse().ok())
}

/// Close code sent when the server shuts down (RFC 6455 "going away"); `graphql-ws`
/// clients reconnect and subscribe again after it.
const GOING_AWAY: u16 = 1001;

/// One WebSocket connection. Like async-graphql-axum's own loop, except that messages
/// that are ready together go out in one write: subscribers of a busy run get a batch
/// of events per wake-up, and a flush per message made that a syscall per event.
///
/// When the process starts shutting down the connection closes with [`GOING_AWAY`]
/// rather than letting its subscriptions end: a `complete` would tell the client the
/// run's stream is over, when it only has to resume elsewhere.
async fn serve_ws(socket: WebSocket, schema: AgentSchema, protocol: WebSocketProtocols, app: AppRef) {
    use futures::{FutureExt, SinkExt, StreamExt};
    let _open = app.socket_open();
    let mut stopping = app.stopping();
    let (mut sink, stream) = socket.split();
    let input = stream.take_while(|m| futures::future::ready(m.is_ok())).filter_map(|m| {
        futures::future::ready(match m {
            Ok(m @ (Message::Text(_) | Message::Binary(_))) => Some(m.into_data()),
            _ => None,
        })
    });
    let out = async_graphql::http::WebSocket::new(schema, input, protocol)
        .on_connection_init(move |payload| async move {
            let key = init_key(&payload);
            let who = app.authenticate(key.as_deref()).await.map_err(|e| {
                use async_graphql::ErrorExtensions;
                e.extend()
            })?;
            let mut data = Data::default();
            data.insert(app.clone());
            data.insert::<CallerResult>(Ok(who));
            Ok(data)
        })
        .map(|m| match m {
            WsMessage::Text(text) => Message::Text(text.into()),
            WsMessage::Close(code, reason) => {
                Message::Close(Some(CloseFrame { code, reason: reason.into() }))
            }
        });
    futures::pin_mut!(out);
    loop {
        // The stop flag is set before any stream ends because of it, so checking it
        // before each message keeps those endings from reaching the client.
        let first = tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => break,
            m = out.next() => m,
        };
        let Some(first) = first else { return };
        if sink.feed(first).await.is_err() {
            return;
        }
        while let Some(Some(more)) = out.next().now_or_never() {
            if *stopping.borrow() {
                break;
            }
            if sink.feed(more).await.is_err() {
                return;
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
    let bye = CloseFrame { code: GOING_AWAY, reason: "server shutting down; reconnect".into() };
    let _ = sink.send(Message::Close(Some(bye))).await;
}

/// `GET /graphql` (GraphiQL), `POST /graphql`, and the WebSocket at `/graphql/ws`.
pub fn routes() -> Router<AppRef> {
    Router::new().route("/graphql", get(graphiql).post(graphql)).route("/graphql/ws", get(graphql_ws))
}
