//! The HTTP API described for machines: an OpenAPI 3.1 document generated with
//! `utoipa` from the handlers' annotations and their parameter structs, served at
//! `GET /openapi.json`, and a JSON Schema of the event vocabulary at
//! `GET /schema/events.json`. A test keeps the document's routes and the router's the
//! same, and validates the document with a standard validator.
//!
//! The bodies the store and the core crates serialize (a run, an event, the view) are
//! described here by schema types of the same shape; a test compares their fields
//! with what the service really sends.

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::error::ErrorCode;

/// A run's row.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Run {
    /// The run id (a ULID).
    run_id: String,
    /// The parent, for a sub-run.
    parent_run_id: Option<String>,
    /// The top of the run tree (the run itself for a top-level run).
    root_run_id: String,
    /// Creation time.
    created_at: chrono::DateTime<chrono::Utc>,
    /// Time of the last append.
    updated_at: chrono::DateTime<chrono::Utc>,
    /// Seq of the newest event (0 while empty).
    last_seq: i64,
    /// The lifecycle state; null before the first `run.lifecycle`.
    state: Option<RunState>,
}

/// A run's lifecycle state.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum RunState {
    /// Plan being generated.
    Planning,
    /// Plan proposed, waiting for a decision.
    AwaitingApproval,
    /// Executing.
    Running,
    /// Paused by a user.
    Paused,
    /// Taking a user's new instruction.
    Redirecting,
    /// Finished.
    Done,
    /// Stopped by a user.
    Aborted,
    /// Failed.
    Error,
}

/// The answer to an append.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Appended {
    /// Seq of the batch's first event.
    first_seq: i64,
    /// Seq of its last event.
    last_seq: i64,
    /// True for a retry answered from the stored events (nothing written).
    replayed: bool,
}

/// One event a producer sends.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EventInput {
    /// The event type (see `/schema/events.json`), or a custom `x-` type.
    #[schema(rename = "type")]
    type_: String,
    /// The type's payload.
    payload: Option<Value>,
    /// The child run scope the event belongs to.
    child_id: Option<String>,
    /// An idempotency key: a retry with the same key writes nothing.
    key: Option<String>,
}

/// An append's JSON body: an array of events, or an object with an optimistic check.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum AppendBody {
    /// The events, in order.
    Events(Vec<EventInput>),
    /// The events and the run's expected last seq.
    Checked(CheckedBatch),
}

/// `{"events": [...], "expected_last_seq": n}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CheckedBatch {
    /// The events, in order.
    events: Vec<EventInput>,
    /// The append succeeds only if the run's last seq is still this.
    expected_last_seq: Option<i64>,
}

/// A stored event: the envelope every surface shares.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Event {
    /// A ULID, increasing within a run.
    id: String,
    /// Server time, millisecond precision.
    ts: chrono::DateTime<chrono::Utc>,
    /// The event type.
    #[schema(rename = "type")]
    type_: String,
    /// The run.
    run_id: String,
    /// The child scope, or null.
    child_id: Option<String>,
    /// 1, 2, 3, ... per run, with no gaps.
    seq: i64,
    /// The type's payload.
    payload: Value,
}

/// A page of a run's log.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EventPage {
    /// The run.
    run_id: String,
    /// Its newest seq.
    last_seq: i64,
    /// The cursor for the next page (`after_seq`).
    next_after_seq: i64,
    /// The events, in seq order.
    events: Vec<Event>,
}

/// The run's views as the reducer folds them (shapes in the README, "Views").
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct View {
    /// The seq the view is at.
    seq: i64,
    /// State and transitions.
    lifecycle: Value,
    /// Messages with their blocks.
    messages: Vec<Value>,
    /// Tool calls.
    tools: Vec<Value>,
    /// The current plan, if any.
    plan: Option<Value>,
    /// Steps.
    steps: Vec<Value>,
    /// Child runs.
    children: Vec<Value>,
    /// Compaction state.
    compaction: Value,
    /// What the reducer found odd.
    anomalies: Vec<Value>,
}

/// An error: `{"error": {"code", "message", "index"?}}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    error: ErrorDetail,
}

/// The error itself.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// The stable code (see the README's table).
    #[schema(schema_with = error_codes)]
    code: String,
    /// What went wrong, for people.
    message: String,
    /// The offending event's index in the batch, when one is to blame.
    index: Option<i64>,
    /// Seed 004's code for the same condition, where the seed defines one
    /// (`KAI-STREAM-CONN-0002`, `KAI-STREAM-PROTO-0001`, `KAI-STREAM-PROTO-0002`).
    kai_code: Option<String>,
}

