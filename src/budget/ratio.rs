//! The ratio budget: a balance of milli-retries deposited by successes, with a windowed floor
//! (see [`balance`](super::balance)), and what runs owe it.

use super::balance::{Balance, BalanceTerms, LocalBalance};
use crate::backoff::rng::mix;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One retry, in the fixed-point unit of the balance.
pub(crate) const RETRY: i64 = 1000;

/// A throttled retry the server scheduled: 5/14 of a retry, as in AWS's 2026 retry quota
/// (throttling errors cost 5 tokens, other failures 14).
pub(super) const THROTTLED: i64 = 357;

/// A retry after the server said it is overloaded (a server-named delay on a failure that is not
/// a rate limit): two retries. In a sustained overload every retry that succeeds
/// takes the place of another caller's first attempt, so it is paid for twice.
pub(super) const OVERLOADED: i64 = 2 * RETRY;

/// A budget's settings, as the builder checked them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Terms {
    /// The acceptance rule's multiplier (0: off) and window in attempts.
    pub(super) acceptance: (f64, u32),
    pub(super) ratio: f64,
    pub(super) max_balance: u32,
    pub(super) run_share: u32,
    pub(super) lending_limit: u32,
    pub(super) floor: u32,
    pub(super) floor_window: Duration,
}

#[derive(Debug)]
pub(super) struct Ratio {
    /// This process's balance and floor: what decides while the budget is not shared, or its
    /// shared balance is down (deposits keep it warm either way).
    local: LocalBalance,
    /// The balance shared with other processes, if any: while it is up, withdrawals come from it.
    pub(super) shared: Option<Arc<dyn Balance>>,
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
    seed: u64,
    operations: AtomicU64,
    id: u32,
    /// The acceptance rule's multiplier (0: off) and window in attempts.
    pub(super) acceptance: (f64, u32),
    /// The budget's name, for its refusals' hints.
    pub(super) name: Option<std::sync::Arc<str>>,
}

impl Ratio {
    pub(super) fn new(terms: &Terms, seed: u64) -> Self {
        Ratio {
            local: LocalBalance::new(BalanceTerms {
                deposit: (terms.ratio * RETRY as f64).round() as i64,
                max: i64::from(terms.max_balance) * RETRY,
                floor: terms.floor,
                floor_window: terms.floor_window,
            }),
            shared: None,
            share: i64::from(terms.run_share) * RETRY,
            limit: i64::from(terms.lending_limit) * RETRY,
            lent: AtomicI64::new(0),
            written_off: AtomicU64::new(0),
            seed,
            operations: AtomicU64::new(0),
            id: next_id(),
            acceptance: terms.acceptance,
            name: None,
        }
    }

    /// The shared balance, while decisions go through it.
    #[inline]
    fn shared_up(&self) -> Option<&dyn Balance> {
        self.shared.as_deref().filter(|shared| shared.is_up())
    }

    #[inline]
    pub(super) fn deposit(&self) {
        if let Some(shared) = &self.shared {
            shared.deposit();
        }
        self.local.deposit();
    }

    /// Takes `cost` milli-retries from the balance, or one use of the floor.
    pub(super) fn try_withdraw(&self, cost: i64) -> bool {
        self.try_balance(cost) || self.try_floor()
    }

    /// Takes `cost` milli-retries from the balance.
    pub(super) fn try_balance(&self, cost: i64) -> bool {
        if let Some(shared) = &self.shared {
            if shared.is_up() {
                return shared.take(cost);
            }
            shared.note_local();
        }
        self.local.take(cost)
    }

    /// One use of the floor, if this window has one left.
    pub(super) fn try_floor(&self) -> bool {
        match self.shared_up() {
            Some(shared) => shared.take_floor(),
            None => self.local.take_floor(),
        }
    }

    /// What one deposit adds, and the most the balance holds (milli-retries).
    pub(super) fn deposit_and_max(&self) -> (i64, i64) {
        self.local.deposit_and_max()
    }

    /// How far one run may draw beyond its own deposits (milli-retries).
    pub(super) fn share(&self) -> i64 {
        self.share
    }

    /// The floor window now: its index from 1, in 32 bits.
    fn window(&self) -> u64 {
        self.local.window()
    }

    /// The most all runs together may owe (milli-retries).
    pub(super) fn limit(&self) -> i64 {
        self.limit
    }

    /// What the balance holds for a decision: the local balance, or, while a shared balance is
    /// up, as much as asked (it decides when it is taken).
    pub(super) fn available(&self) -> i64 {
        if self.shared_up().is_some() {
            return i64::MAX;
        }
        self.local.available()
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
        self.local.retries()
    }

    /// The balance's settings, for a shared balance.
    pub(super) fn balance_terms(&self) -> BalanceTerms {
        self.local.terms()
    }

    pub(super) fn next_seed(&self) -> u64 {
        mix(self.seed ^ mix(self.operations.fetch_add(1, Ordering::Relaxed)))
    }
}

/// The next budget id: 24 bits, never 0 (see [`RetryBudget::id`]).
pub(crate) fn next_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    loop {
        let id = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0xff_ffff;
        if id != 0 {
            return id;
        }
    }
}

/// A random 64-bit number (the process's hasher keys and a counter, mixed).
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    mix(h.finish())
}
