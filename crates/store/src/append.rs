//! The append path: validated, atomic, gapless, idempotent.
//!
//! One transaction per batch:
//! 1. lock the run row (`FOR UPDATE`) and its writer key ([`HOLD_RUNS`](crate::rows::HOLD_RUNS),
//!    which keeps group commit's one-round-trip path, that takes no row lock, off the
//!    run), then read the run's head (its last event) from the log: appends to one run
//!    are serialised, and one built on a head that moved anyway is refused by the
//!    events' primary key and built again, so seqs are handed out in commit order and
//!    readers only ever see a gapless prefix;
//! 2. answer retries: if every event's idempotency key is already stored with the same
//!    content, return the original seqs and write nothing;
//! 3. check `expected_last_seq`;
//! 4. validate the batch against the run's [`RunGuard`] (cached per run, rebuilt from
//!    the log when another process appended since);
//! 5. insert all rows with one `INSERT ... SELECT FROM unnest(...)`, write the run's
//!    new state if it changed, commit.
//!
//! Any failure before the commit rolls the whole batch back: nothing partial is stored.

use std::borrow::Cow;
// foldhash, not SipHash: why, in the workspace Cargo.toml.
use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use serde::Serialize;
use ulid::Ulid;

use super::db::{tenant_tx, Db};
use super::events::{stream_after, ALL_EVENTS};
use super::rows::{Rows, RunRows};
use super::run_key::{get_or_insert_with, RunMap, RunRef};
use super::runs::{parse_run_id, run_not_found};
use crate::error::{Error, ErrorCode, Rejection, Result};
use agent_stream_core::domain::{Batch, Event, NewEvent, Origin, RunGuard};

/// The answer to an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AppendOutcome {
    /// Seq of the first event of the batch.
    pub first_seq: i64,
    /// Seq of the last event of the batch.
    pub last_seq: i64,
    /// True when this was a retry answered from the stored events (nothing written).
    pub replayed: bool,
}

pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// How long a run's head this process committed, read under the run's lock or created
/// is trusted without reading the run again (group commit's one-round-trip path).
///
/// The one-round-trip path does not touch the run's row, so it cannot see that the run
/// was deleted. Only retention deletes, only runs that ended days ago, and nothing can be
/// appended after a run ended; a head this process knew of such a run before another
/// process ended it is refused by the log's primary key, as long as the events after
/// it are still there. They are for days, so a head younger than this minute can only
/// be followed by a refusal, never by rows written for a deleted run.
pub const HEAD_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// A run's guard as this process last left it, and where the run's log ended then.
///
/// One entry per run for every write path of the process (single appends, every
/// group-commit lane), so whichever path writes next knows the head the last one left.
#[derive(Clone)]
pub(crate) struct Cached {
    /// The run's state up to its last event (`guard.last_seq()` is the head's seq).
    pub guard: RunGuard,
    /// The id of the run's last event (`None` before the first).
    pub last_id: Option<Ulid>,
    /// When a commit, a read under the run's lock or the run's creation last showed
    /// the log ending there; `None` once a write built on it failed, until one succeeds.
    pub confirmed: Option<std::time::Instant>,
}

impl Cached {
    /// The cache after a write or a locked read that left the log at `guard`'s seq,
    /// ending with `last_id`.
    pub fn confirmed(guard: RunGuard, last_id: Option<Ulid>) -> Cached {
        Cached { guard, last_id, confirmed: Some(std::time::Instant::now()) }
    }

    /// Whether the head may be built on without reading the run ([`HEAD_TTL`]).
    pub fn head_trusted(&self) -> bool {
        self.confirmed.is_some_and(|at| at.elapsed() < HEAD_TTL)
    }
}

/// Most runs whose guards stay cached; idle ones beyond it are dropped.
pub(crate) const GUARD_CACHE_MAX: usize = 4096;

/// Where the row writer hands the events it has just committed, so that this process's
/// live feeds take them as they are instead of reading them back from the table they
/// were written to (the live layer implements it; the store knows nothing of it).
pub trait CommitSink: Send + Sync {
    /// True when something here follows the run: only then are its events built (a
    /// copy of each).
    fn follows(&self, tenant: &str, run_id: &str) -> bool;
    /// Consecutive events of one run, in seq order, exactly as they are stored, right
    /// after their transaction committed. Called with the run's guard held, so one run's
    /// commits arrive in seq order.
    fn committed(&self, tenant: &str, run_id: &str, events: Vec<Event>);
    /// The run's log now ends at `last_seq`, and the append that wrote it will not take
    /// its answer: its request was dropped while it committed (an HTTP client that hangs
    /// up has its request dropped). The appender would have woken the run's subscribers
    /// and notified other processes on its answer; the group-commit lanes call this so
    /// that those do not wait for the safety poll.
    fn moved(&self, tenant: &str, run_id: &str, last_seq: i64);
}

