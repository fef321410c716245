//! The held-calls book: the writes with nothing recording them (no receipt) whose outcome is
//! unknown, held below the model. The same call reissued in the same run (a model retries an
//! `outcome_unknown` though it says `retryable: false`; models do) is answered
//! `outcome_unknown` again, not sent, until an operator says whether it took effect; the same
//! call made while it is in flight (two branches of an agent) is answered `in_progress`.
//!
//! The decisions are pure ([`admit`], [`after`]); [`Book`] keeps the entries and the future in
//! `service.rs` only carries the decisions out. The book lives in memory, shared by every
//! stack of one [`Tools`](super::Tools) and its clones: a crash loses it (a tool whose run may
//! resume records its calls in a receipt store; the audit says so).

use crate::error::{ErrorCode, ToolError};
use crate::key::{canonical_json, normalized_id};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How many calls the book holds at most; past it, the oldest is forgotten (said out loud).
const CAPACITY: usize = 16_384;

/// What became of a held call, as the operator found it at the provider
/// ([`Tools::resolve_held`](super::Tools::resolve_held)).
///
/// ```
/// use stormguard::tool::HeldResolution;
/// assert_ne!(HeldResolution::Done, HeldResolution::NotDone);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldResolution {
    /// It took effect: the same call is never sent again in its run (answered `conflict`).
    Done,
    /// It did not: the entry is removed and the next call is sent.
    NotDone,
}

/// One call the book holds, as the operator's listing shows it
/// ([`Tools::held`](super::Tools::held)). Its `Debug` leaves the arguments out (they may hold
/// what the model was told in confidence).
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct HeldCall {
    /// What [`Tools::resolve_held`](super::Tools::resolve_held) takes.
    pub id: String,
    /// The tool.
    pub tool: String,
    /// The agent run.
    pub run: String,
    /// The step whose call ended with its outcome unknown.
    pub step: String,
    /// The model's arguments.
    pub args: Value,
    /// How long it has been held.
    pub held_for: Duration,
    /// An operator said it took effect ([`HeldResolution::Done`]).
    pub done: bool,
}

impl fmt::Debug for HeldCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldCall")
            .field("id", &self.id)
            .field("tool", &self.tool)
            .field("run", &self.run)
            .field("step", &self.step)
            .field("held_for", &self.held_for)
            .field("done", &self.done)
            .finish()
    }
}

/// A call as the book sees it: what makes it the same call, and its step. The id is made
/// only when the book needs it (a digest of the arguments costs more than the rest).
#[derive(Clone)]
pub(super) struct Seen {
    pub(super) tool: Arc<str>,
    pub(super) run: Arc<str>,
    pub(super) step: Arc<str>,
    pub(super) args: Arc<Value>,
    pub(super) context: Option<Arc<Vec<(String, String)>>>,
    id: Option<String>,
}

impl Seen {
    pub(super) fn new(
        tool: Arc<str>,
        (run, args, context): super::call::Sameness,
        step: Arc<str>,
    ) -> Self {
        Seen {
            tool,
            run,
            step,
            args,
            context,
            id: None,
        }
    }

    /// The call's id in the book (see [`id_of`]).
    pub(super) fn id(&mut self) -> &str {
        let (tool, run, args, context) = (&self.tool, &self.run, &self.args, &self.context);
        self.id
            .get_or_insert_with(|| id_of(tool, run, args, context.as_deref().map_or(&[], |c| c)))
    }
}

/// Where a call of the book stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Standing {
    /// Sent, no answer yet.
    InFlight,
    /// Ended with its outcome unknown (or dropped while in flight).
    Unknown,
    /// An operator said it took effect.
    Done,
}

/// What a call meets at the door.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// Send it.
    Send,
    /// Refuse it, as the entry's standing says.
    Refuse(Standing),
}

/// The door's decision, from the entry of the same call (if any).
pub(super) fn admit(entry: Option<Standing>) -> Admit {
    match entry {
        None => Admit::Send,
        Some(standing) => Admit::Refuse(standing),
    }
}

/// How a call the book saw ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// An answer.
    Answered,
    /// An error that says it may have taken effect (`outcome_unknown`).
    Unknown,
    /// An error that says it did not (refused before the work, a 4xx, an open breaker).
    NotSent,
    /// Dropped while in flight: whatever was sent may have acted.
    Dropped,
}

