//! Streamed HTTP answers (server-sent events, a chunked stream of tokens) classified at their
//! end: [`StreamClassifier`] and [`StreamEos`].

use super::body::ClassifiedBody;
use super::http::{classify_response, status_error};
use super::stream::{StreamEnd, WatchStream};
use super::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, ClassifyEos,
};
use crate::error::ToolError;
use http::{HeaderMap, Response};

/// The end of a streamed HTTP answer that carries no status of its own (server-sent events):
/// a stream that ends, with or without trailers, is a success; one that breaks (a body error:
/// a reset, a dropped connection) is an `Ambiguous` `unavailable` failure.
///
/// ```
/// use stormguard::classify::{ClassifyEos, FailureClass, StreamEos, Verdict};
///
/// assert_eq!(StreamEos.classify_eos(None).verdict(), Verdict::Success);
/// assert_eq!(StreamEos.classify_broken().failure_class(), Some(FailureClass::Ambiguous));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamEos;

impl ClassifyEos for StreamEos {
    type Trailers = HeaderMap;

    fn classify_eos(self, _: Option<&HeaderMap>) -> Classification {
        Classification::success()
    }
}

impl<B> WatchStream<Response<B>> for StreamEos {
    type Watched<K: StreamEnd> = Response<ClassifiedBody<B, StreamEos, K>>;

    fn watch<K: StreamEnd>(self, response: Response<B>, end: K) -> Self::Watched<K> {
        response.map(|body| ClassifiedBody::new(body, self, end))
    }

    fn pass<K: StreamEnd>(response: Response<B>) -> Self::Watched<K> {
        response.map(ClassifiedBody::unwatched)
    }
}

/// Classifies streamed HTTP answers (server-sent events from a model API, a chunked stream):
/// a 2xx answer is decided when its stream ends ([`StreamEos`]): a
/// [`CircuitBreaker`](crate::breaker::CircuitBreaker) with this classifier counts a stream that
/// breaks after its head as a failure, and a clean end as a success. Any other status is
/// classified at the head as [`HttpClassifier`](super::HttpClassifier) does (`Retry-After`,
/// 429, 503 and the rest).
///
/// A [`Retry`](crate::retry::Retry) hands a 2xx stream to the caller as committed; to retry a
/// stream that breaks before its first data frame, put a
/// [`CommitAtFirstFrameLayer`](crate::stream::CommitAtFirstFrameLayer) under the breaker.
///
/// ```
/// use stormguard::classify::{ClassifiedResponse, Classify, HttpClassifier, StreamClassifier};
///
/// let streamed = http::Response::builder().header("content-type", "text/event-stream").body(()).unwrap();
/// let r: Result<_, std::io::Error> = Ok(streamed);
/// assert!(matches!(StreamClassifier.classify(&r), ClassifiedResponse::RequiresEos(_)));
///
/// // Any other status: as HttpClassifier reads it, at the head.
/// let limited = || Ok::<_, std::io::Error>(http::Response::builder().status(429).header("retry-after", "2").body(()).unwrap());
/// let ClassifiedResponse::Ready(c) = StreamClassifier.classify(&limited()) else { unreachable!() };
/// let ClassifiedResponse::Ready(expected) = HttpClassifier.classify(&limited());
/// assert_eq!(c, expected);
/// assert!(c.failure_class().is_some());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamClassifier;

impl<B, E: AsDynError> Classify<Response<B>, E> for StreamClassifier {
    type ClassifyEos = StreamEos;

    fn classify(&self, result: &Result<Response<B>, E>) -> ClassifiedResponse<StreamEos> {
        match result {
            Ok(resp) if resp.status().is_success() => ClassifiedResponse::RequiresEos(StreamEos),
            Ok(resp) => ClassifiedResponse::Ready(classify_response(resp.status(), resp.headers())),
            Err(e) => ClassifiedResponse::Ready(classify_error(e.as_dyn_error())),
        }
    }

    fn dependency_error(&self, resp: &Response<B>) -> Option<ToolError> {
        status_error(resp.status(), resp.headers())
    }
}