/// Per-run guards. The async mutex also queues this process's appends to one run, so
/// they do not pile up on the row lock and each one finds the guard its predecessor left.
#[derive(Default)]
pub struct Guards {
    slots: Mutex<RunMap<Slot>>,
    sink: std::sync::OnceLock<Arc<dyn CommitSink>>,
}

impl Guards {
    /// From now on, every append through these guards (single or grouped) hands what it
    /// committed to `sink`. Set once; a second sink is refused.
    pub fn hand_commits_to(&self, sink: Arc<dyn CommitSink>) -> std::result::Result<(), Arc<dyn CommitSink>> {
        self.sink.set(sink)
    }

    /// The sink, if one follows `run_id` of `tenant`.
    pub(crate) fn sink_for(&self, tenant: &str, run_id: &str) -> Option<&dyn CommitSink> {
        self.sink.get().map(|s| &**s).filter(|s| s.follows(tenant, run_id))
    }

    /// The sink, whatever it follows.
    pub(crate) fn sink(&self) -> Option<&dyn CommitSink> {
        self.sink.get().map(|s| &**s)
    }

    pub(crate) fn slot(&self, tenant: &str, run_id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= GUARD_CACHE_MAX {
            // Drop guards nobody is using; they are rebuilt from the log on demand.
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        get_or_insert_with(&mut slots, RunRef(tenant, run_id), Slot::default).clone()
    }

    /// Whether this process wrote to the run, created it or read it under its lock less
    /// than [`HEAD_TTL`] ago, so that it exists for `tenant` without a read (retention
    /// deletes only runs that ended days ago). False when unknown, or when a write holds
    /// the run right now: ask the database then.
    pub fn head_known(&self, tenant: &str, run_id: &str) -> bool {
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            match slots.get(&RunRef(tenant, run_id)) {
                Some(s) => s.clone(),
                None => return false,
            }
        };
        let known = slot.try_lock().is_ok_and(|c| c.as_ref().is_some_and(Cached::head_trusted));
        known
    }

    /// Records a run this process has just created: it has no events, so its first
    /// append can take group commit's one-round-trip path instead of reading the run.
    /// (Another process appending first is refused there by the log's primary key, and
    /// the append is built again under the run's lock.)
    pub fn created(&self, tenant: &str, run_id: &str) {
        if let Ok(mut slot) = self.slot(tenant, run_id).try_lock() {
            if slot.is_none() {
                *slot = Some(Cached::confirmed(RunGuard::new(), None));
            }
        }
    }
}

/// Appends a producer's (or the service's) `batch` to a run of `tenant`.
pub async fn append(
    db: &Db,
    guards: &Guards,
    tenant: &str,
    run_id: &str,
    batch: &Batch,
    origin: Origin,
) -> Result<AppendOutcome> {
    append_inner(db, guards, tenant, run_id, origin, batch.expected_last_seq, |_| {
        Ok(Cow::Borrowed(&batch.events))
    })
    .await
}

/// Appends service-written events built from the run's current state, under the same
/// lock as the write: a control action (approve a plan, pause) decides on exactly the
/// state it changes.
pub async fn append_control<F>(
    db: &Db,
    guards: &Guards,
    tenant: &str,
    run_id: &str,
    build: F,
) -> Result<AppendOutcome>
where
    F: FnMut(&RunGuard) -> Result<Vec<NewEvent>>,
{
    let mut build = build;
    append_inner(db, guards, tenant, run_id, Origin::Service, None, |g| build(g).map(Cow::Owned)).await
}

/// How many times an append is built again after another process took the seqs it was
/// built for ([`Error::is_seq_taken`]) before the conflict is reported.
const SEQ_TAKEN_RETRIES: usize = 5;

