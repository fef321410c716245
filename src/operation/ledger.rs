//! The per-operation ledger and the thread-local slot that nested layers read it from.
//!
//! The outermost `Retry` of a logical operation owns the ledger. While it calls or polls its
//! inner service it installs the ledger in a thread-local slot, and every nested `Retry` reached
//! from there (synchronously, on the same thread) reads and updates it. Nothing is allocated and
//! no lock is taken while the ledger is `Inline`; it becomes `Shared` (one `Arc<Mutex<_>>`) only
//! when it must travel to another task (see [`Operation`](super::Operation)).

use crate::class::ToolClass;
use crate::error::ErrorCode;
use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// The state of one logical operation, shared by every nested layer it passes through.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpState {
    /// Retries granted so far, by any layer; attempts = retries + 1.
    pub(crate) retries: u32,
    /// The cap on attempts, set by the layer that opened the operation.
    pub(crate) max_attempts: u32,
    /// The strictest class any layer has declared for it.
    pub(crate) class: ToolClass,
    /// Whether an idempotency key was seen on the request.
    pub(crate) keyed: bool,
    /// When the operation's deadline passes.
    pub(crate) deadline: Option<Instant>,
    /// Set once a layer gave up: no other layer retries the operation.
    pub(crate) closed: Option<ErrorCode>,
}

impl OpState {
    pub(crate) fn new(
        max_attempts: u32,
        class: ToolClass,
        keyed: bool,
        deadline: Option<Instant>,
    ) -> Self {
        OpState {
            retries: 0,
            max_attempts,
            class,
            keyed,
            deadline,
            closed: None,
        }
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.retries.saturating_add(1)
    }
}

/// Where an operation's state lives.
#[derive(Debug)]
pub(crate) enum Ledger {
    /// Owned by the outermost layer's future, lent through the thread-local slot.
    Inline(OpState),
    /// Shared with another task.
    Shared(Arc<Mutex<OpState>>),
}

impl Ledger {
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut OpState) -> R) -> R {
        match self {
            Ledger::Inline(state) => f(state),
            Ledger::Shared(shared) => f(&mut lock(shared)),
        }
    }

    /// Makes the ledger shareable (once) and returns the shared handle.
    pub(crate) fn share(&mut self) -> Arc<Mutex<OpState>> {
        match self {
            Ledger::Shared(shared) => shared.clone(),
            Ledger::Inline(state) => {
                let shared = Arc::new(Mutex::new(*state));
                *self = Ledger::Shared(shared.clone());
                shared
            }
        }
    }
}

pub(crate) fn lock(shared: &Mutex<OpState>) -> MutexGuard<'_, OpState> {
    // The state is plain data, valid after any panic: a poisoned lock is still usable.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

thread_local! {
    static CURRENT: Cell<Option<Ledger>> = const { Cell::new(None) };
}

/// Runs `f` on the operation installed on this thread, if there is one.
pub(crate) fn with_current<R>(f: impl FnOnce(&mut Ledger) -> R) -> Option<R> {
    CURRENT.with(|slot| {
        let mut ledger = slot.take()?;
        let out = f(&mut ledger);
        slot.set(Some(ledger));
        Some(out)
    })
}

/// Lends `slot`'s ledger to this thread until dropped, then takes it back and restores whatever
/// was installed before (also when the inner call panics).
pub(crate) struct Installed<'a> {
    slot: &'a mut Option<Ledger>,
    previous: Option<Ledger>,
}

impl<'a> Installed<'a> {
    pub(crate) fn new(slot: &'a mut Option<Ledger>) -> Self {
        let previous = CURRENT.with(|c| c.replace(slot.take()));
        Installed { slot, previous }
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let mine = CURRENT.with(|c| c.replace(self.previous.take()));
        *self.slot = mine;
    }
}

/// Runs `f` with `slot`'s ledger installed, if it holds one.
pub(crate) fn in_scope<R>(slot: &mut Option<Ledger>, f: impl FnOnce() -> R) -> R {
    if slot.is_none() {
        return f();
    }
    let _installed = Installed::new(slot);
    f()
}

/// Runs `f` on `own`'s ledger if it holds one, else on the thread's, else on a new ledger made by
/// `make` and kept in `own` from then on.
pub(crate) fn with_current_or<R>(
    own: &mut Option<Ledger>,
    make: impl FnOnce() -> OpState,
    f: impl FnOnce(&mut OpState) -> R,
) -> R {
    if let Some(ledger) = own {
        return ledger.with(f);
    }
    CURRENT.with(|slot| match slot.take() {
        Some(mut ledger) => {
            let out = ledger.with(f);
            slot.set(Some(ledger));
            out
        }
        None => own.insert(Ledger::Inline(make())).with(f),
    })
}
