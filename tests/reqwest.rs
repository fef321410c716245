//! stormguard on a reqwest `Client` (a tower `Service<reqwest::Request>`), against a real HTTP
//! server on 127.0.0.1 that records the `Idempotency-Key` of every request it receives.
#![cfg(feature = "reqwest")]

mod support;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::{HttpClassifier, ReqwestClassifier};
use stormguard::error::ErrorCode;
use stormguard::error::ToolError;
use stormguard::key::{Action, SetIdempotencyKeyLayer};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::call;
use tower::ServiceBuilder;

/// What the server does with its n-th request (from 0): a status, and how long to wait first.
type Script = Arc<dyn Fn(usize) -> (u16, Duration) + Send + Sync>;

/// Starts the server; returns its address and the `Idempotency-Key` of each request received.
async fn serve(
    script: impl Fn(usize) -> (u16, Duration) + Send + Sync + 'static,
) -> (SocketAddr, Arc<Mutex<Vec<Option<String>>>>) {
    serve_redirecting(script, None).await
}

/// The same, with `location` on every answer (for a `303 See Other`).
async fn serve_redirecting(
    script: impl Fn(usize) -> (u16, Duration) + Send + Sync + 'static,
    location: Option<String>,
) -> (SocketAddr, Arc<Mutex<Vec<Option<String>>>>) {
    let script: Script = Arc::new(script);
    let keys: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = keys.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, seen, location) = (script.clone(), seen.clone(), location.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let key = req
                        .headers()
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(key);
                        seen.len() - 1
                    };
                    let (status, delay) = script(n);
                    let location = location.clone();
                    async move {
                        tokio::time::sleep(delay).await;
                        let mut resp = http::Response::builder().status(status);
                        if let Some(location) = location {
                            resp = resp.header("location", location);
                        }
                        let resp = resp.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, keys)
}

fn retry(class: ToolClass) -> RetryLayer<HttpClassifier, HttpReplay> {
    retry_with(class, HttpClassifier)
}

fn retry_with<C>(class: ToolClass, classifier: C) -> RetryLayer<C, HttpReplay> {
    let fast = stormguard::backoff::Backoff::exponential(Duration::from_millis(5))
        .build()
        .unwrap();
    RetryLayer::new(
        ClassPolicy::builder(class).backoff(fast).build().unwrap(),
        RetryBudget::default(),
    )
    .classifier(classifier)
    .replay(HttpReplay)
}

fn post(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Request {
    client
        .post(format!("http://{addr}/charges"))
        .body(r#"{"order":7,"cents":1200}"#)
        .build()
        .unwrap()
}

fn key_of(req: &reqwest::Request) -> Result<Action, stormguard::key::KeyError> {
    let body = req.body().and_then(|b| b.as_bytes()).unwrap_or_default();
    Action::new(
        "run-81f2",
        "step-3",
        "charge",
        &String::from_utf8_lossy(body),
    )
}

#[tokio::test]
async fn a_503_is_retried_until_the_server_answers() {
    let (addr, keys) = serve(|n| (if n < 2 { 503 } else { 200 }, Duration::ZERO)).await;
    let client = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::Read))
        .service(client.clone());
    let get = client
        .get(format!("http://{addr}/charges/7"))
        .build()
        .unwrap();
    let resp = call(&mut svc, get).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(keys.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_502_on_a_keyed_write_is_retried_with_the_same_key() {
    let (addr, keys) = serve(|n| (if n == 0 { 502 } else { 201 }, Duration::ZERO)).await;
    let client = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::KeyedWrite))
        .layer(SetIdempotencyKeyLayer::new(key_of))
        .service(client.clone());
    let resp = call(&mut svc, post(&client, addr)).await.unwrap();
    assert_eq!(resp.status(), 201);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let first = keys[0].clone().expect("the first attempt carries a key");
    assert!(first.starts_with("run-81f2:step-3:charge:"), "{first}");
    assert_eq!(keys[1].as_deref(), Some(first.as_str()));
}

#[tokio::test]
async fn a_timeout_after_sending_an_unkeyed_write_is_escalated_not_repeated() {
    let (addr, keys) = serve(|_| (200, Duration::from_secs(2))).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::UnkeyedWrite))
        .service(client.clone());
    let err: ToolError = call(&mut svc, post(&client, addr)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert_eq!(keys.lock().unwrap().len(), 1);
}

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test]
async fn without_redirects_a_refused_connection_is_retried_even_for_an_unkeyed_write() {
    // No redirects are followed, so a connect error means this request was never sent.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(retry_with(
            ToolClass::UnkeyedWrite,
            ReqwestClassifier::without_redirects(),
        ))
        .service(client.clone());
    let err: ToolError = call(&mut svc, post(&client, closed_port()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(err.attempts(), 3, "{err}");
}

#[tokio::test]
async fn by_default_a_connect_error_on_an_unkeyed_write_is_not_guessed_unsent() {
    // reqwest follows redirects by default: the connect error may come from the redirect after
    // the POST was carried out, so an unkeyed write is escalated, not repeated.
    let client = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::UnkeyedWrite))
        .service(client.clone());
    let err: ToolError = call(&mut svc, post(&client, closed_port()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert_eq!(err.attempts(), 1, "{err}");
}

#[tokio::test]
async fn a_post_carried_out_then_redirected_to_a_dead_host_is_not_repeated() {
    // The server takes the charge and answers 303; reqwest follows it to a closed port and the
    // connect fails. The error reads as a connect error, but the charge happened.
    let done = format!("http://{}/receipt", closed_port());
    let (addr, requests) = serve_redirecting(|_| (303, Duration::ZERO), Some(done)).await;
    let client = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::UnkeyedWrite))
        .service(client.clone());
    let err: ToolError = call(&mut svc, post(&client, addr)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert_eq!(
        requests.lock().unwrap().len(),
        1,
        "the charge was sent once"
    );
}
