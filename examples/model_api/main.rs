//! Guarding a model API that rate-limits: a fake model endpoint on 127.0.0.1 answers `429` with
//! `Retry-After: 1` whenever more than 50 requests arrive in a second, and 40 agent runs of 5
//! model calls each start at once.
//!
//! ```text
//! cargo run --release --example model_api            # a table
//! cargo run --release --example model_api -- --json  # one JSON object per line
//! ```
//!
//! Both stacks have three retrying layers (agent loop -> model wrapper -> HTTP client, 3 attempts
//! each, jittered exponential backoff from 100 ms): `tower-nested` is tower 0.5's `Retry`, which
//! knows nothing of `Retry-After`; `stormguard-nested` is three stormguard `Retry` layers with one
//! shared budget, which wait what the server asks (`Retry-After`, clamped) and hold each call to
//! its 3 attempts across the three layers: the HTTP client's is the stack of the tool `model`,
//! declared once in [`MODEL_TOOLS`], and the two above take its class and budget;
//! `stormguard-quota` is the tool `model-quota`, which spends the declared quota `model-api`
//! under its retries (40 calls a second, bursts of 5), so calls are spaced before they are sent.
//!
//! Then the providers' own signals, one case per line (`provider`, `case`): OpenAI's
//! `insufficient_quota` 429 (one request, `quota_exhausted`, not retryable) and its ordinary
//! rate-limit 429 (retried), Anthropic's 529 `overloaded_error` (retried until it recovers),
//! `x-should-retry: false` (one request), and `retry-after-ms` (the wait is the header's), through
//! `ModelApiClassifier` over a `PeekErrorBodyLayer` (see `signals.rs`). Every stormguard stack
//! here is a declared tool's, but the async-openai ones (see `openai.rs` for why).

mod failover;
mod openai;
mod signals;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use stormguard::classify::HttpClassifier;
use stormguard::error::ToolError;
use stormguard::retry::RetryLayer;
use stormguard::tool::{Call, Stores, Toolbox};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// The model call, declared once: a read its own layer retries, on the default budget; the
/// `model-quota` variant spends the quota `model-api` under its retries (40 calls a second with
/// bursts of 5 put at most 45 into any one second, a margin under the API's 50 for network
/// jitter).
const MODEL_TOOLS: &str = r#"{
    "quotas": { "model-api": { "per_sec": 40, "burst": 5 } },
    "tools": [
        { "name": "model", "class": "read", "retry": ["layer"] },
        { "name": "model-quota", "class": "read", "retry": ["layer"],
          "quota": { "name": "model-api", "key": "global", "cost": 1 } }
    ]
}"#;

const LIMIT_PER_SEC: u64 = 50;
const RUNS: u64 = 40;
const CALLS_PER_RUN: u64 = 5;

type Req = http::Request<Full<Bytes>>;
type Res = http::Response<Bytes>;

/// What the fake model API saw.
#[derive(Default)]
struct Api {
    requests: AtomicU64,
    rate_limited: AtomicU64,
    /// (second since start, requests admitted in it)
    window: Mutex<(u64, u64)>,
}

