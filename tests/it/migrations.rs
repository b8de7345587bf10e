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
