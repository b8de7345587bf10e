//! The schema as GraphQL WebSockets run it: a `runEvents` event is rendered once per
//! live page and request shape, and every subscriber of the run that asks the same
//! shares the response.
//!
//! Why: async-graphql executes a subscription's selection set for each item and each
//! subscriber. At 1,000 subscribers of one run that was 5.0–5.9 µs of server CPU per
//! delivered event, 6–7 times SSE's (which shares each page's frames), and the server
//! took 204–272 of the producer's 1,000 events/s (docs/benchmarks-log.md, 2026-11-30
//! 12:20). How an event renders depends on the event and on the request (its query,
//! operation and variables), not on the caller nor on where its stream started: so
//! requests that differ at most in the variable given as `afterSeq` share it.
//!
//! How: the request carries a [`Capture`]. `runEvents` builds everything that is the
//! subscriber's own as before (the tail from its cursor, the filter, the slot, the
//! delivery counts) and hands that stream of events over, resolving instead to a feed
//! the executor fills. For each event the executor looks in its page's memo for this
//! request shape: a subscriber that finds the event rendered takes a copy of the
//! response; one that does not renders it by feeding it through its own execution and
//! leaves the result there for the others. Events that are not in a live page
//! (catch-up reads) or that carry the subscriber's own opening snapshot go through its
//! own execution, as every event did before. Every other operation, and a `runEvents`
//! refused before it started, passes through unchanged.
//!
//! What is shared is the response's JSON text, not the response: a copy of the
//! response was a deep clone of its value tree, which the protocol handler then
//! serialized again, for each subscriber (~40% of what a GraphQL WebSocket subscriber
//! cost beyond an SSE one, docs/benchmarks-log.md, 2026-12-02 19:00). async-graphql's
//! handler frames every response itself, so the stream yields a [`PLACEHOLDER`]
//! response and leaves the text in the socket's [`Spliced`]; the socket puts it in
//! the framed message ([`Spliced::splice`]). The handler frames a response as soon as a
//! stream yields it, so the text left is always the one of the message in hand.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use async_graphql::{Data, Executor, Name, Request, Response, Value};
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::schema::GqlEvent;
use super::AgentSchema;
use crate::metrics::Metrics;

/// What `runEvents` hands over to the executor.
pub(super) struct Captured {
    /// The subscriber's events, in order, each to be sent.
    pub events: BoxStream<'static, GqlEvent>,
    /// The variable `afterSeq` was given by, if it was: left out of the request's shape.
    pub cursor_variable: Option<String>,
}

/// In a request's data when [`Sharing`] runs it: where `runEvents` hands its events
/// over, and the feed it resolves to instead.
pub(super) struct Capture {
    handed: Mutex<Option<oneshot::Sender<Captured>>>,
    /// Boxed: a channel allocates its slots in blocks of 32, and an event is a few
    /// hundred bytes; each subscriber holds one such channel.
    feed: Mutex<Option<mpsc::Receiver<Box<GqlEvent>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Capture {
    /// Hands `captured` to the executor and returns the feed to resolve to; or, when
    /// it cannot (already handed, or the executor is gone), the events themselves.
    pub(super) fn hand_over(&self, captured: Captured) -> BoxStream<'static, GqlEvent> {
        let (Some(feed), Some(handed)) = (lock(&self.feed).take(), lock(&self.handed).take()) else {
            return captured.events;
        };
        match handed.send(captured) {
            Ok(()) => tokio_stream::wrappers::ReceiverStream::new(feed).map(|e| *e).boxed(),
            Err(c) => c.events,
        }
    }
}

/// A page's renderings for one request shape, one cell per event of the page: each
/// the JSON text of the event's response, as the first subscriber of the shape made it.
struct Renders(Vec<OnceLock<Arc<str>>>);

/// The `data` of the response a stream yields in place of a shared rendering. No
/// execution makes it: a response's data is an object, or null.
fn placeholder() -> Response {
    Response::new(Value::String(String::new()))
}

/// How async-graphql's handler ends a message framing [`placeholder`] (both
/// protocols: `{"type":"next"|"data","id":…,"payload":{"data":""}}`).
const PLACEHOLDER: &str = r#","payload":{"data":""}}"#;

