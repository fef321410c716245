//! The failover case: three model providers on 127.0.0.1 behind one `Failover`. The first has
//! spent its quota (OpenAI's 429 `insufficient_quota`) until `QUOTA_BACK`, the second is
//! overloaded (Anthropic's 529) until `OVERLOAD_ENDS`, the third answers. Requests arrive at
//! `RATE` a second for `DURATION`. Then an unkeyed write whose first provider resets the
//! connection after reading the request (an ambiguous failure): it must not be sent to another.
//! Both calls are tools declared once ([`TOOLS`]), each stack over the `Failover` as its body.

use crate::signals::HttpClient;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stormguard::budget::RetryBudget;
use stormguard::classify::ModelApiClassifier;
use stormguard::failover::Failover;
use stormguard::peek::PeekErrorBodyLayer;
use stormguard::receipt::NotStored;
use stormguard::tool::{Call, Stores, ToolService, Toolbox};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// The two calls of the case: a chat completion (a read), and a message post the providers
/// take no key for (an unkeyed write whose unknown outcome is escalated).
const TOOLS: &str = r#"{ "tools": [
    { "name": "chat", "class": "read", "retry": ["layer"] },
    { "name": "post_message", "class": "unkeyed_write", "retry": ["none"],
      "unknown_outcome": "escalate" }
] }"#;

/// The declared tool `name`'s stack over `failover` (each call sent as [`ask`]).
fn over<F, B>(name: &str, failover: F) -> ToolService<http::Response<B>>
where
    F: Service<http::Request<Full<Bytes>>, Response = http::Response<B>> + Clone + Send + 'static,
    F::Error: Into<tower::BoxError>,
    F::Future: Send + 'static,
    B: Send + 'static,
{
    let tools = Toolbox::from_json_str(TOOLS)
        .and_then(|toolbox| toolbox.build(Stores::new()))
        .expect("the tool table is valid");
    let body = tower::service_fn(move |_: Call| failover.clone().oneshot(ask()));
    tools
        .layer(name)
        .expect("declared")
        .classifier(ModelApiClassifier)
        .codec(NotStored)
        .layer(body)
}

fn call() -> Call {
    Call::new("run-1", "step-1", serde_json::json!({}))
}

const RATE: u64 = 20;
const DURATION: Duration = Duration::from_secs(4);
const QUOTA_BACK: Duration = Duration::from_secs(2);
const OVERLOAD_ENDS: Duration = Duration::from_secs(5);
const PROBE_EVERY: Duration = Duration::from_millis(500);

const SPENT: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

/// How a provider answers at `t` since the start: a status and a body.
type Script = fn(Duration) -> (u16, &'static str);

/// Starts a provider; returns its address and when it answered with 200 and with a failure.
async fn provider(script: Script, start: Instant) -> (std::net::SocketAddr, Arc<Mutex<Log>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let log: Arc<Mutex<Log>> = Arc::default();
    let seen = log.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: http::Request<_>| {
                    let t = start.elapsed();
                    let (status, body) = script(t);
                    seen.lock().expect("log").push((t, status));
                    let resp = http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(body.as_bytes())))
                        .expect("response");
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, log)
}

/// (when, status) of each request a provider received.
type Log = Vec<(Duration, u16)>;

/// A provider that reads each request and closes the connection without answering.
async fn resetting() -> (std::net::SocketAddr, Arc<Mutex<u64>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let count: Arc<Mutex<u64>> = Arc::default();
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 4096];
            if stream.read(&mut buf).await.unwrap_or(0) > 0 {
                *seen.lock().expect("count") += 1;
            }
            drop(stream);
        }
    });
    (addr, count)
}

type Target = BoxCloneSyncService<
    http::Request<Full<Bytes>>,
    http::Response<stormguard::peek::PeekedBody<hyper::body::Incoming>>,
    tower::BoxError,
>;

fn target(addr: std::net::SocketAddr) -> Target {
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_request(move |mut req: http::Request<Full<Bytes>>| {
                *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                    .parse()
                    .expect("uri");
                req
            })
            .layer(PeekErrorBodyLayer::builder().build().expect("valid"))
            .service(HttpClient::new()),
    )
}

