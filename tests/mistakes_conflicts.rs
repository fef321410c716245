//! A keyed provider's key conflicts (409: a request with this key is still in flight; 422: the
//! key was used for other arguments) mean the same whether the body answers the response or
//! turns its status into an error first (`error_for_status()`, the natural reqwest idiom),
//! against a real HTTP server on 127.0.0.1 (issue 37, "one obvious answer").
#![cfg(feature = "reqwest")]

mod support;

use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::tool::Call;
use support::call;
use support::server;
use tower::{service_fn, Layer, Service};

/// The invoice body: POSTs with the call's key; `as_error` turns a failure status into an `Err`
/// first (`error_for_status()`), else it answers the status.
fn body(
    addr: SocketAddr,
    as_error: bool,
) -> impl Service<Call, Response = http::Response<String>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    let client = reqwest::Client::new();
    service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/invoices"));
        async move {
            let key = call.key().map(|k| k.to_string()).unwrap_or_default();
            let mut resp = client
                .post(url)
                .header("Idempotency-Key", key)
                .body(call.args().to_string())
                .send()
                .await?;
            if as_error {
                resp = resp.error_for_status()?;
            }
            let status = resp.status().as_u16();
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(status)
                    .body(resp.text().await?)?,
            )
        }
    })
}

/// A 502 after the invoice was created, then a 409 while the provider still processes the key,
/// then the key's answer: retried with the same key through the 409, one invoice, `Ok`, in
/// both shapes (before, the status error's 409 ended `conflict`).
#[tokio::test]
async fn a_409_in_flight_is_waited_out_as_a_response_or_a_status_error() {
    for as_error in [false, true] {
        let (addr, sent, keys) = server::serve_keys(|n| match n {
            0 => server::status(502, &[]),
            1 => server::status(409, &[]),
            _ => server::status(200, &[]),
        })
        .await;
        let tools = support::invoice::invoice_tools(Some(4));
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .layer(body(addr, as_error));
        let answer = call(
            &mut invoice,
            Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
        )
        .await;
        let answer = answer.unwrap_or_else(|e| panic!("as_error {as_error}: {e}"));
        assert_eq!(answer.status(), 200);
        assert_eq!(sent.load(Ordering::SeqCst), 3, "as_error {as_error}");
        let keys = keys.lock().unwrap().clone();
        assert!(
            keys.iter().all(|k| k.is_some() && *k == keys[0]),
            "{keys:?}"
        );
    }
}

/// A 422 to a key sent before (the retry after a 502 that may have landed) is the key's (used
/// for other arguments): `idempotency_key_reused`, not retried, in both shapes.
#[tokio::test]
async fn a_422_to_a_key_sent_before_is_the_keys_as_a_response_or_a_status_error() {
    for as_error in [false, true] {
        let (addr, sent, _) = server::serve_keys(|n| match n {
            0 => server::status(502, &[]),
            _ => server::status(422, &[]),
        })
        .await;
        let tools = support::invoice::invoice_tools(Some(4));
        let mut invoice = tools
            .layer("send_invoice")
            .unwrap()
            .layer(body(addr, as_error));
        let err = call(
            &mut invoice,
            Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::IdempotencyKeyReused,
            "as_error {as_error}: {err}"
        );
        assert_eq!(sent.load(Ordering::SeqCst), 2, "as_error {as_error}");
    }
}

/// Mistake (the provider's, seen by the newcomer probe): a 409 "invoice already sent" or a 422
/// "amount must be positive" answered to the key's first send is about the request, not an
/// earlier one with the key: `conflict` and `invalid_argument`, sent once, never `in_progress`
/// after three sends or `idempotency_key_reused`.
#[tokio::test]
async fn a_409_or_422_to_a_keys_first_send_is_the_requests_own() {
    for (status, code) in [
        (409, ErrorCode::Conflict),
        (422, ErrorCode::InvalidArgument),
    ] {
        for as_error in [false, true] {
            let (addr, sent, _) = server::serve_keys(move |_| server::status(status, &[])).await;
            let tools = support::invoice::invoice_tools(Some(4));
            let mut invoice = tools
                .layer("send_invoice")
                .unwrap()
                .layer(body(addr, as_error));
            let err = call(
                &mut invoice,
                Call::new("run-1", "step-2", json!({ "invoice_id": 7 })),
            )
            .await
            .unwrap_err();
            assert_eq!(err.code(), code, "{status} as_error {as_error}: {err}");
            assert_eq!(
                sent.load(Ordering::SeqCst),
                1,
                "{status} as_error {as_error}"
            );
        }
    }
}
