//! stormguard over real gRPC: a tonic server on 127.0.0.1, a tonic client, HTTP/2 sockets.
//!
//! The retry and key layers sit on the tool's call (`tonic::Request<SendInvoice>`), where the
//! message can be replayed; the server records the `idempotency-key` metadata of every call it
//! receives and delivers each key once, as an idempotent provider does.
#![cfg(feature = "tonic")]

mod support;

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::backoff::Backoff;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::{DefaultClassifier, GrpcClassifier};
use stormguard::error::ErrorCode;
use stormguard::error::ToolError;
use stormguard::key::{Action, SetIdempotencyKeyLayer};
use stormguard::retry::{GrpcReplay, RetryLayer};
use support::call;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::Status;
use tonic_prost::ProstCodec;
use tower::{Service, ServiceBuilder};

#[derive(Clone, PartialEq, prost::Message)]
struct SendInvoice {
    #[prost(uint64, tag = "1")]
    invoice_id: u64,
    #[prost(string, tag = "2")]
    body: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sent {
    #[prost(string, tag = "1")]
    message_id: String,
}

const PATH: &str = "/billing.Billing/SendInvoice";

/// What the server does with a call.
enum Answer {
    /// Delivers the email (once per key) and answers OK.
    Deliver,
    /// Answers with this status without delivering.
    Refuse(Status),
    /// Delivers, then answers with this status (the client cannot tell it went out).
    DeliverThenFail(Status),
}

/// What the server does with its n-th call (0-based).
type Script = Arc<dyn Fn(usize) -> Answer + Send + Sync>;

/// The email provider: records every call's key and invoice, delivers each key once.
#[derive(Clone)]
struct Billing {
    script: Script,
    calls: Arc<Mutex<Vec<(String, u64)>>>,
    delivered: Arc<Mutex<HashSet<String>>>,
    /// Each call's `grpc-previous-rpc-attempts` metadata.
    previous: Arc<Mutex<Vec<Option<String>>>>,
}

impl Billing {
    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
    fn calls_for(&self, invoice_id: u64) -> usize {
        let calls = self.calls.lock().unwrap();
        calls.iter().filter(|(_, id)| *id == invoice_id).count()
    }
    fn keys(&self) -> Vec<String> {
        let calls = self.calls.lock().unwrap();
        calls.iter().map(|(key, _)| key.clone()).collect()
    }
    fn deliveries(&self) -> usize {
        self.delivered.lock().unwrap().len()
    }
}

struct Unary(Billing);

impl tonic::server::UnaryService<SendInvoice> for Unary {
    type Response = Sent;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Sent>, Status>> + Send>>;

    fn call(&mut self, req: tonic::Request<SendInvoice>) -> Self::Future {
        let billing = self.0.clone();
        Box::pin(async move {
            let key = req
                .metadata()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let invoice_id = req.get_ref().invoice_id;
            billing.previous.lock().unwrap().push(
                req.metadata()
                    .get("grpc-previous-rpc-attempts")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
            );
            let n = {
                let mut calls = billing.calls.lock().unwrap();
                calls.push((key.clone(), invoice_id));
                calls.len() - 1
            };
            let deliver = || billing.delivered.lock().unwrap().insert(key.clone());
            match (billing.script)(n) {
                Answer::Refuse(status) => return Err(status),
                Answer::DeliverThenFail(status) => {
                    deliver();
                    return Err(status);
                }
                Answer::Deliver => {
                    deliver();
                }
            }
            Ok(tonic::Response::new(Sent {
                message_id: format!("msg-{}", req.get_ref().invoice_id),
            }))
        })
    }
}

impl Service<http::Request<Body>> for Billing {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let billing = self.clone();
        Box::pin(async move {
            if req.uri().path() == LIST_PATH {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Sent, SendInvoice>::default());
                return Ok(grpc.server_streaming(Listing(billing), req).await);
            }
            if req.uri().path() != PATH {
                return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Sent, SendInvoice>::default());
            Ok(grpc.unary(Unary(billing), req).await)
        })
    }
}

const LIST_PATH: &str = "/billing.Billing/ListSent";

