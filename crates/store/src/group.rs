//! Group commit: concurrent appends share transactions, so single-event appends from
//! many producers are not bound by one commit (and its WAL flush) each.
//!
//! Appends go to one of a few lanes, a tenant's single appends by tenant and a streaming
//! append's groups by run ([`Spread`]), so a run's appends of one kind stay in order in
//! one lane. A lane takes whatever is queued (up to [`MAX_GROUP`]), with a second group
//! going out while the first commits once enough single appends wait
//! ([`SECOND_GROUP_FROM`]), and commits it in one transaction per tenant (the
//! transaction is scoped to the tenant for row-level security), up to
//! [`TENANTS_AT_ONCE`] of them side by side. Each append keeps its own guarantees:
//! - it is validated on its own against its run's guard, as in [`super::append`](fn@super::append); a
//!   refused append gets its error and writes nothing, the others go on;
//! - an idempotent retry is answered from the stored rows, as alone;
//! - a group whose runs' heads this process already knows (from its last commit of them
//!   on any path, a read under their locks or their creation, less than [`HEAD_TTL`]
//!   ago), which changes no run's state and carries no idempotency keys goes out in one
//!   round trip and writes nothing but its events (`run_fast`); a run that moved
//!   meanwhile (another process appended) makes the events' primary key refuse it, and
//!   it is built again under row locks as any other group;
//! - if the shared transaction fails (a race on an idempotency key, a lost
//!   connection), nothing of the group is stored and every accepted append is redone
//!   alone through the single-append path, which answers it exactly as it would have.

// foldhash, not SipHash: why, in the workspace Cargo.toml.
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use ulid::Ulid;

pub use super::append::HEAD_TTL;
use super::append::{next_ids, rebuild_guard, replay_if_retry, AppendOutcome, Cached, CommitSink, Guards};
use super::db::Db;
use super::rows::{Rows, RunRows};
use super::runs::{parse_run_id, run_not_found};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::Metrics;
use agent_stream_core::domain::{Batch, Event, Origin, RunGuard, RunState};

/// Most appends one transaction carries.
pub const MAX_GROUP: usize = 256;

/// Most tenants' transactions one lane has open at once.
pub const TENANTS_AT_ONCE: usize = 8;

/// Most groups a lane has committing at once.
pub const GROUPS_IN_FLIGHT: usize = 2;

/// Appends waiting behind a committing group that go out as a second group rather than
/// wait for it. 64 producers of single appends: 1.69-1.86x raw autocommit INSERT from
/// 16, against 1.52-1.53x with one group at a time; from 24, 1.67x; three groups from
/// 10 or 16, or four from 12, made groups too small (15-17) and the machine's CPU, not
/// the commit, the bound (docs/benchmarks-log.md, 2026-12-02 04:21).
pub const SECOND_GROUP_FROM: usize = 16;

/// Appends of this many events or more commit on their own, outside the lanes.
pub const OWN_COMMIT_FROM: usize = 100;

/// How an append picks its lane. Either way a run's appends of one kind keep to one
/// lane, in order; appends of the two kinds to one run are serialized by the run's guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// By tenant: a tenant's single appends (a request each) gather in one lane, where
    /// they make the largest groups. A transaction's fixed cost is most of such an
    /// append's: 64 producers made groups of 23-27 in one lane against 12 in each of
    /// two, and the database spent 22-33 µs per append against 39-46
    /// (docs/benchmarks-log.md, 2026-11-29 16:20).
    ByTenant,
    /// By run: a streaming append's groups, which already hold what came in during a
    /// commit, spread over the lanes so that several commit at once (two lanes
    /// acknowledged 1.2-1.7 times the events of one in the same runs).
    ByRun,
}

struct Job {
    tenant: String,
    run_id: String,
    batch: Batch,
    reply: oneshot::Sender<Result<AppendOutcome>>,
    /// The append's span: the group's `commit` span is its child (or follows from it).
    span: tracing::Span,
    /// How it picked its lane, which says what waiting costs it: a single append's
    /// producer waits idle for its answer, a stream reads on and sends more next group.
    spread: Spread,
    /// When it reached its lane's queue, for the lane's wait metric.
    queued: std::time::Instant,
}

/// The lanes of a process.
pub struct GroupCommit {
    lanes: Vec<mpsc::Sender<Job>>,
    guards: Arc<Guards>,
}

