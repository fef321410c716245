//! [`PeekedBody`]: a response body after a peek, whole.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// A response body after [`PeekErrorBody`](super::PeekErrorBody): the original one, or the frames read for the
    /// peek followed by the rest of the original (nothing is lost or reordered; an error the
    /// original body returned during the peek is returned in its place).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::peek::{ErrorBody, PeekErrorBodyLayer, PeekedBody};
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
    pub(crate) fn passthrough(body: B) -> Self {
        PeekedBody {
            frames: VecDeque::new(),
            rest: Some(body),
        }
    }

    pub(crate) fn replayed(
        frames: VecDeque<Result<Frame<Bytes>, B::Error>>,
        rest: Option<B>,
    ) -> Self {
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
