//! Idempotency keys: stable, order-free, distinct per action, bounded, free of raw values; and
//! the stamping layer that keeps one key per operation.
mod support;

use serde_json::json;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::key::{IdempotencyKey, IdempotencyKeyLayer};
use stormguard::retry::RetryLayer;
use support::call;
use tower::ServiceBuilder;

#[test]
fn the_same_action_gives_the_same_key_in_every_process() {
    // A constant, computed independently: sha256(b'{"invoice_id":4471}')[:16] in Python. If this
    // changes, keys minted before the change no longer match after it, and every pending intent
    // in every store would be treated as new. Never change it casually.
    let key = IdempotencyKey::derive(
        "run-81f2",
        "step-2",
        "send_invoice",
        &json!({"invoice_id": 4471}),
    )
    .unwrap();
    assert_eq!(
        key.as_str(),
        "run-81f2:step-2:send_invoice:d4842b791cf21395919daabd89c42b3d"
    );
}

#[test]
fn argument_order_whitespace_and_number_form_do_not_matter() {
    let a = IdempotencyKey::derive(
        "r",
        "s",
        "t",
        &json!({"a": 1, "b": [1, 2], "c": {"x": 1.0}}),
    )
    .unwrap();
    let parsed: serde_json::Value =
        serde_json::from_str(r#"{ "c" : {"x":1}, "b":[1,2],  "a":1.0 }"#).unwrap();
    let b = IdempotencyKey::derive("r", "s", "t", &parsed).unwrap();
    assert_eq!(a, b);
}

#[test]
fn different_steps_tools_and_arguments_give_different_keys() {
    let args = json!({"invoice_id": 4471});
    let base = IdempotencyKey::derive("run-1", "step-2", "send", &args).unwrap();
    for other in [
        IdempotencyKey::derive("run-2", "step-2", "send", &args).unwrap(),
        IdempotencyKey::derive("run-1", "step-3", "send", &args).unwrap(),
        IdempotencyKey::derive("run-1", "step-2", "charge", &args).unwrap(),
        IdempotencyKey::derive("run-1", "step-2", "send", &json!({"invoice_id": 4472})).unwrap(),
    ] {
        assert_ne!(base, other);
    }
}

#[test]
fn keys_are_bounded_and_hold_no_raw_values() {
    let secret = "sk_live_51H8dontleakme";
    let long = "x".repeat(64);
    let key = IdempotencyKey::derive(
        &long,
        &long,
        &long,
        &json!({"api_key": secret, "body": "y".repeat(10_000)}),
    )
    .unwrap();
    assert!(key.as_str().len() <= 255, "{} bytes", key.as_str().len());
    assert!(!key.as_str().contains(secret));
    assert!(key.as_str().bytes().all(|b| b.is_ascii_graphic()));
}

#[test]
fn bad_parts_are_rejected() {
    let args = json!({});
    assert_eq!(
        IdempotencyKey::derive("", "s", "t", &args)
            .unwrap_err()
            .part(),
        "run"
    );
    assert_eq!(
        IdempotencyKey::derive("r", "a:b", "t", &args)
            .unwrap_err()
            .part(),
        "step"
    );
    assert_eq!(
        IdempotencyKey::derive("r", "s", &"t".repeat(65), &args)
            .unwrap_err()
            .part(),
        "tool"
    );
    assert!(IdempotencyKey::parse("has space").is_err());
    assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_first_attempts_key() {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let provider = tower::service_fn(move |req: http::Request<String>| {
        let log = log.clone();
        async move {
            let key = req.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_string();
            let attempt = {
                let mut log = log.lock().unwrap();
                log.push(key);
                log.len()
            };
            if attempt < 3 {
                Err::<u32, BoxError>(support::error_for(FailureClass::Ambiguous))
            } else {
                Ok(7)
            }
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::KeyedWrite,
            RetryBudget::default(),
        ))
        .layer(IdempotencyKeyLayer::new(|req: &http::Request<String>| {
            IdempotencyKey::derive("run-1", "step-2", "charge", &json!({"amount": req.body()}))
        }))
        .service(provider);
    let req = http::Request::post("/charge")
        .body("1200".to_string())
        .unwrap();
    // A keyed write with ambiguous failures is retried only because the key layer marked it.
    assert_eq!(call(&mut svc, req).await.unwrap(), 7);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|k| k == &seen[0]));
}

#[tokio::test(start_paused = true)]
async fn a_key_that_changes_between_attempts_is_refused() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let minted = std::sync::Arc::new(AtomicU32::new(0));
    let counter = minted.clone();
    let provider = tower::service_fn(|_req: http::Request<String>| async {
        Err::<u32, BoxError>(support::error_for(FailureClass::Transient))
    });
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::KeyedWrite,
            RetryBudget::default(),
        ))
        .layer(IdempotencyKeyLayer::new(
            move |_req: &http::Request<String>| {
                // The classic bug: a fresh key per attempt.
                let n = counter.fetch_add(1, Ordering::SeqCst);
                IdempotencyKey::derive("run-1", "step-2", "charge", &json!({ "nonce": n }))
            },
        ))
        .service(provider);
    let err = call(
        &mut svc,
        http::Request::post("/charge").body(String::new()).unwrap(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyChanged);
    assert_eq!(
        minted.load(Ordering::SeqCst),
        2,
        "refused at the second attempt"
    );
}

/// A key read back from a checkpoint is checked like one parsed: a space or a newline is refused,
/// not carried into a header that would drop it.
#[test]
fn a_key_read_back_is_checked_like_a_key_parsed() {
    let key = stormguard::key::IdempotencyKey::derive("run-1", "step-2", "send", &7).unwrap();
    let saved = serde_json::to_string(&key).unwrap();
    assert_eq!(
        serde_json::from_str::<stormguard::key::IdempotencyKey>(&saved).unwrap(),
        key
    );
    for bad in ["\"run-1:step 2\"", "\"run-1:step\\n2\"", "\"\""] {
        assert!(
            serde_json::from_str::<stormguard::key::IdempotencyKey>(bad).is_err(),
            "{bad}"
        );
    }
}

/// A missing or misspelled identity field is an error, not `null`: invoice 2 is never taken
/// for invoice 1.
#[test]
fn a_missing_identity_field_is_an_error_not_null() {
    use stormguard::receipt::Action;
    let one = serde_json::json!({"invoice": 1, "to": "a@b.test"});
    let two = serde_json::json!({"invoice": 2, "to": "a@b.test"});
    let fields = ["invoice_id"]; // misspelled: the arguments say "invoice"
    for args in [&one, &two] {
        let err = Action::task("run-1", "step-2", "send", args, &fields, &fields).unwrap_err();
        assert_eq!(err.part(), "args");
    }
    let a = Action::task("run-1", "step-2", "send", &one, &["invoice"], &["invoice"]).unwrap();
    let b = Action::task("run-1", "step-2", "send", &two, &["invoice"], &["invoice"]).unwrap();
    assert_ne!(a.key(), b.key());
}
