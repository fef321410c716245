//! The ratio budget: milli-retries in one atomic, deposited by successes, plus a windowed floor.

use crate::backoff::rng::mix;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// One retry, in the fixed-point unit of the balance.
pub(super) const RETRY: i64 = 1000;

/// A throttled retry the server scheduled: 5/14 of a retry, as in AWS's 2026 retry quota
/// (throttling errors cost 5 tokens, other failures 14).
pub(super) const THROTTLED: i64 = 357;

#[derive(Debug)]
pub(super) struct Ratio {
    /// Milli-retries available; deposits add `deposit`, a retry takes `RETRY`.
    balance: AtomicI64,
    deposit: i64,
    max: i64,
    /// How far, in milli-retries, one run may draw on the balance beyond what it deposited.
    share: i64,
    floor: u32,
    floor_window: Duration,
    /// The floor window's index (high 32 bits) and the retries it has let through (low 32 bits),
    /// in one word so a window change and a use cannot interleave.
    floor_state: AtomicU64,
    started: Instant,
    seed: u64,
    operations: AtomicU64,
    id: u32,
    /// The fleet's balance and floor, when the budget is shared through Redis: while the fleet
    /// is up, withdrawals come from this worker's lease; while it is down, from the local balance
    /// and floor above (which deposits keep warm either way).
    #[cfg(feature = "redis")]
    pub(super) fleet: Option<std::sync::Arc<crate::fleet::budget::Lease>>,
}

impl Ratio {
    pub(super) fn new(
        ratio: f64,
        max_balance: u32,
        run_share: u32,
        floor: u32,
        floor_window: Duration,
        seed: u64,
    ) -> Self {
        Ratio {
            balance: AtomicI64::new(0),
            deposit: (ratio * RETRY as f64).round() as i64,
            max: i64::from(max_balance) * RETRY,
            share: i64::from(run_share) * RETRY,
            floor,
            floor_window,
            floor_state: AtomicU64::new(0),
            started: Instant::now(),
            seed,
            operations: AtomicU64::new(0),
            id: super::next_id(),
            #[cfg(feature = "redis")]
            fleet: None,
        }
    }

    #[inline]
    pub(super) fn deposit(&self) {
        #[cfg(feature = "redis")]
        if let Some(fleet) = &self.fleet {
            fleet.note_success();
        }
        // A full balance is the common case when things go well: read, don't write.
        if self.deposit == 0 || self.balance.load(Ordering::Relaxed) >= self.max {
            return;
        }
        let before = self.balance.fetch_add(self.deposit, Ordering::Relaxed);
        if before + self.deposit > self.max {
            self.balance.fetch_min(self.max, Ordering::Relaxed);
        }
    }

    /// Takes `cost` milli-retries from the balance, or one use of the floor.
    pub(super) fn try_withdraw(&self, cost: i64) -> bool {
        self.try_balance(cost) || self.try_floor()
    }

    /// Takes `cost` milli-retries from the balance.
    pub(super) fn try_balance(&self, cost: i64) -> bool {
        #[cfg(feature = "redis")]
        if let Some(fleet) = &self.fleet {
            if fleet.is_up() {
                return fleet.take(cost);
            }
            fleet.local_decision();
        }
        self.balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b >= cost).then_some(b - cost)
            })
            .is_ok()
    }

    /// One use of the floor, if this window has one left.
    pub(super) fn try_floor(&self) -> bool {
        #[cfg(feature = "redis")]
        if let Some(fleet) = &self.fleet {
            if fleet.is_up() {
                return fleet.take_floor();
            }
        }
        if self.floor == 0 {
            return false;
        }
        let window = self.floor_window.as_nanos().max(1);
        let epoch = ((self.started.elapsed().as_nanos() / window) as u64 + 1) & 0xffff_ffff;
        self.floor_state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let (seen, used) = (state >> 32, state & 0xffff_ffff);
                if seen < epoch {
                    // A new window: only ever move forward.
                    Some(epoch << 32 | 1)
                } else if used < u64::from(self.floor) {
                    Some(state + 1)
                } else {
                    None
                }
            })
            .is_ok()
    }

    /// What one deposit adds, and the most the balance holds (milli-retries).
    pub(super) fn deposit_and_max(&self) -> (i64, i64) {
        (self.deposit, self.max)
    }

    /// How far one run may draw beyond its own deposits (milli-retries).
    pub(super) fn share(&self) -> i64 {
        self.share
    }

    pub(super) fn id(&self) -> u32 {
        self.id
    }

    pub(super) fn balance(&self) -> f64 {
        self.balance.load(Ordering::Relaxed) as f64 / RETRY as f64
    }

    /// A lease on the fleet's budget `name`, with this budget's terms.
    #[cfg(feature = "redis")]
    pub(super) fn lease_on(
        &self,
        fleet: &crate::fleet::Fleet,
        name: &str,
        lease: u32,
    ) -> Result<std::sync::Arc<crate::fleet::budget::Lease>, crate::error::ConfigError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            crate::error::ConfigError::new(
                "fleet",
                "a fleet budget starts a task: build it inside a tokio runtime",
            )
        })?;
        let terms = crate::fleet::budget::Terms {
            deposit: self.deposit,
            max: self.max,
            floor: self.floor,
            floor_window: self.floor_window,
            lease: i64::from(lease) * RETRY,
        };
        Ok(crate::fleet::budget::Lease::start(
            fleet, name, terms, &handle,
        ))
    }

    pub(super) fn next_seed(&self) -> u64 {
        mix(self.seed ^ mix(self.operations.fetch_add(1, Ordering::Relaxed)))
    }
}
