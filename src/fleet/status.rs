//! What the fleet's Redis holds, read for an operator: each budget's balance, leases and floor,
//! each breaker's state, and this worker's view of the link.
//!
//! Every read is one read-only script (atomic, timed by Redis's `TIME` like the decisions),
//! bounded by the fleet's `timeout`. A read goes to Redis whether the fleet is up or down (the
//! moment an operator wants to know is often an outage), and its outcome never moves the fleet
//! up or down. Nothing here is needed to run a fleet: it replaces reading Redis keys by hand.
//!
//! ```no_run
//! use std::time::Duration;
//! use stormguard::breaker::{Breaker, BreakerConfig};
//! use stormguard::budget::RetryBudget;
//! use stormguard::fleet::Fleet;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fleet = Fleet::builder("redis://127.0.0.1:6379/").prefix("billing-agents").build()?;
//! let budget = RetryBudget::builder().fleet(&fleet, "payments").build()?;
//! let breaker = Breaker::new("payments", BreakerConfig::default());
//! fleet.share_breaker(&breaker)?;
//!
//! // Everything this worker shares, in one call:
//! let status = fleet.status().await?;
//! println!("{} up: {} (down {} times)", status.worker, status.up, status.times_down);
//! for b in &status.budgets {
//!     println!(
//!         "budget {}: {:.1} retries, {:.1} leased by {:?}, floor {}/{} ({:?} left), live: {:?}",
//!         b.name, b.balance, b.leased, b.leases, b.floor_used, b.floor, b.floor_window_left,
//!         b.live_workers,
//!     );
//! }
//! for b in &status.breakers {
//!     println!("breaker {}: {:?}, {} failures in a row, trial held by {:?}", b.name, b.state,
//!         b.failures_in_a_row, b.trial_holder);
//! }
//! // One part, from the budget's handle, or any name from an operator's own process:
//! let payments = budget.fleet_status().await?;
//! assert_eq!(payments.name, "payments");
//! let search = fleet.breaker_status("search").await?; // a breaker no one shares: closed
//! # let _ = search; Ok(()) }
//! ```

use super::link::{Failed, Link};
use super::scripts;
use crate::breaker::State;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One worker's view of its fleet, and what Redis holds for every budget and breaker it shares
/// ([`Fleet::status`](super::Fleet::status)).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct FleetStatus {
    /// This worker's name.
    pub worker: String,
    /// Whether this worker decides through Redis now.
    pub up: bool,
    /// How many times this worker's fleet went down since it was built.
    pub times_down: u64,
    /// Every budget shared through this handle, by name.
    pub budgets: Vec<BudgetStatus>,
    /// Every breaker shared through this handle, by name.
    pub breakers: Vec<BreakerStatus>,
}

/// What Redis holds for one fleet budget, in retries.
///
/// The cap, the floor and its window are the last syncing worker's settings (a budget that no
/// worker has synced yet reads as all zeros).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetStatus {
    /// The budget's name.
    pub name: String,
    /// Retries in the fleet's balance, not leased.
    pub balance: f64,
    /// Retries held in leases (they count against the cap): the sum the script keeps.
    pub leased: f64,
    /// The lease each worker reported at its last sync, by worker.
    pub leases: BTreeMap<String, f64>,
    /// The workers heard from within the lease TTL (10 s), by name.
    pub live_workers: Vec<String>,
    /// Floor uses taken in the current floor window (on Redis's clock).
    pub floor_used: u32,
    /// Floor uses per window.
    pub floor: u32,
    /// Time left in the current floor window.
    pub floor_window_left: Duration,
    /// The cap on the balance and the leases together.
    pub max_balance: f64,
}

/// What Redis holds for one fleet breaker.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerStatus {
    /// The breaker's name.
    pub name: String,
    /// `Closed`; `Open` until its open time has passed; then `HalfOpen` (a trial may go, leased
    /// to one worker at a time) until a trial closes it.
    pub state: State,
    /// The fleet's run of failures in a row (0 while open).
    pub failures_in_a_row: u32,
    /// Time until a trial may go (zero unless `Open`).
    pub trial_in: Duration,
    /// The worker holding the trial lease, if any.
    pub trial_holder: Option<String>,
    /// How many times the fleet's breaker has opened.
    pub opens: u64,
}

