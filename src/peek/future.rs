//! [`ResponseFuture`]: the future of [`PeekErrorBody`](super::PeekErrorBody).

use super::{ErrorBody, PeekedBody};
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

pin_project! {
    /// The future of [`PeekErrorBody`](super::PeekErrorBody): the inner call, then (for a 4xx or 5xx answer) the
    /// read of its error body, bounded by the layer's limit and timeout.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::peek::{future::ResponseFuture, ErrorBody, PeekErrorBodyLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = service_fn(|_: ()| async {
    ///     Ok::<_, std::io::Error>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
    /// });
    /// let mut svc = PeekErrorBodyLayer::builder().build()?.layer(api);
    /// let future: ResponseFuture<_, Full<Bytes>> = svc.ready().await?.call(());
    /// let res = future.await?;
    /// // A 2xx answer is handed on unread.
    /// assert!(res.extensions().get::<ErrorBody>().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<F, B: Body> {
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

impl<F, B: Body> ResponseFuture<F, B> {
    pub(super) fn new(future: F, limit: usize, timeout: Duration) -> Self {
        ResponseFuture {
            state: PeekState::Calling { future },
            limit,
            timeout,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
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

impl<F, B: Body> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Error bodies are read: 4xx and 5xx.
fn peekable(status: StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}
