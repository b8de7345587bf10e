//! Run activity for list pages: runs as they are created and change lifecycle state.
//!
//! Every committed write already bumps the tenant's wake-up in the [`Hub`](super::Hub)
//! (locally and through the listener from other processes). On a wake-up, at most
//! every 100 ms (`MIN_GAP`), the stream reads the tenant's run rows changed since its last
//! read, with an overlap for transactions that stamped `updated_at` before committing,
//! and reports runs that are new or whose state moved. The rows are the truth, so a
//! lost wake-up costs at most one safety-poll interval.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::Stream;
use serde::Serialize;

use std::sync::Arc;

use agent_stream_core::domain::RunState;
use agent_stream_store::auth::Principal;
use agent_stream_store::runs::{changed_since, open_runs, RunInfo};
use agent_stream_store::Result;

use crate::Live;

/// Least time between two reads of one stream.
const MIN_GAP: Duration = Duration::from_millis(100);
/// How far before its last read a stream looks again (commit lag of `updated_at`).
const OVERLAP: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// What happened to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[serde(rename_all = "snake_case")]
pub enum ActivityKind {
    /// The run was created after the stream started.
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
    live: Arc<Live>,
    who: Principal,
    wake: tokio::sync::watch::Receiver<u64>,
    since: DateTime<Utc>,
    /// State last reported per run (runs that can still change or changed recently).
    known: HashMap<String, (Option<RunState>, DateTime<Utc>)>,
    queue: VecDeque<RunActivity>,
    last_read: tokio::time::Instant,
}

/// The tenant's run activity from now on.
pub async fn stream(live: Arc<Live>, who: Principal) -> Result<impl Stream<Item = RunActivity>> {
    let wake = live.hub.tenant_watch(&who.tenant_id);
    let (open, now) = open_runs(&live.db, &who.tenant_id, 2.0 * OVERLAP.as_seconds_f64()).await?;
    let known = open.into_iter().map(|r| (r.run_id, (r.state, r.updated_at))).collect();
    let w = Watching {
        live,
        who,
        wake,
        since: now,
        known,
        queue: VecDeque::new(),
        last_read: tokio::time::Instant::now(),
    };
    Ok(futures::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(a) = w.queue.pop_front() {
                return Some((a, w));
            }
            // A wake-up, or the safety interval in case one was lost.
            let woke = tokio::time::timeout(super::SAFETY_POLL, w.wake.changed()).await;
            if matches!(woke, Ok(Err(_))) {
                return None;
            }
            tokio::time::sleep_until(w.last_read + MIN_GAP).await;
            w.last_read = tokio::time::Instant::now();
            w.wake.borrow_and_update();
            if let Err(e) = w.read().await {
                tracing::warn!(error = %e, "run activity read failed; retrying on the next wake-up");
            }
        }
    }))
}

impl Watching {
    async fn read(&mut self) -> Result<()> {
        let (rows, now) = changed_since(&self.live.db, &self.who.tenant_id, self.since - OVERLAP).await?;
        for run in rows {
            let kind = match self.known.get(&run.run_id) {
                None => ActivityKind::Created,
                Some((state, _)) if *state != run.state => ActivityKind::StateChanged,
                Some(_) => continue,
            };
            self.known.insert(run.run_id.clone(), (run.state, run.updated_at));
            self.queue.push_back(RunActivity { kind, run });
        }
        // Finished runs cannot change again; forget them once out of the overlap.
        let horizon = now - OVERLAP * 2;
        self.known.retain(|_, (s, at)| !(s.is_some_and(|s| s.is_terminal()) && *at < horizon));
        self.since = now;
        Ok(())
    }
}
