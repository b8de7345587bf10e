//! Shared reads: one task per watched run reads each wake-up's new rows once and hands
//! the page to every subscriber (Hasura-style multiplexing), so database load follows
//! the number of appends, not the number of subscribers.
//!
//! A subscriber joins the feed first, catches up on its own through the read path, and
//! then takes pages from the feed, keeping only events after its own cursor. When a
//! page starts beyond its cursor (it joined between two reads) or it fell behind the
//! feed's buffer, it reads the gap itself: the cursor, not the feed, decides what is
//! next, so nothing is skipped or repeated.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::broadcast;

use super::Hub;
use agent_stream_core::dialect::Wire;
use agent_stream_core::domain::Event;
use agent_stream_store::db::discard;
use agent_stream_store::events::read_after_alone;
use agent_stream_store::Db;

/// A page of consecutive events, shared by all subscribers of a run.
pub type Page = Arc<PageData>;

/// The events of one read, and each event's native JSON once some subscriber needed it:
/// a page fans out to every subscriber, so rendering it once per page rather than once
/// per subscriber takes the encoding out of the per-subscriber cost.
pub struct PageData {
    events: Vec<Event>,
    wire: Vec<OnceLock<Wire>>,
}

impl PageData {
    /// A page of `events` (consecutive, in seq order).
    pub fn new(events: Vec<Event>) -> Page {
        let wire = events.iter().map(|_| OnceLock::new()).collect();
        Arc::new(PageData { events, wire })
    }

    /// The page's events.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
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

    /// Each event with its shared native rendering (see `agent_stream_core::dialect::Encoding::push_into`).
    pub fn iter(&self) -> impl Iterator<Item = (&Event, &OnceLock<Wire>)> {
        self.events().iter().zip(&self.page.wire[self.range.clone()])
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

/// Splits one read into pages of at most [`FEED_PAGE_BYTES`] of payload (at least one
/// event each), in order.
fn pages(evs: Vec<Event>) -> Vec<Vec<Event>> {
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

/// Per-run feeds and the read counter.
#[derive(Default)]
pub struct Feeds {
    feeds: Mutex<HashMap<(String, String), broadcast::Sender<Page>>>,
    reads: AtomicU64,
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

    /// Joins the run's feed, starting it if this is its first subscriber. `from` is
    /// where a new feed starts reading (the joiner's cursor; others read their gaps).
    /// The feed ends, closing its channel, when `stopping` turns true: subscribers learn
    /// of a shutdown from their feed, so a wake-up does not make every one of them
    /// register with the process-wide stop signal.
    pub fn join(
        self: &Arc<Self>,
        db: &Db,
        hub: &Arc<Hub>,
        tenant: &str,
        run_id: &str,
        from: i64,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> broadcast::Receiver<Page> {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_owned(), run_id.to_owned());
        if let Some(tx) = feeds.get(&key).filter(|tx| tx.receiver_count() > 0) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(FEED_BUFFER);
        feeds.insert(key.clone(), tx.clone());
        let wake = hub.subscribe(tenant, run_id);
        tokio::spawn(run_feed(self.clone(), db.clone(), key, from, wake, stopping, tx));
        rx
    }
}

async fn run_feed(
    feeds: Arc<Feeds>,
    db: Db,
    key: (String, String),
    mut cursor: i64,
    mut wake: tokio::sync::watch::Receiver<i64>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    tx: broadcast::Sender<Page>,
) {
    let (tenant, run_id) = &key;
    loop {
        if tx.receiver_count() == 0 {
            break;
        }
        // Read everything committed after the cursor, in pages.
        loop {
            let page = async {
                let client = db.pool.get().await?;
                let page = read_after_alone(&client, tenant, run_id, cursor, FEED_PAGE).await;
                if page.is_err() {
                    discard(client);
                }
                page
            }
            .await;
            feeds.count_read();
            match page {
                Ok(evs) if evs.is_empty() => break,
                Ok(evs) => {
                    cursor = evs.last().map_or(cursor, |e| e.seq);
                    let full = evs.len() as i64 == FEED_PAGE;
                    for page in pages(evs) {
                        let _ = tx.send(PageData::new(page));
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, run = %run_id, "feed read failed; retrying on the next wake-up");
                    break;
                }
            }
        }
        if *stopping.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = tokio::time::timeout(super::SAFETY_POLL * 2, wake.changed()) => {
                if r.is_ok_and(|r| r.is_err()) {
                    break;
                }
            }
            _ = stopping.changed() => {}
        }
    }
    let mut all = feeds.feeds.lock().unwrap_or_else(|p| p.into_inner());
    if all.get(&key).is_some_and(|t| t.same_channel(&tx)) {
        all.remove(&key);
    }
}
