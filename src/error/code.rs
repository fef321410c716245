use serde::{Deserialize, Serialize};
use std::fmt;

/// The stable machine code of a [`ToolError`](super::ToolError).
///
/// The snake_case string ([`ErrorCode::as_str`], and the serde form) never changes for a code;
/// new codes may be added, so match with a wildcard arm.
///
/// ```
/// use stormguard::error::ErrorCode;
/// assert_eq!(ErrorCode::RetryBudgetExhausted.as_str(), "retry_budget_exhausted");
/// assert_eq!(ErrorCode::parse("outcome_unknown"), Some(ErrorCode::OutcomeUnknown));
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The dependency is throttling the caller (HTTP 429, gRPC `RESOURCE_EXHAUSTED`).
    RateLimited,
    /// The dependency could not be reached or answered that it is unavailable.
    Unavailable,
    /// The call timed out; it may or may not have taken effect.
    Timeout,
    /// The arguments were rejected; the model should fix them.
    InvalidArgument,
    /// The record does not exist.
    NotFound,
    /// The credentials were rejected.
    Unauthenticated,
    /// The caller is not allowed to do this.
    PermissionDenied,
    /// The request conflicts with the current state of the resource.
    Conflict,
    /// A guardrail stopped the call.
    PolicyViolation,
    /// The shared retry budget refused a retry.
    RetryBudgetExhausted,
    /// The run budget (retries or retry time of one agent run) refused a retry.
    RunBudgetExhausted,
    /// The operation's deadline would pass before the next attempt.
    DeadlineExceeded,
    /// A write may have taken effect and cannot be retried safely: escalate.
    OutcomeUnknown,
    /// A write that needs an idempotency key to be retried had none.
    MissingIdempotencyKey,
    /// The circuit breaker is open: calls are paused.
    CircuitOpen,
    /// The dependency failed in a way nothing more specific describes.
    Internal,
    /// The idempotency key of one operation changed between its attempts.
    IdempotencyKeyChanged,
    /// The key was used before with different arguments.
    IdempotencyKeyReused,
    /// The same action (same key) is being executed by another caller right now.
    InProgress,
    /// This key's intent has no receipt and is older than the
    /// [`retention`](crate::receipt::ReceiptConfigBuilder::retention) set in the receipt layer's
    /// [`ReceiptConfig`](crate::receipt::ReceiptConfig): its outcome was never recorded.
    ReceiptExpired,
    /// The receipt store could not record the intent, so nothing was executed.
    StoreUnavailable,
    /// The account's quota or credit is used up (OpenAI's `insufficient_quota`, a 429 that no
    /// wait fixes): nothing helps until billing or limits change.
    QuotaExhausted,
    /// A streamed answer broke after part of it reached the caller: what was read is not the
    /// whole answer, and nothing below sent it again (the caller holds part of it).
    PartialAnswer,
}

