//! What the receipt layer answers itself, without sending the call: its refusals (each with its
//! class and hint), and the count and the note to the operation that go with every such answer.

use super::store::StoreError;
use crate::classify::FailureClass;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::key::IdempotencyKey;
use crate::operation::Operation;

pub(super) fn refusal(code: ErrorCode, key: &IdempotencyKey, op: Option<&Operation>) -> BoxError {
    tracing::info!(key = %key, code = code.as_str(), "receipt refused the call");
    counted(code.as_str());
    answered_here(op);
    Box::new(
        ToolError::new(code)
            .with_retryable(code.default_retryable())
            .with_class(refusal_class(code)),
    )
}

pub(super) fn refused(
    code: ErrorCode,
    key: &IdempotencyKey,
    hint: &'static str,
    op: Option<&Operation>,
) -> BoxError {
    tracing::info!(key = %key, code = code.as_str(), "receipt refused the call");
    counted(code.as_str());
    answered_here(op);
    Box::new(
        ToolError::new(code)
            .with_retryable(code.default_retryable())
            .with_class(refusal_class(code))
            .with_hint(hint),
    )
}

/// What a refusal means for a retry: the same action in flight elsewhere is worth asking again
/// later; an outcome nobody recorded may have taken effect; the rest end the operation.
fn refusal_class(code: ErrorCode) -> crate::classify::FailureClass {
    use crate::classify::FailureClass;
    match code {
        ErrorCode::InProgress => FailureClass::Transient,
        ErrorCode::OutcomeUnknown => FailureClass::Ambiguous,
        _ => FailureClass::Permanent,
    }
}

pub(super) fn counted(outcome: &'static str) {
    crate::telemetry::receipt_outcome(outcome);
}

/// This attempt was answered here without reaching the dependency (a receipt, a refusal): a
/// `Retry` above counts it against the operation's attempts, but does not report it as one.
pub(super) fn answered_here(op: Option<&Operation>) {
    match op {
        Some(op) => op.with(|state| state.answered_locally()),
        None => {
            crate::operation::ledger::with_current(|state| state.answered_locally());
        }
    }
}

pub(super) fn store_down(e: StoreError, op: Option<&Operation>) -> BoxError {
    counted("store_unavailable");
    answered_here(op);
    tracing::warn!(error = %e, "receipt store unavailable; the call was not executed");
    Box::new(ToolError::new(ErrorCode::StoreUnavailable).with_source(e))
}

/// The key came back with other arguments: the same action, reworded. `done`: whether its
/// first request has a receipt; `provider`: the provider refused this repeat (its 422), else the
/// fingerprint recorded here differed.
pub(super) fn key_reused(key: &IdempotencyKey, done: bool, provider: bool) -> ToolError {
    tracing::info!(key = %key, done, provider, "the key came back with other arguments; refused");
    counted(ErrorCode::IdempotencyKeyReused.as_str());
    let outcome = if done {
        "it completed and its receipt holds the result: ask for it with the arguments it was first sent with"
    } else {
        "its outcome is pending (not recorded yet): repeat it with the arguments it was first sent with, or wait for an operator to settle it"
    };
    let who = if provider {
        "; the provider refused this repeat"
    } else {
        ""
    };
    ToolError::new(ErrorCode::IdempotencyKeyReused)
        .with_class(FailureClass::Permanent)
        .with_retryable(false)
        .with_hint(format!(
            "this action was already requested under key {key} with other arguments{who}; {outcome}; do not reword a repeated action (a different action needs a step of its own)"
        ))
}

pub(super) const UNKNOWN_HINT: &str = "a crash or an ambiguous failure left this write's outcome unknown and it cannot be repeated safely; do not retry: once its request can no longer land (ReceiptStore::pending), check with the provider, then settle it (ReceiptStore::resolve)";
pub(super) const KEY_WINDOW_HINT: &str = "this keyed write's outcome is unknown and is older than the provider's idempotency-key window, so the key no longer protects a repeat; do not retry: once its request can no longer land (ReceiptStore::pending), check with the provider, then settle it (ReceiptStore::resolve)";
pub(super) const EXPIRED_HINT: &str = "this action's intent is older than the receipt retention and its outcome was never recorded; do not retry: check with the provider, then settle it (ReceiptStore::resolve)";
