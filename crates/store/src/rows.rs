//! The one writer of the log. Single appends ([`append`](fn@crate::append)), group commit
//! ([`group`](crate::group)) and import ([`import`](crate::import)) all check their
//! events with [`check`], gather rows in [`Rows`], insert them with [`Rows::statement`]
//! (or its claiming twin), and move their runs' rows with [`RunRows`]: one definition
//! of what a stored event is, so the three cannot drift apart.
//!
//! Payloads go as text and are cast per row: a `jsonb[]` parameter is parsed whole
//! while the statement is bound, in memory held until it ends (megabytes for 1,000
//! events, which the backend's allocator then grows and trims on every batch); the cast
//! parses each row in memory reset per row (docs/benchmarks-log.md, `bench ingest`).
//!
//! `RETURNING 1` is for Citus, and costs one small row per event elsewhere: an INSERT
//! whose rows come from a function is run by the coordinator, which otherwise writes
//! them to the shard with COPY, and PostgreSQL refuses COPY into a table under
//! row-level security; with RETURNING it sends them as an intermediate result and runs
//! INSERT ... SELECT on the shard's worker.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;
use ulid::Ulid;

use agent_stream_core::domain::{Event, NewEvent, Origin, Resolution, RunGuard, RunState};
use agent_stream_core::error::Rejection;

use crate::error::Result;

/// Runs `events` (the first at `first_seq`) through `guard`, the append-side state
/// machine: the message each resolved to, or the first refusal, blamed on its index.
/// The guard is left after the last event only when all passed.
pub fn check(
    guard: &mut RunGuard,
    first_seq: i64,
    events: &[NewEvent],
    origin: Origin,
) -> std::result::Result<Vec<Option<String>>, Rejection> {
    let mut next = guard.clone();
    let mut mids = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let res =
            next.apply(first_seq + i as i64, e.child_id.as_deref(), &e.body, origin).map_err(|r| r.at(i))?;
        mids.push(match res {
            Resolution::Message { id, .. } => Some(id),
            Resolution::None => None,
        });
    }
    *guard = next;
    Ok(mids)
}

/// The INSERT of [`Rows`], up to its filter and `RETURNING`: a macro so that
/// `concat!` can build its two statements at compile time.
macro_rules! insert_rows {
    () => {
        "INSERT INTO agent_run_events
             (tenant_id, run_id, seq, id, ts, type, child_id, payload, idempotency_key, message_id)
         SELECT $1, u.run_id, u.seq, u.id, u.ts, u.type, u.child_id, u.payload::jsonb, u.key, u.message_id
         FROM unnest($2::text[], $3::bigint[], $4::text[], $5::timestamptz[], $6::text[], $7::text[],
                     $8::text[], $9::text[], $10::text[])
              AS u(run_id, seq, id, ts, type, child_id, payload, key, message_id)"
    };
}

/// The answers of [`Rows::commit_claimed`]'s BEGIN, tenant setting, INSERT and COMMIT.
pub type OneRoundTrip = (
    std::result::Result<(), tokio_postgres::Error>,
    std::result::Result<(), tokio_postgres::Error>,
    std::result::Result<u64, tokio_postgres::Error>,
    std::result::Result<(), tokio_postgres::Error>,
);

/// Rows of `agent_run_events` for one tenant, column by column (what `unnest` takes).
pub struct Rows {
    tenant: String,
    run: Vec<String>,
    seq: Vec<i64>,
    id: Vec<String>,
    ts: Vec<DateTime<Utc>>,
    /// The types are the vocabulary's static names: borrowed, not copied per row.
    ty: Vec<std::borrow::Cow<'static, str>>,
    child: Vec<Option<String>>,
    payload: Vec<String>,
    key: Vec<Option<String>>,
    mid: Vec<Option<String>>,
}

