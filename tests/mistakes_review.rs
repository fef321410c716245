//! What an outside review (a helper that read only the README and the docs) found silent in the
//! issue-37 work, each with its remedy, against a real HTTP server on 127.0.0.1.
#![cfg(feature = "reqwest")]

mod support;

use serde_json::json;
use std::sync::atomic::Ordering;
use stormguard::tool::{Call, Stores, Toolbox};
use support::call;
use support::invoice::{invoice_body, invoice_tools};
use support::server::{self, serve_keys};
use tower::Layer;

/// `"0012"` and `"12"` are two invoices (a zero-padded id is another id), and so are `"+12"`
/// and `"12"`: each is sent (before, the second was answered from the first's receipt and never
/// sent). `"12"` and `12`, and `" 12"`, are still one.
#[tokio::test]
async fn a_zero_padded_id_is_another_invoice_and_an_integer_as_a_string_is_the_same() {
    for (first, second, sends) in [
        (json!("0012"), json!("12"), 2),
        (json!("+12"), json!("12"), 2),
        (json!("007"), json!(7), 2),
        (json!("12"), json!(12), 1),
        (json!(" 12"), json!(12), 1),
    ] {
        let (addr, sent, _) = serve_keys(|_| server::status(201, &[])).await;
        let tools = invoice_tools(None);
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .layer(invoice_body(addr));
        for (step, id) in [("step-1", &first), ("step-2", &second)] {
            let answer = call(
                &mut invoice,
                Call::new("run-1", step, json!({ "invoice_id": id })),
            )
            .await;
            assert_eq!(answer.unwrap().status(), 201);
        }
        assert_eq!(sent.load(Ordering::SeqCst), sends, "{first} then {second}");
    }
}

/// A tool `chat` that declares no dependency has its own budget, not the budget of the tools
/// declaring `dependency = "chat"` (before: one budget, both named `chat`).
#[test]
fn a_tools_own_budget_is_not_a_dependency_of_the_same_name() {
    let tools = Toolbox::from_json_str(
        r#"{ "tools": [
        { "name": "chat", "class": "read", "retry": ["layer"] },
        { "name": "search", "class": "read", "retry": ["layer"], "dependency": "chat" },
        { "name": "summarize", "class": "read", "retry": ["layer"], "dependency": "chat" } ]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let (chat, search, summarize) = (
        tools.budget_of("chat").unwrap(),
        tools.budget_of("search").unwrap(),
        tools.budget_of("summarize").unwrap(),
    );
    search.deposit();
    assert!(search.balance() > 0.0);
    assert_eq!(
        summarize.balance(),
        search.balance(),
        "one dependency, one budget"
    );
    assert_eq!(chat.balance(), 0.0, "the tool's own budget is its own");
}

/// A named budget shared by a tool of the `openai` dependency and a tool declaring none is
/// flagged (before: only two declared dependencies were); a named budget whose tools declare no
/// dependency at all is the user's choice to share, and is not.
#[test]
fn a_named_budget_across_a_declared_dependency_and_none_is_flagged() {
    let flagged = |table: &str| {
        Toolbox::from_json_str(table)
            .unwrap()
            .audit()
            .findings
            .iter()
            .any(|f| f.code == "budget-across-dependencies")
    };
    assert!(flagged(
        r#"{ "budgets": { "default": { "ratio": 0.1, "min_per_sec": 10 } }, "tools": [
        { "name": "chat", "class": "read", "retry": ["layer"], "budget": "default", "dependency": "openai" },
        { "name": "lookup", "class": "read", "retry": ["layer"], "budget": "default" } ]}"#
    ));
    assert!(!flagged(
        r#"{ "budgets": { "default": { "ratio": 0.1, "min_per_sec": 10 } }, "tools": [
        { "name": "chat", "class": "read", "retry": ["layer"], "budget": "default" },
        { "name": "lookup", "class": "read", "retry": ["layer"], "budget": "default" } ]}"#
    ));
}

