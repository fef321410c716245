//! The per-operation ledger and the thread-local slot that nested layers read it from.
//!
//! The outermost `Retry` of a logical operation owns the ledger. While it calls or polls its
//! inner service it installs the ledger in a thread-local slot, and every nested `Retry` reached
//! from there (synchronously, on the same thread) reads and updates it. While the ledger is
//! `Inline` it is plain `Copy` data ([`OpState`]) copied into the slot and back: no allocation
//! and no lock; the slot's kind is a byte of its own, so a layer that finds none copies nothing. It is `Shared` (one `Arc<Mutex<OpState>>`, kept in a second thread-local) when it
//! travels with a request or to another task (see [`Operation`](super::Operation)).

mod slot;

use crate::class::{Evidence, ToolClass};
use crate::error::ErrorCode;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

pub(crate) use slot::{
    current_deadline, current_deadline_passed, in_scope, join_current, share_current, with_current,
    with_current_or, Installed,
};

/// The state of one logical operation, shared by every nested layer it passes through. Layers
/// change it only through the named mutators below.
///
/// Aligned to 16 bytes, so that every copy of it (into the thread's slot and back, into a future)
/// moves the same aligned 16-byte pieces, and a load is served from the store before it.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
pub(crate) struct OpState {
    /// When the operation's deadline passes: the earliest of every layer's.
    deadline: Option<Instant>,
    /// A fingerprint of the idempotency key its first attempt carried (0: none yet).
    key: u64,
    /// Retries granted so far, by any layer; attempts = retries + 1.
    retries: u32,
    /// Attempts answered without reaching the dependency (a stored receipt, a refusal of the
    /// receipt layer): they count against the cap, not in the attempts an error reports.
    local: u32,
    /// The cap on attempts, set by the layer that opened the operation.
    max_attempts: u32,
    /// The strictest class any layer has declared for it.
    class: ToolClass,
    /// Whether an idempotency key was seen on the request.
    keyed: bool,
    /// Set once a layer gave up: no other layer retries the operation.
    closed: Option<ErrorCode>,
    /// What a request showed that made a layer decide stricter than it was declared (the first
    /// such evidence): the hint of the error the operation ends with says so.
    seen: Option<Evidence>,
    /// The budget id (24 bits) of the layer calling into the stack now: a layer that joins
    /// credits its own budget on success only if it differs from this one, so a run of nested
    /// layers on one budget credits it once (0: none).
    caller: u32,
    /// The budget id (24 bits) of the layer that opened the operation, its owner: a refusal by
    /// another budget is handed up to it (0: none).
    owner: u32,
}

/// What joining an operation did to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Joined {
    /// No operation is installed here: the layer opens its own.
    No,
    /// Joined; the operation's class is unchanged.
    Yes,
    /// Joined with a stricter class than the operation had (`was`): it now applies that class.
    Tightened { was: ToolClass },
}

/// A request's evidence made an operation decide stricter than its layers declared: what the
/// layer logs and counts (once per layer) and an ending's hint names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overruled {
    /// The class the layers declared.
    pub(crate) from: ToolClass,
    /// The class the operation decides as.
    pub(crate) to: ToolClass,
    /// What the request showed.
    pub(crate) evidence: Evidence,
}

impl OpState {
    /// What the thread's state cell holds while no inline state is lent (never read then).
    const EMPTY: OpState = OpState {
        retries: 0,
        local: 0,
        max_attempts: 0,
        class: ToolClass::Read,
        keyed: false,
        closed: None,
        seen: None,
        deadline: None,
        key: 0,
        caller: 0,
        owner: 0,
    };

    pub(crate) fn new(
        max_attempts: u32,
        class: ToolClass,
        keyed: bool,
        deadline: Option<Instant>,
    ) -> Self {
        OpState {
            retries: 0,
            local: 0,
            max_attempts,
            class,
            keyed,
            closed: None,
            seen: None,
            deadline,
            key: 0,
            caller: 0,
            owner: 0,
        }
    }

    /// The layer that opened the operation (its owner) draws on budget `id`.
    pub(crate) fn with_caller(mut self, id: u32) -> Self {
        self.caller = id & BUDGET_ID_MASK;
        self.owner = self.caller;
        self
    }

    /// Whether budget `id` is the account of the operation's owner (the layer that opened it).
    pub(crate) fn owned_by(&self, id: u32) -> bool {
        self.owner == id & BUDGET_ID_MASK
    }

    /// Attempts made so far, by every layer.
    pub(crate) fn attempts(&self) -> u32 {
        self.retries.saturating_add(1)
    }

    /// Attempts that reached the dependency: what an error reports.
    pub(crate) fn sent_attempts(&self) -> u32 {
        self.attempts().saturating_sub(self.local)
    }

    /// The attempt under way was answered without reaching the dependency.
    pub(crate) fn answered_locally(&mut self) {
        self.local = self.local.saturating_add(1).min(self.attempts());
    }

    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    pub(crate) fn class(&self) -> ToolClass {
        self.class
    }

    pub(crate) fn keyed(&self) -> bool {
        self.keyed
    }