async fn append_inner<'b, F>(
    db: &Db,
    guards: &Guards,
    tenant: &str,
    run_id: &str,
    origin: Origin,
    expected_last_seq: Option<i64>,
    mut build: F,
) -> Result<AppendOutcome>
where
    F: FnMut(&RunGuard) -> Result<Cow<'b, [NewEvent]>>,
{
    let run_id = parse_run_id(run_id)?;
    let slot = guards.slot(tenant, &run_id);
    let mut cached = slot.lock().await;
    let to = Target { db, guards, tenant, run_id: &run_id, origin, expected_last_seq };
    let mut tries = 0;
    loop {
        match attempt(&to, &mut build, &mut cached).await {
            Err(e) if e.is_seq_taken() && tries < SEQ_TAKEN_RETRIES => {
                tries += 1;
                tracing::debug!(run = %run_id, tries, "another process appended to the run meanwhile; building the append again");
            }
            // Nothing was stored, and a retry (with the same idempotency keys) is safe:
            // say so, rather than 500.
            Err(e) if e.is_seq_taken() => {
                tracing::warn!(run = %run_id, error = %e, "an append lost the race for its seqs on every try");
                return Err(Error::reject(
                    ErrorCode::Unavailable,
                    "other writers kept taking the run's next seqs; nothing was stored, retry",
                ));
            }
            out => return out,
        }
    }
}

/// Where an append goes, and what it asks of the run.
struct Target<'a> {
    db: &'a Db,
    guards: &'a Guards,
    tenant: &'a str,
    run_id: &'a str,
    origin: Origin,
    expected_last_seq: Option<i64>,
}

/// One try of [`append_inner`], in its own transaction; `cached` is the run's guard slot,
/// held by the caller.
async fn attempt<'b, F>(to: &Target<'_>, build: &mut F, cached: &mut Option<Cached>) -> Result<AppendOutcome>
where
    F: FnMut(&RunGuard) -> Result<Cow<'b, [NewEvent]>>,
{
    let Target { db, guards, tenant, run_id, origin, expected_last_seq } = *to;
    let run_id = run_id.to_owned();
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    let lock = tx
        .prepare_cached(
            "SELECT date_trunc('milliseconds', clock_timestamp())
             FROM runs WHERE tenant_id = $1 AND run_id = $2 FOR UPDATE",
        )
        .await?;
    // The head is read by a statement of its own, sent with the lock and run after it, so
    // that its snapshot holds whatever committed while the lock was awaited.
    let ids = [run_id.clone()];
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&tenant, &run_id];
    let (locked, heads) = futures::join!(
        tx.query_opt(&lock, &lock_params),
        crate::rows::hold_and_read_heads(&tx, tenant, &ids)
    );
    let Some(row) = locked? else {
        return Err(run_not_found(&run_id));
    };
    let now: DateTime<Utc> = row.get(0);
    let (last_seq, last_id) = heads?.remove(&run_id).unwrap_or((0, None));

    // Read under the run's lock: where the log ends now, whatever this append turns out
    // to be (a retry, a refusal), is kept for the next write on any path.
    let base = match cached.as_mut() {
        Some(c) if c.guard.last_seq() == last_seq => {
            c.last_id = last_id;
            c.confirmed = Some(std::time::Instant::now());
            c.guard.clone()
        }
        _ => {
            let rebuilt = rebuild_guard(&tx, tenant, &run_id, last_seq).await?;
            if rebuilt.last_seq() != last_seq {
                return Err(Error::Internal(anyhow::anyhow!(
                    "run {run_id}: the log ends at seq {last_seq} but its rebuilt guard at {}",
                    rebuilt.last_seq()
                )));
            }
            *cached = Some(Cached::confirmed(rebuilt.clone(), last_id));
            rebuilt
        }
    };
    let events = build(&base)?;
    if events.is_empty() {
        return Err(Error::reject(ErrorCode::BatchEmpty, "the batch holds no events"));
    }
    if let Some(outcome) = replay_if_retry(&tx, tenant, &run_id, &events).await? {
        return Ok(outcome);
    }
    if let Some(expected) = expected_last_seq {
        if expected != last_seq {
            return Err(Error::reject(
                ErrorCode::SeqConflict,
                format!("expected the run's last seq to be {expected}, but it is {last_seq}"),
            ));
        }
    }

    let mut guard = base.clone();
    let before = guard.state();
    let mids = crate::rows::check(&mut guard, last_seq + 1, &events, origin)?;
    let n = events.len();
    let ids = next_ids(last_id, now, n);
    let sink = guards.sink_for(tenant, &run_id);
    let mut written = Vec::with_capacity(if sink.is_some() { n } else { 0 });
    let mut rows = Rows::with_capacity(tenant, n);
    for (i, (e, mid)) in events.iter().zip(mids).enumerate() {
        let stored = sink.is_some().then_some(&mut written);
        rows.push(&run_id, last_seq + 1 + i as i64, ids[i], now, e, mid, stored);
    }
    let new_last = last_seq + n as i64;
    let mut changed = RunRows::new(tenant, now);
    changed.push(&run_id, before, guard.state());
    let insert = Rows::statement(&tx).await?;
    let row_params = rows.params();
    if changed.is_empty() {
        tx.execute(&insert, &row_params).await?;
    } else {
        // Sent together, answered in order: one round trip for both. If the insert fails
        // the update fails with it and the transaction rolls back.
        let update = RunRows::statement(&tx).await?;
        let head_params = changed.params();
        futures::try_join!(tx.execute(&insert, &row_params), tx.execute(&update, &head_params))?;
    }
    let id_strs = ids.iter().map(Ulid::to_string).collect::<Vec<_>>();
    let outcome = AppendOutcome { first_seq: last_seq + 1, last_seq: new_last, replayed: false };
    if let Err(e) = tx.commit().await {
        let last = id_strs.last().map_or("", String::as_str);
        if !settle_in_doubt(db, e, tenant, &run_id, new_last, last).await? {
            // Not stored: the guard cached before this append still holds.
            return Err(Error::reject(
                ErrorCode::Unavailable,
                "the database connection was lost; nothing was stored",
            ));
        }
    }
    *cached = Some(Cached::confirmed(guard, ids.last().copied()));
    if let Some(sink) = sink {
        sink.committed(tenant, &run_id, written);
    }
    Ok(outcome)
}

