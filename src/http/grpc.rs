//! Seed 004's gRPC server-stream profile (§5.3): `agent.v1.AgentRun/Stream`, served
//! on the HTTP listen address. A request with `content-type: application/grpc` (HTTP/2,
//! cleartext or TLS as the listener is) goes to tonic's generated server; the same path
//! with any other content type gets our `415`.
//!
//! The events come from the same `http::stream::open` path as SSE and the WebSocket
//! profile (tail, resume filter, shaper, shedder), so R1–R4 hold as there. Each item
//! becomes one `Event` message: the native envelope in proto3, the payload as JSON
//! bytes (see `proto/agent/v1/agent_stream.proto` for why not `Struct`). A stream that
//! ends before the run's terminal event ends with a status instead of a clean end, so
//! a client knows to resume: `UNAVAILABLE` (shutdown, a failed read) or
//! `PERMISSION_DENIED` (the key was revoked).

use std::pin::Pin;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use futures::{Stream, StreamExt};
use tonic::{Code, Status};
use tower::ServiceExt;

use super::stream::open;
use crate::app::AppRef;
use crate::dialect::{Cursor, Format, Out};
use crate::error::{Error, ErrorCode};

/// The code generated from `proto/agent/v1/agent_stream.proto` (server and client).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("agent.v1");
}

use pb::agent_run_server::{AgentRun, AgentRunServer};

/// The gRPC routes, merged into the service's router.
pub(super) fn routes() -> Router<AppRef> {
    Router::new().route("/agent.v1.AgentRun/{method}", any(dispatch))
}

/// gRPC by content type; anything else on these paths gets our error.
async fn dispatch(State(app): State<AppRef>, req: Request) -> Response {
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    if !grpc {
        return super::error::HttpError::from(Error::reject(
            ErrorCode::UnsupportedMediaType,
            "agent.v1.AgentRun is gRPC: send content-type application/grpc over HTTP/2",
        ))
        .into_response();
    }
    let server = AgentRunServer::new(Grpc { app });
    match server.oneshot(req).await {
        Ok(resp) => resp.map(axum::body::Body::new),
        Err(never) => match never {},
    }
}

/// The one mapping from our errors to gRPC statuses: the status code nearest the HTTP
/// one, and our stable code (and seed 004's, where it has one) in the metadata.
fn status(e: Error) -> Status {
    use ErrorCode::*;
    let code = e.code();
    let (message, _) = e.public_parts();
    let grpc = match code {
        AuthMissing | AuthInvalid => Code::Unauthenticated,
        AuthScope => Code::PermissionDenied,
        RunNotFound | NotFound => Code::NotFound,
        // Gone: the run existed and its log was deleted; no retry will bring it back.
        RunExpired => Code::FailedPrecondition,
        CursorBeyondEnd => Code::OutOfRange,
        RateLimited | SubscriptionsLimit | SocketsLimit => Code::ResourceExhausted,
        Unavailable => Code::Unavailable,
        Internal => Code::Internal,
        _ => Code::InvalidArgument,
    };
    let mut s = Status::new(grpc, format!("{}: {message}", code.as_str()));
    if let Ok(v) = code.as_str().parse() {
        s.metadata_mut().insert("x-error-code", v);
    }
    if let Some(Ok(v)) = code.kai_code().map(str::parse) {
        s.metadata_mut().insert("x-kai-code", v);
    }
    s
}

/// One item as an `Event` message.
fn event(o: &Out) -> Result<pb::Event, Status> {
    let v = o.to_json().ok_or_else(|| Status::internal("an item that is not JSON"))?;
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    let payload = serde_json::to_vec(&v["payload"]).map_err(|_| Status::internal("payload"))?;
    let id = o.cursor();
    Ok(pb::Event {
        id: s("id"),
        ts: s("ts"),
        r#type: s("type"),
        run_id: s("run_id"),
        child_id: v["child_id"].as_str().map(str::to_owned),
        seq: v["seq"].as_i64().unwrap_or(o.seq),
        payload,
        first_seq: v["first_seq"].as_i64().unwrap_or(0),
        resume_id: if id.is_plain() && id.seq == o.seq { String::new() } else { id.to_string() },
    })
}

/// The service behind the generated server.
struct Grpc {
    app: AppRef,
}

type Events = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl AgentRun for Grpc {
    type StreamStream = Events;

    async fn stream(
        &self,
        req: tonic::Request<pb::StreamRequest>,
    ) -> Result<tonic::Response<Events>, Status> {
        let app = self.app.clone();
        let key = match req.metadata().get("authorization") {
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| status(Error::reject(ErrorCode::AuthInvalid, "bad authorization")))?;
                let key =
                    v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")).ok_or_else(|| {
                        status(Error::reject(
                            ErrorCode::AuthInvalid,
                            "the authorization metadata must be `Bearer <key>`",
                        ))
                    })?;
                Some(key.trim().to_owned())
            }
            None => None,
        };
        let who = app.authenticate(key.as_deref()).await.map_err(status)?;
        let r = req.into_inner();
        let at = if r.resume_id.is_empty() { r.after_seq.to_string() } else { r.resume_id.clone() };
        let cursor = Cursor::parse(&at).map_err(|e| status(e.into()))?;
        let Some(sending) = open(
            &app,
            who.clone(),
            &r.run_id,
            cursor,
            r.detail_full,
            Format::Native,
            crate::metrics::Transport::GRPC,
        )
        .await
        .map_err(status)?
        else {
            // The run has ended and nothing is after the cursor: a clean, empty end.
            return Ok(tonic::Response::new(Box::pin(futures::stream::empty())));
        };
        // (stream state, whether the terminal item went out, finished)
        let items = futures::stream::unfold((sending, false, false), move |(mut s, terminal, done)| {
            let app = app.clone();
            let who = who.clone();
            async move {
                if done {
                    return None;
                }
                match s.next_items().await {
                    Some(items) => {
                        let terminal = terminal || items.iter().any(|o| o.terminal);
                        let out: Vec<Result<pb::Event, Status>> = items.iter().map(event).collect();
                        Some((futures::stream::iter(out), (s, terminal, false)))
                    }
                    None if terminal => None,
                    None => {
                        let end = if *app.stopping().borrow() {
                            Status::unavailable("the server is shutting down: resume with after_seq")
                        } else if !app.auth.still_valid(&app.db, &who).await.unwrap_or(true) {
                            Status::permission_denied("the API key was revoked")
                        } else {
                            Status::unavailable("reading the run failed: resume with after_seq")
                        };
                        Some((futures::stream::iter(vec![Err(end)]), (s, terminal, true)))
                    }
                }
            }
        })
        .flatten();
        Ok(tonic::Response::new(Box::pin(items)))
    }
}
