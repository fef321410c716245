//! Whether a hedge goes: a pure function of the operation and the budget's answer.

use crate::class::ToolClass;

/// Why a hedge did or did not go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Send the second attempt.
    Go,
    /// The operation was ended by a layer (nothing more is sent for it).
    Closed,
    /// The operation is not a `Read` (a nested layer declared a write): never hedged.
    NotRead,
    /// The operation's attempts are spent.
    AttemptsSpent,
    /// The retry budget refused.
    Budget,
    /// No operation in sight (no stormguard `Retry` above on this task): the class is unknown.
    NoOperation,
}

impl Decision {
    /// The label of this decision in metrics and traces.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Decision::Go => "sent",
            Decision::Closed => "closed",
            Decision::NotRead => "not_read",
            Decision::AttemptsSpent => "attempts_spent",
            Decision::Budget => "budget",
            Decision::NoOperation => "no_operation",
        }
    }
}

/// What the decision reads of the operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) class: ToolClass,
    pub(crate) attempts: u32,
    pub(crate) max_attempts: u32,
    pub(crate) closed: bool,
}

/// The hedge decision, in order: a closed operation, a class other than `Read`, spent attempts,
/// then the budget (asked last, as it is spent when it agrees).
pub(crate) fn decide(op: Op, budget: impl FnOnce() -> bool) -> Decision {
    if op.closed {
        Decision::Closed
    } else if op.class != ToolClass::Read {
        Decision::NotRead
    } else if op.attempts >= op.max_attempts {
        Decision::AttemptsSpent
    } else if !budget() {
        Decision::Budget
    } else {
        Decision::Go
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn class() -> impl Strategy<Value = ToolClass> {
        prop_oneof![
            Just(ToolClass::Read),
            Just(ToolClass::IdempotentWrite),
            Just(ToolClass::KeyedWrite),
            Just(ToolClass::UnkeyedWrite),
            Just(ToolClass::MultiStep),
        ]
    }

    proptest! {
        /// Against the rule as the docs state it: a hedge goes only for an open `Read`
        /// operation with an attempt left and the budget's consent, and the budget is asked only
        /// when everything else allows it.
        #[test]
        fn a_hedge_goes_only_for_an_open_read_with_an_attempt_left_and_the_budget(
            class in class(), attempts in 0u32..6, max in 1u32..6, closed: bool, grant: bool,
        ) {
            let mut asked = false;
            let d = decide(Op { class, attempts, max_attempts: max, closed }, || { asked = true; grant });
            let allowed = !closed && class == ToolClass::Read && attempts < max;
            prop_assert_eq!(asked, allowed);
            prop_assert_eq!(d == Decision::Go, allowed && grant);
            if class != ToolClass::Read {
                prop_assert_ne!(d, Decision::Go);
            }
        }
    }
}
