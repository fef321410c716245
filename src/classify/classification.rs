//! What a classifier says about one result: a [`Verdict`], as a [`Classification`] with its
//! code, the server's hint and, for a request that carried an idempotency key, a [`KeyConflict`].

use super::{FailureClass, ServerHint};
use crate::error::ErrorCode;

/// What happened, in one word.
///
/// ```
/// use stormguard::classify::{classify_error, Classification, FailureClass, Verdict};
///
/// assert_eq!(Classification::empty().verdict(), Verdict::Empty);
/// let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
/// assert_eq!(classify_error(&denied).verdict(), Verdict::Failure(FailureClass::Permanent));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The call did what was asked.
    Success,
    /// A normal "nothing there" answer, such as "no such record". Neither a success nor a failure
    /// of the dependency: a breaker ignores it and nothing retries it.
    Empty,
    /// The call failed; the class says what that means for a retry.
    Failure(FailureClass),
}

/// A verdict plus the code that describes it and any hint the server gave.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::{Classification, FailureClass, Verdict};
/// use stormguard::error::ErrorCode;
///
/// let c = Classification::failure(FailureClass::Transient, ErrorCode::RateLimited)
///     .with_hint(ServerHint::RetryAfter(Duration::from_secs(3)));
/// assert_eq!(c.verdict(), Verdict::Failure(FailureClass::Transient));
/// assert_eq!(c.code(), Some(ErrorCode::RateLimited));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    verdict: Verdict,
    code: Option<ErrorCode>,
    hint: ServerHint,
    key_conflict: Option<KeyConflict>,
}

/// What a failure means if the request carried an idempotency key, in the words of the IETF
/// `Idempotency-Key` header draft (and of Stripe): a classifier that sees the answer says which;
/// the retry decision, which knows the tool's class and whether the request carried its key,
/// acts on it (see [`Retry`](crate::retry::Retry)).
///
/// | answer | a keyed write carrying its key | anything else |
/// |---|---|---|
/// | `InProgress` (HTTP 409) | `Transient` `in_progress`: retried with backoff, within the attempts | as classified (`Permanent` `conflict`) |
/// | `Reused` (HTTP 422) | `Permanent` `idempotency_key_reused` (any request carrying a key) | as classified (`ModelRecoverable` `invalid_argument`) |
///
/// ```
/// use stormguard::classify::{classify_status, KeyConflict};
///
/// assert_eq!(classify_status(http::StatusCode::CONFLICT).key_conflict(), Some(KeyConflict::InProgress));
/// assert_eq!(classify_status(http::StatusCode::UNPROCESSABLE_ENTITY).key_conflict(), Some(KeyConflict::Reused));
/// assert_eq!(classify_status(http::StatusCode::BAD_REQUEST).key_conflict(), None);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyConflict {
    /// A request with this key is still being processed (HTTP 409): the same action, not done
    /// yet; asked again later, the provider answers its result.
    InProgress,
    /// The key was used before with another payload (HTTP 422): this request is a reworded
    /// repeat of an action the provider already has under the key.
    Reused,
}

/// A success, as a constant: copied whole from one place, never written field by field.
const SUCCESS: Classification = Classification {
    verdict: Verdict::Success,
    code: None,
    hint: ServerHint::None,
    key_conflict: None,
};

impl Classification {
    /// A success.
    pub const fn success() -> Self {
        SUCCESS
    }

    /// A normal empty answer ("no such record").
    pub const fn empty() -> Self {
        Classification {
            verdict: Verdict::Empty,
            code: Some(ErrorCode::NotFound),
            hint: ServerHint::None,
            key_conflict: None,
        }
    }

    /// A failure of `class`, described by `code`.
    pub const fn failure(class: FailureClass, code: ErrorCode) -> Self {
        Classification {
            verdict: Verdict::Failure(class),
            code: Some(code),
            hint: ServerHint::None,
            key_conflict: None,
        }
    }

    /// Adds the server's hint.
    pub const fn with_hint(mut self, hint: ServerHint) -> Self {
        self.hint = hint;
        self
    }

    /// Says what the failure means for a request that carried an idempotency key.
    pub const fn with_key_conflict(mut self, conflict: KeyConflict) -> Self {
        self.key_conflict = Some(conflict);
        self
    }

    /// What the failure means for a request that carried an idempotency key, if the classifier
    /// could tell.
    pub const fn key_conflict(&self) -> Option<KeyConflict> {
        self.key_conflict
    }

    /// The verdict.
    pub const fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The failure class, if the verdict is a failure.
    pub const fn failure_class(&self) -> Option<FailureClass> {
        match self.verdict {
            Verdict::Failure(class) => Some(class),
            _ => None,
        }
    }

    /// The code that describes the outcome (`None` for a success).
    pub const fn code(&self) -> Option<ErrorCode> {
        self.code
    }

    /// What the server asked for.
    pub const fn hint(&self) -> ServerHint {
        self.hint
    }
}