impl GroupCommit {
    /// Starts `lanes` committer tasks over `db`.
    pub fn start(db: Db, guards: Arc<Guards>, metrics: Arc<Metrics>, lanes: usize) -> GroupCommit {
        let lanes = (0..lanes.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(4 * MAX_GROUP);
                tokio::spawn(lane(db.clone(), guards.clone(), metrics.clone(), rx));
                tx
            })
            .collect();
        GroupCommit { lanes, guards }
    }

    /// Appends a producer's batch, possibly in a transaction shared with others, in
    /// the lane `spread` picks.
    pub async fn append(
        &self,
        tenant: &str,
        run_id: &str,
        batch: Batch,
        spread: Spread,
    ) -> Result<AppendOutcome> {
        let run_id = parse_run_id(run_id)?;
        if batch.events.is_empty() {
            return Err(Error::reject(ErrorCode::BatchEmpty, "the batch holds no events"));
        }
        let lane = {
            use std::hash::BuildHasher;
            // A fixed seed: a key keeps its lane for the life of the process.
            let h = foldhash::fast::FixedState::with_seed(0);
            let hash = match spread {
                Spread::ByTenant => h.hash_one(tenant),
                Spread::ByRun => h.hash_one((tenant, &run_id)),
            };
            (hash % self.lanes.len() as u64) as usize
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            tenant: tenant.to_owned(),
            run_id: run_id.clone().into_owned(),
            batch,
            reply,
            span: tracing::Span::current(),
            spread,
            queued: std::time::Instant::now(),
        };
        let mut answer = Awaited { answer, guards: &self.guards, tenant, run_id: &run_id };
        self.lanes[lane]
            .send(job)
            .await
            .map_err(|_| Error::Internal(anyhow::anyhow!("group-commit lane stopped")))?;
        (&mut answer.answer)
            .await
            .map_err(|_| Error::Internal(anyhow::anyhow!("group-commit lane dropped an append")))?
    }
}

/// Appends `batch` in a transaction of its own ([`super::append`](fn@super::append)), on
/// a task of its own: an appender that goes away before its answer (its client hung
/// up) leaves the append to commit and be announced, as a lane's appends are. Awaited in
/// the request instead, a commit whose request was dropped while it was under way
/// committed unannounced, and one dropped before it was lost.
pub async fn append_alone(
    db: &Db,
    guards: &Arc<Guards>,
    tenant: &str,
    run_id: &str,
    batch: Batch,
    origin: Origin,
) -> Result<AppendOutcome> {
    use tracing::Instrument;
    let run_id = parse_run_id(run_id)?;
    let (reply, answer_rx) = oneshot::channel();
    let mut awaited = Awaited { answer: answer_rx, guards, tenant, run_id: &run_id };
    let task = (db.clone(), guards.clone(), tenant.to_owned(), run_id.clone().into_owned(), batch);
    tokio::spawn(
        async move {
            let (db, guards, tenant, run_id, batch) = task;
            let out = super::append::append(&db, &guards, &tenant, &run_id, &batch, origin).await;
            answer(&guards, &tenant, &run_id, reply, out);
        }
        .in_current_span(),
    );
    (&mut awaited.answer)
        .await
        .map_err(|_| Error::Internal(anyhow::anyhow!("an append's task ended without its answer")))?
}

/// An append's answer to come. Dropped with the answer sent but not taken (the request
/// went away just as its group committed), it tells the sink what the appender would
/// have acted on; dropped earlier, the lane finds the answer refused and does it
/// ([`unanswered`]). One of the two sees a written append's answer, never both. A taken
/// answer is not there to find: the receiver gives nothing after its value.
struct Awaited<'a> {
    answer: oneshot::Receiver<Result<AppendOutcome>>,
    guards: &'a Guards,
    tenant: &'a str,
    run_id: &'a str,
}

impl Drop for Awaited<'_> {
    fn drop(&mut self) {
        if let Ok(out) = self.answer.try_recv() {
            unanswered(self.guards.sink(), self.tenant, self.run_id, out);
        }
    }
}

/// An answer its appender will not take: if it wrote, the sink hears of the run's new
/// head ([`CommitSink::moved`]).
fn unanswered(sink: Option<&dyn CommitSink>, tenant: &str, run_id: &str, out: Result<AppendOutcome>) {
    if let (Some(sink), Ok(o)) = (sink, out) {
        if !o.replayed {
            sink.moved(tenant, run_id, o.last_seq);
        }
    }
}

/// Sends an append its answer, or, if its appender is gone, tells the sink.
fn answer(
    guards: &Guards,
    tenant: &str,
    run_id: &str,
    reply: oneshot::Sender<Result<AppendOutcome>>,
    out: Result<AppendOutcome>,
) {
    if let Err(out) = reply.send(out) {
        unanswered(guards.sink(), tenant, run_id, out);
    }
}

