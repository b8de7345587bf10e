//! Shared reads: one task per watched run reads each wake-up's new rows once and hands
//! the page to every subscriber (Hasura-style multiplexing), so database load follows
//! the number of appends, not the number of subscribers.
//!
//! A subscriber joins the feed first, catches up on its own through the read path, and
//! then takes pages from the feed, keeping only events after its own cursor. When a
//! page starts beyond its cursor (it joined between two reads) or it fell behind the
//! feed's buffer, it reads the gap itself: the cursor, not the feed, decides what is
//! next, so nothing is skipped or repeated.
//!
//! **One fold per run.** When some subscriber needs more than the events (a dialect that
//! reads the view, or `runView`'s updates), the feed folds each event once with the
//! shared reducer and renders it, right after the fold, once for each such [`Want`] in
//! use: a page carries the events and those renderings, and a subscriber only picks its
//! own. The fold is the run's view in the [`ViewCache`], kept at the feed's cursor. A
//! subscriber that reads on its own (joining, a gap, lagging) renders those events from
//! the view at its cursor ([`fold_page`] on its private copy), then drops the copy as soon
//! as the feed's pages carry its rendering again.
//!
//! **This process's own commits are not read back.** The row writer hands each commit
//! of a followed run to its feed
//! ([`CommitSink`](agent_stream_store::append::CommitSink)), as the events will read
//! from the table; a feed takes those that continue its cursor and reads only for what
//! they do not cover: another process's appends (learned from the listener or the
//! safety poll), a handover that did not fit its queue, a forced re-read. Before, every
//! commit cost its runs' feeds a SELECT of rows this process had in hand a moment
//! earlier.

use std::any::Any;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{broadcast, mpsc};

use super::reads::Reads;
use super::{Hub, ViewCache};
use agent_stream_core::dialect::{render, Format, Out, RunCtx, Step, Wire};
use agent_stream_core::domain::Event;
use agent_stream_core::projection::{updates, RunView, ViewUpdate};
use agent_stream_store::run_key::{RunMap, RunRef};
use agent_stream_store::Db;

/// A page of consecutive events, shared by all subscribers of a run.
pub type Page = Arc<PageData>;

/// The events of one read, and each event's native JSON once some subscriber needed it:
/// a page fans out to every subscriber, so rendering it once per page rather than once
/// per subscriber takes the encoding out of the per-subscriber cost. With the run's fold
/// in use, it also carries each event rendered for every [`Want`] its subscribers had.
pub struct PageData {
    events: Vec<Event>,
    /// Each event's commit time in microseconds since the epoch, for every
    /// subscriber's delivery metric (converted once per page, not per subscriber).
    ts_micros: Vec<i64>,
    wire: Vec<OnceLock<Wire>>,
    /// Per dialect in use: each event's items, rendered from the fold after it.
    dialects: Vec<(Format, PerEvent<Out>)>,
    /// `runView`'s updates of each event, if a subscriber wanted them.
    updates: Option<PerEvent<ViewUpdate>>,
    /// Per dialect, the whole page as transport chunks (SSE frames of `detail=full`
    /// streams), built by the first subscriber that sends it and shared by the rest.
    frames: [OnceLock<Arc<[bytes::Bytes]>>; Format::ALL.len()],
    /// What transports derived from the whole page, by key (see [`Batch::memo`]).
    memos: Mutex<Vec<(Arc<str>, Memo)>>,
}

/// One of a page's memos, of whatever type its transport made.
type Memo = Arc<dyn Any + Send + Sync>;

/// Keys one page memoizes at most: each is a distinct rendering that subscribers share,
/// so a page's memory stays bounded however many distinct ones its subscribers ask for.
const PAGE_MEMOS: usize = 8;

impl PageData {
    /// A page of `events` (consecutive, in seq order).
    pub fn new(events: Vec<Event>) -> Page {
        Arc::new(PageData::plain(events))
    }

