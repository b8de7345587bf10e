//! `GET /graphql/ws`: GraphQL over WebSocket (graphql-transport-ws, or the legacy
//! subscriptions-transport-ws), on async-graphql's protocol handler, with what it does
//! not do itself:
//!
//! - **Keys stay checked.** The key comes in `connection_init`; after that the socket
//!   re-checks it every [`KEY_RECHECK`] and before each new operation, and closes with
//!   4403 once it is revoked (within the README's 5 s: the key cache's 2 s plus this).
//! - **Time and size caps.** A socket that sends no `connection_init` within
//!   [`INIT_TIMEOUT`] is closed with 4408 (graphql-ws's `connectionInitWaitTimeout`);
//!   a key holds at most `max_sockets_per_key` sockets (4429 at `connection_init`); a
//!   socket holds at most `max_operations` subscriptions (`SUBSCRIPTIONS-LIMIT`).
//! - **Clients that stop reading.** Writes are back-pressured (nothing is produced for a
//!   socket that cannot take it), and a socket whose client takes no bytes for
//!   `WsLimits::stall` (30 s) is closed with [`TOO_SLOW`]: it resumes with `afterSeq`.
//!   While it waits, a socket holds its write buffer and one message, and each of its
//!   subscriptions the page of events in hand (see `live::feed`).
//! - **Shared renderings.** `runEvents` subscribers that ask the same share each live
//!   event's response instead of each executing the selection (`super::shared`).
//! - **graphql-ws close codes.** A refused `connection_init` closes with 4401 (no key)
//!   or 4403 (bad or revoked key) instead of the handler's 1002, an operation before
//!   the acknowledgement with 4401, a malformed message with 4400.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_graphql::http::{ClientMessage, WebSocketProtocols, WsMessage};
use async_graphql::Data;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::IntoResponse;
use futures::{FutureExt, SinkExt, StreamExt};

use super::{build_schema_cached, AgentSchema, CallerResult};
use crate::app::AppRef;
use crate::auth::Principal;
use crate::error::{Error, ErrorCode};
use agent_stream_live::alarm::{within, Alarm};

/// How long a new socket may take to send `connection_init` (graphql-ws's default
/// `connectionInitWaitTimeout`); then it is closed with [`INIT_TIMED_OUT`].
pub const INIT_TIMEOUT: Duration = Duration::from_secs(3);
/// How often an open socket re-checks its key.
pub const KEY_RECHECK: Duration = Duration::from_secs(2);

/// graphql-ws `Unauthorized`: no key, or an operation before `connection_ack`.
const UNAUTHORIZED: u16 = 4401;
/// graphql-ws `Forbidden`: the key is unknown or was revoked.
const FORBIDDEN: u16 = 4403;
/// graphql-ws `BadRequest`: a message that is not of the protocol.
const BAD_REQUEST: u16 = 4400;
/// graphql-ws `ConnectionInitialisationTimeout`.
const INIT_TIMED_OUT: u16 = 4408;
/// graphql-ws `TooManyInitialisationRequests`, used for a key over its socket cap too.
const TOO_MANY: u16 = 4429;
/// RFC 6455 "Try Again Later": the client stopped reading; it reconnects and resumes
/// each subscription after the last `seq` it received.
pub const TOO_SLOW: u16 = 1013;
/// RFC 6455 "going away": the server shuts down; `graphql-ws` clients reconnect and
/// subscribe again after it.
const GOING_AWAY: u16 = 1001;

/// Read buffer of the server's WebSockets (GraphQL's and seed 004's profile). Clients
/// send small messages (init, subscribe, ping, complete; the profile's clients only
/// pongs and a close), and a bigger frame still grows the buffer as needed. tungstenite's
/// default, 128 KiB, is zeroed on every read attempt, and the connection tries a read
/// each time it wakes to send an event: at 100 subscribers that memset was a third of
/// the server's CPU, and it made each connection hold 128 KiB resident.
pub(crate) const WS_READ_BUFFER: usize = 4 * 1024;

