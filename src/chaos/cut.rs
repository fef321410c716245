//! [`StreamCutLayer`]: streamed answers cut after some frames, as a dropped connection does
//! mid-stream (feature `chaos`, with `http`).

use super::decide::uniform;
use crate::error::{BoxError, ConfigError};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Cuts a share of streamed HTTP answers after `frames` data frames: the body then fails with
/// a connection reset, as a stream does when its connection drops. Which calls are cut is drawn
/// from the seed and the call's number, so the same seed cuts the same calls. The server did
/// the work in every case: a cut before the first frame is the failure
/// [`CommitAtFirstFrameLayer`](crate::stream::CommitAtFirstFrameLayer) turns into an error a
/// `Retry` can decide on; a cut after it is the caller's.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use stormguard::chaos::StreamCutLayer;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let cut = StreamCutLayer::new(7, 1.0, 0).unwrap(); // every stream, before its first frame
/// let model = cut.layer(service_fn(|_: ()| async {
///     Ok::<_, std::io::Error>(http::Response::new(Full::new(Bytes::from("data: hi\n\n"))))
/// }));
/// let answer = model.oneshot(()).await.unwrap();
/// assert!(answer.into_body().collect().await.is_err());
/// assert_eq!(cut.cuts(), 1);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StreamCutLayer {
    seed: u64,
    share: f64,
    frames: u32,
    calls: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
}

impl StreamCutLayer {
    /// Cuts a `share` (0.0 to 1.0) of the answers after `frames` data frames.
    pub fn new(seed: u64, share: f64, frames: u32) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(ConfigError::new("share", "must be within 0.0..=1.0"));
        }
        Ok(StreamCutLayer {
            seed,
            share,
            frames,
            calls: Arc::default(),
            cuts: Arc::default(),
        })
    }

    /// How many answers were cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }
}

impl<S> Layer<S> for StreamCutLayer {
    type Service = StreamCut<S>;

    fn layer(&self, inner: S) -> StreamCut<S> {
        StreamCut {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`StreamCutLayer`].
#[derive(Clone, Debug)]
pub struct StreamCut<S> {
    inner: S,
    layer: StreamCutLayer,
}

impl<S, Req, B> Service<Req> for StreamCut<S>
where
    S: Service<Req, Response = http::Response<B>>,
{
    type Response = http::Response<CutBody<B>>;
    type Error = S::Error;
    type Future = CutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let layer = &self.layer;
        let n = layer.calls.fetch_add(1, Ordering::Relaxed);
        let cut = uniform(layer.seed, n, 0) < layer.share;
        if cut {
            layer.cuts.fetch_add(1, Ordering::Relaxed);
        }
        CutFuture {
            inner: self.inner.call(req),
            cut: cut.then_some(layer.frames),
        }
    }
}

pin_project! {
    /// The future of a [`StreamCut`] call: the answer, its body cut if the call was drawn.
    pub struct CutFuture<F> {
        #[pin]
        inner: F,
        cut: Option<u32>,
    }
}

impl<F, B, E> Future for CutFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<CutBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx))?;
        let cut = *this.cut;
        Poll::Ready(Ok(res.map(|body| CutBody {
            inner: body,
            left: cut,
        })))
    }
}

pin_project! {
    /// A body that fails with a connection reset after its allowed data frames (or passes
    /// everything through when its call was not drawn).
    pub struct CutBody<B> {
        #[pin]
        inner: B,
        left: Option<u32>,
    }
}

impl<B> Body for CutBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.left == Some(0) {
            *this.left = None;
            let reset = std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "chaos: the stream was cut",
            );
            return Poll::Ready(Some(Err(reset.into())));
        }
        let frame = ready!(this.inner.poll_frame(cx));
        if let (Some(Ok(f)), Some(left)) = (&frame, this.left.as_mut()) {
            if f.is_data() {
                *left -= 1;
            }
        }
        Poll::Ready(frame.map(|f| f.map_err(Into::into)))
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}
