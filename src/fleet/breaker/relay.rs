//! What a breaker shared with a fleet and the fleet's sync pass each other: [`Relay`], the
//! fleet's [`Sharing`] for a breaker.

use crate::breaker::share::Sharing;
use crate::breaker::Count;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// The open breaker follows its own rules (the fleet is closed, or down).
pub(super) const LOCAL: u8 = 0;
/// The fleet's breaker is open and another worker holds its trial: no probe here.
pub(super) const GATED: u8 = 1;
/// This worker holds the fleet's trial: the open breaker probes at its next call.
pub(super) const PROBE: u8 = 2;

/// What the local breaker and the fleet's sync pass each other: the outcomes counted since
/// the last sync, one way; the gate on the open breaker's probes, the other.
#[derive(Debug, Default)]
pub(super) struct Relay {
    successes: AtomicU64,
    failures: AtomicU64,
    gate: AtomicU8,
    /// While gated: how long until the fleet lets a trial go (ms).
    retry_after_ms: AtomicU32,
    /// A call came to the open breaker since the last sync: this worker has traffic to probe
    /// with, so it may take the fleet's trial lease.
    demand: AtomicBool,
    pub(super) wake: Notify,
}

impl Relay {
    pub(super) fn set_gate(&self, gate: u8, retry_after: Duration) {
        self.retry_after_ms.store(
            u32::try_from(retry_after.as_millis()).unwrap_or(u32::MAX),
            Ordering::Release,
        );
        self.gate.store(gate, Ordering::Release);
    }

    pub(super) fn gate_now(&self) -> u8 {
        self.gate.load(Ordering::Acquire)
    }

    /// Whether a call came to the open breaker since the last sync (and forget it).
    pub(super) fn take_demand(&self) -> bool {
        self.demand.swap(false, Ordering::AcqRel)
    }

    /// The counts since the last sync (successes, failures).
    pub(super) fn take_counts(&self) -> (u64, u64) {
        (
            self.successes.swap(0, Ordering::AcqRel),
            self.failures.swap(0, Ordering::AcqRel),
        )
    }
}

/// The breaker's side: its outcomes counted for the next sync, its probes held to the fleet's
/// trial lease.
impl Sharing for Relay {
    /// Counts an outcome for the next sync; a failure wakes the sync at once.
    #[inline]
    fn record(&self, count: Count) {
        match count {
            Count::Success => {
                self.successes.fetch_add(1, Ordering::Relaxed);
            }
            Count::Failure => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.wake.notify_one();
            }
            Count::Ignore => {}
        }
    }

    /// The open breaker's local decision (`None`: probe), as the fleet's gate has it.
    fn gate(&self, local: Option<u64>) -> Option<u64> {
        if !self.demand.load(Ordering::Relaxed) {
            self.demand.store(true, Ordering::Relaxed);
        }
        match self.gate.load(Ordering::Acquire) {
            GATED => {
                Some(local.unwrap_or_else(|| {
                    u64::from(self.retry_after_ms.load(Ordering::Acquire)).max(1)
                }))
            }
            PROBE => None,
            _ => local,
        }
    }
}
