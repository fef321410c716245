//! A `Retry` across an operation: nested layers' deadlines and attempt caps, a readiness wait
//! under a deadline, budgets credited once per operation, runs sharing a budget, a layer with its
//! own operation, a cancelled or carried operation, a service changed through `get_mut`.
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::{RetryBudget, RunLimits};
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::quota::{QuotaLayer, Rate};
use stormguard::retry::RetryLayer;
use support::{call, no_floor, Dependency, Outcome};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceBuilder};

fn constant(class: ToolClass, ms: u64) -> stormguard::class::ClassPolicyBuilder {
    let backoff = Backoff::constant(Duration::from_millis(ms))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    ClassPolicy::builder(class).backoff(backoff)
}

/// A nested layer's own deadline holds: the earliest deadline of the operation wins.
#[tokio::test(start_paused = true)]
async fn a_nested_layers_deadline_holds() {
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let inner = constant(ToolClass::Read, 2_000)
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
        .layer(RetryLayer::new(inner, budget).name("client"))
        .service(dep.clone());
    let start = Instant::now();
    let err = call(&mut stack, 1u32).await.unwrap_err();
    assert_eq!(
        dep.calls(),
        1,
        "a 2 s backoff cannot fit in the client's 1 s deadline"
    );
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert_eq!(start.elapsed(), Duration::ZERO);

    // An outer deadline binds the inner layer that does the retrying.
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let outer = constant(ToolClass::Read, 10)
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let budget = RetryBudget::default();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(outer, budget.clone()))
        .layer(RetryLayer::new(
            constant(ToolClass::Read, 700).build().unwrap(),
            budget,
        ))
        .service(dep.clone());
    let err = call(&mut stack, 1u32).await.unwrap_err();
    assert_eq!(
        dep.calls(),
        2,
        "0 ms and 700 ms; 1,400 ms is past the deadline"
    );
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
}

/// The deadline counts readiness waits: a retry that would wait past it for its service (a
/// quota, a pool) is abandoned with `deadline_exceeded`.
#[tokio::test(start_paused = true)]
async fn a_retry_waiting_for_readiness_is_bounded_by_the_deadline() {
    let dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let policy = ClassPolicy::builder(ToolClass::Read)
        .deadline(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policy, RetryBudget::default()))
        .layer(QuotaLayer::new(Rate::per_second(1).build().unwrap()))
        .service(dep.clone());
    let start = Instant::now();
    let err = call(&mut svc, 1u32).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert!(!err.retryable());
    assert_eq!(start.elapsed(), Duration::from_millis(500));

    // Without a deadline the retry waits for the quota and succeeds.
    let dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, RetryBudget::default()))
        .layer(QuotaLayer::new(Rate::per_second(1).build().unwrap()))
        .service(dep.clone());
    assert!(call(&mut svc, 1u32).await.is_ok());
    assert_eq!(dep.calls(), 2);
}

/// Every budget a retry draws from is credited, once per operation.
#[tokio::test(start_paused = true)]
async fn every_budget_is_credited_once_per_operation() {
    // One budget per layer, as when each client brings its own.
    let budgets: Vec<RetryBudget> = (0..3).map(|_| no_floor()).collect();
    let dep = Dependency::always(Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budgets[0].clone()))
        .layer(RetryLayer::new(ToolClass::Read, budgets[1].clone()))
        .layer(RetryLayer::new(ToolClass::Read, budgets[2].clone()))
        .service(dep);
    for n in 0..10 {
        call(&mut stack, n).await.unwrap();
    }
    for (i, b) in budgets.iter().enumerate() {
        assert!(
            (b.balance() - 2.0).abs() < 1e-9,
            "budget {i}: {}",
            b.balance()
        );
    }

    // One shared budget: credited once per operation, not three times.
    let shared = no_floor();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, shared.clone()))
        .layer(RetryLayer::new(ToolClass::Read, shared.clone()))
        .layer(RetryLayer::new(ToolClass::Read, shared.clone()))
        .service(Dependency::always(Outcome::Ok));
    for n in 0..10 {
        call(&mut stack, n).await.unwrap();
    }
    assert!(
        (shared.balance() - 2.0).abs() < 1e-9,
        "{}",
        shared.balance()
    );

    // Outer budget A over two layers sharing B: each credited once.
    let (a, b) = (no_floor(), no_floor());
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, a.clone()))
        .layer(RetryLayer::new(ToolClass::Read, b.clone()))
        .layer(RetryLayer::new(ToolClass::Read, b.clone()))
        .service(Dependency::always(Outcome::Ok));
    for n in 0..10 {
        call(&mut stack, n).await.unwrap();
    }
    assert!((a.balance() - 2.0).abs() < 1e-9 && (b.balance() - 2.0).abs() < 1e-9);

    // The outer layer on A retries through an inner layer on B that makes one attempt a call:
    // the success of the second attempt credits both, once.
    let (a, b) = (no_floor(), no_floor());
    for _ in 0..5 {
        a.deposit(); // 5 x 0.2: one retry for A to spend
    }
    let once = ClassPolicy::builder(ToolClass::Read)
        .max_attempts(1)
        .build()
        .unwrap();
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, a.clone()))
        .layer(RetryLayer::new(once, b.clone()))
        .service(Dependency::script(
            [Outcome::Fail(FailureClass::Transient)],
            Outcome::Ok,
        ));
    call(&mut stack, 1).await.unwrap();
    assert!((a.balance() - 0.2).abs() < 1e-9, "A: {}", a.balance());
    assert!((b.balance() - 0.2).abs() < 1e-9, "B: {}", b.balance());
}

