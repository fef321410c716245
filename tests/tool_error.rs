//! The JSON a model reads, and the error chain a program reads.
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
