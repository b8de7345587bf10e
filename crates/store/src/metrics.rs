//! A process's metrics: plain atomics for the counters bumped on hot paths, and
//! `prometheus-client` histograms and labelled families for what needs a distribution
//! or a label. The layers record where things happen (the store's group commit, live
//! delivery, the service's operations); the service renders them at `GET /metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use agent_stream_core::domain::Event;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// How an append ended (the `outcome` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `written`, `replayed` or `rejected`.
    pub outcome: &'static str,
}

/// Which transport a live subscriber reads through (the `transport` label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Transport {
    /// `sse`, `graphql_ws`, `seed_ws` or `grpc`.
    pub transport: &'static str,
}

impl Transport {
    /// Server-Sent Events (`GET /v1/runs/{id}/stream`).
    pub const SSE: Transport = Transport { transport: "sse" };
    /// GraphQL subscriptions over WebSocket.
    pub const GRAPHQL_WS: Transport = Transport { transport: "graphql_ws" };
    /// Seed 004's WebSocket profile (`koder-agent-stream-v1`).
    pub const SEED_WS: Transport = Transport { transport: "seed_ws" };
    /// Seed 004's gRPC profile (`agent.v1.AgentRun/Stream`).
    pub const GRPC: Transport = Transport { transport: "grpc" };
}

/// One HTTP request's labels: the matched route template (never the raw path, whose
/// ids would make a series per run), the method and the status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRequest {
    /// E.g. `/v1/runs/{run_id}/events`; `unmatched` for a path no route has.
    pub route: String,
    /// The method; `other` for one outside the standard ones.
    pub method: &'static str,
    /// The status code.
    pub status: u16,
}

/// Latency bucket bounds in seconds: 100 µs to about 54 s, doubling.
fn latency_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 20)
}

/// A latency histogram with [`latency_bounds`].
fn latency() -> Histogram {
    Histogram::new(latency_bounds())
}

/// A latency histogram (the buckets of `latency_bounds`) that takes a batch of observations
/// at once, without a lock.
///
/// Hand-written because `prometheus-client`'s `Histogram` takes a mutex per
/// observation and has no batch form: live delivery records every event handed to
/// every subscriber, and at 1,000 subscribers of a run at 1,000 events/s that was a
/// million lock round trips a second, shared by the runtime's workers (3–4% of the
/// server's CPU). Here a page of events costs one atomic add per bucket it touches.
#[derive(Clone, Debug)]
pub struct Latencies(Arc<LatencyCells>);

#[derive(Debug)]
struct LatencyCells {
    /// Upper bounds in seconds, the last `+Inf`.
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative).
    counts: Vec<AtomicU64>,
    /// The sum of all observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

impl Default for Latencies {
    fn default() -> Self {
        let bounds: Vec<f64> = latency_bounds().chain([f64::INFINITY]).collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        Latencies(Arc::new(LatencyCells { bounds, counts, sum_nanos: AtomicU64::new(0) }))
    }
}

impl Latencies {
    /// Records every duration of `took`.
    pub fn observe_all(&self, took: impl IntoIterator<Item = Duration>) {
        let cells = &*self.0;
        // (bucket, count) runs: a page's events mostly share a bucket.
        let (mut run, mut sum) = (None::<(usize, u64)>, 0u64);
        for d in took {
            let secs = d.as_secs_f64();
            sum = sum.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            let i = cells.bounds.iter().position(|b| secs <= *b).unwrap_or(cells.bounds.len() - 1);
            run = match run {
                Some((j, n)) if j == i => Some((j, n + 1)),
                Some((j, n)) => {
                    cells.counts[j].fetch_add(n, Relaxed);
                    Some((i, 1))
                }
                None => Some((i, 1)),
            };
        }
        if let Some((j, n)) = run {
            cells.counts[j].fetch_add(n, Relaxed);
            cells.sum_nanos.fetch_add(sum, Relaxed);
        }
    }
}