/// Why a status read gave no answer.
#[derive(Debug)]
pub struct StatusError {
    kind: StatusErrorKind,
    source: Option<redis::RedisError>,
}

/// What kind of [`StatusError`] this is.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusErrorKind {
    /// The budget is not shared with a fleet.
    NotShared,
    /// Redis did not answer within the fleet's timeout.
    Timeout,
    /// Redis, or the connection to it, answered with an error.
    Redis,
}

impl StatusError {
    /// What kind of error this is.
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    /// use stormguard::fleet::status::StatusErrorKind;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let err = RetryBudget::default().fleet_status().await.unwrap_err();
    /// assert_eq!(err.kind(), StatusErrorKind::NotShared);
    /// # }
    /// ```
    pub fn kind(&self) -> StatusErrorKind {
        self.kind
    }

    pub(crate) fn not_shared() -> Self {
        StatusError {
            kind: StatusErrorKind::NotShared,
            source: None,
        }
    }
}

impl From<Failed> for StatusError {
    fn from(failed: Failed) -> Self {
        match failed {
            Failed::Redis(e) => StatusError {
                kind: StatusErrorKind::Redis,
                source: Some(e),
            },
            Failed::Down | Failed::Timeout => StatusError {
                kind: StatusErrorKind::Timeout,
                source: None,
            },
        }
    }
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            StatusErrorKind::NotShared => f.write_str("the budget is not shared with a fleet"),
            StatusErrorKind::Timeout => f.write_str("redis did not answer the status read in time"),
            StatusErrorKind::Redis => f.write_str("redis failed the status read"),
        }
    }
}

impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What `BUDGET_STATUS` answers.
type BudgetRow = (i64, i64, i64, i64, i64, i64, i64, Vec<String>, Vec<String>);

fn retries(milli: i64) -> f64 {
    milli as f64 / 1000.0
}

/// Reads the budget `name` (its lease TTL is `ttl`).
pub(crate) async fn budget(
    link: &Link,
    name: &str,
    ttl: Duration,
) -> Result<BudgetStatus, StatusError> {
    let mut invocation = scripts::BUDGET_STATUS.key(link.key("budget", name));
    invocation
        .key(link.key("budget-leases", name))
        .key(link.key("budget-seen", name))
        .arg(ttl.as_millis() as u64);
    let (balance, leased, used, floor, _width, left, cap, leases, live): BudgetRow =
        link.read(&invocation).await?;
    let leases = leases
        .chunks_exact(2)
        .map(|kv| (kv[0].clone(), retries(kv[1].parse().unwrap_or(0))))
        .collect();
    Ok(BudgetStatus {
        name: name.to_string(),
        balance: retries(balance),
        leased: retries(leased),
        leases,
        live_workers: live,
        floor_used: u32::try_from(used).unwrap_or(0),
        floor: u32::try_from(floor).unwrap_or(0),
        floor_window_left: Duration::from_millis(left.max(0) as u64),
        max_balance: retries(cap),
    })
}

/// Reads the breaker `name`.
pub(crate) async fn breaker(link: &Link, name: &str) -> Result<BreakerStatus, StatusError> {
    let mut invocation = scripts::BREAKER_STATUS.key(link.key("breaker", name));
    invocation.key(link.key("breaker-trial", name));
    let (open, until_ms, run, generation, holder): (u8, u64, u64, u64, String) =
        link.read(&invocation).await?;
    let state = match (open == 1, until_ms) {
        (false, _) => State::Closed,
        (true, 0) => State::HalfOpen,
        (true, _) => State::Open,
    };
    Ok(BreakerStatus {
        name: name.to_string(),
        state,
        failures_in_a_row: u32::try_from(run).unwrap_or(u32::MAX),
        trial_in: Duration::from_millis(until_ms),
        trial_holder: (!holder.is_empty()).then_some(holder),
        // Each open and each close moves the generation on, from closed: opens are the odd ones.
        opens: generation.div_ceil(2),
    })
}
