//! Streamed answers committed at their first data frame, not at their head.
//!
//! A model's answer streams (server-sent events): the head says `200` at once, the tokens come
//! later. A [`Retry`](crate::retry::Retry) hands a streamed answer to the caller at its head
//! (gRFC A6: once the head has arrived, a call is not retried), so a stream that breaks before
//! its first token is a failure the caller sees, though nothing reached it and a read could
//! simply be sent again. [`CommitAtFirstFrameLayer`] moves the commit point: it holds a 2xx
//! answer until its first data frame, and a stream that breaks (or stays silent past the layer's
//! timeout) before it becomes an error the `Retry` above decides on:
//!
//! | the stream | what the caller sees | retried |
//! |---|---|---|
//! | breaks, or is silent past the timeout, before its first data frame | nothing yet | a read, a keyed or idempotent write: yes, as any `Ambiguous` failure; an unkeyed write: no, `outcome_unknown` (the server may have started the work) |
//! | breaks after its first data frame | the frames so far, then a `partial_answer` error ([`CommittedBody`]) | never: the caller has part of the answer |
//! | is silent past the timeout between two frames after the first | the frames so far, then a `partial_answer` error | never |
//! | ends (with or without data) | the whole answer | - |
//!
//! Put it under the breaker, directly over the client: the breaker (with
//! [`StreamClassifier`](crate::classify::StreamClassifier)) then counts both a stream that
//! breaks before its first frame (an error at the head) and one that breaks after it (at the
//! stream's end). A non-2xx answer passes untouched, unread.
//!
//! ```text
//! Retry ──► CircuitBreaker(StreamClassifier) ──► CommitAtFirstFrame ──► HTTP client
//!             counts both failures                 holds the head until the first frame
//! ```
//!
//! ```
//! use bytes::Bytes;
//! use http_body::Frame;
//! use http_body_util::{BodyExt, StreamBody};
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, classify::StreamClassifier};
//! use stormguard::retry::RetryLayer;
//! use stormguard::stream::CommitAtFirstFrameLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), stormguard::error::BoxError> {
//! // The first stream breaks before its first token; the second streams two tokens.
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let model = service_fn(move |_: ()| {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = if n == 0 {
//!         vec![Err(std::io::ErrorKind::ConnectionReset.into())]
//!     } else {
//!         vec![Ok(Frame::data(Bytes::from("data: Hel\n\n"))), Ok(Frame::data(Bytes::from("data: lo\n\n")))]
//!     };
//!     let body = StreamBody::new(futures_util::stream::iter(frames));
//!     async move { Ok::<_, std::io::Error>(http::Response::new(body)) }
//! });
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()).classifier(StreamClassifier))
//!     .layer(CommitAtFirstFrameLayer::default())
//!     .service(model);
//! let res = svc.ready().await?.call(()).await?;
//! assert_eq!(res.into_body().collect().await?.to_bytes(), "data: Hel\n\ndata: lo\n\n");
//! assert_eq!(calls.load(Ordering::SeqCst), 2); // the broken stream was sent again
//! # Ok(())
//! # }
//! ```

mod committed;
pub mod future;

pub use committed::{CommittedBody, PARTIAL_ANSWERS};

use crate::error::BoxError;
use future::ResponseFuture;
use http::Response;
use http_body::Body;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// How long [`CommitAtFirstFrameLayer::default`] waits for a stream's first data frame: a model
/// that has said nothing for this long after its head is treated as a broken stream.
pub const DEFAULT_FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(60);

/// Holds each 2xx streamed answer until its first data frame, and bounds the silence before it
/// and between any two frames after it by its timeout: see the [module](self).
///
/// ```
/// use std::time::Duration;
/// use stormguard::stream::CommitAtFirstFrameLayer;
///
/// let layer = CommitAtFirstFrameLayer::new(Duration::from_secs(20))?;
/// assert_eq!(layer.timeout(), Duration::from_secs(20));
/// assert!(CommitAtFirstFrameLayer::new(Duration::ZERO).is_err());
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CommitAtFirstFrameLayer {
    timeout: Duration,
}

impl Default for CommitAtFirstFrameLayer {
    /// Waits [`DEFAULT_FIRST_FRAME_TIMEOUT`] for the first frame.
    fn default() -> Self {
        CommitAtFirstFrameLayer {
            timeout: DEFAULT_FIRST_FRAME_TIMEOUT,
        }
    }
}

impl CommitAtFirstFrameLayer {
    /// Waits at most `timeout` (1 ms to 1 h) after the head for the first data frame.
    pub fn new(timeout: Duration) -> Result<Self, crate::error::ConfigError> {
        if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(3600) {
            return Err(crate::error::ConfigError::new(
                "timeout",
                "must be between 1 ms and 1 h",
            ));
        }
        Ok(CommitAtFirstFrameLayer { timeout })
    }

    /// How long it waits for a first data frame.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl<S> Layer<S> for CommitAtFirstFrameLayer {
    type Service = CommitAtFirstFrame<S>;

    fn layer(&self, inner: S) -> CommitAtFirstFrame<S> {
        CommitAtFirstFrame {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service [`CommitAtFirstFrameLayer`] makes: a 2xx answer is returned at its first data
/// frame (its body is then the frames read, followed by the rest, as a [`CommittedBody`], whose
/// break after that frame is a `partial_answer` error); a stream
/// that breaks or stays silent before it is an error (a [`ToolError`](crate::error::ToolError),
/// `unavailable` or `timeout`, `Ambiguous`, with the body's error as its source).
#[derive(Clone, Debug)]
pub struct CommitAtFirstFrame<S> {
    inner: S,
    timeout: Duration,
}

impl<S, Req, B> Service<Req> for CommitAtFirstFrame<S>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<CommittedBody<B>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.timeout)
    }
}
