//! Retries that follow the tool's class, share one budget, and never multiply when nested.
//!
//! [`Retry`] decides each retry from the tool class × the failure class
//! ([`ToolClass::decide`](crate::class::ToolClass::decide)), the server's hint, the operation's
//! ledger (attempts across all nested layers, see [`operation`](crate::operation)), the shared
//! [`RetryBudget`](crate::budget::RetryBudget), and the operation's deadline, in one pure function whose order is the
//! contract:
//!
//! 1. a success or an empty answer is handed back, and credited to the budget once per
//!    operation: by the outermost layer, and by each nested layer whose budget differs from
//!    that of the layer calling it (layers on one budget credit it once);
//! 2. an operation a layer below ended is handed back untouched;
//! 3. the class table: **an ambiguous failure of an unkeyed write, or of a keyed write without
//!    its key, ends as `outcome_unknown` / `missing_idempotency_key` whatever came with it** (a
//!    server hint, a non-retryable error from below, a spent budget); a failure retrying cannot
//!    help (a bad argument, a bad credential, a used-up quota) is handed back: an `Ok` response
//!    stays `Ok`, an `Err` becomes a non-retryable `ToolError`; either way the operation ends
//!    there, so a layer above whose classifier sees less (the status, not the provider's error
//!    body) hands it back too (rule 2);
//! 4. the server asked not to retry (a negative or malformed `grpc-retry-pushback-ms`, gRFC A6),
//!    or a `ToolError` from below forbids it (an open circuit: it passes through as it is);
//! 5. the request could not be copied (a streaming body);
//! 6. the operation's attempts are spent: the cap of the layer that opened it (the outermost);
//! 7. this layer's own attempts are spent (its `max_attempts` caps the attempts it makes in a
//!    row): a nested layer hands the failure up as a retryable `ToolError`, and the layer above
//!    decides with the operation's cap;
//! 8. the delay (the class's backoff, or the server's `Retry-After` / pushback clamped to the
//!    policy's maximum) would end at or after the deadline;
//! 9. the budget refuses. A layer that joined the operation on a budget other than its owner's
//!    (the layer that opened it) hands the failure up, still retryable, as in step 7: the owner
//!    decides with its own budget, and its refusal ends the operation. Layers on one budget ask
//!    it once: the first refusal ends the operation. A run's limit (`run_budget_exhausted`)
//!    ends it wherever it is reached, as a run's cap is on the whole run, and so does a delay
//!    past the deadline (step 8 comes first): a layer's backoff is the spacing its dependency
//!    needs, so a joined layer whose next attempt cannot fit ends the operation.
//!
//! Every ending of steps 3-9 (but 7, a hand-up of 9, and an open circuit's `circuit_open`, which passes through
//! as it is, `retryable: true` with the time left as `retry_after`) closes the operation, so no
//! layer above retries it, and is a [`ToolError`](crate::error::ToolError) with `retryable: false`, the operation's attempt count, the code of the last
//! failure (`unavailable`, `rate_limited`, ...) or of the ending (`outcome_unknown`,
//! `retry_budget_exhausted`, `run_budget_exhausted`, `deadline_exceeded`), a hint that agrees
//! with `retryable: false`, and the dependency's own structured error as its
//! [`cause`](crate::error::ToolError::cause) (a `ToolError` in the error's chain, or what
//! [`Classify::dependency_error`](crate::classify::Classify::dependency_error) reads from a response, such as its HTTP status); any other
//! error stays reachable through `source()`.
//!
//! # Deadlines
//!
//! Each layer's [`deadline`](crate::class::ClassPolicyBuilder::deadline) joins the operation; the
//! earliest wins. It counts from the layer's `call`, or from when its `poll_ready` first waited.
//! No attempt starts at or after it, the first included: a first attempt whose wait for
//! readiness (a quota, a pool, a layer behind a `Buffer`) outlasted it is not sent; a retry whose
//! delay would end past it is refused, and a granted retry that is still waiting for its service
//! to be ready when it passes is abandoned. Each ends as `deadline_exceeded`. An attempt still in flight when it passes is
//! cut off (the layer holding the operation drops it): a call that may be sent again ends as
//! `deadline_exceeded`, and a write that may not (an unkeyed write, a keyed one without its key)
//! as `outcome_unknown` (`missing_idempotency_key`), for the attempt may have been applied. A
//! `tower::timeout` layer below the `Retry` still bounds each attempt on its own (a timeout is
//! an ambiguous failure, decided as above).
//!
//! # Classes of nested layers
//!
//! A joining layer with a stricter class makes the whole operation that class (a retry of the
//! whole repeats its calls). When that changes a decision (a `Read` operation becomes an
//! `UnkeyedWrite`) it logs a WARN and counts `stormguard_class_tightened_total`: a call that is a
//! logical operation of its own (an auth-token refresh, each branch of a fan-out) belongs in a
//! layer with [`RetryLayer::own_operation`].
//!
//! # Example: three nested layers, one budget
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
//! use stormguard::error::ErrorCode;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let dependency = service_fn(move |_req: u32| {
//!     counter.fetch_add(1, Ordering::SeqCst);
//!     async { Err::<u32, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
//! });
//!
//! let budget = RetryBudget::default();
//! let mut stack = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("agent-loop"))
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
//!     .layer(RetryLayer::new(ToolClass::Read, budget).name("client"))
//!     .service(dependency);
//!
//! let err = stack.ready().await.unwrap().call(7).await.unwrap_err();
//! assert_eq!(calls.load(Ordering::SeqCst), 3); // not 27
//! assert_eq!(err.code(), ErrorCode::Unavailable);
//! assert!(!err.retryable());
//! assert_eq!(err.attempts(), 3);
//! # }
//! ```
//!
//! # Backpressure
//!
//! `poll_ready` waits for the inner service (it neither sheds nor queues). Before every retry the
//! future polls its own clone of the inner service ready, as tower's `Retry` does.
//!
//! # Where it belongs
//!
//! Outermost in a tool's stack (the agent loop's layer), above the circuit breaker, so that a
//! rejection from an open circuit is seen and not retried; nested layers (a tool wrapper, an
//! HTTP client's layer) may stay: they join the outer layer's operation.
//!
//! # Observability
//!
//! Tracing: a `stormguard.operation` span (DEBUG) per logical operation with `layer` and `class`;
//! a DEBUG event per retry (`attempt`, `failure`, `delay_ms`) and an INFO event when a layer gives
//! up or escalates (`code`, `attempts`, `reason`).
//!
//! Metrics:
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `stormguard_operations_total` | `class` | logical operations (by the outermost layer) |
//! | `stormguard_retries_total` | `class`, `failure` | retries granted, by any layer |
//! | `stormguard_retry_refusals_total` | `class`, `reason` | retries refused: `max_attempts`, `retry_budget`, `run_budget`, `deadline`, `not_replayable`, `server_pushback` (also an open circuit or a non-retryable error from below) |
//! | `stormguard_escalations_total` | `class`, `code` | `outcome_unknown` and `missing_idempotency_key` endings |
//! | `stormguard_class_tightened_total` | `from`, `to` | joins that made an operation's class stricter, changing a decision |
//!
//! Amplification is `(operations + retries) / operations`.

mod decide;
mod ending;
pub mod future;

pub(crate) mod layer;
mod outcome;
mod part;
mod paused;
pub(crate) mod policy;
mod replay;
mod request;
mod service;

pub use layer::RetryLayer;
pub(crate) use policy::ClassPolicy;
#[cfg(feature = "tonic")]
pub use replay::GrpcReplay;
#[cfg(feature = "http")]
pub use replay::HttpReplay;
pub use replay::{CloneReplay, DefaultReplay, Replay};
pub use request::Request;
pub use service::Retry;
pub(crate) use service::{into_tool_error, Retrier};
