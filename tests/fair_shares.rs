//! Fair shares of the retry budget between agent runs: one bound on all loans together, loans
//! repaid as runs deposit, and one stack built once serving many runs through their scopes.
mod support;

use std::time::Duration;
use stormguard::budget::{Refusal, RetryBudget, RunLimits};
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::operation::{carry, AdoptLayer, AttachLayer};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::{call, no_floor, Dependency, Outcome};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// Retries `run` gets from the balance until it is refused.
fn drain(run: &RetryBudget) -> u32 {
    let mut n = 0;
    while run.try_withdraw(Duration::ZERO).is_ok() {
        n += 1;
    }
    n
}

/// Twenty runs in an outage borrow one run share between them, not twenty: the lending limit
/// bounds all loans together.
#[tokio::test(start_paused = true)]
async fn failing_runs_together_borrow_at_most_the_lending_limit() {
    let shared = no_floor();
    let healthy = shared.for_run(RunLimits::default());
    for _ in 0..500 {
        healthy.deposit(); // 100 retries, the cap, all the healthy run's
    }
    let down: Vec<RetryBudget> = (0..20)
        .map(|_| shared.for_run(RunLimits::default()))
        .collect();
    let lent: u32 = down.iter().map(drain).sum();
    assert_eq!(lent, 10, "the default lending limit is one run share");
    assert_eq!(shared.balance(), 90.0);
    // The healthy run spends the rest.
    assert_eq!(drain(&healthy), 90);
}

/// A quiet healthy run (its balance small) beside twenty runs in an outage, each a three-layer
/// stack on its own run handle: the failing runs cannot take the quiet run's retries.
#[tokio::test(start_paused = true)]
async fn a_quiet_run_keeps_its_retries_beside_twenty_failing_runs() {
    let shared = no_floor();
    let quiet = shared.for_run(RunLimits::default());
    let stack = |budget: &RetryBudget, dep: Dependency| {
        ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .service(dep)
    };
    let mut ok = stack(&quiet, Dependency::always(Outcome::Ok));
    for n in 0..100 {
        call(&mut ok, n).await.unwrap(); // 100 x 0.2 = 20 retries deposited
    }
    for _ in 0..20 {
        let run = shared.for_run(RunLimits::default());
        let mut down = stack(
            &run,
            Dependency::always(Outcome::Fail(FailureClass::Transient)),
        );
        for n in 0..10 {
            let _ = call(&mut down, n).await;
        }
    }
    assert_eq!(shared.balance(), 10.0, "20 deposited, 10 lent in all");
    // Each of the quiet run's next 10 operations fails once: all 10 are retried.
    let once = [Outcome::Fail(FailureClass::Transient), Outcome::Ok];
    let flaky = Dependency::script(once.into_iter().cycle().take(20), Outcome::Ok);
    let mut quietly = RetryLayer::new(ToolClass::Read, quiet.clone()).layer(flaky.clone());
    let mut succeeded = 0;
    for n in 0..10 {
        if call(&mut quietly, n).await.is_ok() {
            succeeded += 1;
        }
    }
    assert_eq!(succeeded, 10);
}

/// Run handles made and dropped in a loop (a handle per request, say) cannot borrow more than the
/// lending limit per floor window: a run that ends in debt leaves its debt counted until then.
#[tokio::test(start_paused = true)]
async fn runs_dropped_in_debt_cannot_borrow_past_the_limit() {
    let shared = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .max_balance(1000)
        .build()
        .unwrap();
    for _ in 0..5000 {
        shared.deposit(); // 1000 retries, deposited by no run
    }
    let mut lent = 0;
    for _ in 0..100 {
        lent += drain(&shared.for_run(RunLimits::default())); // dropped at once
    }
    assert_eq!(lent, 10);
    // Once the floor window turns, the ended runs' debts are forgiven.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(drain(&shared.for_run(RunLimits::default())), 10);
}

