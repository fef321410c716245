//! Reading an error response's body before it is classified, without taking it from the caller:
//! [`PeekErrorBodyLayer`].

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

pub use super::error_body::ErrorBody;

/// The most a peek may read (1 MiB).
const MAX_LIMIT: usize = 1 << 20;

/// Reads up to `limit` bytes of a non-2xx response's body (for at most `timeout`), parses it as
/// an [`ErrorBody`] into the response's extensions, and hands the response on with the same body:
/// the bytes read come first, then the rest of the original stream. A 2xx response passes
/// through untouched and unread (no allocation, no copy).
///
/// Put it directly above the HTTP client, below the layers that classify (a `Retry`, a
/// breaker with [`ModelApiClassifier`](super::ModelApiClassifier)).
///
/// Built with [`PeekErrorBodyLayer::builder`]: by default it reads at most 16 KiB, for at most
/// 2 s (a model API's error body is well under 1 KiB).
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::PeekErrorBodyLayer;
///
/// let peek = PeekErrorBodyLayer::builder().limit(16 * 1024).timeout(Duration::from_secs(2)).build()?;
/// assert_eq!(peek.limit(), 16 * 1024);
/// assert_eq!(PeekErrorBodyLayer::builder().build()?.timeout(), Duration::from_secs(2));
/// assert_eq!(PeekErrorBodyLayer::builder().limit(0).build().unwrap_err().field(), "limit");
/// assert_eq!(PeekErrorBodyLayer::builder().timeout(Duration::ZERO).build().unwrap_err().field(), "timeout");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeekErrorBodyLayer {
    limit: usize,
    timeout: Duration,
}

impl PeekErrorBodyLayer {
    /// A builder with the defaults: at most 16 KiB, for at most 2 s.
    pub fn builder() -> PeekErrorBodyLayerBuilder {
        PeekErrorBodyLayerBuilder {
            limit: 16 * 1024,
            timeout: Duration::from_secs(2),
        }
    }

    /// The most bytes of an error body it reads.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The longest it waits for an error body.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Builds a [`PeekErrorBodyLayer`]; [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::{PeekErrorBodyLayer, PeekErrorBodyLayerBuilder};
///
/// let builder: PeekErrorBodyLayerBuilder = PeekErrorBodyLayer::builder().limit(4 * 1024);
/// let peek = builder.timeout(Duration::from_millis(500)).build()?;
/// assert_eq!((peek.limit(), peek.timeout()), (4 * 1024, Duration::from_millis(500)));
/// // More than 1 MiB is refused.
/// assert_eq!(PeekErrorBodyLayer::builder().limit(2 << 20).build().unwrap_err().field(), "limit");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct PeekErrorBodyLayerBuilder {
    limit: usize,
    timeout: Duration,
}

impl PeekErrorBodyLayerBuilder {
    /// Reads at most `limit` bytes of an error body (1 B to 1 MiB; default 16 KiB).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Waits at most `timeout` for them (1 ms to 1 min; default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The layer, or the setting that cannot work.
    pub fn build(self) -> Result<PeekErrorBodyLayer, crate::error::ConfigError> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(crate::error::ConfigError::new(
                "limit",
                "must be between 1 byte and 1 MiB",
            ));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(60) {
            return Err(crate::error::ConfigError::new(
                "timeout",
                "must be between 1 ms and 1 minute",
            ));
        }
        Ok(PeekErrorBodyLayer {
            limit: self.limit,
            timeout: self.timeout,
        })
    }
}

impl<S> Layer<S> for PeekErrorBodyLayer {
    type Service = PeekErrorBody<S>;

    fn layer(&self, inner: S) -> PeekErrorBody<S> {
        PeekErrorBody {
            inner,
            limit: self.limit,
            timeout: self.timeout,
        }
    }
}

/// The service [`PeekErrorBodyLayer`] makes: an error response comes with its [`ErrorBody`] in
/// its extensions, and its whole body still to read.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::classify::{ErrorBody, PeekErrorBody, PeekErrorBodyLayer};
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
    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use stormguard::classify::PeekErrorBodyLayer;
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
    type Future = PeekFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        PeekFuture {
            state: PeekState::Calling {
                future: self.inner.call(req),
            },
            limit: self.limit,
            timeout: self.timeout,
        }
    }
}

pin_project! {
    /// The future of [`PeekErrorBody`]: the inner call, then (for a 4xx or 5xx answer) the
    /// read of its error body, bounded by the layer's limit and timeout.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::classify::{ErrorBody, PeekErrorBodyLayer, PeekFuture};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = service_fn(|_: ()| async {
    ///     Ok::<_, std::io::Error>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
    /// });
    /// let mut svc = PeekErrorBodyLayer::builder().build()?.layer(api);
    /// let future: PeekFuture<_, Full<Bytes>> = svc.ready().await?.call(());
    /// let res = future.await?;
    /// // A 2xx answer is handed on unread.
    /// assert!(res.extensions().get::<ErrorBody>().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub struct PeekFuture<F, B: Body> {
        #[pin]
        state: PeekState<F, B>,
        limit: usize,
        timeout: Duration,
    }
}

