//! The shared budget: deposits once per operation, run caps across tools, floor, interop, config.
mod support;

use std::time::Duration;
use stormguard::budget::{Refusal, RetryBudget, RunLimits};
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use support::{call, no_floor, Dependency, Outcome};
use tower::ServiceBuilder;

#[tokio::test(start_paused = true)]
async fn nested_layers_deposit_once_per_logical_operation() {
    let budget = no_floor();
    let dep = Dependency::always(Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    for i in 0..10u32 {
        call(&mut stack, i).await.unwrap();
    }
    // 10 successes x 0.2, not 3 x that (tower's nested TpsBudget deposits at every layer).
    assert!(
        (budget.balance() - 2.0).abs() < 1e-9,
        "balance {}",
        budget.balance()
    );
}

#[tokio::test(start_paused = true)]
async fn an_empty_balance_refuses_with_a_non_retryable_error() {
    let budget = no_floor();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    let err = call(&mut svc, 1u32).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted);
    assert!(!err.retryable());
    assert_eq!(err.to_json()["retryable"], false);
}

#[tokio::test(start_paused = true)]
async fn successes_pay_for_retries() {
    let budget = no_floor();
    budget.deposit();
    budget.deposit();
    budget.deposit();
    budget.deposit();
    budget.deposit(); // 5 x 0.2 = one retry
    assert!(budget.try_withdraw(Duration::ZERO).is_ok());
    assert_eq!(
        budget.try_withdraw(Duration::ZERO),
        Err(Refusal::RetryBudget)
    );
}

#[tokio::test(start_paused = true)]
async fn the_floor_refills_per_window() {
    let budget = RetryBudget::builder()
        .floor(2, Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(budget.try_withdraw(Duration::ZERO).is_ok());
    assert!(budget.try_withdraw(Duration::ZERO).is_ok());
    assert!(budget.try_withdraw(Duration::ZERO).is_err());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(budget.try_withdraw(Duration::ZERO).is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_balance_is_capped() {
    let budget = RetryBudget::builder()
        .max_balance(2)
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..100 {
        budget.deposit();
    }
    assert_eq!(budget.balance(), 2.0);
}

#[tokio::test(start_paused = true)]
async fn a_run_budget_stops_retries_across_tools() {
    let shared = RetryBudget::default();
    let run = shared.for_run(RunLimits::builder().max_retries(3).build().unwrap());
    let search_dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let fetch_dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut search = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, run.clone()).name("search"))
        .service(search_dep.clone());
    let mut fetch = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, run.clone()).name("fetch"))
        .service(fetch_dep.clone());

    let first = call(&mut search, 1u32).await.unwrap_err();
    assert_eq!(first.code(), ErrorCode::Unavailable); // 2 retries spent
    let second = call(&mut fetch, 1u32).await.unwrap_err();
    assert_eq!(second.code(), ErrorCode::RunBudgetExhausted); // 1 more, then the run is out
    assert_eq!(search_dep.calls() + fetch_dep.calls(), 3 + 2);
    assert_eq!(run.run_retries(), Some(3));
    // Another run sharing the ratio budget is not affected.
    let other = shared.for_run(RunLimits::builder().max_retries(3).build().unwrap());
    assert!(other.try_withdraw(Duration::ZERO).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_run_budget_caps_retry_time() {
    let run = RetryBudget::default().for_run(
        RunLimits::builder()
            .max_retry_time(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    assert!(run.try_withdraw(Duration::from_millis(600)).is_ok());
    assert_eq!(
        run.try_withdraw(Duration::from_millis(600)),
        Err(Refusal::RunBudget)
    );
    assert!(run.try_withdraw(Duration::from_millis(400)).is_ok());
    assert_eq!(run.run_retry_time(), Some(Duration::from_secs(1)));
}

#[test]
fn implements_towers_budget_trait() {
    use tower::retry::budget::Budget;
    fn takes_budget(b: &impl Budget) -> bool {
        b.deposit();
        b.withdraw()
    }
    let budget = RetryBudget::builder()
        .retry_ratio(1.0)
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    assert!(takes_budget(&budget));
    assert!(!Budget::withdraw(&budget));
}

#[test]
fn invalid_budgets_are_rejected_with_the_field_named() {
    let cases = [
        (
            RetryBudget::builder().retry_ratio(-0.1).build(),
            "retry_ratio",
        ),
        (
            RetryBudget::builder().retry_ratio(f64::NAN).build(),
            "retry_ratio",
        ),
        (RetryBudget::builder().max_balance(0).build(), "max_balance"),
        (
            RetryBudget::builder()
                .floor(1, Duration::from_millis(10))
                .build(),
            "floor_window",
        ),
    ];
    for (result, field) in cases {
        assert_eq!(result.unwrap_err().field(), field);
    }
    assert_eq!(
        RunLimits::builder()
            .max_retry_time(Duration::ZERO)
            .build()
            .unwrap_err()
            .field(),
        "max_retry_time"
    );
}
