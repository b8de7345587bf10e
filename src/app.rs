//! The application core shared by every transport: state, authentication and the
//! operations (create a run, append, read). HTTP and GraphQL handlers are thin
//! adapters over these methods, so a rule enforced here holds on every surface.

use std::sync::Arc;

use crate::auth::{Authenticator, Principal, Scope};
use crate::domain::event::{Decision, EventBody, Lifecycle, MessageEnd, MessageStart, PlanDecision, Role};
use crate::domain::{Batch, Event, Origin};
use crate::domain::{NewEvent, RunGuard, RunState};
use crate::error::{Error, ErrorCode, Result};
use crate::live::views::load_view;
use crate::projection::RunView;
use crate::storage::{self, events, runs, AppendOutcome, Db, Guards, RunInfo};

/// Largest page of events one read returns.
pub const MAX_PAGE: i64 = 10_000;

/// Tunables of a running service.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Size and count limits for appends.
    pub limits: crate::domain::Limits,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Origins allowed by CORS; `None` allows any origin (embedded dev default only).
    pub cors_origins: Option<Vec<String>>,
    /// Largest JSONL file `POST /v1/runs/import` takes, in bytes.
    pub max_import_bytes: usize,
    /// Group-commit lanes for producer appends (0: every append commits alone).
    pub group_commit_lanes: usize,
    /// Per-tenant append rate limit (`None`: unlimited).
    pub append_rate: Option<crate::ratelimit::RateLimit>,
    /// Live SSE shedding: a client this many events behind the run's newest seq loses
    /// reasoning deltas, and at [`Shedding::text_behind`] text deltas too.
    pub shedding: Shedding,
    /// Caps of GraphQL WebSockets.
    pub ws: WsLimits,
    /// Pooled database connections idle this long are closed (`None`: kept).
    pub pool_idle: Option<std::time::Duration>,
}

/// Caps of GraphQL WebSockets (README, "Subscriptions"); the timeouts are constants in
/// `graphql::ws`.
#[derive(Debug, Clone, Copy)]
pub struct WsLimits {
    /// Operations (subscriptions) open at once on one socket; more get
    /// `SUBSCRIPTIONS-LIMIT`.
    pub max_operations: usize,
    /// Sockets open at once with one API key; more are closed at `connection_init`
    /// with 4429.
    pub max_sockets_per_key: usize,
    /// How long one write may wait on a client that takes nothing before its socket is
    /// closed with 1013 (it stopped reading).
    pub stall: std::time::Duration,
}

impl Default for WsLimits {
    fn default() -> Self {
        // 10,000 sockets: the fanout benchmark's largest cell uses one key.
        WsLimits {
            max_operations: 100,
            max_sockets_per_key: 10_000,
            stall: std::time::Duration::from_secs(30),
        }
    }
}

/// Open WebSockets per API key, for [`WsLimits::max_sockets_per_key`].
#[derive(Default)]
pub struct SocketCounts(std::sync::Mutex<std::collections::HashMap<String, usize>>);

/// One counted socket; uncounted when dropped.
pub struct SocketSlot {
    counts: Arc<App>,
    key_id: String,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut m = self.counts.ws_sockets.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.key_id) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key_id);
            }
        }
    }
}

pub use crate::live::Shedding;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Default::default(),
            max_body_bytes: 16 << 20,
            max_import_bytes: 1 << 30,
            append_rate: Some(crate::ratelimit::RateLimit::default()),
            group_commit_lanes: 2,
            cors_origins: Some(vec![]),
            shedding: Shedding::default(),
            ws: WsLimits::default(),
            pool_idle: Some(std::time::Duration::from_secs(60)),
        }
    }
}

/// Everything a request handler needs.
pub struct App {
    /// The service's pool.
    pub db: Db,
    /// Per-run append guards.
    pub guards: Arc<Guards>,
    /// Group commit of producer appends (when enabled).
    group: Option<storage::group::GroupCommit>,
    /// Live fan-out, cross-process notifications, and the folded views of runs.
    pub live: Arc<crate::live::Live>,
    /// Key lookups (shared with live streams, which re-check their key).
    pub auth: Arc<Authenticator>,
    /// Process metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Recent appends' trace contexts, for the deliveries' spans (OpenTelemetry).
    pub traces: crate::telemetry::Traces,
    /// Per-tenant append buckets.
    pub limiter: crate::ratelimit::RateLimiter,
    /// One clone per open WebSocket: the server's graceful shutdown does not wait for
    /// upgraded connections, so it waits on these before the process exits.
    sockets: Arc<()>,
    /// Limits and options.
    pub settings: Settings,
    /// Open GraphQL WebSockets per key.
    ws_sockets: SocketCounts,
}