    /// A page as a feed makes it: `events` folded into `view` (which stands right
    /// before them) and rendered for `wants` (tests and tools; a feed counts its folds).
    pub fn folded(view: &mut RunView, run: &RunCtx, events: Vec<Event>, wants: &[Want]) -> Page {
        Arc::new(fold_page(view, run, events, wants, &AtomicU64::new(0)))
    }

    fn plain(events: Vec<Event>) -> PageData {
        let wire = events.iter().map(|_| OnceLock::new()).collect();
        let ts_micros = events.iter().map(|e| e.ts.timestamp_micros()).collect();
        PageData {
            events,
            ts_micros,
            wire,
            dialects: vec![],
            updates: None,
            frames: Default::default(),
            memos: Mutex::new(vec![]),
        }
    }

    /// The page's events.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    fn has(&self, want: Want) -> bool {
        match want {
            Want::Dialect(f) => self.dialects.iter().any(|d| d.0 == f),
            Want::Updates => self.updates.is_some(),
        }
    }
}

/// What a subscriber needs rendered from the run's fold besides the events themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Want {
    /// A dialect whose encoder reads the view (every one but native).
    Dialect(Format),
    /// `runView`'s updates.
    Updates,
}

impl Want {
    /// What a stream in `format` wants (nothing for native, which needs no fold).
    pub fn of(format: Format) -> Option<Want> {
        agent_stream_core::dialect::needs_view(format).then_some(Want::Dialect(format))
    }

    fn index(self) -> usize {
        match self {
            Want::Dialect(f) => Format::ALL.iter().position(|g| *g == f).unwrap_or(0),
            Want::Updates => Format::ALL.len(),
        }
    }

    fn from_index(i: usize) -> Want {
        Format::ALL.get(i).map_or(Want::Updates, |f| Want::Dialect(*f))
    }
}

/// Items of consecutive events, in one vector: event `i`'s are `items[ends[i-1]..ends[i]]`.
pub struct PerEvent<T> {
    items: Vec<T>,
    ends: Vec<usize>,
}

impl<T> PerEvent<T> {
    fn new() -> Self {
        PerEvent { items: vec![], ends: vec![] }
    }

    /// The items of the page's event `i`.
    pub fn of(&self, i: usize) -> &[T] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.items[start..self.ends[i]]
    }
}

/// How many subscribers of a feed want each rendering (indexed by [`Want::index`]).
#[derive(Default)]
pub(crate) struct Wants([AtomicUsize; Format::ALL.len() + 1]);

impl Wants {
    fn in_use(&self) -> Vec<Want> {
        (0..self.0.len()).filter(|i| self.0[*i].load(Ordering::Acquire) > 0).map(Want::from_index).collect()
    }
}

