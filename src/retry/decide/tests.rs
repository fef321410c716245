//! `decide` and `settle` against a small reference model written from the decision table in the
//! `retry` and `class` module docs, over the whole input space, plus the invariants the crate
//! promises whatever the inputs.

use super::*;
use crate::classify::FailureClass;
use proptest::prelude::*;

/// The decision table of the docs, transcribed cell by cell.
fn table(class: ToolClass, failure: FailureClass, keyed: bool) -> &'static str {
    use FailureClass::*;
    use ToolClass::*;
    match (failure, class, keyed) {
        (Transient, MultiStep, _) => "return",
        (Transient, _, _) => "retry",
        (Ambiguous, Read | IdempotentWrite, _) => "retry",
        (Ambiguous, KeyedWrite, true) => "retry",
        (Ambiguous, KeyedWrite, false) => "missing_idempotency_key",
        (Ambiguous, UnkeyedWrite | MultiStep, _) => "outcome_unknown",
        _ => "return",
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    view: OperationView,
    verdict: Verdict,
    code: ErrorCode,
    hint: ServerHint,
    policy_attempts: u32,
    max_server_delay: Duration,
    backoff: Duration,
    budget: Result<(), Refusal>,
}

fn model(c: &Case) -> Next {
    let failure = match c.verdict {
        Verdict::Failure(f) => f,
        _ => return Next::Success,
    };
    let v = &c.view;
    if v.closed {
        return Next::ReturnFailure;
    }
    match table(v.class, failure, v.keyed) {
        "return" => return Next::ReturnFailure,
        "outcome_unknown" => return Next::GiveUp(GiveUp::Escalate(ErrorCode::OutcomeUnknown)),
        "missing_idempotency_key" => {
            return Next::GiveUp(GiveUp::Escalate(ErrorCode::MissingIdempotencyKey))
        }
        _ => {}
    }
    let server_delay = match c.hint {
        ServerHint::DoNotRetry => return Next::GiveUp(GiveUp::ServerPushback),
        ServerHint::RetryAfter(d) => Some(d),
        ServerHint::None => None,
    };
    if !v.replayable {
        return Next::GiveUp(GiveUp::NotReplayable);
    }
    if v.attempts >= v.max_attempts {
        return Next::GiveUp(GiveUp::MaxAttempts);
    }
    if v.layer_attempts >= c.policy_attempts {
        return Next::LeaveToOuterLayer;
    }
    // The server's wait if within the limit; past it, the limit, but never under the backoff.
    let delay = server_delay.map_or(c.backoff, |d| {
        if d <= c.max_server_delay {
            d
        } else {
            c.max_server_delay.max(c.backoff)
        }
    });
    if let Some(left) = v.time_left {
        if delay >= left {
            return Next::GiveUp(GiveUp::Deadline);
        }
    }
    if let Err(refusal) = c.budget {
        return Next::GiveUp(GiveUp::Budget(refusal));
    }
    let throttled = c.code == ErrorCode::RateLimited
        && matches!(server_delay, Some(d) if d > Duration::ZERO && d <= c.max_server_delay);
    Next::Retry { delay, throttled }
}

fn class() -> impl Strategy<Value = ToolClass> {
    proptest::sample::select(ToolClass::ALL.to_vec())
}

fn verdict() -> impl Strategy<Value = Verdict> {
    prop_oneof![
        Just(Verdict::Success),
        Just(Verdict::Empty),
        proptest::sample::select(vec![
            FailureClass::Transient,
            FailureClass::Ambiguous,
            FailureClass::ModelRecoverable,
            FailureClass::Permanent,
            FailureClass::Policy,
        ])
        .prop_map(Verdict::Failure),
    ]
}

fn millis(max: u64) -> impl Strategy<Value = Duration> {
    prop_oneof![Just(0), Just(1), Just(max), 0..=max].prop_map(Duration::from_millis)
}

fn hint() -> impl Strategy<Value = ServerHint> {
    prop_oneof![
        Just(ServerHint::None),
        Just(ServerHint::DoNotRetry),
        millis(60_000).prop_map(ServerHint::RetryAfter),
    ]
}

fn budget() -> impl Strategy<Value = Result<(), Refusal>> {
    prop_oneof![
        Just(Ok(())),
        Just(Err(Refusal::RetryBudget)),
        Just(Err(Refusal::RunBudget)),
    ]
}

prop_compose! {
    fn case()(
        class in class(),
        keyed: bool,
        closed: bool,
        attempts in 1u32..6,
        max_attempts in 1u32..6,
        layer_attempts in 1u32..6,
        replayable: bool,
        time_left in proptest::option::of(millis(20_000)),
        verdict in verdict(),
        code in proptest::sample::select(ErrorCode::ALL.to_vec()),
        hint in hint(),
        policy_attempts in 1u32..6,
        max_server_delay in millis(40_000),
        backoff in millis(10_000),
        budget in budget(),
    ) -> Case {
        Case {
            view: OperationView {
                class, keyed, closed, attempts, max_attempts, layer_attempts, replayable, time_left,
            },
            verdict, code, hint, policy_attempts, max_server_delay, backoff, budget,
        }
    }
}