/// Client messages read ahead of the protocol handler: one, so that a client sending
/// large messages to a socket whose handler is not taking them (its sends are stuck)
/// has no more of them held here than the socket's own read buffer held before.
const READ_AHEAD: usize = 1;

/// Largest message a client may send (a subscribe with its variables): far above any
/// real operation, far below tungstenite's 64 MiB default.
const MAX_MESSAGE: usize = 1 << 20;

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

/// `GET /graphql/ws`: subscriptions over WebSocket (see the module docs).
#[utoipa::path(get, path = "/graphql/ws", tag = "graphql",
    params(("Sec-WebSocket-Protocol" = String, Header, description = "`graphql-transport-ws` or `graphql-ws`")),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol; the key goes in `connection_init`"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn graphql_ws(
    State(app): State<AppRef>,
    headers: axum::http::HeaderMap,
    upgrade: WebSocketUpgrade,
) -> axum::response::Response {
    let Some(protocol) = ws_protocol(&headers) else {
        return crate::http::error::HttpError::from(Error::reject(
            ErrorCode::InvalidParameter,
            "`Sec-WebSocket-Protocol` must offer graphql-transport-ws or graphql-ws",
        ))
        .into_response();
    };
    let schema = build_schema_cached().clone();
    // Answer with the protocol the loop will speak: axum alone would pick by the
    // server's order of preference, which can differ from the client's first choice.
    upgrade
        .protocols([protocol.sec_websocket_protocol()])
        .read_buffer_size(WS_READ_BUFFER)
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| serve_ws(socket, schema, protocol, app))
}

/// The first GraphQL WebSocket protocol the client offers.
fn ws_protocol(headers: &axum::http::HeaderMap) -> Option<WebSocketProtocols> {
    let offered = headers.get(axum::http::header::SEC_WEBSOCKET_PROTOCOL)?.to_str().ok()?;
    offered.split(',').find_map(|p| p.trim().parse().ok())
}

/// What the socket's parts share: who it is (once acknowledged) and why it ends.
#[derive(Default)]
struct Socket {
    who: OnceLock<Principal>,
    /// The code a refused `connection_init` got.
    refused: Mutex<Option<ErrorCode>>,
    /// Set when the key was found revoked before an operation.
    revoked: std::sync::atomic::AtomicBool,
    /// Set when `connection_init` arrived: the init timeout is about that, not about how
    /// long its key takes to check.
    init_received: std::sync::atomic::AtomicBool,
}

impl Socket {
    fn refused(&self) -> Option<ErrorCode> {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Open operations of one socket, for [`crate::app::WsLimits::max_operations`]: each
/// subscription holds a [`OperationSlot`] for as long as its stream lives.
#[derive(Clone, Default)]
pub(super) struct Operations(Arc<std::sync::atomic::AtomicUsize>);

/// One open operation; released when dropped.
pub(super) struct OperationSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for OperationSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Operations {
    /// A slot for a new subscription, or `SUBSCRIPTIONS-LIMIT` when the socket has
    /// `max` open.
    pub(super) fn take(&self, max: usize) -> crate::error::Result<OperationSlot> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut n = self.0.load(Relaxed);
        loop {
            if n >= max {
                return Err(Error::reject(
                    ErrorCode::SubscriptionsLimit,
                    format!("this socket already has {max} subscriptions open, the most it may; complete one first"),
                ));
            }
            match self.0.compare_exchange_weak(n, n + 1, Relaxed, Relaxed) {
                Ok(_) => return Ok(OperationSlot(self.0.clone())),
                Err(now) => n = now,
            }
        }
    }
}

/// The close frame for a refused `connection_init`.
fn refusal_code(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::AuthMissing => UNAUTHORIZED,
        ErrorCode::SocketsLimit => TOO_MANY,
        _ => FORBIDDEN,
    }
}

