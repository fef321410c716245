//! The fleet's budget through Redis: decisions per second with and without the local lease, and
//! the first-try overhead of a `Retry` on a fleet budget beside one on a local budget.
//!
//! `cargo bench --features redis --bench fleet`. Uses the Redis at `STORMGUARD_REDIS_URL`, or
//! starts none and measures only the local rows when it is unset (it says so).

mod common;

use common::{once, Leaf};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::fleet::Fleet;
use stormguard::retry::RetryLayer;
use tower::Layer;

fn fleet(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let url = std::env::var("STORMGUARD_REDIS_URL").ok();
    if url.is_none() {
        eprintln!("fleet bench: STORMGUARD_REDIS_URL is not set; measuring the local rows only");
    }
    let fleet = url.map(|url| {
        runtime.block_on(async {
            let prefix = format!("stormguard-bench:{}", std::process::id());
            let fleet = Fleet::builder(url)
                .prefix(prefix)
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap();
            assert!(
                fleet.wait_up(Duration::from_secs(5)).await,
                "Redis did not answer"
            );
            fleet
        })
    });
    let _guard = runtime.enter();

    let mut group = c.benchmark_group("first_try");
    let local = RetryBudget::default();
    let mut svc = RetryLayer::new(ToolClass::Read, local).layer(Leaf);
    group.bench_function("retry_local_budget", |b| {
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            black_box(once(&mut svc, n))
        })
    });
    if let Some(fleet) = &fleet {
        let budget = RetryBudget::builder()
            .fleet(fleet, "first-try")
            .build()
            .unwrap();
        let mut svc = RetryLayer::new(ToolClass::Read, budget).layer(Leaf);
        group.bench_function("retry_fleet_budget", |b| {
            let mut n = 0u64;
            b.iter(|| {
                n += 1;
                black_box(once(&mut svc, n))
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("decision");
    let local = RetryBudget::builder().retry_ratio(10.0).build().unwrap();
    group.bench_function("withdraw_local", |b| {
        b.iter(|| {
            local.deposit();
            black_box(local.try_withdraw(Duration::ZERO).is_ok())
        })
    });
    if let Some(fleet) = &fleet {
        // Each success deposits 10 retries: the fleet's balance stays full, and every decision
        // is a grant whenever the lease holds one.
        let leased = RetryBudget::builder()
            .retry_ratio(10.0)
            .fleet(fleet, "lease")
            .build()
            .unwrap();
        group.bench_function("withdraw_fleet_lease", |b| {
            b.iter(|| {
                leased.deposit();
                black_box(leased.try_withdraw(Duration::ZERO).is_ok())
            })
        });
        let exact = RetryBudget::builder()
            .retry_ratio(10.0)
            .fleet(fleet, "exact")
            .build()
            .unwrap();
        group.bench_function("withdraw_fleet_round_trip", |b| {
            b.to_async(&runtime).iter(|| async {
                exact.deposit();
                black_box(exact.fleet_withdraw(Duration::ZERO).await.is_ok())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fleet);
criterion_main!(benches);
