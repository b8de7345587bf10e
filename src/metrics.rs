//! `GET /metrics`: the process's metrics in the OpenMetrics text format, encoded by
//! `prometheus-client`. The layers keep the metrics ([`Metrics`]); a scrape gathers
//! them into a registry with what other parts count (feeds, view cache, pool), the
//! process's own figures (`/proc/self`) and the build's.

use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

pub use agent_stream_store::metrics::{Delivery, HttpRequest, Metrics, Transport};

use crate::app::App;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The text exposition of every metric.
pub fn render(app: &App) -> String {
    let mut registry = Registry::default();
    process(&mut registry);
    service(registry.sub_registry_with_prefix("agent_stream"), app);
    let mut out = String::with_capacity(16 << 10);
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

fn counter(r: &mut Registry, name: &str, help: &str, v: u64) {
    r.register(name, help, ConstCounter::new(v));
}

fn gauge(r: &mut Registry, name: &str, help: &str, v: i64) {
    r.register(name, help, ConstGauge::new(v));
}

fn service(r: &mut Registry, app: &App) {
    let m = &app.metrics;
    r.register(
        "build",
        "The running build: its version (always 1)",
        Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION")),
            ("profile", if cfg!(debug_assertions) { "debug" } else { "release" }),
        ]),
    );
    counter(r, "appends", "Append requests that wrote", m.appends.load(Relaxed));
    counter(
        r,
        "appends_replayed",
        "Idempotent retries answered from stored events",
        m.appends_replayed.load(Relaxed),
    );
    counter(r, "appends_rejected", "Append requests refused", m.appends_rejected.load(Relaxed));
    counter(
        r,
        "appends_rate_limited",
        "Append requests refused by the tenant rate limit",
        m.rate_limited.load(Relaxed),
    );
    counter(r, "events_appended", "Events written", m.events.load(Relaxed));
    counter(r, "append_bytes", "Bytes of accepted HTTP append bodies", m.append_bytes.load(Relaxed));
    counter(
        r,
        "commit_groups",
        "Transactions that committed appends (appends_total / this = mean group-commit size)",
        m.commit_groups.load(Relaxed),
    );
    r.register_with_unit(
        "append_duration",
        "Seconds a producer's append took in the service (parsed batch to answer), by outcome",
        Unit::Seconds,
        m.append_seconds.clone(),
    );
    r.register("commit_group_size", "Appends committed per transaction", m.commit_group_size.clone());
    r.register_with_unit(
        "commit_wait",
        "Seconds an append waited in its group-commit lane before its group went out",
        Unit::Seconds,
        m.commit_wait_seconds.clone(),
    );
    r.register_with_unit(
        "commit_duration",
        "Seconds a group-commit lane's group took from going out to its answers",
        Unit::Seconds,
        m.commit_seconds.clone(),
    );
    r.register(
        "subscribers",
        "Open live subscriptions (SSE streams, GraphQL runEvents and runView), by transport",
        m.subscribers_by.clone(),
    );
    r.register_with_unit(
        "delivery_latency",
        "Seconds from an event's append (its server timestamp, ms) to its hand-over to a live \
         subscriber, by transport; events appended while the subscriber was attached",
        Unit::Seconds,
        m.delivery_seconds.clone(),
    );
    counter(
        r,
        "dropped_deltas",
        "Deltas dropped for SSE clients that fell behind",
        m.dropped_deltas.load(Relaxed),
    );
    counter(
        r,
        "live_reads",
        "SELECTs made for live delivery (shared feed reads and catch-ups)",
        app.live.feeds.reads(),
    );
    counter(
        r,
        "live_taken_events",
        "Events live feeds took from this process's commits without reading them back",
        app.live.feeds.taken(),
    );
    counter(
        r,
        "notifications",
        "Notification lines (a run or tenant each) this process's listener received: other processes' for runs and tenants it serves, and all of its own",
        m.notifications.load(Relaxed),
    );
    r.register_with_unit(
        "notification_lag",
        "Seconds from a NOTIFY's sending (any process, this one included) to its receipt here (ms resolution)",
        Unit::Seconds,
        m.notify_lag_seconds.clone(),
    );
    gauge(r, "listener_up", "1 while the LISTEN connection is up", i64::from(app.live.listening()));
    counter(
        r,
        "graphql_rendered_events",
        "runEvents events a GraphQL subscription rendered itself (the rest were shared copies)",
        m.graphql_renders.load(Relaxed),
    );
    counter(r, "view_folded_events", "Events folded by the view cache", app.live.views.folded_events());
    counter(
        r,
        "live_folded_events",
        "Events folded for live delivery (once per run by its feed, plus subscribers' own catch-up)",
        app.live.feeds.folds(),
    );
    let pool = app.db.pool.status();
    gauge(r, "db_pool_size", "Database connections open", pool.size as i64);
    gauge(r, "db_pool_available", "Idle database connections", pool.available as i64);
    r.register_with_unit(
        "http_request_duration",
        "HTTP requests by matched route, method and status: seconds to the response's head",
        Unit::Seconds,
        m.http_requests.clone(),
    );
}

/// The standard process metrics (`process_*`, as the Prometheus client libraries name
/// them), read from `/proc/self`; left out where `/proc` is not there.
fn process(r: &mut Registry) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    // Numbered as in proc(5) from field 3 (`state`): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as u64;
    r.register_with_unit(
        "process_cpu",
        "Total user and system CPU time spent in seconds",
        Unit::Seconds,
        ConstCounter::new((field(14) + field(15)) as f64 / ticks),
    );
    r.register_with_unit(
        "process_resident_memory",
        "Resident memory size in bytes",
        Unit::Bytes,
        ConstGauge::new((field(24) * page) as i64),
    );
    r.register_with_unit(
        "process_virtual_memory",
        "Virtual memory size in bytes",
        Unit::Bytes,
        ConstGauge::new(field(23) as i64),
    );
    if let Some(boot) = boot_time() {
        r.register_with_unit(
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Unit::Seconds,
            ConstGauge::new(boot + field(22) as f64 / ticks),
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge(r, "process_open_fds", "Number of open file descriptors", fds.count() as i64);
    }
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        gauge(
            r,
            "process_max_fds",
            "Maximum number of open file descriptors",
            soft.min(i64::MAX as u64) as i64,
        );
    }
}

/// The machine's boot time (`btime` in `/proc/stat`), seconds since the epoch.
fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}
