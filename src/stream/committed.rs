//! [`CommittedBody`]: the body of an answer [`CommitAtFirstFrame`](super::CommitAtFirstFrame)
//! handed on, whose break after the first data frame says the answer is partial.

use crate::classify::FailureClass;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::peek::PeekedBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The counter of streamed answers that broke after part of them reached the caller.
pub const PARTIAL_ANSWERS: &str = "stormguard_partial_answers_total";

/// The body of a committed answer: the frames read up to the first data frame, then the rest.
/// A break after the first data frame is not the HTTP library's raw error ("unexpected EOF
/// during chunk size line") but a [`ToolError`] coded `partial_answer` (`Ambiguous`, not
/// retryable, the bytes read in its hint, the library's error as its source), counted in
/// [`PARTIAL_ANSWERS`]: the caller holds part of the answer and must not take it for the whole.
/// A stream silent for longer than the layer's timeout after a frame ends the same way (the
/// silence in the hint): a model that stops mid-answer never leaves the reader waiting without
/// bound. A non-2xx answer's body passes with its own errors, boxed.
///
/// ```
/// use bytes::Bytes;
/// use http_body::Frame;
/// use http_body_util::{BodyExt, StreamBody};
/// use tower::{Layer, ServiceExt, service_fn};
/// use stormguard::error::{ErrorCode, ToolError};
/// use stormguard::stream::{CommitAtFirstFrameLayer, CommittedBody};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), stormguard::error::BoxError> {
/// // One token, then the connection drops.
/// let model = service_fn(|_: ()| async {
///     let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
///         Ok(Frame::data(Bytes::from("data: Hel\n\n"))),
///         Err(std::io::ErrorKind::UnexpectedEof.into()),
///     ];
///     Ok::<_, std::io::Error>(http::Response::new(StreamBody::new(futures_util::stream::iter(frames))))
/// });
/// let answer = CommitAtFirstFrameLayer::default().layer(model).oneshot(()).await?;
/// let body: CommittedBody<_> = answer.into_body();
/// let err = ToolError::from(body.collect().await.unwrap_err());
/// assert_eq!((err.code(), err.retryable()), (ErrorCode::PartialAnswer, false));
/// assert!(err.hint().contains("after 11 bytes"), "{}", err.hint());
/// # Ok(())
/// # }
/// ```
pub struct CommittedBody<B: Body> {
    inner: PeekedBody<B>,
    /// The longest silence between frames, for a committed answer (a 2xx that gave a data
    /// frame); `None` for a passed answer.
    silence: Option<Duration>,
    /// The silence's timer, made at the first wait (an answer read at once makes none).
    sleep: Option<Pin<Box<Sleep>>>,
    /// Data bytes handed to the caller so far.
    read: u64,
    /// Whether the body has ended with an error (nothing is read after it).
    broken: bool,
}

impl<B: Body> CommittedBody<B> {
    pub(super) fn passed(inner: PeekedBody<B>) -> Self {
        CommittedBody {
            inner,
            silence: None,
            sleep: None,
            read: 0,
            broken: false,
        }
    }

    pub(super) fn committed(inner: PeekedBody<B>, silence: Duration) -> Self {
        CommittedBody {
            inner,
            silence: Some(silence),
            sleep: None,
            read: 0,
            broken: false,
        }
    }
}

fn partial(read: u64, why: &str, source: Option<BoxError>) -> BoxError {
    metrics::counter!(PARTIAL_ANSWERS).increment(1);
    tracing::debug!(
        bytes = read,
        why,
        "a streamed answer broke after its first data frame"
    );
    let err = ToolError::new(ErrorCode::PartialAnswer)
        .with_class(FailureClass::Ambiguous)
        .with_retryable(false)
        .with_hint(format!(
            "the answer {why} after {read} bytes of data: what you have is part of it; discard it, and ask again only if the call was a read"
        ));
    match source {
        Some(source) => err.with_source(source).into(),
        None => err.into(),
    }
}

impl<B> Body for CommittedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.broken {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                let Some(silence) = this.silence else {
                    return Poll::Pending;
                };
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(silence)));
                ready!(sleep.as_mut().poll(cx));
                this.broken = true;
                let why = format!("went silent for {} ms", silence.as_millis());
                return Poll::Ready(Some(Err(partial(this.read, &why, None))));
            }
        };
        Poll::Ready(match frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.read += data.len() as u64;
                }
                // A frame restarts the silence.
                if let (Some(silence), Some(sleep)) = (this.silence, this.sleep.as_mut()) {
                    sleep.as_mut().reset(Instant::now() + silence);
                }
                Some(Ok(frame))
            }
            Some(Err(e)) if this.silence.is_some() => {
                this.broken = true;
                Some(Err(partial(this.read, "broke off", Some(e.into()))))
            }
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.broken || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body> fmt::Debug for CommittedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommittedBody")
            .field("silence", &self.silence)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}