/// Closes pooled connections idle for `idle`, checking every `idle / 2`. Each connection
/// keeps the buffers its largest read or write needed (tokio-postgres does not shrink
/// them): after 20 GraphQL WebSockets had carried 40,000 events of 2 KB, the 32
/// connections of the pool held some 70 MB, kept until the process ended.
async fn close_idle_connections(db: Db, idle: std::time::Duration) {
    let mut tick = tokio::time::interval((idle / 2).max(std::time::Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        db.pool.retain(|_, m| m.last_used() < idle);
    }
}

/// Shared handle to the application.
pub type AppRef = Arc<App>;

impl App {
    /// Wraps a pool and settings.
    pub fn new(db: Db, settings: Settings) -> AppRef {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let guards = Arc::new(Guards::default());
        let group = (settings.group_commit_lanes > 0).then(|| {
            storage::group::GroupCommit::start(
                db.clone(),
                guards.clone(),
                metrics.clone(),
                settings.group_commit_lanes,
            )
        });
        let auth = Arc::new(Authenticator::default());
        let live = Arc::new(crate::live::Live::start(db.clone(), auth.clone(), metrics.clone()));
        // A fresh set of guards has no sink yet, so this cannot be refused.
        let _ = guards.hand_commits_to(live.commit_sink());
        if let Some(idle) = settings.pool_idle {
            tokio::spawn(close_idle_connections(db.clone(), idle));
        }
        Arc::new(App {
            live,
            db,
            guards,
            group,
            auth,
            metrics,
            traces: Default::default(),
            limiter: Default::default(),
            sockets: Arc::new(()),
            settings,
            ws_sockets: SocketCounts::default(),
        })
    }

    /// Starts a graceful shutdown: open live streams end cleanly (clients resume from
    /// their cursor); requests in flight finish.
    pub fn shut_down(&self) {
        self.live.shut_down();
    }

    /// Held by an open WebSocket connection for as long as it is open.
    pub fn socket_open(&self) -> Arc<()> {
        self.sockets.clone()
    }

    /// Counts a GraphQL WebSocket against its key's cap; `None` when the key already
    /// has [`WsLimits::max_sockets_per_key`] open.
    pub fn ws_slot(self: &Arc<Self>, key_id: &str) -> Option<SocketSlot> {
        let mut m = self.ws_sockets.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(key_id.to_owned()).or_insert(0);
        if *n >= self.settings.ws.max_sockets_per_key {
            return None;
        }
        *n += 1;
        Some(SocketSlot { counts: self.clone(), key_id: key_id.to_owned() })
    }

    /// Waits until every WebSocket connection has closed, or `limit` has passed;
    /// false if some were still open.
    pub async fn sockets_closed(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while Arc::strong_count(&self.sockets) > 1 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }

    /// A receiver that turns true when the process starts shutting down.
    pub fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.live.stopping()
    }

    /// Resolves a presented key (`None` when the request carried none).
    pub async fn authenticate(&self, key: Option<&str>) -> Result<Principal> {
        let Some(key) = key else {
            return Err(Error::reject(
                ErrorCode::AuthMissing,
                "no API key: send `Authorization: Bearer <key>` (or `?access_token=<key>` from a browser)",
            ));
        };
        self.auth.lookup(&self.db, key).await?.ok_or_else(|| {
            Error::reject(ErrorCode::AuthInvalid, "the API key is not valid (unknown or revoked)")
        })
    }

    /// Creates a run, optionally as a sub-run of `parent`.
    pub async fn create_run(&self, who: &Principal, parent: Option<&str>) -> Result<RunInfo> {
        who.require(Scope::Write)?;
        let run = runs::create_run(&self.db, &who.tenant_id, parent).await?;
        self.guards.created(&who.tenant_id, &run.run_id);
        self.live.committed(&who.tenant_id, &run.run_id, 0);
        Ok(run)
    }

    /// Imports an exported run (JSONL) as a new run; every line is checked as an append
    /// is, and a bad line writes nothing.
    pub async fn import(&self, who: &Principal, body: &[u8]) -> Result<RunInfo> {
        who.require(Scope::Write)?;
        self.admit(who)?;
        let lines =
            crate::domain::jsonl::parse_export(body, self.settings.limits).map_err(Error::Rejected)?;
        let events = lines
            .into_iter()
            .map(|(line, l)| Ok(storage::import::Imported { ts: l.ts, event: l.event, line }));
        self.import_admitted(who, futures::stream::iter(events)).await
    }

    /// Imports a run from events read as they come (a file of any size, in constant
    /// memory): one transaction, so an error in the stream or a bad event writes
    /// nothing.
    pub async fn import_events<S>(&self, who: &Principal, events: S) -> Result<RunInfo>
    where
        S: futures::Stream<Item = Result<storage::import::Imported>> + Unpin,
    {
        who.require(Scope::Write)?;
        self.admit(who)?;
        self.import_admitted(who, events).await
    }

    /// The import itself, for a caller whose scope and rate were checked.
    async fn import_admitted<S>(&self, who: &Principal, events: S) -> Result<RunInfo>
    where
        S: futures::Stream<Item = Result<storage::import::Imported>> + Unpin,
    {
        let run = storage::import::import_run(&self.db, &who.tenant_id, events).await;
        let counted =
            run.as_ref().ok().map(|r| AppendOutcome { first_seq: 1, last_seq: r.last_seq, replayed: false });
        self.count(counted.as_ref(), true);
        let run = run?;
        self.live.committed(&who.tenant_id, &run.run_id, run.last_seq);
        Ok(run)
    }

    /// Appends a producer's batch (a request's: its group-commit lane is its tenant's).
    /// The batch is taken, not borrowed: its events go on to the lane as they are.
    pub async fn append(&self, who: &Principal, run_id: &str, batch: Batch) -> Result<AppendOutcome> {
        use tracing::Instrument;
        let span = append_span(run_id, &batch);
        self.append_in(who, run_id, batch, storage::group::Spread::ByTenant).instrument(span).await
    }

    /// Appends a group of a streaming append (its group-commit lane is its run's).
    pub async fn append_streamed(
        &self,
        who: &Principal,
        run_id: &str,
        batch: Batch,
    ) -> Result<AppendOutcome> {
        use tracing::Instrument;
        let span = append_span(run_id, &batch);
        self.append_in(who, run_id, batch, storage::group::Spread::ByRun).instrument(span).await
    }

    /// Either append, in the group-commit lane `spread` picks (when it goes to a lane).
    async fn append_in(
        &self,
        who: &Principal,
        run_id: &str,
        batch: Batch,
        spread: storage::group::Spread,
    ) -> Result<AppendOutcome> {
        who.require(Scope::Write)?;
        self.admit(who)?;
        // Sharing a commit pays off for small appends, whose commit is most of their
        // cost. A large batch already amortizes its commit; in a lane it would wait
        // behind other runs' appends and be copied into the queue.
        let lane = self.group.as_ref().filter(|_| batch.events.len() < storage::group::OWN_COMMIT_FROM);
        let started = std::time::Instant::now();
        let out = match lane {
            Some(g) => g.append(&who.tenant_id, run_id, batch, spread).await,
            None => {
                use tracing::Instrument;
                let (db, guards, tenant) = (&self.db, &self.guards, &who.tenant_id);
                storage::group::append_alone(db, guards, tenant, run_id, batch, Origin::Producer)
                    .instrument(tracing::info_span!(target: storage::TRACES, "commit", appends = 1))
                    .await
            }
        };
        let outcome = match &out {
            Ok(o) if o.replayed => "replayed",
            Ok(_) => "written",
            Err(_) => "rejected",
        };
        self.metrics.append_took(outcome, started.elapsed());
        // Group-commit lanes count their own transactions.
        self.count(out.as_ref().ok(), lane.is_none());
        let out = out?;
        self.committed(who, run_id, &out);
        Ok(out)
    }

    /// Takes one append from the tenant's rate-limit bucket.
    fn admit(&self, who: &Principal) -> Result<()> {
        self.limiter.check(self.settings.append_rate, &who.tenant_id).inspect_err(|_| {
            self.metrics.rate_limited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })
    }

    /// Counts a write (`None`: refused) in the metrics; `own_commit` when it committed in
    /// a transaction of its own.
    fn count(&self, out: Option<&AppendOutcome>, own_commit: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.metrics;
        match out {
            Some(o) if o.replayed => _ = m.appends_replayed.fetch_add(1, Relaxed),
            Some(o) => {
                m.appends.fetch_add(1, Relaxed);
                m.events.fetch_add((o.last_seq - o.first_seq + 1) as u64, Relaxed);
                if own_commit {
                    m.committed_group(1);
                }
            }
            None => _ = m.appends_rejected.fetch_add(1, Relaxed),
        }
    }

    /// Tells live subscribers (here and in other processes) about a write.
    fn committed(&self, who: &Principal, run_id: &str, out: &AppendOutcome) {
        if let (false, Ok(run_id)) = (out.replayed, runs::parse_run_id(run_id)) {
            let _span =
                tracing::info_span!(target: storage::TRACES, "notify", last_seq = out.last_seq).entered();
            self.traces.appended(&run_id, out.first_seq, out.last_seq);
            self.live.committed(&who.tenant_id, &run_id, out.last_seq);
        }
    }

    /// A run's row.
    pub async fn run(&self, who: &Principal, run_id: &str) -> Result<RunInfo> {
        who.require(Scope::Read)?;
        runs::get_run(&self.db, &who.tenant_id, run_id).await
    }

    /// A page of a run's events after `after_seq`, with the run's row.
    pub async fn events(
        &self,
        who: &Principal,
        run_id: &str,
        after_seq: i64,
        limit: i64,
        filter: &events::Filter,
    ) -> Result<(RunInfo, Vec<Event>)> {
        who.require(Scope::Read)?;
        if after_seq < 0 {
            return Err(Error::reject(ErrorCode::InvalidParameter, "`after_seq` must be 0 or more"));
        }
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                format!("`limit` must be between 1 and {MAX_PAGE}"),
            ));
        }
        events::page(&self.db, &who.tenant_id, run_id, after_seq, limit, filter).await
    }

    /// A run's row and its views.
    pub async fn view(&self, who: &Principal, run_id: &str) -> Result<(RunInfo, Arc<RunView>)> {
        who.require(Scope::Read)?;
        load_view(&self.db, &self.live.views, &who.tenant_id, run_id).await
    }

    /// A run's views at exactly `seq` (0 up to its last seq): the shared cached view and
    /// the events after it, or a fold from the log's start when `seq` is before the cache.
    pub async fn view_at(&self, who: &Principal, run_id: &str, seq: i64) -> Result<(RunInfo, RunView)> {
        who.require(Scope::Read)?;
        let (run, view) =
            crate::live::views::view_at(&self.db, &self.live.views, &who.tenant_id, run_id, seq).await?;
        if seq < 0 || seq > run.last_seq {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                format!("seq {seq} is outside the run's log, which ends at seq {}", run.last_seq),
            ));
        }
        Ok((run, view))
    }

    /// The encoding of `run` in `format` for a client standing at `cursor`: dialects
    /// that render from the view continue the fold up to its last complete event.
    pub async fn encoding(
        &self,
        who: &Principal,
        run: &RunInfo,
        format: crate::dialect::Format,
        cursor: &crate::dialect::Cursor,
    ) -> Result<crate::dialect::Encoding> {
        use crate::dialect::{Encoding, RunCtx};
        let ctx = RunCtx { run_id: run.run_id.clone(), root_run_id: run.root_run_id.clone() };
        let mut enc = Encoding::new(format, ctx.clone(), RunView::new());
        let base = cursor.complete_seq();
        if base > 0 && enc.needs_view() {
            let (_, view) = self.view_at(who, &run.run_id, base.min(run.last_seq)).await?;
            enc = Encoding::new(format, ctx, view);
            if cursor.is_plain() {
                enc = self.live.views.opening(&who.tenant_id, &run.run_id, enc);
            }
        }
        enc.resume_at(cursor.clone());
        Ok(enc)
    }

    /// The tail of a live stream encoded by `enc` from `base`: a dialect that reads the
    /// view gets its items from the run's shared fold (the tail's batches carry them), so
    /// the encoding hands its view to the tail, which needs it only for what it reads on
    /// its own.
    pub fn live_tail(
        &self,
        who: Principal,
        enc: &mut crate::dialect::Encoding,
        base: i64,
    ) -> crate::live::Tail {
        let want = crate::live::Want::of(enc.format());
        let view = want.and_then(|_| enc.detach_view());
        crate::live::Tail::rendering(self.live.clone(), who, enc.run().clone(), base, want, view)
    }

    /// A page of the tenant's runs, newest first.
    pub async fn list_runs(&self, who: &Principal, q: &runs::RunQuery) -> Result<Vec<RunInfo>> {
        who.require(Scope::Read)?;
        runs::list_runs(&self.db, &who.tenant_id, q).await
    }

    /// Applies a user's control action, written by the service under the run's lock.
    pub async fn control(&self, who: &Principal, run_id: &str, action: Control) -> Result<AppendOutcome> {
        who.require(Scope::Write)?;
        self.admit(who)?;
        let key_id = who.key_id.clone();
        let out = storage::append::append_control(&self.db, &self.guards, &who.tenant_id, run_id, move |g| {
            // Built again if another process appends to the run meanwhile.
            action.clone().events(g, &key_id)
        })
        .await;
        self.count(out.as_ref().ok(), true);
        let out = out?;
        self.committed(who, run_id, &out);
        Ok(out)
    }
}

