//! Receipts: record intent before the call, the receipt after, and check before doing anything.
//!
//! "A checkpoint records position. It does not, and cannot, record whether the outside world did
//! the work." [`ReceiptGuardLayer`] makes every side effect go through three steps:
//!
//! 1. **intent**: [`ReceiptStore::begin`] records the action's key (and a fingerprint of its
//!    arguments) atomically, before anything is sent. A store that cannot record it fails the
//!    call (`store_unavailable`): nothing executes unrecorded;
//! 2. **execute** with the idempotency key stamped on the request (the inner service is driven
//!    ready only now, so a call answered from the store never waits for a quota slot below);
//! 3. **receipt**: the encoded result is stored under the key.
//!
//! On any retry or resume, `begin` answers first:
//!
//! | found | what happens |
//! |---|---|
//! | nothing | the intent is recorded and the call executes |
//! | a receipt | the stored result is returned, whatever its age; the dependency is not called |
//! | the key with other arguments | `idempotency_key_reused` (Stripe's rule), its hint naming the key and whether the first request has its receipt |
//! | an intent whose lease is live (a parallel duplicate in flight) | wait, bounded by the layer's `wait`, for its receipt; then `in_progress` |
//! | an intent whose lease has passed (a crash, an ambiguous failure) | `Read`, `IdempotentWrite`: execute again. `KeyedWrite` younger than the provider's key window (24 h by default, [`ReceiptConfigBuilder::key_window`]): execute again with the same key (the provider deduplicates). `UnkeyedWrite`, or a `KeyedWrite` older than the window: a read-back if one is declared consistent, else `outcome_unknown`. `MultiStep`: `outcome_unknown`. A caller that loses the take-over to another waits for that one's receipt |
//! | an intent without a receipt, older than the retention | `receipt_expired`: refused loudly, never silently repeated |
//!
//! **One clock.** Leases and ages are judged by the store's clock, never by the caller's:
//! PostgreSQL's `clock_timestamp()`; for SQLite (one host, as WAL requires) and the in-memory
//! store, the host's. Two machines whose clocks disagree cannot take over each other's live
//! calls. What remains is a step of the host clock (a time sync jumping forward by more than
//! what is left of a lease ends it early): keep leases longer than the largest step you expect.
//! A step back never lengthens one: what is left of a lease, or of an in-flight bound, is
//! clamped to the length it was granted for ([`Record`]).
//!
//! **What a failure means for the intent.** A success (or an empty answer) stores the receipt;
//! if the receipt cannot be stored, the lease is given up so the next attempt decides at once. A
//! failure that provably did not take effect (refused, a rejected argument) removes the intent.
//! An ambiguous failure keeps it and gives up its lease, so the next attempt decides at once,
//! and records when its request was sent and until when it may still land (the lease after the
//! send: the lease is the in-flight bound), which [`ReceiptStore::pending`] shows and
//! [`ReceiptStore::resolve`] honours; except where that attempt would read back (an unkeyed write with a read-back declared, a
//! keyed one that is older than the key window, or will be by the time its lease runs out):
//! there the lease runs out first, so no read-back runs
//! while the request may still land (found by `examples/episodes`: a parallel duplicate read
//! back the moment the first attempt timed out, and the first attempt's late commit landed
//! after its resend). HTTP 503 is ambiguous: a proxy in front
//! of the provider answers it after an upstream reset on a request it had forwarded (see
//! [`HttpClassifier`](crate::classify::HttpClassifier); a provider documented to mean "not
//! processed" by it is declared with [`NotProcessed`](crate::classify::NotProcessed)). A call
//! dropped before its request was sent (cancelled during `begin`, or while the service below
//! was not ready) removes its intent; one dropped after gives up its lease, recorded as in doubt
//! like an ambiguous failure (or, where the next attempt would read back, keeps it running until
//! it passes).
//!
//! **A provider that checks keys.** A provider that honours idempotency keys (Stripe, the IETF
//! `Idempotency-Key` draft) answers 409 while a request with the key is still being processed,
//! and 422 when the key comes back with other arguments. Under a receipt layer the request
//! always carries its key, so either keeps the intent (lease given up): the provider has an
//! earlier request under it, which may have taken effect. A 409 goes up as it came, and a
//! [`Retry`](crate::retry::Retry) above retries it for a keyed write
//! ([`KeyConflict`](crate::classify::KeyConflict)); a 422 (a resumed run that reworded the
//! arguments a task-shaped key leaves out) is answered `idempotency_key_reused`, with a hint
//! telling the model to repeat the action as it was first sent rather than reword it. The
//! layer's classifier must be one that tells them ([`HttpClassifier`](crate::classify::HttpClassifier)
//! does).
//!
//! **Streamed answers.** A response the layer hands on before its end (a body of tokens, a gRPC
//! stream) is not a receipt: give the layer [`NotStored`] as its codec, and no codec is asked for
//! a response nobody could store. The intent is still recorded and the key stamped; a success
//! leaves it pending, lease given up.
//!
//! **Settling an `outcome_unknown`.** An escalated intent stays until an operator checks with
//! the provider and settles it with [`ReceiptStore::resolve`]: [`Resolution::Done`] with the
//! provider's answer as the receipt (the next attempt is answered from it), or
//! [`Resolution::NotDone`] (the next attempt sends). Each store lists what is pending
//! (`pending`: when each intent was first recorded, when its last attempt was sent, and how long
//! a request of it may still land). Check with the provider only once nothing can still land: a
//! request that timed out at the client may still commit at the provider, and an empty log
//! before then proves nothing; `resolve` refuses `NotDone` until then ([`Resolved::InFlight`]).
//! `examples/resolve.rs` is a small command line for a SQLite store.
//!
//! **Retention and pruning.** [`ReceiptStore::prune`] deletes records (in bounded batches), and
//! a deleted record cannot be told from one that never existed: a resume that arrives after its
//! record was pruned starts fresh. Prune only what is older than your longest possible resume,
//! with a margin (for example `prune(2 × retention)`), so that records between one and two
//! retentions old are still there to be refused loudly.
//!
//! **Observability.** Every decision is a tracing event (targets under `stormguard::receipt`)
//! (DEBUG for the routine ones, INFO for resumes, read-backs and refusals, WARN/ERROR when the
//! store fails) and a count of `stormguard_receipt_outcomes_total`, labelled `outcome`:
//!
//! | `outcome` | when |
//! |---|---|
//! | `fresh` | the intent was recorded; the call executes |
//! | `receipt` | a stored receipt answered; the dependency was not called |
//! | `resumed_with_key` | a pending intent whose lease passed: executed again (same key) |
//! | `read_back_found` / `read_back_absent` | a read-back found the effect / did not |
//! | `recorded` | the receipt was stored after the call |
//! | `left_pending` | an ambiguous failure, a 409 or 422 under the key, a streamed answer: the intent stays, a later attempt decides |
//! | `abandoned` | a failure that did not take effect: the intent was removed |
//! | `receipt_not_stored` | the effect happened but its receipt could not be stored or encoded |
//! | `cancelled_after_send` | the call was dropped after it was sent: the intent stays, its lease given up (kept running where the next attempt would read back) |
//! | `not_sent` | the call was dropped before sending: the intent is removed |
//! | `store_unavailable` | the intent could not be recorded; nothing was executed |
//! | `idempotency_key_reused`, `in_progress`, `receipt_expired`, `outcome_unknown` | refusals, as the error codes |
//!
//! The example: a keyed send, a repeat answered from its receipt; a crashed unkeyed send,
//! escalated without a read-back, sent once with a consistent one that finds nothing.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use tower::{Layer, ServiceExt, service_fn};
//! use stormguard::class::ToolClass;
//! use stormguard::key::{Action, IdempotencyKey, KeyStamp};
//! use stormguard::receipt::*;
//!
//! #[derive(Clone)]
//! struct SendInvoice { invoice_id: u64, key: Option<String> }
//! impl KeyStamp for SendInvoice {
//!     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
//!     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()); }
//! }
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Sent { message_id: String }
//! // Every `Ok` is a sent message (what the default classifier asks of an answer type), and its
//! // receipt is its JSON (what the default codec asks).
//! impl stormguard::classify::Answer for Sent {}
//! stormguard::stored_as_json!(Sent);
//!
//! /// The provider's sent log, consistent: what it does not hold was not sent.
//! #[derive(Clone)]
//! struct SentLog(Arc<AtomicU32>);
//! impl ReadBack<SendInvoice, Sent> for SentLog {
//!     async fn read_back(&self, _: &SendInvoice) -> ReadBackResult<Sent> {
//!         match self.0.load(Ordering::SeqCst) {
//!             0 => ReadBackResult::Absent,
//!             _ => ReadBackResult::Unknown,
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let sends = Arc::new(AtomicU32::new(0));
//! let counter = sends.clone();
//! let provider = service_fn(move |req: SendInvoice| {
//!     counter.fetch_add(1, Ordering::SeqCst);
//!     async move { Ok::<_, std::io::Error>(Sent { message_id: format!("msg-{}", req.invoice_id) }) }
//! });
//! let action = |req: &SendInvoice| Action::new("run-81f2", "step-2", "send_invoice", &req.invoice_id);
//! let clock = ManualClock::new(1_700_000_000_000);
//! let store = InMemoryStore::with_clock(clock.clone());
//!
//! // A keyed write: a repeat (a retry, a resume) is answered from the receipt.
//! let tool = ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, action).layer(provider.clone());
//! let first = tool.clone().oneshot(SendInvoice { invoice_id: 4471, key: None }).await.unwrap();
//! let again = tool.oneshot(SendInvoice { invoice_id: 4471, key: None }).await.unwrap();
//! assert_eq!((first, sends.load(Ordering::SeqCst)), (again, 1));
//!
//! // An unkeyed send whose run crashed after recording its intent; the lease passes.
//! let crashed = action(&SendInvoice { invoice_id: 4472, key: None }).unwrap();
//! store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", Duration::from_secs(30))
//!     .await.unwrap();
//! clock.advance_ms(60_000);
//! let unkeyed = ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, action);
//! let err = unkeyed.clone().layer(provider.clone())
//!     .oneshot(SendInvoice { invoice_id: 4472, key: None }).await.unwrap_err();
//! let err = err.downcast::<stormguard::error::ToolError>().unwrap();
//! assert_eq!(err.code().as_str(), "outcome_unknown"); // nobody can tell: escalated
//! assert_eq!(sends.load(Ordering::SeqCst), 1);
//!
//! // With a consistent read-back that finds nothing, it is safe to send, once.
//! let checked = unkeyed.read_back(SentLog(Arc::new(AtomicU32::new(0))), Consistency::Immediate);
//! checked.layer(provider).oneshot(SendInvoice { invoice_id: 4472, key: None }).await.unwrap();
//! assert_eq!(sends.load(Ordering::SeqCst), 2);
//! # }
//! ```

mod any;
mod clock;
mod codec;
mod config;
mod decide;
mod intent;
mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod read_back;
mod record;
mod refuse;
mod run;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;
mod stored;

pub use any::AnyStore;
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::{Codec, JsonCodec, NotStored};
#[cfg(feature = "http")]
pub use codec::{HttpCodec, StoredBody};
pub use config::{ReceiptConfig, ReceiptConfigBuilder};
pub use layer::{ReceiptGuard, ReceiptGuardLayer};
pub use memory::InMemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresOptionsBuilder, PostgresStore};
pub use read_back::{Consistency, NoReadBack, ReadBack, ReadBackResult};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use store::{
    Begin, Durability, InDoubt, PendingIntent, ReceiptStore, Record, Resolution, Resolved,
    StoreError,
};
pub use stored::{DefaultCodec, Stored};
