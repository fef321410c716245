//! The model APIs' own retry signals, one case at a time, against a fake provider on 127.0.0.1:
//! OpenAI's two 429s (a rate limit, and `insufficient_quota` in the body), Anthropic's 529
//! "overloaded", `x-should-retry: false`, and `retry-after-ms`.
//!
//! The stack is the declared tool `chat` (a read its layer retries) with `ModelApiClassifier`,
//! over a body that sends the call through a `PeekErrorBodyLayer` (reads at most 64 KiB of an
//! error body, for at most 2 s, and hands the body on whole) over hyper's client: the layers
//! `docs/model-apis.md` stacks by hand. The token case declares the quota per tenant.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use stormguard::classify::{Classify, ModelApiClassifier};
use stormguard::error::ToolError;
use stormguard::peek::PeekErrorBodyLayer;
use stormguard::receipt::NotStored;
use stormguard::tool::{Call, Stores, Toolbox, Tools};
use tower::{Layer, Service, ServiceExt};

/// The model call, declared once (a read its own layer retries); with `quota`, it spends that
/// quota per tenant, each call weighing `cost` tokens.
fn chat_tools(quota: Option<(u32, u32)>) -> Tools {
    let (quotas, spends) = match quota {
        Some((rate, cost)) => (
            format!(r#""quotas": {{ "tokens": {{ "per_sec": {rate}, "burst": {rate} }} }},"#),
            format!(r#", "quota": {{ "name": "tokens", "key": "tenant", "cost": {cost} }}"#),
        ),
        None => (String::new(), String::new()),
    };
    let file = format!(
        r#"{{ {quotas} "tools": [{{ "name": "chat", "class": "read", "retry": ["layer"] {spends} }}] }}"#
    );
    Toolbox::from_json_str(&file)
        .and_then(|toolbox| toolbox.build(Stores::new()))
        .expect("the tool table is valid")
}

/// The provider whose error shapes a case uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// The cases: (provider, case).
pub const CASES: [(Provider, &str); 7] = [
    (Provider::OpenAi, "insufficient_quota"),
    (Provider::OpenAi, "rate_limited"),
    (Provider::OpenAi, "should_retry_false"),
    (Provider::OpenAi, "retry_after_ms"),
    (Provider::Anthropic, "overloaded"),
    (Provider::Anthropic, "should_retry_false"),
    (Provider::Anthropic, "retry_after_ms"),
];

/// How long the `retry_after_ms` case asks to wait.
pub const RETRY_AFTER_MS: u64 = 700;

/// What one case did.
#[derive(Debug)]
pub struct Outcome {
    pub provider: Provider,
    pub case: &'static str,
    /// Requests the provider received.
    pub requests: usize,
    pub is_error: bool,
    pub code: Option<&'static str>,
    pub retryable: Option<bool>,
    /// The hint the caller (a model) gets.
    pub hint: Option<String>,
    /// For `retry_after_ms`: the time between the first and the second request.
    pub waited_ms: Option<u64>,
}

impl Outcome {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "provider": self.provider.name(),
            "case": self.case,
            "requests": self.requests,
            "is_error": self.is_error,
            "code": self.code,
            "retryable": self.retryable,
            "hint": self.hint,
            "waited_ms": self.waited_ms,
            "asked_ms": (self.case == "retry_after_ms").then_some(RETRY_AFTER_MS),
        })
    }
}

fn json(
    status: u16,
    headers: &[(&str, String)],
    body: &'static str,
) -> http::Response<Full<Bytes>> {
    let mut b = http::Response::builder()
        .status(status)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("response")
}

const OK_OPENAI: &str =
    r#"{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"ok"}}]}"#;
const OK_ANTHROPIC: &str =
    r#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"ok"}]}"#;

