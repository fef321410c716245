//! Nested retry layers on budgets of their own, against a small reference model of the
//! documented rule (the `retry` module's steps 6, 7 and 9): attempts are the operation's; a
//! joined layer retries on its own budget up to its own `max_attempts` in a row, then hands the
//! failure up; a refusal by a budget that is not the owner's is handed up; the owner's budget
//! (and any layer on it) ends the operation. Success credits each layer's budget where it
//! differs from the layer's caller's.
mod support;

use proptest::prelude::*;
use std::time::Duration;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::RetryBudget;
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::classify::FailureClass;
use stormguard::error::ErrorCode;
use stormguard::retry::RetryLayer;
use support::{call, funded, Dependency, Outcome};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

/// A stack: layer 0 (the owner) first, each as (its budget, its `max_attempts`); what each
/// budget holds; how many calls fail before the dependency answers.
#[derive(Clone, Debug)]
struct Case {
    layers: Vec<(usize, u32)>,
    funds: Vec<u32>,
    failures: u32,
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec((0usize..3, 1u32..5), 1..4),
        proptest::collection::vec(0u32..5, 3),
        0u32..10,
    )
        .prop_map(|(layers, funds, failures)| Case {
            layers,
            funds,
            failures,
        })
}

/// What the model says: the dependency's calls, the ending (`None`: answered), and what each
/// budget holds after.
#[derive(Debug, PartialEq)]
struct Expected {
    calls: u32,
    ended: Option<ErrorCode>,
    balances: Vec<u32>,
}

enum Step {
    Answered,
    HandUp,
    Ended(ErrorCode),
}

struct Model<'a> {
    case: &'a Case,
    calls: u32,
    /// The operation's attempts (the first included).
    attempts: u32,
    balances: Vec<u32>,
}

impl Model<'_> {
    fn run(case: &Case) -> Expected {
        let mut m = Model {
            case,
            calls: 0,
            attempts: 1,
            balances: case.funds.clone(),
        };
        let ended = match m.layer(0) {
            Step::Answered => {
                // Each layer credits its budget where it differs from its caller's.
                let mut caller = None;
                for &(budget, _) in &case.layers {
                    if caller != Some(budget) {
                        m.balances[budget] += 1;
                    }
                    caller = Some(budget);
                }
                None
            }
            Step::Ended(code) => Some(code),
            Step::HandUp => unreachable!("the owner hands nothing up"),
        };
        Expected {
            calls: m.calls,
            ended,
            balances: m.balances,
        }
    }

    fn layer(&mut self, i: usize) -> Step {
        let (budget, max_attempts) = self.case.layers[i];
        let owner_budget = self.case.layers[0].0;
        let cap = self.case.layers[0].1;
        let mut in_a_row = 0;
        loop {
            in_a_row += 1;
            let below = if i + 1 == self.case.layers.len() {
                self.calls += 1;
                if self.calls > self.case.failures {
                    Step::Answered
                } else {
                    Step::HandUp // a failure, as a layer sees it
                }
            } else {
                self.layer(i + 1)
            };
            match below {
                Step::HandUp => {}
                done => return done,
            }
            if self.attempts >= cap {
                return Step::Ended(ErrorCode::Unavailable);
            }
            if i > 0 && in_a_row >= max_attempts {
                return Step::HandUp;
            }
            if self.balances[budget] > 0 {
                self.balances[budget] -= 1;
                self.attempts += 1;
                continue;
            }
            if i > 0 && budget != owner_budget {
                return Step::HandUp;
            }
            return Step::Ended(ErrorCode::RetryBudgetExhausted);
        }
    }
}

fn policy(max_attempts: u32) -> ClassPolicy {
    let backoff = Backoff::constant(Duration::from_millis(10))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    ClassPolicy::builder(ToolClass::Read)
        .max_attempts(max_attempts)
        .backoff(backoff)
        .build()
        .unwrap()
}

async fn measure(case: &Case) -> Expected {
    let budgets: Vec<RetryBudget> = case.funds.iter().map(|&n| funded(n)).collect();
    let dep = Dependency::script(
        (0..case.failures).map(|_| Outcome::Fail(FailureClass::Transient)),
        Outcome::Ok,
    );
    let mut stack: BoxCloneService<u32, u32, stormguard::error::BoxError> =
        BoxCloneService::new(dep.clone());
    for &(budget, max_attempts) in case.layers.iter().rev() {
        let layer = RetryLayer::new(policy(max_attempts), budgets[budget].clone());
        stack = BoxCloneService::new(layer.layer(stack).map_err(Into::into));
    }
    let ended = match call(&mut stack, 7).await {
        Ok(_) => None,
        Err(e) => Some(
            e.downcast::<stormguard::error::ToolError>()
                .expect("a ToolError")
                .code(),
        ),
    };
    Expected {
        calls: dep.calls(),
        ended,
        balances: budgets.iter().map(|b| b.balance().round() as u32).collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn nested_layers_on_their_own_budgets_match_the_model(case in case()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let measured = rt.block_on(measure(&case));
        prop_assert_eq!(measured, Model::run(&case), "{:?}", case);
    }
}

#[test]
fn the_model_covers_each_way_an_operation_ends() {
    // Owner funded, inner spent: the owner pays both retries (the inner hands them up).
    let handed_up = Case {
        layers: vec![(0, 3), (1, 3)],
        funds: vec![2, 0, 0],
        failures: 9,
    };
    let expected = Model::run(&handed_up);
    assert_eq!(expected.calls, 3);
    assert_eq!(expected.ended, Some(ErrorCode::Unavailable));
    assert_eq!(expected.balances, vec![0, 0, 0]);
    // Inner on the owner's (spent) budget: the first refusal ends it.
    let one_budget = Case {
        layers: vec![(0, 3), (0, 3)],
        funds: vec![0, 5, 0],
        failures: 9,
    };
    let expected = Model::run(&one_budget);
    assert_eq!(expected.calls, 1);
    assert_eq!(expected.ended, Some(ErrorCode::RetryBudgetExhausted));
    // Answered after two failures: the budgets that paid are credited.
    let answered = Case {
        layers: vec![(0, 3), (1, 3)],
        funds: vec![0, 2, 0],
        failures: 2,
    };
    assert_eq!(
        Model::run(&answered),
        Expected {
            calls: 3,
            ended: None,
            balances: vec![1, 1, 0]
        }
    );
}
