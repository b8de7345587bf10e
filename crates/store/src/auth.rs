//! API keys: their format, hashing, scopes, and a short-lived lookup cache.
//!
//! A key looks like `ask_<key id>_<secret>`: the key id (12 hex digits) is public and
//! shows up in logs and in `plan.decision.decided_by`; the whole key is hashed with
//! SHA-256 and only the hash is stored. The secret carries 192 random bits, so a slow
//! password hash would add latency without adding safety.

// foldhash, not SipHash: the keys are SHA-256 digests, which no one can aim at a
// bucket, and SipHash was ~1% of a single append's instructions.
use foldhash::HashMap;
use std::sync::{Arc, Mutex};
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
    cache: Mutex<HashMap<[u8; 32], Entry>>,
}

/// A lookup answer and when it was made.
/// Shared, so that a stream's re-check of its key copies nothing.
type Cached = (Option<Arc<Principal>>, Instant);

/// A key's cached answer, and the gate its lookups pass one at a time.
///
/// When an answer expires, every request and open stream of that key finds it expired
/// at once: 1,000 streaming appends of one key sent up to a pool's worth of lookups
/// every [`AUTH_CACHE_TTL`], and the commits queued behind them for connections
/// (`many-runs`: seconds of 100-200 ms receipt p99 amid 15-30 ms ones, gone with the
/// answer kept for minutes; docs/benchmarks-log.md, 2026-11-29 22:10). Behind the gate,
/// one lookup refreshes the answer and the others take it, and a key in use is looked
/// up again before its answer expires ([`Found::Ahead`]). Written here rather than with
/// a coalescing cache crate (moka's `try_get_with`), which hands one error to every
/// waiter and so needs a cloneable error; here a failed lookup is simply tried again by
/// the next in line.
#[derive(Default)]
struct Entry {
    answer: Option<Cached>,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Authenticator {
    /// Looks a presented key up; `Ok(None)` when it is unknown or revoked.
    pub async fn lookup(&self, db: &Db, key: &str) -> Result<Option<Principal>> {
        if !well_formed(key) {
            return Ok(None);
        }
        Ok(self.lookup_hash(db, hash_key(key)).await?.map(Arc::unwrap_or_clone))
    }

    /// True while the key behind `who` is still valid (not revoked): open streams ask
    /// this as they go, so a revoked key stops them within [`AUTH_CACHE_TTL`] plus the
    /// time between checks.
    pub async fn still_valid(&self, db: &Db, who: &Principal) -> Result<bool> {
        Ok(self.lookup_hash(db, who.key_hash).await?.is_some())
    }

    async fn lookup_hash(&self, db: &Db, hash: [u8; 32]) -> Result<Option<Arc<Principal>>> {
        match self.find(&hash) {
            Found::Fresh(p) => Ok(p),
            Found::Ahead(p, turn) => match self.fetch(db, hash, turn).await {
                Ok(q) => Ok(q),
                Err(e) => {
                    tracing::warn!(error = %e, "refreshing an API key's lookup failed; its answer stands until it expires");
                    Ok(p)
                }
            },
            Found::Wait(gate) => {
                let turn = gate.lock_owned().await;
                // The lookup ahead in line may have answered.
                match self.find(&hash) {
                    Found::Fresh(p) | Found::Ahead(p, _) => Ok(p),
                    Found::Wait(_) => self.fetch(db, hash, turn).await,
                }
            }
        }
    }

    /// Looks the key up in the database and caches the answer; `_turn` is the key's gate,
    /// held until the answer is in the cache.
    async fn fetch(
        &self,
        db: &Db,
        hash: [u8; 32],
        _turn: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<Option<Arc<Principal>>> {
        let client = db.pool.get().await?;
        let stmt = client.prepare_cached("SELECT tenant_id, key_id, scopes FROM authenticate($1)").await?;
        let row = client.query_opt(&stmt, &[&hash.as_slice()]).await?;
        let principal = row.map(|r| {
            Arc::new(Principal {
                tenant_id: r.get(0),
                key_id: r.get(1),
                scopes: r.get::<_, Vec<String>>(2).iter().filter_map(|s| Scope::parse(s)).collect(),
                key_hash: hash,
            })
        });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut cache, &hash);
        cache.entry(hash).or_default().answer = Some((principal.clone(), Instant::now()));
        Ok(principal)
    }

    /// What the cache has for the key.
    fn find(&self, hash: &[u8; 32]) -> Found {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut cache, hash);
        let entry = cache.entry(*hash).or_default();
        match &entry.answer {
            Some((p, at)) if at.elapsed() < AUTH_CACHE_TTL / 2 => Found::Fresh(p.clone()),
            Some((p, at)) if at.elapsed() < AUTH_CACHE_TTL => match entry.gate.clone().try_lock_owned() {
                Ok(turn) => Found::Ahead(p.clone(), turn),
                Err(_) => Found::Fresh(p.clone()),
            },
            _ => Found::Wait(entry.gate.clone()),
        }
    }
}

/// A key's cached answer, as [`Authenticator::find`] finds it.
enum Found {
    /// An answer to take as it is.
    Fresh(Option<Arc<Principal>>),
    /// An answer past half its life, and the key's gate: this request looks the key up
    /// again while every other one still takes the answer, so that, while the key is in
    /// use, no request waits for a lookup when the answer expires.
    Ahead(Option<Arc<Principal>>, tokio::sync::OwnedMutexGuard<()>),
    /// No answer, or an expired one: wait at the gate for one lookup.
    Wait(Arc<tokio::sync::Mutex<()>>),
}

/// Keeps the cache under [`AUTH_CACHE_MAX`] keys before `hash` goes in: expired and
/// unanswered entries go first, everything if that is not enough.
fn make_room(cache: &mut HashMap<[u8; 32], Entry>, hash: &[u8; 32]) {
    if cache.len() < AUTH_CACHE_MAX || cache.contains_key(hash) {
        return;
    }
    cache.retain(|_, e| e.answer.as_ref().is_some_and(|(_, at)| at.elapsed() < AUTH_CACHE_TTL));
    if cache.len() >= AUTH_CACHE_MAX {
        cache.clear();
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
