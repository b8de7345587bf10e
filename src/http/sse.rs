//! Server-Sent Events on the wire: frames, the reconnect hint and keep-alive comments.
//!
//! Written by hand rather than with axum's `Sse` because a live page fans out to every
//! subscriber of a run: an unchanged item's frame is built once per page and shared
//! ([`Wire::framed`]), each page goes out as one body chunk, and the keep-alive timer
//! is re-armed once per interval rather than after every frame.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;

use crate::dialect::{Cursor, Data, Out};
use crate::live::alarm::Idle;

/// Keep-alive comment interval (seed 004 §5.1).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);
/// Reconnect delay suggested to clients.
const RETRY: Duration = Duration::from_secs(2);
const KEEPALIVE_COMMENT: &[u8] = b":keepalive\n\n";

/// Appends one SSE frame: `id:`, `event:` when named, one `data:` line per line of data.
pub(crate) fn write_frame(buf: &mut BytesMut, id: &Cursor, event: Option<&str>, data: &str) {
    buf.put_slice(b"id: ");
    if id.is_plain() {
        buf.put_slice(itoa::Buffer::new().format(id.seq).as_bytes());
    } else {
        buf.put_slice(id.to_string().as_bytes());
    }
    buf.put_u8(b'\n');
    if let Some(name) = event {
        buf.put_slice(b"event: ");
        buf.put_slice(name.as_bytes());
        buf.put_u8(b'\n');
    }
    for line in data.split('\n') {
        buf.put_slice(b"data: ");
        buf.put_slice(line.as_bytes());
        buf.put_u8(b'\n');
    }
    buf.put_u8(b'\n');
}

/// Appends the frame of one item.
fn write_item(buf: &mut BytesMut, o: &Out) {
    let text = o.to_text();
    // Room for the whole frame at once: the id, the names and one line of data (JSON
    // has no raw newline) fit in 64 bytes more. Grown a field at a time, a lone
    // frame's buffer was reallocated five times (13% of the shared frame's cost under
    // many-runs, docs/benchmarks-log.md, 2026-11-30 20:55).
    buf.reserve(text.len() + o.event.as_deref().map_or(0, str::len) + 64);
    write_frame(buf, &o.cursor(), o.event.as_deref(), &text);
}

/// The item's frame, shared with every subscriber of its page when it is the page's
/// rendering under the event's own id (anything else is framed for this stream).
fn framed(o: &Out) -> Option<Bytes> {
    match &o.data {
        Data::Wire(w) if o.cursor() == Cursor::at(o.seq) => Some(w.framed(|| frame(o))),
        _ => None,
    }
}

/// The frame of one item on its own.
fn frame(o: &Out) -> Bytes {
    let mut buf = BytesMut::new();
    write_item(&mut buf, o);
    buf.freeze()
}

/// Largest body chunk made by joining frames: a page of small frames goes out in a few
/// writes, and a client that stops reading still holds little: hyper stops pulling from
/// the stream once 16 chunks are queued, so at most about 64 KiB of frames wait in a
/// stalled connection (the pages themselves are shared), as when each frame was a chunk.
const CHUNK: usize = 4 * 1024;

/// The body chunks for a batch of items, in order: a lone unchanged page item is its
/// shared frame as it is (no copy); otherwise consecutive frames are joined into
/// chunks of at most [`CHUNK`] bytes (a frame bigger than that is a chunk of its own).
pub(crate) fn chunks(items: &[Out], out: &mut VecDeque<Bytes>) {
    if let [one] = items {
        out.push_back(framed(one).unwrap_or_else(|| frame(one)));
        return;
    }
    let mut buf = BytesMut::new();
    for o in items {
        let start = buf.len();
        match framed(o) {
            Some(f) => buf.put_slice(&f),
            None => write_item(&mut buf, o),
        }
        if start > 0 && buf.len() > CHUNK {
            // This frame does not fit: what came before it is a chunk.
            out.push_back(buf.split_to(start).freeze());
        }
    }
    if !buf.is_empty() {
        out.push_back(buf.freeze());
    }
}

