//! The retry decision as one pure function of plain inputs: [`decide`], then [`settle`] with
//! the budget's answer. The future in `future.rs` only gathers the inputs and carries out the
//! [`Next`] step; nothing here reads a clock, an atomic or a thread-local.
//!
//! The order of the checks is the contract (each is a row of the table in the module docs):
//!
//! 1. a success or an empty answer is handed back (and deposited);
//! 2. an operation a layer below has ended is handed back untouched;
//! 3. the class × failure table: an ambiguous failure of a write that may not repeat ends as
//!    `outcome_unknown` / `missing_idempotency_key` *whatever else came with it* (a server hint,
//!    a non-retryable error); a failure retrying cannot help is handed back (and the future
//!    closes the operation: a layer above hands it back by rule 2);
//! 4. the server (or a layer below) asked not to retry;
//! 5. the request cannot be copied;
//! 6. the operation's attempts are spent (the cap of the layer that opened it);
//! 7. this layer's own attempts are spent: a nested layer hands the failure up, still
//!    retryable, to the layer above, which decides with the operation's cap;
//! 8. the delay (the server's, clamped, or the backoff) would end past the deadline;
//! 9. the budget refuses ([`settle`]); a joined layer on a budget other than the owner's then
//!    hands the failure up (`outcome.rs`), for the owner's budget to decide.

use super::policy::ClassPolicy;
use crate::budget::Refusal;
use crate::class::{Decision, ToolClass};
use crate::classify::{Classification, FailureClass, KeyConflict, ServerHint, Verdict};
use crate::error::ErrorCode;
use std::time::Duration;

/// What the operation looks like from the deciding layer when a result arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OperationView {
    /// The strictest class of the operation and of this layer.
    pub(crate) class: ToolClass,
    /// Whether the operation's request carries an idempotency key.
    pub(crate) keyed: bool,
    /// Whether a layer has ended the operation.
    pub(crate) closed: bool,
    /// Attempts made by every layer, the one that just ended included.
    pub(crate) attempts: u32,
    /// The operation's cap on attempts (set by the layer that opened it).
    pub(crate) max_attempts: u32,
    /// Attempts this layer has made in a row for this call.
    pub(crate) layer_attempts: u32,
    /// Whether this layer holds a copy of the request to send again.
    pub(crate) replayable: bool,
    /// Time left before the operation's deadline (`None`: no deadline).
    pub(crate) time_left: Option<Duration>,
}

/// Why a layer ended an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveUp {
    /// An ambiguous failure of a write that may not be repeated: escalate with this code.
    Escalate(ErrorCode),
    /// The server, or a layer below, asked not to retry.
    ServerPushback,
    /// No copy of the request to send again.
    NotReplayable,
    /// The operation's attempts are spent.
    MaxAttempts,
    /// The next attempt would start after the deadline.
    Deadline,
    /// The budget refused the retry.
    Budget(Refusal),
}

impl GiveUp {
    /// The `reason` label of `stormguard_retry_refusals_total` (escalations are counted apart).
    pub(crate) const fn reason(self) -> &'static str {
        match self {
            GiveUp::Escalate(_) => "escalate",
            GiveUp::ServerPushback => "server_pushback",
            GiveUp::NotReplayable => "not_replayable",
            GiveUp::MaxAttempts => "max_attempts",
            GiveUp::Deadline => "deadline",
            GiveUp::Budget(Refusal::RunBudget) => "run_budget",
            GiveUp::Budget(_) => "retry_budget",
        }
    }

    /// The code of the error the operation ends with, given the last failure's code.
    pub(crate) const fn code(self, last: ErrorCode) -> ErrorCode {
        match self {
            GiveUp::Escalate(code) => code,
            GiveUp::Deadline => ErrorCode::DeadlineExceeded,
            GiveUp::Budget(refusal) => refusal.code(),
            GiveUp::ServerPushback | GiveUp::NotReplayable | GiveUp::MaxAttempts => last,
        }
    }
}

/// What the future does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// A success or an empty answer: hand it back; the operation is credited to the budget.
    Success,
    /// A failure to hand back as it is: retrying cannot help, or a layer below ended the
    /// operation.
    ReturnFailure,
    /// This nested layer's own attempts are spent, the operation's are not: hand the failure to
    /// the layer above, still retryable.
    LeaveToOuterLayer,
    /// End the operation: no layer retries it again.
    GiveUp(GiveUp),
    /// Retry after `delay`; `throttled` when the server scheduled it after throttling the call
    /// (it costs the ratio budget less, see `RetryBudget::try_withdraw_throttled`).
    Retry { delay: Duration, throttled: bool },
}

