//! Whether the dependency is accepting calls, and the retries that pays for.
//!
//! A ratio budget pays for retries with what successes deposited. Under random, uncorrelated
//! failures that is too little: where half the calls fail, 20 % of a retry per success runs dry
//! while three attempts would have given 87.5 %. So a retry may also be paid by the
//! **dependency's acceptance**: the share `a` of its recent attempts that it answered (a success,
//! an empty result, or a definite error such as a 404; not a timeout, a 5xx, a reset), weighted
//! over about the last `window` attempts (an exponential average, 32 by default). A retry after
//! an ordinary failure goes free with probability `min(1, K·a)` (`K` = 2 by default): every
//! retry while the dependency answers at least half its calls, fewer as it answers fewer, none
//! in an outage (`a` = 0). This is Google SRE's client-side throttling
//! (`max(0, (requests − K·accepts) / (requests + 1))` rejected) turned the other way: here it
//! only ever *admits retries*, first attempts always go, so the `+ 1` that lets an SRE client
//! find out that a backend is back is not needed, and an outage admits none.
//!
//! A failure that says the dependency is **overloaded** (a `Retry-After` or gRPC pushback, a
//! `429`) is never paid this way: half the calls failing because the server has capacity for half
//! is not bad luck, and a retry there displaces another caller's first attempt. Those retries
//! come from the ratio balance (and its floor) only, as before.
//!
//! A dependency that has answered less than a tenth ([`DOWN`]) of a whole window of attempts is
//! taken to be down: its retries are not paid by the ratio balance either, only by the floor.
//! Otherwise a balance that healthy tools deposit into would pay for the retries of a tool whose
//! dependency is down (an agent run's plain clones of one budget over two dependencies: 3.0x
//! into the one that is down, where it now gets 1.0x and the floor).
//!
//! The statistic belongs to one dependency, so each retry layer (each service a `RetryLayer`
//! builds, and its clones) keeps its own; the budget holds the rule's settings.
//! It starts at `a` = 0: a layer that has seen nothing yet retries on the balance and the floor.
//! Counting a success is one relaxed atomic add; a failure folds the successes since the last
//! failure into the average (one compare-and-swap) and reads no clock.
//!
//! ```
//! use stormguard::budget::acceptance::{admits, fold};
//!
//! let alpha = 1.0 / 32.0;
//! // Half the attempts answered: every retry goes (2 × 0.5 = 1).
//! assert!(admits(0.5, 2.0, 0.999));
//! // A dependency that has answered nothing for a while: none goes.
//! let mut a = 1.0;
//! for _ in 0..200 {
//!     a = fold(a, 0, 1, alpha);
//! }
//! assert!(a < 0.002 && !admits(a, 2.0, 0.01));
//! // 32 answers in a row bring it back above one half.
//! assert!(fold(a, 32, 0, alpha) > 0.5);
//! ```

use crate::backoff::rng::mix;
use std::sync::atomic::{AtomicU64, Ordering};

/// The weighted share of answered attempts after `accepted` answers and then `failed` failures,
/// from `a`, each event weighing `alpha` (the successes since the last failure are folded in
/// one step: their order among themselves does not matter).
pub fn fold(a: f64, accepted: u32, failed: u32, alpha: f64) -> f64 {
    let keep = 1.0 - alpha;
    let after_accepts = 1.0 - (1.0 - a) * keep.powi(accepted.min(i32::MAX as u32) as i32);
    (after_accepts * keep.powi(failed.min(i32::MAX as u32) as i32)).clamp(0.0, 1.0)
}

/// Whether a retry after an ordinary failure is paid by the dependency's acceptance `a`, with
/// the multiplier `k` and a uniform draw in `[0, 1)`: with probability `min(1, k·a)`.
pub fn admits(a: f64, k: f64, draw: f64) -> bool {
    draw < k * a
}

/// One dependency's acceptance, as one retry layer sees it (see the [module](self) docs).
#[derive(Debug)]
pub(crate) struct Acceptance {
    /// Answers counted since the layer was built (wrapping): the fast path's one atomic add.
    answered: AtomicU64,
    /// The average's bits as `f32` (high half) and the count of answers it has folded in (low
    /// half, wrapping), changed together by a failure.
    folded: AtomicU64,
    /// Failures folded in (saturating): with the answers, whether the average rests on a whole
    /// window of attempts yet.
    failures: AtomicU64,
    draws: AtomicU64,
    seed: u64,
    /// Answers since the last failure past which more change the average by less than `e^-16`
    /// (16 windows): the fast path stops counting them, so a healthy dependency's answers cost
    /// two loads, not an atomic add each.
    saturated: u32,
}

/// Windows of answers after which the average is 1 to within `e^-16` (about 1e-7).
const SATURATING_WINDOWS: u32 = 16;

/// Below this share of answered attempts (over a whole window) the dependency is taken to be
/// down: the ratio balance no longer pays for its retries, only the floor does.
pub const DOWN: f64 = 0.1;

impl Acceptance {
    /// The acceptance of a layer on a budget whose rule weighs the last ~`window` attempts.
    pub(crate) fn new(seed: u64, window: u32) -> Self {
        Acceptance {
            answered: AtomicU64::new(0),
            folded: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            draws: AtomicU64::new(0),
            seed,
            saturated: window.max(1).saturating_mul(SATURATING_WINDOWS),
        }
    }

