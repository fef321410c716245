//! Mistakes of what a user stacks around or under a declared tool, against a real HTTP server on
//! 127.0.0.1: a naive tower `Retry` around the tool's service, and a model API's 429 read
//! without its body.
#![cfg(feature = "reqwest")]

mod support;

use serde_json::json;
use std::future::{ready, Ready};
use std::sync::atomic::Ordering;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::tool::{Call, Stores, Toolbox};
use support::call;
use support::server::{self, serve};
use tower::{service_fn, Layer, ServiceBuilder};

/// tower's `Retry` as a user writes it first: every error, three attempts.
#[derive(Clone)]
struct RetryEveryError(u32);

impl<Res> tower::retry::Policy<Call, Res, ToolError> for RetryEveryError {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Call, result: &mut Result<Res, ToolError>) -> Option<Ready<()>> {
        match result {
            Err(_) if self.0 > 1 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }
}

/// Mistake: a naive tower `Retry` (every error, 3 attempts) around an unkeyed ticket tool whose
/// provider answers 502 after creating the ticket. The stack ends the first call
/// `outcome_unknown` and holds it: the two reissues are answered `outcome_unknown`, not sent.
/// One ticket.
#[tokio::test]
async fn a_naive_tower_retry_around_a_ticket_tool_creates_one_ticket() {
    let (addr, tickets) = serve(|_| server::status(502, &[])).await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "ticket", "class": "unkeyed_write", "retry": ["model"],
                        "unknown_outcome": "escalate" }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/tickets"));
        async move {
            let resp = client
                .post(url)
                .body(call.args().to_string())
                .send()
                .await?;
            Ok::<_, BoxError>(resp)
        }
    });
    let stack = tools.layer("ticket").unwrap().layer(body);
    let mut svc = ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryEveryError(3)))
        .service(stack);
    let err = call(
        &mut svc,
        Call::new("run-1", "step-4", json!({ "subject": "refund" })),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert!(!err.retryable());
    assert_eq!(tickets.load(Ordering::SeqCst), 1);
    assert_eq!(tools.held().len(), 1);
}

/// Mistake: the same naive tower `Retry` (4 attempts) around a declared read, over a provider
/// down with 502s. The stack retries as declared (3 attempts); the outer layer's clones of the
/// call come back after the stack ended it and are answered with that ending, not sent: 3
/// requests, not 12. Said once, counted; a new call (the model's reissue) is sent.
#[test]
fn a_tower_retry_around_a_read_does_not_multiply_its_attempts() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ((err, after_clones, after_reissue), warnings) = support::logs::warnings(|| {
        rt.block_on(async {
            let (addr, requests) = serve(|_| server::status(502, &[])).await;
            let tools = Toolbox::from_json_str(
                r#"{"tools": [{ "name": "search", "class": "read", "retry": ["layer"],
                                "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
            )
            .unwrap()
            .build(Stores::new())
            .unwrap();
            let client = reqwest::Client::new();
            let body = service_fn(move |_: Call| {
                let (client, url) = (client.clone(), format!("http://{addr}/search"));
                async move { Ok::<_, BoxError>(client.get(url).send().await?) }
            });
            let stack = tools.layer("search").unwrap().layer(body);
            let mut svc = ServiceBuilder::new()
                .layer(tower::retry::RetryLayer::new(RetryEveryError(4)))
                .service(stack);
            let err = call(&mut svc, Call::new("run-1", "s1", json!({ "q": "storm" })))
                .await
                .unwrap_err();
            let after_clones = requests.load(Ordering::SeqCst);
            // The model asks again: a new call, sent (its own 3 attempts).
            let _ = call(&mut svc, Call::new("run-1", "s2", json!({ "q": "storm" }))).await;
            (err, after_clones, requests.load(Ordering::SeqCst))
        })
    });
    assert_eq!(after_clones, 3, "the stack's 3 attempts, not 3 x 4");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(err.hint().contains("retry layer above"), "{}", err.hint());
    assert_eq!(after_reissue, 6, "a new call is sent");
    let said: Vec<_> = warnings
        .iter()
        .filter(|l| l.contains("retry layer above"))
        .collect();
    assert_eq!(said.len(), 1, "{warnings:?}");
}

/// Mistake: a chat tool over `reqwest::Response` without `PeekErrorBodyLayer` or
/// `ModelApiClassifier`, and the provider's quota is spent. The body is not in memory, so the 429
/// cannot be told from a rate limit: it is retried as one, and the crate says so (a WARN, and
/// `stormguard_unread_quota_bodies_total` on every such 429).
#[test]
fn a_model_429_read_without_its_body_is_said_out_loud() {
    let (sent, counted) = support::counted::counting(async {
        let (addr, sent) = serve(|_| {
            http::Response::builder()
                .status(429)
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#,
                )))
                .unwrap()
        })
        .await;
        let tools = Toolbox::from_json_str(
            r#"{"tools": [{ "name": "chat", "class": "read", "retry": ["layer"],
                                "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
        )
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let client = reqwest::Client::new();
        let body = service_fn(move |_call: Call| {
            let (client, url) = (client.clone(), format!("http://{addr}/v1/chat/completions"));
            async move { Ok::<_, BoxError>(client.post(url).body("{}").send().await?) }
        });
        let mut chat = tools.layer("chat").unwrap().layer(body);
        let err = call(&mut chat, Call::new("run-1", "step-1", json!({})))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimited, "{err}");
        sent.load(Ordering::SeqCst)
    });
    let counted: u64 = counted.total("stormguard_unread_quota_bodies_total");
    assert!(sent > 1, "retried as a rate limit: {sent}");
    assert!(
        counted >= u64::from(sent),
        "{counted} counted for {sent} answers"
    );
}

