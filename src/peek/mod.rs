//! Reading an error response's body before it is classified, without taking it from the
//! caller: [`PeekErrorBodyLayer`] puts what the body says ([`ErrorBody`]) in the response's
//! extensions, where [`ModelApiClassifier`](crate::classify::ModelApiClassifier) reads it, and
//! hands the response on with its whole body still to read ([`PeekedBody`]).
//!
//! It is a middleware, not a classifier: it decides nothing, and goes directly above the HTTP
//! client, below the layers that classify.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use stormguard::peek::{ErrorBody, PeekErrorBodyLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let api = service_fn(|_: ()| async {
//!     let body = Full::new(Bytes::from_static(br#"{"error":{"type":"overloaded_error"}}"#));
//!     Ok::<_, std::io::Error>(http::Response::builder().status(529).body(body).unwrap())
//! });
//! let mut svc = PeekErrorBodyLayer::builder().build()?.layer(api);
//! let res = svc.ready().await?.call(()).await?;
//! assert!(res.extensions().get::<ErrorBody>().unwrap().is("overloaded_error"));
//! # Ok(())
//! # }
//! ```

mod body;
mod error_body;
pub mod future;
mod layer;

pub use body::PeekedBody;
pub use error_body::ErrorBody;
pub use layer::{PeekErrorBodyLayer, PeekErrorBodyLayerBuilder};

use bytes::Bytes;
use future::ResponseFuture;
use http::Response;
use http_body::Body;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_service::Service;

/// The service [`PeekErrorBodyLayer`] makes: an error response comes with its [`ErrorBody`] in
/// its extensions, and its whole body still to read.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::peek::{ErrorBody, PeekErrorBody, PeekErrorBodyLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// const QUOTA: &str = r#"{"error":{"type":"insufficient_quota","message":"You exceeded your quota"}}"#;
/// let api = service_fn(|_: ()| async {
///     let body = Full::new(Bytes::from_static(QUOTA.as_bytes()));
///     Ok::<_, std::io::Error>(http::Response::builder().status(429).body(body).unwrap())
/// });
/// let mut svc: PeekErrorBody<_> = PeekErrorBodyLayer::builder().build()?.layer(api);
/// let res = svc.ready().await?.call(()).await?;
/// assert!(res.extensions().get::<ErrorBody>().unwrap().is("insufficient_quota"));
/// assert_eq!(res.into_body().collect().await?.to_bytes(), QUOTA.as_bytes());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PeekErrorBody<S> {
    inner: S,
    limit: usize,
    timeout: Duration,
}

impl<S> PeekErrorBody<S> {
    pub(super) fn new(inner: S, limit: usize, timeout: Duration) -> Self {
        PeekErrorBody {
            inner,
            limit,
            timeout,
        }
    }

    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use stormguard::peek::PeekErrorBodyLayer;
    ///
    /// struct Client { region: &'static str }
    ///
    /// let layer = PeekErrorBodyLayer::builder().build()?;
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

impl<S, Req, B> Service<Req> for PeekErrorBody<S>
where
    S: Service<Req, Response = Response<B>>,
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<PeekedBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.limit, self.timeout)
    }
}
