//! The application core shared by every transport: state, authentication and the
//! operations (create a run, append, read). HTTP and GraphQL handlers are thin
//! adapters over these methods, so a rule enforced here holds on every surface.

use std::sync::Arc;

use crate::auth::{Authenticator, Principal, Scope};
use crate::domain::{Batch, Event, Origin};
use crate::error::{Error, ErrorCode, Result};
use crate::storage::{self, db::tenant_tx, events, runs, AppendOutcome, Db, Guards, RunInfo};

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
}

impl Default for Settings {
    fn default() -> Self {
        Settings { limits: Default::default(), max_body_bytes: 16 << 20, cors_origins: Some(vec![]) }
    }
}

/// Everything a request handler needs.
pub struct App {
    /// The service's pool.
    pub db: Db,
    /// Per-run append guards.
    pub guards: Guards,
    /// Key lookups.
    pub auth: Authenticator,
    /// Limits and options.
    pub settings: Settings,
}

/// Shared handle to the application.
pub type AppRef = Arc<App>;

impl App {
    /// Wraps a pool and settings.
    pub fn new(db: Db, settings: Settings) -> AppRef {
        Arc::new(App { db, guards: Guards::default(), auth: Authenticator::default(), settings })
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
        runs::create_run(&self.db, &who.tenant_id, parent).await
    }

    /// Appends a producer's batch.
    pub async fn append(&self, who: &Principal, run_id: &str, batch: &Batch) -> Result<AppendOutcome> {
        who.require(Scope::Write)?;
        storage::append(&self.db, &self.guards, &who.tenant_id, run_id, batch, Origin::Producer).await
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
        let run = runs::get_run(&self.db, &who.tenant_id, run_id).await?;
        let mut client = self.db.pool.get().await?;
        let tx = tenant_tx(&mut client, &who.tenant_id).await?;
        let evs = events::read_after(&tx, &who.tenant_id, &run.run_id, after_seq, limit).await?;
        tx.commit().await?;
        Ok((run, evs))
    }
}