/// What the book does with a call once it ended: hold it, or forget it.
pub(super) fn after(ending: Ending) -> bool {
    matches!(ending, Ending::Unknown | Ending::Dropped)
}

/// How an error's code reads for the book.
pub(super) fn ending_of(error: &ToolError) -> Ending {
    match error.code() {
        // A keyed write that failed without its key may have acted, as an unknown outcome.
        ErrorCode::OutcomeUnknown | ErrorCode::MissingIdempotencyKey => Ending::Unknown,
        _ => Ending::NotSent,
    }
}

/// The id of a call for the book: the tool, the run, the caller's context and the arguments in
/// RFC 8785 form, digested (so arguments in another field order are the same call).
pub(super) fn id_of(tool: &str, run: &str, args: &Value, context: &[(String, String)]) -> String {
    let mut hash = Sha256::new();
    for part in [tool, run] {
        hash.update(part.len().to_le_bytes());
        hash.update(part.as_bytes());
    }
    let mut context: Vec<_> = context.iter().collect();
    context.sort();
    for (name, value) in context {
        for part in [name, value] {
            hash.update(part.len().to_le_bytes());
            hash.update(part.as_bytes());
        }
    }
    // An id the model wrote as `7` and then as `"7"` is one call: the book errs on the side of
    // holding (each top-level field read as the key reads an `id:` field).
    let normalized = args.as_object().and_then(|object| {
        let any = object.values().any(|v| normalized_id(v).is_some());
        any.then(|| {
            let mut copy = object.clone();
            for v in copy.values_mut() {
                if let Some(n) = normalized_id(v) {
                    *v = n;
                }
            }
            Value::Object(copy)
        })
    });
    let args = normalized.as_ref().unwrap_or(args);
    // A number canonical JSON cannot write is still the same call as itself.
    let args = canonical_json(args).unwrap_or_else(|_| args.to_string());
    hash.update(args.as_bytes());
    let digest = hash.finalize();
    let hex = crate::key::hex16(&digest);
    format!("{tool}:{run}:{hex}")
}

struct Entry {
    standing: Standing,
    call: Seen,
    since: Instant,
    /// Its place in [`Entries::order`].
    seq: u64,
}

#[derive(Default)]
struct Entries {
    by_id: HashMap<String, Entry>,
    /// Oldest first, to forget past [`CAPACITY`].
    order: BTreeMap<u64, String>,
    next: u64,
    /// Entries per tool: a tool with none skips the book.
    per_tool: HashMap<String, usize>,
}

/// The book, shared by every stack of one `Tools`.
#[derive(Clone, Default)]
pub(super) struct Book(Arc<Shared>);

#[derive(Default)]
struct Shared {
    entries: Mutex<Entries>,
    /// How many calls the book holds, as of the last change (written under the lock): an empty
    /// book, the common case, is looked at without taking the lock.
    held: AtomicUsize,
}

/// The book's entries while locked; on release, the count of what it holds is published.
struct Locked<'a> {
    entries: MutexGuard<'a, Entries>,
    held: &'a AtomicUsize,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Entries;
    fn deref(&self) -> &Entries {
        &self.entries
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Entries {
        &mut self.entries
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.held.store(self.entries.by_id.len(), Ordering::Release);
    }
}

