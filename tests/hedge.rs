//! Hedged reads: a second attempt after a delay, counted in the operation's ledger, paid from
//! the budget, never for a write (paused clock).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::hedge::HedgeLayer;
use stormguard::retry::{Replay, RetryLayer};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// A dependency whose n-th call (0-based) waits `script(n).0` ms and then answers, failing if
/// `script(n).1`; counts calls, and calls dropped before they answered.
#[derive(Clone)]
struct Dep {
    calls: Arc<AtomicU32>,
    cancelled: Arc<AtomicU32>,
    script: Arc<dyn Fn(u32) -> (u64, bool) + Send + Sync>,
}

struct Guard(Arc<AtomicU32>, bool);

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Dep {
    fn new(script: impl Fn(u32) -> (u64, bool) + Send + Sync + 'static) -> Self {
        Dep {
            calls: Arc::default(),
            cancelled: Arc::default(),
            script: Arc::new(script),
        }
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
    fn cancelled(&self) -> u32 {
        self.cancelled.load(Ordering::SeqCst)
    }
}

impl Service<u32> for Dep {
    type Response = u32;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<u32, std::io::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u32) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let (ms, fail) = (self.script)(n);
        let cancelled = self.cancelled.clone();
        Box::pin(async move {
            let mut guard = Guard(cancelled, false);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.1 = true;
            if fail {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            } else {
                Ok(req)
            }
        })
    }
}

fn hedge(budget: &RetryBudget, ms: u64) -> HedgeLayer {
    HedgeLayer::fixed(budget.clone(), Duration::from_millis(ms))
        .build()
        .unwrap()
}

fn fast_read(class: ToolClass) -> ClassPolicy {
    ClassPolicy::builder(class)
        .backoff(
            stormguard::backoff::Backoff::exponential(Duration::from_millis(1))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_is_hedged_the_hedge_wins_and_the_loser_is_cancelled() {
    let dep = Dep::new(|n| if n == 0 { (1_000, false) } else { (10, false) });
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(hedge(&budget, 30))
        .service(dep.clone());
    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(5).await.unwrap(), 5);
    assert_eq!(start.elapsed(), Duration::from_millis(40));
    assert_eq!(dep.calls(), 2);
    assert_eq!(dep.cancelled(), 1, "the slow first attempt was dropped");
}

#[tokio::test(start_paused = true)]
async fn a_fast_answer_sends_no_hedge() {
    let dep = Dep::new(|_| (10, false));
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(hedge(&budget, 30))
        .service(dep.clone());
    for i in 0..50 {
        assert_eq!(svc.ready().await.unwrap().call(i).await.unwrap(), i);
    }
    assert_eq!(dep.calls(), 50);
    assert_eq!(dep.cancelled(), 0);
}

/// Counts the copies made for hedges.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicU32>);

impl Replay<u32> for Counting {
    fn replay(&self, req: &u32) -> Option<u32> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Some(*req)
    }
}

