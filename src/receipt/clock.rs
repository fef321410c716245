use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time for receipt records (they outlive the process, so not a monotonic clock).
///
/// ```
/// use stormguard::receipt::Clock;
///
/// /// A clock pinned to one instant, e.g. to replay a recorded run.
/// #[derive(Clone)]
/// struct Fixed(u64);
/// impl Clock for Fixed {
///     fn now_ms(&self) -> u64 { self.0 }
/// }
/// assert_eq!(Fixed(1_700_000_000_000).now_ms(), 1_700_000_000_000);
/// ```
pub trait Clock: Clone + Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock.
///
/// ```
/// use stormguard::receipt::{Clock, SystemClock};
///
/// // Milliseconds since the Unix epoch: after 2020-01-01.
/// assert!(SystemClock.now_ms() > 1_577_836_800_000);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to, for tests.
///
/// ```
/// use stormguard::receipt::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance_ms(500);
/// assert_eq!(clock.now_ms(), 1_500);
/// ```
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `ms`.
    pub fn new(ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(ms)))
    }

    /// Moves the clock forward.
    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManualClock({})", self.now_ms())
    }
}

/// The clock a store reads: any [`Clock`], behind one pointer so the store's type stays plain.
#[derive(Clone)]
pub(crate) struct StoreClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl StoreClock {
    pub(crate) fn of(clock: impl Clock) -> Self {
        StoreClock(Arc::new(move || clock.now_ms()))
    }

    pub(crate) fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for StoreClock {
    fn default() -> Self {
        StoreClock::of(SystemClock)
    }
}
