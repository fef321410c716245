//! The fleet's budget, quota and breaker against the real Redis (feature `redis`).
//!
//! These tests use the Redis at `STORMGUARD_REDIS_URL` (CI starts one on 127.0.0.1:6379 and sets
//! it); without it they print that they were skipped. What happens when Redis stops, stalls,
//! fills up or is not there yet is in `tests/fleet_outages.rs`, on a Redis of its own. Every test
//! uses a prefix of its own: nothing it writes is seen by another.
//!
//! No test depends on how busy the machine is: the fleets' timeout is 5 s (a loaded box never
//! takes a fleet down by accident, and a fleet that went down fails the counts that need it up,
//! saying so), waits are for a state with a generous deadline, never a fixed sleep before a count,
//! and what is asserted is a count or a bound orders of magnitude from the wrong answer.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::breaker::{BreakerConfig, CircuitBreakerLayer, State};
use stormguard::budget::RetryBudget;
use stormguard::error::{ErrorCode, ToolError};
use stormguard::fleet::{Fleet, FleetQuotaLayer};
use stormguard::quota::Rate;
use support::fleet::*;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// `n` workers: each its own `Fleet` (its own connection and name), as separate processes have.
async fn workers(url: &str, prefix: &str, n: usize) -> Vec<Fleet> {
    let mut fleets = Vec::new();
    for i in 0..n {
        let fleet = Fleet::builder(url)
            .prefix(prefix)
            .worker(format!("w{i}"))
            .timeout(Duration::from_secs(5))
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

/// The fleets stayed up: the counts that need Redis's decisions had them.
fn stayed_up(fleets: &[Fleet]) {
    for f in fleets {
        assert_eq!(
            f.times_down(),
            0,
            "{} went down: the count is void",
            f.worker()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_share_one_floor_exactly() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("floor");
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(25)).await;
    let fleets = workers(&url, &prefix, 8).await;
    let granted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for fleet in &fleets {
        // No deposits: only the floor, 10 retries a minute for the whole fleet.
        let budget = RetryBudget::builder()
            .retry_ratio(0.0)
            .floor(10, Duration::from_secs(60))
            .fleet(fleet, "outage")
            .build()
            .unwrap();
        let (granted, stop) = (granted.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if budget.try_withdraw(Duration::ZERO).is_ok() {
                    granted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    // Until the floor is spent (however slow the box), then a while more for any extra.
    eventually(Duration::from_secs(15), || {
        granted.load(Ordering::Relaxed) >= 10
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    stayed_up(&fleets);
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
    let end = Instant::now() + Duration::from_secs(15);
    while spent + (earner.fleet_lease_held().round() as u64) < 10 && Instant::now() < end {
        if spender.try_withdraw(Duration::ZERO).is_ok() {
            spent += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // And a while more: nothing beyond the deposits.
    let more = Instant::now() + Duration::from_millis(300);
    while Instant::now() < more {
        if spender.try_withdraw(Duration::ZERO).is_ok() {
            spent += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stayed_up(&fleets);
    // The earner holds a lease of one retry of its own: the spender gets the rest.
    assert_eq!(spent + earner.fleet_lease_held().round() as u64, 10);
    assert!(spent >= 8, "{spent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_path_asks_redis_for_each_retry() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("exact");
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(15)).await;
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
    // The two deposits reach the fleet's balance (the lease of 0 holds none of them).
    let mut balance = 0.0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance < 2.0 && Instant::now() < deadline {
        balance = budget.fleet_status().await.unwrap().balance;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(balance, 2.0);
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
        let layer = FleetQuotaLayer::builder(
            fleet,
            "provider",
            Rate::per_second(200).build().unwrap(),
            Rate::per_second(50).build().unwrap(),
            |_: &u32| ("org", 1),
        )
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
    stayed_up(&fleets);
    // 200/s for 2 s: 400, and 1 at once (burst 1). Local quotas of 200 each would send 1,600.
    // The upper bound is the promise; the lower one only says the quota is not starving the
    // fleet (a box too busy to make 200 calls a second sends fewer, not more).
    let sent = calls.load(Ordering::Relaxed) as f64;
    assert!((300.0..=420.0).contains(&sent), "{sent} calls in 2 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_fleet_quota_keeps_each_tenant_apart() {
    let Some(url) = redis_url() else { return };
    let prefix = prefix("tenants");
    let fleets = workers(&url, &prefix, 2).await;
    // A burst of 1,000 refilled at 10 a second: 500 units of a spent bucket take 50 s, so "held
    // by the bucket" and "not held" are a minute apart, whatever the box's load.
    let layer = |fleet: &Fleet| {
        FleetQuotaLayer::builder(
            fleet,
            "tpm",
            Rate::per_second(10).burst(1_000).build().unwrap(),
            Rate::per_second(5).burst(500).build().unwrap(),
            |c: &(&'static str, u32)| (c.0, c.1),
        )
        .build()
        .unwrap()
    };
    let model =
        tower::service_fn(|c: (&'static str, u32)| async move { Ok::<_, std::io::Error>(c.1) });
    let a = layer(&fleets[0]).layer(model);
    let b = layer(&fleets[1]).layer(model);
    let soon = Duration::from_secs(10);
    // Tenant x spends its whole burst from one worker; tenant y is not held by it.
    tokio::time::timeout(soon, a.clone().oneshot(("x", 1_000)))
        .await
        .expect("x's first burst goes at once")
        .unwrap();
    tokio::time::timeout(soon, b.clone().oneshot(("y", 1_000)))
        .await
        .expect("y is held by x's bucket")
        .unwrap();
    // Tenant x from the other worker waits for x's refill (50 s): one bucket for the fleet.
    let x_again = tokio::time::timeout(Duration::from_secs(3), b.clone().oneshot(("x", 500))).await;
    assert!(x_again.is_err(), "the other worker spent x's burst again");
    // More than the burst can never go.
    let err = a.clone().oneshot(("x", 5_000)).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<ToolError>().unwrap().code(),
        ErrorCode::InvalidArgument
    );
    stayed_up(&fleets);
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
    let deadline = Instant::now() + Duration::from_secs(10);
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
            start.elapsed() < Duration::from_secs(10),
            "worker 1 never got the trial"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(saw_holder);
    // Its trial succeeded: the fleet closes, and every worker's breaker with it.
    let deadline = Instant::now() + Duration::from_secs(10);
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
    let mut tasks = Vec::new();
    for b in &breakers {
        // Each worker's calls alternate, success then failure, whatever the scheduling: half the
        // fleet's calls fail, never two of a worker's in a row. (One counter shared by the four
        // tasks let a busy box run two of them in lockstep, one taking every failure: its own
        // breaker then tripped, rightly, on 20 in a row.)
        let n = Arc::new(AtomicU64::new(0));
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
    // Until Redis holds the cap, balance and leases together, and never more.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = budgets[0].fleet_status().await.unwrap();
        let held = status.balance + status.leased;
        assert!(held <= 4.0, "{status:?}");
        if held == 4.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deposits never filled the cap: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Then an outage: the fleet spends at most max_balance, leases and all.
    let mut spent = 0;
    let mut more = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while more.is_none_or(|end| Instant::now() < end) && Instant::now() < deadline {
        for b in &budgets {
            if b.try_withdraw(Duration::ZERO).is_ok() {
                spent += 1;
            }
        }
        if spent >= 4 && more.is_none() {
            // A while more, for anything beyond the cap.
            more = Some(Instant::now() + Duration::from_millis(300));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stayed_up(&fleets);
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
        let deadline = Instant::now() + Duration::from_secs(10);
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
        let deadline = Instant::now() + Duration::from_secs(10);
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
    let deadline = Instant::now() + Duration::from_secs(10);
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
    // Probing starts after the shortest open time (250 ms by default) and 25 calls turned away;
    // a quiet holder would keep the trial for its whole timeout (10 s by default).
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "closed after {:?}",
        start.elapsed()
    );
    assert!(!shared[0].holds_trial());
    // And the quiet worker's breaker follows the fleet's.
    let deadline = Instant::now() + Duration::from_secs(10);
    while breakers[0].state() != State::Closed && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(breakers[0].state(), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quotas_whose_name_and_key_join_alike_share_no_bucket() {
    let Some(url) = redis_url() else { return };
    let fleet = &workers(&url, &prefix("join"), 1).await[0];
    let one_a_minute = Rate::per_minute(1).build().unwrap();
    let quota = |name: &'static str, key: &'static str| {
        FleetQuotaLayer::builder(fleet, name, one_a_minute, one_a_minute, move |_: &u32| {
            (key, 1)
        })
        .build()
        .unwrap()
        .layer(tower::service_fn(|_: u32| async {
            Ok::<_, std::io::Error>(())
        }))
    };
    quota("a", "b:c").oneshot(1).await.unwrap();
    // Held by the first one's bucket, it would wait a minute.
    let other = tokio::time::timeout(Duration::from_secs(10), quota("a:b", "c").oneshot(1)).await;
    assert!(
        other.is_ok(),
        "the second quota waited on the first one's bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_reads_balance_leases_workers_floor_and_breakers() {
    let Some(url) = redis_url() else { return };
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(20)).await;
    let fleets = workers(&url, &prefix("status"), 2).await;
    let budgets: Vec<_> = fleets
        .iter()
        .map(|f| {
            RetryBudget::builder()
                .retry_ratio(1.0)
                .max_balance(50)
                .floor(3, Duration::from_secs(60))
                .fleet(f, "pay")
                .fleet_lease(2)
                .build()
                .unwrap()
        })
        .collect();
    for _ in 0..10 {
        budgets[0].deposit();
    }
    // Ten deposits: each worker leases 2, 6 stay in the balance; each holds a floor use.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let s = budgets[1].fleet_status().await.unwrap();
        if s.balance == 6.0 && s.leases.len() == 2 && s.floor_used == 2 {
            break s;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status.name, "pay");
    assert_eq!(status.leased, 4.0);
    assert_eq!(
        status.leases.into_iter().collect::<Vec<_>>(),
        [("w0".to_string(), 2.0), ("w1".to_string(), 2.0)]
    );
    assert_eq!(status.live_workers, ["w0", "w1"]);
    assert_eq!((status.floor, status.max_balance), (3, 50.0));
    assert!(status.floor_window_left <= Duration::from_secs(60));
    // A breaker opened by one worker's failures reads as open, with no trial held yet.
    let config = || {
        BreakerConfig::builder()
            .consecutive_failures(3)
            .open_duration(Duration::from_secs(30), Duration::from_secs(60))
            .no_failure_rate()
            .build()
            .unwrap()
    };
    let (breakers, shared) = shared_breakers(&fleets, "dep", config);
    let mut svc = CircuitBreakerLayer::new(breakers[0].clone()).layer(failing());
    for _ in 0..3 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert!(eventually(Duration::from_secs(10), || shared[1].fleet_open()).await);
    let all = fleets[1].status().await.unwrap();
    assert_eq!(
        (all.worker.as_str(), all.up, all.times_down),
        ("w1", true, 0)
    );
    assert_eq!(all.budgets.len(), 1);
    let [dep] = &all.breakers[..] else {
        panic!("{:?}", all.breakers)
    };
    assert_eq!(
        (dep.name.as_str(), dep.state, dep.opens),
        ("dep", State::Open, 1)
    );
    assert_eq!(
        (dep.failures_in_a_row, dep.trial_holder.as_deref()),
        (0, None)
    );
    assert!(dep.trial_in > Duration::from_secs(20) && dep.trial_in <= Duration::from_secs(30));
    // A name nobody shares reads as nothing at all.
    let none = fleets[0].breaker_status("nobody").await.unwrap();
    assert_eq!((none.state, none.opens), (State::Closed, 0));
}

/// A key borrowed for `'static` (`("org", 1)`) in services a spawned task holds, plain and behind
/// a `Buffer`: this test is their compile check (issue 20, 16a: "one type is more general than
/// the other"). Nothing listens on port 1: the calls go by the fallback, no Redis needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_quota_with_a_static_str_key_runs_inside_tokio_spawn() {
    let fleet = Fleet::builder("redis://127.0.0.1:1/")
        .timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let served = tokio::spawn(async move {
        let layer = FleetQuotaLayer::builder(
            &fleet,
            "api",
            Rate::per_second(100).build().unwrap(),
            Rate::per_second(100).build().unwrap(),
            |_: &String| ("org", 1u32),
        )
        .build()
        .unwrap();
        let echo = tower::service_fn(|s: String| async move { Ok::<_, std::io::Error>(s) });
        let plain = layer
            .layer(echo)
            .oneshot("plain".to_string())
            .await
            .unwrap();
        let buffered = tower::buffer::Buffer::new(layer.layer(echo), 8);
        let through = buffered.oneshot("buffered".to_string()).await.unwrap();
        (plain, through)
    });
    assert_eq!(
        served.await.unwrap(),
        ("plain".to_string(), "buffered".to_string())
    );
}
