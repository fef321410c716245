//! [`ResponseFuture`]: the retry loop of one request, as a state machine.

use super::{into_tool_error, Kit, Replay};
use crate::backoff::BackoffState;
use crate::budget::Refusal;
use crate::class::{Decision, ToolClass};
use crate::classify::{
    Classification, ClassifiedResponse, Classify, FailureClass, ServerHint, Verdict,
};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::operation::ledger::{in_scope, with_current_or, Ledger, OpState};
use crate::telemetry;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

pin_project! {
    /// The future [`Retry`](super::Retry) returns.
    ///
    /// A first-try success allocates nothing: the backoff state, the sleep and the clone of the
    /// inner service are made only when a retry is granted.
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::{budget::RetryBudget, class::ToolClass};
    /// use stormguard::retry::{ResponseFuture, RetryLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let double = service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n * 2) });
    /// let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(double);
    /// let future: ResponseFuture<_, _, _, u32> = svc.ready().await.unwrap().call(21);
    /// assert_eq!(future.await.unwrap(), 42);
    /// # }
    /// ```
    pub struct ResponseFuture<S, C, R, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        kit: Arc<Kit<S, C, R>>,
        request: Option<Req>,
        service: Option<S>,
        track: Track,
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        Waiting { sleep: Pin<Box<Sleep>> },
        Ready,
    }
}

/// This layer's part of the operation.
struct Track {
    /// The ledger this future owns (the outermost layer), or one it had to open after losing the
    /// operation it joined; `None` while it reads the one installed on the thread.
    ledger: Option<Ledger>,
    /// Whether this layer opened the operation (it deposits on success).
    owner: bool,
    /// Attempts this layer has made.
    attempts: u32,
    /// Boxed: made only when a retry is granted, and kept out of the future's size.
    backoff: Option<Box<BackoffState>>,
}

enum Next<T> {
    Done(Result<T, ToolError>),
    Wait(Duration),
}

impl<S, C, R, Req> ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    pub(super) fn owner(
        future: S::Future,
        kit: Arc<Kit<S, C, R>>,
        request: Option<Req>,
        ledger: Option<Ledger>,
        span: Span,
    ) -> Self {
        Self::new(future, kit, request, ledger, true, span)
    }

    pub(super) fn nested(future: S::Future, kit: Arc<Kit<S, C, R>>, request: Option<Req>) -> Self {
        Self::new(future, kit, request, None, false, Span::none())
    }

    fn new(
        future: S::Future,
        kit: Arc<Kit<S, C, R>>,
        request: Option<Req>,
        ledger: Option<Ledger>,
        owner: bool,
        span: Span,
    ) -> Self {
        ResponseFuture {
            state: State::Called { future },
            kit,
            request,
            service: None,
            track: Track {
                ledger,
                owner,
                attempts: 1,
                backoff: None,
            },
            span,
        }
    }
}

impl<S, C, R, Req> Future for ResponseFuture<S, C, R, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
    R: Replay<Req>,
{
    type Output = Result<S::Response, ToolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let result = ready!(in_scope(&mut this.track.ledger, || future.poll(cx)));
                    let has_request = this.request.is_some();
                    match on_result(this.kit, this.track, has_request, result) {
                        Next::Done(output) => return Poll::Ready(output),
                        Next::Wait(delay) if delay.is_zero() => this.state.set(State::Ready),
                        Next::Wait(delay) => this.state.set(State::Waiting {
                            sleep: Box::pin(tokio::time::sleep(delay)),
                        }),
                    }
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.as_mut().poll(cx));
                    this.state.set(State::Ready);
                }
                StateProj::Ready => {
                    let kit = &**this.kit;
                    let service = this.service.get_or_insert_with(|| kit.service());
                    let ready = in_scope(&mut this.track.ledger, || service.poll_ready(cx));
                    if let Err(e) = ready!(ready) {
                        let attempts = this.track.op(kit, |op| {
                            op.closed = Some(ErrorCode::Unavailable);
                            op.attempts()
                        });
                        let err = into_tool_error(e, ErrorCode::Unavailable)
                            .with_retryable(false)
                            .with_attempts(attempts);
                        return Poll::Ready(Err(err));
                    }
                    let Some(request) = this.request.take() else {
                        // A retry is only granted with a copy of the request in hand.
                        return Poll::Ready(Err(ToolError::new(ErrorCode::Internal)));
                    };
                    *this.request = kit.replay.replay(&request);
                    let future = in_scope(&mut this.track.ledger, || service.call(request));
                    this.track.attempts += 1;
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}

