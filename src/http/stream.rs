//! `GET /v1/runs/{run_id}/stream`: the run's events as Server-Sent Events, catch-up
//! then live, resumable.
//!
//! Every frame carries an `id:` (a [`Cursor`]: the seq of the event for most items). A
//! reconnect resumes after `Last-Event-ID` (which wins over `?after_seq=`, since
//! EventSource reconnects with its original URL) and gets exactly what it has not seen:
//! see the dialect's resume rule in `src/dialect/`. Events come from a [`Tail`], the
//! shared catch-up-then-live cursor. By default deltas are merged per lane into at most
//! 10 frames a second for the whole run (seed 004 R1, [`Shaper`]); `?detail=full` sends
//! every item. Control items are never merged or delayed. The stream ends after the
//! run's terminal lifecycle event; a reconnect to a finished run with nothing left gets
//! 204, which tells EventSource to stop; a cursor beyond the run's end is refused
//! (`416 CURSOR-BEYOND-END`), never silently skipped.
//!
//! A reader that cannot keep up loses reasoning deltas, then text deltas, never anything
//! else (R4, [`Shedder`]); the terminal item says how many in `dropped_count`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use tokio::time::Instant;

use super::extract::{Caller, Params};
use crate::app::{check_cursor, AppRef};
use crate::dialect::resume::Resumer;
use crate::dialect::shape::Shaper;
use crate::dialect::{Class, Cursor, Encoding, Format, Out, Resume};
use crate::error::{Error, ErrorCode, Result};
use crate::live::shed::{drops, Shedder};
use crate::live::{Batch, Tail};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {
    /// Resume after this stream position: a seq, or an `id:` this service sent (`Last-Event-ID` wins).
    #[serde(default)]
    after_seq: Option<String>,
    /// `default` merges deltas per lane (at most 10 delta frames a second per run); `full` sends every item as it is.
    #[serde(default)]
    detail: Option<String>,
    /// The dialect: native (default), multica, chunks, hier, typed, agui or vercel.
    #[serde(default)]
    format: Option<String>,
}

/// Where a stream resumes: `Last-Event-ID` if sent, else `after_seq`, else the start.
pub(super) fn resume_point(headers: &HeaderMap, after_seq: Option<&str>) -> Result<Cursor> {
    if let Some(v) = headers.get("last-event-id") {
        let s = v.to_str().map_err(|_| {
            Error::reject(ErrorCode::InvalidParameter, "`Last-Event-ID` must be an id this service sent")
        })?;
        return Ok(Cursor::parse(s)?);
    }
    match after_seq {
        Some(a) => Cursor::parse(a).map_err(|_| {
            Error::reject(
                ErrorCode::InvalidParameter,
                "`after_seq` must be a seq (0 or more) or an `id` this service sent",
            )
        }),
        None => Ok(Cursor::at(0)),
    }
}

/// `GET /v1/runs/{run_id}/stream[?after_seq=N][&detail=full][&format=]`
#[utoipa::path(get, path = "/v1/runs/{run_id}/stream", tag = "live", security(("bearer" = []), ("access_token" = [])),
    params(("run_id" = String, Path, description = "The run id (a ULID)"), StreamParams, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this stream position (wins over `after_seq`)")),
    responses(
        (status = 200, description = "Server-Sent Events in the chosen dialect", content_type = "text/event-stream", body = String),
        (status = 204, description = "The run has ended and nothing is after the cursor"),
        (status = 400, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 416, description = "error", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "error", body = crate::http::openapi::ErrorBody),
    ))]
