//! How a retrying layer's part of an operation ends: the errors it gives up with, hands up to
//! the layer above, or hands back, each keeping the evidence (attempts, class, the dependency's
//! own error as `cause`) and a hint that agrees with its `retryable` flag.

use super::decide::GiveUp;
use super::part::LayerPart;
use super::paused;
use super::Retrier;
use crate::budget::Refusal;
use crate::class::ToolClass;
use crate::classify::{Classification, Classify, ServerHint};
use crate::error::{hint, BoxError, ErrorCode, FailureClass, ToolError};
use crate::operation::ledger::OpState;
use crate::telemetry;
use tower_service::Service;

/// The failure an operation gives up on: why it gives up, the operation's class, and the last
/// attempt's failure class and classification (what the final error is built from).
pub(super) struct LastFailure<'a> {
    pub(super) why: GiveUp,
    pub(super) class: ToolClass,
    pub(super) failure: FailureClass,
    pub(super) classification: &'a Classification,
}

/// Ends the operation: records why, closes the ledger so no other layer retries it, and builds
/// the non-retryable error, keeping the dependency's own error as its source.
pub(super) fn give_up<S, C, R, Req>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
    ended: LastFailure<'_>,
    result: Result<S::Response, S::Error>,
) -> ToolError
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
{
    let LastFailure {
        why,
        class,
        failure,
        classification,
    } = ended;
    let last = classification.code().unwrap_or(ErrorCode::Internal);
    let code = why.code(last);
    let (mut attempts, seen) = part.op(retrier, |op| {
        op.close(code);
        (op.sent_attempts(), op.seen())
    });
    match why {
        GiveUp::Escalate(code) => telemetry::escalated(class, code.as_str()),
        why => telemetry::retry_refused(class, why.reason()),
    }
    tracing::info!(
        layer = %retrier.name,
        code = code.as_str(),
        attempts,
        reason = why.reason(),
        "giving up"
    );
    let source = match result {
        Err(e) => match e.into().downcast::<ToolError>() {
            // An error from below that asked not to be retried (an open circuit, an operation a
            // layer across a task boundary ended) is the answer itself.
            Ok(tool) if why == GiveUp::ServerPushback => {
                return if tool.attempts() >= attempts {
                    *tool
                } else {
                    tool.with_attempts(attempts)
                };
            }
            Ok(tool) => {
                // Attempts made below (across a boundary the operation did not cross) count.
                attempts = attempts.max(tool.attempts());
                if tool.is_handed_up() {
                    // A nested layer's wrapper: the dependency's own error is what it wraps.
                    tool.into_source()
                } else {
                    Some(tool as BoxError)
                }
            }
            Err(other) if why == GiveUp::ServerPushback => {
                // The same, wrapped by a client on the way up (a tonic `Status` whose source is
                // the breaker's rejection): its code, flag, hint and delay are the answer; the
                // wrapper stays its source.
                if let Some(tool) = tool_error_in(&*other) {
                    let mut answer = ToolError::new(tool.code())
                        .with_retryable(tool.retryable())
                        .with_hint(tool.hint().to_string())
                        .with_attempts(attempts.max(tool.attempts()));
                    if let Some(class) = tool.class() {
                        answer = answer.with_class(class);
                    }
                    if let Some(after) = tool.retry_after() {
                        answer = answer.with_retry_after(after);
                    }
                    return answer.with_source(other);
                }
                Some(other)
            }
            Err(other) => Some(other),
        },
        Ok(response) => retrier
            .classifier
            .dependency_error(&response)
            .map(|e| Box::new(e) as BoxError),
    };
    let retry_after = match classification.hint() {
        ServerHint::RetryAfter(after) => Some(after),
        // "Do not retry" with a delay beside it (`x-should-retry: false` and `Retry-After`): the
        // delay still tells the model when to come back.
        _ => source
            .as_deref()
            .and_then(|e| e.downcast_ref::<ToolError>())
            .and_then(ToolError::retry_after),
    };
    // Only a write can have taken effect; a read's ambiguous failure changed nothing.
    let may_have_acted = failure == FailureClass::Ambiguous && class != ToolClass::Read;
    let hint: std::borrow::Cow<'static, str> = match why {
        GiveUp::MaxAttempts => hint::attempts_spent(attempts, code, may_have_acted).into(),
        GiveUp::ServerPushback => hint::pushed_back(code, may_have_acted).into(),
        GiveUp::NotReplayable => hint::not_replayable(code, may_have_acted).into(),
        // Not an outage: the dependency is up and throttling this client.
        GiveUp::Budget(Refusal::RetryBudget) if last == ErrorCode::RateLimited => {
            hint::throttled_budget(retry_after).into()
        }
        // Whose budget is spent: the dependency that drained it, named.
        GiveUp::Budget(Refusal::RetryBudget) => match retrier.budget.name() {
            Some(name) => hint::budget_spent(name).into(),
            None => hint::of(code),
        },
        _ => hint::of(code),
    };
    // The class came from what the request showed, not from the declaration: say so.
    let hint = match (why, seen) {
        (GiveUp::Escalate(_), Some(seen)) => hint::from_evidence(&hint, seen).into(),
        _ => hint,
    };
    let mut err = ToolError::new(code)
        .with_class(failure)
        .with_attempts(attempts)
        .with_retryable(false)
        .with_hint(hint);
    if let Some(after) = retry_after {
        err = err.with_retry_after(after);
    }
    match source {
        Some(source) => err.with_source(source),
        None => err,
    }
}

