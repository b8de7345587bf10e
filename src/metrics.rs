//! Process metrics in Prometheus' text format (`GET /metrics`): the counters the layers
//! keep ([`Metrics`]), rendered on request with what other parts already count.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use agent_stream_store::metrics::Metrics;

use crate::app::App;

fn line(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The text exposition of every metric.
pub fn render(app: &App) -> String {
    let m = &app.metrics;
    let mut out = String::with_capacity(4096);
    let c = |v: &AtomicU64| v.load(Relaxed);
    line(&mut out, "agent_stream_appends_total", "counter", "Append requests that wrote.", c(&m.appends));
    line(
        &mut out,
        "agent_stream_appends_replayed_total",
        "counter",
        "Idempotent retries answered from stored events.",
        c(&m.appends_replayed),
    );
    line(
        &mut out,
        "agent_stream_appends_rejected_total",
        "counter",
        "Append requests refused.",
        c(&m.appends_rejected),
    );
    line(
        &mut out,
        "agent_stream_appends_rate_limited_total",
        "counter",
        "Append requests refused by the tenant rate limit.",
        c(&m.rate_limited),
    );
    line(&mut out, "agent_stream_events_appended_total", "counter", "Events written.", c(&m.events));
    line(
        &mut out,
        "agent_stream_append_bytes_total",
        "counter",
        "Bytes of accepted HTTP append bodies.",
        c(&m.append_bytes),
    );
    line(
        &mut out,
        "agent_stream_commit_groups_total",
        "counter",
        "Transactions that committed appends (appends_total / this = mean group-commit size).",
        c(&m.commit_groups),
    );
    line(
        &mut out,
        "agent_stream_subscribers",
        "gauge",
        "Open live streams (SSE and WebSocket).",
        m.subscribers.load(Relaxed),
    );
    line(
        &mut out,
        "agent_stream_dropped_deltas_total",
        "counter",
        "Deltas dropped for SSE clients that fell behind.",
        c(&m.dropped_deltas),
    );
    line(
        &mut out,
        "agent_stream_live_reads_total",
        "counter",
        "SELECTs made for live delivery (shared feed reads and catch-ups).",
        app.live.feeds.reads(),
    );
    line(
        &mut out,
        "agent_stream_notifications_total",
        "counter",
        "Notifications received from other processes.",
        c(&m.notifications),
    );
    line(
        &mut out,
        "agent_stream_notification_lag_ms",
        "gauge",
        "Latest NOTIFY-to-receipt lag from another process, ms.",
        c(&m.notify_lag_ms_last),
    );
    line(
        &mut out,
        "agent_stream_notification_lag_max_ms",
        "gauge",
        "Largest NOTIFY-to-receipt lag seen, ms.",
        c(&m.notify_lag_ms_max),
    );
    line(
        &mut out,
        "agent_stream_listener_up",
        "gauge",
        "1 while the LISTEN connection is up.",
        u8::from(app.live.listening()),
    );
    line(
        &mut out,
        "agent_stream_view_folded_events_total",
        "counter",
        "Events folded by the view cache.",
        app.live.views.folded_events(),
    );
    let pool = app.db.pool.status();
    line(&mut out, "agent_stream_db_pool_size", "gauge", "Database connections open.", pool.size);
    line(&mut out, "agent_stream_db_pool_available", "gauge", "Idle database connections.", pool.available);
    out
}
