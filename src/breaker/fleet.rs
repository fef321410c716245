//! What a breaker shared with a fleet exposes to the fleet's sync (feature `redis`): its counts,
//! and a gate on its probes. The sync itself is in [`fleet`](crate::fleet).

use super::policy::Count;
use super::state::{Breaker, Shared};
use super::State;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// The open breaker follows its own rules (the fleet is closed, or down).
pub(crate) const LOCAL: u8 = 0;
/// The fleet's breaker is open and another worker holds its trial: no probe here.
pub(crate) const GATED: u8 = 1;
/// This worker holds the fleet's trial: the open breaker probes at its next call.
pub(crate) const PROBE: u8 = 2;

/// The breaker's side of the fleet's sync.
#[derive(Debug)]
pub(crate) struct Tap {
    successes: AtomicU64,
    failures: AtomicU64,
    gate: AtomicU8,
    /// While gated: how long until the fleet lets a trial go (ms).
    retry_after_ms: AtomicU32,
    /// A call came to the open breaker since the last sync: this worker has traffic to probe
    /// with, so it may take the fleet's trial lease.
    demand: AtomicBool,
    pub(crate) wake: Notify,
}

impl Tap {
    /// Counts an outcome for the next sync; a failure wakes the sync at once.
    #[inline]
    pub(super) fn record(&self, count: Count) {
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
    pub(super) fn gate(&self, local: Option<u64>) -> Option<u64> {
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

    pub(crate) fn set_gate(&self, gate: u8, retry_after: Duration) {
        self.retry_after_ms.store(
            u32::try_from(retry_after.as_millis()).unwrap_or(u32::MAX),
            Ordering::Release,
        );
        self.gate.store(gate, Ordering::Release);
    }

    pub(crate) fn gate_now(&self) -> u8 {
        self.gate.load(Ordering::Acquire)
    }

    /// Whether a call came to the open breaker since the last sync (and forget it).
    pub(crate) fn take_demand(&self) -> bool {
        self.demand.swap(false, Ordering::AcqRel)
    }

    /// The counts since the last sync (successes, failures).
    pub(crate) fn take_counts(&self) -> (u64, u64) {
        (
            self.successes.swap(0, Ordering::AcqRel),
            self.failures.swap(0, Ordering::AcqRel),
        )
    }
}

/// The breaker as the fleet's sync holds it: the sync ends when the breaker is dropped.
#[derive(Debug)]
pub(crate) struct Watched(Weak<Shared>);

impl Watched {
    pub(crate) fn get(&self) -> Option<Breaker> {
        self.0.upgrade().map(|shared| Breaker { shared })
    }
}

/// What the fleet's breaker takes from the local one's settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FleetTerms {
    /// Failures in a row, fleet-wide, that open the fleet's breaker (`u32::MAX` without a
    /// consecutive rule: then only local trips open it).
    pub(crate) consecutive: u32,
    pub(crate) open: Duration,
    pub(crate) trial_timeout: Duration,
}

impl Breaker {
    /// Attaches a tap for a fleet; `None` if the breaker is shared already.
    pub(crate) fn tap_for_fleet(&self) -> Option<(Arc<Tap>, Watched)> {
        let tap = Arc::new(Tap {
            successes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            gate: AtomicU8::new(LOCAL),
            retry_after_ms: AtomicU32::new(0),
            demand: AtomicBool::new(false),
            wake: Notify::new(),
        });
        self.shared.fleet.set(tap.clone()).ok()?;
        Some((tap, Watched(Arc::downgrade(&self.shared))))
    }

    pub(crate) fn fleet_terms(&self) -> FleetTerms {
        let c = &self.shared.config;
        FleetTerms {
            consecutive: c.consecutive_failures.unwrap_or(u32::MAX),
            open: c.open_duration,
            trial_timeout: c.trial_timeout,
        }
    }

    /// Opens the breaker for the fleet; whether it did.
    pub(crate) fn fleet_open(&self, reason: String) -> bool {
        self.force_open(reason)
    }

    /// Closes the breaker for the fleet; whether it did.
    pub(crate) fn fleet_close(&self, reason: String) -> bool {
        self.force_close(reason)
    }

    /// Failures in a row now.
    pub(crate) fn fleet_tail(&self) -> u32 {
        self.consecutive()
    }

    /// Whether the breaker is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.state() == State::Closed
    }

    /// Whether the breaker is half-open (a trial is under way).
    pub(crate) fn is_half_open(&self) -> bool {
        self.state() == State::HalfOpen
    }
}
