//! The natural mistakes of issue 37, each against a real HTTP server on 127.0.0.1: what the
//! crate can see overrules what it was told, and says so. Each test asserts the remedy (one
//! effect, the right code, a hint that names the fix).
#![cfg(feature = "reqwest")]

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::{Classify, FailureClass, HttpClassifier, OkIsSuccess};
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::retry::{HttpReplay, RetryLayer};
use stormguard::tool::{Call, RetryOwner, Stores, Tool, Toolbox};
use support::call;
use support::server::{self, serve, serve_after};
use tower::{service_fn, Layer, ServiceBuilder};

/// A retry policy whose backoff is a few milliseconds, so the tests do not wait on it.
fn quick(class: ToolClass) -> ClassPolicy {
    let fast = stormguard::backoff::Backoff::exponential(Duration::from_millis(2))
        .build()
        .unwrap();
    ClassPolicy::builder(class).backoff(fast).build().unwrap()
}

fn ticket_post(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Request {
    client
        .post(format!("http://{addr}/tickets"))
        .body(r#"{"subject":"refund"}"#)
        .build()
        .unwrap()
}

/// A ticket tool's body: POSTs the call's arguments to the provider, mapping a 5xx (as a user
/// would) to an ambiguous failure.
fn ticket_body(
    addr: SocketAddr,
) -> impl tower::Service<Call, Response = Value, Error = BoxError, Future = impl Send> + Clone + Send
{
    let client = reqwest::Client::new();
    service_fn(move |call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/tickets"));
        async move {
            let resp = client
                .post(url)
                .body(call.args().to_string())
                .send()
                .await?;
            if resp.status().is_server_error() {
                // The user's own mapping: a 5xx is an ambiguous failure.
                return Err(ToolError::new(ErrorCode::Unavailable)
                    .with_class(FailureClass::Ambiguous)
                    .into());
            }
            Ok::<Value, BoxError>(json!({ "ticket": 1 }))
        }
    })
}

/// Mistake: the ticket tool declared `class = "read"`. A 502 after the ticket was created: the
/// tool's name says it creates, so it decides as an unkeyed write: one ticket, `outcome_unknown`,
/// and the hint says why and how to say otherwise.
#[tokio::test]
async fn a_ticket_tool_declared_read_creates_one_ticket() {
    let (addr, tickets) = serve(|_| server::status(502, &[])).await;
    let tools = Toolbox::new(vec![Tool::new(
        "create_ticket",
        ToolClass::Read,
        RetryOwner::Layer,
    )])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let body = ticket_body(addr);
    let mut svc = tools
        .layer("create_ticket")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let err = call(&mut svc, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(tickets.load(Ordering::SeqCst), 1, "one ticket");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err}");
    assert!(err.hint().contains("create"), "{}", err.hint());
    assert!(err.hint().contains("trust_class"), "{}", err.hint());

    // Told explicitly that the tool is a read, the crate believes it: the 502 is retried.
    let (addr, calls) = serve(|_| server::status(502, &[])).await;
    let tools = Toolbox::new(vec![Tool::new(
        "create_ticket",
        ToolClass::Read,
        RetryOwner::Layer,
    )
    .trust_class()])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/reports"));
        async move {
            client.post(url).send().await?;
            Err::<Value, BoxError>(
                ToolError::new(ErrorCode::Unavailable)
                    .with_class(FailureClass::Ambiguous)
                    .into(),
            )
        }
    });
    let mut svc = tools
        .layer("create_ticket")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let err = call(&mut svc, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "trusted: retried");
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

