//! What whatever shares a breaker (see [`share`](super::share)) may do to it: hold it without
//! keeping it alive, read its settings and its tail of failures, open or close it.

use super::share::{ShareTerms, Sharing};
use super::state::{Breaker, Machine, CLOSED, OPEN};
use super::window::Tally;
use super::State;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

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
