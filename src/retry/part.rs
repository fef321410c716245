//! [`LayerPart`]: what one retrying layer keeps of an operation while its future runs.

use super::Retrier;
use crate::backoff::BackoffState;
use crate::error::{ErrorCode, FailureClass};
use crate::operation::ledger::{with_current_or, Ledger, OpState};
use crate::operation::Operation;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// This layer's part of the operation: its own ledger (if it owns one), the attempts it made in
/// a row, whether a success credits its budget, and its retry state once it is retrying.
pub(super) struct LayerPart {
    /// The ledger this future owns (the outermost layer), or one it had to open after losing the
    /// operation it joined; `None` while it reads the one installed on the thread.
    pub(super) ledger: Option<Ledger>,
    /// Attempts this layer has made in a row for this call.
    pub(super) attempts: u32,
    /// Whether a success credits this layer's budget: the outermost layer's always, a nested
    /// one's when its budget differs from its caller's (decided when it joined).
    pub(super) credits: bool,
    /// What only a retry needs: boxed, made on the first failure, kept out of the future's size
    /// (nested futures contain each other, and are moved whole).
    pub(super) retry: Option<Box<Retrying>>,
    /// This layer owns no retries: it hands every retryable failure up, still retryable (a
    /// [nested](super::RetryLayer::nested) layer that found no operation to join, or a tool
    /// whose retries the model or the client own).
    pub(super) hands_up: bool,
    /// This layer joined an operation another layer opened (its owner): a retry its budget
    /// refuses, when that budget is not the owner's, is handed up for the owner to decide.
    pub(super) joined: bool,
}

/// The state of a layer that is retrying.
#[derive(Default)]
pub(super) struct Retrying {
    pub(super) backoff: Option<BackoffState>,
    /// The backoff's sleep, then the deadline's while the service gets ready.
    pub(super) sleep: Option<Pin<Box<Sleep>>>,
    /// The failure the pending retry follows, for the error if the deadline passes first.
    pub(super) last: Option<(FailureClass, ErrorCode)>,
}

impl LayerPart {
    /// Runs `f` on the operation: the ledger this future holds, else the one installed on the
    /// thread, else (the operation was lost across a task boundary) a new one of its own.
    pub(super) fn op<S, C, R, T>(
        &mut self,
        retrier: &Retrier<S, C, R>,
        f: impl FnOnce(&mut OpState) -> T,
    ) -> T {
        let attempts = self.attempts;
        with_current_or(
            &mut self.ledger,
            || {
                let policy = &retrier.policy;
                OpState::new(policy.max_attempts(), policy.class(), false, None)
                    .with_caller(retrier.budget.id())
                    .with_retries(attempts.saturating_sub(1))
            },
            f,
        )
    }

    /// The operation as a handle that can travel with a request: the ledger this future holds
    /// if it is on the heap, else the one installed on the thread.
    pub(super) fn operation(&self) -> Option<Operation> {
        match &self.ledger {
            Some(ledger) => Operation::of(ledger, crate::budget::scope::current()),
            None => Operation::current(),
        }
    }

    pub(super) fn retrying(&mut self) -> &mut Retrying {
        self.retry.get_or_insert_with(Box::default)
    }

    /// The class and code of the failure the pending retry follows.
    pub(super) fn last(&self) -> Option<(FailureClass, ErrorCode)> {
        self.retry.as_ref().and_then(|r| r.last)
    }

    pub(super) fn sleep(&mut self) -> Option<&mut Pin<Box<Sleep>>> {
        self.retry.as_mut()?.sleep.as_mut()
    }

    pub(super) fn sleep_for(&mut self, delay: Duration) {
        let at = Instant::now() + delay;
        let retrying = self.retrying();
        match retrying.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().reset(at),
            None if delay.is_zero() => {}
            None => retrying.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    pub(super) fn sleep_until(&mut self, deadline: Option<Instant>) {
        let retrying = self.retrying();
        match (deadline, retrying.sleep.as_mut()) {
            (None, _) => retrying.sleep = None,
            (Some(at), Some(sleep)) => sleep.as_mut().reset(at),
            (Some(at), None) => retrying.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// The sleep that ends at the operation's deadline `at`, made (or moved) only when it is
    /// not already there: polled while an attempt is in flight, to cut it off.
    pub(super) fn deadline_sleep(&mut self, at: Instant) -> &mut Pin<Box<Sleep>> {
        let retrying = self.retrying();
        let sleep = retrying
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() != at {
            sleep.as_mut().reset(at);
        }
        sleep
    }
}
