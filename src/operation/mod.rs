//! The logical operation: one ledger of attempts shared by every nested [`Retry`] layer.
//!
//! The outermost [`Retry`] that a request passes through opens an operation; every stormguard
//! [`Retry`] it reaches while calling or polling its inner service (on the same task, whatever
//! the request types in between) joins it, so the attempts of all nested layers together never
//! exceed the operation's `max_attempts`. A layer that gives up closes the operation: no layer
//! above it retries it again.
//!
//! **The operation travels with the request.** On a request type that can carry it (an
//! `http::Request` or a `tonic::Request`, in its extensions; your own type through
//! [`retry::Request::attach`](crate::retry::Request::attach)) the outermost layer puts it on the
//! request, so a layer behind a `tower::buffer::Buffer` or in a spawned task joins it with no
//! help: one allocation for the ledger and three for the extensions, per operation, whatever the
//! depth. On one task, any request type works: the layer lends the ledger to the layers below
//! it through a thread-local slot while it calls or polls them (no allocation), and a nested
//! layer whose request can carry it puts it on that request for the layers further down.
//!
//! Where the request cannot carry it (a plain value, a `reqwest::Request`, whose extensions
//! reqwest keeps private) and a boundary lies between two layers, carry it by hand:
//!
//! - **A spawned task.** Wrap the future you spawn with [`carry`]: it takes the current operation
//!   along and lends it to the spawned future's polls.
//! - **A `Buffer`** (or any layer that hands requests to a worker task): put an [`AttachLayer`]
//!   above it and an [`AdoptLayer`] below it, for a request type that implements [`Carrier`].
//!
//! Without them a layer behind the boundary opens an operation of its own: an unkeyed write
//! behind a client layer configured for reads is then sent up to 3 times.

//! A retrying layer made for a *different* logical operation inside one (an auth-token refresh
//! while a tool call runs) declares itself with
//! [`RetryLayer::own_operation`](crate::retry::RetryLayer::own_operation), so its retries do not
//! spend the caller's attempts.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use stormguard::operation::{carry, Operation};
//!
//! // Outside any stormguard layer there is no current operation.
//! assert!(Operation::current().is_none());
//! // `carry` is then a no-op wrapper.
//! let handle = tokio::spawn(carry(async { 1 + 1 }));
//! assert_eq!(handle.await.unwrap(), 2);
//! # }
//! ```
//!
//! [`Retry`]: crate::retry::Retry

mod layer;
pub(crate) mod ledger;

pub use layer::{Adopt, AdoptLayer, Attach, AttachLayer, Carrier};

