//! One `Retry` layer against tower-test's mock: readiness, the request replayed, errors.
use std::future::poll_fn;
use std::io;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use tower::{Layer, Service};
use tower_test::{assert_request_eq, mock};

#[tokio::test(start_paused = true)]
async fn replays_the_same_request_after_a_transient_error() {
    let (mock, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(mock);

    handle.allow(1);
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let response = tokio::spawn(svc.call("get user 7"));

    assert_request_eq!(handle, "get user 7")
        .send_error(io::Error::from(io::ErrorKind::ConnectionRefused));
    // The retry waits for the mock to be ready again (allow(0) keeps it pending).
    handle.allow(1);
    assert_request_eq!(handle, "get user 7").send_response("alice");
    assert_eq!(response.await.unwrap().unwrap(), "alice");
}

#[tokio::test(start_paused = true)]
async fn poll_ready_waits_for_the_inner_service() {
    let (mock, mut handle) = mock::pair::<u8, u8>();
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(mock);
    handle.allow(0);
    let mut task = tokio_test::task::spawn(poll_fn(move |cx| svc.poll_ready(cx)));
    assert!(task.poll().is_pending());
    handle.allow(1);
    assert!(task.is_woken());
    assert!(task.poll().is_ready());
}

#[tokio::test(start_paused = true)]
async fn a_model_recoverable_error_reaches_the_caller_once() {
    let (mock, mut handle) = mock::pair::<u8, u8>();
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(mock);
    handle.allow(5);
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let response = tokio::spawn(svc.call(1));
    assert_request_eq!(handle, 1).send_error(io::Error::new(
        io::ErrorKind::InvalidInput,
        "date must be YYYY-MM-DD",
    ));
    let err = response.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(!err.retryable());
    // Nothing else was sent: once the service is gone the mock's queue ends empty.
    drop(svc);
    assert!(handle.next_request().await.is_none());
}
