//! The async-openai recipe: stormguard as the SDK's HTTP service (`Client::with_http_service`),
//! against a model API on 127.0.0.1 that answers 503 to everything.
//!
//! - `async_openai`: a stormguard `Retry` inside the SDK (its `HttpRequestFactory` is `Clone`,
//!   so each attempt rebuilds the request): 3 requests for the call;
//! - `async_openai_sdk_retry`: `with_http_client` keeps the SDK's own retry (3 retries, no
//!   jitter) under a stormguard `Retry` at the agent loop: 4 x 3 = 12 requests.
//!
//! Both stacks are built by hand, not from a tool declaration: the first sits inside the SDK,
//! whose requests are its own type, not a `Call`; the second has two retry owners (the layer
//! and the client), which a declaration refuses and the audit reports as an error: it is here
//! to measure what that costs.

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use async_openai::Client;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::backoff::Backoff;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::{HttpClassifier, OkIsSuccess};
use stormguard::error::ToolError;
use stormguard::retry::{CloneReplay, RetryLayer};
use tower::{ServiceBuilder, ServiceExt};

/// What the 503 case cost.
#[derive(Debug)]
pub struct SdkCase {
    pub case: &'static str,
    pub requests: u64,
    pub failed: bool,
}

impl SdkCase {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "provider": "openai",
            "case": self.case,
            "requests": self.requests,
            "is_error": self.failed,
        })
    }
}

async fn serve_503() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let requests = Arc::new(AtomicU64::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: http::Request<_>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let resp = http::Response::builder()
                        .status(503)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(
                            br#"{"error":{"message":"The engine is currently overloaded","type":"server_error","param":null,"code":null}}"#,
                        )))
                        .expect("response");
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, requests)
}

/// A quick policy for the demo: the class's rules, 5 ms backoff.
fn fast(class: ToolClass) -> ClassPolicy {
    ClassPolicy::builder(class)
        .backoff(
            Backoff::exponential(Duration::from_millis(5))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

fn ask() -> async_openai::types::chat::CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o-mini")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Summarise the storm report")
            .build()
            .expect("message")
            .into()])
        .build()
        .expect("request")
}

/// reqwest 0.13, with its own retries off: stormguard owns them.
fn reqwest_client() -> reqwest013::Client {
    reqwest013::Client::builder()
        .retry(reqwest013::retry::never())
        .build()
        .expect("client")
}

/// stormguard inside the SDK: `with_http_service` over a `Retry`.
pub async fn inside() -> SdkCase {
    let (addr, requests) = serve_503().await;
    let http = ServiceBuilder::new()
        // The SDK wants its own error type back.
        .map_err(|e: ToolError| OpenAIError::from(tower::BoxError::from(e)))
        .layer(
            RetryLayer::new(fast(ToolClass::Read), RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(CloneReplay),
        )
        // The classifiers read errors through `AsDynError`: box the SDK's.
        .map_err(tower::BoxError::from)
        .service(ReqwestService::new(reqwest_client()));
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{addr}/v1"))
        .with_api_key("sk-test");
    let client = Client::with_config(config).with_http_service(http);
    let result = client.chat().create(ask()).await;
    SdkCase {
        case: "async_openai",
        requests: requests.load(Ordering::SeqCst),
        failed: result.is_err(),
    }
}

/// The SDK's own retry kept (`with_http_client`), under a stormguard `Retry` at the agent loop.
pub async fn sdk_retry_kept() -> SdkCase {
    let (addr, requests) = serve_503().await;
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{addr}/v1"))
        .with_api_key("sk-test");
    let client = Client::with_config(config).with_http_client(reqwest_client());
    let model = tower::service_fn(
        move |req: async_openai::types::chat::CreateChatCompletionRequest| {
            let client = client.clone();
            async move {
                client
                    .chat()
                    .create(req)
                    .await
                    .map_err(tower::BoxError::from)
            }
        },
    );
    let agent = ServiceBuilder::new()
        .layer(
            RetryLayer::new(fast(ToolClass::Read), RetryBudget::default())
                // the SDK's typed answer: its failures all arrive as errors
                .classifier(OkIsSuccess)
                .replay(CloneReplay),
        )
        .service(model);
    let result = agent.oneshot(ask()).await;
    SdkCase {
        case: "async_openai_sdk_retry",
        requests: requests.load(Ordering::SeqCst),
        failed: result.is_err(),
    }
}
