//! A client-side rate limit shared by every clone: keep under a provider's quota instead of
//! learning it from `429`s.
//!
//! A model API that allows 50 requests a second answers the 51st with `429` and `Retry-After`.
//! Retrying politely (as [`Retry`](crate::retry::Retry) does) keeps the storm down, but every
//! `429` is still a wasted request and a delay. [`QuotaLayer`] spaces calls out before they are
//! sent: `poll_ready` waits until the quota has room, so a caller that polls readiness (as
//! `Retry` does before every attempt, and `ServiceExt::ready` does) never sends over the limit.
//!
//! The limit is GCRA (the generic cell rate algorithm, as in `governor`): one atomic word holds
//! the theoretical arrival time of the next call, so a call within the quota takes one
//! compare-and-swap and no lock, and a burst of up to `burst` calls goes through at once. Time is
//! `tokio::time`, so tests run on a paused clock. Every clone of the layer, and every service it
//! makes, shares the one quota: give the same layer to every path that calls one provider.
//!
//! A caller that has to wait holds its place in line (first come, first served) and wakes once,
//! at its slot; a caller dropped while waiting leaves its slot unused. Readiness reserves the
//! room before the inner service is ready, so put the layer directly above the transport (not
//! above a `Buffer` or a concurrency limit that could hold reserved calls and release them
//! together). A retry's wait for the quota counts against the operation deadline of
//! [`Retry`](crate::retry::Retry): a retry still waiting when the deadline passes ends as
//! `deadline_exceeded`. The first attempt's wait happens before the `Retry` is called (in its
//! `poll_ready`) and starts the deadline's clock there; bound the whole call with tower's
//! `Timeout` if you need a hard limit.
//!
//! Put it below the retrying layers, so retries wait for the quota too:
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
//! use stormguard::quota::{Quota, QuotaLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let quota = QuotaLayer::new(Quota::per_second(10).burst(2).build().unwrap());
//! let model = service_fn(|prompt: &'static str| async move { Ok::<_, std::io::Error>(prompt.len()) });
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
//!     .layer(quota)
//!     .service(model);
//! let start = tokio::time::Instant::now();
//! for _ in 0..4 {
//!     svc.ready().await.unwrap().call("hello").await.unwrap();
//! }
//! // Two at once (the burst), then one every 100 ms.
//! assert_eq!(start.elapsed(), Duration::from_millis(200));
//! # }
//! ```
//!
//! For a quota per tenant, run or model, weighted by each call's cost (tokens per minute), see
//! [`KeyedQuotaLayer`].
//!
//! Metrics: `stormguard_quota_waits_total` (label `quota`) counts the calls that had to wait.

mod keyed;
mod layer;

pub use keyed::{KeyedQuota, KeyedQuotaFuture, KeyedQuotaLayer};
pub use layer::{QuotaLayer, QuotaService};

use crate::error::ConfigError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A rate: `rate` calls per `per`, with bursts of up to `burst` calls.
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Quota;
///
/// let q = Quota::per_minute(3_000).burst(20).build().unwrap();
/// assert_eq!(q.interval(), Duration::from_millis(20));
/// assert_eq!(Quota::per_second(0).build().unwrap_err().field(), "rate");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    rate: u32,
    per: Duration,
    burst: u32,
}

impl Quota {
    /// `rate` calls per second (burst 1 until [`QuotaBuilder::burst`] says otherwise).
    pub fn per_second(rate: u32) -> QuotaBuilder {
        Quota::per(rate, Duration::from_secs(1))
    }

    /// `rate` calls per minute (a provider's "requests per minute").
    pub fn per_minute(rate: u32) -> QuotaBuilder {
        Quota::per(rate, Duration::from_secs(60))
    }

    /// `rate` calls per `period`.
    pub fn per(rate: u32, period: Duration) -> QuotaBuilder {
        QuotaBuilder {
            quota: Quota {
                rate,
                per: period,
                burst: 1,
            },
        }
    }

    /// The steady spacing between calls: `per / rate`.
    pub fn interval(&self) -> Duration {
        self.per / self.rate.max(1)
    }

    /// The most calls that may go at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

/// Builds a [`Quota`]; [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Quota;
///
/// assert_eq!(Quota::per_second(10).burst(0).build().unwrap_err().field(), "burst");
/// assert_eq!(Quota::per(1, Duration::ZERO).build().unwrap_err().field(), "per");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct QuotaBuilder {
    quota: Quota,
}

impl QuotaBuilder {
    /// Up to `calls` may go at once after a quiet spell (1 by default: perfectly even spacing).
    pub fn burst(mut self, calls: u32) -> Self {
        self.quota.burst = calls;
        self
    }