/// The server-streaming call: `invoice_id` messages, then the status the script gives
/// (`Answer::Refuse(status)`: that status in the trailers; otherwise OK).
struct Listing(Billing);

type SentStream = Pin<Box<dyn futures_util::Stream<Item = Result<Sent, Status>> + Send>>;

impl tonic::server::ServerStreamingService<SendInvoice> for Listing {
    type Response = Sent;
    type ResponseStream = SentStream;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<SentStream>, Status>> + Send>>;

    fn call(&mut self, req: tonic::Request<SendInvoice>) -> Self::Future {
        let billing = self.0.clone();
        Box::pin(async move {
            let count = req.get_ref().invoice_id;
            let n = {
                let mut calls = billing.calls.lock().unwrap();
                calls.push((String::new(), count));
                calls.len() - 1
            };
            let mut items: Vec<Result<Sent, Status>> = (0..count)
                .map(|i| {
                    Ok(Sent {
                        message_id: format!("msg-{i}"),
                    })
                })
                .collect();
            if let Answer::Refuse(status) = (billing.script)(n) {
                items.push(Err(status));
            }
            let stream: SentStream = Box::pin(futures_util::stream::iter(items));
            Ok(tonic::Response::new(stream))
        })
    }
}

impl NamedService for Billing {
    const NAME: &'static str = "billing.Billing";
}

