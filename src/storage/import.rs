//! Importing an exported run: a new run whose log equals the original (types,
//! payloads, seqs and timestamps), written in one transaction.
//!
//! Every event is checked by the append path's guard before it is written, and the
//! whole import is one transaction, so a bad line is refused with its line number and
//! the database is untouched.

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};

use super::append::next_ids;
use super::db::{tenant_tx, Db};
use super::runs::{insert_run, RunInfo};
use crate::domain::{NewEvent, Origin, Resolution, RunGuard};
use crate::error::{Error, ErrorCode, Result};

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
    let insert = tx
        .prepare_cached(
            "INSERT INTO agent_run_events
                 (tenant_id, run_id, seq, id, ts, type, child_id, payload, message_id)
             SELECT $1, $2, u.seq, u.id, u.ts, u.type, u.child_id, u.payload, u.message_id
             FROM unnest($3::bigint[], $4::text[], $5::timestamptz[], $6::text[], $7::text[], $8::jsonb[], $9::text[])
                  AS u(seq, id, ts, type, child_id, payload, message_id)",
        )
        .await?;
    // Service origin: the log may hold events only the service writes, such as plan
    // decisions.
    let mut guard = RunGuard::default();
    let mut chunk: Vec<(Imported, Option<String>)> = Vec::with_capacity(CHUNK);
    let (mut written, mut last_id) = (0i64, None);
    loop {
        let next = events.next().await.transpose()?;
        let ended = next.is_none();
        if let Some(imp) = next {
            let seq = written + chunk.len() as i64 + 1;
            let res = guard
                .apply(seq, imp.event.child_id.as_deref(), &imp.event.body, Origin::Service)
                .map_err(|r| {
                    Error::Rejected(crate::error::Rejection {
                        message: format!("line {}: {}", imp.line, r.message),
                        index: Some(imp.line - 1),
                        ..r
                    })
                })?;
            let mid = match res {
                Resolution::Message { id, .. } => Some(id),
                Resolution::None => None,
            };
            chunk.push((imp, mid));
        }
        if chunk.len() == CHUNK || (ended && !chunk.is_empty()) {
            let ids = next_ids(last_id, Utc::now(), chunk.len());
            last_id = ids.last().copied();
            let seqs: Vec<i64> = (1..=chunk.len() as i64).map(|i| written + i).collect();
            let ids: Vec<String> = ids.iter().map(ulid::Ulid::to_string).collect();
            let ts: Vec<DateTime<Utc>> = chunk.iter().map(|(e, _)| e.ts).collect();
            let types: Vec<String> =
                chunk.iter().map(|(e, _)| e.event.body.type_name().into_owned()).collect();
            let children: Vec<Option<&str>> =
                chunk.iter().map(|(e, _)| e.event.child_id.as_deref()).collect();
            let payloads: Vec<serde_json::Value> =
                chunk.iter().map(|(e, _)| e.event.body.payload()).collect();
            let mids: Vec<Option<&str>> = chunk.iter().map(|(_, m)| m.as_deref()).collect();
            tx.execute(
                &insert,
                &[&tenant, &run.run_id, &seqs, &ids, &ts, &types, &children, &payloads, &mids],
            )
            .await?;
            written += chunk.len() as i64;
            chunk.clear();
        }
        if ended {
            break;
        }
    }
    if written == 0 {
        return Err(Error::reject(ErrorCode::BatchEmpty, "the file holds no events"));
    }
    let state = guard.state();
    // Retention counts from the import, not from the original run's end.
    let updated = Utc::now();
    let ended = state.filter(|s| s.is_terminal()).map(|_| updated);
    let last_id = last_id.map(|u| u.to_string());
    let row = tx
        .query_one(
            "UPDATE runs SET last_seq = $3, last_event_id = $4, state = $5, updated_at = $6, ended_at = $7
             WHERE tenant_id = $1 AND run_id = $2 RETURNING updated_at",
            &[&tenant, &run.run_id, &written, &last_id, &state.map(|s| s.as_str()), &updated, &ended],
        )
        .await?;
    tx.commit().await?;
    Ok(RunInfo { last_seq: written, state, updated_at: row.get(0), ..run })
}
