//! [`RetryBudget`]: the handle every layer draws on, for the shared ratio balance and, for a run,
//! the run's own account and limits.

use super::balance;
use super::lend::Short;
use super::ratio::{self, Ratio};
use super::refusal::loan_refused;
use super::run::Run;
use super::scope;
use super::{Refusal, RetryBudgetBuilder, RunLimits, RunScoped};
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
    pub(super) ratio: Arc<Ratio>,
    pub(super) run: Option<Arc<Run>>,
}

impl RetryBudget {
    /// A builder with the default settings.
    pub fn builder() -> RetryBudgetBuilder {
        RetryBudgetBuilder::default()
    }

    /// A handle for one agent run: it shares this budget's ratio balance within the run's
    /// [fair share](super#fair-shares-between-runs), and adds the run's own `limits`
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
    /// with [fair shares](super#fair-shares-between-runs): wrap each run's work, not the stack.
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
    /// account: see [fair shares](super#fair-shares-between-runs)).
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

    /// Asks for a retry after the server said it is overloaded (a `503` or `529` with
    /// `Retry-After`, a gRPC pushback: a server-named delay on a failure that is not a rate
    /// limit): it costs the ratio balance two retries, since in a sustained overload a retry that
    /// succeeds takes the place of another caller's first attempt; the dependency's
    /// [acceptance](super::acceptance) never pays for it. The run budget counts one retry.
    pub(crate) fn try_withdraw_overloaded(&self, delay: Duration) -> Result<(), Refusal> {
        self.withdraw(delay, ratio::OVERLOADED)
    }

    /// The [acceptance rule](super::acceptance)'s multiplier `k` and window in attempts, or
    /// `None` when it is off (`RetryBudgetBuilder::acceptance(0.0, _)`).
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    ///
    /// assert_eq!(RetryBudget::default().acceptance(), Some((2.0, 32)));
    /// ```
    pub fn acceptance(&self) -> Option<(f64, u32)> {
        let (k, window) = self.ratio.acceptance;
        (k > 0.0).then_some((k, window))
    }

    /// A retry the dependency's acceptance pays for (see [`acceptance`](super::acceptance)): it
    /// takes nothing from the ratio balance, but counts against this run's limits.
    pub(crate) fn try_withdraw_accepted(&self, delay: Duration) -> Result<(), Refusal> {
        self.with_run(|run| match run {
            Some(run) => run.try_spend(delay),
            None => Ok(()),
        })
    }

    /// A retry for a dependency that answers almost nothing (see
    /// [`acceptance::DOWN`](super::acceptance::DOWN)): the floor only, within this run's limits.
    pub(crate) fn try_withdraw_floor(&self, delay: Duration) -> Result<(), Refusal> {
        self.with_run(|run| {
            if let Some(run) = run {
                run.try_spend(delay)?;
                if self.ratio.try_floor() {
                    return Ok(());
                }
                run.refund(delay);
                return Err(Refusal::RetryBudget);
            }
            if self.ratio.try_floor() {
                Ok(())
            } else {
                Err(Refusal::RetryBudget)
            }
        })
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

    /// The budget's name ([`RetryBudgetBuilder::name`]), if it was given one.
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    /// assert_eq!(RetryBudget::default().name(), None);
    /// ```
    pub fn name(&self) -> Option<&str> {
        self.ratio.name.as_deref()
    }

    /// Retries the ratio balance allows now (without the floor).
    pub fn balance(&self) -> f64 {
        self.ratio.balance()
    }

    /// Retries that runs owe the shared balance together now, as the lending limit counts them:
    /// what the runs alive drew beyond their own deposits, and what runs that ended in debt left
    /// owing in the current floor window (see [fair shares](super#fair-shares-between-runs)).
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
    /// retries, if it is a run's handle (see [fair shares](super#fair-shares-between-runs)).
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
