//! A process's counters: plain atomics bumped where things happen (the store's group
//! commit, live delivery, the service's operations). The service renders them at
//! `GET /metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Counters and gauges of one process.
#[derive(Default)]
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
    /// Notifications received from other processes.
    pub notifications: AtomicU64,
    /// Milliseconds between another process's NOTIFY and its receipt here (last, max).
    pub notify_lag_ms_last: AtomicU64,
    /// See `notify_lag_ms_last`.
    pub notify_lag_ms_max: AtomicU64,
    /// Transactions that committed appends, and appends they carried (the group-commit
    /// size is their ratio).
    pub commit_groups: AtomicU64,
}

impl Metrics {
    /// Records one notification's lag.
    pub fn notify_lag(&self, ms: u64) {
        self.notifications.fetch_add(1, Relaxed);
        self.notify_lag_ms_last.store(ms, Relaxed);
        self.notify_lag_ms_max.fetch_max(ms, Relaxed);
    }
}
