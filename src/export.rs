//! JSONL export: a run's log (or a tenant's, for backups) as one line per item,
//! streamed from PostgreSQL with constant memory.
//!
//! Rows are read through the one read path (`storage::events`) inside one
//! tenant-scoped transaction and written in chunks of 64 KiB (`CHUNK`) to a bounded
//! channel, so a slow reader slows the query instead of filling memory. Native lines
//! are the stored envelope with the payload passed through as stored; other dialects
//! fold and encode every event of the range through [`Encoding`](crate::dialect::Encoding), so an export in any
//! dialect is the same items the stream sends.
//!
//! A native export ends with one more line, the [`EndLine`]: `{"export_end": {...}}`
//! with the number of event lines before it, written only once the read finished. A
//! reader that does not find it holds a partial export. (An export that fails midway
//! is also cut off as an error at the transport: see `http::jsonl`.) Dialect exports
//! carry only their protocol's items, and end as that protocol ends.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use tokio::sync::mpsc;

use crate::app::AppRef;
use crate::auth::{Principal, Scope};
use crate::dialect::Format;
use crate::domain::jsonl::EndLine;
use crate::error::{Error, ErrorCode, Result};
use crate::storage::db::tenant_tx;
use crate::storage::events::{stream_after, stream_raw, stream_tenant_raw, Filter, ALL_EVENTS};
use crate::storage::RunInfo;

/// Bytes gathered before a chunk goes out.
const CHUNK: usize = 64 << 10;
/// Chunks in flight between the query and the reader.
pub const CHANNEL: usize = 8;

/// What to export of a run.
#[derive(Debug, Clone, Default)]
pub struct RunExport {
    /// First seq (inclusive; 1 when absent).
    pub from_seq: Option<i64>,
    /// Last seq (inclusive; the end of the log when absent).
    pub to_seq: Option<i64>,
    /// Types and child to keep.
    pub filter: Filter,
    /// The dialect.
    pub format: Format,
}

impl RunExport {
    /// Checks the range against the run: `from_seq` may be at most one past its last
    /// seq (nothing new yet); further is a cursor beyond its end.
    pub fn check_run(&self, run: &RunInfo) -> Result<()> {
        self.check()?;
        let after = self.from_seq.unwrap_or(1) - 1;
        crate::app::check_cursor(run, &crate::dialect::Cursor::at(after))
    }

    /// Checks the range: `from_seq` ≥ 1, `to_seq` ≥ `from_seq`.
    pub fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::reject(ErrorCode::InvalidParameter, m));
        match (self.from_seq, self.to_seq) {
            (Some(f), _) if f < 1 => bad("`from_seq` must be 1 or more"),
            (_, Some(t)) if t < 1 => bad("`to_seq` must be 1 or more"),
            (Some(f), Some(t)) if t < f => bad("`to_seq` must not be less than `from_seq`"),
            _ => Ok(()),
        }
    }
}

struct Writer {
    buf: Vec<u8>,
    tx: mpsc::Sender<Bytes>,
    lines: u64,
}

impl Writer {
    fn new(tx: mpsc::Sender<Bytes>) -> Self {
        Writer { buf: Vec::with_capacity(CHUNK + 4096), tx, lines: 0 }
    }

    /// Sends the buffer once it is full; `Err` when the reader went away.
    async fn maybe_flush(&mut self) -> Result<()> {
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + 4096)));
        self.tx.send(chunk).await.map_err(|_| Error::Internal(anyhow::anyhow!("export reader went away")))
    }
}

