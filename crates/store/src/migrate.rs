//! Schema migrations: the ordered files in `sql/`, applied once each, recorded with a
//! checksum, under an advisory lock so two processes can migrate at the same time.

use sha2::{Digest, Sha256};

use super::db::{connect_owner, quote_ident};
use crate::error::{Error, Result};

/// One migration: its version, name and SQL text (embedded at build time).
pub struct Migration {
    /// Position in the order; never reused.
    pub version: i32,
    /// File name, for humans.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Every migration, in order. The files in `sql/` are the source of truth.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "0001_log.sql", sql: include_str!("../../../sql/0001_log.sql") },
    Migration {
        version: 2,
        name: "0002_analyst_views.sql",
        sql: include_str!("../../../sql/0002_analyst_views.sql"),
    },
    Migration {
        version: 3,
        name: "0003_retention.sql",
        sql: include_str!("../../../sql/0003_retention.sql"),
    },
    Migration {
        version: 4,
        name: "0004_key_admin.sql",
        sql: include_str!("../../../sql/0004_key_admin.sql"),
    },
    Migration { version: 5, name: "0005_citus.sql", sql: include_str!("../../../sql/0005_citus.sql") },
    Migration {
        version: 6,
        name: "0006_live_secret.sql",
        sql: include_str!("../../../sql/0006_live_secret.sql"),
    },
    Migration {
        version: 7,
        name: "0007_run_tombstones.sql",
        sql: include_str!("../../../sql/0007_run_tombstones.sql"),
    },
    Migration {
        version: 8,
        name: "0008_hot_run_heads.sql",
        sql: include_str!("../../../sql/0008_hot_run_heads.sql"),
    },
    Migration {
        version: 9,
        name: "0009_heads_in_the_log.sql",
        sql: include_str!("../../../sql/0009_heads_in_the_log.sql"),
    },
];

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Versions applied by this call.
    pub applied: Vec<i32>,
    /// Versions that were already there.
    pub skipped: Vec<i32>,
}

fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// Applies every pending migration to `schema`, creating it if needed.
pub async fn migrate(url: &str, schema: &str) -> Result<Report> {
    let mut client = connect_owner(url, schema).await?;
    // Advisory locks are per database; keying on the schema lets tests migrate their
    // own schemas in parallel while two processes on one schema take turns.
    let lock_key = format!("agent-stream migrate {schema}");
    client.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&lock_key]).await?;
    let result = apply_all(&mut client, schema).await;
    // Unlock even after a failure; the session ends with the client anyway.
    let _ = client.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", &[&lock_key]).await;
    result
}

async fn apply_all(client: &mut tokio_postgres::Client, schema: &str) -> Result<Report> {
    let q = quote_ident(schema);
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {q};
             CREATE TABLE IF NOT EXISTS {q}.schema_migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 checksum text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );"
        ))
        .await?;
    let rows = client
        .query(&format!("SELECT version, name, checksum FROM {q}.schema_migrations ORDER BY version"), &[])
        .await?;
    let mut report = Report { applied: vec![], skipped: vec![] };
    for m in MIGRATIONS {
        let sum = checksum(m.sql);
        if let Some(row) = rows.iter().find(|r| r.get::<_, i32>(0) == m.version) {
            let stored: String = row.get(2);
            if stored != sum {
                return Err(Error::Internal(anyhow::anyhow!(
                    "migration {} ({}) was changed after it was applied to schema {schema}; \
                     add a new migration instead of editing an applied one",
                    m.version,
                    m.name
                )));
            }
            report.skipped.push(m.version);
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(&format!("SET LOCAL search_path TO {q}")).await?;
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| Error::Internal(anyhow::anyhow!("migration {} failed: {}", m.name, describe(&e))))?;
        tx.execute(
            &format!("INSERT INTO {q}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"),
            &[&m.version, &m.name, &sum],
        )
        .await?;
        tx.commit().await?;
        report.applied.push(m.version);
    }
    if let Some(newest) = rows.iter().map(|r| r.get::<_, i32>(0)).max() {
        let known = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0);
        if newest > known {
            tracing::warn!(
                newest,
                known,
                "the database has migrations this binary does not know; is it older than the schema?"
            );
        }
    }
    Ok(report)
}

/// A Postgres error with its server message, which `Display` alone omits.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}
