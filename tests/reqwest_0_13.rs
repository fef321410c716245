//! reqwest 0.13 (feature `reqwest-0_13`, the renamed dependency `reqwest013`): the same
//! classification, keys and replay as 0.12, against a server on 127.0.0.1.
#![cfg(feature = "reqwest-0_13")]

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{
    ClassifiedResponse, Classify, FailureClass, HttpClassifier, ReqwestClassifier,
};
use stormguard::error::BoxError;
use stormguard::key::{Action, SetIdempotencyKeyLayer};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::server;
use tower::{Service, ServiceBuilder, ServiceExt};

/// A client with reqwest's own retries off: stormguard owns them.
fn client() -> reqwest013::Client {
    reqwest013::Client::builder()
        .retry(reqwest013::retry::never())
        .redirect(reqwest013::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_502_on_a_keyed_write_is_retried_with_the_same_key() -> Result<(), BoxError> {
    let (addr, calls, keys) =
        server::serve_keys(|n| server::status(if n < 2 { 502 } else { 200 }, &[])).await;
    let mut charge = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(SetIdempotencyKeyLayer::new(|req: &reqwest013::Request| {
            Action::new(
                "run-81f2",
                "step-3",
                "charge",
                &req.url().path().to_string(),
            )
        }))
        .service(client());
    let url = format!("http://{addr}/orders/7781").parse()?;
    let req = reqwest013::Request::new(reqwest013::Method::POST, url);
    let resp = charge.ready().await?.call(req).await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let keys = keys.lock().unwrap().clone();
    assert!(keys[0]
        .as_deref()
        .is_some_and(|k| k.starts_with("run-81f2:step-3:charge:")));
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key on every attempt"
    );
    Ok(())
}

#[tokio::test]
async fn a_refused_connection_is_not_sent_without_redirects() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = client()
        .post(format!("http://127.0.0.1:{port}/charges"))
        .send()
        .await;
    let class = |c: ReqwestClassifier| match c.classify(&refused) {
        ClassifiedResponse::Ready(c) => c.failure_class(),
        ClassifiedResponse::RequiresEos(_) => unreachable!(),
    };
    assert_eq!(
        class(ReqwestClassifier::without_redirects()),
        Some(FailureClass::Transient)
    );
    assert_eq!(
        class(ReqwestClassifier::default()),
        Some(FailureClass::Ambiguous)
    );
    // And through the generic error chain (a boxed reqwest 0.13 error).
    let boxed: BoxError = Box::new(refused.unwrap_err());
    assert_eq!(
        stormguard::classify::classify_error(&*boxed).failure_class(),
        Some(FailureClass::Ambiguous)
    );
}

#[tokio::test]
async fn the_model_api_classifier_reads_a_reqwest_response_by_its_headers() -> Result<(), BoxError>
{
    use stormguard::classify::ModelApiClassifier;
    let (addr, calls) =
        server::serve(|_| server::status(503, &[("x-should-retry", "false")])).await;
    let mut model = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(ModelApiClassifier)
                .replay(HttpReplay),
        )
        .service(client());
    let url = format!("http://{addr}/v1/chat/completions").parse()?;
    let err = model
        .ready()
        .await?
        .call(reqwest013::Request::new(reqwest013::Method::POST, url))
        .await
        .unwrap_err();
    // The provider said not to retry: one request (HttpClassifier would have sent three).
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(!err.retryable());
    Ok(())
}

#[tokio::test]
async fn a_used_up_quota_behind_reqwest_is_one_request_with_the_peek() -> Result<(), BoxError> {
    use stormguard::classify::ModelApiClassifier;
    use stormguard::peek::PeekErrorBodyLayer;
    const QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let (addr, calls) = server::serve(|_| {
        http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .body(server::Body::from(QUOTA))
            .unwrap()
    })
    .await;
    // The README's stack for a reqwest client: the peek works on `http::Response`.
    let mut model = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(ModelApiClassifier)
                .replay(HttpReplay),
        )
        .layer(PeekErrorBodyLayer::builder().build()?)
        .map_response(http::Response::from)
        .service(client());
    let url = format!("http://{addr}/v1/chat/completions").parse()?;
    let answer = model
        .ready()
        .await?
        .call(reqwest013::Request::new(reqwest013::Method::POST, url))
        .await?;
    assert_eq!(answer.status(), 429, "the provider's answer, handed back");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    Ok(())
}
