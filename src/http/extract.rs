//! Extractors that answer in our error format instead of axum's plain-text rejections.

use axum::body::Body;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use serde::de::DeserializeOwned;

use crate::app::AppRef;
use crate::auth::Principal;
use crate::domain::Framing;
use crate::error::{Error, ErrorCode, Result};

/// The authenticated caller: `Authorization: Bearer <key>`, or `?access_token=` for
/// browsers whose EventSource cannot set headers.
pub struct Caller(pub Principal);

/// The key a request presents, if any.
pub fn presented_key(parts: &Parts) -> Result<Option<String>> {
    if let Some(v) = parts.headers.get(header::AUTHORIZATION) {
        let v = v.to_str().map_err(|_| bad_auth())?;
        let key = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")).ok_or_else(bad_auth)?;
        return Ok(Some(key.trim().to_owned()));
    }
    // Browsers' EventSource cannot set headers, so streams accept the key in the URL.
    let params = Query::<std::collections::HashMap<String, String>>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .unwrap_or_default();
    Ok(params.get("access_token").cloned())
}

fn bad_auth() -> Error {
    Error::reject(ErrorCode::AuthInvalid, "the Authorization header must be `Bearer <key>`")
}

impl FromRequestParts<AppRef> for Caller {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(parts: &mut Parts, app: &AppRef) -> super::error::ApiResult<Self> {
        let key = presented_key(parts)?;
        Ok(Caller(app.authenticate(key.as_deref()).await?))
    }
}

/// Query-string parameters, rejected with `PARAM-INVALID` and serde's explanation.
/// `access_token` is the [`Caller`]'s, so it is taken out before `T` (which refuses
/// unknown parameters) sees the query.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = super::error::HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> super::error::ApiResult<Self> {
        let query: Vec<&str> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("access_token"))
            .collect();
        serde_urlencoded::from_str::<T>(&query.join("&")).map(Params).map_err(|e| {
            Error::reject(ErrorCode::InvalidParameter, format!("invalid query string: {e}")).into()
        })
    }
}

/// How an append body is framed, from its Content-Type.
pub fn framing(headers: &HeaderMap) -> Result<Framing> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match mime.as_str() {
        "application/json" => Ok(Framing::Json),
        "application/x-ndjson" | "application/ndjson" | "application/jsonl" | "application/x-jsonlines"
        | "application/jsonlines" => Ok(Framing::Ndjson),
        "" => Err(Error::reject(
            ErrorCode::UnsupportedMediaType,
            "missing Content-Type: send application/json (an array of events) or application/x-ndjson (one event per line)",
        )),
        other => Err(Error::reject(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Type `{other}` is not accepted: send application/json or application/x-ndjson"),
        )),
    }
}

/// Reads a body of at most `limit` bytes. A declared Content-Length over the limit is
/// refused before reading anything; an undeclared one is cut off at the limit.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<bytes::Bytes> {
    let too_large = || {
        Error::reject(ErrorCode::BodyTooLarge, format!("the request body exceeds the limit of {limit} bytes"))
    };
    if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(too_large());
        }
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            Err(Error::reject(ErrorCode::BodyMalformed, format!("could not read the request body: {e}")))
        }
    }
}

/// Reads a JSON body of at most `limit` bytes into `T` (`BODY-MALFORMED` when it is not).
pub async fn read_json<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T> {
    let bytes = read_body(headers, body, limit).await?;
    let malformed =
        |e: serde_json::Error| Error::reject(ErrorCode::BodyMalformed, format!("invalid body: {e}"));
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).map_err(malformed)?;
    crate::domain::text::check_json("body", &mut v)?;
    serde_json::from_value(v).map_err(malformed)
}
