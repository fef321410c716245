//! Every decision is counted: the documented metric names and labels, read back from a
//! `metrics-util` debugging recorder installed for this thread only.
mod support;

use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use std::future::Future;
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::FailureClass::{Ambiguous, Transient};
use stormguard::error::BoxError;
use stormguard::key::{Action, IdempotencyKey, KeyStamp, SetIdempotencyKeyLayer};
use stormguard::receipt::{InMemoryStore, ReceiptGuardLayer};
use stormguard::retry::RetryLayer;
use support::{call, classifier, Dependency, Outcome};
use tower::{Layer, ServiceBuilder};

/// Runs `f` on a paused current-thread runtime with `recorder` as this thread's recorder.
fn recorded<F: Future>(recorder: &DebuggingRecorder, f: impl FnOnce() -> F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || rt.block_on(f()))
}

/// Every metric once (a snapshot drains what it reports: take one and read it).
type Metrics = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

/// The value of the metric `name` whose labels include all of `labels`.
fn value<'m>(metrics: &'m Metrics, name: &str, labels: &[(&str, &str)]) -> Option<&'m DebugValue> {
    metrics
        .iter()
        .find(|(key, _, _, _)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, _, _, value)| value)
}

fn counter(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(metrics, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
    }
}

#[test]
fn retries_refusals_and_escalations_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorded(&recorder, || async {
        let budget = RetryBudget::default();
        let retry =
            |class| RetryLayer::new(class, budget.clone()).classifier(classifier as fn(&_) -> _);
        // Two transient failures, then a success: two retries.
        let dep = Dependency::script([Outcome::Fail(Transient); 2], Outcome::Ok);
        call(&mut retry(ToolClass::Read).layer(dep), 1u32)
            .await
            .unwrap();
        // An outage: two retries, then refused at the attempt cap.
        let dep = Dependency::always(Outcome::Fail(Transient));
        let _ = call(&mut retry(ToolClass::Read).layer(dep), 2u32).await;
        // An ambiguous failure of an unkeyed write: escalated, not retried.
        let dep = Dependency::always(Outcome::Fail(Ambiguous));
        let _ = call(&mut retry(ToolClass::UnkeyedWrite).layer(dep), 3u32).await;
    });
    let metrics = snapshotter.snapshot().into_vec();
    let read = ("class", "read");
    assert_eq!(counter(&metrics, "stormguard_operations_total", &[read]), 2);
    assert_eq!(
        counter(
            &metrics,
            "stormguard_retries_total",
            &[read, ("failure", "transient")]
        ),
        4
    );
    assert_eq!(
        counter(
            &metrics,
            "stormguard_retry_refusals_total",
            &[read, ("reason", "max_attempts")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "stormguard_escalations_total",
            &[("class", "unkeyed_write"), ("code", "outcome_unknown")]
        ),
        1
    );
}

#[test]
fn breaker_transitions_rejections_and_outcomes_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorded(&recorder, || async {
        let config = BreakerConfig::builder()
            .consecutive_failures(3)
            .probe_after(0)
            .open_duration(Duration::from_secs(5), Duration::from_secs(30))
            .build()
            .unwrap();
        let breaker = Breaker::new("billing-api", config);
        let mut script = vec![Outcome::Empty, Outcome::Ok];
        script.extend([Outcome::Fail(Transient); 3]);
        let dep = Dependency::script(script, Outcome::Ok);
        let mut svc = CircuitBreakerLayer::new(breaker.clone())
            .classifier(classifier as fn(&_) -> _)
            .layer(dep);
        for _ in 0..7 {
            let _ = call(&mut svc, 1u32).await; // empty, ok, 3 failures (opens), 2 rejected
        }
        tokio::time::advance(Duration::from_secs(6)).await;
        call(&mut svc, 1u32).await.unwrap(); // the trial succeeds: closed again
    });
    let metrics = snapshotter.snapshot().into_vec();
    let name = ("breaker", "billing-api");
    let outcomes = "stormguard_breaker_outcomes_total";
    assert_eq!(
        counter(&metrics, outcomes, &[name, ("count", "ignored")]),
        1
    );
    assert_eq!(
        counter(&metrics, outcomes, &[name, ("count", "success")]),
        2
    );
    assert_eq!(
        counter(&metrics, outcomes, &[name, ("count", "failure")]),
        3
    );
    assert_eq!(
        counter(&metrics, "stormguard_breaker_rejections_total", &[name]),
        2
    );
    let transitions = "stormguard_breaker_transitions_total";
    for (from, to) in [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ] {
        assert_eq!(
            counter(&metrics, transitions, &[name, ("from", from), ("to", to)]),
            1,
            "{from} -> {to}"
        );
    }
    match value(&metrics, "stormguard_breaker_state", &[name]) {
        Some(DebugValue::Gauge(state)) => assert_eq!(state.into_inner(), 0.0, "closed"),
        other => panic!("state gauge: {other:?}"),
    }
}