/// A subscriber's entry in its feed's [`Wants`], withdrawn when dropped.
pub(crate) struct Registration(Option<(Arc<Wants>, usize)>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some((w, i)) = &self.0 {
            w.0[*i].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Folds `events` into `view` (which stands right before them) with the one reducer and
/// renders each, from the view right after it, for every want in `wants`: the only place
/// live delivery applies the reducer. Counts the events in `folds`.
pub(crate) fn fold_page(
    view: &mut RunView,
    run: &RunCtx,
    events: Vec<Event>,
    wants: &[Want],
    folds: &AtomicU64,
) -> PageData {
    let mut page = PageData::plain(events);
    let mut dialects: Vec<(Format, PerEvent<Out>)> = wants
        .iter()
        .filter_map(|w| match w {
            Want::Dialect(f) => Some((*f, PerEvent::new())),
            Want::Updates => None,
        })
        .collect();
    let mut ups = wants.contains(&Want::Updates).then(PerEvent::new);
    let mut one = vec![];
    for e in &page.events {
        let change = view.apply(e);
        let step = Step { event: e, view, change, run, wire: None };
        for (f, items) in &mut dialects {
            render(*f, &step, &mut one);
            // Shared renderings: serialised once here, framed once by the first stream
            // that sends them, cloned by reference by every subscriber of the format.
            items.items.extend(one.drain(..).map(Out::into_shared));
            items.ends.push(items.items.len());
        }
        if let Some(u) = &mut ups {
            u.items.extend(updates(view, e.seq, change));
            u.ends.push(u.items.len());
        }
    }
    folds.fetch_add(page.events.len() as u64, Ordering::Relaxed);
    page.dialects = dialects;
    page.updates = ups;
    page
}

/// Consecutive events handed to one consumer: a slice of a page that other subscribers
/// may share.
#[derive(Clone)]
pub struct Batch {
    page: Page,
    range: Range<usize>,
}

impl Batch {
    /// The whole of `page`.
    pub fn whole(page: Page) -> Batch {
        let range = 0..page.events.len();
        Batch { page, range }
    }

    /// Narrows the batch to `range` (indices into [`Batch::events`]).
    pub fn slice(self, range: Range<usize>) -> Batch {
        let start = self.range.start + range.start;
        let end = (self.range.start + range.end).min(self.range.end);
        Batch { page: self.page, range: start.min(end)..end }
    }

    /// The events, in seq order.
    pub fn events(&self) -> &[Event] {
        &self.page.events[self.range.clone()]
    }

    /// Each event's commit time in microseconds since the epoch, in the order of
    /// [`Batch::events`].
    pub fn ts_micros(&self) -> &[i64] {
        &self.page.ts_micros[self.range.clone()]
    }

    /// Each event with its shared native rendering (see `agent_stream_core::dialect::Encoding::push_into`).
    pub fn iter(&self) -> impl Iterator<Item = (&Event, &OnceLock<Wire>)> {
        self.events().iter().zip(&self.page.wire[self.range.clone()])
    }

    /// Each event's items in `format`, as the run's fold rendered them, if the page
    /// carries that rendering (a [`super::Tail`] that wants it always hands out such
    /// batches).
    pub fn rendered(&self, format: Format) -> Option<impl Iterator<Item = &[Out]> + '_> {
        let (_, r) = self.page.dialects.iter().find(|d| d.0 == format)?;
        Some(self.range.clone().map(move |i| r.of(i)))
    }

    /// Each event's `runView` updates, if the page carries them.
    pub fn updates(&self) -> Option<impl Iterator<Item = &[ViewUpdate]> + '_> {
        let r = self.page.updates.as_ref()?;
        Some(self.range.clone().map(move |i| r.of(i)))
    }

    /// True when the batch is its whole page.
    pub fn is_whole(&self) -> bool {
        self.range.start == 0 && self.range.end == self.page.events.len()
    }

    /// The whole page in `format` as transport chunks: `make` runs for the first
    /// subscriber that asks, the others share its bytes. `None` unless the batch is its
    /// whole page.
    pub fn shared_frames(
        &self,
        format: Format,
        make: impl FnOnce() -> Vec<bytes::Bytes>,
    ) -> Option<Arc<[bytes::Bytes]>> {
        if !self.is_whole() {
            return None;
        }
        let i = Format::ALL.iter().position(|f| *f == format)?;
        Some(self.page.frames[i].get_or_init(|| make().into()).clone())
    }

    /// Where the batch's first event stands in its page (an index into what
    /// [`Batch::memo`] makes).
    pub fn offset(&self) -> usize {
        self.range.start
    }

    /// What `make` builds for the whole page (it gets the page's length) under `key`:
    /// built by the first subscriber that asks, shared with every other that asks with
    /// the same key. `None` when the page already holds [`PAGE_MEMOS`] other keys, or
    /// `key` holds another type: the caller then builds its own.
    pub fn memo<T: Any + Send + Sync>(
        &self,
        key: &Arc<str>,
        make: impl FnOnce(usize) -> T,
    ) -> Option<Arc<T>> {
        let mut memos = self.page.memos.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, m)) = memos.iter().find(|(k, _)| k == key) {
            return m.clone().downcast().ok();
        }
        if memos.len() >= PAGE_MEMOS {
            return None;
        }
        let m = Arc::new(make(self.page.events.len()));
        memos.push((key.clone(), m.clone()));
        Some(m)
    }

    /// True when the batch carries what `want` needs.
    pub fn has(&self, want: Want) -> bool {
        self.page.has(want)
    }
}

