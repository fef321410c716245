//! The per-operation ledger and the thread-local slot that nested layers read it from.
//!
//! The outermost `Retry` of a logical operation owns the ledger. While it calls or polls its
//! inner service it installs the ledger in a thread-local slot, and every nested `Retry` reached
//! from there (synchronously, on the same thread) reads and updates it. While the ledger is
//! `Inline` it is plain `Copy` data in a thread-local without a destructor: installing it is two
//! moves, with no allocation and no lock. It becomes `Shared` (one `Arc<Mutex<_>>`, kept in a
//! second thread-local) only when it must travel to another task (see
//! [`Operation`](super::Operation)).

use crate::class::ToolClass;
use crate::error::ErrorCode;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// The state of one logical operation, shared by every nested layer it passes through. Layers
/// change it only through the named mutators below.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpState {
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
    /// When the operation's deadline passes: the earliest of every layer's.
    deadline: Option<Instant>,
    /// A fingerprint of the idempotency key its first attempt carried (0: none yet).
    key: u64,
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

pub(crate) type SharedState = Arc<Mutex<OpState>>;

/// An operation's state packed into one word (and its deadline beside it), as the outermost
/// layer's future holds it.
#[derive(Debug)]
pub(crate) struct Inline {
    word: u64,
    deadline: Option<Instant>,
    key: u64,
}

/// Where an operation's state lives while a future holds it.
#[derive(Debug)]
pub(crate) enum Ledger {
    /// Owned by the outermost layer's future, lent through the thread-local slot.
    Inline(Inline),
    /// Shared with another task.
    Shared(SharedState),
}

