//! The windows a failure rate is computed over: the last `n` counted calls (a ring), or the
//! last `n` seconds (one-second buckets). Lock-free; each `record` returns (calls, failures) in
//! the window after it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

const EMPTY_SLOT: u8 = 0;
const SUCCESS_SLOT: u8 = 1;
const FAILURE_SLOT: u8 = 2;

/// The last `n` counted outcomes.
pub(super) struct Ring {
    slots: Box<[AtomicU8]>,
    /// The next slot to write, in `0..n` (wrapped by comparison: no division per call).
    cursor: AtomicU32,
    /// Whether every slot has been written since the last reset.
    full: AtomicBool,
    failures: AtomicU32,
}

impl Ring {
    pub(super) fn new(n: u32) -> Ring {
        Ring {
            slots: (0..n).map(|_| AtomicU8::new(EMPTY_SLOT)).collect(),
            cursor: AtomicU32::new(0),
            full: AtomicBool::new(false),
            failures: AtomicU32::new(0),
        }
    }

    /// Records one outcome; returns (calls in the window, failures in the window).
    pub(super) fn record(&self, failed: bool) -> (u32, u32) {
        let len = self.slots.len() as u32;
        // Not a read-modify-write: under contention two outcomes may share a slot, which only
        // ages the window a little more slowly; the failure count stays exact for the slots.
        let i = self.cursor.load(Ordering::Relaxed);
        let i = if i < len { i } else { 0 };
        let next = if i + 1 < len {
            i + 1
        } else {
            if !self.full.load(Ordering::Relaxed) {
                self.full.store(true, Ordering::Relaxed);
            }
            0
        };
        self.cursor.store(next, Ordering::Relaxed);
        let slot = &self.slots[i as usize];
        let new = if failed { FAILURE_SLOT } else { SUCCESS_SLOT };
        // A healthy dependency overwrites successes with successes: read, don't write.
        if slot.load(Ordering::Acquire) != new {
            let old = slot.swap(new, Ordering::AcqRel);
            if failed && old != FAILURE_SLOT {
                self.failures.fetch_add(1, Ordering::AcqRel);
            } else if !failed && old == FAILURE_SLOT {
                // Saturating: a reset racing with this record must not wrap the count.
                let _ = self
                    .failures
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            }
        }
        let calls = if self.full.load(Ordering::Relaxed) {
            len
        } else {
            i + 1
        };
        (calls, self.failures.load(Ordering::Acquire))
    }

    pub(super) fn reset(&self) {
        for slot in self.slots.iter() {
            slot.store(EMPTY_SLOT, Ordering::Release);
        }
        self.failures.store(0, Ordering::Release);
        self.full.store(false, Ordering::Release);
        self.cursor.store(0, Ordering::Release);
    }
}

/// Outcomes of the last `n` seconds, in one-second buckets.
pub(super) struct Buckets {
    epochs: Box<[AtomicU64]>,
    calls: Box<[AtomicU32]>,
    failures: Box<[AtomicU32]>,
}

impl Buckets {
    pub(super) fn new(secs: u64) -> Buckets {
        let n = secs.max(1) as usize;
        Buckets {
            epochs: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            calls: (0..n).map(|_| AtomicU32::new(0)).collect(),
            failures: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub(super) fn record(&self, now_sec: u64, failed: bool) -> (u32, u32) {
        let n = self.epochs.len() as u64;
        let i = (now_sec % n) as usize;
        let seen = self.epochs[i].load(Ordering::Acquire);
        if seen != now_sec
            && self.epochs[i]
                .compare_exchange(seen, now_sec, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.calls[i].store(0, Ordering::Release);
            self.failures[i].store(0, Ordering::Release);
        }
        self.calls[i].fetch_add(1, Ordering::AcqRel);
        if failed {
            self.failures[i].fetch_add(1, Ordering::AcqRel);
        }
        let (mut calls, mut failures) = (0, 0);
        for j in 0..self.epochs.len() {
            let epoch = self.epochs[j].load(Ordering::Acquire);
            if epoch != u64::MAX && epoch + n > now_sec {
                calls += self.calls[j].load(Ordering::Acquire);
                failures += self.failures[j].load(Ordering::Acquire);
            }
        }
        (calls, failures)
    }

    pub(super) fn reset(&self) {
        for e in self.epochs.iter() {
            e.store(u64::MAX, Ordering::Release);
        }
    }
}

/// The failure-rate rule's window, or none.
pub(super) enum Tally {
    Count(Ring),
    Time(Buckets),
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_counts_the_last_n_outcomes_across_wraps() {
        let ring = Ring::new(4);
        assert_eq!(ring.record(true), (1, 1));
        assert_eq!(ring.record(false), (2, 1));
        assert_eq!(ring.record(true), (3, 2));
        assert_eq!(ring.record(true), (4, 3));
        // Wrapped: the first failure is overwritten by a success.
        assert_eq!(ring.record(false), (4, 2));
        assert_eq!(ring.record(true), (4, 3));
        for _ in 0..8 {
            ring.record(false);
        }
        assert_eq!(ring.record(false), (4, 0));
        ring.reset();
        assert_eq!(ring.record(true), (1, 1));
    }
}
