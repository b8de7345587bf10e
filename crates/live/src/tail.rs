//! A subscriber's cursor over one run: catch-up then live through the one read path.
//! Every live transport (SSE now, GraphQL subscriptions next) pulls batches from a
//! [`Tail`], so they cannot disagree about what comes after a cursor.

use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};

use std::sync::Arc;

use agent_stream_core::dialect::RunCtx;
use agent_stream_core::domain::Event;
use agent_stream_core::projection::RunView;
use agent_stream_store::auth::Principal;
use agent_stream_store::events::Filter;

use super::alarm::Alarm;
use super::feed::{fold_page, Registration, Want};
use super::{Batch, Live, Page};

/// Events one catch-up read returns at most.
const PAGE: i64 = 500;

/// Where a subscriber is in a run's log.
pub struct Tail {
    live: Arc<Live>,
    who: Principal,
    run_id: String,
    cursor: i64,
    pages: broadcast::Receiver<Page>,
    /// Reading on our own (after joining, after a gap, after lagging) until caught up.
    catching_up: bool,
    /// The run's last seq as of the latest read (the hub's watch only moves on a
    /// wake-up, so a reader of history learns the head from its reads).
    known_last: i64,
    /// The newest seq known to be committed.
    newest: tokio::sync::watch::Receiver<i64>,
    /// When the caller's key was last confirmed valid.
    key_checked: tokio::time::Instant,
    /// Fires every [`KEY_RECHECK`] while waiting. One timer for the tail's life: a
    /// timeout per wait would register and cancel a timer per subscriber per wake-up;
    /// an [`Alarm`], so a wait for the next page does not poll it again.
    tick: Alarm,
    stopping: tokio::sync::watch::Receiver<bool>,
    done: bool,
    /// What this subscriber needs rendered from the run's fold, and its entry in the
    /// feed's count of that.
    want: Option<Want>,
    registration: Registration,
    /// The run, for rendering on our own.
    ctx: RunCtx,
    /// The view at the cursor, while we render on our own (joining, after a gap or a
    /// lag); dropped once the feed's pages carry our rendering.
    private: Option<RunView>,
    /// The span current when the tail was made (its request's): what it logs goes
    /// there, since its stream is polled outside the span (`src/http/traced.rs`).
    span: tracing::Span,
}

/// How often an open stream re-checks its key (revocation stops it within this plus
/// the key cache's 2 s).
pub const KEY_RECHECK: Duration = Duration::from_secs(2);

