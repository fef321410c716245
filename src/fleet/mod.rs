//! A fleet of workers that behaves as one client: the retry budget, a provider's quota and the
//! breakers shared through Redis (feature `redis`).
//!
//! One process's budget bounds one process. A fleet of agent workers calling one provider
//! multiplies every per-process limit by the number of workers: 100 workers with a floor of 10
//! retries a minute are 1,000 retries a minute into a provider that is down, 100 workers each
//! holding a 500 requests/minute quota send 50,000, and each worker's breaker has to see its own
//! run of failures before it stops. A [`Fleet`] is a handle on one Redis that the workers share;
//! hand it to the three parts:
//!
//! | part | how | one round trip |
//! |---|---|---|
//! | retry budget | [`RetryBudgetBuilder::fleet`](crate::budget::RetryBudgetBuilder::fleet): the ratio balance and the floor live in Redis; each worker holds a small **lease** of retries and batches its deposits, so a decision never waits on Redis | per sync (every `sync_interval`, or when the lease runs low), never per call |
//! | quota | [`FleetQuotaLayer`]: GCRA in Redis on Redis's clock, keyed (tenant, model) and weighted (tokens) like [`KeyedQuotaLayer`](crate::quota::KeyedQuotaLayer) | per call (the provider's quota is the fleet's) |
//! | breaker | [`Fleet::share_breaker`]: failures counted fleet-wide, an open breaker published, half-open trials leased to one worker at a time | per sync, and at once after a failure |
//!
//! # When Redis is down, slow or partitioned
//!
//! Every Redis call is bounded by the fleet's `timeout` (50 ms by default). A call that fails or
//! times out marks the fleet **down**: from then on every decision is local (the budget's own
//! balance and floor, each key's `fallback` rate, each breaker's own rules) and no call waits on
//! Redis. One task per fleet probes Redis with a small write (a `SET` with expiry: a full Redis
//! answers `PING` but refuses every script, so "up" means "takes writes"), first after one
//! `sync_interval`, then backing off to four, with jitter so a fleet does not reconnect in step,
//! and marks it **up** again when the write is taken; the parts then sync their state once
//! (batched deposits, the breaker's count), with no burst of queued calls. An outage is one
//! `WARN` tracing event (a fleet that falls again soon after it came back is still in it: `DEBUG`)
//! and an `INFO` when Redis takes writes again; each change moves the `stormguard_fleet_up` gauge;
//! every local decision taken because the fleet was down counts in
//! `stormguard_fleet_local_decisions_total{part}`.
//!
//! A sync that times out may still run in Redis, late: it is sent again first with the same id,
//! and each script answers a repeated id from memory instead of applying it twice, so a slow
//! Redis never counts a batch of successes or failures twice. A quota reservation is never sent
//! twice: one that timed out and ran late holds room no call uses (the fleet sends less, never
//! more).
//!
//! # Reading the fleet's state
//!
//! [`Fleet::status`] reads what Redis holds for every budget and breaker this worker shares
//! (balance, leases by worker, live workers, floor used, breaker state) in plain structs; see
//! [`status`] for an example.
//!
//! Choose each quota's `fallback` rate as the provider's limit divided by the number of workers:
//! a fleet that falls back as a whole then still sends about the provider's limit.
//!
//! # The Redis client
//!
//! [redis-rs](https://docs.rs/redis) with its tokio `ConnectionManager` (one multiplexed
//! connection per fleet, reconnected on I/O errors) and `Script` (EVALSHA, loaded again after a
//! Redis restart). It is the most used Redis client for Rust, kept by the Redis organisation, and
//! it needs nothing but tokio; `fred` would add a second connection model for no decision this
//! module makes. Every decision that touches shared state is one Lua script: atomic in Redis, one
//! round trip, and timed by Redis's `TIME`, so workers whose clocks differ agree.
//!
//! ```no_run
//! use std::time::Duration;
//! use stormguard::budget::RetryBudget;
//! use stormguard::fleet::Fleet;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fleet = Fleet::builder("redis://127.0.0.1:6379/").prefix("billing-agents").build()?;
//! fleet.wait_up(Duration::from_secs(1)).await; // or start local and join when it answers
//! let budget = RetryBudget::builder().fleet(&fleet, "payments").build()?;
//! # let _ = budget; Ok(()) }
//! ```

mod breaker;
pub(crate) mod budget;
pub mod future;
mod health;
mod link;
mod outbox;
mod quota;
mod scripts;
#[cfg(test)]
mod scripts_props;
pub mod status;
#[cfg(test)]
mod sync_props;

