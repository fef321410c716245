//! Streamed answers committed at their first data frame, against a real HTTP server on
//! 127.0.0.1 that streams server-sent events and breaks where each test says: before the first
//! frame (sent again, for a read), after it (never sent again), silent past the timeout; the
//! breaker counts both kinds of break.
mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::net::SocketAddr;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::StreamClassifier;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::retry::RetryLayer;
use stormguard::stream::CommitAtFirstFrameLayer;
use support::sse::{serve, Answer, EVENT};
use tower::{service_fn, ServiceBuilder, ServiceExt};

type Stack = tower::util::BoxCloneService<http::Request<Full<Bytes>>, StreamedResponse, ToolError>;
type StreamedResponse = http::Response<
    stormguard::classify::ClassifiedBody<
        stormguard::stream::CommittedBody<hyper::body::Incoming>,
        stormguard::classify::StreamEos,
        stormguard::breaker::future::StreamTicket<stormguard::breaker::CountDependencyFailures>,
    >,
>;

/// Retry (of `class`) -> breaker -> commit at the first frame (`timeout`) -> hyper's client.
fn stack(class: ToolClass, breaker: &Breaker, timeout: Duration) -> Stack {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let http = service_fn(move |req: http::Request<Full<Bytes>>| {
        let client = client.clone();
        async move { client.request(req).await.map_err(BoxError::from) }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(class, RetryBudget::default()).classifier(StreamClassifier))
        .layer(CircuitBreakerLayer::new(breaker.clone()).classifier(StreamClassifier))
        .layer(CommitAtFirstFrameLayer::new(timeout).unwrap())
        .service(http);
    tower::util::BoxCloneService::new(svc)
}

fn get(addr: SocketAddr) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{addr}/v1/chat/completions"))
        .body(Full::default())
        .unwrap()
}

/// Runs `f` on a real-time runtime with `recorder` as this thread's recorder (the breaker
/// registers its counters when it is made, inside).
fn recorded<T>(recorder: &DebuggingRecorder, f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || rt.block_on(f))
}

/// Every counter, by name and labels (`name` or `name{label=value}`), taken at once: a
/// snapshot sets the counters back to zero.
fn counters(recorder: &DebuggingRecorder) -> std::collections::HashMap<String, u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, v)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = match labels.is_empty() {
                true => key.key().name().to_owned(),
                false => format!("{}{{{}}}", key.key().name(), labels.join(",")),
            };
            match v {
                DebugValue::Counter(n) => Some((name, n)),
                _ => None,
            }
        })
        .collect()
}

fn breaker() -> Breaker {
    Breaker::new("model-api", BreakerConfig::default())
}

#[test]
fn a_read_whose_stream_breaks_before_its_first_frame_is_sent_again() {
    let recorder = DebuggingRecorder::new();
    let (body, received) = recorded(&recorder, async {
        let (addr, received) = serve(vec![Answer::BreakBefore]).await;
        let svc = stack(ToolClass::Read, &breaker(), Duration::from_secs(10));
        let res = svc.oneshot(get(addr)).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let received = *received.lock().unwrap();
        (body, received)
    });
    assert_eq!(body, EVENT, "one whole answer");
    assert_eq!(received, 2, "the broken stream was sent again");
}

#[test]
fn a_stream_that_broke_before_its_first_frame_counts_a_failure_and_its_retry_a_success() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorded(&recorder, async {
        let (addr, _) = serve(vec![Answer::BreakBefore]).await;
        let svc = stack(ToolClass::Read, &breaker(), Duration::from_secs(10));
        let res = svc.oneshot(get(addr)).await.unwrap();
        res.into_body().collect().await.unwrap();
    });
    let counted = |metrics: &[(metrics_util::CompositeKey, _, _, DebugValue)], count: &str| {
        metrics
            .iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == "stormguard_breaker_outcomes_total"
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "count" && l.value() == count)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    let metrics = snapshotter.snapshot().into_vec();
    assert_eq!(
        counted(&metrics, "failure"),
        1,
        "the break before the first frame"
    );
    assert_eq!(
        counted(&metrics, "success"),
        1,
        "the whole stream, at its end"
    );
}

