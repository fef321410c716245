//! Three nested layers over real sockets: a hyper server on 127.0.0.1.
mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::HttpClassifier;
use stormguard::error::ErrorCode;
use stormguard::retry::{HttpReplay, RetryLayer};
use support::call;
use support::server::{serve, status, Body, HttpClient};
use tower::ServiceBuilder;

fn stack(
    budget: &RetryBudget,
    class: ToolClass,
) -> impl tower::Service<
    http::Request<Body>,
    Response = http::Response<hyper::body::Incoming>,
    Error = stormguard::error::ToolError,
> + Clone {
    let layer = |name| {
        RetryLayer::new(class, budget.clone())
            .name(name)
            .classifier(HttpClassifier)
            .replay(HttpReplay)
    };
    ServiceBuilder::new()
        .layer(layer("agent-loop"))
        .layer(layer("tool-wrapper"))
        .layer(layer("client"))
        .service(HttpClient::new())
}

fn get(addr: std::net::SocketAddr) -> http::Request<Body> {
    http::Request::get(format!("http://{addr}/search"))
        .body(Body::default())
        .unwrap()
}

#[tokio::test]
async fn an_outage_costs_at_most_max_attempts_per_operation() {
    let (addr, count) = serve(|_| status(503, &[])).await;
    let budget = RetryBudget::builder()
        .floor(100, Duration::from_secs(60))
        .build()
        .unwrap();
    let mut svc = stack(&budget, ToolClass::Read);
    for op in 1..=5 {
        let err = call(&mut svc, get(addr)).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(!err.retryable());
        assert_eq!(count.load(Ordering::SeqCst), 3 * op);
    }
}

#[tokio::test]
async fn retry_after_is_honoured_over_the_wire() {
    let (addr, count) = serve(|n| {
        if n == 0 {
            status(429, &[("retry-after", "1")])
        } else {
            status(200, &[])
        }
    })
    .await;
    let mut svc = stack(&RetryBudget::default(), ToolClass::Read);
    let start = Instant::now();
    let resp = call(&mut svc, get(addr)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert!(start.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn a_502_on_an_unkeyed_write_is_sent_once() {
    let (addr, count) = serve(|_| status(502, &[])).await;
    let mut svc = stack(&RetryBudget::default(), ToolClass::UnkeyedWrite);
    let req = http::Request::post(format!("http://{addr}/send-email"))
        .body(Body::default())
        .unwrap();
    let err = call(&mut svc, req).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
