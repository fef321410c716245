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
//! for whose retry, and one failing caller can spend everything the others deposited (beside one
//! run in an outage, the healthy run above keeps 95.5 % at 100/s and 90.2 % at 10/s: no retries).
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

pub(crate) mod balance;
mod builder;
mod lend;
mod ratio;
mod refusal;
mod run;
pub(crate) mod scope;

pub use builder::RetryBudgetBuilder;
pub(crate) use ratio::{next_id, random_seed, RETRY};
pub use refusal::Refusal;
pub use run::{RunLimits, RunLimitsBuilder};
pub use scope::RunScoped;

use lend::Short;
use ratio::Ratio;
use refusal::loan_refused;
use run::Run;
use std::fmt;
use std::future::Future;

use std::sync::Arc;
use std::time::Duration;

/// A retry budget shared by every layer (and every clone) it is given to.
///
/// `RetryBudget::default()` is `retry_ratio` 0.2, `max_balance` 100, a floor of 10 retries per
/// 60 s, a run share of 10 retries, a lending limit of one run share, no run limits.
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::{Refusal, RetryBudget};
///
/// let no_floor = RetryBudget::builder().floor(0, Duration::from_secs(60)); // deposits only
/// let budget = no_floor.retry_ratio(0.5).build()?;
/// assert_eq!(budget.try_withdraw(Duration::ZERO), Err(Refusal::RetryBudget));
/// budget.deposit();
/// budget.deposit();
/// assert_eq!(budget.balance(), 1.0);
/// assert_eq!(budget.try_withdraw(Duration::ZERO), Ok(()));
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    ratio: Arc<Ratio>,
    run: Option<Arc<Run>>,
}

impl RetryBudget {
    /// A builder with the default settings.
    pub fn builder() -> RetryBudgetBuilder {
        RetryBudgetBuilder::default()
    }

    /// A handle for one agent run: it shares this budget's ratio balance within the run's
    /// [fair share](self#fair-shares-between-runs), and adds the run's own `limits`
    /// (`RunLimits::default()` for none).
    pub fn for_run(&self, limits: RunLimits) -> RetryBudget {
        RetryBudget {
            ratio: self.ratio.clone(),
            run: Some(Arc::new(Run::new(limits, self.ratio.clone()))),
        }
    }

    /// Runs `future` as this run: while it is polled, every handle of the same budget that has no
    /// run of its own (a plain clone given to a stack built once) deposits into, draws on and is
    /// limited as this run's handle. This is how one long-lived stack serves many agent runs
    /// with [fair shares](self#fair-shares-between-runs): wrap each run's work, not the stack.
    /// A handle of another budget, or one made with its own [`for_run`](Self::for_run), keeps its
    /// own account; a scope inside a scope wins while it runs. A task spawned inside does not
    /// inherit the scope unless it is wrapped too (or carried with
    /// [`operation::carry`](crate::operation::carry) from inside a stormguard layer).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::{budget::{RetryBudget, RunLimits}, class::ToolClass, retry::RetryLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), stormguard::error::ConfigError> {
    /// let shared = RetryBudget::default();
    /// // One stack, built once on the shared budget, serves every run.
    /// let search = RetryLayer::new(ToolClass::Read, shared.clone())
    ///     .layer(service_fn(|q: &'static str| async move { Ok::<_, std::io::Error>(q.len()) }));
    /// let run = shared.for_run(RunLimits::builder().max_retries(20).build()?);
    /// let found = run.scope(search.clone().oneshot("storm")).await.unwrap();
    /// assert_eq!(found, 5);
    /// assert_eq!(run.run_credit(), Some(0.2)); // the run's success, credited to the run
    /// # Ok(()) }
    /// ```
    pub fn scope<F: Future>(&self, future: F) -> RunScoped<F> {
        RunScoped::new(future, self.clone())
    }

    /// Runs `f` on the run this handle acts for: its own, else the run whose
    /// [scope](Self::scope) is being polled if that run draws on this budget, else none.
    #[inline]
    fn with_run<T>(&self, f: impl FnOnce(Option<&Run>) -> T) -> T {
        match &self.run {
            Some(run) => f(Some(run)),
            None => scope::with_current(&self.ratio, f),
        }
    }

    /// Credits one logical operation that succeeded (and, for a run's handle, the run's own
    /// account: see [fair shares](self#fair-shares-between-runs)).
    #[inline]
    pub fn deposit(&self) {
        self.ratio.deposit();
        self.with_run(|run| {
            if let Some(run) = run {
                run.earn();
            }
        });
    }

    /// Who is credited by [`deposit`](Self::deposit): the run this handle acts for (its own, or
    /// that of the [scope](Self::scope) being polled), or the shared balance for none. A 24-bit number, never 0, unique among the budgets and run
    /// handles of a process until 16,777,215 of them have been made (then numbers repeat, and
    /// two nested layers on two budgets with one number credit only the outer one). Nested layers
    /// use it to credit each budget once per operation.
    #[inline]
    pub(crate) fn id(&self) -> u32 {
        self.with_run(|run| run.map_or_else(|| self.ratio.id(), Run::id))
    }

    /// Asks for one retry that will wait `delay` first. On `Ok` the retry is paid for.
    pub fn try_withdraw(&self, delay: Duration) -> Result<(), Refusal> {
        self.withdraw(delay, ratio::RETRY)
    }