impl From<Vec<Event>> for Batch {
    fn from(events: Vec<Event>) -> Batch {
        Batch::whole(PageData::new(events))
    }
}

/// Events one feed read returns at most.
const FEED_PAGE: i64 = 1000;
/// Payload bytes one page holds at most (a page holds at least one event, so an event
/// larger than this is a page of its own). A subscriber that stops taking events keeps
/// the page in hand alive, and the channel keeps [`FEED_BUFFER`] pages: with 1,000
/// events of 2 KB to a page, 20 stuck GraphQL WebSockets and the channel held some
/// 130 MB; bounded in bytes, they hold a few MB.
const FEED_PAGE_BYTES: usize = 256 << 10;
/// Pages a slow subscriber may lag before it reads for itself. The channel keeps the
/// last this many pages whatever the subscribers do, so it bounds the feed's memory
/// (to about this times [`FEED_PAGE_BYTES`] of payload).
const FEED_BUFFER: usize = 32;
/// Commits handed to a feed that it has not taken yet. A feed busy elsewhere (folding,
/// a read) lets more queue up; past this, commits are dropped from the queue and the
/// feed reads them instead.
const HANDED_MAX: usize = 64;

/// Splits one read into pages of at most [`FEED_PAGE_BYTES`] of payload (at least one
/// event each), in order.
fn pages(evs: Vec<Event>) -> Vec<Vec<Event>> {
    // A lone event is a page whatever its size, and measuring it means writing its
    // payload once more (~800 instructions): the common case of a live run.
    if evs.len() <= 1 {
        return if evs.is_empty() { vec![] } else { vec![evs] };
    }
    let mut out = vec![];
    let (mut page, mut bytes) = (Vec::new(), 0);
    for e in evs {
        let n = e.body.payload_len();
        if !page.is_empty() && bytes + n > FEED_PAGE_BYTES {
            out.push(std::mem::take(&mut page));
            bytes = 0;
        }
        bytes += n;
        page.push(e);
    }
    if !page.is_empty() {
        out.push(page);
    }
    out
}

/// One run's feed: its channel, what its subscribers want rendered, and the queue of
/// this process's commits of the run.
struct Feed {
    tx: broadcast::Sender<Page>,
    wants: Arc<Wants>,
    handed: mpsc::Sender<Vec<Event>>,
}

/// Per-run feeds, their combined reads, and the read and fold counters.
#[derive(Default)]
pub struct Feeds {
    feeds: Mutex<RunMap<Feed>>,
    /// Started by the first feed (it needs the store, which `join` brings).
    combined: OnceLock<Reads>,
    reads: Arc<AtomicU64>,
    /// The part of `reads` subscribers made on their own.
    own_reads: AtomicU64,
    folds: AtomicU64,
    /// Events feeds took from this process's commits instead of reading them.
    taken: AtomicU64,
}

impl Feeds {
    /// True when a feed here has subscribers of the run (see
    /// [`agent_stream_store::append::CommitSink::follows`]).
    pub(crate) fn follows(&self, tenant: &str, run_id: &str) -> bool {
        let feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        feeds.get(&RunRef(tenant, run_id)).is_some_and(|f| f.tx.receiver_count() > 0)
    }

    /// Hands a commit's events to the run's feed (see
    /// [`agent_stream_store::append::CommitSink::committed`]).
    pub(crate) fn committed(&self, tenant: &str, run_id: &str, events: Vec<Event>) {
        let feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = feeds.get(&RunRef(tenant, run_id)) {
            // Full or closed: the feed reads these rows when the commit's wake-up comes.
            let _ = f.handed.try_send(events);
        }
    }
}

impl Feeds {
    /// SELECTs of events made so far for live delivery (feeds plus subscribers' own
    /// catch-up reads): the metric that must not grow with the number of subscribers.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    pub(crate) fn count_read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Of [`Feeds::reads`], the SELECTs subscribers made on their own (joining, a gap,
    /// lagging): a count that has reached every joiner's read says none of them can
    /// still read an append that comes later (a feed's reads are not in it, so it is
    /// exact whenever a feed reads).
    pub fn own_reads(&self) -> u64 {
        self.own_reads.load(Ordering::Relaxed)
    }

