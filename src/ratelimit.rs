//! Per-tenant append rate limits: a token bucket per tenant, refilled continuously.
//! A refused append answers `429 RATE-LIMITED` with `Retry-After` and writes nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::error::{Error, ErrorCode, Result};

/// Appends per second a tenant may sustain, and how many it may send at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained appends per second.
    pub per_sec: f64,
    /// Bucket size (burst).
    pub burst: f64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit { per_sec: 10_000.0, burst: 20_000.0 }
    }
}

/// Buckets by tenant.
#[derive(Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Tenants tracked before idle full buckets are forgotten.
const MAX_TENANTS: usize = 100_000;

impl RateLimiter {
    /// Takes one token for `tenant`, or refuses.
    pub fn check(&self, limit: Option<RateLimit>, tenant: &str) -> Result<()> {
        let Some(limit) = limit else { return Ok(()) };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_TENANTS {
            buckets
                .retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * limit.per_sec < limit.burst);
        }
        let (tokens, at) = buckets.entry(tenant.to_owned()).or_insert((limit.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * limit.per_sec).min(limit.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Error::reject(
                ErrorCode::RateLimited,
                format!(
                    "this tenant's append rate limit ({} per second, bursts of {}) is reached; retry after a second",
                    limit.per_sec, limit.burst
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_refuses_per_tenant() {
        let rl = RateLimiter::default();
        let limit = Some(RateLimit { per_sec: 0.001, burst: 3.0 });
        for _ in 0..3 {
            rl.check(limit, "a").expect("within the burst");
        }
        assert_eq!(rl.check(limit, "a").unwrap_err().code(), ErrorCode::RateLimited);
        rl.check(limit, "b").expect("other tenants have their own bucket");
        rl.check(None, "a").expect("no limit configured");
    }
}
