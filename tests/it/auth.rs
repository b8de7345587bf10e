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

/// Keys are scoped: a read key cannot append, a write key cannot manage keys; an admin
/// key lists, issues and revokes its own tenant's keys and no other tenant's.
#[tokio::test]
async fn only_admin_keys_manage_keys_and_only_their_tenants() {
    let t = TestApp::new().await;
    let admin = t.key_for_a(&[Scope::Admin]).await.secret;
    let read = t.key_for_a(&[Scope::Read]).await.secret;
    let run = t.create_run(&t.key_a).await;
    let (status, body) =
        t.append(&read, &run, &json!([{"type": "text.delta", "payload": {"text": "x"}}])).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("AUTH-SCOPE")));
    for key in [&t.key_a, &read] {
        let r = t.http.get(format!("{}/v1/keys", t.base)).bearer_auth(key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "a write or read key cannot list keys");
        let r = t
            .http
            .post(format!("{}/v1/keys", t.base))
            .bearer_auth(key)
            .json(&json!({"scopes": ["admin"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "nor issue them");
    }
    let r = t
        .http
        .post(format!("{}/v1/keys", t.base))
        .bearer_auth(&admin)
        .json(&json!({"scopes": ["read"], "label": "dashboard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let issued: Value = r.json().await.unwrap();
    let new_key = issued["key"].as_str().unwrap().to_owned();
    let new_id = issued["key_id"].as_str().unwrap().to_owned();
    assert_eq!(
        t.http.get(format!("{}/v1/runs/{run}", t.base)).bearer_auth(&new_key).send().await.unwrap().status(),
        StatusCode::OK
    );
    let listed: Value = t
        .http
        .get(format!("{}/v1/keys", t.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = listed["keys"].as_array().unwrap();
    assert!(keys.iter().any(|k| k["key_id"] == json!(new_id) && k["label"] == "dashboard"));
    assert!(!listed.to_string().contains(&new_key[16..]), "no secret is ever listed");
    // Tenant b's admin cannot see or revoke a's keys: a's key id is simply not found.
    let mut owner = t.db.owner().await;
    let admin_b = agent_stream::storage::tenants::create_key(&mut owner, "b", &[Scope::Admin], None)
        .await
        .unwrap()
        .secret;
    let listed_b: Value = t
        .http
        .get(format!("{}/v1/keys", t.base))
        .bearer_auth(&admin_b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!listed_b.to_string().contains(&new_id));
    let r = t.http.delete(format!("{}/v1/keys/{new_id}", t.base)).bearer_auth(&admin_b).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = t.http.delete(format!("{}/v1/keys/{new_id}", t.base)).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    tokio::time::sleep(agent_stream::auth::AUTH_CACHE_TTL).await;
    assert_eq!(
        t.http.get(format!("{}/v1/runs/{run}", t.base)).bearer_auth(&new_key).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let r = t
        .http
        .post(format!("{}/v1/keys", t.base))
        .bearer_auth(&admin)
        .json(&json!({"scopes": ["root"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

/// A key whose cached answer is missing (or expired) is looked up once, however many of
/// its requests arrive meanwhile: the others wait for that lookup's answer. Every
/// request of 1,000 streaming appends of one key used to look it up at once each time
/// the answer expired, and commits queued behind those lookups for the pool.
#[tokio::test]
async fn a_keys_concurrent_requests_wait_for_one_lookup() {
    use std::time::Duration;
    let t = std::sync::Arc::new(TestApp::new().await);
    let key = t.key_for_a(&[Scope::Read]).await.secret;
    // Lookups wait on this lock: each one waiting shows in pg_stat_activity.
    let mut holder = t.db.owner().await;
    let tx = holder.transaction().await.expect("begin");
    tx.batch_execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE").await.expect("lock api_keys");
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let (t, key) = (t.clone(), key.clone());
            tokio::spawn(async move { t.get_text(&key, "/v1/runs").await.0 })
        })
        .collect();
    let watcher = t.db.owner().await;
    let waiting = || async {
        let row = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%FROM authenticate(%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        row.get::<_, i64>(0)
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while waiting().await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a lookup reached the database");
    // Time for the other 19 to arrive and, were they not held back, to look it up too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lookups = waiting().await;
    tx.rollback().await.expect("unlock");
    for r in requests {
        let status = tokio::time::timeout(Duration::from_secs(10), r).await.expect("answered").expect("task");
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(lookups, 1, "one lookup for the key's 20 concurrent requests");
}

/// A key in use is refused within [`AUTH_CACHE_TTL`] of its revocation, although its
/// cached answer is refreshed ahead of expiry while it is in use.
///
/// [`AUTH_CACHE_TTL`]: agent_stream::auth::AUTH_CACHE_TTL
#[tokio::test]
async fn a_key_in_use_is_refused_within_the_cache_time_of_its_revocation() {
    use agent_stream::auth::AUTH_CACHE_TTL;
    use std::time::{Duration, Instant};
    let t = TestApp::new().await;
    let key = t.key_for_a(&[Scope::Read]).await;
    assert_eq!(t.get_text(&key.secret, "/v1/runs").await.0, StatusCode::OK);
    let revoked_at = Instant::now();
    assert!(tenants::revoke_key(&t.db.owner().await, &key.key_id).await.expect("revoke"));
    loop {
        let (status, body) = t.get_text(&key.secret, "/v1/runs").await;
        if status == StatusCode::UNAUTHORIZED {
            assert!(body.contains("AUTH-INVALID"), "{body}");
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            revoked_at.elapsed() < AUTH_CACHE_TTL + Duration::from_millis(500),
            "still accepted {:?} after its revocation",
            revoked_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