/// A run's debt is repaid as it deposits, and what it repays another run may borrow.
#[tokio::test(start_paused = true)]
async fn loans_are_repaid_as_the_borrower_deposits() {
    let shared = no_floor();
    for _ in 0..500 {
        shared.deposit(); // 100 retries, deposited by no run
    }
    let (a, b) = (
        shared.for_run(RunLimits::default()),
        shared.for_run(RunLimits::default()),
    );
    assert_eq!(drain(&a), 10);
    assert_eq!(shared.lent(), 10.0);
    assert_eq!(drain(&b), 0, "the limit is lent out");
    for _ in 0..25 {
        a.deposit(); // 25 x 0.2 = 5 retries repaid
    }
    assert_eq!(a.run_credit(), Some(-5.0));
    assert!((shared.lent() - 5.0).abs() < 1e-9);
    assert_eq!(drain(&b), 5);
    // A run back in credit draws its own money, then borrows what the limit has left.
    for _ in 0..30 {
        a.deposit();
    }
    assert_eq!(a.run_credit(), Some(1.0));
    assert!((shared.lent() - 5.0).abs() < 1e-9); // b's
    assert_eq!(drain(&a), 1 + 5);
    assert_eq!(a.try_withdraw(Duration::ZERO), Err(Refusal::RetryBudget));
}

/// `lending_limit(0)` lends nothing: each run spends only its own deposits (and the floor).
#[tokio::test(start_paused = true)]
async fn a_lending_limit_of_zero_lends_nothing() {
    let shared = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .lending_limit(0)
        .build()
        .unwrap();
    let (rich, poor) = (
        shared.for_run(RunLimits::default()),
        shared.for_run(RunLimits::default()),
    );
    for _ in 0..10 {
        rich.deposit();
    }
    assert_eq!(drain(&poor), 0);
    assert_eq!(drain(&rich), 2);
}

/// Threads that borrow, repay and drop runs at once never make the runs owe more than the limit,
/// and what is counted as lent is exactly what the runs owe.
#[test]
fn concurrent_runs_never_owe_more_than_the_limit() {
    let shared = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .max_balance(100_000)
        .lending_limit(7)
        .build()
        .unwrap();
    for _ in 0..500_000 {
        shared.deposit();
    }
    let runs: Vec<RetryBudget> = (0..4)
        .map(|_| shared.for_run(RunLimits::default()))
        .collect();
    std::thread::scope(|s| {
        for (t, run) in runs.iter().enumerate() {
            let shared = &shared;
            s.spawn(move || {
                for i in 0..20_000u32 {
                    let _ = run.try_withdraw(Duration::ZERO);
                    if i % 4 == t as u32 % 4 {
                        run.deposit();
                    }
                    assert!(shared.lent() <= 7.0 + 1e-9, "lent {}", shared.lent());
                }
            });
        }
    });
    let owed: f64 = runs
        .iter()
        .map(|r| (-r.run_credit().unwrap()).max(0.0))
        .sum();
    assert!(
        (shared.lent() - owed).abs() < 1e-9,
        "{} vs {owed}",
        shared.lent()
    );
    assert!(shared.balance() >= 0.0);
}

// ---------------------------------------------------------------------------------------------
// One stack built once, many runs: `RetryBudget::scope`.

/// Three nested layers on the shared budget.
fn nested_on(
    budget: &RetryBudget,
    dep: Dependency,
) -> impl Service<u32, Response = u32, Error = stormguard::error::ToolError> + Clone {
    ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep)
}

/// `f` as `run` if there is one, else as it is.
async fn as_run<F: std::future::Future>(run: Option<&RetryBudget>, f: F) -> F::Output {
    match run {
        Some(run) => run.scope(f).await,
        None => f.await,
    }
}

