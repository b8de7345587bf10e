//! Retention (seed 004 §6): finished runs are deleted, whole, some time after they
//! ended: 90 days for `done`, 30 for `aborted` and `error`, unless the tenant overrides
//! it (`tenants.retention_done_days` / `retention_failed_days`). Runs that have not
//! ended are never touched.
//!
//! This is the only code that deletes: the service role has no DELETE grant, so the
//! sweep runs on an owner connection. A run is deleted with all its events in one
//! transaction; a run that still has sub-runs waits until they are gone (the next
//! batch of the same sweep, when they expired too). Each deleted run leaves a tombstone
//! (`run_tombstones`: ids, final state, when it ended, its last seq) in the same
//! transaction, so reads and resumes of it answer `410 RUN-EXPIRED`.

use chrono::{DateTime, Utc};
use tokio_postgres::Client;

use crate::error::Result;

/// Default retention, in days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Days a `done` run is kept after it ended.
    pub done_days: i32,
    /// Days an `aborted` or `error` run is kept after it ended.
    pub failed_days: i32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { done_days: 90, failed_days: 30 }
    }
}

/// A run past its retention.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    /// Its tenant.
    pub tenant_id: String,
    /// The run.
    pub run_id: String,
    /// done, aborted or error.
    pub state: String,
    /// When it ended.
    pub ended_at: DateTime<Utc>,
    /// Events it holds.
    pub events: i64,
}

/// What a sweep did (or, dry, would do first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Runs deleted (or due).
    pub runs: Vec<Expired>,
    /// True when nothing was deleted.
    pub dry_run: bool,
}

impl Report {
    /// Events in the reported runs.
    pub fn events(&self) -> i64 {
        self.runs.iter().map(|r| r.events).sum()
    }
}

/// Runs per deleting transaction.
const BATCH: i64 = 200;

/// Up to `limit` expired runs without sub-runs, oldest first, counting the runs in
/// `gone` (tenant ids and run ids, side by side) as deleted already.
async fn expired<C: tokio_postgres::GenericClient>(
    c: &C,
    policy: Policy,
    limit: i64,
    gone: (&[String], &[String]),
) -> Result<Vec<Expired>> {
    let rows = c
        .query(
            "WITH gone AS (SELECT * FROM unnest($4::text[], $5::text[]) AS g(tenant_id, run_id))
             SELECT r.tenant_id, r.run_id, r.state, r.ended_at,
                    coalesce((SELECT max(e.seq) FROM agent_run_events e
                              WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id), 0)
             FROM runs r JOIN tenants t ON t.tenant_id = r.tenant_id
             WHERE r.ended_at IS NOT NULL
               AND ((r.state = 'done'
                     AND r.ended_at < now() - make_interval(days => coalesce(t.retention_done_days, $1)))
                 OR (r.state IN ('aborted', 'error')
                     AND r.ended_at < now() - make_interval(days => coalesce(t.retention_failed_days, $2))))
               AND NOT EXISTS (SELECT 1 FROM gone g WHERE g.tenant_id = r.tenant_id AND g.run_id = r.run_id)
               AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.tenant_id = r.tenant_id AND c.parent_run_id = r.run_id
                               AND NOT EXISTS (SELECT 1 FROM gone g
                                               WHERE g.tenant_id = c.tenant_id AND g.run_id = c.run_id))
             ORDER BY r.ended_at LIMIT $3",
            &[&policy.done_days, &policy.failed_days, &limit, &gone.0, &gone.1],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Expired {
            tenant_id: r.get(0),
            run_id: r.get(1),
            state: r.get(2),
            ended_at: r.get(3),
            events: r.get(4),
        })
        .collect())
}

/// Deletes every expired run, sub-runs before their parents, so a parent goes in the
/// same sweep once its sub-runs are gone. With `dry_run`, deletes nothing and lists
/// exactly the runs the sweep would delete, parents included.
pub async fn sweep(c: &mut Client, policy: Policy, dry_run: bool) -> Result<Report> {
    let mut report = Report { runs: vec![], dry_run };
    if dry_run {
        // Round by round, as the sweep would, taking each round's runs as deleted.
        let (mut tenants, mut runs) = (vec![], vec![]);
        loop {
            let round = expired(c, policy, i64::MAX, (&tenants, &runs)).await?;
            if round.is_empty() {
                return Ok(report);
            }
            tenants.extend(round.iter().map(|e| e.tenant_id.clone()));
            runs.extend(round.iter().map(|e| e.run_id.clone()));
            report.runs.extend(round);
        }
    }
    loop {
        let tx = c.transaction().await?;
        let batch = expired(&tx, policy, BATCH, (&[], &[])).await?;
        if batch.is_empty() {
            tx.commit().await?;
            break;
        }
        let tenants: Vec<&str> = batch.iter().map(|e| e.tenant_id.as_str()).collect();
        let runs: Vec<&str> = batch.iter().map(|e| e.run_id.as_str()).collect();
        tx.execute(
            "DELETE FROM agent_run_events e USING unnest($1::text[], $2::text[]) AS d(tenant_id, run_id)
             WHERE e.tenant_id = d.tenant_id AND e.run_id = d.run_id",
            &[&tenants, &runs],
        )
        .await?;
        // What is left of each run: a tombstone, so a later read or resume learns the
        // run expired (410 RUN-EXPIRED) rather than that it never was (404).
        let states: Vec<&str> = batch.iter().map(|e| e.state.as_str()).collect();
        let ended: Vec<DateTime<Utc>> = batch.iter().map(|e| e.ended_at).collect();
        let last: Vec<i64> = batch.iter().map(|e| e.events).collect();
        tx.execute(
            "INSERT INTO run_tombstones (tenant_id, run_id, state, ended_at, last_seq)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::int8[])
             ON CONFLICT DO NOTHING",
            &[&tenants, &runs, &states, &ended, &last],
        )
        .await?;
        tx.execute(
            "DELETE FROM runs r USING unnest($1::text[], $2::text[]) AS d(tenant_id, run_id)
             WHERE r.tenant_id = d.tenant_id AND r.run_id = d.run_id",
            &[&tenants, &runs],
        )
        .await?;
        tx.commit().await?;
        for e in &batch {
            tracing::info!(tenant = %e.tenant_id, run = %e.run_id, state = %e.state, events = e.events, "retention: run deleted");
        }
        report.runs.extend(batch);
    }
    Ok(report)
}

/// Sets (or, with `None`, clears) a tenant's retention override, by tenant name.
pub async fn set_override(
    c: &Client,
    tenant: &str,
    done_days: Option<i32>,
    failed_days: Option<i32>,
) -> Result<bool> {
    let n = c
        .execute(
            "UPDATE tenants SET retention_done_days = $2, retention_failed_days = $3 WHERE name = $1",
            &[&tenant, &done_days, &failed_days],
        )
        .await?;
    Ok(n == 1)
}
