//! GCRA, the generic cell rate algorithm: one atomic word per quota.

use super::Rate;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The shared state: GCRA's theoretical arrival time, in nanoseconds since `epoch`.
#[derive(Debug)]
pub(crate) struct Gcra {
    tat: AtomicU64,
    interval: u64,
    tolerance: u64,
    epoch: Instant,
}

impl Gcra {
    pub(crate) fn new(rate: Rate) -> Gcra {
        let interval = rate.interval().as_nanos() as u64;
        Gcra {
            tat: AtomicU64::new(0),
            interval,
            tolerance: interval.saturating_mul(u64::from(rate.burst() - 1)),
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
        let gcra = Gcra::new(Rate::per(1, Duration::from_secs(86_400)).build().unwrap());
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
        let gcra = Gcra::new(Rate::per_second(1_000).burst(1_000).build().unwrap());
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
        let gcra = Gcra::new(Rate::per_second(10).burst(3).build().unwrap());
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