/// A lane's event loop. It keeps the database busy rather than waiting on it:
/// - the single appends that came in while a group committed go out the moment it
///   ends, and its answers are sent after them (sending 34 answers and letting their
///   requests come back took ~300 µs of each ~1.4 ms cycle in which the connection sat
///   idle); streams' groups wait for the answers as before, so that the streams
///   answered join them;
/// - once [`SECOND_GROUP_FROM`] single appends wait behind a group still committing,
///   they go out as a second group on another connection, so the next group's rows
///   are inserted while the first one's COMMIT flushes and its answers travel.
///
/// Runs that two groups in flight share stay in order: each group locks its runs' guard
/// slots (in run order) before it builds, so the later one waits for the earlier one's
/// commit and builds on its head.
async fn lane(db: Db, guards: Arc<Guards>, metrics: Arc<Metrics>, mut rx: mpsc::Receiver<Job>) {
    use futures::StreamExt;
    // The answers of the groups last committed, sent once the next group is on its way.
    let mut done: Vec<Answered> = vec![];
    let mut queued: Vec<Job> = vec![];
    let mut inflight = futures::stream::FuturesUnordered::new();
    let mut open = true;
    loop {
        while open && queued.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(j) => queued.push(j),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        let singles = waiting_producers(&queued);
        if !done.is_empty() && !queued.is_empty() && singles == 0 {
            // Only streams wait: the streams just answered send their next lines at
            // once, and yielding lets them join this group (streams gain nothing from
            // the group going out before the answers).
            deliver(&guards, std::mem::take(&mut done));
            tokio::task::yield_now().await;
            continue;
        }
        let start = !queued.is_empty()
            && (inflight.is_empty() || (inflight.len() < GROUPS_IN_FLIGHT && singles >= SECOND_GROUP_FROM));
        if start {
            let mut work = Box::pin(commit_jobs(&db, &guards, &metrics, std::mem::take(&mut queued)));
            // One poll sends the group's statements; the last group's answers go after.
            match futures::poll!(work.as_mut()) {
                std::task::Poll::Ready(d) => done.extend(d),
                std::task::Poll::Pending => inflight.push(work),
            }
            deliver(&guards, std::mem::take(&mut done));
            continue;
        }
        deliver(&guards, std::mem::take(&mut done));
        if inflight.is_empty() {
            let Some(first) = rx.recv().await else { return };
            queued.push(first);
            // An idle lane lets the tasks that are ready run once before it gathers:
            // appends already on their way (a request parsed, a stream's line read) then
            // join this group instead of waiting for the next commit. Groups grew by a
            // third (26 -> 34 single appends per commit) and many-runs' receipt p99 fell
            // from 122-187 ms to 78-163 (docs/benchmarks-log.md, 2026-11-29 17:29).
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            Some(d) = inflight.next() => done.extend(d),
            j = rx.recv(), if open && queued.len() < MAX_GROUP => match j {
                Some(j) => queued.push(j),
                None => open = false,
            },
        }
    }
}

/// Commits `jobs`, one transaction per tenant, and gives their answers; the appends'
/// wait in the lane and the group's time go to the metrics, which split an append's time
/// between the queue and the commit (under many-runs the queue was most of it:
/// docs/benchmarks-log.md, 2026-12-03 14:25).
async fn commit_jobs(db: &Db, guards: &Guards, metrics: &Metrics, jobs: Vec<Job>) -> Vec<Answered> {
    let out = std::time::Instant::now();
    metrics.commit_wait_seconds.observe_all(jobs.iter().map(|j| out.saturating_duration_since(j.queued)));
    let answered = commit_tenants(db, guards, metrics, jobs).await;
    metrics.commit_seconds.observe_all([out.elapsed()]);
    answered
}

/// Commits `jobs`, one transaction per tenant, without the metrics' clock around them.
async fn commit_tenants(db: &Db, guards: &Guards, metrics: &Metrics, jobs: Vec<Job>) -> Vec<Answered> {
    // One transaction per tenant, appends in arrival order.
    let mut by_tenant: Vec<(String, Vec<Job>)> = vec![];
    for j in jobs {
        match by_tenant.iter_mut().find(|(t, _)| *t == j.tenant) {
            Some((_, v)) => v.push(j),
            None => by_tenant.push((j.tenant.clone(), vec![j])),
        }
    }
    // Tenants' groups are separate transactions on separate connections: up to
    // TENANTS_AT_ONCE go out together, so one lane serves many tenants without
    // their commits queueing behind each other. The bound keeps a lane from taking the
    // whole pool.
    let n = by_tenant.len();
    let groups = by_tenant.into_iter().map(|(tenant, jobs)| commit_group(db, guards, metrics, tenant, jobs));
    use futures::StreamExt;
    let mut groups = std::pin::pin!(futures::stream::iter(groups).buffer_unordered(TENANTS_AT_ONCE));
    // A tenant's answers go out as its transaction ends, so that a tenant waiting on a
    // lock holds up no other's answers; only the last, which ends the batch, is left
    // for the lane to send after its next group.
    let mut ended = 0;
    while let Some(answered) = groups.next().await {
        ended += 1;
        if ended == n {
            return vec![answered];
        }
        deliver(guards, [answered]);
    }
    vec![]
}

