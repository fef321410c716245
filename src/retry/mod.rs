//! Retries that follow the tool's class, share one budget, and never multiply when nested.
//!
//! [`Retry`] decides each retry from the tool class × the failure class
//! ([`ToolClass::decide`](crate::class::ToolClass::decide)), the server's hint, the operation's
//! ledger (attempts across all nested layers, see [`operation`](crate::operation)), the shared
//! [`RetryBudget`], and the operation's deadline, in one pure function whose order is the
//! contract:
//!
//! 1. a success or an empty answer is handed back, and credited to the budget once per
//!    operation (each distinct budget of the nested layers once);
//! 2. an operation a layer below ended is handed back untouched;
//! 3. the class table: **an ambiguous failure of an unkeyed write, or of a keyed write without
//!    its key, ends as `outcome_unknown` / `missing_idempotency_key` whatever came with it** (a
//!    server hint, a non-retryable error from below, a spent budget); a failure retrying cannot
//!    help (a bad argument, a bad credential, a used-up quota) is handed back: an `Ok` response
//!    stays `Ok`, an `Err` becomes a non-retryable `ToolError`; either way the operation ends
//!    there, so a layer above whose classifier sees less (the status, not the provider's error
//!    body) hands it back too (rule 2);
//! 4. the server asked not to retry (a negative or malformed `grpc-retry-pushback-ms`, gRFC A6),
//!    or a `ToolError` from below forbids it (an open circuit: it passes through as it is);
//! 5. the request could not be copied (a streaming body);
//! 6. the operation's attempts are spent: the cap of the layer that opened it (the outermost);
//! 7. this layer's own attempts are spent (its `max_attempts` caps the attempts it makes in a
//!    row): a nested layer hands the failure up as a retryable `ToolError`, and the layer above
//!    decides with the operation's cap;
//! 8. the delay (the class's backoff, or the server's `Retry-After` / pushback clamped to the
//!    policy's maximum) would end at or after the deadline;
//! 9. the budget refuses.
//!
//! Every ending of steps 3-9 (but 7, and an open circuit's `circuit_open`, which passes through
//! as it is, `retryable: true` with the time left as `retry_after`) closes the operation, so no
//! layer above retries it, and is a [`ToolError`] with `retryable: false`, the operation's attempt count, the code of the last
//! failure (`unavailable`, `rate_limited`, ...) or of the ending (`outcome_unknown`,
//! `retry_budget_exhausted`, `run_budget_exhausted`, `deadline_exceeded`), a hint that agrees
//! with `retryable: false`, and the dependency's own structured error as its
//! [`cause`](crate::error::ToolError::cause) (a `ToolError` in the error's chain, or what
//! [`Classify::dependency_error`] reads from a response, such as its HTTP status); any other
//! error stays reachable through `source()`.
//!
//! # Deadlines
//!
//! Each layer's [`deadline`](crate::class::ClassPolicyBuilder::deadline) joins the operation; the
//! earliest wins. It counts from the layer's `call`, or from when its `poll_ready` first waited.
//! No attempt starts at or after it, the first included: a first attempt whose wait for
//! readiness (a quota, a pool, a layer behind a `Buffer`) outlasted it is not sent; a retry whose
//! delay would end past it is refused, and a granted retry that is still waiting for its service
//! to be ready when it passes is abandoned. Each ends as `deadline_exceeded`. An attempt in flight is not cut off; put a `tower::timeout` layer below
//! the `Retry` for that (a timeout is then an ambiguous failure, decided as above).
//!
//! # Classes of nested layers
//!
//! A joining layer with a stricter class makes the whole operation that class (a retry of the
//! whole repeats its calls). When that changes a decision (a `Read` operation becomes an
//! `UnkeyedWrite`) it logs a WARN and counts `stormguard_class_tightened_total`: a call that is a
//! logical operation of its own (an auth-token refresh, each branch of a fan-out) belongs in a
//! layer with [`RetryLayer::own_operation`].
//!
//! # Example: three nested layers, one budget
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
//! use stormguard::error::ErrorCode;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let dependency = service_fn(move |_req: u32| {
//!     counter.fetch_add(1, Ordering::SeqCst);
//!     async { Err::<u32, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
//! });
//!
//! let budget = RetryBudget::default();
//! let mut stack = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
//!     .layer(RetryLayer::new(ToolClass::Read, budget).name("client"))
//!     .service(dependency);
//!
//! let err = stack.ready().await.unwrap().call(7).await.unwrap_err();
//! assert_eq!(calls.load(Ordering::SeqCst), 3); // not 27
//! assert_eq!(err.code(), ErrorCode::Unavailable);
//! assert!(!err.retryable());
//! assert_eq!(err.attempts(), 3);
//! # }
//! ```
//!
//! # Backpressure
//!
//! `poll_ready` waits for the inner service (it neither sheds nor queues). Before every retry the
//! future polls its own clone of the inner service ready, as tower's `Retry` does.
//!
//! # Where it belongs
//!
//! Outermost in a tool's stack (the agent loop's layer), above the circuit breaker, so that a
//! rejection from an open circuit is seen and not retried; nested layers (a tool wrapper, an
//! HTTP client's layer) may stay: they join the outer layer's operation.
//!
//! # Observability
//!
//! Tracing: a `stormguard.operation` span (DEBUG) per logical operation with `layer` and `class`;
//! a DEBUG event per retry (`attempt`, `failure`, `delay_ms`) and an INFO event when a layer gives
//! up or escalates (`code`, `attempts`, `reason`).
//!
//! Metrics:
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `stormguard_operations_total` | `class` | logical operations (by the outermost layer) |
//! | `stormguard_retries_total` | `class`, `failure` | retries granted, by any layer |
//! | `stormguard_retry_refusals_total` | `class`, `reason` | retries refused: `max_attempts`, `retry_budget`, `run_budget`, `deadline`, `not_replayable`, `server_pushback` (also an open circuit or a non-retryable error from below) |
//! | `stormguard_escalations_total` | `class`, `code` | `outcome_unknown` and `missing_idempotency_key` endings |
//! | `stormguard_class_tightened_total` | `from`, `to` | joins that made an operation's class stricter, changing a decision |
//!
//! Amplification is `(operations + retries) / operations`.