/// How long [`commit_outcome`] waits for a transaction still inserting at the seq it checks.
const IN_DOUBT_LOCK_WAIT: &str = "SET LOCAL lock_timeout = '5s'";

/// After a COMMIT failed, whether it took effect anyway, given the append's last row
/// (`seq` of the run, with event `id`). A COMMIT the server answered with an error
/// did not; one whose answer never came (the connection broke) is checked with
/// [`commit_outcome`]. `Ok(true)`: stored; `Ok(false)`: not stored; `Err`: the
/// server's error, or [`Error::InDoubt`] when the check failed too.
pub(crate) async fn settle_in_doubt(
    db: &Db,
    failed: tokio_postgres::Error,
    tenant: &str,
    run_id: &str,
    seq: i64,
    id: &str,
) -> Result<bool> {
    if failed.code().is_some() {
        return Err(failed.into());
    }
    tracing::warn!(error = %failed, run = %run_id, seq, "COMMIT got no answer; checking whether it took effect");
    commit_outcome(db, tenant, run_id, seq, id)
        .await
        .map_err(|check| Error::InDoubt(format!("{failed}; checking afterwards failed too: {check}")))
}

/// Whether the event `id` is stored at `seq` of the run: after a COMMIT whose answer
/// never came, whether that transaction committed. A transaction the server is still
/// finishing is waited out (up to 5 s) rather than taken for one that did not commit:
/// a probe row is inserted at the same key, which waits for whoever is inserting there
/// (the group commit's one-round-trip path holds no row lock to wait on). The probe is
/// never kept: the transaction ends in a rollback.
pub async fn commit_outcome(db: &Db, tenant: &str, run_id: &str, seq: i64, id: &str) -> Result<bool> {
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    tx.batch_execute(IN_DOUBT_LOCK_WAIT).await?;
    let probe = tx
        .query_opt(
            "INSERT INTO agent_run_events (tenant_id, run_id, seq, id, ts, type, payload)
             VALUES ($1, $2, $3, '', now(), 'probe', '{}')
             ON CONFLICT (tenant_id, run_id, seq) DO NOTHING RETURNING 1",
            &[&tenant, &run_id, &seq],
        )
        .await?;
    if probe.is_some() {
        // Nothing was at that seq: the transaction in doubt did not commit.
        tx.rollback().await?;
        return Ok(false);
    }
    let row = tx
        .query_opt(
            "SELECT id FROM agent_run_events WHERE tenant_id = $1 AND run_id = $2 AND seq = $3",
            &[&tenant, &run_id, &seq],
        )
        .await?;
    Ok(row.is_some_and(|r| r.get::<_, &str>(0) == id))
}

