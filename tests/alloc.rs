//! The hot path allocates nothing: a first-try success through three nested retry layers and a
//! closed circuit breaker, counted by a global allocator.
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::retry::RetryLayer;
use tower::{service_fn, Service, ServiceBuilder};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
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
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for n in 0..10_000 {
        assert_eq!(run(n), n + 1);
    }
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(allocations, 0, "{allocations} allocations in 10,000 calls");
}
