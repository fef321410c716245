//! The quota's futures. [`Quota`](super::Quota) returns its inner service's future as it is:
//! it waits in `poll_ready`, as tower's `RateLimit` does. [`KeyedQuotaFuture`] is the future of
//! [`KeyedQuota`](super::KeyedQuota), which waits in the call (the key is in the request); its
//! example shows the wait on a paused clock.

use crate::error::{BoxError, ToolError};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_service::Service;

pin_project! {
    /// The future of [`KeyedQuota`](super::KeyedQuota): the wait for the key's room, the inner
    /// service's readiness, then the call. A call that costs more than the burst fails at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::error::{ErrorCode, ToolError};
    /// use stormguard::quota::future::KeyedQuotaFuture;
    /// use stormguard::quota::{KeyedQuotaLayer, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // 10 tokens a second per tenant, 10 at once.
    /// let rate = Rate::per_second(10).burst(10).build().unwrap();
    /// let model = service_fn(|(_, tokens): (&'static str, u32)| async move { Ok::<_, std::io::Error>(tokens) });
    /// let mut svc = KeyedQuotaLayer::new(rate, |&(tenant, tokens): &(&'static str, u32)| (tenant, tokens)).layer(model);
    /// let start = tokio::time::Instant::now();
    /// svc.ready().await.unwrap().call(("a", 10)).await.unwrap();
    /// let future: KeyedQuotaFuture<_, (&'static str, u32)> = svc.ready().await.unwrap().call(("a", 5));
    /// assert_eq!(future.await.unwrap(), 5);
    /// assert_eq!(start.elapsed(), Duration::from_millis(500)); // waited for 5 tokens of refill
    /// let err = svc.ready().await.unwrap().call(("a", 11)).await.unwrap_err();
    /// assert_eq!(err.downcast_ref::<ToolError>().unwrap().code(), ErrorCode::InvalidArgument);
    /// # }
    /// ```
    pub struct KeyedQuotaFuture<S: Service<Req>, Req> {
        #[pin]
        state: KeyedState<S, Req>,
    }
}

pin_project! {
    #[project = KeyedProj]
    enum KeyedState<S: Service<Req>, Req> {
        Failed { error: Option<ToolError> },
        Waiting { sleep: Option<Pin<Box<Sleep>>>, service: S, request: Option<Req> },
        Calling { #[pin] future: S::Future },
    }
}

impl<S: Service<Req>, Req> KeyedQuotaFuture<S, Req> {
    /// Fails at once with `error`.
    pub(crate) fn failed(error: ToolError) -> Self {
        KeyedQuotaFuture {
            state: KeyedState::Failed { error: Some(error) },
        }
    }

    /// Waits for `sleep` (if any), then for `service` to be ready, then calls it with `request`.
    pub(crate) fn waiting(sleep: Option<Pin<Box<Sleep>>>, service: S, request: Req) -> Self {
        KeyedQuotaFuture {
            state: KeyedState::Waiting {
                sleep,
                service,
                request: Some(request),
            },
        }
    }
}

impl<S, Req> Future for KeyedQuotaFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                KeyedProj::Failed { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(Box::new(error)));
                }
                KeyedProj::Waiting {
                    sleep,
                    service,
                    request,
                } => {
                    if let Some(s) = sleep.as_mut() {
                        ready!(s.as_mut().poll(cx));
                        *sleep = None;
                    }
                    ready!(service.poll_ready(cx)).map_err(Into::into)?;
                    // The wait may have outlasted the operation's deadline: then nothing is sent.
                    if crate::operation::ledger::current_deadline_passed() {
                        let err = crate::error::hint::not_sent_by_deadline();
                        return Poll::Ready(Err(Box::new(err)));
                    }
                    let req = request.take().expect("polled after completion");
                    let future = service.call(req);
                    this.state.set(KeyedState::Calling { future });
                }
                KeyedProj::Calling { future } => {
                    return future.poll(cx).map_err(Into::into);
                }
            }
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for KeyedQuotaFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQuotaFuture").finish_non_exhaustive()
    }
}