/// An append's span, for traces only ([`storage::TRACES`]).
fn append_span(run_id: &str, batch: &Batch) -> tracing::Span {
    tracing::info_span!(target: storage::TRACES, "append", run_id = %run_id, events = batch.events.len())
}

/// Refuses a resume cursor that names events the run does not have: a client that
/// claims to have seen seq 57 of a run whose log ends at 42 is following another run (or
/// a run restored from an older backup), and skipping to "after 57" would hide from it
/// whatever comes next.
pub fn check_cursor(run: &RunInfo, cursor: &crate::dialect::Cursor) -> Result<()> {
    if cursor.max_seq() <= run.last_seq {
        return Ok(());
    }
    Err(Error::reject(
        ErrorCode::CursorBeyondEnd,
        format!(
            "the stream position `{cursor}` is beyond the end of run {}, whose last event is seq {}: \
             resume with an id this run's stream sent",
            run.run_id, run.last_seq
        ),
    ))
}

/// What a user can do to a running run (seed 004: AICORE-122 and AICORE-126).
#[derive(Debug, Clone)]
pub enum Control {
    /// Approve the pending plan; the run moves from awaiting_approval to running.
    ApprovePlan(Option<String>),
    /// Reject the pending plan; the run goes back to planning.
    RejectPlan(Option<String>),
    /// Pause a running run.
    Pause(Option<String>),
    /// Resume a paused run.
    Resume(Option<String>),
    /// Abort the run.
    Abort(Option<String>),
    /// Redirect the run with a new instruction (recorded as a user message).
    Redirect(String),
}

