//! Row-level security and the append-only rule, checked in SQL as the service role.

use agent_stream::storage::db::{self, SERVICE_ROLE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::TestApp;

/// Runs `sql` as the service role with `tenant`'s setting and returns the first column.
async fn as_service(t: &TestApp, tenant: &str, sql: &str) -> Result<i64, tokio_postgres::Error> {
    let c = t.db.owner().await;
    // As the pool sets its connections up, and as the service scopes a transaction (on
    // Citus the workers' policies see the tenant only this way).
    c.batch_execute(&format!("SET ROLE {SERVICE_ROLE}; SET citus.propagate_set_commands = 'local'; BEGIN"))
        .await?;
    match tenant {
        "" => c.batch_execute("SET LOCAL agent_stream.tenant_id = ''").await?,
        t => c.batch_execute(&db::scope_sql(t).expect("tenant id")).await?,
    }
    let n = c.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0));
    let _ = c.batch_execute("ROLLBACK").await;
    n
}

#[tokio::test]
async fn tenant_b_sees_none_of_tenant_as_rows_even_without_a_filter() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        json!([{"type": "custom.a", "payload": {}}, {"type": "custom.b", "payload": {}}]),
    )
    .await;

    let unfiltered = "SELECT count(*) FROM agent_run_events";
    assert_eq!(as_service(&t, &t.tenant_a, unfiltered).await.unwrap(), 2, "tenant a sees its rows");
    assert_eq!(as_service(&t, &t.tenant_b, unfiltered).await.unwrap(), 0, "tenant b sees none");
    assert_eq!(as_service(&t, &t.tenant_b, "SELECT count(*) FROM runs").await.unwrap(), 0);
    assert_eq!(as_service(&t, &t.tenant_b, "SELECT count(*) FROM tenants").await.unwrap(), 1, "only itself");
    assert_eq!(as_service(&t, "", unfiltered).await.unwrap(), 0, "no tenant set: nothing");

    // Writing a row for another tenant is refused by the policy's WITH CHECK.
    let forged = format!(
        "WITH i AS (INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
         VALUES ('{}', '{run}', 99, 'x', now(), 'custom.x', '{{}}') RETURNING 1) SELECT count(*) FROM i",
        t.tenant_a
    );
    let err = as_service(&t, &t.tenant_b, &forged).await.unwrap_err();
    assert!(
        err.to_string().contains("row-level security") || format!("{err:?}").contains("row-level security"),
        "{err:?}"
    );
    // The service role never reads key hashes, and sees only its tenant's keys' metadata
    // (tenant a has one key; the table holds both tenants').
    assert!(as_service(&t, &t.tenant_a, "SELECT count(key_hash) FROM api_keys").await.is_err());
    assert_eq!(as_service(&t, &t.tenant_a, "SELECT count(key_id) FROM api_keys").await.unwrap(), 1);
    assert_eq!(
        as_service(
            &t,
            &t.tenant_b,
            "SELECT count(key_id) FROM api_keys WHERE tenant_id <> current_setting('agent_stream.tenant_id')"
        )
        .await
        .unwrap(),
        0
    );
}

#[tokio::test]
async fn the_log_is_append_only_for_the_service_role() {
    let t = TestApp::new().await;
    let run = t.create_run(&t.key_a).await;
    t.append_ok(&t.key_a, &run, json!([{"type": "custom.a", "payload": {}}])).await;
    for sql in [
        "WITH u AS (UPDATE agent_run_events SET type = 'custom.z' RETURNING 1) SELECT count(*) FROM u",
        "WITH d AS (DELETE FROM agent_run_events RETURNING 1) SELECT count(*) FROM d",
        "WITH d AS (DELETE FROM runs RETURNING 1) SELECT count(*) FROM d",
    ] {
        let err = as_service(&t, &t.tenant_a, sql).await.unwrap_err();
        let msg = format!("{err:?}");
        assert!(msg.contains("permission denied"), "{sql}: {msg}");
    }
    assert_eq!(t.stored_count(&t.tenant_a, &run).await, 1);
}

#[tokio::test]
async fn the_service_role_is_neither_owner_nor_superuser() {
    let t = TestApp::new().await;
    let c = t.db.owner().await;
    let row = c
        .query_one("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", &[&SERVICE_ROLE])
        .await
        .unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, bool>(1)), (false, false));
    let owner: String = c
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE schemaname = $1 AND tablename = 'agent_run_events'",
            &[&t.db.schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(owner, SERVICE_ROLE);
    // And the pool really runs as it.
    let pooled = t.app.db.pool.get().await.unwrap();
    let who: String = pooled.query_one("SELECT current_user::text", &[]).await.unwrap().get(0);
    assert_eq!(who, SERVICE_ROLE);
}

#[tokio::test]
async fn every_key_of_the_log_carries_the_distribution_column() {
    let t = TestApp::new().await;
    let c = t.db.owner().await;
    // Primary and unique constraints/indexes of the distributed tables.
    let rows = c
        .query(
            "SELECT c.relname::text, i.indexrelid::regclass::text,
                    bool_or(a.attname = 'tenant_id')
             FROM pg_index i
             JOIN pg_class c ON c.oid = i.indrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)
             WHERE n.nspname = $1 AND c.relname IN ('runs', 'agent_run_events', 'run_tombstones') AND (i.indisunique OR i.indisprimary)
             GROUP BY 1, 2",
            &[&t.db.schema],
        )
        .await
        .unwrap();
    assert!(rows.len() >= 4, "{rows:?}");
    for r in rows {
        assert!(r.get::<_, bool>(2), "{} / {} lacks tenant_id", r.get::<_, String>(0), r.get::<_, String>(1));
    }
    let seqs: i64 = c
        .query_one("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'S'", &[&t.db.schema])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seqs, 0, "no sequences: ids and seqs are assigned by the service");
}

