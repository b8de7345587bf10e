//! OpenTelemetry tracing, off unless the standard `OTEL_*` variables ask for it: an
//! OTLP exporter (`OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT`; protocol
//! `http/protobuf`, or `http/json` by `OTEL_EXPORTER_OTLP_PROTOCOL`) behind
//! `tracing-opentelemetry`, so the service's `tracing` spans become OTel spans.
//!
//! One trace follows an append: the request (whose W3C `traceparent` it continues),
//! `append`, `commit`, `notify`, and a `deliver` span for each live subscriber's
//! hand-over. The delivery happens in other tasks, so [`Traces`] remembers the trace of
//! each run's recent appends by seq range, for the transports to find; a delivery that
//! comes before its append's trace is known (the row writer wakes subscribers as it
//! commits) is held until the append registers it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// True when the environment asks for traces (an OTLP endpoint, and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`).
pub fn configured() -> bool {
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"));
    endpoint.is_some()
        && env("OTEL_SDK_DISABLED").is_none_or(|v| v != "true")
        && env("OTEL_TRACES_EXPORTER").is_none_or(|v| v != "none")
}

/// The `tracing` layer exporting spans, when [`configured`]; call [`shutdown`] before
/// the process exits so the last spans are sent.
pub fn layer<S>() -> anyhow::Result<Option<impl tracing_subscriber::Layer<S>>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    if !configured() {
        return Ok(None);
    }
    let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL `{other}` is not supported: use http/protobuf or http/json"
        ),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(protocol).build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("agent-stream");
    }
    let provider =
        SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("agent-stream");
    let _ = PROVIDER.set(provider);
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// Sends what is buffered and stops the exporter.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        if let Err(e) = p.shutdown() {
            eprintln!("warning: the OpenTelemetry exporter did not shut down cleanly: {e}");
        }
    }
}

/// Makes `span` continue the W3C trace in `headers` (`traceparent`), if any.
pub fn continue_trace(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if PROVIDER.get().is_none() || !headers.contains_key("traceparent") {
        return;
    }
    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl opentelemetry::propagation::Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    let _ = span.set_parent(parent);
}

/// Appends remembered per run: a subscriber's delivery of seq N finds its append's trace.
const PER_RUN: usize = 64;
/// Runs remembered; the oldest go first.
const RUNS: usize = 4096;
/// Early deliveries held for runs not (yet) appended to here, across all of them.
const UNKNOWN: usize = 1024;

/// What is remembered of one run.
#[derive(Default)]
struct Run {
    /// Recent appends: first seq, last seq, trace context.
    appends: VecDeque<(i64, i64, Context)>,
    /// Deliveries that came before their append's trace was known (seq, transport):
    /// the row writer wakes a run's subscribers as it commits, and the appender's task
    /// registers its trace only once it runs on its answer, so under load the delivery
    /// often wins. They get their span when the append registers, or are forgotten
    /// after [`PER_RUN`] more (an append by another process, or a replay of old events,
    /// never registers here).
    early: VecDeque<(i64, &'static str)>,
}

/// Everything [`Traces`] remembers.
#[derive(Default)]
struct State {
    /// The runs appended to here.
    by_run: HashMap<String, Run>,
    /// Their ids in the order they were first appended to (for eviction).
    order: VecDeque<String>,
    /// Early deliveries of runs with no append here yet (a new run's first events, or
    /// runs another process writes): kept apart, so that they take no place among
    /// [`RUNS`] and evict no run appended to here.
    unknown: VecDeque<(String, i64, &'static str)>,
}

/// The trace contexts of recent appends, by run and seq range (empty when tracing is off).
#[derive(Default)]
pub struct Traces {
    state: Mutex<State>,
}

/// Keeps the last `cap` of `queue`.
fn push_capped<T>(queue: &mut VecDeque<T>, item: T, cap: usize) {
    queue.push_back(item);
    if queue.len() > cap {
        queue.pop_front();
    }
}

impl Traces {
    /// Remembers that the current span's trace wrote `first..=last` of `run`, and
    /// records the deliveries of those seqs that came first.
    pub fn appended(&self, run: &str, first: i64, last: i64) {
        if PROVIDER.get().is_none() {
            return;
        }
        let cx = tracing::Span::current().context();
        if !cx.span().span_context().is_valid() {
            return;
        }
        let mut early = vec![];
        {
            let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let State { by_run, order, unknown } = &mut *guard;
            if !by_run.contains_key(run) {
                while order.len() >= RUNS {
                    if let Some(old) = order.pop_front() {
                        by_run.remove(&old);
                    }
                }
                order.push_back(run.to_owned());
                // What was held for the run before it was known becomes its own.
                let mut new = Run::default();
                unknown.retain(|(r, seq, transport)| {
                    let mine = r == run;
                    if mine {
                        push_capped(&mut new.early, (*seq, *transport), PER_RUN);
                    }
                    !mine
                });
                by_run.insert(run.to_owned(), new);
            }
            let Some(entry) = by_run.get_mut(run) else { return };
            push_capped(&mut entry.appends, (first, last, cx.clone()), PER_RUN);
            entry.early.retain(|&(seq, transport)| {
                let mine = (first..=last).contains(&seq);
                if mine {
                    early.push((seq, transport));
                }
                !mine
            });
        }
        for (seq, transport) in early {
            deliver_span(&cx, run, seq, transport);
        }
    }

    /// Records `seq` of `run` handed to a subscriber through `transport`, in its
    /// append's trace (now, or when the append registers).
    pub fn delivered(&self, run: &str, seq: i64, transport: &'static str) {
        if PROVIDER.get().is_none() {
            return;
        }
        let cx = {
            let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let State { by_run, unknown, .. } = &mut *guard;
            match by_run.get_mut(run) {
                None => {
                    push_capped(unknown, (run.to_owned(), seq, transport), UNKNOWN);
                    None
                }
                Some(entry) => {
                    let cx = entry
                        .appends
                        .iter()
                        .find(|(f, l, _)| (*f..=*l).contains(&seq))
                        .map(|(_, _, c)| c.clone());
                    if cx.is_none() {
                        push_capped(&mut entry.early, (seq, transport), PER_RUN);
                    }
                    cx
                }
            }
        };
        if let Some(cx) = cx {
            deliver_span(&cx, run, seq, transport);
        }
    }
}

/// One `deliver` span, below the append's `notify`.
fn deliver_span(cx: &Context, run: &str, seq: i64, transport: &'static str) {
    let span = tracing::info_span!(target: crate::storage::TRACES, "deliver", run_id = run, seq, transport);
    let _ = span.set_parent(cx.clone());
    span.in_scope(|| {});
}
