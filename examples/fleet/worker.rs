//! One worker process of the fleet demo: runs one scenario in one mode and prints one JSON line
//! of what it saw. The dependency is in the worker (a service that counts its calls), so the
//! counts are exact; only Redis is shared.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::fleet::{Fleet, FleetQuotaLayer};
use stormguard::quota::{QuotaLayer, Rate};
use stormguard::retry::RetryLayer;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// What the parent tells a worker.
pub struct Job {
    pub scenario: String,
    pub fleet: bool,
    pub redis: String,
    pub index: usize,
    pub workers: usize,
    /// When to start, in Unix milliseconds (all workers start together).
    pub start_at: u64,
}

/// The scenarios' settings, shared with the parent's report.
pub const OUTAGE_OPS_PER_S: u64 = 2;
pub const OUTAGE_SECS: u64 = 10;
pub const QUOTA_PER_S: u32 = 200;
pub const QUOTA_SECS: u64 = 5;
pub const BREAKER_CALLS_PER_S: u64 = 20;
pub const BREAKER_SECS: u64 = 3;
pub const DOWN_SECS: u64 = 6;
pub const DOWN_AT_MS: u64 = 2_000;
pub const UP_AT_MS: u64 = 4_000;
/// The breaker's trip threshold: the default config's 20 failures in a row.
pub const TRIP_THRESHOLD: u32 = 20;

