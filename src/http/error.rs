//! The one mapping from [`Error`] to an HTTP answer: status, `{"error": {...}}` body,
//! and `Retry-After` / `WWW-Authenticate` where they apply. Server-side failures are
//! logged with their cause and reach the client only as a generic message.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::{Error, ErrorCode};

/// HTTP status for a code.
pub fn status(code: ErrorCode) -> StatusCode {
    use ErrorCode::*;
    match code {
        AuthMissing | AuthInvalid => StatusCode::UNAUTHORIZED,
        AuthScope => StatusCode::FORBIDDEN,
        RunNotFound | NotFound => StatusCode::NOT_FOUND,
        MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        RunExpired => StatusCode::GONE,
        RunClosed | SeqConflict | IdempotencyMismatch | AlreadyExists | PlanNotPending => {
            StatusCode::CONFLICT
        }
        BodyMalformed | EventMalformed | InvalidParameter | BatchEmpty | KeyRepeated | TextNul => {
            StatusCode::BAD_REQUEST
        }
        UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        // The position asked for lies beyond what the run has: "range not satisfiable".
        CursorBeyondEnd => StatusCode::RANGE_NOT_SATISFIABLE,
        BodyTooLarge | BatchTooLarge | EventTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        UnknownType | InvalidPayload | NumberUnstorable | Reserved | ToolUnknownCall | ToolDuplicateCall
        | ToolCallEnded | MessageUnknown | MessageDuplicate | MessageEnded | MessageTextMismatch
        | LifecycleIllegal | ChildUnknown | ChildDuplicate => StatusCode::UNPROCESSABLE_ENTITY,
        RateLimited | SubscriptionsLimit | SocketsLimit => StatusCode::TOO_MANY_REQUESTS,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An [`Error`] on its way to an HTTP client: the one mapping from our errors to HTTP
/// answers (a newtype, since the error type belongs to the store layer).
#[derive(Debug)]
pub struct HttpError(pub Error);

/// What HTTP handlers return.
pub type ApiResult<T> = std::result::Result<T, HttpError>;

impl<E: Into<Error>> From<E> for HttpError {
    fn from(e: E) -> Self {
        HttpError(e.into())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let code = e.code();
        let (mut body, index) = detail(&e);
        if let Some(i) = index {
            body["index"] = json!(i);
        }
        let mut resp = (status(code), Json(json!({ "error": body }))).into_response();
        let headers = resp.headers_mut();
        match code {
            ErrorCode::Unavailable | ErrorCode::RateLimited => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ErrorCode::AuthMissing | ErrorCode::AuthInvalid => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}

/// The `{"code", "message", "kai_code"?}` object of an error as clients see it, and the
/// index of the event to blame: shared by error answers and the error lines of streamed
/// answers (`POST /v1/runs/{run_id}/events/stream`), so both say the same.
pub(crate) fn detail(e: &Error) -> (serde_json::Value, Option<usize>) {
    let code = e.code();
    let (message, index) = e.public_parts();
    let mut body = json!({ "code": code.as_str(), "message": message });
    if let Some(kai) = code.kai_code() {
        body["kai_code"] = json!(kai);
    }
    (body, index)
}