pub(crate) async fn stream(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<StreamParams>,
    headers: HeaderMap,
) -> super::error::ApiResult<Response> {
    let cursor = resume_point(&headers, p.after_seq.as_deref())?;
    let raw = detail(p.detail.as_deref())?;
    let format = Format::parse(p.format.as_deref())?;
    match open(&app, who, &run_id, cursor, raw, format, crate::metrics::Transport::SSE).await? {
        Some(sending) => Ok(sse_response(sending, format)),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// `detail`: `full` (raw mode, R2) or `default` (merged deltas, R1).
pub(super) fn detail(v: Option<&str>) -> Result<bool> {
    match v {
        None | Some("default") => Ok(false),
        Some("full") => Ok(true),
        Some(other) => Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!(
                "`detail` must be `full` or `default`, not `{}`",
                other.chars().take(40).collect::<String>()
            ),
        )),
    }
}

/// Opens a live stream of `run_id` for a client standing at `cursor`: the one path
/// every streaming transport (SSE, the seed's WebSocket profile) takes. `None` when the
/// run has ended and nothing is after the cursor.
pub(super) async fn open(
    app: &AppRef,
    who: crate::auth::Principal,
    run_id: &str,
    cursor: Cursor,
    raw: bool,
    format: Format,
    transport: crate::metrics::Transport,
) -> Result<Option<Sending<Live>>> {
    let run = app.run(&who, run_id).await?;
    check_cursor(&run, &cursor)?;
    let ended = run.state.is_some_and(|s| s.is_terminal());
    if ended && cursor.complete_seq() >= run.last_seq {
        return Ok(None);
    }
    let base = cursor.complete_seq();
    let mut enc = app.encoding(&who, &run, format, &cursor).await?;
    let shedding = app.settings.shedding;
    let delivery = app.metrics.subscription(transport);
    let tail = Live { tail: app.live_tail(who, &mut enc, base), delivery, transport, app: app.clone() };
    Ok(Some(Sending::new(tail, enc, raw, Shedder::new(shedding, !ended))))
}

/// A live stream's source: the tail, with its deliveries recorded in the metrics and
/// the traces under its transport's name.
pub(super) struct Live {
    tail: Tail,
    delivery: crate::metrics::Delivery,
    transport: crate::metrics::Transport,
    app: AppRef,
}

impl Source for Live {
    fn note_dropped(&self, n: u64) {
        self.tail.note_dropped(n);
    }
    async fn next_batch(&mut self) -> Option<Batch> {
        let batch = self.tail.next_batch().await?;
        self.delivery.delivered_at(batch.ts_micros());
        for e in batch.events() {
            self.app.traces.delivered(&e.run_id, e.seq, self.transport.transport);
        }
        Some(batch)
    }
    fn behind(&self, seq: i64) -> i64 {
        self.tail.behind_seq(seq)
    }
}

/// The SSE response for a stream, with the dialect's headers.
pub(super) fn sse_response<S: Source + Send + 'static>(state: Sending<S>, format: Format) -> Response {
    let mut r = super::sse::response(chunks(state.sse_pages()));
    for (k, v) in format.sse_headers() {
        r.headers_mut().insert(*k, axum::http::HeaderValue::from_static(v));
    }
    r
}

/// Where a stream's events come from: a [`Tail`] when live, a paced reader for
/// replay, a channel in tests (so the pacing can be checked on tokio's paused clock).
pub(super) trait Source {
    /// The next events in seq order; `None` at the end.
    fn next_batch(&mut self) -> impl std::future::Future<Output = Option<Batch>> + Send;
    /// How far the newest committed event is past `seq` (0 when not known).
    fn behind(&self, seq: i64) -> i64;
    /// Told how many deltas were dropped for this consumer.
    fn note_dropped(&self, _n: u64) {}
}

impl Source for Tail {
    fn note_dropped(&self, n: u64) {
        self.note_dropped(n);
    }
    async fn next_batch(&mut self) -> Option<Batch> {
        Tail::next_batch(self).await
    }
    fn behind(&self, seq: i64) -> i64 {
        Tail::behind_seq(self, seq)
    }
}

/// Events encoded per step: a client that stops reading leaves at most this many
/// events' items built and waiting, not a whole page's.
const EVENTS_PER_STEP: usize = 32;
/// Items handed to the transport per step.
const ITEMS_PER_STEP: usize = 64;