/// A run in an outage borrows at most its share of the shared balance; a healthy run keeps its
/// retries.
#[tokio::test(start_paused = true)]
async fn a_run_in_an_outage_cannot_starve_a_healthy_run() {
    let shared = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    let healthy = shared.for_run(RunLimits::default());
    let down = shared.for_run(RunLimits::default());
    let mut good =
        RetryLayer::new(ToolClass::Read, healthy.clone()).layer(Dependency::always(Outcome::Ok));
    for n in 0..500 {
        call(&mut good, n).await.unwrap();
    }
    assert!((shared.balance() - 100.0).abs() < 1e-9); // 500 x 0.2, at the cap
    let outage = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut bad = RetryLayer::new(ToolClass::Read, down.clone()).layer(outage.clone());
    for n in 0..100 {
        let _ = call(&mut bad, n).await;
    }
    // 100 operations; 10 retries borrowed (the default run share), then none.
    assert_eq!(outage.calls(), 110);
    assert!(
        (shared.balance() - 90.0).abs() < 1e-9,
        "{}",
        shared.balance()
    );
    assert_eq!(down.run_credit(), Some(-10.0));
    // The healthy run still retries on what it deposited.
    let flaky = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let mut good = RetryLayer::new(ToolClass::Read, healthy).layer(flaky.clone());
    assert!(call(&mut good, 1).await.is_ok());
    assert_eq!(flaky.calls(), 2);
}

/// A nested layer's own `max_attempts` caps its own attempts in a row; the operation's cap is
/// the outermost layer's, so raising it there gives the operation more attempts.
#[tokio::test(start_paused = true)]
async fn the_outermost_layer_sets_the_operations_attempts() {
    let budget = RetryBudget::default();
    let five = ClassPolicy::builder(ToolClass::Read)
        .max_attempts(5)
        .build()
        .unwrap();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(five, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(dep.clone());
    let err = call(&mut stack, 1u32).await.unwrap_err();
    assert_eq!(dep.calls(), 5);
    assert_eq!(err.attempts(), 5);
    assert!(!err.retryable());

    // An inner layer that makes one attempt leaves the retrying to the layer above.
    let once: ClassPolicy = ClassPolicy::builder(ToolClass::Read)
        .max_attempts(1)
        .build()
        .unwrap();
    let dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(once, budget))
        .service(dep.clone());
    assert!(call(&mut stack, 1u32).await.is_ok());
    assert_eq!(dep.calls(), 2);
}

/// A token refresh (an unkeyed write) joined into a read makes the read an unkeyed write: its
/// ambiguous failure is escalated after one call. With `.own_operation()` the read keeps its
/// class and retries.
#[tokio::test(start_paused = true)]
async fn a_refresh_inside_a_read_needs_its_own_operation() {
    for own in [false, true] {
        let budget = RetryBudget::default();
        let mut refresh_layer = RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone());
        if own {
            refresh_layer = refresh_layer.own_operation();
        }
        let refresh = refresh_layer.layer(Dependency::always(Outcome::Ok));
        let read_dep = Dependency::script([Outcome::Fail(FailureClass::Ambiguous)], Outcome::Ok);
        let tool = {
            let read_dep = read_dep.clone();
            service_fn(move |arg: u32| {
                let (mut refresh, mut read_dep) = (refresh.clone(), read_dep.clone());
                async move {
                    call(&mut refresh, 0u32).await?;
                    call(&mut read_dep, arg).await
                }
            })
        };
        let mut stack = RetryLayer::new(ToolClass::Read, budget).layer(tool);
        let result = call(&mut stack, 1).await;
        if own {
            assert!(result.is_ok(), "{result:?}");
            assert_eq!(read_dep.calls(), 2);
        } else {
            assert_eq!(result.unwrap_err().code(), ErrorCode::OutcomeUnknown);
            assert_eq!(read_dep.calls(), 1);
        }
    }
}

