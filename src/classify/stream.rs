//! Verdicts that arrive at the end of a stream: who is told ([`StreamEnd`]) and how a response
//! is watched until then ([`WatchStream`]).
//!
//! A classifier that can decide only at the end of a stream (gRPC's status in the trailers of a
//! server-streaming call) answers [`ClassifiedResponse::RequiresEos`](super::ClassifiedResponse)
//! with its [`ClassifyEos`]. A layer that must learn the verdict (the
//! [`CircuitBreaker`](crate::breaker::CircuitBreaker)) hands the response to
//! [`WatchStream::watch`] with a [`StreamEnd`] of its own; the watched response (for HTTP, a
//! response whose body is a [`ClassifiedBody`](super::ClassifiedBody)) tells it the verdict when
//! the stream ends, or nothing if the caller drops the stream first (no evidence either way).
//!
//! A classifier that always decides from the head has [`NeverClassifyEos`] as its end-of-stream
//! type, whose watched response is the response itself: nothing is wrapped, nothing allocated.

use super::{Classification, ClassifyEos, NeverClassifyEos};

/// Told the verdict of a stream when it ends.
///
/// Dropped without being told (the caller dropped the stream before its end), it has learnt
/// nothing; a breaker's trial permit, for one, is given back then.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use stormguard::classify::{Classification, StreamEnd};
///
/// struct Log(Arc<Mutex<Vec<Classification>>>);
/// impl StreamEnd for Log {
///     fn ended(self, outcome: Classification) {
///         self.0.lock().unwrap().push(outcome);
///     }
/// }
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// Log(seen.clone()).ended(Classification::success());
/// assert_eq!(seen.lock().unwrap()[0], Classification::success());
/// ```
pub trait StreamEnd {
    /// The stream ended with this verdict.
    fn ended(self, outcome: Classification);
}

/// How a [`ClassifyEos`] watches a response of type `Res` until its stream ends.
///
/// `Watched<K>` is the response the caller gets: the same response, with whatever wrapper sees
/// the end of its stream (for `http::Response<B>`, the body wrapped in a
/// [`ClassifiedBody`](super::ClassifiedBody)). [`pass`](WatchStream::pass) gives the same type
/// for a response decided at the head, unwatched.
///
/// ```
/// use stormguard::classify::{Classification, NeverClassifyEos, StreamEnd, WatchStream};
///
/// struct Nobody;
/// impl StreamEnd for Nobody {
///     fn ended(self, _: Classification) {}
/// }
/// // A classifier that decides at the head hands the response on as it is.
/// let res: u32 = <NeverClassifyEos as WatchStream<u32>>::pass::<Nobody>(7);
/// assert_eq!(res, 7);
/// ```
pub trait WatchStream<Res>: ClassifyEos + Sized {
    /// The response as the caller gets it, watched by `K`.
    type Watched<K: StreamEnd>;

    /// Watches `response`: `end` is told the verdict when its stream ends.
    fn watch<K: StreamEnd>(self, response: Res, end: K) -> Self::Watched<K>;

    /// The response, decided at its head: nothing to watch.
    fn pass<K: StreamEnd>(response: Res) -> Self::Watched<K>;
}

impl<Res> WatchStream<Res> for NeverClassifyEos {
    type Watched<K: StreamEnd> = Res;

    fn watch<K: StreamEnd>(self, _: Res, _: K) -> Res {
        match self {}
    }

    fn pass<K: StreamEnd>(response: Res) -> Res {
        response
    }
}
