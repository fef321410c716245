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
