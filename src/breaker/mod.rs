//! A circuit breaker that counts failures of the dependency, not disappointing answers.
//!
//! [`CircuitBreaker`] goes Closed → Open when a trip rule fires (consecutive failures, or a
//! failure rate over a count or time window with a minimum number of calls), rejects calls at once
//! while open, then goes HalfOpen (once the shortest open time has passed and enough calls were
//! turned away, or once the longest open time has passed) and admits exactly
//! [`trials`](BreakerConfigBuilder::trials) trial calls: enough successes close it, a failure
//! opens it again, for no longer than before (the open time never doubles).
//!
//! **What it does to a partial failure.** The default rates trip only a dependency that accepts
//! almost nothing (90 % of the last 50 counted calls failed, or 20 in a row). A dependency failing
//! up to about 70 % of its calls practically never trips it, so it loses nothing by the breaker
//! (measured: 50 % failing, the same success rate as without a breaker; 70 %, 0.9 points less).
//! Between about 75 % and 90 %, runs of failures trip it by chance, and each trip turns away the
//! calls of one open period: at 85 % failing, 4.4 % of calls succeed with the breaker against
//! 15.0 % without. Where a dependency that poor is still worth calling, raise the threshold or
//! turn the rate rule off.
//!
//! What counts comes from the same [`Classification`](crate::classify::Classification) the retry
//! layer uses, mapped by a [`CountPolicy`]: by default only `Failure(Transient | Ambiguous)` counts
//! against the dependency. A "no such record" answer (`Empty`), a model's bad argument
//! (`ModelRecoverable`), a bad credential (`Permanent`) and a guardrail (`Policy`) count as
//! neither success nor failure, so they neither trip the breaker nor dilute its failure rate.
//!
//! The count window is a ring of the last N counted outcomes: after 1,000 healthy calls the
//! breaker trips as soon as the last N cross the threshold (a window that accumulates since the
//! last state change can need hundreds of failures).
//!
//! A rejection is a [`ToolError`] with code `circuit_open`,
//! a `retry_after`, and a hint that names the dependency and why it opened, e.g.
//! `"a trial call to billing-api failed; open for at least 250 ms, then probing after 25
//! turned-away calls (at most 2000 ms); calls are paused, retry after 2 s"`: `retry_after` is
//! the time after which a call is sure to go through as a probe (the longest open time, a fifth
//! of the outage so far by default, or the shortest once enough calls were turned away); under
//! traffic the probe comes sooner.
//! stormguard's [`Retry`](crate::retry::Retry) never retries it and spends no budget on it.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
//! use stormguard::error::{ErrorCode, ToolError};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let config = BreakerConfig::builder()
//!     .consecutive_failures(3)
//!     .open_duration(Duration::from_secs(5), Duration::from_secs(30))
//!     .build()
//!     .unwrap();
//! let breaker = Breaker::new("billing-api", config);
//! let mut svc = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new(breaker.clone()))
//!     .service(service_fn(|_: ()| async {
//!         Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
//!     }));
//! for _ in 0..3 {
//!     let _ = svc.ready().await.unwrap().call(()).await;
//! }
//! assert_eq!(breaker.state(), State::Open);
//! let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
//! let err = err.downcast::<ToolError>().unwrap();
//! assert_eq!(err.code(), ErrorCode::CircuitOpen);
//! // The time after which a probe is sure to go: a fifth of the outage so far, at least the
//! // shortest open time (5 s) and at most the longest (30 s); under traffic, a probe goes once
//! // 5 s have passed and 25 calls were turned away.
//! assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));
//! # }
//! ```
//!
//! # Backpressure
//!
//! Like tower's `LoadShed`, an open breaker sheds in `call`, not in `poll_ready`: `poll_ready`
//! decides admission once per call; when the call will be rejected it answers `Ready(Ok)` at once
//! without polling the inner service (a down dependency is not waited on), and `call` returns the
//! rejection. An admitted call waits for the inner service's readiness. A `Buffer` above the
//! breaker is never torn down by an open circuit.
//!
//! # Where it belongs
//!
//! Below the outermost [`Retry`](crate::retry::Retry), so that each attempt is counted and a
//! rejection is seen and not retried, and below a [`ReceiptGuardLayer`](crate::receipt::ReceiptGuardLayer),
//! so that a result answered from a stored receipt (the dependency was not called) is not taken
//! as evidence of its health. One [`Breaker`] per dependency (a [`BreakerRegistry`] hands them
//! out by name).
//!
//! Put a `Timeout` *below* the breaker:
//!
//! ```text
//! Retry ──► ReceiptGuardLayer ──► CircuitBreaker ──► Timeout ──► client
//!                                  ▲               │
//!                                  └── Elapsed ────┘  a hung call ends as a counted failure
//! ```
//!
//! There a hung call ends as `Elapsed`, a failure the breaker counts, so a dependency that hangs
//! trips it like one that refuses. Above the breaker, a timeout drops the call's future: a
//! dropped call counts as nothing (not a failure, not a success), so any number of hung calls
//! never trip it. Either way a half-open trial is bounded by
//! [`trial_timeout`](BreakerConfigBuilder::trial_timeout) (10 s): unanswered that long, it
//! counts as failed and a later probe tries again, so one hung trial cannot keep a healed
//! dependency shut.
//!
//! # Streams
//!
//! A call whose outcome comes at the end of its stream (a gRPC server-streaming call fails in
//! its trailers) is counted then, not at its head. With a classifier whose
//! [`ClassifyEos`](crate::classify::ClassifyEos) watches the response
//! ([`GrpcClassifier`](crate::classify::GrpcClassifier) on a tonic `Channel`), the breaker hands
//! the response on with its body wrapped in a
//! [`ClassifiedBody`](crate::classify::ClassifiedBody) that carries the call's
//! [`StreamTicket`](future::StreamTicket): the trailers' status is counted when the caller reads the stream to its
//! end; a stream dropped before its end counts as nothing. A half-open trial whose answer is a
//! stream is judged at its head (the dependency answered; `trial_timeout` bounds the wait for
//! the head, not the stream, which may rightly last minutes), and its end is then counted like
//! any call's. The slow-call rule times the head. A classifier that
//! decides at the head ([`NeverClassifyEos`](crate::classify::NeverClassifyEos), every stock one
//! but `GrpcClassifier`) leaves the response as it is: the breaker's `Response` is the inner
//! service's.
//!
//! ```text
//! tonic client ──► CircuitBreaker(GrpcClassifier) ──► Channel
//!                      │  head: 200, application/grpc ─► body wrapped, verdict pending
//!                      └◄ trailers: grpc-status 14 ──────► counted as a failure
//! ```
//!
//! # Observability
//!
//! Tracing: an INFO event `circuit breaker transition` (`breaker`, `from`, `to`, `reason`) on
//! every transition. Metrics:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `stormguard_breaker_state` | gauge: 0 closed, 1 open, 2 half-open | `breaker` |
//! | `stormguard_breaker_transitions_total` | counter | `breaker`, `from`, `to` |
//! | `stormguard_breaker_rejections_total` | counter | `breaker` |
//! | `stormguard_breaker_outcomes_total` | counter | `breaker`, `count` = `success` / `failure` / `ignored` |
//! | `stormguard_stream_end_total` | counter (by [`ClassifiedBody`](crate::classify::ClassifiedBody)) | `verdict` = `success` / `empty` / `failure` |
//!
//! Outcome and rejection counters are registered when the breaker is made: install your metrics
//! recorder first. [`BreakerConfigBuilder::on_transition`] adds a callback.