/// One SSE stream: events from a source, encoded in a dialect, filtered for a resume,
/// shed under backpressure, shaped per window.
pub(super) struct Sending<S> {
    source: S,
    enc: Encoding,
    resumer: Resumer,
    shaper: Shaper,
    shedder: Shedder,
    /// Shaped items waiting for the transport.
    ready: Vec<Out>,
    /// The batch being encoded and the index of its next event.
    batch: Option<(Batch, usize)>,
    /// What the reader loses while encoding the current batch (R4).
    level: Option<Class>,
    ended: bool,
    /// Deltas dropped because the client fell behind (reported in the terminal item).
    dropped: u64,
    /// The client was told it is being shed ([`shed_notice`]) since it last got
    /// everything.
    warned: bool,
    /// An SSE stream, which may send a page's shared frames ([`Sending::shared_page`]).
    sse_pages: bool,
    /// A page's shared frames, next to go.
    page: Option<std::sync::Arc<[bytes::Bytes]>>,
}

/// What a stream sends next.
enum Next {
    /// Items, framed by the transport.
    Items(Vec<Out>),
    /// A whole page's SSE frames, shared with the page's other subscribers.
    Page(std::sync::Arc<[bytes::Bytes]>),
}

impl<S: Source> Sending<S> {
    /// A stream whose client stands where `enc` says ([`Encoding::client`]; its
    /// encoding starts at that cursor's last complete event).
    pub(super) fn new(source: S, enc: Encoding, raw: bool, shedder: Shedder) -> Self {
        let now = Instant::now();
        let resume = enc.resume();
        // A resync dialect re-synchronises the client at the base: that is where it stands.
        let start = match resume {
            Resume::Exact => enc.client().clone(),
            Resume::Resync => Cursor::at(enc.view_seq()),
        };
        let mut shaper = Shaper::new(raw, start, now);
        if resume == Resume::Resync {
            shaper = shaper.resumed(enc.client());
        }
        let mut ready = vec![];
        for o in enc.open() {
            shaper.push(&enc, o, now, &mut ready);
        }
        Sending {
            source,
            resumer: enc.resumer(),
            enc,
            shaper,
            shedder,
            ready,
            batch: None,
            level: None,
            ended: false,
            dropped: 0,
            warned: false,
            sse_pages: false,
            page: None,
        }
    }

    /// The next items to send (or a whole page's shared SSE frames); `None` ends the
    /// stream.
    async fn next(&mut self) -> Option<Next> {
        loop {
            if let Some(frames) = self.page.take() {
                return Some(Next::Page(frames));
            }
            if !self.ready.is_empty() {
                let n = self.ready.len().min(ITEMS_PER_STEP);
                return Some(Next::Items(self.ready.drain(..n).collect()));
            }
            if self.ended {
                return None;
            }
            if let Some((batch, from)) = self.batch.take() {
                self.encode(&batch, from);
                continue;
            }
            let next = match self.shaper.due() {
                Some(due) => match tokio::time::timeout_at(due, self.source.next_batch()).await {
                    Ok(b) => b,
                    Err(_) => {
                        // The window closed: the merged deltas go out.
                        self.shaper.tick(Instant::now(), &mut self.ready);
                        continue;
                    }
                },
                None => self.source.next_batch().await,
            };
            match next {
                Some(batch) => {
                    self.measure(&batch, 0);
                    match self.shared_page(&batch) {
                        Some(frames) => self.page = Some(frames),
                        None => self.batch = Some((batch, 0)),
                    }
                }
                None => {
                    self.ended = true;
                    let mut rest = vec![];
                    self.resumer.finish(&mut rest);
                    self.shape(rest);
                    self.shaper.flush(Instant::now(), &mut self.ready);
                }
            }
        }
    }

