//! Seed 004's WebSocket profile (§5.2) on `GET /v1/agent/runs/{run_id}/stream`:
//! subprotocol `koder-agent-stream-v1`, one text frame per item, each the native
//! envelope the SSE stream's `data:` carries.
//!
//! The frames come from the same [`Sending`] as SSE (a [`Tail`](crate::live::Tail), the
//! resume filter, the shaper and the shedder), so R1–R4 hold as they do there: deltas merged per lane into at
//! most 10 frames a second unless the handshake sends `Detail: full` (or
//! `?detail=full`), control events never merged or delayed, a client that cannot keep up
//! losing reasoning then text deltas and told so (`stream.warning`,
//! `KAI-STREAM-BUF-0001`), the terminal event carrying `dropped_count`.
//!
//! Resume: `?after_seq=` (browsers cannot set headers on a WebSocket) or
//! `Last-Event-ID` in the handshake, with the last frame's `seq`; a merged frame sent
//! before the end of its window also carries `resume_id`, which is then the position
//! to resume from (as the SSE `id:` is). Errors found before the upgrade (key, run,
//! cursor, parameters) are ordinary HTTP answers with our error body; after it, the
//! close code says why the socket ended (see the README).

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;

use super::extract::{Caller, Params};
use super::stream::{detail, open, resume_point, Live, Sending};
use crate::app::AppRef;
use crate::auth::Principal;
use crate::dialect::{Data, Format, Out};
use crate::error::{Error, ErrorCode};
use crate::live::alarm::{within, Idle};

/// The subprotocol a client opts in with (seed 004 §5.2).
pub const SUBPROTOCOL: &str = "koder-agent-stream-v1";

/// The run's terminal event was sent (or the run had ended with nothing after the cursor).
const NORMAL: u16 = 1000;
/// The server is shutting down: reconnect and resume.
const GOING_AWAY: u16 = 1001;
/// The client sent a binary frame (the profile is text frames only).
const UNSUPPORTED_DATA: u16 = 1003;
/// The client sent a text frame (the profile is server to client only).
const POLICY: u16 = 1008;
/// A read of the log failed: reconnect and resume; nothing is lost.
const SERVER_ERROR: u16 = 1011;
/// The client took no bytes for the stall limit: reconnect and resume.
const TOO_SLOW: u16 = 1013;
/// The key was revoked while the socket was open.
const FORBIDDEN: u16 = 4403;

/// A ping goes out after this much silence (the SSE keep-alive's interval).
const KEEPALIVE: Duration = super::sse::KEEPALIVE;

/// Query parameters of the WebSocket profile.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WsParams {
    #[serde(default)]
    after_seq: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

/// The first subprotocol the client offers, if it is ours.
fn offers_subprotocol(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL)
}

/// The WebSocket handshake of `GET /v1/agent/runs/{run_id}/stream`: everything is checked
/// before the upgrade, so a refused client gets our HTTP error.
pub(super) async fn upgrade(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<WsParams>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> super::error::ApiResult<Response> {
    let upgrade = upgrade.map_err(|e| {
        Error::reject(ErrorCode::InvalidParameter, format!("not a valid WebSocket handshake: {e}"))
    })?;
    if !offers_subprotocol(&headers) {
        return Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!("`Sec-WebSocket-Protocol` must offer {SUBPROTOCOL}"),
        )
        .into());
    }
    let cursor = resume_point(&headers, p.after_seq.as_deref())?;
    let header_detail = match headers.get("detail") {
        Some(v) => Some(v.to_str().map_err(|_| {
            Error::reject(ErrorCode::InvalidParameter, "the `Detail` header must be `full` or `default`")
        })?),
        None => None,
    };
    let raw = detail(p.detail.as_deref())? || detail(header_detail.map(str::trim))?;
    let sending =
        open(&app, who.clone(), &run_id, cursor, raw, Format::Native, crate::metrics::Transport::SEED_WS)
            .await?;
    Ok(upgrade
        .protocols([SUBPROTOCOL])
        .read_buffer_size(crate::graphql::ws::WS_READ_BUFFER)
        .max_message_size(64 << 10)
        .on_upgrade(move |socket| serve(socket, app, who, sending))
        .into_response())
}

