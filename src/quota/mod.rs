//! A client-side rate limit shared by every clone: keep under a provider's quota instead of
//! learning it from `429`s.
//!
//! A model API that allows 50 requests a second answers the 51st with `429` and `Retry-After`.
//! Retrying politely (as [`Retry`](crate::retry::Retry) does) keeps the storm down, but every
//! `429` is still a wasted request and a delay. [`QuotaLayer`] spaces calls out before they are
//! sent: `poll_ready` waits until the quota has room, so a caller that polls readiness (as
//! `Retry` does before every attempt, and `ServiceExt::ready` does) never sends over the limit.
//!
//! The names are tower's `limit::rate`: the config is a [`Rate`] (built with
//! [`Rate::per_second`]), [`QuotaLayer`] holds it, and the service it makes is a [`Quota`].
//!
//! The limit is GCRA (the generic cell rate algorithm, as in `governor`): one atomic word holds
//! the theoretical arrival time of the next call, so a call within the quota takes one
//! compare-and-swap and no lock, and a burst of up to `burst` calls goes through at once. Time is
//! `tokio::time`, so tests run on a paused clock. Every clone of the layer, and every service it
//! makes, shares the one quota: give the same layer to every path that calls one provider.
//!
//! A caller that has to wait holds its place in line (first come, first served) and wakes once,
//! at its slot; a caller dropped while waiting leaves its slot unused. Readiness reserves the
//! room before the inner service is ready, so put the layer directly above the transport (not
//! above a `Buffer` or a concurrency limit that could hold reserved calls and release them
//! together). A retry's wait for the quota counts against the operation deadline of
//! [`Retry`](crate::retry::Retry): a retry still waiting when the deadline passes ends as
//! `deadline_exceeded`. The first attempt's wait happens before the `Retry` is called (in its
//! `poll_ready`) and starts the deadline's clock there: if the wait outlasts the deadline, the
//! first attempt is not sent either (`deadline_exceeded`, its slot unused). A
//! [`KeyedQuota`] waits inside its call (the key is in the request) and checks the deadline
//! after its wait the same way. A wait counts from when it begins, so bound the whole call with
//! tower's `Timeout` if you need a hard limit.
//!
//! Put it below the retrying layers, so retries wait for the quota too:
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
//! use stormguard::quota::{QuotaLayer, Rate};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // One budget and one quota for the whole process, made once; every stack gets clones of the
//! // same handles. (A `RetryBudget::default()` per stack, or per call, is a budget each: in an
//! // outage every one of them pays for its own retries.)
//! let budget = RetryBudget::default();
//! let quota = QuotaLayer::new(Rate::per_second(10).burst(2).build().unwrap());
//! let model = service_fn(|prompt: &'static str| async move { Ok::<_, std::io::Error>(prompt.len()) });
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
//!     .layer(quota.clone())
//!     .service(model);
//! let start = tokio::time::Instant::now();
//! for _ in 0..4 {
//!     svc.ready().await.unwrap().call("hello").await.unwrap();
//! }
//! // Two at once (the burst), then one every 100 ms.
//! assert_eq!(start.elapsed(), Duration::from_millis(200));
//! # }
//! ```
//!
//! For a quota per tenant, run or model, weighted by each call's cost (tokens per minute), see
//! [`KeyedQuotaLayer`].
//!
//! Metrics: `stormguard_quota_waits_total` (label `quota`) counts the calls that had to wait.

pub mod future;
mod gcra;
mod keyed;
pub(crate) mod keys;
mod layer;
mod rate;
pub(crate) mod wait;

pub use keyed::{KeyedQuota, KeyedQuotaLayer, KeyedQuotaLayerBuilder};
pub use layer::QuotaLayer;
pub use rate::{Rate, RateBuilder};

use crate::telemetry::QUOTA_WAITS as WAITS;
use gcra::Gcra;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_service::Service;

/// The service [`QuotaLayer`] makes: ready only when the quota has room for one more call.
///
/// Readiness reserves the room: a service polled ready and then dropped without a call leaves
/// that room unused (as tower's `RateLimit` does).
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::quota::{QuotaLayer, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let layer = QuotaLayer::new(Rate::per_second(5).build().unwrap());
/// let echo = service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n) });
/// // Two clones, one quota: together they make one call every 200 ms.
/// let (mut a, mut b) = (layer.layer(echo), layer.layer(echo));
/// let start = tokio::time::Instant::now();
/// a.ready().await.unwrap().call(1).await.unwrap();
/// b.ready().await.unwrap().call(2).await.unwrap();
/// a.ready().await.unwrap().call(3).await.unwrap();
/// assert_eq!(start.elapsed(), Duration::from_millis(400));
/// # }
/// ```
pub struct Quota<S> {
    inner: S,
    layer: QuotaLayer,
    /// The next call's slot has come.
    reserved: bool,
    /// Until the reserved slot comes. Boxed: made only when a call has to wait.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S: Clone> Clone for Quota<S> {
    fn clone(&self) -> Self {
        // A clone has reserved nothing.
        Quota {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            reserved: false,
            sleep: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Quota<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .field("reserved", &self.reserved)
            .finish()
    }
}

impl<S> Quota<S> {
    pub(super) fn new(inner: S, layer: QuotaLayer) -> Self {
        Quota {
            inner,
            layer,
            reserved: false,
            sleep: None,
        }
    }

    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use stormguard::quota::{QuotaLayer, Rate};
    ///
    /// struct Client { region: &'static str }
    ///
    /// let layer = QuotaLayer::new(Rate::per_second(5).build().unwrap());
    /// let mut svc = layer.layer(Client { region: "eu" });
    /// svc.get_mut().region = "us";
    /// assert_eq!(svc.get_ref().region, "us");
    /// let client: Client = svc.into_inner();
    /// assert_eq!(client.region, "us");
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

impl<S, Req> Service<Req> for Quota<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.reserved {
            if self.sleep.is_none() {
                let wait = self.layer.state.reserve();
                if !wait.is_zero() {
                    metrics::counter!(WAITS, "quota" => self.layer.name.clone()).increment(1);
                    tracing::debug!(
                        quota = %self.layer.name,
                        wait_ms = wait.as_millis() as u64,
                        "waiting for this call's slot in the quota"
                    );
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            self.reserved = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> S::Future {
        self.reserved = false;
        self.inner.call(req)
    }
}