    /// The next items as a transport sends them: the terminal item carries
    /// `dropped_count` (R4). `None` ends the stream.
    pub(super) async fn next_items(&mut self) -> Option<Vec<Out>> {
        loop {
            match self.next().await? {
                Next::Items(items) => return Some(self.annotated(items)),
                // Only an SSE stream ([`Sending::sse_pages`]) takes whole pages.
                Next::Page(_) => debug_assert!(false, "a page's frames for a stream that sends items"),
            }
        }
    }

    fn annotated(&self, mut items: Vec<Out>) -> Vec<Out> {
        for o in items.iter_mut().filter(|o| o.terminal) {
            if self.dropped > 0 || self.enc.format() == Format::Native {
                self.enc.annotate_dropped(o, self.dropped);
            }
        }
        items
    }

    /// The next SSE body chunks: a whole page's frames as the page shares them, or the
    /// items' frames. `None` ends the stream.
    async fn next_chunks(&mut self, out: &mut std::collections::VecDeque<bytes::Bytes>) -> Option<()> {
        match self.next().await? {
            Next::Items(items) => super::sse::chunks(&self.annotated(items), out),
            Next::Page(frames) => out.extend(frames.iter().cloned()),
        }
        Some(())
    }

    /// Lets this stream take whole pages as SSE frames shared by every subscriber of the
    /// page in the same dialect (see [`Sending::shared_page`]).
    fn sse_pages(mut self) -> Self {
        self.sse_pages = true;
        self
    }

    /// The frames of `batch` as body chunks, built by the first `detail=full` SSE
    /// stream of its page in this dialect and shared by the rest, when nothing of this
    /// stream's own applies to it: the batch is the whole page, nothing is shed, held
    /// for a resume or pending in the shaper, the dialect resumes exactly (no floor on
    /// ids), and the run does not end in it (the terminal item carries this stream's
    /// `dropped_count`). The bytes are those the item path would send: raw items go out
    /// in order with their own positions as ids.
    fn shared_page(&mut self, batch: &Batch) -> Option<std::sync::Arc<[bytes::Bytes]>> {
        let format = self.enc.format();
        if !self.sse_pages
            || !self.shaper.is_raw()
            || self.shaper.has_pending()
            || self.level.is_some()
            || !self.resumer.is_done()
            || self.enc.resume() != Resume::Exact
            || !batch.is_whole()
            || batch.events().iter().any(crate::domain::Event::is_run_end)
        {
            return None;
        }
        if format != Format::Native && batch.rendered(format).is_none() {
            return None;
        }
        let last = batch.events().last()?.seq;
        let enc = &self.enc;
        let frames = batch.shared_frames(format, || {
            let mut items = vec![];
            match batch.rendered(format) {
                Some(rendered) => rendered.for_each(|one| items.extend_from_slice(one)),
                // Native renders from the event alone (no fold), into the page's wire.
                None => {
                    let mut enc = Encoding::fresh(format, enc.run().clone());
                    for (e, wire) in batch.iter() {
                        enc.push_into(e, Some(wire), &mut items);
                    }
                }
            }
            for o in &mut items {
                o.id = Some(o.position());
            }
            // The chunks the item path makes (at most `sse::CHUNK` each, as hyper's
            // queue of 16 chunks is what bounds a stalled reader), made once.
            let mut chunks = std::collections::VecDeque::new();
            super::sse::chunks(&items, &mut chunks);
            chunks.into()
        })?;
        self.shaper.passed(Cursor::at(last));
        self.warned = false;
        Some(frames)
    }

    /// Where the reader stands when it asks for the step of `batch` from index `from`:
    /// as far behind the head as the step's last event. Measured per step, not per
    /// batch: a batch of a reader catching up can reach from far behind to the head,
    /// and the steps that end between the two limits must lose reasoning only.
    fn measure(&mut self, batch: &Batch, from: usize) {
        let to = (from + EVENTS_PER_STEP).min(batch.events().len());
        let Some(last) = to.checked_sub(1).and_then(|i| batch.events().get(i)) else { return };
        self.level = self.shedder.level(self.source.behind(last.seq), Instant::now());
    }

