//! Per-token rate limits: a token bucket per API token, so that one caller flooding the
//! service (a runaway supervisor, a retry storm) is answered 429 with `Retry-After` while
//! every other caller keeps its share. Per instance: with N instances behind a load
//! balancer a token gets up to N times the rate.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A rate and the burst allowed above it (a setting: `config::RateLimit`).
pub use crate::config::RateLimit as Limit;

/// A bucket: `tokens` left at `at` (seconds on a monotonic clock).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub at: f64,
}

impl Bucket {
    pub fn full(limit: Limit, at: f64) -> Bucket {
        Bucket {
            tokens: limit.burst,
            at,
        }
    }
}

/// Take one request from the bucket at `now`: the bucket after, and `Err(seconds)` to wait
/// when it is empty.
pub fn take(b: Bucket, now: f64, limit: Limit) -> (Bucket, Result<(), f64>) {
    let refilled = (b.tokens + (now - b.at).max(0.0) * limit.per_sec).min(limit.burst);
    if refilled >= 1.0 {
        (
            Bucket {
                tokens: refilled - 1.0,
                at: now,
            },
            Ok(()),
        )
    } else {
        let wait = (1.0 - refilled) / limit.per_sec;
        (
            Bucket {
                tokens: refilled,
                at: now,
            },
            Err(wait),
        )
    }
}

/// The buckets of every token seen lately.
pub struct RateLimiter {
    limit: Limit,
    epoch: Instant,
    buckets: moka::future::Cache<String, Arc<Mutex<Bucket>>>,
}

impl RateLimiter {
    pub fn new(limit: Limit) -> RateLimiter {
        RateLimiter {
            limit,
            epoch: Instant::now(),
            buckets: moka::future::Cache::builder()
                .max_capacity(1_000_000)
                // An idle bucket refills to full; forgetting it changes nothing.
                .time_to_idle(std::time::Duration::from_secs_f64(
                    (limit.burst / limit.per_sec).max(1.0) + 1.0,
                ))
                .build(),
        }
    }

    /// One request of `token`: `Err(whole seconds to wait)` when over its limit.
    pub async fn check(&self, token: &str) -> Result<(), u64> {
        let now = self.epoch.elapsed().as_secs_f64();
        let limit = self.limit;
        let bucket = self
            .buckets
            .get_with_by_ref(token, async {
                Arc::new(Mutex::new(Bucket::full(limit, now)))
            })
            .await;
        let mut b = bucket.lock().expect("bucket lock");
        let (next, verdict) = take(*b, now, limit);
        *b = next;
        verdict.map_err(|wait| wait.ceil().max(1.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Limit = Limit {
        per_sec: 10.0,
        burst: 20.0,
    };

    #[test]
    fn a_burst_then_the_rate() {
        let mut b = Bucket::full(L, 0.0);
        for _ in 0..20 {
            let (n, v) = take(b, 0.0, L);
            assert_eq!(v, Ok(()));
            b = n;
        }
        let (b, v) = take(b, 0.0, L);
        assert_eq!(v, Err(0.1));
        let (_, v) = take(b, 0.1, L);
        assert_eq!(v, Ok(()));
    }

    proptest! {
        /// Over any sequence of requests, no more pass than the burst plus the rate times
        /// the time elapsed.
        #[test]
        fn never_more_than_burst_plus_rate(gaps in proptest::collection::vec(0.0f64..0.3, 1..400)) {
            let mut b = Bucket::full(L, 0.0);
            let (mut now, mut passed) = (0.0, 0);
            for g in gaps {
                now += g;
                let (n, v) = take(b, now, L);
                b = n;
                passed += usize::from(v.is_ok());
                prop_assert!(passed as f64 <= L.burst + L.per_sec * now + 1e-9);
            }
        }
    }
}