fn run(c: &Case) -> Next {
    let policy = c
        .view
        .class
        .policy()
        .into_builder()
        .max_attempts(c.policy_attempts)
        .max_server_delay(c.max_server_delay)
        .build()
        .unwrap();
    let classification = match c.verdict {
        Verdict::Success => Classification::success(),
        Verdict::Empty => Classification::empty(),
        Verdict::Failure(f) => Classification::failure(f, c.code).with_hint(c.hint),
    };
    let next = decide(&c.view, &classification, &policy, || c.backoff);
    settle(next, c.budget)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn decide_matches_the_reference_model(c in case()) {
        prop_assert_eq!(run(&c), model(&c));
    }

    /// Item 1 of the retry-decision issue: an ambiguous failure of a write that may not repeat
    /// is escalated whatever came with it (a hint, a spent budget, no copy, a past deadline).
    #[test]
    fn an_ambiguous_unsafe_write_is_always_escalated(mut c in case()) {
        c.view.closed = false;
        c.verdict = Verdict::Failure(FailureClass::Ambiguous);
        let expected = match c.view.class {
            ToolClass::UnkeyedWrite | ToolClass::MultiStep => ErrorCode::OutcomeUnknown,
            ToolClass::KeyedWrite if !c.view.keyed => ErrorCode::MissingIdempotencyKey,
            _ => return Ok(()),
        };
        prop_assert_eq!(run(&c), Next::GiveUp(GiveUp::Escalate(expected)));
    }

    /// A retry is granted only inside every limit.
    #[test]
    fn a_retry_respects_every_limit(c in case()) {
        if let Next::Retry { delay, .. } = run(&c) {
            prop_assert!(c.view.attempts < c.view.max_attempts);
            prop_assert!(c.view.layer_attempts < c.policy_attempts);
            prop_assert!(c.view.replayable && !c.view.closed && c.budget.is_ok());
            prop_assert!(c.hint != ServerHint::DoNotRetry);
            prop_assert!(c.view.time_left.is_none_or(|left| delay < left));
            prop_assert!(delay <= c.max_server_delay.max(c.backoff));
        }
    }
}

#[test]
fn reasons_and_codes_of_every_give_up() {
    let last = ErrorCode::Unavailable;
    let cases = [
        (
            GiveUp::Escalate(ErrorCode::OutcomeUnknown),
            "escalate",
            ErrorCode::OutcomeUnknown,
        ),
        (GiveUp::ServerPushback, "server_pushback", last),
        (GiveUp::NotReplayable, "not_replayable", last),
        (GiveUp::MaxAttempts, "max_attempts", last),
        (GiveUp::Deadline, "deadline", ErrorCode::DeadlineExceeded),
        (
            GiveUp::Budget(Refusal::RetryBudget),
            "retry_budget",
            ErrorCode::RetryBudgetExhausted,
        ),
        (
            GiveUp::Budget(Refusal::RunBudget),
            "run_budget",
            ErrorCode::RunBudgetExhausted,
        ),
    ];
    for (give_up, reason, code) in cases {
        assert_eq!(give_up.reason(), reason);
        assert_eq!(give_up.code(last), code);
    }
}

/// `under_key`, cell by cell: a 409 under its key is transient for a keyed write only; a 422
/// under a key is `idempotency_key_reused` for every class; nothing changes without a key, or
/// for a failure that carries no key conflict.
#[test]
fn key_conflicts_by_class_and_key() {
    use FailureClass::*;
    let conflict = Classification::failure(Permanent, ErrorCode::Conflict)
        .with_key_conflict(KeyConflict::InProgress)
        .with_hint(ServerHint::RetryAfter(Duration::from_secs(1)));
    let reused = Classification::failure(ModelRecoverable, ErrorCode::InvalidArgument)
        .with_key_conflict(KeyConflict::Reused);
    let plain_409 = Classification::failure(Permanent, ErrorCode::Conflict);
    for class in ToolClass::ALL {
        for keyed in [false, true] {
            let got = |c| {
                let m = under_key(class, keyed, c);
                (m.failure_class(), m.code())
            };
            let expected_409 = if keyed && class == ToolClass::KeyedWrite {
                (Some(Transient), Some(ErrorCode::InProgress))
            } else {
                (Some(Permanent), Some(ErrorCode::Conflict))
            };
            assert_eq!(got(conflict), expected_409, "{class:?} keyed {keyed}");
            let expected_422 = if keyed {
                (Some(Permanent), Some(ErrorCode::IdempotencyKeyReused))
            } else {
                (Some(ModelRecoverable), Some(ErrorCode::InvalidArgument))
            };
            assert_eq!(got(reused), expected_422, "{class:?} keyed {keyed}");
            assert_eq!(under_key(class, keyed, plain_409), plain_409);
            assert_eq!(
                under_key(class, keyed, Classification::success()),
                Classification::success()
            );
            // The server's hint stays.
            assert_eq!(under_key(class, keyed, conflict).hint(), conflict.hint());
        }
    }
}

proptest! {
    /// Through `decide`: a 409 of a keyed write carrying its key is retried whenever a
    /// transient failure would be, and every other 409 is handed back.
    #[test]
    fn a_409_is_retried_only_for_a_keyed_write_carrying_its_key(mut c in case()) {
        c.verdict = Verdict::Failure(FailureClass::Permanent);
        c.code = ErrorCode::Conflict;
        let policy = c.view.class.policy().into_builder()
            .max_attempts(c.policy_attempts)
            .max_server_delay(c.max_server_delay)
            .build()
            .unwrap();
        let classified = Classification::failure(FailureClass::Permanent, ErrorCode::Conflict)
            .with_key_conflict(KeyConflict::InProgress)
            .with_hint(c.hint);
        let mapped = under_key(c.view.class, c.view.keyed, classified);
        let next = settle(decide(&c.view, &mapped, &policy, || c.backoff), c.budget);
        let mut transient = c;
        transient.verdict = Verdict::Failure(FailureClass::Transient);
        transient.code = ErrorCode::InProgress;
        if c.view.keyed && c.view.class == ToolClass::KeyedWrite {
            prop_assert_eq!(next, model(&transient));
        } else {
            prop_assert_eq!(next, model(&c));
        }
    }
}
