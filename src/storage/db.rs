//! Connections: the service pool (running as the non-owner role under RLS) and the
//! owner connection used by migrations and administrative commands.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Transaction};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{Client, NoTls};

use crate::error::{Error, Result};

/// The role every pooled connection switches to. It owns nothing and has no BYPASSRLS,
/// so row-level security applies to everything the request handlers run.
pub const SERVICE_ROLE: &str = "agent_stream_service";

/// The per-transaction setting the RLS policies compare `tenant_id` with.
pub const TENANT_SETTING: &str = "agent_stream.tenant_id";

/// Quotes an identifier for SQL (`"my""schema"`).
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Where the database is and which schema holds agent-stream's tables.
#[derive(Debug, Clone)]
pub struct DbConfig {
    /// A libpq-style URL or key=value string.
    pub url: String,
    /// Schema holding the tables (tests use one schema each).
    pub schema: String,
    /// Pool size.
    pub max_connections: usize,
}

/// The service's connection pool.
#[derive(Clone)]
pub struct Db {
    /// Pooled connections, already switched to [`SERVICE_ROLE`] and the schema.
    pub pool: Pool,
    /// The schema in use.
    pub schema: String,
    /// The owner's connection string (for the live listener and notifier).
    pub url: String,
}

fn pg_config(url: &str) -> Result<tokio_postgres::Config> {
    let mut cfg = tokio_postgres::Config::from_str(url)
        .map_err(|e| Error::Internal(anyhow::anyhow!("invalid DATABASE_URL: {e}")))?;
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(Duration::from_secs(5));
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("agent-stream");
    }
    Ok(cfg)
}

impl Db {
    /// Builds the pool. Connections are made lazily; call [`Db::check`] to fail fast.
    pub fn new(cfg: &DbConfig) -> Result<Db> {
        let pg = pg_config(&cfg.url)?;
        let mgr = Manager::from_config(pg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let setup = format!(
            "SET ROLE {SERVICE_ROLE}; SET search_path TO {}; SET statement_timeout = '30s'",
            quote_ident(&cfg.schema)
        );
        let pool = Pool::builder(mgr)
            .max_size(cfg.max_connections)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .post_create(Hook::async_fn(move |client, _| {
                let setup = setup.clone();
                Box::pin(async move {
                    client.batch_execute(&setup).await.map_err(HookError::Backend)?;
                    Ok(())
                })
            }))
            .build()
            .map_err(|e| Error::Internal(anyhow::anyhow!("building the pool: {e}")))?;
        Ok(Db { pool, schema: cfg.schema.clone(), url: cfg.url.clone() })
    }

    /// Gets a connection and runs a trivial query.
    pub async fn check(&self) -> Result<()> {
        let c = self.pool.get().await?;
        c.simple_query("SELECT 1").await?;
        Ok(())
    }
}

/// Scopes the current transaction to the tenant given as `$1`.
pub(crate) const SET_TENANT: &str = "SELECT set_config('agent_stream.tenant_id', $1, true)";

/// Opens a transaction scoped to `tenant` on `c` and runs `first` in it, in one round
/// trip: BEGIN, the tenant setting and `first`'s statements are sent together
/// (tokio-postgres sends requests in the order their futures are first polled, and
/// `join` polls in order; `first` must not have been polled). This is for transactions
/// driven by hand so that their statements can be pipelined: the caller ends the
/// transaction itself, and after an error closes the connection ([`discard`]).
pub async fn begin_with<T, E>(
    c: &ClientWrapper,
    tenant: &str,
    first: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T>
where
    Error: From<E>,
{
    // Prepared once per connection; after that, preparing costs nothing.
    let set = c.prepare_cached(SET_TENANT).await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&tenant];
    let (begun, scoped, out) = futures::join!(c.batch_execute("BEGIN"), c.execute(&set, &params), first);
    begun?;
    scoped?;
    Ok(out?)
}

/// Closes a pooled connection instead of returning it to the pool: after an error, a
/// transaction driven by hand ([`begin_with`]) may still be open on it.
pub fn discard(c: deadpool_postgres::Object) {
    drop(deadpool_postgres::Object::take(c));
}

/// Starts a transaction scoped to `tenant`: every RLS policy now sees this tenant only.
pub async fn tenant_tx<'a>(client: &'a mut ClientWrapper, tenant: &str) -> Result<Transaction<'a>> {
    let tx = client.transaction().await?;
    // Prepared once per connection: an unprepared statement costs a round trip of its
    // own to parse, and every transaction of the service starts here.
    let set = tx.prepare_cached(SET_TENANT).await?;
    tx.execute(&set, &[&tenant]).await?;
    Ok(tx)
}

/// Opens a single connection as the URL's own user (the schema owner), for migrations
/// and administration. The connection task ends when the client is dropped.
pub async fn connect_owner(url: &str, schema: &str) -> Result<Client> {
    let pg = pg_config(url)?;
    let (client, conn) = pg.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "owner connection closed");
        }
    });
    // The schema may not exist yet (first migration); search_path tolerates that.
    client.batch_execute(&format!("SET search_path TO {}", quote_ident(schema))).await?;
    Ok(client)
}
