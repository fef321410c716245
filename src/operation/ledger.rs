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
    /// Set once a layer gave up: no other layer retries the operation.
    pub(crate) closed: Option<ErrorCode>,
    /// When the operation's deadline passes.
    pub(crate) deadline: Option<Instant>,
    /// A fingerprint of the idempotency key its first attempt carried (0: none yet).
    pub(crate) key: u64,
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
            closed: None,
            deadline,
            key: 0,
        }
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.retries.saturating_add(1)
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

// The thread-local slot holds the packed word (and, only for operations with a deadline, the
// deadline in a second slot), so lending the ledger is a couple of register moves: no destructor
// runs, nothing is allocated, no lock is taken.
//
// word: bits 0-15 retries, 16-31 max_attempts, 32-39 class, 40 keyed, 41 has a deadline,
//       42 has a key fingerprint (in `KEY`), 48-55 closed code + 1 (0 = open), 62-63 tag.
const TAG_SHIFT: u32 = 62;
const EMPTY: u64 = 0;
const INLINE: u64 = 1;
const SHARED_TAG: u64 = 2;
const KEYED: u64 = 1 << 40;
const HAS_DEADLINE: u64 = 1 << 41;
const HAS_KEY: u64 = 1 << 42;

#[inline]
fn tag(word: u64) -> u64 {
    word >> TAG_SHIFT
}

#[inline]
fn pack(state: &OpState) -> u64 {
    let closed = state.closed.map_or(0, |code| code as u64 + 1);
    u64::from(state.retries.min(0xffff))
        | u64::from(state.max_attempts.min(0xffff)) << 16
        | (state.class as u64) << 32
        | if state.keyed { KEYED } else { 0 }
        | if state.deadline.is_some() {
            HAS_DEADLINE
        } else {
            0
        }
        | if state.key != 0 { HAS_KEY } else { 0 }
        | closed << 48
        | INLINE << TAG_SHIFT
}

#[inline]
fn unpack(word: u64, deadline: Option<Instant>, key: u64) -> OpState {
    let class = ToolClass::ALL
        .get(((word >> 32) & 0xff) as usize)
        .copied()
        .unwrap_or(ToolClass::MultiStep);
    let closed = match ((word >> 48) & 0xff) as usize {
        0 => None,
        n => Some(
            ErrorCode::ALL
                .get(n - 1)
                .copied()
                .unwrap_or(ErrorCode::Internal),
        ),
    };
    OpState {
        retries: (word & 0xffff) as u32,
        max_attempts: ((word >> 16) & 0xffff) as u32,
        class,
        keyed: word & KEYED != 0,
        closed,
        deadline: if word & HAS_DEADLINE != 0 {
            deadline
        } else {
            None
        },
        key: if word & HAS_KEY != 0 { key } else { 0 },
    }
}

thread_local! {
    static CURRENT: Cell<u64> = const { Cell::new(EMPTY) };
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static KEY: Cell<u64> = const { Cell::new(0) };
    static SHARED: RefCell<Option<SharedState>> = const { RefCell::new(None) };
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
fn read_key(word: u64) -> u64 {
    if word & HAS_KEY != 0 {
        KEY.get()
    } else {
        0
    }
}

#[inline]
fn with_installed_inline<R>(word: u64, f: impl FnOnce(&mut OpState) -> R) -> R {
    let deadline = if word & HAS_DEADLINE != 0 {
        DEADLINE.get()
    } else {
        None
    };
    let mut state = unpack(word, deadline, read_key(word));
    let out = f(&mut state);
    if state.key != 0 {
        KEY.set(state.key);
    }
    CURRENT.set(pack(&state));
    out
}

/// Joins the operation installed on this thread, if there is one: records the joining layer's
/// class (the stricter one wins) and whether its request carries a key. Bit operations on the
/// packed word; no unpacking on the hot path.
#[inline]
pub(crate) fn join_current(class: ToolClass, keyed: bool) -> bool {
    let word = CURRENT.get();
    match tag(word) {
        INLINE => {
            let current = (word >> 32) & 0xff;
            let strictest = current.max(class as u64);
            let word = (word & !(0xff << 32)) | strictest << 32 | if keyed { KEYED } else { 0 };
            CURRENT.set(word);
            true
        }
        SHARED_TAG => with_current(|op| {
            op.keyed |= keyed;
            op.class = op.class.strictest(class);
        })
        .is_some(),
        _ => false,
    }
}

/// Moves the operation installed on this thread to the heap (once) and returns a handle to it.
pub(crate) fn share_current() -> Option<SharedState> {
    let word = CURRENT.get();
    match tag(word) {
        SHARED_TAG => SHARED.with_borrow(Clone::clone),
        INLINE => {
            let shared = Arc::new(Mutex::new(unpack(word, DEADLINE.get(), read_key(word))));
            // `Installed` keeps `SHARED` empty while an inline ledger is installed.
            SHARED.set(Some(shared.clone()));
            CURRENT.set(SHARED_TAG << TAG_SHIFT);
            Some(shared)
        }
        _ => None,
    }
}

/// Lends `slot`'s ledger to this thread until dropped, then takes it back and restores whatever
/// was installed before (also when the inner call panics).
pub(crate) struct Installed<'a> {
    slot: &'a mut Option<Ledger>,
    previous: u64,
    previous_deadline: Option<Option<Instant>>,
    previous_key: Option<u64>,
    previous_shared: Option<SharedState>,
}

