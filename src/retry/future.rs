//! [`ResponseFuture`]: the retry loop of one request, as a state machine that gathers the inputs
//! of the retry decision (a pure function) and carries out what it returns.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass};
//! use stormguard::retry::{future::ResponseFuture, RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // The first attempt is refused (a transient failure), the retry answers.
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let flaky = service_fn(move |n: u32| {
//!     let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
//!     async move {
//!         if first { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) } else { Ok(n) }
//!     }
//! });
//! let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(flaky);
//! let future: ResponseFuture<_, _, _, u32> = svc.ready().await.unwrap().call(7);
//! assert_eq!(future.await.unwrap(), 7);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```

use super::ending::{self, deadline_passed};
use super::outcome::{on_result, Step};
use super::part::LayerPart;
use super::{into_tool_error, Replay, Retrier};
use crate::budget::scope::in_run;
use crate::budget::RetryBudget;
use crate::classify::Classify;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::operation::ledger::{in_scope, Ledger};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;
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
    /// use stormguard::retry::{future::ResponseFuture, RetryLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let double = service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n * 2) });
    /// let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(double);
    /// let future: ResponseFuture<_, _, _, u32> = svc.ready().await.unwrap().call(21);
    /// assert_eq!(future.await.unwrap(), 42);
    /// # }
    /// ```
    #[project = Projection]
    pub struct ResponseFuture<S, C, R, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        retrier: Arc<Retrier<S, C, R>>,
        request: Option<Req>,
        service: Option<S>,
        part: LayerPart,
        // Only while a subscriber wants it (`None` costs one word to move).
        span: Option<Span>,
        // The agent run of an operation that reached this layer in its request (across a
        // `Buffer` or a spawned task): lent to the thread while this future is polled, so the
        // budgets below act for that run.
        run: Option<RetryBudget>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        /// Backing off before a retry.
        Backoff,
        /// Waiting for the inner service to be ready for the retry, within the deadline.
        Ready,
        /// The deadline passed before the first attempt could be sent: nothing was.
        Expired { error: Option<ToolError> },
    }
}

impl<S, C, R, Req> ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    pub(super) fn owner(
        future: S::Future,
        retrier: Arc<Retrier<S, C, R>>,
        request: Option<Req>,
        ledger: Option<Ledger>,
        span: Option<Span>,
    ) -> Self {
        Self::new(future, retrier, request, ledger, true, span)
    }

    /// A nested layer that joined the operation its request carried: it holds the ledger and
    /// lends it to the layers below it on this task.
    pub(super) fn carried(
        future: S::Future,
        retrier: Arc<Retrier<S, C, R>>,
        request: Option<Req>,
        ledger: Option<Ledger>,
        credits: bool,
        run: Option<RetryBudget>,
    ) -> Self {
        let mut future = Self::new(future, retrier, request, ledger, credits, None);
        future.run = run;
        future.part.joined = true;
        future
    }

    pub(super) fn nested(
        future: S::Future,
        retrier: Arc<Retrier<S, C, R>>,
        request: Option<Req>,
        credits: bool,
    ) -> Self {
        let mut future = Self::new(future, retrier, request, None, credits, None);
        future.part.joined = true;
        future
    }

    /// Marks the future of a layer that owns no retries (see `LayerPart::hands_up`).
    pub(super) fn hands_up(mut self, hands_up: bool) -> Self {
        self.part.hands_up = hands_up;
        self
    }

    /// The operation's deadline passed before this layer's first attempt was sent (it waited
    /// for readiness): the future ends with `deadline_exceeded` and sends nothing.
    pub(super) fn expired(retrier: Arc<Retrier<S, C, R>>, error: ToolError) -> Self {
        ResponseFuture {
            state: State::Expired { error: Some(error) },
            retrier,
            request: None,
            service: None,
            part: LayerPart {
                ledger: None,
                attempts: 0,
                credits: false,
                retry: None,
                hands_up: false,
                joined: false,
            },
            span: None,
            run: None,
        }
    }

    fn new(
        future: S::Future,
        retrier: Arc<Retrier<S, C, R>>,
        request: Option<Req>,
        ledger: Option<Ledger>,
        credits: bool,
        span: Option<Span>,
    ) -> Self {
        ResponseFuture {
            state: State::Called { future },
            retrier,
            request,
            service: None,
            part: LayerPart {
                ledger,
                attempts: 1,
                credits,
                retry: None,
                hands_up: false,
                joined: false,
            },
            span,
            run: None,
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
        let mut run = this.run.take();
        let out = in_run(&mut run, || drive(&mut this, cx));
        *this.run = run;
        out
    }
}

