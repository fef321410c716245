//! The balance a budget decides from, behind one small trait: [`Balance`]. [`LocalBalance`] is
//! this process's (the ratio balance and the floor in atomics); a budget shared with other
//! processes adds a second one (the fleet's lease, feature `redis`), opened through
//! [`OpenBalance`] when the budget is built. The budget never names what shares it.

use super::RETRY;
use crate::error::ConfigError;
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where retries are taken from and successes deposited (amounts in milli-retries).
pub(crate) trait Balance: Any + Send + Sync + fmt::Debug {
    /// One logical operation succeeded.
    fn deposit(&self);
    /// Takes `cost` milli-retries, if the balance holds them.
    fn take(&self, cost: i64) -> bool;
    /// Takes one use of the floor, if the current window has one left.
    fn take_floor(&self) -> bool;
    /// Whether decisions go through this balance now; while it is not, the budget decides from
    /// its local balance (a shared balance whose store is down).
    fn is_up(&self) -> bool {
        true
    }
    /// Counts a decision the budget took locally because this balance was down.
    fn note_local(&self) {}
    /// The balance as `Any`, for the code that opened it to find its own type again.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    fn as_any(&self) -> &dyn Any;
}

/// A balance's settings, as the builder checked them (amounts in milli-retries).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BalanceTerms {
    /// What one success deposits.
    pub(crate) deposit: i64,
    /// The balance's cap.
    pub(crate) max: i64,
    /// Floor uses per window.
    pub(crate) floor: u32,
    pub(crate) floor_window: Duration,
}

/// Opens a shared balance for a budget being built (kept by the builder until `build`).
pub(crate) trait OpenBalance: Send + Sync + fmt::Debug {
    /// The shared balance for a budget with these `terms`, of which this process keeps `lease`
    /// milli-retries leased.
    fn open(&self, terms: BalanceTerms, lease: i64) -> Result<Arc<dyn Balance>, ConfigError>;
}

/// This process's balance: milli-retries in one atomic, deposited by successes, and a floor of
/// uses per fixed window.
#[derive(Debug)]
pub(super) struct LocalBalance {
    /// Milli-retries available; deposits add `deposit`, a retry takes its cost.
    balance: AtomicI64,
    terms: BalanceTerms,
    /// The floor window's index (high 32 bits) and the retries it has let through (low 32 bits),
    /// in one word so a window change and a use cannot interleave.
    floor_state: AtomicU64,
    started: Instant,
}

impl LocalBalance {
    pub(super) fn new(terms: BalanceTerms) -> Self {
        LocalBalance {
            balance: AtomicI64::new(0),
            terms,
            floor_state: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// The floor window now: its index from 1, in 32 bits.
    pub(super) fn window(&self) -> u64 {
        let window = self.terms.floor_window.as_nanos().max(1);
        ((self.started.elapsed().as_nanos() / window) as u64 + 1) & 0xffff_ffff
    }

    /// Milli-retries held now.
    pub(super) fn available(&self) -> i64 {
        self.balance.load(Ordering::Relaxed)
    }

    /// Retries held now.
    pub(super) fn retries(&self) -> f64 {
        self.available() as f64 / RETRY as f64
    }

    /// What one deposit adds, and the most the balance holds (milli-retries).
    pub(super) fn deposit_and_max(&self) -> (i64, i64) {
        (self.terms.deposit, self.terms.max)
    }

    /// The balance's settings.
    pub(super) fn terms(&self) -> BalanceTerms {
        self.terms
    }
}

impl Balance for LocalBalance {
    #[inline]
    fn deposit(&self) {
        // A full balance is the common case when things go well: read, don't write.
        let BalanceTerms { deposit, max, .. } = self.terms;
        if deposit == 0 || self.balance.load(Ordering::Relaxed) >= max {
            return;
        }
        let before = self.balance.fetch_add(deposit, Ordering::Relaxed);
        if before + deposit > max {
            self.balance.fetch_min(max, Ordering::Relaxed);
        }
    }

    fn take(&self, cost: i64) -> bool {
        self.balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b >= cost).then_some(b - cost)
            })
            .is_ok()
    }

    fn take_floor(&self) -> bool {
        let floor = self.terms.floor;
        if floor == 0 {
            return false;
        }
        let epoch = self.window();
        self.floor_state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let (seen, used) = (state >> 32, state & 0xffff_ffff);
                if seen < epoch {
                    // A new window: only ever move forward.
                    Some(epoch << 32 | 1)
                } else if used < u64::from(floor) {
                    Some(state + 1)
                } else {
                    None
                }
            })
            .is_ok()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
