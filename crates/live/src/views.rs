//! Reading views cheaply: a per-process cache of folded views, brought up to date by
//! folding only the events after the cached seq.
//!
//! Why a cache and not projection tables: the reducer stays the single definition of
//! every view (no SQL or second Rust copy to keep in step), a finished run is folded
//! once per process and then served from memory, and a live run costs one tail read of
//! the events since the last request. A cache miss folds the log once, streaming rows
//! (memory grows with the view, not the log). Entries are shared `Arc`s; a tail fold
//! copies a view only while a reader still holds the previous version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;

use agent_stream_core::dialect::{Encoding, Format, Out};
use agent_stream_core::projection::RunView;
use agent_stream_store::db::{tenant_tx, Db};
use agent_stream_store::events::{stream_after, ALL_EVENTS};
use agent_stream_store::run_key::{get_or_insert_with, RunMap, RunRef};
use agent_stream_store::runs::{get_run, RunInfo};
use agent_stream_store::Result;

type Slot = Arc<tokio::sync::Mutex<Option<Arc<RunView>>>>;

/// Most views kept; idle ones beyond it are dropped and refolded on demand.
const VIEW_CACHE_MAX: usize = 1024;

/// Openings kept (see [`ViewCache::opening`]); a resync opening can be a few MB.
const OPENINGS_MAX: usize = 16;

/// Where a stream's opening is the same for every stream: run, format and seq.
type OpeningKey = (String, String, Format, i64);

/// Folded views by (tenant, run).
#[derive(Default)]
pub struct ViewCache {
    slots: Mutex<RunMap<Slot>>,
    openings: Mutex<HashMap<OpeningKey, Vec<Out>>>,
    folded: std::sync::atomic::AtomicU64,
}

impl ViewCache {
    /// Events folded so far by this cache (a metric; a cached read adds nothing).
    pub fn folded_events(&self) -> u64 {
        self.folded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `enc` opening with the shared rendering of its opening (tenant `tenant`): made
    /// by the first stream of the run to start at this seq in this format, cloned by
    /// the rest.
    pub fn opening(&self, tenant: &str, run_id: &str, enc: Encoding) -> Encoding {
        let key = (tenant.to_owned(), run_id.to_owned(), enc.format(), enc.view_seq());
        if let Some(items) = self.openings.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return enc.with_opening(items.clone());
        }
        // Rendered outside the lock; two first streams may both render it, once each.
        let items = enc.shared_open();
        let mut openings = self.openings.lock().unwrap_or_else(|p| p.into_inner());
        if openings.len() >= OPENINGS_MAX {
            openings.clear();
        }
        openings.insert(key, items.clone());
        enc.with_opening(items)
    }

    /// Runs `fold` on `view`, a live feed's fold of the run, and offers the result to
    /// the cache: the feed's view and the cached one are then the same `Arc`, so the
    /// cache costs no second fold and no copy. The cached entry is set aside while the
    /// feed folds (so the fold does not copy the view just because the cache holds it),
    /// and replaced when it is not ahead. Never waits: if a reader holds the entry, the
    /// feed folds anyway and offers nothing this time.
    pub(crate) fn fold_shared(
        &self,
        tenant: &str,
        run_id: &str,
        view: &mut Arc<RunView>,
        fold: impl FnOnce(&mut RunView),
    ) {
        let slot = self.slot(tenant, run_id);
        let mut cached = slot.try_lock().ok();
        if let Some(c) = cached.as_mut() {
            if c.as_ref().is_some_and(|v| Arc::ptr_eq(v, view)) {
                **c = None;
            }
        }
        fold(Arc::make_mut(view));
        if let Some(c) = cached.as_mut() {
            if c.as_ref().is_none_or(|v| v.seq <= view.seq) {
                **c = Some(view.clone());
            }
        }
    }

    fn slot(&self, tenant: &str, run_id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= VIEW_CACHE_MAX {
            slots.retain(|_, s| Arc::strong_count(s) > 1);
            if slots.len() >= VIEW_CACHE_MAX {
                slots.clear();
            }
        }
        get_or_insert_with(&mut slots, RunRef(tenant, run_id), Slot::default).clone()
    }
}

/// Folds the events of `run` after `view.seq` up to `upto` into `view`, on a connection
/// of its own; counts them in the cache's metric.
async fn fold_tail(
    db: &Db,
    cache: &ViewCache,
    tenant: &str,
    run: &RunInfo,
    view: &mut RunView,
    upto: i64,
) -> Result<()> {
    if view.seq >= upto {
        return Ok(());
    }
    let mut client = db.pool.get().await?;
    let tx = tenant_tx(&mut client, tenant).await?;
    {
        let events = stream_after(&tx, tenant, &run.run_id, view.seq, upto, &ALL_EVENTS).await?;
        futures::pin_mut!(events);
        let mut n = 0;
        while let Some(e) = events.try_next().await? {
            view.apply(&e);
            n += 1;
        }
        cache.folded.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    tx.commit().await?;
    Ok(())
}

// Both readers below take the run's row first, on a connection they give back, and only
// then wait for the run's slot: a reader waiting for the slot holds no connection, so a
// crowd joining one run cannot take the whole pool while the fold it waits for needs a
// connection (100 GraphQL subscribers joining a 100,000-event run did exactly that).

/// The run's row and its views, folded at least up to the row's `last_seq`.
pub async fn load_view(
    db: &Db,
    cache: &ViewCache,
    tenant: &str,
    run_id: &str,
) -> Result<(RunInfo, Arc<RunView>)> {
    let run = get_run(db, tenant, run_id).await?;
    let slot = cache.slot(tenant, &run.run_id);
    let mut cached = slot.lock().await;
    let mut view = cached.take().unwrap_or_default();
    if view.seq < run.last_seq {
        // On an error the slot stays empty: no half-folded view is left behind.
        fold_tail(db, cache, tenant, &run, Arc::make_mut(&mut view), run.last_seq).await?;
    }
    *cached = Some(view.clone());
    Ok((run, view))
}

/// The run's views at exactly `upto` (a seq it has reached): the cached view plus the
/// events after it when the cache is at or before `upto` (a client joining at the
/// head), else a fold from the log's start. A fold that reaches further than the cache
/// becomes the cache.
pub async fn view_at(
    db: &Db,
    cache: &ViewCache,
    tenant: &str,
    run_id: &str,
    upto: i64,
) -> Result<(RunInfo, RunView)> {
    let run = get_run(db, tenant, run_id).await?;
    let upto = upto.min(run.last_seq);
    let slot = cache.slot(tenant, &run.run_id);
    let mut cached = slot.lock().await;
    let mut view = match cached.as_ref() {
        Some(v) if v.seq <= upto => RunView::clone(v),
        _ => RunView::new(),
    };
    fold_tail(db, cache, tenant, &run, &mut view, upto).await?;
    if cached.as_ref().is_none_or(|c| c.seq < view.seq) {
        *cached = Some(Arc::new(view.clone()));
    }
    Ok((run, view))
}
