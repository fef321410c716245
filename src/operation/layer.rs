use super::{Operation, Scoped};
use crate::budget::scope::in_run;
use crate::operation::ledger::{in_scope, Ledger};
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A request type that can carry an [`Operation`] across a task boundary.
///
/// Implemented for `http::Request<B>` (in its extensions). For your own request type, keep an
/// `Option<Operation>` field:
///
/// ```
/// use stormguard::operation::{Carrier, Operation};
///
/// struct ToolCall { name: String, operation: Option<Operation> }
///
/// impl Carrier for ToolCall {
///     fn attach(&mut self, op: Operation) { self.operation = Some(op); }
///     fn operation(&self) -> Option<Operation> { self.operation.clone() }
/// }
/// ```
pub trait Carrier {
    /// Stores the operation in the request.
    fn attach(&mut self, operation: Operation);
    /// The operation the request carries, if any.
    fn operation(&self) -> Option<Operation>;
}

#[cfg(feature = "http")]
impl<B> Carrier for http::Request<B> {
    fn attach(&mut self, operation: Operation) {
        self.extensions_mut().insert(operation);
    }

    fn operation(&self) -> Option<Operation> {
        self.extensions().get::<Operation>().cloned()
    }
}

/// Puts the current operation into each request, for an [`AdoptLayer`] behind a task boundary.
///
/// Place it directly above the boundary (a `Buffer`, a queue):
///
/// ```
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, service_fn};
/// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
/// use stormguard::operation::{AdoptLayer, AttachLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let budget = RetryBudget::default();
/// let client = service_fn(|_req: http::Request<String>| async {
///     Ok::<_, Infallible>(http::Response::new(String::new()))
/// });
/// let svc = ServiceBuilder::new()
///     .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
///     .layer(AttachLayer::new())
///     .buffer(16)
///     .layer(AdoptLayer::new())
///     .layer(RetryLayer::new(ToolClass::Read, budget))
///     .service(client);
/// # let _ = svc;
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AttachLayer {
    _priv: (),
}

impl AttachLayer {
    /// A new layer.
    pub const fn new() -> Self {
        AttachLayer { _priv: () }
    }
}

impl<S> Layer<S> for AttachLayer {
    type Service = Attach<S>;

    fn layer(&self, inner: S) -> Attach<S> {
        Attach { inner }
    }
}

/// The service [`AttachLayer`] makes: puts the current operation into each request.
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Service, ServiceExt, service_fn};
/// use stormguard::operation::{Attach, Carrier};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let inner = service_fn(|req: http::Request<()>| async move {
///     Ok::<_, Infallible>(req.operation().is_some())
/// });
/// let mut svc = Attach::new(inner);
/// // Outside a stormguard `Retry` there is no operation to attach.
/// let carried = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert!(!carried);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Attach<S> {
    inner: S,
}

impl<S> Attach<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Attach { inner }
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

impl<S, Req> Service<Req> for Attach<S>
where
    S: Service<Req>,
    Req: Carrier,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> S::Future {
        if let Some(op) = Operation::current() {
            req.attach(op);
        }
        self.inner.call(req)
    }
}

/// Lends the operation a request carries (from an [`AttachLayer`]) to the layers below it.
///
/// Place it directly below the task boundary; see [`AttachLayer`].
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::operation::{AdoptLayer, Operation};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let inner = service_fn(|_: http::Request<()>| async {
///     Ok::<_, Infallible>(Operation::current().is_some())
/// });
/// let mut svc = AdoptLayer::new().layer(inner);
/// // A request that carries no operation: nothing to adopt, the call runs on its own.
/// assert!(!svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap());
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AdoptLayer {
    _priv: (),
}

impl AdoptLayer {
    /// A new layer.
    pub const fn new() -> Self {
        AdoptLayer { _priv: () }
    }
}

impl<S> Layer<S> for AdoptLayer {
    type Service = Adopt<S>;

    fn layer(&self, inner: S) -> Adopt<S> {
        Adopt { inner }
    }
}

/// The service [`AdoptLayer`] makes: lends the operation a request carries to the call below.
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
/// use stormguard::{budget::RetryBudget, class::ToolClass, retry::{HttpReplay, RetryLayer}};
/// use stormguard::operation::{Adopt, AttachLayer, Operation};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let inner = service_fn(|_: http::Request<()>| async {
///     Ok::<_, Infallible>(Operation::current().map(|op| op.class()))
/// });
/// let mut svc = ServiceBuilder::new()
///     .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()).replay(HttpReplay))
///     .layer(AttachLayer::new())
///     .service(Adopt::new(inner));
/// let seen = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(seen, Some(ToolClass::Read));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Adopt<S> {
    inner: S,
}

impl<S> Adopt<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Adopt { inner }
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

impl<S, Req> Service<Req> for Adopt<S>
where
    S: Service<Req>,
    Req: Carrier,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Scoped<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let operation = req.operation();
        let mut ledger = operation.clone().map(|op| Ledger::Shared(op.shared));
        let mut run = operation.as_ref().and_then(|op| op.run.clone());
        let inner = &mut self.inner;
        let future = in_scope(&mut ledger, || in_run(&mut run, || inner.call(req)));
        Scoped::new(future, operation)
    }
}