pub use breaker::SharedBreaker;
pub use quota::{FleetQuota, FleetQuotaLayer, FleetQuotaLayerBuilder};
use status::{BreakerStatus, BudgetStatus, FleetStatus, StatusError};

use crate::error::ConfigError;
use link::Link;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A handle on the Redis that a fleet of workers shares; cheap to clone (see the
/// [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use stormguard::fleet::Fleet;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // Nothing listens on port 1: the fleet starts down and every decision is local.
/// let fleet = Fleet::builder("redis://127.0.0.1:1/").timeout(Duration::from_millis(20)).build().unwrap();
/// assert!(!fleet.wait_up(Duration::from_millis(100)).await);
/// assert!(!fleet.is_up());
/// assert_eq!(Fleet::builder("http://nope").build().unwrap_err().field(), "url");
/// # }
/// ```
#[derive(Clone)]
pub struct Fleet {
    pub(crate) link: Arc<Link>,
}

impl Fleet {
    /// A builder for the Redis at `url` (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>) -> FleetBuilder {
        FleetBuilder {
            url: url.into(),
            prefix: "stormguard".into(),
            timeout: Duration::from_millis(50),
            sync_interval: Duration::from_millis(50),
            worker: None,
        }
    }

    /// Whether decisions go through Redis now (`false`: every part decides locally).
    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// Waits until Redis answers, at most `limit`; says whether it did. A worker that starts
    /// while Redis is away need not wait: it decides locally and joins when Redis answers.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        self.link.wait_up(limit).await
    }

    /// How many times the fleet has gone down since it was built (a call that failed or timed
    /// out, or a probe that did).
    pub fn times_down(&self) -> u64 {
        self.link.downs()
    }

    /// This worker's name in the fleet (who holds a breaker's trial, in traces).
    pub fn worker(&self) -> &str {
        self.link.worker()
    }

    /// What Redis holds for every budget and breaker shared through this handle (by name), and
    /// this worker's view of the link: one read-only script per part, each bounded by the
    /// timeout, sent whether the fleet is up or down. See [`status`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::fleet::{status::StatusErrorKind, Fleet};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let fleet = Fleet::builder("redis://127.0.0.1:1/").timeout(Duration::from_millis(20)).build().unwrap();
    /// let _budget = stormguard::budget::RetryBudget::builder().fleet(&fleet, "pay").build().unwrap();
    /// // Nothing listens on port 1: no status, and the error says why.
    /// let err = fleet.status().await.unwrap_err();
    /// assert!(matches!(err.kind(), StatusErrorKind::Redis | StatusErrorKind::Timeout));
    /// # }
    /// ```
    pub async fn status(&self) -> Result<FleetStatus, StatusError> {
        let names = {
            let names = self.link.names.lock().unwrap_or_else(|p| p.into_inner());
            (names.budgets.clone(), names.breakers.clone())
        };
        let mut budgets = Vec::with_capacity(names.0.len());
        for name in &names.0 {
            budgets.push(self.budget_status(name).await?);
        }
        let mut breakers = Vec::with_capacity(names.1.len());
        for name in &names.1 {
            breakers.push(self.breaker_status(name).await?);
        }
        Ok(FleetStatus {
            worker: self.worker().to_string(),
            up: self.is_up(),
            times_down: self.times_down(),
            budgets,
            breakers,
        })
    }

    /// What Redis holds for the budget `name` (whether or not this worker shares it).
    ///
    /// ```no_run
    /// use stormguard::fleet::Fleet;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = Fleet::builder("redis://127.0.0.1:6379/").prefix("billing-agents").build()?;
    /// let payments = fleet.budget_status("payments").await?;
    /// println!("{:.1} retries, {:.1} leased, live: {:?}", payments.balance, payments.leased, payments.live_workers);
    /// # Ok(()) }
    /// ```
    pub async fn budget_status(&self, name: &str) -> Result<BudgetStatus, StatusError> {
        status::budget(&self.link, name, budget::LEASE_TTL).await
    }

    /// What Redis holds for the breaker `name` (whether or not this worker shares it).
    ///
    /// ```no_run
    /// use stormguard::breaker::State;
    /// use stormguard::fleet::Fleet;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = Fleet::builder("redis://127.0.0.1:6379/").prefix("billing-agents").build()?;
    /// let payments = fleet.breaker_status("payments").await?;
    /// if payments.state != State::Closed {
    ///     println!("open {} times; trial in {:?}, held by {:?}", payments.opens, payments.trial_in, payments.trial_holder);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn breaker_status(&self, name: &str) -> Result<BreakerStatus, StatusError> {
        status::breaker(&self.link, name).await
    }

    /// Shares `breaker` with the fleet: its failures are counted fleet-wide, the fleet's open
    /// state opens it, and its half-open trials are leased to one worker of the fleet at a time.
    /// The sharing lasts as long as the breaker; see [`SharedBreaker`].
    ///
    /// ```no_run
    /// use stormguard::breaker::{Breaker, BreakerConfig};
    /// use stormguard::fleet::Fleet;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = Fleet::builder("redis://127.0.0.1:6379/").build()?;
    /// let breaker = Breaker::new("payments", BreakerConfig::default());
    /// let shared = fleet.share_breaker(&breaker)?;
    /// assert_eq!(shared.name(), "payments");
    /// # Ok(()) }
    /// ```
    pub fn share_breaker(
        &self,
        breaker: &crate::breaker::Breaker,
    ) -> Result<SharedBreaker, ConfigError> {
        breaker::share(self, breaker)
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("worker", &self.worker())
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Fleet`]; [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::fleet::Fleet;
///
/// # fn main() {
/// // Outside a tokio runtime there is nothing to run the fleet's tasks on.
/// assert_eq!(Fleet::builder("redis://127.0.0.1:6379/").build().unwrap_err().field(), "runtime");
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(async {
/// let b = || Fleet::builder("redis://127.0.0.1:6379/");
/// assert_eq!(b().timeout(Duration::ZERO).build().unwrap_err().field(), "timeout");
/// assert_eq!(b().sync_interval(Duration::from_secs(3600)).build().unwrap_err().field(), "sync_interval");
/// assert_eq!(b().prefix("").build().unwrap_err().field(), "prefix");
/// assert_eq!(b().worker("").build().unwrap_err().field(), "worker");
/// # });
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct FleetBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    sync_interval: Duration,
    worker: Option<String>,
}

impl FleetBuilder {
    /// The prefix of every Redis key (`stormguard` by default): fleets with different prefixes
    /// share nothing.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest wait for one Redis call (50 ms by default; 1 ms to 10 s). A call that takes
    /// longer is decided locally and marks the fleet down.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How often the budget and the breakers sync with Redis, and how often a fleet that is
    /// down pings it (50 ms by default; 1 ms to 60 s).
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.sync_interval = interval;
        self
    }

    /// This worker's name, 1 to 200 bytes (by default the process id and a random number). Two
    /// live workers of one fleet must not share a name: the name keys a worker's lease and its
    /// hold on a breaker's trial.
    pub fn worker(mut self, name: impl Into<String>) -> Self {
        self.worker = Some(name.into());
        self
    }

    /// Checks the settings and starts the fleet's ping task (a tokio runtime must be running).
    /// Redis need not be up: the fleet starts down and joins when it answers.
    pub fn build(self) -> Result<Fleet, ConfigError> {
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(10) {
            return Err(ConfigError::new("timeout", "must be from 1 ms to 10 s"));
        }
        if self.sync_interval < Duration::from_millis(1)
            || self.sync_interval > Duration::from_secs(60)
        {
            return Err(ConfigError::new(
                "sync_interval",
                "must be from 1 ms to 60 s",
            ));
        }
        if self.prefix.is_empty() || self.prefix.len() > 200 {
            return Err(ConfigError::new("prefix", "must be 1 to 200 bytes"));
        }
        if self
            .worker
            .as_ref()
            .is_some_and(|w| w.is_empty() || w.len() > 200)
        {
            return Err(ConfigError::new("worker", "must be 1 to 200 bytes"));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|_| ConfigError::new("url", "is not a Redis URL (redis://host:port/db)"))?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "runtime",
                "a fleet starts tasks: build it inside a tokio runtime",
            )
        })?;
        let worker = self
            .worker
            .unwrap_or_else(|| format!("{}-{:08x}", std::process::id(), link::random() as u32));
        let link = Link::start(
            client,
            link::Settings {
                prefix: self.prefix,
                timeout: self.timeout,
                sync_interval: self.sync_interval,
                worker,
            },
            &handle,
        )
        .map_err(|_| ConfigError::new("url", "redis-rs refused the connection settings"))?;
        Ok(Fleet { link })
    }
}
