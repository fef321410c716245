//! What a caller gets back through the receipt guard (from real HTTP servers on 127.0.0.1 where
//! the answer is HTTP): a 503 on a write, a key the caller sent, a receipt that answers (an old one
//! too), a streamed answer, a key reused with other arguments.
#![cfg(all(feature = "sqlite", feature = "postgres"))]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{HttpClassifier, NotProcessed};
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::{Action, IdempotencyKey, KeyStamp};
use stormguard::receipt::{
    Codec, Durability, InMemoryStore, ManualClock, NotStored, ReceiptGuardLayer, ReceiptStore,
    SqliteStore,
};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::receipts::{code, crash, layer, send, Provider, T0};
use support::server::{self, Body, HttpClient};
use support::stores::temp_db;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

// ---------------------------------------------------------------------------------------------
// 1. A 503 on a write is not proof that nothing happened.

/// The HTTP client below the receipt layer, its answer reduced to the status (what the tool's
/// caller needs, and what a receipt can hold).
fn status_client() -> tower::util::BoxCloneService<http::Request<Body>, http::Response<()>, BoxError>
{
    tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(|resp: http::Response<hyper::body::Incoming>| resp.map(|_| ()))
            .service(HttpClient::new()),
    )
}

#[derive(Clone)]
struct StatusCodec;

impl Codec<http::Response<()>> for StatusCodec {
    fn encode(&self, res: &http::Response<()>) -> Result<Vec<u8>, BoxError> {
        Ok(res.status().as_u16().to_be_bytes().to_vec())
    }
    fn decode(&self, bytes: &[u8]) -> Result<http::Response<()>, BoxError> {
        let code = u16::from_be_bytes(bytes.try_into()?);
        Ok(http::Response::builder().status(code).body(())?)
    }
}

fn email(addr: std::net::SocketAddr) -> http::Request<Body> {
    http::Request::post(format!("http://{addr}/emails/4471"))
        .body(Body::default())
        .unwrap()
}

fn email_action(req: &http::Request<Body>) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-2", "send_email", &req.uri().path())
}

#[tokio::test]
async fn a_503_after_the_work_is_never_a_second_email_reported_as_success() {
    // The provider sends the email, then a proxy in front of it answers 503 (upstream reset).
    let (addr, emails) = server::serve(|_| server::status(503, &[])).await;
    let store = SqliteStore::open(temp_db("503"), Durability::Process).unwrap();
    let receipts = ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, email_action)
        .classifier(HttpClassifier)
        .codec(StatusCodec);
    let mut tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts.clone())
        .service(status_client());
    let err = tool
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(emails.load(Ordering::SeqCst), 1, "not sent again");
    // The agent resumes and asks again: the intent is pending, nothing tells whether the email
    // went out, so it stays escalated.
    let mut resumed = receipts.layer(status_client());
    let err = resumed
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap_err();
    assert_eq!(code(err), ErrorCode::OutcomeUnknown);
    assert_eq!(emails.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_503_on_a_read_is_still_retried_and_a_documented_not_processed_503_is_retried_for_writes()
{
    let (addr, calls) = server::serve(|n| server::status(if n < 2 { 503 } else { 200 }, &[])).await;
    let mut read = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(status_client());
    let get = http::Request::get(format!("http://{addr}/invoices/4471"))
        .body(Body::default())
        .unwrap();
    assert_eq!(
        read.ready()
            .await
            .unwrap()
            .call(get)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // A provider documented to answer 503 only before processing, with no proxy in between.
    let (addr, calls) = server::serve(|n| server::status(if n < 1 { 503 } else { 200 }, &[])).await;
    let documented =
        NotProcessed::new(HttpClassifier, [http::StatusCode::SERVICE_UNAVAILABLE]).unwrap();
    let store = InMemoryStore::new();
    let mut write = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
                .classifier(documented)
                .replay(HttpReplay),
        )
        .layer(
            ReceiptGuardLayer::new(store, ToolClass::UnkeyedWrite, email_action)
                .classifier(documented)
                .codec(StatusCodec),
        )
        .service(status_client());
    let ok = write
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the 503 was trusted: sent again"
    );
}

// ---------------------------------------------------------------------------------------------
// 14. Smaller promises.

#[tokio::test]
async fn an_old_receipt_on_hand_still_answers() {
    let clock = ManualClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let first = svc.ready().await.unwrap().call(send(141)).await.unwrap();
    clock.advance_ms(8 * 24 * 3600 * 1000); // past the 7-day retention
    assert_eq!(
        svc.ready().await.unwrap().call(send(141)).await.unwrap(),
        first
    );
    assert_eq!(provider.deliveries(), 1);
    // An old intent without a receipt is refused, with a hint that says how to settle it.
    crash(&store, 142).await;
    clock.advance_ms(8 * 24 * 3600 * 1000);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(send(142))
        .await
        .unwrap_err();
    let err = err.downcast::<ToolError>().unwrap();
    assert_eq!(err.code(), ErrorCode::ReceiptExpired);
    assert!(err.hint().contains("resolve"), "{}", err.hint());
}

#[tokio::test]
async fn a_non_ascii_idempotency_key_from_the_caller_is_refused_not_overwritten() {
    let (addr, calls) = server::serve(|_| server::status(200, &[])).await;
    let mut tool =
        ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, email_action)
            .classifier(HttpClassifier)
            .codec(StatusCodec)
            .layer(status_client());
    let mut req = email(addr);
    req.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes(b"caf\xe9-4471").unwrap(),
    );
    let err = tool.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(code(err), ErrorCode::InvalidArgument);
    let mut stamp = stormguard::key::SetIdempotencyKeyLayer::new(|_: &http::Request<Body>| {
        IdempotencyKey::parse("run-1:step-2:send:abc").map(Action::from_key)
    })
    .layer(status_client());
    let mut req = email(addr);
    req.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes(b"caf\xe9-4471").unwrap(),
    );
    let err = stamp.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(code(err), ErrorCode::InvalidArgument);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------------------