impl Rows {
    /// Rows of `tenant`, with room for `n`.
    pub fn with_capacity(tenant: &str, n: usize) -> Rows {
        Rows {
            tenant: tenant.to_owned(),
            run: Vec::with_capacity(n),
            seq: Vec::with_capacity(n),
            id: Vec::with_capacity(n),
            ts: Vec::with_capacity(n),
            ty: Vec::with_capacity(n),
            child: Vec::with_capacity(n),
            payload: Vec::with_capacity(n),
            key: Vec::with_capacity(n),
            mid: Vec::with_capacity(n),
        }
    }

    /// Rows gathered.
    pub fn len(&self) -> usize {
        self.seq.len()
    }

    /// True when there is nothing to insert.
    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    /// One event of `run_id` at `seq`, with its id, time and resolved message. With
    /// `stored`, also the event exactly as the row will read back (for
    /// [`crate::append::CommitSink`]): built here, so what a row holds is said once.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        run_id: &str,
        seq: i64,
        id: Ulid,
        ts: DateTime<Utc>,
        e: &NewEvent,
        message_id: Option<String>,
        stored: Option<&mut Vec<Event>>,
    ) {
        if let Some(out) = stored {
            out.push(Event {
                id,
                ts,
                run_id: run_id.to_owned(),
                child_id: e.child_id.clone(),
                seq,
                body: e.body.clone(),
                message_id: message_id.clone(),
            });
        }
        self.run.push(run_id.to_owned());
        self.seq.push(seq);
        self.id.push(id.to_string());
        self.ts.push(ts);
        self.ty.push(e.body.type_name());
        self.child.push(e.child_id.clone());
        self.payload.push(e.body.payload_text());
        self.key.push(e.key.clone());
        self.mid.push(message_id);
    }

    /// The last row's run, seq and event id (how an unanswered COMMIT is checked).
    pub fn last(&self) -> Option<(String, i64, String)> {
        let i = self.len().checked_sub(1)?;
        Some((self.run[i].clone(), self.seq[i], self.id[i].clone()))
    }

    /// Empties the rows, keeping their room (import writes in chunks).
    pub fn clear(&mut self) {
        self.run.clear();
        self.seq.clear();
        self.id.clear();
        self.ts.clear();
        self.ty.clear();
        self.child.clear();
        self.payload.clear();
        self.key.clear();
        self.mid.clear();
    }

    /// The INSERT, prepared once per connection.
    pub async fn statement<C: GenericClient>(c: &C) -> Result<Statement> {
        Ok(c.prepare_cached(concat!(insert_rows!(), " RETURNING 1")).await?)
    }

    /// The INSERT of group commit's one-round-trip path, which holds no row lock: it
    /// first claims its runs' writer keys (`$11`, [`writer_keys`]) shared, without
    /// waiting. If a locked writer holds or awaits one, the claim divides by zero, and
    /// the error aborts the transaction, so that the COMMIT pipelined after it stores
    /// nothing and the group is built again under row locks (see [`HOLD_RUNS`]). The
    /// claim is a one-time filter of the INSERT rather than a statement of its own: a
    /// statement more per group cost about 9% of the throughput of single appends, the
    /// filter about 5% (docs/benchmarks-log.md, 2026-11-29 13:26). (An
    /// error is the only way to stop statements already sent; a constant `1/0` would
    /// be folded, and raised, when planned.)
    pub async fn claiming_statement<C: GenericClient>(c: &C) -> Result<Statement> {
        Ok(c.prepare_cached(concat!(
            insert_rows!(),
            " WHERE (SELECT 1 / bool_and(pg_try_advisory_xact_lock_shared(k))::int
                     FROM unnest($11::int8[]) k) = 1
             RETURNING 1"
        ))
        .await?)
    }

    /// The rows in a transaction of their own, in one round trip: BEGIN, their tenant's
    /// setting ([`crate::db::scope_sql`]), the [`Rows::claiming_statement`] with the
    /// runs' writer `keys` ([`writer_keys`]) and COMMIT, sent together. Each statement's
    /// own answer, for the caller to settle: after a failed statement the COMMIT is a
    /// rollback, and an unanswered COMMIT leaves the group in doubt.
    pub async fn commit_claimed(&self, c: &deadpool_postgres::Client, keys: &[i64]) -> Result<OneRoundTrip> {
        let scope = crate::db::scope_sql(&self.tenant)?;
        let insert = Self::claiming_statement(c).await?;
        let mut params = Vec::with_capacity(11);
        params.extend(self.params());
        params.push(&keys as &(dyn ToSql + Sync));
        // BEGIN and the setting as two messages, as in `db::begin_with` (Citus would
        // repeat a "BEGIN; SET LOCAL ..." on its workers).
        Ok(futures::join!(
            c.batch_execute("BEGIN"),
            c.batch_execute(&scope),
            c.execute(&insert, &params),
            c.batch_execute("COMMIT")
        ))
    }

    /// The statement's parameters.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 10] {
        [
            &self.tenant,
            &self.run,
            &self.seq,
            &self.id,
            &self.ts,
            &self.ty,
            &self.child,
            &self.payload,
            &self.key,
            &self.mid,
        ]
    }
}

