//! The log is the bus: what the standard clients' POST routes (`/v1/chat`, `/v1/agui`)
//! share. A frontend's new user message becomes a user message in the run, appended
//! through the one append path (validated like any event, idempotent on retry); the
//! answer is the run's stream in the client's dialect, picked up where the client is.

use axum::response::Response;

use crate::app::AppRef;
use crate::auth::Principal;
use crate::dialect::{Cursor, Format};
use crate::domain::input::{check_batch_size, check_keys, parse_event};
use crate::domain::Batch;
use crate::error::Result;
use crate::live::shed::Shedder;
use crate::storage::runs::RunInfo;

/// A user message a client sent: its id (the client's) and its text.
pub(super) struct UserMessage {
    /// The client's message id; it becomes the run's `message_id`.
    pub id: String,
    /// The message's text.
    pub text: String,
}

/// Appends the messages the run does not hold yet (one without text is refused) (by message id, in the run itself,
/// not a child), each as `message.start` (role user) and `message.end` with its text, in
/// one batch. Keys `user:<id>:start` / `user:<id>:end` make a retry that races the
/// first attempt write nothing.
pub(super) async fn append_user_messages(
    app: &AppRef,
    who: &Principal,
    run_id: &str,
    messages: &[UserMessage],
) -> Result<()> {
    if messages.is_empty() {
        return Ok(());
    }
    let (_, view) = app.view(who, run_id).await?;
    let mut events = vec![];
    for m in messages.iter().filter(|m| view.message(None, &m.id).is_none()) {
        if m.text.is_empty() {
            return Err(crate::error::Error::reject(
                crate::error::ErrorCode::InvalidPayload,
                format!(
                    "user message `{}` has no text; only text is carried into the run",
                    m.id.chars().take(80).collect::<String>()
                ),
            ));
        }
        let start = serde_json::json!({"type": "message.start", "key": format!("user:{}:start", m.id),
            "payload": {"message_id": m.id, "role": "user"}});
        let end = serde_json::json!({"type": "message.end", "key": format!("user:{}:end", m.id),
            "payload": {"message_id": m.id, "stop_reason": "end_turn", "text": m.text}});
        for e in [start, end] {
            let at = events.len();
            let raw = serde_json::to_vec(&e).unwrap_or_default();
            events.push(parse_event(&raw, app.settings.limits).map_err(|r| r.at(at))?);
        }
    }
    if events.is_empty() {
        return Ok(());
    }
    check_batch_size(events.len(), app.settings.limits)?;
    check_keys(&events)?;
    app.append(who, run_id, &Batch { events, expected_last_seq: None }).await?;
    Ok(())
}

/// The run's SSE stream in `format` for a client that has just posted: a resync
/// dialect re-synchronises it at the run's newest event (its snapshot holds everything
/// so far, the posted messages included), then the stream goes on live and ends with
/// the run. A run that has already ended is synchronised before its last event, so the
/// answer still carries the run's end.
pub(super) async fn stream_from_now(
    app: &AppRef,
    who: Principal,
    run: RunInfo,
    format: Format,
) -> Result<Response> {
    let ended = run.state.is_some_and(|s| s.is_terminal());
    let base = if ended { (run.last_seq - 1).max(0) } else { run.last_seq };
    stream_at(app, who, run, format, Cursor::at(base)).await
}

/// The run's SSE stream in `format` after `cursor` (unshaped deltas merged as on
/// `GET /v1/runs/{id}/stream`).
pub(super) async fn stream_at(
    app: &AppRef,
    who: Principal,
    run: RunInfo,
    format: Format,
    cursor: Cursor,
) -> Result<Response> {
    let ended = run.state.is_some_and(|s| s.is_terminal());
    let base = cursor.complete_seq();
    let mut enc = app.encoding(&who, &run, format, &cursor).await?;
    let tail = app.live_tail(who, &mut enc, base);
    let shedder = Shedder::new(app.settings.shedding, !ended);
    Ok(super::stream::sse_response(super::stream::Sending::new(tail, enc, false, shedder), format))
}