/// One stack per tool, built once on plain clones of the shared budget, serves every run; each
/// run's scope gives it its own account, so twenty runs in an outage cannot take a healthy run's
/// retries. Without scopes the same stacks are one run to the budget, and they can.
#[tokio::test(start_paused = true)]
async fn one_stack_built_once_gives_each_scoped_run_its_own_account() {
    for scoped in [true, false] {
        let shared = no_floor();
        let ok = nested_on(&shared, Dependency::always(Outcome::Ok));
        let down = nested_on(
            &shared,
            Dependency::always(Outcome::Fail(FailureClass::Transient)),
        );
        let healthy = shared.for_run(RunLimits::default());
        let healthy_scope = scoped.then_some(&healthy);
        as_run(healthy_scope, async {
            for n in 0..100 {
                ok.clone().oneshot(n).await.unwrap(); // 20 retries deposited
            }
        })
        .await;
        for _ in 0..20 {
            let run = shared.for_run(RunLimits::default());
            as_run(scoped.then_some(&run), async {
                for n in 0..10 {
                    let _ = down.clone().oneshot(n).await;
                }
            })
            .await;
        }
        let once = [Outcome::Fail(FailureClass::Transient), Outcome::Ok];
        let flaky = nested_on(
            &shared,
            Dependency::script(once.into_iter().cycle().take(20), Outcome::Ok),
        );
        let succeeded = as_run(healthy_scope, async {
            let mut succeeded = 0;
            for n in 0..10 {
                if flaky.clone().oneshot(n).await.is_ok() {
                    succeeded += 1;
                }
            }
            succeeded
        })
        .await;
        if scoped {
            assert_eq!(succeeded, 10, "the healthy run keeps its retries");
            // 20 + 10 x 0.2 deposited, 10 spent
            assert!((healthy.run_credit().unwrap() - 12.0).abs() < 1e-9);
            assert_eq!(shared.lent(), 10.0);
        } else {
            // Plain clones: one run, drained by the outage; the script's failures are not
            // retried, so only every other operation (the ones that needed no retry) succeeds.
            assert_eq!(succeeded, 5);
            assert_eq!(healthy.run_credit(), Some(0.0)); // nothing reached the run
        }
    }
}

/// Nested layers on the shared budget, in a run's scope, credit the balance and the run once per
/// operation; the run's limits apply to every tool the run calls.
#[tokio::test(start_paused = true)]
async fn a_scoped_run_is_credited_once_and_limited_across_tools() {
    let shared = no_floor();
    let run = shared.for_run(RunLimits::builder().max_retries(3).build().unwrap());
    let ok = nested_on(&shared, Dependency::always(Outcome::Ok));
    run.scope(async {
        for n in 0..50 {
            ok.clone().oneshot(n).await.unwrap();
        }
    })
    .await;
    assert!(
        (shared.balance() - 10.0).abs() < 1e-9,
        "{}",
        shared.balance()
    );
    assert_eq!(run.run_credit(), Some(10.0));
    let search = nested_on(
        &shared,
        Dependency::always(Outcome::Fail(FailureClass::Transient)),
    );
    let fetch = nested_on(
        &shared,
        Dependency::always(Outcome::Fail(FailureClass::Transient)),
    );
    let (first, second) = run
        .scope(async {
            let first = search.oneshot(1).await.unwrap_err();
            let second = fetch.oneshot(1).await.unwrap_err();
            (first, second)
        })
        .await;
    assert_eq!(first.code(), ErrorCode::Unavailable); // 2 retries of the run's 3
    assert_eq!(second.code(), ErrorCode::RunBudgetExhausted);
    assert_eq!(run.run_retries(), Some(3));
    // Outside the scope the shared handle is no run at all.
    assert_eq!(shared.run_retries(), None);
}

/// A handle with a run of its own keeps it inside another run's scope, a handle of another
/// budget ignores the scope, and a scope inside a scope wins while it runs.
#[tokio::test(start_paused = true)]
async fn a_scope_changes_only_plain_handles_of_its_own_budget() {
    let (shared, other) = (no_floor(), no_floor());
    let (a, b) = (
        shared.for_run(RunLimits::default()),
        shared.for_run(RunLimits::default()),
    );
    a.scope(async {
        shared.deposit(); // a's
        b.deposit(); // b's own
        other.deposit(); // another budget: no run
        b.scope(async { shared.deposit() }).await; // b's
        shared.deposit(); // a's again
    })
    .await;
    assert_eq!(a.run_credit(), Some(0.4));
    assert_eq!(b.run_credit(), Some(0.4));
    assert!((other.balance() - 0.2).abs() < 1e-9);
    shared.deposit(); // outside: nobody's
    assert_eq!(a.run_credit(), Some(0.4));
    assert!((shared.balance() - 1.0).abs() < 1e-9);
}