/// A read tool's stack made per call (`tools.layer(..)` inside the handler): the `201 Created`
/// an earlier stack saw is the tool's, so the later stack does not resend its ambiguous failure
/// (before: each new stack forgot it, and the 502 was resent as a read's).
#[tokio::test]
async fn a_201_seen_by_one_stack_of_a_read_is_known_to_the_next() {
    let (addr, sent, _) = serve_keys(|n| match n {
        0 => server::status(201, &[]),
        _ => server::status(502, &[]),
    })
    .await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "lookup", "class": "read", "retry": ["layer"],
                        "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let mut first = tools.layer("lookup").unwrap().layer(invoice_body(addr));
    let answer = call(&mut first, Call::new("run-1", "s1", json!({ "q": 1 }))).await;
    assert_eq!(answer.unwrap().status(), 201);
    let mut second = tools.layer("lookup").unwrap().layer(invoice_body(addr));
    let err = call(&mut second, Call::new("run-1", "s2", json!({ "q": 2 })))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        stormguard::error::ErrorCode::OutcomeUnknown,
        "{err}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 2, "the 502 is not resent");
}

/// A JSON answer that is only a provider's error envelope, from a body that read a 503 with
/// `.json::<Value>()` (its status lost), under `OkIsSuccess`: a failure, retried with the key,
/// never the receipt (before: the error body was stored as the invoice's receipt, the reissue was
/// answered from it, and no invoice was ever sent).
#[tokio::test]
async fn an_error_envelope_read_as_json_is_a_failure_not_the_receipt() {
    use bytes::Bytes;
    use http_body_util::Full;
    use stormguard::classify::OkIsSuccess;
    let (addr, sent, keys) = serve_keys(|n| {
        let (status, body) = match n {
            0 => (
                503,
                r#"{"error":{"type":"api_error","message":"upstream connect error"}}"#,
            ),
            _ => (201, r#"{"invoice":"in_1"}"#),
        };
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    })
    .await;
    let client = reqwest::Client::new();
    let body = tower::service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/invoices"));
        async move {
            let key = call.key().map(|k| k.to_string()).unwrap_or_default();
            let resp = client
                .post(url)
                .header("Idempotency-Key", key)
                .send()
                .await?;
            let text = resp.text().await?; // `.json()` needs reqwest's `json` feature
            Ok::<_, stormguard::error::BoxError>(serde_json::from_str::<serde_json::Value>(&text)?)
        }
    });
    let tools = invoice_tools(None);
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let first = call(
        &mut invoice,
        Call::new("run-1", "step-2", json!({ "invoice_id": 4471 })),
    )
    .await
    .unwrap();
    assert_eq!(first, json!({ "invoice": "in_1" }));
    let reissue = call(
        &mut invoice,
        Call::new("run-1", "step-5", json!({ "invoice_id": 4471 })),
    )
    .await
    .unwrap();
    assert_eq!(
        reissue,
        json!({ "invoice": "in_1" }),
        "the receipt is the invoice"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys[0], keys[1], "retried with its key");
}