    /// The quota, or the setting that cannot work.
    pub fn build(self) -> Result<Quota, ConfigError> {
        let q = self.quota;
        if q.rate == 0 {
            return Err(ConfigError::new("rate", "must be at least one call"));
        }
        if q.per.is_zero() || q.per > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new(
                "per",
                "must be longer than zero and at most a day",
            ));
        }
        if q.interval().is_zero() {
            return Err(ConfigError::new(
                "rate",
                "must leave at least a nanosecond between calls",
            ));
        }
        if q.burst == 0 || q.burst > 100_000 {
            return Err(ConfigError::new("burst", "must be 1 to 100,000 calls"));
        }
        Ok(q)
    }
}

/// The shared state: GCRA's theoretical arrival time, in nanoseconds since `epoch`.
#[derive(Debug)]
pub(crate) struct Gcra {
    tat: AtomicU64,
    interval: u64,
    tolerance: u64,
    epoch: Instant,
}

impl Gcra {
    pub(crate) fn new(quota: Quota) -> Gcra {
        let interval = quota.interval().as_nanos() as u64;
        Gcra {
            tat: AtomicU64::new(0),
            interval,
            tolerance: interval.saturating_mul(u64::from(quota.burst - 1)),
            epoch: Instant::now(),
        }
    }

    /// Reserves the next slot in the quota and says how long until it comes (zero: now).
    ///
    /// A caller that has to wait holds its place in line: waiters are served in the order they
    /// reserved, each wakes once, at its own slot, and the spacing holds even for intervals
    /// shorter than the timer's millisecond (waiters woken in the same tick had their slots
    /// reserved apart).
    pub(crate) fn reserve(&self) -> Duration {
        self.reserve_n(1)
    }

    /// Reserves `cost` units at once (tokens, say) and says how long until they may go. The
    /// units go together once the last of them fits the burst, so `cost` must be at most the
    /// burst (checked by the callers).
    pub(crate) fn reserve_n(&self, cost: u32) -> Duration {
        let now = self.now();
        let span = self.interval.saturating_mul(u64::from(cost));
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let base = tat.max(now);
            // Saturating: a slow quota (one a day) with hundreds of thousands of waiters would
            // overflow u64 nanoseconds; the line then ends at the far future, never wraps.
            let next = base.saturating_add(span);
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    // May go once `next` is within the burst's reach: `tolerance + interval`.
                    let allowed = next.saturating_sub(self.tolerance.saturating_add(self.interval));
                    return Duration::from_nanos(allowed.saturating_sub(now));
                }
                Err(actual) => tat = actual,
            }
        }
    }

    /// Whether the quota is full again (nothing reserved ahead of now): an idle key's state can
    /// be dropped and made anew, with nothing lost.
    pub(crate) fn idle(&self) -> bool {
        self.tat.load(Ordering::Relaxed) <= self.now()
    }

    fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_quota_with_a_long_line_never_overflows() {
        let gcra = Gcra::new(Quota::per(1, Duration::from_secs(86_400)).build().unwrap());
        let mut last = Duration::ZERO;
        for _ in 0..300_000 {
            let wait = gcra.reserve();
            assert!(wait >= last, "waits never go back: {wait:?} after {last:?}");
            last = wait;
        }
        assert!(last > Duration::from_secs(500 * 365 * 86_400));
    }

    #[tokio::test(start_paused = true)]
    async fn weighted_reservations_are_spaced_by_their_cost() {
        // 1,000 tokens a second, up to 1,000 at once.
        let gcra = Gcra::new(Quota::per_second(1_000).burst(1_000).build().unwrap());
        assert_eq!(gcra.reserve_n(600), Duration::ZERO);
        assert_eq!(gcra.reserve_n(400), Duration::ZERO);
        // The bucket is empty: 500 more wait half a second, 1,000 after them a second more.
        assert_eq!(gcra.reserve_n(500), Duration::from_millis(500));
        assert_eq!(gcra.reserve_n(1_000), Duration::from_millis(1_500));
        assert!(!gcra.idle());
        tokio::time::advance(Duration::from_millis(2_500)).await;
        assert!(gcra.idle());
        // One unit reserves as `reserve` does.
        assert_eq!(gcra.reserve_n(1), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_calls_are_spaced() {
        let gcra = Gcra::new(Quota::per_second(10).burst(3).build().unwrap());
        for _ in 0..3 {
            assert_eq!(gcra.reserve(), Duration::ZERO);
        }
        // Waiters hold their places in line: 100 ms, then 200 ms.
        assert_eq!(gcra.reserve(), Duration::from_millis(100));
        assert_eq!(gcra.reserve(), Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(gcra.reserve(), Duration::from_millis(100));
        // A quiet spell refills the burst, and no more than the burst.
        tokio::time::advance(Duration::from_secs(10)).await;
        for _ in 0..3 {
            assert_eq!(gcra.reserve(), Duration::ZERO);
        }
        assert_eq!(gcra.reserve(), Duration::from_millis(100));
    }
}
