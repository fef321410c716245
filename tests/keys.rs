//! Idempotency keys: stable, order-free, distinct per action, bounded, free of raw values; and
//! the stamping layer that keeps one key per operation.
mod support;

use serde_json::json;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::key::{Action, IdempotencyKey, SetIdempotencyKeyLayer};
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
        .layer(SetIdempotencyKeyLayer::new(
            |req: &http::Request<String>| {
                Action::new("run-1", "step-2", "charge", &json!({"amount": req.body()}))
            },
        ))
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
        .layer(SetIdempotencyKeyLayer::new(
            move |_req: &http::Request<String>| {
                // The classic bug: a fresh key per attempt.
                let n = counter.fetch_add(1, Ordering::SeqCst);
                Action::new("run-1", "step-2", "charge", &json!({ "nonce": n }))
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
    use stormguard::key::Action;
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

mod canonical {
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use stormguard::key::{canonical_json, IdempotencyKey, MAX_DEPTH};

    fn key(v: &impl serde::Serialize) -> IdempotencyKey {
        IdempotencyKey::derive("run-1", "step-2", "charge", v).unwrap()
    }

    /// Saved as JSON text (a checkpoint) and read back.
    fn reloaded(v: &Value) -> Value {
        serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            (1u32..100_000, 1u32..1_000)
                .prop_map(|(a, b)| Value::from(f64::from(a) * 0.01 * f64::from(b) / 7.0)),
            "[a-zé\u{301}\"\\\\\n\u{1}]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z\u{e9}\u{1f600}_]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// A value saved as JSON and read back gives the same key (floats included).
        #[test]
        fn a_save_and_reload_keeps_the_key(v in json_value()) {
            prop_assert_eq!(key(&v), key(&reloaded(&v)));
        }

        /// Equal values give one key, different values different keys: the canonical text is
        /// equal exactly when the values are (numbers compared as numbers).
        #[test]
        fn one_key_per_value(a in json_value(), b in json_value()) {
            let same = canonical_json(&a).unwrap() == canonical_json(&b).unwrap();
            prop_assert_eq!(same, numerically_equal(&a, &b));
            prop_assert_eq!(key(&a) == key(&b), same);
        }

        /// Two different doubles never share a key; a double and the integer it equals do.
        #[test]
        fn doubles_are_told_apart(x in any::<f64>(), y in any::<f64>()) {
            prop_assume!(x.is_finite() && y.is_finite());
            let equal = x == y;
            prop_assert_eq!(key(&x) == key(&y), equal);
            if x.fract() == 0.0 && x.abs() < 9.0e15 {
                prop_assert_eq!(key(&x), key(&(x as i64)));
            }
        }
    }

    /// The reference model of JSON equality: numbers by value, objects by members.
    fn numerically_equal(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                match (x.as_i64(), x.as_u64(), y.as_i64(), y.as_u64()) {
                    (Some(i), _, Some(j), _) => i == j,
                    (_, Some(i), _, Some(j)) => i == j,
                    _ if x.is_f64() || y.is_f64() => {
                        let (p, q) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                        // An integer and a double are equal only if the double is that integer.
                        let exact = |n: &serde_json::Number, f: f64| {
                            n.as_i64().is_none_or(|i| f == i as f64 && (f as i64) == i)
                                && n.as_u64().is_none_or(|u| f == u as f64 && (f as u64) == u)
                        };
                        p == q && exact(x, q) && exact(y, p)
                    }
                    _ => false,
                }
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| numerically_equal(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| numerically_equal(v, w)))
            }
            _ => a == b,
        }
    }

    #[test]
    fn everyday_computed_floats_keep_their_key_after_a_reload() {
        // The outside review's case: prices times tax rates, 60,000 of them.
        let mut changed = 0;
        for cents in 1..=60_000u32 {
            let price = json!({"amount": f64::from(cents) * 0.01 * 1.19, "currency": "EUR"});
            if key(&price) != key(&reloaded(&price)) {
                changed += 1;
            }
        }
        assert_eq!(changed, 0);
    }

    #[test]
    fn one_number_one_form() {
        assert_eq!(key(&json!(1e16)), key(&json!(10_000_000_000_000_000u64)));
        assert_eq!(key(&json!(1.0)), key(&json!(1)));
        assert_eq!(key(&json!(-0.0)), key(&json!(0)));
        assert_eq!(
            canonical_json(&json!([1e21, 1e-7, 123.456, 0.000001])).unwrap(),
            "[1e+21,1e-7,123.456,0.000001]"
        );
        // Integers beyond 2^53 stay exact: two ids that differ only there are two actions.
        assert_ne!(
            key(&json!(9_007_199_254_740_993u64)),
            key(&json!(9_007_199_254_740_992u64))
        );
        // Members sorted by UTF-16 code units (RFC 8785): U+1F600 (a surrogate pair, 0xD83D)
        // sorts before U+FF5E, although its code point is larger.
        assert_eq!(
            canonical_json(&json!({"\u{ff5e}": 1, "\u{1f600}": 2})).unwrap(),
            "{\"\u{1f600}\":2,\"\u{ff5e}\":1}"
        );
    }

    #[test]
    fn non_finite_numbers_are_refused_not_read_as_null() {
        #[derive(serde::Serialize)]
        struct Charge {
            amount: f64,
            note: Option<String>,
        }
        for amount in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err =
                IdempotencyKey::derive("run-1", "step-2", "charge", &Charge { amount, note: None })
                    .unwrap_err();
            assert_eq!(err.part(), "args");
        }
        let err = IdempotencyKey::derive("run-1", "step-2", "charge", &[f32::NAN]).unwrap_err();
        assert_eq!(err.part(), "args");
    }

    #[test]
    fn nfc_and_nfd_strings_are_two_keys_as_documented() {
        let nfc = json!({"name": "Caf\u{e9}"});
        let nfd = json!({"name": "Cafe\u{301}"});
        assert_ne!(key(&nfc), key(&nfd));
    }

    #[test]
    fn a_value_nested_5000_deep_is_an_error_not_a_stack_overflow() {
        // On a thread with a small stack (256 KiB): the check is bounded by MAX_DEPTH.
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                let mut deep = json!(1);
                for _ in 0..5_000 {
                    deep = Value::Array(vec![deep]);
                }
                let err = IdempotencyKey::derive("run-1", "step-2", "charge", &deep).unwrap_err();
                assert_eq!(err.part(), "args");
                assert!(canonical_json(&deep).is_err());
                let mut ok = json!(1);
                for _ in 0..MAX_DEPTH - 1 {
                    ok = Value::Array(vec![ok]);
                }
                assert!(IdempotencyKey::derive("run-1", "step-2", "charge", &ok).is_ok());
                // A deep serde_json value's own drop recurses; not what is tested here.
                std::mem::forget(deep);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}

