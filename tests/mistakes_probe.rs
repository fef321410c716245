//! The silent mistakes a newcomer probe found (issue 37), each against a real HTTP server on
//! 127.0.0.1, with the remedy asserted: the crate reads what it can see (a status, the
//! arguments, the shape of the call) over what it was told.
#![cfg(feature = "reqwest")]

mod support;

use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use stormguard::classify::{ModelApiClassifier, OkIsSuccess};
use stormguard::error::{BoxError, ErrorCode};
use stormguard::tool::{Call, Stores, Toolbox};
use support::call;
use support::invoice::invoice_body;
use support::server::{self, serve_keys};
use tower::{service_fn, Layer};

/// Mistake: `.classifier(OkIsSuccess)` (the docs' advice for JSON) on a body that answers an
/// `http::Response`. A 503 before the work is the failure its status says: retried with the
/// key, never stored as the receipt (before: the 503 became the receipt, every reissue was
/// answered 503, and no invoice was ever sent). Said (WARN once) and counted.
#[test]
fn an_http_failure_under_ok_is_success_is_retried_not_a_receipt() {
    let ((sent, reissue), counted) = support::counted::counting(async {
        let (addr, sent, _) = serve_keys(|n| match n {
            0 => server::status(503, &[]),
            _ => server::status(201, &[]),
        })
        .await;
        let tools = support::invoice::invoice_tools(None);
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .classifier(OkIsSuccess)
            .layer(invoice_body(addr));
        let first = call(
            &mut invoice,
            Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
        )
        .await
        .unwrap();
        assert_eq!(first.status(), 201);
        let again = call(
            &mut invoice,
            Call::new("run-1", "step-5", json!({ "invoice_id": 7 })),
        )
        .await
        .unwrap();
        (sent.load(Ordering::SeqCst), again.status())
    });
    assert_eq!(
        sent, 2,
        "the 503, then the invoice; the reissue is answered from its receipt"
    );
    assert_eq!(reissue, 201, "the receipt is the invoice, not the 503");
    assert_eq!(counted.total("stormguard_answer_status_overruled_total"), 1);
}

