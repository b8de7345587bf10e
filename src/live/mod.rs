//! Live delivery across processes.
//!
//! - An append that commits wakes this process's subscribers at once ([`Hub::publish`]),
//!   and queues a pointer (tenant, run, newest seq) for other processes.
//! - One notifier task per process sends the queued pointers with `pg_notify`,
//!   coalesced (a batch every few milliseconds, one line per run). NOTIFY takes a
//!   cluster-wide lock at commit; doing it outside the producers' transactions keeps
//!   that lock off the append path, and coalescing keeps it rare.
//! - One LISTEN connection per process feeds other processes' pointers into the hub.
//!   When it reconnects (with backoff), every subscriber re-reads its cursor, because
//!   notifications sent while it was away are lost.
//! - A slow safety poll compares the runs subscribers watch with their committed
//!   `last_seq`, catching any wake-up lost on the way. It wakes the run's feed, so one
//!   read serves every subscriber; idle subscribers never poll on their own.
//!
//! Notifications are never the data, only the reason to read rows with `seq > cursor`.

pub mod activity;
mod feed;
mod hub;
pub mod shape;
mod tail;

pub use feed::{Batch, Feeds, Page, PageData};
pub use hub::Hub;
pub use tail::{is_run_end, Tail};

use std::time::Duration;

use tokio::sync::mpsc;

use crate::storage::db::{connect_owner, quote_ident};

/// How often the safety poll runs.
pub const SAFETY_POLL: Duration = Duration::from_secs(2);
/// How long the notifier gathers pointers before one NOTIFY.
const COALESCE: Duration = Duration::from_millis(3);
/// Largest NOTIFY payload we send (PostgreSQL's limit is 8000 bytes).
const MAX_PAYLOAD: usize = 7_000;

/// The live side of one process: the hub and the queue to the notifier.
pub struct Live {
    /// In-memory fan-out.
    pub hub: std::sync::Arc<Hub>,
    /// Shared per-run reads.
    pub feeds: std::sync::Arc<Feeds>,
    outbox: mpsc::Sender<(String, String, i64)>,
    listening: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The listener and the safety poll, stopped by [`Live::stop_listening`].
    watchers: [tokio::task::AbortHandle; 2],
}

/// `application_name` of the LISTEN connection (PostgreSQL keeps 63 bytes of it).
pub fn listener_name(schema: &str) -> String {
    format!("agent-stream listen {schema}")
}

/// The channel all processes on one schema share.
pub fn channel(schema: &str) -> String {
    format!("agent_stream_{schema}")
}

