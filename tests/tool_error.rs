//! The JSON a model reads, and the error chain a program reads.
use serde::Deserialize;
use std::error::Error;
use std::time::Duration;
use stormguard::classify::FailureClass;
use stormguard::error::{ErrorCode, ToolError};

#[test]
fn json_shape_is_stable() {
    let err = ToolError::new(ErrorCode::RateLimited)
        .with_class(FailureClass::Transient)
        .with_attempts(3)
        .with_retry_after(Duration::from_millis(1500))
        .with_retryable(false)
        .with_hint("slow down");
    assert_eq!(
        err.to_json(),
        serde_json::json!({
            "code": "rate_limited",
            "retryable": false,
            "hint": "slow down",
            "retry_after_ms": 1500,
            "attempts": 3,
            "class": "transient",
            "cause": null,
        })
    );
    let bare = ToolError::new(ErrorCode::OutcomeUnknown).to_json();
    assert_eq!(bare["retry_after_ms"], serde_json::Value::Null);
    assert_eq!(bare["class"], serde_json::Value::Null);
    assert_eq!(bare["retryable"], false);
}

#[test]
fn every_code_has_a_stable_string_and_an_actionable_hint() {
    for code in ErrorCode::ALL {
        let s = code.as_str();
        assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
        assert_eq!(ErrorCode::parse(s), Some(code));
        assert_eq!(serde_json::to_value(code).unwrap(), s);
        let hint = code.default_hint();
        assert!(hint.len() > 20 && !hint.ends_with('.'), "{s}: {hint}");
    }
    for (code, retryable) in [
        (ErrorCode::Unavailable, true),
        (ErrorCode::OutcomeUnknown, false),
        (ErrorCode::MissingIdempotencyKey, false),
        (ErrorCode::RetryBudgetExhausted, false),
        (ErrorCode::InvalidArgument, false),
    ] {
        assert_eq!(ToolError::new(code).retryable(), retryable, "{code}");
    }
}

#[test]
fn display_is_lowercase_and_the_source_chain_is_kept() {
    let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let err = ToolError::new(ErrorCode::Unavailable)
        .with_hint(
            "connection refused; retryable; the database may be unreachable from outside the VPN",
        )
        .with_source(io);
    assert_eq!(
        err.to_string(),
        "unavailable: connection refused; retryable; the database may be unreachable from outside the VPN"
    );
    let source = err.source().unwrap();
    assert!(source.downcast_ref::<std::io::Error>().is_some());
}

#[test]
fn mcp_result_carries_is_error() {
    let result = ToolError::new(ErrorCode::CircuitOpen).to_mcp_result();
    assert_eq!(result["isError"], true);
    let text = result["content"][0]["text"].as_str().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(parsed["code"], "circuit_open");
}

/// `{"code": "internal", "cause": {"code": "timeout", "cause": ... }}`, `depth` causes deep,
/// built in memory (serde_json's parser would refuse text nested this deep).
fn cause_chain(depth: usize) -> serde_json::Value {
    let mut value = serde_json::json!({"code": "timeout", "hint": "the deepest"});
    for _ in 0..depth {
        // Not `json!`, which would serialise (copy) `value` at every level.
        let mut level = serde_json::Map::new();
        level.insert("code".into(), "internal".into());
        level.insert("retryable".into(), false.into());
        level.insert("cause".into(), value);
        value = serde_json::Value::Object(level);
    }
    value
}