mod decide;
mod ending;
pub mod future;
use future::ResponseFuture;
mod layer;
pub(crate) mod policy;
mod replay;

pub use layer::RetryLayer;
pub(crate) use policy::ClassPolicy;
#[cfg(feature = "tonic")]
pub use replay::GrpcReplay;
#[cfg(feature = "http")]
pub use replay::HttpReplay;
pub use replay::{CloneReplay, DefaultReplay, Replay, Request};

use crate::budget::scope::in_run;
use crate::budget::RetryBudget;
use crate::class::ToolClass;
use crate::classify::{Classify, DefaultClassifier};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::operation::ledger::{
    current_deadline, join_current, with_current, Installed, Joined, Ledger, OpState,
};
use crate::operation::Operation;
use crate::telemetry;
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_service::Service;

/// Retries a service's failures as its tool class, the shared budget and the operation's ledger
/// allow. See the [module docs](self).
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::{budget::RetryBudget, class::ToolClass, error::ErrorCode};
/// use stormguard::retry::{Retry, RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let calls = Arc::new(AtomicU32::new(0));
/// let counter = calls.clone();
/// // Refuses connections twice (nothing was sent: transient), then answers.
/// let flaky = service_fn(move |q: &'static str| {
///     let n = counter.fetch_add(1, Ordering::SeqCst);
///     async move {
///         if n < 2 {
///             Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
///         } else {
///             Ok(format!("results for {q}"))
///         }
///     }
/// });
/// let mut search: Retry<_> = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(flaky);
/// let found = search.ready().await.unwrap().call("storm").await.unwrap();
/// assert_eq!(found, "results for storm");
/// assert_eq!(calls.load(Ordering::SeqCst), 3);
///
/// // A dependency that stays down: the Read class's 3 attempts, then a final error.
/// let down = service_fn(|_: &'static str| async {
///     Err::<String, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
/// });
/// let mut search = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(down);
/// let err = search.ready().await.unwrap().call("storm").await.unwrap_err();
/// assert_eq!(err.code(), ErrorCode::Unavailable);
/// assert_eq!(err.attempts(), 3);
/// assert!(!err.retryable());
/// # }
/// ```
pub struct Retry<S, C = DefaultClassifier, R = DefaultReplay> {
    inner: S,
    retrier: Arc<Retrier<S, C, R>>,
    /// `get_mut` lent the inner service out: the retry template is refreshed at the next call.
    stale: bool,
    /// When the inner service first answered "not ready" before the next call (only with a
    /// deadline): the operation's deadline counts from then.
    waiting_since: Option<Instant>,
}

/// What makes a retry (the service to clone, the policy, budget, classifier and replay): shared
/// by a [`Retry`] and its futures, so a call clones one `Arc` and not the service.
pub(crate) struct Retrier<S, C, R> {
    /// Cloned (on the cold path) for a retry: the inner service as it was at the last call that
    /// followed a `get_mut` (or when the layer was built). Behind a mutex so that a `Send`
    /// service that is not `Sync` still gives a `Send` future.
    pub(crate) template: Mutex<S>,
    pub(crate) policy: ClassPolicy,
    pub(crate) budget: RetryBudget,
    pub(crate) classifier: C,
    pub(crate) replay: R,
    pub(crate) name: Cow<'static, str>,
    pub(crate) own_operation: bool,
}