/// Mistake: the invoice's body forgets to send `call.key()` as the provider's Idempotency-Key,
/// and the provider answers 502 after creating the invoice. The body never read the key, so it
/// cannot have reached the provider: the 502 is not retried as a keyed write's would be; one
/// invoice, `missing_idempotency_key`, and the crate says so (WARN, `stormguard_keys_not_delivered_total`).
#[test]
fn a_keyed_write_whose_body_never_reads_its_key_is_not_retried() {
    let ((sent, keys), counted) = support::counted::counting(async {
        let (addr, sent, keys) = server::serve_keys(|n| match n {
            0 => server::status(502, &[]),
            _ => server::status(200, &[]),
        })
        .await;
        let tools = support::invoice::invoice_tools(None);
        // The mistake: the body sends no `Idempotency-Key` (see `keyless_body`).
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .layer(keyless_body(addr));
        let err = call(
            &mut invoice,
            Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::MissingIdempotencyKey, "{err}");
        assert!(!err.retryable());
        let keys: Vec<Option<String>> = keys.lock().unwrap().clone();
        (sent.load(Ordering::SeqCst), keys)
    });
    assert_eq!(sent, 1, "one invoice");
    assert_eq!(keys, [None]);
    let counted: u64 = counted.total("stormguard_keys_not_delivered_total");
    assert_eq!(counted, 1);
}

/// The same tool with a body that sends its key: the 502 is retried with that key.
#[tokio::test]
async fn a_keyed_write_whose_body_sends_its_key_is_retried_with_it() {
    let (addr, sent, keys) = server::serve_keys(|n| match n {
        0 => server::status(502, &[]),
        _ => server::status(200, &[]),
    })
    .await;
    let tools = support::invoice::invoice_tools(None);
    let body = support::invoice::invoice_body(addr);
    let mut invoice = tools.layer("send_invoice").unwrap().layer(body);
    let answer = call(
        &mut invoice,
        Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    let keys = keys.lock().unwrap().clone();
    assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
}

/// A keyed write's body that answers the provider's status, never reading the key.
fn keyless_body(
    addr: std::net::SocketAddr,
) -> impl tower::Service<Call, Response = http::Response<String>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    let client = reqwest::Client::new();
    service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/invoices"));
        async move {
            let resp = client
                .post(url)
                .body(call.args().to_string())
                .send()
                .await?;
            let status = resp.status().as_u16();
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(status)
                    .body(String::new())?,
            )
        }
    })
}

/// A keyed write without receipts whose body never sends its key: the 502 ends
/// `missing_idempotency_key` and is held, so the model's reissue at the next step is answered, not sent (one invoice).
#[tokio::test]
async fn a_keyless_keyed_write_without_receipts_is_held_for_its_reissue() {
    let (addr, sent) = serve(|_| server::status(502, &[])).await;
    let tools = Toolbox::from_json_str(
        r#"{"tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
                        "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
                        "backoff": { "base_ms": 1, "cap_ms": 2 } }]}"#,
    )
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .layer(keyless_body(addr));
    let args = json!({ "invoice_id": 1 });
    let first = call(&mut invoice, Call::new("run-1", "step-1", args.clone()))
        .await
        .unwrap_err();
    assert_eq!(first.code(), ErrorCode::MissingIdempotencyKey, "{first}");
    let again = call(&mut invoice, Call::new("run-1", "step-2", args))
        .await
        .unwrap_err();
    assert_eq!(again.code(), ErrorCode::OutcomeUnknown, "{again}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(tools.held().len(), 1);
}

/// A 422 answered to a keyed write whose body never sent the key is the provider's own
/// `invalid_argument`, not `idempotency_key_reused` (no key reached it).
#[tokio::test]
async fn a_422_to_a_key_never_sent_is_not_read_as_the_keys() {
    let (addr, sent) = serve(|_| server::status(422, &[])).await;
    let tools = support::invoice::invoice_tools(None);
    let mut invoice = tools
        .layer("send_invoice")
        .unwrap()
        .layer(keyless_body(addr));
    let err = call(
        &mut invoice,
        Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// "Never read the key" is one attempt's: a first attempt refused before the body read the key
/// does not make the retry that reads and sends it unkeyed (its 502 is retried with the key).
#[tokio::test]
async fn an_attempt_refused_before_reading_the_key_leaves_the_retry_keyed() {
    let (addr, sent, keys) = server::serve_keys(|n| match n {
        0 => server::status(502, &[]),
        _ => server::status(200, &[]),
    })
    .await;
    let tools = support::invoice::invoice_tools(None);
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let client = reqwest::Client::new();
    let body = service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/invoices"));
        let first = attempts.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                // Refused before any work, before the key was read.
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
            }
            let key = call.key().map(|k| k.to_string()).unwrap_or_default();
            let resp = client
                .post(url)
                .header("Idempotency-Key", key)
                .send()
                .await?;
            let status = resp.status().as_u16();
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(status)
                    .body(String::new())?,
            )
        }
    });
    let mut invoice = tools.layer("send_invoice").unwrap().layer(body);
    let answer = call(
        &mut invoice,
        Call::new("run-1", "step-2", json!({ "invoice_id": 9 })),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        sent.load(Ordering::SeqCst),
        2,
        "the 502 retried with its key"
    );
    let keys = keys.lock().unwrap().clone();
    assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
}
