//! [`ResponseFuture`]: the future of [`CommitAtFirstFrame`](super::CommitAtFirstFrame).

use super::committed::CommittedBody;
use crate::classify::FailureClass;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::peek::PeekedBody;
use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

pin_project! {
    /// The future of [`CommitAtFirstFrame`](super::CommitAtFirstFrame): the inner call, then
    /// (for a 2xx answer) the read up to its first data frame, bounded by the layer's timeout.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::stream::{future::ResponseFuture, CommitAtFirstFrameLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), stormguard::error::BoxError> {
    /// let api = service_fn(|_: ()| async {
    ///     Ok::<_, std::io::Error>(http::Response::new(Full::new(Bytes::from_static(b"data: 1\n\n"))))
    /// });
    /// let mut svc = CommitAtFirstFrameLayer::default().layer(api);
    /// let future: ResponseFuture<_, Full<Bytes>> = svc.ready().await?.call(());
    /// assert_eq!(future.await?.status(), 200);
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<F, B: Body> {
        #[pin]
        state: State<F, B>,
        timeout: Duration,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B: Body> {
        Calling { #[pin] future: F },
        Reading {
            head: Option<(http::response::Parts, B)>,
            frames: VecDeque<Result<Frame<Bytes>, B::Error>>,
            #[pin]
            sleep: tokio::time::Sleep,
        },
    }
}

impl<F, B: Body> ResponseFuture<F, B> {
    pub(super) fn new(future: F, timeout: Duration) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            timeout,
        }
    }
}

/// The error of a stream that gave no data frame: nothing reached the caller, and the server
/// may have started the work.
fn before_first_frame(code: ErrorCode, hint: &'static str) -> ToolError {
    ToolError::new(code)
        .with_class(FailureClass::Ambiguous)
        .with_retryable(true)
        .with_hint(hint)
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<CommittedBody<B>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let timeout = self.timeout;
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let res = ready!(future.poll(cx)).map_err(Into::into)?;
                    if !res.status().is_success() {
                        return Poll::Ready(Ok(
                            res.map(|b| CommittedBody::passed(PeekedBody::passthrough(b)))
                        ));
                    }
                    let (parts, body) = res.into_parts();
                    this.state.set(State::Reading {
                        head: Some((parts, body)),
                        frames: VecDeque::new(),
                        sleep: tokio::time::sleep(timeout),
                    });
                }
                StateProj::Reading {
                    head,
                    frames,
                    sleep,
                } => {
                    let Some((_, body)) = head.as_mut() else {
                        return Poll::Ready(Err(ToolError::new(ErrorCode::Internal)
                            .with_hint("polled after it was ready")
                            .into()));
                    };
                    let committed = match Pin::new(body).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            let data = frame.data_ref().is_some_and(|d| !d.is_empty());
                            let trailers = frame.is_trailers();
                            frames.push_back(Ok(frame));
                            // The first data (or the trailers: the end) commits the answer.
                            data || trailers
                        }
                        Poll::Ready(Some(Err(e))) => {
                            let err = before_first_frame(
                                ErrorCode::Unavailable,
                                "the stream broke before its first data frame: nothing reached the caller",
                            )
                            .with_source(e);
                            return Poll::Ready(Err(err.into()));
                        }
                        // Ended without data: an empty answer, whole (its body is not polled
                        // again after its end).
                        Poll::Ready(None) => {
                            let Some((parts, _)) = head.take() else {
                                continue;
                            };
                            let body = PeekedBody::replayed(std::mem::take(frames), None);
                            let body = CommittedBody::passed(body);
                            return Poll::Ready(Ok(Response::from_parts(parts, body)));
                        }
                        Poll::Pending => {
                            if sleep.poll(cx).is_ready() {
                                let err = before_first_frame(
                                    ErrorCode::Timeout,
                                    "the stream sent no data frame within the layer's timeout",
                                );
                                return Poll::Ready(Err(err.into()));
                            }
                            return Poll::Pending;
                        }
                    };
                    if committed {
                        let Some((parts, body)) = head.take() else {
                            continue;
                        };
                        let frames = std::mem::take(frames);
                        let body = PeekedBody::replayed(frames, Some(body));
                        let body = CommittedBody::committed(body, timeout);
                        return Poll::Ready(Ok(Response::from_parts(parts, body)));
                    }
                }
            }
        }
    }
}