/// The last event of each run `r` of tenant `$1`, joined as `h` (`seq`, `id`, `ts`),
/// found newest first by the events' primary key: a run's head is its last event, not a
/// copy in its row (migration 0009). Every read of a head is built on this join; a macro
/// rather than a `const` so that `concat!` can build those statements at compile time.
macro_rules! last_event_join {
    () => {
        "LEFT JOIN LATERAL (SELECT e.seq, e.id, e.ts FROM agent_run_events e
                            WHERE e.tenant_id = $1 AND e.run_id = r.run_id
                            ORDER BY e.seq DESC LIMIT 1) h ON true"
    };
}
pub(crate) use last_event_join;

/// A run's head: the seq and id of its last event ((0, None) before the first).
pub type Head = (i64, Option<Ulid>);

/// Where each of the runs `$2` (ids of tenant `$1`) ends, from the log, one row per run
/// that exists; decoded by [`head_of`]. One statement naming its tenant, so on Citus it
/// is a router query to the tenant's worker.
pub const HEADS: &str = concat!(
    "SELECT r.run_id, h.seq, h.id FROM runs r ",
    last_event_join!(),
    " WHERE r.tenant_id = $1 AND r.run_id = ANY($2)"
);

/// A row of [`HEADS`]: the run and its head.
pub fn head_of(r: &tokio_postgres::Row) -> (String, Head) {
    let seq: Option<i64> = r.get(1);
    let id: Option<&str> = r.get(2);
    (r.get(0), (seq.unwrap_or(0), id.and_then(|s| Ulid::from_string(s).ok())))
}

/// [`HEADS`] of `runs` (ids of `tenant`); a run that does not exist (or was deleted) is
/// absent. In a transaction, call it after the runs' rows are locked, as a statement of
/// its own: its snapshot then holds every event committed before the lock was granted.
pub async fn heads<C: GenericClient>(
    c: &C,
    tenant: &str,
    runs: &[String],
) -> Result<foldhash::HashMap<String, Head>> {
    let stmt = c.prepare_cached(HEADS).await?;
    Ok(c.query(&stmt, &[&tenant, &runs]).await?.iter().map(head_of).collect())
}

/// The advisory-lock key of a run's writers: the low 64 bits of its ULID (its random
/// part). Two runs sharing a key only ever wait for each other, never write wrongly.
fn writer_key(run_id: &str) -> i64 {
    Ulid::from_string(run_id).map_or(0, |u| u128::from(u) as u64 as i64)
}

/// The writer keys of `runs`, in their order.
pub fn writer_keys<S: AsRef<str>>(runs: impl IntoIterator<Item = S>) -> Vec<i64> {
    runs.into_iter().map(|r| writer_key(r.as_ref())).collect()
}

