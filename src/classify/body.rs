//! Streamed HTTP bodies classified at their end: [`ClassifiedBody`] (tower-http's
//! `ClassifyEos` shape), and gRPC's status read from the trailers ([`GrpcClassifier`],
//! [`GrpcEos`]).

use super::http::{classify_response, server_hint, status_error};
use super::stream::{StreamEnd, WatchStream};
use super::{
    classify_error, classify_grpc_code, AsDynError, Classification, ClassifiedResponse, Classify,
    ClassifyEos, FailureClass,
};
use crate::error::{ErrorCode, ToolError};
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

pin_project! {
    /// A response body that tells a [`StreamEnd`] the verdict of its [`ClassifyEos`] when the
    /// stream ends: at its trailers, at its last frame if it has none, or when it breaks (a body
    /// error, [`ClassifyEos::classify_broken`]). Frames and errors pass through untouched.
    ///
    /// Dropped before its end (the caller stopped reading), it tells nothing: the `StreamEnd` is
    /// dropped untold.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use http_body_util::{BodyExt, StreamBody};
    /// use http_body::Frame;
    /// use stormguard::classify::{Classification, ClassifiedBody, GrpcEos, StreamEnd, FailureClass};
    ///
    /// struct Seen(Arc<Mutex<Option<Classification>>>);
    /// impl StreamEnd for Seen {
    ///     fn ended(self, outcome: Classification) { *self.0.lock().unwrap() = Some(outcome); }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // Two messages, then UNAVAILABLE in the trailers.
    /// let mut trailers = http::HeaderMap::new();
    /// trailers.insert("grpc-status", "14".parse().unwrap());
    /// let frames = vec![
    ///     Ok::<_, std::io::Error>(Frame::data(bytes::Bytes::from_static(b"one"))),
    ///     Ok(Frame::data(bytes::Bytes::from_static(b"two"))),
    ///     Ok(Frame::trailers(trailers)),
    /// ];
    /// let seen = Arc::new(Mutex::new(None));
    /// let body = ClassifiedBody::new(StreamBody::new(futures_util::stream::iter(frames)), GrpcEos, Seen(seen.clone()));
    /// let collected = body.collect().await.unwrap();
    /// assert_eq!(collected.trailers().unwrap()["grpc-status"], "14");
    /// let verdict = seen.lock().unwrap().unwrap();
    /// assert_eq!(verdict.failure_class(), Some(FailureClass::Transient));
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct ClassifiedBody<B, E, K> {
        #[pin]
        inner: B,
        watch: Option<(E, K)>,
    }
}

impl<B, E, K> ClassifiedBody<B, E, K> {
    /// Wraps `inner`: `end` is told `eos`'s verdict when the stream ends.
    pub fn new(inner: B, eos: E, end: K) -> Self {
        ClassifiedBody {
            inner,
            watch: Some((eos, end)),
        }
    }

    /// Wraps `inner` with nothing to tell: a response decided at its head.
    pub fn unwatched(inner: B) -> Self {
        ClassifiedBody { inner, watch: None }
    }

    /// Whether the end of the stream is still awaited.
    pub fn is_watching(&self) -> bool {
        self.watch.is_some()
    }