/// The single appends among `queued`: only they count towards a second group. A
/// stream's lines gather while it waits and go in its next group, so a stream loses
/// nothing by waiting, and splitting its groups cost `many-runs` (1,000 streams) more
/// transactions and receipt p99 77-123 ms against 34-69 (docs/benchmarks-log.md,
/// 2026-12-02 04:21).
fn waiting_producers(queued: &[Job]) -> usize {
    queued.iter().filter(|j| j.spread == Spread::ByTenant).count()
}

/// A tenant's group's answers, to be sent.
type Answered = (String, Answers);

/// Sends each group's answers.
fn deliver(guards: &Guards, groups: impl IntoIterator<Item = Answered>) {
    for (tenant, answers) in groups {
        for (reply, run_id, out) in answers {
            answer(guards, &tenant, &run_id, reply, out);
        }
    }
}

/// A run's state while its group is built.
struct Locked {
    last_seq: i64,
    last_id: Option<Ulid>,
    guard: RunGuard,
    before: Option<RunState>,
}

async fn commit_group(
    db: &Db,
    guards: &Guards,
    metrics: &Metrics,
    owned: String,
    jobs: Vec<Job>,
) -> Answered {
    let tenant = owned.as_str();
    let mut runs: Vec<String> = jobs.iter().map(|j| j.run_id.clone()).collect();
    runs.sort();
    runs.dedup();
    // The runs' guard slots, locked in order (the single-append path takes one at a time).
    let mut slots = Vec::with_capacity(runs.len());
    for r in &runs {
        slots.push(guards.slot(tenant, r).lock_owned().await);
    }
    // One transaction for every append of the group: in the first one's trace, linked
    // from the others'.
    let span = tracing::info_span!(target: crate::TRACES, parent: jobs.first().and_then(|j| j.span.id()), "commit", appends = jobs.len());
    for j in jobs.iter().skip(1) {
        span.follows_from(j.span.id());
    }
    let result = {
        use tracing::Instrument;
        try_group(db, guards.sink(), tenant, &runs, &mut slots, jobs).instrument(span).await
    };
    drop(slots);
    match result {
        Ok((answers, groups)) => {
            if groups > 0 {
                let written =
                    answers.iter().filter(|(_, _, a)| a.as_ref().is_ok_and(|o| !o.replayed)).count();
                metrics.committed_group(written as u64);
            }
            (owned, answers)
        }
        Err((e, jobs)) => {
            if e.is_seq_taken() {
                // Another process appended to one of the runs meanwhile: expected when
                // several write to one run, and each append is built again on its own.
                tracing::debug!(error = %e, appends = jobs.len(), "a group's seqs were taken; redoing its appends one by one");
            } else {
                tracing::warn!(error = %e, appends = jobs.len(), "group commit failed; redoing its appends one by one");
            }
            for j in jobs {
                let out = super::append(db, guards, &j.tenant, &j.run_id, &j.batch, Origin::Producer).await;
                if out.as_ref().is_ok_and(|o| !o.replayed) {
                    metrics.committed_group(1);
                }
                answer(guards, &j.tenant, &j.run_id, j.reply, out);
            }
            (owned, vec![])
        }
    }
}

/// Each append's reply channel, run and answer.
type Answers = Vec<(oneshot::Sender<Result<AppendOutcome>>, String, Result<AppendOutcome>)>;

/// Each append's answer, the runs' state after the group, and the events written for
/// runs the commit sink follows.
type Built = (Vec<Result<AppendOutcome>>, HashMap<String, Locked>, Vec<Event>);

/// Why a group's transaction did not end in an answered COMMIT.
enum Failed {
    /// Nothing of the group is stored.
    NotStored(Error),
    /// COMMIT was sent but its answer never came (the connection broke): the group is
    /// stored or not as a whole, and its last row (run, seq, event id) tells which.
    InDoubt { error: tokio_postgres::Error, probe: (String, i64, String), built: Built },
}

