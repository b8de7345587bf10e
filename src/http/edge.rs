//! What every route does around its handler, in one layer: it refuses a NUL in the
//! request's URI, and counts the request by route, method and status with the time to
//! its response's head.
//!
//! Hand-written rather than two `axum::middleware::from_fn`s: each of those boxes a
//! clone of the stack below it on every request, and with the router's other layers
//! applied one `Router::layer` at a time (a boxed route per layer) the stack cost a
//! `GET /healthz` about 13 µs of the server's 29 on a slow host, a quarter of a single
//! append's (docs/benchmarks-log.md, 2026-11-30 15:07). This one is a plain future.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};

use crate::metrics::Metrics;

/// The layer: [`Edge`] around each route.
#[derive(Clone)]
pub struct EdgeLayer {
    metrics: Arc<Metrics>,
}

impl EdgeLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> EdgeLayer {
        EdgeLayer { metrics }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge { inner, metrics: self.metrics.clone() }
    }
}

/// A route with its NUL check and its count.
#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Counted<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let started = Instant::now();
        let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
        let method = method_label(req.method());
        let step = match refused(&req) {
            Some(refusal) => Step::Refused { refusal: Some(refusal) },
            None => Step::Inner { future: self.inner.call(req) },
        };
        Counted { step, started, route, method, metrics: self.metrics.clone() }
    }
}

/// A bounded set of method labels: a client's made-up method does not make a series.
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The answer to a URI whose path or query string decodes to a NUL (`TEXT-NUL`), before
/// any handler sees it: one check for every parameter.
fn refused(req: &Request) -> Option<Response> {
    use crate::domain::text::{nul_rejection, uri_has_nul};
    let uri = req.uri();
    let place = if uri_has_nul(uri.path()) {
        "the request path"
    } else if uri.query().is_some_and(uri_has_nul) {
        "the query string"
    } else {
        return None;
    };
    Some(super::error::HttpError::from(nul_rejection(place)).into_response())
}

pin_project_lite::pin_project! {
    /// A route's response, counted when its head is ready.
    pub struct Counted<F> {
        #[pin]
        step: Step<F>,
        started: Instant,
        // Never the raw path: ids would make a series per run.
        route: Option<String>,
        method: &'static str,
        metrics: Arc<Metrics>,
    }
}

pin_project_lite::pin_project! {
    #[project = StepProj]
    enum Step<F> {
        Refused { refusal: Option<Response> },
        Inner { #[pin] future: F },
    }
}

impl<F> Future for Counted<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = match this.step.project() {
            StepProj::Refused { refusal } => refusal.take().unwrap_or_else(|| {
                // Polled again after it answered: a caller's bug, never a panic.
                super::error::HttpError::from(crate::error::Error::Internal(anyhow::anyhow!(
                    "a refused request was polled after its answer"
                )))
                .into_response()
            }),
            StepProj::Inner { future } => match future.poll(cx) {
                Poll::Ready(Ok(r)) => r,
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => return Poll::Pending,
            },
        };
        let route = this.route.take().unwrap_or_else(|| "unmatched".to_owned());
        let labels =
            crate::metrics::HttpRequest { route, method: this.method, status: resp.status().as_u16() };
        this.metrics.http_requests.get_or_create(&labels).observe(this.started.elapsed().as_secs_f64());
        Poll::Ready(Ok(resp))
    }
}