    /// The body inside; a watch not yet told is dropped untold.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B, E, K> Body for ClassifiedBody<B, E, K>
where
    B: Body,
    E: ClassifyEos<Trailers = HeaderMap>,
    K: StreamEnd,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        let verdict = match &frame {
            Some(Ok(frame)) => match frame.trailers_ref() {
                Some(trailers) => this.watch.take().map(|(eos, end)| {
                    let outcome = eos.classify_eos(Some(trailers));
                    (outcome, end)
                }),
                None => None,
            },
            Some(Err(_)) => this
                .watch
                .take()
                .map(|(eos, end)| (eos.classify_broken(), end)),
            None => this
                .watch
                .take()
                .map(|(eos, end)| (eos.classify_eos(None), end)),
        };
        if let Some((outcome, end)) = verdict {
            told(outcome);
            end.ended(outcome);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        // While the end is awaited, say "not yet", so the reader polls once more and the end
        // (trailers or none) is seen here.
        self.watch.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn told(outcome: Classification) {
    let verdict = match outcome.verdict() {
        super::Verdict::Success => "success",
        super::Verdict::Empty => "empty",
        super::Verdict::Failure(_) => "failure",
    };
    metrics::counter!("stormguard_stream_end_total", "verdict" => verdict).increment(1);
    tracing::debug!(verdict, code = ?outcome.code(), "stream ended");
}

/// The end of a gRPC response stream: the status in its trailers.
///
/// `grpc-status` in the trailers is classified by [`classify_grpc_code`] (with
/// `grpc-retry-pushback-ms` as the hint); trailers without it, or a stream that ends with no
/// trailers at all, are an `Ambiguous` `internal` failure (the server did not say how the call
/// ended); a stream that breaks is an `Ambiguous` `unavailable` one.
///
/// ```
/// use stormguard::classify::{ClassifyEos, GrpcEos, FailureClass, Verdict};
///
/// let mut trailers = http::HeaderMap::new();
/// trailers.insert("grpc-status", "0".parse().unwrap());
/// assert_eq!(GrpcEos.classify_eos(Some(&trailers)).verdict(), Verdict::Success);
/// assert_eq!(GrpcEos.classify_eos(None).failure_class(), Some(FailureClass::Ambiguous));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcEos;

impl ClassifyEos for GrpcEos {
    type Trailers = HeaderMap;

    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Classification {
        let code = trailers
            .and_then(|t| t.get("grpc-status"))
            .and_then(|v| v.to_str().ok()?.trim().parse::<i32>().ok());
        match (code, trailers) {
            (Some(code), Some(trailers)) => {
                let c = classify_grpc_code(code);
                if c.failure_class().is_some() {
                    c.with_hint(server_hint(trailers))
                } else {
                    c
                }
            }
            _ => Classification::failure(FailureClass::Ambiguous, ErrorCode::Internal),
        }
    }
}

impl<B> WatchStream<Response<B>> for GrpcEos {
    type Watched<K: StreamEnd> = Response<ClassifiedBody<B, GrpcEos, K>>;

    fn watch<K: StreamEnd>(self, response: Response<B>, end: K) -> Self::Watched<K> {
        response.map(|body| ClassifiedBody::new(body, self, end))
    }

    fn pass<K: StreamEnd>(response: Response<B>) -> Self::Watched<K> {
        response.map(ClassifiedBody::unwatched)
    }
}

/// Classifies gRPC calls made over HTTP (a tonic `Channel` under the layer), streams included.
///
/// An answer whose head decides it (a non-2xx status, or a trailers-only answer with
/// `grpc-status` in the head) is classified as [`HttpClassifier`](super::HttpClassifier) does.
/// Any other answer is a stream whose status comes in its trailers:
/// [`ClassifiedResponse::RequiresEos`] with [`GrpcEos`]. A
/// [`CircuitBreaker`](crate::breaker::CircuitBreaker) with this classifier wraps such a
/// response's body in a [`ClassifiedBody`] and counts the trailers' verdict when the stream ends;
/// a [`Retry`](crate::retry::Retry) hands it to the caller as committed (gRFC A6: once the head
/// has arrived, a call is not retried).
///
/// Over a tonic `Channel`, box the channel's error under the breaker
/// (`ServiceBuilder::new().layer(breaker).map_err(tower::BoxError::from).service(channel)`): the
/// classifier reads errors as [`AsDynError`], which `tonic::transport::Error` is not.
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, GrpcClassifier, FailureClass};
///
/// // A streamed answer: decided at the end.
/// let streamed = http::Response::builder().header("content-type", "application/grpc").body(()).unwrap();
/// let r: Result<_, std::io::Error> = Ok(streamed);
/// assert!(matches!(GrpcClassifier.classify(&r), ClassifiedResponse::RequiresEos(_)));
///
/// // A trailers-only answer: decided now.
/// let refused = http::Response::builder().header("grpc-status", "14").body(()).unwrap();
/// let ClassifiedResponse::Ready(c) = GrpcClassifier.classify(&Ok::<_, std::io::Error>(refused)) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::Transient));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcClassifier;

impl<B, E: AsDynError> Classify<Response<B>, E> for GrpcClassifier {
    type ClassifyEos = GrpcEos;

