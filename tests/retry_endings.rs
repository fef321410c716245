//! How a `Retry` ends an operation it cannot retry: an ambiguous write is escalated whatever
//! the server hinted, a malformed pushback means "do not retry", the final error keeps the
//! evidence (the response's status, the attempts made below) and never invites a retry.
mod support;

use std::sync::atomic::Ordering;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{FailureClass, HttpClassifier};
use stormguard::error::{ErrorCode, ToolError};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::{call, http_script};
use tower::{service_fn, Layer, ServiceBuilder};

type Req = http::Request<String>;

fn post() -> Req {
    http::Request::post("/send").body(String::new()).unwrap()
}

/// A read (a POST would be decided as the unkeyed write it shows it is).
fn get() -> Req {
    http::Request::get("/orders/7").body(String::new()).unwrap()
}

/// A hint never skips escalation: an ambiguous failure of an unkeyed write ends as
/// `outcome_unknown`, whatever the server said about retrying.
#[tokio::test(start_paused = true)]
async fn a_pushback_never_skips_the_escalation_of_an_ambiguous_write() {
    for pushback in ["-1", "abc", "250"] {
        let headers: &'static [(&str, &str)] = match pushback {
            "-1" => &[("grpc-retry-pushback-ms", "-1")],
            "abc" => &[("grpc-retry-pushback-ms", "abc")],
            _ => &[("grpc-retry-pushback-ms", "250")],
        };
        let (calls, dep) = http_script(502, headers, 10);
        let mut svc = RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
            .classifier(HttpClassifier)
            .replay(HttpReplay)
            .layer(dep);
        let err = call(&mut svc, post()).await.unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "pushback {pushback}");
        assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "pushback {pushback}");
        assert!(!err.retryable());
        assert!(err.hint().contains("escalate"), "{}", err.hint());
    }
}

/// The same for a non-retryable `ToolError` classed `Ambiguous` (from a tool, or from a
/// stormguard layer that lost the operation), on an unkeyed write and a keyless keyed write.
#[tokio::test(start_paused = true)]
async fn a_non_retryable_ambiguous_tool_error_is_escalated() {
    for (class, code) in [
        (ToolClass::UnkeyedWrite, ErrorCode::OutcomeUnknown),
        (ToolClass::MultiStep, ErrorCode::OutcomeUnknown),
        (ToolClass::KeyedWrite, ErrorCode::MissingIdempotencyKey),
    ] {
        let dep = service_fn(|_: u32| async {
            Err::<u32, _>(
                ToolError::new(ErrorCode::Unavailable)
                    .with_class(FailureClass::Ambiguous)
                    .with_retryable(false)
                    .with_hint("the upstream reset the connection after the request was sent"),
            )
        });
        let mut svc = RetryLayer::new(class, RetryBudget::default()).layer(dep);
        let err = call(&mut svc, 1).await.unwrap_err();
        assert_eq!(err.code(), code, "{class:?}");
        assert!(!err.retryable());
        // The dependency's own error is the cause.
        let cause = err.cause().expect("the tool's error is kept");
        assert_eq!(cause.code(), ErrorCode::Unavailable);
        assert_eq!(err.to_json()["cause"]["code"], "unavailable");
    }
}

/// A malformed pushback means "do not retry" (gRFC A6): one call, and a hint that does not say
/// "retry later".
#[tokio::test(start_paused = true)]
async fn a_malformed_pushback_means_do_not_retry() {
    for bad in ["abc", "1.5", "", "99999999999"] {
        let headers: &'static [(&str, &str)] = Box::leak(Box::new([(
            "grpc-retry-pushback-ms",
            Box::leak(bad.to_string().into_boxed_str()) as &str,
        )]));
        let (calls, dep) = http_script(503, headers, 10);
        let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
            .classifier(HttpClassifier)
            .layer(dep);
        let err = call(&mut svc, get()).await.unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "pushback {bad:?}");
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(!err.retryable());
        assert!(!err.hint().contains("retry later"), "{}", err.hint());
        assert!(
            err.hint().contains("asked not to be retried"),
            "{}",
            err.hint()
        );
    }
}

/// Giving up on an `Ok` response classified as a failure keeps the evidence: the real attempt
/// count, a hint that agrees with `retryable: false`, and what the dependency answered.
#[tokio::test(start_paused = true)]
async fn giving_up_on_a_response_keeps_the_evidence() {
    let (calls, dep) = http_script(503, &[], 100);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let err = call(&mut svc, get()).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(!err.retryable());
    assert!(
        err.hint().contains("do not repeat it now"),
        "{}",
        err.hint()
    );
    let cause = err.cause().expect("the response's status is kept");
    assert!(cause.hint().contains("503"), "{}", cause.hint());

    // Three nested layers, only the innermost reading HTTP: the count is the operation's.
    let (calls, dep) = http_script(503, &[], 100);
    let budget = RetryBudget::default();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget).classifier(HttpClassifier))
        .service(dep);
    let err = call(&mut stack, get()).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(err.attempts(), 3);
    assert!(err.cause().is_some());

    // Every way of giving up says not to retry now.
    let json = err.to_json();
    assert_eq!(json["retryable"], false);
    assert_eq!(json["attempts"], 3);
}

/// An escalation keeps the attempts made below it (across a boundary the operation did not
/// cross): whoever verifies the write learns it was sent 3 times, not once. (Outside review.)
#[tokio::test(start_paused = true)]
async fn an_escalation_keeps_the_attempts_made_below() {
    let below = service_fn(|_: u32| async {
        Err::<u32, _>(
            ToolError::new(ErrorCode::Unavailable)
                .with_class(FailureClass::Ambiguous)
                .with_retryable(false)
                .with_attempts(3),
        )
    });
    let mut svc = RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default()).layer(below);
    let err = call(&mut svc, 1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(err.attempts(), 3);
}

/// No hint of an error a `Retry` gives up with invites the reader to try again. (Outside review.)
#[tokio::test(start_paused = true)]
async fn a_final_hint_never_invites_a_retry() {
    let (_, dep) = http_script(503, &[], 100);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(HttpClassifier)
        .layer(dep);
    let err = call(&mut svc, post()).await.unwrap_err();
    assert!(!err.retryable());
    for phrase in ["try again", "try later", "retry later"] {
        assert!(!err.hint().contains(phrase), "{}", err.hint());
    }
    let budget = ErrorCode::RetryBudgetExhausted.default_hint();
    assert!(!budget.contains("try later"), "{budget}");
}
