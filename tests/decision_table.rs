//! The class x failure decision table, cell by cell, through a real `Retry` layer.
mod support;

use stormguard::budget::RetryBudget;
use stormguard::class::{Decision, ToolClass};
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::retry::{Replay, RetryLayer};
use support::{Dependency, Outcome};
use tower::{Layer, Service, ServiceExt};

/// Reports a key or not, for every request.
#[derive(Clone, Copy)]
struct Keyed(bool);

impl Replay<u32> for Keyed {
    fn replay(&self, req: &u32) -> Option<u32> {
        Some(*req)
    }
    fn carries_key(&self, _: &u32) -> bool {
        self.0
    }
}

const FAILURES: [FailureClass; 5] = [
    FailureClass::Transient,
    FailureClass::Ambiguous,
    FailureClass::ModelRecoverable,
    FailureClass::Permanent,
    FailureClass::Policy,
];

fn expected(class: ToolClass, failure: FailureClass, keyed: bool) -> (u32, ErrorCode) {
    use FailureClass::*;
    use ToolClass::*;
    let failure_code = match failure {
        Transient | Ambiguous => ErrorCode::Unavailable,
        ModelRecoverable => ErrorCode::InvalidArgument,
        Permanent => ErrorCode::PermissionDenied,
        _ => ErrorCode::PolicyViolation,
    };
    match (failure, class) {
        (Transient, MultiStep) => (1, failure_code),
        (Transient, _) => (3, failure_code),
        (Ambiguous, Read | IdempotentWrite) => (3, failure_code),
        (Ambiguous, KeyedWrite) if keyed => (3, failure_code),
        (Ambiguous, KeyedWrite) => (1, ErrorCode::MissingIdempotencyKey),
        (Ambiguous, UnkeyedWrite | MultiStep) => (1, ErrorCode::OutcomeUnknown),
        _ => (1, failure_code),
    }
}

#[tokio::test(start_paused = true)]
async fn every_cell_of_the_table() {
    for class in ToolClass::ALL {
        for failure in FAILURES {
            for keyed in [false, true] {
                let dep = Dependency::always(Outcome::Fail(failure));
                let mut svc = RetryLayer::new(class, RetryBudget::default())
                    .replay(Keyed(keyed))
                    .layer(dep.clone());
                let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
                let (calls, code) = expected(class, failure, keyed);
                let cell = format!("{class:?} x {failure:?} keyed={keyed}");
                assert_eq!(dep.calls(), calls, "calls for {cell}");
                assert_eq!(err.code(), code, "code for {cell}");
                assert!(!err.retryable(), "{cell} must leave non-retryable");
                assert_eq!(err.attempts(), calls, "attempts for {cell}");
            }
        }
    }
}

#[test]
fn decide_matches_the_documented_table() {
    assert_eq!(
        ToolClass::KeyedWrite.decide(FailureClass::Ambiguous, false),
        Decision::Escalate(ErrorCode::MissingIdempotencyKey)
    );
    assert_eq!(
        ToolClass::MultiStep.decide(FailureClass::Transient, true),
        Decision::Return
    );
    assert_eq!(
        ToolClass::IdempotentWrite.decide(FailureClass::Ambiguous, false),
        Decision::Retry
    );
    for class in ToolClass::ALL {
        for failure in [
            FailureClass::ModelRecoverable,
            FailureClass::Permanent,
            FailureClass::Policy,
        ] {
            assert_eq!(class.decide(failure, true), Decision::Return);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn success_after_a_transient_failure_is_returned() {
    let dep = Dependency::script([Outcome::Fail(FailureClass::Transient)], Outcome::Ok);
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(dep.clone());
    let answer = support::call(&mut svc, 1u32).await.unwrap();
    assert_eq!(answer, 2);
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_empty_answer_is_not_retried() {
    use stormguard::classify::Classification;
    // A classifier that calls the answer 0 "no such record".
    let classifier = |r: &Result<u32, stormguard::error::BoxError>| match r {
        Ok(0) => Classification::empty(),
        Ok(_) => Classification::success(),
        Err(e) => stormguard::classify::classify_error(&**e),
    };
    let dep = tower::service_fn(|_: u32| async { Ok::<u32, stormguard::error::BoxError>(0) });
    let mut svc = RetryLayer::new(ToolClass::Read, RetryBudget::default())
        .classifier(classifier)
        .layer(dep);
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 0);
}
