//! The shared retry budget: a ratio budget with a small floor, and an optional run budget.
//!
//! One [`RetryBudget`] is a cheap `Clone` handle over atomics; every layer you give a clone to
//! draws from the same balance. It works with the per-operation ledger of
//! [`operation`](crate::operation): the ledger caps the attempts of one logical operation across
//! nested layers, the budget caps the retries of all operations together.
//!
//! # Why a ratio budget, and why this one
//!
//! A cap on attempts per request does not stop a storm: in an outage every request spends all
//! its attempts. A budget ties retries to what is going well: here, **each logical operation
//! that succeeds deposits `retry_ratio` of a retry** (0.2 by default, Finagle's and tower's 20 %),
//! and each retry withdraws one. In an outage nothing succeeds, so nothing is deposited and only
//! the floor lets retries through; under scattered transient failures the successes around them
//! pay for their retries.
//!
//! Three things differ from tower's `TpsBudget` (a Finagle port), each measured to matter:
//!
//! - **Deposits happen once per logical operation**, by the layer that opened it, not once per
//!   layer: with three nested layers tower deposits three times for one success.
//! - **The floor is per window, not per second.** `TpsBudget::default()` lets 10 retries/s
//!   through whatever happens, which at the 1 request/s of one agent run is 10 retries per
//!   request. The default floor here is 10 retries per minute.
//! - **The hot path takes no lock and reads no clock**: a deposit is one atomic load (and an
//!   atomic add while the balance is below its cap). Only a retry reads the clock (for the floor).
//!
//! The balance is capped at `max_balance` retries (100 by default), so a long healthy spell
//! cannot bank an unbounded burst for the next outage.
//!
//! # Retry where it helps, shed where it hurts
//!
//! A ratio alone is too stingy under random failures: where each call fails with probability
//! 0.5, 20 % of a retry per success pays for one retry in ten failures (55 % success, where three
//! attempts give 87.5 %). So a retry after an ordinary failure may also be paid by the
//! **dependency's acceptance** ([`acceptance`]): the share of its last ~32 attempts the layer saw
//! answered. It goes free of the balance with probability `min(1, 2·a)`, Google SRE's client-side
//! throttling (`K` = 2) applied to retries only: all of them while the dependency answers half its
//! calls or more, none in an outage. A failure that says the dependency is **overloaded** or
//! limiting (a server-named delay, a pushback, a rate limit) is never paid this way. A `503` or
//! `529` with `Retry-After` and a gRPC pushback cost the balance two retries: in a sustained
//! overload each retry that succeeds displaces another caller's first attempt. A rate limit
//! (`429`, `RESOURCE_EXHAUSTED`) whose delay the retry waits in full costs 5/14 of one (the server
//! scheduled it, as AWS's retry quota prices throttling); any other rate limit costs one. The
//! storm demo, same seeds, 100 requests/s (`cargo run --release --example storm`):
//!
//! | | ratio only (before) | with acceptance | tower, shared `TpsBudget` | tower-resilience |
//! |---|---|---|---|---|
//! | half the calls fail: success, calls per op | 55.1 %, 1.11x | **87.3 %, 1.75x** | 77.4 %, 1.56x | 100 %, 2.01x |
//! | outage: calls per op, 100/s and 1/s | 1.002x, 1.167x | 1.002x, 1.167x | 1.10x, 10.1x | 1.12x, 11.2x |
//! | brownout (down 20 s, 30 % failing 40 s): success | 76.8 % | 82.4 % | 83.3 % | 84.9 % |
//! | twice the calls the dependency can serve (503 + `Retry-After`) | 1.10x | 1.05x | | |
//!
//! The brownout row is at the ceiling three attempts allow (a call in the 30 % phase still fails
//! three times in 2.7 % of operations); the peers reach more by sending up to 27 calls per
//! operation. The price is at the start of an outage after a healthy spell: the acceptance
//! falls below one half after about 22 failed attempts, so each layer lets about 50 retries
//! through before it sheds (`outage-after-healthy`: 1.006x over two minutes, half of them down).
//! Finagle's `RetryBudget` and gRPC A6's retry throttling (a token bucket drained by failures)
//! shed both cases alike; A6's would stop retrying at a 50 % failure rate.
//!
//! A retry the server scheduled after throttling a call (`429` or `RESOURCE_EXHAUSTED` with
//! `Retry-After` or a pushback) costs 5/14 of a retry
//! ([`try_withdraw_throttled`](RetryBudget::try_withdraw_throttled)): the dependency is up and
//! said when to come back, as AWS's 2026 retry quota charges throttling 5 tokens and other
//! failures 14. When the budget is spent on throttling, the error says so and carries the
//! server's delay, instead of reporting an outage.
//!
//! # Run budget
//!
//! An agent run can also cap what it spends in total, across every tool it calls: a number of
//! retries and a total of backoff time. Give each run its own handle with
//! [`RetryBudget::for_run`] (and build its stacks on it, or run its work in the handle's
//! [`scope`](RetryBudget::scope)); the ratio balance stays shared.
//!
//! ```
//! use std::time::Duration;
//! use stormguard::budget::{RetryBudget, RunLimits};
//!
//! let shared = RetryBudget::builder().retry_ratio(0.1).build()?;
//! let run = shared.for_run(RunLimits::builder().max_retries(20).max_retry_time(Duration::from_secs(60)).build()?);
//! assert_eq!(run.run_retries(), Some(0));
//! # Ok::<(), stormguard::error::ConfigError>(())
//! ```
//!
//! # Fair shares between runs
//!
//! One balance for every run lets a quiet run (one agent at 1 request/s) retry on the credit
//! of the busy ones around it. It also lets runs in an outage spend what the healthy runs
//! deposited, and starve them. So each run keeps an account of what it deposited minus what it
//! drew (its *credit*; below zero, its *debt*), and a retry its credit does not cover is a
//! **loan**, allowed only while
//!
//! - the run owes at most `run_share` retries ([`RetryBudgetBuilder::run_share`], 10 by
//!   default), and
//! - **all runs together** owe at most `lending_limit` retries
//!   ([`RetryBudgetBuilder::lending_limit`], one run share by default, whatever the number of
//!   runs).
//!
//! A run repays its debt as it deposits. A run that ends in debt (its last handle dropped) leaves
//! the debt counted against the limit until the floor window turns, so run handles made and
//! dropped in a loop cannot borrow more than the limit per window. A run that succeeds more than
//! it fails never borrows; runs in an outage borrow the limit between them once, then have only
//! the floor. The floor (10 retries a minute) stays common to every run: it is what a cold start
//! or a run in an outage gets, whatever the others do.
//!
//! A bound on each run's loan alone is not enough: N runs in an outage take N shares. Beside 20 of
//! them (10 requests/s each), a healthy run with 10 % transient failures fell from 99.89 %
//! success (alone) to 96.4 % at 10 requests/s and 99.64 % at 100/s with per-run shares only; with
//! the lending limit it keeps 99.78 % and 99.88 % for 1, 2, 5 and 20 failing runs alike
//! (`cargo run --release --example storm -- --scenario fairness`, three seeds each).
//!
//! The decision is a pure function of the run's credit, what all runs owe, the balance, the
//! retry's cost, the share and the limit; the atomics carry it out (a loan is counted before the
//! run's credit moves, so the limit holds under concurrent runs). A first-try success still costs
//! a load and at most an add on the balance, the same on the run's credit, and for a handle
//! without a run of its own one thread-local read (is a run's scope being polled?).
//!
//! ## Giving each run its account
//!
//! The budget tells runs apart by their handles. Two ways to give each agent run one:
//!
//! - **A stack built once, many runs** (the usual setup): build the stack on the shared budget
//!   and run each agent run's work in its scope, `run.scope(future)` ([`RetryBudget::scope`]).
//!   While the future is polled, every plain handle of that budget, in every nested layer, acts
//!   for the run: its deposits, its loans and its [`RunLimits`]. The scope travels with the
//!   operation ([`operation::carry`](crate::operation::carry) to a spawned task,
//!   [`AttachLayer`](crate::operation::AttachLayer)/[`AdoptLayer`](crate::operation::AdoptLayer)
//!   across a `Buffer`); a task spawned otherwise must be wrapped in the scope itself.
//! - **A stack per run**: build the run's layers on its own handle, [`RetryBudget::for_run`]. A
//!   handle made this way keeps its own run inside another run's scope.
//!
//! Plain clones used without a scope are one run to the budget: it cannot tell whose success paid
//! for whose retry. Each retry layer still knows whether *its* dependency answers: one that
//! answers under a tenth of its calls gets the floor only ([`acceptance::DOWN`]), so a failing
//! caller no longer spends what the others deposited (beside one run in an outage, the healthy
//! run keeps 99.89 % at 100/s and 99.88 % at 10/s, was 95.5 % and 90.2 %; the failing one makes
//! 1.02x its calls). Run handles remain the way to bound what each run borrows.
//!
//! Finagle's `RetryBudget` and the AWS SDKs' retry quota are one balance per client, so they
//! never lend; tower's `TpsBudget` has no notion of a caller at all. Here the balance is shared
//! (a run too small to fill its own still gets retries) and the loans are bounded, per run and in
//! all.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Layer, ServiceExt, service_fn};
//! use stormguard::budget::{Refusal, RetryBudget, RunLimits};
//! use stormguard::{class::ToolClass, retry::RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let shared = RetryBudget::builder().floor(0, Duration::from_secs(60)).run_share(2).build().unwrap();
//! // One tool stack, built once on the shared budget.
//! let search = RetryLayer::new(ToolClass::Read, shared.clone())
//!     .layer(service_fn(|q: u32| async move { Ok::<_, std::io::Error>(q) }));
//! let healthy = shared.for_run(RunLimits::default());
//! for q in 0..50 {
//!     // 50 successes x 0.2 = 10 retries, in the shared balance and in the run's account.
//!     healthy.scope(search.clone().oneshot(q)).await.unwrap();
//! }
//! assert_eq!(healthy.run_credit(), Some(10.0));
//! // Runs in an outage borrow two retries between them (the limit: one share), then nothing.
//! let down: Vec<_> = (0..5).map(|_| shared.for_run(RunLimits::default())).collect();
//! let lent = down.iter().filter(|run| run.try_withdraw(Duration::ZERO).is_ok()).count();
//! assert_eq!(lent, 2);
//! assert_eq!(down[0].try_withdraw(Duration::ZERO), Err(Refusal::RetryBudget));
//! // The healthy run still draws on its own deposits.
//! assert!(healthy.try_withdraw(Duration::ZERO).is_ok());
//! # }
//! ```

pub mod acceptance;
pub(crate) mod balance;
mod builder;
mod handle;
mod lend;
mod ratio;
mod refusal;
mod run;
pub(crate) mod scope;

pub use builder::RetryBudgetBuilder;
pub use handle::RetryBudget;
pub(crate) use ratio::{next_id, random_seed, RETRY};
pub use refusal::Refusal;
pub use run::{RunLimits, RunLimitsBuilder};
pub use scope::RunScoped;