/// The deadline passed while a granted retry waited for its service to be ready.
pub(super) fn deadline_passed<S, C, R>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
) -> ToolError {
    let code = ErrorCode::DeadlineExceeded;
    let attempts = part.op(retrier, |op| {
        op.close(code);
        op.sent_attempts()
    });
    telemetry::retry_refused(retrier.policy.class(), GiveUp::Deadline.reason());
    tracing::info!(layer = %retrier.name, code = code.as_str(), attempts, reason = "deadline", "giving up");
    let mut err = ToolError::new(code)
        .with_attempts(attempts)
        .with_retryable(false);
    if let Some(note) = paused::note(&retrier.name) {
        err = err.with_hint(format!("{}{note}", code.default_hint()));
    }
    if let Some((failure, _)) = part.last() {
        err = err.with_class(failure);
    }
    err
}

/// The operation's deadline passed while an attempt was in flight: the attempt was dropped
/// (cut off), so whether it took effect is not known. A call that may be sent again ends as
/// `deadline_exceeded`; a write that may not (an unkeyed write, a keyed one without its key)
/// ends as its escalation, `outcome_unknown` or `missing_idempotency_key`, as a timeout would.
#[cold]
pub(super) fn cut_off<S, C, R>(retrier: &Retrier<S, C, R>, part: &mut LayerPart) -> ToolError {
    let (class, keyed, attempts, seen) = part.op(retrier, |op| {
        (op.class(), op.keyed(), op.sent_attempts(), op.seen())
    });
    let code = cut_off_code(class, keyed);
    part.op(retrier, |op| op.close(code));
    match code {
        ErrorCode::DeadlineExceeded => telemetry::retry_refused(class, GiveUp::Deadline.reason()),
        code => telemetry::escalated(class, code.as_str()),
    }
    tracing::warn!(
        layer = %retrier.name,
        code = code.as_str(),
        attempts,
        reason = "deadline",
        "the operation's deadline passed with an attempt in flight: cut off"
    );
    let may_have_acted = class != ToolClass::Read;
    let mut hint: std::borrow::Cow<'static, str> = hint::cut_off(code, may_have_acted).into();
    if let (ErrorCode::OutcomeUnknown | ErrorCode::MissingIdempotencyKey, Some(seen)) = (code, seen)
    {
        hint = hint::from_evidence(&hint, seen).into();
    }
    if let Some(note) = paused::note(&retrier.name) {
        hint = format!("{hint}{note}").into();
    }
    ToolError::new(code)
        .with_class(FailureClass::Ambiguous)
        .with_attempts(attempts)
        .with_retryable(false)
        .with_hint(hint)
}

/// The code an attempt cut off by the deadline ends with: what the class decides for an
/// ambiguous failure (a cut-off attempt may have been applied), where that is an escalation;
/// else `deadline_exceeded`.
///
/// A pure function of the class and the key, unit-tested below.
pub(super) fn cut_off_code(class: ToolClass, keyed: bool) -> ErrorCode {
    match class.decide(FailureClass::Ambiguous, keyed) {
        crate::class::Decision::Escalate(code) => code,
        _ => ErrorCode::DeadlineExceeded,
    }
}