fn error_codes() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
        .build()
}

/// One of the tenant's keys (never its secret).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct KeyInfo {
    /// The public id (the 12 hex digits after `ask_`).
    key_id: String,
    /// `read`, `write`, `admin`.
    scopes: Vec<String>,
    /// A note.
    label: Option<String>,
    /// When it was issued.
    created_at: chrono::DateTime<chrono::Utc>,
    /// When it was revoked, if it was.
    revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The tenant's keys.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct KeyList {
    keys: Vec<KeyInfo>,
}

/// A new key: its secret is shown this once.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct NewKeyAnswer {
    /// The public id.
    key_id: String,
    /// The secret key (`ask_<id>_<secret>`).
    key: String,
    /// Its scopes.
    scopes: Vec<String>,
    /// Its label.
    label: Option<String>,
}

/// `/readyz`'s answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Readiness {
    /// Both below.
    ready: bool,
    /// The database answered within 2 s.
    database: bool,
    /// The LISTEN connection is up.
    listener: bool,
}

/// A GraphQL request.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct GraphqlRequest {
    /// The document.
    query: String,
    /// Its variables.
    variables: Option<Value>,
    /// The operation to run.
    #[schema(rename = "operationName")]
    operation_name: Option<String>,
}

/// A GraphQL response (the schema is at `agent-stream schema`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct GraphqlResponse {
    /// The result.
    data: Option<Value>,
    /// Errors; each has `extensions.code`.
    errors: Option<Vec<Value>>,
}

struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key: `Authorization: Bearer ask_...`"))
                    .build(),
            ),
        );
        c.add_security_scheme(
            "access_token",
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "access_token",
                "The API key in the URL, for browsers' EventSource (streams only)",
            ))),
        );
    }
}

/// Every error response names the codes its status stands for.
struct ErrorCodes;

impl Modify for ErrorCodes {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        for item in api.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch]
                .into_iter()
                .flatten()
            {
                for (status, resp) in op.responses.responses.iter_mut() {
                    let utoipa::openapi::RefOr::T(resp) = resp else { continue };
                    if resp.description != "error" {
                        continue;
                    }
                    let codes: Vec<String> = ErrorCode::ALL
                        .iter()
                        .filter(|c| super::error::status(**c).as_str() == status)
                        .map(|c| format!("`{}`", c.as_str()))
                        .collect();
                    resp.description = format!("An error: {}", codes.join(", "));
                }
            }
        }
    }
}

/// The document's source.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "agent-stream",
        description = "Durable, multi-tenant event log and live stream for AI-agent runs. \
                       Errors are `{\"error\": {\"code\", \"message\", \"index\"?, \"kai_code\"?}}` with a stable code.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(
        super::runs::create,
        super::runs::list_runs,
        super::runs::get,
        super::runs::append,
        super::append_stream::append_stream,
        super::runs::list,
        super::runs::view,
        super::stream::stream,
        super::replay::replay,
        super::jsonl::export,
        super::jsonl::export_all,
        super::jsonl::import,
        super::chat::send,
        super::chat::resume,
        super::agui::run,
        super::durable::read,
        super::seed::stream,
        super::seed::approve_plan,
        super::ui::index,
        super::ui::run_page,
        super::ui::asset,
        super::ui::fold_export,
        super::keys::list,
        super::keys::create,
        super::keys::revoke,
        super::health::alive,
        super::health::ready,
        super::health::metrics,
        crate::graphql::graphql,
        crate::graphql::graphiql,
        crate::graphql::graphiql_asset,
        crate::graphql::ws::graphql_ws,
        openapi_json,
        events_schema,
    ),
    components(schemas(ErrorBody, ErrorDetail, Event, EventInput, RunState)),
    modifiers(&Security, &ErrorCodes),
    tags(
        (name = "runs", description = "Runs and their views"),
        (name = "events", description = "Appending and reading the log"),
        (name = "live", description = "Server-Sent Events: live and replayed"),
        (name = "jsonl", description = "Export and import"),
        (name = "keys", description = "A tenant's API keys (admin scope)"),
        (name = "clients", description = "Standard clients as they are: AI SDK chat, AG-UI, Durable Streams"),
        (name = "graphql", description = "GraphQL over HTTP and WebSocket"),
        (name = "ui", description = "The run inspector: a browser page served by the service"),
        (name = "operations", description = "Health, readiness, metrics and these documents"),
    )
)]
pub struct ApiDoc;

