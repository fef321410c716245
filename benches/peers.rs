//! The newer layers side by side with their anchors, on a first-try success: the hedge with
//! tower's `Hedge`, the keyed quota with governor's keyed rate limiter (behind the smallest tower
//! service a user would write around it), the keyed breaker with the plain breaker.
//!
//! `cargo bench --bench peers`. Every stack wraps the same leaf service that answers at once;
//! futures are polled once with a no-op waker, inside a tokio runtime (both hedges arm a timer).

mod common;

use common::{once, Leaf};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::breaker::{
    Breaker, BreakerConfig, BreakerRegistry, CircuitBreakerLayer, KeyedBreakerLayer,
};
use stormguard::budget::RetryBudget;
use stormguard::hedge::HedgeLayer;
use stormguard::quota::{KeyedQuotaLayer, Rate};
use tower::{Layer, Service};

/// How many keys (tenants, models) the keyed layers see, in turn.
const KEYS: u64 = 1_024;

/// tower's hedge policy for a `u64` request: always clonable, always hedgeable.
#[derive(Clone)]
struct Always;

impl tower::hedge::Policy<u64> for Always {
    fn clone_request(&self, req: &u64) -> Option<u64> {
        Some(*req)
    }

    fn can_retry(&self, _: &u64) -> bool {
        true
    }
}

/// governor's keyed limiter as a user puts it in a tower stack: check the key, refuse when it
/// has no room, else call through.
#[derive(Clone)]
struct Governed<S> {
    inner: S,
    limiter: Arc<DefaultKeyedRateLimiter<u64>>,
}

impl<S: Service<u64, Error = std::io::Error>> Service<u64> for Governed<S> {
    type Response = S::Response;
    type Error = std::io::Error;
    type Future = futures_util::future::Either<
        S::Future,
        std::future::Ready<Result<S::Response, std::io::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: u64) -> Self::Future {
        match self.limiter.check_key(&(req % KEYS)) {
            Ok(()) => futures_util::future::Either::Left(self.inner.call(req)),
            Err(_) => futures_util::future::Either::Right(std::future::ready(Err(
                std::io::Error::other("rate limited"),
            ))),
        }
    }
}

fn peers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _in_runtime = rt.enter();
    let mut group = c.benchmark_group("peers");

    // The hedge: a timer armed for the second attempt, the answer at once.
    let mut tower_hedge = tower::hedge::Hedge::new(Leaf, Always, 10, 0.9, Duration::from_secs(10));
    group.bench_function("tower_hedge", |b| {
        b.iter(|| once(&mut tower_hedge, black_box(1)))
    });
    let hedge = HedgeLayer::fixed(RetryBudget::default(), Duration::from_secs(1))
        .build()
        .expect("valid");
    let mut stormguard_hedge = hedge.layer(Leaf);
    group.bench_function("stormguard_hedge", |b| {
        b.iter(|| once(&mut stormguard_hedge, black_box(1)))
    });

    // The keyed quota: 1,024 keys in turn, each with far more room than the bench uses.
    let per_key = NonZeroU32::new(1_000_000_000).expect("non-zero");
    let mut governed = Governed {
        inner: Leaf,
        limiter: Arc::new(RateLimiter::keyed(Quota::per_second(per_key))),
    };
    let mut n = 0u64;
    group.bench_function("governor_keyed", |b| {
        b.iter(|| {
            n += 1;
            once(&mut governed, black_box(n))
        })
    });
    let rate = Rate::per_second(1_000_000_000)
        .burst(100_000)
        .build()
        .expect("valid");
    let mut keyed_quota = KeyedQuotaLayer::new(rate, |req: &u64| (*req % KEYS, 1)).layer(Leaf);
    group.bench_function("stormguard_keyed_quota", |b| {
        b.iter(|| {
            n += 1;
            once(&mut keyed_quota, black_box(n))
        })
    });

    // The breakers: one closed breaker, and a breaker per key (1,024 keys in turn).
    let mut plain =
        CircuitBreakerLayer::new(Breaker::new("dep", BreakerConfig::default())).layer(Leaf);
    group.bench_function("breaker", |b| b.iter(|| once(&mut plain, black_box(1))));
    // The key as a user's closure reads it from the request: borrowed, no allocation.
    let names: &'static [String] = Vec::leak((0..KEYS).map(|k| format!("model-{k}")).collect());
    let registry = BreakerRegistry::new(BreakerConfig::default());
    let mut keyed_breaker = KeyedBreakerLayer::new(registry, move |req: &u64| {
        names[(*req % KEYS) as usize].as_str()
    })
    .layer(Leaf);
    group.bench_function("stormguard_keyed_breaker", |b| {
        b.iter(|| {
            n += 1;
            once(&mut keyed_breaker, black_box(n))
        })
    });
    group.finish();
}

criterion_group!(benches, peers);
criterion_main!(benches);
