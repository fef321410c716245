//! The run budget: what one agent run may spend on retries, in count and in backoff time.

use super::lend::{debt, decide, Ask, Draw, Short};
use super::ratio::Ratio;
use super::Refusal;
use crate::error::ConfigError;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Caps on what one agent run may spend on retries, across every tool it calls.
/// `RunLimits::default()` has none; [`RunLimits::builder`] sets them.
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::RunLimits;
///
/// let limits = RunLimits::builder().max_retries(30).max_retry_time(Duration::from_secs(120)).build()?;
/// assert_eq!(limits.retries(), Some(30));
/// assert_eq!(RunLimits::default().retries(), None);
/// assert!(RunLimits::builder().max_retry_time(Duration::ZERO).build().is_err());
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunLimits {
    max_retries: Option<u32>,
    max_retry_time: Option<Duration>,
}

impl RunLimits {
    /// A builder with no limits set.
    pub fn builder() -> RunLimitsBuilder {
        RunLimitsBuilder {
            limits: RunLimits::default(),
        }
    }

    /// The cap on retries.
    pub fn retries(&self) -> Option<u32> {
        self.max_retries
    }

    /// The cap on backoff time.
    pub fn retry_time(&self) -> Option<Duration> {
        self.max_retry_time
    }
}

/// Builds [`RunLimits`]; [`build`](Self::build) rejects what cannot work. A limit not set is no
/// limit.
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::{RunLimits, RunLimitsBuilder};
///
/// let builder: RunLimitsBuilder = RunLimits::builder().max_retries(0);
/// let limits = builder.build()?;
/// assert_eq!(limits.retries(), Some(0)); // this run may not retry at all
/// assert_eq!(limits.retry_time(), None); // not set: no limit
/// let err = RunLimits::builder().max_retry_time(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.field(), "max_retry_time");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct RunLimitsBuilder {
    limits: RunLimits,
}

impl RunLimitsBuilder {
    /// At most `n` retries in the run (0 forbids retries).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.limits.max_retries = Some(n);
        self
    }

    /// At most `d` of backoff in the run, summed over its retries.
    pub fn max_retry_time(mut self, d: Duration) -> Self {
        self.limits.max_retry_time = Some(d);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<RunLimits, ConfigError> {
        if self.limits.max_retry_time == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "max_retry_time",
                "must be greater than zero (use max_retries(0) to forbid retries)",
            ));
        }
        Ok(self.limits)
    }
}

#[derive(Debug)]
pub(super) struct Run {
    limits: RunLimits,
    retries: AtomicU32,
    nanos: AtomicU64,
    /// What the run has deposited into the shared balance minus what it drew from it, in
    /// milli-retries: at most the balance's cap, at least minus the run share.
    credit: AtomicI64,
    /// The balance the run draws on, and where its debts are counted.
    ratio: Arc<Ratio>,
    id: u32,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Run {
    pub(super) fn new(limits: RunLimits, ratio: Arc<Ratio>) -> Self {
        Run {
            limits,
            retries: AtomicU32::new(0),
            nanos: AtomicU64::new(0),
            credit: AtomicI64::new(0),
            ratio,
            id: super::next_id(),
        }
    }

    pub(super) fn id(&self) -> u32 {
        self.id
    }

    /// Whether the run draws on `ratio`.
    pub(super) fn draws_on(&self, ratio: &Arc<Ratio>) -> bool {
        Arc::ptr_eq(&self.ratio, ratio)
    }

    /// Credits the run with one deposit, up to the balance's cap; a run in debt repays it.
    #[inline]
    pub(super) fn earn(&self) {
        let (amount, cap) = self.ratio.deposit_and_max();
        // A run in good standing is the common case: read, don't write.
        if amount == 0 || self.credit.load(Ordering::Relaxed) >= cap {
            return;
        }
        self.add(amount, cap);
    }

    /// Adds `amount` to the run's credit, at most `cap`, and repays what that takes off its debt.
    fn add(&self, amount: i64, cap: i64) {
        let before = self.credit.fetch_add(amount, Ordering::AcqRel);
        let after = before + amount;
        if after > cap {
            self.credit.fetch_min(cap, Ordering::AcqRel);
        }
        self.ratio.repay(debt(before) - debt(after));
    }

    /// Pays `cost` from the shared balance as the lending rules allow ([`lend`](super::lend)):
    /// from the run's own credit, or on loan within its share and the lending limit. `Err` says
    /// why the balance did not pay; the caller may then try the floor.
    pub(super) fn draw(&self, cost: i64) -> Result<(), Short> {
        let ratio = &*self.ratio;
        loop {
            let credit = self.credit.load(Ordering::Acquire);
            let ask = Ask {
                credit,
                lent: ratio.lent(),
                balance: ratio.available(),
                cost,
                share: ratio.share(),
                limit: ratio.limit(),
            };
            let loan = match decide(ask) {
                Draw::Own => 0,
                Draw::Borrow { loan } => loan,
                Draw::Floor(short) => return Err(short),
            };
            // The loan is counted before the credit moves, so `lent` never falls below the
            // runs' debts, and the limit holds whatever runs borrow at once.
            if loan > 0 && !ratio.reserve(loan) {
                return Err(Short::Limit);
            }
            let moved = self.credit.compare_exchange(
                credit,
                credit - cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if moved.is_err() {
                // The run deposited or drew meanwhile: decide again on what it has now.
                ratio.repay(loan);
                continue;
            }
            if ratio.try_balance(cost) {
                return Ok(());
            }
            self.add(cost, ratio.deposit_and_max().1);
            return Err(Short::Balance);
        }
    }

    /// The run's standing, in retries (negative: it has drawn more than it deposited).
    pub(super) fn credit(&self) -> f64 {
        self.credit.load(Ordering::Relaxed) as f64 / super::ratio::RETRY as f64
    }

    pub(super) fn try_spend(&self, delay: Duration) -> Result<(), Refusal> {
        let max = self.limits.max_retries.unwrap_or(u32::MAX);
        self.retries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refusal::RunBudget)?;
        let max_nanos = self.limits.max_retry_time.map_or(u64::MAX, nanos);
        let d = nanos(delay);
        let spent = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                t.checked_add(d).filter(|&sum| sum <= max_nanos)
            });
        if spent.is_err() {
            self.retries.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::RunBudget);
        }
        Ok(())
    }

    pub(super) fn refund(&self, delay: Duration) {
        self.retries.fetch_sub(1, Ordering::AcqRel);
        self.nanos.fetch_sub(nanos(delay), Ordering::AcqRel);
    }

    pub(super) fn retries(&self) -> u32 {
        self.retries.load(Ordering::Acquire)
    }

    pub(super) fn retry_time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }
}

impl Drop for Run {
    /// A run that ends in debt leaves it to the lending limit until the floor window turns.
    fn drop(&mut self) {
        self.ratio.write_off(debt(*self.credit.get_mut()));
    }
}
