//! Tenants and their API keys. These run on the owner connection: they are the
//! administrative path, outside any one tenant's row-level security.

use tokio_postgres::Client;
use ulid::Ulid;

use crate::auth::{generate_key, Scope};
use crate::error::{Error, ErrorCode, Result};

/// A created key: hand `secret` to the user once.
#[derive(Debug, Clone)]
pub struct IssuedKey {
    /// The tenant the key belongs to.
    pub tenant_id: String,
    /// Public id of the key.
    pub key_id: String,
    /// The key itself; never stored.
    pub secret: String,
}

/// Creates tenant `name` and a first key with `scopes`.
pub async fn create_tenant(client: &mut Client, name: &str, scopes: &[Scope]) -> Result<IssuedKey> {
    if !valid_name(name) {
        return Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!("tenant name `{name}` is invalid: use 1-63 lowercase letters, digits, `-` or `_`, starting with a letter or digit"),
        ));
    }
    let tx = client.transaction().await?;
    let tenant_id = Ulid::new().to_string();
    let inserted = tx
        .execute(
            "INSERT INTO tenants (tenant_id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&tenant_id, &name],
        )
        .await?;
    if inserted == 0 {
        return Err(Error::reject(
            ErrorCode::AlreadyExists,
            format!("tenant `{name}` already exists; use `agent-stream key create {name}` for another key"),
        ));
    }
    let key = insert_key(&tx, &tenant_id, scopes, Some("initial key")).await?;
    tx.commit().await?;
    Ok(key)
}

/// Issues another key for the tenant called `name`.
pub async fn create_key(
    client: &mut Client,
    name: &str,
    scopes: &[Scope],
    label: Option<&str>,
) -> Result<IssuedKey> {
    let tx = client.transaction().await?;
    let row = tx.query_opt("SELECT tenant_id FROM tenants WHERE name = $1", &[&name]).await?;
    let Some(row) = row else {
        return Err(Error::reject(ErrorCode::NotFound, format!("no tenant named `{name}`")));
    };
    let tenant_id: String = row.get(0);
    let key = insert_key(&tx, &tenant_id, scopes, label).await?;
    tx.commit().await?;
    Ok(key)
}

/// Revokes a key by its public id; true when a live key was revoked.
pub async fn revoke_key(client: &Client, key_id: &str) -> Result<bool> {
    let n = client
        .execute(
            "UPDATE api_keys SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL",
            &[&key_id],
        )
        .await?;
    Ok(n == 1)
}

/// The tenant id for `name`, if the tenant exists.
pub async fn tenant_id(client: &Client, name: &str) -> Result<Option<String>> {
    Ok(client.query_opt("SELECT tenant_id FROM tenants WHERE name = $1", &[&name]).await?.map(|r| r.get(0)))
}

async fn insert_key(
    tx: &tokio_postgres::Transaction<'_>,
    tenant_id: &str,
    scopes: &[Scope],
    label: Option<&str>,
) -> Result<IssuedKey> {
    if scopes.is_empty() {
        return Err(Error::reject(ErrorCode::InvalidParameter, "a key needs at least one scope"));
    }
    let key = generate_key();
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    tx.execute(
        "INSERT INTO api_keys (key_id, tenant_id, key_hash, scopes, label) VALUES ($1, $2, $3, $4, $5)",
        &[&key.key_id, &tenant_id, &key.hash.as_slice(), &scopes, &label],
    )
    .await?;
    Ok(IssuedKey { tenant_id: tenant_id.to_owned(), key_id: key.key_id, secret: key.secret })
}

/// A key as its tenant's admins see it (never the secret or its hash).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyInfo {
    /// Public id.
    pub key_id: String,
    /// What it may do.
    pub scopes: Vec<String>,
    /// A note.
    pub label: Option<String>,
    /// When it was issued.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The keys of the tenant the service transaction is scoped to, newest first.
pub async fn list_keys(tx: &tokio_postgres::Transaction<'_>, tenant_id: &str) -> Result<Vec<KeyInfo>> {
    let rows = tx
        .query(
            "SELECT key_id, scopes, label, created_at, revoked_at FROM api_keys WHERE tenant_id = $1
             ORDER BY created_at DESC, key_id",
            &[&tenant_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| KeyInfo {
            key_id: r.get(0),
            scopes: r.get(1),
            label: r.get(2),
            created_at: r.get(3),
            revoked_at: r.get(4),
        })
        .collect())
}

/// Issues a key for the tenant the service transaction is scoped to.
pub async fn issue_key(
    tx: &tokio_postgres::Transaction<'_>,
    tenant_id: &str,
    scopes: &[Scope],
    label: Option<&str>,
) -> Result<IssuedKey> {
    insert_key(tx, tenant_id, scopes, label).await
}

/// Revokes one of the scoped tenant's keys; false when it has no such live key.
pub async fn revoke_own_key(
    tx: &tokio_postgres::Transaction<'_>,
    tenant_id: &str,
    key_id: &str,
) -> Result<bool> {
    let n = tx
        .execute(
            "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND key_id = $2 AND revoked_at IS NULL",
            &[&tenant_id, &key_id],
        )
        .await?;
    Ok(n == 1)
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_')
}

