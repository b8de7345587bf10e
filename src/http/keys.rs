//! `/v1/keys`: a tenant's admins list, issue and revoke the tenant's own API keys
//! (the `admin` scope; read and write keys get `403 AUTH-SCOPE`).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::extract::{read_json, Caller};
use crate::app::AppRef;
use crate::auth::Scope;
use crate::error::{Error, ErrorCode};
use crate::storage::db::tenant_tx;
use crate::storage::tenants;

/// A new key's scopes (`read`, `write`, `admin`) and an optional label.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewKey {
    scopes: Vec<String>,
    #[serde(default)]
    label: Option<String>,
}

/// `GET /v1/keys`: the tenant's keys (ids, scopes, labels, dates; never secrets).
#[utoipa::path(get, path = "/v1/keys", tag = "keys", security(("bearer" = [])),
    responses(
        (status = 200, description = "The tenant's keys (never secrets)", body = crate::http::openapi::KeyList),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn list(
    State(app): State<AppRef>,
    Caller(who): Caller,
) -> super::error::ApiResult<Response> {
    who.require(Scope::Admin)?;
    let mut client = app.db.pool.get().await?;
    let tx = tenant_tx(&mut client, &who.tenant_id).await?;
    let keys = tenants::list_keys(&tx, &who.tenant_id).await?;
    tx.commit().await?;
    Ok(Json(json!({ "keys": keys })).into_response())
}

/// `POST /v1/keys` with `{"scopes": ["read", …], "label": "…"}`: a new key, shown once.
#[utoipa::path(post, path = "/v1/keys", tag = "keys", security(("bearer" = [])), request_body = NewKey,
    responses(
        (status = 201, description = "The new key, its secret shown once", body = crate::http::openapi::NewKeyAnswer),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn create(
    State(app): State<AppRef>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Body,
) -> super::error::ApiResult<Response> {
    who.require(Scope::Admin)?;
    let req: NewKey = read_json(&headers, body, 16 << 10).await?;
    let mut scopes = Vec::with_capacity(req.scopes.len());
    for s in &req.scopes {
        let scope = Scope::parse(s).ok_or_else(|| {
            Error::reject(
                ErrorCode::InvalidParameter,
                format!("unknown scope `{}`: use read, write or admin", crate::domain::text::echo(s)),
            )
        })?;
        if scopes.contains(&scope) {
            return Err(
                Error::reject(ErrorCode::InvalidParameter, format!("scope `{s}` is listed twice")).into()
            );
        }
        scopes.push(scope);
    }
    if scopes.is_empty() {
        return Err(Error::reject(
            ErrorCode::InvalidParameter,
            "`scopes` names no scope: give read, write or admin",
        )
        .into());
    }
    if req.label.as_ref().is_some_and(|l| l.len() > 200) {
        return Err(Error::reject(ErrorCode::InvalidParameter, "`label` is at most 200 bytes").into());
    }
    let mut client = app.db.pool.get().await?;
    let tx = tenant_tx(&mut client, &who.tenant_id).await?;
    let key = tenants::issue_key(&tx, &who.tenant_id, &scopes, req.label.as_deref()).await?;
    tx.commit().await?;
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    Ok((
        StatusCode::CREATED,
        Json(json!({"key_id": key.key_id, "key": key.secret, "scopes": scopes, "label": req.label})),
    )
        .into_response())
}

/// `DELETE /v1/keys/{key_id}`: revokes one of the tenant's keys (open streams using it
/// close within 5 s).
#[utoipa::path(delete, path = "/v1/keys/{key_id}", tag = "keys", security(("bearer" = [])),
    params(("key_id" = String, Path, description = "The key's id: the 12 hex digits after `ask_`")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn revoke(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(key_id): Path<String>,
) -> super::error::ApiResult<Response> {
    who.require(Scope::Admin)?;
    let mut client = app.db.pool.get().await?;
    let tx = tenant_tx(&mut client, &who.tenant_id).await?;
    let revoked = tenants::revoke_own_key(&tx, &who.tenant_id, &key_id).await?;
    tx.commit().await?;
    if revoked {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(Error::reject(
            ErrorCode::NotFound,
            format!("no live key `{}` in this tenant", crate::domain::text::echo(&key_id)),
        )
        .into())
    }
}