impl From<Error> for Failed {
    fn from(e: Error) -> Failed {
        Failed::NotStored(e)
    }
}

impl From<tokio_postgres::Error> for Failed {
    fn from(e: tokio_postgres::Error) -> Failed {
        Failed::NotStored(e.into())
    }
}

/// Builds and commits the group. `Ok`: every append's answer and whether a transaction
/// wrote. `Err`: nothing was stored; every append comes back to be redone alone, which
/// answers each exactly as alone. A COMMIT whose answer never came is settled first
/// (see [`super::append::settle_in_doubt`]): a group that did commit is answered as
/// committed, not redone (a redo would store keyless appends twice); one whose outcome
/// cannot be learned answers its appends with [`Error::InDoubt`].
///
/// The transaction is driven by hand rather than through `Transaction` so that its
/// statements can be pipelined: BEGIN, the tenant setting, the row locks and the heads
/// go out in one round trip, and the INSERT, the state UPDATE (if a state changed) and
/// COMMIT in another. A group then waits on three round trips instead of six (one on
/// the one-round-trip path), and group commit is bound by how fast groups
/// go round (docs/benchmarks-log.md, `bench ingest-single`).
async fn try_group(
    db: &Db,
    sink: Option<&dyn CommitSink>,
    tenant: &str,
    runs: &[String],
    slots: &mut [tokio::sync::OwnedMutexGuard<Option<Cached>>],
    jobs: Vec<Job>,
) -> std::result::Result<(Answers, u64), (Error, Vec<Job>)> {
    let client = match db.pool.get().await {
        Ok(c) => c,
        Err(e) => return Err((e.into(), jobs)),
    };
    let cached: Option<HashMap<String, Locked>> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let c = slots[i].as_ref().filter(|c| c.head_trusted())?;
            let g = &c.guard;
            Some((
                r.clone(),
                Locked { last_seq: g.last_seq(), last_id: c.last_id, guard: g.clone(), before: g.state() },
            ))
        })
        .collect();
    let fast = match cached {
        Some(state) => run_fast(&client, sink, tenant, state, &jobs).await,
        None => Ok(None),
    };
    if !matches!(fast, Ok(Some(_))) {
        // A head may have moved (another process appended): none of these runs' heads
        // is built on again without a read until a commit says where it is.
        for slot in slots.iter_mut() {
            if let Some(c) = slot.as_mut() {
                c.confirmed = None;
            }
        }
    }
    let outcome = match fast {
        Ok(Some(built)) => Ok(built),
        Ok(None) => run_group(&client, sink, tenant, runs, slots, &jobs).await,
        Err(failed) => Err(failed),
    };
    let (results, mut state, written) = match outcome {
        Ok(built) => built,
        Err(failed) => {
            super::db::discard(client);
            let (error, (run, seq, id), built) = match failed {
                Failed::NotStored(e) => return Err((e, jobs)),
                Failed::InDoubt { error, probe, built } => (error, probe, built),
            };
            match super::append::settle_in_doubt(db, error, tenant, &run, seq, &id).await {
                Ok(true) => built,
                Ok(false) => {
                    let e = anyhow::anyhow!("the connection broke at COMMIT; the group was not stored");
                    return Err((Error::Internal(e), jobs));
                }
                Err(e) => {
                    // The guards may or may not hold the group: rebuild them next time.
                    for slot in slots.iter_mut() {
                        **slot = None;
                    }
                    let why = match e {
                        Error::InDoubt(why) => why,
                        other => other.to_string(),
                    };
                    let answers = jobs
                        .into_iter()
                        .zip(built.0)
                        .map(|(j, r)| match r {
                            Ok(o) if !o.replayed => (j.reply, j.run_id, Err(Error::InDoubt(why.clone()))),
                            r => (j.reply, j.run_id, r),
                        })
                        .collect();
                    return Ok((answers, 0));
                }
            }
        }
    };
    // The guards move into the slots rather than being copied: `state` ends here.
    for (i, r) in runs.iter().enumerate() {
        if let Some(s) = state.remove(r) {
            *slots[i] = Some(Cached::confirmed(s.guard, s.last_id));
        }
    }
    if let Some(sink) = sink {
        hand_over(sink, tenant, written);
    }
    let wrote = results.iter().any(|r| r.as_ref().is_ok_and(|o| !o.replayed));
    let answers = jobs.into_iter().zip(results).map(|(j, r)| (j.reply, j.run_id, r)).collect();
    Ok((answers, u64::from(wrote)))
}