impl Live {
    /// Starts the notifier, the listener and the safety poll for `schema`, using owner
    /// connections to `url`. Tasks run until the process ends.
    pub fn start(url: String, schema: String, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Live {
        let hub = std::sync::Arc::new(Hub::default());
        let (outbox, rx) = mpsc::channel(65_536);
        let listening = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(notifier(url.clone(), schema.clone(), rx));
        let listen =
            tokio::spawn(listener(url.clone(), schema.clone(), hub.clone(), listening.clone(), metrics));
        let poll = tokio::spawn(safety_poll(url, schema, hub.clone()));
        let watchers = [listen.abort_handle(), poll.abort_handle()];
        Live { hub, feeds: Default::default(), outbox, listening, watchers }
    }

    /// Stops listening for other processes' appends and polling for lost wake-ups: the
    /// server has drained, and the database may be about to stop (the embedded
    /// default), which the listener would otherwise report as a lost connection.
    pub fn stop_listening(&self) {
        for task in &self.watchers {
            task.abort();
        }
        self.listening.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// True while the LISTEN connection is up (readiness).
    pub fn listening(&self) -> bool {
        self.listening.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Joins a run's shared feed (see [`Feeds::join`]); the feed closes when `stopping`
    /// turns true.
    pub fn join(
        &self,
        db: &crate::storage::Db,
        tenant: &str,
        run_id: &str,
        from: i64,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::sync::broadcast::Receiver<Page> {
        self.feeds.join(db, &self.hub, tenant, run_id, from, stopping)
    }

    /// An append committed: wake local subscribers now, tell other processes soon.
    pub fn committed(&self, tenant: &str, run_id: &str, last_seq: i64) {
        self.hub.publish(tenant, run_id, last_seq);
        // A full queue only delays other processes until the safety poll.
        let _ = self.outbox.try_send((tenant.to_owned(), run_id.to_owned(), last_seq));
    }
}

async fn notifier(url: String, schema: String, mut rx: mpsc::Receiver<(String, String, i64)>) {
    let chan = channel(&schema);
    let mut client = None;
    while let Some(first) = rx.recv().await {
        let mut newest: std::collections::HashMap<(String, String), i64> = Default::default();
        newest.insert((first.0, first.1), first.2);
        let deadline = tokio::time::Instant::now() + COALESCE;
        while let Ok(Some((t, r, s))) = tokio::time::timeout_at(deadline, rx.recv()).await {
            let e = newest.entry((t, r)).or_insert(s);
            *e = (*e).max(s);
        }
        let mut payloads = vec![String::new()];
        let sent_ms = chrono::Utc::now().timestamp_millis();
        for ((t, r), s) in newest {
            // The send time lets receivers measure notification lag.
            let line = format!("{t} {r} {s} {sent_ms}\n");
            if payloads.last().is_some_and(|p| p.len() + line.len() > MAX_PAYLOAD) {
                payloads.push(String::new());
            }
            if let Some(p) = payloads.last_mut() {
                p.push_str(&line);
            }
        }
        for payload in payloads {
            if client.is_none() {
                client = connect_owner(&url, &schema).await.ok();
            }
            let Some(c) = &client else { continue };
            if let Err(e) = c.execute("SELECT pg_notify($1, $2)", &[&chan, &payload]).await {
                tracing::warn!(error = %e, "notify failed; other processes catch up by the safety poll");
                client = None;
            }
        }
    }
}

async fn listener(
    url: String,
    schema: String,
    hub: std::sync::Arc<Hub>,
    listening: std::sync::Arc<std::sync::atomic::AtomicBool>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let result = listen_once(&url, &schema, &hub, &listening, &metrics).await;
        listening.store(false, std::sync::atomic::Ordering::Relaxed);
        match result {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => tracing::warn!(error = %e, "LISTEN connection lost; reconnecting"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One LISTEN session: returns when the connection ends.
async fn listen_once(
    url: &str,
    schema: &str,
    hub: &Hub,
    listening: &std::sync::atomic::AtomicBool,
    metrics: &crate::metrics::Metrics,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    let mut cfg: tokio_postgres::Config = url.parse()?;
    // Named so operators (and the fault tests) can find this process's listener.
    cfg.application_name(listener_name(schema));
    let (client, mut conn) = cfg.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n.payload().to_owned());
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {}", quote_ident(&channel(schema)))).await?;
    listening.store(true, std::sync::atomic::Ordering::Relaxed);
    // Anything committed while we were not listening is only in the rows.
    hub.wake_all();
    while let Some(payload) = rx.recv().await {
        for line in payload.lines() {
            let mut parts = line.split(' ');
            if let (Some(t), Some(r), Some(Ok(s))) =
                (parts.next(), parts.next(), parts.next().map(str::parse))
            {
                hub.publish(t, r, s);
                if let Some(Ok(sent)) = parts.next().map(str::parse::<i64>) {
                    let lag = chrono::Utc::now().timestamp_millis().saturating_sub(sent).max(0);
                    metrics.notify_lag(lag as u64);
                }
            }
        }
    }
    drop(client);
    driver.await??;
    Ok(())
}

async fn safety_poll(url: String, schema: String, hub: std::sync::Arc<Hub>) {
    let mut client = None;
    let mut tick = tokio::time::interval(SAFETY_POLL);
    loop {
        tick.tick().await;
        let active = hub.active();
        if active.is_empty() {
            continue;
        }
        if client.is_none() {
            client = connect_owner(&url, &schema).await.ok();
        }
        let Some(c) = &client else { continue };
        let tenants: Vec<&str> = active.iter().map(|a| a.0.as_str()).collect();
        let runs: Vec<&str> = active.iter().map(|a| a.1.as_str()).collect();
        let rows = c
            .query(
                "SELECT r.tenant_id, r.run_id, r.last_seq FROM runs r
                 JOIN unnest($1::text[], $2::text[]) AS a(tenant_id, run_id)
                   ON r.tenant_id = a.tenant_id AND r.run_id = a.run_id",
                &[&tenants, &runs],
            )
            .await;
        match rows {
            Ok(rows) => {
                for r in rows {
                    hub.publish(r.get(0), r.get(1), r.get(2));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "safety poll failed");
                client = None;
            }
        }
    }
}