/// Writes the run's lines to `tx`; returns how many lines were written.
pub async fn export_run(
    app: AppRef,
    who: Principal,
    run: RunInfo,
    opts: RunExport,
    tx: mpsc::Sender<Bytes>,
) -> Result<u64> {
    who.require(Scope::Read)?;
    let after = opts.from_seq.unwrap_or(1) - 1;
    let upto = opts.to_seq.unwrap_or(i64::MAX);
    let mut w = Writer::new(tx);
    let mut enc = match opts.format {
        Format::Native => None,
        f => Some(app.encoding(&who, &run, f, &crate::dialect::Cursor::at(after)).await?),
    };
    let mut client = app.db.pool.get().await?;
    let t = tenant_tx(&mut client, &who.tenant_id).await?;
    // The query lives as long as the reader takes; the pool's 30 s cap is for requests.
    t.batch_execute("SET LOCAL statement_timeout = 0").await?;
    match enc.as_mut() {
        None => {
            let mut last_seq = None;
            {
                let rows = stream_raw(&t, &who.tenant_id, &run.run_id, after, upto, &opts.filter).await?;
                futures::pin_mut!(rows);
                while let Some(raw) = rows.try_next().await? {
                    raw.write_line(&mut w.buf);
                    last_seq = Some(raw.seq);
                    w.lines += 1;
                    w.maybe_flush().await?;
                }
            }
            t.commit().await?;
            w.end(&EndLine { lines: w.lines, last_seq, runs: None });
            w.flush().await?;
            return Ok(w.lines);
        }
        Some(enc) => {
            // From the start: the dialect's opening items; from a later seq, a resync
            // dialect's snapshot of the run up to there, so the file is valid on its own.
            for o in enc.open() {
                write_item(&mut w, &o);
            }
            // Dialects fold every event of the range; the filter then picks what is written.
            let events = stream_after(&t, &who.tenant_id, &run.run_id, after, upto, &ALL_EVENTS).await?;
            futures::pin_mut!(events);
            while let Some(e) = events.try_next().await? {
                let items = enc.push(&e);
                if opts.filter.keeps(&e) {
                    for o in &items {
                        write_item(&mut w, o);
                    }
                }
                w.maybe_flush().await?;
            }
        }
    }
    t.commit().await?;
    w.flush().await?;
    Ok(w.lines)
}

impl Writer {
    fn end(&mut self, end: &EndLine) {
        // A struct rather than `json!`, which would sort the fields.
        #[derive(serde::Serialize)]
        struct Line<'a> {
            export_end: &'a EndLine,
        }
        if serde_json::to_writer(&mut self.buf, &Line { export_end: end }).is_ok() {
            self.buf.push(b'\n');
        }
    }
}

fn write_item(w: &mut Writer, o: &crate::dialect::Out) {
    // JSONL carries JSON items only (the AI SDK's `[DONE]` marker is an SSE thing).
    match &o.data {
        crate::dialect::Data::Json(v) => {
            if serde_json::to_writer(&mut w.buf, v).is_err() {
                return;
            }
        }
        // A shared rendering (a resync opening) is already the JSON text.
        crate::dialect::Data::Wire(wire) => w.buf.extend_from_slice(wire.json()),
        crate::dialect::Data::Text(_) => return,
    }
    w.buf.push(b'\n');
    w.lines += 1;
}

/// Writes every event the tenant stored in `[since, until)` to `tx`, by run and seq.
pub async fn export_tenant(
    app: AppRef,
    who: Principal,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    tx: mpsc::Sender<Bytes>,
) -> Result<u64> {
    who.require(Scope::Read)?;
    let mut w = Writer::new(tx);
    let mut client = app.db.pool.get().await?;
    let t = tenant_tx(&mut client, &who.tenant_id).await?;
    // The query lives as long as the reader takes; the pool's 30 s cap is for requests.
    t.batch_execute("SET LOCAL statement_timeout = 0").await?;
    let mut runs = 0;
    {
        let rows = stream_tenant_raw(&t, &who.tenant_id, &since, &until).await?;
        futures::pin_mut!(rows);
        let mut run = String::new();
        while let Some(raw) = rows.try_next().await? {
            // Rows come by run, so a new run id is a new run.
            if raw.run_id != run {
                runs += 1;
                run.clone_from(&raw.run_id);
            }
            raw.write_line(&mut w.buf);
            w.lines += 1;
            w.maybe_flush().await?;
        }
    }
    t.commit().await?;
    w.end(&EndLine { lines: w.lines, last_seq: None, runs: Some(runs) });
    w.flush().await?;
    Ok(w.lines)
}
