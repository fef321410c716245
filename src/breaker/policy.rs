use crate::classify::{Classification, FailureClass, Verdict};

/// How one outcome counts toward a breaker's view of its dependency's health.
///
/// ```
/// use stormguard::breaker::{Count, CountDependencyFailures, CountPolicy};
/// use stormguard::classify::{Classification, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// let policy = CountDependencyFailures;
/// assert_eq!(policy.count(&Classification::success()), Count::Success);
/// let bad_arg =
///     Classification::failure(FailureClass::ModelRecoverable, ErrorCode::InvalidArgument);
/// assert_eq!(policy.count(&bad_arg), Count::Ignore);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Count {
    /// Evidence that the dependency works.
    Success,
    /// Evidence that the dependency is failing.
    Failure,
    /// No evidence either way: an empty answer, a caller's mistake, a guardrail.
    Ignore,
}

/// Maps a [`Classification`] to a [`Count`]. Replace it to count differently; closures
/// `Fn(&Classification) -> Count` implement it.
///
/// ```
/// use stormguard::breaker::{Count, CountPolicy, CountDependencyFailures};
/// use stormguard::classify::{Classification, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// let policy = CountDependencyFailures;
/// assert_eq!(policy.count(&Classification::empty()), Count::Ignore);
/// assert_eq!(
///     policy.count(&Classification::failure(FailureClass::Ambiguous, ErrorCode::Timeout)),
///     Count::Failure,
/// );
///
/// // Count expired credentials too (they recur on every call until an operator acts).
/// let strict = |c: &Classification| match c.failure_class() {
///     Some(FailureClass::Permanent) => Count::Failure,
///     _ => CountDependencyFailures.count(c),
/// };
/// # let _ = strict;
/// ```
pub trait CountPolicy {
    /// How `classification` counts.
    fn count(&self, classification: &Classification) -> Count;
}

impl<F: Fn(&Classification) -> Count> CountPolicy for F {
    fn count(&self, classification: &Classification) -> Count {
        self(classification)
    }
}

/// The default: `Failure(Transient | Ambiguous)` counts against the dependency, `Success` for
/// it, and `Empty`, `ModelRecoverable`, `Permanent` and `Policy` not at all.
///
/// | verdict | counts as |
/// |---|---|
/// | `Success` | success |
/// | `Failure(Transient)`, `Failure(Ambiguous)` | failure |
/// | `Empty` ("no such record") | ignored |
/// | `Failure(ModelRecoverable)` (bad argument) | ignored |
/// | `Failure(Permanent)` (bad credential, forbidden) | ignored |
/// | `Failure(Policy)` (guardrail) | ignored |
///
/// ```
/// use stormguard::breaker::{Count, CountDependencyFailures, CountPolicy};
/// use stormguard::classify::{Classification, FailureClass};
/// use stormguard::error::ErrorCode;
///
/// let forbidden = Classification::failure(FailureClass::Permanent, ErrorCode::PermissionDenied);
/// assert_eq!(CountDependencyFailures.count(&forbidden), Count::Ignore);
/// let refused = Classification::failure(FailureClass::Transient, ErrorCode::Unavailable);
/// assert_eq!(CountDependencyFailures.count(&refused), Count::Failure);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CountDependencyFailures;

impl CountPolicy for CountDependencyFailures {
    fn count(&self, classification: &Classification) -> Count {
        match classification.verdict() {
            Verdict::Success => Count::Success,
            Verdict::Empty => Count::Ignore,
            Verdict::Failure(FailureClass::Transient | FailureClass::Ambiguous) => Count::Failure,
            Verdict::Failure(_) => Count::Ignore,
        }
    }
}
