//! [`ResponseFuture`]: one call with, after the delay, a second attempt racing the first.
//!
//! Its own example names the future; the [module docs of `hedge`](super) show a hedge winning
//! the race on a paused clock.

use super::decide::{decide, Decision, Op};
use super::HedgeState;
use crate::classify::{ClassifiedResponse, Classify, Verdict};
use crate::operation::ledger::with_current;
use crate::operation::Operation;
use crate::retry::Replay;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

/// What a call holds for its hedge until the delay passes: a clone of the service and a copy of
/// the request (made when the call was, as tower's `Hedge` does).
pub(super) struct Spare<S, Req> {
    pub(super) service: S,
    pub(super) request: Req,
    /// The operation the request carried, if it travels with requests of its type: the hedge
    /// decides on it and takes it along.
    pub(super) operation: Option<Operation>,
}

pin_project! {
    /// The future [`Hedge`](super::Hedge) returns: the first attempt, and after the delay a
    /// second one if the operation and the budget allow it; the first success wins and the
    /// other attempt is dropped (cancelled). A failure while the other attempt runs waits for
    /// it; if both fail, the later failure is the answer (for the
    /// [`Retry`](crate::retry::Retry) above to decide on, with both attempts counted). A failure
    /// before the hedge went is the answer at once, and no hedge follows it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::budget::RetryBudget;
    /// use stormguard::hedge::{future::ResponseFuture, HedgeLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let layer = HedgeLayer::fixed(RetryBudget::default(), Duration::from_millis(20)).build().unwrap();
    /// let mut svc = layer.layer(service_fn(|q: u32| async move { Ok::<_, std::io::Error>(q * 2) }));
    /// let future: ResponseFuture<_, _, _, u32> = svc.ready().await.unwrap().call(21);
    /// assert_eq!(future.await.unwrap(), 42);
    /// # }
    /// ```
    pub struct ResponseFuture<S, C, R, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        first: Option<S::Future>,
        #[pin]
        second: Option<S::Future>,
        #[pin]
        sleep: Option<Sleep>,
        spare: Option<Spare<S, Req>>,
        // The delay passed; the spare service is being driven ready.
        arming: bool,
        shared: Arc<HedgeState<C, R>>,
        // When the call started, if its latency is to be recorded (a read, hedged by percentile).
        started: Option<Instant>,
    }
}

impl<S, C, R, Req> ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    pub(super) fn new(
        first: S::Future,
        hedge: Option<(Spare<S, Req>, Instant)>,
        shared: Arc<HedgeState<C, R>>,
        started: Option<Instant>,
    ) -> Self {
        let (spare, sleep) = match hedge {
            Some((spare, at)) => (Some(spare), Some(tokio::time::sleep_until(at))),
            None => (None, None),
        };
        ResponseFuture {
            first: Some(first),
            second: None,
            sleep,
            spare,
            arming: false,
            shared,
            started,
        }
    }
}

impl<S, C, R, Req> Future for ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
    C: Classify<S::Response, S::Error>,
    R: Replay<Req>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // The attempts first (an answer at the very moment the delay passes wins): the
            // first success wins; a failure waits for the other attempt.
            for slot in 0..2 {
                let (mut mine, mut other) = if slot == 0 {
                    (this.first.as_mut(), this.second.as_mut())
                } else {
                    (this.second.as_mut(), this.first.as_mut())
                };
                let Some(future) = mine.as_mut().as_pin_mut() else {
                    continue;
                };
                let Poll::Ready(result) = future.poll(cx) else {
                    continue;
                };
                mine.set(None);
                let failed = matches!(
                    this.shared.classifier.classify(&result),
                    ClassifiedResponse::Ready(c) if matches!(c.verdict(), Verdict::Failure(_))
                );
                if failed && other.is_some() {
                    // The other attempt may still succeed: this failure is dropped.
                    continue;
                }
                if other.is_some() {
                    other.set(None); // the loser is cancelled
                    this.shared
                        .count(if slot == 0 { "first_won" } else { "hedge_won" });
                }
                // Answered (a success, or the last attempt's failure): no hedge after it.
                this.sleep.set(None);
                *this.spare = None;
                if let Some(started) = this.started {
                    this.shared.latencies.record(started.elapsed());
                }
                return Poll::Ready(result);
            }
            // The delay: once it passes, drive the spare ready, then decide and send.
            if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
                if sleep.poll(cx).is_ready() {
                    this.sleep.set(None);
                    *this.arming = true;
                }
            }
            if !*this.arming {
                return Poll::Pending;
            }
            let Some(spare) = this.spare.as_mut() else {
                *this.arming = false;
                return Poll::Pending;
            };
            match spare.service.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => {
                    // The spare cannot be used: wait for the first attempt alone.
                    *this.arming = false;
                    *this.spare = None;
                    this.shared.count("not_ready");
                    return Poll::Pending;
                }
                Poll::Ready(Ok(())) => {
                    *this.arming = false;
                    let spare = this.spare.take().expect("checked above");
                    match launch(this.shared, spare) {
                        // Poll the hedge once, in the loop, so it can wake this task.
                        Some(future) => this.second.set(Some(future)),
                        None => return Poll::Pending,
                    }
                }
            }
        }
    }
}

/// Decides the hedge (the operation's ledger, then the budget) and sends it if it may go.
fn launch<S, C, R, Req>(shared: &HedgeState<C, R>, mut spare: Spare<S, Req>) -> Option<S::Future>
where
    S: Service<Req>,
    R: Replay<Req>,
{
    let budget = || {
        shared
            .budget
            .try_withdraw(std::time::Duration::ZERO)
            .is_ok()
    };
    // The operation's ledger decides and counts the attempt. Without one in sight (the
    // request was copied while it was, the future is polled where it is not), nothing is sent:
    // the class is unknown.
    let mut previous = 1;
    let decide_on = |op: &mut crate::operation::ledger::OpState| {
        previous = op.attempts();
        let d = decide(
            Op {
                class: op.class(),
                attempts: op.attempts(),
                max_attempts: op.max_attempts(),
                closed: op.closed().is_some(),
            },
            budget,
        );
        if d == Decision::Go {
            op.grant_retry();
        }
        d
    };
    let decision = match &spare.operation {
        Some(op) => Some(op.with(decide_on)),
        None => with_current(decide_on),
    }
    .unwrap_or(Decision::NoOperation);
    shared.count(decision.label());
    if decision != Decision::Go {
        tracing::debug!(
            layer = &*shared.name,
            decision = decision.label(),
            "hedge not sent"
        );
        return None;
    }
    tracing::debug!(layer = &*shared.name, previous, "hedge sent");
    shared.replay.mark_retry(&mut spare.request, previous);
    if let Some(op) = &spare.operation {
        shared.replay.attach(&mut spare.request, op);
    }
    Some(spare.service.call(spare.request))
}

impl<S, C, R, Req> fmt::Debug for ResponseFuture<S, C, R, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("hedged", &self.second.is_some())
            .finish_non_exhaustive()
    }
}