/// A keyed write answered 404 (a route not deployed yet, an id the model then corrects) did
/// nothing: no receipt records it, so the reissue is sent (before: the 404 became the receipt,
/// and every reissue was answered 404 without being sent).
#[tokio::test]
async fn a_404_to_a_keyed_write_is_not_its_receipt() {
    let (addr, sent, _) = serve_keys(|n| match n {
        0 => server::status(404, &[]),
        _ => server::status(201, &[]),
    })
    .await;
    let tools = invoice_tools(None);
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .layer(invoice_body(addr));
    let args = json!({ "invoice_id": 4471 });
    let first = call(&mut invoice, Call::new("run-1", "step-2", args.clone())).await;
    assert_eq!(first.unwrap().status(), 404);
    let reissue = call(&mut invoice, Call::new("run-1", "step-5", args.clone())).await;
    assert_eq!(
        reissue.unwrap().status(),
        201,
        "sent, not answered from a 404"
    );
    let again = call(&mut invoice, Call::new("run-1", "step-6", args)).await;
    assert_eq!(again.unwrap().status(), 201, "the 201 is the receipt");
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

/// A ticket whose outcome is unknown is held; the model's reissue with the id written `"7"`
/// instead of `7` is the same call, refused `outcome_unknown`, not sent (before: a second ticket).
#[tokio::test]
async fn a_held_call_reissued_with_its_id_as_a_string_is_still_held() {
    let (addr, sent, _) = serve_keys(|n| match n {
        0 => server::status(502, &[]),
        _ => server::status(201, &[]),
    })
    .await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
                        "unknown_outcome": "escalate" }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let mut ticket = tools
        .layer("post_ticket")
        .unwrap()
        .layer(invoice_body(addr));
    let first = call(
        &mut ticket,
        Call::new("run-1", "s2", json!({ "ticket": 7 })),
    )
    .await;
    let code = first.unwrap_err().code();
    assert_eq!(code, stormguard::error::ErrorCode::OutcomeUnknown);
    let reissue = call(
        &mut ticket,
        Call::new("run-1", "s3", json!({ "ticket": "7" })),
    )
    .await;
    assert_eq!(
        reissue.unwrap_err().code(),
        stormguard::error::ErrorCode::OutcomeUnknown
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1, "one ticket");
}

/// A tool declared `read` whose server annotates it `destructiveHint: true` (merged by
/// `with_mcp_tools` / `with_listed_tools`), named without a write verb: the annotation is
/// evidence, the stricter wins, and its ambiguous failure is not resent (before: only the audit
/// said so; the runtime resent the 502 as a read's).
#[test]
fn a_read_its_server_calls_destructive_is_not_resent_after_an_ambiguous_failure() {
    use stormguard::tool::ListedTool;
    let listed = ListedTool::from_tools_list(&json!({ "tools": [
        { "name": "archive_record", "annotations": { "destructiveHint": true } }
    ]}))
    .unwrap();
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "archive_record", "class": "read", "retry": ["layer"],
                        "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
    )
    .unwrap()
    .with_listed_tools(&listed)
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ((err, sent), warnings) = support::logs::warnings(|| {
        rt.block_on(async {
            let (addr, sent, _) = serve_keys(|_| server::status(502, &[])).await;
            let mut archive = tools
                .layer("archive_record")
                .unwrap()
                .layer(invoice_body(addr));
            let answer = call(
                &mut archive,
                Call::new("run-1", "s1", json!({ "record": 7 })),
            )
            .await;
            (answer.unwrap_err(), sent.load(Ordering::SeqCst))
        })
    });
    assert_eq!(
        err.code(),
        stormguard::error::ErrorCode::OutcomeUnknown,
        "{err}"
    );
    assert!(err.hint().contains("destructiveHint"), "{}", err.hint());
    assert_eq!(sent, 1, "not resent");
    assert!(
        warnings.iter().any(|l| l.contains("destructive")),
        "{warnings:?}"
    );
}

/// One dependency spelt three ways is three budgets: the audit says so.
#[test]
fn a_dependency_spelt_three_ways_is_flagged() {
    let audit = Toolbox::from_json_str(
        r#"{ "tools": [
        { "name": "a", "class": "read", "retry": ["layer"], "dependency": "orders-api" },
        { "name": "b", "class": "read", "retry": ["layer"], "dependency": "orders_api" },
        { "name": "c", "class": "read", "retry": ["layer"], "dependency": "Orders-API" },
        { "name": "d", "class": "read", "retry": ["layer"], "dependency": "billing" } ]}"#,
    )
    .unwrap()
    .audit();
    let found: Vec<_> = audit
        .findings
        .iter()
        .filter(|f| f.code == "dependency-spelt-apart")
        .collect();
    assert_eq!(found.len(), 1, "{}", audit.to_markdown());
    assert!(found[0].message.contains("3 ways"), "{}", found[0].message);
}
