//! [`Rate`]: how many calls a quota lets through, and how many at once.

use crate::error::ConfigError;
use std::time::Duration;

/// A rate: `rate` calls per `per`, with bursts of up to `burst` calls. The config of a
/// [`QuotaLayer`](super::QuotaLayer) or a [`KeyedQuotaLayer`](super::KeyedQuotaLayer) (as
/// tower's `limit::rate::Rate` is the config of its `RateLimitLayer`).
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Rate;
///
/// let rate = Rate::builder().per_minute(3_000).burst(20).build().unwrap();
/// assert_eq!(rate.interval(), Duration::from_millis(20));
/// assert_eq!(rate.burst(), 20);
/// assert_eq!(Rate::builder().per_second(0).build().unwrap_err().field(), "rate");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    rate: u32,
    per: Duration,
    burst: u32,
}

impl Rate {
    /// A builder with no rate chosen yet (choose one with [`RateBuilder::per_second`],
    /// [`RateBuilder::per_minute`] or [`RateBuilder::per`]) and a burst of 1.
    pub fn builder() -> RateBuilder {
        RateBuilder {
            rate: None,
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

/// Builds a [`Rate`]; [`build`](Self::build) rejects what cannot work, and a rate never chosen.
///
/// ```
/// use std::time::Duration;
/// use stormguard::quota::Rate;
///
/// assert_eq!(Rate::builder().burst(2).build().unwrap_err().field(), "rate");
/// assert_eq!(Rate::builder().per_second(10).burst(0).build().unwrap_err().field(), "burst");
/// assert_eq!(Rate::builder().per(1, Duration::ZERO).build().unwrap_err().field(), "per");
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct RateBuilder {
    /// Calls, per period.
    rate: Option<(u32, Duration)>,
    burst: u32,
}

impl RateBuilder {
    /// `rate` calls per second.
    pub fn per_second(self, rate: u32) -> Self {
        self.per(rate, Duration::from_secs(1))
    }

    /// `rate` calls per minute (a provider's "requests per minute").
    pub fn per_minute(self, rate: u32) -> Self {
        self.per(rate, Duration::from_secs(60))
    }

    /// `rate` calls per `period` (longer than zero, at most a day).
    pub fn per(mut self, rate: u32, period: Duration) -> Self {
        self.rate = Some((rate, period));
        self
    }

    /// Up to `calls` may go at once after a quiet spell (1 by default: perfectly even spacing).
    pub fn burst(mut self, calls: u32) -> Self {
        self.burst = calls;
        self
    }

    /// The rate, or the setting that cannot work.
    pub fn build(self) -> Result<Rate, ConfigError> {
        let Some((rate, per)) = self.rate else {
            return Err(ConfigError::new(
                "rate",
                "choose one: per_second, per_minute or per",
            ));
        };
        let r = Rate {
            rate,
            per,
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
