//! Upstream limits of one connection: `max_in_flight` (requests at once)
//! and `rate` (a token bucket, `governor`), so the servers behind the pool
//! are not flooded by many runs at once.
//!
//! A request past a limit waits its turn, in order (tokio's semaphore and
//! mutex are first in, first out), in a bounded queue; the wait counts
//! against the request's own timeout, and a request that gets no turn
//! within it fails `timeout`, naming the limit. The limits hold across the
//! connection's sessions (a reconnect does not reset them).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::PoolError;
use crate::config::Rate;

/// Most requests that may wait for a turn on one connection; past it a
/// request fails at once (`unavailable`) rather than queue without bound.
pub(super) const MAX_QUEUED: u64 = 10_000;

/// A connection's limits, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub(crate) struct LimitSettings {
    pub max_in_flight: Option<usize>,
    /// `(count, per ms, burst)`.
    pub rate: Option<(u32, u64, u32)>,
}

impl LimitSettings {
    pub(crate) fn new(
        max_in_flight: Option<usize>,
        rate: Option<Rate>,
        burst: Option<u32>,
    ) -> Self {
        LimitSettings {
            max_in_flight: max_in_flight.filter(|n| *n > 0),
            rate: rate.map(|r| {
                (
                    r.count,
                    u64::try_from(r.per.as_millis()).unwrap_or(u64::MAX),
                    burst.unwrap_or(r.count).max(1),
                )
            }),
        }
    }
}

/// The limits of one connection, live.
pub(super) struct Limits {
    settings: LimitSettings,
    in_flight: Option<Arc<Semaphore>>,
    rate: Option<RateGate>,
    queued: AtomicU64,
}

/// The token bucket, and the line to it: one request at a time asks the
/// bucket, in the order they came.
struct RateGate {
    limiter: DefaultDirectRateLimiter,
    line: tokio::sync::Mutex<()>,
}

/// A request's turn: it holds its place among `max_in_flight` until dropped.
pub(super) struct Turn {
    _in_flight: Option<OwnedSemaphorePermit>,
    /// How long the request waited for it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) waited: Duration,
}

impl Limits {
    pub(super) fn new(settings: LimitSettings) -> Limits {
        let rate = settings.rate.and_then(|(count, per_ms, burst)| {
            // One token every `per / count`, at most `burst` saved up.
            let every = Duration::from_millis(per_ms) / count.max(1);
            let quota = Quota::with_period(every)?.allow_burst(NonZeroU32::new(burst)?);
            Some(RateGate {
                limiter: RateLimiter::direct(quota),
                line: tokio::sync::Mutex::new(()),
            })
        });
        Limits {
            in_flight: settings.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
            rate,
            settings,
            queued: AtomicU64::new(0),
        }
    }

    /// Requests waiting for a turn now.
    pub(super) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Waits for a turn, at most `within`.
    ///
    /// # Errors
    /// [`PoolError::Limited`] when no turn came within `within`;
    /// [`PoolError::ConnectFailed`]-like `Unavailable` when the queue is full.
    pub(super) async fn turn(&self, connection: &str, within: Duration) -> Result<Turn, PoolError> {
        if self.in_flight.is_none() && self.rate.is_none() {
            return Ok(Turn {
                _in_flight: None,
                waited: Duration::ZERO,
            });
        }
        let started = Instant::now();
        if self.queued.fetch_add(1, Ordering::AcqRel) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(PoolError::QueueFull {
                connection: connection.to_owned(),
                queued: MAX_QUEUED,
            });
        }
        struct Queued<'a>(&'a AtomicU64);
        impl Drop for Queued<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let queued = Queued(&self.queued);
        let wait = async {
            let permit = match &self.in_flight {
                Some(semaphore) => Some(
                    semaphore
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed"),
                ),
                None => None,
            };
            if let Some(gate) = &self.rate {
                let _line = gate.line.lock().await;
                gate.limiter.until_ready().await;
            }
            permit
        };
        let permit = tokio::time::timeout(within, wait)
            .await
            .map_err(|_| PoolError::Limited {
                connection: connection.to_owned(),
                limits: self.describe(),
                after: within,
                queued: self.queued().saturating_sub(1),
            })?;
        drop(queued);
        Ok(Turn {
            _in_flight: permit,
            waited: started.elapsed(),
        })
    }

    /// The limits, as the config wrote them, for messages.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.settings.max_in_flight {
            parts.push(format!("`max_in_flight = {n}`"));
        }
        if let Some((count, per_ms, burst)) = self.settings.rate {
            let per = match per_ms {
                1000 => "s".to_owned(),
                60_000 => "min".to_owned(),
                3_600_000 => "h".to_owned(),
                ms => format!("{ms}ms"),
            };
            parts.push(format!("`rate = \"{count}/{per}\"` (burst {burst})"));
        }
        parts.join(" and ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_come_in_order_and_a_late_one_names_the_limit() {
        let limits = Arc::new(Limits::new(LimitSettings::new(Some(1), None, None)));
        let first = limits.turn("c", Duration::from_secs(1)).await.unwrap();
        let waiting = {
            let limits = limits.clone();
            tokio::spawn(async move { limits.turn("c", Duration::from_millis(50)).await })
        };
        let late = waiting.await.unwrap().err().unwrap();
        assert_eq!(
            late.to_string(),
            "connection `c`: no turn within 50ms under `max_in_flight = 1` (0 more waiting)"
        );
        drop(first);
        assert_eq!(limits.queued(), 0);
        let again = limits.turn("c", Duration::from_secs(1)).await.unwrap();
        assert!(again.waited < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_rate_spaces_requests_after_its_burst() {
        let rate = Rate::parse("20/s").unwrap();
        let limits = Limits::new(LimitSettings::new(None, Some(rate), Some(1)));
        let started = Instant::now();
        for _ in 0..5 {
            limits.turn("c", Duration::from_secs(5)).await.unwrap();
        }
        // 1 at once, then one every 50 ms.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(190), "{took:?}");
        assert!(took < Duration::from_millis(400), "{took:?}");
    }
}