fn lifecycle(state: RunState, reason: Option<String>) -> NewEvent {
    NewEvent { child_id: None, key: None, body: EventBody::Lifecycle(Lifecycle { state, reason }) }
}

impl Control {
    /// The events the action appends, given the run's state. Illegal actions are refused
    /// here or by the guard with the append path's codes.
    fn events(self, g: &RunGuard, key_id: &str) -> Result<Vec<NewEvent>> {
        let decide = |decision: Decision, reason: Option<String>, next: RunState| -> Result<Vec<NewEvent>> {
            if g.state() != Some(RunState::AwaitingApproval) {
                return Err(Error::reject(
                    ErrorCode::LifecycleIllegal,
                    format!(
                        "a plan can be decided only while the run is awaiting_approval; it is {}",
                        g.state().map_or("new", RunState::as_str)
                    ),
                ));
            }
            let plan_id = g.pending_plan(None).ok_or_else(|| {
                Error::reject(ErrorCode::PlanNotPending, "the run has no plan awaiting a decision")
            })?;
            let verb = if decision == Decision::Approved { "approved" } else { "rejected" };
            Ok(vec![
                NewEvent {
                    child_id: None,
                    key: None,
                    body: EventBody::PlanDecision(PlanDecision {
                        plan_id: plan_id.to_owned(),
                        decision,
                        reason: reason.clone(),
                        decided_by: Some(key_id.to_owned()),
                    }),
                },
                lifecycle(next, Some(reason.unwrap_or_else(|| format!("plan {verb}")))),
            ])
        };
        match self {
            Control::ApprovePlan(r) => decide(Decision::Approved, r, RunState::Running),
            Control::RejectPlan(r) => decide(Decision::Rejected, r, RunState::Planning),
            Control::Pause(r) => {
                Ok(vec![lifecycle(RunState::Paused, r.or_else(|| Some("paused by user".into())))])
            }
            Control::Resume(r) => {
                Ok(vec![lifecycle(RunState::Running, r.or_else(|| Some("resumed by user".into())))])
            }
            Control::Abort(r) => {
                Ok(vec![lifecycle(RunState::Aborted, r.or_else(|| Some("aborted by user".into())))])
            }
            Control::Redirect(instruction) => {
                if instruction.trim().is_empty() {
                    return Err(Error::reject(
                        ErrorCode::InvalidParameter,
                        "a redirect needs an instruction",
                    ));
                }
                let id = format!("redirect-{}", g.last_seq() + 1);
                Ok(vec![
                    lifecycle(RunState::Redirecting, Some("redirected by user".into())),
                    NewEvent {
                        child_id: None,
                        key: None,
                        body: EventBody::MessageStart(MessageStart {
                            message_id: id.clone(),
                            role: Role::User,
                        }),
                    },
                    NewEvent {
                        child_id: None,
                        key: None,
                        body: EventBody::MessageEnd(MessageEnd {
                            message_id: Some(id),
                            stop_reason: None,
                            text: Some(instruction),
                        }),
                    },
                ])
            }
        }
    }
}