// Found by an outside review.

#[tokio::test]
async fn a_keyed_write_answered_503_is_retried_not_stored_as_its_receipt() {
    let (addr, calls) =
        server::serve(|n| server::status(if n == 0 { 503 } else { 200 }, &[])).await;
    let store = InMemoryStore::new();
    let receipts = ReceiptGuardLayer::new(store, ToolClass::KeyedWrite, email_action)
        .classifier(HttpClassifier)
        .codec(StatusCodec);
    let mut tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts.clone())
        .service(status_client());
    let ok = tool.ready().await.unwrap().call(email(addr)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // The 200 is the receipt: a resume is answered from it.
    let again = receipts
        .layer(status_client())
        .oneshot(email(addr))
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------------------------------
// Issue 20, items 16b and 17b.

/// 17b: a retry answered from a stored receipt never reached the dependency; the error counts
/// only the attempts that did.
#[tokio::test]
async fn an_answer_from_a_stored_receipt_is_not_counted_as_an_attempt() {
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    // A receipt layer whose classifier disagrees with the Retry's: it stores the 503.
    let every_answer_a_success =
        |_: &Result<http::Response<()>, BoxError>| stormguard::classify::Classification::success();
    let receipts =
        ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, email_action)
            .classifier(every_answer_a_success)
            .codec(StatusCodec);
    let tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts)
        .service(status_client());
    let err = tool.oneshot(email(addr)).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one request");
    assert_eq!(err.attempts(), 1, "{err}");
}

/// 16b: a receipt layer over a streamed answer (decided at its end, never stored) needs no codec
/// that could store it: `NotStored` says so.
#[tokio::test]
async fn a_receipt_layer_runs_over_a_streaming_body() {
    use http_body_util::BodyExt;
    let (addr, calls) =
        server::serve(|_| http::Response::new(Body::from("a stream of tokens"))).await;
    let store = InMemoryStore::new();
    let tool = ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, email_action)
        .classifier(stormguard::classify::GrpcClassifier)
        .codec(NotStored)
        .layer(HttpClient::new());
    let resp = tool.clone().oneshot(email(addr)).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"a stream of tokens");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // No receipt: the intent stays pending, its lease given up; a keyed repeat is sent again
    // with the same key (the provider deduplicates it).
    assert_eq!(store.pending(10).await.unwrap()[0].lease_left_ms, 0);
    let again = tool.oneshot(email(addr)).await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A charge: the key covers the order, the fingerprint the order and the amount.
#[derive(Clone)]
struct Amount {
    order: u64,
    amount: u32,
    key: Option<String>,
}

impl KeyStamp for Amount {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

fn amount(order: u64, amount: u32) -> Amount {
    Amount {
        order,
        amount,
        key: None,
    }
}

fn amount_action(req: &Amount) -> Result<Action, stormguard::key::KeyError> {
    Action::task(
        "run-1",
        "step-3",
        "charge",
        &serde_json::json!({"order": req.order, "amount": req.amount}),
        &["order"],
        &["order", "amount"],
    )
}

/// Item 7: the same key with other arguments (another fingerprint) is refused with a hint that
/// names the key, says whether the first request has its receipt, and tells the model not to
/// reword a repeated action; nothing is sent, and the first request's record stays.
#[tokio::test]
async fn a_key_reused_with_other_arguments_is_refused_with_what_became_of_the_first() {
    let store = InMemoryStore::new();
    let sent = Arc::new(AtomicU32::new(0));
    let counter = sent.clone();
    let provider = tower::service_fn(move |req: Amount| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, std::io::Error>(format!("ch-{}", req.order)) }
    });
    let tool =
        ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, amount_action).layer(provider);
    // Pending: a crashed run recorded the order with amount 100.
    let first = amount_action(&amount(7, 100)).unwrap();
    store
        .begin(
            first.key().as_str(),
            first.fingerprint(),
            "crashed",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let err = code_and_hint(tool.clone().oneshot(amount(7, 120)).await.unwrap_err());
    assert_eq!(err.0, ErrorCode::IdempotencyKeyReused);
    assert!(err.1.contains(first.key().as_str()), "{}", err.1);
    assert!(err.1.contains("pending"), "{}", err.1);
    assert!(err.1.contains("do not reword"), "{}", err.1);
    // Done: the first request's receipt holds the result.
    let done = amount_action(&amount(8, 100)).unwrap();
    assert_eq!(tool.clone().oneshot(amount(8, 100)).await.unwrap(), "ch-8");
    let err = code_and_hint(tool.clone().oneshot(amount(8, 120)).await.unwrap_err());
    assert_eq!(err.0, ErrorCode::IdempotencyKeyReused);
    assert!(err.1.contains(done.key().as_str()), "{}", err.1);
    assert!(err.1.contains("receipt"), "{}", err.1);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.pending(10).await.unwrap().len(),
        1,
        "the crashed one's"
    );
}

fn code_and_hint(err: BoxError) -> (ErrorCode, String) {
    let err = err.downcast::<ToolError>().unwrap();
    assert!(!err.retryable());
    (err.code(), err.hint().to_string())
}
