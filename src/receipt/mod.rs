//! Receipts: record intent before the call, the receipt after, and check before doing anything.
//!
//! "A checkpoint records position. It does not, and cannot, record whether the outside world did
//! the work." [`ReceiptLayer`] makes every side effect go through three steps:
//!
//! 1. **intent**: [`ReceiptStore::begin`] records the action's key (and a fingerprint of its
//!    arguments) atomically, before anything is sent. A store that cannot record it fails the
//!    call (`store_unavailable`): nothing executes unrecorded;
//! 2. **execute** with the idempotency key stamped on the request;
//! 3. **receipt**: the encoded result is stored under the key.
//!
//! On any retry or resume, `begin` answers first:
//!
//! | found | what happens |
//! |---|---|
//! | nothing | the intent is recorded and the call executes |
//! | a receipt | the stored result is returned; the dependency is not called |
//! | the key with other arguments | `idempotency_key_reused` (Stripe's rule) |
//! | an intent whose lease is live (a parallel duplicate in flight) | wait, bounded, for its receipt; then `in_progress` |
//! | an intent whose lease has passed (a crash) | `Read`, `IdempotentWrite`, `KeyedWrite`: execute again with the same key (the provider deduplicates); `UnkeyedWrite`: a read-back if one is declared consistent, else `outcome_unknown`; `MultiStep`: `outcome_unknown` |
//! | an intent older than the retention | `receipt_expired`: refused loudly, never silently repeated |
//!
//! **Retention and pruning.** [`ReceiptStore::prune`] deletes records, and a deleted record
//! cannot be told from one that never existed: a resume that arrives after its record was pruned
//! starts fresh. Prune only what is older than your longest possible resume, with a margin (for
//! example `prune(now - 2 × retention)`), so that records between one and two retentions old are
//! still there to be refused loudly.
//!
//! After the call: a success (or an empty answer) stores the receipt; a failure that provably did
//! not take effect (transient, a rejected argument) removes the intent; an ambiguous failure keeps
//! it and gives up its lease, so the next attempt decides as after a crash.
//!
//! **Observability.** Every decision is a tracing event (target `stormguard::receipt::layer`)
//! (DEBUG for the routine ones, INFO for resumes, read-backs and refusals, WARN/ERROR when the
//! store fails) and a count of `stormguard_receipt_outcomes_total`, labelled `outcome`:
//!
//! | `outcome` | when |
//! |---|---|
//! | `fresh` | the intent was recorded; the call executes |
//! | `receipt` | a stored receipt answered; the dependency was not called |
//! | `resumed_with_key` | a pending intent whose lease passed: executed again with the same key |
//! | `read_back_found` / `read_back_absent` | an unkeyed write's read-back found the effect / did not |
//! | `recorded` | the receipt was stored after the call |
//! | `left_pending` | an ambiguous failure: the intent stays, a later attempt decides |
//! | `abandoned` | a failure that did not take effect: the intent was removed |
//! | `receipt_not_stored` | the effect happened but its receipt could not be stored or encoded |
//! | `cancelled_after_send` | the call was dropped after it was sent: its lease is given up, the intent stays |
//! | `not_sent` | the call was dropped or its service failed before sending: the intent is removed |
//! | `store_unavailable` | the intent could not be recorded; nothing was executed |
//! | `idempotency_key_reused`, `in_progress`, `receipt_expired`, `outcome_unknown` | refusals, as the error codes |
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use serde::{Deserialize, Serialize};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::class::ToolClass;
//! use stormguard::key::{IdempotencyKey, KeyStamp};
//! use stormguard::receipt::{Action, InMemoryStore, ReceiptLayer};
//!
//! #[derive(Clone)]
//! struct SendInvoice { invoice_id: u64, key: Option<String> }
//! impl KeyStamp for SendInvoice {
//!     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
//!     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()); }
//! }
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Sent { message_id: String }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let sends = Arc::new(AtomicU32::new(0));
//! let counter = sends.clone();
//! let provider = service_fn(move |req: SendInvoice| {
//!     counter.fetch_add(1, Ordering::SeqCst);
//!     async move { Ok::<_, std::io::Error>(Sent { message_id: format!("msg-{}", req.invoice_id) }) }
//! });
//! let store = InMemoryStore::new();
//! let layer = ReceiptLayer::new(store, ToolClass::KeyedWrite, |req: &SendInvoice| {
//!     Action::new("run-81f2", "step-2", "send_invoice", &req.invoice_id)
//! });
//! let mut tool = ServiceBuilder::new().layer(layer).service(provider);
//!
//! let req = SendInvoice { invoice_id: 4471, key: None };
//! let first = tool.ready().await.unwrap().call(req.clone()).await.unwrap();
//! let again = tool.ready().await.unwrap().call(req).await.unwrap(); // a resume, a retry
//! assert_eq!(first, again);
//! assert_eq!(sends.load(Ordering::SeqCst), 1);
//! # }
//! ```

mod clock;
mod codec;
mod intent;
mod layer;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod read_back;
mod run;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

pub use crate::key::Action;
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::{Codec, JsonCodec};
pub use layer::{Receipt, ReceiptLayer};
pub use memory::InMemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
pub use read_back::{Consistency, NoReadBack, ReadBack, ReadBackResult};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use store::{
    Begin, Durability, PendingIntent, ReceiptStore, Record, Resolution, Resolved, StoreError,
};