/// A socket's shared rendering on its way from a stream to the message the handler
/// frames around its placeholder (module docs).
#[derive(Clone, Default)]
pub(crate) struct Spliced(Arc<Mutex<Option<Arc<str>>>>);

impl Spliced {
    fn leave(&self, text: Arc<str>) {
        *lock(&self.0) = Some(text);
    }

    /// `message` as the handler framed it, with the shared rendering left for it in
    /// place of its placeholder; any other message as it is.
    pub(crate) fn splice(&self, message: String) -> String {
        let Some(text) = lock(&self.0).take() else { return message };
        if let Some(head) = message.strip_suffix(PLACEHOLDER) {
            let mut out = String::with_capacity(head.len() + text.len() + 12);
            out.push_str(head);
            out.push_str(r#","payload":"#);
            out.push_str(&text);
            out.push('}');
            return out;
        }
        // Another framing (a newer async-graphql): the same, the slow way.
        let spliced = serde_json::from_str::<serde_json::Value>(&message).and_then(|mut m| {
            m["payload"] = serde_json::from_str(&text)?;
            serde_json::to_string(&m)
        });
        spliced.unwrap_or_else(|e| {
            tracing::error!(error = %e, "a shared GraphQL rendering could not be put in its message");
            message
        })
    }
}

/// The key of a request's renderings: its query, operation and variables, without the
/// variable that gave `afterSeq`. `None` (nothing shared) if the variables do not
/// serialize.
fn shape(
    query: &str,
    operation: Option<&str>,
    variables: &async_graphql::Variables,
    cursor: Option<&str>,
) -> Option<Arc<str>> {
    let mut vars = variables.clone();
    if let Some(v) = cursor {
        vars.remove(&Name::new(v));
    }
    let vars = serde_json::to_string(&vars).ok()?;
    let op = operation.unwrap_or_default();
    // Length-prefixed, so that no two different requests make the same key.
    Some(format!("{}:{query}{}:{op}{vars}", query.len(), op.len()).into())
}

/// The schema, run so that `runEvents` subscribers share renderings (module docs);
/// the metrics count the renderings made, and the socket's messages take the shared
/// texts from the [`Spliced`].
#[derive(Clone)]
pub(crate) struct Sharing(pub AgentSchema, pub Arc<Metrics>, pub Spliced);

impl Executor for Sharing {
    fn execute(&self, request: Request) -> impl Future<Output = Response> + Send {
        let schema = self.0.clone();
        async move { schema.execute(request).await }
    }

