//! [`Rate`]: how many calls a quota lets through, and how many at once.

use crate::error::ConfigError;
use std::time::Duration;

/// A rate: `rate` calls per `per`, with bursts of up to `burst` calls. [`build`](RateBuilder::build)
/// accepts `rate` of at least one call, `per` longer than zero and at most a day, at least a
/// nanosecond between calls (`per / rate`: up to 10⁹ calls a second), and a `burst` of 1 to
/// 100,000. The config of a
/// [`QuotaLayer`](super::QuotaLayer) or a [`KeyedQuotaLayer`](super::KeyedQuotaLayer) (as
/// tower's `limit::rate::Rate` is the config of its `RateLimitLayer`).
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Rate;
///
/// let rate = Rate::per_minute(3_000).burst(20).build().unwrap();
/// assert_eq!(rate.interval(), Duration::from_millis(20));
/// assert_eq!(rate.burst(), 20);
/// assert_eq!(Rate::per_second(0).build().unwrap_err().field(), "rate");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    rate: u32,
    per: Duration,
    burst: u32,
}

impl Rate {
    /// A builder for `rate` calls per second, with a burst of 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::quota::Rate;
    ///
    /// assert_eq!(Rate::per_second(10).build()?.interval(), Duration::from_millis(100));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn per_second(rate: u32) -> RateBuilder {
        Rate::per(rate, Duration::from_secs(1))
    }

    /// A builder for `rate` calls per minute (a provider's "requests per minute"), with a burst
    /// of 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::quota::Rate;
    ///
    /// assert_eq!(Rate::per_minute(600).build()?.interval(), Duration::from_millis(100));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn per_minute(rate: u32) -> RateBuilder {
        Rate::per(rate, Duration::from_secs(60))
    }

    /// A builder for `rate` calls per `period` (longer than zero, at most a day), with a burst
    /// of 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::quota::Rate;
    ///
    /// assert_eq!(Rate::per(5, Duration::from_secs(10)).build()?.interval(), Duration::from_secs(2));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn per(rate: u32, period: Duration) -> RateBuilder {
        RateBuilder {
            rate,
            per: period,
            burst: 1,
        }
    }

    /// The steady spacing between calls: `per / rate`.
    pub fn interval(&self) -> Duration {
        self.per / self.rate.max(1)
    }

    /// The most calls that may go at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

/// Builds a [`Rate`] from its rate ([`Rate::per_second`], [`Rate::per_minute`], [`Rate::per`]);
/// [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Rate;
///
/// assert_eq!(Rate::per_second(0).burst(2).build().unwrap_err().field(), "rate");
/// assert_eq!(Rate::per_second(10).burst(0).build().unwrap_err().field(), "burst");
/// assert_eq!(Rate::per(1, Duration::ZERO).build().unwrap_err().field(), "per");
/// assert_eq!(Rate::per_second(u32::MAX).build().unwrap_err().field(), "rate"); // under 1 ns apart
/// assert_eq!(Rate::per_second(10).burst(100_001).build().unwrap_err().field(), "burst");
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct RateBuilder {
    /// Calls per `per`.
    rate: u32,
    per: Duration,
    burst: u32,
}

impl RateBuilder {
    /// Up to `calls` (1 to 100,000) may go at once after a quiet spell (1 by default: perfectly
    /// even spacing).
    pub fn burst(mut self, calls: u32) -> Self {
        self.burst = calls;
        self
    }

    /// The rate, or the setting that cannot work.
    pub fn build(self) -> Result<Rate, ConfigError> {
        let r = Rate {
            rate: self.rate,
            per: self.per,
            burst: self.burst,
        };
        if r.rate == 0 {
            return Err(ConfigError::new("rate", "must be at least one call"));
        }
        if r.per.is_zero() || r.per > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new(
                "per",
                "must be longer than zero and at most a day",
            ));
        }
        if r.interval().is_zero() {
            return Err(ConfigError::new(
                "rate",
                "must leave at least a nanosecond between calls",
            ));
        }
        if r.burst == 0 || r.burst > 100_000 {
            return Err(ConfigError::new("burst", "must be 1 to 100,000 calls"));
        }
        Ok(r)
    }
}
