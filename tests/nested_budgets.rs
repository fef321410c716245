//! Nested layers on different budgets: the layer that owns the operation decides its retries.
//! A joined layer whose own account is spent hands the failure up; the owner's account decides.
mod support;

use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use support::{call, spent, Dependency, Outcome, ToolCall};
use tower::ServiceBuilder;

const FAIL: Outcome = Outcome::Fail(FailureClass::Transient);

fn request(arg: u32) -> ToolCall {
    ToolCall {
        tool: "search",
        arg,
    }
}

fn attempts(n: u32) -> ClassPolicy {
    ClassPolicy::builder(ToolClass::Read)
        .max_attempts(n)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_on_a_nested_layer_hands_the_retry_to_the_owners_budget() {
    let dep = Dependency::script([FAIL, FAIL], Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .layer(RetryLayer::new(ToolClass::Read, spent()).nested())
        .service(dep.clone());
    let answer = call(&mut stack, request(1)).await;
    assert!(answer.is_ok(), "the owner's budget pays: {answer:?}");
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_layer_joined_without_nested_hands_up_its_spent_budget_too() {
    let dep = Dependency::script([FAIL], Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .layer(RetryLayer::new(ToolClass::Read, spent()))
        .service(dep.clone());
    assert!(call(&mut stack, request(2)).await.is_ok());
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_owners_spent_budget_ends_the_operation_whatever_the_nested_layers_hold() {
    // Three layers: the owner's account is spent, the two below share a full one. The nested
    // layers' own retries run on their account (up to the operation's cap); once the failure
    // reaches the owner, its refusal ends the operation.
    let dep = Dependency::always(FAIL);
    let full = RetryBudget::default();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(attempts(5), spent()))
        .layer(RetryLayer::new(attempts(2), full.clone()))
        .service(dep.clone());
    let err = call(&mut stack, request(3)).await.unwrap_err();
    assert_eq!(
        dep.calls(),
        2,
        "the nested layer's two attempts, then the owner refuses"
    );
    assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted);
    assert!(!err.retryable());
}

#[tokio::test(start_paused = true)]
async fn layers_on_one_spent_budget_end_the_operation_at_the_first_refusal() {
    let dep = Dependency::always(FAIL);
    let budget = spent();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .service(dep.clone());
    let err = call(&mut stack, request(4)).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted);
    assert_eq!(err.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_spent_nested_budget_never_lifts_the_operations_cap() {
    // Inner account spent, owner's full: every retry is the owner's, and the cap (3) holds.
    let dep = Dependency::always(FAIL);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .layer(RetryLayer::new(ToolClass::Read, spent()).nested())
        .layer(RetryLayer::new(ToolClass::Read, spent()))
        .service(dep.clone());
    let err = call(&mut stack, request(5)).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.code(), ErrorCode::Unavailable);
    assert!(!err.retryable());
}

#[tokio::test(start_paused = true)]
async fn behind_a_buffer_the_carried_operation_still_knows_its_owner() {
    // The client layer runs on the buffer's worker task: it joins the operation the request
    // carries, and its spent account hands the retry up to the owner across the boundary.
    let dep = Dependency::script([FAIL, FAIL], Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .buffer(8)
        .layer(RetryLayer::new(ToolClass::Read, spent()).nested())
        .service(dep.clone());
    let request = http::Request::post("/tools/search")
        .body(String::new())
        .unwrap();
    let answer = call(&mut stack, request).await;
    assert!(answer.is_ok(), "the owner's budget pays: {answer:?}");
    assert_eq!(dep.calls(), 3);
}
