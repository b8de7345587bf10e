//! `POST /v1/agui`: AG-UI's `HttpAgent` as it is (`url` and `headers` only), its
//! `threadId` naming the run.
//!
//! `RunAgentInput` maps onto the run like this:
//! - `threadId`: the run id.
//! - `messages`: each user message the run does not hold yet (by id) is appended as a
//!   user message, in order (its text: `content` as a string, or its text parts joined).
//!   Other roles are the run's own output and are not taken from the client.
//! - `resume`: answers to a pending plan (interrupt id = the plan's id): `resolved`
//!   approves it (unless `payload.approved` is `false`, which rejects it), `cancelled`
//!   rejects it; `payload.reason` is the decision's reason.
//! - `runId`, `state`, `tools`, `context`, `forwardedProps`: not taken. The state is the
//!   run's fold (`{lifecycle, plan}`), written by the runtime and the service; the
//!   runtime has its own tools.
//!
//! The answer is the run's `agui` stream, re-synchronised at the last event this request
//! wrote, or at the run's newest event when it wrote nothing (`RUN_STARTED`,
//! `STATE_SNAPSHOT`, `MESSAGES_SNAPSHOT`, which replaces the agent's messages, the posted
//! ones included), then live until the run ends: an answer the runtime appends after
//! the posted message arrives as deltas however quickly it comes.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::bus::{append_user_messages, stream_after_post, UserMessage};
use super::extract::{read_json, Caller};
use crate::app::{AppRef, Control};
use crate::dialect::Format;
use crate::error::{Error, ErrorCode};

/// The parts of AG-UI's `RunAgentInput` the service takes (the rest is ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunAgentInput {
    thread_id: String,
    #[serde(default)]
    messages: Vec<InputMessage>,
    #[serde(default)]
    resume: Vec<ResumeEntry>,
}

#[derive(Deserialize)]
struct InputMessage {
    id: String,
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Value,
}

/// A message's text: `content` as a string, or its text parts joined with newlines.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `POST /v1/agui`
#[utoipa::path(post, path = "/v1/agui", tag = "clients", security(("bearer" = [])),
    request_body(content = Object, content_type = "application/json",
        description = "AG-UI's `RunAgentInput`: `threadId` (the run id), new user `messages` (appended once), `resume` entries deciding a pending plan"),
    responses(
        (status = 200, description = "The run as AG-UI events (`agui` dialect over SSE)", content_type = "text/event-stream", body = String),
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
pub(crate) async fn run(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    let input: RunAgentInput = read_json(&headers, body, app.settings.max_body_bytes).await?;
    let run = app.run(&who, &input.thread_id).await?;
    let users: Vec<UserMessage> = input
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| UserMessage { id: m.id.clone(), text: text_of(&m.content) })
        .collect();
    if input.resume.len() > 1 {
        return Err(Error::reject(
            ErrorCode::InvalidPayload,
            "`resume` holds at most one entry: the run's pending plan",
        )
        .into());
    }
    // Every part of the input is checked before anything is written.
    let mut decisions = vec![];
    if !input.resume.is_empty() {
        let (_, view) = app.view(&who, &run.run_id).await?;
        for r in &input.resume {
            decisions.push(decision(&view, r)?);
        }
    }
    let mut written = append_user_messages(&app, &who, &run.run_id, &users).await?;
    for d in decisions {
        let out = app.control(&who, &run.run_id, d).await?;
        written = written.max(Some(out.last_seq));
    }
    Ok(stream_after_post(&app, who, &run.run_id, written, Format::Agui).await?)
}

/// What one `resume` entry decides on the run's pending plan.
fn decision(view: &crate::projection::RunView, r: &ResumeEntry) -> crate::error::Result<Control> {
    let pending = view.plan.as_ref().filter(|p| p.decision.is_none()).map(|p| p.id.as_str());
    if pending != Some(r.interrupt_id.as_str()) {
        return Err(Error::reject(
            ErrorCode::PlanNotPending,
            format!(
                "interrupt `{}` is not the run's pending plan",
                r.interrupt_id.chars().take(80).collect::<String>()
            ),
        ));
    }
    let reason = r.payload["reason"].as_str().map(str::to_owned);
    match (r.status.as_str(), r.payload["approved"].as_bool()) {
        ("resolved", Some(false)) | ("cancelled", _) => Ok(Control::RejectPlan(reason)),
        ("resolved", _) => Ok(Control::ApprovePlan(reason)),
        (other, _) => Err(Error::reject(
            ErrorCode::InvalidPayload,
            format!(
                "resume status must be `resolved` or `cancelled`, not `{}`",
                other.chars().take(40).collect::<String>()
            ),
        )),
    }
}