/// True while the key behind `who` is still valid; a database error keeps the socket
/// (the next check decides). Callers box it: awaited in place, its state (a pool
/// checkout and a query) would be part of every socket's future, awaited or not, and
/// made each of 10,000 idle sockets some 6 KiB larger (`bench fanout`).
async fn key_valid(app: &AppRef, who: &Principal) -> bool {
    app.auth.still_valid(&app.db, who).await.unwrap_or(true)
}

/// One WebSocket connection. Like async-graphql-axum's own loop, except that messages
/// that are ready together go out in one write (subscribers of a busy run get a batch
/// of events per wake-up, and a flush per message made that a syscall per event), and
/// for the checks in the module docs.
///
/// When the process starts shutting down the connection closes with [`GOING_AWAY`]
/// rather than letting its subscriptions end: a `complete` would tell the client the
/// run's stream is over, when it only has to resume elsewhere.
async fn serve_ws(socket: WebSocket, schema: AgentSchema, protocol: WebSocketProtocols, app: AppRef) {
    let _open = app.socket_open();
    let mut stopping = app.stopping();
    let state = Arc::new(Socket::default());
    let (mut sink, mut stream) = socket.split();
    // The client's messages are read on a task of their own. async-graphql's protocol
    // stream polls its input each time it is polled for output, and each of those read
    // attempts sized and zeroed tungstenite's read buffer: 7.5% of the server's samples
    // at 1,000 subscribers (docs/benchmarks-log.md, 2026-11-30 06:30). The set aborts the
    // reader when this connection ends, so a client that never sends cannot hold it open.
    let mut reader = tokio::task::JoinSet::new();
    let (read, received) = tokio::sync::mpsc::channel(READ_AHEAD);
    reader.spawn(async move {
        while let Some(m) = stream.next().await {
            let failed = m.is_err();
            if read.send(m).await.is_err() || failed {
                break;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(received);
    let input = {
        let (app, state) = (app.clone(), state.clone());
        stream
            .take_while(|m| futures::future::ready(m.is_ok()))
            .filter_map(|m| {
                futures::future::ready(match m {
                    Ok(m @ (Message::Text(_) | Message::Binary(_))) => {
                        Some(ClientMessage::from_bytes(m.into_data()))
                    }
                    _ => None,
                })
            })
            // Every new operation is authorised with the key's current state: a revoked
            // key ends the input, which ends the handler, and the loop closes with 4403.
            .then(move |m| {
                let (app, state) = (app.clone(), state.clone());
                async move {
                    if let Ok(ClientMessage::ConnectionInit { .. }) = &m {
                        state.init_received.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    if let (Ok(ClientMessage::Start { .. }), Some(who)) = (&m, state.who.get()) {
                        if !Box::pin(key_valid(&app, who)).await {
                            state.revoked.store(true, std::sync::atomic::Ordering::Relaxed);
                            return None;
                        }
                    }
                    Some(m)
                }
            })
            .take_while(|m| futures::future::ready(m.is_some()))
            .filter_map(futures::future::ready)
    };
    let init_state = state.clone();
    let init_app = app.clone();
    let spliced = super::shared::Spliced::default();
    let schema = super::shared::Sharing(schema, app.metrics.clone(), spliced.clone());
    let out = async_graphql::http::WebSocket::from_message_stream(schema, input, protocol)
        .on_connection_init(move |payload| async move {
            let (app, state) = (init_app, init_state);
            let refuse = |e: Error| {
                *state.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.code());
                super::error::gql_error(&e)
            };
            let key = init_key(&payload);
            let who = app.authenticate(key.as_deref()).await.map_err(refuse)?;
            let Some(slot) = app.ws_slot(&who.key_id) else {
                let max = app.settings.ws.max_sockets_per_key;
                return Err(refuse(Error::reject(
                    ErrorCode::SocketsLimit,
                    format!("this API key already has {max} GraphQL WebSockets open, the most it may"),
                )));
            };
            let mut data = Data::default();
            data.insert(app.clone());
            data.insert::<CallerResult>(Ok(who.clone()));
            data.insert(Operations::default());
            data.insert(Arc::new(slot));
            let _ = state.who.set(who);
            Ok(data)
        })
        .map({
            let state = state.clone();
            move |m| match m {
                WsMessage::Text(text) => Message::Text(spliced.splice(text).into()),
                WsMessage::Close(code, reason) => {
                    let code = match code {
                        1002 => state.refused().map_or(BAD_REQUEST, refusal_code),
                        1011 => UNAUTHORIZED,
                        c => c,
                    };
                    Message::Close(Some(CloseFrame { code, reason: reason.into() }))
                }
            }
        });
    futures::pin_mut!(out);
    let stall = app.settings.ws.stall;
    // Alarms, not a `sleep_until` and an `Interval` in the `select!`: those were made or
    // polled (their wakers registered with the timer wheel again) each time the socket
    // woke to send, once per subscriber and page.
    let init_deadline = tokio::time::Instant::now() + INIT_TIMEOUT;
    let mut init_timer = Alarm::at(init_deadline);
    let mut recheck = Alarm::at(init_deadline);
    let close = |code: u16, reason: &str| Message::Close(Some(CloseFrame { code, reason: reason.into() }));
    let bye = loop {
        // The stop flag is set before any stream ends because of it, so checking it
        // before each message keeps those endings from reaching the client.
        enum Woke {
            Stopping,
            InitTimedOut,
            Recheck,
            Out(Option<Message>),
        }
        let woke = tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => Woke::Stopping,
            _ = init_timer.fired(), if !state.init_received.load(std::sync::atomic::Ordering::Relaxed) => {
                Woke::InitTimedOut
            }
            _ = recheck.fired(), if state.who.get().is_some() => Woke::Recheck,
            m = out.next() => Woke::Out(m),
        };
        let first = match woke {
            Woke::Stopping => break close(GOING_AWAY, "server shutting down; reconnect"),
            Woke::InitTimedOut => break close(INIT_TIMED_OUT, "connection_init was not received in time"),
            Woke::Recheck => {
                recheck.reset(tokio::time::Instant::now() + KEY_RECHECK);
                if let Some(who) = state.who.get() {
                    if !Box::pin(key_valid(&app, who)).await {
                        tracing::info!(key_id = %who.key_id, "key revoked; closing its GraphQL WebSocket");
                        break close(FORBIDDEN, "the API key was revoked");
                    }
                }
                continue;
            }
            Woke::Out(m) => m,
        };
        let Some(first) = first else {
            if state.revoked.load(std::sync::atomic::Ordering::Relaxed) {
                break close(FORBIDDEN, "the API key was revoked");
            }
            // The handler ended: the client went away, or it was refused (for the
            // legacy protocol, after its `connection_error`).
            match state.refused() {
                Some(code) => break close(refusal_code(code), code.as_str()),
                None => return,
            }
        };
        // Feed what is ready, then flush once. Each write waits for the client to take
        // the previous ones (back-pressure); one that waits `stall` means the client
        // stopped reading. Nothing is produced for the socket meanwhile, so what it
        // holds stays bounded, and closing it lets go of that too.
        let (mut next, mut closing, mut stuck) = (Some(first), false, false);
        while let Some(m) = next.take() {
            closing = matches!(m, Message::Close(_));
            match within(stall, sink.feed(m)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    stuck = true;
                    break;
                }
            }
            if closing || *stopping.borrow() {
                break;
            }
            next = out.next().now_or_never().flatten();
        }
        if !stuck {
            match within(stall, sink.flush()).await {
                Ok(Ok(())) if !closing => continue,
                Ok(_) => return,
                Err(_) => {}
            }
        }
        tracing::info!("a GraphQL WebSocket client took nothing for {stall:?}; closing it");
        break close(
            TOO_SLOW,
            "the client stopped reading; reconnect and resume after the last seq received",
        );
    };
    // A client that stopped reading may never take the close frame either.
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(bye)).await;
}