    pub(crate) fn count_own_read(&self) {
        self.own_reads.fetch_add(1, Ordering::Relaxed);
        self.count_read();
    }

    /// Events folded by the reducer for live delivery (feeds plus subscribers' own
    /// catch-up): once per event per run, whatever the number of subscribers, plus what
    /// subscribers reading on their own fold.
    pub fn folds(&self) -> u64 {
        self.folds.load(Ordering::Relaxed)
    }

    pub(crate) fn fold_counter(&self) -> &AtomicU64 {
        &self.folds
    }

    /// Events feeds took as this process committed them, without a read.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// Joins the run's feed, starting it if this is its first subscriber. `from` is
    /// where a new feed starts reading (the joiner's cursor; others read their gaps).
    /// The feed ends, closing its channel, when `stopping` turns true: subscribers learn
    /// of a shutdown from their feed, so a wake-up does not make every one of them
    /// register with the process-wide stop signal.
    ///
    /// `want` registers what the subscriber needs rendered (before it subscribes, so
    /// every page rendered after this carries it; a page rendered just before reaches
    /// it unrendered, and it renders that one itself).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn join(
        self: &Arc<Self>,
        db: &Db,
        hub: &Arc<Hub>,
        views: &Arc<ViewCache>,
        tenant: &str,
        run_id: &str,
        from: i64,
        want: Option<Want>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> (broadcast::Receiver<Page>, Registration) {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_owned(), run_id.to_owned());
        let register = |wants: &Arc<Wants>| {
            Registration(want.map(|w| {
                wants.0[w.index()].fetch_add(1, Ordering::AcqRel);
                (wants.clone(), w.index())
            }))
        };
        if let Some(feed) = feeds.get(&key).filter(|f| f.tx.receiver_count() > 0) {
            let registration = register(&feed.wants);
            return (feed.tx.subscribe(), registration);
        }
        let (tx, rx) = broadcast::channel(FEED_BUFFER);
        let wants = Arc::new(Wants::default());
        let registration = register(&wants);
        let (handed, own) = mpsc::channel(HANDED_MAX);
        feeds.insert(key.clone(), Feed { tx: tx.clone(), wants: wants.clone(), handed });
        let wake = Wake { newest: hub.subscribe(tenant, run_id), rereads: hub.rereads(), own };
        let fold = Folding { views: views.clone(), wants, state: None };
        let reads =
            self.combined.get_or_init(|| Reads::start(db.clone(), FEED_PAGE, self.reads.clone())).clone();
        let feed = Running { feeds: self.clone(), reads, db: db.clone(), key };
        tokio::spawn(run_feed(feed, from, wake, stopping, tx, fold));
        (rx, registration)
    }
}

/// A feed's fold: the run's view at the feed's cursor once some subscriber wanted a
/// rendering (then kept up to date, and shared with the view cache).
struct Folding {
    views: Arc<ViewCache>,
    wants: Arc<Wants>,
    state: Option<(RunCtx, Arc<RunView>)>,
}

impl Folding {
    /// The pages of one read (`evs`, after `cursor`), folded and rendered if wanted.
    async fn pages(
        &mut self,
        feeds: &Feeds,
        db: &Db,
        key: &(String, String),
        cursor: i64,
        evs: Vec<Event>,
    ) -> Vec<Page> {
        let wants = self.wants.in_use();
        if self.state.is_none() && !wants.is_empty() {
            // The view right before this read: the cached one plus what it lacks. On
            // an error the pages go out unrendered; subscribers render their own.
            match super::views::view_at(db, &self.views, &key.0, &key.1, cursor).await {
                Ok((run, view)) if view.seq == cursor => {
                    let ctx = RunCtx { run_id: run.run_id, root_run_id: run.root_run_id };
                    self.state = Some((ctx, Arc::new(view)));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, run = %key.1, "feed fold could not start"),
            }
        }
        let Some((ctx, view)) = &mut self.state else {
            return pages(evs).into_iter().map(PageData::new).collect();
        };
        pages(evs)
            .into_iter()
            .map(|page| {
                let mut out = None;
                self.views.fold_shared(&key.0, &key.1, view, |v| {
                    out = Some(fold_page(v, ctx, page, &wants, &feeds.folds));
                });
                Arc::new(out.unwrap_or_else(|| PageData::plain(vec![])))
            })
            .collect()
    }
}

