//! The fleet's calls on a budget: `RetryBudgetBuilder::fleet` opens a [`Lease`] as the budget's
//! shared balance (the core's [`OpenBalance`]); `RetryBudget::fleet_*` find it again.

use super::{Lease, LEASE_TTL};
use crate::budget::balance::{Balance, BalanceTerms, OpenBalance};
use crate::budget::{Refusal, RetryBudget, RetryBudgetBuilder, RETRY};
use crate::error::ConfigError;
use crate::fleet::status::{self, BudgetStatus, StatusError};
use crate::fleet::Fleet;
use std::sync::Arc;
use std::time::Duration;

/// A budget `name` on `fleet`, to be opened when the budget is built.
#[derive(Debug)]
struct FleetBalance {
    fleet: Fleet,
    name: String,
}

impl OpenBalance for FleetBalance {
    fn open(&self, terms: BalanceTerms, lease: i64) -> Result<Arc<dyn Balance>, ConfigError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "fleet",
                "a fleet budget starts a task: build it inside a tokio runtime",
            )
        })?;
        Ok(Lease::start(&self.fleet, &self.name, terms, lease, &handle))
    }
}

impl RetryBudgetBuilder {
    /// Shares the ratio balance and the floor with every worker of `fleet` that builds a budget
    /// of the same `name` (feature `redis`): the fleet as a whole earns `retry_ratio` per
    /// success, holds at most `max_balance`, and gets `floor` retries per window, as one process
    /// would. Each worker keeps a lease of up to 2 retries (see [`fleet_lease`](Self::fleet_lease))
    /// and batches its deposits, so no decision waits on Redis; while the fleet is down, the
    /// budget decides from its local balance and floor. Every worker must build the budget with
    /// the same settings: the script applies the caller's. Run budgets and fair shares stay per
    /// process, and [`RetryBudget::balance`] is this worker's local balance (the one it falls
    /// back to), not the fleet's. Leases sit with the workers that took them: keep
    /// `workers × fleet_lease` well below `max_balance`. See [`fleet`](crate::fleet).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::RetryBudget;
    /// use stormguard::fleet::Fleet;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // A fleet whose Redis does not answer: the budget decides locally.
    /// let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap();
    /// let budget = RetryBudget::builder().floor(1, Duration::from_secs(60)).fleet(&fleet, "search").build().unwrap();
    /// assert!(budget.try_withdraw(Duration::ZERO).is_ok()); // the local floor
    /// assert!(budget.try_withdraw(Duration::ZERO).is_err());
    /// # }
    /// ```
    pub fn fleet(self, fleet: &Fleet, name: impl Into<String>) -> Self {
        self.shared(Arc::new(FleetBalance {
            fleet: fleet.clone(),
            name: name.into(),
        }))
    }

    /// The retries a worker keeps leased from the fleet's balance (2 by default; 0 to 100). 0
    /// leases nothing from the balance: a worker then retries only on the floor (one use leased
    /// at a time) or from the balance through [`RetryBudget::fleet_withdraw`]. Set without
    /// [`fleet`](Self::fleet), `build` refuses it (`fleet_lease`). A budget dropped gives its
    /// lease back.
    pub fn fleet_lease(self, retries: u32) -> Self {
        self.lease(retries)
    }
}

impl RetryBudget {
    /// The fleet's lease this budget decides from, if it is shared with a fleet.
    fn lease(&self) -> Option<&Lease> {
        self.shared_balance()?.as_any().downcast_ref::<Lease>()
    }

    /// Asks the fleet's Redis for one retry now, in one round trip (feature `redis`): the exact
    /// fleet-wide decision, without this worker's lease. The run's own limits apply as in
    /// [`try_withdraw`](Self::try_withdraw) (fair shares do not: the fleet's balance is asked
    /// directly). Without a fleet, or while it is down or does not answer within its timeout, it
    /// is [`try_withdraw`](Self::try_withdraw). The retry layers use the lease, never this: it is
    /// for a caller that would rather wait a round trip than hold a lease, and for measuring what
    /// the lease saves (`cargo bench --features redis --bench fleet`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::{Refusal, RetryBudget};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let local = RetryBudget::builder().floor(0, Duration::from_secs(60)).build().unwrap();
    /// assert_eq!(local.fleet_withdraw(Duration::ZERO).await, Err(Refusal::RetryBudget));
    /// # }
    /// ```
    pub async fn fleet_withdraw(&self, delay: Duration) -> Result<(), Refusal> {
        let Some(lease) = self.lease().filter(|l| l.is_up()) else {
            return self.try_withdraw(delay);
        };
        self.withdraw_exact(delay, async { lease.withdraw_now(RETRY).await.ok() })
            .await
    }

    /// Waits until this worker's first sync with the fleet has answered, at most `limit`, and
    /// says whether it did (feature `redis`; `true` at once without a fleet). A fleet budget holds
    /// no lease until then (a round trip after `build`, started at once), so a retry asked for in
    /// that moment is refused; await this after building when the first calls may fail at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::budget::RetryBudget;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert!(RetryBudget::default().fleet_ready(Duration::ZERO).await);
    /// # }
    /// ```
    pub async fn fleet_ready(&self, limit: Duration) -> bool {
        match self.lease() {
            Some(lease) => lease.wait_synced(limit).await,
            None => true,
        }
    }

    /// What the fleet's Redis holds for this budget (feature `redis`): its balance, the leases by
    /// worker, the live workers, the floor used; one read-only script, bounded by the fleet's
    /// timeout. See [`fleet::status`](crate::fleet::status).
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    /// use stormguard::fleet::status::StatusErrorKind;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // A budget of one process has no fleet to read.
    /// let err = RetryBudget::default().fleet_status().await.unwrap_err();
    /// assert_eq!(err.kind(), StatusErrorKind::NotShared);
    /// # }
    /// ```
    pub async fn fleet_status(&self) -> Result<BudgetStatus, StatusError> {
        match self.lease() {
            Some(lease) => status::budget(lease.link(), &lease.name, LEASE_TTL).await,
            None => Err(StatusError::not_shared()),
        }
    }

    /// Retries this worker holds leased from the fleet's balance (feature `redis`; 0 without a
    /// fleet).
    pub fn fleet_lease_held(&self) -> f64 {
        self.lease().map_or(0.0, |l| l.held() as f64 / RETRY as f64)
    }
}
