//! Why a budget refused a retry: [`Refusal`], and the trace of a loan refused.

use super::lend::Short;
use crate::error::ErrorCode;
use crate::telemetry;

/// Why a budget refused a retry.
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::{Refusal, RetryBudget, RunLimits};
/// use stormguard::error::ErrorCode;
///
/// let run = RetryBudget::default().for_run(RunLimits::builder().max_retries(0).build()?);
/// let refusal = run.try_withdraw(Duration::ZERO).unwrap_err();
/// assert_eq!(refusal, Refusal::RunBudget);
/// assert_eq!(refusal.code(), ErrorCode::RunBudgetExhausted);
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The shared ratio budget (and its floor) is spent.
    RetryBudget,
    /// The run's own cap on retries or retry time is spent.
    RunBudget,
}

impl Refusal {
    /// The code of the error a refused retry ends with.
    pub const fn code(self) -> ErrorCode {
        match self {
            Refusal::RetryBudget => ErrorCode::RetryBudgetExhausted,
            Refusal::RunBudget => ErrorCode::RunBudgetExhausted,
        }
    }
}

/// A run was sent to the floor because it may not borrow (`short`: its share, or the limit on
/// what all runs owe).
#[cold]
pub(super) fn loan_refused(short: Short) {
    telemetry::loan_refused(short.as_str());
    tracing::debug!(
        reason = short.as_str(),
        "retry budget: no loan for this run; it has only the floor"
    );
}
