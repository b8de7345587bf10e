//! In-memory fan-out: one watch channel per run that has subscribers, holding the
//! newest seq known to be committed. A wake-up carries no data: a run's feed takes
//! what this process committed from the row writer and reads the rest (`seq > cursor`)
//! through the same read path as catch-up, and subscribers keep only what follows their
//! cursor, so switching from history to live can neither skip nor repeat an event.

// foldhash, not SipHash: why, in the workspace Cargo.toml.
use foldhash::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use agent_stream_store::run_key::{get_or_insert_with, RunMap, RunRef};

/// Runs with live subscribers, and the newest seq each is known to have.
#[derive(Default)]
pub struct Hub {
    runs: Mutex<RunMap<watch::Sender<i64>>>,
    /// Per tenant: a counter bumped by every write (for run-activity streams).
    tenants: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Bumped whenever a run or tenant gains its first watcher, so the listener knows
    /// when the tokens it maps back to runs may be out of date.
    generation: std::sync::atomic::AtomicU64,
    /// Bumped by [`Hub::wake_all`]: feeds, which read only when a run's newest seq is
    /// past their cursor, read regardless on this.
    rereads: watch::Sender<u64>,
}

impl Hub {
    /// A receiver that changes whenever the run's newest seq moves (or on a forced
    /// re-read after the listener reconnects).
    pub fn subscribe(&self, tenant: &str, run_id: &str) -> watch::Receiver<i64> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        get_or_insert_with(&mut runs, RunRef(tenant, run_id), || {
            self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            watch::channel(0).0
        })
        .subscribe()
    }

    /// A receiver that changes whenever any run of the tenant is written.
    pub fn tenant_watch(&self, tenant: &str) -> watch::Receiver<u64> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants
            .entry(tenant.to_owned())
            .or_insert_with(|| {
                self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                watch::channel(0).0
            })
            .subscribe()
    }

    /// A receiver that changes on every forced re-read ([`Hub::wake_all`]).
    pub fn rereads(&self) -> watch::Receiver<u64> {
        self.rereads.subscribe()
    }

    /// Changes whenever a run or a tenant gains its first watcher.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tenants whose run activity is watched.
    pub fn watched_tenants(&self) -> Vec<String> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.retain(|_, tx| tx.receiver_count() > 0);
        tenants.keys().cloned().collect()
    }

    /// Wakes the tenant's run-activity watchers (they read the rows themselves).
    pub fn wake_tenant(&self, tenant: &str) {
        self.bump_tenant(tenant);
    }

    fn bump_tenant(&self, tenant: &str) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tenants.get(tenant) {
            if tx.receiver_count() == 0 {
                tenants.remove(tenant);
            } else {
                tx.send_modify(|n| *n += 1);
            }
        }
    }

    /// Records that `seq` is committed for the run (0: the run was just created); wakes
    /// its subscribers if it is new, and the tenant's activity watchers.
    pub fn publish(&self, tenant: &str, run_id: &str, seq: i64) {
        self.bump_tenant(tenant);
        self.wake_run(tenant, run_id, seq);
    }

    /// [`Hub::publish`] without the tenant's activity watchers: wakes the run's
    /// subscribers if `seq` is new to them.
    pub fn wake_run(&self, tenant: &str, run_id: &str, seq: i64) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let key = RunRef(tenant, run_id);
        if let Some(tx) = runs.get(&key) {
            if tx.receiver_count() == 0 {
                runs.remove(&key);
                return;
            }
            tx.send_if_modified(|v| {
                let newer = seq > *v;
                if newer {
                    *v = seq;
                }
                newer
            });
        }
    }

    /// Wakes every subscriber to re-read its cursor: after the listener reconnects,
    /// notifications sent while it was away are lost, the rows are not.
    pub fn wake_all(&self) {
        self.rereads.send_modify(|n| *n += 1);
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|_, tx| tx.receiver_count() > 0);
        for tx in runs.values() {
            tx.send_modify(|_| {});
        }
        drop(runs);
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.retain(|_, tx| tx.receiver_count() > 0);
        for tx in tenants.values() {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// Runs with subscribers and the seq each was last told about (for the safety poll).
    pub fn active(&self) -> Vec<(String, String, i64)> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|_, tx| tx.receiver_count() > 0);
        runs.iter().map(|((t, r), tx)| (t.clone(), r.clone(), *tx.borrow())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn publish_wakes_only_on_a_newer_seq() {
        let hub = Hub::default();
        let mut rx = hub.subscribe("t", "r");
        hub.publish("t", "r", 3);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 3);
        hub.publish("t", "r", 2);
        assert!(!rx.has_changed().unwrap(), "an older seq is no news");
        hub.wake_all();
        assert!(rx.has_changed().unwrap(), "a forced re-read wakes everyone");
        hub.publish("t", "other", 9);
        assert_eq!(hub.active(), vec![("t".to_owned(), "r".to_owned(), 3)]);
        drop(rx);
        assert!(hub.active().is_empty(), "runs without subscribers are forgotten");
    }
}
