//! The mistake of a tool body that folds the provider's HTTP answer into JSON below the stack
//! and gives `OkIsSuccess`: the JSON's own status (`{"status": 503}`) is read as the failure it
//! says, against a real HTTP server on 127.0.0.1, so no receipt records a 503 and a spent quota is
//! sent once.
#![cfg(feature = "reqwest")]

mod support;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use stormguard::classify::OkIsSuccess;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::tool::{Call, Stores, Toolbox};
use support::call;
use support::server::{self, serve, serve_keys};
use tower::{service_fn, Layer};

/// The user's body: sends the call with the stamped key, and answers the provider's status and
/// body as JSON, whatever the status (the mistake).
fn folding_body(
    addr: SocketAddr,
    path: &'static str,
) -> impl tower::Service<Call, Response = Value, Error = BoxError, Future = impl Send> + Clone + Send
{
    let client = reqwest::Client::new();
    service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}{path}"));
        async move {
            let mut req = client.post(url).body(call.args().to_string());
            if let Some(key) = call.key() {
                req = req.header("Idempotency-Key", key.to_string());
            }
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let body: Value = serde_json::from_str(&resp.text().await?).unwrap_or(Value::Null);
            Ok::<Value, BoxError>(json!({ "status": status, "body": body }))
        }
    })
}

fn json_answer(code: u16, body: Value) -> http::Response<server::Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A 503 folded into `{"status": 503}` on a keyed invoice with receipts: retried with the same
/// key (not recorded as the receipt), the second answer recorded, and the model's reissue answered
/// from that receipt. Counted once, on the call that was overruled.
#[test]
fn a_503_folded_into_json_is_retried_and_never_a_receipt() {
    let ((), counted) = support::counted::counting(async {
        let (addr, sent, keys) = serve_keys(|n| match n {
            0 => json_answer(503, json!({ "error": "upstream reset" })),
            _ => json_answer(200, json!({ "invoice": "in_4471" })),
        })
        .await;
        let tools = Toolbox::from_json_str(
            r#"{
                "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
                "tools": [{
                    "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
                    "key": ["run", "tool", "id:invoice_id"],
                    "receipt": { "store": "receipts", "provider_key_window_secs": 86400 },
                    "unknown_outcome": "escalate"
                }]
            }"#,
        )
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .classifier(OkIsSuccess)
            .layer(folding_body(addr, "/invoices"));
        let args = json!({ "invoice_id": 4471 });
        let first = call(&mut invoice, Call::new("run-9", "step-2", args.clone()))
            .await
            .unwrap();
        assert_eq!(first["status"], 200, "{first}");
        assert_eq!(sent.load(Ordering::SeqCst), 2, "the 503 was retried once");
        let keys = keys.lock().unwrap().clone();
        assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
        // The model reissues it: answered from the receipt of the 200, nothing sent.
        let again = call(&mut invoice, Call::new("run-9", "step-5", args))
            .await
            .unwrap();
        assert_eq!(again, first);
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    });
    let overruled = counted.series("stormguard_answer_status_overruled_total");
    assert_eq!(overruled.len(), 1, "{overruled:?}");
    assert!(overruled[0].0.contains(&"status=503".to_string()));
    assert_eq!(overruled[0].1, 1);
}

/// A spent quota folded into JSON on a chat tool: sent once, `quota_exhausted`, not retried as a
/// rate limit.
#[tokio::test]
async fn a_spent_quota_folded_into_json_is_sent_once() {
    let (addr, sent) = serve(|_| {
        json_answer(
            429,
            json!({ "error": { "type": "insufficient_quota", "message": "You exceeded your quota" } }),
        )
    })
    .await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "chat", "class": "read", "retry": ["layer"] }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    // The body folds the provider's error body in as `error`, as many SDK wrappers do.
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/v1/chat/completions"));
        async move {
            let resp = client.post(url).body("{}").send().await?;
            let status = resp.status().as_u16();
            let mut body: Value = serde_json::from_str(&resp.text().await?)?;
            body["status"] = json!(status);
            Ok::<Value, BoxError>(body)
        }
    });
    let mut chat = tools
        .layer("chat")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let err = call(&mut chat, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::QuotaExhausted, "{err}");
    assert!(!err.retryable());
    assert_eq!(err.attempts(), 1);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// A 4xx the declared stack does not retry ends as a `ToolError` (not `Ok`), with the status in
/// its cause and the attempts sent.
#[tokio::test]
async fn a_4xx_answer_ends_as_a_tool_error() {
    let (addr, sent) = serve(|_| server::status(400, &[])).await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "search_orders", "class": "read", "retry": ["layer"] }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/orders"));
        async move { Ok::<_, BoxError>(client.get(url).send().await?) }
    });
    // A `reqwest::Response` needs no codec: the default stores nothing of a streamed answer.
    let mut orders = tools.layer("search_orders").unwrap().layer(body);
    let err = call(&mut orders, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert_eq!(err.attempts(), 1);
    assert!(err.hint().contains("400"), "{}", err.hint());
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// Mistake: no `deadline_secs` and a client without a timeout over a provider that hangs. The
/// declared tool still has a deadline (five minutes): the call ends `deadline_exceeded`, it does
/// not wait without bound. (On tokio's paused clock: the hang is the body's.)
#[tokio::test(start_paused = true)]
async fn a_tool_without_a_deadline_is_not_waited_on_without_bound() {
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "search_orders", "class": "read", "retry": ["layer"] }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let body = service_fn(|_call: Call| async {
        std::future::pending::<()>().await;
        Ok::<Value, BoxError>(json!([]))
    });
    let mut orders = tools
        .layer("search_orders")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let started = tokio::time::Instant::now();
    let err = call(&mut orders, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded, "{err}");
    let waited = started.elapsed().as_secs();
    assert_eq!(
        waited,
        stormguard::tool::DEFAULT_DEADLINE_SECS,
        "{waited} s"
    );
}

/// A declared tool on its default classifier reads a spent quota from a body already in memory
/// (`http::Response<String>`), as `HttpClassifier` does: sent once, `quota_exhausted`.
#[tokio::test]
async fn a_spent_quota_in_memory_is_read_by_the_default_classifier() {
    let (addr, sent) = serve(|_| {
        json_answer(429, json!({ "error": { "type": "insufficient_quota", "message": "You exceeded your quota" } }))
    })
    .await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "lookup", "class": "read", "retry": ["layer"] }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/v1/x"));
        async move {
            let resp = client.get(url).send().await?;
            let status = resp.status().as_u16();
            let text = resp.text().await?;
            Ok::<_, BoxError>(http::Response::builder().status(status).body(text)?)
        }
    });
    let mut lookup = tools.layer("lookup").unwrap().layer(body);
    let err = call(&mut lookup, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::QuotaExhausted, "{err}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}