/// A task spawned inside a scope is not in it, unless it is wrapped in the scope again or carried
/// from inside a stormguard layer with `operation::carry`.
#[tokio::test(start_paused = true)]
async fn a_spawned_task_keeps_the_run_only_when_carried() {
    let shared = no_floor();
    let run = shared.for_run(RunLimits::default());
    run.scope(async {
        let plain = shared.clone();
        tokio::spawn(async move { plain.deposit() }).await.unwrap(); // lost
        let plain = shared.clone();
        tokio::spawn(run.scope(async move { plain.deposit() }))
            .await
            .unwrap(); // wrapped
    })
    .await;
    assert_eq!(run.run_credit(), Some(0.2));
    // Inside a stormguard layer, `carry` takes the operation and the run to the spawned task.
    let plain = shared.clone();
    let tool = tower::service_fn(move |_: u32| {
        let plain = plain.clone();
        async move {
            tokio::spawn(carry(async move { plain.deposit() }))
                .await
                .unwrap();
            Ok::<_, std::io::Error>(1u32)
        }
    });
    let svc = RetryLayer::new(ToolClass::Read, shared.clone())
        .own_operation()
        .layer(tool);
    run.scope(svc.oneshot(1)).await.unwrap();
    // The carried deposit and the layer's own, both the run's.
    assert!((run.run_credit().unwrap() - 0.6).abs() < 1e-9);
}

/// Across a `Buffer` (with `AttachLayer` above and `AdoptLayer` below), the layers under it act
/// for the run as the ones above do: the balance and the run are credited once per operation,
/// and a retry below the buffer is the run's.
#[tokio::test(start_paused = true)]
async fn a_scoped_run_crosses_a_buffer_with_its_operation() {
    // In the request's operation (an `http::Request` carries it), and with the helper layers.
    for helpers in [false, true] {
        let shared = no_floor();
        let run = shared.for_run(RunLimits::default());
        // Ten answers, then a refused connection, then answers again.
        let script = (0..10)
            .map(|_| Outcome::Ok)
            .chain([Outcome::Fail(FailureClass::Transient)]);
        let client = Dependency::script(script, Outcome::Ok);
        let below = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, shared.clone()).replay(HttpReplay))
            .service(client.clone());
        let svc = if helpers {
            ServiceBuilder::new()
                .layer(RetryLayer::new(ToolClass::Read, shared.clone()).replay(HttpReplay))
                .layer(AttachLayer::new())
                .buffer(8)
                .layer(AdoptLayer::new())
                .service(below)
                .boxed_clone()
        } else {
            ServiceBuilder::new()
                .layer(RetryLayer::new(ToolClass::Read, shared.clone()))
                .buffer(8)
                .service(below)
                .boxed_clone()
        };
        run.scope(async {
            for _ in 0..10 {
                svc.clone()
                    .oneshot(http::Request::new(String::new()))
                    .await
                    .unwrap();
            }
        })
        .await;
        let balance = shared.balance();
        assert!((balance - 2.0).abs() < 1e-9, "helpers {helpers}: {balance}");
        assert!((run.run_credit().unwrap() - 2.0).abs() < 1e-9);
        // The layer under the buffer retries the refused call on the run's credit.
        run.scope(svc.clone().oneshot(http::Request::new(String::new())))
            .await
            .unwrap();
        assert_eq!(client.calls(), 12);
        assert!((run.run_credit().unwrap() - 1.2).abs() < 1e-9);
    }
}
