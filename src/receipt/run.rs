//! One call through the receipt layer: `begin`, then execute, resume, read back, wait or refuse.

use super::codec::Codec;
use super::decide::{plan, stale, Plan, Stale};
use super::intent::Intent;
use super::read_back::{Consistency, ReadBack, ReadBackResult};
use super::refuse::{
    answered_here, counted, key_reused, refusal, refused, store_down, EXPIRED_HINT,
    KEY_WINDOW_HINT, UNKNOWN_HINT,
};
use super::store::{Begin, ReceiptStore};
use crate::class::ToolClass;
use crate::classify::{ClassifiedResponse, Classify, FailureClass, KeyConflict, Verdict};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::key::{Action, IdempotencyKey};
use crate::operation::Operation;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;
use tower_service::Service;

/// The layer's settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Settings {
    pub(super) class: ToolClass,
    pub(super) lease: Duration,
    pub(super) wait: Duration,
    pub(super) poll: Duration,
    pub(super) retention: Duration,
    pub(super) key_window: Duration,
    pub(super) consistency: Consistency,
}

impl Settings {
    /// A class's settings with `config`'s times, polling every 50 ms, no consistent read-back.
    pub(super) fn new(class: ToolClass, config: super::ReceiptConfig) -> Settings {
        Settings {
            class,
            lease: config.lease,
            wait: config.wait,
            poll: Duration::from_millis(50),
            retention: config.retention,
            key_window: config.key_window,
            consistency: Consistency::Eventual,
        }
    }
}

/// What every call of one [`ReceiptGuard`](super::ReceiptGuard) guards with (store, classifier,
/// codec, read-back, settings): built once, one pointer cloned per call.
pub(super) struct GuardState<St, C, Cd, RB> {
    pub(super) store: St,
    pub(super) classifier: C,
    pub(super) codec: Cd,
    pub(super) read_back: RB,
    pub(super) settings: Settings,
}

/// One call: the service to send with (a clone, driven ready here), the action and its owner.
pub(super) struct Run<S, Req, St, C, Cd, RB> {
    pub(super) inner: S,
    pub(super) shared: Arc<GuardState<St, C, Cd, RB>>,
    pub(super) action: Action,
    /// The operation the request carries, if any: told when an attempt is answered here.
    pub(super) op: Option<Operation>,
    pub(super) _req: PhantomData<fn(Req)>,
}

/// A token unique to one call of the layer (process, a counter and a random seed, hashed).
pub(super) fn owner_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

