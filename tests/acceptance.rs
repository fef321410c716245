//! The default budget's acceptance rule through a real `Retry` layer: retries go where they help
//! (random failures, most calls answered) and are shed where they hurt (an outage, an overload),
//! each case against the same budget with the rule off. Seeded fates, tokio's paused clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::hint::ServerHint;
use stormguard::classify::{
    Classification, ClassifiedResponse, Classify, FailureClass, NeverClassifyEos,
};
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use tower::{service_fn, Layer, ServiceExt};

/// What the dependency answers to one attempt.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Answer {
    Ok,
    /// A 503 without a hint: the dependency failed this call.
    Failed,
    /// A 503 with `Retry-After: 1`: the dependency is over its capacity.
    Overloaded,
}

#[derive(Clone, Copy)]
struct Reads;

impl Classify<Answer, std::io::Error> for Reads {
    type ClassifyEos = NeverClassifyEos;

    fn classify(
        &self,
        result: &Result<Answer, std::io::Error>,
    ) -> ClassifiedResponse<NeverClassifyEos> {
        let unavailable = Classification::failure(FailureClass::Transient, ErrorCode::Unavailable);
        ClassifiedResponse::Ready(match result {
            Ok(Answer::Ok) => Classification::success(),
            Ok(Answer::Failed) | Err(_) => unavailable,
            Ok(Answer::Overloaded) => {
                unavailable.with_hint(ServerHint::RetryAfter(Duration::from_secs(1)))
            }
        })
    }
}

