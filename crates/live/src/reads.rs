//! Feeds' reads, combined: the feeds of runs woken together (a group commit wakes every
//! run it wrote, a listener line names several) ask here for their rows after their
//! cursors, and the asks of one tenant that are waiting go to PostgreSQL as one
//! statement ([`read_after_many`]) instead of one transaction per run. The rows are the
//! same `seq > cursor` rows a feed would read alone; only the round trips are shared.
//!
//! Asks queue while [`IN_FLIGHT`] reads are out, so the busier the database, the more
//! runs one read carries; an idle one answers a lone ask at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use agent_stream_core::domain::Event;
use agent_stream_store::db::discard;
use agent_stream_store::events::read_after_many;
use agent_stream_store::Db;

/// Combined reads out at once (each holds a pooled connection while it runs).
const IN_FLIGHT: usize = 4;
/// Runs one combined read carries at most.
const MAX_RUNS: usize = 128;

/// A failed read, as every feed that shared it sees it (they retry on their next wake-up).
pub(crate) type ReadError = Arc<agent_stream_store::Error>;

struct Ask {
    tenant: String,
    run_id: String,
    after: i64,
    reply: oneshot::Sender<Result<Vec<Event>, ReadError>>,
}

/// The combiner's queue.
#[derive(Clone)]
pub(crate) struct Reads {
    tx: mpsc::UnboundedSender<Ask>,
}

impl Reads {
    /// Starts the combiner over `db`, reading up to `limit` events per run; every
    /// statement it sends is counted in `reads`.
    pub(crate) fn start(db: Db, limit: i64, reads: Arc<AtomicU64>) -> Reads {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(combine(db, limit, rx, reads));
        Reads { tx }
    }

    /// Up to the limit of events of the run after `after`, read together with whatever
    /// other feeds of the tenant asked meanwhile.
    pub(crate) async fn read(&self, tenant: &str, run_id: &str, after: i64) -> Result<Vec<Event>, ReadError> {
        let (reply, answer) = oneshot::channel();
        let ask = Ask { tenant: tenant.to_owned(), run_id: run_id.to_owned(), after, reply };
        let stopped =
            || Arc::new(agent_stream_store::Error::Internal(anyhow::anyhow!("the read combiner stopped")));
        self.tx.send(ask).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn combine(db: Db, limit: i64, mut rx: mpsc::UnboundedReceiver<Ask>, reads: Arc<AtomicU64>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // The feeds one commit woke run one after another: let the others ask too.
        tokio::task::yield_now().await;
        let mut asks = vec![first];
        while asks.len() < MAX_RUNS * IN_FLIGHT {
            match rx.try_recv() {
                Ok(a) => asks.push(a),
                Err(_) => break,
            }
        }
        // Per tenant (a read is scoped to one), in arrival order.
        let mut groups: HashMap<String, Vec<Ask>> = HashMap::new();
        for a in asks {
            groups.entry(a.tenant.clone()).or_default().push(a);
        }
        for (tenant, asks) in groups {
            let mut asks = asks.into_iter().peekable();
            while asks.peek().is_some() {
                let chunk: Vec<Ask> = asks.by_ref().take(MAX_RUNS).collect();
                // Waiting here is what lets the next asks gather into larger reads.
                let Ok(permit) = permits.clone().acquire_owned().await else { return };
                let (db, tenant, reads) = (db.clone(), tenant.clone(), reads.clone());
                tokio::spawn(async move {
                    read_group(&db, &tenant, limit, chunk, &reads).await;
                    drop(permit);
                });
            }
        }
    }
}

async fn read_group(db: &Db, tenant: &str, limit: i64, asks: Vec<Ask>, reads: &AtomicU64) {
    let runs: Vec<(String, i64)> = asks.iter().map(|a| (a.run_id.clone(), a.after)).collect();
    let read = async {
        let client = db.pool.get().await?;
        let read = read_after_many(&client, tenant, &runs, limit).await;
        if read.is_err() {
            discard(client);
        }
        read
    };
    let read = read.await;
    reads.fetch_add(1, Ordering::Relaxed);
    match read {
        Ok(per_run) => {
            for (ask, evs) in asks.into_iter().zip(per_run) {
                let _ = ask.reply.send(Ok(evs));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for ask in asks {
                let _ = ask.reply.send(Err(e.clone()));
            }
        }
    }
}
