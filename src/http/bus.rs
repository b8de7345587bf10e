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
/// first attempt write nothing. Returns the seq the batch ended at (a retry's: the
/// original one), `None` when nothing was new.
pub(super) async fn append_user_messages(
    app: &AppRef,
    who: &Principal,
    run_id: &str,
    messages: &[UserMessage],
) -> Result<Option<i64>> {
    if messages.is_empty() {
        return Ok(None);
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
        return Ok(None);
    }
    check_batch_size(events.len(), app.settings.limits)?;
    check_keys(&events)?;
    let out = app.append(who, run_id, Batch { events, expected_last_seq: None }).await?;
    Ok(Some(out.last_seq))
}

/// The run's SSE stream in `format` for a client that has just posted: a resync
/// dialect re-synchronises it (its snapshot holds everything so far, the posted messages
/// included), then the stream goes on live and ends with the run.
///
/// `written` is the seq the request's own writes ended at. The stream starts there, not
/// at the run's newest event: a runtime that answers quickly may already have appended
/// (and even ended the run) by the time the run is read again, and starting after its
/// answer would turn the answer's deltas into a resync snapshot. With nothing written,
/// the stream starts at the newest event, or before the last one for a run that has
/// ended, so the answer still carries the run's end.
pub(super) async fn stream_after_post(
    app: &AppRef,
    who: Principal,
    run_id: &str,
    written: Option<i64>,
    format: Format,
) -> Result<Response> {
    let run = app.run(&who, run_id).await?;
    let base = start_after_post(written, &run);
    stream_at(app, who, run, format, Cursor::at(base)).await
}

/// Where [`stream_after_post`] starts: after the request's own writes, else at `run`'s
/// newest event (before its last one when it has ended).
fn start_after_post(written: Option<i64>, run: &RunInfo) -> i64 {
    let ended = run.state.is_some_and(|s| s.is_terminal());
    match written {
        Some(seq) => seq.min(run.last_seq),
        None if ended => (run.last_seq - 1).max(0),
        None => run.last_seq,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RunState;

    fn run(last_seq: i64, state: RunState) -> RunInfo {
        RunInfo {
            run_id: "r".into(),
            parent_run_id: None,
            root_run_id: "r".into(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
            last_seq,
            state: Some(state),
        }
    }

    /// The race a CI run hit: the runtime answered (and ended the run) between the
    /// request's write at seq 3 and its read of the run at seq 9. The stream starts at 3,
    /// so the answer goes out as it was appended, not inside the opening snapshot.
    #[test]
    fn a_post_streams_from_its_own_write_whatever_came_after_it() {
        assert_eq!(start_after_post(Some(3), &run(9, RunState::Done)), 3);
        assert_eq!(start_after_post(Some(3), &run(9, RunState::Running)), 3);
        assert_eq!(start_after_post(Some(3), &run(3, RunState::Running)), 3);
        // Nothing written: the newest event, or the one before an ended run's end.
        assert_eq!(start_after_post(None, &run(9, RunState::Running)), 9);
        assert_eq!(start_after_post(None, &run(9, RunState::Done)), 8);
        assert_eq!(start_after_post(None, &run(0, RunState::Running)), 0);
    }
}
