//! Live delivery across processes.
//!
//! - An append that commits hands its events to the run's feed here (the store's
//!   `CommitSink`, see [`Feeds`]), wakes this process's subscribers at once
//!   ([`Hub::publish`]), and queues a pointer (tenant, run) for other processes.
//! - One notifier task per process sends the queued pointers with `pg_notify`,
//!   coalesced (a batch every few milliseconds, one line per run). NOTIFY takes a
//!   cluster-wide lock at commit; doing it outside the producers' transactions keeps
//!   that lock off the append path, and coalescing keeps it rare.
//! - One LISTEN connection per process feeds other processes' pointers into the hub
//!   (a process marks its payloads with a random nonce and skips its own: their
//!   subscribers here were woken at commit).
//!   When it reconnects (with backoff), every subscriber re-reads its cursor, because
//!   notifications sent while it was away are lost.
//! - A slow safety poll compares the runs subscribers watch with their committed
//!   `last_seq`, catching any wake-up lost on the way. It wakes the run's feed, so one
//!   read serves every subscriber; idle subscribers never poll on their own.
//!
//! Notifications are never the data, only the reason to read rows with `seq > cursor`;
//! the only data that does not come from a read is what this process committed itself,
//! handed over as the rows it wrote.
//!
//! **Other logins.** PostgreSQL has no privileges on LISTEN and NOTIFY: any login of
//! the database (an analyst's, say) may listen on a channel it can name, and notify on
//! it. So nothing on the channel is trusted or readable without the schema's secret
//! (`live_secret`, readable by the owner only; [`Secret`]): the channel's name is keyed
//! by it, a line carries keyed tokens of the tenant and the run (no ids, no seq), and a
//! token is acted on only when it matches a run or tenant this process watches, whose
//! newest seq is then read from `runs`. A forged or replayed line can at most cause
//! that read.

#![warn(missing_docs)]

pub mod activity;
pub mod alarm;
mod feed;
mod hub;
mod reads;
pub mod shed;
mod tail;
pub mod views;

pub use feed::{Batch, Feeds, Page, PageData, PerEvent, Want};
pub use hub::Hub;
pub use shed::Shedding;
pub use tail::Tail;
pub use views::ViewCache;

use std::sync::Arc;

use agent_stream_store::append::CommitSink;
use agent_stream_store::auth::Authenticator;
use agent_stream_store::metrics::Metrics;
use agent_stream_store::Db;

use std::time::Duration;

use tokio::sync::mpsc;

use agent_stream_store::db::{connect_owner, quote_ident};

/// How often the safety poll runs.
pub const SAFETY_POLL: Duration = Duration::from_secs(2);
/// How long the notifier gathers pointers before one NOTIFY.
const COALESCE: Duration = Duration::from_millis(3);

/// Pointers the notifier takes off its queue at a time.
const RECEIVED_AT_ONCE: usize = 256;
/// Most runs whose notification tokens the notifier keeps.
const TOKENS_KEPT: usize = 16_384;
/// Largest NOTIFY payload we send (PostgreSQL's limit is 8000 bytes).
const MAX_PAYLOAD: usize = 7_000;

/// The live side of one process: the hub, the per-run feeds and folds, and the queue to
/// the notifier. It reads through the store and checks keys with the store's
/// authenticator; it knows nothing of the transports that use it.
pub struct Live {
    /// In-memory fan-out.
    pub hub: std::sync::Arc<Hub>,
    /// Shared per-run reads.
    pub feeds: std::sync::Arc<Feeds>,
    /// The folded view of each watched or read run, shared by every reader (and kept
    /// up to date by the run's feed while it folds).
    pub views: Arc<ViewCache>,
    /// Shared per-tenant reads of run activity.
    pub activity: activity::ActivityFeeds,
    /// The store every read goes through.
    pub db: Db,
    /// Key checks for open streams (revocation ends them).
    pub auth: Arc<Authenticator>,
    /// The process's counters.
    pub metrics: Arc<Metrics>,
    /// Set when the process starts shutting down: live streams end cleanly.
    stopping: tokio::sync::watch::Sender<bool>,
    outbox: mpsc::Sender<(String, String)>,
    listening: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Statements the listener made to read runs' newest seqs (see [`Live::heads_read`]).
    heads_read: Arc<std::sync::atomic::AtomicU64>,
    /// The listener and the safety poll, stopped by [`Live::stop_listening`].
    watchers: [tokio::task::AbortHandle; 2],
}