/// Retries go through the service as it is now: a change made through `get_mut` reaches them.
#[tokio::test(start_paused = true)]
async fn retries_use_the_service_as_get_mut_left_it() {
    #[derive(Clone)]
    struct Region(&'static str, Arc<AtomicU32>);
    impl tower::Service<u32> for Region {
        type Response = &'static str;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<&'static str, std::io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), std::io::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: u32) -> Self::Future {
            let n = self.1.fetch_add(1, Ordering::SeqCst);
            std::future::ready(if n % 2 == 0 {
                Err(std::io::ErrorKind::ConnectionRefused.into())
            } else {
                Ok(self.0)
            })
        }
    }
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .layer(Region("eu", Arc::new(AtomicU32::new(0))));
    assert_eq!(call(&mut svc, 1).await.unwrap(), "eu");
    let clone = svc.clone();
    svc.get_mut().0 = "us";
    assert_eq!(call(&mut svc, 1).await.unwrap(), "us");
    // A clone made before the change keeps its own service, as with tower's `Retry`.
    let mut clone = clone;
    assert_eq!(call(&mut clone, 1).await.unwrap(), "eu");
}

/// Cancelling an operation at any await point (here: in its backoff, and while a retry waits
/// for readiness) leaves nothing behind: the next operation on the thread starts clean.
#[tokio::test(start_paused = true)]
async fn a_cancelled_operation_leaves_the_next_one_clean() {
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    // A 100 ms backoff without jitter: full jitter may draw less than the 1 ms timeout below.
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(
            constant(ToolClass::UnkeyedWrite, 100).build().unwrap(),
            budget.clone(),
        ))
        .layer(RetryLayer::new(
            constant(ToolClass::Read, 100).build().unwrap(),
            budget.clone(),
        ))
        .service(dep.clone());
    // Dropped during its first backoff.
    let cut = tokio::time::timeout(Duration::from_millis(1), call(&mut stack, 1u32)).await;
    assert!(cut.is_err(), "still backing off");
    assert_eq!(dep.calls(), 1);
    // A new read operation: its own class and attempts, not the cancelled write's.
    let read = Dependency::script([Outcome::Fail(FailureClass::Ambiguous)], Outcome::Ok);
    let mut reads = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .service(read.clone());
    assert!(call(&mut reads, 1u32).await.is_ok());
    assert_eq!(read.calls(), 2, "an ambiguous read is retried");
}

/// A nested layer's deadline also holds when the operation travels to a spawned task
/// (`carry`): the shared ledger takes the earliest deadline.
#[tokio::test(start_paused = true)]
async fn a_carried_operation_takes_the_spawned_layers_deadline() {
    use stormguard::operation::carry;
    let budget = RetryBudget::default();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let inner_policy = constant(ToolClass::Read, 2_000)
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let inner = RetryLayer::new(inner_policy, budget.clone()).layer(dep.clone());
    let tool = service_fn(move |arg: u32| {
        let mut inner = inner.clone();
        async move {
            tokio::spawn(carry(async move { call(&mut inner, arg).await }))
                .await
                .unwrap()
        }
    });
    let mut stack = RetryLayer::new(ToolClass::Read, budget).layer(tool);
    let start = Instant::now();
    let err = call(&mut stack, 1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded);
    assert_eq!(dep.calls(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// The largest attempt cap a policy accepts fits the operation's ledger.
#[tokio::test(start_paused = true)]
async fn the_largest_attempt_cap_is_honoured_exactly() {
    use stormguard::class::MAX_ATTEMPTS_LIMIT;
    let most = constant(ToolClass::Read, 1)
        .max_attempts(MAX_ATTEMPTS_LIMIT)
        .build()
        .unwrap();
    let budget = RetryBudget::builder()
        .floor(1000, Duration::from_secs(60))
        .build()
        .unwrap();
    let dep = Dependency::always(Outcome::Fail(FailureClass::Transient));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(most, budget.clone()))
        .layer(RetryLayer::new(most, budget))
        .service(dep.clone());
    let err = call(&mut stack, 1u32).await.unwrap_err();
    assert_eq!(dep.calls(), MAX_ATTEMPTS_LIMIT);
    assert_eq!(err.attempts(), MAX_ATTEMPTS_LIMIT);
}