impl Ledger {
    #[inline]
    pub(crate) fn inline(state: OpState) -> Ledger {
        Ledger::Inline(Inline {
            word: pack(&state),
            deadline: state.deadline,
            key: state.key,
        })
    }

    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut OpState) -> R) -> R {
        match self {
            Ledger::Inline(inline) => {
                let mut state = unpack(inline.word, inline.deadline, inline.key);
                let out = f(&mut state);
                inline.word = pack(&state);
                inline.deadline = state.deadline;
                inline.key = state.key;
                out
            }
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

// The thread-local slot holds the packed word, and two side slots that are read only when the
// word's bit says they hold something: the deadline and the key fingerprint. Lending the ledger
// is a couple of register moves: no destructor runs, nothing is allocated, no lock is taken.
//
// word: bits 0-7 retries, 8-15 max_attempts (both at most `MAX_ATTEMPTS_LIMIT` = 100),
//       16-19 class, 20 keyed, 21 has a deadline (in `DEADLINE`), 22 has a key fingerprint (in
//       `KEY`), 23-28 closed code + 1 (0 = open), 29-35 attempts answered locally (at most the
//       attempts), 36-59 the caller's budget id, 62-63 tag.
const TAG_SHIFT: u32 = 62;
const EMPTY: u64 = 0;
const INLINE: u64 = 1;
const SHARED_TAG: u64 = 2;
const CLASS_SHIFT: u32 = 16;
const CLASS: u64 = 0xf << CLASS_SHIFT;
const KEYED: u64 = 1 << 20;
const HAS_DEADLINE: u64 = 1 << 21;
const HAS_KEY: u64 = 1 << 22;
const CLOSED_SHIFT: u32 = 23;
const CLOSED: u64 = 0x3f;
const LOCAL_SHIFT: u32 = 29;
const LOCAL: u64 = 0x7f;
const CALLER_SHIFT: u32 = 36;
// Every class and every closing code fits its bits.
const _: () = assert!(ToolClass::ALL.len() <= 0xf && ErrorCode::ALL.len() < CLOSED as usize);

/// Budget ids are 24 bits (see `RetryBudget::id`).
pub(crate) const BUDGET_ID_MASK: u32 = 0xff_ffff;
const CALLER: u64 = (BUDGET_ID_MASK as u64) << CALLER_SHIFT;

#[inline]
fn tag(word: u64) -> u64 {
    word >> TAG_SHIFT
}

#[inline]
fn pack(state: &OpState) -> u64 {
    let closed = state.closed.map_or(0, |code| code as u64 + 1);
    let flag = |set: bool, bit: u64| if set { bit } else { 0 };
    u64::from(state.retries.min(0xff))
        | u64::from(state.max_attempts.min(0xff)) << 8
        | (state.class as u64) << CLASS_SHIFT
        | flag(state.keyed, KEYED)
        | flag(state.deadline.is_some(), HAS_DEADLINE)
        | flag(state.key != 0, HAS_KEY)
        | (closed & CLOSED) << CLOSED_SHIFT
        | u64::from(state.local).min(LOCAL) << LOCAL_SHIFT
        | u64::from(state.caller & BUDGET_ID_MASK) << CALLER_SHIFT
        | INLINE << TAG_SHIFT
}

#[inline]
fn unpack(word: u64, deadline: Option<Instant>, key: u64) -> OpState {
    let class = ToolClass::ALL
        .get(((word & CLASS) >> CLASS_SHIFT) as usize)
        .copied()
        .unwrap_or(ToolClass::MultiStep);
    let closed = match ((word >> CLOSED_SHIFT) & CLOSED) as usize {
        0 => None,
        n => Some(
            ErrorCode::ALL
                .get(n - 1)
                .copied()
                .unwrap_or(ErrorCode::Internal),
        ),
    };
    OpState {
        retries: (word & 0xff) as u32,
        local: ((word >> LOCAL_SHIFT) & LOCAL) as u32,
        max_attempts: ((word >> 8) & 0xff) as u32,
        class,
        keyed: word & KEYED != 0,
        closed,
        deadline: deadline.filter(|_| word & HAS_DEADLINE != 0),
        key: if word & HAS_KEY != 0 { key } else { 0 },
        caller: ((word & CALLER) >> CALLER_SHIFT) as u32,
    }
}

thread_local! {
    static CURRENT: Cell<u64> = const { Cell::new(EMPTY) };
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static KEY: Cell<u64> = const { Cell::new(0) };
    static SHARED: RefCell<Option<SharedState>> = const { RefCell::new(None) };
}

/// The side slots of an installed inline word: each read only when the word's bit is set.
#[inline]
fn read_sides(word: u64) -> (Option<Instant>, u64) {
    (
        if word & HAS_DEADLINE != 0 {
            DEADLINE.get()
        } else {
            None
        },
        if word & HAS_KEY != 0 { KEY.get() } else { 0 },
    )
}

/// Writes the side slots the state uses.
#[inline]
fn write_sides(state: &OpState) {
    if state.deadline.is_some() {
        DEADLINE.set(state.deadline);
    }
    if state.key != 0 {
        KEY.set(state.key);
    }
}

/// Runs `f` on the operation installed on this thread, if there is one.
#[inline]
pub(crate) fn with_current<R>(f: impl FnOnce(&mut OpState) -> R) -> Option<R> {
    let word = CURRENT.get();
    match tag(word) {
        INLINE => Some(with_installed_inline(word, f)),
        SHARED_TAG => SHARED.with_borrow(|shared| shared.as_deref().map(|m| f(&mut lock(m)))),
        _ => None,
    }
}

#[inline]
fn with_installed_inline<R>(word: u64, f: impl FnOnce(&mut OpState) -> R) -> R {
    let (deadline, key) = read_sides(word);
    let mut state = unpack(word, deadline, key);
    let out = f(&mut state);
    write_sides(&state);
    CURRENT.set(pack(&state));
    out
}

/// Joins the operation installed on this thread, if there is one (see [`OpState::join`]), for
/// a layer on budget `budget`; the `bool` says whether the layer credits its budget on success.
/// Bit operations on the packed word for a layer without a deadline; no unpacking.
#[inline(always)]
pub(crate) fn join_current(
    class: ToolClass,
    keyed: bool,
    deadline: Option<Instant>,
    budget: u32,
) -> (Joined, bool) {
    let word = CURRENT.get();
    if tag(word) == EMPTY {
        return (Joined::No, true);
    }
    if tag(word) != INLINE || deadline.is_some() {
        return join_slow(class, keyed, deadline, budget);
    }
    let budget = u64::from(budget & BUDGET_ID_MASK);
    let credits = (word & CALLER) >> CALLER_SHIFT != budget;
    let current = (word & CLASS) >> CLASS_SHIFT;
    let strictest = current.max(class as u64);
    CURRENT.set(
        (word & !(CLASS | CALLER))
            | strictest << CLASS_SHIFT
            | budget << CALLER_SHIFT
            | if keyed { KEYED } else { 0 },
    );
    if strictest == current {
        (Joined::Yes, credits)
    } else {
        (tightened(current), credits)
    }
}

#[inline(never)]
fn join_slow(
    class: ToolClass,
    keyed: bool,
    deadline: Option<Instant>,
    budget: u32,
) -> (Joined, bool) {
    with_current(|op| op.join(class, keyed, deadline, budget)).unwrap_or((Joined::No, true))
}

#[cold]
fn tightened(was: u64) -> Joined {
    Joined::Tightened {
        was: ToolClass::ALL
            .get(was as usize)
            .copied()
            .unwrap_or(ToolClass::MultiStep),
    }
}

/// Moves the operation installed on this thread to the heap (once) and returns a handle to it.
pub(crate) fn share_current() -> Option<SharedState> {
    let word = CURRENT.get();
    match tag(word) {
        SHARED_TAG => SHARED.with_borrow(Clone::clone),
        INLINE => {
            let (deadline, key) = read_sides(word);
            let shared = Arc::new(Mutex::new(unpack(word, deadline, key)));
            // `Installed` keeps `SHARED` empty while an inline ledger is installed.
            SHARED.set(Some(shared.clone()));
            CURRENT.set(SHARED_TAG << TAG_SHIFT);
            Some(shared)
        }
        _ => None,
    }
}

/// The bits of a word that say a side slot holds something.
const SIDES: u64 = HAS_DEADLINE | HAS_KEY;

/// The side slots of the ledger installed before, saved when its word used them.
struct Saved {
    deadline: Option<Instant>,
    key: u64,
}

/// Lends `slot`'s ledger to this thread until dropped, then takes it back and restores whatever
/// was installed before (also when the inner call panics). Without a deadline or key on
/// either side this is two moves of the packed word.
pub(crate) struct Installed<'a> {
    slot: &'a mut Option<Ledger>,
    previous: u64,
    saved: Option<Saved>,
    previous_shared: Option<SharedState>,
}

impl<'a> Installed<'a> {
    #[inline]
    pub(crate) fn new(slot: &'a mut Option<Ledger>) -> Self {
        let previous = CURRENT.get();
        // A side slot is read only through a word with its bit: save the previous word's before
        // ours overwrites them.
        let saved = (previous & SIDES != 0).then(save_sides);
        let mut shared = None;
        let next = match slot {
            Some(Ledger::Inline(inline)) => {
                if inline.word & SIDES != 0 {
                    write_inline_sides(inline);
                }
                inline.word
            }
            Some(Ledger::Shared(_)) => {
                if let Some(Ledger::Shared(s)) = slot.take() {
                    shared = Some(s);
                }
                SHARED_TAG << TAG_SHIFT
            }
            None => EMPTY,
        };
        CURRENT.set(next);
        let previous_shared = if shared.is_some() || tag(previous) == SHARED_TAG {
            SHARED.replace(shared)
        } else {
            None
        };
        Installed {
            slot,
            previous,
            saved,
            previous_shared,
        }
    }
}

#[cold]
fn save_sides() -> Saved {
    Saved {
        deadline: DEADLINE.get(),
        key: KEY.get(),
    }
}

#[cold]
fn write_inline_sides(inline: &Inline) {
    let word = inline.word;
    if word & HAS_DEADLINE != 0 {
        DEADLINE.set(inline.deadline);
    }
    if word & HAS_KEY != 0 {
        KEY.set(inline.key);
    }
}

#[cold]
fn read_inline_sides(inline: &mut Inline) {
    let (deadline, key) = read_sides(inline.word);
    inline.deadline = deadline;
    inline.key = key;
}

#[cold]
fn restore_sides(saved: &Saved) {
    DEADLINE.set(saved.deadline);
    KEY.set(saved.key);
}

impl Drop for Installed<'_> {
    #[inline]
    fn drop(&mut self) {
        let mine = CURRENT.replace(self.previous);
        match (tag(mine), &mut *self.slot) {
            (INLINE, Some(Ledger::Inline(inline))) => {
                inline.word = mine;
                if mine & SIDES != 0 {
                    read_inline_sides(inline);
                }
            }
            (SHARED_TAG, slot) => *slot = SHARED.take().map(Ledger::Shared),
            _ => {}
        }
        if let Some(saved) = &self.saved {
            restore_sides(saved);
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
    let word = CURRENT.get();
    match tag(word) {
        INLINE => with_installed_inline(word, f),
        SHARED_TAG => match SHARED.with_borrow(Clone::clone) {
            Some(shared) => f(&mut lock(&shared)),
            None => own.insert(Ledger::inline(make())).with(f),
        },
        _ => own.insert(Ledger::inline(make())).with(f),
    }
}

#[cfg(test)]
mod tests;