fn chain_len(err: &ToolError) -> usize {
    let mut next: Option<&(dyn Error + 'static)> = Some(err);
    let mut n = 0;
    while let Some(e) = next {
        n += 1;
        next = e.source();
    }
    n
}

/// On a thread with a small stack: reading a 5,000-deep `cause` chain (or one 100,000 deep, or
/// a deep value under any other field) neither recurses without bound nor aborts the process.
#[test]
fn a_cause_chain_5000_deep_is_read_to_a_bounded_depth_not_a_stack_overflow() {
    use stormguard::error::MAX_CAUSE_DEPTH;
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            for depth in [5_000, 100_000] {
                let deep = cause_chain(depth);
                let err = ToolError::from_json(&deep).expect("the shape, its deepest causes cut");
                assert_eq!(err.code(), ErrorCode::Internal);
                assert_eq!(chain_len(&err), MAX_CAUSE_DEPTH + 1);
                assert_eq!(err.cause().unwrap().code(), ErrorCode::Internal);
                // serde: the same value is refused with an error, not read without bound
                // (borrowed: a deep value's own clone and drop recurse).
                let via_serde = ToolError::deserialize(&deep);
                assert!(via_serde.unwrap_err().to_string().contains("nested deeper"));
                drop(err);
                // A deep serde_json value's own drop recurses; not what is tested here.
                std::mem::forget(deep);
            }
            // A deep value under a field that is not read is never walked.
            let mut junk = serde_json::json!(1);
            for _ in 0..5_000 {
                junk = serde_json::Value::Array(vec![junk]);
            }
            let mut value = serde_json::Map::new();
            value.insert("code".into(), "unavailable".into());
            value.insert("extra".into(), junk);
            let value = serde_json::Value::Object(value);
            assert_eq!(
                ToolError::from_json(&value).unwrap().code(),
                ErrorCode::Unavailable
            );
            assert!(ToolError::deserialize(&value).is_err());
            std::mem::forget(value);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_cause_chain_up_to_the_bound_is_read_whole_and_round_trips_through_serde() {
    use stormguard::error::MAX_CAUSE_DEPTH;
    for depth in [0, 1, 2, MAX_CAUSE_DEPTH - 1, MAX_CAUSE_DEPTH] {
        let value = cause_chain(depth);
        let err = ToolError::from_json(&value).unwrap();
        assert_eq!(chain_len(&err), depth + 1, "depth {depth}");
        let via_serde: ToolError = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(chain_len(&via_serde), depth + 1, "depth {depth}");
        let text: ToolError = serde_json::from_str(&value.to_string()).unwrap();
        assert_eq!(text.to_json(), err.to_json());
    }
    // One past the bound: the deepest cause is cut, the rest kept.
    let err = ToolError::from_json(&cause_chain(MAX_CAUSE_DEPTH + 1)).unwrap();
    assert_eq!(chain_len(&err), MAX_CAUSE_DEPTH + 1);
    // A malformed cause within the bound is still "not this shape".
    let bad = serde_json::json!({"code": "internal", "cause": {"code": "no_such_code"}});
    assert!(ToolError::from_json(&bad).is_none());
}

/// The layers that do not return a `ToolError` (the breaker, the key and receipt layers, the
/// keyed quotas return a `BoxError`) give one with `ToolError::from` / `.into()` / `?`: the one
/// the layer made, or the inner error classified, kept as the source.
#[tokio::test(start_paused = true)]
async fn every_layers_boxed_error_becomes_a_tool_error_with_into() {
    use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
    use stormguard::error::BoxError;
    use stormguard::key::{Action, SetIdempotencyKeyLayer};
    use tower::{Layer, Service, ServiceExt};

    let config = BreakerConfig::builder()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(5), Duration::from_secs(30))
        .build()
        .unwrap();
    let mut breaker = CircuitBreakerLayer::new(Breaker::new("billing-api", config)).layer(
        tower::service_fn(|_: ()| async {
            Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        }),
    );
    // The dependency's own error, passed through boxed: classified, kept as the source.
    let boxed: BoxError = breaker.ready().await.unwrap().call(()).await.unwrap_err();
    let err = ToolError::from(boxed);
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert_eq!(err.class(), Some(FailureClass::Transient));
    assert!(err.source().unwrap().is::<std::io::Error>());
    // The breaker's own rejection: the ToolError it made, as it is.
    let err: ToolError = breaker
        .ready()
        .await
        .unwrap()
        .call(())
        .await
        .unwrap_err()
        .into();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));

    // `?` in a function that returns a ToolError.
    async fn stamped(req: http::Request<u64>) -> Result<bool, ToolError> {
        let echo = tower::service_fn(|req: http::Request<u64>| async move {
            Ok::<_, std::convert::Infallible>(req.headers().contains_key("idempotency-key"))
        });
        let derive =
            |req: &http::Request<u64>| Action::new("run-1", "step-2", "charge", req.body());
        let svc = SetIdempotencyKeyLayer::new(derive).layer(echo);
        Ok(svc.oneshot(req).await?)
    }
    assert!(stamped(http::Request::new(7)).await.unwrap());
    let mut minted = http::Request::new(7);
    minted
        .headers_mut()
        .insert("idempotency-key", "a-random-uuid".parse().unwrap());
    assert_eq!(
        stamped(minted).await.unwrap_err().code(),
        ErrorCode::IdempotencyKeyChanged
    );
}