/// The `text/event-stream` response for a stream of body chunks (whole frames), with
/// the reconnect hint first and a keep-alive comment after every [`KEEPALIVE`] of
/// silence.
pub(crate) fn response<S>(chunks: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    // Boxed here with axum's own error type, so `Body::new` takes the box as it is:
    // given a `Body::from_stream`, it wraps a stream adapter, a `StreamBody` and two
    // error maps around it, each moving the whole polled frame, on every poll of every
    // subscriber's body (~110 of the ~8,200 instructions one more subscriber of a page
    // cost, docs/benchmarks-log.md, 2026-12-07 02:00).
    let body = KeepAlive { chunks, idle: Idle::new(KEEPALIVE), opened: false };
    let mut r = Response::new(Body::new(UnsyncBoxBody::new(body)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

pin_project_lite::pin_project! {
    /// The body: chunks, after the `retry:` hint (sent at once, so a client that
    /// reconnects before any event arrived still has it), with keep-alive comments in
    /// the silences.
    struct KeepAlive<S> {
        #[pin]
        chunks: S,
        // Sending a chunk only reads the clock; waiting for the next one does not poll
        // the timer again ([`Idle`]).
        idle: Idle,
        opened: bool,
    }
}

impl<S: Stream<Item = Bytes>> http_body::Body for KeepAlive<S> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        if !*this.opened {
            *this.opened = true;
            // A block with no data dispatches no event; EventSource keeps the delay.
            let hint = Bytes::from(format!("retry: {}\n\n", RETRY.as_millis()));
            return Poll::Ready(Some(Ok(Frame::data(hint))));
        }
        match this.chunks.poll_next(cx) {
            Poll::Ready(Some(c)) => {
                this.idle.wrote();
                Poll::Ready(Some(Ok(Frame::data(c))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                this.idle.poll_due(cx).map(|()| Some(Ok(Frame::data(Bytes::from_static(KEEPALIVE_COMMENT)))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Wire;
    use http_body_util::BodyExt;
    use tokio::time::Instant;

    fn text(b: &Bytes) -> &str {
        std::str::from_utf8(b).expect("utf-8")
    }

    #[test]
    fn a_frame_has_id_event_and_one_data_line_per_line() {
        let mut buf = BytesMut::new();
        write_frame(&mut buf, &Cursor::at(42), Some("text.delta"), "a\nb");
        assert_eq!(text(&buf.freeze()), "id: 42\nevent: text.delta\ndata: a\ndata: b\n\n");
        let mut buf = BytesMut::new();
        write_frame(&mut buf, &Cursor::at(7), None, "[DONE]");
        assert_eq!(text(&buf.freeze()), "id: 7\ndata: [DONE]\n\n");
        let mut buf = BytesMut::new();
        write_frame(&mut buf, &Cursor::parse("7.2:9,12").expect("cursor"), None, "{}");
        assert_eq!(text(&buf.freeze()), "id: 7.2:9,12\ndata: {}\n\n");
    }

    #[test]
    fn subscribers_of_a_page_share_one_frame() {
        let w = Wire::new(br#"{"seq":3}"#.to_vec());
        let item = |w: &Wire| Out {
            event: Some("tool.start".into()),
            data: Data::Wire(w.clone()),
            ..Out::control(3, serde_json::Value::Null)
        };
        let one = |items: &[Out]| {
            let mut out = VecDeque::new();
            chunks(items, &mut out);
            assert_eq!(out.len(), 1, "one chunk");
            out.pop_front().unwrap_or_default()
        };
        let (a, b) = (one(&[item(&w)]), one(&[item(&w)]));
        assert_eq!(text(&a), "id: 3\nevent: tool.start\ndata: {\"seq\":3}\n\n");
        assert_eq!(a.as_ptr(), b.as_ptr(), "built once, shared");
        // Several small items go out as one chunk of consecutive frames.
        let two = one(&[item(&w), Out::control(4, serde_json::json!({"seq": 4}))]);
        assert_eq!(text(&two), "id: 3\nevent: tool.start\ndata: {\"seq\":3}\n\nid: 4\ndata: {\"seq\":4}\n\n");
        // Bigger ones are split into chunks of at most CHUNK bytes, frames kept whole.
        let big: Vec<Out> = (1..=10).map(|i| Out::control(i, serde_json::json!("x".repeat(1500)))).collect();
        let mut out = VecDeque::new();
        chunks(&big, &mut out);
        assert!(out.len() >= 3, "{} chunks", out.len());
        assert!(out.iter().all(|c| c.len() <= CHUNK && c.ends_with(b"\n\n")));
        assert_eq!(out.iter().map(|c| text(c).matches("id: ").count()).sum::<usize>(), 10);
    }

    /// On tokio's paused clock: the hint first; a comment after each 15 s of silence,
    /// none while chunks flow.
    #[tokio::test(start_paused = true)]
    async fn keepalive_fills_silences_only() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let chunks = tokio_stream::wrappers::ReceiverStream::new(rx);
        // Through the response, as hyper polls it.
        let mut body = response(chunks).into_body();
        async fn next(b: &mut Body) -> Option<Bytes> {
            b.frame().await.and_then(|r| r.ok()).and_then(|f| f.into_data().ok())
        }
        let start = Instant::now();
        // A chunk every 10 s for a minute: never 15 s of silence, so no comment. The
        // first carries the reconnect hint.
        let feeder = tokio::spawn(async move {
            for i in 0..6u8 {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let _ = tx.send(Bytes::from(vec![b'0' + i])).await;
            }
            tokio::time::sleep(Duration::from_secs(100)).await;
            drop(tx);
        });
        // The hint comes at once, before any chunk.
        assert_eq!(next(&mut body).await.as_deref(), Some(&b"retry: 2000\n\n"[..]));
        assert_eq!(start.elapsed(), Duration::ZERO);
        for i in 0..6u8 {
            assert_eq!(next(&mut body).await, Some(Bytes::from(vec![b'0' + i])));
        }
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        // Then silence: a comment 15 s after the last chunk, and every 15 s after that.
        for k in 1..=3u64 {
            assert_eq!(next(&mut body).await.as_deref(), Some(KEEPALIVE_COMMENT));
            assert_eq!(start.elapsed(), Duration::from_secs(60 + 15 * k));
        }
        feeder.abort();
    }
}
