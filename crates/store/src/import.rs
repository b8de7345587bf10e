//! Importing an exported run: a new run whose log equals the original (types,
//! payloads, seqs and timestamps), written in one transaction.
//!
//! Every event is checked by the append path's guard before it is written, and the
//! whole import is one transaction, so a bad line is refused with its line number and
//! the database is untouched.

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};

use super::append::next_id;
use super::db::{tenant_tx, Db};
use super::rows::{Rows, RunRows};
use super::runs::{insert_run, RunInfo};
use crate::error::{Error, ErrorCode, Result};
use agent_stream_core::domain::{NewEvent, Origin, RunGuard};

/// Rows per INSERT statement.
const CHUNK: usize = 5_000;

/// One event of an imported log, with its original time.
#[derive(Debug, Clone)]
pub struct Imported {
    /// When the original event was stored.
    pub ts: DateTime<Utc>,
    /// The event.
    pub event: NewEvent,
    /// Its line in the file (1-based), for errors.
    pub line: usize,
}

/// Creates a run holding `events` (seqs 1..=n in the order given) for `tenant`, in one
/// transaction. Events are checked as they come, exactly as appends are, and written
/// 5,000 (`CHUNK`) at a time, so memory does not grow with the log; a bad event (or an error
/// from the stream) rolls the transaction back, leaving the database untouched.
pub async fn import_run<S>(db: &Db, tenant: &str, mut events: S) -> Result<RunInfo>
where
    S: Stream<Item = Result<Imported>> + Unpin,
{
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    // A large import takes longer than the pool's per-statement cap for requests.
    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
    let run = insert_run(&tx, tenant, None).await?;
    let insert = Rows::statement(&tx).await?;
    // Service origin: the log may hold events only the service writes, such as plan
    // decisions.
    let mut guard = RunGuard::default();
    let mut rows = Rows::with_capacity(tenant, CHUNK);
    let (mut written, mut last_id, mut last_ts) = (0i64, None, run.created_at);
    loop {
        let next = events.next().await.transpose()?;
        let ended = next.is_none();
        if let Some(imp) = next {
            let seq = written + rows.len() as i64 + 1;
            let mids = crate::rows::check(&mut guard, seq, std::slice::from_ref(&imp.event), Origin::Service)
                .map_err(|r| {
                    Error::Rejected(crate::error::Rejection {
                        message: format!("line {}: {}", imp.line, r.message),
                        index: Some(imp.line - 1),
                        ..r
                    })
                })?;
            // New ids, increasing from the last one (the original ids are not kept).
            let id = next_id(last_id, Utc::now());
            last_id = Some(id);
            let mid = mids.into_iter().next().flatten();
            last_ts = imp.ts;
            rows.push(&run.run_id, seq, id, imp.ts, &imp.event, mid, None);
        }
        if rows.len() == CHUNK || (ended && !rows.is_empty()) {
            tx.execute(&insert, &rows.params()).await?;
            written += rows.len() as i64;
            rows.clear();
        }
        if ended {
            break;
        }
    }
    if written == 0 {
        return Err(Error::reject(ErrorCode::BatchEmpty, "the file holds no events"));
    }
    let state = guard.state();
    // Retention counts from the import (the state change is stamped now), not from the
    // original run's end.
    let mut changed = RunRows::new(tenant, Utc::now());
    changed.push(&run.run_id, None, state);
    if !changed.is_empty() {
        tx.execute(&RunRows::statement(&tx).await?, &changed.params()).await?;
    }
    tx.commit().await?;
    // As a read of the run would say: its head is its last event.
    Ok(RunInfo { last_seq: written, state, updated_at: last_ts, ..run })
}
