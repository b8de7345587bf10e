//! Connections: the service pool (running as the non-owner role under RLS) and the
//! owner connection used by migrations and administrative commands.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Transaction};
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::PgTarget;
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

/// A connection as tokio-postgres hands it over, TLS or not (the caller drives it).
pub type PgConnection =
    tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// Parses a connection string (TLS included, see [`super::tls`]) and applies the
/// service's defaults: a 5 s connect timeout and the application name.
pub fn target(url: &str) -> Result<PgTarget> {
    let mut t =
        PgTarget::parse(url).map_err(|e| Error::Internal(anyhow::anyhow!("invalid DATABASE_URL: {e}")))?;
    if t.config.get_connect_timeout().is_none() {
        t.config.connect_timeout(Duration::from_secs(5));
    }
    if t.config.get_application_name().is_none() {
        t.config.application_name("agent-stream");
    }
    Ok(t)
}

/// Opens one connection to `url` with its TLS settings, named `application_name` when
/// given. The caller drives the returned connection (or spawns it).
pub async fn connect_raw(url: &str, application_name: Option<&str>) -> Result<(Client, PgConnection)> {
    let mut t = target(url)?;
    if let Some(name) = application_name {
        t.config.application_name(name);
    }
    Ok(t.config.connect(t.tls).await?)
}

/// Opens one connection to `url` and drives it on a task of its own, which ends when
/// the client is dropped.
pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = connect_raw(url, None).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "database connection ended");
        }
    });
    Ok(client)
}

/// How the pool opens connections: with the URL's TLS settings, and a connection that
/// ends (the server restarted, the network broke) is noted at debug level only. The
/// pool drops it at its next use and opens another; what happened to the server is
/// logged once by whoever knows (the embedded supervisor, the failing request), instead
/// of one bare "Connection error" per pooled connection.
struct PoolConnect {
    tls: MakeRustlsConnect,
}

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> futures::future::BoxFuture<
        '_,
        std::result::Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let (tls, pg_config) = (self.tls.clone(), pg_config.clone());
        Box::pin(async move {
            let (client, conn) = pg_config.connect(tls).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "a pooled database connection ended");
                }
            });
            Ok((client, task))
        })
    }
}

impl Db {
    /// Builds the pool. Connections are made lazily; call [`Db::check`] to fail fast.
    pub fn new(cfg: &DbConfig) -> Result<Db> {
        let t = target(&cfg.url)?;
        let mgr = Manager::from_connect(
            t.config,
            PoolConnect { tls: t.tls },
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        // citus.propagate_set_commands: on Citus, the SET LOCAL of each transaction's tenant
        // ([`scope_sql`]) must reach the worker connections, where row-level security is
        // applied to the shards. On plain PostgreSQL the setting is an inert placeholder
        // (the `citus.` prefix is reserved only when Citus is loaded), so it is set
        // everywhere rather than after a round trip to find out.
        let setup = format!(
            "SET ROLE {SERVICE_ROLE}; SET search_path TO {}; SET statement_timeout = '30s'; \
             SET citus.propagate_set_commands = 'local'",
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

/// The statement that scopes the current transaction to `tenant`: every RLS policy then
/// sees this tenant only.
///
/// `SET LOCAL`, not `set_config(..., true)` with a parameter: Citus passes `SET LOCAL`
/// on to the worker connections of the transaction (with `citus.propagate_set_commands
/// = 'local'`, which every pooled connection sets), and does not pass on function calls,
/// so with `set_config` the workers' policies would see no tenant and match no row.
/// SET takes no parameters; tenant ids are ULIDs the service made, and anything else is
/// refused here rather than quoted.
pub fn scope_sql(tenant: &str) -> Result<String> {
    if tenant.is_empty() || !tenant.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(Error::Internal(anyhow::anyhow!("tenant id {tenant:?} is not a service-made id")));
    }
    Ok(format!("SET LOCAL {TENANT_SETTING} = '{tenant}'"))
}

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
    // Two messages, not one "BEGIN; SET LOCAL ...": Citus passes the SET on to the
    // workers as the text of the query it came in, and would repeat the BEGIN there.
    let scope = scope_sql(tenant)?;
    let (begun, scoped, out) = futures::join!(c.batch_execute("BEGIN"), c.batch_execute(&scope), first);
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
    let scope = scope_sql(tenant)?;
    let tx = client.transaction().await?;
    tx.batch_execute(&scope).await?;
    Ok(tx)
}

/// Opens a single connection as the URL's own user (the schema owner), for migrations
/// and administration. The connection task ends when the client is dropped.
pub async fn connect_owner(url: &str, schema: &str) -> Result<Client> {
    let client = connect(url).await?;
    // The schema may not exist yet (first migration); search_path tolerates that.
    client.batch_execute(&format!("SET search_path TO {}", quote_ident(schema))).await?;
    Ok(client)
}

/// Drops schemas named `<prefix>_<unix secs>_...` that are more than two hours old:
/// what crashed test or bench runs left behind.
pub async fn sweep_old_schemas(url: &str, prefix: &str, now: u64) {
    let Ok(c) = connect(url).await else {
        return;
    };
    let pattern = format!("{prefix}\\_%");
    let Ok(rows) = c.query("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1", &[&pattern]).await
    else {
        return;
    };
    for r in rows {
        let name: String = r.get(0);
        let born: Option<u64> =
            name.strip_prefix(prefix).and_then(|rest| rest.split('_').nth(1)?.parse().ok());
        if born.is_some_and(|b| b + 7200 < now) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await;
        }
    }
}
