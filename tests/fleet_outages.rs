//! The fleet when its Redis misbehaves: stopped, frozen, slow, full, or not there yet (feature
//! `redis`). Each test starts a `redis-server` of its own on a free port (so it can do that to it)
//! and says so when the binary is missing.

mod support;

use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
use stormguard::budget::RetryBudget;
use stormguard::fleet::{Fleet, FleetQuotaLayer};
use stormguard::quota::Rate;
use support::fleet::*;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// A fleet on the test's own Redis that notices within 50 ms when it goes, and probes every 20
/// ms (backing off to 200 ms) while it is down.
async fn quick_fleet(redis: &own::OwnRedis, test: &str) -> Fleet {
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

/// Redis is back: the fleet decides through it again, soon (100 ms or so; 5 s on a busy box).
async fn rejoins(fleet: &Fleet) {
    let back = Instant::now();
    assert!(
        fleet.wait_up(Duration::from_secs(10)).await,
        "did not rejoin"
    );
    let took = back.elapsed();
    assert!(took < Duration::from_secs(5), "rejoined after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_sync_that_times_out_on_a_slow_redis_is_applied_once() {
    let Some(redis) = own_redis() else { return };
    let prefix = prefix("slow-budget");
    let fleet = Fleet::builder(redis.url())
        .prefix(prefix.as_str())
        .timeout(Duration::from_millis(100))
        .sync_interval(Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(fleet.wait_up(Duration::from_secs(5)).await);
    let budget = RetryBudget::builder()
        .retry_ratio(1.0)
        .floor(0, Duration::from_secs(60))
        .fleet(&fleet, "pay")
        .fleet_lease(0)
        .build()
        .unwrap();
    assert!(budget.fleet_ready(Duration::from_secs(5)).await);
    // Redis stalls for a second; the sync of 10 successes goes in, and times out.
    slow_down(&redis.url(), 1.0).await;
    for _ in 0..10 {
        budget.deposit();
    }
    // A refused retry wakes the sync at once (the lease of 0 holds nothing).
    assert!(budget.try_withdraw(Duration::ZERO).is_err() || !fleet.is_up());
    assert!(
        eventually(Duration::from_secs(5), || fleet.times_down() >= 1).await,
        "the sync never timed out"
    );
    // Redis wakes and runs the late sync; the fleet comes back and syncs again.
    assert!(
        fleet.wait_up(Duration::from_secs(10)).await,
        "did not rejoin"
    );
    let balance = || async { budget.fleet_status().await.unwrap().balance };
    let deadline = Instant::now() + Duration::from_secs(10);
    while balance().await < 10.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give a second application every chance to land.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // 10 successes at a ratio of 1.0: 10 retries, not 20.
    assert_eq!(balance().await, 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_sync_that_times_out_on_a_slow_redis_is_counted_once() {
    let Some(redis) = own_redis() else { return };
    let prefix = prefix("slow-breaker");
    // A long interval: no periodic sync comes between the stall and the failures.
    let fleet = Fleet::builder(redis.url())
        .prefix(prefix.as_str())
        .timeout(Duration::from_millis(100))
        .sync_interval(Duration::from_secs(2))
        .build()
        .unwrap();
    assert!(fleet.wait_up(Duration::from_secs(5)).await);
    let config = BreakerConfig::builder()
        .consecutive_failures(5)
        .no_failure_rate()
        .build()
        .unwrap();
    let breaker = Breaker::new("dep", config);
    let shared = fleet.share_breaker(&breaker).unwrap();
    // Its first sync (which loads the script: a script Redis does not know yet fails with
    // NOSCRIPT instead of running late), then the stall, well before the next periodic sync. A raw
    // read: the status cannot tell "never synced" from "synced, all zero".
    let mut conn = connection(&redis.url()).await;
    let key = format!("{prefix}:breaker:3:dep");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis::cmd("EXISTS")
        .arg(&key)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "the breaker never synced");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    slow_down(&redis.url(), 1.0).await;
    // Three failures: the first wakes the sync, whose batch times out and runs late.
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(failing());
    for _ in 0..3 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert!(
        eventually(Duration::from_secs(5), || fleet.times_down() >= 1).await,
        "the sync never timed out"
    );
    assert!(
        fleet.wait_up(Duration::from_secs(15)).await,
        "did not rejoin"
    );
    let run = || async { shared.status().await.unwrap().failures_in_a_row };
    let deadline = Instant::now() + Duration::from_secs(10);
    while run().await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Give a second count every chance to land (a sync every 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Three failures in a row, fleet-wide: not four or more, and no trip at five.
    let status = shared.status().await.unwrap();
    assert_eq!((status.failures_in_a_row, status.state), (3, State::Closed));
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_without_lease_or_floor_is_ready_after_its_first_sync() {
    let Some(redis) = own_redis() else { return };
    let fleet = Fleet::builder(redis.url())
        .prefix(prefix("ready"))
        .build()
        .unwrap();
    assert!(fleet.wait_up(Duration::from_secs(5)).await);
    let budget = RetryBudget::builder()
        .floor(0, Duration::from_secs(60))
        .fleet(&fleet, "pay")
        .fleet_lease(0)
        .build()
        .unwrap();
    // Its first sync has nothing to ask for, but it goes, and the budget is ready (a heartbeat
    // two seconds later would be too late).
    assert!(budget.fleet_ready(Duration::from_millis(1_500)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_fleet_budget_grants_nothing_on_a_guess_and_is_ready_after_one_sync() {
    let Some(redis) = own_redis() else { return };
    let url = redis.url();
    clear_of_a_window_turn(&url, Duration::from_secs(60), Duration::from_secs(30)).await;
    let prefix = prefix("new");
    let mut fleets = Vec::new();
    for i in 0..8 {
        // A timeout longer than the freeze below: the fleets stay up through it.
        let fleet = Fleet::builder(url.as_str())
            .prefix(prefix.as_str())
            .worker(format!("w{i}"))
            .timeout(Duration::from_secs(10))
            .sync_interval(Duration::from_millis(10))
            .build()
            .unwrap();
        assert!(fleet.wait_up(Duration::from_secs(5)).await);
        fleets.push(fleet);
    }
    // Redis stops answering while the budgets are built: their first syncs go out and cannot
    // be answered, however long this thread is kept from running. (Against a Redis that answers,
    // "before any sync" lasts one round trip: a test thread preempted for 5 ms between building
    // and asking found the first syncs answered, and failed.)
    redis.freeze();
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    // No lease yet, and no local floor taken on a guess.
    assert!(
        fleets.iter().all(Fleet::is_up),
        "a fleet fell: the check is void"
    );
    assert!(budgets
        .iter()
        .all(|b| b.try_withdraw(Duration::ZERO).is_err()));
    redis.thaw();
    for b in &budgets {
        assert!(b.fleet_ready(Duration::from_secs(10)).await);
    }
    // Then the fleet's floor of 2, not 2 per worker: until both are taken, and a while more.
    let mut granted = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut more = None;
    while more.is_none_or(|end| Instant::now() < end) && Instant::now() < deadline {
        granted += budgets
            .iter()
            .filter(|b| b.try_withdraw(Duration::ZERO).is_ok())
            .count();
        if granted >= 2 && more.is_none() {
            more = Some(Instant::now() + Duration::from_millis(500));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        fleets.iter().all(|f| f.times_down() == 0),
        "a fleet fell: the count is void"
    );
    assert_eq!(granted, 2);
}

/// Counts the `WARN` events of the fleet (the subscriber of one thread: run on a current-thread
/// runtime).
#[derive(Clone, Default)]
struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    fn count(&self) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).to_string();
        text.lines()
            .filter(|l| l.contains("WARN") && l.contains("fleet"))
            .count()
    }
}

#[test]
fn a_full_redis_is_one_outage_not_a_flapping_fleet() {
    let Some(redis) = own_redis() else { return };
    let warnings = Warnings::default();
    let sink = warnings.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let fleet = Fleet::builder(redis.url())
                .prefix(prefix("full"))
                .timeout(Duration::from_millis(200))
                .sync_interval(Duration::from_millis(20))
                .build()
                .unwrap();
            assert!(fleet.wait_up(Duration::from_secs(5)).await);
            let budget = RetryBudget::builder().fleet(&fleet, "pay").build().unwrap();
            assert!(budget.fleet_ready(Duration::from_secs(5)).await);
            let breaker = Breaker::new("dep", BreakerConfig::default());
            let _shared = fleet.share_breaker(&breaker).unwrap();
            // Up and settled, then Redis is full: `maxmemory` below what it holds, `noeviction`.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut admin = connection(&redis.url()).await;
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("noeviction")
                .query_async(&mut admin)
                .await
                .unwrap();
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(1)
                .query_async(&mut admin)
                .await
                .unwrap();
            // Two seconds of work: deposits to sync, a breaker syncing every 20 ms.
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(2) {
                budget.deposit();
                let _ = budget.try_withdraw(Duration::ZERO);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(!fleet.is_up(), "up on a Redis that takes no write");
            assert_eq!(fleet.times_down(), 1, "the fleet flapped");
            // An operator can still read it: the status scripts write nothing.
            let status = fleet.status().await.expect("a status read on a full Redis");
            assert!(!status.up);
            assert_eq!(status.budgets[0].name, "pay");
            // Room again: the fleet comes back.
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(0)
                .query_async(&mut admin)
                .await
                .unwrap();
            assert!(
                fleet.wait_up(Duration::from_secs(5)).await,
                "did not rejoin"
            );
        })
    });
    assert_eq!(warnings.count(), 1, "one WARN per outage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_falls_back_within_the_timeout_and_rejoins_when_it_returns() {
    let Some(mut redis) = own_redis() else {
        return;
    };
    let fleet = quick_fleet(&redis, "down").await;
    let layer = FleetQuotaLayer::builder(
        &fleet,
        "provider",
        Rate::per_second(100).build().unwrap(),
        Rate::per_second(50).build().unwrap(),
        |_: &u32| ("org", 1),
    )
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
    // (Bounds ten times what they take, so a busy box does not fail them: without the
    // fallback a call would wait on Redis without end.)
    assert!(
        slowest < Duration::from_secs(1),
        "a call waited {slowest:?} with Redis down"
    );
    // 20 calls at the fallback's 50/s: about 400 ms, not blocked.
    assert!(
        down_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        down_at.elapsed()
    );
    // The budget decides from its local floor (3), not from a lease it cannot refill.
    let local: usize = (0..10)
        .filter(|_| budget.try_withdraw(Duration::ZERO).is_ok())
        .count();
    assert!(local >= 3, "{local}");

    redis.restart().unwrap();
    rejoins(&fleet).await;
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
    assert!(fleet.wait_up(Duration::from_secs(10)).await);
    // Its trip, made while Redis was away, is published when it returns.
    let deadline = Instant::now() + Duration::from_secs(10);
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
            // A stopped Redis refuses connections at once: the timeout need not be short, and a
            // long one keeps a busy box from adding a fall (and a rise) of its own.
            let fleet = Fleet::builder(redis.url())
                .prefix(prefix.as_str())
                .timeout(Duration::from_secs(5))
                .sync_interval(Duration::from_millis(20))
                .build()
                .unwrap();
            assert!(fleet.wait_up(Duration::from_secs(2)).await);
            let quota = FleetQuotaLayer::builder(
                &fleet,
                "q",
                Rate::per_second(1_000).build().unwrap(),
                Rate::per_second(1_000).build().unwrap(),
                |_: &u32| ("k", 1),
            )
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
            assert!(fleet.wait_up(Duration::from_secs(10)).await);
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
async fn a_partitioned_redis_costs_each_call_at_most_the_timeout_and_the_fleet_rejoins() {
    let Some(redis) = own_redis() else { return };
    let fleet = quick_fleet(&redis, "frozen").await;
    let quota = FleetQuotaLayer::builder(
        &fleet,
        "provider",
        Rate::per_second(1_000).build().unwrap(),
        Rate::per_second(1_000).build().unwrap(),
        |_: &u32| ("org", 1),
    )
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
    // The timeout is 50 ms; a second, so a busy box does not fail it (without the timeout a
    // call would wait for the partition to end).
    assert!(
        slowest < Duration::from_secs(1),
        "a call waited {slowest:?}"
    );
    // The breaker follows its own rules meanwhile: three failures trip it.
    let mut failing = CircuitBreakerLayer::new(breaker.clone()).layer(failing());
    for _ in 0..3 {
        let _ = failing.ready().await.unwrap().call(()).await;
    }
    assert_eq!(breaker.state(), State::Open);

    redis.thaw();
    rejoins(&fleet).await;
    svc.clone().oneshot(1).await.unwrap();
    assert!(fleet.is_up());
}
