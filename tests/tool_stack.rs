//! The stack a tool declaration builds: the same behaviour as the stack built by hand, the key
//! from each call, retry owners, shared parts by name, and the declarations a stack refuses.
mod support;

use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use stormguard::breaker::State;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::{FailureClass, OkIsSuccess};
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::{Action, SetIdempotencyKeyLayer};
use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
use stormguard::retry::RetryLayer;
use stormguard::tool::{
    BreakerSpec, Call, KeyPart, QuotaSpec, RetryOwner, StoreSpec, Stores, Tool, Toolbox,
};
use support::{call, classifier, Dependency, Outcome};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

fn memory_store() -> StoreSpec {
    StoreSpec {
        kind: "memory".into(),
        retention_secs: 7 * 86_400,
    }
}

/// A body that counts its calls and answers with the key it was given.
fn counting_body(
    sent: Arc<AtomicU32>,
) -> impl Service<Call, Response = Value, Error = std::io::Error, Future: Send> + Clone + Send + Sync
{
    service_fn(move |call: Call| {
        sent.fetch_add(1, Ordering::SeqCst);
        let key = call.key().map(|k| k.to_string());
        async move { Ok::<_, std::io::Error>(json!({ "key": key })) }
    })
}

/// The stack of the tool `name` of `tools` over `dep`, read by the shared test classifier.
fn stack_of(
    tools: &stormguard::tool::Tools,
    name: &str,
    dep: &Dependency,
) -> stormguard::tool::ToolService<u32> {
    tools
        .layer(name)
        .unwrap()
        .classifier(classifier as fn(&_) -> _)
        .layer(dep.clone())
}

/// The stack of the lone tool `tool` over `dep`, read by the shared test classifier.
fn lone(tool: Tool, dep: &Dependency) -> stormguard::tool::ToolService<u32> {
    let name = tool.name.clone();
    let tools = Toolbox::new(vec![tool])
        .unwrap()
        .build(Stores::new())
        .unwrap();
    stack_of(&tools, &name, dep)
}

/// The `send_invoice` tool keyed on `key`, with memory receipts, built.
fn invoice_tools(key: Vec<KeyPart>) -> stormguard::tool::Tools {
    Toolbox::new(vec![])
        .unwrap()
        .with_store("receipts", memory_store())
        .unwrap()
        .with_tool(send_invoice(key))
        .unwrap()
        .build(Stores::new())
        .unwrap()
}

fn send_invoice(key: Vec<KeyPart>) -> Tool {
    Tool::new("send_invoice", ToolClass::KeyedWrite, RetryOwner::Layer)
        .key(key)
        .receipt("receipts", Some(86_400))
}

#[tokio::test(start_paused = true)]
async fn a_reissue_at_a_later_step_is_one_effect_when_the_key_leaves_the_step_out() {
    for (parts, effects) in [
        (
            vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")],
            1,
        ),
        (
            vec![
                KeyPart::Run,
                KeyPart::Step,
                KeyPart::Tool,
                KeyPart::id("invoice_id"),
            ],
            2,
        ),
    ] {
        let tools = invoice_tools(parts.clone());
        let sent = Arc::new(AtomicU32::new(0));
        let mut svc = tools
            .layer("send_invoice")
            .unwrap()
            .classifier(OkIsSuccess)
            .layer(counting_body(sent.clone()));
        // One stack, built once: the run and the step come with each call.
        for step in ["step-2", "step-5"] {
            let args = json!({ "invoice_id": 4471, "note": format!("sent at {step}") });
            call(&mut svc, Call::new("run-81f2", step, args))
                .await
                .unwrap();
        }
        assert_eq!(sent.load(Ordering::SeqCst), effects, "key parts {parts:?}");
        // Another run is another action.
        call(
            &mut svc,
            Call::new("run-99", "step-2", json!({ "invoice_id": 4471 })),
        )
        .await
        .unwrap();
        assert_eq!(sent.load(Ordering::SeqCst), effects + 1);
    }
}

