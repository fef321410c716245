//! The per-operation ledger and the thread-local slot that nested layers read it from.
//!
//! The outermost `Retry` of a logical operation owns the ledger. While it calls or polls its
//! inner service it installs the ledger in a thread-local slot, and every nested `Retry` reached
//! from there (synchronously, on the same thread) reads and updates it. While the ledger is
//! `Inline` it is plain `Copy` data ([`OpState`]) copied into the slot and back: no allocation
//! and no lock; the slot's kind is a byte of its own, so a layer that finds none copies nothing. It is `Shared` (one `Arc<Mutex<OpState>>`, kept in a second thread-local) when it
//! travels with a request or to another task (see [`Operation`](super::Operation)).

use crate::class::ToolClass;
use crate::error::ErrorCode;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

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
    /// The budget id (24 bits) of the layer calling into the stack now: a layer that joins
    /// credits its own budget on success only if it differs from this one, so a run of nested
    /// layers on one budget credits it once (0: none).
    caller: u32,
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

impl OpState {
    /// What the thread's state cell holds while no inline state is lent (never read then).
    const EMPTY: OpState = OpState {
        retries: 0,
        local: 0,
        max_attempts: 0,
        class: ToolClass::Read,
        keyed: false,
        closed: None,
        deadline: None,
        key: 0,
        caller: 0,
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
            deadline,
            key: 0,
            caller: 0,
        }
    }

    /// The layer that opened the operation draws on budget `id`.
    pub(crate) fn with_caller(mut self, id: u32) -> Self {
        self.caller = id & BUDGET_ID_MASK;
        self
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

    pub(crate) fn closed(&self) -> Option<ErrorCode> {
        self.closed
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
    ) -> (Joined, bool) {
        let budget = budget & BUDGET_ID_MASK;
        let credits = self.caller != budget;
        self.caller = budget;
        let was = self.class;
        self.class = was.strictest(class);
        self.keyed |= keyed;
        if let Some(deadline) = deadline {
            self.tighten_deadline(deadline);
        }
        let joined = if self.class == was {
            Joined::Yes
        } else {
            Joined::Tightened { was }
        };
        (joined, credits)
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
) -> (Joined, bool) {
    with_current(|op| op.join(class, keyed, deadline, budget)).unwrap_or((Joined::No, true))
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

#[cfg(test)]
mod tests;
