//! The one read path over the log: rows with `seq > cursor`, in seq order.
//!
//! Every surface that reads events (the append guard's rebuild, queries, later the
//! live hub, SSE and JSONL) goes through [`read_after`] or [`stream_after`] (live feeds
//! woken together through [`read_after_many`], the same condition for several runs), so
//! catch-up and live reads cannot disagree about what comes after a cursor.

use deadpool_postgres::GenericClient;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio_postgres::Row;
use ulid::Ulid;

use crate::error::{Error, ErrorCode, Result};
use agent_stream_core::domain::{Event, EventBody};

/// Columns in the order [`event_from_row`] reads them.
pub const EVENT_COLUMNS: &str = "seq, id, ts, type, child_id, payload, run_id, message_id";

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
        message_id: r.get(7),
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

impl Filter {
    /// A filter from a reader's parameters: a list of known types (not empty) and a
    /// child id of 1 to 256 bytes. A typo is refused rather than matching nothing.
    pub fn new(types: Option<Vec<String>>, child_id: Option<String>) -> Result<Filter> {
        use agent_stream_core::domain::event::is_event_type;
        use agent_stream_core::domain::input::MAX_ID_LEN;
        use agent_stream_core::domain::text::echo;
        let bad = |m: String| Err(Error::reject(ErrorCode::InvalidParameter, m));
        if let Some(ts) = &types {
            if ts.is_empty() {
                return bad("`types` names no type: leave it out for every type".to_owned());
            }
            if let Some(t) = ts.iter().find(|t| !is_event_type(t)) {
                return bad(format!("`types`: `{}` is not an event type", echo(t)));
            }
        }
        if child_id.as_ref().is_some_and(|c| c.is_empty() || c.len() > MAX_ID_LEN) {
            return bad(format!("`child_id` must be 1 to {MAX_ID_LEN} bytes long"));
        }
        Ok(Filter { types, child_id })
    }

    /// True when `e` passes: the same test the SQL of [`read_after`] makes.
    pub fn keeps(&self, e: &Event) -> bool {
        self.types.as_ref().is_none_or(|ts| ts.iter().any(|t| *t == e.body.type_name()))
            && self.child_id.as_ref().is_none_or(|c| e.child_id.as_ref() == Some(c))
    }
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
    let stmt = c.prepare_cached(&READ_AFTER).await?;
    let rows =
        c.query(&stmt, &[&tenant, &run_id, &after_seq, &limit, &filter.types, &filter.child_id]).await?;
    rows.iter().map(event_from_row).collect()
}

/// The statement of [`read_after`], built once.
static READ_AFTER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {EVENT_COLUMNS} FROM agent_run_events
         WHERE tenant_id = $1 AND run_id = $2 AND seq > $3
           AND ($5::text[] IS NULL OR type = ANY($5))
           AND ($6::text IS NULL OR child_id = $6)
         ORDER BY seq LIMIT $4"
    )
});

/// [`read_after`] (every type, every child) in a transaction of its own scoped to
/// `tenant`, pipelined ([`super::db::begin_with`]): BEGIN, the tenant setting, the
/// SELECT and COMMIT go out together, so a live wake-up waits one round trip for its
/// rows instead of four.
pub async fn read_after_alone(
    c: &deadpool_postgres::ClientWrapper,
    tenant: &str,
    run_id: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<Event>> {
    let stmt = c.prepare_cached(&READ_AFTER).await?;
    let (types, child): (Option<Vec<String>>, Option<String>) = (None, None);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&tenant, &run_id, &after_seq, &limit, &types, &child];
    // A failure inside makes COMMIT a rollback; a read has nothing to undo either way.
    let read = async { Ok::<_, Error>(futures::join!(c.query(&stmt, &params), c.batch_execute("COMMIT"))) };
    let (rows, commit) = super::db::begin_with(c, tenant, read).await?;
    let rows = rows?;
    commit?;
    rows.iter().map(event_from_row).collect()
}

