//! Model-API signals against a fake provider on 127.0.0.1 (the cases of `examples/model_api`),
//! and the error-body peek: bounded, and the body still reaches the caller whole.
#![cfg(feature = "http")]

#[path = "../examples/model_api/signals.rs"]
#[allow(dead_code)]
mod signals;
mod support;

#[cfg(feature = "reqwest-0_13")]
#[path = "../examples/model_api/openai.rs"]
#[allow(dead_code)]
mod openai;

use bytes::Bytes;
use http_body_util::BodyExt;
use signals::{run_case, Provider, RETRY_AFTER_MS};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{HttpClassifier, ModelApiClassifier};
use stormguard::peek::{ErrorBody, PeekErrorBodyLayer};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::server::{self, Body};
use tower::{Layer, ServiceExt};
use tower::{Service, ServiceBuilder};

#[tokio::test]
async fn openai_insufficient_quota_is_one_request_and_not_retryable() {
    let o = run_case(Provider::OpenAi, "insufficient_quota").await;
    assert_eq!(o.requests, 1);
    assert_eq!(
        (o.is_error, o.code, o.retryable),
        (true, Some("quota_exhausted"), Some(false))
    );
    assert!(
        o.hint.unwrap().contains("exceeded your current quota"),
        "the provider's words reach the model"
    );
}

#[tokio::test]
async fn an_ordinary_rate_limit_is_retried() {
    let o = run_case(Provider::OpenAi, "rate_limited").await;
    assert_eq!((o.requests, o.is_error), (2, false));
}

#[tokio::test]
async fn anthropic_overloaded_is_retried_until_it_recovers() {
    let o = run_case(Provider::Anthropic, "overloaded").await;
    assert_eq!((o.requests, o.is_error), (3, false));
}

#[tokio::test]
async fn x_should_retry_false_is_one_request() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let o = run_case(provider, "should_retry_false").await;
        assert_eq!(o.requests, 1, "{provider:?}");
        assert_eq!((o.is_error, o.retryable), (true, Some(false)));
    }
}

#[tokio::test]
async fn retry_after_ms_is_the_wait() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let o = run_case(provider, "retry_after_ms").await;
        assert_eq!((o.requests, o.is_error), (2, false));
        let waited = o.waited_ms.unwrap();
        // The header's 700 ms, not `retry-after: 5`, nor the class's backoff.
        assert!(
            (RETRY_AFTER_MS..RETRY_AFTER_MS + 400).contains(&waited),
            "{provider:?} waited {waited} ms"
        );
    }
}

fn client() -> server::HttpClient {
    server::HttpClient::new()
}

#[tokio::test]
async fn a_long_error_body_is_peeked_up_to_the_limit_and_handed_on_whole() {
    let long: &'static str = Box::leak(
        format!(
            r#"{{"error":{{"type":"server_error","message":"{}"}}}}"#,
            "x".repeat(200_000)
        )
        .into_boxed_str(),
    );
    let (addr, _) = server::serve(move |_| {
        http::Response::builder()
            .status(500)
            .body(Body::new(Bytes::from_static(long.as_bytes())))
            .unwrap()
    })
    .await;
    let peek = PeekErrorBodyLayer::builder()
        .limit(1024)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .layer(client());
    let req = http::Request::get(format!("http://{addr}/"))
        .body(Body::default())
        .unwrap();
    let resp = peek.oneshot(req).await.unwrap();
    let seen = resp.extensions().get::<ErrorBody>().cloned().unwrap();
    assert!(seen.truncated, "more than the limit");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), long.len(), "nothing lost");
    assert_eq!(&body[..], long.as_bytes());
}

#[tokio::test]
async fn a_success_is_not_read() {
    let (addr, _) = server::serve(|_| {
        http::Response::builder()
            .status(200)
            .body(Body::new(Bytes::from_static(b"{\"ok\":true}")))
            .unwrap()
    })
    .await;
    let peek = PeekErrorBodyLayer::builder()
        .limit(1024)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .layer(client());
    let req = http::Request::get(format!("http://{addr}/"))
        .body(Body::default())
        .unwrap();
    let resp = peek.oneshot(req).await.unwrap();
    assert!(resp.extensions().get::<ErrorBody>().is_none());
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        b"{\"ok\":true}"
    );
}

