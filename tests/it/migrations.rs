//! Migrations are recorded, idempotent, and safe to run from several processes at once.

use agent_stream::storage::migrate::{migrate, MIGRATIONS};

use crate::common::TestDb;

#[tokio::test]
async fn migrations_run_twice_and_concurrently() {
    let db = TestDb::unmigrated().await;
    let runs = futures::future::join_all((0..4).map(|_| migrate(&db.url, &db.schema))).await;
    let mut applied = 0;
    for r in runs {
        let r = r.expect("concurrent migrate");
        applied += r.applied.len();
    }
    assert_eq!(applied, MIGRATIONS.len(), "each migration applied exactly once");
    let again = migrate(&db.url, &db.schema).await.unwrap();
    assert!(again.applied.is_empty());
    assert_eq!(again.skipped.len(), MIGRATIONS.len());
    let c = db.owner().await;
    let n: i64 = c.query_one("SELECT count(*) FROM schema_migrations", &[]).await.unwrap().get(0);
    assert_eq!(n as usize, MIGRATIONS.len());
}

#[tokio::test]
async fn an_edited_migration_is_detected() {
    let db = TestDb::new().await;
    let c = db.owner().await;
    c.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1", &[]).await.unwrap();
    let err = migrate(&db.url, &db.schema).await.unwrap_err();
    assert!(err.to_string().contains("changed after it was applied"), "{err}");
}

/// A run's head is its log's last row (migration 0009): appends write the run's row only
/// when they change its state, so a run streamed to by single deltas costs one row
/// written per delta, not two. `updated_at`, which a state change moves, is in no index
/// of `runs`, so those updates can be HOT (migration 0008).
#[tokio::test]
async fn appends_write_their_runs_row_only_when_its_state_changes() {
    let t = crate::common::TestApp::new().await;
    let c = t.db.owner().await;
    let columns: Vec<String> = c
        .query(
            "SELECT column_name::text FROM information_schema.columns
              WHERE table_schema = current_schema() AND table_name = 'runs'",
            &[],
        )
        .await
        .expect("columns")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(columns.contains(&"state".to_owned()), "the query reads the columns: {columns:?}");
    for gone in ["last_seq", "last_event_id"] {
        assert!(!columns.contains(&gone.to_owned()), "runs still has `{gone}`: {columns:?}");
    }
    let indexed: Vec<String> = c
        .query(
            "SELECT DISTINCT a.attname::text FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
              WHERE i.indrelid = 'runs'::regclass",
            &[],
        )
        .await
        .expect("index columns")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(indexed.contains(&"tenant_id".to_owned()), "the query reads the indexes: {indexed:?}");
    assert!(!indexed.contains(&"updated_at".to_owned()), "`updated_at` is indexed: {indexed:?}");
    // On plain PostgreSQL the table's statistics show it (on Citus they are the shards').
    if t.db.citus().await {
        return;
    }
    let run = t.create_run(&t.key_a).await;
    t.append_ok(
        &t.key_a,
        &run,
        serde_json::json!([{"type": "run.lifecycle", "payload": {"state": "running"}}]),
    )
    .await;
    for i in 0..60 {
        t.append_ok(
            &t.key_a,
            &run,
            serde_json::json!([{"type": "text.delta", "payload": {"text": format!("{i}")}}]),
        )
        .await;
    }
    // Backends report their statistics when idle, at most once a second (10 s when busy):
    // wait until every row written is counted, then a little longer for any late report.
    let stats = "SELECT (SELECT n_tup_upd FROM pg_stat_user_tables
                          WHERE schemaname = current_schema() AND relname = 'runs'),
                        (SELECT n_tup_ins FROM pg_stat_user_tables
                          WHERE schemaname = current_schema() AND relname = 'agent_run_events')";
    let mut seen = (0, 0);
    for _ in 0..40 {
        let r = c.query_one(stats, &[]).await.expect("pg_stat_user_tables");
        seen = (r.get::<_, i64>(0), r.get::<_, i64>(1));
        if seen.0 >= 1 && seen.1 >= 61 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(seen.1 >= 61, "61 events appended, {} inserts reported", seen.1);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = c.query_one(stats, &[]).await.expect("pg_stat_user_tables");
    let updates: i64 = r.get(0);
    assert_eq!(updates, 1, "61 appends, one state change: {updates} updates of runs");
    let api = t.get_json(&t.key_a, &format!("/v1/runs/{run}")).await;
    assert_eq!(api["last_seq"], 61, "the run's head, read from the log: {api}");
}
