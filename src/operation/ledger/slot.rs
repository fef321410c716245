//! The thread-local slot a layer lends its operation's ledger through while it calls or polls
//! its inner service, and what the layers below do with what they find there.

use super::{lock, Joined, Ledger, OpState, Overruled, SharedState};
use crate::class::{Evidence, ToolClass};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// What this thread's slot holds while a layer's call or poll runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// No stormguard `Retry` is running here.
    Empty,
    /// The running operation's state is in `STATE`, lent by the future that owns it, and no
    /// layer has changed it yet: taking it back copies nothing.
    Inline,
    /// The same, changed by a layer below: taking it back copies it.
    InlineChanged,
    /// The running operation is on the heap, in `SHARED`.
    Shared,
}

// The kind is one byte, read first: a layer that finds `Empty` (the outermost, the common case)
// touches nothing else, and a state is copied only where one is lent or read.
thread_local! {
    static CURRENT: Cell<Slot> = const { Cell::new(Slot::Empty) };
    static STATE: Cell<OpState> = const { Cell::new(OpState::EMPTY) };
    /// Whether `STATE` holds a state lent by a future further up this thread's stack of calls
    /// (installed now or under what is installed now): one lent over it saves it first.
    static LENT: Cell<bool> = const { Cell::new(false) };
    static SHARED: RefCell<Option<SharedState>> = const { RefCell::new(None) };
}

/// Runs `f` on the operation installed on this thread, if there is one.
#[inline]
pub(crate) fn with_current<R>(f: impl FnOnce(&mut OpState) -> R) -> Option<R> {
    match CURRENT.get() {
        Slot::Inline | Slot::InlineChanged => Some(on_inline(f)),
        Slot::Shared => SHARED.with_borrow(|shared| shared.as_deref().map(|m| f(&mut lock(m)))),
        Slot::Empty => None,
    }
}

/// Runs `f` on the inline state lent to this thread (which then counts as changed).
#[inline]
fn on_inline<R>(f: impl FnOnce(&mut OpState) -> R) -> R {
    let mut state = STATE.get();
    let out = f(&mut state);
    STATE.set(state);
    CURRENT.set(Slot::InlineChanged);
    out
}

/// The deadline of the operation installed on this thread, if there is one and it has one.
#[inline]
pub(crate) fn current_deadline() -> Option<Instant> {
    with_current(|op| op.deadline()).flatten()
}

/// Whether the deadline of the operation installed on this thread has come: a layer that waited
/// inside its call (a keyed quota) sends nothing then.
#[inline]
pub(crate) fn current_deadline_passed() -> bool {
    current_deadline().is_some_and(|d| Instant::now() >= d)
}

/// Joins the operation installed on this thread, if there is one (see [`OpState::join`]), for
/// a layer on budget `budget`; the `bool` says whether the layer credits its budget on success.
#[inline]
pub(crate) fn join_current(
    class: ToolClass,
    keyed: bool,
    deadline: Option<Instant>,
    budget: u32,
    evidence: Option<Evidence>,
) -> (Joined, bool, Option<Overruled>) {
    with_current(|op| op.join(class, keyed, deadline, budget, evidence)).unwrap_or((
        Joined::No,
        true,
        None,
    ))
}

/// Moves the operation installed on this thread to the heap (once) and returns a handle to it.
pub(crate) fn share_current() -> Option<SharedState> {
    match CURRENT.get() {
        Slot::Shared => SHARED.with_borrow(Clone::clone),
        Slot::Inline | Slot::InlineChanged => {
            let shared = Arc::new(Mutex::new(STATE.get()));
            // `Installed` keeps `SHARED` empty while an inline ledger is installed.
            SHARED.set(Some(shared.clone()));
            CURRENT.set(Slot::Shared);
            Some(shared)
        }
        Slot::Empty => None,
    }
}

/// Lends `slot`'s ledger to this thread until dropped, then takes it back and restores whatever
/// was installed before (also when the inner call panics).
pub(crate) struct Installed<'a> {
    slot: &'a mut Option<Ledger>,
    previous: Slot,
    /// The inline state installed before, if this one replaced it (a carried or own operation
    /// inside another).
    previous_state: Option<OpState>,
    previous_shared: Option<SharedState>,
}

impl<'a> Installed<'a> {
    #[inline]
    pub(crate) fn new(slot: &'a mut Option<Ledger>) -> Self {
        let previous = CURRENT.get();
        let mut shared = None;
        let mut previous_state = None;
        let next = match slot {
            Some(Ledger::Inline(state)) => {
                if LENT.replace(true) {
                    previous_state = Some(STATE.get());
                }
                STATE.set(*state);
                Slot::Inline
            }
            Some(Ledger::Shared(_)) => {
                if let Some(Ledger::Shared(s)) = slot.take() {
                    shared = Some(s);
                }
                Slot::Shared
            }
            None => Slot::Empty,
        };
        CURRENT.set(next);
        let previous_shared = if shared.is_some() || previous == Slot::Shared {
            SHARED.replace(shared)
        } else {
            None
        };
        Installed {
            slot,
            previous,
            previous_state,
            previous_shared,
        }
    }
}

impl Drop for Installed<'_> {
    #[inline]
    fn drop(&mut self) {
        let mine = CURRENT.replace(self.previous);
        let lent_here = matches!(self.slot, Some(Ledger::Inline(_)));
        match (mine, &mut *self.slot) {
            (Slot::InlineChanged, Some(Ledger::Inline(held))) => *held = STATE.get(),
            // Ours, or moved to the heap while it was lent (`share_current`).
            (Slot::Shared, slot) => *slot = SHARED.take().map(Ledger::Shared),
            _ => {}
        }
        match self.previous_state.take() {
            Some(previous) => STATE.set(previous),
            // This one lent the only state: none is lent now.
            None if lent_here => LENT.set(false),
            None => {}
        }
        if let Some(previous) = self.previous_shared.take() {
            SHARED.set(Some(previous));
        }
    }
}

/// Runs `f` with `slot`'s ledger installed, if it holds one.
#[inline]
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
    match CURRENT.get() {
        Slot::Inline | Slot::InlineChanged => on_inline(f),
        Slot::Shared => match SHARED.with_borrow(Clone::clone) {
            Some(shared) => f(&mut lock(&shared)),
            None => own.insert(Ledger::inline(make())).with(f),
        },
        Slot::Empty => own.insert(Ledger::inline(make())).with(f),
    }
}