impl ErrorCode {
    /// Every code, in declaration order.
    ///
    /// ```
    /// use stormguard::error::ErrorCode;
    ///
    /// for code in ErrorCode::ALL {
    ///     assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
    ///     assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
    /// }
    /// ```
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::RateLimited,
        ErrorCode::Unavailable,
        ErrorCode::Timeout,
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::Conflict,
        ErrorCode::PolicyViolation,
        ErrorCode::RetryBudgetExhausted,
        ErrorCode::RunBudgetExhausted,
        ErrorCode::DeadlineExceeded,
        ErrorCode::OutcomeUnknown,
        ErrorCode::MissingIdempotencyKey,
        ErrorCode::CircuitOpen,
        ErrorCode::Internal,
        ErrorCode::IdempotencyKeyChanged,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::InProgress,
        ErrorCode::ReceiptExpired,
        ErrorCode::StoreUnavailable,
        ErrorCode::QuotaExhausted,
        ErrorCode::PartialAnswer,
    ];

    /// The stable snake_case string.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PolicyViolation => "policy_violation",
            ErrorCode::RetryBudgetExhausted => "retry_budget_exhausted",
            ErrorCode::RunBudgetExhausted => "run_budget_exhausted",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::MissingIdempotencyKey => "missing_idempotency_key",
            ErrorCode::CircuitOpen => "circuit_open",
            ErrorCode::Internal => "internal",
            ErrorCode::IdempotencyKeyChanged => "idempotency_key_changed",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::InProgress => "in_progress",
            ErrorCode::ReceiptExpired => "receipt_expired",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::QuotaExhausted => "quota_exhausted",
            ErrorCode::PartialAnswer => "partial_answer",
        }
    }

    /// The code for a snake_case string, if there is one.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Whether an error with this code may, by default, be retried by its caller.
    ///
    /// Only throttling, unavailability, timeouts and an open circuit are retryable by default;
    /// stormguard's `Retry` marks the errors it gives up on non-retryable whatever their code.
    pub const fn default_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::RateLimited
                | ErrorCode::Unavailable
                | ErrorCode::Timeout
                | ErrorCode::CircuitOpen
                | ErrorCode::InProgress
                | ErrorCode::StoreUnavailable
        )
    }

    /// The default hint: what a model (or a person) should do next.
    pub const fn default_hint(self) -> &'static str {
        match self {
            ErrorCode::RateLimited => {
                "the service is rate limiting these calls; wait retry_after_ms (or a few seconds) before calling again"
            }
            ErrorCode::Unavailable => {
                "the service is temporarily unavailable; retry later with backoff"
            }
            ErrorCode::Timeout => {
                "the call timed out and may or may not have taken effect; check before repeating a write"
            }
            ErrorCode::InvalidArgument => {
                "the arguments were rejected; fix them before calling again, do not repeat the same call"
            }
            ErrorCode::NotFound => "no such record; check the identifier, do not retry",
            ErrorCode::Unauthenticated => {
                "the credentials were rejected; do not retry, ask an operator to fix the credentials"
            }
            ErrorCode::PermissionDenied => {
                "this caller is not allowed to do that; do not retry, choose another action or ask a person"
            }
            ErrorCode::Conflict => {
                "the request conflicts with the resource's current state; read it again before deciding"
            }
            ErrorCode::PolicyViolation => {
                "a guardrail stopped this call; do not retry, halt and report"
            }
            ErrorCode::RetryBudgetExhausted => {
                "the dependency keeps failing and its retry budget is spent; do not retry now, report the outage"
            }
            ErrorCode::RunBudgetExhausted => {
                "this run has spent its retry budget; do not retry, finish with what you have or escalate"
            }
            ErrorCode::DeadlineExceeded => {
                "the operation's deadline would pass before another attempt; do not retry within this operation"
            }
            ErrorCode::OutcomeUnknown => {
                "the write may have taken effect and cannot be repeated safely; do not retry, escalate to a person or verify with a consistent read"
            }
            ErrorCode::MissingIdempotencyKey => {
                "this write may have taken effect and carried no idempotency key, so it cannot be repeated safely; do not retry, escalate"
            }
            ErrorCode::CircuitOpen => {
                "calls to this dependency are paused after repeated failures; wait retry_after_ms before calling again"
            }
            ErrorCode::Internal => "the dependency failed unexpectedly; report it",
            ErrorCode::IdempotencyKeyChanged => {
                "the idempotency key changed between attempts of one action, which defeats it; do not retry, derive the key from run, step, tool and arguments"
            }
            ErrorCode::IdempotencyKeyReused => {
                "this key was already used for the same step with different arguments; do not retry, this is a different action and needs its own step"
            }
            ErrorCode::InProgress => {
                "the same action is being executed right now by another caller; wait a few seconds and ask for its result, do not start it again"
            }
            ErrorCode::ReceiptExpired => {
                "the record of this action is older than the receipt retention, so whether it ran cannot be checked; do not retry, escalate to a person"
            }
            ErrorCode::StoreUnavailable => {
                "the receipt store could not record the intent, so nothing was executed; retry later"
            }
            ErrorCode::QuotaExhausted => {
                "the account's quota or credit is used up; waiting or retrying will not help until billing or limits change; tell the user"
            }
            ErrorCode::PartialAnswer => {
                "the answer broke off midway; discard the part you have and do not act on it; ask again only if the call was a read"
            }
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