impl Book {
    fn entries(&self) -> Locked<'_> {
        Locked {
            entries: self
                .0
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            held: &self.0.held,
        }
    }

    /// The tool has entries (a cheap look before a call's id is made; no lock while the book is
    /// empty).
    pub(super) fn holds_any(&self, tool: &str) -> bool {
        if self.0.held.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.entries().per_tool.get(tool).is_some_and(|n| *n > 0)
    }

    /// The door: the standing of the same call (with the step it was made at), or, if there is
    /// none and `track`, the call entered as in flight.
    pub(super) fn enter(&self, call: &mut Seen, track: bool) -> (Admit, Option<String>) {
        call.id(); // the digest is made before the lock is taken

        let mut entries = self.entries();
        let entry = entries.by_id.get(call.id());
        let step = entry.map(|e| e.call.step.to_string());
        let admit = admit(entry.map(|e| e.standing));
        if admit == Admit::Send && track {
            entries.insert(call.clone(), Standing::InFlight);
        }
        (admit, step)
    }

    /// The call `call` ended as `ending`: held or forgotten.
    pub(super) fn end(&self, mut call: Seen, ending: Ending) {
        call.id(); // the digest is made before the lock is taken

        let mut entries = self.entries();
        if after(ending) {
            let tool = call.tool.clone();
            let step = call.step.clone();
            entries.insert(call, Standing::Unknown);
            drop(entries);
            crate::telemetry::held_call(&tool, "held");
            tracing::warn!(
                tool = %tool,
                step = %step,
                "its outcome is unknown: the same call in this run is held (answered \
                 outcome_unknown, not sent) until an operator resolves it (Tools::held, \
                 Tools::resolve_held)"
            );
        } else {
            entries.remove(call.id());
        }
    }

    /// The calls held, oldest first.
    pub(super) fn list(&self) -> Vec<HeldCall> {
        let entries = self.entries();
        entries
            .order
            .values()
            .filter_map(|id| entries.by_id.get(id))
            .filter(|e| e.standing != Standing::InFlight)
            .map(|e| HeldCall {
                id: e.call.id.clone().unwrap_or_default(),
                tool: e.call.tool.to_string(),
                run: e.call.run.to_string(),
                step: e.call.step.to_string(),
                args: Value::clone(&e.call.args),
                held_for: e.since.elapsed(),
                done: e.standing == Standing::Done,
            })
            .collect()
    }

    /// The operator's word on `id`; `false` if the book does not hold it (or it is in flight).
    pub(super) fn resolve(&self, id: &str, resolution: HeldResolution) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.by_id.get_mut(id) else {
            return false;
        };
        if entry.standing == Standing::InFlight {
            return false;
        }
        let tool = entry.call.tool.clone();
        match resolution {
            HeldResolution::Done => entry.standing = Standing::Done,
            HeldResolution::NotDone => entries.remove(id),
        }
        drop(entries);
        crate::telemetry::held_call(&tool, "resolved");
        true
    }
}