/// Mistake: the model reissues the unkeyed ticket after `outcome_unknown` (the error said
/// `retryable: false`; models do it anyway), on a tool with no receipt. The stack holds the
/// call: answered `outcome_unknown` again, not sent, until an operator resolves it; a ticket
/// for another subject is sent; the same call at once from two branches is sent once.
#[tokio::test]
async fn a_reissued_unknown_outcome_is_held_not_sent_again() {
    let (addr, tickets) = serve(|_| server::status(502, &[])).await;
    let tools = Toolbox::new(vec![Tool::new(
        "post_ticket",
        ToolClass::UnkeyedWrite,
        RetryOwner::Model,
    )
    .unknown_outcome(stormguard::tool::UnknownOutcome::Escalate)])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let body = ticket_body(addr);
    let mut svc = tools
        .layer("post_ticket")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let refund = json!({ "subject": "refund 4471" });
    let first = call(&mut svc, Call::new("run-1", "step-2", refund.clone()))
        .await
        .unwrap_err();
    assert_eq!(first.code(), ErrorCode::OutcomeUnknown, "{first}");
    assert!(!first.retryable());
    for step in ["step-3", "step-4"] {
        let again = call(&mut svc, Call::new("run-1", step, refund.clone()))
            .await
            .unwrap_err();
        assert_eq!(again.code(), ErrorCode::OutcomeUnknown, "{again}");
        assert!(again.hint().contains("resolve_held"), "{}", again.hint());
        assert!(again.hint().contains("step-2"), "{}", again.hint());
    }
    assert_eq!(tickets.load(Ordering::SeqCst), 1, "one ticket, not three");
    // Another subject is another call; another run is another run.
    let other = json!({ "subject": "address change" });
    let _ = call(&mut svc, Call::new("run-1", "step-5", other)).await;
    let _ = call(&mut svc, Call::new("run-2", "step-1", refund.clone())).await;
    assert_eq!(tickets.load(Ordering::SeqCst), 3);
    // The operator says the first one took effect: still not sent, answered `conflict`.
    let held = tools.held();
    assert_eq!(held.len(), 3, "{held:?}");
    let first_held = held
        .iter()
        .find(|h| h.run == "run-1" && h.step == "step-2")
        .unwrap();
    assert!(tools.resolve_held(&first_held.id, stormguard::tool::HeldResolution::Done));
    let done = call(&mut svc, Call::new("run-1", "step-6", refund.clone()))
        .await
        .unwrap_err();
    assert_eq!(done.code(), ErrorCode::Conflict, "{done}");
    assert_eq!(tickets.load(Ordering::SeqCst), 3);
}

/// Two branches of the agent make the same unkeyed call at once: the second is answered
/// `in_progress`, not sent.
#[tokio::test]
async fn the_same_unkeyed_call_from_two_branches_at_once_is_sent_once() {
    let (addr, tickets) =
        serve_after(|_| Duration::from_millis(200), |_| server::status(201, &[])).await;
    let tools = Toolbox::new(vec![Tool::new(
        "post_ticket",
        ToolClass::UnkeyedWrite,
        RetryOwner::None,
    )
    .unknown_outcome(stormguard::tool::UnknownOutcome::Escalate)])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let body = ticket_body(addr);
    let layer = tools.layer("post_ticket").unwrap().classifier(OkIsSuccess);
    let (mut a, mut b) = (layer.layer(body.clone()), layer.layer(body));
    let args = json!({ "subject": "refund" });
    let (ra, rb) = tokio::join!(
        call(&mut a, Call::new("run-1", "step-2", args.clone())),
        call(&mut b, Call::new("run-1", "step-3", args.clone())),
    );
    assert_eq!(tickets.load(Ordering::SeqCst), 1);
    let refused = ra.err().or(rb.err()).expect("one branch is refused");
    assert_eq!(refused.code(), ErrorCode::InProgress, "{refused}");
    assert!(!refused.retryable());
    // Answered, the call is forgotten: nothing is held.
    assert!(tools.held().is_empty());
}