impl<S: Clone, C, R> Retrier<S, C, R> {
    /// A fresh clone of the inner service, for a retry.
    pub(crate) fn service(&self) -> S {
        self.template
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl<S, C, R> Retry<S, C, R> {
    pub(crate) fn new(inner: S, retrier: Retrier<S, C, R>) -> Self {
        Retry {
            inner,
            retrier: Arc::new(retrier),
            stale: false,
            waiting_since: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably: a change made here reaches the retries of the calls made
    /// after it. (Retries clone a copy of the service taken when the layer was built or at the
    /// first call after a `get_mut`, not the service at every call as tower's `Retry` does: state
    /// a service changes inside its own `call` is not seen by retries; keep it behind an `Arc`.)
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
    /// use tower::{Layer, Service, ServiceExt};
    /// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    ///
    /// /// Refuses the first call it gets, answers with its `region` after that.
    /// #[derive(Clone)]
    /// struct Client { region: &'static str, calls: Arc<AtomicU32> }
    /// impl Service<()> for Client {
    ///     type Response = &'static str;
    ///     type Error = std::io::Error;
    ///     type Future = std::future::Ready<Result<&'static str, std::io::Error>>;
    ///     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), std::io::Error>> {
    ///         std::task::Poll::Ready(Ok(()))
    ///     }
    ///     fn call(&mut self, _: ()) -> Self::Future {
    ///         let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
    ///         std::future::ready(if first { Err(std::io::ErrorKind::ConnectionRefused.into()) } else { Ok(self.region) })
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let client = Client { region: "eu", calls: Arc::new(AtomicU32::new(0)) };
    /// let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(client);
    /// svc.get_mut().region = "us";
    /// // The first attempt is refused; the retry goes through the changed service.
    /// assert_eq!(svc.ready().await.unwrap().call(()).await.unwrap(), "us");
    /// # }
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        self.stale = true;
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The policy this layer applies.
    pub fn policy(&self) -> &ClassPolicy {
        &self.retrier.policy
    }
}

impl<S: Clone, C, R> Clone for Retry<S, C, R> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            retrier: self.retrier.clone(),
            stale: self.stale,
            waiting_since: None,
        }
    }
}

impl<S: fmt::Debug, C, R> fmt::Debug for Retry<S, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("name", &self.retrier.name)
            .field("policy", &self.retrier.policy)
            .field("budget", &self.retrier.budget)
            .finish()
    }
}

/// Turns an inner error into the `ToolError` this layer returns, keeping a `ToolError` as it is.
pub(crate) fn into_tool_error<E: Into<BoxError>>(err: E, code: ErrorCode) -> ToolError {
    ToolError::from_boxed(err.into(), code)
}

