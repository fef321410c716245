//! Overhead of a first-try success, side by side with tower's own `Retry`.
//!
//! `cargo bench --bench overhead`. Every stack wraps the same leaf service that answers at once;
//! futures are polled once with a no-op waker, so what is measured is the middleware itself.

mod common;

use common::{once, Leaf};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::future::{ready, Ready};
use std::sync::Arc;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::retry::RetryLayer;
use tower::retry::budget::{Budget, TpsBudget};
use tower::ServiceBuilder;

/// tower's `Retry` with the least a policy can do: retry errors, deposit successes if budgeted.
#[derive(Clone)]
struct Trivial {
    budget: Option<Arc<TpsBudget>>,
}

impl<E> tower::retry::Policy<u64, u64, E> for Trivial {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut u64, result: &mut Result<u64, E>) -> Option<Ready<()>> {
        match result {
            Ok(_) => {
                if let Some(b) = &self.budget {
                    b.deposit();
                }
                None
            }
            Err(_) => match &self.budget {
                Some(b) if !b.withdraw() => None,
                _ => Some(ready(())),
            },
        }
    }

    fn clone_request(&mut self, req: &u64) -> Option<u64> {
        Some(*req)
    }
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");

    let mut bare = Leaf;
    group.bench_function("bare", |b| b.iter(|| once(&mut bare, black_box(1))));

    let mut tower_1 = ServiceBuilder::new()
        .retry(Trivial { budget: None })
        .service(Leaf);
    group.bench_function("tower_retry_1", |b| {
        b.iter(|| once(&mut tower_1, black_box(1)))
    });

    let tps = Arc::new(TpsBudget::default());
    let mut tower_1_budget = ServiceBuilder::new()
        .retry(Trivial { budget: Some(tps) })
        .service(Leaf);
    group.bench_function("tower_retry_1_budget", |b| {
        b.iter(|| once(&mut tower_1_budget, black_box(1)))
    });

    let budget = RetryBudget::default();
    let mut stormguard_1 = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .service(Leaf);
    group.bench_function("stormguard_retry_1", |b| {
        b.iter(|| once(&mut stormguard_1, black_box(1)))
    });

    let shared = Arc::new(TpsBudget::default());
    let policy = Trivial {
        budget: Some(shared),
    };
    let mut tower_3_budget = ServiceBuilder::new()
        .retry(policy.clone())
        .retry(policy.clone())
        .retry(policy)
        .service(Leaf);
    group.bench_function("tower_retry_3_budget", |b| {
        b.iter(|| once(&mut tower_3_budget, black_box(1)))
    });

    let mut stormguard_3_budget = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .service(Leaf);
    group.bench_function("stormguard_retry_3_budget", |b| {
        b.iter(|| once(&mut stormguard_3_budget, black_box(1)))
    });

    let breaker = Breaker::new("leaf", BreakerConfig::default());
    let mut breaker_closed = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone()))
        .service(Leaf);
    group.bench_function("breaker_closed", |b| {
        b.iter(|| once(&mut breaker_closed, black_box(1)))
    });

    let budget = RetryBudget::default();
    let mut stormguard_3_breaker = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .layer(CircuitBreakerLayer::new(breaker))
        .service(Leaf);
    group.bench_function("stormguard_retry_3_budget_breaker", |b| {
        b.iter(|| once(&mut stormguard_3_breaker, black_box(1)))
    });

    // A hedge over a write: never hedged, so nothing but the class check (no clock read, no
    // copy); beside the same Retry alone.
    let budget = RetryBudget::default();
    let mut write_1 = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .service(Leaf);
    group.bench_function("stormguard_retry_1_write", |b| {
        b.iter(|| once(&mut write_1, black_box(1)))
    });
    let hedge =
        stormguard::hedge::HedgeLayer::fixed(budget.clone(), std::time::Duration::from_secs(1))
            .build()
            .expect("valid");
    let mut write_hedged = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
        .layer(hedge.clone())
        .service(Leaf);
    group.bench_function("stormguard_retry_1_write_hedge", |b| {
        b.iter(|| once(&mut write_hedged, black_box(1)))
    });
    // Over a read: the copy, one clock read and the timer armed (inside a runtime), then the
    // answer at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _in_runtime = rt.enter();
    let mut read_hedged = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget))
        .layer(hedge)
        .service(Leaf);
    group.bench_function("stormguard_retry_1_read_hedge", |b| {
        b.iter(|| once(&mut read_hedged, black_box(1)))
    });

    // The fault layer switched off (feature `chaos`): within noise of the bare service.
    #[cfg(feature = "chaos")]
    {
        use tower::Layer;
        let mut chaos_off = stormguard::chaos::ChaosLayer::off().layer(Leaf);
        group.bench_function("chaos_off", |b| {
            b.iter(|| once(&mut chaos_off, black_box(1)))
        });
    }

    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
