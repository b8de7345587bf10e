//! `GET /v1/runs/{run_id}/stream`: the run's events as Server-Sent Events, catch-up
//! then live, resumable.
//!
//! Every frame carries `id: <seq>` (for merged deltas, the last seq they cover). A
//! reconnect resumes after `Last-Event-ID` (which wins over `?after_seq=`, since
//! EventSource reconnects with its original URL). Events come from a [`Tail`], the
//! shared catch-up-then-live cursor. By default consecutive deltas of one message are
//! merged into at most one frame per 100 ms window (seed 004 R1); `?detail=full` sends
//! every event. Control events are never merged or delayed. The stream ends after the
//! run's terminal lifecycle event; a reconnect to a finished run with nothing left gets
//! 204, which tells EventSource to stop.
//!
//! A live client that falls behind the run's newest seq (its socket is full, so the
//! stream is not polled) loses reasoning deltas, and further behind text deltas too;
//! the terminal event's payload says how many in `dropped_count`. The seq gaps show
//! where; the dropped text is still in the `message.end` and the run's view.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;

use super::extract::{Caller, Params};
use crate::app::AppRef;
use crate::app::Shedding;
use crate::dialect::{Class, Encoding, Format, Out};
use crate::error::{Error, ErrorCode, Result};
use crate::live::shape::{Aggregator, WINDOW};
use crate::live::{Batch, Tail};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {
    #[serde(default)]
    after_seq: Option<i64>,
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    format: Option<String>,
}

pub(super) fn resume_point(headers: &HeaderMap, after_seq: Option<i64>) -> Result<i64> {
    let header = headers.get("last-event-id").map(|v| {
        v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()).filter(|n| *n >= 0).ok_or_else(|| {
            Error::reject(
                ErrorCode::InvalidParameter,
                "`Last-Event-ID` must be a seq (an integer, 0 or more)",
            )
        })
    });
    match (header, after_seq) {
        (Some(h), _) => h,
        (None, Some(a)) if a >= 0 => Ok(a),
        (None, Some(_)) => Err(Error::reject(ErrorCode::InvalidParameter, "`after_seq` must be 0 or more")),
        (None, None) => Ok(0),
    }
}

/// `GET /v1/runs/{run_id}/stream[?after_seq=N][&detail=full]`
pub(crate) async fn stream(
    State(app): State<AppRef>,
    Caller(who): Caller,
    Path(run_id): Path<String>,
    Params(p): Params<StreamParams>,
    headers: HeaderMap,
) -> Result<Response> {
    let cursor = resume_point(&headers, p.after_seq)?;
    let raw = match p.detail.as_deref() {
        None | Some("default") => false,
        Some("full") => true,
        Some(other) => {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                format!("`detail` must be `full` or `default`, not `{other}`"),
            ))
        }
    };
    let format = Format::parse(p.format.as_deref())?;
    let run = app.run(&who, &run_id).await?;
    if run.state.is_some_and(|s| s.is_terminal()) && run.last_seq <= cursor {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let enc = app.encoding(&who, &run, format, cursor).await?;
    let shedding = app.settings.shedding;
    let tail = Tail::new(app, who, run.run_id, cursor);
    Ok(sse_response(Sending::new(tail, enc, raw, shedding), format))
}

/// The SSE response for a stream, with the dialect's headers.
pub(super) fn sse_response<S: Source + Send + 'static>(state: Sending<S>, format: Format) -> Response {
    let mut r = super::sse::response(chunks(state));
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
    /// How far behind the newest committed event the consumer is.
    fn behind(&self) -> i64;
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
    fn behind(&self) -> i64 {
        Tail::behind(self)
    }
}

/// One SSE stream: events from a source, encoded in a dialect, shed under
/// backpressure, merged per window.
pub(super) struct Sending<S> {
    source: S,
    enc: Encoding,
    agg: Aggregator,
    /// Opening items still to send (a stream from the start of the run).
    opening: Vec<Out>,
    /// When the pending merged deltas must go out.
    window_end: Option<tokio::time::Instant>,
    /// `detail=full`: every item as it is, no merging.
    raw: bool,
    ended: bool,
    shedding: Shedding,
    /// Deltas dropped because the client fell behind (reported in the terminal item).
    dropped: u64,
}

impl<S: Source> Sending<S> {
    pub(super) fn new(source: S, mut enc: Encoding, raw: bool, shedding: Shedding) -> Self {
        let opening = if enc.view_seq() == 0 { enc.begin() } else { vec![] };
        Sending {
            source,
            enc,
            agg: Aggregator::default(),
            opening,
            window_end: None,
            raw,
            ended: false,
            shedding,
            dropped: 0,
        }
    }

