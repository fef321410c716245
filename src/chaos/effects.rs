//! What the fault layer did: per operation, how many times the inner service did the work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One attempt the layer saw.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effect {
    /// The operation it belongs to.
    pub operation: u64,
    /// Its attempt number in that operation (1 for the first).
    pub attempt: u32,
    /// The fault drawn, by name (`None`: passed through).
    pub fault: Option<&'static str>,
}

#[derive(Debug, Default)]
struct Tally {
    log: Vec<Effect>,
    /// Work done per operation (the inner service answered with success).
    work: HashMap<u64, u32>,
    /// Attempts seen per operation.
    attempts: HashMap<u64, u32>,
    not_done: u64,
    failed_after_work: u64,
}

/// The effect ledger of a [`ChaosLayer`](super::ChaosLayer), shared by its clones and services.
/// It keeps every attempt it saw: a tool for tests and harnesses, not for production traffic.
/// "Work" is an attempt the inner service answered with `Ok`, at the time it did (a late commit
/// counts when it lands).
///
/// ```
/// let effects = stormguard::chaos::ChaosLayer::off().effects();
/// assert_eq!((effects.calls(), effects.work_done(), effects.duplicated_operations()), (0, 0, 0));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Effects {
    tally: Arc<Mutex<Tally>>,
}

impl Effects {
    fn lock(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attempt number of the next call of `operation` (1 for its first).
    pub(crate) fn next_attempt(&self, operation: u64) -> u32 {
        let mut tally = self.lock();
        let seen = tally.attempts.entry(operation).or_default();
        *seen += 1;
        *seen
    }

    pub(crate) fn saw(&self, effect: Effect, does_work: bool) {
        let mut tally = self.lock();
        tally.log.push(effect);
        if !does_work {
            tally.not_done += 1;
        }
        if effect.fault == Some("failed_after_work") {
            tally.failed_after_work += 1;
        }
    }

    pub(crate) fn worked(&self, operation: u64) {
        *self.lock().work.entry(operation).or_default() += 1;
    }

    /// Attempts the layer saw (with faults configured; a layer that is off keeps no ledger).
    pub fn calls(&self) -> u64 {
        self.lock().log.len() as u64
    }

    /// Times the inner service did the work, over all operations.
    pub fn work_done(&self) -> u64 {
        self.lock().work.values().map(|n| u64::from(*n)).sum()
    }

    /// Times the inner service did the work for `operation`.
    pub fn work_done_for(&self, operation: u64) -> u32 {
        self.lock().work.get(&operation).copied().unwrap_or(0)
    }

    /// Operations whose work was done more than once: the duplicates a test asserts are 0.
    pub fn duplicated_operations(&self) -> u64 {
        self.lock().work.values().filter(|n| **n > 1).count() as u64
    }

    /// Attempts answered with a fault that did not do the work (429, 529, 503).
    pub fn not_done(&self) -> u64 {
        self.lock().not_done
    }

    /// Attempts that did the work and were answered with a proxy's 5xx.
    pub fn failed_after_work(&self) -> u64 {
        self.lock().failed_after_work
    }

    /// Every attempt, in the order the layer saw them.
    pub fn log(&self) -> Vec<Effect> {
        self.lock().log.clone()
    }
}