pin_project! {
    #[project = PeekProj]
    enum PeekState<F, B: Body> {
        Calling { #[pin] future: F },
        Reading {
            head: Option<(http::response::Parts, B)>,
            frames: VecDeque<Result<Frame<Bytes>, B::Error>>,
            read: Vec<u8>,
            ended: bool,
            #[pin]
            sleep: tokio::time::Sleep,
        },
    }
}

impl<F, B, E> Future for PeekFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Unpin,
{
    type Output = Result<Response<PeekedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                PeekProj::Calling { future } => {
                    let resp = ready!(future.poll(cx))?;
                    if !peekable(resp.status()) {
                        return Poll::Ready(Ok(resp.map(PeekedBody::passthrough)));
                    }
                    let (parts, body) = resp.into_parts();
                    this.state.set(PeekState::Reading {
                        head: Some((parts, body)),
                        frames: VecDeque::new(),
                        read: Vec::new(),
                        ended: false,
                        sleep: tokio::time::sleep(*this.timeout),
                    });
                }
                PeekProj::Reading {
                    head,
                    frames,
                    read,
                    ended,
                    sleep,
                } => {
                    let (_, body) = head.as_mut().expect("polled after completion");
                    let mut truncated = false;
                    while !*ended && read.len() < *this.limit {
                        match Pin::new(&mut *body).poll_frame(cx) {
                            Poll::Ready(Some(Ok(frame))) => {
                                if let Some(data) = frame.data_ref() {
                                    let room = *this.limit - read.len();
                                    read.extend_from_slice(&data[..data.len().min(room)]);
                                    // A frame cut at the limit: the body is longer than it.
                                    truncated |= data.len() > room;
                                }
                                frames.push_back(Ok(frame));
                            }
                            // The caller sees the error where it came, when it reads the body.
                            Poll::Ready(Some(Err(e))) => {
                                frames.push_back(Err(e));
                                *ended = true;
                                truncated = true;
                            }
                            Poll::Ready(None) => *ended = true,
                            Poll::Pending => {
                                if sleep.poll(cx).is_pending() {
                                    return Poll::Pending;
                                }
                                truncated = true;
                                break;
                            }
                        }
                    }
                    if read.len() >= *this.limit && !*ended {
                        // Exactly the limit, or more? One more look, without waiting.
                        match Pin::new(&mut *body).poll_frame(cx) {
                            Poll::Ready(None) => *ended = true,
                            Poll::Ready(Some(Ok(frame))) => {
                                frames.push_back(Ok(frame));
                                truncated = true;
                            }
                            Poll::Ready(Some(Err(e))) => {
                                frames.push_back(Err(e));
                                *ended = true;
                                truncated = true;
                            }
                            Poll::Pending => truncated = true,
                        }
                    }
                    let (mut parts, body) = head.take().expect("polled after completion");
                    let mut parsed = ErrorBody::parse(read);
                    parsed.truncated = truncated;
                    parts.extensions.insert(parsed);
                    // A body that ended (or failed) during the peek is not polled again.
                    let rest = (!*ended).then_some(body);
                    let body = PeekedBody::replayed(std::mem::take(frames), rest);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
            }
        }
    }
}

impl<F, B: Body> fmt::Debug for PeekFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeekFuture").finish_non_exhaustive()
    }
}

/// Error bodies are read: 4xx and 5xx.
fn peekable(status: StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}

pin_project! {
    /// A response body after [`PeekErrorBody`]: the original one, or the frames read for the
    /// peek followed by the rest of the original (nothing is lost or reordered; an error the
    /// original body returned during the peek is returned in its place).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::classify::{ErrorBody, PeekErrorBodyLayer, PeekedBody};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = service_fn(|_: ()| async {
    ///     let body = Full::new(Bytes::from_static(b"upstream overloaded"));
    ///     Ok::<_, std::io::Error>(http::Response::builder().status(503).body(body).unwrap())
    /// });
    /// // Peek at 8 bytes only: the body as read so far, then the rest.
    /// let mut svc = PeekErrorBodyLayer::builder().limit(8).build()?.layer(api);
    /// let res = svc.ready().await?.call(()).await?;
    /// assert_eq!(res.extensions().get::<ErrorBody>().unwrap().kind, None); // not JSON
    /// let body: PeekedBody<Full<Bytes>> = res.into_body();
    /// assert_eq!(body.collect().await?.to_bytes(), "upstream overloaded");
    /// # Ok(())
    /// # }
    /// ```
    pub struct PeekedBody<B: Body> {
        frames: VecDeque<Result<Frame<Bytes>, B::Error>>,
        rest: Option<B>,
    }
}

impl<B: Body> PeekedBody<B> {
    fn passthrough(body: B) -> Self {
        PeekedBody {
            frames: VecDeque::new(),
            rest: Some(body),
        }
    }

    fn replayed(frames: VecDeque<Result<Frame<Bytes>, B::Error>>, rest: Option<B>) -> Self {
        // What was read, then the rest of the original (none if it ended during the peek).
        PeekedBody { frames, rest }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for PeekedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(frame) = this.frames.pop_front() {
            return Poll::Ready(Some(frame));
        }
        match this.rest.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref().map(|d| d.len() as u64))
            .sum();
        match &self.rest {
            Some(body) => {
                let rest = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + buffered);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + buffered);
                }
                hint
            }
            None => SizeHint::with_exact(buffered),
        }
    }
}

impl<B: Body> fmt::Debug for PeekedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeekedBody")
            .field("buffered_frames", &self.frames.len())
            .finish_non_exhaustive()
    }
}
