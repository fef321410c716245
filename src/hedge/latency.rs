//! The latency a hedge waits for: fixed, or a quantile of recent answers, kept without a lock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Latencies kept (the most recent ones).
pub(crate) const RING: usize = 512;
/// The quantile is recomputed every this many answers.
const EVERY: u64 = 32;

/// The last [`RING`] latencies (microseconds, saturating at `u32::MAX`) in a ring of atomics,
/// and the quantile of them computed every [`EVERY`] answers: recording is two atomic operations;
/// the recompute copies the ring to the stack and selects, allocating nothing.
pub(crate) struct Latencies {
    ring: [AtomicU32; RING],
    recorded: AtomicU64,
    /// The current quantile in microseconds, plus one; 0 while there are too few answers.
    delay: AtomicU64,
    quantile: f64,
    min_samples: u32,
}

impl Latencies {
    pub(crate) fn new(quantile: f64, min_samples: u32) -> Self {
        Latencies {
            ring: std::array::from_fn(|_| AtomicU32::new(0)),
            recorded: AtomicU64::new(0),
            delay: AtomicU64::new(0),
            quantile,
            min_samples,
        }
    }

    /// A record with the same settings and no answers yet.
    pub(crate) fn fresh(&self) -> Self {
        Latencies::new(self.quantile, self.min_samples)
    }

    /// The quantile of recent answers, once there have been `min_samples` of them.
    #[inline]
    pub(crate) fn delay(&self) -> Option<Duration> {
        match self.delay.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros - 1)),
        }
    }

    /// Records one answer's latency.
    #[inline]
    pub(crate) fn record(&self, latency: Duration) {
        let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let n = self.recorded.fetch_add(1, Ordering::Relaxed);
        self.ring[(n % RING as u64) as usize].store(micros, Ordering::Relaxed);
        let n = n + 1;
        if n >= u64::from(self.min_samples) && (n % EVERY == 0 || n == u64::from(self.min_samples))
        {
            self.recompute(n);
        }
    }

    #[cold]
    fn recompute(&self, recorded: u64) {
        let len = recorded.min(RING as u64) as usize;
        let mut copy = [0u32; RING];
        for (slot, cell) in copy.iter_mut().zip(&self.ring).take(len) {
            *slot = cell.load(Ordering::Relaxed);
        }
        let values = &mut copy[..len];
        let rank = quantile_rank(self.quantile, len);
        let (_, at, _) = values.select_nth_unstable(rank);
        self.delay.store(u64::from(*at) + 1, Ordering::Relaxed);
    }
}

/// The index of the `q` quantile among `len` sorted values (nearest rank, rounding up).
pub(crate) fn quantile_rank(q: f64, len: usize) -> usize {
    debug_assert!(len > 0);
    let rank = (q * len as f64).ceil() as usize;
    rank.clamp(1, len) - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a sorted copy: the delay is the nearest-rank quantile of the last `RING`
        /// latencies once `min_samples` were recorded (at the recompute points).
        #[test]
        fn the_delay_is_the_quantile_of_the_recent_latencies(
            values in proptest::collection::vec(0u32..2_000_000, 1..1_200),
            q in 0.5f64..0.999,
            min in 1u32..100,
        ) {
            let l = Latencies::new(q, min);
            for v in &values {
                l.record(Duration::from_micros(u64::from(*v)));
            }
            let n = values.len() as u64;
            if n < u64::from(min) {
                prop_assert_eq!(l.delay(), None);
                return Ok(());
            }
            // The last recompute happened at the last multiple of EVERY (or at min_samples).
            let at = if n % EVERY == 0 { n } else {
                let last = n - n % EVERY;
                if last >= u64::from(min) { last } else { u64::from(min) }
            };
            let upto = &values[..at as usize];
            let recent = &upto[upto.len().saturating_sub(RING)..];
            let mut sorted = recent.to_vec();
            sorted.sort_unstable();
            let want = sorted[quantile_rank(q, sorted.len())];
            prop_assert_eq!(l.delay(), Some(Duration::from_micros(u64::from(want))));
        }
    }

    #[test]
    fn a_latency_past_u32_micros_saturates() {
        let l = Latencies::new(0.5, 1);
        l.record(Duration::from_secs(10_000));
        assert_eq!(l.delay(), Some(Duration::from_micros(u64::from(u32::MAX))));
    }
}
