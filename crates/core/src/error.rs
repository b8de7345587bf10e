//! The stable, machine-readable codes clients see, and [`Rejection`]: what the pure
//! layers (parsing, validation, dialects) answer when the input is refused.
//!
//! Every rejection carries an [`ErrorCode`] whose string form is part of the public
//! contract: clients switch on it, so a code is never renamed once shipped. The mapping
//! from code to HTTP status lives at the edge (`http::error`), the GraphQL mapping in
//! `graphql::error`; nothing else decides how an error looks on the wire.

use std::fmt;

/// A stable error code; `as_str` is the wire form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// No API key was presented.
    AuthMissing,
    /// The API key is unknown, malformed or revoked.
    AuthInvalid,
    /// The key is valid but lacks the scope the operation needs.
    AuthScope,
    /// The run does not exist for this tenant (also for other tenants' runs).
    RunNotFound,
    /// The run existed but retention deleted it: its log is gone for good (seed 004's
    /// `KAI-STREAM-CONN-0002`, the replay window expired).
    RunExpired,
    /// The run (or the child scope) reached a terminal state.
    RunClosed,
    /// `expected_last_seq` did not match the run's last seq.
    SeqConflict,
    /// The body is not valid JSON / NDJSON of the expected shape.
    BodyMalformed,
    /// The body's content type is not one we accept.
    UnsupportedMediaType,
    /// The request body exceeds the configured limit.
    BodyTooLarge,
    /// The batch holds no events.
    BatchEmpty,
    /// The batch holds more events than allowed.
    BatchTooLarge,
    /// An event is not an object of the envelope shape.
    EventMalformed,
    /// The `type` is not part of the vocabulary.
    UnknownType,
    /// The payload misses a field, has a wrong type or an unknown field.
    InvalidPayload,
    /// A single event exceeds the per-event size limit.
    EventTooLarge,
    /// A number PostgreSQL's `jsonb` cannot hold exactly (a negative zero, or out of
    /// `numeric`'s range), or a float field's value that a 64-bit float cannot hold.
    NumberUnstorable,
    /// The event type may only be written by the service itself.
    Reserved,
    /// `tool.progress` / `tool.end` for a call that never started.
    ToolUnknownCall,
    /// A second `tool.start` for one call id.
    ToolDuplicateCall,
    /// An event for a tool call that already ended.
    ToolCallEnded,
    /// `message.end` with no open message to end.
    MessageUnknown,
    /// A second `message.start` for one message id.
    MessageDuplicate,
    /// A delta or end for a message that already ended.
    MessageEnded,
    /// `message.end.text` differs from the accumulated text.
    MessageTextMismatch,
    /// A lifecycle transition the state table does not allow.
    LifecycleIllegal,
    /// An event names a child that was never spawned.
    ChildUnknown,
    /// A second `child.spawn` for one child id.
    ChildDuplicate,
    /// A plan decision with no matching pending proposal.
    PlanNotPending,
    /// One idempotency key appears twice in a batch.
    KeyRepeated,
    /// A retried key arrives with different content, or a batch mixes stored and new keys.
    IdempotencyMismatch,
    /// A string holds U+0000, which PostgreSQL's text and jsonb cannot store.
    TextNul,
    /// A query or path parameter is invalid.
    InvalidParameter,
    /// A resume cursor (`Last-Event-ID`, `after_seq`, `afterSeq`, `from_seq`) is beyond
    /// the end of the run's log: the client has seen events this run never had.
    CursorBeyondEnd,
    /// The route does not exist.
    NotFound,
    /// The route exists but not with this method (the `Allow` header lists those it has).
    MethodNotAllowed,
    /// A tenant or key with that name already exists.
    AlreadyExists,
    /// The tenant's append rate limit is reached; retry after `Retry-After`.
    RateLimited,
    /// A GraphQL WebSocket already has as many operations open as it may.
    SubscriptionsLimit,
    /// The API key already has as many GraphQL WebSockets open as it may.
    SocketsLimit,
    /// The database is unreachable or overloaded; retry later.
    Unavailable,
    /// An unexpected server-side failure (details are logged, not sent).
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of the README's table.
    pub const ALL: [ErrorCode; 42] = [
        ErrorCode::AuthMissing,
        ErrorCode::AuthInvalid,
        ErrorCode::AuthScope,
        ErrorCode::RunNotFound,
        ErrorCode::RunExpired,
        ErrorCode::RunClosed,
        ErrorCode::SeqConflict,
        ErrorCode::BodyMalformed,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::BodyTooLarge,
        ErrorCode::BatchEmpty,
        ErrorCode::BatchTooLarge,
        ErrorCode::EventMalformed,
        ErrorCode::UnknownType,
        ErrorCode::InvalidPayload,
        ErrorCode::EventTooLarge,
        ErrorCode::NumberUnstorable,
        ErrorCode::Reserved,
        ErrorCode::ToolUnknownCall,
        ErrorCode::ToolDuplicateCall,
        ErrorCode::ToolCallEnded,
        ErrorCode::MessageUnknown,
        ErrorCode::MessageDuplicate,
        ErrorCode::MessageEnded,
        ErrorCode::MessageTextMismatch,
        ErrorCode::LifecycleIllegal,
        ErrorCode::ChildUnknown,
        ErrorCode::ChildDuplicate,
        ErrorCode::PlanNotPending,
        ErrorCode::KeyRepeated,
        ErrorCode::IdempotencyMismatch,
        ErrorCode::TextNul,
        ErrorCode::InvalidParameter,
        ErrorCode::CursorBeyondEnd,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::AlreadyExists,
        ErrorCode::RateLimited,
        ErrorCode::SubscriptionsLimit,
        ErrorCode::SocketsLimit,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The stable wire form of the code.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            AuthMissing => "AUTH-MISSING",
            AuthInvalid => "AUTH-INVALID",
            AuthScope => "AUTH-SCOPE",
            RunNotFound => "RUN-NOT-FOUND",
            RunExpired => "RUN-EXPIRED",
            RunClosed => "RUN-CLOSED",
            SeqConflict => "SEQ-CONFLICT",
            BodyMalformed => "BODY-MALFORMED",
            UnsupportedMediaType => "BODY-UNSUPPORTED-MEDIA-TYPE",
            BodyTooLarge => "BODY-TOO-LARGE",
            BatchEmpty => "BATCH-EMPTY",
            BatchTooLarge => "BATCH-TOO-LARGE",
            EventMalformed => "EVENT-MALFORMED",
            UnknownType => "EVENT-UNKNOWN-TYPE",
            InvalidPayload => "EVENT-INVALID-PAYLOAD",
            EventTooLarge => "EVENT-TOO-LARGE",
            NumberUnstorable => "EVENT-NUMBER-UNSTORABLE",
            Reserved => "EVENT-RESERVED",
            ToolUnknownCall => "TOOL-UNKNOWN-CALL",
            ToolDuplicateCall => "TOOL-DUPLICATE-CALL",
            ToolCallEnded => "TOOL-CALL-ENDED",
            MessageUnknown => "MESSAGE-UNKNOWN",
            MessageDuplicate => "MESSAGE-DUPLICATE",
            MessageEnded => "MESSAGE-ENDED",
            MessageTextMismatch => "MESSAGE-TEXT-MISMATCH",
            LifecycleIllegal => "LIFECYCLE-ILLEGAL-TRANSITION",
            ChildUnknown => "CHILD-UNKNOWN",
            ChildDuplicate => "CHILD-DUPLICATE",
            PlanNotPending => "PLAN-NOT-PENDING",
            KeyRepeated => "IDEMPOTENCY-KEY-REPEATED",
            IdempotencyMismatch => "IDEMPOTENCY-MISMATCH",
            TextNul => "TEXT-NUL",
            InvalidParameter => "PARAM-INVALID",
            CursorBeyondEnd => "CURSOR-BEYOND-END",
            NotFound => "NOT-FOUND",
            MethodNotAllowed => "METHOD-NOT-ALLOWED",
            AlreadyExists => "ALREADY-EXISTS",
            RateLimited => "RATE-LIMITED",
            SubscriptionsLimit => "SUBSCRIPTIONS-LIMIT",
            SocketsLimit => "SOCKETS-LIMIT",
            Unavailable => "SERVICE-UNAVAILABLE",
            Internal => "INTERNAL",
        }
    }
}