/// A uniform draw from a seed (splitmix64).
fn uniform(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `ops` reads one after the other through a `Retry` (3 attempts) on `budget`; the `n`th
/// call to the dependency (from 0) answers `fate(n, draw)`. Returns (successes, calls).
async fn run(
    budget: RetryBudget,
    ops: u64,
    fate: impl Fn(u64, f64) -> Answer + Send + Sync + 'static,
) -> (u64, u64) {
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let fate = Arc::new(fate);
    let dependency = service_fn(move |_op: u64| {
        let n = counted.fetch_add(1, Ordering::Relaxed);
        let answer = fate(n, uniform(n ^ 0x5EED));
        async move { Ok::<_, std::io::Error>(answer) }
    });
    let svc = RetryLayer::new(ToolClass::Read, budget)
        .classifier(Reads)
        .layer(dependency);
    let mut successes = 0;
    for op in 0..ops {
        if matches!(svc.clone().oneshot(op).await, Ok(Answer::Ok)) {
            successes += 1;
        }
    }
    (successes, calls.load(Ordering::Relaxed))
}

fn budget(acceptance: bool) -> RetryBudget {
    let k = if acceptance { 2.0 } else { 0.0 };
    RetryBudget::builder()
        .seed(7)
        .acceptance(k, 32)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn half_the_calls_failing_at_random_are_retried_to_the_three_attempt_ceiling() {
    let half = |_, draw: f64| {
        if draw < 0.5 {
            Answer::Failed
        } else {
            Answer::Ok
        }
    };
    let (ok, calls) = run(budget(true), 4000, half).await;
    let (success, per_op) = (ok as f64 / 4000.0, calls as f64 / 4000.0);
    // Three attempts give 1 - 0.5^3 = 87.5 % for 1.75 calls per operation.
    assert!(success >= 0.85, "success {success}");
    assert!((1.6..=1.9).contains(&per_op), "calls per op {per_op}");
    // The ratio balance alone pays for one retry in ten failures.
    let (ok_ratio_only, _) = run(budget(false), 4000, half).await;
    assert!(
        (ok_ratio_only as f64 / 4000.0) < 0.65,
        "ratio only: {ok_ratio_only}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outage_from_the_start_gets_no_retry_from_acceptance() {
    let (ok, calls) = run(budget(true), 3000, |_, _| Answer::Failed).await;
    assert_eq!(ok, 0);
    let (_, calls_ratio_only) = run(budget(false), 3000, |_, _| Answer::Failed).await;
    // Only the floor's retries (10 a minute): the same as the ratio budget alone.
    assert_eq!(calls, calls_ratio_only);
    assert!(calls <= 3000 + 30, "{calls}");
}

#[tokio::test(start_paused = true)]
async fn an_outage_after_a_healthy_spell_costs_a_bounded_burst() {
    // 2,000 healthy reads, then the dependency is down for 3,000.
    let healthy_then_down = |n, _| if n < 2000 { Answer::Ok } else { Answer::Failed };
    let (_, calls) = run(budget(true), 5000, healthy_then_down).await;
    let (_, calls_ratio_only) = run(budget(false), 5000, healthy_then_down).await;
    let (retries, retries_ratio_only) = (calls - 5000, calls_ratio_only - 5000);
    // The acceptance falls below one half after ~22 failed attempts and pays for about 50
    // retries; the balance pays for some more until the dependency is known to be down (a tenth
    // answered), then the floor only. Whatever the outage's length.
    assert!((20..=150).contains(&retries), "{retries} retries");
    // The balance alone spends all it holds (100) and then the floor.
    assert!(retries_ratio_only >= 100, "{retries_ratio_only} retries");
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_dependency_is_never_retried_on_acceptance() {
    // Half the calls are told to come back in a second: an overload, not bad luck.
    let overload = |_, draw: f64| {
        if draw < 0.5 {
            Answer::Overloaded
        } else {
            Answer::Ok
        }
    };
    let (_, calls) = run(budget(true), 4000, overload).await;
    let (_, calls_ratio_only) = run(budget(false), 4000, overload).await;
    assert_eq!(
        calls, calls_ratio_only,
        "the rule paid for an overloaded retry"
    );
    // Two retries of the balance each: 20 % of a retry per success pays one in ten.
    let per_op = calls as f64 / 4000.0;
    assert!(per_op <= 1.1, "calls per op {per_op}");
}

#[test]
fn the_rule_is_on_by_default_and_refuses_settings_that_mean_nothing() {
    assert_eq!(RetryBudget::default().acceptance(), Some((2.0, 32)));
    for (k, window) in [
        (0.5, 32),
        (11.0, 32),
        (f64::NAN, 32),
        (2.0, 0),
        (2.0, 100_001),
    ] {
        let err = RetryBudget::builder()
            .acceptance(k, window)
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "acceptance", "{k} {window}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_dependency_that_answers_nothing_does_not_spend_what_a_healthy_one_deposited() {
    // One budget for two tools (plain clones, no run handles): one dependency healthy, one down.
    let shared = RetryBudget::builder()
        .seed(7)
        .floor(0, Duration::from_secs(60))
        .build()
        .unwrap();
    let (ok, _) = run(shared.clone(), 1000, |_, _| Answer::Ok).await;
    assert_eq!(ok, 1000);
    assert_eq!(
        shared.balance(),
        100.0,
        "200 retries deposited, capped at 100"
    );
    let (_, calls) = run(shared.clone(), 1000, |_, _| Answer::Failed).await;
    // Until the layer has seen a window of 32 attempts it does not know the dependency is down
    // and the balance pays; then it pays nothing (no floor here).
    assert!(calls <= 1000 + 32, "{calls} calls for 1,000 operations");
    assert!(
        shared.balance() >= 100.0 - 32.0,
        "balance {}",
        shared.balance()
    );
    // With the rule off, the balance is spent on the dependency that is down.
    let ratio_only = RetryBudget::builder()
        .seed(7)
        .floor(0, Duration::from_secs(60))
        .acceptance(0.0, 32)
        .build()
        .unwrap();
    run(ratio_only.clone(), 1000, |_, _| Answer::Ok).await;
    let (_, calls) = run(ratio_only.clone(), 1000, |_, _| Answer::Failed).await;
    assert_eq!(calls, 1000 + 100);
}
