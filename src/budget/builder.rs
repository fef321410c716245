//! [`RetryBudgetBuilder`]: the budget's settings, checked when it is built (and the balance it
//! shares with other processes, if any: see [`balance`](super::balance)).

use super::balance::OpenBalance;
use super::ratio::{Ratio, Terms, RETRY};
use super::run::{Run, RunLimits};
use super::{random_seed, RetryBudget};
use crate::error::ConfigError;
use std::sync::Arc;
use std::time::Duration;

/// Builds a [`RetryBudget`]; [`build`](Self::build) rejects invalid settings.
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::RetryBudget;
///
/// let budget = RetryBudget::builder()
///     .retry_ratio(0.1)
///     .max_balance(50)
///     .floor(5, Duration::from_secs(60))
///     .seed(7)
///     .build()?;
/// assert!(RetryBudget::builder().retry_ratio(-1.0).build().is_err());
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RetryBudgetBuilder {
    retry_ratio: f64,
    max_balance: u32,
    run_share: u32,
    lending_limit: Option<u32>,
    floor: u32,
    floor_window: Duration,
    seed: Option<u64>,
    run: Option<RunLimits>,
    /// Opens the balance the budget shares with other processes, if it is shared.
    shared: Option<Arc<dyn OpenBalance>>,
    /// The retries a process keeps leased from the shared balance.
    lease: Option<u32>,
    /// The acceptance rule's multiplier (0: off) and window (attempts).
    acceptance: (f64, u32),
    /// What the budget is called in its refusals' hints (its dependency's name).
    name: Option<Arc<str>>,
}

impl Default for RetryBudgetBuilder {
    fn default() -> Self {
        RetryBudgetBuilder {
            retry_ratio: 0.2,
            max_balance: 100,
            run_share: 10,
            lending_limit: None,
            floor: 10,
            floor_window: Duration::from_secs(60),
            seed: None,
            run: None,
            shared: None,
            lease: None,
            acceptance: (2.0, 32),
            name: None,
        }
    }
}

impl RetryBudgetBuilder {
    /// Retries earned per successful logical operation: 0 to 10 (0 leaves only the floor).
    pub fn retry_ratio(mut self, ratio: f64) -> Self {
        self.retry_ratio = ratio;
        self
    }

    /// The most retries the balance can hold: at least 1.
    pub fn max_balance(mut self, retries: u32) -> Self {
        self.max_balance = retries;
        self
    }

    /// How many retries one run ([`RetryBudget::for_run`]) may draw on the shared balance
    /// beyond what its own successes deposited: 10 by default; 0 lets each run spend only its own
    /// deposits (and the floor). What all runs together may owe is the
    /// [`lending_limit`](Self::lending_limit). See [fair shares](super#fair-shares-between-runs).
    pub fn run_share(mut self, retries: u32) -> Self {
        self.run_share = retries;
        self
    }