/// [`read_after_alone`] for several runs of one tenant in one statement: up to `limit`
/// events after each `(run_id, after_seq)`, returned per run in the order asked, each
/// in seq order. Live feeds woken together (one group commit wakes every run it
/// wrote) share this read instead of sending one transaction each: the same
/// `seq > cursor` rows, fewer statements for PostgreSQL and fewer round trips here.
/// On Citus the `tenant_id` equality routes it to the tenant's shard, like the
/// single-run read.
pub async fn read_after_many(
    c: &deadpool_postgres::ClientWrapper,
    tenant: &str,
    runs: &[(String, i64)],
    limit: i64,
) -> Result<Vec<Vec<Event>>> {
    if let [(run_id, after)] = runs {
        return Ok(vec![read_after_alone(c, tenant, run_id, *after, limit).await?]);
    }
    let stmt = c.prepare_cached(&READ_AFTER_MANY).await?;
    let ids: Vec<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    let afters: Vec<i64> = runs.iter().map(|r| r.1).collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&tenant, &ids, &afters, &limit];
    let read = async { Ok::<_, Error>(futures::join!(c.query(&stmt, &params), c.batch_execute("COMMIT"))) };
    let (rows, commit) = super::db::begin_with(c, tenant, read).await?;
    let rows = rows?;
    commit?;
    let mut out: Vec<Vec<Event>> = runs.iter().map(|_| vec![]).collect();
    for r in &rows {
        // The statement's last column is the run's position in the request (1-based).
        let at: i64 = r.get(r.len() - 1);
        let slot = usize::try_from(at - 1)
            .ok()
            .and_then(|i| out.get_mut(i))
            .ok_or_else(|| Error::Internal(anyhow::anyhow!("read_after_many: row for request {at}")))?;
        slot.push(event_from_row(r)?);
    }
    Ok(out)
}

/// The statement of [`read_after_many`]: [`READ_AFTER`]'s condition, per requested run.
static READ_AFTER_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let cols = EVENT_COLUMNS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ");
    format!(
        "SELECT {cols}, w.at FROM unnest($2::text[], $3::bigint[]) WITH ORDINALITY AS w(run_id, after_seq, at)
         CROSS JOIN LATERAL (
             SELECT {EVENT_COLUMNS} FROM agent_run_events
             WHERE tenant_id = $1 AND run_id = w.run_id AND seq > w.after_seq
             ORDER BY seq LIMIT $4) e
         ORDER BY w.at, e.seq"
    )
});

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
    let rows = query_range(c, EVENT_COLUMNS, tenant, run_id, after_seq, upto, filter).await?;
    Ok(rows.map_err(Error::from).map(|r| r.and_then(|row| event_from_row(&row))))
}

/// The one range query behind [`stream_after`] and [`stream_raw`], selecting `columns`.
async fn query_range<'a, C: GenericClient>(
    c: &'a C,
    columns: &str,
    tenant: &'a str,
    run_id: &'a str,
    after_seq: i64,
    upto: i64,
    filter: &'a Filter,
) -> Result<tokio_postgres::RowStream> {
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {columns} FROM agent_run_events
             WHERE tenant_id = $1 AND run_id = $2 AND seq > $3 AND seq <= $4
               AND ($5::text[] IS NULL OR type = ANY($5))
               AND ($6::text IS NULL OR child_id = $6)
             ORDER BY seq"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&tenant, &run_id, &after_seq, &upto, &filter.types, &filter.child_id];
    Ok(c.query_raw(&stmt, params).await?)
}

/// A stored event as the database returns it, payload still JSON text: the export's
/// row, turned into a line without parsing and re-encoding the payload.
#[derive(Debug, Clone)]
pub struct RawEvent {
    /// Per-run seq.
    pub seq: i64,
    /// ULID text.
    pub id: String,
    /// Server time.
    pub ts: chrono::DateTime<chrono::Utc>,
    /// Wire type.
    pub type_name: String,
    /// Child scope.
    pub child_id: Option<String>,
    /// Payload as JSON text.
    pub payload: String,
    /// The run.
    pub run_id: String,
}