#[test]
fn a_stream_that_breaks_after_its_first_frame_is_never_sent_again_and_the_breaker_counts_it() {
    let recorder = DebuggingRecorder::new();
    let (first, rest, received) = recorded(&recorder, async {
        let (addr, received) = serve(vec![Answer::BreakAfter]).await;
        let svc = stack(ToolClass::Read, &breaker(), Duration::from_secs(10));
        let res = svc
            .oneshot(get(addr))
            .await
            .expect("committed at its first frame");
        let mut body = res.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let mut rest = Ok(());
        while let Some(frame) = body.frame().await {
            if let Err(e) = frame {
                rest = Err(e);
                break;
            }
        }
        let received = *received.lock().unwrap();
        (first, rest, received)
    });
    assert_eq!(first, EVENT);
    // The break is not hyper's raw error but says the answer is partial, and how much arrived.
    let err = ToolError::from(rest.expect_err("the caller sees the break after the frame"));
    assert_eq!(
        (err.code(), err.retryable()),
        (ErrorCode::PartialAnswer, false),
        "{err:?}"
    );
    assert!(
        err.hint().contains(&format!("after {} bytes", EVENT.len())),
        "{}",
        err.hint()
    );
    assert_eq!(
        received, 1,
        "part of the answer reached the caller: never sent again"
    );
    let counted = counters(&recorder);
    assert_eq!(
        counted.get("stormguard_breaker_outcomes_total{breaker=model-api,count=failure}"),
        Some(&1),
        "counted at the stream's end: {counted:?}"
    );
    assert_eq!(counted.get(stormguard::stream::PARTIAL_ANSWERS), Some(&1));
}

/// A stream that says one event and then nothing: the reader is not left waiting (before: the
/// body was pending for as long as the server kept the connection), it gets the event, then
/// `partial_answer` once the layer's timeout (200 ms here) of silence has passed; never resent.
#[test]
fn a_stream_silent_after_its_first_frame_ends_partial_after_the_timeout() {
    let recorder = DebuggingRecorder::new();
    let (first, rest, received) = recorded(&recorder, async {
        let (addr, received) = serve(vec![Answer::SilentAfter]).await;
        let svc = stack(ToolClass::Read, &breaker(), Duration::from_millis(200));
        let res = svc.oneshot(get(addr)).await.expect("committed");
        let mut body = res.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        // Bounded here only so that a regression fails instead of hanging the suite.
        let rest = tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .expect("the silence is bounded by the layer's timeout");
        let received = *received.lock().unwrap();
        (first, rest, received)
    });
    assert_eq!(first, EVENT);
    let err = ToolError::from(rest.unwrap().expect_err("a partial answer"));
    assert_eq!(err.code(), ErrorCode::PartialAnswer, "{err:?}");
    assert!(
        err.hint().contains("went silent for 200 ms"),
        "{}",
        err.hint()
    );
    assert_eq!(received, 1);
}

#[test]
fn an_unkeyed_write_whose_stream_breaks_before_its_first_frame_is_not_sent_again() {
    let recorder = DebuggingRecorder::new();
    let (result, received) = recorded(&recorder, async {
        let (addr, received) = serve(vec![Answer::BreakBefore]).await;
        let svc = stack(ToolClass::UnkeyedWrite, &breaker(), Duration::from_secs(10));
        let result = svc.oneshot(get(addr)).await.map(|_| ());
        let received = *received.lock().unwrap();
        (result, received)
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err:?}");
    assert!(!err.retryable());
    assert_eq!(received, 1);
}

#[test]
fn a_stream_silent_past_the_timeout_before_its_first_frame_is_sent_again() {
    let recorder = DebuggingRecorder::new();
    let (body, received) = recorded(&recorder, async {
        let (addr, received) = serve(vec![Answer::Silent]).await;
        let svc = stack(ToolClass::Read, &breaker(), Duration::from_millis(200));
        let res = svc.oneshot(get(addr)).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let received = *received.lock().unwrap();
        (body, received)
    });
    assert_eq!(body, EVENT);
    assert_eq!(received, 2);
}

/// The chaos layer's stream cut meets the commit rule: cut before its first frame, a read is
/// sent again (each attempt cut, the operation's three); cut after it, never.
#[cfg(feature = "chaos")]
#[tokio::test(start_paused = true)]
async fn a_stream_cut_by_chaos_is_sent_again_only_when_nothing_reached_the_caller() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use stormguard::chaos::StreamCutLayer;
    for (frames, calls_wanted) in [(0, 3), (1, 1)] {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let model = service_fn(move |_: ()| {
            counter.fetch_add(1, Ordering::SeqCst);
            let events = ["data: Hel\n\n", "data: lo\n\n"]
                .map(|e| Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from(e))));
            let body = StreamBody::new(futures_util::stream::iter(events));
            async move { Ok::<_, std::io::Error>(http::Response::new(body)) }
        });
        let svc = ServiceBuilder::new()
            .layer(
                RetryLayer::new(ToolClass::Read, RetryBudget::default())
                    .classifier(StreamClassifier),
            )
            .layer(CommitAtFirstFrameLayer::default())
            .layer(StreamCutLayer::new(7, 1.0, frames).unwrap())
            .service(model);
        let answer = svc.oneshot(()).await;
        match frames {
            0 => assert_eq!(answer.unwrap_err().code(), ErrorCode::Unavailable),
            _ => {
                let body = answer.unwrap().into_body();
                let err =
                    ToolError::from(body.collect().await.expect_err("the caller sees the cut"));
                assert_eq!(err.code(), ErrorCode::PartialAnswer, "{err:?}");
            }
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            calls_wanted,
            "cut after {frames}"
        );
    }
}
