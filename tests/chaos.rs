//! The fault layer (feature `chaos`): each fault at its drawn rate against a counting service,
//! the effect ledger, the same seed giving the same run, and what the faults do to a naive retry
//! against stormguard's.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::chaos::{ChaosLayer, Fault};
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::retry::RetryLayer;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

type Res = http::Response<String>;

/// A provider that counts the work it did.
fn provider(
    work: Arc<AtomicU32>,
) -> impl Service<http::Request<String>, Response = Res, Error = BoxError, Future: Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |_: http::Request<String>| {
        work.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(http::Response::new("done".to_string())) }
    })
}

fn req() -> http::Request<String> {
    http::Request::post("/charges").body(String::new()).unwrap()
}

/// Runs `n` calls through a chaos layer with one fault at probability `p`; returns (answers by
/// status or error kind, work done by the provider, the ledger).
async fn run(
    fault: Fault,
    p: f64,
    n: u32,
    seed: u64,
) -> (Vec<String>, u32, stormguard::chaos::Effects) {
    let work = Arc::new(AtomicU32::new(0));
    let chaos = ChaosLayer::builder(seed).fault(fault, p).build().unwrap();
    let effects = chaos.effects();
    let svc = chaos.layer(provider(work.clone()));
    let mut seen = Vec::new();
    for _ in 0..n {
        seen.push(match svc.clone().oneshot(req()).await {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => match e.downcast_ref::<std::io::Error>() {
                Some(io) => format!("{:?}", io.kind()),
                None => e.to_string(),
            },
        });
    }
    // Let late commits land.
    tokio::time::sleep(Duration::from_secs(60)).await;
    (seen, work.load(Ordering::SeqCst), effects)
}

fn count(seen: &[String], what: &str) -> usize {
    seen.iter().filter(|s| *s == what).count()
}