/// `.ci/run` runs this once more with serde_json's `arbitrary_precision` on (a feature any crate
/// in a build may turn on), where a number keeps its source text.
#[test]
fn one_number_in_three_spellings_is_one_key_whatever_serde_jsons_features() {
    let spellings = ["0.1", "0.10", "1e-1", "1.0e-1"];
    let keys: Vec<_> = spellings
        .iter()
        .map(|s| {
            let v: serde_json::Value = serde_json::from_str(&format!("{{\"rate\": {s}}}")).unwrap();
            IdempotencyKey::derive("run-1", "step-2", "charge", &v).unwrap()
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    let big: serde_json::Value = serde_json::from_str("[10000000000000000, 1e16, 1.0e16]").unwrap();
    assert_eq!(
        stormguard::key::canonical_json(&big).unwrap(),
        "[10000000000000000,10000000000000000,10000000000000000]"
    );
}

#[test]
fn an_f32_saved_and_read_back_keeps_its_key() {
    #[derive(serde::Serialize)]
    struct Order {
        qty: f32,
        price: f64,
    }
    for qty in [0.1f32, 1.1, 3.3e-7, 16_777_217.0, f32::MAX] {
        let order = Order {
            qty,
            price: 0.01 * 1.19,
        };
        let text = serde_json::to_string(&order).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            IdempotencyKey::derive("r", "s", "t", &order).unwrap(),
            IdempotencyKey::derive("r", "s", "t", &back).unwrap(),
            "{text}"
        );
    }
}

#[test]
fn no_identity_fields_and_integers_beyond_64_bits_are_refused() {
    let args = json!({"invoice_id": 4471});
    assert!(IdempotencyKey::derive_fields("r", "s", "t", &args, &[]).is_err());
    assert!(stormguard::key::Action::task("r", "s", "t", &args, &[], &["invoice_id"]).is_err());
    assert!(IdempotencyKey::derive("r", "s", "t", &(u128::from(u64::MAX) + 1)).is_err());
    assert!(IdempotencyKey::derive("r", "s", "t", &i128::MIN).is_err());
    assert!(IdempotencyKey::derive("r", "s", "t", &u128::from(u64::MAX)).is_ok());
}
