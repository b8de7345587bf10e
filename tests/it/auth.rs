//! Authentication and scopes: 401 for missing or bad keys, 403 for a missing scope,
//! 404 (never 403) for another tenant's run, revocation.

use agent_stream::auth::Scope;
use agent_stream::storage::tenants;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

async fn code(r: reqwest::Response) -> (StatusCode, String) {
    let s = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (s, v["error"]["code"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn missing_malformed_and_unknown_keys_get_401() {
    let t = TestApp::new().await;
    let url = format!("{}/v1/runs", t.base);
    let r = t.http.post(&url).send().await.unwrap();
    assert_eq!(r.headers().get("www-authenticate").map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
    assert_eq!(code(r).await, (StatusCode::UNAUTHORIZED, "AUTH-MISSING".into()));
    let r = t.http.post(&url).header("authorization", "Basic dXNlcjpwYXNz").send().await.unwrap();
    assert_eq!(code(r).await, (StatusCode::UNAUTHORIZED, "AUTH-INVALID".into()));
    let r = t
        .http
        .post(&url)
        .bearer_auth("ask_000000000000_000000000000000000000000000000000000000000000000")
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, (StatusCode::UNAUTHORIZED, "AUTH-INVALID".into()));
    let r = t.http.post(&url).bearer_auth("garbage").send().await.unwrap();
    assert_eq!(code(r).await, (StatusCode::UNAUTHORIZED, "AUTH-INVALID".into()));
    // A key in the query string works (browsers' EventSource cannot set headers).
    let r = t.http.post(format!("{url}?access_token={}", t.key_a)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn scopes_are_enforced() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    let read = t.key_for_a(&[Scope::Read]).await.secret;
    let write = t.key_for_a(&[Scope::Write]).await.secret;
    let (s, v) = t.append(&read, &run, &json!([{"type": "custom.a", "payload": {}}])).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("AUTH-SCOPE")));
    let r = t.http.post(format!("{}/v1/runs", t.base)).bearer_auth(&read).send().await.unwrap();
    assert_eq!(code(r).await, (StatusCode::FORBIDDEN, "AUTH-SCOPE".into()));
    // A write-only key appends but cannot read.
    t.append_ok(&write, &run, json!([{"type": "custom.a", "payload": {}}])).await;
    let r = t.http.get(format!("{}/v1/runs/{run}/events", t.base)).bearer_auth(&write).send().await.unwrap();
    assert_eq!(code(r).await, (StatusCode::FORBIDDEN, "AUTH-SCOPE".into()));
    let r = t.http.get(format!("{}/v1/runs/{run}/events", t.base)).bearer_auth(&read).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 1);
}

#[tokio::test]
async fn another_tenants_run_is_indistinguishable_from_a_missing_one() {
    let t = TestApp::new().await;
    let run_a = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run_a, json!([{"type": "custom.secret", "payload": {"s": 1}}])).await;
    let missing = ulid::Ulid::new().to_string();
    for (path, method) in [("", "GET"), ("/events", "GET"), ("/events", "POST")] {
        let answer = |run: String| {
            let url = format!("{}/v1/runs/{run}{path}", t.base);
            let req = if method == "GET" {
                t.http.get(url)
            } else {
                t.http.post(url).json(&json!([{"type": "custom.x", "payload": {}}]))
            };
            let key = t.key_b.clone();
            async move {
                let r = req.bearer_auth(&key).send().await.unwrap();
                let s = r.status();
                let body = r.text().await.unwrap().replace(&run, "<id>");
                (s, body)
            }
        };
        let theirs = answer(run_a.clone()).await;
        let nobody = answer(missing.clone()).await;
        assert_eq!(theirs.0, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(theirs, nobody, "{method} {path}: same status and body");
    }
    assert_eq!(t.stored_count(&t.tenant_a, &run_a).await, 1);
}

#[tokio::test]
async fn a_revoked_key_stops_working() {
    let t = TestApp::new().await;
    let key = t.key_for_a(&[Scope::Read, Scope::Write]).await;
    let owner = t.db.owner().await;
    assert!(tenants::revoke_key(&owner, &key.key_id).await.unwrap());
    assert!(!tenants::revoke_key(&owner, &key.key_id).await.unwrap(), "second revoke is a no-op");
    let r = t.http.post(format!("{}/v1/runs", t.base)).bearer_auth(&key.secret).send().await.unwrap();
    assert_eq!(code(r).await, (StatusCode::UNAUTHORIZED, "AUTH-INVALID".into()));
}

#[tokio::test]
async fn keys_are_stored_hashed() {
    let t = TestApp::new().await;
    let owner = t.db.owner().await;
    let rows = owner.query("SELECT key_hash, key_id FROM api_keys", &[]).await.unwrap();
    assert!(rows.len() >= 2);
    for r in rows {
        let hash: Vec<u8> = r.get(0);
        assert_eq!(hash.len(), 32);
        assert!(!String::from_utf8_lossy(&hash).contains("ask_"));
    }
    let secret_in_db: i64 = owner
        .query_one("SELECT count(*) FROM api_keys WHERE key_hash::text LIKE '%' || $1 || '%'", &[&t.key_a])
        .await
        .unwrap()
        .get(0);
    assert_eq!(secret_in_db, 0);
}
