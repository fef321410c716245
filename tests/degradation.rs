//! What the default breaker does to a failing dependency, alone (no retries), on a paused clock
//! under an open-loop load: a partial failure is never made an outage, a healed dependency is
//! noticed within a second, a full outage is shed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// splitmix64 in [0, 1).
fn roll(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

struct Run {
    requests: u64,
    calls: u64,
    successes: u64,
    /// When the first success came, from the start.
    first_success: Option<Duration>,
    opens: u64,
}

/// Sends `rate` requests a second for `secs` through a default breaker to a dependency whose
/// call `n` (at time `t`) fails when `fails(n, t)`.
async fn drive(
    rate: u64,
    secs: u64,
    fails: impl Fn(u64, Duration) -> bool + Send + Sync + 'static,
) -> Run {
    let breaker = Breaker::new("dependency", BreakerConfig::default());
    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let fails = Arc::new(fails);
    let counter = calls.clone();
    let dep = tower::service_fn(move |_: u64| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let failed = fails(n, start.elapsed());
        async move {
            if failed {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            } else {
                Ok(n)
            }
        }
    });
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(dep);
    let (mut successes, mut first_success) = (0, None);
    let requests = rate * secs;
    for i in 0..requests {
        tokio::time::sleep_until(start + Duration::from_secs(1) * i as u32 / rate as u32).await;
        if svc.ready().await.unwrap().call(i).await.is_ok() {
            successes += 1;
            first_success.get_or_insert(start.elapsed());
        }
    }
    Run {
        requests,
        calls: calls.load(Ordering::SeqCst),
        successes,
        first_success,
        opens: breaker.opens(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_dependency_failing_half_its_calls_is_never_shut_out() {
    for p in [0.3, 0.5, 0.6] {
        let run = drive(100, 60, move |n, _| roll(n ^ 0x5EED) < p).await;
        assert_eq!(run.opens, 0, "p = {p}: the breaker opened");
        assert_eq!(run.calls, run.requests, "p = {p}: a call was turned away");
        let rate = run.successes as f64 / run.requests as f64;
        assert!((rate - (1.0 - p)).abs() < 0.03, "p = {p}: success {rate}");
    }
}

#[tokio::test(start_paused = true)]
async fn at_70_percent_failing_it_costs_at_most_a_point_or_two() {
    // The documented edge: runs of 20 failures in a row come by chance now and then.
    let run = drive(100, 60, |n, _| roll(n ^ 0x5EED) < 0.7).await;
    let rate = run.successes as f64 / run.requests as f64;
    assert!(
        rate >= 0.3 - 0.02,
        "success {rate} against 0.30 without a breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn a_healed_dependency_is_noticed_within_a_second() {
    for rate in [100, 10] {
        let heal = Duration::from_secs(30);
        let run = drive(rate, 90, move |_, t| t < heal).await;
        assert!(run.opens >= 1);
        let after = run.first_success.expect("a success after healing") - heal;
        // At 10/s the 25 turned-away calls take 2.5 s; the rule is "250 ms and 25 calls".
        let bound = if rate == 100 {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(2_600)
        };
        assert!(
            after <= bound,
            "{rate}/s: first success {after:?} after healing"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_outage_is_shed() {
    let run = drive(100, 60, |_, _| true).await;
    let amplification = run.calls as f64 / run.requests as f64;
    assert!(amplification <= 0.05, "100/s: {amplification}");
    let run = drive(1, 600, |_, _| true).await;
    let amplification = run.calls as f64 / run.requests as f64;
    assert!(amplification <= 0.1, "1/s: {amplification}");
}
