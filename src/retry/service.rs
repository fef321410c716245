//! [`Retry`]: the service, and the [`Retrier`] it shares with its futures.

use super::ending;
use super::future::ResponseFuture;
use super::layer::Role;
use super::{ClassPolicy, DefaultReplay, Replay};
use crate::budget::acceptance::Acceptance;
use crate::budget::scope::in_run;
use crate::budget::RetryBudget;
use crate::class::{Evidence, ToolClass};
use crate::classify::{Classify, DefaultClassifier};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::operation::ledger::{
    current_deadline, join_current, with_current, Installed, Joined, Ledger, OpState, Overruled,
};
use crate::operation::Operation;
use crate::telemetry;
use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower_service::Service;

/// Retries a service's failures as its tool class, the shared budget and the operation's ledger
/// allow. See the [module docs](super).
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
    pub(crate) role: Role,
    /// The declared class decides even where the request's evidence is stricter
    /// ([`RetryLayer::trust_class`](super::RetryLayer::trust_class)).
    pub(crate) trust: bool,
    /// A failed answer it does not retry ends as a `ToolError`, not `Ok`.
    pub(crate) answers_as_errors: bool,
    /// What the tool's name shows, weighed when the request shows nothing.
    pub(crate) named: Option<Evidence>,
    /// Set once the tool answered `201 Created` (see `RetryLayer::learns_creates`).
    pub(crate) creates: Option<Arc<AtomicBool>>,
    /// The WARN that evidence overruled the declared class has been logged.
    pub(crate) warned: AtomicBool,
    /// How much of its recent traffic the dependency below answered (see
    /// [`budget::acceptance`](crate::budget::acceptance)): one per service the layer built,
    /// shared with its clones.
    pub(crate) acceptance: Arc<Acceptance>,
}

impl<S, C, R> Retrier<S, C, R> {
    /// What `req` shows about its class (an HTTP POST without a key), to be weighed against
    /// the declared class; `None` when the layer trusts its class.
    #[inline]
    pub(crate) fn evidence<Req>(&self, req: &Req) -> Option<Evidence>
    where
        R: Replay<Req>,
    {
        if self.trust {
            return None;
        }
        self.replay.evidence(req).or(self.named).or_else(|| {
            let creates = self.creates.as_ref()?.load(Ordering::Relaxed);
            creates.then(Evidence::created_answer)
        })
    }

    /// The evidence overruled the declared class: said out loud, once per layer, and counted.
    #[cold]
    fn overruled(&self, o: Overruled) {
        telemetry::class_from_evidence(o.from, o.to, o.evidence.as_str());
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                layer = %self.name,
                declared = o.from.as_str(),
                seen = o.to.as_str(),
                evidence = o.evidence.as_str(),
                "the layer is declared {} but it sees {}: it decides as {} (an ambiguous \
                 failure is not sent again); if the endpoint is safe to resend, give the layer \
                 .trust_class() (`trust_class = true` in a tool table)",
                o.from.as_str(),
                o.evidence.describe(),
                o.to.as_str(),
            );
        }
    }
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
        let declared = retrier.policy.class();
        let evidence = retrier.evidence(&req);
        let since = self.waiting_since.take();
        let deadline = retrier
            .policy
            .deadline()
            .map(|d| since.unwrap_or_else(Instant::now) + d);
        let budget = retrier.budget.id();

        if retrier.role != Role::Own {
            // The operation the request carries: it crossed a `Buffer` or a spawned task with it.
            if let Some(op) = retrier.replay.operation(&req) {
                let copy = retrier.replay.replay(&req);
                let mut ledger = Some(op.ledger());
                // The run the operation acts for decides which account this layer draws on.
                let mut run = op.run();
                let joined = in_run(&mut run, || {
                    let budget = retrier.budget.id();
                    op.with(|op| op.join(declared, keyed, deadline, budget, evidence))
                });
                let (joined, credits, overruled) = joined;
                note_join(retrier, joined, overruled);
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
                return ResponseFuture::carried(future, retrier, copy, ledger, credits, run)
                    .hands_up(self.retrier.role == Role::HandsUp);
            }
            // The operation of a layer above on this task.
            match join_current(declared, keyed, deadline, budget, evidence) {
                (Joined::No, ..) => {}
                (joined, credits, overruled) => {
                    note_join(retrier, joined, overruled);
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
                    return ResponseFuture::nested(future, self.retrier.clone(), copy, credits)
                        .hands_up(retrier.role == Role::HandsUp);
                }
            }
        }

        // Outermost (or its own operation): open the ledger and lend it to the inner call; a
        // request that can carry it takes it along (one allocation per operation).
        if retrier.role == Role::Nested {
            operation_uncarried(&retrier.name);
        }
        let hands_up = matches!(retrier.role, Role::Nested | Role::HandsUp);
        let max_attempts = retrier.policy.max_attempts();
        let state = OpState::new(max_attempts, declared, keyed, deadline).with_caller(budget);
        let (mut state, overruled) = state.with_evidence(evidence);
        if let Some(o) = overruled {
            retrier.overruled(o);
        }
        let class = state.class();
        telemetry::operation_opened(class);
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
        let span = (!span.is_disabled()).then_some(span);
        let future = {
            let _entered = span.as_ref().map(tracing::Span::enter);
            let _installed = Installed::new(&mut ledger);
            self.inner.call(req)
        };
        ResponseFuture::owner(future, self.retrier.clone(), copy, ledger, span).hands_up(hands_up)
    }
}

/// Traces a join that made the operation stricter.
#[inline]
fn note_join<S, C, R>(retrier: &Retrier<S, C, R>, joined: Joined, overruled: Option<Overruled>) {
    if let Some(o) = overruled {
        retrier.overruled(o);
    }
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
            role: retrier.role,
            trust: retrier.trust,
            answers_as_errors: retrier.answers_as_errors,
            named: retrier.named,
            creates: retrier.creates.clone(),
            warned: AtomicBool::new(retrier.warned.load(Ordering::Relaxed)),
            acceptance: retrier.acceptance.clone(),
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

/// A layer declared [`nested`](super::RetryLayer::nested) found no operation to join: the
/// operation was lost on the way (a request type that cannot carry it, across a `Buffer` or a
/// spawned task), or the layer has no owner above it.
#[cold]
fn operation_uncarried(layer: &str) {
    telemetry::operation_uncarried(layer);
    tracing::warn!(
        layer,
        "a nested retry layer found no operation to join: it makes one attempt and hands failures \
         up; carry the operation across the boundary (operation::carry for a spawned task, \
         AttachLayer/AdoptLayer around a Buffer) or use a request type that carries it"
    );
}