    /// The next items to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Vec<Out>> {
        if !self.opening.is_empty() {
            return Some(std::mem::take(&mut self.opening));
        }
        loop {
            if self.ended {
                return self.agg.flush().map(|f| vec![f]);
            }
            let batch = match self.window_end {
                Some(end) => match tokio::time::timeout_at(end, self.source.next_batch()).await {
                    Ok(b) => b,
                    Err(_) => {
                        // The window closed: the merged deltas go out.
                        self.window_end = None;
                        return self.agg.flush().map(|f| vec![f]);
                    }
                },
                None => self.source.next_batch().await,
            };
            let Some(batch) = batch else {
                self.ended = true;
                continue;
            };
            let behind = self.source.behind();
            let mut items = Vec::with_capacity(batch.events().len());
            for (e, wire) in batch.iter() {
                self.enc.push_into(e, Some(wire), &mut items);
            }
            let dropped = shed(&mut items, behind, self.shedding);
            if dropped > 0 {
                self.dropped += dropped;
                self.source.note_dropped(dropped);
            }
            if self.raw {
                if items.is_empty() {
                    continue;
                }
                return Some(items);
            }
            let mut out = vec![];
            for o in items {
                out.extend(self.agg.push(&self.enc, o));
            }
            if !self.agg.has_pending() {
                self.window_end = None;
            } else if self.window_end.is_none() {
                self.window_end = Some(tokio::time::Instant::now() + WINDOW);
            }
            if !out.is_empty() {
                return Some(out);
            }
        }
    }
}

/// Seed 004 R4: a client that falls behind loses reasoning deltas first, then text
/// deltas; never control items. Returns how many were dropped.
fn shed(items: &mut Vec<Out>, behind: i64, s: Shedding) -> u64 {
    if behind < s.reasoning_behind {
        return 0;
    }
    let text_too = behind >= s.text_behind;
    let before = items.len();
    items.retain(|o| match o.class {
        Class::Reasoning => false,
        Class::Text => !text_too,
        Class::Control => true,
    });
    (before - items.len()) as u64
}

/// The stream's body: each batch of items as SSE frames, in chunks.
fn chunks<S: Source + Send + 'static>(state: Sending<S>) -> impl Stream<Item = bytes::Bytes> {
    let ready = std::collections::VecDeque::new();
    futures::stream::unfold((state, ready), |(mut s, mut ready)| async move {
        while ready.is_empty() {
            let mut items = s.next().await?;
            for o in items.iter_mut().filter(|o| o.terminal) {
                if s.dropped > 0 || s.enc.format() == Format::Native {
                    s.enc.annotate_dropped(o, s.dropped);
                }
            }
            super::sse::chunks(&items, &mut ready);
        }
        let c = ready.pop_front()?;
        Some((c, (s, ready)))
    })
}

#[cfg(test)]
mod tests {
    //! Seed 004 T4 on tokio's paused clock: the windows are exact, not subject to load.

    use super::*;
    use crate::dialect::{Data, RunCtx};
    use crate::domain::Event;
    use crate::projection::RunView;
    use crate::testkit::stored;
    use serde_json::json;
    use std::time::Duration;
    use tokio::sync::mpsc;

    struct Channel(mpsc::Receiver<Vec<Event>>);

    impl Source for Channel {
        async fn next_batch(&mut self) -> Option<Batch> {
            self.0.recv().await.map(Batch::from)
        }
        fn behind(&self) -> i64 {
            0
        }
    }

    /// 1000 deltas, one per millisecond, then a tool call; frames as (first, last seq).
    async fn shape(raw: bool) -> Vec<Out> {
        let mut inputs: Vec<_> =
            (0..1000).map(|i| json!({"type": "text.delta", "payload": {"text": format!("{i},")}})).collect();
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
        let mut s = Sending::new(Channel(rx), enc, raw, Shedding::default());
        let mut frames = vec![];
        while let Some(f) = s.next().await {
            frames.extend(f);
        }
        frames
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_deltas_in_one_second_come_out_as_at_most_ten_frames() {
        let started = tokio::time::Instant::now();
        let frames = shape(false).await;
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

    #[tokio::test(start_paused = true)]
    async fn detail_full_sends_every_event() {
        let frames = shape(true).await;
        assert_eq!(frames.len(), 1001);
        assert!(frames.iter().enumerate().all(|(i, f)| f.first_seq == i as i64 + 1 && f.seq == i as i64 + 1));
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
            page.iter().flat_map(|(e, w)| enc.push_shared(e, Some(w))).collect()
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
}
