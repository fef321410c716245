//! One call through the failover: pick a target, send, classify, and either return the answer or
//! move on (the decisions are `decide`'s).

use super::decide::{away_for, leaves, pick, Away, Leave};
use super::trail::{Exhausted, Tried};
use super::Shared;
use crate::classify::FailureClass;
use crate::classify::{Classification, ClassifiedResponse, Classify};
use crate::error::{BoxError, ToolError};
use crate::operation::ledger::{with_current, OpState};
use crate::operation::Operation;
use crate::retry::Replay;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tower_service::Service;

/// Which targets are skipped, until when, and why each was left.
#[derive(Debug)]
pub(super) struct TargetState {
    pub(super) until: Vec<Away>,
    pub(super) why: Vec<Option<Leave>>,
}

impl TargetState {
    pub(super) fn new(targets: usize) -> Self {
        TargetState {
            until: vec![None; targets],
            why: vec![None; targets],
        }
    }
}

pub(super) fn lock(state: &Mutex<TargetState>) -> MutexGuard<'_, TargetState> {
    // Plain data, valid after any panic.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the operation the request carries, else on the one running on this task.
fn on_operation<T>(carried: &Option<Operation>, f: impl FnOnce(&mut OpState) -> T) -> Option<T> {
    match carried {
        Some(op) => Some(op.with(f)),
        None => with_current(f),
    }
}

/// Whether the call may go to one more target: the operation's deadline has not passed, its
/// attempts are not used up (the move is counted as one), and the budget grants it.
fn may_move<S, C, R, W>(shared: &Shared<S, C, R, W>, carried: &Option<Operation>) -> bool {
    let now = Instant::now();
    let open = on_operation(carried, |op| {
        op.deadline().is_none_or(|d| now < d) && op.attempts() < op.max_attempts()
    });
    if open == Some(false) || shared.budget.try_withdraw(Duration::ZERO).is_err() {
        return false;
    }
    on_operation(carried, |op| op.grant_retry());
    true
}

pub(super) async fn call<S, Req, C, R, W>(
    shared: Arc<Shared<S, C, R, W>>,
    req: Req,
) -> Result<S::Response, BoxError>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error>,
    R: Replay<Req>,
    W: super::Rewrite<Req>,
{
    let targets = shared.targets.len();
    let carried = shared.replay.operation(&req);
    let mut tried = vec![false; targets];
    let mut trail = Vec::new();
    let mut last: Option<(Classification, Option<BoxError>)> = None;
    let mut next = Some(req);
    loop {
        let Some(mut req) = next.take() else {
            return Err(exhausted(&shared, &tried, trail, last));
        };
        let now = Instant::now();
        let picked = {
            let mut state = lock(&shared.away);
            let picked = pick(&state.until, &tried, now);
            if let Some(i) = picked {
                if state.until[i].is_some() {
                    // Its wait has passed: this call probes it, later ones skip it meanwhile.
                    state.until[i] = Some(now + shared.probe_every);
                }
            }
            picked
        };
        let Some(i) = picked else {
            return Err(exhausted(&shared, &tried, trail, last));
        };
        if last.is_some() && !may_move(&shared, &carried) {
            return Err(exhausted(&shared, &tried, trail, last));
        }
        tried[i] = true;
        let (name, service) = &shared.targets[i];
        // A copy for the next target, if one may follow (a copy leaves the operation behind).
        if tried.iter().any(|t| !t) {
            next = shared.replay.replay(&req);
            if let (Some(copy), Some(op)) = (next.as_mut(), carried.as_ref()) {
                shared.replay.attach(copy, op);
            }
        }
        shared.rewrite.rewrite(&mut req, name);
        let mut service = service.clone();
        let result = match std::future::poll_fn(|cx| service.poll_ready(cx)).await {
            Ok(()) => service.call(req).await,
            Err(e) => Err(e),
        };
        let classification = match shared.classifier.classify(&result) {
            ClassifiedResponse::Ready(c) => c,
            // A stream: committed at its head, it stays where it is.
            ClassifiedResponse::RequiresEos(_) => return result.map_err(Into::into),
        };
        let Some(why) = leaves(&classification, shared.max_wait) else {
            let mut state = lock(&shared.away);
            state.until[i] = None;
            state.why[i] = None;
            return result.map_err(Into::into);
        };
        let until = Instant::now() + away_for(&classification, shared.probe_every);
        {
            let mut state = lock(&shared.away);
            state.until[i] = Some(until);
            state.why[i] = Some(why);
        }
        crate::telemetry::failover_left(name, why.as_str());
        tracing::info!(target = %name, why = why.as_str(), "failover: left the target");
        trail.push(Tried {
            target: name.clone(),
            why,
            sent: why != Leave::CircuitOpen,
        });
        last = Some((classification, result.err().map(Into::into)));
    }
}

/// The error of a call no target could serve: the last reason's code, every target left or
/// skipped in the hint and in its source.
fn exhausted<S, C, R, W>(
    shared: &Shared<S, C, R, W>,
    tried: &[bool],
    mut trail: Vec<Tried>,
    last: Option<(Classification, Option<BoxError>)>,
) -> BoxError {
    let now = Instant::now();
    let mut wait: Option<Duration> = None;
    {
        let state = lock(&shared.away);
        for (i, (name, _)) in shared.targets.iter().enumerate() {
            if let (false, Some(until), Some(why)) = (tried[i], state.until[i], state.why[i]) {
                let left = until.saturating_duration_since(now);
                wait = Some(wait.map_or(left, |w| w.min(left)));
                trail.push(Tried {
                    target: name.clone(),
                    why,
                    sent: false,
                });
            }
        }
    }
    let (why, class, source) = match last {
        Some((c, source)) => {
            let why = trail
                .iter()
                .rev()
                .find(|t| t.sent || t.why == Leave::CircuitOpen)
                .map_or(Leave::Unavailable, |t| t.why);
            (why, c.failure_class(), source)
        }
        None => (
            trail.first().map_or(Leave::Unavailable, |t| t.why),
            None,
            None,
        ),
    };
    let class = class.unwrap_or(match why {
        Leave::QuotaExhausted => FailureClass::Permanent,
        _ => FailureClass::Transient,
    });
    let exhausted = Exhausted::new(trail, wait, source);
    let mut err = ToolError::new(why.code())
        .with_class(class)
        .with_hint(exhausted.hint());
    if let Some(wait) = wait {
        err = err.with_retry_after(wait);
    }
    Box::new(err.with_source(exhausted))
}