/// The provider's `n`-th answer (from 0) in `case`.
fn answer(provider: Provider, case: &str, n: usize) -> http::Response<Full<Bytes>> {
    let ok = match provider {
        Provider::OpenAi => OK_OPENAI,
        Provider::Anthropic => OK_ANTHROPIC,
    };
    match (provider, case, n) {
        (Provider::OpenAi, "insufficient_quota", _) => json(
            429,
            &[],
            r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
        ),
        (Provider::OpenAi, "rate_limited", 0) => json(
            429,
            &[("retry-after-ms", "20".into())],
            r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        ),
        (Provider::Anthropic, "overloaded", 0 | 1) => json(
            529,
            &[],
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        (Provider::OpenAi, "should_retry_false", _) => json(
            503,
            &[("x-should-retry", "false".into())],
            r#"{"error":{"message":"The server is shedding this request","type":"server_error","param":null,"code":null}}"#,
        ),
        (Provider::Anthropic, "should_retry_false", _) => json(
            500,
            &[("x-should-retry", "false".into())],
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        ),
        (Provider::OpenAi, "retry_after_ms", 0) => json(
            429,
            &[
                ("retry-after-ms", RETRY_AFTER_MS.to_string()),
                ("retry-after", "5".into()),
            ],
            r#"{"error":{"message":"Rate limit reached for tokens","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
        ),
        (Provider::Anthropic, "retry_after_ms", 0) => json(
            429,
            &[
                ("retry-after-ms", RETRY_AFTER_MS.to_string()),
                ("retry-after", "5".into()),
            ],
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
        ),
        _ => json(200, &[], ok),
    }
}

/// Starts the provider for one case; returns its address and the times it received requests.
async fn serve(
    provider: Provider,
    case: &'static str,
) -> (std::net::SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: http::Request<_>| {
                    let n = {
                        let mut log = log.lock().expect("log");
                        log.push(Instant::now());
                        log.len() - 1
                    };
                    async move { Ok::<_, Infallible>(answer(provider, case, n)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

type Req = http::Request<Full<Bytes>>;

/// hyper's client as a `Clone` tower service (its error boxed, for the classifiers).
#[derive(Clone)]
pub struct HttpClient(Client<HttpConnector, Full<Bytes>>);

impl HttpClient {
    pub fn new() -> Self {
        HttpClient(Client::builder(TokioExecutor::new()).build_http())
    }
}

impl Service<Req> for HttpClient {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tower::BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { Ok(client.request(req).await?) })
    }
}

/// Runs one case: one model call through the guarded stack.
pub async fn run_case(provider: Provider, case: &'static str) -> Outcome {
    let (addr, seen) = serve(provider, case).await;
    let path = match provider {
        Provider::OpenAi => "/v1/chat/completions",
        Provider::Anthropic => "/v1/messages",
    };
    let url = format!("http://{addr}{path}");
    let peek = PeekErrorBodyLayer::builder()
        .limit(64 * 1024)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("valid")
        .layer(HttpClient::new());
    let body = tower::service_fn(move |_: Call| {
        let req = http::Request::post(&url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"m","messages":[]}"#,
            )))
            .expect("request");
        peek.clone().oneshot(req)
    });
    // A streamed answer is not stored (the tool keeps no receipts anyway).
    let mut model = chat_tools(None)
        .layer("chat")
        .expect("declared")
        .classifier(ModelApiClassifier)
        .codec(NotStored)
        .layer(body);
    let req = Call::new("run-1", "step-1", serde_json::json!({}));
    let result = model.ready().await.expect("ready").call(req).await;
    let (is_error, code, retryable, hint) = match result {
        Ok(resp) if resp.status().is_success() => {
            // The body reaches the caller whole.
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(!body.is_empty());
            (false, None, None, None)
        }
        Ok(resp) => {
            // A failure no retry can help is handed back as the provider's answer; the tool
            // turns it into the error the model sees, from what the classifier read.
            let error =
                Classify::<_, tower::BoxError>::dependency_error(&ModelApiClassifier, &resp)
                    .expect("a failure");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(!body.is_empty(), "the peeked body is handed on whole");
            (
                true,
                Some(error.code().as_str()),
                Some(error.retryable()),
                Some(error.hint().to_string()),
            )
        }
        Err(e) => {
            let tool: &ToolError = &e;
            (
                true,
                Some(tool.code().as_str()),
                Some(tool.retryable()),
                Some(
                    tool.cause()
                        .map_or(tool.hint(), ToolError::hint)
                        .to_string(),
                ),
            )
        }
    };
    let times = seen.lock().expect("log").clone();
    let waited_ms = (case == "retry_after_ms" && times.len() >= 2)
        .then(|| (times[1] - times[0]).as_millis() as u64);
    Outcome {
        provider,
        case,
        requests: times.len(),
        is_error,
        code,
        retryable,
        hint,
        waited_ms,
    }
}