impl<S, Req, St, C, Cd, RB> Run<S, Req, St, C, Cd, RB>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    St: ReceiptStore,
    C: Classify<S::Response, S::Error>,
    Cd: Codec<S::Response>,
    RB: ReadBack<Req, S::Response>,
{
    /// Asks the store first; waits (bounded) while another caller holds the intent.
    pub(super) async fn go(self, req: Req) -> Result<S::Response, BoxError> {
        let key = self.action.key().clone();
        let settings = self.shared.settings;
        let store = &self.shared.store;
        let mut intent = Intent::new(store.clone(), key.as_str(), owner_token(), settings.lease);
        let deadline = tokio::time::Instant::now() + settings.wait;
        loop {
            intent.recording();
            let begin = store
                .begin(
                    key.as_str(),
                    self.action.fingerprint(),
                    intent.owner(),
                    settings.lease,
                )
                .await
                .map_err(|e| store_down(e, self.op.as_ref()))?;
            let (age_ms, lease_left_ms) = match begin {
                Begin::Fresh => {
                    counted("fresh");
                    tracing::debug!(key = %key, "intent recorded; executing");
                    return self.execute(intent, req, false, 0).await;
                }
                Begin::Mismatch { done } => {
                    intent.disown();
                    answered_here(self.op.as_ref());
                    return Err(Box::new(key_reused(&key, done, false)));
                }
                Begin::Done { receipt, .. } => {
                    // A receipt on hand answers whatever its age: nothing is repeated.
                    intent.disown();
                    counted("receipt");
                    answered_here(self.op.as_ref());
                    tracing::debug!(key = %key, "receipt found; not executing");
                    let hint = if self.shared.codec.stores() {
                        "this action completed, but its stored receipt cannot be read as this tool's answer (a receipt an operator settles must be encoded with the tool's codec: HttpCodec for an http::Response, the JSON of a serde type); do not repeat it; escalate"
                    } else {
                        "this action completed (its receipt is recorded) but its answer was a stream, which is not stored; do not repeat it"
                    };
                    return self.shared.codec.decode(&receipt).map_err(|e| {
                        Box::new(
                            ToolError::new(ErrorCode::Internal)
                                .with_hint(hint)
                                .with_retryable(false)
                                .with_source(e),
                        ) as BoxError
                    });
                }
                Begin::Pending {
                    age_ms,
                    lease_left_ms,
                } => {
                    // Another caller's record: nothing of this call's to clean up while waiting.
                    intent.disown();
                    (age_ms, lease_left_ms)
                }
            };
            if u128::from(age_ms) > settings.retention.as_millis() {
                intent.disown();
                return Err(refused(
                    ErrorCode::ReceiptExpired,
                    &key,
                    EXPIRED_HINT,
                    self.op.as_ref(),
                ));
            }
            if lease_left_ms == 0 {
                let next = stale(&settings, age_ms);
                if let Stale::Escalate = next {
                    intent.disown();
                    let hint = if settings.class == ToolClass::KeyedWrite {
                        KEY_WINDOW_HINT
                    } else {
                        UNKNOWN_HINT
                    };
                    return Err(refused(
                        ErrorCode::OutcomeUnknown,
                        &key,
                        hint,
                        self.op.as_ref(),
                    ));
                }
                if intent
                    .claim(settings.lease)
                    .await
                    .map_err(|e| store_down(e, self.op.as_ref()))?
                {
                    if let Stale::ReadBack = next {
                        return self.read_back(intent, req, age_ms).await;
                    }
                    counted("resumed_with_key");
                    tracing::info!(key = %key, "pending intent without receipt; executing again with the same key");
                    return self.execute(intent, req, true, age_ms).await;
                }
                // Another caller took it over first: wait for its receipt like any duplicate.
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                intent.disown();
                return Err(refusal(ErrorCode::InProgress, &key, self.op.as_ref()));
            }
            let nap = settings
                .poll
                .min(Duration::from_millis(lease_left_ms.max(1)))
                .min(deadline - now);
            tokio::time::sleep(nap).await;
        }
    }

    /// A stale intent this call has claimed, of a write no key protects, with a consistent
    /// read-back declared.
    async fn read_back(
        self,
        intent: Intent<St>,
        req: Req,
        age_ms: u64,
    ) -> Result<S::Response, BoxError> {
        let key = self.action.key().clone();
        match self.shared.read_back.read_back(&req).await {
            ReadBackResult::Found(res) => {
                counted("read_back_found");
                answered_here(self.op.as_ref());
                tracing::info!(key = %key, "read-back found the effect; recording its receipt");
                match self.shared.codec.encode(&res) {
                    Ok(bytes) => {
                        record(intent, &key, &bytes).await;
                    }
                    Err(e) => not_stored(intent, &key, e.to_string()).await,
                }
                Ok(res)
            }
            ReadBackResult::Absent => {
                counted("read_back_absent");
                tracing::info!(key = %key, "read-back found no effect; executing");
                self.execute(intent, req, true, age_ms).await
            }
            ReadBackResult::Unknown => {
                intent.release().await;
                let hint = if self.shared.settings.class == ToolClass::KeyedWrite {
                    KEY_WINDOW_HINT
                } else {
                    UNKNOWN_HINT
                };
                Err(refused(
                    ErrorCode::OutcomeUnknown,
                    &key,
                    hint,
                    self.op.as_ref(),
                ))
            }
        }
    }

    /// Sends the request (driving the inner service ready first: a call answered from the store
    /// never waits for, or spends, the readiness of what is below), then settles the intent.
    ///
    /// `age_ms` is the intent's age when this call took it (0 for a fresh one): if a later
    /// attempt could settle a doubt about this one by a read-back (judged at the age the intent
    /// will have when this lease runs out), the lease is kept running after an ambiguous failure
    /// (or a drop), so the read-back cannot run while the request may still land at the
    /// provider.
    async fn execute(
        mut self,
        mut intent: Intent<St>,
        req: Req,
        resumed: bool,
        age_ms: u64,
    ) -> Result<S::Response, BoxError> {
        // Judged at the age the intent may have when its lease runs out: a keyed write that
        // crosses its key window during the attempt, or before a reissue, is read back then.
        let settings = &self.shared.settings;
        let lease_ms = u64::try_from(settings.lease.as_millis()).unwrap_or(u64::MAX);
        if let Stale::ReadBack = stale(settings, age_ms.saturating_add(lease_ms)) {
            intent.hold_lease_in_doubt();
        }
        let key = self.action.key().clone();
        if let Err(e) = std::future::poll_fn(|cx| self.inner.poll_ready(cx)).await {
            // Never sent: forget the intent (keep one taken over, lease given up).
            answered_here(self.op.as_ref());
            if let Some(outcome) = intent.abandon().await {
                counted(outcome);
            }
            return Err(e.into());
        }
        if crate::operation::ledger::current_deadline_passed() {
            // The wait for readiness outlasted the operation's deadline: never sent, as above.
            if let Some(outcome) = intent.abandon().await {
                counted(outcome);
            }
            return Err(Box::new(crate::error::hint::not_sent_by_deadline()));
        }
        intent.sent();
        let result = self.inner.call(req).await;
        let (verdict, conflict) = match self.shared.classifier.classify(&result) {
            ClassifiedResponse::Ready(c) => (c.verdict(), c.key_conflict()),
            // A streamed answer's outcome comes at its end, after this layer has handed it on:
            // it is not a receipt. The intent stays pending (lease given up) for a read-back
            // or `resolve` to settle.
            ClassifiedResponse::RequiresEos(_) => (Verdict::Failure(FailureClass::Ambiguous), None),
        };
        // A 409 or 422 is the key's only if the key reached the provider: a declared tool's body
        // that never read it did not send it (the operation says so), and the answer is its own.
        // Nor is it the key's on the key's first send (a fresh intent: no request of this key
        // was ever recorded): a provider's 409 "already sent" or 422 "amount must be positive"
        // to a first request is about the request, not an earlier one with the key.
        let conflict =
            conflict.filter(|_| self.op.as_ref().is_none_or(|op| op.with(|s| s.keyed())));
        let conflict = match conflict {
            Some(_) if !resumed => {
                first_send_conflict(self.op.as_ref());
                None
            }
            conflict => conflict,
        };
        match plan(&result, verdict, conflict, &self.shared.codec) {
            Plan::Record(bytes) => {
                if record(intent, &key, &bytes).await {
                    tracing::debug!(key = %key, resumed, "receipt recorded");
                }
            }
            Plan::NotEncoded(why) => not_stored(intent, &key, why).await,
            Plan::NoReceipt => {
                // Done, but its codec stores no receipt (a streamed answer): the intent stays
                // pending, its lease given up, as for any streamed answer.
                if intent.release().await {
                    counted("left_pending");
                }
                tracing::debug!(key = %key, "answered; its codec stores no receipt, the intent stays pending");
            }
            Plan::KeyHeld(conflict) => {
                // The provider holds this key from an earlier request (409: still running; 422:
                // with other arguments): that one may have taken effect, whatever became of this
                // one. Keep the intent (lease given up) for the next attempt or an operator.
                if intent.release().await {
                    counted("left_pending");
                }
                tracing::info!(key = %key, ?conflict, "the provider holds this key from an earlier request; the intent stays pending");
                if conflict == KeyConflict::Reused {
                    let theirs = match result {
                        Err(e) => Some(e.into()),
                        Ok(res) => self
                            .shared
                            .classifier
                            .dependency_error(&res)
                            .map(|e| Box::new(e) as BoxError),
                    };
                    let err = key_reused(&key, false, true);
                    return Err(Box::new(match theirs {
                        Some(theirs) => err.with_source(theirs),
                        None => err,
                    }));
                }
            }
            Plan::InDoubt if intent.holds_lease() => {
                // It may have taken effect, and may still: the next attempt reads back, so the
                // lease runs out first (it outlasts the provider's in-flight time).
                intent.keep();
                counted("left_pending");
                tracing::info!(key = %key, "ambiguous failure; the intent stays pending, its lease running until a read-back is safe");
            }
            Plan::InDoubt => {
                // It may have taken effect, and may still land: keep the intent, give up the
                // lease, and record until when its request may land (no operator settles it
                // "not done" before that).
                if intent.release_in_doubt().await {
                    counted("left_pending");
                }
                tracing::info!(key = %key, "ambiguous failure; the intent stays pending");
            }
            Plan::Abandon => {
                // This call did not take effect: forget the intent, so a later call starts
                // fresh (one taken over from a crashed caller stays, lease given up).
                if let Some(outcome) = intent.abandon().await {
                    counted(outcome);
                }
                tracing::debug!(key = %key, "failure without effect; intent removed unless taken over");
            }
        }
        result.map_err(Into::into)
    }
}

