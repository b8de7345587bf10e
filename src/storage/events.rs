//! The one read path over the log: rows with `seq > cursor`, in seq order.
//!
//! Every surface that reads events (the append guard's rebuild, queries, later the
//! live hub, SSE and JSONL) goes through [`read_after`] or [`stream_after`], so
//! catch-up and live reads cannot disagree about what comes after a cursor.

use deadpool_postgres::GenericClient;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio_postgres::Row;
use ulid::Ulid;

use crate::domain::{Event, EventBody};
use crate::error::{Error, Result};

/// Columns in the order [`event_from_row`] reads them.
pub const EVENT_COLUMNS: &str = "seq, id, ts, type, child_id, payload, run_id";

/// Decodes a row selected with [`EVENT_COLUMNS`].
pub fn event_from_row(r: &Row) -> Result<Event> {
    let type_name: &str = r.get(3);
    let payload: serde_json::Value = r.get(5);
    let id: &str = r.get(1);
    let body = EventBody::parse(type_name, payload)
        .map_err(|e| Error::Internal(anyhow::anyhow!("stored event does not parse: {e}")))?;
    Ok(Event {
        seq: r.get(0),
        id: Ulid::from_string(id).map_err(|e| Error::Internal(anyhow::anyhow!("stored id {id}: {e}")))?,
        ts: r.get(2),
        child_id: r.get(4),
        run_id: r.get(6),
        body,
    })
}

/// Which events of a run a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only these types (exact names, e.g. `tool.start`, `custom.note`); `None` = all.
    pub types: Option<Vec<String>>,
    /// Only events of this child; `None` = all.
    pub child_id: Option<String>,
}

/// The filter that keeps every event.
pub static ALL_EVENTS: Filter = Filter { types: None, child_id: None };

/// Up to `limit` events of a run after `after_seq` that pass `filter`. The caller has
/// scoped the transaction to the tenant.
pub async fn read_after<C: GenericClient>(
    c: &C,
    tenant: &str,
    run_id: &str,
    after_seq: i64,
    limit: i64,
    filter: &Filter,
) -> Result<Vec<Event>> {
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM agent_run_events
             WHERE tenant_id = $1 AND run_id = $2 AND seq > $3
               AND ($5::text[] IS NULL OR type = ANY($5))
               AND ($6::text IS NULL OR child_id = $6)
             ORDER BY seq LIMIT $4"
        ))
        .await?;
    let rows =
        c.query(&stmt, &[&tenant, &run_id, &after_seq, &limit, &filter.types, &filter.child_id]).await?;
    rows.iter().map(event_from_row).collect()
}

/// Every event of a run with `after_seq < seq <= upto` that passes `filter`, streamed
/// row by row (constant memory).
pub async fn stream_after<'a, C: GenericClient>(
    c: &'a C,
    tenant: &'a str,
    run_id: &'a str,
    after_seq: i64,
    upto: i64,
    filter: &'a Filter,
) -> Result<impl Stream<Item = Result<Event>> + 'a> {
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM agent_run_events
             WHERE tenant_id = $1 AND run_id = $2 AND seq > $3 AND seq <= $4
               AND ($5::text[] IS NULL OR type = ANY($5))
               AND ($6::text IS NULL OR child_id = $6)
             ORDER BY seq"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&tenant, &run_id, &after_seq, &upto, &filter.types, &filter.child_id];
    let rows = c.query_raw(&stmt, params).await?;
    Ok(rows.map_err(Error::from).map(|r| r.and_then(|row| event_from_row(&row))))
}