#[tokio::test]
async fn every_table_with_a_tenant_column_has_row_level_security() {
    let t = TestApp::new().await;
    let c = t.db.owner().await;
    let rows = c
        .query(
            "SELECT cl.relname::text, cl.relrowsecurity,
                    (SELECT count(*) FROM pg_policy p WHERE p.polrelid = cl.oid)
             FROM pg_class cl
             JOIN pg_namespace n ON n.oid = cl.relnamespace
             JOIN pg_attribute a ON a.attrelid = cl.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
             WHERE n.nspname = $1 AND cl.relkind = 'r'",
            &[&t.db.schema],
        )
        .await
        .unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    for table in ["tenants", "api_keys", "runs", "agent_run_events", "analyst_logins"] {
        assert!(names.iter().any(|n| n == table), "{table} has a tenant column: {names:?}");
    }
    for r in rows {
        let (name, rls, policies): (String, bool, i64) = (r.get(0), r.get(1), r.get(2));
        assert!(rls && policies > 0, "{name}: RLS {rls}, {policies} policies");
    }
}

/// Tenant B's key against tenant A's run on every read path: each answers exactly as
/// for an id that does not exist (same status, code and body apart from the id), and
/// nothing of A's shows up. Ends with the count of A's rows B saw.
#[tokio::test]
async fn every_read_path_answers_another_tenants_run_as_not_found() {
    use futures::StreamExt;
    use std::time::Instant;
    let t = TestApp::new().await;
    let run_a = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run_a,
        json!([{"type": "run.lifecycle", "payload": {"state": "running"}}, {"type": "text.delta", "payload": {"text": "secret of A"}}]),
    )
    .await;
    let ghost = ulid::Ulid::new().to_string();
    let mut leaks = 0usize;
    let paths = [
        "/v1/runs/{}",
        "/v1/runs/{}/events",
        "/v1/runs/{}/view",
        "/v1/runs/{}/stream",
        "/v1/runs/{}/replay?speed=100",
        "/v1/runs/{}/events.jsonl",
        "/v1/runs/{}/stream?format=agui",
    ];
    for p in paths {
        let get = |id: &str| {
            let url = format!("{}{}", t.base, p.replace("{}", id));
            let req = t.http.get(url).bearer_auth(&t.key_b);
            async move {
                let r = req.send().await.expect("send");
                (r.status(), r.text().await.expect("body"))
            }
        };
        let (sa, ba) = get(&run_a).await;
        let (sg, bg) = get(&ghost).await;
        assert_eq!(sa, StatusCode::NOT_FOUND, "{p}: {ba}");
        assert_eq!(
            (sa, ba.replace(&run_a, "ID")),
            (sg, bg.replace(&ghost, "ID")),
            "{p}: same answer as a missing run"
        );
        leaks += usize::from(ba.contains("secret of A"));
    }
    // GraphQL query and subscription.
    let q = "query($id: ID!) { run(id: $id) { id lastSeq } events(runId: $id) { edges { node { seq } } } }";
    let a = t.graphql(Some(&t.key_b), q, json!({"id": run_a})).await;
    let g = t.graphql(Some(&t.key_b), q, json!({"id": ghost})).await;
    assert_eq!(a.to_string().replace(&run_a, "ID"), g.to_string().replace(&ghost, "ID"));
    assert!(a["data"].is_null() || a["data"]["run"].is_null(), "{a}");
    leaks += usize::from(a.to_string().contains("secret of A"));
    // The tenant-wide export holds none of A's rows for B.
    let (_, all_b) = t.get_text(&t.key_b, "/v1/events.jsonl").await;
    leaks += all_b.lines().filter(|l| l.contains(&run_a)).count();
    // An import by B of A's export creates B's own run and leaves A's untouched.
    let (_, export) = t.get_text(&t.key_a, &format!("/v1/runs/{run_a}/events.jsonl")).await;
    let r = t
        .http
        .post(format!("{}/v1/runs/import", t.base))
        .bearer_auth(&t.key_b)
        .body(export)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let copy: Value = r.json().await.unwrap();
    assert_ne!(copy["run_id"], json!(run_a));
    assert_eq!(t.stored_count(&t.tenant_a, &run_a).await, 2);
    assert_eq!(t.stored_count(&t.tenant_b, copy["run_id"].as_str().unwrap()).await, 2);
    // Timing: B's lookups of A's run and of a missing id take the same path (one
    // RLS-filtered query); their medians stay close.
    let time = |id: String| {
        let (http, base, key) = (t.http.clone(), t.base.clone(), t.key_b.clone());
        async move {
            let mut v = vec![];
            for _ in 0..15 {
                let s = Instant::now();
                let _ = http
                    .get(format!("{base}/v1/runs/{id}/events"))
                    .bearer_auth(&key)
                    .send()
                    .await
                    .unwrap()
                    .bytes_stream()
                    .next()
                    .await;
                v.push(s.elapsed());
            }
            v.sort();
            v[v.len() / 2]
        }
    };
    let (ma, mg) = (time(run_a.clone()).await, time(ghost.clone()).await);
    eprintln!("median lookup: A's run {ma:?}, missing run {mg:?}; A's rows seen by B: {leaks}");
    assert!(
        ma < mg * 4 + std::time::Duration::from_millis(5)
            && mg < ma * 4 + std::time::Duration::from_millis(5)
    );
    assert_eq!(leaks, 0, "cross-tenant rows seen");
}