impl prometheus_client::metrics::TypedMetric for Latencies {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for Latencies {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
        let cells = &*self.0;
        let buckets: Vec<(f64, u64)> =
            cells.bounds.iter().zip(&cells.counts).map(|(b, c)| (*b, c.load(Relaxed))).collect();
        // Read after the buckets: a scrape racing a batch may count it in the buckets
        // and not yet in the sum, never the other way round in the count.
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = cells.sum_nanos.load(Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// Group sizes: 1, 2, 4, ... 1024 appends per transaction.
fn sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// Counters and gauges of one process.
pub struct Metrics {
    /// Append requests that wrote (control actions and imports included).
    pub appends: AtomicU64,
    /// Append requests answered from stored events (idempotent retries).
    pub appends_replayed: AtomicU64,
    /// Append requests refused (validation, conflicts, rate limits).
    pub appends_rejected: AtomicU64,
    /// Events written.
    pub events: AtomicU64,
    /// Bytes of append request bodies accepted over HTTP.
    pub append_bytes: AtomicU64,
    /// Append requests refused by the per-tenant rate limit.
    pub rate_limited: AtomicU64,
    /// Open live streams (SSE, WebSocket subscriptions).
    pub subscribers: AtomicI64,
    /// Deltas dropped for slow SSE clients.
    pub dropped_deltas: AtomicU64,
    /// Notifications this process received for runs or tenants it serves (its own
    /// included: PostgreSQL delivers a NOTIFY to every listener, the sender's too).
    pub notifications: AtomicU64,
    /// Transactions that committed appends, and appends they carried (the group-commit
    /// size is their ratio).
    pub commit_groups: AtomicU64,
    /// GraphQL `runEvents` events rendered by a subscription's own execution; the
    /// others it sent were copies of a rendering shared with subscribers asking the same.
    pub graphql_renders: AtomicU64,
    /// Seconds an append took in the service, by outcome.
    pub append_seconds: Family<Outcome, Histogram, fn() -> Histogram>,
    /// Appends per committed transaction.
    pub commit_group_size: Histogram,
    /// Seconds an append waited in its group-commit lane before its group went out.
    pub commit_wait_seconds: Latencies,
    /// Seconds a lane's group took from going out to its answers.
    pub commit_seconds: Latencies,
    /// Seconds from a NOTIFY's sending to its receipt by this process's listener.
    pub notify_lag_seconds: Histogram,
    /// Seconds from an event's append (its server timestamp) to its hand-over to a
    /// subscriber's transport, by transport; events appended while it was subscribed.
    pub delivery_seconds: Family<Transport, Latencies>,
    /// Open live subscriptions, by transport.
    pub subscribers_by: Family<Transport, Gauge>,
    /// HTTP requests by route, method and status, with the seconds to their response's
    /// head (a stream's whole life is not a request's latency).
    pub http_requests: Family<HttpRequest, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            appends: AtomicU64::default(),
            appends_replayed: AtomicU64::default(),
            appends_rejected: AtomicU64::default(),
            events: AtomicU64::default(),
            append_bytes: AtomicU64::default(),
            rate_limited: AtomicU64::default(),
            subscribers: AtomicI64::default(),
            dropped_deltas: AtomicU64::default(),
            notifications: AtomicU64::default(),
            commit_groups: AtomicU64::default(),
            graphql_renders: AtomicU64::default(),
            append_seconds: Family::new_with_constructor(latency),
            commit_group_size: sizes(),
            commit_wait_seconds: Latencies::default(),
            commit_seconds: Latencies::default(),
            notify_lag_seconds: latency(),
            delivery_seconds: Family::default(),
            subscribers_by: Family::default(),
            http_requests: Family::new_with_constructor(latency),
        };
        // Every transport's series from the start, so a scrape shows 0 rather than nothing.
        for t in [Transport::SSE, Transport::GRAPHQL_WS, Transport::SEED_WS, Transport::GRPC] {
            m.subscribers_by.get_or_create(&t).set(0);
        }
        m
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Records one notification's lag.
    pub fn notify_lag(&self, lag: Duration) {
        self.notifications.fetch_add(1, Relaxed);
        self.notify_lag_seconds.observe(lag.as_secs_f64());
    }

    /// Records a transaction that committed `appends` appends.
    pub fn committed_group(&self, appends: u64) {
        self.commit_groups.fetch_add(1, Relaxed);
        self.commit_group_size.observe(appends as f64);
    }

    /// Records an append's time in the service by its outcome.
    pub fn append_took(&self, outcome: &'static str, took: Duration) {
        self.append_seconds.get_or_create(&Outcome { outcome }).observe(took.as_secs_f64());
    }

    /// A live subscription through `transport`: counted open until the value drops,
    /// and the recorder of its deliveries.
    pub fn subscription(self: &std::sync::Arc<Self>, transport: Transport) -> Delivery {
        self.subscribers_by.get_or_create(&transport).inc();
        // The histogram itself, looked up once: a lookup per delivered event took the
        // family's lock a million times a second at 1,000 subscribers.
        let latency = self.delivery_seconds.get_or_create(&transport).clone();
        Delivery { metrics: self.clone(), transport, since: chrono::Utc::now(), latency }
    }
}

/// One open subscription's share of the metrics (see [`Metrics::subscription`]).
pub struct Delivery {
    metrics: std::sync::Arc<Metrics>,
    transport: Transport,
    since: chrono::DateTime<chrono::Utc>,
    latency: Latencies,
}

impl Delivery {
    /// Records `e` handed to the transport. Events from before the subscription (its
    /// catch-up) are history, not latency, and are not recorded.
    pub fn delivered(&self, e: &Event) {
        self.delivered_all(std::slice::from_ref(e));
    }

    /// Records `events`, handed to the transport together, against one reading of the
    /// clock (a subscriber of a busy run takes pages of many events, and the clock was
    /// a few percent of the server's CPU when read per event at 1,000 subscribers).
    pub fn delivered_all(&self, events: &[Event]) {
        self.record(events.iter().map(|e| e.ts.timestamp_micros()));
    }

