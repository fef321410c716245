//! The breaker and streamed answers on a paused clock: a half-open trial whose answer is a long,
//! healthy stream closes the breaker at its head (outside review: before, the trial timeout
//! counted it as failed while it was still streaming, and the breaker stayed shut).
#![cfg(feature = "http")]

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
use stormguard::classify::GrpcClassifier;
use tower::{Layer, Service, ServiceExt};

type Frames = Pin<Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send>>;
type Res = http::Response<StreamBody<Frames>>;

/// Calls before `fail` answer trailers-only UNAVAILABLE; later ones stream one message, then
/// after `secs` seconds end with `grpc-status: status`.
fn dependency(
    fail: u32,
    secs: u64,
    status: &'static str,
) -> impl Service<(), Response = Res, Error = Infallible, Future: Send> + Clone {
    let calls = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |()| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < fail {
                let empty: Frames = Box::pin(futures_util::stream::empty());
                return Ok(http::Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "14")
                    .body(StreamBody::new(empty))
                    .unwrap());
            }
            let frames: Frames =
                Box::pin(futures_util::stream::unfold(0u8, move |step| async move {
                    match step {
                        0 => Some((Ok(Frame::data(Bytes::from_static(b"msg"))), 1)),
                        1 => {
                            tokio::time::sleep(Duration::from_secs(secs)).await;
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", status.parse().unwrap());
                            Some((Ok(Frame::trailers(trailers)), 2))
                        }
                        _ => None,
                    }
                }));
            Ok(http::Response::builder()
                .header("content-type", "application/grpc")
                .body(StreamBody::new(frames))
                .unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_long_healthy_trial_stream_closes_the_breaker_at_its_head() {
    let breaker = Breaker::new("watch", BreakerConfig::default());
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(GrpcClassifier)
        .layer(dependency(20, 15, "0"));
    for _ in 0..20 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(30)).await;
    let trial = svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(breaker.state(), State::Closed, "the dependency answered");
    let reader = tokio::spawn(async move { trial.into_body().collect().await.unwrap() });
    // 11 s in, past the 10 s trial timeout: another caller gets through.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let other = svc.ready().await.unwrap().call(()).await;
    assert!(
        other.is_ok(),
        "a healthy trial stream was counted as a failure"
    );
    let body = reader.await.unwrap();
    assert_eq!(body.trailers().unwrap()["grpc-status"], "0");
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.opens(), 1);
}

#[tokio::test(start_paused = true)]
async fn after_a_streamed_trial_the_ends_are_counted_again() {
    // Every stream after the trip fails in its trailers: the trial closes the breaker at its
    // head, and 20 failing ends in a row open it again.
    let breaker = Breaker::new("watch", BreakerConfig::default());
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(GrpcClassifier)
        .layer(dependency(20, 0, "14"));
    for _ in 0..20 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    tokio::time::advance(Duration::from_secs(30)).await;
    for _ in 0..21 {
        let Ok(res) = svc.ready().await.unwrap().call(()).await else {
            break;
        };
        let _ = res.into_body().collect().await;
    }
    assert_eq!(breaker.opens(), 2);
    assert_eq!(breaker.state(), State::Open);
}
