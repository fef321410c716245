use super::{Gcra, Quota};
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;

use crate::telemetry::QUOTA_WAITS as WAITS;

/// Holds calls to a [`Quota`], shared by every clone; see the [module docs](super).
///
/// ```
/// use stormguard::quota::{Quota, QuotaLayer};
///
/// let layer = QuotaLayer::new(Quota::per_minute(3_000).burst(20).build().unwrap())
///     .name("model-api");
/// assert_eq!(layer.quota().burst(), 20);
/// ```
#[derive(Clone)]
pub struct QuotaLayer {
    state: Arc<Gcra>,
    quota: Quota,
    name: Cow<'static, str>,
}

impl QuotaLayer {
    /// A layer holding calls to `quota`; its clones share it.
    pub fn new(quota: Quota) -> Self {
        QuotaLayer {
            state: Arc::new(Gcra::new(quota)),
            quota,
            name: Cow::Borrowed("quota"),
        }
    }

    /// The name in metrics (`quota` label) and traces.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// The quota it holds calls to.
    pub fn quota(&self) -> Quota {
        self.quota
    }
}

impl fmt::Debug for QuotaLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaLayer")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .finish()
    }
}

impl<S> Layer<S> for QuotaLayer {
    type Service = QuotaService<S>;

    fn layer(&self, inner: S) -> QuotaService<S> {
        QuotaService {
            inner,
            layer: self.clone(),
            reserved: false,
            sleep: None,
        }
    }
}

/// The service [`QuotaLayer`] makes: ready only when the quota has room for one more call.
///
/// Readiness reserves the room: a service polled ready and then dropped without a call leaves
/// that room unused (as tower's `RateLimit` does).
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::quota::{Quota, QuotaLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let layer = QuotaLayer::new(Quota::per_second(5).build().unwrap());
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
pub struct QuotaService<S> {
    inner: S,
    layer: QuotaLayer,
    /// The next call's slot has come.
    reserved: bool,
    /// Until the reserved slot comes. Boxed: made only when a call has to wait.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S: Clone> Clone for QuotaService<S> {
    fn clone(&self) -> Self {
        // A clone has reserved nothing.
        QuotaService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            reserved: false,
            sleep: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for QuotaService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .field("reserved", &self.reserved)
            .finish()
    }
}

impl<S> QuotaService<S> {
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

impl<S, Req> Service<Req> for QuotaService<S>
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
