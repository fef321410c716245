//! [`ReceiptConfig`]: how long a call may be in flight, how long to wait for a duplicate, how
//! long records are kept and how long a provider remembers a key.

use crate::error::ConfigError;
use std::time::Duration;

/// The times a [`ReceiptGuardLayer`](super::ReceiptGuardLayer) works with, given to it with
/// [`ReceiptGuardLayer::config`](super::ReceiptGuardLayer::config). The defaults: a 30 s lease, a 10 s
/// wait for a parallel duplicate, 7 days' retention, a 24 h provider key window.
///
/// ```
/// use std::time::Duration;
/// use stormguard::class::ToolClass;
/// use stormguard::key::Action;
/// use stormguard::receipt::{InMemoryStore, ReceiptConfig, ReceiptGuardLayer};
///
/// let config = ReceiptConfig::builder()
///     .lease(Duration::from_secs(5))
///     .wait(Duration::from_secs(2))
///     .build()?;
/// let action = |invoice: &u64| Action::new("run-1", "step-2", "send_invoice", invoice);
/// let layer = ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, action).config(config);
/// # let _ = layer;
///
/// // Invalid settings are refused when the config is built.
/// let err = ReceiptConfig::builder().retention(Duration::from_secs(60)).build().unwrap_err();
/// assert_eq!(err.field(), "retention");
/// let err = ReceiptConfig::builder().key_window(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.field(), "key_window");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiptConfig {
    pub(super) lease: Duration,
    pub(super) wait: Duration,
    pub(super) retention: Duration,
    pub(super) key_window: Duration,
}

impl Default for ReceiptConfig {
    fn default() -> Self {
        ReceiptConfig {
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(10),
            retention: Duration::from_secs(7 * 24 * 3600),
            key_window: Duration::from_secs(24 * 3600),
        }
    }
}

impl ReceiptConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> ReceiptConfigBuilder {
        ReceiptConfigBuilder {
            config: ReceiptConfig::default(),
        }
    }

    /// How long a call may be in flight before its intent counts as abandoned.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long to wait for a parallel duplicate's receipt before answering `in_progress`.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// How long records are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// How long the provider of a keyed write remembers an idempotency key.
    pub fn key_window(&self) -> Duration {
        self.key_window
    }
}

/// Builds a [`ReceiptConfig`]; [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{ReceiptConfig, ReceiptConfigBuilder};
///
/// // A provider that remembers idempotency keys for 48 h.
/// let builder: ReceiptConfigBuilder = ReceiptConfig::builder().key_window(Duration::from_secs(48 * 3600));
/// let config = builder.build()?;
/// assert_eq!(config.key_window(), Duration::from_secs(48 * 3600));
/// assert_eq!(config.lease(), Duration::from_secs(30)); // the others keep their defaults
/// let err = ReceiptConfig::builder().wait(Duration::from_secs(7200)).build().unwrap_err();
/// assert_eq!(err.field(), "wait");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct ReceiptConfigBuilder {
    config: ReceiptConfig,
}

impl ReceiptConfigBuilder {
    /// How long a call may be in flight before its intent counts as abandoned (a crash): at
    /// least 1 ms, at most one day (default 30 s). With a
    /// [`read_back`](super::ReceiptGuardLayer::read_back), the lease must also outlast the
    /// provider's in-flight time: a read-back runs only once it has passed.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long to wait for a parallel duplicate's receipt before answering `in_progress`: at
    /// most one hour (default 10 s).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// How long records are kept (at least one hour, at most ten years, default 7 days; longer
    /// than your longest resume). A resume that finds an older intent without a receipt is
    /// refused with `receipt_expired`; a receipt on hand still answers, whatever its age.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// How long the provider of a [`ToolClass::KeyedWrite`](crate::class::ToolClass::KeyedWrite)
    /// remembers an idempotency key (Stripe: 24 h, the default). A pending intent older than
    /// this is resumed as if the write were unkeyed: by a consistent read-back if one is
    /// declared, else `outcome_unknown`; never sent again on the strength of a key the provider
    /// has forgotten. At least one second, at most ten years.
    pub fn key_window(mut self, window: Duration) -> Self {
        self.config.key_window = window;
        self
    }

    /// The config, or the setting that cannot work.
    pub fn build(self) -> Result<ReceiptConfig, ConfigError> {
        let c = self.config;
        if c.lease < Duration::from_millis(1) || c.lease > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new(
                "lease",
                "must be at least 1 ms and at most one day",
            ));
        }
        if c.wait > Duration::from_secs(3600) {
            return Err(ConfigError::new("wait", "must be at most one hour"));
        }
        if c.retention > Duration::from_secs(10 * 365 * 24 * 3600) {
            return Err(ConfigError::new("retention", "must be at most ten years"));
        }
        if c.retention < Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "retention",
                "must be at least one hour (and longer than the longest resume)",
            ));
        }
        if c.key_window < Duration::from_secs(1)
            || c.key_window > Duration::from_secs(10 * 365 * 24 * 3600)
        {
            return Err(ConfigError::new(
                "key_window",
                "must be at least one second and at most ten years",
            ));
        }
        Ok(c)
    }
}