impl<'a> Installed<'a> {
    #[inline]
    pub(crate) fn new(slot: &'a mut Option<Ledger>) -> Self {
        let mut previous_deadline = None;
        let mut own_key = 0;
        let mut shared = None;
        let next = match slot {
            Some(Ledger::Inline(inline)) => {
                if inline.deadline.is_some() {
                    previous_deadline = Some(DEADLINE.replace(inline.deadline));
                }
                own_key = inline.key;
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
        let previous = CURRENT.replace(next);
        // The key slot is read only through a word with HAS_KEY: save it when the previous word
        // relies on it, write it when ours does.
        let previous_key = (previous & HAS_KEY != 0).then(|| KEY.get());
        if own_key != 0 {
            KEY.set(own_key);
        }
        let previous_shared = if shared.is_some() || tag(previous) == SHARED_TAG {
            SHARED.replace(shared)
        } else {
            None
        };
        Installed {
            slot,
            previous,
            previous_deadline,
            previous_key,
            previous_shared,
        }
    }
}

impl Drop for Installed<'_> {
    #[inline]
    fn drop(&mut self) {
        let mine = CURRENT.replace(self.previous);
        match (tag(mine), &mut *self.slot) {
            (INLINE, Some(Ledger::Inline(inline))) => {
                inline.word = mine;
                inline.key = read_key(mine);
            }
            (SHARED_TAG, slot) => *slot = SHARED.take().map(Ledger::Shared),
            _ => {}
        }
        if let Some(deadline) = self.previous_deadline.take() {
            DEADLINE.set(deadline);
        }
        if let Some(key) = self.previous_key.take() {
            KEY.set(key);
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
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_every_class_and_code() {
        for class in ToolClass::ALL {
            for closed in std::iter::once(None).chain(ErrorCode::ALL.map(Some)) {
                for keyed in [false, true] {
                    let mut state = OpState::new(7, class, keyed, None);
                    state.retries = 4;
                    state.closed = closed;
                    let back = unpack(pack(&state), None, 0);
                    assert_eq!(back.class, class);
                    assert_eq!(back.closed, closed);
                    assert_eq!(back.keyed, keyed);
                    assert_eq!((back.retries, back.max_attempts), (4, 7));
                }
            }
        }
    }

    #[test]
    fn nested_installs_restore_the_outer_operation() {
        let mut outer = Some(Ledger::inline(OpState::new(
            3,
            ToolClass::Read,
            false,
            None,
        )));
        let mut inner = Some(Ledger::inline(OpState::new(
            5,
            ToolClass::UnkeyedWrite,
            false,
            Some(Instant::now()),
        )));
        in_scope(&mut outer, || {
            with_current(|op| {
                op.retries += 1;
                op.key = 42;
            });
            in_scope(&mut inner, || {
                assert_eq!(with_current(|op| op.max_attempts), Some(5));
                let shared = share_current().unwrap();
                lock(&shared).retries = 2;
            });
            assert_eq!(
                with_current(|op| (op.max_attempts, op.retries, op.key)),
                Some((3, 1, 42))
            );
        });
        assert!(with_current(|_| ()).is_none());
        assert!(matches!(inner, Some(Ledger::Shared(_))));
        assert_eq!(inner.as_mut().unwrap().with(|op| op.retries), 2);
        assert_eq!(
            outer.as_mut().unwrap().with(|op| (op.retries, op.key)),
            (1, 42)
        );
    }
}