pub async fn run(job: Job) -> Value {
    let now_ms = unix_ms();
    if job.start_at > now_ms {
        tokio::time::sleep(Duration::from_millis(job.start_at - now_ms)).await;
    }
    let fleet = Fleet::builder(job.redis.as_str())
        .prefix(format!("stormguard-fleet-demo:{}", job.start_at))
        .worker(format!("worker-{}", job.index))
        .build()
        .expect("valid fleet settings");
    if job.fleet && !fleet.wait_up(Duration::from_secs(2)).await {
        eprintln!(
            "worker {}: Redis did not answer within 2 s; deciding locally",
            job.index
        );
    }
    let mut line = match job.scenario.as_str() {
        "outage" => outage(&job, &fleet).await,
        "quota" => quota(&job, &fleet).await,
        "breaker" => breaker(&job, &fleet).await,
        "redis-down" => redis_down(&job, &fleet).await,
        other => json!({ "error": format!("no scenario {other}") }),
    };
    line["index"] = json!(job.index);
    line["times_down"] = json!(fleet.times_down());
    line
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A dependency in full outage that counts its calls: every call is refused (not sent, so a
/// retry is allowed for any class).
fn down(
    calls: Arc<AtomicU64>,
) -> impl Service<
    u64,
    Response = (),
    Error = std::io::Error,
    Future = std::future::Ready<Result<(), std::io::Error>>,
> + Clone {
    tower::service_fn(move |_: u64| {
        calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Err(std::io::ErrorKind::ConnectionRefused.into()))
    })
}

/// `outage`: two operations a second for ten seconds into a dependency that is down, each with
/// up to 3 attempts, paid from the retry budget (default settings: a floor of 10 retries a
/// minute, nothing deposited since nothing succeeds).
async fn outage(job: &Job, fleet: &Fleet) -> Value {
    let budget = if job.fleet {
        RetryBudget::builder()
            .fleet(fleet, "outage")
            .build()
            .expect("valid budget")
    } else {
        RetryBudget::default()
    };
    // Its first lease, so the fleet's budget is not refusing for want of a sync.
    budget.fleet_ready(Duration::from_secs(2)).await;
    let calls = Arc::new(AtomicU64::new(0));
    let svc = RetryLayer::new(ToolClass::Read, budget).layer(down(calls.clone()));
    let ops = OUTAGE_OPS_PER_S * OUTAGE_SECS;
    let mut every = tokio::time::interval(Duration::from_millis(1_000 / OUTAGE_OPS_PER_S));
    let mut tasks = Vec::new();
    for op in 0..ops {
        every.tick().await;
        tasks.push(tokio::spawn(svc.clone().oneshot(op)));
    }
    for t in tasks {
        let _ = t.await;
    }
    json!({ "ops": ops, "calls": calls.load(Ordering::Relaxed) })
}

/// `quota`: four callers in the worker as fast as the quota lets them for five seconds. Local:
/// each worker holds the provider's limit (what a per-process quota does); fleet: the fleet holds
/// it, each worker falling back to its share.
async fn quota(job: &Job, fleet: &Fleet) -> Value {
    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let (from, to) = (Duration::from_secs(1), Duration::from_secs(QUOTA_SECS));
    let counted = {
        let calls = calls.clone();
        tower::service_fn(move |_: u64| {
            let at = start.elapsed();
            if at >= from && at < to {
                calls.fetch_add(1, Ordering::Relaxed);
            }
            std::future::ready(Ok::<_, std::io::Error>(()))
        })
    };
    // Local: each worker holds the provider's whole limit, as a per-process quota does.
    quota_load(job, fleet, "provider", QUOTA_PER_S, counted, start, to).await;
    json!({ "window_s": (to - from).as_secs_f64(), "calls": calls.load(Ordering::Relaxed) })
}

/// Four callers through a quota of `QUOTA_PER_S` for the fleet (falling back to each worker's
/// share) or, in local mode, `local_rate` per worker, until `end` after `start`.
async fn quota_load<S>(
    job: &Job,
    fleet: &Fleet,
    name: &'static str,
    local_rate: u32,
    svc: S,
    start: Instant,
    end: Duration,
) where
    S: Service<u64> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<stormguard::error::BoxError> + std::fmt::Debug,
{
    let rate = |n: u32| Rate::per_second(n.max(1)).build().expect("valid rate");
    if job.fleet {
        let layer = FleetQuotaLayer::builder(
            fleet,
            name,
            rate(QUOTA_PER_S),
            rate(QUOTA_PER_S / job.workers as u32),
            |_: &u64| ("org", 1),
        )
        .build()
        .expect("valid quota");
        callers(layer.layer(svc), start, end).await;
    } else {
        callers(QuotaLayer::new(rate(local_rate)).layer(svc), start, end).await;
    }
}

/// Four callers that call `svc` until `end` after `start`.
async fn callers<S>(svc: S, start: Instant, end: Duration)
where
    S: Service<u64> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < end {
                let ready = svc.ready().await.expect("the quota is always ready");
                let _ = ready.call(0).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// `breaker`: 20 calls a second from each worker into a dead dependency, through the default
/// breaker (20 failures in a row trip it). Counts the calls each worker sent before its own
/// breaker opened.
async fn breaker(job: &Job, fleet: &Fleet) -> Value {
    let breaker = Breaker::new("payments", BreakerConfig::default());
    if job.fleet {
        fleet.share_breaker(&breaker).expect("shared once");
    }
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = CircuitBreakerLayer::new(breaker.clone()).layer(down(calls.clone()));
    let start = Instant::now();
    let mut before_open = None;
    let mut opened_ms = None;
    let mut every = tokio::time::interval(Duration::from_millis(1_000 / BREAKER_CALLS_PER_S));
    while start.elapsed() < Duration::from_secs(BREAKER_SECS) {
        every.tick().await;
        if before_open.is_none() && breaker.state() != State::Closed {
            before_open = Some(calls.load(Ordering::Relaxed));
            opened_ms = Some(start.elapsed().as_millis() as u64);
        }
        let _ = svc.ready().await.expect("always ready").call(0).await;
    }
    json!({
        "calls_before_open": before_open.unwrap_or(calls.load(Ordering::Relaxed)),
        "opened_ms": opened_ms,
        "calls": calls.load(Ordering::Relaxed),
        "reason": breaker.reason(),
    })
}

/// `redis-down`: the `quota` load for six seconds; the parent stops Redis at 2 s and starts it
/// again at 4 s. Reports served calls per 100 ms, and when this worker saw Redis go and return.
async fn redis_down(job: &Job, fleet: &Fleet) -> Value {
    let buckets = Arc::new(Mutex::new(vec![0u64; (DOWN_SECS * 10) as usize]));
    let start = Instant::now();
    let end = Duration::from_secs(DOWN_SECS);
    let counted = {
        let buckets = buckets.clone();
        tower::service_fn(move |_: u64| {
            let i = (start.elapsed().as_millis() / 100) as usize;
            if let Some(b) = buckets.lock().unwrap().get_mut(i) {
                *b += 1;
            }
            std::future::ready(Ok::<_, std::io::Error>(()))
        })
    };
    let watch = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            let (mut down_ms, mut up_ms) = (None, None);
            while start.elapsed() < end {
                let up = fleet.is_up();
                let at = start.elapsed().as_millis() as u64;
                if !up && down_ms.is_none() {
                    down_ms = Some(at);
                }
                if up && down_ms.is_some() && up_ms.is_none() {
                    up_ms = Some(at);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (down_ms, up_ms)
        })
    };
    // Local: each worker holds its share, as the fleet's workers do while Redis is down.
    let share = QUOTA_PER_S / job.workers as u32;
    quota_load(job, fleet, "provider-down", share, counted, start, end).await;
    let (down_ms, up_ms) = watch.await.unwrap_or((None, None));
    let buckets = buckets.lock().unwrap().clone();
    json!({ "buckets": buckets, "down_ms": down_ms, "up_ms": up_ms })
}