impl Entries {
    fn insert(&mut self, mut call: Seen, standing: Standing) {
        let id = call.id().to_owned();
        if let Some(entry) = self.by_id.get_mut(&id) {
            entry.standing = standing;
            entry.call.step = call.step;
            return;
        }
        if self.by_id.len() >= CAPACITY {
            if let Some((_, oldest)) = self.order.first_key_value() {
                let oldest = oldest.clone();
                let tool = self.by_id.get(&oldest).map(|e| e.call.tool.clone());
                self.remove(&oldest);
                crate::telemetry::held_call(tool.as_deref().unwrap_or("-"), "forgotten");
                tracing::warn!(
                    capacity = CAPACITY,
                    "the held-calls book is full: its oldest call is forgotten, and sent again \
                     if reissued; resolve held calls (Tools::held, Tools::resolve_held)"
                );
            }
        }
        *self.per_tool.entry(call.tool.to_string()).or_default() += 1;
        let seq = self.next;
        self.next += 1;
        self.order.insert(seq, id.clone());
        let since = Instant::now();
        self.by_id.insert(
            id,
            Entry {
                standing,
                call,
                since,
                seq,
            },
        );
    }

    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.by_id.remove(id) {
            self.order.remove(&entry.seq);
            if let Some(n) = self.per_tool.get_mut(&*entry.call.tool) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// The answer to `call`, which the book refuses: the same call made at `step` stands as
/// `standing`.
pub(super) fn refusal(standing: Standing, held: &mut Seen, step: &str) -> ToolError {
    let id = held.id().to_owned();
    let (code, hint) = match standing {
        Standing::Unknown => (
            ErrorCode::OutcomeUnknown,
            format!(
                "the same call (tool `{}`, run `{}`, the same arguments) ended with its outcome \
                 unknown at step `{}`: it may have taken effect, so it is not sent again; an \
                 operator checks the provider and resolves it (Tools::resolve_held(\"{}\", ..))",
                held.tool, held.run, step, id
            ),
        ),
        Standing::InFlight => (
            ErrorCode::InProgress,
            format!(
                "the same call (tool `{}`, run `{}`, the same arguments) is in flight from \
                 another branch: it is not sent twice; its answer goes to that branch",
                held.tool, held.run
            ),
        ),
        Standing::Done => (
            ErrorCode::Conflict,
            format!(
                "the same call (tool `{}`, run `{}`, the same arguments) took effect (an \
                 operator said so): it is not sent again; its answer was not recorded",
                held.tool, held.run
            ),
        ),
    };
    crate::telemetry::held_call(
        &held.tool,
        match standing {
            Standing::Unknown => "refused_unknown",
            Standing::InFlight => "refused_in_flight",
            Standing::Done => "refused_done",
        },
    );
    ToolError::new(code).with_retryable(false).with_hint(hint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(step: &str, args: Value) -> Seen {
        Seen::new(
            Arc::from("post_ticket"),
            ("run-1".into(), Arc::new(args), None),
            step.into(),
        )
    }

    #[test]
    fn the_door_and_the_ending_decide_alone() {
        assert_eq!(admit(None), Admit::Send);
        for s in [Standing::InFlight, Standing::Unknown, Standing::Done] {
            assert_eq!(admit(Some(s)), Admit::Refuse(s));
        }
        assert!(after(Ending::Unknown) && after(Ending::Dropped));
        assert!(!after(Ending::Answered) && !after(Ending::NotSent));
    }

    #[test]
    fn the_same_call_is_the_same_whatever_the_field_order_and_not_across_runs() {
        let a = id_of("t", "r", &json!({"a": 1, "b": 2}), &[]);
        assert_eq!(a, id_of("t", "r", &json!({"b": 2, "a": 1}), &[]));
        assert_ne!(a, id_of("t", "r2", &json!({"a": 1, "b": 2}), &[]));
        assert_ne!(a, id_of("t2", "r", &json!({"a": 1, "b": 2}), &[]));
        let ctx = [("tenant".to_owned(), "acme".to_owned())];
        assert_ne!(a, id_of("t", "r", &json!({"a": 1, "b": 2}), &ctx));
        // Parts cannot run into each other.
        assert_ne!(
            id_of("ab", "c", &json!(1), &[]),
            id_of("a", "bc", &json!(1), &[])
        );
    }

    #[test]
    fn a_held_call_is_refused_until_resolved() {
        let book = Book::default();
        let first = call("step-2", json!({"ticket": "t-1"}));
        let enter = |c: &mut Seen, track| book.enter(c, track).0;
        assert_eq!(enter(&mut first.clone(), true), Admit::Send);
        assert_eq!(
            enter(&mut call("step-3", json!({"ticket": "t-1"})), true),
            Admit::Refuse(Standing::InFlight)
        );
        // Another ticket is another call.
        assert_eq!(
            enter(&mut call("step-3", json!({"ticket": "t-2"})), false),
            Admit::Send
        );
        assert!(book.list().is_empty(), "in flight is not listed");
        book.end(first.clone(), Ending::Unknown);
        assert!(book.holds_any("post_ticket"));
        assert_eq!(
            enter(&mut call("step-4", json!({"ticket": "t-1"})), true),
            Admit::Refuse(Standing::Unknown)
        );
        let held = book.list();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].step, "step-2");
        assert!(!book.resolve("nope", HeldResolution::Done));
        assert!(book.resolve(&held[0].id, HeldResolution::Done));
        assert_eq!(
            enter(&mut call("step-5", json!({"ticket": "t-1"})), true),
            Admit::Refuse(Standing::Done)
        );
        assert!(book.resolve(&held[0].id, HeldResolution::NotDone));
        assert!(!book.holds_any("post_ticket"));
        assert_eq!(
            enter(&mut call("step-6", json!({"ticket": "t-1"})), true),
            Admit::Send
        );
        book.end(call("step-6", json!({"ticket": "t-1"})), Ending::Answered);
        assert!(!book.holds_any("post_ticket"));
    }

    #[test]
    fn past_capacity_the_oldest_is_forgotten() {
        let book = Book::default();
        for i in 0..=CAPACITY {
            book.end(call("s", json!({"ticket": i})), Ending::Unknown);
        }
        let held = book.list();
        assert_eq!(held.len(), CAPACITY);
        assert_eq!(held[0].args, json!({"ticket": 1}));
    }
}
