//! A deadline that passed on tokio's paused clock, said out loud.
//!
//! Under a test's `start_paused`, tokio's clock stands still and jumps to the next timer
//! whenever the runtime has nothing to do, and waiting for a blocking thread (a SQLite store's
//! work, `spawn_blocking`) is nothing to do: the operation's deadline then passes at once, with
//! the store's write in flight, and every call ends `deadline_exceeded` or `outcome_unknown`
//! though nothing was slow. Only read where a deadline has already ended a call (cold), so the
//! first try pays nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The counter of deadline endings while tokio's clock was paused.
pub(crate) const PAUSED_CLOCK_DEADLINES: &str = "stormguard_paused_clock_deadlines_total";

/// How far tokio's clock has moved apart from the wall clock, when it has: both read now. On a
/// running clock tokio's time is the wall clock's (well under a millisecond apart); a paused one
/// stands still (behind) or has jumped to a timer (ahead).
fn apart(tokio_now: std::time::Instant, wall_now: std::time::Instant) -> Option<Duration> {
    const SLACK: Duration = Duration::from_millis(50);
    let apart = match tokio_now.checked_duration_since(wall_now) {
        Some(ahead) => ahead,
        None => wall_now.duration_since(tokio_now),
    };
    (apart > SLACK).then_some(apart)
}

/// The hint's note when the clock is paused (and a WARN once per process, and the counter):
/// what happened and the fix; `None` on a running clock.
#[cold]
pub(super) fn note(layer: &str) -> Option<String> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let apart = apart(
        tokio::time::Instant::now().into_std(),
        std::time::Instant::now(),
    )?;
    metrics::counter!(PAUSED_CLOCK_DEADLINES).increment(1);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            layer,
            apart_ms = apart.as_millis() as u64,
            "an operation's deadline passed on tokio's paused clock: it jumps to the deadline while the runtime waits for a blocking thread (a SQLite store), so nothing was slow; test receipts on a running clock or on InMemoryStore"
        );
    }
    Some(format!(
        " (tokio's clock is paused, {} ms apart from the wall clock: it jumps to the deadline while the runtime waits for work off it, such as a SQLite store's, so the deadline may have passed though nothing was slow; run such tests on a running clock, or with InMemoryStore)",
        apart.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::apart;
    use std::time::{Duration, Instant};

    #[test]
    fn clocks_a_few_microseconds_apart_are_one_clock_and_a_jump_is_seen_either_way() {
        let wall = Instant::now();
        assert_eq!(apart(wall, wall), None);
        assert_eq!(apart(wall + Duration::from_micros(300), wall), None);
        assert_eq!(
            apart(wall + Duration::from_secs(300), wall),
            Some(Duration::from_secs(300))
        );
        let later = wall + Duration::from_secs(2);
        assert_eq!(apart(wall, later), Some(Duration::from_secs(2)));
    }
}