/// Hands a committed group's events to `sink`, run by run (a group holds a run's
/// appends in seq order, though other runs' appends may come between them).
fn hand_over(sink: &dyn CommitSink, tenant: &str, written: Vec<Event>) {
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut by_run: Vec<Vec<Event>> = vec![];
    for e in written {
        // A run's appends often come one after another: only a new run is looked up.
        let i = match by_run.last() {
            Some(last) if last[0].run_id == e.run_id => by_run.len() - 1,
            _ => *at.entry(e.run_id.clone()).or_insert_with(|| {
                by_run.push(vec![]);
                by_run.len() - 1
            }),
        };
        by_run[i].push(e);
    }
    // Each run's id, moved out of the map rather than copied again.
    let mut names = vec![String::new(); by_run.len()];
    for (run_id, i) in at {
        names[i] = run_id;
    }
    for (run_id, evs) in names.iter().zip(by_run) {
        sink.committed(tenant, run_id, evs);
    }
}

/// The group in one round trip, when this process knows where each of its runs' heads
/// is (`state`, from the runs' cached guards and heads), no append carries an
/// idempotency key (a retry needs a read before its answer) and no run's state changes
/// (that writes the run's row, under its lock): BEGIN, the tenant setting, the INSERT
/// and COMMIT are sent together. No row of `runs` is read or written: if another
/// process appended to a run since, the events' primary key refuses the rows built on
/// the old head, and the COMMIT then ends in a rollback; if a locked writer holds one
/// of the runs, the INSERT's claim on it fails ([`Rows::claiming_statement`]), likewise.
///
/// `Ok(Some)`: committed. `Ok(None)`: nothing was stored and the connection is idle
/// again: a run moved, an append was refused, or a statement failed; the caller builds
/// the group again the locking way ([`run_group`]), which settles each append as
/// before. The group is all or nothing here: if any append would be refused, the
/// other path answers it against the locked head rather than against a cached one.
///
/// Timestamps come from this process's clock rather than the database's (there is no
/// read to take it from); ids stay strictly increasing per run ([`next_ids`]).
async fn run_fast(
    c: &deadpool_postgres::Client,
    sink: Option<&dyn CommitSink>,
    tenant: &str,
    mut state: HashMap<String, Locked>,
    jobs: &[Job],
) -> std::result::Result<Option<Built>, Failed> {
    if jobs.iter().any(|j| j.batch.events.iter().any(|e| e.key.is_some())) {
        return Ok(None);
    }
    let now = DateTime::<Utc>::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap_or_else(Utc::now);
    let (results, rows, written) = accept(c, sink, tenant, &mut state, jobs, now).await;
    if rows.is_empty() || results.iter().any(|r| r.is_err()) || !state_changes(tenant, now, &state).is_empty()
    {
        return Ok(None);
    }
    let keys = super::rows::writer_keys(state.keys());
    let (begun, scoped, inserted, committed) = rows.commit_claimed(c, &keys).await?;
    match committed {
        // No answer to the COMMIT: the group may be stored; its last row tells.
        Err(error) if error.code().is_none() => {
            let probe = rows.last().unwrap_or_default();
            return Err(Failed::InDoubt { error, probe, built: (results, state, written) });
        }
        Err(e) => return Err(e.into()),
        Ok(()) => {}
    }
    // COMMIT was answered, so the connection held: BEGIN cannot have failed (had it, the
    // statements after it would have run on their own; it is checked all the same).
    begun?;
    // COMMIT answered: after any failed statement it was a rollback.
    if let Some(e) = [scoped.err(), inserted.err()].into_iter().flatten().next() {
        tracing::debug!(error = %e, "one-round-trip group rolled back; building it again under row locks");
        return Ok(None);
    }
    Ok(Some((results, state, written)))
}

/// One group's transaction on `c`, up to and including COMMIT.
async fn run_group(
    c: &deadpool_postgres::Client,
    sink: Option<&dyn CommitSink>,
    tenant: &str,
    runs: &[String],
    slots: &[tokio::sync::OwnedMutexGuard<Option<Cached>>],
    jobs: &[Job],
) -> std::result::Result<Built, Failed> {
    let lock = c
        .prepare_cached(
            "SELECT run_id, date_trunc('milliseconds', clock_timestamp())
             FROM runs WHERE tenant_id = $1 AND run_id = ANY($2) ORDER BY run_id FOR UPDATE",
        )
        .await?;
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&tenant, &runs];
    // The heads are read after the locks are granted (a statement of its own, sent in
    // the same round trip), so their snapshot holds what committed meanwhile.
    let (locked, heads) = super::db::begin_with(c, tenant, async {
        let (locked, heads) =
            futures::join!(c.query(&lock, &lock_params), super::rows::hold_and_read_heads(c, tenant, runs));
        Ok::<_, Error>((locked?, heads?))
    })
    .await?;
    build(c, sink, tenant, runs, slots, &locked, &heads, jobs).await
}

