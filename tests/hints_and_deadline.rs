//! Server hints (Retry-After, grpc-retry-pushback-ms) and the operation deadline.
mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::HttpClassifier;
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use support::{call, http_script};
use tokio::time::Instant;
use tower::Layer;

type Req = http::Request<String>;

fn req() -> Req {
    http::Request::get("/").body(String::new()).unwrap()
}

fn constant(ms: u64) -> ClassPolicy {
    ClassPolicy::builder(ToolClass::Read)
        .backoff(
            Backoff::constant(Duration::from_millis(ms))
                .jitter(Jitter::None)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retry_after_replaces_the_backoff() {
    let (calls, dep) = http_script(429, &[("retry-after", "7")], 1);
    let mut svc = RetryLayer::new(constant(10), RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let start = Instant::now();
    let resp = call(&mut svc, req()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(start.elapsed(), Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_is_clamped_to_the_policy_maximum() {
    let (_, dep) = http_script(503, &[("retry-after", "86400")], 1);
    let policy = constant(10)
        .into_builder()
        .max_server_delay(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut svc = RetryLayer::new(policy, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let start = Instant::now();
    call(&mut svc, req()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn a_malformed_retry_after_is_ignored() {
    let (_, dep) = http_script(503, &[("retry-after", "in a while")], 1);
    let mut svc = RetryLayer::new(constant(10), RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let start = Instant::now();
    call(&mut svc, req()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn a_negative_pushback_forbids_the_retry() {
    let (calls, dep) = http_script(503, &[("grpc-retry-pushback-ms", "-1")], 5);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(!err.retryable());
}

#[tokio::test(start_paused = true)]
async fn a_failed_retry_reports_the_servers_delay() {
    let (_, dep) = http_script(429, &[("retry-after", "3")], 10);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(err.to_json()["retry_after_ms"], 3000);
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_whose_backoff_would_pass_the_deadline() {
    let (calls, dep) = http_script(503, &[("retry-after", "4")], 10);
    let policy = constant(10)
        .into_builder()
        .max_attempts(5)
        .deadline(Duration::from_secs(6))
        .build()
        .unwrap();
    let mut svc = RetryLayer::new(policy, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    // Attempt at 0 s, retry at 4 s; a retry at 8 s would pass the 6 s deadline.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(!err.retryable());
    assert_eq!(start.elapsed(), Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn a_404_is_an_answer_not_a_failure() {
    let (calls, dep) = http_script(404, &[], 10);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let resp = call(&mut svc, req()).await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_500_on_an_unkeyed_write_escalates_and_a_keyed_one_retries() {
    use stormguard::retry::HttpReplay;
    let (calls, dep) = http_script(500, &[], 1);
    let mut unkeyed = RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
        .classifier(HttpClassifier)
        .replay(HttpReplay)
        .layer(dep);
    let err = call(
        &mut unkeyed,
        http::Request::post("/send").body(String::new()).unwrap(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (calls, dep) = http_script(500, &[], 1);
    let mut keyed = RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
        .classifier(HttpClassifier)
        .replay(HttpReplay)
        .layer(dep);
    let keyed_req = http::Request::post("/send")
        .header("idempotency-key", "run-1:step-2:send:abc")
        .body(String::new())
        .unwrap();
    assert_eq!(call(&mut keyed, keyed_req).await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A budget with one retry's worth in its balance and no floor.
fn one_retry_budget() -> RetryBudget {
    let budget = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .retry_ratio(1.0)
        .build()
        .unwrap();
    budget.deposit();
    budget
}

#[tokio::test(start_paused = true)]
async fn a_throttled_retry_the_server_scheduled_costs_the_budget_less() {
    // 429 + Retry-After twice: each retry costs 5/14 of one, so one retry's worth pays for both.
    assert_eq!(two_failures(429, &[("retry-after", "1")]).await, (3, None));
    // A Retry-After of 0 is no schedule to honour: full price, one retry's worth pays for one.
    let spent = Some(ErrorCode::RetryBudgetExhausted);
    assert_eq!(two_failures(429, &[("retry-after", "0")]).await, (2, spent));
    // A 503 with the same Retry-After is an overload, not throttling: a retry costs two, so one
    // retry's worth pays for none (and the dependency's acceptance never pays for it).
    assert_eq!(two_failures(503, &[("retry-after", "1")]).await, (1, spent));
}

/// Two failures of `status`, then 200, through a `Read` layer with one retry's worth of budget:
/// the calls the server saw, and the error code if the call failed.
async fn two_failures(
    status: u16,
    headers: &'static [(&'static str, &'static str)],
) -> (u32, Option<ErrorCode>) {
    let (calls, dep) = http_script(status, headers, 2);
    let mut svc = RetryLayer::new(ToolClass::Read, one_retry_budget())
        .classifier(HttpClassifier)
        .layer(dep);
    let code = call(&mut svc, req()).await.err().map(|e| e.code());
    (calls.load(Ordering::SeqCst), code)
}

#[tokio::test(start_paused = true)]
async fn a_budget_spent_on_throttling_says_so_and_when_to_come_back() {
    let (_, dep) = http_script(429, &[("retry-after", "2")], 10);
    let budget = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    let mut svc = RetryLayer::new(ToolClass::Read, budget)
        .classifier(HttpClassifier)
        .layer(dep);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted);
    assert!(err.hint().contains("rate limiting"), "{}", err.hint());
    assert!(err.hint().contains("wait 2 s"), "{}", err.hint());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
}

/// The final hint says "the last attempt may have taken effect" only after a write: a read
/// changes nothing, however ambiguous its failure (a 503 it gave up on, a 503 whose server
/// asked not to be retried).
#[tokio::test(start_paused = true)]
async fn only_a_writes_final_hint_says_it_may_have_taken_effect() {
    const MAYBE: &str = "may have taken effect";
    for (class, may_have_acted) in [(ToolClass::Read, false), (ToolClass::IdempotentWrite, true)] {
        for headers in [&[][..], &[("grpc-retry-pushback-ms", "-1")][..]] {
            let headers: &'static [(&str, &str)] = headers;
            let (_, dep) = http_script(503, headers, u32::MAX);
            let backoff = Backoff::constant(Duration::from_millis(10))
                .jitter(Jitter::None)
                .build()
                .unwrap();
            let policy = ClassPolicy::builder(class)
                .backoff(backoff)
                .build()
                .unwrap();
            let mut svc = RetryLayer::new(policy, RetryBudget::default())
                .classifier(HttpClassifier)
                .layer(dep);
            let err = call(&mut svc, req()).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Unavailable, "{class:?} {headers:?}");
            assert_eq!(
                err.hint().contains(MAYBE),
                may_have_acted,
                "{class:?} {headers:?}: {}",
                err.hint()
            );
        }
    }
}

/// A Read policy with a 300 ms deadline.
fn deadline_300ms() -> ClassPolicy {
    constant(10)
        .into_builder()
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A quota of one call a second whose burst is already spent: the next call waits 1 s.
async fn spent_quota() -> stormguard::quota::QuotaLayer {
    use stormguard::quota::{QuotaLayer, Rate};
    use tower::ServiceExt;
    let quota = QuotaLayer::new(Rate::per_second(1).burst(1).build().unwrap());
    let noop = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
    quota.layer(noop).oneshot(()).await.unwrap();
    quota
}

/// The case: a 300 ms deadline behind a 1 s quota wait. The wait happens in the
/// `Retry`'s `poll_ready` and starts the deadline's clock; by the call the deadline has passed,
/// so the first attempt is not sent: `deadline_exceeded`, no attempts.
#[tokio::test(start_paused = true)]
async fn no_first_attempt_starts_after_the_deadline() {
    let (calls, dep) = http_script(200, &[], 0);
    let mut svc = RetryLayer::new(deadline_300ms(), RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(spent_quota().await.layer(dep));
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "sent after the deadline");
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(!err.retryable());
    assert_eq!(err.attempts(), 0);
    assert!(err.hint().contains("not sent"), "{}", err.hint());
}

/// The same when the deadline is a nested layer's (its own `poll_ready` waited), and when the
/// operation crosses a `Buffer` and the wait happens in its worker, behind the boundary.
#[tokio::test(start_paused = true)]
async fn no_first_attempt_starts_after_a_nested_or_buffered_deadline() {
    use stormguard::operation::{AdoptLayer, AttachLayer};
    use tower::ServiceBuilder;

    // Outer layer without a deadline, inner layer with one.
    let (calls, dep) = http_script(200, &[], 0);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()).classifier(HttpClassifier))
        .layer(RetryLayer::new(deadline_300ms(), RetryBudget::default()).classifier(HttpClassifier))
        .layer(spent_quota().await)
        .service(dep);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nested: sent after the deadline"
    );
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(!err.retryable());
    assert!(err.hint().contains("not sent"), "{}", err.hint());
    // The outer layer counts the attempt it started (the ledger's count), although the layer
    // below did not send it.
    assert!(err.attempts() <= 1);

    // The outer layer's deadline, carried across a Buffer to a layer that waits behind it.
    let (calls, dep) = http_script(200, &[], 0);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(deadline_300ms(), RetryBudget::default()).classifier(HttpClassifier))
        .layer(AttachLayer::new())
        .buffer(4)
        .layer(AdoptLayer::new())
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()).classifier(HttpClassifier))
        .layer(spent_quota().await)
        .service(dep);
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "buffered: sent after the deadline"
    );
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    // The deadline cuts the wait off at 300 ms: it does not wait for the quota's 1 s.
    assert_eq!(start.elapsed(), Duration::from_millis(300));

    // A deadline that has not passed lets the first attempt through after the wait.
    let (calls, dep) = http_script(200, &[], 0);
    let policy = constant(10)
        .into_builder()
        .deadline(Duration::from_millis(1_001))
        .build()
        .unwrap();
    let mut svc = RetryLayer::new(policy, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(spent_quota().await.layer(dep));
    assert_eq!(call(&mut svc, req()).await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A retry whose quota slot comes exactly at the deadline is not sent: no attempt starts at or
/// after the deadline, even when the service and the deadline wake the retry together.
#[tokio::test(start_paused = true)]
async fn a_retry_ready_exactly_at_the_deadline_is_not_sent() {
    use stormguard::quota::{QuotaLayer, Rate};
    let (calls, dep) = http_script(503, &[], u32::MAX);
    let quota = QuotaLayer::new(Rate::per_second(1).burst(1).build().unwrap());
    let policy = constant(10)
        .into_builder()
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut svc = RetryLayer::new(policy, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(quota.layer(dep));
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a retry was sent at the deadline"
    );
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

/// A quota that waits inside its call (a keyed quota: the key is in the request) holds the
/// deadline too: the call is not sent after it.
#[tokio::test(start_paused = true)]
async fn a_keyed_quota_does_not_send_a_call_after_the_deadline() {
    use stormguard::quota::{KeyedQuotaLayer, Rate};
    let (calls, dep) = http_script(200, &[], 0);
    let rate = Rate::per_second(1).burst(1).build().unwrap();
    let quota = KeyedQuotaLayer::new(rate, |_: &Req| ("tenant-a", 1));
    let mut svc = RetryLayer::new(deadline_300ms(), RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(quota.layer(dep));
    call(&mut svc, req()).await.unwrap(); // spends the burst
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "sent after the deadline");
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(!err.retryable());
    // The deadline cuts the wait off at 300 ms: it does not wait for the quota's 1 s.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

/// The documented stack, `Retry → ReceiptGuardLayer → … → Quota`: the receipt layer is always ready
/// and waits for the quota inside its call, so it holds the deadline too. Nothing is sent, and
/// the intent it recorded is removed (never sent), so a later call is not blocked by it.
#[tokio::test(start_paused = true)]
async fn a_receipt_layer_does_not_send_a_call_after_the_deadline() {
    use stormguard::key::Action;
    use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
    use stormguard::retry::HttpReplay;
    use tower::ServiceBuilder;

    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = calls.clone();
    let dep = tower::service_fn(move |_: Req| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::io::Error>(200u16) }
    });
    let action = |req: &Req| Action::new("run-1", "step-2", "send_invoice", &req.uri().to_string());
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(
                ClassPolicy::builder(ToolClass::KeyedWrite)
                    .deadline(Duration::from_millis(300))
                    .build()
                    .unwrap(),
                RetryBudget::default(),
            )
            .replay(HttpReplay),
        )
        .layer(ReceiptGuardLayer::new(
            InMemoryStore::new(),
            ToolClass::KeyedWrite,
            action,
        ))
        .layer(spent_quota().await)
        .service(dep);
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "sent after the deadline");
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    // The deadline cuts the wait off at 300 ms: it does not wait for the quota's 1 s.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    // Once the quota has room again, the same action goes, with no pending intent in its way
    // (the slot the refused call reserved is spent: the next one comes at 2 s).
    tokio::time::sleep_until(start + Duration::from_secs(2)).await;
    assert_eq!(call(&mut svc, req()).await.unwrap(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A limit on the server's wait cuts a long `Retry-After` to the limit but never below the
/// class's backoff: with the limit at zero, a 429 asking for 7 s is retried after the backoff,
/// not at once (outside review: three calls at t = 0).
#[tokio::test(start_paused = true)]
async fn a_server_wait_past_the_limit_is_cut_to_the_limit_but_never_below_the_backoff() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use stormguard::class::{ClassPolicy, ToolClass};
    use stormguard::retry::RetryLayer;
    use tower::{Layer, Service, ServiceExt};
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let dependency = tower::service_fn(move |_: http::Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = if n < 2 { 429 } else { 200 };
            Ok::<_, std::io::Error>(
                http::Response::builder()
                    .status(status)
                    .header("retry-after", "7")
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    for (limit, at_least, at_most) in [
        (
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_secs(7),
        ),
        (
            Duration::from_secs(2),
            Duration::from_secs(4),
            Duration::from_secs(7),
        ),
    ] {
        calls.store(0, Ordering::SeqCst);
        let policy = ClassPolicy::builder(ToolClass::Read)
            .max_server_delay(limit)
            .build()
            .unwrap();
        let mut read = RetryLayer::new(policy, stormguard::budget::RetryBudget::default())
            .layer(dependency.clone());
        let started = tokio::time::Instant::now();
        let answer = read
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let waited = started.elapsed();
        assert!(
            waited >= at_least && waited < at_most,
            "limit {limit:?}: waited {waited:?}"
        );
    }
}