mod config;
pub(crate) mod control;
mod decide;
pub mod future;
mod keyed;
mod layer;
mod policy;
mod record;
mod registry;
pub(crate) mod share;
mod state;
mod transition;
mod window;

pub use config::{BreakerConfig, BreakerConfigBuilder, FailureRate, OnTransition, Window};
use future::ResponseFuture;
pub use keyed::{KeyedBreaker, KeyedBreakerLayer};
pub use layer::CircuitBreakerLayer;
pub use policy::{Count, CountDependencyFailures, CountPolicy};
pub use registry::BreakerRegistry;
pub use state::Breaker;
pub use transition::{State, Transition};

use crate::classify::{Classify, DefaultClassifier, FailureClass};
use crate::error::{BoxError, ErrorCode, ToolError};
use future::{retry_after_hint, Ticket, Watched};
use state::{Admission, Admit};
use std::fmt;
use std::task::{Context, Poll};
use tower_service::Service;

pub(crate) use crate::telemetry::{
    BREAKER_OUTCOMES as OUTCOMES, BREAKER_REJECTIONS as REJECTIONS, BREAKER_STATE as STATE,
    BREAKER_TRANSITIONS as TRANSITIONS,
};

/// Fails calls at once while its dependency is down. See the [module docs](self).
///
/// ```
/// use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreaker, CountDependencyFailures};
/// use stormguard::classify::DefaultClassifier;
/// use tower::{service_fn, Service, ServiceExt};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let breaker = Breaker::new("search", BreakerConfig::default());
/// let inner = service_fn(|q: &'static str| async move { Ok::<_, std::io::Error>(q.len()) });
/// let mut svc = CircuitBreaker::new(inner, breaker, DefaultClassifier, CountDependencyFailures);
/// assert_eq!(svc.ready().await.unwrap().call("storm").await.unwrap(), 5);
/// assert_eq!(svc.breaker().opens(), 0);
/// # }
/// ```
pub struct CircuitBreaker<S, C = DefaultClassifier, P = CountDependencyFailures> {
    inner: S,
    breaker: Breaker,
    classifier: C,
    policy: P,
    /// A closed-state or rejecting admission decided in `poll_ready`, spent in `call`: it holds
    /// nothing, so the fast path moves no reference count around.
    admitted: Option<Admission>,
    /// A half-open trial admitted in `poll_ready`: it holds a permit, given back if dropped.
    trial: Option<Ticket>,
}

