//! Hedged reads: a second attempt after a delay, inside the operation's attempts and the budget.
//!
//! [`Hedge`] sends a call, and if no answer has come after the delay (fixed, or a quantile of
//! recent latencies), sends a copy; the first success wins and the other attempt is dropped
//! (cancelled). Unlike tower's `Hedge`, the second attempt is not free:
//!
//! - **Reads only.** Under a stormguard [`Retry`](crate::retry::Retry) the hedge reads the
//!   operation's class from its ledger: any class but [`ToolClass::Read`] (a nested layer that
//!   declared a write makes the whole operation one) is never hedged, and its request is not
//!   even copied.
//! - **Inside the operation's attempts.** The hedge is an attempt in the operation's ledger:
//!   with `max_attempts` 3, a hedged call that fails twice leaves the `Retry` above one more
//!   attempt, never a fourth.
//! - **Only where the operation is seen.** Without a stormguard `Retry` above it on the same
//!   task, the hedge cannot know the call's class, and a write must never go twice: nothing is
//!   hedged (counted as `no_operation`). Across a `tokio::spawn`, wrap the spawned future in
//!   [`carry`](crate::operation::carry); across a `Buffer`, put
//!   [`AttachLayer`](crate::operation::AttachLayer) above it and
//!   [`AdoptLayer`](crate::operation::AdoptLayer) below.
//! - **From the same budget.** Each hedge withdraws one retry from the [`RetryBudget`] the
//!   layers share; when it refuses, the first attempt goes on alone. In an outage, where the
//!   budget is spent, hedging stops with the retries.
//!
//! The decision (closed operation, class, attempts, budget, in that order) is a pure function
//! tested against the rule above. A failure before the hedge went is the answer at once; a
//! failure while the other attempt runs waits for it.
//!
//! ```text
//! Retry(Read) ──► Hedge ──► client
//!                   │ t = 0      attempt 1 ─────────────────────────► (slow)     dropped
//!                   │ t = delay  attempt 2 (ledger +1, budget -1) ─► answer ──► wins
//! ```
//!
//! # The delay
//!
//! [`HedgeLayer::fixed`] waits a set time; [`HedgeLayer::percentile`] waits the `q` quantile
//! of the last 512 reads' latencies (nearest rank, recomputed every 32 answers, after at
//! least `min_samples`; no hedge before). Only a call that could be hedged (a read, under a
//! `Retry` on its task) is timed and recorded: a write's latency says nothing of the reads, and
//! a call that can never be hedged reads no clock. Recording an answer is two atomic operations
//! and the recompute copies the ring to the stack: no lock and no allocation on any call. The
//! request is copied (with the layer's [`Replay`]) when the call is made and a hedge is possible,
//! as tower's `Hedge` does.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, hedge::HedgeLayer, retry::RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // The first attempt of every call hangs for a second; the second answers in 10 ms.
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let search = service_fn(move |q: u32| {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         let wait = if n % 2 == 0 { 1_000 } else { 10 };
//!         tokio::time::sleep(Duration::from_millis(wait)).await;
//!         Ok::<_, std::io::Error>(q)
//!     }
//! });
//! let budget = RetryBudget::default();
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
//!     .layer(HedgeLayer::fixed(budget, Duration::from_millis(50)).build().unwrap())
//!     .service(search);
//!
//! let start = tokio::time::Instant::now();
//! assert_eq!(svc.ready().await.unwrap().call(7).await.unwrap(), 7);
//! assert_eq!(start.elapsed(), Duration::from_millis(60)); // the hedge answered
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```
//!
//! # Where it belongs
//!
//! Below the innermost [`Retry`](crate::retry::Retry) (so the ledger it joins is the
//! operation's) and above the breaker and the client. Not below a
//! [`ReceiptGuardLayer`](crate::receipt::ReceiptGuardLayer): receipts are for writes, which are never
//! hedged.
//!
//! # Observability
//!
//! `stormguard_hedge_total` (counter, labels `layer` and `event`: `sent`, `first_won`,
//! `hedge_won`, and why a hedge did not go: `closed`, `not_read`, `attempts_spent`, `budget`,
//! `no_operation`, `not_ready`) and a DEBUG event for each hedge decision.

mod decide;
pub mod future;
use future::ResponseFuture;
mod latency;
mod layer;

pub use layer::{HedgeLayer, HedgeLayerBuilder};

use crate::budget::RetryBudget;
use crate::class::ToolClass;
use crate::classify::{Classify, DefaultClassifier};
use crate::operation::ledger::with_current;
use crate::retry::{DefaultReplay, Replay};
use future::Spare;
use latency::Latencies;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower_service::Service;

/// What every service of one [`HedgeLayer`] hedges with: the budget, the delay (fixed, or from
/// the latency record), the classifier, the replay and the name.
pub(crate) struct HedgeState<C, R> {
    budget: RetryBudget,
    fixed: Option<Duration>,
    latencies: Latencies,
    classifier: C,
    replay: R,
    name: Cow<'static, str>,
}

impl<C, R> HedgeState<C, R> {
    #[cold]
    fn count(&self, event: &'static str) {
        metrics::counter!("stormguard_hedge_total", "layer" => self.name.clone(), "event" => event)
            .increment(1);
    }
}

/// Hedges reads: see the [module docs](self) (whose example hedges a slow read). Anything but a
/// read goes once, however slow:
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// use std::time::Duration;
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
/// use stormguard::{budget::RetryBudget, class::ToolClass, hedge::{Hedge, HedgeLayer}, retry::RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let calls = Arc::new(AtomicU32::new(0));
/// let counter = calls.clone();
/// let slow = service_fn(move |n: u32| {
///     counter.fetch_add(1, Ordering::SeqCst);
///     async move {
///         tokio::time::sleep(Duration::from_millis(500)).await;
///         Ok::<_, std::io::Error>(n)
///     }
/// });
/// let budget = RetryBudget::default();
/// let hedge = HedgeLayer::fixed(budget.clone(), Duration::from_millis(50)).build().unwrap();
/// let mut write = ServiceBuilder::new()
///     .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget))
///     .layer(hedge)
///     .service(slow);
/// let _: &Hedge<_> = write.get_ref();
/// assert_eq!(write.ready().await.unwrap().call(1).await.unwrap(), 1);
/// assert_eq!(calls.load(Ordering::SeqCst), 1); // a write is never sent twice
/// # }
/// ```
pub struct Hedge<S, C = DefaultClassifier, R = DefaultReplay> {
    inner: S,
    shared: Arc<HedgeState<C, R>>,
}

impl<S: Clone, C, R> Clone for Hedge<S, C, R> {
    fn clone(&self) -> Self {
        Hedge {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, C, R> fmt::Debug for Hedge<S, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<S, C, R> Hedge<S, C, R> {
    /// The inner service.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::Layer;
    /// use stormguard::{budget::RetryBudget, hedge::HedgeLayer};
    ///
    /// struct Client { region: &'static str }
    ///
    /// let layer = HedgeLayer::fixed(RetryBudget::default(), Duration::from_millis(50)).build()?;
    /// let mut svc = layer.layer(Client { region: "eu" });
    /// svc.get_mut().region = "us";
    /// assert_eq!(svc.get_ref().region, "us");
    /// let client: Client = svc.into_inner();
    /// assert_eq!(client.region, "us");
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
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

impl<S, C, R, Req> Service<Req> for Hedge<S, C, R>
where
    S: Service<Req> + Clone,
    C: Classify<S::Response, S::Error>,
    R: Replay<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, C, R, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        // Copy the request only if a hedge may go: a delay is known, and the operation is in
        // sight and a read (without one, the class is unknown: never hedged).
        let operation = shared.replay.operation(&req);
        let is_read = |op: &mut crate::operation::ledger::OpState| op.class() == ToolClass::Read;
        let read = match &operation {
            Some(op) => op.with(is_read),
            None => with_current(is_read).unwrap_or(false),
        };
        if !read {
            // Never hedged: no clock read, no latency recorded (a write's or an unseen call's
            // latency says nothing of the reads the percentile is for).
            return ResponseFuture::new(self.inner.call(req), None, shared.clone(), None);
        }
        let started = Instant::now();
        let hedge = shared
            .fixed
            .or_else(|| shared.latencies.delay())
            .filter(|_| read)
            .and_then(|delay| {
                let request = shared.replay.replay(&req)?;
                Some((
                    Spare {
                        service: self.inner.clone(),
                        request,
                        operation,
                    },
                    started + delay,
                ))
            });
        let first = self.inner.call(req);
        // A fixed delay needs no record of latencies: the answer's time is not read.
        let timed = shared.fixed.is_none().then_some(started);
        ResponseFuture::new(first, hedge, shared.clone(), timed)
    }
}