use crate::budget::{self, scope::in_run, RetryBudget};
use crate::class::ToolClass;
use ledger::{in_scope, lock, share_current, Ledger, OpState};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// A handle to a logical operation that can travel to another task.
///
/// Get one with [`Operation::current`] inside a stormguard layer; lend it to a future with
/// [`Operation::scope`] (or use [`carry`], which does both).
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::{budget::RetryBudget, class::ToolClass, operation::Operation, retry::RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let tool = service_fn(|_: u32| async {
///     let op = Operation::current().expect("inside a stormguard Retry");
///     Ok::<_, Infallible>((op.class(), op.attempts(), op.max_attempts()))
/// });
/// let mut svc = RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default()).layer(tool);
/// let (class, attempts, max) = svc.ready().await.unwrap().call(1).await.unwrap();
/// assert_eq!(class, ToolClass::KeyedWrite);
/// assert_eq!(attempts, 1);
/// assert_eq!(max, ToolClass::KeyedWrite.policy().max_attempts());
/// assert!(Operation::current().is_none()); // outside, nothing is installed
/// # }
/// ```
#[derive(Clone)]
pub struct Operation {
    shared: Arc<Mutex<OpState>>,
    /// The agent run whose [scope](crate::budget::RetryBudget::scope) the operation was opened
    /// in, if any: it travels with the operation.
    run: Option<RetryBudget>,
}

impl Operation {
    /// A new operation in `state`, on the heap so it can travel with a request.
    /// It acts for the agent run whose scope it is opened in, if any.
    pub(crate) fn open(state: OpState) -> Operation {
        Operation {
            shared: Arc::new(Mutex::new(state)),
            run: budget::scope::current(),
        }
    }

    /// The operation a future's ledger holds, if it is on the heap, acting for `run`.
    pub(crate) fn of(ledger: &Ledger, run: Option<RetryBudget>) -> Option<Operation> {
        match ledger {
            Ledger::Shared(shared) => Some(Operation {
                shared: shared.clone(),
                run,
            }),
            Ledger::Inline(_) => None,
        }
    }

    /// The agent run it acts for, if any.
    pub(crate) fn run(&self) -> Option<RetryBudget> {
        self.run.clone()
    }

    /// Its ledger, for a future that holds it.
    pub(crate) fn ledger(&self) -> Ledger {
        Ledger::Shared(self.shared.clone())
    }

    /// Runs `f` on its state.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut OpState) -> R) -> R {
        f(&mut lock(&self.shared))
    }

    /// The operation installed on this thread, if a stormguard `Retry` is running here.
    ///
    /// The first call moves the ledger to the heap (one allocation) so it can be shared; the
    /// layers already running keep using it.
    pub fn current() -> Option<Operation> {
        share_current().map(|shared| Operation {
            shared,
            run: budget::scope::current(),
        })
    }

    /// Lends this operation to `future`'s polls: stormguard layers inside it join the operation
    /// (and, if it was opened in an agent run's [scope](crate::budget::RetryBudget::scope), act
    /// for that run).
    pub fn scope<F: Future>(self, future: F) -> Scoped<F> {
        Scoped {
            future,
            ledger: Some(Ledger::Shared(self.shared)),
            run: self.run,
        }
    }

    /// Attempts made so far by all layers.
    pub fn attempts(&self) -> u32 {
        lock(&self.shared).attempts()
    }

    /// The cap on attempts.
    pub fn max_attempts(&self) -> u32 {
        lock(&self.shared).max_attempts()
    }

    /// The strictest tool class declared for the operation.
    pub fn class(&self) -> ToolClass {
        lock(&self.shared).class()
    }

    /// Whether a layer has given up on the operation.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared).closed().is_some()
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = *lock(&self.shared);
        f.debug_struct("Operation")
            .field("attempts", &state.attempts())
            .field("max_attempts", &state.max_attempts())
            .field("class", &state.class())
            .field("keyed", &state.keyed())
            .field("closed", &state.closed())
            .field("in_run", &self.run.is_some())
            .finish()
    }
}

/// Takes the current operation (if any) along with `future`, typically one you `tokio::spawn`,
/// and the agent run whose [scope](crate::budget::RetryBudget::scope) it runs in (if any).
///
/// ```
/// # use stormguard::operation::carry;
/// # async fn inner_call() {}
/// # async fn example() {
/// // inside a tool that a stormguard `Retry` wraps:
/// let handle = tokio::spawn(carry(inner_call()));
/// # }
/// ```
pub fn carry<F: Future>(future: F) -> Scoped<F> {
    Scoped {
        future,
        ledger: share_current().map(Ledger::Shared),
        run: budget::scope::current(),
    }
}

pin_project! {
    /// A future that runs with an operation lent to it; see [`carry`].
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    /// use stormguard::operation::{carry, Operation, Scoped};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tool = service_fn(|_: u32| async {
    ///     // The inner call runs on another task: the operation goes with it.
    ///     let inner: Scoped<_> = carry(async { Operation::current().is_some() });
    ///     Ok::<_, Infallible>(tokio::spawn(inner).await.unwrap())
    /// });
    /// let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(tool);
    /// assert!(svc.ready().await.unwrap().call(1).await.unwrap());
    /// # }
    /// ```
    pub struct Scoped<F> {
        #[pin]
        future: F,
        ledger: Option<Ledger>,
        run: Option<RetryBudget>,
    }
}

impl<F> Scoped<F> {
    pub(crate) fn new(future: F, operation: Option<Operation>) -> Self {
        let (ledger, run) = match operation {
            Some(op) => (Some(Ledger::Shared(op.shared)), op.run),
            None => (None, None),
        };
        Scoped {
            future,
            ledger,
            run,
        }
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        let run = this.run;
        in_scope(this.ledger, || in_run(run, || future.poll(cx)))
    }
}

impl<F> fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped")
            .field("carries_operation", &self.ledger.is_some())
            .field("carries_run", &self.run.is_some())
            .finish()
    }
}