fn ask() -> http::Request<Full<Bytes>> {
    http::Request::post("http://model/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"messages":[]}"#)))
        .expect("request")
}

/// What the failover case measured.
pub struct Outcome {
    pub requests: u64,
    pub answered: u64,
    /// Per provider: requests received.
    pub sent: [u64; 3],
    /// Requests the first provider received after it first answered `insufficient_quota` and
    /// while its quota was still spent: the probes, one per `PROBE_EVERY`.
    pub probes_while_spent: u64,
    /// From the quota's return to the first request the first provider answered.
    pub back_on_first_ms: Option<u64>,
    /// The unkeyed write behind an ambiguous failure: the code it ended with, and the requests
    /// the other provider received (must be 0).
    pub write_code: String,
    pub write_sent_elsewhere: u64,
}

impl Outcome {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "case": "failover",
            "requests": self.requests,
            "answered": self.answered,
            "sent_openai": self.sent[0],
            "sent_anthropic": self.sent[1],
            "sent_local": self.sent[2],
            "probes_while_spent": self.probes_while_spent,
            "probe_every_ms": PROBE_EVERY.as_millis() as u64,
            "back_on_first_ms": self.back_on_first_ms,
            "unkeyed_write_ambiguous_code": self.write_code,
            "unkeyed_write_sent_elsewhere": self.write_sent_elsewhere,
        })
    }
}

pub async fn run() -> Outcome {
    let start = Instant::now();
    let (a, a_log) = provider(
        |t| {
            if t < QUOTA_BACK {
                (429, SPENT)
            } else {
                (200, "{}")
            }
        },
        start,
    )
    .await;
    let (b, b_log) = provider(
        |t| {
            if t < OVERLOAD_ENDS {
                (529, OVERLOADED)
            } else {
                (200, "{}")
            }
        },
        start,
    )
    .await;
    let (c, c_log) = provider(|_| (200, "{}"), start).await;
    let failover = Failover::builder(RetryBudget::default(), "openai", target(a))
        .or("anthropic", target(b))
        .or("local", target(c))
        .classifier(ModelApiClassifier)
        .probe_every(PROBE_EVERY)
        .build()
        .expect("valid");
    let model = over("chat", failover);

    let total = RATE * DURATION.as_secs();
    // On one thread (`spawn_local`): the calls arrive at `RATE` a second, each on its own task.
    let local = tokio::task::LocalSet::new();
    let answered = local
        .run_until(async {
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
            let mut calls = Vec::new();
            for _ in 0..total {
                tick.tick().await;
                let model = model.clone();
                calls.push(tokio::task::spawn_local(async move {
                    matches!(model.oneshot(call()).await, Ok(r) if r.status() == 200)
                }));
            }
            let mut answered = 0;
            for call in calls {
                answered += u64::from(call.await.expect("call"));
            }
            answered
        })
        .await;
    let a_log = a_log.lock().expect("log").clone();
    let first_spent = a_log.iter().find(|(_, s)| *s == 429).map(|(t, _)| *t);
    let probes_while_spent = a_log
        .iter()
        .filter(|(t, s)| *s == 429 && Some(*t) != first_spent)
        .count() as u64;
    let back_on_first_ms = a_log
        .iter()
        .find(|(_, s)| *s == 200)
        .map(|(t, _)| t.saturating_sub(QUOTA_BACK).as_millis() as u64);
    let sent = [
        a_log.len() as u64,
        b_log.lock().expect("log").len() as u64,
        c_log.lock().expect("log").len() as u64,
    ];

    // An unkeyed write: its first provider reads the request and drops the connection.
    let (reset, _) = resetting().await;
    let (other, other_log) = provider(|_| (200, "{}"), start).await;
    let failover = Failover::builder(RetryBudget::default(), "primary", target(reset))
        .or("secondary", target(other))
        .classifier(ModelApiClassifier)
        .build()
        .expect("valid");
    let write = over("post_message", failover);
    let write_code = match write.oneshot(call()).await {
        Ok(r) => format!("answered {}", r.status()),
        Err(e) => e.code().as_str().to_string(),
    };
    let write_sent_elsewhere = other_log.lock().expect("log").len() as u64;

    Outcome {
        requests: total,
        answered,
        sent,
        probes_while_spent,
        back_on_first_ms,
        write_code,
        write_sent_elsewhere,
    }
}
