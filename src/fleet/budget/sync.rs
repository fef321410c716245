//! The lease's sync with Redis: one script deposits the batch of successes and tops the lease
//! up; a sync that got no answer goes again first, with the same id (see
//! [`outbox`](super::super::outbox)).

use super::{Lease, HEARTBEAT};
use crate::fleet::link::Failed;
use crate::fleet::outbox::Outbox;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Lease {
    /// One sync: first the last sync again if it got no answer (Redis applies it once, or
    /// answers it from memory), then deposit the new batch, top the lease up (or give it back
    /// when `closing`); a heartbeat at least every [`HEARTBEAT`], so the others know this worker's
    /// lease is alive. The first sync always goes: until it answers the budget is not ready.
    pub(in crate::fleet) async fn sync(
        &self,
        outbox: &mut Outbox<Ask>,
        closing: bool,
    ) -> Result<(), Failed> {
        if let Some((id, mut ask)) = outbox.unanswered() {
            // What it still holds is a report, not a change: send what is true now.
            ask.held = self.held();
            let answer = self.send(ask, id).await?;
            outbox.answered();
            self.apply(answer);
        }
        let Some(ask) = self.next_ask(closing) else {
            return Ok(());
        };
        let id = outbox.send(ask);
        // No answer: the batch waits in the outbox, to go again first (never merged, never lost).
        let answer = self.send(ask, id).await?;
        outbox.answered();
        self.apply(answer);
        Ok(())
    }

    /// The next sync's ask, taking the batch of successes (and the lease, when `closing`); `None`
    /// when there is nothing to ask and no heartbeat due.
    fn next_ask(&self, closing: bool) -> Option<Ask> {
        let held = self.balance.load(Ordering::Acquire);
        let want = if closing {
            0
        } else {
            (self.lease - held).max(0)
        };
        let floor_expired = self.now() >= self.floor_until.load(Ordering::Acquire);
        let want_floor = u32::from(
            !closing
                && self.terms.floor > 0
                && (floor_expired || self.floor.load(Ordering::Acquire) == 0),
        );
        let quiet = self.synced.load(Ordering::Acquire)
            && self
                .now()
                .saturating_sub(self.last_sync.load(Ordering::Acquire))
                < HEARTBEAT.as_nanos() as u64;
        let pending = self.pending.load(Ordering::Acquire);
        if !closing && pending == 0 && want == 0 && want_floor == 0 && quiet {
            return None;
        }
        let successes = self.pending.swap(0, Ordering::AcqRel);
        let give_back = if closing {
            self.balance.swap(0, Ordering::AcqRel)
        } else {
            0
        };
        Some(Ask {
            deposit: (successes as i64).saturating_mul(self.terms.deposit),
            give_back,
            want,
            want_floor,
            exact: false,
            held: self.balance.load(Ordering::Acquire),
            closing,
        })
    }

    async fn send(&self, ask: Ask, id: u64) -> Result<Answer, Failed> {
        let (granted, floor, _balance, window_left_ms) = self
            .link
            .eval::<(i64, i64, i64, i64)>(&self.invocation(ask, Some(id)))
            .await?;
        Ok(Answer {
            granted,
            floor,
            window_left: Duration::from_millis(window_left_ms.max(0) as u64),
        })
    }

    fn apply(&self, answer: Answer) {
        self.balance.fetch_add(answer.granted, Ordering::AcqRel);
        if answer.floor > 0 {
            let until = self.now() + answer.window_left.as_nanos() as u64;
            self.floor_until.store(until, Ordering::Release);
            self.floor.store(answer.floor as u32, Ordering::Release);
        }
        self.last_sync.store(self.now(), Ordering::Release);
        if !self.synced.swap(true, Ordering::AcqRel) {
            self.synced_now.notify_waiters();
        }
    }
}

/// What the script granted.
#[derive(Clone, Copy, Debug)]
struct Answer {
    granted: i64,
    floor: i64,
    window_left: Duration,
}

/// What one sync asks of the script.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::fleet) struct Ask {
    /// Milli-retries deposited by the batch of successes.
    pub(super) deposit: i64,
    /// Milli-retries of the lease given back.
    pub(super) give_back: i64,
    /// Milli-retries wanted for the lease (or, `exact`, for one retry now).
    pub(super) want: i64,
    pub(super) want_floor: u32,
    pub(super) exact: bool,
    /// Milli-retries this worker still holds, after its give back.
    pub(super) held: i64,
    /// The lease closes: the script forgets its last sync (nothing follows).
    pub(super) closing: bool,
}

/// Syncs while the budget lives (woken by a low lease, else every `sync_interval`), then gives
/// the lease back.
pub(super) async fn sync_task(lease: Arc<Lease>) {
    let every = lease.link.settings.sync_interval;
    let mut outbox = Outbox::new();
    // The first sync at once: until it answers the budget decides locally.
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                _ = lease.wake.notified() => {}
                _ = tokio::time::sleep(every) => {}
            }
        }
        first = false;
        if Arc::strong_count(&lease) == 1 {
            if lease.link.is_up() {
                let _ = lease.sync(&mut outbox, true).await;
            }
            return;
        }
        if !lease.link.is_up() {
            // The ping brings the fleet back; wait for it rather than spin on every wake.
            let _ = lease.link.wait_up(every).await;
            first = lease.link.is_up();
            continue;
        }
        if let Err(e) = lease.sync(&mut outbox, false).await {
            tracing::debug!(budget = %lease.keys[0], error = %e, "fleet budget: sync failed");
        }
    }
}