/// Mistake: the model corrects the amount and reissues the invoice under the same key. The key
/// is the same, the amount is not: refused `idempotency_key_reused` (before: answered with the
/// first invoice's receipt, "success"). Reworded free text is the same action (a resume's model
/// writes the email again): answered from the receipt.
#[tokio::test]
async fn other_arguments_under_one_key_are_refused_not_answered_from_the_receipt() {
    let (addr, sent, _) = serve_keys(|_| server::status(201, &[])).await;
    let tools = support::invoice::invoice_tools(None);
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .layer(invoice_body(addr));
    let args = |amount: u32| json!({ "invoice_id": 7, "amount": amount });
    call(&mut invoice, Call::new("run-1", "step-2", args(100)))
        .await
        .unwrap();
    let err = call(&mut invoice, Call::new("run-1", "step-5", args(250)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyKeyReused, "{err}");
    assert!(err.hint().contains("other arguments"), "{}", err.hint());
    // The same amount, reissued (as the model may write it, with a note reworded): the receipt.
    let same = json!({ "amount": 100.0, "invoice_id": 7, "note": "reworded" });
    assert_eq!(
        call(&mut invoice, Call::new("run-1", "step-6", same))
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// Mistake: `ModelApiClassifier` over a body that answers `reqwest::Response`, without a
/// `PeekErrorBodyLayer`: a spent quota's 429 cannot be read, and is retried as a rate limit. The
/// crate says so (WARN once, `stormguard_unread_quota_bodies_total`), on any path.
#[test]
fn a_model_api_classifier_over_an_unread_429_says_so() {
    let (sent, counted) = support::counted::counting(async {
        let (addr, sent, _) =
            serve_keys(|_| server::status(429, &[("content-type", "application/json")])).await;
        let tools = Toolbox::from_json_str(
            r#"{"tools": [{ "name": "model_chat", "class": "read", "retry": ["layer"],
                            "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
        )
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let client = reqwest::Client::new();
        let body = service_fn(move |_call: Call| {
            let (client, url) = (client.clone(), format!("http://{addr}/proxy/llm"));
            async move { Ok::<_, BoxError>(client.post(url).body("{}").send().await?) }
        });
        let mut chat = tools
            .layer("model_chat")
            .unwrap()
            .classifier(ModelApiClassifier)
            .layer(body);
        let err = call(&mut chat, Call::new("run-1", "s1", json!({})))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited, "{err}");
        sent.load(Ordering::SeqCst)
    });
    assert!(sent > 1);
    assert_eq!(
        counted.total("stormguard_unread_quota_bodies_total"),
        u64::from(sent)
    );
}

/// Mistake: a model API's tool-call arguments passed on unparsed (a JSON string). Refused
/// `invalid_argument` with the fix, nothing sent (before: sent with every field missing).
#[tokio::test]
async fn arguments_as_an_unparsed_json_string_are_refused() {
    let (addr, sent, _) = serve_keys(|_| server::status(200, &[])).await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "search", "class": "read", "retry": ["layer"] }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let mut search = tools.layer("search").unwrap().layer(invoice_body(addr));
    let args = Value::String(r#"{"q": "refund policy"}"#.into());
    let err = call(&mut search, Call::new("run-1", "s1", args))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(
        err.hint().contains("serde_json::from_str"),
        "{}",
        err.hint()
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    // A plain string argument is not refused.
    call(
        &mut search,
        Call::new("run-1", "s2", json!("refund policy")),
    )
    .await
    .unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// Mistake: the status folded into JSON as `{"code": 503}` or `{"status": "503"}`: read as the
/// failure it says, retried (before: the 503 was a success).
#[tokio::test]
async fn a_status_folded_as_code_or_as_a_string_is_read() {
    for folded in [json!({ "code": 503 }), json!({ "status": "503" })] {
        let (addr, sent, _) = serve_keys(|n| match n {
            0 => server::status(503, &[]),
            _ => server::status(200, &[]),
        })
        .await;
        let tools = Toolbox::from_json_str(
            r#"{"tools": [{ "name": "search", "class": "read", "retry": ["layer"],
                            "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
        )
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let client = reqwest::Client::new();
        let shape = folded.clone();
        let body = service_fn(move |_call: Call| {
            let (client, url, shape) = (client.clone(), format!("http://{addr}/"), shape.clone());
            async move {
                let status = client.get(url).send().await?.status().as_u16();
                Ok::<_, BoxError>(if status == 200 {
                    json!({ "hits": [] })
                } else {
                    shape
                })
            }
        });
        let mut search = tools
            .layer("search")
            .unwrap()
            .classifier(OkIsSuccess)
            .layer(body);
        let answer = call(&mut search, Call::new("run-1", "s1", json!({})))
            .await
            .unwrap();
        assert_eq!(answer, json!({ "hits": [] }), "{folded}");
        assert_eq!(sent.load(Ordering::SeqCst), 2, "{folded}");
    }
}

/// Mistake: a ticket tool declared `read`, named without a write verb, its POST inside the body
/// (where no layer sees the method). Its first answer, `201 Created`, says it creates: said (WARN
/// once, `stormguard_class_from_evidence_total{evidence="created_answer"}`), and from then on its
/// ambiguous failure is not resent: `outcome_unknown`, one ticket (before: three, "success").
/// The call that taught it could not be told: the first answer is the evidence.
#[test]
fn a_read_that_answers_201_created_decides_as_a_write_from_then_on() {
    let ((tickets, err), counted) = support::counted::counting(async {
        let (addr, sent, _) = serve_keys(|n| match n {
            0 => server::status(201, &[]),
            1 => server::status(502, &[]),
            _ => server::status(201, &[]),
        })
        .await;
        let tools = Toolbox::from_json_str(
            r#"{"tools": [{ "name": "support_ticket", "class": "read", "retry": ["layer"],
                            "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
        )
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let mut ticket = tools
            .layer("support_ticket")
            .unwrap()
            .layer(invoice_body(addr));
        let first = call(&mut ticket, Call::new("run-1", "s1", json!({ "order": 1 })))
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
        let err = call(&mut ticket, Call::new("run-1", "s2", json!({ "order": 2 })))
            .await
            .unwrap_err();
        (sent.load(Ordering::SeqCst), err)
    });
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert!(err.hint().contains("201 Created"), "{}", err.hint());
    assert_eq!(tickets, 2, "the 502 after the second ticket is not resent");
    let series = counted.series("stormguard_class_from_evidence_total");
    assert!(
        series
            .iter()
            .any(|(labels, _)| labels.contains(&"evidence=created_answer".to_owned())),
        "{series:?}"
    );
}

/// Mistake (the model's): the invoice id written `4471`, then `"4471"` at a later step. An
/// identifier is read as one: one key, the reissue answered from the receipt, one invoice
/// (before: two keys, two invoices).
#[tokio::test]
async fn an_id_written_as_a_number_then_a_string_is_one_action() {
    let (addr, sent, keys) = serve_keys(|_| server::status(201, &[])).await;
    let tools = support::invoice::invoice_tools(None);
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .layer(invoice_body(addr));
    for (step, id) in [
        ("step-2", json!(4471)),
        ("step-5", json!("4471")),
        ("step-6", json!(" 4471 ")),
    ] {
        let answer = call(
            &mut invoice,
            Call::new("run-1", step, json!({ "invoice_id": id })),
        )
        .await
        .unwrap();
        assert_eq!(answer.status(), 201);
    }
    assert_eq!(sent.load(Ordering::SeqCst), 1, "{:?}", keys.lock().unwrap());
}