#[tokio::test]
async fn a_keyed_weighted_quota_keeps_two_tenants_under_their_token_limits() {
    let guarded = signals::run_tokens(true).await;
    assert_eq!(guarded.rate_limited, 0, "no 429 at all");
    assert_eq!((guarded.requests, guarded.answered), (40, 40));
    // 2 x 6,000 tokens at 1,800 a second per tenant (after a burst of 1,800): about 2.3 s.
    assert!(guarded.wall_ms >= 2_000, "{} ms", guarded.wall_ms);
    // The same calls with the retries alone meet the provider's limit.
    let bare = signals::run_tokens(false).await;
    assert!(bare.rate_limited > 0);
}

#[cfg(feature = "reqwest-0_13")]
#[tokio::test]
async fn async_openai_through_stormguard_costs_3_requests_in_an_outage_not_12() {
    let inside = openai::inside().await;
    assert_eq!((inside.requests, inside.failed), (3, true));
    // The SDK's own retry kept under a stormguard Retry at the agent loop: 4 x 3.
    let kept = openai::sdk_retry_kept().await;
    assert_eq!((kept.requests, kept.failed), (12, true));
}

/// A body of scripted frames for the peek tests.
struct Script(std::collections::VecDeque<Result<http_body::Frame<Bytes>, std::io::Error>>);

impl http_body::Body for Script {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(self.0.pop_front())
    }
}

#[tokio::test]
async fn a_body_that_breaks_during_the_peek_hands_its_error_on_in_its_place() {
    let mut frames = vec![
        Ok(http_body::Frame::data(Bytes::from_static(
            br#"{"error":{"type":"server_"#,
        ))),
        Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
    ];
    let upstream = tower::service_fn(move |_: ()| {
        let body = Script(frames.drain(..).collect());
        async move { Ok::<_, std::io::Error>(http::Response::builder().status(500).body(body).unwrap()) }
    });
    let peek = PeekErrorBodyLayer::builder()
        .limit(1024)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .layer(upstream);
    let resp = peek.oneshot(()).await.unwrap();
    assert!(resp.extensions().get::<ErrorBody>().is_some());
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(
        first.into_data().unwrap(),
        Bytes::from_static(br#"{"error":{"type":"server_"#)
    );
    let second = body.frame().await.unwrap();
    assert_eq!(
        second.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionReset,
        "the error, in its place"
    );
    assert!(body.frame().await.is_none(), "and nothing after it");
}

#[tokio::test(start_paused = true)]
async fn a_slow_error_body_is_handed_on_after_the_timeout_with_what_was_read() {
    // One frame now, the rest 10 s later: the peek waits 2 s, then hands the response on.
    let upstream = tower::service_fn(|_: ()| async {
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
        tokio::spawn(async move {
            let _ = tx.send_data(Bytes::from_static(b"{\"error\":")).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _ = tx
                .send_data(Bytes::from_static(b"{\"type\":\"slow\"}}"))
                .await;
        });
        Ok::<_, std::io::Error>(http::Response::builder().status(503).body(body).unwrap())
    });
    let peek = PeekErrorBodyLayer::builder()
        .limit(1024)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .layer(upstream);
    let start = tokio::time::Instant::now();
    let resp = peek.oneshot(()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(resp.extensions().get::<ErrorBody>().unwrap().truncated);
    let all = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &all[..],
        b"{\"error\":{\"type\":\"slow\"}}",
        "the whole body, in order"
    );
}

/// A 429 answering `QUOTA_BODY` in one frame, peeked at with `limit`.
async fn peek_one_frame(
    limit: usize,
) -> http::Response<impl http_body::Body<Data = Bytes, Error: std::fmt::Debug>> {
    let upstream = tower::service_fn(|_: ()| async {
        Ok::<_, std::io::Error>(
            http::Response::builder()
                .status(429)
                .body(http_body_util::Full::new(Bytes::from_static(QUOTA_BODY)))
                .unwrap(),
        )
    });
    let peek = PeekErrorBodyLayer::builder()
        .limit(limit)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .layer(upstream);
    peek.oneshot(()).await.unwrap()
}

const QUOTA_BODY: &[u8] = br#"{"error":{"type":"insufficient_quota"}}"#;

#[tokio::test]
async fn a_single_frame_longer_than_the_limit_is_truncated_though_the_body_ends_with_it() {
    let resp = peek_one_frame(QUOTA_BODY.len() - 1).await;
    assert!(resp.extensions().get::<ErrorBody>().unwrap().truncated);
    // The caller still reads the whole body.
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        QUOTA_BODY
    );
}