#[derive(Clone)]
struct Email {
    invoice: u64,
    key: Option<String>,
}

impl KeyStamp for Email {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

#[test]
fn receipt_decisions_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let deliveries = recorded(&recorder, || async {
        let dep = Dependency::script([Outcome::Fail(Transient)], Outcome::Ok);
        let layer = ReceiptGuardLayer::new(
            InMemoryStore::new(),
            ToolClass::KeyedWrite,
            |req: &Email| Action::new("run-1", "step-2", "send_invoice", &req.invoice),
        );
        let mut svc = ServiceBuilder::new()
            .layer(layer.clone())
            .service(dep.clone());
        let email = |invoice| Email { invoice, key: None };
        let result: Result<u32, BoxError> = call(&mut svc, email(1)).await;
        assert!(result.is_err(), "the transient failure is returned");
        call(&mut svc, email(1)).await.unwrap(); // fresh again, executes, recorded
        call(&mut svc, email(1)).await.unwrap(); // answered from the receipt

        // A connection reset mid-call: it may have taken effect, so the intent stays pending.
        let reset = Dependency::always(Outcome::Fail(Ambiguous));
        let mut svc = ServiceBuilder::new().layer(layer).service(reset);
        assert!(call(&mut svc, email(3)).await.is_err());

        // A request that arrives with a key of its own, not its action's: refused.
        let mut keyed = SetIdempotencyKeyLayer::new(|req: &Email| {
            Action::new("run-1", "step-3", "send_invoice", &req.invoice)
        })
        .layer(dep.clone());
        let minted = Email {
            invoice: 2,
            key: Some("a-fresh-uuid".into()),
        };
        assert!(call(&mut keyed, minted).await.is_err());
        dep.calls()
    });
    let metrics = snapshotter.snapshot().into_vec();
    assert_eq!(deliveries, 2);
    let outcomes = "stormguard_receipt_outcomes_total";
    assert_eq!(
        counter(
            &metrics,
            "stormguard_key_refusals_total",
            &[("code", "idempotency_key_changed")]
        ),
        1
    );
    for (outcome, n) in [
        ("fresh", 3),
        ("abandoned", 1),
        ("recorded", 1),
        ("receipt", 1),
        ("left_pending", 1),
    ] {
        assert_eq!(
            counter(&metrics, outcomes, &[("outcome", outcome)]),
            n,
            "{outcome}"
        );
    }
}

/// A run's retry sent to the floor because it may not borrow is counted, with why: its own share
/// is owed, or all runs together owe the lending limit.
#[test]
fn refused_loans_are_counted_with_the_reason() {
    use stormguard::budget::RunLimits;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorded(&recorder, || async {
        let shared = RetryBudget::builder()
            .floor(0, Duration::from_secs(60))
            .run_share(1)
            .lending_limit(2)
            .build()
            .unwrap();
        for _ in 0..50 {
            shared.deposit();
        }
        let runs: Vec<_> = (0..3)
            .map(|_| shared.for_run(RunLimits::default()))
            .collect();
        assert!(runs[0].try_withdraw(Duration::ZERO).is_ok()); // on loan
        assert!(runs[1].try_withdraw(Duration::ZERO).is_ok()); // on loan
        assert!(runs[2].try_withdraw(Duration::ZERO).is_err()); // the limit is lent out
        assert!(runs[0].try_withdraw(Duration::ZERO).is_err()); // it owes its share
    });
    let metrics = snapshotter.snapshot().into_vec();
    let name = "stormguard_budget_loans_refused_total";
    assert_eq!(counter(&metrics, name, &[("reason", "lending_limit")]), 1);
    assert_eq!(counter(&metrics, name, &[("reason", "run_share")]), 1);
}

#[test]
fn a_nested_layer_that_finds_no_operation_is_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let calls = recorded(&recorder, || async {
        let budget = RetryBudget::default();
        // A plain `u32` cannot carry the operation across the buffer.
        let dep = Dependency::always(Outcome::Fail(Ambiguous));
        let mut stack = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::UnkeyedWrite, budget.clone()))
            .buffer(8)
            .layer(
                RetryLayer::new(ToolClass::Read, budget.clone())
                    .name("billing-client")
                    .nested(),
            )
            .service(dep.clone());
        let _ = call(&mut stack, 1u32).await;
        // Without a boundary the nested layer joins, and nothing is counted.
        let mut joined = ServiceBuilder::new()
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()))
            .layer(
                RetryLayer::new(ToolClass::Read, budget)
                    .name("joined")
                    .nested(),
            )
            .service(Dependency::always(Outcome::Ok));
        call(&mut joined, 2u32).await.unwrap();
        dep.calls()
    });
    assert_eq!(calls, 1);
    let metrics = snapshotter.snapshot().into_vec();
    let uncarried = "stormguard_operations_uncarried_total";
    assert_eq!(
        counter(&metrics, uncarried, &[("layer", "billing-client")]),
        1
    );
    assert_eq!(counter(&metrics, uncarried, &[("layer", "joined")]), 0);
}