    /// The dependency answered an attempt.
    #[inline]
    pub(crate) fn answered(&self) {
        // Past `saturated` answers since the last fold, one more moves the average by less
        // than 1e-7: read, don't write (a failure folds what was counted, and counting resumes).
        let seen = self.folded.load(Ordering::Relaxed) as u32;
        let total = self.answered.load(Ordering::Relaxed) as u32;
        if total.wrapping_sub(seen) < self.saturated {
            self.answered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An attempt failed as the dependency's failure: folds it (and the answers since the last
    /// one) into the average, and returns the average after it.
    pub(crate) fn failed(&self, alpha: f64) -> f64 {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut after = 0.0;
        let _ = self
            .folded
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let a = f64::from(f32::from_bits((word >> 32) as u32));
                let seen = word as u32;
                let total = self.answered.load(Ordering::Relaxed) as u32;
                let batch = total.wrapping_sub(seen);
                after = fold(a, batch, 1, alpha);
                Some(u64::from((after as f32).to_bits()) << 32 | u64::from(total))
            });
        after
    }

    /// Whether the average rests on at least `window` attempts.
    pub(crate) fn known(&self, window: u32) -> bool {
        let seen = self.answered.load(Ordering::Relaxed) + self.failures.load(Ordering::Relaxed);
        seen >= u64::from(window)
    }

    /// The average now, with the answers not yet folded in.
    #[cfg(test)]
    pub(crate) fn share(&self, alpha: f64) -> f64 {
        let word = self.folded.load(Ordering::Acquire);
        let a = f64::from(f32::from_bits((word >> 32) as u32));
        let batch = (self.answered.load(Ordering::Relaxed) as u32).wrapping_sub(word as u32);
        fold(a, batch, 0, alpha)
    }

    /// A uniform draw in `[0, 1)`, from the layer's seed and the draws before it.
    pub(crate) fn draw(&self) -> f64 {
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        (mix(self.seed ^ mix(n)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference model: one event at a time.
    fn one_by_one(mut a: f64, events: &[bool], alpha: f64) -> f64 {
        for &accepted in events {
            a = a * (1.0 - alpha) + if accepted { alpha } else { 0.0 };
        }
        a
    }

    proptest! {
        #[test]
        fn folding_a_batch_is_folding_its_events_one_by_one(
            start in 0.0f64..=1.0,
            accepted in 0u32..200,
            failed in 0u32..200,
            window in 1u32..500,
        ) {
            let alpha = 1.0 / f64::from(window);
            let mut events = vec![true; accepted as usize];
            events.extend(std::iter::repeat_n(false, failed as usize));
            let model = one_by_one(start, &events, alpha);
            let folded = fold(start, accepted, failed, alpha);
            prop_assert!((model - folded).abs() < 1e-9, "{model} vs {folded}");
            prop_assert!((0.0..=1.0).contains(&folded));
        }

        #[test]
        fn the_rule_admits_with_probability_k_times_a(a in 0.0f64..=1.0, k in 1.0f64..4.0) {
            let admitted = (0..1000).filter(|i| admits(a, k, f64::from(*i) / 1000.0)).count();
            let expected = ((k * a).min(1.0) * 1000.0).ceil() as usize;
            prop_assert_eq!(admitted, expected);
        }
    }

    #[test]
    fn the_layer_state_folds_answers_counted_on_the_fast_path() {
        let alpha = 1.0 / 32.0;
        let acceptance = Acceptance::new(7, 32);
        assert_eq!(
            acceptance.share(alpha),
            0.0,
            "a layer that saw nothing trusts nothing"
        );
        for _ in 0..10 {
            acceptance.answered();
        }
        let after = acceptance.failed(alpha);
        let model = one_by_one(0.0, &[true; 10], alpha) * (1.0 - alpha);
        assert!((after - model).abs() < 1e-6, "{after} vs {model}");
        // Folded once: the next failure sees no new answers.
        let again = acceptance.failed(alpha);
        assert!((again - model * (1.0 - alpha)).abs() < 1e-6);
        assert!((acceptance.share(alpha) - again).abs() < 1e-6);
    }

    proptest! {
        /// Counting stops 16 windows after the last failure: the average any run of answers
        /// and failures leaves is the one counting every answer gives (to within the `f32` it is
        /// kept in).
        #[test]
        fn saturated_answers_leave_the_average_as_counting_all_would(
            window in 1u32..64,
            runs in proptest::collection::vec((0u32..3000, 0u32..3), 1..12),
        ) {
            let alpha = 1.0 / f64::from(window);
            let acceptance = Acceptance::new(1, window);
            let mut model = 0.0;
            for (answers, failures) in runs {
                for _ in 0..answers {
                    acceptance.answered();
                }
                model = fold(model, answers, 0, alpha);
                for _ in 0..failures {
                    let after = acceptance.failed(alpha);
                    model = fold(model, 0, 1, alpha);
                    prop_assert!((after - model).abs() < 1e-5, "{} vs {}", after, model);
                }
            }
            prop_assert!((acceptance.share(alpha) - model).abs() < 1e-5);
        }
    }

    #[test]
    fn draws_repeat_for_a_seed_and_spread_over_the_unit_interval() {
        let (a, b) = (Acceptance::new(3, 32), Acceptance::new(3, 32));
        let xs: Vec<f64> = (0..1000).map(|_| a.draw()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| b.draw()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let below_half = xs.iter().filter(|x| **x < 0.5).count();
        assert!((400..600).contains(&below_half), "{below_half}");
    }
}