/// `application_name` of the LISTEN connection (PostgreSQL keeps 63 bytes of it).
pub fn listener_name(schema: &str) -> String {
    format!("agent-stream listen {schema}")
}

/// The schema's live secret: the key of the channel's name and of the tokens on it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Reads the secret of the schema an owner connection is set to.
    pub async fn load(c: &tokio_postgres::Client) -> Result<Secret, tokio_postgres::Error> {
        let secret: String = c.query_one("SELECT secret FROM live_secret", &[]).await?.get(0);
        Ok(Secret(secret.into_bytes()))
    }

    /// A secret from its stored text (tests).
    pub fn from_text(secret: &str) -> Secret {
        Secret(secret.as_bytes().to_vec())
    }

    fn keyed(&self, parts: &[&str]) -> String {
        use hmac::{KeyInit, Mac};
        // Any key length is valid for HMAC, so this cannot fail.
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        for p in parts {
            mac.update(p.as_bytes());
            mac.update(&[0]);
        }
        hex::encode(&mac.finalize().into_bytes()[..12])
    }

    /// The channel all processes on the schema share.
    pub fn channel(&self) -> String {
        format!("agent_stream_{}", self.keyed(&["channel"]))
    }

    /// A run's token on the channel.
    fn run_token(&self, tenant: &str, run_id: &str) -> String {
        self.keyed(&["run", tenant, run_id])
    }

    /// A tenant's token on the channel.
    fn tenant_token(&self, tenant: &str) -> String {
        self.keyed(&["tenant", tenant])
    }
}

impl Live {
    /// Starts the notifier, the listener and the safety poll for `schema`, using owner
    /// connections to `url`. Tasks run until the process ends.
    pub fn start(db: Db, auth: Arc<Authenticator>, metrics: Arc<Metrics>) -> Live {
        let (url, schema) = (db.url.clone(), db.schema.clone());
        let hub = std::sync::Arc::new(Hub::default());
        let (outbox, rx) = mpsc::channel(65_536);
        let listening = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let heads_read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Marks this process's notifications, so its listener does not read the heads
        // of runs whose subscribers here were woken at commit already.
        let origin = Origin(hex::encode(rand::random::<[u8; 8]>()));
        tokio::spawn(notifier(url.clone(), schema.clone(), origin.clone(), rx));
        let listen = tokio::spawn(listener(
            url.clone(),
            schema.clone(),
            hub.clone(),
            Listening { up: listening.clone(), origin, heads_read: heads_read.clone() },
            metrics.clone(),
        ));
        let poll = tokio::spawn(safety_poll(url, schema, hub.clone()));
        let watchers = [listen.abort_handle(), poll.abort_handle()];
        Live {
            hub,
            feeds: Default::default(),
            views: Arc::default(),
            activity: Default::default(),
            db,
            auth,
            metrics,
            stopping: tokio::sync::watch::channel(false).0,
            outbox,
            listening,
            heads_read,
            watchers,
        }
    }

