//! Correct by default: layers left on their defaults keep the crate's guarantees for the
//! common client (an HTTP service), with nothing repeated by the user.
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::key::Action;
use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
use stormguard::retry::RetryLayer;
use support::call;
use tower::{service_fn, Layer, ServiceBuilder};

/// An HTTP provider that answers 503 to its first `failures` calls, then 201; and its calls.
fn provider(
    failures: u32,
) -> (
    Arc<AtomicU32>,
    impl tower::Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = BoxError,
            Future: Send,
        > + Clone
        + Send
        + 'static,
) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = service_fn(move |_req: http::Request<String>| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let status = if n <= failures { 503 } else { 201 };
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(status)
                    .body(format!("answer {n}"))
                    .unwrap(),
            )
        }
    });
    (calls, svc)
}

fn charge() -> http::Request<String> {
    http::Request::post("/charges/4471")
        .body("{\"amount\":100}".to_string())
        .unwrap()
}

fn by_path(req: &http::Request<String>) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-2", "charge", &req.uri().path())
}

#[tokio::test(start_paused = true)]
async fn a_receipt_layer_left_on_its_defaults_over_an_http_client_never_stores_a_503() {
    // No classifier and no codec given: the answer is read by its status and stored by its type.
    let (calls, provider) = provider(1);
    let store = InMemoryStore::new();
    let mut tool =
        ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, by_path).layer(provider);

    // The 503 comes back, and is not the receipt.
    let first = call(&mut tool, charge()).await;
    assert!(
        first.as_ref().map_or(true, |r| r.status() == 503),
        "the first call must not be a success: {first:?}"
    );
    // The next attempt sends again (with the same key) and gets the real answer...
    let second = call(&mut tool, charge()).await.unwrap();
    assert_eq!(
        (second.status().as_u16(), calls.load(Ordering::SeqCst)),
        (201, 2)
    );
    // ...which is the receipt: a third is answered from it, nothing is sent.
    let third = call(&mut tool, charge()).await.unwrap();
    assert_eq!(third.status(), 201);
    assert_eq!(third.body(), "answer 2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_with_no_classifier_given_over_an_http_client_escalates_an_unkeyed_503() {
    // The write was declared unkeyed; a 503 may come from a proxy after the work: the model
    // must get `outcome_unknown`, not a plain 503 it would retry itself.
    let (calls, provider) = provider(u32::MAX);
    let mut tool = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::UnkeyedWrite,
            RetryBudget::default(),
        ))
        .service(provider);
    let err = call(&mut tool, charge()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert!(!err.retryable());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_read_with_no_classifier_given_over_an_http_client_retries_a_503() {
    let (calls, provider) = provider(2);
    let mut tool = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .service(provider);
    let resp = call(
        &mut tool,
        http::Request::get("/search").body(String::new()).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[cfg(feature = "reqwest")]
#[tokio::test]
async fn a_retry_left_on_its_defaults_over_reqwest_reads_the_status_and_the_key() {
    // reqwest's `Client` is a tower service of `reqwest::Request`: the default replay copies the
    // request (with its key), and the default classifier reads a 502 as ambiguous.
    use std::convert::Infallible;
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let server = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = if n < 2 { 502 } else { 200 };
            Ok::<_, Infallible>(
                http::Response::builder()
                    .status(status)
                    .body(http_body_util::Full::new(bytes::Bytes::from("ok")))
                    .unwrap(),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = hyper::service::service_fn({
                let server = server.clone();
                move |req| {
                    let mut server = server.clone();
                    tower::Service::call(&mut server, req)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
            );
        }
    });
    let client = reqwest::Client::builder().build().unwrap();
    let mut charge = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::KeyedWrite,
            RetryBudget::default(),
        ))
        .service(client.clone());
    let keyed = client
        .post(format!("http://{addr}/charges"))
        .header("idempotency-key", "run-1:step-2:charge:4471")
        .build()
        .unwrap();
    let resp = call(&mut charge, keyed).await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), calls.load(Ordering::SeqCst)),
        (200, 3)
    );

    // Without its key, an ambiguous 502 of a keyed write is not retried.
    calls.store(0, Ordering::SeqCst);
    let unkeyed = client
        .post(format!("http://{addr}/charges"))
        .build()
        .unwrap();
    let err = call(&mut charge, unkeyed).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::MissingIdempotencyKey);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