/// Starts the server on 127.0.0.1 and returns it with a client channel to it.
async fn serve(script: impl Fn(usize) -> Answer + Send + Sync + 'static) -> (Billing, Channel) {
    let billing = Billing {
        script: Arc::new(script),
        calls: Arc::default(),
        delivered: Arc::default(),
        previous: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder().add_service(billing.clone());
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (billing, channel)
}

/// The tool's call: one unary gRPC call through a tonic client.
fn client(
    channel: Channel,
) -> impl Service<tonic::Request<SendInvoice>, Response = tonic::Response<Sent>, Error = Status> + Clone
{
    tower::service_fn(move |req: tonic::Request<SendInvoice>| {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        async move {
            grpc.ready()
                .await
                .map_err(|e| Status::from_error(e.into()))?;
            let path = http::uri::PathAndQuery::from_static(PATH);
            grpc.unary(req, path, ProstCodec::<SendInvoice, Sent>::default())
                .await
        }
    })
}

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

/// A retry layer for `class` with a 5 ms backoff, replaying gRPC requests.
fn retry(class: ToolClass, budget: &RetryBudget) -> RetryLayer<DefaultClassifier, GrpcReplay> {
    RetryLayer::new(fast(class), budget.clone()).replay(GrpcReplay)
}

type Call = tonic::Request<SendInvoice>;
type Reply = tonic::Response<Sent>;

/// One retrying layer over the client.
fn retrying(
    class: ToolClass,
    channel: Channel,
) -> impl Service<Call, Response = Reply, Error = ToolError> {
    ServiceBuilder::new()
        .layer(retry(class, &RetryBudget::default()))
        .service(client(channel))
}

/// A keyed write: one retrying layer, then the key layer, over the client.
fn keyed(channel: Channel) -> impl Service<Call, Response = Reply, Error = ToolError> {
    ServiceBuilder::new()
        .layer(retry(ToolClass::KeyedWrite, &RetryBudget::default()))
        .layer(SetIdempotencyKeyLayer::new(key_of))
        .service(client(channel))
}

fn key_of(req: &tonic::Request<SendInvoice>) -> Result<Action, stormguard::key::KeyError> {
    // The key covers the invoice, not the (model-written) body.
    Action::new(
        "run-81f2",
        "step-2",
        "send_invoice",
        &serde_json::json!({ "invoice_id": req.get_ref().invoice_id }),
    )
}

fn invoice(id: u64, body: &str) -> tonic::Request<SendInvoice> {
    tonic::Request::new(SendInvoice {
        invoice_id: id,
        body: body.to_string(),
    })
}

#[tokio::test]
async fn unavailable_is_retried_with_the_same_key_on_every_attempt() {
    let (billing, channel) = serve(|n| {
        if n < 2 {
            Answer::Refuse(Status::unavailable("warming up"))
        } else {
            Answer::Deliver
        }
    })
    .await;
    let mut svc = keyed(channel);
    let sent = call(&mut svc, invoice(4471, "Dear customer"))
        .await
        .unwrap();
    assert_eq!(sent.get_ref().message_id, "msg-4471");
    let keys = billing.keys();
    assert_eq!(keys.len(), 3, "two UNAVAILABLE answers, then a success");
    assert!(
        keys[0].starts_with("run-81f2:step-2:send_invoice:"),
        "{keys:?}"
    );
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    assert_eq!(billing.deliveries(), 1);
}

#[tokio::test]
async fn a_deadline_on_a_keyed_write_is_retried_and_delivered_once() {
    // The server delivers and then reports DEADLINE_EXCEEDED: ambiguous. With a key the retry is
    // safe, and the provider's deduplication keeps it to one delivery.
    let (billing, channel) = serve(|n| {
        if n == 0 {
            Answer::DeliverThenFail(Status::deadline_exceeded("slow"))
        } else {
            Answer::Deliver
        }
    })
    .await;
    let mut svc = keyed(channel);
    call(&mut svc, invoice(7, "first wording")).await.unwrap();
    let keys = billing.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(!keys[0].is_empty() && keys[0] == keys[1], "{keys:?}");
    assert_eq!(billing.deliveries(), 1);
}

#[tokio::test]
async fn a_deadline_on_an_unkeyed_write_is_escalated_not_repeated() {
    let (billing, channel) =
        serve(|_| Answer::DeliverThenFail(Status::deadline_exceeded("slow"))).await;
    let mut svc = retrying(ToolClass::UnkeyedWrite, channel);
    let err: ToolError = call(&mut svc, invoice(8, "hello")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert!(!err.retryable());
    assert_eq!(billing.calls(), 1);
    assert_eq!(billing.deliveries(), 1);
}

#[tokio::test]
async fn invalid_argument_goes_back_to_the_model_after_one_call() {
    let (billing, channel) =
        serve(|_| Answer::Refuse(Status::invalid_argument("invoice_id must be positive"))).await;
    let mut svc = retrying(ToolClass::Read, channel);
    let err: ToolError = call(&mut svc, invoice(0, "")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(!err.retryable());
    assert_eq!(billing.calls(), 1);
    let json = err.to_json();
    assert_eq!(json["code"], "invalid_argument");
}

#[tokio::test]
async fn three_nested_layers_in_an_outage_make_at_most_three_grpc_calls_per_operation() {
    let (billing, channel) = serve(|_| Answer::Refuse(Status::unavailable("down"))).await;
    let budget = RetryBudget::default();
    let layer = |name| retry(ToolClass::Read, &budget).name(name);
    let mut svc = ServiceBuilder::new()
        .layer(layer("agent-loop"))
        .layer(layer("tool-wrapper"))
        .layer(layer("client"))
        .service(client(channel));
    for op in 1..=4 {
        let err: ToolError = call(&mut svc, invoice(op, "")).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(
            !err.retryable(),
            "no outer layer or model should retry it again"
        );
        let calls = billing.calls_for(op);
        assert!((1..=3).contains(&calls), "operation {op}: {calls} calls");
    }
}

#[tokio::test]
async fn grpc_retry_pushback_is_honoured() {
    let (billing, channel) = serve(|n| {
        if n == 0 {
            let mut status = Status::resource_exhausted("slow down");
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", "300".parse().unwrap());
            Answer::Refuse(status)
        } else {
            Answer::Deliver
        }
    })
    .await;
    let mut svc = retrying(ToolClass::Read, channel);
    let start = std::time::Instant::now();
    call(&mut svc, invoice(9, "")).await.unwrap();
    assert_eq!(billing.calls(), 2);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "the pushback (300 ms), not the 5 ms backoff, set the delay: {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_refused_connection_is_retried_even_for_an_unkeyed_write() {
    // Nothing listens on this port: no call is sent, so even an unkeyed write may be retried.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut svc = retrying(ToolClass::UnkeyedWrite, channel);
    let err: ToolError = call(&mut svc, invoice(10, "")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert_eq!(err.attempts(), 3, "{err}");
}

#[tokio::test]
async fn each_retry_says_how_many_attempts_came_before_it() {
    let (billing, channel) = serve(|n| {
        if n < 2 {
            Answer::Refuse(Status::unavailable("warming up"))
        } else {
            Answer::Deliver
        }
    })
    .await;
    let mut svc = keyed(channel);
    call(&mut svc, invoice(4471, "Dear customer"))
        .await
        .unwrap();
    let previous = billing.previous.lock().unwrap().clone();
    assert_eq!(
        previous,
        [None, Some("1".to_string()), Some("2".to_string())]
    );
}

/// A `google.rpc.Status` whose details hold one `RetryInfo` asking for `ms` milliseconds.
fn retry_info_details(code: i32, ms: u64) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn field(tag: u64, bytes: &[u8], out: &mut Vec<u8>) {
        varint(tag << 3 | 2, out);
        varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
    let mut duration = Vec::new();
    varint(1 << 3, &mut duration);
    varint(ms / 1000, &mut duration);
    varint(2 << 3, &mut duration);
    varint((ms % 1000) * 1_000_000, &mut duration);
    let mut info = Vec::new();
    field(1, &duration, &mut info);
    let mut any = Vec::new();
    field(1, b"type.googleapis.com/google.rpc.RetryInfo", &mut any);
    field(2, &info, &mut any);
    let mut status = Vec::new();
    varint(1 << 3, &mut status);
    varint(code as u64, &mut status);
    field(3, &any, &mut status);
    status
}

#[tokio::test]
async fn a_retry_info_in_the_status_details_is_the_servers_delay() {
    let (billing, channel) = serve(|n| {
        if n == 0 {
            Answer::Refuse(Status::with_details(
                tonic::Code::Unavailable,
                "draining",
                retry_info_details(14, 300).into(),
            ))
        } else {
            Answer::Deliver
        }
    })
    .await;
    // The backoff is 5 ms; the server asked for 300 ms.
    let mut svc = retrying(ToolClass::Read, channel);
    let started = std::time::Instant::now();
    call(&mut svc, invoice(4471, "Dear customer"))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(billing.calls(), 2);
}

/// A server-streaming call through a typed `Retry` over tonic's client over a breaker on the
/// channel (HTTP level, `GrpcClassifier`): what the stream ended with, and the messages before.
async fn list(
    retry: &mut (impl Service<Call, Response = tonic::Response<tonic::Streaming<Sent>>, Error = ToolError>
              + Send),
    count: u64,
) -> (usize, Result<(), Status>) {
    let response = call(retry, invoice(count, ""))
        .await
        .expect("the head arrives");
    let mut stream = response.into_inner();
    let mut got = 0;
    loop {
        match stream.message().await {
            Ok(Some(_)) => got += 1,
            Ok(None) => return (got, Ok(())),
            Err(status) => return (got, Err(status)),
        }
    }
}

fn streaming_stack(
    channel: Channel,
    breaker: &Breaker,
) -> impl Service<Call, Response = tonic::Response<tonic::Streaming<Sent>>, Error = ToolError> + Send
{
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()).classifier(GrpcClassifier))
        // The classifiers read errors as `AsDynError`: a channel's error, boxed.
        .map_err(tower::BoxError::from)
        .service(channel);
    let client = tower::service_fn(move |req: Call| {
        let mut grpc = tonic::client::Grpc::new(guarded.clone());
        async move {
            grpc.ready().await.map_err(Status::from_error)?;
            let path = http::uri::PathAndQuery::from_static(LIST_PATH);
            grpc.server_streaming(req, path, ProstCodec::<SendInvoice, Sent>::default())
                .await
        }
    });
    ServiceBuilder::new()
        .layer(retry(ToolClass::Read, &RetryBudget::default()))
        .service(client)
}

#[tokio::test]
async fn a_stream_that_fails_in_its_trailers_counts_against_the_breaker_and_is_not_retried() {
    let (billing, channel) =
        serve(|_| Answer::Refuse(Status::unavailable("shard lost mid-stream"))).await;
    let breaker = Breaker::new(
        "billing-stream",
        BreakerConfig::builder()
            .consecutive_failures(3)
            .no_failure_rate()
            .build()
            .unwrap(),
    );
    let mut stack = streaming_stack(channel, &breaker);
    for n in 1..=3 {
        let (got, end) = list(&mut stack, 2).await;
        // The messages and the trailers' status reach the caller untouched.
        assert_eq!(got, 2);
        assert_eq!(end.unwrap_err().code(), tonic::Code::Unavailable);
        // Committed once the head arrived: one call per stream, not retried.
        assert_eq!(billing.calls(), n);
    }
    // Three streams failed in their trailers: the breaker counted each one and opened.
    assert_eq!(breaker.opens(), 1);
    assert_eq!(breaker.state(), stormguard::breaker::State::Open);
    let err = call(&mut stack, invoice(2, "")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(billing.calls(), 3, "an open breaker sends nothing");
}

#[tokio::test]
async fn streams_that_end_ok_or_are_dropped_never_trip_the_breaker() {
    // Every other stream fails in its trailers, the others end OK; from the 11th on, all fail.
    let (billing, channel) = serve(|n| {
        if n % 2 == 0 || n >= 10 {
            Answer::Refuse(Status::internal("lost"))
        } else {
            Answer::Deliver
        }
    })
    .await;
    let breaker = Breaker::new(
        "billing-stream",
        BreakerConfig::builder()
            .consecutive_failures(2)
            .no_failure_rate()
            .build()
            .unwrap(),
    );
    let mut stack = streaming_stack(channel, &breaker);
    for _ in 0..5 {
        let (_, end) = list(&mut stack, 1).await; // fails
        assert!(end.is_err());
        let (got, end) = list(&mut stack, 3).await; // ends OK: resets the run of failures
        assert_eq!((got, end.is_ok()), (3, true));
    }
    assert_eq!(breaker.opens(), 0);
    // Streams dropped before their end are no evidence: two failing ones dropped unread.
    for _ in 0..2 {
        let response = call(&mut stack, invoice(4, "")).await.unwrap();
        drop(response);
    }
    assert_eq!(breaker.opens(), 0);
    assert_eq!(billing.calls(), 12);
    // Read to their end, two failing streams open it.
    for _ in 0..2 {
        assert!(list(&mut stack, 1).await.1.is_err());
    }
    assert_eq!(breaker.opens(), 1);
}

#[tokio::test]
async fn an_open_circuit_below_the_tonic_client_reaches_the_retry_retryable_with_its_delay() {
    // Outside review: through tonic's client the rejection arrives as a `Status` whose source is
    // the breaker's `ToolError`; the Retry used to rebuild it as non-retryable, without its delay.
    let (billing, channel) = serve(|_| Answer::Refuse(Status::unavailable("down"))).await;
    let breaker = Breaker::new(
        "billing",
        BreakerConfig::builder()
            .consecutive_failures(1)
            .no_failure_rate()
            .build()
            .unwrap(),
    );
    let guarded = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()).classifier(GrpcClassifier))
        .map_err(tower::BoxError::from)
        .service(channel);
    let client = tower::service_fn(move |req: Call| {
        let mut grpc = tonic::client::Grpc::new(guarded.clone());
        async move {
            grpc.ready().await.map_err(Status::from_error)?;
            let path = http::uri::PathAndQuery::from_static(PATH);
            grpc.unary(req, path, ProstCodec::<SendInvoice, Sent>::default())
                .await
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(retry(ToolClass::Read, &RetryBudget::default()))
        .service(client);
    // One UNAVAILABLE opens it; the retry meets the open circuit.
    let err = call(&mut svc, invoice(1, "")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(billing.calls(), 1);
    let err = call(&mut svc, invoice(1, "")).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert!(err.retryable(), "an open circuit is retryable later");
    assert!(err.retry_after().is_some_and(|d| d > Duration::ZERO));
    assert_eq!(billing.calls(), 1, "nothing reached the server");
}