/// The deadline passed before this layer's first attempt could be sent (it waited for its
/// service to be ready, or behind a boundary): nothing was sent by it. Ends the operation `op`.
#[cold]
pub(super) fn not_sent<S, C, R>(retrier: &Retrier<S, C, R>, op: &mut OpState) -> ToolError {
    let code = ErrorCode::DeadlineExceeded;
    op.close(code);
    // The ledger counts the attempt that was not sent (the first, or a retry granted above).
    let attempts = op.attempts().saturating_sub(1);
    telemetry::retry_refused(retrier.policy.class(), GiveUp::Deadline.reason());
    tracing::info!(layer = %retrier.name, code = code.as_str(), attempts, reason = "deadline", "not sent");
    let hint = match paused::note(&retrier.name) {
        Some(note) => format!("{}{note}", hint::deadline_before_sending()).into(),
        None => std::borrow::Cow::Borrowed(hint::deadline_before_sending()),
    };
    ToolError::new(code)
        .with_attempts(attempts)
        .with_retryable(false)
        .with_hint(hint)
}

/// A nested layer's own attempts are spent and the operation's are not: the failure goes to the
/// layer above as a retryable `ToolError` that keeps its class, code and server delay. An `Ok`
/// response classified as a failure becomes one too (with what the dependency answered as its
/// cause), so that a layer above with another classifier still sees a failure.
pub(super) fn leave_to_outer_layer<S, C, R, Req>(
    retrier: &Retrier<S, C, R>,
    result: Result<S::Response, S::Error>,
    classification: &Classification,
    failure: FailureClass,
    attempts: u32,
) -> ToolError
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
{
    let code = classification.code().unwrap_or(ErrorCode::Internal);
    let source = match result {
        Err(e) => match e.into().downcast::<ToolError>() {
            Ok(tool) => return tool.with_attempts(attempts),
            Err(other) => Some(other),
        },
        Ok(response) => retrier
            .classifier
            .dependency_error(&response)
            .map(|e| Box::new(e) as BoxError),
    };
    let mut err = ToolError::new(code)
        .with_class(failure)
        .with_attempts(attempts)
        .with_retryable(true)
        .handed_up();
    if let ServerHint::RetryAfter(after) = classification.hint() {
        err = err.with_retry_after(after);
    }
    match source {
        Some(source) => err.with_source(source),
        None => err,
    }
}

/// An error handed back without a retry: a `ToolError` from below keeps its code and flag (its
/// attempt count is brought up to date); anything else becomes a non-retryable `ToolError` with
/// the classification's code.
pub(super) fn hand_back<E: Into<BoxError>>(
    e: E,
    classification: &Classification,
    failure: Option<FailureClass>,
    attempts: u32,
) -> ToolError {
    let code = classification.code().unwrap_or(ErrorCode::Internal);
    match e.into().downcast::<ToolError>() {
        Ok(tool) if tool.attempts() >= attempts => *tool,
        Ok(tool) => tool.with_attempts(attempts),
        Err(other) => {
            let mut err = ToolError::new(code)
                .with_attempts(attempts)
                .with_retryable(false)
                .with_source(other);
            if let Some(failure) = failure {
                err = err.with_class(failure);
            }
            err
        }
    }
}

/// The first `ToolError` in an error's source chain.
fn tool_error_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a ToolError> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(tool) = e.downcast_ref::<ToolError>() {
            return Some(tool);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::cut_off_code;
    use crate::class::ToolClass;
    use crate::error::ErrorCode;

    #[test]
    fn a_cut_off_write_that_may_not_repeat_is_an_unknown_outcome() {
        let code = |class, keyed| cut_off_code(class, keyed);
        assert_eq!(code(ToolClass::Read, false), ErrorCode::DeadlineExceeded);
        assert_eq!(
            code(ToolClass::IdempotentWrite, false),
            ErrorCode::DeadlineExceeded
        );
        assert_eq!(
            code(ToolClass::KeyedWrite, true),
            ErrorCode::DeadlineExceeded
        );
        assert_eq!(
            code(ToolClass::KeyedWrite, false),
            ErrorCode::MissingIdempotencyKey
        );
        assert_eq!(
            code(ToolClass::UnkeyedWrite, true),
            ErrorCode::OutcomeUnknown
        );
        assert_eq!(code(ToolClass::MultiStep, false), ErrorCode::OutcomeUnknown);
    }
}
