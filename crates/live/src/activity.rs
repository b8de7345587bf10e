//! Run activity for list pages: runs as they are created and change lifecycle state.
//!
//! Every committed write already bumps the tenant's wake-up in the [`Hub`](super::Hub)
//! (locally and through the listener from other processes). On a wake-up, at most
//! every 100 ms (`MIN_GAP`), one task per watched tenant reads the tenant's runs created
//! or whose state changed since its last read (`state_changed_at`, which appends that
//! leave the state alone do not move), with an overlap for transactions that stamped it
//! before committing, and hands the rows to every stream of the tenant;
//! each stream reports the runs that are new to it or whose state moved. So a wake-up
//! costs one read per tenant, whatever the number of streams. The rows are the truth,
//! so a lost wake-up costs at most one safety-poll interval.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast::{self, error::RecvError};

use std::sync::Arc;

use agent_stream_core::domain::RunState;
use agent_stream_store::auth::Principal;
use agent_stream_store::runs::{changed_since, open_runs, RunInfo};
use agent_stream_store::{Db, Result};

use crate::Live;

/// Least time between two reads of one stream.
const MIN_GAP: Duration = Duration::from_millis(100);
/// How far before its last read a stream looks again (commit lag of `state_changed_at`).
const OVERLAP: chrono::TimeDelta = chrono::TimeDelta::seconds(5);
/// Reads a stream may fall behind before it reads for itself.
const BUFFER: usize = 16;

/// One read of a tenant's changed run rows, shared by the tenant's streams.
struct Read {
    rows: Vec<RunInfo>,
    /// The database's clock at the read.
    at: DateTime<Utc>,
}

/// The per-tenant reading tasks.
#[derive(Default)]
pub struct ActivityFeeds {
    feeds: Mutex<HashMap<String, broadcast::Sender<Arc<Read>>>>,
}

impl ActivityFeeds {
    /// Joins the tenant's reading task, starting it (reading from `since`) if this is
    /// its first stream.
    fn join(&self, live: &Arc<Live>, tenant: &str, since: DateTime<Utc>) -> broadcast::Receiver<Arc<Read>> {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = feeds.get(tenant).filter(|tx| tx.receiver_count() > 0) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        feeds.insert(tenant.to_owned(), tx.clone());
        tokio::spawn(tenant_feed(live.clone(), tenant.to_owned(), since, tx));
        rx
    }
}

/// Reads the tenant's changed runs once per wake-up for all its streams; ends with its
/// last stream or the process.
async fn tenant_feed(
    live: Arc<Live>,
    tenant: String,
    mut since: DateTime<Utc>,
    tx: broadcast::Sender<Arc<Read>>,
) {
    let mut wake = live.hub.tenant_watch(&tenant);
    let mut stopping = live.stopping();
    let mut last_read = tokio::time::Instant::now();
    while tx.receiver_count() > 0 && !*stopping.borrow_and_update() {
        // A wake-up, or the safety interval in case one was lost.
        tokio::select! {
            woke = tokio::time::timeout(super::SAFETY_POLL, wake.changed()) => {
                if matches!(woke, Ok(Err(_))) {
                    break;
                }
            }
            _ = stopping.changed() => break,
        }
        tokio::time::sleep_until(last_read + MIN_GAP).await;
        last_read = tokio::time::Instant::now();
        wake.borrow_and_update();
        if tx.receiver_count() == 0 {
            break;
        }
        live.feeds.count_read();
        match changed_since(&live.db, &tenant, since - OVERLAP).await {
            Ok((rows, at)) => {
                since = at;
                let _ = tx.send(Arc::new(Read { rows, at }));
            }
            Err(e) => tracing::warn!(error = %e, "run activity read failed; retrying on the next wake-up"),
        }
    }
    let mut all = live.activity.feeds.lock().unwrap_or_else(|p| p.into_inner());
    if all.get(&tenant).is_some_and(|t| t.same_channel(&tx)) {
        all.remove(&tenant);
    }
}