#[tokio::test(start_paused = true)]
async fn each_fault_at_its_rate_with_the_work_done_or_not_as_it_says() {
    // (fault, what the caller sees, whether the provider did the work)
    let cases = [
        (
            Fault::RateLimited(Duration::from_millis(1500)),
            "429",
            false,
        ),
        (Fault::QuotaExhausted, "429", false),
        (Fault::Overloaded, "529", false),
        (Fault::Unavailable, "503", false),
        (Fault::FailedAfterWork(502), "502", true),
        (Fault::ResetAfterWork, "ConnectionReset", true),
        (Fault::LateCommit(Duration::from_secs(5)), "TimedOut", true),
    ];
    for (fault, seen_as, works) in cases {
        let (seen, work, effects) = run(fault, 0.25, 2_000, 11).await;
        let hits = count(&seen, seen_as);
        assert!(
            (400..600).contains(&hits),
            "{fault:?}: {hits} of 2000 at 25 %"
        );
        assert_eq!(
            count(&seen, "200") + hits,
            2_000,
            "{fault:?}: only 200s and the fault"
        );
        let expected_work = if works { 2_000 } else { 2_000 - hits as u32 };
        assert_eq!(work, expected_work, "{fault:?}: the provider's own count");
        assert_eq!(
            effects.work_done(),
            u64::from(expected_work),
            "{fault:?}: the ledger agrees"
        );
        assert_eq!(effects.calls(), 2_000);
        assert_eq!(
            effects.duplicated_operations(),
            0,
            "every call its own operation"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_says_how_long_and_a_quota_says_what() {
    let chaos = ChaosLayer::builder(3)
        .fault(Fault::RateLimited(Duration::from_millis(1500)), 1.0)
        .build()
        .unwrap();
    let answer = chaos
        .layer(provider(Arc::default()))
        .oneshot(req())
        .await
        .unwrap();
    assert_eq!(answer.headers()["retry-after"], "2");
    assert_eq!(answer.headers()["retry-after-ms"], "1500");
    let chaos = ChaosLayer::builder(3)
        .fault(Fault::QuotaExhausted, 1.0)
        .build()
        .unwrap();
    let answer = chaos
        .layer(provider(Arc::default()))
        .oneshot(req())
        .await
        .unwrap();
    assert!(answer.body().contains("insufficient_quota"));
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_run() {
    let (a, _, ea) = run(Fault::ResetAfterWork, 0.3, 500, 42).await;
    let (b, _, eb) = run(Fault::ResetAfterWork, 0.3, 500, 42).await;
    let (c, _, _) = run(Fault::ResetAfterWork, 0.3, 500, 43).await;
    assert_eq!(a, b);
    assert_eq!(ea.log(), eb.log());
    assert_ne!(a, c);
}

#[tokio::test(start_paused = true)]
async fn a_late_commit_lands_after_the_caller_gave_up() {
    let work = Arc::new(AtomicU32::new(0));
    let chaos = ChaosLayer::builder(1)
        .fault(Fault::LateCommit(Duration::from_secs(5)), 1.0)
        .build()
        .unwrap();
    let svc = chaos.layer(provider(work.clone()));
    assert!(svc.oneshot(req()).await.is_err());
    assert_eq!(work.load(Ordering::SeqCst), 0, "not yet");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        work.load(Ordering::SeqCst),
        1,
        "landed after the caller gave up"
    );
}

#[tokio::test(start_paused = true)]
async fn latency_delays_on_tokios_clock() {
    let chaos = ChaosLayer::builder(1)
        .fault(Fault::Latency(Duration::from_secs(2)), 1.0)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let answer = chaos
        .layer(provider(Arc::default()))
        .oneshot(req())
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn switched_off_it_passes_calls_through() {
    let work = Arc::new(AtomicU32::new(0));
    let svc = ChaosLayer::off().layer(provider(work.clone()));
    for _ in 0..10 {
        assert_eq!(svc.clone().oneshot(req()).await.unwrap().status(), 200);
    }
    assert_eq!(work.load(Ordering::SeqCst), 10);
}

/// Unkeyed writes against a provider that fails after the work a third of the time: a naive
/// retry (tower's, 3 attempts on any failure) repeats the effect; stormguard's `Retry` for an
/// unkeyed write escalates `outcome_unknown` and repeats nothing. The ledger counts both.
#[tokio::test(start_paused = true)]
async fn faults_after_the_work_duplicate_a_naive_retry_and_not_stormguard() {
    #[derive(Clone)]
    struct Naive(u32);
    impl<E> tower::retry::Policy<http::Request<String>, Res, E> for Naive {
        type Future = std::future::Ready<()>;
        fn retry(
            &mut self,
            _: &mut http::Request<String>,
            r: &mut Result<Res, E>,
        ) -> Option<Self::Future> {
            let failed = match r {
                Ok(res) => !res.status().is_success(),
                Err(_) => true,
            };
            (failed && self.0 > 1).then(|| {
                self.0 -= 1;
                std::future::ready(())
            })
        }
        fn clone_request(&mut self, req: &http::Request<String>) -> Option<http::Request<String>> {
            Some(
                http::Request::post(req.uri().clone())
                    .body(req.body().clone())
                    .unwrap(),
            )
        }
    }
    let faults = |seed| {
        ChaosLayer::builder(seed)
            .fault(Fault::FailedAfterWork(502), 0.2)
            .fault(Fault::ResetAfterWork, 0.15)
            .operation(|req: &http::Request<String>| req.body().parse::<u64>().unwrap())
            .build()
            .unwrap()
    };
    let call = |n: u64| http::Request::post("/tickets").body(n.to_string()).unwrap();

    let chaos = faults(5);
    let naive_effects = chaos.effects();
    let naive = ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(Naive(3)))
        .layer(chaos)
        .service(provider(Arc::default()));
    for n in 0..1_000 {
        let _ = naive.clone().oneshot(call(n)).await;
    }

    let chaos = faults(5);
    let ours_effects = chaos.effects();
    let ours = ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::UnkeyedWrite,
            RetryBudget::default(),
        ))
        .layer(chaos)
        .service(provider(Arc::default()));
    let mut unknown = 0;
    for n in 0..1_000 {
        if let Err(e) = ours.clone().oneshot(call(n)).await {
            assert_eq!(e.code(), ErrorCode::OutcomeUnknown);
            unknown += 1;
        }
    }
    assert!(
        naive_effects.duplicated_operations() > 250,
        "{}",
        naive_effects.duplicated_operations()
    );
    assert_eq!(ours_effects.duplicated_operations(), 0);
    assert!(
        (300..400).contains(&unknown),
        "escalated, not guessed: {unknown}"
    );
}

/// Over a plain-value service the faults are the errors its client would return.
#[tokio::test(start_paused = true)]
async fn over_a_plain_value_service_the_faults_are_tool_errors() {
    use stormguard::classify::FailureClass;
    use stormguard::error::ToolError;
    let work = Arc::new(AtomicU32::new(0));
    let counted = work.clone();
    let plain = service_fn(move |n: u32| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(n) }
    });
    let cases = [
        (
            Fault::RateLimited(Duration::from_millis(1500)),
            ErrorCode::RateLimited,
            FailureClass::Transient,
            0,
        ),
        (
            Fault::QuotaExhausted,
            ErrorCode::QuotaExhausted,
            FailureClass::Permanent,
            0,
        ),
        (
            Fault::Overloaded,
            ErrorCode::Unavailable,
            FailureClass::Transient,
            0,
        ),
        (
            Fault::FailedAfterWork(502),
            ErrorCode::Unavailable,
            FailureClass::Ambiguous,
            1,
        ),
    ];
    for (fault, code, class, worked) in cases {
        let before = work.load(Ordering::SeqCst);
        let chaos = ChaosLayer::builder(9).fault(fault, 1.0).build().unwrap();
        let err = chaos.layer(plain.clone()).oneshot(7).await.unwrap_err();
        let err = err.downcast_ref::<ToolError>().unwrap();
        assert_eq!((err.code(), err.class()), (code, Some(class)), "{fault:?}");
        assert_eq!(work.load(Ordering::SeqCst) - before, worked, "{fault:?}");
        if let Fault::RateLimited(wait) = fault {
            assert_eq!(err.retry_after(), Some(wait));
        }
    }
}

/// Over an MCP tool, a fault after the work is an `isError` result the client's classifier reads
/// as ambiguous: an unkeyed write is escalated after one call, a read is retried.
#[cfg(feature = "rmcp")]
#[tokio::test(start_paused = true)]
async fn over_an_mcp_tool_a_fault_after_the_work_is_an_error_result_read_as_ambiguous() {
    use rmcp::model::CallToolResult;
    use stormguard::classify::McpClassifier;
    for (class, calls_wanted) in [(ToolClass::UnkeyedWrite, 1), (ToolClass::Read, 3)] {
        let chaos = ChaosLayer::builder(7)
            .fault(Fault::FailedAfterWork(502), 1.0)
            .build()
            .unwrap();
        let effects = chaos.effects();
        let tool = chaos.layer(service_fn(|_: u32| async {
            Ok::<_, std::io::Error>(CallToolResult::success(vec![]))
        }));
        let client = RetryLayer::new(class, RetryBudget::default())
            .classifier(McpClassifier)
            .layer(tool);
        let err = client.oneshot(1).await.unwrap_err();
        assert_eq!(effects.work_done(), calls_wanted, "{class:?}");
        if class == ToolClass::UnkeyedWrite {
            assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
        }
    }
}