    fn classify(&self, result: &Result<Response<B>, E>) -> ClassifiedResponse<GrpcEos> {
        match result {
            Ok(resp)
                if resp.status().is_success() && !resp.headers().contains_key("grpc-status") =>
            {
                ClassifiedResponse::RequiresEos(GrpcEos)
            }
            Ok(resp) => ClassifiedResponse::Ready(classify_response(resp.status(), resp.headers())),
            Err(e) => ClassifiedResponse::Ready(classify_error(e.as_dyn_error())),
        }
    }

    fn dependency_error(&self, resp: &Response<B>) -> Option<ToolError> {
        status_error(resp.status(), resp.headers())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Verdict;
    use std::sync::{Arc, Mutex};

    type Script = Vec<Result<Frame<&'static [u8]>, std::io::Error>>;

    /// A body of scripted frames.
    struct Frames(Script);

    impl Body for Frames {
        type Data = &'static [u8];
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Ready((!self.0.is_empty()).then(|| self.0.remove(0)))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<Classification>>>);

    impl StreamEnd for Seen {
        fn ended(self, outcome: Classification) {
            self.0.lock().unwrap().push(outcome);
        }
    }

    fn drain(body: &mut ClassifiedBody<Frames, GrpcEos, Seen>) -> usize {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut frames = 0;
        while let Poll::Ready(Some(_)) = Pin::new(&mut *body).poll_frame(&mut cx) {
            frames += 1;
        }
        frames
    }

    fn trailers(status: &str) -> HeaderMap {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", status.parse().unwrap());
        t
    }

    #[test]
    fn each_end_is_told_once() {
        let cases: Vec<(Script, Verdict)> = vec![
            (
                vec![
                    Ok(Frame::data(&b"x"[..])),
                    Ok(Frame::trailers(trailers("0"))),
                ],
                Verdict::Success,
            ),
            (vec![Ok(Frame::trailers(trailers("5")))], Verdict::Empty),
            (
                vec![
                    Ok(Frame::data(&b"x"[..])),
                    Ok(Frame::trailers(trailers("13"))),
                ],
                Verdict::Failure(FailureClass::Ambiguous),
            ),
            // No trailers at all: the server never said how it ended.
            (
                vec![Ok(Frame::data(&b"x"[..]))],
                Verdict::Failure(FailureClass::Ambiguous),
            ),
            // Broken mid-stream.
            (
                vec![
                    Ok(Frame::data(&b"x"[..])),
                    Err(std::io::ErrorKind::ConnectionReset.into()),
                ],
                Verdict::Failure(FailureClass::Ambiguous),
            ),
        ];
        for (frames, want) in cases {
            let seen = Seen::default();
            let mut body = ClassifiedBody::new(Frames(frames), GrpcEos, seen.clone());
            assert!(!body.is_end_stream(), "the end is awaited");
            drain(&mut body);
            // Polled again after its end: told nothing more.
            drain(&mut body);
            let told = seen.0.lock().unwrap();
            assert_eq!(told.len(), 1);
            assert_eq!(told[0].verdict(), want);
            assert!(body.is_end_stream());
        }
    }

    #[test]
    fn a_body_dropped_before_its_end_tells_nothing() {
        let seen = Seen::default();
        let mut body = ClassifiedBody::new(
            Frames(vec![
                Ok(Frame::data(&b"x"[..])),
                Ok(Frame::trailers(trailers("14"))),
            ]),
            GrpcEos,
            seen.clone(),
        );
        let waker = std::task::Waker::noop();
        let _ = Pin::new(&mut body).poll_frame(&mut Context::from_waker(waker));
        drop(body);
        assert!(seen.0.lock().unwrap().is_empty());
        // Unwatched: nothing to tell, ever.
        let mut body: ClassifiedBody<Frames, GrpcEos, Seen> =
            ClassifiedBody::unwatched(Frames(vec![Ok(Frame::trailers(trailers("14")))]));
        assert_eq!(drain(&mut body), 1);
    }
}