/// The OpenAPI document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
pub(crate) async fn openapi_json() -> Response {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(|| serde_json::to_value(document()).unwrap_or_default())).into_response()
}

/// `GET /schema/events.json`: the event vocabulary as a JSON Schema.
#[utoipa::path(get, path = "/schema/events.json", tag = "operations",
    responses((status = 200, description = "A JSON Schema (2020-12) of the events this service accepts and stores", body = Object)))]
pub(crate) async fn events_schema() -> Response {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(event_vocabulary)).into_response()
}

/// The payload schema of a built-in event type, by name.
fn payload_schema(type_name: &str) -> Option<&'static str> {
    Some(match type_name {
        "run.lifecycle" => "Lifecycle",
        "message.start" => "MessageStart",
        "message.end" => "MessageEnd",
        "text.delta" | "reasoning.delta" => "Delta",
        "tool.start" => "ToolStart",
        "tool.progress" => "ToolProgress",
        "tool.end" => "ToolEnd",
        "step.boundary" => "StepBoundary",
        "child.spawn" => "ChildSpawn",
        "plan.proposal" => "PlanProposal",
        "plan.decision" => "PlanDecision",
        "compaction.start" => "CompactionStart",
        "compaction.end" => "CompactionEnd",
        _ => return None,
    })
}

/// The payload types' schemas and those they refer to, generated from the event model.
fn payload_defs() -> serde_json::Map<String, Value> {
    use crate::domain::event as e;
    use utoipa::openapi::{RefOr, Schema};
    fn add<T: ToSchema>(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push((T::name().into_owned(), T::schema()));
        T::schemas(out);
    }
    let mut all = vec![];
    add::<e::Lifecycle>(&mut all);
    add::<e::MessageStart>(&mut all);
    add::<e::MessageEnd>(&mut all);
    add::<e::Delta>(&mut all);
    add::<e::ToolStart>(&mut all);
    add::<e::ToolProgress>(&mut all);
    add::<e::ToolEnd>(&mut all);
    add::<e::StepBoundary>(&mut all);
    add::<e::ChildSpawn>(&mut all);
    add::<e::PlanProposal>(&mut all);
    add::<e::PlanDecision>(&mut all);
    add::<e::CompactionStart>(&mut all);
    add::<e::CompactionEnd>(&mut all);
    all.into_iter().map(|(name, schema)| (name, serde_json::to_value(schema).unwrap_or_default())).collect()
}

/// The event vocabulary as JSON Schema 2020-12: the stored envelope, whose `payload`
/// is checked by its `type` (one `if`/`then` per built-in type; `custom.<name>`
/// carries any JSON).
pub fn event_vocabulary() -> Value {
    let types = crate::domain::event::EVENT_TYPES;
    let rules: Vec<Value> = types
        .iter()
        .filter_map(|t| {
            let def = payload_schema(t)?;
            Some(json!({
                "if": {"properties": {"type": {"const": t}}},
                "then": {"properties": {"payload": {"$ref": format!("#/$defs/{def}")}}}
            }))
        })
        .collect();
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://agent-stream.invalid/schema/events.json",
        "title": "agent-stream event",
        "description": "A stored event: the envelope every surface shares (HTTP pages, JSONL lines, \
                        SSE `native` data, GraphQL `Event`), with its payload checked by its type.",
        "type": "object",
        "required": ["id", "ts", "type", "run_id", "child_id", "seq", "payload"],
        "additionalProperties": false,
        "properties": {
            "id": {"type": "string", "description": "A ULID, increasing within a run", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"},
            "ts": {"type": "string", "format": "date-time", "description": "Server time, millisecond precision"},
            "type": {"anyOf": [{"enum": types}, {"type": "string", "pattern": "^custom\\..+"}]},
            "run_id": {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"},
            "child_id": {"type": ["string", "null"]},
            "seq": {"type": "integer", "minimum": 1},
            "payload": {}
        },
        "allOf": rules,
        "$defs": payload_defs(),
    });
    // utoipa refers to components; here they are definitions of this document.
    let text = schema.to_string().replace("#/components/schemas/", "#/$defs/");
    serde_json::from_str(&text).unwrap_or(schema)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_built_in_type_has_a_payload_schema() {
        let defs = super::payload_defs();
        for t in crate::domain::event::EVENT_TYPES {
            let def = super::payload_schema(t).unwrap_or_else(|| panic!("{t} has no schema"));
            assert!(defs.contains_key(def), "{t}: {def}");
        }
        let text = super::event_vocabulary().to_string();
        assert!(!text.contains("#/components/"), "every reference resolves inside the schema");
    }
}