/// Mistake: the tool body spawns its inner call, a `RetryLayer(Read)` over `reqwest::Client`
/// sending a POST (the operation does not cross the spawn). The POST is the evidence: one
/// ticket, and the model is told `outcome_unknown` after one attempt.
#[tokio::test]
async fn a_spawned_read_layer_over_a_post_sends_it_once() {
    let (addr, tickets) = serve(|_| server::status(502, &[])).await;
    let client = reqwest::Client::new();
    let inner = ServiceBuilder::new()
        .layer(
            RetryLayer::new(quick(ToolClass::Read), RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(client.clone());
    let req = ticket_post(&client, addr);
    let err = tokio::spawn(async move {
        let mut inner = inner;
        call(&mut inner, req).await.map(|_| ())
    })
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(tickets.load(Ordering::SeqCst), 1, "one ticket, not three");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(err.attempts(), 1);
    assert!(err.hint().contains("POST"), "{}", err.hint());
}

/// An `Idempotency-Key` on the POST is evidence too: the same declared read is retried, for the
/// provider deduplicates the key.
#[tokio::test]
async fn a_keyed_post_under_a_read_layer_is_retried() {
    let (addr, calls) = serve(|n| server::status(if n == 0 { 502 } else { 201 }, &[])).await;
    let client = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(quick(ToolClass::Read), RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(client.clone());
    let mut req = ticket_post(&client, addr);
    req.headers_mut()
        .insert("idempotency-key", "run-1:step-1".parse().unwrap());
    let resp = call(&mut svc, req).await.unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// hyper's client, answering with the whole body read into a `String` (as a user's client reads
/// a model API's JSON).
fn string_client() -> impl tower::Service<
    http::Request<Full<Bytes>>,
    Response = http::Response<String>,
    Error = BoxError,
    Future: Send,
> + Clone {
    let client = server::HttpClient::new();
    service_fn(move |req: http::Request<Full<Bytes>>| {
        let mut client = client.clone();
        async move {
            let resp = tower::Service::call(&mut client, req).await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            Ok::<_, BoxError>(http::Response::from_parts(parts, text))
        }
    })
}

/// Mistake: `ModelApiClassifier` forgotten on the chat tool. The stock `HttpClassifier` reads a
/// spent quota from a body in memory: sent once, `quota_exhausted` (not `rate_limited`), with
/// the provider's words in the hint.
#[tokio::test]
async fn a_spent_quota_is_sent_once_without_the_model_api_classifier() {
    let (addr, calls) = serve(|_| {
        http::Response::builder()
            .status(429)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}"#,
            )))
            .unwrap()
    })
    .await;
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(quick(ToolClass::Read), RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(string_client());
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    // A permanent failure is the answer at this layer: the provider's 429 comes back as is,
    // after one send (a rate limit would have been resent).
    let resp = call(&mut svc, req).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a spent quota is not resent"
    );
    // What a layer above (the tool stack) turns it into: `quota_exhausted`, the provider's
    // words in the hint.
    let err = Classify::<_, BoxError>::dependency_error(&HttpClassifier, &resp)
        .expect("a 429 is a dependency error");
    assert_eq!(err.code(), ErrorCode::QuotaExhausted, "{err}");
    assert!(!err.retryable());
    assert!(err.hint().contains("quota"), "{}", err.hint());
}