/// A retry is a batch whose every event carries a key that is already stored with the
/// same type, child and payload. A batch mixing stored and new keys is refused: the
/// producer changed a batch it is retrying, and guessing which half it meant would be
/// worse than saying so.
pub(crate) async fn replay_if_retry<C: deadpool_postgres::GenericClient>(
    tx: &C,
    tenant: &str,
    run_id: &str,
    events: &[NewEvent],
) -> Result<Option<AppendOutcome>> {
    let keys: Vec<&str> = events.iter().filter_map(|e| e.key.as_deref()).collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let stmt = tx
        .prepare_cached(
            "SELECT idempotency_key, seq, type, child_id, payload FROM agent_run_events
             WHERE tenant_id = $1 AND run_id = $2 AND idempotency_key = ANY($3)",
        )
        .await?;
    let rows = tx.query(&stmt, &[&tenant, &run_id, &keys]).await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let stored: HashMap<String, (i64, String, Option<String>, serde_json::Value)> =
        rows.into_iter().map(|r| (r.get::<_, String>(0), (r.get(1), r.get(2), r.get(3), r.get(4)))).collect();
    let mut first = i64::MAX;
    let mut last = i64::MIN;
    for (i, e) in events.iter().enumerate() {
        let Some((seq, ty, child, payload)) = e.key.as_ref().and_then(|k| stored.get(k)) else {
            return Err(Rejection::new(
                ErrorCode::IdempotencyMismatch,
                "this batch mixes events whose keys are already stored with new events; \
                 retry the original batch unchanged and send new events in a batch of their own",
            )
            .at(i)
            .into());
        };
        if *ty != e.body.type_name() || *child != e.child_id || *payload != e.body.payload() {
            return Err(Rejection::new(
                ErrorCode::IdempotencyMismatch,
                format!(
                    "idempotency key `{}` is already stored at seq {seq} with different content",
                    e.key.as_deref().unwrap_or_default()
                ),
            )
            .at(i)
            .into());
        }
        first = first.min(*seq);
        last = last.max(*seq);
    }
    Ok(Some(AppendOutcome { first_seq: first, last_seq: last, replayed: true }))
}

/// Folds the stored log up to `upto`, the head the caller read, into a guard (after a
/// restart, or when another process appended). Not further: another process may append
/// meanwhile (group commit's one-round-trip path takes no lock), and rows built on the
/// head read are then refused by the log's primary key and built again.
pub(crate) async fn rebuild_guard<C: deadpool_postgres::GenericClient>(
    tx: &C,
    tenant: &str,
    run_id: &str,
    upto: i64,
) -> Result<RunGuard> {
    let mut guard = RunGuard::new();
    let events = stream_after(tx, tenant, run_id, 0, upto, &ALL_EVENTS).await?;
    futures::pin_mut!(events);
    while let Some(e) = events.try_next().await? {
        guard.apply(e.seq, e.child_id.as_deref(), &e.body, Origin::Service).map_err(|r| {
            Error::Internal(anyhow::anyhow!("stored event {} of run {run_id} fails validation: {r}", e.seq))
        })?;
    }
    Ok(guard)
}

/// ULIDs for a batch at time `now`, strictly increasing and above the run's last id, so
/// ids are monotonic per run even when two appends share a millisecond or the clock
/// steps back.
pub(crate) fn next_ids(last: Option<Ulid>, now: DateTime<Utc>, n: usize) -> Vec<Ulid> {
    let mut out = Vec::with_capacity(n);
    let mut prev = last;
    for _ in 0..n {
        let next = next_id(prev, now);
        out.push(next);
        prev = Some(next);
    }
    out
}

/// The id after `prev`: in `now`'s millisecond, or after `prev`'s if the clock stepped back.
pub(crate) fn next_id(prev: Option<Ulid>, now: DateTime<Utc>) -> Ulid {
    let ms = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    match prev.filter(|p| p.timestamp_ms() >= ms).and_then(|p| p.increment()) {
        Some(id) => id,
        None => {
            let ts = prev.map_or(ms, |p| p.timestamp_ms().max(ms) + u64::from(p.timestamp_ms() >= ms));
            // Keep the top random bit clear so increments have room within the ms.
            Ulid::from_parts(ts, rand::random::<u128>() & ((1u128 << 79) - 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_strictly_increasing_even_when_the_clock_steps_back() {
        let t1: DateTime<Utc> = "2026-01-01T00:00:01Z".parse().unwrap();
        let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let a = next_ids(None, t1, 100);
        let b = next_ids(a.last().copied(), t0, 100);
        let all: Vec<Ulid> = a.into_iter().chain(b).collect();
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        let max = Ulid::from_parts(1_000, u128::MAX);
        let c = next_ids(Some(max), t0, 2);
        assert!(c[0] > max && c[1] > c[0]);
    }
}
