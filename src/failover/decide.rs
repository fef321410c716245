//! The failover's decisions, as pure functions: whether a failure leaves its target, and which
//! target a call goes to. The service only drives them.

use crate::classify::FailureClass;
use crate::classify::{Classification, ServerHint, Verdict};
use crate::error::ErrorCode;
use std::time::Duration;
use tokio::time::Instant;

/// Why a call left a target for the next one.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Leave {
    /// The target's quota or credit is used up (`quota_exhausted`): no wait fixes it here.
    QuotaExhausted,
    /// The target's own breaker is open (`circuit_open`): nothing was sent.
    CircuitOpen,
    /// The target did not process the call: overloaded (529, `overloaded_error`), unavailable
    /// (503) or unreachable (connection refused). Safe to send elsewhere, even for a write.
    Unavailable,
    /// The target is throttling the caller and asks for a wait longer than the failover's
    /// [`max_wait`](super::FailoverBuilder::max_wait) (or names no wait at all).
    RateLimited,
}

impl Leave {
    /// The snake_case name used in metrics, traces and the final error's hint.
    ///
    /// ```
    /// use stormguard::failover::Leave;
    /// assert_eq!(Leave::QuotaExhausted.as_str(), "quota_exhausted");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Leave::QuotaExhausted => "quota_exhausted",
            Leave::CircuitOpen => "circuit_open",
            Leave::Unavailable => "unavailable",
            Leave::RateLimited => "rate_limited",
        }
    }

    /// The error code a call that ran out of targets reports for this reason.
    pub(crate) const fn code(self) -> ErrorCode {
        match self {
            Leave::QuotaExhausted => ErrorCode::QuotaExhausted,
            Leave::CircuitOpen => ErrorCode::CircuitOpen,
            Leave::Unavailable => ErrorCode::Unavailable,
            Leave::RateLimited => ErrorCode::RateLimited,
        }
    }
}

/// Whether an answer ends the call at this target (`None`: return it as it is) or moves it on.
///
/// Only failures that say *this target cannot serve now, and did nothing* move a call on. Every
/// other answer is returned: a success or an empty answer; a failure the model must fix
/// (`invalid_argument`) or that no target fixes (permanent, policy), which another provider would
/// only repeat; an ambiguous failure (a timeout, a reset after sending), which may have taken
/// effect at this target, so sending the call elsewhere could do it twice (a provider's
/// idempotency key does not travel to another provider); and a transient failure that is not an
/// overload signal (a timeout on a read, a 500), which is the `Retry` above's to retry.
pub(crate) fn leaves(c: &Classification, max_wait: Duration) -> Option<Leave> {
    let Verdict::Failure(class) = c.verdict() else {
        return None;
    };
    match (class, c.code()) {
        (_, Some(ErrorCode::QuotaExhausted)) => Some(Leave::QuotaExhausted),
        (_, Some(ErrorCode::CircuitOpen)) => Some(Leave::CircuitOpen),
        (FailureClass::Transient, Some(ErrorCode::Unavailable)) => Some(Leave::Unavailable),
        (FailureClass::Transient, Some(ErrorCode::RateLimited)) => match c.hint() {
            ServerHint::RetryAfter(wait) if wait <= max_wait => None,
            _ => Some(Leave::RateLimited),
        },
        _ => None,
    }
}

/// How long a target that was left is skipped: the server's own wait if it named a longer one,
/// else `probe_every`.
pub(crate) fn away_for(c: &Classification, probe_every: Duration) -> Duration {
    match c.hint() {
        ServerHint::RetryAfter(wait) => wait.max(probe_every),
        _ => probe_every,
    }
}

/// A target's state as the failover sees it: `None` while it serves, or until when it is skipped.
pub(crate) type Away = Option<Instant>;

