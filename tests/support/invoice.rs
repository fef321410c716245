//! The invoice tool several mistake tests share: a keyed write with in-memory receipts, keyed
//! on the run, the tool and `invoice_id`, retried by the layer on a quick backoff.
#![allow(dead_code, unreachable_pub)]

use serde_json::json;
use stormguard::tool::{Stores, Toolbox, Tools};

/// The invoice tool, built; `max_attempts` where given (`None`: the class's default).
pub fn invoice_tools(max_attempts: Option<u32>) -> Tools {
    let mut tool = json!({
        "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
        "key": ["run", "tool", "id:invoice_id"],
        "receipt": { "store": "receipts", "provider_key_window_secs": 86400 },
        "unknown_outcome": "escalate",
        "backoff": { "base_ms": 1, "cap_ms": 2 }
    });
    if let Some(n) = max_attempts {
        tool["max_attempts"] = json!(n);
    }
    let table = json!({
        "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
        "tools": [tool]
    });
    Toolbox::from_json_str(&table.to_string())
        .unwrap()
        .build(Stores::new())
        .unwrap()
}

#[cfg(feature = "reqwest")]
/// The invoice body: POSTs with the call's key, answers the status and body as read.
pub fn invoice_body(
    addr: std::net::SocketAddr,
) -> impl tower::Service<
    stormguard::tool::Call,
    Response = http::Response<String>,
    Error = stormguard::error::BoxError,
    Future = impl Send,
> + Clone
       + Send {
    let client = reqwest::Client::new();
    tower::service_fn(move |call: stormguard::tool::Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/invoices"));
        async move {
            let key = call.key().map(|k| k.to_string()).unwrap_or_default();
            let resp = client
                .post(url)
                .header("Idempotency-Key", key)
                .body(call.args().to_string())
                .send()
                .await?;
            let status = resp.status().as_u16();
            Ok::<_, stormguard::error::BoxError>(
                http::Response::builder()
                    .status(status)
                    .body(resp.text().await?)?,
            )
        }
    })
}
