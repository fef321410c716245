//! A breaker opened by a failure that named when to come back (`Retry-After`) stays open that
//! long, then probes, at any traffic rate.
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer, State};
use stormguard::classify::HttpClassifier;
use stormguard::error::{ErrorCode, ToolError};
use tokio::time::{advance, Instant};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

type Reply = http::Response<String>;

/// A dependency that answers 503 (with `Retry-After: retry_after` s, if any) while `down`, else
/// 200; and the count of calls that reached it.
fn dependency(
    down: Arc<AtomicBool>,
    retry_after: Option<u32>,
) -> (BoxCloneService<(), Reply, std::io::Error>, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = service_fn(move |_: ()| {
        counter.fetch_add(1, Ordering::SeqCst);
        let down = down.load(Ordering::SeqCst);
        async move {
            let mut reply = http::Response::builder().status(if down { 503 } else { 200 });
            if let (true, Some(secs)) = (down, retry_after) {
                reply = reply.header("retry-after", secs.to_string());
            }
            Ok::<_, std::io::Error>(reply.body(String::new()).unwrap())
        }
    });
    (BoxCloneService::new(svc), calls)
}

fn breaker() -> Breaker {
    let config = BreakerConfig::builder()
        .consecutive_failures(1)
        .no_failure_rate()
        .open_duration(Duration::from_millis(250), Duration::from_secs(30))
        .build()
        .unwrap();
    Breaker::new("provider", config)
}

/// Calls `svc` every `every` until `until` (from the start), returning the calls it made and
/// the rejections among them.
async fn drive<S>(svc: &mut S, every: Duration, until: Duration) -> (u32, Vec<ToolError>)
where
    S: Service<(), Response = Reply, Error = stormguard::error::BoxError>,
{
    let start = Instant::now();
    let (mut made, mut rejected) = (0, Vec::new());
    while start.elapsed() < until {
        made += 1;
        if let Err(e) = svc.ready().await.unwrap().call(()).await {
            if let Ok(tool) = e.downcast::<ToolError>() {
                rejected.push(*tool);
            }
        }
        advance(every).await;
    }
    (made, rejected)
}

#[tokio::test(start_paused = true)]
async fn at_a_hundred_calls_a_second_no_probe_goes_before_the_server_said() {
    let down = Arc::new(AtomicBool::new(true));
    let (dep, calls) = dependency(down.clone(), Some(5));
    let breaker = breaker();
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(HttpClassifier)
        .layer(dep);
    // The first call trips it (`Retry-After: 5`); 4.9 s at 100 calls/s: all turned away, where
    // the traffic rule alone would probe after 250 ms and 25 turned-away calls.
    let (made, rejected) = drive(
        &mut svc,
        Duration::from_millis(10),
        Duration::from_millis(4_900),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no probe before 5 s");
    assert_eq!(rejected.len() as u32, made - 1);
    let first = &rejected[0];
    assert_eq!(first.code(), ErrorCode::CircuitOpen);
    let after = first.retry_after().unwrap();
    assert!(
        after > Duration::from_millis(4_900) && after <= Duration::from_secs(5),
        "{after:?}"
    );
    // Healed; the call at 5 s is the probe, and it closes the breaker.
    down.store(false, Ordering::SeqCst);
    advance(Duration::from_millis(100)).await;
    assert!(svc.ready().await.unwrap().call(()).await.is_ok());
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn at_one_call_a_second_a_short_overload_heals_by_the_named_delay() {
    // Ten seconds of `503` with `Retry-After: 2`, one call a second: the breaker probes every
    // other second (as the server asked), so the first call that finds it healed within 2 s
    // succeeds.
    let down = Arc::new(AtomicBool::new(true));
    let (dep, calls) = dependency(down.clone(), Some(2));
    let breaker = breaker();
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(HttpClassifier)
        .layer(dep);
    let (made, _) = drive(&mut svc, Duration::from_secs(1), Duration::from_secs(10)).await;
    assert_eq!(made, 10);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "a probe every other second"
    );
    down.store(false, Ordering::SeqCst);
    assert_eq!(first_success(&mut svc).await, Duration::ZERO);
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_long_outage_that_keeps_naming_a_second_is_probed_by_the_share_rule() {
    // An hour of `503` with `Retry-After: 1`, one call a second: the server's word holds the
    // probe back, never forward past the share of the outage, so the hour costs about as many
    // probes as a silent outage (about 150), and healing waits at most the longest open time.
    let down = Arc::new(AtomicBool::new(true));
    let (dep, calls) = dependency(down.clone(), Some(1));
    let breaker = breaker();
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(HttpClassifier)
        .layer(dep);
    drive(&mut svc, Duration::from_secs(1), Duration::from_secs(3_600)).await;
    let reached = calls.load(Ordering::SeqCst);
    assert!(
        (100..=200).contains(&reached),
        "{reached} of 3600 calls reached it"
    );
    down.store(false, Ordering::SeqCst);
    assert!(first_success(&mut svc).await <= Duration::from_secs(30));
    assert_eq!(breaker.state(), State::Closed);
}

/// Calls once a second until a call succeeds: how long that took.
async fn first_success<S>(svc: &mut S) -> Duration
where
    S: Service<(), Response = Reply, Error = stormguard::error::BoxError>,
{
    let healed = Instant::now();
    while svc.ready().await.unwrap().call(()).await.is_err() {
        advance(Duration::from_secs(1)).await;
    }
    healed.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_named_delay_past_the_longest_open_time_is_cut_to_it() {
    let down = Arc::new(AtomicBool::new(true));
    let (dep, calls) = dependency(down.clone(), Some(3_600));
    let breaker = breaker();
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(HttpClassifier)
        .layer(dep);
    let (_, rejected) = drive(
        &mut svc,
        Duration::from_millis(100),
        Duration::from_millis(29_900),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(rejected[0].retry_after().unwrap() <= Duration::from_secs(30));
    down.store(false, Ordering::SeqCst);
    advance(Duration::from_millis(100)).await;
    assert!(svc.ready().await.unwrap().call(()).await.is_ok());
    assert_eq!(breaker.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn without_a_named_delay_the_traffic_rule_still_probes() {
    let down = Arc::new(AtomicBool::new(true));
    let (dep, calls) = dependency(down.clone(), None);
    let breaker = breaker();
    let mut svc = CircuitBreakerLayer::new(breaker.clone())
        .classifier(HttpClassifier)
        .layer(dep);
    // At 100 calls/s for 1 s: probes after 250 ms and 25 turned-away calls, more than one.
    drive(&mut svc, Duration::from_millis(10), Duration::from_secs(1)).await;
    assert!(
        calls.load(Ordering::SeqCst) >= 3,
        "{} calls",
        calls.load(Ordering::SeqCst)
    );
}
