//! [`PostgresOptions`]: how a [`PostgresStore`](super::PostgresStore) connects, and its builder.

use crate::error::ConfigError;
use crate::receipt::clock::{Clock, StoreClock};
use crate::receipt::store::Durability;
use std::fmt;
use std::time::Duration;

/// How a [`PostgresStore`](super::PostgresStore) connects: built with [`PostgresOptions::builder`], then
/// [`connect`](Self::connect)ed.
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::PostgresOptions;
///
/// let url = "host=127.0.0.1 user=postgres dbname=test";
/// let options = PostgresOptions::builder(url).connections(16).build()?;
/// # let _ = options;
/// let err = PostgresOptions::builder(url).connections(0).build().unwrap_err();
/// assert_eq!(err.field(), "connections");
/// let err = PostgresOptions::builder(url).lock_timeout(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.field(), "lock_timeout");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct PostgresOptions {
    pub(super) config: String,
    pub(super) durability: Durability,
    pub(super) connections: usize,
    pub(super) statement_timeout: Duration,
    pub(super) lock_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) clock: Option<StoreClock>,
}

impl fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection string may hold a password: never printed.
        f.debug_struct("PostgresOptions")
            .field("durability", &self.durability)
            .field("connections", &self.connections)
            .field("statement_timeout", &self.statement_timeout)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

fn bounded(field: &'static str, d: Duration) -> Result<(), ConfigError> {
    if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
        return Err(ConfigError::new(field, "must be between 1 ms and one hour"));
    }
    Ok(())
}

/// Builds [`PostgresOptions`]; [`build`](Self::build) rejects what cannot work. Building
/// checks the settings only: nothing connects until [`PostgresOptions::connect`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{Durability, PostgresOptions, PostgresOptionsBuilder};
///
/// let url = "host=127.0.0.1 user=postgres password=hunter2 dbname=test";
/// let builder: PostgresOptionsBuilder = PostgresOptions::builder(url).durability(Durability::Process);
/// let options = builder.connections(4).statement_timeout(Duration::from_secs(2)).build()?;
/// let shown = format!("{options:?}");
/// assert!(shown.contains("Process") && shown.contains("connections: 4"));
/// assert!(!shown.contains("hunter2")); // the connection string is never printed
/// let err = PostgresOptions::builder(url).connections(65).build().unwrap_err();
/// assert_eq!(err.field(), "connections");
/// let err = PostgresOptions::builder(url).statement_timeout(Duration::from_secs(7200)).build().unwrap_err();
/// assert_eq!(err.field(), "statement_timeout");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PostgresOptionsBuilder {
    pub(super) options: PostgresOptions,
}

impl PostgresOptionsBuilder {
    /// What a commit survives (default [`Durability::PowerLoss`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.options.durability = durability;
        self
    }

    /// How many connections the store keeps (1 to 64, default 8).
    pub fn connections(mut self, n: usize) -> Self {
        self.options.connections = n;
        self
    }

    /// The longest one statement may run (1 ms to one hour, default 10 s).
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.options.statement_timeout = d;
        self
    }

    /// The longest one statement may wait for a lock (1 ms to one hour, default 5 s).
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.options.lock_timeout = d;
        self
    }

    /// The longest opening a connection may take (1 ms to one hour, default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.options.connect_timeout = d;
        self
    }

    /// Judge leases and ages by `clock` instead of the server's (tests only: a clock per
    /// process is what the server clock exists to avoid).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.options.clock = Some(StoreClock::of(clock));
        self
    }

    /// The options, or the setting that cannot work.
    pub fn build(self) -> Result<PostgresOptions, ConfigError> {
        let o = self.options;
        if !(1..=64).contains(&o.connections) {
            return Err(ConfigError::new("connections", "must be between 1 and 64"));
        }
        bounded("statement_timeout", o.statement_timeout)?;
        bounded("lock_timeout", o.lock_timeout)?;
        bounded("connect_timeout", o.connect_timeout)?;
        Ok(o)
    }
}

impl PostgresOptions {
    /// A builder for connecting with `config` (a libpq-style connection string; without TLS:
    /// for a database on this host or a private network) with the defaults: 8 connections,
    /// `PowerLoss`, a 10 s statement timeout, a 5 s lock timeout, a 5 s connect timeout.
    pub fn builder(config: &str) -> PostgresOptionsBuilder {
        PostgresOptionsBuilder {
            options: PostgresOptions {
                config: config.to_string(),
                durability: Durability::PowerLoss,
                connections: 8,
                statement_timeout: Duration::from_secs(10),
                lock_timeout: Duration::from_secs(5),
                connect_timeout: Duration::from_secs(5),
                clock: None,
            },
        }
    }
}
