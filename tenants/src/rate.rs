//! Requests a second, per tenant: a token bucket that holds one second of requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::{Exceeded, Quota, TenantId};

#[derive(Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<TenantId, (f64, Instant)>>,
}

impl RateLimiter {
    /// Takes one request of `tenant`'s allowance of `rate` a second, or says when to retry.
    pub fn take(&self, tenant: TenantId, rate: u64, now: Instant) -> Result<(), Exceeded> {
        let rate_f = rate as f64;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = buckets.entry(tenant).or_insert((rate_f, now));
        let elapsed = now.saturating_duration_since(*at).as_secs_f64();
        *tokens = (*tokens + elapsed * rate_f).min(rate_f.max(1.0));
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait = if rate == 0 { 1.0 } else { (1.0 - *tokens) / rate_f };
        Err(Exceeded {
            quota: Quota::RequestsPerSecond,
            limit: rate,
            used: rate,
            retry_after_secs: Some(wait.ceil().max(1.0) as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_of_one_second_then_refusals_until_refilled() {
        let limiter = RateLimiter::default();
        let (a, b) = (TenantId(2), TenantId(3));
        let t0 = Instant::now();
        for _ in 0..5 {
            limiter.take(a, 5, t0).unwrap();
        }
        let e = limiter.take(a, 5, t0).unwrap_err();
        assert_eq!(e.retry_after_secs, Some(1));
        limiter.take(b, 5, t0).expect("tenants have their own buckets");
        limiter.take(a, 5, t0 + Duration::from_millis(200)).unwrap();
        assert!(limiter.take(a, 5, t0 + Duration::from_millis(200)).is_err());
        assert!(
            limiter.take(a, 0, t0 + Duration::from_secs(9)).is_err(),
            "0 refuses all"
        );
    }
}
