//! What a breaker shares with others, behind one small trait: [`Sharing`]. A breaker alone
//! ([`Alone`], the default) follows its own rules; one shared with a fleet (feature `redis`)
//! reports its outcomes there, and its open state lets a probe go only when the fleet's trial is
//! this worker's. The fleet implements [`Sharing`] and drives the breaker through the calls
//! below; the breaker never names it.

use super::policy::Count;
use super::state::{Breaker, Machine, CLOSED, OPEN};
use super::window::Tally;
use super::State;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What a breaker tells whatever it is shared with, and what it asks of it.
pub(crate) trait Sharing: Send + Sync + fmt::Debug {
    /// Counts an outcome the breaker recorded.
    fn record(&self, count: Count);
    /// The open breaker's decision (`None`: probe; `Some(ms)`: reject, retry after), given its
    /// own: `local`.
    fn gate(&self, local: Option<u64>) -> Option<u64>;
}

/// A breaker shared with nothing: it counts for itself and decides by its own rules.
#[derive(Debug)]
pub(super) struct Alone;

impl Sharing for Alone {
    #[inline]
    fn record(&self, _count: Count) {}

    #[inline]
    fn gate(&self, local: Option<u64>) -> Option<u64> {
        local
    }
}

/// A breaker held without keeping it alive: what shares it stops when the breaker is dropped.
#[derive(Debug)]
pub(crate) struct WeakBreaker(Weak<Machine>);

impl WeakBreaker {
    /// The breaker, while a handle on it lives.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn get(&self) -> Option<Breaker> {
        self.0.upgrade().map(|machine| Breaker { machine })
    }
}

/// What a shared breaker takes from the local one's settings.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // read by the fleet (feature `redis`) only
pub(crate) struct ShareTerms {
    /// Failures in a row, counted together, that open the shared breaker (`u32::MAX` without a
    /// consecutive rule: then only local trips open it).
    pub(crate) consecutive: u32,
    pub(crate) open: Duration,
    pub(crate) trial_timeout: Duration,
}

impl Breaker {
    /// Shares this breaker through `sharing`; `None` if it is shared already.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn share(&self, sharing: Arc<dyn Sharing>) -> Option<WeakBreaker> {
        self.machine.sharing.set(sharing).ok()?;
        Some(WeakBreaker(Arc::downgrade(&self.machine)))
    }

    /// The settings a shared breaker takes from this one.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn share_terms(&self) -> ShareTerms {
        let c = &self.machine.config;
        ShareTerms {
            consecutive: c.consecutive_failures.unwrap_or(u32::MAX),
            open: c.open_duration,
            trial_timeout: c.trial_timeout,
        }
    }

    /// Whether the breaker is closed.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn is_closed(&self) -> bool {
        self.state() == State::Closed
    }

    /// Whether the breaker is half-open (a trial is under way).
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn is_half_open(&self) -> bool {
        self.state() == State::HalfOpen
    }

    /// Opens a closed breaker because what it is shared with says so (the fleet's
    /// breaker is open); says whether it did.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn force_open(&self, reason: String) -> bool {
        let word = self.word();
        if word.state() != CLOSED {
            return false;
        }
        self.trip(word, State::Closed, reason);
        self.word().state() == OPEN
    }

    /// Closes an open or half-open breaker because what it is shared with says so
    /// (the fleet's trial succeeded); says whether it did.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn force_close(&self, reason: String) -> bool {
        let s = &*self.machine;
        let word = self.word();
        if word.state() == CLOSED {
            return false;
        }
        let closed = word.next(CLOSED);
        if s.word
            .compare_exchange(word.0, closed.0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        s.consecutive.store(0, Ordering::Release);
        match &s.tally {
            Tally::Count(ring) => ring.reset(),
            Tally::Time(buckets) => buckets.reset(),
            Tally::Off => {}
        }
        self.transition(word.public(), State::Closed, reason);
        true
    }

    /// Failures in a row now (the tail a fleet sync reports).
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn consecutive(&self) -> u32 {
        self.machine.consecutive.load(Ordering::Acquire)
    }
}
