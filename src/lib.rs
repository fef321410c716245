//! Tower middleware that makes the retries of AI agents safe.
//!
//! Agents retry all the time: the HTTP client retries a timeout, the tool wrapper retries, the
//! agent loop reissues the call, and a resumed run repeats a step whose completion was never
//! recorded. Three nested layers of 3 attempts make 27 calls for one failing operation, and a
//! retried write that is not idempotent charges the card twice. stormguard's layers stop both:
//!
//! - [`retry`]: a [`Retry`](retry::Retry) layer that decides each retry from the tool's
//!   [class](class::ToolClass) and the failure's [class](classify::FailureClass), draws from a
//!   [budget](budget::RetryBudget) shared by every layer, and joins the
//!   [operation] of any stormguard layer above it, so nesting never multiplies
//!   attempts;
//! - [`breaker`]: a [`CircuitBreaker`](breaker::CircuitBreaker) that counts failures of the
//!   dependency but not empty results or caller mistakes, with an exact half-open trial count;
//! - [`classify`]: one verdict per result (`Success`, `Empty`, or a failure class) that retry,
//!   breaker and metrics share; "no such record" is an answer, not a failure;
//! - [`peek`] (feature `http`): reads a model API's error body before it is classified, without
//!   taking it from the caller;
//! - [`backoff`]: full, equal or decorrelated jitter, a fresh seed per operation, and the
//!   server's `Retry-After` honoured up to a cap;
//! - [`key`]: idempotency keys derived from the action's logical identity (run, step, tool,
//!   canonical arguments), stamped once per operation;
//! - [`receipt`]: intent before the call, receipt after (in memory, SQLite or PostgreSQL), so a
//!   retry or a resume after a crash never repeats a side effect, and an unknown outcome is
//!   escalated instead of guessed;
//! - [`quota`]: a client-side rate limit (GCRA, shared by every clone) that keeps calls, and
//!   retries, under a provider's quota instead of learning it from `429`s;
//! - [`error`]: every failure leaves as a [`error::ToolError`] with a stable code, a
//!   retryable flag and a hint a model can act on.
//!
//! # Where each layer goes
//!
//! ```text
//! agent loop ─► Retry(class) ─► ReceiptGuardLayer ─► CircuitBreaker ─► Timeout ─► Quota ─► client
//!                 └ one RetryBudget handle and one operation ledger shared by every Retry below
//! ```
//!
//! The receipt layer stamps the action's idempotency key itself; without receipts, a
//! `SetIdempotencyKeyLayer` with the same `MakeIdempotencyKey` takes its place. The `Timeout`
//! goes below the breaker, so that a hung call ends as a failure the breaker counts (see the
//! [`breaker`] module docs).
//!
//! The quota goes last, right above the client: every attempt the layers above decide to make
//! waits for room in it, and a call the breaker rejects takes none.
//!
//! The breaker sits below the receipt layer: a receipt answered from
//! the store is not evidence about the dependency, and must not close a half-open breaker; and a
//! receipt layer's own refusals (`in_progress`, `store_unavailable`) must not count as failures
//! of the dependency. An open circuit's rejection reaches the receipt layer as a failure that did
//! not take effect, so the intent is removed.
//!
//! # The decision table
//!
//! | failure | `Read` | `IdempotentWrite` | `KeyedWrite` (key) | `KeyedWrite` (no key) | `UnkeyedWrite` | `MultiStep` |
//! |---|---|---|---|---|---|---|
//! | `Transient` | retry | retry | retry | retry | retry | return |
//! | `Ambiguous` | retry | retry | retry, same key | `missing_idempotency_key` | `outcome_unknown` | `outcome_unknown` |
//! | `ModelRecoverable`, `Permanent`, `Policy` | return | return | return | return | return | return |
//!
//! HTTP 500, 502, 503 and 504 are `Ambiguous` (a proxy answers 503 after forwarding, too; a
//! provider documented otherwise is declared with `classify::NotProcessed`).
//!
//! An escalation in this table holds whatever came with the failure: a server hint, a
//! non-retryable error from below, a spent budget. The order of the other checks is in the
//! [`retry`] module docs.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
//! use stormguard::classify::HttpClassifier;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // One budget for every layer that guards this dependency.
//! let budget = RetryBudget::default();
//!
//! let client = service_fn(|req: http::Request<String>| async move {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(format!("searched {}", req.uri())))
//! });
//! let mut search = ServiceBuilder::new()
//!     .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("search"))
//!     .layer(RetryLayer::new(ToolClass::Read, budget).classifier(HttpClassifier).name("http"))
//!     .service(client);
//!
//! let req = http::Request::get("/search?q=storm").body(String::new())?;
//! let resp = search.ready().await?.call(req).await?;
//! assert_eq!(resp.body(), "searched /search?q=storm");
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `http` (default): the `http::Response` classifiers (`HttpClassifier`, `GrpcClassifier`
//!   for streams, `ModelApiClassifier`), the [`peek`] middleware, `Retry-After` HTTP-date
//!   parsing, `HttpReplay`, and [`Carrier`](operation::Carrier) and [`KeyStamp`](key::KeyStamp)
//!   for `http::Request`.
//! - `sqlite`: `receipt::SqliteStore` (rusqlite with SQLite compiled in).
//! - `postgres`: `receipt::PostgresStore` (tokio-postgres).
//! - `reqwest`: `HttpClassifier` for `reqwest::Response`, `reqwest::Error` classified by kind,
//!   `HttpReplay` and `Idempotency-Key` for `reqwest::Request`.
//! - `reqwest-0_13`: the same for reqwest 0.13 (the renamed dependency `reqwest013`).
//! - `tonic`: `tonic::Status` classified by gRPC code, `idempotency-key` metadata on
//!   `tonic::Request`, and `retry::GrpcReplay`.
//! - `rmcp`: a `ToolError` as an rmcp `CallToolResult`, read back by `McpClassifier` on the
//!   client, classes from `ToolAnnotations`.
//! - `redis`: the `fleet` module: a retry budget, quotas and breakers shared by a fleet of
//!   workers through Redis (redis-rs), each deciding locally while Redis is out of reach.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
pub mod breaker;
pub mod budget;
#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
pub mod chaos;
pub mod class;
pub mod classify;
pub mod error;
pub mod failover;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod fleet;
pub mod hedge;
pub mod key;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub mod middleware;
pub mod operation;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod peek;
pub mod quota;
pub mod receipt;
pub mod retry;
pub mod saga;
#[cfg(feature = "http")]
pub mod stream;
pub mod tool;

mod telemetry;

/// What the crate's macros name; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
