//! What a breaker shares with others, behind one small trait: [`Sharing`]. A breaker alone
//! ([`Alone`], the default) follows its own rules; one shared with a fleet (feature `redis`)
//! reports its outcomes there, and its open state lets a probe go only when the fleet's trial is
//! this worker's. The fleet implements [`Sharing`] and drives the breaker through the calls
//! of [`control`](super::control); the breaker never names it.

use super::policy::Count;
use std::fmt;
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
