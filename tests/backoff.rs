//! Backoff bounds (property tests), independence of concurrent backoffs, invalid settings.
use proptest::prelude::*;
use std::time::Duration;
use stormguard::backoff::{Backoff, Jitter};

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
    ]
}

proptest! {
    #[test]
    fn every_delay_is_within_its_bounds(
        base_ms in 1u64..5_000,
        extra_ms in 0u64..60_000,
        jitter in jitter(),
        seed in any::<u64>(),
        retries in 1usize..40,
    ) {
        let base = Duration::from_millis(base_ms);
        let cap = base + Duration::from_millis(extra_ms);
        let backoff = Backoff::exponential(base).cap(cap).jitter(jitter).build().unwrap();
        let mut state = backoff.state(seed);
        for n in 0..retries {
            let d = state.next_delay();
            let ceiling = backoff.ceiling(n as u32);
            prop_assert!(d <= cap, "{d:?} above cap {cap:?}");
            match jitter {
                Jitter::None => prop_assert_eq!(d, ceiling),
                Jitter::Full => prop_assert!(d <= ceiling),
                Jitter::Equal => prop_assert!(d >= ceiling / 2 && d <= ceiling),
                Jitter::Decorrelated => prop_assert!(d >= base),
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn linear_and_constant_stay_under_their_caps(
        base_ms in 1u64..1_000, cap_extra in 0u64..10_000, seed in any::<u64>(), n in 0u32..1000,
    ) {
        let base = Duration::from_millis(base_ms);
        let cap = base + Duration::from_millis(cap_extra);
        let linear = Backoff::linear(base).cap(cap).jitter(Jitter::None).build().unwrap();
        prop_assert_eq!(linear.ceiling(n), (base * (n + 1)).min(cap));
        let constant = Backoff::constant(base).build().unwrap();
        prop_assert_eq!(constant.state(seed).next_delay(), base);
    }

    #[test]
    fn the_same_seed_gives_the_same_delays(seed in any::<u64>()) {
        let backoff = Backoff::exponential(Duration::from_millis(100)).build().unwrap();
        let (mut a, mut b) = (backoff.state(seed), backoff.state(seed));
        for _ in 0..10 {
            prop_assert_eq!(a.next_delay(), b.next_delay());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_operations_retry_at_independent_times() {
    use std::sync::{Arc, Mutex};
    use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    use tokio::time::Instant;
    use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

    // Every operation fails once (connection refused), then succeeds; record when retries land.
    let start = Instant::now();
    let retried_at = Arc::new(Mutex::new(Vec::new()));
    let log = retried_at.clone();
    let dep = service_fn(move |attempt: u32| {
        let log = log.clone();
        async move {
            if attempt == 0 {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            } else {
                log.lock().unwrap().push(start.elapsed());
                Ok(())
            }
        }
    });
    // The request is the attempt number: the first attempt sends 0, the replay sends 1.
    #[derive(Clone, Copy)]
    struct Bump;
    impl stormguard::retry::Replay<u32> for Bump {
        fn replay(&self, req: &u32) -> Option<u32> {
            Some(req + 1)
        }
    }
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new(
                ToolClass::Read,
                RetryBudget::builder()
                    .seed(9)
                    .floor(100, Duration::from_secs(60))
                    .build()
                    .unwrap(),
            )
            .replay(Bump),
        )
        .service(dep);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let mut svc = svc.clone();
        tasks.spawn(async move { svc.ready().await.unwrap().call(0).await.unwrap() });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let mut times = retried_at.lock().unwrap().clone();
    assert_eq!(times.len(), 16);
    times.sort();
    times.dedup();
    // tower's ExponentialBackoffMaker would give all 16 the same delay; here they spread over
    // [0, 100 ms) (full jitter, 100 ms base).
    assert!(
        times.len() >= 12,
        "only {} distinct retry times: {times:?}",
        times.len()
    );
    assert!(times.iter().all(|t| *t < Duration::from_millis(100)));
}

#[test]
fn invalid_backoffs_are_rejected() {
    let ms = Duration::from_millis;
    let cases = [
        (Backoff::exponential(Duration::ZERO).build(), "base"),
        (Backoff::exponential(ms(500)).cap(ms(100)).build(), "cap"),
        (
            Backoff::exponential(ms(1))
                .cap(Duration::from_secs(7200))
                .build(),
            "cap",
        ),
        (
            Backoff::linear(ms(10)).jitter(Jitter::Decorrelated).build(),
            "jitter",
        ),
    ];
    for (result, field) in cases {
        assert_eq!(result.unwrap_err().field(), field);
    }
    assert!(Backoff::constant(Duration::ZERO).build().is_ok());
}
