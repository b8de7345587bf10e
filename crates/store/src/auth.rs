//! API keys: their format, hashing, scopes, and a short-lived lookup cache.
//!
//! A key looks like `ask_<key id>_<secret>`: the key id (12 hex digits) is public and
//! shows up in logs and in `plan.decision.decided_by`; the whole key is hashed with
//! SHA-256 and only the hash is stored. The secret carries 192 random bits, so a slow
//! password hash would add latency without adding safety.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorCode, Result};
use crate::Db;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Read runs, events and views.
    Read,
    /// Create runs and append events.
    Write,
    /// Manage keys and control runs on behalf of users.
    Admin,
}

impl Scope {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }

    /// Parses the stored form.
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

/// The authenticated caller of a request.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant every query of the request is scoped to.
    pub tenant_id: String,
    /// The public part of the key.
    pub key_id: String,
    /// What the key may do.
    pub scopes: Vec<Scope>,
    /// SHA-256 of the presented key, so open streams can re-check it (never logged).
    pub(crate) key_hash: [u8; 32],
}

/// Without the key hash: a principal may end up in a log line.
impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principal")
            .field("tenant_id", &self.tenant_id)
            .field("key_id", &self.key_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl Principal {
    /// Fails with 403-style `AUTH-SCOPE` unless the key has `scope`.
    pub fn require(&self, scope: Scope) -> Result<()> {
        if self.scopes.contains(&scope) {
            Ok(())
        } else {
            Err(Error::reject(
                ErrorCode::AuthScope,
                format!("this API key lacks the `{}` scope", scope.as_str()),
            ))
        }
    }
}

/// A freshly generated key: show `secret` once, store `hash`.
pub struct NewKey {
    /// Public id.
    pub key_id: String,
    /// The full key to hand to the user.
    pub secret: String,
    /// SHA-256 of `secret`.
    pub hash: [u8; 32],
}

/// Makes a new random key.
pub fn generate_key() -> NewKey {
    let mut id = [0u8; 6];
    let mut secret = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut id);
    rand::thread_rng().fill_bytes(&mut secret);
    let key_id = hex::encode(id);
    let full = format!("ask_{key_id}_{}", hex::encode(secret));
    NewKey { hash: hash_key(&full), key_id, secret: full }
}

/// SHA-256 of a presented key.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// True when `key` has the shape of one of our keys (cheap check before any I/O).
pub fn well_formed(key: &str) -> bool {
    let mut parts = key.splitn(3, '_');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some("ask"), Some(id), Some(secret))
            if id.len() == 12 && secret.len() == 48
                && id.bytes().chain(secret.bytes()).all(|b| b.is_ascii_hexdigit())
    )
}

/// How long a lookup is trusted. Revocation takes effect within this time.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(2);
const AUTH_CACHE_MAX: usize = 10_000;

/// Resolves keys to principals, caching answers (also negative ones) briefly so a busy
/// producer does not pay a database round trip per request.
#[derive(Default)]
pub struct Authenticator {
    cache: Mutex<HashMap<[u8; 32], Cached>>,
}

/// A lookup answer and when it was made.
type Cached = (Option<Principal>, Instant);

impl Authenticator {
    /// Looks a presented key up; `Ok(None)` when it is unknown or revoked.
    pub async fn lookup(&self, db: &Db, key: &str) -> Result<Option<Principal>> {
        if !well_formed(key) {
            return Ok(None);
        }
        self.lookup_hash(db, hash_key(key)).await
    }

    /// True while the key behind `who` is still valid (not revoked): open streams ask
    /// this as they go, so a revoked key stops them within [`AUTH_CACHE_TTL`] plus the
    /// time between checks.
    pub async fn still_valid(&self, db: &Db, who: &Principal) -> Result<bool> {
        Ok(self.lookup_hash(db, who.key_hash).await?.is_some())
    }

    async fn lookup_hash(&self, db: &Db, hash: [u8; 32]) -> Result<Option<Principal>> {
        if let Some((p, at)) = self.cache_get(&hash) {
            if at.elapsed() < AUTH_CACHE_TTL {
                return Ok(p);
            }
        }
        let client = db.pool.get().await?;
        let stmt = client.prepare_cached("SELECT tenant_id, key_id, scopes FROM authenticate($1)").await?;
        let row = client.query_opt(&stmt, &[&hash.as_slice()]).await?;
        let principal = row.map(|r| Principal {
            tenant_id: r.get(0),
            key_id: r.get(1),
            scopes: r.get::<_, Vec<String>>(2).iter().filter_map(|s| Scope::parse(s)).collect(),
            key_hash: hash,
        });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= AUTH_CACHE_MAX {
            cache.retain(|_, (_, at)| at.elapsed() < AUTH_CACHE_TTL);
            if cache.len() >= AUTH_CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(hash, (principal.clone(), Instant::now()));
        Ok(principal)
    }

    fn cache_get(&self, hash: &[u8; 32]) -> Option<Cached> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(hash).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate_key();
        let b = generate_key();
        assert!(well_formed(&a.secret), "{}", a.secret);
        assert_ne!(a.secret, b.secret);
        assert_eq!(a.hash, hash_key(&a.secret));
        assert!(a.secret.contains(&a.key_id));
    }

    #[test]
    fn malformed_keys_are_refused_without_io() {
        for k in ["", "ask_", "Bearer x", "ask_zzzzzzzzzzzz_00", &"a".repeat(5000)] {
            assert!(!well_formed(k), "{k}");
        }
    }
}