/// Stores the receipt; `true` if it was stored. A failure is logged, not returned: the effect
/// happened, the intent stays pending with its lease given up, and the next attempt decides at
/// once (with the same key, or by read-back, or escalated).
async fn record<St: ReceiptStore>(intent: Intent<St>, key: &IdempotencyKey, bytes: &[u8]) -> bool {
    match intent.complete(bytes).await {
        Ok(()) => {
            counted("recorded");
            true
        }
        Err(e) => {
            counted("receipt_not_stored");
            tracing::error!(key = %key, error = %e, "the receipt could not be stored; its lease was given up and the next attempt decides again");
            false
        }
    }
}

/// The result could not be encoded: the effect happened, so the intent stays, lease given up.
async fn not_stored<St: ReceiptStore>(intent: Intent<St>, key: &IdempotencyKey, why: String) {
    counted("receipt_not_stored");
    tracing::error!(key = %key, error = %why, "the result could not be encoded as a receipt; the intent stays pending");
    intent.release().await;
}

/// A 409 or 422 answered to its key's first send: the request's own answer. The retry above
/// decides it as a request without a key (a conflict, invalid arguments), not as the key's.
#[cold]
fn first_send_conflict(op: Option<&crate::operation::Operation>) {
    match op {
        Some(op) => op.with(|s| s.conflict_not_the_keys()),
        None => {
            crate::operation::ledger::with_current(|s| s.conflict_not_the_keys());
        }
    }
}
