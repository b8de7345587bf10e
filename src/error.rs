//! The crate's error type and the stable, machine-readable codes clients see.
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
    /// A query or path parameter is invalid.
    InvalidParameter,
    /// The route does not exist.
    NotFound,
    /// A tenant or key with that name already exists.
    AlreadyExists,
    /// The tenant's append rate limit is reached; retry after `Retry-After`.
    RateLimited,
    /// The database is unreachable or overloaded; retry later.
    Unavailable,
    /// An unexpected server-side failure (details are logged, not sent).
    Internal,
}

impl ErrorCode {
    /// The stable wire form of the code.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            AuthMissing => "AUTH-MISSING",
            AuthInvalid => "AUTH-INVALID",
            AuthScope => "AUTH-SCOPE",
            RunNotFound => "RUN-NOT-FOUND",
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
            InvalidParameter => "PARAM-INVALID",
            NotFound => "NOT-FOUND",
            AlreadyExists => "ALREADY-EXISTS",
            RateLimited => "RATE-LIMITED",
            Unavailable => "SERVICE-UNAVAILABLE",
            Internal => "INTERNAL",
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

/// Every error the library returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request was refused; nothing was written.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A database call failed.
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The connection was lost after COMMIT was sent, and whether the transaction
    /// committed could not be checked either.
    #[error("commit outcome unknown: {0}")]
    InDoubt(String),
    /// Anything else that is the server's fault.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    /// Shorthand for a rejection with no event index.
    pub fn reject(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Rejected(Rejection::new(code, message))
    }

    /// What a client is told: the message and offending index for rejections, a
    /// generic message for server-side failures (whose cause is logged here instead).
    pub fn public_parts(&self) -> (String, Option<usize>) {
        match self {
            Error::Rejected(r) => (r.message.clone(), r.index),
            Error::InDoubt(_) => {
                tracing::warn!(error = %self, "commit outcome unknown");
                (
                    "the connection to the database was lost while committing, and whether the append \
                     was stored could not be checked; retry it with the same idempotency keys to find out"
                        .to_owned(),
                    None,
                )
            }
            _ if self.code() == ErrorCode::Unavailable => {
                tracing::warn!(error = %self, "database unavailable");
                ("the database is unavailable; retry shortly".to_owned(), None)
            }
            _ => {
                tracing::error!(error = ?self, "internal error");
                ("internal error; the cause has been logged".to_owned(), None)
            }
        }
    }

    /// The code a client sees for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Rejected(r) => r.code,
            Error::Db(e) if is_unavailable(e) => ErrorCode::Unavailable,
            Error::Pool(_) | Error::InDoubt(_) => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}

/// True when a database error means "try again later" rather than a bug: the
/// connection is gone, the server is starting or shutting down, or it is overloaded.
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            // Class 08: connection exceptions; 57P: operator intervention (shutdown,
            // cannot connect now); 53: insufficient resources; 40001/40P01: retryable.
            c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") || c == "40001" || c == "40P01"
        }
        // No SQLSTATE means the error came from the socket, not the server.
        None => true,
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
