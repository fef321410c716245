//! The first stack: a charge over reqwest declared once as a tool (its class, key, receipt,
//! breaker and quota), and what the model sees when the payment API is down (`cargo run
//! --example first_stack --features reqwest`).

use http_body_util::Full;
use serde::{Deserialize, Serialize};
use stormguard::classify::{classify_error, classify_status, Classification};
use stormguard::error::BoxError;
use stormguard::tool::{Call, Stores, Toolbox};
use tower::{Layer, Service, ServiceExt};

/// What the charge answered, kept as its receipt.
#[derive(Serialize, Deserialize)]
struct Charged {
    status: u16,
    body: String,
}

// Its receipt is its JSON.
stormguard::stored_as_json!(Charged);

/// One classifier for the retry, the receipt and the breaker: by HTTP status, or by the error.
fn classify(r: &Result<Charged, BoxError>) -> Classification {
    match r {
        Ok(c) => classify_status(
            http::StatusCode::from_u16(c.status).unwrap_or(http::StatusCode::BAD_GATEWAY),
        ),
        Err(e) => classify_error(&**e),
    }
}

/// The tool, declared once: a keyed write, keyed on the run, the tool and the order.
const TOOLS: &str = r#"{
    "breakers": { "payments": { "failure_ratio": 0.5, "open_secs": 30 } },
    "quotas": { "payments": { "per_sec": 20, "burst": 5 } },
    "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
    "tools": [{
        "name": "charge", "class": "keyed_write", "retry": ["layer"],
        "key": ["run", "tool", "id:order"], "unknown_outcome": "escalate",
        "receipt": { "store": "receipts", "provider_key_window_secs": 86400 },
        "breaker": "payments", "quota": { "name": "payments", "key": "global", "cost": 1 }
    }]
}"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let api = payments_api_answering_503().await?;
    let tools = Toolbox::from_json_str(TOOLS)?.build(Stores::new())?;
    // reqwest's own retries off: the tool's layer owns them.
    let client = reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .build()?;
    // The tool's body: the call's arguments in, the API's answer out, the stack's key as its header.
    let body = tower::service_fn(move |call: Call| {
        let order = call.args()["order"].as_u64().unwrap_or_default();
        let request = client
            .post(format!("http://{api}/charges/{order}"))
            .header("idempotency-key", call.key().map_or("", |k| k.as_str()));
        async move {
            let response = request.send().await?;
            Ok::<_, BoxError>(Charged {
                status: response.status().as_u16(),
                body: response.text().await?,
            })
        }
    });
    let mut charge = tools.layer("charge")?.classifier(classify).layer(body);
    let call = Call::new("run-81f2", "step-3", serde_json::json!({ "order": 4471 }));
    match charge.ready().await?.call(call).await {
        Ok(done) => println!("charged: HTTP {} {}", done.status, done.body),
        // A 503 may come after the charge went through: retried with the same key, 3 times in
        // all, then handed to the model as a structured error it can act on.
        Err(err) => println!("{}", serde_json::to_string_pretty(&err.to_json())?),
    }
    Ok(())
}

/// A payment API on 127.0.0.1 that is down.
async fn payments_api_answering_503() -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|_req| async {
                http::Response::builder()
                    .status(503)
                    .body(Full::new(bytes::Bytes::from_static(b"down")))
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, svc));
        }
    });
    Ok(addr)
}