/// With the group's runs locked (`rows`) and their heads read (`heads`) in the
/// transaction open on `c`, answers
/// retries, validates each append on its own, writes the accepted ones' rows and
/// commits; returns each append's answer, in order.
#[allow(clippy::too_many_arguments)]
async fn build(
    c: &deadpool_postgres::Client,
    sink: Option<&dyn CommitSink>,
    tenant: &str,
    runs: &[String],
    slots: &[tokio::sync::OwnedMutexGuard<Option<Cached>>],
    rows: &[tokio_postgres::Row],
    heads: &HashMap<String, (i64, Option<Ulid>)>,
    jobs: &[Job],
) -> std::result::Result<Built, Failed> {
    let mut now: Option<DateTime<Utc>> = None;
    let mut state: HashMap<String, Locked> = HashMap::new();
    for row in rows {
        let run_id: String = row.get(0);
        now = Some(row.get(1));
        let (last_seq, last_id) = heads.get(&run_id).copied().unwrap_or((0, None));
        let i = runs
            .binary_search(&run_id)
            .map_err(|_| Error::Internal(anyhow::anyhow!("locked a run that was not asked for")))?;
        let guard = match slots[i].as_ref() {
            Some(c) if c.guard.last_seq() == last_seq => c.guard.clone(),
            _ => rebuild_guard(c, tenant, &run_id, last_seq).await?,
        };
        if guard.last_seq() != last_seq {
            return Err(Error::Internal(anyhow::anyhow!(
                "run {run_id}: the log ends at seq {last_seq} but its rebuilt guard at {}",
                guard.last_seq()
            ))
            .into());
        }
        let before = guard.state();
        state.insert(run_id, Locked { last_seq, last_id, guard, before });
    }
    let now = now.unwrap_or_else(Utc::now);
    let (results, rows, written) = accept(c, sink, tenant, &mut state, jobs, now).await;
    if !rows.is_empty() {
        let changed = state_changes(tenant, now, &state);
        let (insert, update) = (Rows::statement(c).await?, RunRows::statement(c).await?);
        let (row_params, change_params) = (rows.params(), changed.params());
        // One round trip for the three. A failed INSERT or UPDATE turns the COMMIT into
        // a rollback, so nothing of the group is stored; their errors say so.
        let (inserted, updated, committed) = futures::join!(
            c.execute(&insert, &row_params),
            async {
                match changed.is_empty() {
                    true => Ok(0),
                    false => c.execute(&update, &change_params).await,
                }
            },
            c.batch_execute("COMMIT")
        );
        match committed {
            // No answer to the COMMIT: the group may be stored; its last row tells.
            Err(error) if error.code().is_none() => {
                let probe = rows.last().unwrap_or_default();
                return Err(Failed::InDoubt { error, probe, built: (results, state, written) });
            }
            committed => {
                inserted?;
                updated?;
                committed?;
            }
        }
    } else {
        // Nothing to write (retries and refusals only): end the transaction.
        c.batch_execute("COMMIT").await?;
    }
    Ok((results, state, written))
}

/// The runs whose state the group changes, with their new states.
fn state_changes(tenant: &str, now: DateTime<Utc>, state: &HashMap<String, Locked>) -> RunRows {
    let mut changed = RunRows::new(tenant, now);
    for (run_id, s) in state {
        changed.push(run_id, s.before, s.guard.state());
    }
    changed
}