impl<S, C, R, Req> Service<Req> for Retry<S, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error> + Clone,
    R: Replay<Req> + Clone,
{
    type Response = S::Response;
    type Error = ToolError;
    type Future = ResponseFuture<S, C, R, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        match self.inner.poll_ready(cx) {
            Poll::Pending => {
                if self.waiting_since.is_none() && self.retrier.policy.deadline().is_some() {
                    self.waiting_since = Some(Instant::now());
                }
                Poll::Pending
            }
            Poll::Ready(ready) => {
                Poll::Ready(ready.map_err(|e| into_tool_error(e, ErrorCode::Unavailable)))
            }
        }
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        if self.stale {
            self.refresh_template();
        }
        let retrier = &*self.retrier;
        let keyed = retrier.replay.carries_key(&req);
        let class = retrier.policy.class();
        let since = self.waiting_since.take();
        let deadline = retrier
            .policy
            .deadline()
            .map(|d| since.unwrap_or_else(Instant::now) + d);
        let budget = retrier.budget.id();

        if !retrier.own_operation {
            // The operation the request carries: it crossed a `Buffer` or a spawned task with it.
            if let Some(op) = retrier.replay.operation(&req) {
                let copy = retrier.replay.replay(&req);
                let mut ledger = Some(op.ledger());
                // The run the operation acts for decides which account this layer draws on.
                let mut run = op.run();
                let joined = in_run(&mut run, || {
                    let budget = retrier.budget.id();
                    op.with(|op| op.join(class, keyed, deadline, budget))
                });
                let (joined, credits) = joined;
                note_join(retrier, joined);
                // The operation's deadline may have passed on the way (a queue, a spawn).
                if passed(op.with(|op| op.deadline())) {
                    let err = op.with(|op| ending::not_sent(retrier, op));
                    return ResponseFuture::expired(self.retrier.clone(), err);
                }
                let future = in_run(&mut run, || {
                    let _installed = Installed::new(&mut ledger);
                    self.inner.call(req)
                });
                let retrier = self.retrier.clone();
                return ResponseFuture::carried(future, retrier, copy, ledger, credits, run);
            }
            // The operation of a layer above on this task.
            match join_current(class, keyed, deadline, budget) {
                (Joined::No, _) => {}
                (joined, credits) => {
                    note_join(retrier, joined);
                    if retrier.replay.can_carry() {
                        // From here it travels with the request, to layers behind a boundary.
                        if let Some(op) = Operation::current() {
                            retrier.replay.attach(&mut req, &op);
                        }
                    }
                    let copy = retrier.replay.replay(&req);
                    // The operation's deadline (the earliest) may have passed while this layer
                    // waited to be ready, or behind a boundary: then nothing is sent.
                    if passed(current_deadline()) {
                        let err = with_current(|op| ending::not_sent(retrier, op));
                        let err =
                            err.unwrap_or_else(|| ToolError::new(ErrorCode::DeadlineExceeded));
                        return ResponseFuture::expired(self.retrier.clone(), err);
                    }
                    // Nested: the operation's owner has installed its ledger on this thread.
                    let future = self.inner.call(req);
                    return ResponseFuture::nested(future, self.retrier.clone(), copy, credits);
                }
            }
        }

        // Outermost (or its own operation): open the ledger and lend it to the inner call; a
        // request that can carry it takes it along (one allocation per operation).
        telemetry::operation_opened(class);
        let max_attempts = retrier.policy.max_attempts();
        let mut state = OpState::new(max_attempts, class, keyed, deadline).with_caller(budget);
        if since.is_some() && passed(deadline) {
            // The wait for readiness (a quota, a pool) outlasted the deadline: nothing is sent.
            let err = ending::not_sent(retrier, &mut state);
            return ResponseFuture::expired(self.retrier.clone(), err);
        }
        let copy = retrier.replay.replay(&req);
        let mut ledger = Some(if retrier.replay.can_carry() {
            let op = Operation::open(state);
            retrier.replay.attach(&mut req, &op);
            op.ledger()
        } else {
            Ledger::inline(state)
        });
        let span = tracing::debug_span!(
            "stormguard.operation",
            layer = %retrier.name,
            class = class.as_str()
        );
        let future = {
            let _entered = span.enter();
            let _installed = Installed::new(&mut ledger);
            self.inner.call(req)
        };
        ResponseFuture::owner(future, self.retrier.clone(), copy, ledger, span)
    }
}

/// Traces a join that made the operation stricter.
#[inline]
fn note_join<S, C, R>(retrier: &Retrier<S, C, R>, joined: Joined) {
    if let Joined::Tightened { was } = joined {
        let class = retrier.policy.class();
        if !was.decides_like(class) {
            class_tightened(&retrier.name, was, class);
        }
    }
}

impl<S: Clone, C: Clone, R: Clone> Retry<S, C, R> {
    /// After a `get_mut`: retries of the calls from now on clone the service as it is now. This
    /// service gets a retrier of its own; its clones made before keep theirs.
    #[cold]
    fn refresh_template(&mut self) {
        let retrier = &*self.retrier;
        self.retrier = Arc::new(Retrier {
            template: Mutex::new(self.inner.clone()),
            policy: retrier.policy,
            budget: retrier.budget.clone(),
            classifier: retrier.classifier.clone(),
            replay: retrier.replay.clone(),
            name: retrier.name.clone(),
            own_operation: retrier.own_operation,
        });
        self.stale = false;
    }
}

/// Whether `deadline` has come: no attempt starts at or after it.
#[inline]
fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// A layer joined an operation with a stricter class: the operation is now decided as that
/// class. Right when the layer's calls are part of the operation (a retry of the whole repeats
/// them); wrong for a separate operation inside it (an auth refresh): `.own_operation()`.
#[cold]
fn class_tightened(layer: &str, was: ToolClass, now: ToolClass) {
    telemetry::class_tightened(was, now);
    tracing::warn!(
        layer,
        from = was.as_str(),
        to = now.as_str(),
        "a nested layer made the operation stricter: it is now retried as {}; if this layer's calls \
         are an operation of their own (an auth-token refresh, one branch of a fan-out), give it \
         .own_operation()",
        now.as_str()
    );
}