/// Locked writers (the single-append path, locked groups) take their runs' writer keys
/// exclusively, right after the runs' row locks and before reading the heads: that
/// waits out every one-round-trip group already writing to them (which holds the keys
/// shared, [`Rows::claiming_statement`]) and turns away the ones that come after, so a
/// writer holding the row lock never builds on a head that moves under it. Without this, a
/// busy one-round-trip writer in another process could take the seqs of a locked one
/// on every retry. `$1`: [`writer_keys`]. On Citus it runs on the coordinator, as does
/// the claim (the INSERT's rows come from the coordinator).
pub const HOLD_RUNS: &str = "SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) k";

/// A locked writer's read of its runs' heads: takes their writer keys ([`HOLD_RUNS`])
/// and then reads the [`heads`], each a statement of its own, sent together. Poll it
/// right after sending the runs' row locks, in the same round trip: the heads' snapshot
/// then holds whatever committed while the locks and the keys were awaited.
pub async fn hold_and_read_heads<C: GenericClient>(
    c: &C,
    tenant: &str,
    runs: &[String],
) -> Result<foldhash::HashMap<String, Head>> {
    let hold = c.prepare_cached(HOLD_RUNS).await?;
    let keys = writer_keys(runs);
    let key_params: [&(dyn ToSql + Sync); 1] = [&keys];
    let (held, heads) = futures::join!(c.execute(&hold, &key_params), heads(c, tenant, runs));
    held?;
    heads
}

/// New states of runs whose state an append changed. A run's head (its last seq and
/// event) is the log's last row and is not copied here: only a change of state writes
/// the run's row (migration 0009).
pub struct RunRows {
    tenant: String,
    now: DateTime<Utc>,
    run: Vec<String>,
    state: Vec<Option<String>>,
    ended: Vec<Option<DateTime<Utc>>>,
}

impl RunRows {
    /// State changes of `tenant`'s runs, stamped `now`.
    pub fn new(tenant: &str, now: DateTime<Utc>) -> RunRows {
        RunRows { tenant: tenant.to_owned(), now, run: vec![], state: vec![], ended: vec![] }
    }

    /// `run_id` moved from state `before` to `after`; `ended` is set when it reached a
    /// terminal state. Nothing is recorded when the state did not change.
    pub fn push(&mut self, run_id: &str, before: Option<RunState>, after: Option<RunState>) {
        if before == after {
            return;
        }
        self.run.push(run_id.to_owned());
        self.state.push(after.map(|s| s.as_str().to_owned()));
        self.ended.push(after.filter(|s| s.is_terminal()).map(|_| self.now));
    }

    /// True when no run's state changed.
    pub fn is_empty(&self) -> bool {
        self.run.is_empty()
    }

    /// The UPDATE of [`RunRows::statement`].
    ///
    /// `r.run_id = ANY($3)` repeats the join's condition so that the runs are found by
    /// key in every plan. Without it, the generic plan PostgreSQL caches after a
    /// statement's fifth run (it cannot see how many runs the array holds) could join
    /// by hash over a scan of every run of the tenant: with 1,000 runs, a commit of two
    /// read all 1,000 (1.15 ms against 0.40 ms by key; docs/benchmarks-log.md,
    /// 2026-11-28).
    pub const SQL: &'static str = "UPDATE runs r SET state = u.state, updated_at = $2, state_changed_at = $2,
                ended_at = COALESCE(u.ended_at, r.ended_at)
         FROM unnest($3::text[], $4::text[], $5::timestamptz[]) AS u(run_id, state, ended_at)
         WHERE r.tenant_id = $1 AND r.run_id = ANY($3::text[]) AND r.run_id = u.run_id";

    /// The UPDATE, prepared once per connection.
    pub async fn statement<C: GenericClient>(c: &C) -> Result<Statement> {
        Ok(c.prepare_cached(Self::SQL).await?)
    }

    /// The statement's parameters.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [&self.tenant, &self.now, &self.run, &self.state, &self.ended]
    }
}