/// What happened to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum ActivityKind {
    /// The run was created after the stream started (or just before: see [`stream`]).
    Created,
    /// The run's lifecycle state changed.
    StateChanged,
}

/// One item of a run-activity stream: what happened and the run's row now.
#[derive(Debug, Clone)]
pub struct RunActivity {
    /// Created or state changed.
    pub kind: ActivityKind,
    /// The run's row.
    pub run: RunInfo,
}

struct Watching {
    db: Db,
    tenant: String,
    reads: broadcast::Receiver<Arc<Read>>,
    /// The database's clock at the last read this stream took in.
    since: DateTime<Utc>,
    /// State last reported per run (runs that can still change or changed recently).
    known: HashMap<String, (Option<RunState>, DateTime<Utc>)>,
    queue: VecDeque<RunActivity>,
}

/// The tenant's run activity from now on, starting with the runs created or moved in
/// the last `OVERLAP`.
///
/// A client lists the runs and then subscribes (or subscribes and lists while the
/// subscription starts); a run created or moved between its list and this stream's
/// snapshot would be in neither. So what moved within `OVERLAP` before the snapshot is
/// reported first, as `Created` (made in that window) or `StateChanged`: a client
/// that listed it already just sets it again.
pub async fn stream(live: Arc<Live>, who: Principal) -> Result<impl Stream<Item = RunActivity>> {
    let (open, now) = open_runs(&live.db, &who.tenant_id, 2.0 * OVERLAP.as_seconds_f64()).await?;
    // Joined after the snapshot: what changes in between is in the feed's next read,
    // which looks `OVERLAP` back.
    let reads = live.activity.join(&live, &who.tenant_id, now);
    let recent = now - OVERLAP;
    let mut known = HashMap::with_capacity(open.len());
    let mut queue = VecDeque::new();
    for (run, moved_at) in open {
        known.insert(run.run_id.clone(), (run.state, run.updated_at));
        if moved_at >= recent {
            let kind =
                if run.created_at >= recent { ActivityKind::Created } else { ActivityKind::StateChanged };
            queue.push_back(RunActivity { kind, run });
        }
    }
    let w = Watching { db: live.db.clone(), tenant: who.tenant_id, reads, since: now, known, queue };
    Ok(futures::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(a) = w.queue.pop_front() {
                return Some((a, w));
            }
            match w.reads.recv().await {
                Ok(read) => w.take(&read.rows, read.at),
                // Fell behind the shared reads: read for ourselves once, then rejoin them.
                Err(RecvError::Lagged(_)) => match changed_since(&w.db, &w.tenant, w.since - OVERLAP).await {
                    Ok((rows, at)) => w.take(&rows, at),
                    Err(e) => {
                        tracing::warn!(error = %e, "run activity read failed; retrying on the next read")
                    }
                },
                // The process is stopping (or the tenant's wake-ups ended with it).
                Err(RecvError::Closed) => return None,
            }
        }
    }))
}

impl Watching {
    /// Queues what in `rows` (read at `now`) is new to this stream.
    fn take(&mut self, rows: &[RunInfo], now: DateTime<Utc>) {
        for run in rows {
            let kind = match self.known.get(&run.run_id) {
                None => ActivityKind::Created,
                Some((state, _)) if *state != run.state => ActivityKind::StateChanged,
                Some(_) => continue,
            };
            self.known.insert(run.run_id.clone(), (run.state, run.updated_at));
            self.queue.push_back(RunActivity { kind, run: run.clone() });
        }
        // Finished runs cannot change again; forget them once out of the overlap.
        let horizon = now - OVERLAP * 2;
        self.known.retain(|_, (s, at)| !(s.is_some_and(|s| s.is_terminal()) && *at < horizon));
        self.since = self.since.max(now);
    }
}