    /// The key the attempt under way carried did not reach the dependency (the tool's body never
    /// read it): its failure is decided as a request without one (an ambiguous failure of a
    /// keyed write ends `missing_idempotency_key`; a 409 or 422 is not read as the key's). For
    /// this attempt only: the next one's key is noted again when it is stamped (a refusal that
    /// returned before the body read the key must not make the retry that reads it unkeyed).
    pub(crate) fn key_not_delivered(&mut self) {
        self.keyed = false;
    }

    /// The attempt under way was its key's first send (a fresh intent in the receipt store),
    /// so a 409 or 422 it was answered is the request's own, not the key's: decided as a
    /// request without a key, for this attempt only (as [`key_not_delivered`](Self::key_not_delivered)).
    pub(crate) fn conflict_not_the_keys(&mut self) {
        self.keyed = false;
    }

    pub(crate) fn closed(&self) -> Option<ErrorCode> {
        self.closed
    }

    /// The evidence that made a layer of the operation decide stricter than declared.
    pub(crate) fn seen(&self) -> Option<Evidence> {
        self.seen
    }

    /// Weighs the request's `evidence` against the class the state was opened with (see
    /// [`OpState::weigh`]).
    #[inline]
    pub(crate) fn with_evidence(self, evidence: Option<Evidence>) -> (Self, Option<Overruled>) {
        match evidence {
            // The common case (a GET, a plain value): nothing to weigh, nothing copied out of line.
            None => (self, None),
            Some(evidence) => self.with_seen(evidence),
        }
    }

    #[cold]
    #[inline(never)]
    fn with_seen(mut self, evidence: Evidence) -> (Self, Option<Overruled>) {
        let overruled = self.weigh(self.class, Some(evidence));
        if let Some(o) = overruled {
            self.class = o.to;
        }
        (self, overruled)
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Records that `retries` attempts before this one were made (an operation opened late, by a
    /// layer that lost the one it joined).
    pub(crate) fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// A layer on budget `budget` joins: the stricter class wins, a key is noted, the earlier
    /// deadline wins, and it becomes the caller. The `bool` says whether its budget differs from
    /// its caller's, so that it credits it on success.
    pub(crate) fn join(
        &mut self,
        class: ToolClass,
        keyed: bool,
        deadline: Option<Instant>,
        budget: u32,
        evidence: Option<Evidence>,
    ) -> (Joined, bool, Option<Overruled>) {
        let budget = budget & BUDGET_ID_MASK;
        let credits = self.caller != budget;
        self.caller = budget;
        let was = self.class;
        self.keyed |= keyed;
        let class = was.strictest(class);
        let overruled = self.weigh(class, evidence);
        self.class = overruled.map_or(class, |o| o.to);
        if let Some(deadline) = deadline {
            self.tighten_deadline(deadline);
        }
        let joined = if self.class == was {
            Joined::Yes
        } else {
            Joined::Tightened { was }
        };
        (joined, credits, overruled)
    }

    /// The class `class` becomes once the request's `evidence` is weighed, where that changes
    /// a decision (noted: the first evidence stands, and an ending's hint names it).
    pub(crate) fn weigh(
        &mut self,
        class: ToolClass,
        evidence: Option<Evidence>,
    ) -> Option<Overruled> {
        let evidence = evidence?;
        let to = evidence.overrule(class, self.keyed)?;
        self.seen.get_or_insert(evidence);
        Some(Overruled {
            from: class,
            to,
            evidence,
        })
    }

    /// The layer on budget `budget` calls into the stack again (a retry): the layers below
    /// compare their budgets with its.
    pub(crate) fn set_caller(&mut self, budget: u32) {
        self.caller = budget & BUDGET_ID_MASK;
    }

    /// The deadline becomes `deadline` if that is earlier.
    pub(crate) fn tighten_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(self.deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// A layer granted a retry.
    pub(crate) fn grant_retry(&mut self) {
        self.retries = self.retries.saturating_add(1);
    }

    /// A layer ended the operation with `code` (the first ending stands).
    pub(crate) fn close(&mut self, code: ErrorCode) {
        self.closed.get_or_insert(code);
    }

    /// The request carries a key with this fingerprint; `false` if an earlier attempt of the
    /// operation carried another one.
    pub(crate) fn note_key(&mut self, fingerprint: u64) -> bool {
        self.keyed = true;
        if self.key == 0 {
            self.key = fingerprint;
        }
        self.key == fingerprint
    }
}

/// Budget ids are 24 bits (see `RetryBudget::id`).
pub(crate) const BUDGET_ID_MASK: u32 = 0xff_ffff;

pub(crate) type SharedState = Arc<Mutex<OpState>>;

/// Where an operation's state lives while a future holds it.
#[derive(Debug)]
pub(crate) enum Ledger {
    /// Owned by the outermost layer's future, lent through the thread-local slot: plain data,
    /// copied in and out, no allocation and no lock.
    Inline(OpState),
    /// On the heap, shared with another task (it travels with a request, or was carried).
    Shared(SharedState),
}

impl Ledger {
    #[inline]
    pub(crate) fn inline(state: OpState) -> Ledger {
        Ledger::Inline(state)
    }

    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut OpState) -> R) -> R {
        match self {
            Ledger::Inline(state) => f(state),
            Ledger::Shared(shared) => f(&mut lock(shared)),
        }
    }
}

pub(crate) fn lock(shared: &Mutex<OpState>) -> MutexGuard<'_, OpState> {
    // The state is plain data, valid after any panic: a poisoned lock is still usable.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
