//! The intent a call holds in the store, as a guard: whatever ends the call (an answer, an
//! error, a dropped future), the intent is settled once, the way tower's concurrency limit moves
//! its permit into the response future.

use super::store::{InDoubt, ReceiptStore, StoreError};
use std::time::Duration;
use tokio::time::Instant;

/// Where the call stands with its intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// `begin` or `claim` may have recorded it for this owner; nothing was sent yet.
    Unsent,
    /// The request was handed to the dependency: it may have taken effect.
    Sent,
    /// Settled (or never ours): nothing to do when dropped.
    Settled,
}

/// An intent this call may hold. Dropped unsettled, it removes an intent it recorded whose request
/// was never sent, and gives up the lease of any other (so the next attempt decides at once): one
/// that may have been sent, or one taken over from a caller that may have sent it.
/// A `begin` in flight when the call is dropped is covered too: the clean-up is queued after it
/// (the SQLite writer runs calls in order; PostgreSQL sends one key's calls on one connection).
pub(super) struct Intent<St: ReceiptStore> {
    store: St,
    key: String,
    owner: String,
    stage: Stage,
    /// Recorded by this call's `begin` (not taken over from a caller that may have sent it).
    fresh: bool,
    /// In doubt after the send (an ambiguous failure, a drop), keep the lease running instead of
    /// giving it up: the next attempt would read back, and a read-back must not run while the
    /// request may still land.
    hold: bool,
    /// The lease: how long a request may take to land after its send (the in-flight bound).
    lease: Duration,
    /// When the request was handed to the dependency.
    sent_at: Option<Instant>,
}

impl<St: ReceiptStore> Intent<St> {
    /// A guard for `key` held by `owner` for `lease`, made before `begin` is sent.
    pub(super) fn new(store: St, key: &str, owner: String, lease: Duration) -> Self {
        Intent {
            store,
            key: key.to_string(),
            owner,
            stage: Stage::Unsent,
            fresh: true,
            hold: false,
            lease,
            sent_at: None,
        }
    }

    /// In doubt after the send, this intent keeps its lease until it passes (see `hold`).
    pub(super) fn hold_lease_in_doubt(&mut self) {
        self.hold = true;
    }

    /// Whether the lease is kept in doubt.
    pub(super) fn holds_lease(&self) -> bool {
        self.hold
    }

    /// Keeps the intent with its lease running: the outcome is unknown, and nothing decides on
    /// it until the lease has passed.
    pub(super) fn keep(mut self) {
        self.stage = Stage::Settled;
    }

    pub(super) fn owner(&self) -> &str {
        &self.owner
    }

    /// A `begin` is about to be sent: whatever it records is this call's own (after a lost
    /// take-over, the next `begin` may find the record gone and record a fresh one).
    pub(super) fn recording(&mut self) {
        self.stage = Stage::Unsent;
        self.fresh = true;
    }

    /// The record found was not this call's: nothing to settle.
    pub(super) fn disown(&mut self) {
        self.stage = Stage::Settled;
    }

    /// Takes over a stale intent; `false` if another caller took it first. Until the store
    /// says it was taken, the record is not this call's: a claim cut short (dropped, or an
    /// error) leaves it alone, so a crashed caller's intent, which may have been sent, is never
    /// removed by a clean-up.
    pub(super) async fn claim(&mut self, lease: Duration) -> Result<bool, StoreError> {
        self.stage = Stage::Settled;
        self.fresh = false;
        let claimed = self.store.claim(&self.key, &self.owner, lease).await?;
        if claimed {
            self.stage = Stage::Unsent;
        }
        Ok(claimed)
    }

    /// The request is about to be handed over.
    pub(super) fn sent(&mut self) {
        self.stage = Stage::Sent;
        self.sent_at = Some(Instant::now());
    }

    /// The request sent, as the store records an attempt in doubt: it may land until the lease
    /// (the in-flight bound) after its send has passed.
    fn in_doubt(&self) -> Option<InDoubt> {
        self.sent_at.map(|at| InDoubt {
            sent_ago: at.elapsed(),
            lands_within: self.lease,
        })
    }

    /// Records the receipt. On failure the lease is given up, so the next attempt decides at
    /// once instead of waiting it out.
    pub(super) async fn complete(mut self, receipt: &[u8]) -> Result<(), StoreError> {
        let result = self.store.complete(&self.key, &self.owner, receipt).await;
        if result.is_ok() {
            self.stage = Stage::Settled;
        } else {
            self.release().await;
        }
        result
    }

    /// Keeps the intent and gives up its lease: the outcome is unknown, but this call's request
    /// cannot land any more (it was answered, or never sent). `true` if the store answered.
    pub(super) async fn release(mut self) -> bool {
        self.stage = Stage::Settled;
        self.store
            .release(&self.key, &self.owner, None)
            .await
            .is_ok()
    }

    /// Keeps the intent and gives up its lease after an attempt that ended in doubt: its
    /// request may still land, and the store records until when (see
    /// [`InDoubt`]). `true` if the store answered.
    pub(super) async fn release_in_doubt(mut self) -> bool {
        self.stage = Stage::Settled;
        let doubt = self.in_doubt();
        let released = self.store.release(&self.key, &self.owner, doubt).await;
        released.is_ok()
    }

    /// Removes the intent: this call provably did not take effect. An intent taken over from a
    /// caller that may have sent it is kept instead, lease given up: what this call did proves
    /// nothing about that one. The outcome to count (`abandoned` or `left_pending`), if the store
    /// answered.
    pub(super) async fn abandon(mut self) -> Option<&'static str> {
        self.stage = Stage::Settled;
        if !self.fresh {
            let kept = self.store.release(&self.key, &self.owner, None).await;
            return kept.is_ok().then_some("left_pending");
        }
        let removed = self.store.abandon(&self.key, &self.owner).await;
        removed.is_ok().then_some("abandoned")
    }
}

impl<St: ReceiptStore> Drop for Intent<St> {
    fn drop(&mut self) {
        let sent = match self.stage {
            Stage::Settled => return,
            Stage::Sent if self.hold => {
                // Dropped after the send, in doubt: the lease runs out on its own.
                crate::telemetry::receipt_outcome("cancelled_after_send");
                return;
            }
            Stage::Sent => true,
            Stage::Unsent => false,
        };
        let remove = !sent && self.fresh;
        crate::telemetry::receipt_outcome(if sent {
            "cancelled_after_send"
        } else {
            "not_sent"
        });
        // Sent and dropped: its request may still land.
        let doubt = self.in_doubt().filter(|_| sent);
        let (store, key, owner) = (
            self.store.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
        );
        let settle = async move {
            let _ = if remove {
                store.abandon(&key, &owner).await
            } else {
                store.release(&key, &owner, doubt).await
            };
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(settle)),
            Err(_) => tracing::warn!(
                "an intent was dropped outside a tokio runtime; its lease will pass on its own"
            ),
        }
    }
}