impl ErrorCode {
    /// Seed 004's code (§8, namespace `KAI-STREAM-`) for the codes it has one for; sent
    /// beside ours as `kai_code`, which stays the code to switch on.
    pub fn kai_code(self) -> Option<&'static str> {
        use ErrorCode::*;
        match self {
            RunExpired => Some("KAI-STREAM-CONN-0002"),
            EventMalformed | InvalidPayload => Some("KAI-STREAM-PROTO-0001"),
            UnknownType => Some("KAI-STREAM-PROTO-0002"),
            _ => None,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A client-caused rejection: a code, a message for people, and the offending event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Rejection {
    /// The stable code.
    pub code: ErrorCode,
    /// What went wrong, phrased for the person reading it.
    pub message: String,
    /// Index of the offending event in the batch (0-based), when one event is to blame.
    pub index: Option<usize>,
}

impl Rejection {
    /// A rejection not tied to a particular event.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), index: None }
    }

    /// Blames the event at `index` of the batch.
    pub fn at(mut self, index: usize) -> Self {
        self.index = Some(index);
        self
    }
}

/// Longest message a client gets: messages quote parts of the input (a field name, a
/// type), each already cut to a few dozen characters where it is known to be echoed;
/// this bounds the rest (serde's explanations quote names whole).
pub const MAX_MESSAGE: usize = 1024;

/// `m`, cut to [`MAX_MESSAGE`] bytes (at a character boundary) with `…`.
pub fn cap_message(m: &str) -> String {
    if m.len() <= MAX_MESSAGE {
        return m.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… (message cut at {MAX_MESSAGE} bytes)", &m[..end])
}

/// A result whose error is a [`Rejection`].
pub type Result<T, E = Rejection> = std::result::Result<T, E>;