#[tokio::test(start_paused = true)]
async fn the_stamped_key_is_the_same_on_every_retry_and_leaves_out_free_text() {
    let tools = invoice_tools(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")]);
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = keys.clone();
    // A connection reset after the request left (ambiguous), then an answer.
    let dep = Dependency::script([Outcome::Fail(FailureClass::Ambiguous)], Outcome::Ok);
    let body = service_fn(move |c: Call| {
        seen.lock().unwrap().push(c.key().unwrap().to_string());
        let mut dep = dep.clone();
        async move { dep.call(()).await.map(|n| json!(n)) }
    });
    let mut svc = tools
        .layer("send_invoice")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(body);
    let a = json!({ "invoice_id": 4471, "body": "Dear customer" });
    call(&mut svc, Call::new("run-1", "step-2", a))
        .await
        .unwrap();
    let keys = keys.lock().unwrap().clone();
    assert_eq!(
        keys.len(),
        2,
        "the ambiguous failure of a keyed write is retried"
    );
    assert_eq!(keys[0], keys[1], "with the same key");
    let by_hand = Action::task(
        "run-1",
        "-",
        "send_invoice",
        &json!({"invoice_id": 4471}),
        &["invoice_id"],
        &["invoice_id"],
    )
    .unwrap();
    assert_eq!(keys[0], by_hand.key().as_str());
}

#[tokio::test(start_paused = true)]
async fn the_retry_owner_decides_who_retries() {
    for (owner, calls, retryable) in [
        (RetryOwner::Layer, 3, false),
        (RetryOwner::Model, 1, true),
        (RetryOwner::Client, 1, true),
        (RetryOwner::None, 1, true),
    ] {
        let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
        let mut svc = lone(Tool::new("search", ToolClass::Read, owner), &dep);
        let err = call(&mut svc, Call::new("r", "s", json!({ "q": "storm" })))
            .await
            .unwrap_err();
        assert_eq!(dep.calls(), calls, "owner {owner:?}");
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert_eq!(
            err.retryable(),
            retryable,
            "owner {owner:?}: who may try again"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_write_owned_by_the_model_still_escalates_an_ambiguous_failure() {
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let post_ticket = Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Model);
    let mut svc = lone(post_ticket, &dep);
    let err = call(&mut svc, Call::new("r", "s", json!({})))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert!(!err.retryable(), "the model must not reissue it");
}

#[tokio::test(start_paused = true)]
async fn tools_that_name_one_breaker_share_it() {
    let toolbox = Toolbox::new(vec![])
        .unwrap()
        .with_breaker(
            "billing-api",
            BreakerSpec {
                failure_ratio: 0.5,
                open_secs: 30,
            },
        )
        .unwrap()
        .with_tool(Tool::new("lookup", ToolClass::Read, RetryOwner::Layer).breaker("billing-api"))
        .unwrap()
        .with_tool(Tool::new("list", ToolClass::Read, RetryOwner::Layer).breaker("billing-api"))
        .unwrap();
    let tools = toolbox.build(Stores::new()).unwrap();
    let down = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut lookup = stack_of(&tools, "lookup", &down);
    for i in 0..20 {
        let _ = call(&mut lookup, Call::new("r", format!("s{i}"), json!({}))).await;
    }
    assert_eq!(tools.breaker("billing-api").unwrap().state(), State::Open);
    let healthy = Dependency::always(Outcome::Ok);
    let mut list = stack_of(&tools, "list", &healthy);
    let err = call(&mut list, Call::new("r", "s", json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        healthy.calls(),
        0,
        "the other tool's open breaker turned it away"
    );
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
}

#[tokio::test(start_paused = true)]
async fn a_quota_counted_per_tenant_needs_the_tenant_in_the_call() {
    let toolbox = Toolbox::new(vec![])
        .unwrap()
        .with_quota(
            "openai",
            QuotaSpec {
                per_sec: 1,
                burst: 1,
            },
        )
        .unwrap()
        .with_tool(
            Tool::new("complete", ToolClass::Read, RetryOwner::Layer).quota("openai", "tenant", 1),
        )
        .unwrap();
    let tools = toolbox.build(Stores::new()).unwrap();
    let dep = Dependency::always(Outcome::Ok);
    let mut svc = stack_of(&tools, "complete", &dep);
    let err = call(&mut svc, Call::new("r", "s", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.hint().contains("tenant"));
    assert_eq!(dep.calls(), 0);

    // With it: each tenant has its own count (a burst of 1 each), so two tenants go at once and
    // a tenant's second call waits a second.
    let start = tokio::time::Instant::now();
    for tenant in ["acme", "globex"] {
        call(
            &mut svc,
            Call::new("r", "s", json!({})).with("tenant", tenant),
        )
        .await
        .unwrap();
    }
    assert_eq!(start.elapsed(), std::time::Duration::ZERO);
    call(
        &mut svc,
        Call::new("r", "s", json!({})).with("tenant", "acme"),
    )
    .await
    .unwrap();
    assert!(start.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(dep.calls(), 3);
}

#[test]
fn a_stack_refuses_what_it_cannot_build() {
    let base = || {
        Toolbox::new(vec![])
            .unwrap()
            .with_store("receipts", memory_store())
            .unwrap()
    };
    let field_of = |tool: Tool| {
        base()
            .with_tool(tool)
            .unwrap()
            .build(Stores::new())
            .unwrap()
            .layer("t")
            .unwrap_err()
            .field()
            .to_owned()
    };
    let t = |class| Tool::new("t", class, RetryOwner::Layer);
    assert_eq!(
        field_of(t(ToolClass::Read).also_retried_by(RetryOwner::Client)),
        "retry"
    );
    assert_eq!(
        field_of(t(ToolClass::KeyedWrite).receipt("receipts", None)),
        "key"
    );
    assert_eq!(
        field_of(
            t(ToolClass::KeyedWrite)
                .key(vec![KeyPart::Run])
                .unknown_outcome(stormguard::tool::UnknownOutcome::ReadBack {
                    attempts: 2,
                    within_secs: 10
                })
        ),
        "unknown_outcome"
    );

    // Stores: one declared but not given, one of another kind, one given but not declared.
    let pg = StoreSpec {
        kind: "postgres".into(),
        retention_secs: 86_400,
    };
    let tb = Toolbox::new(vec![]).unwrap().with_store("pg", pg).unwrap();
    assert!(tb
        .build(Stores::new())
        .unwrap_err()
        .reason()
        .contains("give it"));
    let wrong = Stores::new().with("pg", InMemoryStore::new());
    assert!(tb
        .build(wrong)
        .unwrap_err()
        .reason()
        .contains("declared postgres"));
    let extra = Stores::new().with("nope", InMemoryStore::new());
    assert!(base()
        .build(extra)
        .unwrap_err()
        .reason()
        .contains("declares no such store"));
    // A retention the receipt layer refuses (under an hour) is refused at build.
    let short = StoreSpec {
        kind: "memory".into(),
        retention_secs: 60,
    };
    let tb = Toolbox::new(vec![])
        .unwrap()
        .with_store("s", short)
        .unwrap()
        .with_tool(send_invoice(vec![KeyPart::Run]).receipt("s", None))
        .unwrap();
    let err = tb.build(Stores::new()).unwrap_err();
    assert_eq!(err.field(), "stores");
    assert!(err.reason().contains("`s`"), "{err}");
    // A call that costs more than its quota ever holds could never be sent.
    let err = Toolbox::new(vec![])
        .unwrap()
        .with_quota(
            "q",
            QuotaSpec {
                per_sec: 1,
                burst: 1,
            },
        )
        .unwrap()
        .with_tool(Tool::new("t", ToolClass::Read, RetryOwner::Layer).quota("q", "global", 2))
        .unwrap_err();
    assert_eq!(err.field(), "quota.cost");
}

#[tokio::test(start_paused = true)]
async fn a_body_that_spawns_its_inner_call_keeps_the_operation() {
    // An unkeyed write whose body spawns its HTTP-client call over a plain value (which cannot
    // carry the operation), the client's layer configured for reads and declared nested: with
    // `call.scope`, the client's layer joins the tool's operation and sends the write once.
    let tools = Toolbox::new(vec![Tool::new(
        "post_ticket",
        ToolClass::UnkeyedWrite,
        RetryOwner::Layer,
    )])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    // Boxed (see docs/decisions.md: spawning over BoxError services).
    let client = tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                RetryLayer::new(
                    ToolClass::Read,
                    tools.budget_of("post_ticket").unwrap().clone(),
                )
                .classifier(classifier as fn(&_) -> _)
                .nested(),
            )
            .service(dep.clone()),
    );
    let body = service_fn(move |c: Call| {
        let client = client.clone();
        async move {
            let inner = c.scope(async move { client.oneshot(7u32).await });
            tokio::spawn(inner)
                .await
                .map_err(BoxError::from)?
                .map_err(BoxError::from)
        }
    });
    let mut svc = tools
        .layer("post_ticket")
        .unwrap()
        .classifier(classifier as fn(&_) -> _)
        .layer(body);
    let err = call(&mut svc, Call::new("r", "s", json!({})))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1, "the write was sent more than once");
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
}

/// What a call through a stack came to: calls made, and the result as the caller sees it.
#[derive(Debug, PartialEq)]
enum Ended {
    Answer(u32),
    Error {
        code: ErrorCode,
        retryable: bool,
        attempts: u32,
    },
}

fn ended(result: Result<u32, ToolError>) -> Ended {
    match result {
        Ok(n) => Ended::Answer(n),
        Err(e) => Ended::Error {
            code: e.code(),
            retryable: e.retryable(),
            attempts: e.attempts(),
        },
    }
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Ok),
        Just(Outcome::Fail(FailureClass::Transient)),
        Just(Outcome::Fail(FailureClass::Ambiguous)),
        Just(Outcome::Fail(FailureClass::Permanent)),
        Just(Outcome::Fail(FailureClass::ModelRecoverable)),
    ]
}

fn class() -> impl Strategy<Value = ToolClass> {
    prop_oneof![
        Just(ToolClass::Read),
        Just(ToolClass::IdempotentWrite),
        Just(ToolClass::KeyedWrite),
        Just(ToolClass::UnkeyedWrite),
        Just(ToolClass::MultiStep),
    ]
}

/// The same tool through the built stack and through the stack built by hand as the docs show.
async fn both_ways(
    class: ToolClass,
    owner: RetryOwner,
    keyed: bool,
    receipts: bool,
    deadline: Option<u64>,
    script: Vec<Outcome>,
    then: Outcome,
) -> ((u32, Ended), (u32, Ended)) {
    let key = vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("order")];
    let mut tool = Tool::new("t", class, owner);
    if keyed {
        tool = tool.key(key);
        if receipts {
            tool = tool.receipt("receipts", Some(86_400));
        }
    }
    if let Some(secs) = deadline {
        tool = tool.deadline_secs(secs);
    }
    let tools = Toolbox::new(vec![])
        .unwrap()
        .with_store("receipts", memory_store())
        .unwrap()
        .with_tool(tool)
        .unwrap()
        .build(Stores::new())
        .unwrap();
    let args = json!({ "order": 7, "note": "free text" });
    let cf = classifier as fn(&Result<u32, BoxError>) -> _;

    let built_dep = Dependency::script(script.clone(), then);
    // The body reads the key it is given, as one that sends it to the provider does (a keyed
    // write whose body never reads `call.key()` is decided as unkeyed: tests/mistakes_stacked.rs).
    let sends_key = tower::util::MapRequestLayer::new(|c: Call| {
        let _ = c.key();
        c
    });
    let mut built = tools
        .layer("t")
        .unwrap()
        .classifier(cf)
        .layer(sends_key.layer(built_dep.clone()));
    let built_end = ended(call(&mut built, Call::new("run-1", "step-1", args.clone())).await);

    // By hand: the README's order, the same class, classifier and key.
    let hand_dep = Dependency::script(script, then);
    let mut policy = ClassPolicy::builder(class);
    if let Some(secs) = deadline {
        policy = policy.deadline(std::time::Duration::from_secs(secs));
    }
    let mut retry = RetryLayer::new(
        policy.build().unwrap(),
        stormguard::budget::RetryBudget::default(),
    )
    .name("t")
    .classifier(cf);
    if owner != RetryOwner::Layer {
        retry = retry.nested(); // one attempt, failures handed up
    }
    let action = |c: &Call| Action::task("run-1", "-", "t", c.args(), &["order"], &["order"]);
    let inner: tower::util::BoxCloneService<Call, u32, BoxError> = if keyed && receipts {
        let guard = ReceiptGuardLayer::new(InMemoryStore::new(), class, action)
            .config(
                stormguard::receipt::ReceiptConfig::builder()
                    .retention(std::time::Duration::from_secs(7 * 86_400))
                    .key_window(std::time::Duration::from_secs(86_400))
                    .build()
                    .unwrap(),
            )
            .classifier(cf);
        tower::util::BoxCloneService::new(guard.layer(hand_dep.clone()))
    } else if keyed {
        tower::util::BoxCloneService::new(
            SetIdempotencyKeyLayer::new(action).layer(hand_dep.clone()),
        )
    } else {
        tower::util::BoxCloneService::new(hand_dep.clone())
    };
    let mut hand = retry.layer(inner);
    let hand_end = ended(call(&mut hand, Call::new("run-1", "step-1", args)).await);
    ((built_dep.calls(), built_end), (hand_dep.calls(), hand_end))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// For every declaration a stack is built from, the built stack does what the stack built by
    /// hand does: the same calls and the same ending, on a scripted failing dependency.
    #[test]
    fn a_built_stack_behaves_as_the_hand_built_one(
        class in class(),
        owner in prop_oneof![Just(RetryOwner::Layer), Just(RetryOwner::Model)],
        keyed in any::<bool>(),
        receipts in any::<bool>(),
        deadline in prop_oneof![Just(None), (1u64..5).prop_map(Some)],
        script in prop::collection::vec(outcome(), 0..4),
        then in outcome(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (built, hand) =
            rt.block_on(both_ways(class, owner, keyed, receipts, deadline, script, then));
        prop_assert_eq!(built, hand);
    }
}

#[tokio::test(start_paused = true)]
async fn one_session_for_many_tools_applies_each_tools_class_per_call() {
    let tools = Toolbox::new(vec![
        Tool::new("search", ToolClass::Read, RetryOwner::Layer),
        Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Layer),
    ])
    .unwrap()
    .build(Stores::new())
    .unwrap();
    // One client for both tools, down in a way that may have done the work (a reset).
    let dep = Dependency::always(Outcome::Fail(FailureClass::Ambiguous));
    let mut session = tools
        .router(dep.clone(), classifier as fn(&_) -> _)
        .unwrap();
    let err = call(&mut session, Call::new("r", "s", json!({})).to("search"))
        .await
        .unwrap_err();
    assert_eq!(
        (dep.calls(), err.code()),
        (3, ErrorCode::Unavailable),
        "a read retries"
    );
    let err = call(
        &mut session,
        Call::new("r", "s", json!({})).to("post_ticket"),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (dep.calls(), err.code()),
        (4, ErrorCode::OutcomeUnknown),
        "an unkeyed write is sent once"
    );
    for to in [None, Some("nope")] {
        let mut c = Call::new("r", "s", json!({}));
        if let Some(to) = to {
            c = c.to(to);
        }
        let err = call(&mut session, c).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }
    // A call addressed to one tool never goes through another tool's stack.
    let mut search = stack_of(&tools, "search", &dep);
    let err = call(
        &mut search,
        Call::new("r", "s", json!({})).to("post_ticket"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(dep.calls(), 4, "nothing more was sent");
}

#[tokio::test(start_paused = true)]
async fn a_null_identifier_is_refused_not_keyed() {
    let tools = invoice_tools(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")]);
    let sent = Arc::new(AtomicU32::new(0));
    let mut svc = tools
        .layer("send_invoice")
        .unwrap()
        .classifier(OkIsSuccess)
        .layer(counting_body(sent.clone()));
    for invoice in [1, 2] {
        let args = json!({ "invoice_id": null, "invoice": invoice });
        let err = call(&mut svc, Call::new("run-1", "step-2", args))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_tool_the_model_retries_hands_up_a_failure_its_deadline_would_end() {
    // The server asks for 5 s, the tool's deadline is 1 s: for a tool whose retries are the
    // model's, that is the model's to weigh, and the failure stays retryable.
    for (owner, retryable) in [(RetryOwner::Model, true), (RetryOwner::Layer, false)] {
        let tools = Toolbox::new(vec![
            Tool::new("search", ToolClass::Read, owner).deadline_secs(1)
        ])
        .unwrap()
        .build(Stores::new())
        .unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let busy = service_fn(move |_: Call| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let busy = http::Response::builder()
                    .status(503)
                    .header("retry-after", "5")
                    .body(String::new());
                Ok::<_, BoxError>(busy?)
            }
        });
        let mut svc = tools.layer("search").unwrap().layer(busy);
        let err = call(&mut svc, Call::new("r", "s", json!({})))
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{owner:?}");
        assert_eq!(err.retryable(), retryable, "{owner:?}: {}", err.to_json());
    }
}