/// The next target for a call at `now`, among those not `tried` yet: the first in order that is
/// not skipped (a target whose skip has passed is due for a probe: the caller claims it).
/// `None`: every target left is skipped, or tried.
pub(crate) fn pick(away: &[Away], tried: &[bool], now: Instant) -> Option<usize> {
    (0..away.len()).find(|&i| !tried[i] && away[i].is_none_or(|until| until <= now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::KeyConflict;
    use proptest::prelude::*;

    const CLASSES: [FailureClass; 5] = [
        FailureClass::Transient,
        FailureClass::Ambiguous,
        FailureClass::ModelRecoverable,
        FailureClass::Permanent,
        FailureClass::Policy,
    ];

    /// The rule in words, written separately from `leaves`: a call moves on only for the four
    /// "cannot serve now, did nothing" signals.
    fn reference(
        verdict: u8,
        class: FailureClass,
        code: ErrorCode,
        hint: Option<u64>,
        max_wait: u64,
    ) -> Option<Leave> {
        if verdict != 2 {
            return None; // success, empty
        }
        if code == ErrorCode::QuotaExhausted {
            return Some(Leave::QuotaExhausted);
        }
        if code == ErrorCode::CircuitOpen {
            return Some(Leave::CircuitOpen);
        }
        if class != FailureClass::Transient {
            return None; // ambiguous: may have acted; the rest: another target repeats it
        }
        match code {
            ErrorCode::Unavailable => Some(Leave::Unavailable),
            ErrorCode::RateLimited if hint.is_some_and(|h| h <= max_wait) => None,
            ErrorCode::RateLimited => Some(Leave::RateLimited),
            _ => None,
        }
    }

    proptest! {
        #[test]
        fn leaves_matches_the_reference(
            verdict in 0u8..3,
            class in 0usize..5,
            code in 0usize..ErrorCode::ALL.len(),
            hint in proptest::option::of(0u64..5_000),
            max_wait in 0u64..5_000,
            conflict in any::<bool>(),
        ) {
            let class = CLASSES[class];
            let code = ErrorCode::ALL[code];
            let mut c = match verdict {
                0 => Classification::success(),
                1 => Classification::empty(),
                _ => Classification::failure(class, code),
            };
            if let Some(h) = hint {
                c = c.with_hint(ServerHint::RetryAfter(Duration::from_millis(h)));
            }
            if conflict {
                c = c.with_key_conflict(KeyConflict::InProgress);
            }
            prop_assert_eq!(
                leaves(&c, Duration::from_millis(max_wait)),
                reference(verdict, class, code, hint, max_wait)
            );
        }

        #[test]
        fn pick_takes_the_first_serving_target_never_one_tried(
            away in proptest::collection::vec(proptest::option::of(0u64..100), 1..6),
            tried in proptest::collection::vec(any::<bool>(), 6),
            now in 0u64..100,
        ) {
            let base = Instant::now();
            let at = |ms: u64| base + Duration::from_millis(ms);
            let away: Vec<Away> = away.iter().map(|a| a.map(at)).collect();
            let tried = &tried[..away.len()];
            let serving = |i: usize| away[i].is_none_or(|u| u <= at(now));
            match pick(&away, tried, at(now)) {
                Some(i) => {
                    prop_assert!(!tried[i] && serving(i));
                    // Every earlier target was tried or is skipped.
                    prop_assert!((0..i).all(|j| tried[j] || !serving(j)));
                }
                None => prop_assert!((0..away.len()).all(|j| tried[j] || !serving(j))),
            }
        }
    }

    #[test]
    fn a_short_rate_limit_stays_a_long_one_leaves() {
        let limited = |ms| {
            Classification::failure(FailureClass::Transient, ErrorCode::RateLimited)
                .with_hint(ServerHint::RetryAfter(Duration::from_millis(ms)))
        };
        let max = Duration::from_secs(1);
        assert_eq!(leaves(&limited(500), max), None);
        assert_eq!(leaves(&limited(5_000), max), Some(Leave::RateLimited));
        assert_eq!(away_for(&limited(5_000), max), Duration::from_secs(5));
        assert_eq!(away_for(&limited(5), max), max);
    }
}