    fn execute_stream(
        &self,
        request: Request,
        session_data: Option<Arc<Data>>,
    ) -> BoxStream<'static, Response> {
        let (query, operation, variables) =
            (request.query.clone(), request.operation_name.clone(), request.variables.clone());
        let (handed_tx, mut handed) = oneshot::channel();
        let (feed, feed_rx) = mpsc::channel(1);
        let capture = Capture { handed: Mutex::new(Some(handed_tx)), feed: Mutex::new(Some(feed_rx)) };
        let mut own =
            self.0.execute_stream_with_session_data(request.data(capture), session_data.unwrap_or_default());
        let (metrics, spliced) = (self.1.clone(), self.2.clone());
        async_stream::stream! {
            /// What came first.
            enum First {
                Response(Option<Response>),
                Handed(Option<Captured>),
            }
            // `runEvents` hands over while its execution is first polled; any other
            // operation either answers or keeps the capture unused until it ends.
            let first = tokio::select! {
                r = own.next() => First::Response(r),
                c = &mut handed => First::Handed(c.ok()),
            };
            let captured = match first {
                First::Response(None) => return,
                First::Response(Some(r)) => {
                    yield r;
                    None
                }
                First::Handed(c) => c,
            };
            let Some(Captured { mut events, cursor_variable }) = captured else {
                while let Some(r) = own.next().await {
                    yield r;
                }
                return;
            };
            let key = shape(&query, operation.as_deref(), &variables, cursor_variable.as_deref());
            while let Some(event) = events.next().await {
                let memo = key.as_ref().zip(event.page()).and_then(|(key, (page, i))| {
                    page.memo(key, |n| Renders((0..n).map(|_| OnceLock::new()).collect())).map(|m| (m, i))
                });
                if let Some(shared) = memo.as_ref().and_then(|(m, i)| m.0[*i].get()) {
                    spliced.leave(shared.clone());
                    yield placeholder();
                    continue;
                }
                if feed.send(Box::new(event)).await.is_err() {
                    return;
                }
                metrics.graphql_renders.fetch_add(1, Relaxed);
                let Some(response) = own.next().await else { return };
                let text = memo.and_then(|m| Some((m, serde_json::to_string(&response).ok()?)));
                let Some(((m, i), text)) = text else {
                    yield response;
                    continue;
                };
                // Offered to the others; nobody waits for it (a subscriber whose socket
                // is stuck would make them wait too). Another worker's subscriber that
                // rendered it meanwhile keeps its own.
                let text: Arc<str> = text.into();
                let _ = m.0[i].set(text.clone());
                spliced.leave(text);
                yield placeholder();
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use async_graphql::Variables;
    use serde_json::json;

    use super::{placeholder, shape, Spliced};

    /// The placeholder as the protocol handler frames it, for `type` and `id`.
    fn framed(kind: &str, id: &str) -> String {
        let payload = serde_json::to_value(placeholder()).expect("a response serializes");
        serde_json::to_string(&json!({"type": kind, "id": id, "payload": payload})).expect("json")
    }

    /// The shared text takes the placeholder's place in either protocol's message, under
    /// the message's own id; a message with nothing left for it passes as it is.
    #[test]
    fn a_shared_rendering_is_put_in_place_of_the_placeholder() {
        let text = r#"{"data":{"runEvents":{"seq":3,"payload":{"text":"a \"b\"}"}}}}"#;
        let spliced = Spliced::default();
        for (kind, id) in [("next", "1"), ("data", r#"a "quoted" id"#)] {
            spliced.leave(text.into());
            let got: serde_json::Value =
                serde_json::from_str(&spliced.splice(framed(kind, id))).expect("the message is JSON");
            let want = json!({"type": kind, "id": id, "payload": serde_json::from_str::<serde_json::Value>(text).expect("json")});
            assert_eq!(got, want);
        }
        let ack = r#"{"type":"connection_ack"}"#.to_owned();
        assert_eq!(spliced.splice(ack.clone()), ack, "nothing was left, so nothing is put in");
        // A framing other than the handler's (fields in another order) gets it too.
        spliced.leave(text.into());
        let other = r#"{"payload":{"data":""},"id":"9","type":"next"}"#.to_owned();
        let got: serde_json::Value = serde_json::from_str(&spliced.splice(other)).expect("json");
        assert_eq!(got["payload"]["data"]["runEvents"]["seq"], 3);
        assert_eq!(got["id"], "9");
    }

    fn vars(v: serde_json::Value) -> Variables {
        Variables::from_json(v)
    }

    /// Requests that differ only in the cursor's variable share a key; any other
    /// difference, however the parts are cut, makes another.
    #[test]
    fn a_shape_leaves_out_the_cursor_variable_and_nothing_else() {
        let q = "subscription($r: ID!, $a: Int) { runEvents(runId: $r, afterSeq: $a) { seq } }";
        let at = |a: i64| shape(q, None, &vars(json!({"r": "x", "a": a})), Some("a")).expect("a key");
        assert_eq!(at(1), at(7));
        assert_ne!(at(1), shape(q, None, &vars(json!({"r": "y", "a": 1})), Some("a")).expect("a key"));
        assert_ne!(at(1), shape(q, None, &vars(json!({"r": "x", "a": 1})), None).expect("a key"));
        assert_ne!(at(1), shape(q, Some("Op"), &vars(json!({"r": "x", "a": 1})), Some("a")).expect("a key"));
        let none = Variables::default();
        assert_ne!(shape("ab", Some("c"), &none, None), shape("a", Some("bc"), &none, None));
    }
}