impl Drop for Tail {
    fn drop(&mut self) {
        self.live.metrics.subscribers.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Tail {
    /// Starts after `cursor`. Joins the run's shared feed before the first read, so a
    /// page read after this point reaches us and the catch-up covers everything before.
    pub fn new(live: Arc<Live>, who: Principal, run_id: String, cursor: i64) -> Tail {
        let ctx = RunCtx { run_id: run_id.clone(), root_run_id: run_id };
        Tail::rendering(live, who, ctx, cursor, None, None)
    }

    /// A tail whose batches always carry `want`'s rendering (see [`Batch::rendered`],
    /// [`Batch::updates`]): the feed's, shared with every subscriber that wants the same,
    /// or, for what the tail reads on its own, its own from the view at its cursor
    /// (`view` if given, which must be the run's view at `cursor`; else the view cache's).
    pub fn rendering(
        live: Arc<Live>,
        who: Principal,
        ctx: RunCtx,
        cursor: i64,
        want: Option<Want>,
        view: Option<RunView>,
    ) -> Tail {
        let run_id = ctx.run_id.clone();
        let stopping = live.stopping();
        let (pages, registration) = live.join(&who.tenant_id, &run_id, cursor, want, stopping.clone());
        let newest = live.hub.subscribe(&who.tenant_id, &run_id);
        live.metrics.subscribers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key_checked = tokio::time::Instant::now();
        let tick = Alarm::at(key_checked + KEY_RECHECK);
        Tail {
            live,
            who,
            run_id,
            cursor,
            pages,
            catching_up: true,
            known_last: cursor,
            newest,
            key_checked,
            tick,
            stopping,
            done: false,
            want,
            registration,
            ctx,
            private: view.filter(|v| v.seq == cursor),
            span: tracing::Span::current(),
        }
    }

    /// How many committed events the subscriber has not been handed yet, live or
    /// reading history (whether that makes it slow is the shedder's call: a reader
    /// catching up closes the distance).
    pub fn behind(&self) -> i64 {
        self.behind_seq(self.cursor)
    }

    /// How far the newest committed event known here is past `seq` (0 at or after it).
    pub fn behind_seq(&self, seq: i64) -> i64 {
        ((*self.newest.borrow()).max(self.known_last) - seq).max(0)
    }

    /// Counts deltas a transport dropped for this subscriber (a metric).
    pub fn note_dropped(&self, n: u64) {
        self.live.metrics.dropped_deltas.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The seq of the last event handed out.
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// The next events after the cursor, in seq order, ending with the run's terminal
    /// event if it comes. `None` once that was handed out, or on a read error (the
    /// client resumes from its cursor and loses nothing).
    pub async fn next_batch(&mut self) -> Option<Batch> {
        if self.done {
            return None;
        }
        let batch = self.next_raw().await?;
        let before = self.cursor;
        let evs = batch.events();
        let start = evs.iter().position(|e| e.seq > self.cursor).unwrap_or(evs.len());
        let end = match evs[start..].iter().position(Event::is_run_end) {
            Some(i) => {
                self.done = true;
                start + i + 1
            }
            None => evs.len(),
        };
        let batch = batch.slice(start..end);
        let batch = match self.want {
            Some(want) if !batch.events().is_empty() => self.render(batch, before, want).await?,
            _ => batch,
        };
        if let Some(last) = batch.events().last() {
            self.cursor = last.seq;
        }
        Some(batch)
    }

    /// `batch` (the events right after `before`) with `want`'s rendering: as it is when
    /// the feed rendered it, else rendered here from the view at `before`. `None` when
    /// that view cannot be read (the client resumes from its cursor).
    async fn render(&mut self, batch: Batch, before: i64, want: Want) -> Option<Batch> {
        if batch.has(want) {
            // The feed renders for us: our copy of the view would only go stale.
            self.private = None;
            return Some(batch);
        }
        let mut view = match self.private.take() {
            Some(v) if v.seq == before => v,
            _ => {
                let read = super::views::view_at(
                    &self.live.db,
                    &self.live.views,
                    &self.who.tenant_id,
                    &self.run_id,
                    before,
                )
                .await;
                match read {
                    Ok((_, v)) if v.seq == before => v,
                    Ok(_) => return None,
                    Err(e) => {
                        tracing::warn!(parent: &self.span, error = %e, run = %self.run_id, "reading the view to render from failed; closing");
                        return None;
                    }
                }
            }
        };
        let page =
            fold_page(&mut view, &self.ctx, batch.events().to_vec(), &[want], self.live.feeds.fold_counter());
        self.private = Some(view);
        Some(Batch::whole(Arc::new(page)))
    }

    /// False once the caller's key was revoked (checked every [`KEY_RECHECK`]).
    async fn key_valid(&mut self) -> bool {
        if self.key_checked.elapsed() < KEY_RECHECK {
            return true;
        }
        match self.live.auth.still_valid(&self.live.db, &self.who).await {
            Ok(valid) => {
                self.key_checked = tokio::time::Instant::now();
                if !valid {
                    tracing::info!(parent: &self.span, run = %self.run_id, key_id = %self.who.key_id, "key revoked; closing its stream");
                }
                valid
            }
            // The database is away: keep the stream; the next check decides.
            Err(_) => true,
        }
    }

    async fn next_raw(&mut self) -> Option<Batch> {
        loop {
            if *self.stopping.borrow_and_update() {
                // The process is shutting down: end cleanly; the client resumes from
                // its cursor on another instance (or this one, restarted).
                self.done = true;
                return None;
            }
            if !self.key_valid().await {
                self.done = true;
                return None;
            }
            if self.catching_up {
                let all = Filter::default();
                let read = agent_stream_store::events::page(
                    &self.live.db,
                    &self.who.tenant_id,
                    &self.run_id,
                    self.cursor,
                    PAGE,
                    &all,
                );
                // Counted once it is made, not when it starts: a count that has
                // reached every joiner's read then says none of them can still see an
                // append that comes after (the fold test waits on it).
                let read = read.await;
                self.live.feeds.count_own_read();
                match read {
                    Ok((run, evs)) => {
                        // Caught up once the read reaches the run's last seq as it was
                        // when the read began: whatever commits later comes as a feed
                        // page, since the feed was joined before the first read. No
                        // confirming empty read, which cost every joining subscriber a
                        // second SELECT.
                        self.known_last = self.known_last.max(run.last_seq);
                        if evs.last().is_none_or(|e| e.seq >= run.last_seq) {
                            self.catching_up = false;
                        }
                        if !evs.is_empty() {
                            return Some(Batch::from(evs));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(parent: &self.span, error = %e, run = %self.run_id, "live read failed; closing");
                        return None;
                    }
                }
            }
            // No branch for the stop signal: on shutdown the feed closes its channel
            // (see `Feeds::join`), which ends this wait.
            let waited = tokio::select! {
                // Pages first, and no random pick per wait (the key is checked at the
                // top of the loop by time, whichever branch woke us).
                biased;
                r = self.pages.recv() => Some(r),
                _ = self.tick.fired() => None,
            };
            match waited {
                Some(Ok(page)) => {
                    let evs = page.events();
                    if let Some(last) = evs.last() {
                        self.known_last = self.known_last.max(last.seq);
                    }
                    match evs.first() {
                        // A page that starts beyond our cursor: we joined between two reads.
                        Some(first) if first.seq > self.cursor + 1 => self.catching_up = true,
                        _ if evs.last().is_some_and(|e| e.seq > self.cursor) => {
                            return Some(Batch::whole(page))
                        }
                        _ => {}
                    }
                }
                // Fell behind the feed's buffer: read on our own, then rejoin the flow.
                Some(Err(RecvError::Lagged(_))) => self.catching_up = true,
                // Closed because the process is stopping: the top of the loop ends us.
                Some(Err(RecvError::Closed)) if *self.stopping.borrow() => {}
                Some(Err(RecvError::Closed)) => {
                    let (pages, registration) = self.live.join(
                        &self.who.tenant_id,
                        &self.run_id,
                        self.cursor,
                        self.want,
                        self.stopping.clone(),
                    );
                    self.pages = pages;
                    self.registration = registration;
                    self.catching_up = true;
                }
                // The tick: the key is checked at the top of the loop. A lost wake-up
                // is not this tail's to cover: the run's feed polls for it once for all
                // its subscribers (a re-read per tail made idle reads grow with them).
                None => {
                    let next = tokio::time::Instant::now() + KEY_RECHECK;
                    self.tick.reset(next);
                }
            }
        }
    }
}