/// Answers retries, validates each append on its own against its run's state (moved
/// along as appends are accepted) and gathers the accepted ones' rows: each append's
/// answer, in order, and the rows. Only retries (appends carrying idempotency keys)
/// read from `c`. The accepted events of runs `sink` follows are built as they will be
/// stored, to be handed over once committed.
async fn accept(
    c: &deadpool_postgres::Client,
    sink: Option<&dyn CommitSink>,
    tenant: &str,
    state: &mut HashMap<String, Locked>,
    jobs: &[Job],
    now: DateTime<Utc>,
) -> (Vec<Result<AppendOutcome>>, Rows, Vec<Event>) {
    let mut written = vec![];
    let mut rows = Rows::with_capacity(tenant, jobs.iter().map(|j| j.batch.events.len()).sum());
    let mut results = Vec::with_capacity(jobs.len());
    for job in jobs {
        let Some(run) = state.get_mut(&job.run_id) else {
            results.push(Err(run_not_found(&job.run_id)));
            continue;
        };
        let events = &job.batch.events;
        match replay_if_retry(c, tenant, &job.run_id, events).await {
            Ok(Some(outcome)) => {
                results.push(Ok(outcome));
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                results.push(Err(e));
                continue;
            }
        }
        if let Some(expected) = job.batch.expected_last_seq {
            if expected != run.last_seq {
                results.push(Err(Error::reject(
                    ErrorCode::SeqConflict,
                    format!("expected the run's last seq to be {expected}, but it is {}", run.last_seq),
                )));
                continue;
            }
        }
        // `check` works on a copy of its own and leaves the guard as it was on a refusal.
        let mids = match crate::rows::check(&mut run.guard, run.last_seq + 1, events, Origin::Producer) {
            Ok(mids) => mids,
            Err(r) => {
                results.push(Err(Error::Rejected(r)));
                continue;
            }
        };
        let n = events.len() as i64;
        let ids = next_ids(run.last_id, now, events.len());
        let follow = sink.is_some_and(|s| s.follows(tenant, &job.run_id));
        for (i, (e, mid)) in events.iter().zip(mids).enumerate() {
            let stored = follow.then_some(&mut written);
            rows.push(&job.run_id, run.last_seq + 1 + i as i64, ids[i], now, e, mid, stored);
        }
        results.push(Ok(AppendOutcome {
            first_seq: run.last_seq + 1,
            last_seq: run.last_seq + n,
            replayed: false,
        }));
        run.last_seq += n;
        run.last_id = ids.last().copied();
    }
    (results, rows, written)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records what it is told of runs' new heads.
    #[derive(Default)]
    struct Heard(Mutex<Vec<(String, String, i64)>>);

    impl CommitSink for Heard {
        fn follows(&self, _: &str, _: &str) -> bool {
            false
        }
        fn committed(&self, _: &str, _: &str, _: Vec<Event>) {}
        fn moved(&self, tenant: &str, run_id: &str, last_seq: i64) {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push((tenant.into(), run_id.into(), last_seq));
        }
    }

    fn guards() -> (Arc<Guards>, Arc<Heard>) {
        let (guards, heard) = (Arc::new(Guards::default()), Arc::new(Heard::default()));
        let _ = guards.hand_commits_to(heard.clone());
        (guards, heard)
    }

    fn awaited(guards: &Guards) -> (oneshot::Sender<Result<AppendOutcome>>, Awaited<'_>) {
        let (reply, answer) = oneshot::channel();
        (reply, Awaited { answer, guards, tenant: "t", run_id: "r" })
    }

    fn wrote(last_seq: i64, replayed: bool) -> Result<AppendOutcome> {
        Ok(AppendOutcome { first_seq: last_seq, last_seq, replayed })
    }

    fn heard(h: &Heard) -> Vec<(String, String, i64)> {
        h.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whichever side finds the appender gone, the lane (its answer refused) or the
    /// appender's drop (its answer there, untaken), tells the sink once; an answer taken,
    /// a retry (nothing written) and a refusal tell it nothing.
    #[test]
    fn an_append_whose_answer_is_not_taken_is_told_to_the_sink_once() {
        // Gone before the lane answered: the lane tells.
        let (g, h) = guards();
        let (reply, a) = awaited(&g);
        drop(a);
        answer(&g, "t", "r", reply, wrote(5, false));
        assert_eq!(heard(&h), [("t".into(), "r".into(), 5)]);

        // Gone after the lane answered, before taking it: the drop tells.
        let (g, h) = guards();
        let (reply, a) = awaited(&g);
        answer(&g, "t", "r", reply, wrote(6, false));
        assert!(heard(&h).is_empty(), "the answer waits to be taken");
        drop(a);
        assert_eq!(heard(&h), [("t".into(), "r".into(), 6)]);

        // Taken, as the appender takes it: the appender acts on it, the sink hears nothing.
        let (g, h) = guards();
        let (reply, mut a) = awaited(&g);
        answer(&g, "t", "r", reply, wrote(7, false));
        let taken = futures::executor::block_on(&mut a.answer);
        assert!(taken.is_ok_and(|r| r.is_ok()));
        drop(a);
        assert!(heard(&h).is_empty());

        // Nothing written: nothing to tell.
        let (g, h) = guards();
        let (reply, a) = awaited(&g);
        drop(a);
        answer(&g, "t", "r", reply, wrote(8, true));
        let (reply, a) = awaited(&g);
        drop(a);
        answer(&g, "t", "r", reply, Err(Error::reject(ErrorCode::SeqConflict, "refused")));
        assert!(heard(&h).is_empty());
    }
}
