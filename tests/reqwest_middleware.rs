//! The stormguard stack as a reqwest-middleware `Middleware` (feature `reqwest-middleware`),
//! against a server on 127.0.0.1, beside reqwest-retry's `RetryTransientMiddleware`.

mod support;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use std::sync::atomic::Ordering;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::error::ErrorCode;
use stormguard::error::ToolError;
use stormguard::middleware::Guard;
use stormguard::retry::RetryLayer;
use support::server;

/// reqwest with its own retries off: the middlewares own them.
fn reqwest() -> reqwest013::Client {
    reqwest013::Client::builder()
        .retry(reqwest013::retry::never())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn guard(class: ToolClass, budget: &RetryBudget) -> Guard {
    Guard::new(RetryLayer::new(class, budget.clone()))
}

fn tool_error(err: &reqwest_middleware::Error) -> &ToolError {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ToolError>().unwrap(),
        other => panic!("not a stormguard error: {other}"),
    }
}

#[tokio::test]
async fn three_nested_guards_make_3_calls_where_three_reqwest_retry_make_27() {
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    let url = format!("http://{addr}/search");

    let budget = RetryBudget::default();
    let ours: ClientWithMiddleware = ClientBuilder::new(reqwest())
        .with(guard(ToolClass::Read, &budget))
        .with(guard(ToolClass::Read, &budget))
        .with(guard(ToolClass::Read, &budget))
        .build();
    let err = ours.get(&url).send().await.unwrap_err();
    assert_eq!(tool_error(&err).code(), ErrorCode::Unavailable);
    assert_eq!(tool_error(&err).attempts(), 3);
    assert_eq!(
        calls.swap(0, Ordering::SeqCst),
        3,
        "one operation, three attempts in all"
    );

    // The same nesting with reqwest-retry, 3 attempts each (2 retries), 1 ms backoff.
    let policy = || {
        ExponentialBackoff::builder()
            .retry_bounds(Duration::from_millis(1), Duration::from_millis(2))
            .build_with_max_retries(2)
    };
    let theirs = ClientBuilder::new(reqwest())
        .with(RetryTransientMiddleware::new_with_policy(policy()))
        .with(RetryTransientMiddleware::new_with_policy(policy()))
        .with(RetryTransientMiddleware::new_with_policy(policy()))
        .build();
    let answer = theirs.get(&url).send().await.unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 27, "3 x 3 x 3");
}

#[tokio::test]
async fn an_unkeyed_write_behind_a_502_is_sent_once_and_ends_outcome_unknown() {
    let (addr, calls) = server::serve(|_| server::status(502, &[])).await;
    let client = ClientBuilder::new(reqwest())
        .with(guard(ToolClass::UnkeyedWrite, &RetryBudget::default()))
        .build();
    let err = client
        .post(format!("http://{addr}/tickets"))
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert_eq!(tool_error(&err).code(), ErrorCode::OutcomeUnknown);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_keyed_write_is_retried_with_its_key() {
    let (addr, calls, keys) =
        server::serve_keys(|n| server::status(if n == 0 { 502 } else { 200 }, &[])).await;
    let client = ClientBuilder::new(reqwest())
        .with(guard(ToolClass::KeyedWrite, &RetryBudget::default()))
        .build();
    let answer = client
        .post(format!("http://{addr}/charges"))
        .header("idempotency-key", "run-1/charge/inv-42")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        [
            Some("run-1/charge/inv-42".to_string()),
            Some("run-1/charge/inv-42".to_string())
        ]
    );
}

#[tokio::test]
async fn a_keyed_write_without_its_key_is_not_retried() {
    let (addr, calls) = server::serve(|_| server::status(502, &[])).await;
    let client = ClientBuilder::new(reqwest())
        .with(guard(ToolClass::KeyedWrite, &RetryBudget::default()))
        .build();
    let err = client
        .post(format!("http://{addr}/charges"))
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert_eq!(tool_error(&err).code(), ErrorCode::MissingIdempotencyKey);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The agent's own `Retry` (a tower layer over the tool function) above a client whose guard
/// retries too: one operation, 3 calls, not 9.
#[tokio::test]
async fn a_tool_retry_above_the_client_guard_shares_its_attempts() {
    use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    let budget = RetryBudget::default();
    let client = ClientBuilder::new(reqwest())
        .with(guard(ToolClass::Read, &budget))
        .build();
    let url = format!("http://{addr}/search");
    let search = service_fn(move |q: String| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let answer = client.get(format!("{url}?q={q}")).send().await?;
            if answer.status().is_server_error() {
                return Err(ToolError::new(ErrorCode::Unavailable).into());
            }
            Ok::<_, stormguard::error::BoxError>(answer.status().as_u16())
        }
    });
    let mut tool = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .service(search);
    let err = tool
        .ready()
        .await
        .unwrap()
        .call("storm".into())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
