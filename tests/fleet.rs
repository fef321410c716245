//! The fleet's budget, quota and breaker against the real Redis (feature `redis`).
//!
//! The shared tests use the Redis at `STORMGUARD_REDIS_URL` (CI starts one on 127.0.0.1:6379 and
//! sets it); without it they print that they were skipped. The fallback tests start a
//! `redis-server` of their own on a free port (so they can stop it) and say so when the binary
//! is missing. Every test uses a prefix of its own: nothing it writes is seen by another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
use stormguard::budget::RetryBudget;
use stormguard::error::{ErrorCode, ToolError};
use stormguard::fleet::{Fleet, FleetQuotaLayer, SharedBreaker};
use stormguard::quota::Rate;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

fn redis_url() -> Option<String> {
    match std::env::var("STORMGUARD_REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            eprintln!("skipped: STORMGUARD_REDIS_URL is not set (CI sets it and starts Redis)");
            None
        }
    }
}

fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("stormguard-test:{test}:{}:{nanos}", std::process::id())
}

/// The fleet's floor windows are aligned on Redis's clock (`TIME`), so a test that counts one
/// window's floor exactly must not straddle a turn: wait, if need be, until the current window
/// has at least `needed` left on Redis's clock.
async fn clear_of_a_window_turn(url: &str, window: Duration, needed: Duration) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1_000 + micros / 1_000;
    let width = window.as_millis() as u64;
    let left = Duration::from_millis(width - now_ms % width);
    if left < needed {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

/// One breaker named `name` per worker, each shared through its worker's fleet.
fn shared_breakers(
    fleets: &[Fleet],
    name: &'static str,
    config: impl Fn() -> BreakerConfig,
) -> (Vec<Breaker>, Vec<SharedBreaker>) {
    let breakers: Vec<Breaker> = fleets
        .iter()
        .map(|_| Breaker::new(name, config()))
        .collect();
    let shared = fleets
        .iter()
        .zip(&breakers)
        .map(|(f, b)| f.share_breaker(b).unwrap())
        .collect();
    (breakers, shared)
}

/// `n` workers: each its own `Fleet` (its own connection and name), as separate processes have.
async fn workers(url: &str, prefix: &str, n: usize) -> Vec<Fleet> {
    let mut fleets = Vec::new();
    for i in 0..n {
        let fleet = Fleet::builder(url)
            .prefix(prefix)
            .worker(format!("w{i}"))
            .timeout(Duration::from_millis(500))
            .sync_interval(Duration::from_millis(10))
            .build()
            .unwrap();
        assert!(
            fleet.wait_up(Duration::from_secs(5)).await,
            "Redis at {url} did not answer"
        );
        fleets.push(fleet);
    }
    fleets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_share_one_floor_exactly() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("floor");
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(10)).await;
    let fleets = workers(&url, &prefix, 8).await;
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for fleet in &fleets {
        // No deposits: only the floor, 10 retries a minute for the whole fleet.
        let budget = RetryBudget::builder()
            .retry_ratio(0.0)
            .floor(10, Duration::from_secs(60))
            .fleet(fleet, "outage")
            .build()
            .unwrap();
        let granted = granted.clone();
        tasks.push(tokio::spawn(async move {
            let end = Instant::now() + Duration::from_millis(1_500);
            while Instant::now() < end {
                if budget.try_withdraw(Duration::ZERO).is_ok() {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Eight processes with local budgets would have had 80.
    assert_eq!(granted.load(Ordering::Relaxed), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_from_one_worker_pay_for_retries_in_another_and_no_more() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("deposits");
    let fleets = workers(&url, &prefix, 2).await;
    let build = |fleet: &Fleet| {
        RetryBudget::builder()
            .retry_ratio(0.2)
            .floor(0, Duration::from_secs(60))
            .fleet(fleet, "ratio")
            .fleet_lease(1)
            .build()
            .unwrap()
    };
    let (earner, spender) = (build(&fleets[0]), build(&fleets[1]));
    // Nothing deposited yet: the spender has nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(spender.try_withdraw(Duration::ZERO).is_err());
    for _ in 0..50 {
        earner.deposit(); // 50 × 0.2 = 10 retries for the fleet
    }
    let mut spent = 0;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if spender.try_withdraw(Duration::ZERO).is_ok() {
            spent += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The earner holds a lease of one retry of its own: the spender gets the rest.
    assert_eq!(spent + earner.fleet_lease_held().round() as u64, 10);
    assert!(spent >= 8, "{spent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_path_asks_redis_for_each_retry() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("exact");
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(5)).await;
    let fleets = workers(&url, &prefix, 1).await;
    let budget = RetryBudget::builder()
        .retry_ratio(1.0)
        .floor(2, Duration::from_secs(60))
        .fleet(&fleets[0], "exact")
        .fleet_lease(0)
        .build()
        .unwrap();
    budget.deposit();
    budget.deposit();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut granted = 0;
    for _ in 0..10 {
        if budget.fleet_withdraw(Duration::ZERO).await.is_ok() {
            granted += 1;
        }
    }
    // Two from the balance, then the floor's two (the lease of 0 held the floor's use at most
    // one at a time, and the task's sync may hold one of them).
    assert!((3..=4).contains(&granted), "{granted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_quota_holds_four_workers_to_the_providers_rate() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("quota");
    let fleets = workers(&url, &prefix, 4).await;
    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let run_for = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for fleet in &fleets {
        let layer = FleetQuotaLayer::builder(fleet, "provider", |_: &u32| ("org", 1))
            .rate(Rate::builder().per_second(200).build().unwrap())
            .fallback(Rate::builder().per_second(50).build().unwrap())
            .build()
            .unwrap();
        let calls = calls.clone();
        let svc = layer.layer(tower::service_fn(move |_: u32| {
            let calls = calls.clone();
            async move {
                if start.elapsed() < run_for {
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, std::io::Error>(())
            }
        }));
        for _ in 0..4 {
            let mut svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < run_for {
                    svc.ready().await.unwrap().call(1).await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 200/s for 2 s: 400, and 1 at once (burst 1). Local quotas of 200 each would send 1,600.
    let sent = calls.load(Ordering::Relaxed) as f64;
    assert!((380.0..=420.0).contains(&sent), "{sent} calls in 2 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_fleet_quota_keeps_each_tenant_apart() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("tenants");
    let fleets = workers(&url, &prefix, 2).await;
    let layer = |fleet: &Fleet| {
        FleetQuotaLayer::builder(fleet, "tpm", |c: &(&'static str, u32)| (c.0, c.1))
            .rate(
                Rate::builder()
                    .per_second(1_000)
                    .burst(1_000)
                    .build()
                    .unwrap(),
            )
            .fallback(Rate::builder().per_second(500).burst(500).build().unwrap())
            .build()
            .unwrap()
    };
    let model =
        tower::service_fn(|c: (&'static str, u32)| async move { Ok::<_, std::io::Error>(c.1) });
    let a = layer(&fleets[0]).layer(model);
    let b = layer(&fleets[1]).layer(model);
    let start = Instant::now();
    // Tenant x spends its whole burst from one worker; tenant y is not held by it.
    a.clone().oneshot(("x", 1_000)).await.unwrap();
    b.clone().oneshot(("y", 1_000)).await.unwrap();
    // Two round trips to Redis; held by x's bucket, y would wait a whole second.
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    // Tenant x from the other worker waits for half a second of refill.
    b.clone().oneshot(("x", 500)).await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_millis(800),
        "{waited:?}"
    );
    // More than the burst can never go.
    let err = a.clone().oneshot(("x", 5_000)).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<ToolError>().unwrap().code(),
        ErrorCode::InvalidArgument
    );
}

fn failing() -> impl Service<
    (),
    Response = (),
    Error = std::io::Error,
    Future = std::future::Ready<Result<(), std::io::Error>>,
> + Clone {
    tower::service_fn(|()| {
        std::future::ready(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_workers_failures_open_every_workers_breaker() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("breaker");
    let fleets = workers(&url, &prefix, 4).await;
    let config = || {
        BreakerConfig::builder()
            .consecutive_failures(10)
            .open_duration(Duration::from_millis(300), Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (breakers, shared) = shared_breakers(&fleets, "payments", config);
    // Workers 0 and 1 each see 5 failures: neither breaker trips alone (10 in a row), the fleet's does.
    for b in &breakers[..2] {
        let mut svc = CircuitBreakerLayer::new(b.clone()).layer(failing());
        for _ in 0..5 {
            let _ = svc.ready().await.unwrap().call(()).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while breakers.iter().any(|b| b.state() == State::Closed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (i, b) in breakers.iter().enumerate() {
        assert_eq!(b.state(), State::Open, "worker {i}");
    }
    assert!(shared.iter().all(|s| s.fleet_open()));
    assert!(
        breakers[3].reason().contains("fleet"),
        "{}",
        breakers[3].reason()
    );

    // After the open time nobody holds the trial until a worker has a call to probe with.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(shared.iter().all(|s| !s.holds_trial()));
    // Worker 1 gets calls, for a dependency that has healed: turned away until its claim to the
    // trial lands, then its next call is the trial. While it holds the trial the others stay
    // shut, even under traffic.
    let healthy = tower::service_fn(|()| std::future::ready(Ok::<_, std::io::Error>(())));
    let mut one = CircuitBreakerLayer::new(breakers[1].clone()).layer(healthy);
    let mut two = CircuitBreakerLayer::new(breakers[2].clone()).layer(failing());
    let start = Instant::now();
    let mut saw_holder = false;
    loop {
        if shared[1].holds_trial() {
            saw_holder = true;
            for _ in 0..50 {
                let err = two.ready().await.unwrap().call(()).await.unwrap_err();
                assert_eq!(
                    err.downcast_ref::<ToolError>().unwrap().code(),
                    ErrorCode::CircuitOpen
                );
            }
        }
        match one.ready().await.unwrap().call(()).await {
            Ok(()) => break,
            Err(e) => assert_eq!(
                e.downcast_ref::<ToolError>().unwrap().code(),
                ErrorCode::CircuitOpen
            ),
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "worker 1 never got the trial"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(saw_holder);
    // Its trial succeeded: the fleet closes, and every worker's breaker with it.
    let deadline = Instant::now() + Duration::from_secs(2);
    while breakers.iter().any(|b| b.state() != State::Closed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (i, b) in breakers.iter().enumerate() {
        assert_eq!(b.state(), State::Closed, "worker {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_failing_dependency_does_not_open_the_fleets_breaker() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("half");
    let fleets = workers(&url, &prefix, 4).await;
    let (breakers, _shared) = shared_breakers(&fleets, "search", BreakerConfig::default);
    let n = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for b in &breakers {
        let n = n.clone();
        let half = tower::service_fn(move |()| {
            let i = n.fetch_add(1, Ordering::Relaxed);
            std::future::ready(if i % 2 == 0 {
                Ok(())
            } else {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
            })
        });
        let mut svc = CircuitBreakerLayer::new(b.clone()).layer(half);
        tasks.push(tokio::spawn(async move {
            for _ in 0..500 {
                let _ = svc.ready().await.unwrap().call(()).await;
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for b in &breakers {
        assert_eq!(b.opens(), 0, "{}", b.reason());
    }
}

/// A `redis-server` of the test's own on a free port (the fleet demo's), so it can be stopped
/// and started again; `None`, with the reason, where there is no `redis-server` to start.
#[path = "../examples/fleet/redis.rs"]
#[allow(dead_code)]
mod own_redis;

/// A fleet on the test's own Redis that notices within 50 ms when it goes, and pings every 20 ms.
async fn quick_fleet(redis: &own_redis::OwnRedis, test: &str) -> Fleet {
    let fleet = Fleet::builder(redis.url())
        .prefix(prefix(test))
        .timeout(Duration::from_millis(50))
        .sync_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    assert!(fleet.wait_up(Duration::from_secs(2)).await);
    fleet
}

/// Makes 20 calls through `svc`, one after another, and says how long the slowest took.
async fn slowest_of_20<S>(svc: &S) -> Duration
where
    S: Service<u32> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        svc.clone().oneshot(1).await.unwrap();
        slowest = slowest.max(t.elapsed());
    }
    slowest
}

/// Redis is back: the fleet answers through it again within a second.
async fn rejoins_within_a_second(fleet: &Fleet) {
    let back = Instant::now();
    assert!(
        fleet.wait_up(Duration::from_secs(2)).await,
        "did not rejoin"
    );
    let took = back.elapsed();
    assert!(took < Duration::from_secs(1), "rejoined after {took:?}");
}

fn own_redis() -> Option<own_redis::OwnRedis> {
    own_redis::OwnRedis::start()
        .map_err(|e| eprintln!("skipped: {e} (apt-get install redis-server)"))
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_falls_back_within_the_timeout_and_rejoins_when_it_returns() {
    let Some(mut redis) = own_redis() else {
        return;
    };
    let fleet = quick_fleet(&redis, "down").await;
    let layer = FleetQuotaLayer::builder(&fleet, "provider", |_: &u32| ("org", 1))
        .rate(Rate::builder().per_second(100).build().unwrap())
        .fallback(Rate::builder().per_second(50).build().unwrap())
        .build()
        .unwrap();
    let budget = RetryBudget::builder()
        .retry_ratio(0.0)
        .floor(3, Duration::from_secs(60))
        .fleet(&fleet, "b")
        .build()
        .unwrap();
    let svc = layer.layer(tower::service_fn(|_: u32| async {
        Ok::<_, std::io::Error>(())
    }));
    svc.clone().oneshot(1).await.unwrap();

    redis.stop();
    // Every call keeps being served: none waits longer than the timeout plus its quota slot.
    let down_at = Instant::now();
    let slowest = slowest_of_20(&svc).await;
    assert!(!fleet.is_up());
    assert!(
        slowest < Duration::from_millis(100),
        "a call waited {slowest:?} with Redis down"
    );
    // 20 calls at the fallback's 50/s: about 400 ms, not blocked.
    assert!(
        down_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        down_at.elapsed()
    );
    // The budget decides from its local floor (3), not from a lease it cannot refill.
    let local: usize = (0..10)
        .filter(|_| budget.try_withdraw(Duration::ZERO).is_ok())
        .count();
    assert!(local >= 3, "{local}");

    redis.restart().unwrap();
    rejoins_within_a_second(&fleet).await;
    // Through Redis again: the scripts were loaded anew into the restarted server.
    svc.clone().oneshot(1).await.unwrap();
    assert!(fleet.is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_starts_without_redis_decides_locally_and_joins_later() {
    let Some(mut redis) = own_redis() else {
        return;
    };
    redis.stop();
    let fleet = Fleet::builder(redis.url())
        .prefix(prefix("late"))
        .timeout(Duration::from_millis(50))
        .sync_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let breaker = Breaker::new(
        "dep",
        BreakerConfig::builder()
            .consecutive_failures(3)
            .build()
            .unwrap(),
    );
    let shared = fleet.share_breaker(&breaker).unwrap();
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(failing());
    // Local rules: three failures trip it.
    for _ in 0..3 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert_eq!(breaker.state(), State::Open);
    assert!(!shared.fleet_open());
    redis.restart().unwrap();
    assert!(fleet.wait_up(Duration::from_secs(2)).await);
    // Its trip, made while Redis was away, is published when it returns.
    let deadline = Instant::now() + Duration::from_secs(1);
    while !shared.fleet_open() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(shared.fleet_open());
}

#[test]
fn going_down_deciding_locally_and_coming_back_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let Some(mut redis) = own_redis() else { return };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = prefix("metrics");
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let fleet = Fleet::builder(redis.url())
                .prefix(prefix.as_str())
                .timeout(Duration::from_millis(50))
                .sync_interval(Duration::from_millis(20))
                .build()
                .unwrap();
            assert!(fleet.wait_up(Duration::from_secs(2)).await);
            let quota = FleetQuotaLayer::builder(&fleet, "q", |_: &u32| ("k", 1))
                .rate(Rate::builder().per_second(1_000).build().unwrap())
                .fallback(Rate::builder().per_second(1_000).build().unwrap())
                .build()
                .unwrap();
            let budget = RetryBudget::builder().fleet(&fleet, "b").build().unwrap();
            let svc = quota.layer(tower::service_fn(|_: u32| async {
                Ok::<_, std::io::Error>(())
            }));
            svc.clone().oneshot(1).await.unwrap();
            redis.stop();
            for _ in 0..3 {
                svc.clone().oneshot(1).await.unwrap();
            }
            assert!(!fleet.is_up());
            let _ = budget.try_withdraw(Duration::ZERO);
            redis.restart().unwrap();
            assert!(fleet.wait_up(Duration::from_secs(2)).await);
        })
    });
    let metrics = snapshotter.snapshot().into_vec();
    let find = |name: &str, label: (&str, &str)| {
        metrics.iter().find_map(|(key, _, _, value)| {
            let key = key.key();
            (key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == label.0 && l.value() == label.1))
            .then_some(value)
        })
    };
    let count = |name: &str, label| match find(name, label) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name} {label:?}: {other:?}"),
    };
    assert!(count("stormguard_fleet_local_decisions_total", ("part", "quota")) >= 3);
    assert!(count("stormguard_fleet_local_decisions_total", ("part", "budget")) >= 1);
    assert!(count("stormguard_fleet_transitions_total", ("to", "down")) >= 1);
    assert_eq!(count("stormguard_fleet_transitions_total", ("to", "up")), 2);
    let up = find("stormguard_fleet_up", ("fleet", prefix.as_str()));
    assert!(
        matches!(up, Some(DebugValue::Gauge(g)) if g.into_inner() == 1.0),
        "{up:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_holds_for_the_whole_fleet_leases_included() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("cap");
    let fleets = workers(&url, &prefix, 4).await;
    let budgets: Vec<_> = fleets
        .iter()
        .map(|f| {
            RetryBudget::builder()
                .retry_ratio(1.0)
                .max_balance(4)
                .floor(0, Duration::from_secs(60))
                .fleet(f, "pay")
                .build()
                .unwrap()
        })
        .collect();
    // Steady traffic: every worker deposits far more than the cap, leases fill up.
    for _ in 0..5 {
        for b in &budgets {
            for _ in 0..10 {
                b.deposit();
            }
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Then an outage: the fleet spends at most max_balance, leases and all.
    let mut spent = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        for b in &budgets {
            if b.try_withdraw(Duration::ZERO).is_ok() {
                spent += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(spent, 4, "the fleet spent {spent} with a cap of 4");
}

#[test]
fn a_dead_workers_lease_stops_counting_against_the_cap() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("dead");
    let budget = |fleet: &Fleet| {
        RetryBudget::builder()
            .retry_ratio(1.0)
            .max_balance(4)
            .floor(0, Duration::from_secs(60))
            .fleet(fleet, "pay")
            .fleet_lease(4)
            .build()
            .unwrap()
    };
    // Worker a takes the whole cap as its lease, then dies: its runtime is dropped with its
    // tasks, so nothing gives the lease back.
    let dying = tokio::runtime::Runtime::new().unwrap();
    dying.block_on(async {
        let fleet = &workers(&url, &prefix, 1).await[0];
        let a = budget(fleet);
        for _ in 0..4 {
            a.deposit();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while a.fleet_lease_held() < 4.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(a.fleet_lease_held(), 4.0);
        std::mem::forget(a);
    });
    drop(dying);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fleet = Fleet::builder(url.as_str())
            .prefix(prefix.as_str())
            .worker("b")
            .sync_interval(Duration::from_millis(10))
            .build()
            .unwrap();
        assert!(fleet.wait_up(Duration::from_secs(5)).await);
        let b = budget(&fleet);
        let deposit_and_wait = |b: &RetryBudget| {
            for _ in 0..4 {
                b.deposit();
            }
        };
        deposit_and_wait(&b);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // a's lease still counts: the cap is full.
        assert_eq!(b.fleet_lease_held(), 0.0);
        // After the lease TTL (10 s) a is taken for dead and the cap is free again.
        tokio::time::sleep(Duration::from_secs(10)).await;
        deposit_and_wait(&b);
        let deadline = Instant::now() + Duration::from_secs(2);
        while b.fleet_lease_held() < 4.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(b.fleet_lease_held(), 4.0);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_worker_does_not_keep_the_trial_from_the_others() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("quiet");
    let fleets = workers(&url, &prefix, 2).await;
    let config = || {
        BreakerConfig::builder()
            .consecutive_failures(3)
            .no_failure_rate()
            .build()
            .unwrap()
    };
    let (breakers, shared) = shared_breakers(&fleets, "dep", config);
    let mut failing = CircuitBreakerLayer::new(breakers[0].clone()).layer(failing());
    for _ in 0..3 {
        let _ = failing.ready().await.unwrap().call(()).await;
    }
    // Worker 0 tripped it and then goes quiet; worker 1, opened by the fleet, calls a
    // dependency that has healed.
    let deadline = Instant::now() + Duration::from_secs(1);
    while breakers[1].state() == State::Closed && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(breakers[1].state(), State::Open);
    let healthy = tower::service_fn(|()| std::future::ready(Ok::<_, std::io::Error>(())));
    let mut svc = CircuitBreakerLayer::new(breakers[1].clone()).layer(healthy);
    let start = Instant::now();
    while breakers[1].state() != State::Closed && start.elapsed() < Duration::from_secs(15) {
        let _ = svc.ready().await.unwrap().call(()).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Probing starts after the shortest open time (250 ms by default) and 25 calls turned away.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "closed after {:?}",
        start.elapsed()
    );
    assert!(!shared[0].holds_trial());
    // And the quiet worker's breaker follows the fleet's.
    let deadline = Instant::now() + Duration::from_secs(1);
    while breakers[0].state() != State::Closed && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(breakers[0].state(), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quotas_whose_name_and_key_join_alike_share_no_bucket() {
    let Some(url) = redis_url() else { return };
    let fleet = &workers(&url, &prefix("join"), 1).await[0];
    let one_a_minute = Rate::builder().per_minute(1).build().unwrap();
    let quota = |name: &'static str, key: &'static str| {
        FleetQuotaLayer::builder(fleet, name, move |_: &u32| (key, 1))
            .rate(one_a_minute)
            .fallback(one_a_minute)
            .build()
            .unwrap()
            .layer(tower::service_fn(|_: u32| async {
                Ok::<_, std::io::Error>(())
            }))
    };
    quota("a", "b:c").oneshot(1).await.unwrap();
    let other = tokio::time::timeout(Duration::from_secs(1), quota("a:b", "c").oneshot(1)).await;
    assert!(
        other.is_ok(),
        "the second quota waited on the first one's bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_fleet_budget_grants_nothing_on_a_guess_and_is_ready_after_one_sync() {
    let Some(url) = redis_url() else { return };
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(10)).await;
    let fleets = workers(&url, &prefix("new"), 8).await;
    let budgets: Vec<_> = fleets
        .iter()
        .map(|f| {
            RetryBudget::builder()
                .floor(2, Duration::from_secs(60))
                .fleet(f, "pay")
                .build()
                .unwrap()
        })
        .collect();
    // At once, before any sync: no lease yet, and no local floor taken on a guess.
    assert!(budgets
        .iter()
        .all(|b| b.try_withdraw(Duration::ZERO).is_err()));
    for b in &budgets {
        assert!(b.fleet_ready(Duration::from_secs(2)).await);
    }
    // Then the fleet's floor of 2, not 2 per worker.
    let mut granted = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        granted += budgets
            .iter()
            .filter(|b| b.try_withdraw(Duration::ZERO).is_ok())
            .count();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(granted, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_redis_costs_each_call_at_most_the_timeout_and_the_fleet_rejoins() {
    let Some(redis) = own_redis() else { return };
    let fleet = quick_fleet(&redis, "frozen").await;
    let quota = FleetQuotaLayer::builder(&fleet, "provider", |_: &u32| ("org", 1))
        .rate(Rate::builder().per_second(1_000).build().unwrap())
        .fallback(Rate::builder().per_second(1_000).build().unwrap())
        .build()
        .unwrap();
    let breaker = Breaker::new(
        "dep",
        BreakerConfig::builder()
            .consecutive_failures(3)
            .build()
            .unwrap(),
    );
    fleet.share_breaker(&breaker).unwrap();
    let svc = quota.layer(tower::service_fn(|_: u32| async {
        Ok::<_, std::io::Error>(())
    }));
    svc.clone().oneshot(1).await.unwrap();

    // The server stops answering: connections stay open, nothing comes back.
    redis.freeze();
    let slowest = slowest_of_20(&svc).await;
    assert!(!fleet.is_up());
    assert!(
        slowest < Duration::from_millis(150),
        "a call waited {slowest:?}"
    );
    // The breaker follows its own rules meanwhile: three failures trip it.
    let mut failing = CircuitBreakerLayer::new(breaker.clone()).layer(failing());
    for _ in 0..3 {
        let _ = failing.ready().await.unwrap().call(()).await;
    }
    assert_eq!(breaker.state(), State::Open);

    redis.thaw();
    rejoins_within_a_second(&fleet).await;
    svc.clone().oneshot(1).await.unwrap();
    assert!(fleet.is_up());
}