impl RawEvent {
    /// Appends the native JSONL line (the envelope of [`Event`], payload verbatim).
    pub fn write_line(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let s = |v: &str| serde_json::to_string(v).unwrap_or_default();
        let child = self.child_id.as_deref().map_or_else(|| "null".to_owned(), s);
        let _ = write!(
            out,
            r#"{{"id":{},"ts":"{}","type":{},"run_id":{},"child_id":{},"seq":{},"payload":"#,
            s(&self.id),
            self.ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            s(&self.type_name),
            s(&self.run_id),
            child,
            self.seq,
        );
        compact_json(self.payload.as_bytes(), out);
        out.extend_from_slice(b"}\n");
    }
}

/// Copies JSON text without the whitespace between tokens: PostgreSQL prints jsonb as
/// `{"a": 1, "b": [2, 3]}`, every other surface as `{"a":1,"b":[2,3]}`. The input is
/// valid JSON (jsonb's output), so only strings need care: whitespace inside them stays.
pub fn compact_json(json: &[u8], out: &mut Vec<u8>) {
    out.reserve(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        out.push(b);
    }
}

const RAW_COLUMNS: &str = "seq, id, ts, type, child_id, payload::text, run_id";

fn raw_from_row(r: &Row) -> RawEvent {
    RawEvent {
        seq: r.get(0),
        id: r.get(1),
        ts: r.get(2),
        type_name: r.get(3),
        child_id: r.get(4),
        payload: r.get(5),
        run_id: r.get(6),
    }
}

/// [`stream_after`], with payloads as text.
pub async fn stream_raw<'a, C: GenericClient>(
    c: &'a C,
    tenant: &'a str,
    run_id: &'a str,
    after_seq: i64,
    upto: i64,
    filter: &'a Filter,
) -> Result<impl Stream<Item = Result<RawEvent>> + 'a> {
    let rows = query_range(c, RAW_COLUMNS, tenant, run_id, after_seq, upto, filter).await?;
    Ok(rows.map_err(Error::from).map_ok(|row| raw_from_row(&row)))
}

/// Every event of the tenant stored in `[since, until)` (open where `None`), by run and
/// seq (backups and analysts), payloads as text.
pub async fn stream_tenant_raw<'a, C: GenericClient>(
    c: &'a C,
    tenant: &'a str,
    since: &'a Option<chrono::DateTime<chrono::Utc>>,
    until: &'a Option<chrono::DateTime<chrono::Utc>>,
) -> Result<impl Stream<Item = Result<RawEvent>> + 'a> {
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {RAW_COLUMNS} FROM agent_run_events
             WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR ts >= $2)
               AND ($3::timestamptz IS NULL OR ts < $3)
             ORDER BY run_id, seq"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&tenant, since, until];
    let rows = c.query_raw(&stmt, params).await?;
    Ok(rows.map_err(Error::from).map_ok(|row| raw_from_row(&row)))
}

/// The run's row and a page of its events after `after_seq`, in one tenant transaction:
/// the read every reader makes (REST pages, a subscriber catching up). The page may run
/// past the row's `last_seq` if an append commits in between; readers page by seq.
pub async fn page(
    db: &crate::Db,
    tenant: &str,
    run_id: &str,
    after_seq: i64,
    limit: i64,
    filter: &Filter,
) -> Result<(crate::RunInfo, Vec<Event>)> {
    let mut client = db.pool.get().await?;
    let tx = crate::db::tenant_tx(&mut client, tenant).await?;
    let run = crate::runs::get_run_in(&tx, tenant, run_id).await?;
    let evs = read_after(&tx, tenant, &run.run_id, after_seq, limit, filter).await?;
    tx.commit().await?;
    Ok((run, evs))
}

#[cfg(test)]
mod compact_tests {
    use super::compact_json;

    #[test]
    fn compacts_jsonb_text_and_leaves_strings_alone() {
        let jsonb = r#"{"a": 1, "b": [2, {"c": "x: y, z"}], "d": "q\" , \\", "e": null}"#;
        let mut out = vec![];
        compact_json(jsonb.as_bytes(), &mut out);
        let out = String::from_utf8(out).expect("utf-8");
        assert_eq!(out, r#"{"a":1,"b":[2,{"c":"x: y, z"}],"d":"q\" , \\","e":null}"#);
        let v: serde_json::Value = serde_json::from_str(jsonb).expect("json");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&out).expect("json"), v);
    }
}
