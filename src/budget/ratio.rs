//! The ratio budget: milli-retries in one atomic, deposited by successes, plus a windowed floor.

use crate::backoff::rng::mix;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// One retry, in the fixed-point unit of the balance.
const RETRY: i64 = 1000;

#[derive(Debug)]
pub(super) struct Ratio {
    /// Milli-retries available; deposits add `deposit`, a retry takes `RETRY`.
    balance: AtomicI64,
    deposit: i64,
    max: i64,
    floor: u32,
    floor_window: Duration,
    /// The index of the floor window `floor_used` counts in.
    floor_epoch: AtomicU64,
    floor_used: AtomicU32,
    started: Instant,
    seed: u64,
    operations: AtomicU64,
}

impl Ratio {
    pub(super) fn new(
        ratio: f64,
        max_balance: u32,
        floor: u32,
        floor_window: Duration,
        seed: u64,
    ) -> Self {
        Ratio {
            balance: AtomicI64::new(0),
            deposit: (ratio * RETRY as f64).round() as i64,
            max: i64::from(max_balance) * RETRY,
            floor,
            floor_window,
            floor_epoch: AtomicU64::new(0),
            floor_used: AtomicU32::new(0),
            started: Instant::now(),
            seed,
            operations: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(super) fn deposit(&self) {
        // A full balance is the common case when things go well: read, don't write.
        if self.deposit == 0 || self.balance.load(Ordering::Relaxed) >= self.max {
            return;
        }
        let before = self.balance.fetch_add(self.deposit, Ordering::Relaxed);
        if before + self.deposit > self.max {
            self.balance.fetch_min(self.max, Ordering::Relaxed);
        }
    }

    pub(super) fn try_withdraw(&self) -> bool {
        let taken = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b >= RETRY).then_some(b - RETRY)
            })
            .is_ok();
        taken || self.try_floor()
    }

    fn try_floor(&self) -> bool {
        if self.floor == 0 {
            return false;
        }
        let window = self.floor_window.as_nanos().max(1);
        let epoch = (self.started.elapsed().as_nanos() / window) as u64 + 1;
        let seen = self.floor_epoch.load(Ordering::Acquire);
        if seen != epoch
            && self
                .floor_epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.floor_used.store(0, Ordering::Release);
        }
        self.floor_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.floor).then_some(used + 1)
            })
            .is_ok()
    }

    pub(super) fn balance(&self) -> f64 {
        self.balance.load(Ordering::Relaxed) as f64 / RETRY as f64
    }

    pub(super) fn next_seed(&self) -> u64 {
        mix(self.seed ^ mix(self.operations.fetch_add(1, Ordering::Relaxed)))
    }
}