/// The classification as the operation's class and key make it: what a [`KeyConflict`] means
/// (the classifier cannot know the class, nor whether the request carried a key; this can).
///
/// | key conflict | `KeyedWrite` carrying its key | any class carrying a key | otherwise |
/// |---|---|---|---|
/// | `InProgress` (409: a request with the key is still being processed) | `Transient` `in_progress` | as classified | as classified |
/// | `Reused` (422: the key came back with another payload) | `Permanent` `idempotency_key_reused` | `Permanent` `idempotency_key_reused` | as classified |
///
/// A 409 under the key is the same action, not done yet: retried with backoff, bounded by the
/// attempts, and if they run out the error says `in_progress` (ask for its result later, do not
/// start it again), not `conflict`. A 422 is a reworded repeat of an action the provider already has: no retry helps,
/// and `invalid_argument` would tell a model to reword it once more.
pub(crate) fn under_key(class: ToolClass, keyed: bool, c: Classification) -> Classification {
    let Verdict::Failure(_) = c.verdict() else {
        return c;
    };
    let (failure, code) = match c.key_conflict() {
        Some(KeyConflict::InProgress) if keyed && class == ToolClass::KeyedWrite => {
            (FailureClass::Transient, ErrorCode::InProgress)
        }
        Some(KeyConflict::Reused) if keyed => {
            (FailureClass::Permanent, ErrorCode::IdempotencyKeyReused)
        }
        _ => return c,
    };
    let mut mapped = Classification::failure(failure, code).with_hint(c.hint());
    if let Some(conflict) = c.key_conflict() {
        mapped = mapped.with_key_conflict(conflict);
    }
    mapped
}

/// The retry decision for one result, before the budget is asked. `backoff` gives the class's
/// next backoff delay; it is called only when a retry is still possible and the server named
/// no delay.
pub(crate) fn decide(
    view: &OperationView,
    classification: &Classification,
    policy: &ClassPolicy,
    backoff: impl FnOnce() -> Duration,
) -> Next {
    let failure = match classification.verdict() {
        Verdict::Success | Verdict::Empty => return Next::Success,
        Verdict::Failure(failure) => failure,
    };
    if view.closed {
        return Next::ReturnFailure;
    }
    match view.class.decide(failure, view.keyed) {
        Decision::Retry => {}
        Decision::Return => return Next::ReturnFailure,
        Decision::Escalate(code) => return Next::GiveUp(GiveUp::Escalate(code)),
    }
    let hint = classification.hint();
    if hint == ServerHint::DoNotRetry {
        return Next::GiveUp(GiveUp::ServerPushback);
    }
    if !view.replayable {
        return Next::GiveUp(GiveUp::NotReplayable);
    }
    if view.attempts >= view.max_attempts {
        return Next::GiveUp(GiveUp::MaxAttempts);
    }
    if view.layer_attempts >= policy.max_attempts() {
        return Next::LeaveToOuterLayer;
    }
    let (delay, throttled) = match hint {
        ServerHint::RetryAfter(after) => {
            // Only a retry that waits what the server asked, in full and not zero, is throttled.
            let full = !after.is_zero() && after <= policy.max_server_delay();
            // A wait longer than the layer allows is cut to its limit, but never below the
            // class's own backoff: a limit of zero means "do not wait for the server", not
            // "retry at once".
            let delay = if full || after.is_zero() {
                after
            } else {
                policy.max_server_delay().max(backoff())
            };
            (
                delay,
                full && classification.code() == Some(ErrorCode::RateLimited),
            )
        }
        _ => (backoff(), false),
    };
    if matches!(view.time_left, Some(left) if delay >= left) {
        return Next::GiveUp(GiveUp::Deadline);
    }
    Next::Retry { delay, throttled }
}

/// The decision once the budget has answered a [`Next::Retry`]'s withdrawal.
pub(crate) fn settle(next: Next, withdrawal: Result<(), Refusal>) -> Next {
    match (next, withdrawal) {
        (Next::Retry { .. }, Err(refusal)) => Next::GiveUp(GiveUp::Budget(refusal)),
        (next, _) => next,
    }
}

#[cfg(test)]
mod tests;