/// What a feed task reads with and for.
struct Running {
    feeds: Arc<Feeds>,
    reads: Reads,
    db: Db,
    key: (String, String),
}

/// What wakes a feed: the run's newest committed seq (the hub's), forced re-reads, and
/// this process's commits of the run.
struct Wake {
    newest: tokio::sync::watch::Receiver<i64>,
    rereads: tokio::sync::watch::Receiver<u64>,
    own: mpsc::Receiver<Vec<Event>>,
}

impl Wake {
    /// The handed-over commits queued now, in seq order.
    fn handed(&mut self) -> Vec<Vec<Event>> {
        let mut out = vec![];
        while let Ok(evs) = self.own.try_recv() {
            out.push(evs);
        }
        // One run's commits are handed in order; a sort costs nothing then and keeps
        // the feed right should that ever change.
        out.sort_by_key(|evs| evs.first().map_or(0, |e| e.seq));
        out
    }
}

async fn run_feed(
    feed: Running,
    mut cursor: i64,
    mut wake: Wake,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    tx: broadcast::Sender<Page>,
    mut fold: Folding,
) {
    let Running { feeds, reads, db, key } = feed;
    let (tenant, run_id) = &key;
    // The first pass reads: what committed before the feed began was handed to nobody.
    let mut must_read = true;
    // An `Idle` rather than a `timeout` per wait: a feed waits once per commit of its
    // run, and each `timeout` put an entry into the timer wheel and took it out again
    // (~1,000 instructions a streamed line, docs/benchmarks-log.md, 2026-12-06 06:16).
    let mut quiet = super::alarm::Idle::new(super::SAFETY_POLL * 2);
    loop {
        if tx.receiver_count() == 0 {
            break;
        }
        // This process's commits that continue the cursor go out as they are.
        for evs in wake.handed() {
            let evs: Vec<Event> = evs.into_iter().skip_while(|e| e.seq <= cursor).collect();
            let Some(last) = evs.last().map(|e| e.seq) else { continue };
            if evs[0].seq != cursor + 1 {
                // A gap (another process wrote in between): the read below covers it.
                break;
            }
            feeds.taken.fetch_add(evs.len() as u64, Ordering::Relaxed);
            let before = cursor;
            cursor = last;
            for page in fold.pages(&feeds, &db, &key, before, evs).await {
                let _ = tx.send(page);
            }
        }
        // Read what committed and was not handed over: the hub's newest seq is past the
        // cursor, or a re-read was asked for.
        let mut failed = false;
        if must_read || *wake.newest.borrow_and_update() > cursor {
            loop {
                // Counted by the combiner, once per statement however many runs it carries.
                let page = reads.read(tenant, run_id, cursor).await;
                match page {
                    Ok(evs) if evs.is_empty() => break,
                    Ok(evs) => {
                        let before = cursor;
                        cursor = evs.last().map_or(cursor, |e| e.seq);
                        let full = evs.len() as i64 == FEED_PAGE;
                        for page in fold.pages(&feeds, &db, &key, before, evs).await {
                            let _ = tx.send(page);
                        }
                        if !full {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, run = %run_id, "feed read failed; retrying on the next wake-up");
                        failed = true;
                        break;
                    }
                }
            }
        }
        must_read = failed;
        if *stopping.borrow_and_update() {
            break;
        }
        tokio::select! {
            // No random pick per wait: each branch only sets what the top of the loop reads.
            biased;
            r = wake.newest.changed() => match r {
                Ok(()) => quiet.wrote(),
                Err(_) => break,
            },
            _ = wake.rereads.changed() => must_read = true,
            _ = stopping.changed() => {}
            // Quiet for a while: read once, in case a wake-up was lost.
            _ = quiet.due() => must_read = true,
        }
    }
    let mut all = feeds.feeds.lock().unwrap_or_else(|p| p.into_inner());
    if all.get(&key).is_some_and(|f| f.tx.same_channel(&tx)) {
        all.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::{Batch, PAGE_MEMOS};
    use agent_stream_core::testkit::stored;
    use serde_json::json;

    fn page() -> Batch {
        let delta = |t: &str| json!({"type": "text.delta", "payload": {"text": t}});
        Batch::from(stored(&[
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            delta("a"),
            delta("b"),
        ]))
    }

    /// Reads split into pages of at most the byte bound (an event larger than it alone),
    /// in order, none lost; a lone event is a page whatever its size.
    #[test]
    fn reads_split_into_bounded_pages() {
        let big = "x".repeat(super::FEED_PAGE_BYTES / 3);
        let delta = |t: &str| json!({"type": "text.delta", "payload": {"text": t}});
        let huge = "y".repeat(super::FEED_PAGE_BYTES + 1);
        assert!(super::pages(vec![]).is_empty());
        let one = super::pages(stored(&[delta(&huge)]));
        assert_eq!(one.iter().map(Vec::len).collect::<Vec<_>>(), [1]);
        let evs = stored(&[delta(&big), delta(&big), delta("a"), delta(&big), delta(&huge), delta("b")]);
        let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
        let split = super::pages(evs);
        assert_eq!(split.iter().map(Vec::len).collect::<Vec<_>>(), [3, 1, 1, 1]);
        assert_eq!(split.concat().iter().map(|e| e.seq).collect::<Vec<_>>(), seqs);
        for page in &split {
            let bytes: usize = page.iter().map(|e| e.body.payload_len()).sum();
            assert!(page.len() == 1 || bytes <= super::FEED_PAGE_BYTES, "{bytes}");
        }
    }

    /// A slice's commit times are its own events', in order (each subscriber's delivery
    /// metric reads them instead of converting the events' times).
    #[test]
    fn a_slices_commit_times_are_its_events() {
        let delta = json!({"type": "text.delta", "payload": {"text": "a"}});
        let mut evs = stored(&vec![delta; 4]);
        for (i, e) in evs.iter_mut().enumerate() {
            e.ts = chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + 7 * i as i64).expect("a time");
        }
        let slice = Batch::from(evs).slice(1..3);
        let want: Vec<i64> = slice.events().iter().map(|e| e.ts.timestamp_micros()).collect();
        assert_eq!(slice.ts_micros(), want);
        assert_eq!(want, [1_700_000_000_007_000, 1_700_000_000_014_000]);
    }

    /// A memo is made once per page and key, whatever slice of the page asks for it; a
    /// key past the cap, or asking for another type, gets none and builds its own.
    #[test]
    fn a_pages_memo_is_made_once_per_key_and_bounded() {
        let whole = page();
        let made = AtomicUsize::new(0);
        let make = |n: usize| {
            made.fetch_add(1, Ordering::Relaxed);
            vec![0u8; n]
        };
        let key: Arc<str> = "shape".into();
        let a = whole.memo(&key, make).expect("a memo");
        let last = whole.clone().slice(2..3);
        assert_eq!(last.offset(), 2);
        let b = last.memo(&key, make).expect("the same memo");
        assert!(Arc::ptr_eq(&a, &b), "one memo per page and key");
        assert_eq!((a.len(), made.load(Ordering::Relaxed)), (3, 1), "sized to the whole page, made once");
        assert!(whole.memo(&key, |_| "another type").is_none());
        for k in 1..PAGE_MEMOS {
            assert!(whole.memo(&format!("k{k}").into(), make).is_some());
        }
        assert!(whole.memo(&"one too many".into(), make).is_none(), "at most {PAGE_MEMOS} keys");
        assert!(page().memo(&key, make).is_some(), "another page has its own memos");
        assert_eq!(made.load(Ordering::Relaxed), PAGE_MEMOS + 1);
    }
}