    /// Asks for a retry the server scheduled after throttling the call (a `429` or
    /// `RESOURCE_EXHAUSTED` with a non-zero `Retry-After` or pushback that the retry waits in
    /// full), waiting `delay` first. It costs
    /// the ratio balance 5/14 of a retry, as AWS's 2026 retry quota charges throttling 5 tokens
    /// and other failures 14: the dependency is up and has said when to come back. The run
    /// budget counts it as a whole retry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::RetryBudget;
    ///
    /// let budget = RetryBudget::builder().floor(0, Duration::from_secs(60)).retry_ratio(1.0).build()?;
    /// budget.deposit(); // one retry's worth
    /// let throttled = (0..5).filter(|_| budget.try_withdraw_throttled(Duration::ZERO).is_ok());
    /// assert_eq!(throttled.count(), 2); // 2 × 0.357 fits in 1.0, a third does not
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn try_withdraw_throttled(&self, delay: Duration) -> Result<(), Refusal> {
        self.withdraw(delay, ratio::THROTTLED)
    }

    fn withdraw(&self, delay: Duration, cost: i64) -> Result<(), Refusal> {
        self.with_run(|run| {
            let Some(run) = run else {
                return if self.ratio.try_withdraw(cost) {
                    Ok(())
                } else {
                    Err(Refusal::RetryBudget)
                };
            };
            run.try_spend(delay)?;
            // The shared balance as the lending rules allow; the floor for every run.
            match run.draw(cost) {
                Ok(()) => return Ok(()),
                Err(Short::Balance) => {}
                Err(short) => loan_refused(short),
            }
            if self.ratio.try_floor() {
                return Ok(());
            }
            run.refund(delay);
            Err(Refusal::RetryBudget)
        })
    }

    /// Asks `exact` for one retry now (the shared balance's exact path: `Some(granted)`, or
    /// `None` when it has no answer), with this handle's run limits around it; without an
    /// answer, it is [`try_withdraw`](Self::try_withdraw).
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) async fn withdraw_exact(
        &self,
        delay: Duration,
        exact: impl Future<Output = Option<bool>>,
    ) -> Result<(), Refusal> {
        let run = self.run.clone().or_else(|| scope::current_run(&self.ratio));
        if let Some(run) = &run {
            run.try_spend(delay)?;
        }
        let answer = exact.await;
        if answer == Some(true) {
            return Ok(());
        }
        if let Some(run) = &run {
            run.refund(delay);
        }
        match answer {
            Some(_) => Err(Refusal::RetryBudget),
            None => self.try_withdraw(delay),
        }
    }

    /// The balance this budget shares with other processes, if any.
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn shared_balance(&self) -> Option<&dyn balance::Balance> {
        self.ratio.shared.as_deref()
    }

    /// Retries the ratio balance allows now (without the floor).
    pub fn balance(&self) -> f64 {
        self.ratio.balance()
    }

    /// Retries that runs owe the shared balance together now, as the lending limit counts them:
    /// what the runs alive drew beyond their own deposits, and what runs that ended in debt left
    /// owing in the current floor window (see [fair shares](self#fair-shares-between-runs)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::{RetryBudget, RunLimits};
    ///
    /// let shared = RetryBudget::builder().floor(0, Duration::from_secs(60)).build()?;
    /// for _ in 0..50 {
    ///     shared.deposit(); // 10 retries in the balance, deposited by no run
    /// }
    /// let run = shared.for_run(RunLimits::default());
    /// assert!(run.try_withdraw(Duration::ZERO).is_ok()); // on loan
    /// assert_eq!(shared.lent(), 1.0);
    /// run.deposit(); // 0.2 repaid
    /// assert!((shared.lent() - 0.8).abs() < 1e-9);
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn lent(&self) -> f64 {
        self.ratio.lent() as f64 / ratio::RETRY as f64
    }

    /// Retries this run has spent, if this handle is a run's ([`for_run`](Self::for_run)). A
    /// plain handle used inside a run's [scope](Self::scope) answers `None`: ask the run's handle.
    pub fn run_retries(&self) -> Option<u32> {
        self.run.as_ref().map(|run| run.retries())
    }

    /// What this run has deposited into the shared balance minus what it drew from it, in
    /// retries, if it is a run's handle (see [fair shares](self#fair-shares-between-runs)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::{RetryBudget, RunLimits};
    ///
    /// let shared = RetryBudget::builder().retry_ratio(0.5).build()?;
    /// let run = shared.for_run(RunLimits::default());
    /// run.deposit();
    /// assert_eq!(run.run_credit(), Some(0.5));
    /// assert_eq!(shared.run_credit(), None);
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn run_credit(&self) -> Option<f64> {
        self.run.as_ref().map(|run| run.credit())
    }

    /// Backoff time this run has spent, if it has a run budget.
    pub fn run_retry_time(&self) -> Option<Duration> {
        self.run.as_ref().map(|run| run.retry_time())
    }

    /// A fresh seed for one operation's backoff.
    pub(crate) fn next_seed(&self) -> u64 {
        self.ratio.next_seed()
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudgetBuilder::default()
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("balance", &self.balance())
            .field("run_retries", &self.run_retries())
            .field("run_credit", &self.run_credit())
            .field("run_retry_time", &self.run_retry_time())
            .finish()
    }
}

/// tower interop: `deposit` credits one operation, `withdraw` asks for a retry without delay.
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn withdraw(&self) -> bool {
        self.try_withdraw(Duration::ZERO).is_ok()
    }
}
