//! Sagas: a multi-step irreversible action (reserve, charge, issue) as a sequence of declared
//! tools, each with its own key and receipt, each irreversible step with a compensation (release,
//! refund), resumable from any crash.
//!
//! A key protects one step from repeating itself and says nothing about a sequence that must be
//! undone: that is the saga's job. A [`Saga`] runs its steps in order, each through its own
//! tool's stack (its class decides its retries; there is no whole-saga retry). When a step fails
//! for good (an error that is not retryable), the compensations of the steps done so far run in
//! reverse order, each exactly once and each retried by its own policy. The decision to
//! compensate is recorded in the receipt store before the first compensation, and every step and
//! compensation is a tool with a receipt, so a crash anywhere followed by [`Saga::run`] again
//! (same run id, same arguments) repeats nothing: a done step is answered from its receipt, a
//! decided compensation resumes where it stopped. An unknown outcome of a step halts the saga
//! ([`Halt::OutcomeUnknown`]) until an operator settles that step's pending intent
//! ([`ReceiptStore::resolve`](crate::receipt::ReceiptStore::resolve)); then it resumes.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use serde_json::{json, Value};
//! use tower::service_fn;
//! use stormguard::classify::OkIsSuccess;
//! use stormguard::error::{ErrorCode, ToolError};
//! use stormguard::saga::Halt;
//! use stormguard::tool::{Call, Stores, Toolbox};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let keyed = |name: &str| json!({
//!     "name": name, "class": "keyed_write", "retry": ["layer"], "key": ["run", "tool"],
//!     "unknown_outcome": "escalate", "receipt": { "store": "receipts" }
//! });
//! let toolbox = Toolbox::from_json_str(&json!({
//!     "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
//!     "tools": [keyed("reserve"), keyed("release"), keyed("charge"), keyed("refund"), keyed("issue")],
//!     "sagas": { "trip": { "steps": [
//!         { "tool": "reserve", "compensation": "release" },
//!         { "tool": "charge", "compensation": "refund" },
//!         { "tool": "issue" }
//!     ] } }
//! }).to_string())?;
//! let tools = toolbox.build(Stores::new())?;
//!
//! // The provider: every action is counted; issuing the ticket fails for good.
//! let done = Arc::new(Mutex::new(Vec::<String>::new()));
//! let log = done.clone();
//! let provider = service_fn(move |call: Call| {
//!     let tool = call.tool().unwrap_or_default().to_owned();
//!     log.lock().unwrap().push(tool.clone());
//!     async move {
//!         match tool.as_str() {
//!             "issue" => Err(ToolError::new(ErrorCode::InvalidArgument).with_retryable(false)),
//!             _ => Ok::<Value, ToolError>(json!({ "ok": tool })),
//!         }
//!     }
//! });
//! let trip = tools.saga("trip", provider, OkIsSuccess)?;
//!
//! let halted = trip.run("run-7", json!({ "seat": "12A" })).await.unwrap_err();
//! assert!(matches!(halted.halt(), Halt::Compensated { step } if step == "issue"));
//! assert_eq!(*done.lock().unwrap(), ["reserve", "charge", "issue", "refund", "release"]);
//!
//! // Run again (a resume after a crash would do the same): nothing is repeated.
//! let again = trip.run("run-7", json!({ "seat": "12A" })).await.unwrap_err();
//! assert!(matches!(again.halt(), Halt::Compensated { .. }));
//! assert_eq!(done.lock().unwrap().len(), 5);
//! # Ok(()) }
//! ```

mod build;
mod record;
mod run;
mod spec;

pub use run::{Halt, Saga, SagaError};
pub use spec::{SagaSpec, SagaStep};