/// An Anthropic-style overload (529) is retried until the provider answers, as not processed.
#[tokio::test]
async fn an_overload_is_retried_without_the_model_api_classifier() {
    let (addr, calls) = serve(|n| match n {
        0 => http::Response::builder()
            .status(529)
            .body(Full::new(Bytes::from_static(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            )))
            .unwrap(),
        _ => server::status(200, &[]),
    })
    .await;
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(quick(ToolClass::UnkeyedWrite), RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(string_client());
    let req = http::Request::post(format!("http://{addr}/v1/messages"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = call(&mut svc, req).await.unwrap();
    assert_eq!(resp.status(), 200);
    // Even an unkeyed write may be resent: the overload says the request was not processed.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Mistake: `reqwest::Client::new()` (no timeout) under a declared deadline, against a provider
/// that hangs. The deadline cuts the attempt off: a read ends `deadline_exceeded`, an unkeyed
/// write `outcome_unknown` (it may have been applied); neither waits on the hung call.
#[tokio::test]
async fn a_declared_deadline_cuts_off_a_hung_call() {
    let hang = Duration::from_secs(60);
    let (addr, calls) = serve_after(move |_| hang, |_| server::status(200, &[])).await;
    let client = reqwest::Client::new();
    for (class, code) in [
        (ToolClass::Read, ErrorCode::DeadlineExceeded),
        (ToolClass::UnkeyedWrite, ErrorCode::OutcomeUnknown),
    ] {
        let policy = ClassPolicy::builder(class)
            .deadline(Duration::from_millis(300))
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(
                RetryLayer::new(policy, RetryBudget::default())
                    .classifier(HttpClassifier)
                    .replay(HttpReplay),
            )
            .service(client.clone());
        let started = Instant::now();
        let req = client
            .get(format!("http://{addr}/orders/7"))
            .build()
            .unwrap();
        let err = call(&mut svc, req).await.unwrap_err();
        // Far below the hang, whatever the machine's load.
        assert!(started.elapsed() < hang / 4, "{:?}", started.elapsed());
        assert_eq!(err.code(), code, "{class:?}: {err}");
        assert_eq!(err.attempts(), 1);
        assert!(!err.retryable());
        assert!(err.hint().contains("deadline"), "{}", err.hint());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one attempt per class");
}

/// The deadline in a tool table holds the same way: the toolbox's `deadline_secs` cuts off a
/// body that waits on a hung provider.
#[tokio::test]
async fn a_tool_tables_deadline_cuts_off_a_hung_body() {
    let hang = Duration::from_secs(60);
    let (addr, calls) = serve_after(move |_| hang, |_| server::status(200, &[])).await;
    let tools = Toolbox::new(vec![Tool::new(
        "search_orders",
        ToolClass::Read,
        RetryOwner::Layer,
    )
    .deadline_secs(1)])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/orders"));
        async move {
            client.get(url).send().await?;
            Ok::<Value, BoxError>(json!([]))
        }
    });
    let mut svc = tools
        .layer("search_orders")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let started = Instant::now();
    let err = call(&mut svc, Call::new("run-1", "step-1", json!({})))
        .await
        .unwrap_err();
    assert!(started.elapsed() < hang / 4, "{:?}", started.elapsed());
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded, "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Evidence that overrules a class is counted on every decision it changes (the WARN is said
/// once per layer).
#[test]
fn evidence_that_overrules_a_class_is_counted() {
    let (tickets, counted) = support::counted::counting(async {
        let (addr, tickets) = serve(|_| server::status(502, &[])).await;
        let client = reqwest::Client::new();
        let mut svc = ServiceBuilder::new()
            .layer(
                RetryLayer::new(quick(ToolClass::Read), RetryBudget::default())
                    .classifier(HttpClassifier)
                    .replay(HttpReplay),
            )
            .service(client.clone());
        for _ in 0..2 {
            let err = call(&mut svc, ticket_post(&client, addr))
                .await
                .unwrap_err();
            assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
        }
        tickets.load(Ordering::SeqCst)
    });
    assert_eq!(tickets, 2, "one per call");
    let counted: u64 = counted.total("stormguard_class_from_evidence_total");
    assert_eq!(counted, 2);
}

/// A read dropped while in flight (the agent gave up on it) is not held: the next same call is
/// sent. An unkeyed write dropped in flight is held: what was sent may have acted.
#[tokio::test]
async fn a_dropped_read_is_not_held_but_a_dropped_write_is() {
    let (addr, _hits) =
        serve_after(|_| Duration::from_millis(300), |_| server::status(200, &[])).await;
    let tools = Toolbox::new(vec![
        Tool::new("search_orders", ToolClass::Read, RetryOwner::Layer),
        Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::None)
            .unknown_outcome(stormguard::tool::UnknownOutcome::Escalate),
    ])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let client = reqwest::Client::new();
    let body = service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/"));
        async move {
            client.get(url).send().await?;
            Ok::<Value, BoxError>(json!({ "ok": true }))
        }
    });
    let args = json!({ "q": "4471" });
    for tool in ["search_orders", "post_ticket"] {
        let mut svc = tools
            .layer(tool)
            .unwrap()
            .classifier(OkIsSuccess)
            .layer(body.clone());
        let gave_up = tokio::time::timeout(
            Duration::from_millis(50),
            call(&mut svc, Call::new("run-1", "step-1", args.clone())),
        )
        .await;
        assert!(gave_up.is_err(), "{tool}: dropped in flight");
        let again = call(&mut svc, Call::new("run-1", "step-2", args.clone())).await;
        match tool {
            "search_orders" => assert!(again.is_ok(), "{again:?}"),
            _ => assert_eq!(again.unwrap_err().code(), ErrorCode::OutcomeUnknown),
        }
    }
    let held = tools.held();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].tool, "post_ticket");
}
