//! What one attempt's result does to the retry loop: classified, then handed back as it is, or
//! (a failure) decided by [`decide`] and carried out, as a wait before a retry or an ending.

use super::decide::{decide, settle, under_key, GiveUp, Next, OperationView};
use super::ending::{give_up, hand_back, leave_to_outer_layer, LastFailure};
use super::part::LayerPart;
use super::Retrier;
use crate::budget::acceptance::{admits, DOWN};
use crate::budget::Refusal;
use crate::classify::{Classification, ClassifiedResponse, Classify, ServerHint, Verdict};
use crate::error::{BoxError, ErrorCode, FailureClass, ToolError};
use crate::telemetry;
use std::time::Duration;
use tokio::time::Instant;
use tower_service::Service;

/// What the state machine does after a result.
pub(super) enum Step<T> {
    Done(Result<T, ToolError>),
    Wait(Duration),
}

#[inline]
pub(super) fn on_result<S, C, R, Req>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
    has_request: bool,
    result: Result<S::Response, S::Error>,
) -> Step<S::Response>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
{
    let classification = match retrier.classifier.classify(&result) {
        ClassifiedResponse::Ready(c) => c,
        // The head has arrived: the response is committed and goes to the caller.
        ClassifiedResponse::RequiresEos(_) => Classification::success(),
    };
    let Verdict::Failure(failure) = classification.verdict() else {
        retrier.acceptance.answered();
        // Each budget once per operation: not if the layer above draws on the same one.
        if part.credits {
            retrier.budget.deposit();
        }
        return match result {
            Ok(response) => Step::Done(Ok(response)),
            Err(e) => Step::Done(Err(answered_err(retrier, part, e, &classification))),
        };
    };
    on_failure(retrier, part, has_request, result, classification, failure)
}

/// Whether a failure says the dependency is overloaded: it named when to come back (a `503` or
/// `529` with `Retry-After`, a gRPC pushback) on a failure that is not a rate limit. Such a
/// retry costs the balance two.
fn overloaded(classification: &Classification) -> bool {
    matches!(classification.hint(), ServerHint::RetryAfter(after) if !after.is_zero())
        && classification.code() != Some(ErrorCode::RateLimited)
}

/// Whether the server pushed back at all (any server-named delay, or a rate limit): the
/// dependency's acceptance never pays for the retry; the balance does.
fn pushed_back(classification: &Classification) -> bool {
    matches!(classification.hint(), ServerHint::RetryAfter(_))
        || classification.code() == Some(ErrorCode::RateLimited)
}

/// Whether the dependency's acceptance pays for a retry after an ordinary failure (see
/// [`budget::acceptance`](crate::budget::acceptance)): with probability `min(1, k·a)`.
fn paid_by_acceptance<S, C, R>(
    retrier: &Retrier<S, C, R>,
    acceptance: Option<(f64, f64, bool)>,
) -> bool {
    acceptance.is_some_and(|(k, share, _)| admits(share, k, retrier.acceptance.draw()))
}

/// An `Err` the classifier called a success or an empty answer, as a `ToolError`.
#[inline(never)]
fn answered_err<S, C, R, E: Into<BoxError>>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
    e: E,
    classification: &Classification,
) -> ToolError {
    let attempts = part.op(retrier, |op| op.sent_attempts());
    hand_back(e, classification, None, attempts)
}

/// A failed answer that is not retried, as the `ToolError` a declared tool ends with: the
/// dependency's own error where the classifier reads one (an HTTP status, a JSON answer's
/// `status`), else the classification's code.
#[cold]
fn failed_answer<S, C, R, Req>(
    retrier: &Retrier<S, C, R>,
    answer: &S::Response,
    classification: &Classification,
    failure: FailureClass,
    sent: u32,
) -> ToolError
where
    S: Service<Req>,
    C: Classify<S::Response, S::Error>,
{
    let code = classification.code().unwrap_or(ErrorCode::Internal);
    let err = ToolError::new(code).with_class(failure).with_attempts(sent);
    match retrier.classifier.dependency_error(answer) {
        Some(theirs) => {
            let hint = format!("{}; {}", code.default_hint(), theirs.hint());
            err.with_hint(hint).with_source(theirs)
        }
        None => err,
    }
}

