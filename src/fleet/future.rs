//! The fleet's futures: [`FleetQuotaFuture`], the future of [`FleetQuota`](super::FleetQuota).
//!
//! ```
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use stormguard::fleet::{future::FleetQuotaFuture, Fleet, FleetQuotaLayer};
//! use stormguard::quota::Rate;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Nothing listens on port 1: the fleet is down and each call is held by the fallback rate.
//! let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap();
//! let (rate, fallback) = (Rate::per_second(100).build().unwrap(), Rate::per_second(10).build().unwrap());
//! let quota = FleetQuotaLayer::builder(&fleet, "api", rate, fallback, |_: &u32| ("org", 1))
//!     .build()
//!     .unwrap();
//! let mut svc = quota.layer(service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n) }));
//! let call: FleetQuotaFuture<_, u32> = svc.ready().await.unwrap().call(7);
//! assert_eq!(call.await.unwrap(), 7);
//! # }
//! ```

use crate::error::BoxError;
use crate::quota::future::KeyedQuotaFuture;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_service::Service;

pub(super) type Reserve = Pin<Box<dyn Future<Output = Option<Pin<Box<Sleep>>>> + Send>>;

pin_project! {
    /// The future of [`FleetQuota`]: the reservation (in Redis, or locally while the fleet is
    /// down), then what a [`KeyedQuotaFuture`] does: the wait for the slot, the inner service's
    /// readiness, the call.
    pub struct FleetQuotaFuture<S: Service<Req>, Req> {
        #[pin]
        pub(super) state: State<S, Req>,
    }
}

pin_project! {
    #[project = Proj]
    pub(super) enum State<S: Service<Req>, Req> {
        Reserving { reserve: Reserve, service: Option<S>, request: Option<Req> },
        Then { #[pin] inner: KeyedQuotaFuture<S, Req> },
    }
}

impl<S, Req> Future for FleetQuotaFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                Proj::Reserving {
                    reserve,
                    service,
                    request,
                } => {
                    let sleep = ready!(reserve.as_mut().poll(cx));
                    let (Some(service), Some(request)) = (service.take(), request.take()) else {
                        panic!("polled after completion");
                    };
                    let inner = KeyedQuotaFuture::waiting(sleep, service, request);
                    this.state.set(State::Then { inner });
                }
                Proj::Then { inner } => return inner.poll(cx),
            }
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for FleetQuotaFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetQuotaFuture").finish_non_exhaustive()
    }
}