    /// How many retries **all runs together** may owe the shared balance beyond what their own
    /// successes deposited: by default one [`run_share`](Self::run_share), whatever the number
    /// of runs; 0 lends nothing. A run's debt is repaid as it deposits; a run that ends in debt
    /// (its last handle dropped) leaves the debt counted until the floor window turns, so runs
    /// made and dropped in a loop borrow at most this much per window. See
    /// [fair shares](super#fair-shares-between-runs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::{Refusal, RetryBudget, RunLimits};
    ///
    /// let shared = RetryBudget::builder().floor(0, Duration::from_secs(60)).lending_limit(3).build()?;
    /// for _ in 0..500 {
    ///     shared.deposit(); // a full balance, deposited by no run
    /// }
    /// let runs: Vec<_> = (0..5).map(|_| shared.for_run(RunLimits::default())).collect();
    /// let lent = runs.iter().filter(|run| run.try_withdraw(Duration::ZERO).is_ok()).count();
    /// assert_eq!(lent, 3); // five runs with nothing deposited: three retries on loan in all
    /// assert_eq!(runs[4].try_withdraw(Duration::ZERO), Err(Refusal::RetryBudget));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn lending_limit(mut self, retries: u32) -> Self {
        self.lending_limit = Some(retries);
        self
    }

    /// Retries allowed per `window` whatever the balance (cold start, low traffic). The window is
    /// 1 s to 1 h; `retries` may be 0. Windows are fixed, not sliding: across a window's turn up
    /// to `2 × retries` can go back to back. A local budget's windows start when it is built; a
    /// fleet budget's (feature `redis`) are aligned on Redis's clock (`TIME`), the same for every
    /// worker.
    pub fn floor(mut self, retries: u32, window: Duration) -> Self {
        self.floor = retries;
        self.floor_window = window;
        self
    }

    /// The acceptance rule (see [`acceptance`](super::acceptance)): a retry after an ordinary
    /// failure also goes, free of the balance, with probability `min(1, k·a)`, where `a` is the
    /// share of the last ~`window` attempts the dependency answered. `k` is 0 (off: the balance
    /// and the floor only) or from 1 to 10 (2 by default, Google SRE's `K`);
    /// `window` is 1 to 100,000 attempts (32 by default).
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    ///
    /// let ratio_only = RetryBudget::builder().acceptance(0.0, 32).build()?;
    /// assert_eq!(ratio_only.acceptance(), None);
    /// assert_eq!(RetryBudget::default().acceptance(), Some((2.0, 32)));
    /// assert!(RetryBudget::builder().acceptance(0.5, 32).build().is_err());
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn acceptance(mut self, k: f64, window: u32) -> Self {
        self.acceptance = (k, window);
        self
    }

    /// Seeds the backoff RNGs, for reproducible tests and simulations. By default each budget
    /// takes a random seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Names the budget after what draws on it (a dependency, a tool): a refusal's hint then
    /// says whose budget is spent, so the model and the operator blame the dependency that
    /// drained it, not the one whose call was refused. A toolbox names each budget it makes.
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    /// let budget = RetryBudget::builder().name("orders-api").build()?;
    /// assert_eq!(budget.name(), Some("orders-api"));
    /// assert_eq!(RetryBudget::default().name(), None);
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(Arc::from(name.into()));
        self
    }

    /// Gives the budget a run budget of its own.
    pub fn run_limits(mut self, limits: RunLimits) -> Self {
        self.run = Some(limits);
        self
    }

    /// Shares the ratio balance and the floor through `shared` (the fleet's
    /// `RetryBudgetBuilder::fleet`, feature `redis`).
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn shared(mut self, shared: Arc<dyn OpenBalance>) -> Self {
        self.shared = Some(shared);
        self
    }

    /// The retries a process keeps leased from the shared balance (the fleet's
    /// `RetryBudgetBuilder::fleet_lease`, feature `redis`).
    #[allow(dead_code)] // reached from the fleet (feature `redis`) only
    pub(crate) fn lease(mut self, retries: u32) -> Self {
        self.lease = Some(retries);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<RetryBudget, ConfigError> {
        if !(0.0..=10.0).contains(&self.retry_ratio) {
            return Err(ConfigError::new(
                "retry_ratio",
                "must be a number from 0 to 10",
            ));
        }
        if self.max_balance == 0 {
            return Err(ConfigError::new("max_balance", "must be at least 1"));
        }
        if self.floor_window < Duration::from_secs(1)
            || self.floor_window > Duration::from_secs(3600)
        {
            return Err(ConfigError::new("floor_window", "must be from 1 s to 1 h"));
        }
        let (k, window) = self.acceptance;
        if !(k == 0.0 || (1.0..=10.0).contains(&k)) {
            return Err(ConfigError::new(
                "acceptance",
                "the multiplier must be 0 (off) or from 1 to 10",
            ));
        }
        if !(1..=100_000).contains(&window) {
            return Err(ConfigError::new(
                "acceptance",
                "the window must be from 1 to 100,000 attempts",
            ));
        }
        let seed = self.seed.unwrap_or_else(random_seed);
        let terms = Terms {
            acceptance: (k, window),
            ratio: self.retry_ratio,
            max_balance: self.max_balance,
            run_share: self.run_share,
            lending_limit: self.lending_limit.unwrap_or(self.run_share),
            floor: self.floor,
            floor_window: self.floor_window,
        };
        let mut ratio = Ratio::new(&terms, seed);
        ratio.name = self.name;
        match (self.shared, self.lease) {
            (Some(shared), lease) => {
                let lease = lease.unwrap_or(2);
                if lease > 100 {
                    return Err(ConfigError::new("fleet_lease", "must be 0 to 100 retries"));
                }
                ratio.shared = Some(shared.open(ratio.balance_terms(), i64::from(lease) * RETRY)?);
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "fleet_lease",
                    "needs a fleet: call `fleet` too",
                ));
            }
            (None, None) => {}
        }
        let ratio = Arc::new(ratio);
        Ok(RetryBudget {
            run: self
                .run
                .map(|limits| Arc::new(Run::new(limits, ratio.clone()))),
            ratio,
        })
    }
}