/// The frame text of one item: the native envelope, plus `resume_id` when the item's
/// stream position is not its `seq`.
fn frame_text(o: &Out) -> Utf8Bytes {
    let id = o.cursor();
    if id.is_plain() && id.seq == o.seq {
        // A live page's rendering is shared by every subscriber of the page: each frame
        // takes a reference to its bytes where a copy was made per subscriber and item.
        if let Data::Wire(w) = &o.data {
            if let Ok(text) = Utf8Bytes::try_from(w.json_bytes()) {
                return text;
            }
        }
        return o.to_text().into_owned().into();
    }
    match o.to_json() {
        Some(serde_json::Value::Object(mut m)) => {
            m.insert("resume_id".into(), id.to_string().into());
            serde_json::Value::Object(m).to_string().into()
        }
        _ => o.to_text().into_owned().into(),
    }
}

/// Sends a close frame, if the client still takes it.
async fn close<S>(sink: &mut S, code: u16, reason: &str)
where
    S: futures::Sink<Message> + Unpin,
{
    let frame = CloseFrame { code, reason: reason.to_owned().into() };
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(Some(frame)))).await;
}

/// One socket: the stream's items out, the client's frames watched for a close.
async fn serve(socket: WebSocket, app: AppRef, who: Principal, sending: Option<Sending<Live>>) {
    let _open = app.socket_open();
    let (mut sink, mut input) = socket.split();
    let Some(sending) = sending else {
        close(&mut sink, NORMAL, "the run has ended; nothing after the cursor").await;
        return;
    };
    // The items as a stream: a wait cut short by a ping or a client frame resumes where
    // it was when polled again.
    let items = futures::stream::unfold(sending, |mut s| async move {
        let items = s.next_items().await?;
        Some((items, s))
    });
    let mut items = std::pin::pin!(items);
    let stall = app.settings.ws.stall;
    // A ping after KEEPALIVE of silence; a batch only reads the clock ([`Idle`]).
    let mut ping = Idle::new(KEEPALIVE);
    let mut ended = false;
    loop {
        tokio::select! {
            next = items.next() => {
                let Some(batch) = next else { break };
                ended |= batch.iter().any(|o| o.terminal);
                let write = async {
                    for o in &batch {
                        sink.feed(Message::Text(frame_text(o))).await?;
                    }
                    sink.flush().await
                };
                // One stall budget for the whole batch, as before; `within` arms its
                // timer only if the batch does not go into the socket at once.
                match within(stall, write).await {
                    Ok(Ok(())) => ping.wrote(),
                    Ok(Err(_)) => return,
                    Err(_) => {
                        close(&mut sink, TOO_SLOW, "the client stopped reading; resume with after_seq").await;
                        return;
                    }
                }
            }
            m = input.next() => match m {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(Message::Binary(_))) => {
                    close(&mut sink, UNSUPPORTED_DATA, "binary frames are not part of koder-agent-stream-v1").await;
                    return;
                }
                Some(Ok(Message::Text(_))) => {
                    close(&mut sink, POLICY, "koder-agent-stream-v1 takes no messages from the client").await;
                    return;
                }
                Some(Ok(_)) => {}
            },
            () = ping.due() => {
                if within(stall, sink.send(Message::Ping(Default::default()))).await.is_err() {
                    close(&mut sink, TOO_SLOW, "the client stopped reading; resume with after_seq").await;
                    return;
                }
            }
        }
    }
    let (code, reason) = if ended {
        (NORMAL, "the run has ended")
    } else if *app.stopping().borrow() {
        (GOING_AWAY, "the server is shutting down; resume with after_seq")
    } else if !app.auth.still_valid(&app.db, &who).await.unwrap_or(true) {
        (FORBIDDEN, "the API key was revoked")
    } else {
        (SERVER_ERROR, "reading the run failed; resume with after_seq")
    };
    close(&mut sink, code, reason).await;
}