impl<S, C, P> CircuitBreaker<S, C, P> {
    /// Wraps `inner` with `breaker`.
    pub fn new(inner: S, breaker: Breaker, classifier: C, policy: P) -> Self {
        CircuitBreaker {
            inner,
            breaker,
            classifier,
            policy,
            admitted: None,
            trial: None,
        }
    }

    /// The shared breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C: Clone, P: Clone> Clone for CircuitBreaker<S, C, P> {
    fn clone(&self) -> Self {
        // A clone has not been polled ready: it holds no admission.
        CircuitBreaker::new(
            self.inner.clone(),
            self.breaker.clone(),
            self.classifier.clone(),
            self.policy.clone(),
        )
    }
}

impl<S: fmt::Debug, C, P> fmt::Debug for CircuitBreaker<S, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker)
            .finish()
    }
}

impl<S, C, P, Req> Service<Req> for CircuitBreaker<S, C, P>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error> + Clone,
    P: CountPolicy + Clone,
{
    type Response = Watched<C, S::Response, S::Error, P>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.admitted.is_none() && self.trial.is_none() {
            let admission = self.breaker.admit();
            match admission.view() {
                Admit::Trial(_) => self.trial = Some(Ticket::new(self.breaker.clone(), admission)),
                _ => self.admitted = Some(admission),
            }
        }
        if self.admitted.is_some_and(Admission::is_rejected) {
            return Poll::Ready(Ok(()));
        }
        match self.inner.poll_ready(cx) {
            Poll::Ready(Err(e)) => {
                self.admitted = None;
                self.trial = None;
                Poll::Ready(Err(e.into()))
            }
            other => other.map_err(Into::into),
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let breaker = &self.breaker;
        let mut ticket = match self.trial.take() {
            Some(ticket) => ticket,
            None => {
                let admission = self.admitted.take().unwrap_or_else(|| breaker.admit());
                if let Admit::Rejected(after_ms) = admission.view() {
                    let after = std::time::Duration::from_millis(u64::from(after_ms));
                    breaker.rejected();
                    let err = ToolError::new(ErrorCode::CircuitOpen)
                        .with_class(FailureClass::Transient)
                        .with_retry_after(after)
                        .with_hint(retry_after_hint(breaker, after));
                    return ResponseFuture::rejected(
                        err,
                        self.classifier.clone(),
                        self.policy.clone(),
                    );
                }
                Ticket::new(breaker.clone(), admission)
            }
        };
        ticket.start();
        let future = self.inner.call(req);
        ResponseFuture::called(future, ticket, self.classifier.clone(), self.policy.clone())
    }
}
