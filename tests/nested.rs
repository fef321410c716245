//! One ledger per logical operation, across nested layers, request types and task boundaries.
mod support;

use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::operation::{carry, AdoptLayer, AttachLayer};
use stormguard::retry::RetryLayer;
use support::{call, Dependency, Outcome, ToolCall};
use tower::{service_fn, Service, ServiceBuilder};

fn outage() -> Dependency {
    Dependency::always(Outcome::Fail(FailureClass::Transient))
}

fn to_http(call: ToolCall) -> http::Request<String> {
    http::Request::post(format!("/tools/{}", call.tool))
        .body(call.arg.to_string())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn three_layers_over_differing_request_types_make_three_calls() {
    let dep = outage();
    let budget = RetryBudget::default();
    // agent loop (ToolCall) -> tool wrapper (ToolCall) -> client (http::Request)
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
        .map_request(to_http)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("client"))
        .service(dep.clone());

    for i in 0..5 {
        let before = dep.calls();
        let err = call(
            &mut stack,
            ToolCall {
                tool: "search",
                arg: i,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(
            dep.calls() - before,
            3,
            "operation {i} made more than max_attempts calls"
        );
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(!err.retryable());
        assert_eq!(err.attempts(), 3);
    }
}

#[tokio::test(start_paused = true)]
async fn tower_retry_nested_three_deep_makes_twenty_seven() {
    // The problem this crate exists for, measured on tower's own Retry.
    #[derive(Clone)]
    struct Attempts(u32);
    impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for Attempts {
        type Future = std::future::Ready<()>;
        fn retry(&mut self, _: &mut Req, r: &mut Result<Res, E>) -> Option<Self::Future> {
            (r.is_err() && self.0 > 1).then(|| {
                self.0 -= 1;
                std::future::ready(())
            })
        }
        fn clone_request(&mut self, req: &Req) -> Option<Req> {
            Some(req.clone())
        }
    }
    let dep = outage();
    let mut stack = ServiceBuilder::new()
        .retry(Attempts(3))
        .retry(Attempts(3))
        .retry(Attempts(3))
        .service(dep.clone());
    let _ = call(&mut stack, 1u32).await;
    assert_eq!(dep.calls(), 27);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_write_across_a_buffer_over_a_read_client_layer_is_sent_once() {
    // An unkeyed write whose HTTP client layer, behind a buffer, is configured for reads. The
    // operation travels in the request's extensions, so the client layer learns that it must
    // not repeat an ambiguous failure of the write: no helper layer needed.
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    let err = call(
        &mut stack,
        to_http(ToolCall {
            tool: "send",
            arg: 1,
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(dep.calls(), 1, "the write was sent more than once");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert!(!err.retryable());

    // The same through a tool body that spawns its inner call (no `carry`).
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .buffer(8)
        .service(spawning_http_tool(client));
    let err = call(
        &mut stack,
        to_http(ToolCall {
            tool: "send",
            arg: 2,
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(dep.calls(), 1, "the write was sent more than once");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
}

/// A tool body that runs its inner HTTP call on a spawned task, without `carry`.
fn spawning_http_tool<S>(
    inner: S,
) -> impl Service<http::Request<String>, Response = u32, Error = BoxError, Future: Send> + Clone
where
    S: Service<http::Request<String>, Response = u32, Error = stormguard::error::ToolError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    service_fn(move |req: http::Request<String>| {
        let mut inner = inner.clone();
        async move { Ok(tokio::spawn(async move { call(&mut inner, req).await }).await??) }
    })
}

#[tokio::test(start_paused = true)]
async fn three_layers_with_a_buffer_between_each_and_a_spawning_tool_body_make_three_calls() {
    let budget = RetryBudget::default();
    let dep = outage();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("client"))
        .service(dep.clone());
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
        .buffer(8)
        .service(spawning_http_tool(client));
    for i in 1..=3 {
        let err = call(&mut stack, to_http(ToolCall { tool: "t", arg: i }))
            .await
            .unwrap_err();
        assert_eq!(dep.calls(), 3 * i, "operation {i}: more than 3 calls");
        assert_eq!(err.attempts(), 3);
        assert!(!err.retryable());
    }
}

#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn a_tonic_request_carries_the_operation_across_buffers_and_spawns() {
    let budget = RetryBudget::default();
    let dep = outage();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("client"))
        .service(dep.clone());
    let body = service_fn(move |req: tonic::Request<u32>| {
        let mut client = client.clone();
        async move {
            let attempts = req.metadata().get("grpc-previous-rpc-attempts").cloned();
            let answer = tokio::spawn(async move { call(&mut client, req).await }).await??;
            Ok::<_, BoxError>((answer, attempts))
        }
    });
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
        .buffer(8)
        .service(body);
    let err = call(&mut stack, tonic::Request::new(7u32))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(err.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_request_type_that_cannot_carry_loses_the_operation_at_a_buffer() {
    // The limit, said plainly: a plain value (here a `u32`) carries nothing, so behind a buffer
    // the client layer opens an operation of its own and, configured for reads, repeats an
    // ambiguous failure of the unkeyed write. A request type that implements `Request::attach`
    // (or `operation::Carrier` with `AttachLayer` / `AdoptLayer`) carries it.
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    let _ = call(&mut stack, 1u32).await;
    assert_eq!(dep.calls(), 3, "a u32 cannot carry the operation");
}

#[tokio::test(start_paused = true)]
async fn a_nested_layer_that_loses_the_operation_owns_no_retries() {
    // The same stack with the client layer declared `nested()`: finding no operation, it makes
    // one attempt and hands the ambiguous failure up, where the unkeyed write escalates it.
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).nested())
        .service(dep.clone());
    let err = call(&mut stack, 1u32).await.unwrap_err();
    assert_eq!(dep.calls(), 1, "the write was sent more than once");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);

    // Over a read, the owner above still retries what the nested layer hands up: 3 in all.
    let dep = outage();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).nested())
        .service(dep.clone());
    let err = call(&mut stack, 2u32).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(err.code(), ErrorCode::Unavailable);

    // Where the operation does reach it, a nested layer retries within the operation's attempts
    // as any joining layer does.
    let dep = outage();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget).nested())
        .service(dep.clone());
    let err = call(&mut stack, 3u32).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(err.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_buffer_between_layers_shares_the_attempt_cap() {
    let budget = RetryBudget::default();
    let dep = outage();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(AttachLayer::new())
        .buffer(8)
        .layer(AdoptLayer::new())
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    for i in 1..=3 {
        let err = call(&mut stack, to_http(ToolCall { tool: "t", arg: i }))
            .await
            .unwrap_err();
        assert_eq!(dep.calls(), 3 * i);
        assert_eq!(err.attempts(), 3);
    }
}

/// A tool that runs its inner call on a spawned task, with or without `carry`, and reports
/// failures as its own error type (dropping the `ToolError`, as many tool wrappers do).
fn spawning_tool(
    inner: impl Service<u32, Response = u32, Error = stormguard::error::ToolError, Future: Send>
        + Clone
        + Send
        + 'static,
    use_carry: bool,
) -> impl Service<ToolCall, Response = u32, Error = BoxError, Future: Send> + Clone {
    service_fn(move |req: ToolCall| {
        let mut inner = inner.clone();
        async move {
            let work = async move { call(&mut inner, req.arg).await };
            let joined = if use_carry {
                tokio::spawn(carry(work)).await
            } else {
                tokio::spawn(work).await
            };
            joined?.map_err(|e| {
                BoxError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    e.to_string(),
                ))
            })
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_spawned_inner_call_joins_the_operation_when_carried() {
    for (use_carry, expected) in [(false, 9), (true, 3)] {
        let dep = outage();
        let budget = RetryBudget::default();
        let inner = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .service(dep.clone());
        let mut stack = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .service(spawning_tool(inner, use_carry));
        let _ = call(&mut stack, ToolCall { tool: "t", arg: 1 }).await;
        assert_eq!(dep.calls(), expected, "carry = {use_carry}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_layer_for_another_operation_does_not_spend_the_callers_attempts() {
    for own in [false, true] {
        let budget = RetryBudget::default();
        // An auth refresh that fails twice before it works, and a tool call that fails once.
        let refresh_dep = Dependency::script(
            [
                Outcome::Fail(FailureClass::Transient),
                Outcome::Fail(FailureClass::Transient),
            ],
            Outcome::Ok,
        );
        let tool_dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
        let mut refresh_layer = RetryLayer::new(ToolClass::Read, budget.clone()).name("auth");
        if own {
            refresh_layer = refresh_layer.own_operation();
        }
        let refresh = ServiceBuilder::new()
            .layer(refresh_layer)
            .service(refresh_dep.clone());
        let tool = {
            let tool_dep = tool_dep.clone();
            service_fn(move |req: ToolCall| {
                let mut refresh = refresh.clone();
                let mut tool_dep = tool_dep.clone();
                async move {
                    call(&mut refresh, 0u32).await?;
                    call(&mut tool_dep, req.arg).await
                }
            })
        };
        let mut stack = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool"))
            .service(tool);
        let result = call(&mut stack, ToolCall { tool: "t", arg: 1 }).await;
        if own {
            assert!(result.is_ok(), "own operation: {result:?}");
        } else {
            // The refresh spent the operation's three attempts: the tool failure cannot be retried.
            assert_eq!(result.unwrap_err().code(), ErrorCode::Unavailable);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_a_stricter_layer_below_hands_back_is_not_retried_above() {
    // The tool wrapper knows the tool is multi-step (a transient failure is not retried: the
    // steps done would run again); the agent loop above only knows it as a read.
    let dep = outage();
    let budget = RetryBudget::default();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
        .layer(RetryLayer::new(ToolClass::MultiStep, budget.clone()).name("tool-wrapper"))
        .service(dep.clone());
    let err = call(
        &mut stack,
        ToolCall {
            tool: "book_trip",
            arg: 1,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(dep.calls(), 1, "the loop re-ran a multi-step tool");
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn a_key_stamped_behind_a_buffer_tells_the_operation_the_request_carries() {
    // The key layer sits behind a buffer: the write's Retry above it saw a request without a
    // key. The key layer notes its key in the operation the request carries, so the ambiguous
    // 502 is retried with that same key instead of ending `missing_idempotency_key`.
    use std::sync::{Arc, Mutex};
    use stormguard::key::{Action, SetIdempotencyKeyLayer};
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let provider = service_fn(move |req: http::Request<String>| {
        let key = req.headers().get("idempotency-key").cloned();
        seen.lock().unwrap().push(key);
        async move { Ok::<_, BoxError>(http::Response::builder().status(502).body(()).unwrap()) }
    });
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::KeyedWrite,
            RetryBudget::default(),
        ))
        .buffer(8)
        .layer(SetIdempotencyKeyLayer::new(
            |req: &http::Request<String>| {
                Action::new("run-1", "step-2", "charge", &req.uri().path())
            },
        ))
        .service(provider);
    let err = call(
        &mut stack,
        to_http(ToolCall {
            tool: "charge",
            arg: 9,
        }),
    )
    .await
    .unwrap_err();
    let keys = keys.lock().unwrap();
    assert_eq!(keys.len(), 3, "{err}");
    assert!(keys.iter().all(|k| k.is_some() && *k == keys[0]));
    assert_eq!(err.code(), ErrorCode::Unavailable);
}

/// The two ways to spawn a call through a `Retry` over a service whose error is a `BoxError`
/// (an async block awaiting it directly does not compile: rust-lang/rust#102211).
#[tokio::test]
async fn a_call_over_a_boxed_service_is_spawned_as_its_future_or_through_a_boxed_stack() {
    use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    use tower::util::BoxCloneSyncService;
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = calls.clone();
    let inner = BoxCloneSyncService::new(service_fn(move |n: u32| {
        let first = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            if first {
                Err::<u32, stormguard::error::BoxError>(
                    std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
                )
            } else {
                Ok(n)
            }
        }
    }));
    let stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .service(inner);
    // The future itself.
    let answer = tokio::spawn(stack.clone().oneshot(7)).await.unwrap();
    assert_eq!(answer.unwrap(), 7);
    // The stack boxed first: an async block around its call is fine.
    let boxed = BoxCloneSyncService::new(stack);
    let answer = tokio::spawn(async move { boxed.oneshot(8).await.map_err(|e| e.to_string()) });
    assert_eq!(answer.await.unwrap(), Ok(8));
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "one refused, two answered"
    );
}

/// A receipt layer in a spawned tool body (its future polled on another task) tells the
/// operation the request carries that an attempt was answered there (the key came back with
/// other arguments), so the error reports no attempt sent: the same as on one task. (A `Buffer`
/// would not show it: tower's buffer hands the inner future back to the caller's task.)
#[tokio::test(start_paused = true)]
async fn a_receipt_layer_in_a_spawned_body_reports_its_local_answers_to_the_carried_operation() {
    use stormguard::key::Action;
    use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer, ReceiptStore};
    use stormguard::{budget::RetryBudget, class::ToolClass, error::ErrorCode, retry::RetryLayer};
    use tower::{service_fn, Layer, ServiceExt};
    let action = |req: &http::Request<String>| Action::new("run-1", "step-1", "charge", req.body());
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = sent.clone();
    let provider = service_fn(move |_: http::Request<String>| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok::<_, std::io::Error>(http::Response::new(String::new())) }
    });
    for spawned in [false, true] {
        let store = InMemoryStore::new();
        let held = action(&http::Request::new("4471".to_string())).unwrap();
        // The action was recorded before under other arguments.
        store
            .begin(
                held.key().as_str(),
                "other arguments",
                "earlier",
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap();
        let guard =
            ReceiptGuardLayer::new(store, ToolClass::KeyedWrite, action).layer(provider.clone());
        let retry = RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default());
        let err = if spawned {
            let body = service_fn(move |req: http::Request<String>| {
                let task = tokio::spawn(guard.clone().oneshot(req));
                async move { task.await.expect("the tool body") }
            });
            retry
                .layer(body)
                .oneshot(http::Request::new("4471".into()))
                .await
        } else {
            retry
                .layer(guard)
                .oneshot(http::Request::new("4471".into()))
                .await
        }
        .unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::IdempotencyKeyReused,
            "spawned: {spawned}"
        );
        assert_eq!(err.attempts(), 0, "nothing was sent (spawned: {spawned})");
    }
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
}
