//! Query and Mutation roots. Resolvers call the same [`App`] operations as the HTTP
//! handlers; event input goes through the same parser as HTTP bodies.

use std::sync::Arc;

use async_graphql::connection::{Connection, Edge, EmptyFields};
use async_graphql::{ComplexObject, Context, InputObject, Json, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::error::GqlResult;
use super::CallerResult;
use crate::app::AppRef;
use crate::app::{Control, MAX_PAGE};
use crate::auth::Principal;
use crate::domain::input::parse_event;
use crate::domain::{Batch, Event, RunState};
use crate::error::{Error, ErrorCode};
use crate::projection::RunView;
use crate::storage::events::Filter;
use crate::storage::runs::RunQuery;
use crate::storage::{AppendOutcome, RunInfo};

pub(super) fn app<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a AppRef> {
    ctx.data::<AppRef>()
}

pub(super) fn caller<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a Principal> {
    match ctx.data::<CallerResult>()? {
        Ok(p) => Ok(p),
        Err(r) => Err(Error::Rejected(r.clone())).gql(),
    }
}

/// An agent run.
#[derive(SimpleObject)]
#[graphql(name = "Run", complex)]
pub struct GqlRun {
    /// Run id (ULID).
    id: ID,
    /// Parent run, for sub-runs.
    parent_run_id: Option<ID>,
    /// Top of the run tree.
    root_run_id: ID,
    /// Creation time.
    created_at: DateTime<Utc>,
    /// Time of the last append.
    updated_at: DateTime<Utc>,
    /// Seq of the newest event (0 when empty).
    last_seq: i64,
    /// Current lifecycle state; null before the first `run.lifecycle` event.
    state: Option<RunState>,
    #[graphql(skip)]
    view: tokio::sync::OnceCell<Arc<RunView>>,
}

impl From<RunInfo> for GqlRun {
    fn from(r: RunInfo) -> Self {
        GqlRun {
            id: ID(r.run_id),
            parent_run_id: r.parent_run_id.map(ID),
            root_run_id: ID(r.root_run_id),
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_seq: r.last_seq,
            state: r.state,
            view: Default::default(),
        }
    }
}

impl GqlRun {
    fn with_view(r: RunInfo, view: Arc<RunView>) -> Self {
        let run = GqlRun::from(r);
        let _ = run.view.set(view);
        run
    }
}

#[ComplexObject]
impl GqlRun {
    /// The run's views (messages, tool calls, plan, lifecycle, steps, children,
    /// compaction), folded by the same reducer every surface uses.
    async fn view(&self, ctx: &Context<'_>) -> async_graphql::Result<Arc<RunView>> {
        let v = self
            .view
            .get_or_try_init(|| async {
                let (_, v) = app(ctx)?.view(caller(ctx)?, &self.id).await.gql()?;
                Ok::<_, async_graphql::Error>(v)
            })
            .await?;
        Ok(v.clone())
    }
}

/// A stored event.
pub struct GqlEvent {
    event: EventRef,
    /// With `runEvents(format:)` other than native: the dialect's items for the event.
    pub(super) encoded: Option<Vec<Value>>,
    /// True when `encoded` holds this subscriber's own opening snapshot, so that its
    /// rendering is not the one other subscribers of the page share.
    pub(super) own: bool,
}

/// Where an event's data lives: its own, or in a live page shared by every subscriber of
/// the run, so a subscription copies nothing and builds only the fields a client asks for.
/// An own event is boxed: a subscriber's events pass by value through half a dozen
/// stream adapters, and unboxed every live event carried an `Event`'s few hundred
/// bytes through each (copying them was 8% of the server's CPU at 1,000 GraphQL
/// subscribers, docs/benchmarks-log.md, 2026-12-02 19:00).
enum EventRef {
    Owned(Box<Event>),
    Shared(crate::live::Batch),
}

impl GqlEvent {
    /// The event at `i` of a live batch, without copying it.
    pub(super) fn shared(batch: &crate::live::Batch, i: usize) -> GqlEvent {
        GqlEvent { event: EventRef::Shared(batch.clone().slice(i..i + 1)), encoded: None, own: false }
    }

    /// The live page this event came in and its place there, when every subscriber of
    /// the run that asks the same renders it the same (see `super::shared`).
    pub(super) fn page(&self) -> Option<(&crate::live::Batch, usize)> {
        match &self.event {
            EventRef::Shared(b) if !self.own => Some((b, b.offset())),
            _ => None,
        }
    }

    /// The event.
    pub(super) fn event(&self) -> &Event {
        match &self.event {
            EventRef::Owned(e) => e,
            // A one-event slice of a page (see `shared`).
            EventRef::Shared(b) => &b.events()[0],
        }
    }
}

impl From<Event> for GqlEvent {
    fn from(e: Event) -> Self {
        GqlEvent { event: EventRef::Owned(Box::new(e)), encoded: None, own: false }
    }
}

/// A stored event.
#[Object(name = "Event")]
impl GqlEvent {
    /// ULID, monotonic per run.
    async fn id(&self) -> ID {
        ID(self.event().id.to_string())
    }

    /// Per-run position.
    async fn seq(&self) -> i64 {
        self.event().seq
    }

    /// Server time.
    async fn ts(&self) -> DateTime<Utc> {
        self.event().ts
    }

    /// Event type.
    #[graphql(name = "type")]
    async fn type_name(&self) -> String {
        self.event().body.type_name().into_owned()
    }

    /// The run.
    async fn run_id(&self) -> ID {
        ID(self.event().run_id.clone())
    }

    /// Set for a child's events.
    async fn child_id(&self) -> Option<&str> {
        self.event().child_id.as_deref()
    }

    /// Type-specific payload.
    async fn payload(&self) -> Value {
        self.event().body.payload()
    }

    /// With `runEvents(format:)` other than native: the items this event became in
    /// that dialect, in order (possibly none); null otherwise.
    async fn encoded(&self) -> Option<&[Value]> {
        self.encoded.as_deref()
    }
}

/// One event to append.
#[derive(InputObject)]
pub struct EventInput {
    /// Event type, e.g. `text.delta` or `custom.note`.
    #[graphql(name = "type")]
    type_name: String,
    /// Type-specific payload.
    payload: Option<Json<Value>>,
    /// Set for events of a spawned child.
    child_id: Option<String>,
    /// Idempotency key.
    key: Option<String>,
}

/// Where an append landed.
#[derive(SimpleObject)]
pub struct AppendResult {
    /// Seq of the first event.
    first_seq: i64,
    /// Seq of the last event.
    last_seq: i64,
    /// True when the batch was a retry and nothing was written.
    replayed: bool,
}

impl From<AppendOutcome> for AppendResult {
    fn from(o: AppendOutcome) -> Self {
        AppendResult { first_seq: o.first_seq, last_seq: o.last_seq, replayed: o.replayed }
    }
}

/// Read operations.
pub struct Query;

#[Object]
impl Query {
    /// A run of the caller's tenant, or null when there is none with this id.
    async fn run(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<GqlRun>> {
        match app(ctx)?.run(caller(ctx)?, &id).await {
            Ok(r) => Ok(Some(r.into())),
            Err(Error::Rejected(r)) if r.code == ErrorCode::RunNotFound => Ok(None),
            Err(e) => Err(e).gql(),
        }
    }

    /// The caller's runs, newest first, filtered by state and creation time.
    async fn runs(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Page size, 1-1000 (default 20).")] first: Option<i32>,
        #[graphql(desc = "Cursor: the endCursor of the previous page.")] after: Option<String>,
        state: Option<RunState>,
        created_after: Option<DateTime<Utc>>,
        created_before: Option<DateTime<Utc>>,
    ) -> async_graphql::Result<Connection<String, GqlRun, EmptyFields, EmptyFields>> {
        let first = first.unwrap_or(20);
        if !(1..=1000).contains(&first) {
            return Err(Error::reject(ErrorCode::InvalidParameter, "`first` must be between 1 and 1000"))
                .gql();
        }
        let before_run_id = after
            .map(|c| crate::storage::runs::parse_run_id(&c).map(std::borrow::Cow::into_owned))
            .transpose()
            .gql()?;
        let q = RunQuery {
            state,
            created_after,
            created_before,
            before_run_id: before_run_id.clone(),
            limit: i64::from(first) + 1,
        };
        let mut page = app(ctx)?.list_runs(caller(ctx)?, &q).await.gql()?;
        let has_next = page.len() > first as usize;
        page.truncate(first as usize);
        let mut conn = Connection::new(before_run_id.is_some(), has_next);
        conn.edges.extend(page.into_iter().map(|r| Edge::new(r.run_id.clone(), GqlRun::from(r))));
        Ok(conn)
    }

    /// A run's raw log after `afterSeq`, in seq order; the cursor is the seq.
    async fn events(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        #[graphql(desc = "Return events after this seq (default 0: from the start).")] after_seq: Option<i64>,
        #[graphql(desc = "Page size, 1-10000 (default 100).")] first: Option<i64>,
        #[graphql(desc = "Only these event types.")] types: Option<Vec<String>>,
        #[graphql(desc = "Only this child's events.")] child_id: Option<String>,
    ) -> async_graphql::Result<Connection<i64, GqlEvent, EmptyFields, EmptyFields>> {
        let (after_seq, first) = (after_seq.unwrap_or(0), first.unwrap_or(100));
        if !(1..=MAX_PAGE).contains(&first) {
            return Err(Error::reject(
                ErrorCode::InvalidParameter,
                format!("`first` must be between 1 and {MAX_PAGE}"),
            ))
            .gql();
        }
        let filter = Filter::new(types, child_id).gql()?;
        let (_, mut evs) =
            app(ctx)?.events(caller(ctx)?, &run_id, after_seq, first + 1, &filter).await.gql()?;
        let has_next = evs.len() > first as usize;
        evs.truncate(first as usize);
        let mut conn = Connection::new(after_seq > 0, has_next);
        conn.edges.extend(evs.into_iter().map(|e| Edge::new(e.seq, GqlEvent::from(e))));
        Ok(conn)
    }
}

/// Write operations.
pub struct Mutation;

#[Object]
impl Mutation {
    /// Creates a run, optionally as a sub-run of `parentRunId`.
    async fn create_run(
        &self,
        ctx: &Context<'_>,
        parent_run_id: Option<ID>,
    ) -> async_graphql::Result<GqlRun> {
        let run =
            app(ctx)?.create_run(caller(ctx)?, parent_run_id.as_ref().map(|p| p.as_str())).await.gql()?;
        Ok(run.into())
    }

    /// Appends a batch atomically; the same rules and error codes as `POST /v1/runs/{id}/events`.
    async fn append_events(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        events: Vec<EventInput>,
        expected_last_seq: Option<i64>,
    ) -> async_graphql::Result<AppendResult> {
        let app = app(ctx)?;
        let who = caller(ctx)?;
        let limits = app.settings.limits;
        crate::domain::input::check_batch_size(events.len(), limits).map_err(Error::Rejected).gql()?;
        let mut parsed = Vec::with_capacity(events.len());
        for (i, e) in events.into_iter().enumerate() {
            // Re-encode and go through the HTTP body parser: one set of rules, one size limit.
            let mut obj = serde_json::Map::new();
            obj.insert("type".into(), Value::String(e.type_name));
            if let Some(Json(p)) = e.payload {
                obj.insert("payload".into(), p);
            }
            if let Some(c) = e.child_id {
                obj.insert("child_id".into(), Value::String(c));
            }
            if let Some(k) = e.key {
                obj.insert("key".into(), Value::String(k));
            }
            let raw = serde_json::to_vec(&Value::Object(obj)).map_err(|e| Error::Internal(e.into())).gql()?;
            parsed.push(parse_event(&raw, limits).map_err(|r| Error::Rejected(r.at(i))).gql()?);
        }
        let batch = Batch { events: parsed, expected_last_seq };
        crate::domain::input::check_keys(&batch.events).map_err(Error::Rejected).gql()?;
        Ok(app.append(who, &run_id, batch).await.gql()?.into())
    }

    /// Approves the pending plan: writes `plan.decision` and moves the run from
    /// awaiting_approval to running.
    async fn approve_plan(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        reason: Option<String>,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::ApprovePlan(reason)).await
    }

    /// Rejects the pending plan: writes `plan.decision` and moves the run back to planning.
    async fn reject_plan(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        reason: Option<String>,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::RejectPlan(reason)).await
    }

    /// Pauses a running run.
    async fn pause_run(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        reason: Option<String>,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::Pause(reason)).await
    }

    /// Resumes a paused run.
    async fn resume_run(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        reason: Option<String>,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::Resume(reason)).await
    }

    /// Aborts the run (terminal).
    async fn abort_run(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        reason: Option<String>,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::Abort(reason)).await
    }

    /// Redirects the run: lifecycle `redirecting` plus the instruction as a user message.
    async fn redirect_run(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        instruction: String,
    ) -> async_graphql::Result<GqlRun> {
        control(ctx, run_id, Control::Redirect(instruction)).await
    }
}

async fn control(ctx: &Context<'_>, run_id: ID, action: Control) -> async_graphql::Result<GqlRun> {
    let app = app(ctx)?;
    let who = caller(ctx)?;
    app.control(who, &run_id, action).await.gql()?;
    let (run, view) = app.view(who, &run_id).await.gql()?;
    Ok(GqlRun::with_view(run, view))
}

#[cfg(test)]
mod tests {
    /// A subscriber's event stays a few words as it passes through the stream adapters
    /// (see `EventRef`): a live one is a slice of its page, an own one a box.
    #[test]
    fn an_event_in_a_subscription_is_a_few_words() {
        let size = std::mem::size_of::<super::GqlEvent>();
        assert!(size <= 64, "GqlEvent is {size} bytes");
        assert!(std::mem::size_of::<agent_stream_core::domain::Event>() > 2 * size, "boxing saves nothing");
    }
}