/// Starts the model API: a fixed one-second window of `LIMIT_PER_SEC` requests, `429` beyond.
async fn start_model_api(api: Arc<Api>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let start = Instant::now();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api = api.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: http::Request<_>| {
                    api.requests.fetch_add(1, Ordering::Relaxed);
                    let second = start.elapsed().as_secs();
                    let admitted = {
                        let mut window = api.window.lock().expect("window");
                        if window.0 != second {
                            *window = (second, 0);
                        }
                        window.1 += 1;
                        window.1 <= LIMIT_PER_SEC
                    };
                    let resp = if admitted {
                        http::Response::builder()
                            .status(200)
                            .body(Full::new(Bytes::from_static(br#"{"content":"ok"}"#)))
                    } else {
                        api.rate_limited.fetch_add(1, Ordering::Relaxed);
                        http::Response::builder()
                            .status(429)
                            .header("retry-after", "1")
                            .body(Full::new(Bytes::from_static(
                                br#"{"error":"rate_limited"}"#,
                            )))
                    };
                    async move { Ok::<_, Infallible>(resp.expect("response")) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// hyper's client as a `Clone` tower service that reads each body to the end.
#[derive(Clone)]
struct ModelClient(Client<HttpConnector, Full<Bytes>>);

impl Service<Req> for ModelClient {
    type Response = Res;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Res, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), tower::BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            let (parts, body) = client.request(req).await?.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// tower's `Retry` with a typical policy: retry a 429 or 5xx up to 3 attempts, full jitter.
#[derive(Clone)]
struct TowerPolicy {
    attempts: u32,
    /// A fresh seed per request (tower clones the policy for each call).
    seeds: Arc<AtomicU64>,
    rng: Option<u64>,
}

impl<E> tower::retry::Policy<Req, Res, E> for TowerPolicy {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        let failed = match result {
            Ok(res) => res.status() == 429 || res.status().is_server_error(),
            Err(_) => true,
        };
        if !failed || self.attempts >= 3 {
            return None;
        }
        let seeds = &self.seeds;
        let rng = self.rng.get_or_insert_with(|| {
            seeds
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        });
        *rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let unit = (*rng >> 11) as f64 / (1u64 << 53) as f64;
        let ceiling = Duration::from_millis(100) * 2u32.pow(self.attempts - 1);
        self.attempts += 1;
        Some(tokio::time::sleep(ceiling.mul_f64(unit)))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = http::Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// A stack under test: it takes (run, step) and sends that model call.
type Boxed = tower::util::BoxCloneService<(u64, u64), Res, tower::BoxError>;

/// The model call of `step` of `run`.
fn request(uri: &http::Uri, run: u64, step: u64) -> Req {
    let body = format!(r#"{{"run":{run},"step":{step},"messages":[]}}"#);
    http::Request::post(uri.clone())
        .body(Full::new(Bytes::from(body)))
        .expect("request")
}

fn tower_nested(client: ModelClient, uri: http::Uri) -> Boxed {
    let seeds = Arc::new(AtomicU64::new(1));
    let layer = || {
        tower::retry::RetryLayer::new(TowerPolicy {
            attempts: 1,
            seeds: seeds.clone(),
            rng: None,
        })
    };
    Boxed::new(
        ServiceBuilder::new()
            .map_request(move |(run, step)| request(&uri, run, step))
            .layer(layer())
            .layer(layer())
            .layer(layer())
            .service(client),
    )
}

fn stormguard_nested(client: ModelClient, uri: http::Uri) -> Boxed {
    stormguard_stack(client, uri, "model")
}

fn stormguard_quota(client: ModelClient, uri: http::Uri) -> Boxed {
    stormguard_stack(client, uri, "model-quota")
}

/// The agent loop's and the model wrapper's `Retry` (the declared tool's class and budget) over
/// the stack the tool `tool` declares, whose body sends the call to the API.
fn stormguard_stack(client: ModelClient, uri: http::Uri, tool: &str) -> Boxed {
    let tools = Toolbox::from_json_str(MODEL_TOOLS)
        .and_then(|toolbox| toolbox.build(Stores::new()))
        .expect("the tool table is valid");
    let layer = tools.layer(tool).expect("a declared tool");
    let (policy, budget) = (*layer.policy(), layer.budget().clone());
    let body = tower::service_fn(move |call: Call| {
        let at = |field: &str| call.args()[field].as_u64().unwrap_or_default();
        client.clone().oneshot(request(&uri, at("run"), at("step")))
    });
    let http_client = layer.classifier(HttpClassifier).layer(body);
    let retry = |name: &'static str| {
        RetryLayer::new(policy, budget.clone())
            .name(name)
            .classifier(HttpClassifier)
    };
    let svc = ServiceBuilder::new()
        .map_request(|(run, step): (u64, u64)| {
            let args = serde_json::json!({ "run": run, "step": step });
            Call::new(format!("run-{run}"), format!("step-{step}"), args)
        })
        .layer(retry("agent-loop"))
        .layer(retry("model-wrapper"))
        .service(http_client);
    Boxed::new(svc.map_err(tower::BoxError::from))
}

struct Row {
    stack: &'static str,
    logical: u64,
    requests: u64,
    rate_limited: u64,
    successes: u64,
    /// Why calls failed, by final error code (`http_429` for a 429 the stack handed back).
    failures: BTreeMap<String, u64>,
    wall: Duration,
}

async fn run(stack: &'static str, build: fn(ModelClient, http::Uri) -> Boxed) -> Row {
    let api = Arc::new(Api::default());
    let addr = start_model_api(api.clone()).await;
    let client = ModelClient(Client::builder(TokioExecutor::new()).build_http());
    let uri: http::Uri = format!("http://{addr}/v1/messages").parse().expect("uri");
    let svc = build(client, uri);
    let start = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for run in 0..RUNS {
        let svc = svc.clone();
        runs.spawn(async move {
            let mut failures = Vec::new();
            for step in 0..CALLS_PER_RUN {
                match svc.clone().oneshot((run, step)).await {
                    Ok(res) if res.status().is_success() => {}
                    Ok(res) => failures.push(format!("http_{}", res.status().as_u16())),
                    Err(e) => failures.push(match e.downcast::<ToolError>() {
                        Ok(tool) => tool.code().as_str().to_string(),
                        Err(_) => "transport".to_string(),
                    }),
                }
            }
            failures
        });
    }
    let mut failures = BTreeMap::<String, u64>::new();
    while let Some(run) = runs.join_next().await {
        for code in run.expect("agent run") {
            *failures.entry(code).or_default() += 1;
        }
    }
    Row {
        stack,
        logical: RUNS * CALLS_PER_RUN,
        requests: api.requests.load(Ordering::Relaxed),
        rate_limited: api.rate_limited.load(Ordering::Relaxed),
        successes: RUNS * CALLS_PER_RUN - failures.values().sum::<u64>(),
        failures,
        wall: start.elapsed(),
    }
}

#[tokio::main]
async fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let rows = [
        run("tower-nested", tower_nested).await,
        run("stormguard-nested", stormguard_nested).await,
        run("stormguard-quota", stormguard_quota).await,
    ];
    if !json {
        println!(
            "{RUNS} agent runs x {CALLS_PER_RUN} model calls against an API allowing \
             {LIMIT_PER_SEC} requests/s (429 + Retry-After: 1 beyond)\n"
        );
        println!(
            "{:<22} {:>8} {:>9} {:>7} {:>9} {:>8} {:>8}",
            "stack", "logical", "requests", "429s", "per call", "success", "wall_ms"
        );
    }
    let mut outcomes = Vec::new();
    for (provider, case) in signals::CASES {
        outcomes.push(signals::run_case(provider, case).await);
    }
    let tokens = [
        signals::run_tokens(false).await,
        signals::run_tokens(true).await,
    ];
    let sdk = [openai::inside().await, openai::sdk_retry_kept().await];
    let failover = failover::run().await;
    for r in rows {
        let amplification = r.requests as f64 / r.logical as f64;
        let success = r.successes as f64 / r.logical as f64;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "stack": r.stack,
                    "logical": r.logical,
                    "requests": r.requests,
                    "rate_limited": r.rate_limited,
                    "amplification": (amplification * 1000.0).round() / 1000.0,
                    "success_rate": (success * 1000.0).round() / 1000.0,
                    "failures": r.failures,
                    "wall_ms": r.wall.as_millis() as u64,
                })
            );
        } else {
            println!(
                "{:<22} {:>8} {:>9} {:>7} {:>8.2}x {:>7.1}% {:>8}",
                r.stack,
                r.logical,
                r.requests,
                r.rate_limited,
                amplification,
                success * 100.0,
                r.wall.as_millis()
            );
            for (code, n) in &r.failures {
                println!("{:<22} {n} failed with {code}", "");
            }
        }
    }
    if !json {
        println!(
            "\n{:<10} {:<20} {:>8} {:>8} {:<18} {:>9} {:>9}",
            "provider", "case", "requests", "error", "code", "retryable", "waited"
        );
    }
    for o in &outcomes {
        if json {
            println!("{}", o.json());
        } else {
            println!(
                "{:<10} {:<20} {:>8} {:>8} {:<18} {:>9} {:>9}",
                o.provider.name(),
                o.case,
                o.requests,
                o.is_error,
                o.code.unwrap_or("-"),
                o.retryable.map_or("-".to_string(), |r| r.to_string()),
                o.waited_ms.map_or("-".to_string(), |ms| format!("{ms} ms")),
            );
        }
    }
    for t in &tokens {
        if json {
            println!("{}", t.json());
        } else {
            println!(
                "openai     {:<28} {} requests, {} x 429, {} of 40 answered, {} ms",
                if t.guarded {
                    "tokens_per_minute"
                } else {
                    "tokens_per_minute (no quota)"
                },
                t.requests,
                t.rate_limited,
                t.answered,
                t.wall_ms
            );
        }
    }
    for c in &sdk {
        if json {
            println!("{}", c.json());
        } else {
            println!(
                "openai     {:<28} {} requests in a 503 outage",
                c.case, c.requests
            );
        }
    }
    if json {
        println!("{}", failover.json());
    } else {
        let f = &failover;
        println!(
            "\nfailover: {} of {} answered; sent to openai {} (probes while its quota was spent: {}), \
             anthropic {}, local {}; back on openai {} ms after its quota returned; an unkeyed \
             write after a reset: {}, sent elsewhere {}",
            f.answered,
            f.requests,
            f.sent[0],
            f.probes_while_spent,
            f.sent[1],
            f.sent[2],
            f.back_on_first_ms.map_or("-".to_string(), |ms| ms.to_string()),
            f.write_code,
            f.write_sent_elsewhere
        );
    }
    let goals_met = failover.answered == failover.requests
        && failover.back_on_first_ms.is_some_and(|ms| ms <= 1_000)
        && failover.write_code == "outcome_unknown"
        && failover.write_sent_elsewhere == 0;
    if !goals_met {
        eprintln!("the failover case missed a goal");
        std::process::exit(1);
    }
}
