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

/// A budget's settings, as the builder checked them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Terms {
    pub(super) ratio: f64,
    pub(super) max_balance: u32,
    pub(super) run_share: u32,
    pub(super) lending_limit: u32,
    pub(super) floor: u32,
    pub(super) floor_window: Duration,
}

#[derive(Debug)]
pub(super) struct Ratio {
    /// Milli-retries available; deposits add `deposit`, a retry takes `RETRY`.
    balance: AtomicI64,
    deposit: i64,
    max: i64,
    /// How far, in milli-retries, one run may draw on the balance beyond what it deposited.
    share: i64,
    /// The most all runs together may owe the balance (milli-retries).
    limit: i64,
    /// What runs owe the balance together (milli-retries): the sum of their debts, plus loans
    /// being made (reserved here before the run's credit moves, so it is never below that sum).
    lent: AtomicI64,
    /// What runs that ended in debt left owing, counted against `limit` until the floor window
    /// turns: the window's index (high 32 bits) and the milli-retries (low 32 bits); 0 for none.
    written_off: AtomicU64,
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
    pub(super) fn new(terms: &Terms, seed: u64) -> Self {
        Ratio {
            balance: AtomicI64::new(0),
            deposit: (terms.ratio * RETRY as f64).round() as i64,
            max: i64::from(terms.max_balance) * RETRY,
            share: i64::from(terms.run_share) * RETRY,
            limit: i64::from(terms.lending_limit) * RETRY,
            lent: AtomicI64::new(0),
            written_off: AtomicU64::new(0),
            floor: terms.floor,
            floor_window: terms.floor_window,
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
        let epoch = self.window();
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

    /// The floor window now: its index from 1, in 32 bits.
    fn window(&self) -> u64 {
        let window = self.floor_window.as_nanos().max(1);
        ((self.started.elapsed().as_nanos() / window) as u64 + 1) & 0xffff_ffff
    }

    /// The most all runs together may owe (milli-retries).
    pub(super) fn limit(&self) -> i64 {
        self.limit
    }

    /// What the balance holds for a decision: the local balance, or, while the fleet is up, as
    /// much as asked (the lease decides when it is taken, and asks for a refill if it is short).
    pub(super) fn available(&self) -> i64 {
        #[cfg(feature = "redis")]
        if self.fleet.as_ref().is_some_and(|fleet| fleet.is_up()) {
            return i64::MAX;
        }
        self.balance.load(Ordering::Relaxed)
    }

    /// What runs owe together, as the lending limit counts it: the debts of the runs alive, and
    /// what runs that ended in debt left owing in this floor window (milli-retries).
    pub(super) fn lent(&self) -> i64 {
        self.lent.load(Ordering::Acquire) + self.written_off_now()
    }

    fn written_off_now(&self) -> i64 {
        let word = self.written_off.load(Ordering::Acquire);
        if word != 0 && word >> 32 == self.window() {
            (word & 0xffff_ffff) as i64
        } else {
            0
        }
    }

    /// Lends `loan` more if the runs' debts stay within the limit.
    pub(super) fn reserve(&self, loan: i64) -> bool {
        let off = self.written_off_now();
        self.lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                (lent.saturating_add(loan).saturating_add(off) <= self.limit).then_some(lent + loan)
            })
            .is_ok()
    }

    /// `amount` of the runs' debts is repaid (or a reservation given back).
    pub(super) fn repay(&self, amount: i64) {
        if amount > 0 {
            self.lent.fetch_sub(amount, Ordering::AcqRel);
        }
    }

    /// A run ended owing `debt`: it counts against the lending limit until the floor window
    /// turns, so runs made and dropped in a loop cannot borrow more than the limit per window.
    pub(super) fn write_off(&self, debt: i64) {
        if debt <= 0 {
            return;
        }
        let window = self.window();
        // Counted here first, then released from `lent`: the sum is never too low on the way.
        let _ = self
            .written_off
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let kept = if word >> 32 == window {
                    word & 0xffff_ffff
                } else {
                    0
                };
                Some(window << 32 | (kept + debt as u64).min(0xffff_ffff))
            });
        self.lent.fetch_sub(debt, Ordering::AcqRel);
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
