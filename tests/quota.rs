//! The client-side quota on a paused clock: shared by clones, spacing concurrent callers, and
//! holding retries too.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::FailureClass::Transient;
use stormguard::quota::{QuotaLayer, Rate};
use stormguard::retry::RetryLayer;
use support::{call, classifier, Dependency, Outcome};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn concurrent_callers_through_clones_share_one_quota() {
    let layer = QuotaLayer::new(Rate::per_second(10).burst(5).build().unwrap());
    let start = Instant::now();
    let sent: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let record = sent.clone();
    let api = service_fn(move |_: u32| {
        record.lock().unwrap().push(start.elapsed());
        async { Ok::<_, std::io::Error>(()) }
    });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..45 {
        let svc = layer.layer(api.clone());
        tasks.spawn(async move { svc.oneshot(i).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 45);
    // The burst of 5 at once, then 40 more at 100 ms intervals: the last at 4 s.
    assert_eq!(sent.iter().filter(|t| t.is_zero()).count(), 5);
    assert_eq!(sent.iter().max(), Some(&Duration::from_secs(4)));
    // No window of one second holds more than the rate plus the burst.
    for from in 0..40 {
        let from = Duration::from_millis(100 * from);
        let within = sent
            .iter()
            .filter(|t| **t >= from && **t < from + Duration::from_secs(1))
            .count();
        assert!(within <= 14, "{within} calls in the second from {from:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn retries_wait_for_the_quota_too() {
    // Two transient failures, then a success: three calls, evenly spaced by the quota, whatever
    // the retry's own (here zero) backoff.
    let dep = Dependency::script([Outcome::Fail(Transient); 2], Outcome::Ok);
    let no_wait = ClassPolicy::builder(ToolClass::Read)
        .backoff(
            stormguard::backoff::Backoff::constant(Duration::ZERO)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(no_wait, RetryBudget::default()).classifier(classifier as fn(&_) -> _),
        )
        .layer(QuotaLayer::new(Rate::per_second(4).build().unwrap()))
        .service(dep.clone());
    let start = Instant::now();
    call(&mut svc, 1u32).await.unwrap();
    assert_eq!(dep.calls(), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn a_rate_faster_than_the_timer_still_holds() {
    // 10,000 calls a second is one every 100 µs, finer than tokio's 1 ms timer: waiters woken in
    // the same tick had their slots reserved apart, so 2,000 calls take 200 ms, not 2 s.
    let layer = QuotaLayer::new(Rate::per_second(10_000).build().unwrap());
    let api = service_fn(|_: u32| async { Ok::<_, std::io::Error>(()) });
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..2_000 {
        let svc = layer.layer(api);
        tasks.spawn(async move { svc.oneshot(i).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_micros(199_900) && took <= Duration::from_millis(201),
        "{took:?}"
    );
}

/// The quota module's own example is copied as it is: it must build the retry budget once and
/// share clones, not make a budget per layer inline (a budget per call site doubles an outage's
/// calls when the pattern is copied).
#[test]
fn the_module_example_builds_its_budget_once() {
    let docs = include_str!("../src/quota/mod.rs");
    let inline: Vec<&str> = docs
        .lines()
        .filter(|l| l.contains("RetryLayer::new(") && l.contains("RetryBudget::default()"))
        .collect();
    assert!(inline.is_empty(), "{inline:#?}");
    assert!(docs.contains("let budget = RetryBudget::default();"));
}