#[tokio::test(start_paused = true)]
async fn writes_are_never_hedged_nor_copied() {
    for class in [
        ToolClass::IdempotentWrite,
        ToolClass::KeyedWrite,
        ToolClass::UnkeyedWrite,
        ToolClass::MultiStep,
    ] {
        let dep = Dep::new(|_| (1_000, false));
        let budget = RetryBudget::default();
        let copies = Counting::default();
        let layer = HedgeLayer::fixed(budget.clone(), Duration::from_millis(10))
            .replay(copies.clone())
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(RetryLayer::new(class, budget.clone()))
            .layer(layer)
            .service(dep.clone());
        svc.ready().await.unwrap().call(1).await.unwrap();
        assert_eq!(dep.calls(), 1, "{class:?} was hedged");
        assert_eq!(copies.0.load(Ordering::SeqCst), 0, "{class:?} was copied");
    }
    // A read layer above a write layer: the operation is a write (the strictest class).
    let dep = Dep::new(|_| (1_000, false));
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .layer(hedge(&budget, 10))
        .service(dep.clone());
    svc.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(dep.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn hedges_count_in_the_operations_attempts() {
    // Every attempt fails after 100 ms: attempt 1 at 0, its hedge at 20 ms (both fail), then
    // the Retry's one remaining attempt, unhedged: 3 calls, never more.
    let dep = Dep::new(|_| (100, true));
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(fast_read(ToolClass::Read), budget.clone()))
        .layer(hedge(&budget, 20))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(dep.calls(), 3);

    // Three nested layers, the same: the operation's cap, not 3 x 3 plus hedges.
    let dep = Dep::new(|_| (100, true));
    let budget = RetryBudget::default();
    let layer = |name| RetryLayer::new(fast_read(ToolClass::Read), budget.clone()).name(name);
    let mut svc = ServiceBuilder::new()
        .layer(layer("agent-loop"))
        .layer(layer("tool-wrapper"))
        .layer(layer("client"))
        .layer(hedge(&budget, 20))
        .service(dep.clone());
    let _ = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_sends_no_hedge() {
    let dep = Dep::new(|n| if n == 0 { (1_000, false) } else { (10, false) });
    let budget = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(hedge(&budget, 30))
        .service(dep.clone());
    let start = Instant::now();
    svc.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    assert_eq!(dep.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_before_the_delay_is_answered_at_once() {
    let dep = Dep::new(|_| (5, true));
    let budget = RetryBudget::default();
    // Under a Retry that gives no second attempt: the failure comes back after 5 ms, with no
    // hedge after it.
    let one = ClassPolicy::builder(ToolClass::Read)
        .max_attempts(1)
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(one, budget.clone()))
        .layer(hedge(&budget, 30))
        .service(dep.clone());
    let start = Instant::now();
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(dep.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_waits_for_the_other_one() {
    // The first attempt fails at 50 ms, after its hedge went at 20 ms; the hedge succeeds at 70.
    let dep = Dep::new(|n| if n == 0 { (50, true) } else { (50, false) });
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(hedge(&budget, 20))
        .service(dep.clone());
    let start = Instant::now();
    assert_eq!(svc.ready().await.unwrap().call(3).await.unwrap(), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(70));
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_an_operation_in_sight_nothing_is_hedged() {
    // Alone: the class is unknown, so nothing is hedged.
    let dep = Dep::new(|_| (1_000, false));
    let budget = RetryBudget::default();
    let mut svc = ServiceBuilder::new()
        .layer(hedge(&budget, 10))
        .service(dep.clone());
    svc.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(dep.calls(), 1);
    // Behind a spawn that did not carry the operation (outside review): an unkeyed write above
    // is never sent twice.
    let dep = Dep::new(|_| (1_000, false));
    let hedged = hedge(&budget, 10).layer(dep.clone());
    let tool = tower::service_fn(move |r: u32| {
        let mut h = hedged.clone();
        async move {
            tokio::spawn(async move { h.ready().await?.call(r).await })
                .await
                .unwrap()
        }
    });
    let mut send = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .service(tool);
    send.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(dep.calls(), 1);
    // Copied where the operation was seen, but polled on a task where it is not: not sent.
    let dep = Dep::new(|_| (1_000, false));
    let hedged = hedge(&budget, 10).layer(dep.clone());
    let tool = tower::service_fn(move |r: u32| {
        let mut h = hedged.clone();
        async move {
            let future = h.ready().await?.call(r);
            tokio::spawn(future).await.unwrap()
        }
    });
    let mut read = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(tool);
    read.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(dep.calls(), 1);
    // With the operation carried across the spawn, a read is hedged.
    let dep = Dep::new(|_| (1_000, false));
    let hedged = hedge(&budget, 10).layer(dep.clone());
    let tool = tower::service_fn(move |r: u32| {
        let mut h = hedged.clone();
        async move {
            let carried =
                stormguard::operation::carry(async move { h.ready().await?.call(r).await });
            tokio::spawn(carried).await.unwrap()
        }
    });
    let mut read = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(tool);
    read.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(dep.calls(), 2);
    assert_eq!(dep.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_waits_for_its_samples_then_follows_the_latencies() {
    // 95 % answer in 10 ms, every 20th call takes a second.
    let dep = Dep::new(|n| {
        if n % 20 == 19 {
            (1_000, false)
        } else {
            (10, false)
        }
    });
    let budget = RetryBudget::default();
    let layer = HedgeLayer::percentile(budget.clone(), 0.9, 100)
        .build()
        .unwrap();
    assert_eq!(layer.delay(), None);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(layer.clone())
        .service(dep.clone());
    let latencies = Arc::new(Mutex::new(Vec::new()));
    for i in 0..400 {
        let start = Instant::now();
        svc.ready().await.unwrap().call(i).await.unwrap();
        latencies.lock().unwrap().push(start.elapsed());
    }
    assert_eq!(layer.delay(), Some(Duration::from_millis(10)));
    let l = latencies.lock().unwrap();
    // Before 100 samples no hedge: the slow calls took a second.
    assert!(
        l[..100]
            .iter()
            .filter(|d| **d >= Duration::from_secs(1))
            .count()
            >= 4
    );
    // After, every slow call was hedged at 10 ms and answered at 20 ms.
    assert!(
        l[100..].iter().all(|d| *d <= Duration::from_millis(20)),
        "{:?}",
        l.iter()
            .enumerate()
            .filter(|(_, d)| **d > Duration::from_millis(20))
            .collect::<Vec<_>>()
    );
    // Amplification: only the slow ones were hedged (5 % of 300 = 15).
    assert_eq!(dep.calls(), 400 + 15);
}

#[test]
fn bad_settings_are_refused() {
    let budget = RetryBudget::default;
    assert_eq!(
        HedgeLayer::fixed(budget(), Duration::ZERO)
            .build()
            .unwrap_err()
            .field(),
        "delay"
    );
    assert_eq!(
        HedgeLayer::fixed(budget(), Duration::from_secs(7200))
            .build()
            .unwrap_err()
            .field(),
        "delay"
    );
    for q in [0.0, 1.0, -0.5, f64::NAN, 2.0] {
        assert_eq!(
            HedgeLayer::percentile(budget(), q, 10)
                .build()
                .unwrap_err()
                .field(),
            "percentile"
        );
    }
    assert_eq!(
        HedgeLayer::percentile(budget(), 0.9, 0)
            .build()
            .unwrap_err()
            .field(),
        "min_samples"
    );
}

/// Only reads feed the percentile: the latencies of writes (never hedged, and no clock read for
/// them) leave the delay unknown, so the first read after them is not hedged.
#[tokio::test(start_paused = true)]
async fn the_percentile_is_learnt_from_reads_only() {
    let budget = RetryBudget::default();
    let hedge = HedgeLayer::percentile(budget.clone(), 0.5, 5)
        .build()
        .unwrap();
    let dep = Dep::new(|_| (10, false));
    let stack = |class| {
        ServiceBuilder::new()
            .layer(RetryLayer::new(class, budget.clone()))
            .layer(hedge.clone())
            .service(dep.clone())
    };
    for _ in 0..10 {
        stack(ToolClass::UnkeyedWrite).oneshot(1).await.unwrap();
    }
    assert_eq!(hedge.delay(), None, "writes taught it nothing");
    for _ in 0..5 {
        stack(ToolClass::Read).oneshot(1).await.unwrap();
    }
    assert_eq!(
        hedge.delay(),
        Some(Duration::from_millis(10)),
        "five reads did"
    );
}