/// The `tokens_per_minute` case, scaled to seconds: the provider allows each tenant 2,000
/// tokens a second (a token bucket of 2,000, as providers meter tokens per minute) and answers
/// 429 beyond; two tenants each send 20 calls of 300 tokens at once.
pub const TENANT_TOKENS_PER_SEC: u32 = 2_000;
const CALLS_PER_TENANT: u32 = 20;
const TOKENS_PER_CALL: u32 = 300;

/// What the token case did.
#[derive(Debug)]
pub struct Tokens {
    pub guarded: bool,
    pub requests: u64,
    pub rate_limited: u64,
    pub answered: u64,
    pub wall_ms: u64,
}

impl Tokens {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "provider": "openai",
            "case": if self.guarded { "tokens_per_minute" } else { "tokens_per_minute_unguarded" },
            "requests": self.requests,
            "rate_limited": self.rate_limited,
            "answered": self.answered,
            "calls": 2 * CALLS_PER_TENANT,
            "wall_ms": self.wall_ms,
        })
    }
}

/// A provider metering tokens per tenant: a bucket of `TENANT_TOKENS_PER_SEC`, refilled at that
/// rate per second.
async fn serve_tokens() -> (std::net::SocketAddr, Arc<Mutex<(u64, u64)>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let counts: Arc<Mutex<(u64, u64)>> = Arc::default();
    let buckets: Arc<Mutex<std::collections::HashMap<String, (f64, Instant)>>> = Arc::default();
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (seen, buckets) = (seen.clone(), buckets.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let header = |name: &str| {
                        req.headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    let (tenant, tokens) = (header("x-tenant"), header("x-tokens"));
                    let tokens: f64 = tokens.parse().unwrap_or(0.0);
                    let admitted = {
                        let mut buckets = buckets.lock().expect("buckets");
                        let now = Instant::now();
                        let cap = f64::from(TENANT_TOKENS_PER_SEC);
                        let (level, at) = buckets.entry(tenant).or_insert((cap, now));
                        *level = (*level + (now - *at).as_secs_f64() * cap).min(cap);
                        *at = now;
                        if *level >= tokens {
                            *level -= tokens;
                            true
                        } else {
                            false
                        }
                    };
                    {
                        let mut seen = seen.lock().expect("counts");
                        seen.0 += 1;
                        seen.1 += u64::from(!admitted);
                    }
                    let resp = if admitted {
                        json(200, &[], OK_OPENAI)
                    } else {
                        json(
                            429,
                            &[("retry-after-ms", "200".into())],
                            r#"{"error":{"message":"Rate limit reached for tokens per min","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
                        )
                    };
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts)
}

/// Two tenants, 20 calls of 300 tokens each, all at once: with a keyed, weighted quota of 90 %
/// of each tenant's limit under the retries (`guarded`), or with the retries alone.
pub async fn run_tokens(guarded: bool) -> Tokens {
    let (addr, counts) = serve_tokens().await;
    // The quota per tenant, each call weighing its tokens: 90 % of each tenant's limit.
    let rate = TENANT_TOKENS_PER_SEC * 9 / 10;
    let tools = chat_tools(guarded.then_some((rate, TOKENS_PER_CALL)));
    let url = format!("http://{addr}/v1/chat/completions");
    let client = HttpClient::new();
    let body = tower::service_fn(move |call: Call| {
        let req = http::Request::post(&url)
            .header("x-tenant", call.get("tenant").unwrap_or_default())
            .header("x-tokens", TOKENS_PER_CALL.to_string())
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        client.clone().oneshot(req)
    });
    let model = tools
        .layer("chat")
        .expect("declared")
        .classifier(ModelApiClassifier)
        .codec(NotStored)
        .layer(body);
    let start = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for tenant in ["acme", "globex"] {
        for _ in 0..CALLS_PER_TENANT {
            let model = model.clone();
            let req = Call::new("run-1", "step-1", serde_json::json!({})).with("tenant", tenant);
            calls.spawn(async move {
                model
                    .oneshot(req)
                    .await
                    .is_ok_and(|r| r.status().is_success())
            });
        }
    }
    let mut answered = 0;
    while let Some(ok) = calls.join_next().await {
        answered += u64::from(ok.expect("call"));
    }
    let (requests, rate_limited) = *counts.lock().expect("counts");
    Tokens {
        guarded,
        requests,
        rate_limited,
        answered,
        wall_ms: start.elapsed().as_millis() as u64,
    }
}
