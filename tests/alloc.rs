//! What the hot path allocates, counted by a global allocator: nothing for a first-try success
//! through three nested retry layers and a closed circuit breaker on a request that carries no
//! operation; a fixed few per operation on an `http::Request`, which carries it.
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::retry::RetryLayer;
use tower::{service_fn, Service, ServiceBuilder};

struct Counting;

thread_local! {
    // Per thread: the test harness allocates on its own threads while a test runs.
    static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn allocations() -> usize {
    ALLOCATIONS.with(|n| n.get())
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn poll_now<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the stack should answer at once"),
    }
}

#[test]
fn a_first_try_success_allocates_nothing() {
    let budget = RetryBudget::default();
    let leaf = service_fn(|n: u64| std::future::ready(Ok::<_, std::io::Error>(n + 1)));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::IdempotentWrite, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(CircuitBreakerLayer::new(Breaker::new(
            "leaf",
            BreakerConfig::default(),
        )))
        .service(leaf);

    let mut run = |n: u64| {
        poll_now(std::future::poll_fn(|cx| stack.poll_ready(cx))).unwrap();
        poll_now(stack.call(n)).unwrap()
    };
    for n in 0..100 {
        run(n); // warm-up: thread-locals, metrics and tracing callsites
    }
    let before = allocations();
    for n in 0..10_000 {
        assert_eq!(run(n), n + 1);
    }
    let allocations = allocations() - before;
    assert_eq!(allocations, 0, "{allocations} allocations in 10,000 calls");
}

/// The same stack built once on the shared budget, called inside an agent run's scope
/// (`RetryBudget::scope`): every layer credits the run, and nothing is allocated.
#[test]
fn a_first_try_success_in_a_runs_scope_allocates_nothing() {
    use stormguard::budget::RunLimits;
    let budget = RetryBudget::default();
    let leaf = service_fn(|n: u64| std::future::ready(Ok::<_, std::io::Error>(n + 1)));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::IdempotentWrite, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(leaf);
    let agent = budget.for_run(RunLimits::default());
    let before = std::cell::Cell::new(0);
    let mut scoped = std::pin::pin!(agent.scope(std::future::poll_fn(|cx| {
        for n in 0..10_100 {
            if n == 100 {
                // after the warm-up (thread-locals, metrics and tracing callsites)
                before.set(allocations());
            }
            let Poll::Ready(ready) = stack.poll_ready(cx) else {
                panic!("the stack should be ready");
            };
            ready.unwrap();
            assert_eq!(poll_now(stack.call(n)).unwrap(), n + 1);
        }
        Poll::Ready(())
    })));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(scoped.as_mut().poll(&mut cx).is_ready());
    let allocations = allocations() - before.get();
    assert_eq!(allocations, 0, "{allocations} allocations in 10,000 calls");
    // 10,100 successes x 0.2, up to the cap: all the run's.
    assert_eq!(agent.run_credit(), Some(100.0));
}

/// What the operation travelling with the request costs: on an `http::Request` the outermost
/// `Retry` moves the ledger to the heap (one `Arc`) and puts it in the request's extensions (the
/// map and its entry), so layers behind a `Buffer` or a spawned task join it. Measured, not
/// assumed, through three nested layers: the nested ones find it and add nothing.
#[test]
fn an_http_request_carries_the_operation_for_a_few_allocations_per_operation() {
    use stormguard::retry::Request;
    let budget = RetryBudget::default();
    let leaf = service_fn(|req: http::Request<()>| {
        std::future::ready(Ok::<_, std::io::Error>(req.operation().is_some()))
    });
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::IdempotentWrite, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .service(leaf);
    let mut run = || {
        poll_now(std::future::poll_fn(|cx| stack.poll_ready(cx))).unwrap();
        poll_now(stack.call(http::Request::new(()))).unwrap()
    };
    for _ in 0..100 {
        assert!(run(), "the operation travels in the request");
    }
    let before = allocations();
    for _ in 0..1_000 {
        run();
    }
    let per_operation = (allocations() - before) as f64 / 1_000.0;
    eprintln!("three Retry layers on an http::Request: {per_operation} allocations per operation");
    // The Arc, the extensions map (its box and its table) and the entry's box.
    assert!(
        (1.0..=4.0).contains(&per_operation),
        "{per_operation} allocations per operation"
    );
}

/// The same stack on a fleet budget with its breaker shared through Redis (feature `redis`):
/// a success is one more atomic add for the batch of deposits and one for the breaker's counts,
/// and no allocation. (The fleet's Redis need not answer: the hot path never asks it.)
#[cfg(feature = "redis")]
#[test]
fn a_first_try_success_on_a_fleet_budget_and_a_shared_breaker_allocates_nothing() {
    use stormguard::fleet::Fleet;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = rt.enter();
    let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap();
    let budget = RetryBudget::builder().fleet(&fleet, "hot").build().unwrap();
    let breaker = Breaker::new("leaf", BreakerConfig::default());
    let _shared = fleet.share_breaker(&breaker).unwrap();
    let leaf = service_fn(|n: u64| std::future::ready(Ok::<_, std::io::Error>(n + 1)));
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(CircuitBreakerLayer::new(breaker))
        .service(leaf);
    let mut run = |n: u64| {
        poll_now(std::future::poll_fn(|cx| stack.poll_ready(cx))).unwrap();
        poll_now(stack.call(n)).unwrap()
    };
    for n in 0..100 {
        run(n);
    }
    let before = allocations();
    for n in 0..10_000 {
        assert_eq!(run(n), n + 1);
    }
    let allocations = allocations() - before;
    assert_eq!(allocations, 0, "{allocations} allocations in 10,000 calls");
}