/// The cold half of [`on_result`]: a failure, decided by [`decide`] and carried out. Kept out of
/// line so that the first-try path stays small.
#[inline(never)]
fn on_failure<S, C, R, Req>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
    has_request: bool,
    result: Result<S::Response, S::Error>,
    classification: Classification,
    failure: FailureClass,
) -> Step<S::Response>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
{
    let (own_class, layer_attempts) = (retrier.policy.class(), part.attempts);
    let now = Instant::now();
    let (view, sent) = part.op(retrier, |op| {
        let view = OperationView {
            class: op.class().strictest(own_class),
            keyed: op.keyed(),
            closed: op.closed().is_some(),
            attempts: op.attempts(),
            max_attempts: op.max_attempts(),
            layer_attempts,
            replayable: has_request,
            time_left: op.deadline().map(|d| d.saturating_duration_since(now)),
        };
        // What an error reports: the attempts that reached the dependency (one answered from
        // a stored receipt did not).
        (view, op.sent_attempts())
    });
    // A 409 or 422 under an idempotency key means what the class and the key make of it.
    let classification = under_key(view.class, view.keyed, classification);
    let failure = classification.failure_class().unwrap_or(failure);
    // The dependency's acceptance, after this result (`None`: the rule is off).
    let acceptance = retrier.budget.acceptance().map(|(k, window)| {
        if failure.is_dependency_failure() {
            let share = retrier.acceptance.failed(1.0 / f64::from(window));
            let down = share < DOWN && retrier.acceptance.known(window);
            (k, share, down)
        } else {
            retrier.acceptance.answered();
            (k, 1.0, false)
        }
    });
    let retrying = part.retrying();
    let next = decide(&view, &classification, &retrier.policy, || {
        retrying
            .backoff
            .get_or_insert_with(|| retrier.policy.backoff().state(retrier.budget.next_seed()))
            .next_delay()
    });
    let next = match next {
        // Not this layer's to retry: the owner above decides, also whether time or attempts are
        // left for it (a deadline or cap of this layer says nothing of the owner's). An escalation
        // stands: a write that may have landed is not the owner's to repeat.
        Next::Retry { .. }
        | Next::GiveUp(
            GiveUp::Deadline | GiveUp::MaxAttempts | GiveUp::Budget(_) | GiveUp::NotReplayable,
        ) if part.hands_up => Next::LeaveToOuterLayer,
        Next::Retry { delay, throttled } => settle(
            next,
            if throttled {
                retrier.budget.try_withdraw_throttled(delay)
            } else if overloaded(&classification) {
                retrier.budget.try_withdraw_overloaded(delay)
            } else if !pushed_back(&classification) && paid_by_acceptance(retrier, acceptance) {
                telemetry::retry_accepted(own_class);
                retrier.budget.try_withdraw_accepted(delay)
            } else if acceptance.is_some_and(|(_, _, down)| down) {
                // The dependency answers almost nothing: the balance others deposit is not spent
                // on it; the floor still lets a few retries find out whether it is back.
                retrier.budget.try_withdraw_floor(delay)
            } else {
                retrier.budget.try_withdraw(delay)
            },
        ),
        next => next,
    };
    let next = match next {
        // A joined layer's account is spent, the owner's may not be: the layer that owns the
        // retries decides with its own budget (a refusal by the owner's account stands, and so
        // does a run's limit: it caps the whole run).
        Next::GiveUp(GiveUp::Budget(Refusal::RetryBudget))
            if part.joined && !part.op(retrier, |op| op.owned_by(retrier.budget.id())) =>
        {
            tracing::debug!(
                layer = %retrier.name,
                "retry budget of a joined layer spent: the owner's budget decides"
            );
            Next::LeaveToOuterLayer
        }
        next => next,
    };
    let code = classification.code().unwrap_or(ErrorCode::Internal);
    match next {
        // `decide` answers a failure with one of the others; hand it back if it ever does not.
        Next::Success | Next::ReturnFailure => {
            if !view.closed {
                // Retrying cannot help, by this layer's class and classifier: the operation ends
                // here, and a layer above (whose classifier may not see what this one saw, as a
                // provider's error body) hands it back too.
                part.op(retrier, |op| op.close(code));
            }
            Step::Done(match result {
                Ok(answer) if retrier.answers_as_errors => Err(failed_answer(
                    retrier,
                    &answer,
                    &classification,
                    failure,
                    sent,
                )),
                result => result.map_err(|e| hand_back(e, &classification, Some(failure), sent)),
            })
        }
        Next::LeaveToOuterLayer => Step::Done(Err(leave_to_outer_layer(
            retrier,
            result,
            &classification,
            failure,
            sent,
        ))),
        Next::GiveUp(why) => {
            let ended = LastFailure {
                why,
                class: view.class,
                failure,
                classification: &classification,
            };
            Step::Done(Err(give_up(retrier, part, ended, result)))
        }
        Next::Retry { delay, .. } => {
            part.op(retrier, |op| op.grant_retry());
            part.retrying().last = Some((failure, code));
            telemetry::retry_granted(view.class, failure.as_str());
            tracing::debug!(
                layer = %retrier.name,
                attempt = view.attempts + 1,
                failure = failure.as_str(),
                code = code.as_str(),
                delay_ms = delay.as_millis() as u64,
                "retrying"
            );
            Step::Wait(delay)
        }
    }
}