    /// Encodes up to [`EVENTS_PER_STEP`] events of `batch` from index `from`, keeping
    /// the rest for the next step.
    fn encode(&mut self, batch: &Batch, from: usize) {
        if from > 0 {
            self.measure(batch, from);
        }
        let to = (from + EVENTS_PER_STEP).min(batch.events().len());
        let mut items = Vec::with_capacity(to - from);
        match batch.rendered(self.enc.format()) {
            // Rendered once by the run's fold for every subscriber of this dialect.
            Some(rendered) => {
                for one in rendered.skip(from).take(to - from) {
                    items.extend_from_slice(one);
                }
            }
            None => {
                for (e, wire) in batch.iter().skip(from).take(to - from) {
                    self.enc.push_into(e, Some(wire), &mut items);
                }
            }
        }
        if to < batch.events().len() {
            self.batch = Some((batch.clone(), to));
        }
        let level = self.level;
        if level.is_none() {
            self.warned = false;
        }
        let before = items.len();
        items.retain(|o| !drops(level, o.class));
        let dropped = (before - items.len()) as u64;
        if dropped > 0 {
            self.dropped += dropped;
            self.source.note_dropped(dropped);
        }
        let mut kept = Vec::with_capacity(items.len());
        self.resumer.push(items, &mut kept);
        self.shape(kept);
        if dropped > 0 && !self.warned {
            self.warned = true;
            // Native clients switch on the event name; the dialects have no place for it.
            if self.enc.format() == Format::Native {
                self.ready.push(shed_notice(self.shaper.sent(), self.dropped));
            }
        }
    }

    fn shape(&mut self, items: Vec<Out>) {
        let now = Instant::now();
        for o in items {
            self.shaper.push(&self.enc, o, now, &mut self.ready);
        }
    }
}

/// The SSE event name (and WebSocket `type`) of [`shed_notice`].
pub(super) const SHED_NOTICE: &str = "stream.warning";

/// Seed 004's `KAI-STREAM-BUF-0001`, sent the moment a live client starts losing deltas
/// (once per episode: again only after it has caught up and fallen behind anew). Not an
/// event of the log: its id is where the client stands, so a resume from it is exact.
fn shed_notice(at: Cursor, dropped: u64) -> Out {
    let mut o = Out::control(
        at.seq,
        serde_json::json!({
            "type": SHED_NOTICE,
            "payload": {
                "code": "KAI-STREAM-BUF-0001",
                "message": "this client is not keeping up: deltas are being dropped (reasoning first, then text; never other events)",
                "dropped_count": dropped,
            }
        }),
    );
    o.event = Some(SHED_NOTICE.into());
    o.id = Some(at);
    o
}