    /// [`Delivery::delivered_all`] for events whose commit times are given in whole
    /// microseconds since the epoch, as a live page holds them for all its subscribers:
    /// converting each event's `DateTime` per subscriber was ~450 instructions of the
    /// ~7,400 one more subscriber of a page costs (docs/benchmarks-log.md, 2026-12-03).
    pub fn delivered_at(&self, ts_micros: &[i64]) {
        self.record(ts_micros.iter().copied());
    }

    fn record(&self, ts_micros: impl Iterator<Item = i64>) {
        // The system clock read as microseconds directly: chrono's `Utc::now` builds a
        // calendar date only for it to be turned back into a count.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        // Event times are in milliseconds: compare at that precision.
        let since = self.since.timestamp_millis().saturating_mul(1000);
        self.latency.observe_all(
            ts_micros
                .filter(|ts| *ts >= since)
                .map(|ts| Duration::from_micros(u64::try_from(now - ts).unwrap_or(0))),
        );
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.metrics.subscribers_by.get_or_create(&self.transport).dec();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::{Metric, Registry};

    use super::{latency, Latencies};

    /// A subscription records how old each event is when it is handed over, in the
    /// histogram's seconds, and leaves out what was committed before it opened.
    #[test]
    fn a_delivery_records_the_age_of_the_events_since_it_opened_only() {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = std::sync::Arc::new(super::Metrics::default());
        let mut d = metrics.subscription(super::Transport::SSE);
        let running = serde_json::json!({"type": "run.lifecycle", "payload": {"state": "running"}});
        let mut evs = agent_stream_core::testkit::stored(&[running.clone(), running.clone(), running]);
        let ms = chrono::Duration::milliseconds;
        let now = chrono::Utc::now();
        // Stored times are whole milliseconds.
        let at = |ago: i64| {
            chrono::DateTime::from_timestamp_millis((now - ms(ago)).timestamp_millis()).expect("a time")
        };
        // Opened a second ago: the first event was committed before that.
        d.since = now - ms(1_000);
        evs[0].ts = at(60_000);
        evs[1].ts = at(250);
        evs[2].ts = at(40);
        let before = std::time::Instant::now();
        d.delivered_all(&evs);
        let slack = before.elapsed() + Duration::from_millis(2);
        let cells = &*d.latency.0;
        let counted: u64 = cells.counts.iter().map(|c| c.load(Relaxed)).sum();
        assert_eq!(counted, 2, "the event from before the subscription is history");
        let sum = Duration::from_nanos(cells.sum_nanos.load(Relaxed));
        let least = Duration::from_millis(290);
        assert!(
            sum >= least - Duration::from_millis(2) && sum <= least + slack + Duration::from_millis(50),
            "{sum:?}"
        );
        // The same events given by their commit times, as a live page holds them.
        let micros: Vec<i64> = evs.iter().map(|e| e.ts.timestamp_micros()).collect();
        d.delivered_at(&micros);
        let counted: u64 = cells.counts.iter().map(|c| c.load(Relaxed)).sum();
        assert_eq!(counted, 4, "the same two recorded again, the one from before left out again");
        let twice = Duration::from_nanos(cells.sum_nanos.load(Relaxed));
        assert!(
            twice >= sum + least - Duration::from_millis(2)
                && twice <= sum + least + slack + Duration::from_millis(60),
            "{twice:?}"
        );
    }

    fn text(m: impl Metric) -> String {
        let mut r = Registry::default();
        r.register("delivery_seconds", "h", m);
        let mut s = String::new();
        encode(&mut s, &r).expect("encode");
        s
    }

    /// Scrapers and the load tool read the batch histogram as they read the library's:
    /// the same buckets (bounds included) and count for the same observations, and the
    /// same sum but for float rounding.
    #[test]
    fn latencies_encode_as_the_librarys_histogram_of_the_same_observations() {
        let ms = |m: f64| Duration::from_secs_f64(m / 1000.0);
        let took =
            [ms(0.0), ms(0.05), ms(0.1), ms(0.15), ms(3.0), ms(3.0), ms(3.1), ms(2_000.0), ms(100_000.0)];
        let (ours, theirs) = (Latencies::default(), latency());
        // Two batches, the second in a different bucket order, as pages come.
        ours.observe_all(took[..4].iter().copied());
        ours.observe_all(took[4..].iter().rev().copied());
        for d in took {
            theirs.observe(d.as_secs_f64());
        }
        let (ours, theirs) = (text(ours), text(theirs));
        let (sum_ours, rest_ours): (Vec<&str>, Vec<&str>) = ours.lines().partition(|l| l.contains("_sum"));
        let (sum_theirs, rest_theirs): (Vec<&str>, Vec<&str>) =
            theirs.lines().partition(|l| l.contains("_sum"));
        assert_eq!(rest_ours, rest_theirs);
        assert!(rest_ours.iter().any(|l| l.contains("le=\"0.0002\"} 4")), "{ours}");
        let value =
            |l: &[&str]| -> f64 { l[0].rsplit(' ').next().and_then(|v| v.parse().ok()).expect("sum") };
        assert!((value(&sum_ours) - value(&sum_theirs)).abs() < 1e-6, "{ours} against {theirs}");
    }
}
