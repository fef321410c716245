//! The first stack: a charge over reqwest with an idempotency key, a receipt, a breaker and a
//! quota, and what the model sees when the payment API is down (`cargo run --example first_stack
//! --features reqwest`).

use http_body_util::Full;
use serde::{Deserialize, Serialize};
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::classify::{classify_error, classify_status, Classification};
use stormguard::key::Action;
use stormguard::quota::{QuotaLayer, Rate};
use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
use stormguard::{
    budget::RetryBudget, class::ToolClass, error::BoxError, retry::HttpReplay, retry::RetryLayer,
};
use tower::{Service, ServiceBuilder, ServiceExt};

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

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let api = payments_api_answering_503().await?;
    // reqwest's own retries off: stormguard owns them.
    let client = reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .build()?;
    let key = |req: &reqwest::Request| {
        Action::new(
            "run-81f2",
            "step-3",
            "charge",
            &req.url().path().to_string(),
        )
    };
    let mut charge = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(classify)
                .replay(HttpReplay),
        )
        .layer(
            ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, key)
                .classifier(classify),
        )
        .layer(
            CircuitBreakerLayer::new(Breaker::new("payments", BreakerConfig::default()))
                .classifier(classify),
        )
        .layer(QuotaLayer::new(Rate::per_second(20).burst(5).build()?))
        .and_then(|resp: reqwest::Response| async move {
            Ok::<_, BoxError>(Charged {
                status: resp.status().as_u16(),
                body: resp.text().await?,
            })
        })
        .service(client);
    let req = reqwest::Request::new(
        reqwest::Method::POST,
        format!("http://{api}/charges/4471").parse()?,
    );
    match charge.ready().await?.call(req).await {
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
