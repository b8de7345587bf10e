//! Each request's span: its handler runs inside it, its response is logged under it, and
//! it lasts as long as the response's body (a trace's `request` span covers the stream).
//!
//! Hand-written rather than tower-http's `TraceLayer`, which enters the request span on
//! every poll of the response body as well. A live stream's body is polled once or more
//! per page for every subscriber, and at the default log level (`info`, where the span
//! is enabled) those entries cost ~2,000 instructions of the ~10,100 that one more
//! subscriber of a page cost (docs/benchmarks-log.md, 2026-12-05 23:10). Here a body is
//! polled outside the span; what a stream logs names its request's span as its parent
//! (the span current when the stream was built), so its lines keep the request's context.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::HeaderName;
use axum::response::{IntoResponse, Response};
use http_body_util::combinators::UnsyncBoxBody;
use tracing::Span;

/// Where the request lines go: `AGENT_STREAM_LOG=...,agent_stream::requests=debug` shows them.
pub const TARGET: &str = "agent_stream::requests";

/// The layer: [`Traced`] around the routes.
#[derive(Clone)]
pub struct TracedLayer {
    /// The header the request id is read from (set by an outer layer).
    request_id: HeaderName,
}

impl TracedLayer {
    /// Spans named by the request id in `request_id`.
    pub fn new(request_id: HeaderName) -> TracedLayer {
        TracedLayer { request_id }
    }
}

impl<S> tower::Layer<S> for TracedLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner, request_id: self.request_id.clone() }
    }
}

/// The routes, each request in a span of its own.
#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
    request_id: HeaderName,
}

impl<S> tower::Service<Request> for Traced<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let id = req.headers().get(&self.request_id).and_then(|v| v.to_str().ok()).unwrap_or("-");
        // Method and path only: a query string may carry `access_token`.
        let span = tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id);
        crate::telemetry::continue_trace(&span, req.headers());
        let future = span.in_scope(|| self.inner.call(req));
        TracedFuture { future, span: Some(span), started: Instant::now() }
    }
}

pin_project_lite::pin_project! {
    /// A request's handler, polled inside its span; its response's body holds the span.
    pub struct TracedFuture<F> {
        #[pin]
        future: F,
        span: Option<Span>,
        started: Instant,
    }
}

impl<F> Future for TracedFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(span) = this.span.take() else {
            // Polled after its answer: a caller's bug, answered rather than a panic.
            return Poll::Ready(Ok(super::error::HttpError::from(crate::error::Error::Internal(
                anyhow::anyhow!("a request's future was polled after its answer"),
            ))
            .into_response()));
        };
        let polled = span.in_scope(|| this.future.poll(cx));
        let resp = match polled {
            Poll::Ready(Ok(r)) => r,
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => {
                *this.span = Some(span);
                return Poll::Pending;
            }
        };
        let latency = this.started.elapsed();
        let status = resp.status();
        // Every answer at debug and a server error at error, as tower-http's `TraceLayer`
        // logged them; but a 503 at warn: it asks the client to retry (the database
        // away, the process draining), and its cause is logged at warn where it arose.
        if status == axum::http::StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(target: TARGET, parent: &span, status = status.as_u16(), ?latency, "response failed");
        } else if status.is_server_error() {
            tracing::error!(target: TARGET, parent: &span, status = status.as_u16(), ?latency, "response failed");
        } else {
            tracing::debug!(target: TARGET, parent: &span, status = status.as_u16(), ?latency, "finished processing request");
        }
        // Boxed with axum's error type so `Body::new` keeps the box rather than wrapping
        // an error map around it, polled on every poll of a stream's body.
        Poll::Ready(Ok(resp.map(|inner| Body::new(UnsyncBoxBody::new(SpanHeld { inner, span })))))
    }
}

pin_project_lite::pin_project! {
    /// A response's body with its request's span, which ends when the body is dropped.
    /// Not entered while polled (see the module's doc); a body that fails logs it there.
    pub struct SpanHeld {
        #[pin]
        inner: Body,
        span: Span,
    }
}

impl HttpBody for SpanHeld {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let this = self.project();
        let span: &Span = this.span;
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &polled {
            // The head went out as a success; the client sees a cut-off body.
            tracing::error!(target: TARGET, parent: span, error = %e, "response body failed");
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use axum::routing::get;
    use tower::ServiceExt;
    use tracing_subscriber::prelude::*;

    /// What each answer logs at `info`: nothing for a success, a warning for a 503 (the
    /// client is to retry), an error for any other 5xx and for a body cut off by an
    /// error; each line with its request's method, path and id.
    #[test]
    fn answers_are_logged_at_their_level_with_the_requests_context() {
        let _one = crate::log_capture::one_subscriber_at_a_time();
        let cut = || async {
            let parts: Vec<Result<bytes::Bytes, std::io::Error>> =
                vec![Ok(bytes::Bytes::from_static(b"part")), Err(std::io::Error::other("export failed"))];
            axum::body::Body::from_stream(futures::stream::iter(parts))
        };
        let router = axum::Router::new()
            .route("/ok", get(|| async { "fine" }))
            .route("/busy", get(|| async { StatusCode::SERVICE_UNAVAILABLE }))
            .route("/broken", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
            .route("/cut", get(cut))
            .layer(super::TracedLayer::new(axum::http::HeaderName::from_static("x-request-id")));
        let buf = crate::log_capture::LogBuf::default();
        let writer = buf.clone();
        let log = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        );
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        tracing::subscriber::with_default(log, || {
            rt.block_on(async {
                for path in ["/ok", "/busy", "/broken", "/cut"] {
                    let req = axum::http::Request::get(path)
                        .header("x-request-id", format!("id{path}"))
                        .body(axum::body::Body::empty())
                        .expect("request");
                    let resp = router.clone().oneshot(req).await.expect("infallible");
                    // The body is read to its end (or its error), as hyper would.
                    let _ = axum::body::to_bytes(resp.into_body(), 1 << 20).await;
                }
            })
        });
        let text = buf.text();
        let line = |path: &str| text.lines().find(|l| l.contains(&format!("id{path}"))).map(str::to_owned);
        assert_eq!(line("/ok"), None, "a success is not logged at info: {text}");
        let busy = line("/busy").expect("a 503 is logged");
        assert!(
            busy.contains("WARN") && busy.contains("status=503") && busy.contains("path=/busy"),
            "{busy}"
        );
        let broken = line("/broken").expect("a 500 is logged");
        assert!(broken.contains("ERROR") && broken.contains("status=500"), "{broken}");
        let cut = line("/cut").expect("a failed body is logged");
        assert!(
            cut.contains("ERROR") && cut.contains("export failed") && cut.contains("method=GET"),
            "{cut}"
        );
    }
}