/// One poll of the retry loop.
fn drive<S, C, R, Req>(
    this: &mut Projection<'_, S, C, R, Req>,
    cx: &mut Context<'_>,
) -> Poll<Result<S::Response, ToolError>>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
    R: Replay<Req>,
{
    let _entered = this.span.as_ref().map(Span::enter);
    {
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let polled = in_scope(&mut this.part.ledger, || future.poll(cx));
                    let Poll::Ready(result) = polled else {
                        // The layer holding the operation bounds the attempt in flight by its
                        // deadline (the layers below end with it, dropped with the attempt).
                        if this.part.ledger.is_some() && cut_off(this.retrier, this.part, cx) {
                            let error = ending::cut_off(this.retrier, this.part);
                            this.state.set(State::Expired { error: Some(error) });
                            continue;
                        }
                        return Poll::Pending;
                    };
                    let has_request = this.request.is_some();
                    match on_result(this.retrier, this.part, has_request, result) {
                        Step::Done(output) => return Poll::Ready(output),
                        Step::Wait(delay) => {
                            this.part.sleep_for(delay);
                            this.state.set(State::Backoff);
                        }
                    }
                }
                StateProj::Backoff => {
                    if let Some(sleep) = this.part.sleep() {
                        ready!(sleep.as_mut().poll(cx));
                    }
                    // From here the sleep is the deadline's, if the operation has one.
                    let deadline = this.part.op(this.retrier, |op| op.deadline());
                    this.part.sleep_until(deadline);
                    this.state.set(State::Ready);
                }
                StateProj::Expired { error } => {
                    let error = error.take().unwrap_or_else(|| {
                        ToolError::new(ErrorCode::DeadlineExceeded).with_retryable(false)
                    });
                    return Poll::Ready(Err(error));
                }
                StateProj::Ready => {
                    let retrier = &**this.retrier;
                    let service = this.service.get_or_insert_with(|| retrier.service());
                    let ready = in_scope(&mut this.part.ledger, || service.poll_ready(cx));
                    let ready = match ready {
                        Poll::Ready(ready) => ready,
                        Poll::Pending => {
                            // Not ready: the retry is abandoned if the deadline passes first.
                            if let Some(sleep) = this.part.sleep() {
                                ready!(sleep.as_mut().poll(cx));
                                return Poll::Ready(Err(deadline_passed(retrier, this.part)));
                            }
                            return Poll::Pending;
                        }
                    };
                    // Ready at or after the deadline (the service and the deadline's sleep
                    // woke together): the retry is not sent.
                    let deadline = this.part.op(retrier, |op| op.deadline());
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Poll::Ready(Err(deadline_passed(retrier, this.part)));
                    }
                    if let Err(e) = ready {
                        let attempts = this.part.op(retrier, |op| {
                            op.close(ErrorCode::Unavailable);
                            op.sent_attempts()
                        });
                        let err = into_tool_error(e, ErrorCode::Unavailable)
                            .with_retryable(false)
                            .with_attempts(attempts);
                        return Poll::Ready(Err(err));
                    }
                    let Some(mut request) = this.request.take() else {
                        // A retry is only granted with a copy of the request in hand.
                        return Poll::Ready(Err(ToolError::new(ErrorCode::Internal)));
                    };
                    *this.request = retrier.replay.replay(&request);
                    // The ledger counts the granted retry already: the ones before it are one fewer.
                    let previous = this.part.op(retrier, |op| op.attempts().saturating_sub(1));
                    retrier.replay.mark_retry(&mut request, previous);
                    if retrier.replay.can_carry() && retrier.replay.operation(&request).is_none() {
                        // A copy leaves the operation out: the retry takes it along again.
                        if let Some(op) = this.part.operation() {
                            retrier.replay.attach(&mut request, &op);
                        }
                    }
                    // The layers below compare their budgets with this one's again.
                    let budget = retrier.budget.id();
                    this.part.op(retrier, |op| op.set_caller(budget));
                    let future = in_scope(&mut this.part.ledger, || service.call(request));
                    this.part.attempts += 1;
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}

/// Whether the operation's deadline has passed while this layer's attempt is in flight; arms
/// (or moves) the deadline's sleep to wake this future when it does. Nothing is armed for an
/// operation without a deadline, so the first try of one costs nothing here.
fn cut_off<S, C, R>(
    retrier: &Retrier<S, C, R>,
    part: &mut LayerPart,
    cx: &mut Context<'_>,
) -> bool {
    let Some(at) = part.op(retrier, |op| op.deadline()) else {
        return false;
    };
    part.deadline_sleep(at).as_mut().poll(cx).is_ready()
}

impl<S, C, R, Req> fmt::Debug for ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("name", &self.retrier.name)
            .field("attempts", &self.part.attempts)
            .field("owner", &self.part.ledger.is_some())
            .finish()
    }
}
