//! Query and Mutation roots. Resolvers call the same [`App`] operations as the HTTP
//! handlers; event input goes through the same parser as HTTP bodies.

use async_graphql::{Context, Enum, InputObject, Json, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::error::GqlResult;
use super::CallerResult;
use crate::app::AppRef;
use crate::auth::Principal;
use crate::domain::input::parse_event;
use crate::domain::{Batch, RunState};
use crate::error::{Error, ErrorCode};
use crate::storage::{AppendOutcome, RunInfo};

fn app<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a AppRef> {
    ctx.data::<AppRef>()
}

fn caller<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a Principal> {
    match ctx.data::<CallerResult>()? {
        Ok(p) => Ok(p),
        Err(r) => Err(Error::Rejected(r.clone())).gql(),
    }
}

/// Lifecycle state of a run.
#[derive(Enum, Copy, Clone, Eq, PartialEq)]
#[graphql(name = "RunState", rename_items = "SCREAMING_SNAKE_CASE")]
pub enum GqlRunState {
    /// Plan being generated.
    Planning,
    /// Waiting for a user to approve the plan.
    AwaitingApproval,
    /// Executing.
    Running,
    /// Paused by a user.
    Paused,
    /// Redirect in progress.
    Redirecting,
    /// Completed (terminal).
    Done,
    /// Cancelled (terminal).
    Aborted,
    /// Failed (terminal).
    Error,
}

impl From<RunState> for GqlRunState {
    fn from(s: RunState) -> Self {
        match s {
            RunState::Planning => GqlRunState::Planning,
            RunState::AwaitingApproval => GqlRunState::AwaitingApproval,
            RunState::Running => GqlRunState::Running,
            RunState::Paused => GqlRunState::Paused,
            RunState::Redirecting => GqlRunState::Redirecting,
            RunState::Done => GqlRunState::Done,
            RunState::Aborted => GqlRunState::Aborted,
            RunState::Error => GqlRunState::Error,
        }
    }
}

/// An agent run.
#[derive(SimpleObject)]
#[graphql(name = "Run")]
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
    state: Option<GqlRunState>,
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
            state: r.state.map(Into::into),
        }
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
        if events.is_empty() {
            return Err(Error::reject(ErrorCode::BatchEmpty, "the batch holds no events")).gql();
        }
        if events.len() > limits.max_batch_events {
            return Err(Error::reject(
                ErrorCode::BatchTooLarge,
                format!("a batch holds at most {} events", limits.max_batch_events),
            ))
            .gql();
        }
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
        Ok(app.append(who, &run_id, &batch).await.gql()?.into())
    }
}