impl Track {
    /// Runs `f` on the operation: the ledger this future holds, else the one installed on the
    /// thread, else (the operation was lost across a task boundary) a new one of its own.
    fn op<S, C, R, T>(&mut self, kit: &Kit<S, C, R>, f: impl FnOnce(&mut OpState) -> T) -> T {
        let attempts = self.attempts;
        with_current_or(
            &mut self.ledger,
            || {
                let policy = &kit.policy;
                let mut state = OpState::new(policy.max_attempts(), policy.class(), false, None);
                state.retries = attempts.saturating_sub(1);
                state
            },
            f,
        )
    }
}

/// What the operation looks like from this layer when a failure arrives.
struct View {
    class: ToolClass,
    keyed: bool,
    closed: bool,
    attempts: u32,
    max_attempts: u32,
    deadline: Option<Instant>,
}

fn on_result<S, C, R, Req>(
    kit: &Kit<S, C, R>,
    track: &mut Track,
    has_request: bool,
    result: Result<S::Response, S::Error>,
) -> Next<S::Response>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
{
    let classification = match kit.classifier.classify(&result) {
        ClassifiedResponse::Ready(c) => c,
        // The head has arrived: the response is committed and goes to the caller.
        ClassifiedResponse::RequiresEos(_) => Classification::success(),
    };
    let failure = match classification.verdict() {
        Verdict::Success | Verdict::Empty => {
            if track.owner {
                kit.budget.deposit();
            }
            return Next::Done(result.map_err(|e| {
                let attempts = track.op(kit, |op| op.attempts());
                hand_back(e, &classification, None, attempts)
            }));
        }
        Verdict::Failure(failure) => failure,
    };

    let own_class = kit.policy.class();
    let view = track.op(kit, |op| View {
        class: op.class.strictest(own_class),
        keyed: op.keyed,
        closed: op.closed.is_some(),
        attempts: op.attempts(),
        max_attempts: op.max_attempts,
        deadline: op.deadline,
    });
    let code = classification.code().unwrap_or(ErrorCode::Internal);
    let give_up = |track: &mut Track, code: ErrorCode, reason: &'static str, result| {
        Next::Done(Err(give_up(
            kit,
            track,
            view.class,
            &classification,
            failure,
            code,
            reason,
            result,
        )))
    };

    if view.closed {
        // A layer below gave up on this operation: hand its answer back untouched.
        return Next::Done(result_back(result, &classification, failure, view.attempts));
    }
    if classification.hint() == ServerHint::DoNotRetry {
        return match result {
            Err(e) => Next::Done(Err(hand_back(
                e,
                &classification,
                Some(failure),
                view.attempts,
            ))),
            ok => give_up(track, code, "server_pushback", ok),
        };
    }
    match view.class.decide(failure, view.keyed) {
        Decision::Retry => {}
        Decision::Return => {
            return Next::Done(result_back(result, &classification, failure, view.attempts))
        }
        Decision::Escalate(code) => {
            telemetry::escalated(view.class, code.as_str());
            return give_up(track, code, "escalate", result);
        }
    }
    if !has_request {
        return give_up(track, code, "not_replayable", result);
    }
    if view.attempts >= view.max_attempts || track.attempts >= kit.policy.max_attempts() {
        return give_up(track, code, "max_attempts", result);
    }
    let delay = match classification.hint() {
        ServerHint::RetryAfter(after) => after.min(kit.policy.max_server_delay()),
        _ => track
            .backoff
            .get_or_insert_with(|| Box::new(kit.policy.backoff().state(kit.budget.next_seed())))
            .next_delay(),
    };
    if let Some(deadline) = view.deadline {
        if Instant::now() + delay > deadline {
            return give_up(track, ErrorCode::DeadlineExceeded, "deadline", result);
        }
    }
    // A throttled call the server scheduled costs the ratio budget less (see
    // `RetryBudget::try_withdraw_throttled`): the dependency is up and said when to come back.
    // Only when the retry waits what the server asked: not a zero delay, not one clamped short.
    let throttled = code == ErrorCode::RateLimited
        && matches!(classification.hint(),
            ServerHint::RetryAfter(after) if !after.is_zero() && after <= kit.policy.max_server_delay());
    let withdrawn = if throttled {
        kit.budget.try_withdraw_throttled(delay)
    } else {
        kit.budget.try_withdraw(delay)
    };
    if let Err(refusal) = withdrawn {
        let reason = match refusal {
            Refusal::RunBudget => "run_budget",
            _ => "retry_budget",
        };
        return give_up(track, refusal.code(), reason, result);
    }
    track.op(kit, |op| op.retries += 1);
    telemetry::retry_granted(view.class, failure.as_str());
    tracing::debug!(
        layer = %kit.name,
        attempt = view.attempts + 1,
        failure = failure.as_str(),
        code = code.as_str(),
        delay_ms = delay.as_millis() as u64,
        "retrying"
    );
    Next::Wait(delay)
}

