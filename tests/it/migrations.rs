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

/// Appends move `last_seq`, `last_event_id` and `updated_at` of their run's row on every
/// commit: no index of `runs` may hold one of them, or no such update can be HOT and
/// every single delta leaves a dead version in each index (migration 0008).
#[tokio::test]
async fn what_appends_move_is_in_no_index_so_their_updates_are_hot() {
    let t = crate::common::TestApp::new().await;
    let c = t.db.owner().await;
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
    for moved in ["last_seq", "last_event_id", "updated_at"] {
        assert!(!indexed.contains(&moved.to_owned()), "`{moved}` is indexed: {indexed:?}");
    }
    // On plain PostgreSQL the table's statistics show it (on Citus they are the shards').
    if t.db.citus().await {
        return;
    }
    let run = t.create_run(&t.key_a).await;
    for i in 0..60 {
        t.append_ok(
            &t.key_a,
            &run,
            serde_json::json!([{"type": "text.delta", "payload": {"text": format!("{i}")}}]),
        )
        .await;
    }
    // Backends report their statistics when idle, at most once a second (10 s when busy).
    let mut seen = (0, 0);
    for _ in 0..40 {
        let r = c
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                  WHERE schemaname = current_schema() AND relname = 'runs'",
                &[],
            )
            .await
            .expect("pg_stat_user_tables");
        seen = (r.get::<_, i64>(0), r.get::<_, i64>(1));
        if seen.0 >= 60 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(seen.0 >= 60, "60 appends, {} updates of runs reported", seen.0);
    assert!(seen.1 * 10 >= seen.0 * 9, "{} of {} updates of runs were HOT", seen.1, seen.0);
}