/// An analyst login as created: its name, and what was done about the cluster's
/// other databases.
#[derive(Debug, Clone)]
pub struct AnalystLogin {
    /// The role name.
    pub role: String,
    /// Databases whose default CONNECT for PUBLIC was revoked (and granted instead to
    /// the logins that had it), so the analyst cannot connect to them.
    pub closed: Vec<String>,
    /// Databases the analyst can still connect to because this user may not change
    /// their privileges: a DBA should run `REVOKE CONNECT ON DATABASE ... FROM PUBLIC`.
    pub still_open: Vec<String>,
}

/// Creates a read-only PostgreSQL login for analysts of tenant `name`: a member of
/// `agent_stream_analyst` mapped to the tenant, so row-level security shows it that
/// tenant's rows only.
///
/// PostgreSQL grants CONNECT on every database to PUBLIC, so a new login could also
/// connect to the cluster's other databases. For each database other than this one that
/// the analyst could connect to, CONNECT is granted explicitly to the logins (other
/// than analysts) that have it now, then revoked from PUBLIC: nobody loses access, and
/// analysts (this one and later ones) have none. Roles created afterwards need an
/// explicit `GRANT CONNECT` for those databases.
pub async fn create_analyst(
    client: &mut Client,
    name: &str,
    role: &str,
    password: Option<&str>,
) -> Result<AnalystLogin> {
    let ok = !role.is_empty()
        && role.len() <= 63
        && role.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !role.starts_with("pg_");
    if !ok {
        return Err(Error::reject(
            ErrorCode::InvalidParameter,
            format!("role name `{role}` is invalid: use 1-63 lowercase letters, digits or `_`"),
        ));
    }
    let tx = client.transaction().await?;
    let Some(tenant_id) = tenant_id_in(&tx, name).await? else {
        return Err(Error::reject(ErrorCode::NotFound, format!("no tenant named `{name}`")));
    };
    let schema: String = tx.query_one("SELECT current_schema()", &[]).await?.get(0);
    let create: String = tx
        .query_one(
            "SELECT format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE agent_stream_analyst; \
                            ALTER ROLE %I SET search_path = %I', $1::text, $2::text, $1::text, $3::text)",
            &[&role, &password, &schema],
        )
        .await?
        .get(0);
    tx.batch_execute(&create).await.map_err(|e| match e.code() {
        Some(c) if *c == tokio_postgres::error::SqlState::DUPLICATE_OBJECT => {
            Error::reject(ErrorCode::AlreadyExists, format!("role `{role}` already exists"))
        }
        _ => Error::Db(e),
    })?;
    tx.execute("INSERT INTO analyst_logins (role_name, tenant_id) VALUES ($1, $2)", &[&role, &tenant_id])
        .await?;
    let mut tx = tx;
    let (closed, still_open) = close_other_databases(&mut tx, role).await?;
    tx.commit().await?;
    Ok(AnalystLogin { role: role.to_owned(), closed, still_open })
}

/// See [`create_analyst`]: the other databases `role` could connect to are closed to
/// PUBLIC, each in a savepoint, so one this user may not change is reported instead.
async fn close_other_databases(
    tx: &mut tokio_postgres::Transaction<'_>,
    role: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    // Two creations at once would update the same pg_database rows ("tuple concurrently
    // updated"): take turns.
    tx.execute("SELECT pg_advisory_xact_lock(hashtextextended('agent-stream analyst connect', 0))", &[])
        .await?;
    let open: Vec<String> = tx
        .query(
            "SELECT datname::text FROM pg_database
             WHERE datallowconn AND datname <> current_database()
               AND has_database_privilege($1, oid, 'CONNECT')
             ORDER BY datname",
            &[&role],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (mut closed, mut still_open) = (vec![], vec![]);
    for db in open {
        let sql: String = tx
            .query_one(
                "SELECT coalesce(string_agg(format('GRANT CONNECT ON DATABASE %I TO %I', $1::text, rolname), '; '), '')
                        || format('; REVOKE CONNECT ON DATABASE %I FROM PUBLIC', $1::text)
                 FROM pg_roles
                 WHERE rolcanlogin AND NOT rolsuper
                   AND NOT pg_has_role(oid, 'agent_stream_analyst', 'MEMBER')
                   AND has_database_privilege(oid, (SELECT oid FROM pg_database WHERE datname = $1), 'CONNECT')",
                &[&db],
            )
            .await?
            .get(0);
        let sp = tx.transaction().await?;
        match sp.batch_execute(sql.trim_start_matches("; ")).await {
            Ok(()) => {
                sp.commit().await?;
                closed.push(db);
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
                sp.rollback().await?;
                still_open.push(db);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((closed, still_open))
}

async fn tenant_id_in(tx: &tokio_postgres::Transaction<'_>, name: &str) -> Result<Option<String>> {
    Ok(tx.query_opt("SELECT tenant_id FROM tenants WHERE name = $1", &[&name]).await?.map(|r| r.get(0)))
}