/// Ends the operation: records why, closes the ledger so no other layer retries it, and builds
/// the non-retryable error.
#[allow(clippy::too_many_arguments)]
fn give_up<S, C, R, Res, E: Into<BoxError>>(
    kit: &Kit<S, C, R>,
    track: &mut Track,
    class: ToolClass,
    classification: &Classification,
    failure: FailureClass,
    code: ErrorCode,
    reason: &'static str,
    result: Result<Res, E>,
) -> ToolError {
    let attempts = track.op(kit, |op| {
        op.closed = Some(code);
        op.attempts()
    });
    if reason != "escalate" {
        telemetry::retry_refused(class, reason);
    }
    tracing::info!(
        layer = %kit.name,
        code = code.as_str(),
        attempts,
        reason,
        "giving up"
    );
    let mut err = ToolError::new(code)
        .with_class(failure)
        .with_attempts(attempts)
        .with_retryable(false);
    if reason == "max_attempts" {
        err = err.with_hint(format!(
            "the call failed {attempts} times ({code}); the retries of this operation are spent, do not repeat it now: {}",
            if failure == FailureClass::Ambiguous {
                "the last attempt may have taken effect, check before acting again"
            } else {
                "report the failure or try again later"
            }
        ));
    }
    let last = classification.code();
    if reason == "retry_budget" && last == Some(ErrorCode::RateLimited) {
        // Not an outage: the dependency is up and throttling this client.
        let wait = match classification.hint() {
            ServerHint::RetryAfter(after) => {
                format!(
                    "wait {} s, then ",
                    after.as_secs_f64().ceil().max(1.0) as u64
                )
            }
            _ => String::new(),
        };
        err = err.with_hint(format!(
            "the dependency is rate limiting these calls and the retry budget is spent; {wait}\
             send fewer calls at a time"
        ));
    }
    if let ServerHint::RetryAfter(after) = classification.hint() {
        err = err.with_retry_after(after);
    }
    match result {
        Err(e) => err.with_source(e),
        Ok(_) => err,
    }
}

/// Hands a result back without retrying: `Ok` unchanged, `Err` as a `ToolError`.
fn result_back<Res, E: Into<BoxError>>(
    result: Result<Res, E>,
    classification: &Classification,
    failure: FailureClass,
    attempts: u32,
) -> Result<Res, ToolError> {
    result.map_err(|e| hand_back(e, classification, Some(failure), attempts))
}

/// An error handed back without a retry: a `ToolError` from below keeps its code and flag (its
/// attempt count is brought up to date); anything else
/// becomes a non-retryable `ToolError` with the classification's code.
fn hand_back<E: Into<BoxError>>(
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

impl<S, C, R, Req> fmt::Debug for ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("name", &self.kit.name)
            .field("attempts", &self.track.attempts)
            .field("owner", &self.track.owner)
            .finish()
    }
}
