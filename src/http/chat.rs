//! `/v1/chat`: the AI SDK's `DefaultChatTransport` as it is (`api: "<base>/v1/chat"`,
//! `headers` with the key), the chat id being a run id.
//!
//! - `POST /v1/chat` with the transport's body `{id, messages, trigger, messageId, ...}`:
//!   on `submit-message`, the last message, when it is a user message the run does not
//!   hold yet, is appended as a user message (its text parts joined; id = the SDK's
//!   message id, so a retry writes nothing). Then the answer is the run's `vercel`
//!   stream: the SDK starts a fresh assistant message for it, so the stream re-synchronises
//!   it with the whole run so far (a compacted replay, message id = the run id, which the
//!   SDK replaces in place) and goes on live until the run ends.
//! - `GET /v1/chat/{run_id}/stream` (`resumeStream`): the same stream for a run that is
//!   still going; `204` once it has ended (the SDK then keeps what it has). A
//!   `Last-Event-ID` is honoured as on `/v1/runs/{id}/stream`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::bus::{append_user_messages, stream_after_post, stream_at, UserMessage};
use super::extract::{read_json, Caller};
use crate::app::{check_cursor, AppRef};
use crate::dialect::{Cursor, Format};

/// The body `DefaultChatTransport` posts (fields the caller adds through the transport's
/// `body` option are ignored).
#[derive(Deserialize)]
pub(crate) struct ChatRequest {
    /// The chat id: our run id.
    id: String,
    /// The chat's messages, as the SDK holds them.
    #[serde(default)]
    messages: Vec<UiMessage>,
    /// `submit-message` or `regenerate-message`.
    #[serde(default)]
    trigger: Option<String>,
}

#[derive(Deserialize)]
struct UiMessage {
    id: String,
    role: String,
    #[serde(default)]
    parts: Vec<Value>,
}

/// The user message a `submit-message` request adds, if its last message is one.
fn new_user_message(req: &ChatRequest) -> Option<UserMessage> {
    if req.trigger.as_deref().unwrap_or("submit-message") != "submit-message" {
        return None;
    }
    let last = req.messages.last().filter(|m| m.role == "user")?;
    let text: String = last
        .parts
        .iter()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Some(UserMessage { id: last.id.clone(), text })
}

/// `POST /v1/chat`
#[utoipa::path(post, path = "/v1/chat", tag = "clients", security(("bearer" = [])),
    request_body(content = Object, content_type = "application/json",
        description = "The AI SDK `DefaultChatTransport`'s body: `id` (the run id), `messages` (UI messages), `trigger` (`submit-message` appends the last user message once)"),
    responses(
        (status = 200, description = "The run as the AI SDK's UI message stream (`vercel` dialect over SSE), live until it ends", content_type = "text/event-stream", body = String),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn send(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    let req: ChatRequest = read_json(&headers, body, app.settings.max_body_bytes).await?;
    let run = app.run(&who, &req.id).await?;
    let written = match new_user_message(&req) {
        Some(m) => append_user_messages(&app, &who, &run.run_id, &[m]).await?,
        None => None,
    };
    Ok(stream_after_post(&app, who, &run.run_id, written, Format::Vercel).await?)
}

/// `GET /v1/chat/{run_id}/stream`
#[utoipa::path(get, path = "/v1/chat/{run_id}/stream", tag = "clients", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), ("Last-Event-ID" = Option<String>, Header, description = "Resume after this stream position")),
    responses(
        (status = 200, description = "The run's `vercel` stream (the SDK's `resumeStream`)", content_type = "text/event-stream", body = String),
        (status = 204, description = "The run has ended: nothing to resume"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 416, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn resume(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> super::error::ApiResult<Response> {
    let run = app.run(&who, &run_id).await?;
    let ended = run.state.is_some_and(|s| s.is_terminal());
    let cursor = match headers.get("last-event-id") {
        Some(_) => super::stream::resume_point(&headers, None)?,
        // The SDK sends no position: a run that has ended has nothing left for it.
        None if ended => return Ok(StatusCode::NO_CONTENT.into_response()),
        None => Cursor::at(run.last_seq),
    };
    check_cursor(&run, &cursor)?;
    if ended && cursor.complete_seq() >= run.last_seq {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Ok(stream_at(&app, who, run, Format::Vercel, cursor).await?)
}