#[tokio::test]
async fn a_body_of_exactly_the_limit_is_whole_not_truncated() {
    const BODY: &[u8] = QUOTA_BODY;
    let resp = peek_one_frame(BODY.len()).await;
    let seen = resp.extensions().get::<ErrorBody>().cloned().unwrap();
    assert!(!seen.truncated);
    assert!(seen.is("insufficient_quota"));
    assert_eq!(
        &resp.into_body().collect().await.unwrap().to_bytes()[..],
        BODY
    );
}

/// A provider that answers every request with `status`, `headers` and `body`; and its count of
/// requests.
fn provider(
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: Bytes,
) -> (
    impl tower::Service<
            http::Request<String>,
            Response = http::Response<http_body_util::Full<Bytes>>,
            Error = std::io::Error,
            Future = impl Send,
        > + Clone,
    Arc<AtomicUsize>,
) {
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    let svc = tower::service_fn(move |_: http::Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        let mut answer = http::Response::builder().status(status);
        for (k, v) in headers {
            answer = answer.header(*k, *v);
        }
        let answer = answer
            .body(http_body_util::Full::new(body.clone()))
            .unwrap();
        async move { Ok::<_, std::io::Error>(answer) }
    });
    (svc, requests)
}

fn ask() -> http::Request<String> {
    http::Request::post("http://api.test/v1/chat/completions")
        .body(String::new())
        .unwrap()
}

const QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;

/// An agent loop's layer (which sees only the status) over the model client's layer (which
/// reads the provider's error body): the client's layer ends the operation on a used-up quota,
/// and the loop hands its answer back instead of sending it twice more.
#[tokio::test(start_paused = true)]
async fn a_used_up_quota_ended_below_is_not_retried_by_a_layer_above_that_sees_only_the_status() {
    let (provider, requests) = provider(429, &[], Bytes::from_static(QUOTA.as_bytes()));
    let budget = RetryBudget::default();
    let mut stack = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, budget.clone())
                .classifier(HttpClassifier)
                .replay(HttpReplay)
                .name("agent-loop"),
        )
        .layer(
            RetryLayer::new(ToolClass::Read, budget.clone())
                .classifier(ModelApiClassifier)
                .replay(HttpReplay)
                .name("model"),
        )
        .layer(PeekErrorBodyLayer::builder().build().unwrap())
        .service(provider);
    let answer = stack.ready().await.unwrap().call(ask()).await;
    let answer = answer.expect("the provider's answer, handed back");
    assert_eq!(answer.status(), 429);
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

/// A quota error whose `type` comes before a message longer than the peek's limit: the peek
/// reads the first 16 KiB, and the type in them is enough.
#[tokio::test(start_paused = true)]
async fn a_used_up_quota_with_a_body_past_the_limit_is_still_one_request() {
    let body = format!(
        r#"{{"error":{{"type":"insufficient_quota","code":"insufficient_quota","message":"{}"}}}}"#,
        "x".repeat(20_000)
    );
    let whole = body.len();
    let (provider, requests) = provider(429, &[], Bytes::from(body));
    let mut model = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(ModelApiClassifier)
                .replay(HttpReplay),
        )
        .layer(PeekErrorBodyLayer::builder().build().unwrap())
        .service(provider);
    let answer = model.ready().await.unwrap().call(ask()).await.unwrap();
    let peeked = answer.extensions().get::<ErrorBody>().unwrap();
    assert!(peeked.truncated && peeked.is("insufficient_quota"));
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    // The caller still gets the whole body.
    let got = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), whole);
}

/// `x-should-retry: false` beside a `Retry-After`: one request, and the model still learns when
/// to come back.
#[tokio::test(start_paused = true)]
async fn do_not_retry_keeps_the_servers_delay_for_the_model() {
    let headers = &[("x-should-retry", "false"), ("retry-after", "7")];
    let (provider, requests) = provider(503, headers, Bytes::new());
    let mut model = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(ModelApiClassifier)
                .replay(HttpReplay),
        )
        .service(provider);
    let err = model.ready().await.unwrap().call(ask()).await.unwrap_err();
    assert!(!err.retryable());
    assert_eq!((err.attempts(), requests.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
}