    /// Statements the listener has made to read the newest seq of runs named by other
    /// processes' notifications (its own are skipped: their subscribers here were woken
    /// when the append committed).
    pub fn heads_read(&self) -> u64 {
        self.heads_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts a graceful shutdown: open live streams end cleanly (clients resume from
    /// their cursor).
    pub fn shut_down(&self) {
        self.stopping.send_replace(true);
    }

    /// A receiver that turns true when the process starts shutting down.
    pub fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stopping.subscribe()
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
    pub(crate) fn join(
        &self,
        tenant: &str,
        run_id: &str,
        from: i64,
        want: Option<Want>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> (tokio::sync::broadcast::Receiver<Page>, feed::Registration) {
        self.feeds.join(&self.db, &self.hub, &self.views, tenant, run_id, from, want, stopping)
    }

    /// A write committed: wake local subscribers now, tell other processes soon.
    pub fn committed(&self, tenant: &str, run_id: &str, last_seq: i64) {
        wake(&self.hub, &self.outbox, tenant, run_id, last_seq);
    }

    /// What the row writer hands its commits to: the runs' feeds take the events, and an
    /// append whose request went away before its answer wakes and notifies as
    /// [`Live::committed`] would have on the answer (see [`CommitSink::moved`]).
    pub fn commit_sink(&self) -> Arc<dyn CommitSink> {
        Arc::new(Commits { feeds: self.feeds.clone(), hub: self.hub.clone(), outbox: self.outbox.clone() })
    }
}

/// Wakes a run's local subscribers and queues its notification to other processes.
fn wake(hub: &Hub, outbox: &mpsc::Sender<(String, String)>, tenant: &str, run_id: &str, last_seq: i64) {
    hub.publish(tenant, run_id, last_seq);
    // A full queue only delays other processes until the safety poll.
    let _ = outbox.try_send((tenant.to_owned(), run_id.to_owned()));
}

/// The sink of [`Live::commit_sink`].
struct Commits {
    feeds: Arc<Feeds>,
    hub: Arc<Hub>,
    outbox: mpsc::Sender<(String, String)>,
}

impl CommitSink for Commits {
    fn follows(&self, tenant: &str, run_id: &str) -> bool {
        self.feeds.follows(tenant, run_id)
    }

    fn committed(&self, tenant: &str, run_id: &str, events: Vec<agent_stream_core::domain::Event>) {
        let last = events.last().map(|e| e.seq);
        self.feeds.committed(tenant, run_id, events);
        // The feed is woken here, where the writer learns of the commit, rather than
        // only by `Live::committed` once the appender's task has run on its answer: a
        // group's answers wake dozens of appenders, and under load each waits its turn
        // on the runtime before it could wake its run's feed (docs/benchmarks-log.md,
        // 2026-12-06 16:00). `Live::committed` still follows, for the tenant's activity
        // watchers and other processes; its wake is then no news to the feed.
        if let Some(seq) = last {
            self.hub.wake_run(tenant, run_id, seq);
        }
    }

    fn moved(&self, tenant: &str, run_id: &str, last_seq: i64) {
        wake(&self.hub, &self.outbox, tenant, run_id, last_seq);
    }
}

/// A process's mark on its notifications: a random nonce, not derived from anything.
#[derive(Clone)]
struct Origin(String);

impl Origin {
    /// The first line of every payload this process sends.
    fn header(&self) -> String {
        format!("from {}\n", self.0)
    }
}

async fn notifier(url: String, schema: String, origin: Origin, mut rx: mpsc::Receiver<(String, String)>) {
    let mut conn: Option<Notifying> = None;
    // Each run's pair of tokens, which costs two HMACs to make: a busy run is notified
    // hundreds of times a second (the keyed tokens were 2% of the service's CPU under
    // single appends, docs/benchmarks-log.md, 2026-11-29 16:20). Emptied when it fills
    // and when the secret is read again.
    let mut tokens: foldhash::HashMap<(String, String), String> = Default::default();
    let header = origin.header();
    let mut got = Vec::with_capacity(RECEIVED_AT_ONCE);
    while let Some(first) = rx.recv().await {
        let mut runs: foldhash::HashSet<(String, String)> = Default::default();
        runs.insert(first);
        // One timer for the window, and what is queued taken in bulk: a `timeout` per
        // pointer put an entry into the timer wheel and took it out again for every
        // commit (~1,000 instructions a streamed line, docs/benchmarks-log.md,
        // 2026-12-06 06:16).
        let window = tokio::time::sleep(COALESCE);
        tokio::pin!(window);
        loop {
            tokio::select! {
                // The window first, so that a steady stream of pointers cannot hold it open.
                biased;
                () = &mut window => break,
                n = rx.recv_many(&mut got, RECEIVED_AT_ONCE) => {
                    runs.extend(got.drain(..));
                    if n == 0 {
                        break;
                    }
                }
            }
        }
        if conn.is_none() {
            conn = Notifying::connect(&url, &schema).await.ok();
            tokens.clear();
        }
        if tokens.len() + runs.len() > TOKENS_KEPT {
            tokens.clear();
        }
        let Some(n) = &conn else { continue };
        let mut payloads = vec![header.clone()];
        // The send time lets receivers measure notification lag. Each line is written
        // in place: a `format!` per line was 1% of a many-runs event.
        let mut stamp = itoa::Buffer::new();
        let sent_ms = stamp.format(chrono::Utc::now().timestamp_millis());
        for (t, r) in runs {
            let pair = tokens.entry((t, r)).or_insert_with_key(|(t, r)| {
                format!("{} {}", n.secret.tenant_token(t), n.secret.run_token(t, r))
            });
            let line = pair.len() + 1 + sent_ms.len() + 1;
            if payloads.last().is_some_and(|p| p.len() + line > MAX_PAYLOAD) {
                payloads.push(header.clone());
            }
            if let Some(p) = payloads.last_mut() {
                p.push_str(pair);
                p.push(' ');
                p.push_str(sent_ms);
                p.push('\n');
            }
        }
        for payload in payloads {
            if let Err(e) = n.client.execute(&n.notify, &[&n.channel, &payload]).await {
                tracing::warn!(error = %e, "notify failed; other processes catch up by the safety poll");
                conn = None;
                break;
            }
        }
    }
}

/// The notifier's connection, with what it sends on every NOTIFY made once: the
/// channel's name (an HMAC) and the prepared `pg_notify`. Made for each NOTIFY, they
/// were 44% of the notifier's instructions, and PostgreSQL parsed the statement each
/// time (docs/benchmarks-log.md, 2026-11-30 18:28).
struct Notifying {
    client: tokio_postgres::Client,
    secret: Secret,
    channel: String,
    notify: tokio_postgres::Statement,
}

impl Notifying {
    /// An owner connection, the schema's secret read on it, and the statement.
    async fn connect(url: &str, schema: &str) -> anyhow::Result<Notifying> {
        let client = connect_owner(url, schema).await?;
        let secret = Secret::load(&client).await?;
        let notify = client.prepare("SELECT pg_notify($1, $2)").await?;
        Ok(Notifying { channel: secret.channel(), client, secret, notify })
    }
}

/// The listener's state shared with [`Live`].
struct Listening {
    /// True while the LISTEN connection is up.
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// This process's mark, to tell its own notifications.
    origin: Origin,
    heads_read: Arc<std::sync::atomic::AtomicU64>,
}

async fn listener(
    url: String,
    schema: String,
    hub: std::sync::Arc<Hub>,
    listening: Listening,
    metrics: Arc<Metrics>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let result = listen_once(&url, &schema, &hub, &listening, &metrics).await;
        listening.up.store(false, std::sync::atomic::Ordering::Relaxed);
        match result {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => tracing::warn!(error = %e, "LISTEN connection lost; reconnecting"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The tokens of the runs and tenants this process watches, to map lines back to them.
/// Rebuilt from the hub when a token is not found and the hub has gained watchers since
/// (so a line for a run nobody here watches costs a lookup, not a rebuild).
struct Watched {
    generation: Option<u64>,
    runs: foldhash::HashMap<String, (String, String)>,
    tenants: foldhash::HashMap<String, String>,
}

impl Watched {
    fn refresh(&mut self, hub: &Hub, secret: &Secret) {
        let generation = hub.generation();
        if self.generation == Some(generation) {
            return;
        }
        self.generation = Some(generation);
        self.runs = hub.active().into_iter().map(|(t, r, _)| (secret.run_token(&t, &r), (t, r))).collect();
        self.tenants = hub.watched_tenants().into_iter().map(|t| (secret.tenant_token(&t), t)).collect();
    }
}

/// One LISTEN session: returns when the connection ends.
async fn listen_once(
    url: &str,
    schema: &str,
    hub: &Hub,
    listening: &Listening,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    // Named so operators (and the fault tests) can find this process's listener; with
    // the URL's TLS settings, like every other connection.
    let (client, mut conn) = agent_stream_store::db::connect_raw(url, Some(&listener_name(schema))).await?;
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
    client.batch_execute(&format!("SET search_path TO {}", quote_ident(schema))).await?;
    let secret = Secret::load(&client).await?;
    client.batch_execute(&format!("LISTEN {}", quote_ident(&secret.channel()))).await?;
    listening.up.store(true, std::sync::atomic::Ordering::Relaxed);
    // Anything committed while we were not listening is only in the rows.
    hub.wake_all();
    let mut watched = Watched { generation: None, runs: Default::default(), tenants: Default::default() };
    let check = client.prepare(agent_stream_store::rows::HEADS).await?;
    let own = listening.origin.header();
    while let Some(first) = rx.recv().await {
        // Everything that arrived together is checked with one read.
        let mut payloads = vec![first];
        while let Ok(more) = rx.try_recv() {
            payloads.push(more);
        }
        let mut runs: foldhash::HashSet<(String, String)> = Default::default();
        let mut tenants: foldhash::HashSet<String> = Default::default();
        for payload in &payloads {
            // This process's own lines: their runs' subscribers here were woken when
            // the append committed; only the lag is measured. A forged mark can only
            // make this process skip the lines that came with it.
            let (mine, lines) = match payload.split_once('\n') {
                Some((first, rest)) if first.starts_with("from ") => (own.trim_end() == first, rest),
                _ => (false, payload.as_str()),
            };
            if mine {
                note_own(lines, metrics);
                continue;
            }
            for line in lines.lines() {
                note_line(line, hub, &secret, &mut watched, metrics, &mut runs, &mut tenants);
            }
        }
        for t in &tenants {
            hub.wake_tenant(t);
        }
        if runs.is_empty() {
            continue;
        }
        listening.heads_read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The seq comes from the table, never from the line.
        for (tenant, run, seq) in
            newest(&client, &check, runs.iter().map(|(t, r)| (t.as_str(), r.as_str()))).await?
        {
            hub.publish(&tenant, &run, seq);
        }
    }
    drop(client);
    driver.await??;
    Ok(())
}

/// This process's own lines: their runs' subscribers here were woken when the append
/// committed, so only their lag is measured, a line at a time as for other processes'
/// lines. Their runs are not looked up: every line of a payload carries the time it was
/// sent, and the lookups (two tokens hashed and compared per line) were ~3% of a
/// streamed line's instructions under many-runs, where nearly every committed line of
/// a run is one line here (docs/benchmarks-log.md, 2026-12-06).
fn note_own(lines: &str, metrics: &Metrics) {
    let Some(sent) =
        lines.lines().next().and_then(|l| l.rsplit(' ').next()).and_then(|t| t.parse::<i64>().ok())
    else {
        return;
    };
    let lag = chrono::Utc::now().timestamp_millis().saturating_sub(sent).max(0);
    let lag = std::time::Duration::from_millis(lag as u64);
    for _ in lines.lines() {
        metrics.notify_lag(lag);
    }
}

/// One line of another process's notification: the run or tenant it names, if watched
/// here, joins what is read, and its lag is measured.
fn note_line(
    line: &str,
    hub: &Hub,
    secret: &Secret,
    watched: &mut Watched,
    metrics: &Metrics,
    runs: &mut foldhash::HashSet<(String, String)>,
    tenants: &mut foldhash::HashSet<String>,
) {
    let mut parts = line.split(' ');
    let (Some(tenant_token), Some(run_token)) = (parts.next(), parts.next()) else { return };
    if !watched.runs.contains_key(run_token) && !watched.tenants.contains_key(tenant_token) {
        watched.refresh(hub, secret);
    }
    let run = watched.runs.get(run_token);
    let tenant = watched.tenants.get(tenant_token);
    if run.is_none() && tenant.is_none() {
        return;
    }
    if let Some(Ok(sent)) = parts.next().map(str::parse::<i64>) {
        let lag = chrono::Utc::now().timestamp_millis().saturating_sub(sent).max(0);
        metrics.notify_lag(std::time::Duration::from_millis(lag as u64));
    }
    if let Some(run) = run {
        runs.insert(run.clone());
    }
    if let Some(t) = tenant {
        tenants.insert(t.clone());
    }
}

/// The newest seq of each of `runs` (tenant, run) that still exists, by the store's one
/// read of heads ([`HEADS`](agent_stream_store::rows::HEADS), prepared as `stmt`): one
/// statement per tenant, pipelined on the one connection.
async fn newest<'a>(
    c: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    runs: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<(String, String, i64)>, tokio_postgres::Error> {
    let mut by_tenant: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (t, r) in runs {
        by_tenant.entry(t).or_default().push(r);
    }
    let queries = by_tenant.iter().map(|(t, rs)| async move {
        let rows = c.query(stmt, &[t, rs]).await?;
        Ok::<_, tokio_postgres::Error>(
            rows.iter()
                .map(|r| {
                    let (run, (seq, _)) = agent_stream_store::rows::head_of(r);
                    ((*t).to_owned(), run, seq)
                })
                .collect::<Vec<_>>(),
        )
    });
    Ok(futures::future::try_join_all(queries).await?.into_iter().flatten().collect())
}

async fn safety_poll(url: String, schema: String, hub: std::sync::Arc<Hub>) {
    // The connection and its statement, prepared once per connection.
    let mut conn = None;
    let mut tick = tokio::time::interval(SAFETY_POLL);
    loop {
        tick.tick().await;
        let active = hub.active();
        if active.is_empty() {
            continue;
        }
        if conn.is_none() {
            if let Ok(c) = connect_owner(&url, &schema).await {
                match c.prepare(agent_stream_store::rows::HEADS).await {
                    Ok(stmt) => conn = Some((c, stmt)),
                    Err(e) => tracing::warn!(error = %e, "safety poll failed"),
                }
            }
        }
        let Some((c, stmt)) = &conn else { continue };
        match newest(c, stmt, active.iter().map(|a| (a.0.as_str(), a.1.as_str()))).await {
            Ok(rows) => {
                for (tenant, run, seq) in rows {
                    hub.publish(&tenant, &run, seq);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "safety poll failed");
                conn = None;
            }
        }
    }
}