/// The stream's body: each step's items as SSE frames, in chunks.
///
/// A generator rather than `futures::stream::unfold`: unfold moves its state and its
/// next step's future in and out of place for every chunk, two copies of a
/// `Sending` per chunk per subscriber, which at 1,000 subscribers of one run were
/// ~4% of the server's CPU (docs/benchmarks-log.md, 2026-11-30). Here the state lives
/// in one future, polled where it is.
fn chunks<S: Source + Send + 'static>(mut state: Sending<S>) -> impl Stream<Item = bytes::Bytes> {
    async_stream::stream! {
        let mut ready = std::collections::VecDeque::new();
        loop {
            while let Some(c) = ready.pop_front() {
                yield c;
            }
            if state.next_chunks(&mut ready).await.is_none() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Seed 004 T4 on tokio's paused clock: the windows are exact, not subject to load.

    use super::*;
    use crate::app::Shedding;
    use crate::dialect::{Data, RunCtx};
    use crate::domain::Event;
    use crate::projection::RunView;
    use agent_stream_core::testkit::stored;
    use serde_json::json;
    use std::time::Duration;
    use tokio::sync::mpsc;

    struct Channel(mpsc::Receiver<Vec<Event>>);

    impl Source for Channel {
        async fn next_batch(&mut self) -> Option<Batch> {
            self.0.recv().await.map(Batch::from)
        }
        fn behind(&self, _seq: i64) -> i64 {
            0
        }
    }

    /// `deltas` deltas from `lanes` interleaved messages, one per millisecond, then a
    /// tool call.
    async fn shape(raw: bool, deltas: usize, lanes: usize) -> Vec<Out> {
        let mut inputs: Vec<_> = (0..deltas)
            .map(|i| {
                let m = format!("m{}", i % lanes);
                json!({"type": "text.delta", "payload": {"text": format!("{i},"), "message_id": m}})
            })
            .collect();
        inputs.push(json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}));
        let events = stored(&inputs);
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            for e in events {
                let control = !matches!(e.body, crate::domain::EventBody::TextDelta(_));
                if tx.send(vec![e]).await.is_err() {
                    return;
                }
                if !control {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
        let enc = Encoding::new(Format::Native, RunCtx::default(), RunView::new());
        let shedder = Shedder::new(Shedding::default(), true);
        let mut s = Sending::new(Channel(rx), enc, raw, shedder);
        let mut frames = vec![];
        while let Some(f) = s.next_items().await {
            frames.extend(f);
        }
        frames
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_deltas_in_one_second_come_out_as_at_most_ten_frames() {
        let started = tokio::time::Instant::now();
        let frames = shape(false, 1000, 1).await;
        assert!(started.elapsed() >= Duration::from_secs(1), "deltas were spread over a second");
        let deltas = &frames[..frames.len() - 1];
        assert!(deltas.len() <= 10, "{} delta frames", deltas.len());
        // Nothing lost: the frames cover seqs 1..=1000 back to back, text in order.
        let mut next = 1;
        let mut text = String::new();
        for f in deltas {
            assert_eq!(f.first_seq, next);
            next = f.seq + 1;
            text.push_str(f.json().and_then(|v| v["payload"]["text"].as_str()).unwrap_or_default());
        }
        assert_eq!(next, 1001);
        assert_eq!(text, (0..1000).map(|i| format!("{i},")).collect::<String>());
        assert_eq!(frames.last().and_then(|f| f.event.as_deref()), Some("tool.start"), "control last, alone");
    }

    /// Seed 004 R1 per run: four messages streaming at once share the run's 10 frames a
    /// second, and every message's text arrives whole and in order.
    #[tokio::test(start_paused = true)]
    async fn interleaved_messages_share_the_runs_ten_frames_a_second() {
        let frames = shape(false, 2000, 4).await;
        let deltas = &frames[..frames.len() - 1];
        // Two seconds of deltas; the control item at the end flushes at most one frame per lane.
        assert!(deltas.len() <= 2 * 10 + 4, "{} delta frames for 4 interleaved messages", deltas.len());
        for m in 0..4 {
            let got: String = deltas
                .iter()
                .filter(|f| f.json().is_some_and(|v| v["payload"]["message_id"] == format!("m{m}")))
                .map(|f| f.json().and_then(|v| v["payload"]["text"].as_str()).unwrap_or_default().to_owned())
                .collect();
            let want: String = (0..2000).filter(|i| i % 4 == m).map(|i| format!("{i},")).collect();
            assert_eq!(got, want, "message m{m}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn detail_full_sends_every_event() {
        let frames = shape(true, 1000, 1).await;
        assert_eq!(frames.len(), 1001);
        assert!(frames.iter().enumerate().all(|(i, f)| f.first_seq == i as i64 + 1 && f.seq == i as i64 + 1));
        assert!(frames.iter().all(|f| f.cursor().is_plain()));
    }

    /// Subscribers of one page share each event's native rendering (rendered once,
    /// not once per subscriber), and it is the same JSON the unshared path produces.
    #[tokio::test]
    async fn subscribers_of_a_page_share_one_rendering() {
        let events = stored(&[
            json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}),
            json!({"type": "text.delta", "payload": {"text": "hi"}}),
        ]);
        let page = Batch::from(events.clone());
        let rendered = |enc: &mut Encoding| -> Vec<Out> {
            let mut out = vec![];
            for (e, w) in page.iter() {
                enc.push_into(e, Some(w), &mut out);
            }
            out
        };
        let new_enc = || Encoding::new(Format::Native, RunCtx::default(), RunView::new());
        let (a, b) = (rendered(&mut new_enc()), rendered(&mut new_enc()));
        let plain: Vec<Out> = events.iter().flat_map(|e| new_enc().push(e)).collect();
        assert_eq!(a.len(), 2);
        for ((x, y), p) in a.iter().zip(&b).zip(&plain) {
            let (Data::Wire(x), Data::Wire(y)) = (&x.data, &y.data) else { panic!("not shared: {x:?}") };
            assert!(x.same(y), "rendered once, shared");
            let parsed: serde_json::Value = serde_json::from_slice(x.json()).expect("json");
            assert_eq!(Some(&parsed), p.json(), "same JSON as the unshared path");
        }
    }

    /// Pages handed out in order, the same pages to every stream built over them.
    struct Pages(std::collections::VecDeque<Batch>);

    impl Source for Pages {
        async fn next_batch(&mut self) -> Option<Batch> {
            self.0.pop_front()
        }
        fn behind(&self, _seq: i64) -> i64 {
            0
        }
    }

    /// `detail=full` SSE streams of a page share its frames as one chunk, built once,
    /// and those bytes are exactly what the item path sends, in every dialect that takes
    /// the shortcut and in the one that does not (agui resynchronises).
    #[tokio::test]
    async fn a_pages_shared_frames_are_the_item_paths_bytes() {
        let events = stored(&[
            json!({"type": "run.lifecycle", "payload": {"state": "running"}}),
            json!({"type": "message.start", "payload": {"message_id": "m", "role": "assistant"}}),
            json!({"type": "text.delta", "payload": {"text": "a\nb"}}),
            json!({"type": "tool.start", "payload": {"call_id": "c", "tool": "t"}}),
            json!({"type": "custom.x", "payload": {"n": 1}}),
            json!({"type": "tool.end", "payload": {"call_id": "c", "ok": true}}),
            json!({"type": "message.end", "payload": {"message_id": "m", "stop_reason": "end_turn"}}),
        ]);
        for format in [Format::Native, Format::Multica, Format::Typed, Format::Agui] {
            // Pages as a run's feed makes them: rendered by the fold for the dialect.
            let mut view = RunView::new();
            let pages: Vec<Batch> = events
                .chunks(3)
                .map(|page| {
                    let wants: Vec<_> = crate::live::Want::of(format).into_iter().collect();
                    Batch::whole(crate::live::PageData::folded(
                        &mut view,
                        &RunCtx::default(),
                        page.to_vec(),
                        &wants,
                    ))
                })
                .collect();
            let body = |pages: &[Batch], shared: bool| {
                let enc = Encoding::new(format, RunCtx::default(), RunView::new());
                let shedder = Shedder::new(Shedding::default(), true);
                let mut s = Sending::new(Pages(pages.iter().cloned().collect()), enc, true, shedder);
                if shared {
                    s = s.sse_pages();
                }
                async move {
                    let mut out = std::collections::VecDeque::new();
                    while s.next_chunks(&mut out).await.is_some() {}
                    out.into_iter().collect::<Vec<_>>()
                }
            };
            let items = body(&pages, false).await.concat();
            let (a, b) = (body(&pages, true).await, body(&pages, true).await);
            assert_eq!(a.concat(), items, "{format:?}: the same bytes");
            if format != Format::Agui {
                // Small pages: a chunk each (none for a page the dialect renders nothing of).
                assert!(!a.is_empty() && a.len() <= pages.len(), "{format:?}: {} chunks", a.len());
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.as_ptr() == y.as_ptr()),
                    "{format:?}: built once, shared"
                );
            }
        }
    }
}
