use super::state::Transition;
use crate::error::ConfigError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which recent outcomes a failure rate is computed over.
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::{BreakerConfig, Window};
///
/// let half_a_second = Window::Time(Duration::from_millis(500));
/// let err = BreakerConfig::builder().failure_rate(0.5, half_a_second, 10).build().unwrap_err();
/// assert_eq!(err.field(), "window");
/// let empty = BreakerConfig::builder().failure_rate(0.5, Window::Count(0), 10).build();
/// assert_eq!(empty.unwrap_err().field(), "window");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The last `n` counted outcomes (a ring: the oldest drops out as a new one arrives).
    Count(u32),
    /// The outcomes of the last `d`, in one-second buckets (1 s to 10 min).
    Time(Duration),
}

/// A callback run on every state transition (after the transition, on the caller's task).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use stormguard::breaker::{OnTransition, State, Transition};
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let callback: OnTransition = Arc::new(move |t: &Transition| log.lock().unwrap().push(t.to));
/// let (from, to) = (State::Closed, State::Open);
/// callback(&Transition { breaker: "billing-api".into(), from, to, reason: String::new() });
/// assert_eq!(*seen.lock().unwrap(), [State::Open]);
/// ```
pub type OnTransition = Arc<dyn Fn(&Transition) + Send + Sync>;

/// A breaker's settings. Start from [`BreakerConfig::builder`]; `build` rejects invalid ones.
///
/// Defaults, chosen for agents (tens of calls per run, not thousands per second):
///
/// | setting | default | resilience4j | Polly v8 | why |
/// |---|---|---|---|---|
/// | consecutive failures | 10 | - | - | trips a dead dependency fast at low rates; at a 10 % failure rate the chance of 10 in a row is 10⁻¹⁰ per call |
/// | failure rate | 50 % | 50 % | 10 % | |
/// | window | last 50 counted calls | last 100 | 30 s | a count window works at any rate; 50 keeps false trips at p = 0.1 below 10⁻¹² per call |
/// | minimum calls | 20 | 100 | 100 | an agent run may make only dozens of calls |
/// | open duration | 5 s, doubling per repeated trip, capped at 30 s | 60 s | 5 s | Envoy-style growth: a dependency that stays down is probed less often |
/// | half-open trials | 1 | 10 | 1 | Fowler's single trial call; its success closes the breaker |
/// | slow call | off | 60 s | - | |
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::BreakerConfig;
///
/// let config = BreakerConfig::default();
/// assert_eq!(config.trials(), 1);
/// assert_eq!(config.open_duration_after(1), Duration::from_secs(5));
/// assert_eq!(config.open_duration_after(2), Duration::from_secs(10));
/// assert_eq!(config.open_duration_after(4), Duration::from_secs(30)); // capped
/// ```
#[derive(Clone)]
pub struct BreakerConfig {
    pub(super) consecutive_failures: Option<u32>,
    pub(super) failure_rate: Option<(f64, Window, u32)>,
    pub(super) slow_call: Option<Duration>,
    pub(super) open_duration: Duration,
    pub(super) max_open_duration: Duration,
    pub(super) trials: u32,
    pub(super) on_transition: Option<OnTransition>,
}

impl BreakerConfig {
    /// A builder with the defaults.
    pub fn builder() -> BreakerConfigBuilder {
        BreakerConfigBuilder {
            config: BreakerConfig::default(),
        }
    }

    /// The open duration after `trips` consecutive trips (1 = the first).
    pub fn open_duration_after(&self, trips: u32) -> Duration {
        let factor = 1u32 << trips.saturating_sub(1).min(20);
        self.open_duration
            .saturating_mul(factor)
            .min(self.max_open_duration)
    }

    /// The number of trial calls admitted while half-open.
    pub fn trials(&self) -> u32 {
        self.trials
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: Some(10),
            failure_rate: Some((0.5, Window::Count(50), 20)),
            slow_call: None,
            open_duration: Duration::from_secs(5),
            max_open_duration: Duration::from_secs(30),
            trials: 1,
            on_transition: None,
        }
    }
}

impl fmt::Debug for BreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerConfig")
            .field("consecutive_failures", &self.consecutive_failures)
            .field("failure_rate", &self.failure_rate)
            .field("slow_call", &self.slow_call)
            .field("open_duration", &self.open_duration)
            .field("max_open_duration", &self.max_open_duration)
            .field("trials", &self.trials)
            .field("on_transition", &self.on_transition.is_some())
            .finish()
    }
}

/// Builds a [`BreakerConfig`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::{BreakerConfig, Window};
///
/// let config = BreakerConfig::builder()
///     .consecutive_failures(5)
///     .failure_rate(0.5, Window::Time(Duration::from_secs(30)), 10)
///     .slow_call(Duration::from_secs(10))
///     .open_duration(Duration::from_secs(2), Duration::from_secs(60))
///     .trials(3)
///     .build()?;
/// assert_eq!(config.open_duration_after(3), Duration::from_secs(8));
///
/// assert!(BreakerConfig::builder().trials(0).build().is_err());
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct BreakerConfigBuilder {
    config: BreakerConfig,
}

impl BreakerConfigBuilder {
    /// Opens after `n` counted failures in a row (at least 1).
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.config.consecutive_failures = Some(n);
        self
    }

    /// Turns the consecutive-failures rule off.
    pub fn no_consecutive_failures(mut self) -> Self {
        self.config.consecutive_failures = None;
        self
    }

    /// Opens when at least `threshold` (0 < threshold <= 1) of the counted outcomes in `window`
    /// failed, once the window holds at least `min_calls` of them.
    pub fn failure_rate(mut self, threshold: f64, window: Window, min_calls: u32) -> Self {
        self.config.failure_rate = Some((threshold, window, min_calls));
        self
    }

    /// Turns the failure-rate rule off.
    pub fn no_failure_rate(mut self) -> Self {
        self.config.failure_rate = None;
        self
    }

    /// Counts a success slower than `threshold` as a failure.
    pub fn slow_call(mut self, threshold: Duration) -> Self {
        self.config.slow_call = Some(threshold);
        self
    }

    /// How long the breaker stays open after its first trip, and the cap it grows to (doubling)
    /// on repeated trips without a recovery in between.
    pub fn open_duration(mut self, first: Duration, max: Duration) -> Self {
        self.config.open_duration = first;
        self.config.max_open_duration = max;
        self
    }

    /// Trial calls admitted while half-open (1 to 1,000); that many successes close the breaker.
    pub fn trials(mut self, n: u32) -> Self {
        self.config.trials = n;
        self
    }

    /// Runs `callback` on every transition.
    pub fn on_transition(mut self, callback: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.config.on_transition = Some(Arc::new(callback));
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<BreakerConfig, ConfigError> {
        let c = self.config;
        if c.consecutive_failures == Some(0) {
            return Err(ConfigError::new(
                "consecutive_failures",
                "must be at least 1",
            ));
        }
        if let Some((threshold, window, min_calls)) = c.failure_rate {
            if !(threshold > 0.0 && threshold <= 1.0) {
                return Err(ConfigError::new(
                    "failure_rate",
                    "the threshold must be above 0 and at most 1",
                ));
            }
            match window {
                Window::Count(n) if !(1..=10_000).contains(&n) => {
                    return Err(ConfigError::new(
                        "window",
                        "a count window holds 1 to 10,000 calls",
                    ))
                }
                Window::Time(d) if d < Duration::from_secs(1) || d > Duration::from_secs(600) => {
                    return Err(ConfigError::new(
                        "window",
                        "a time window spans 1 s to 10 min",
                    ))
                }
                _ => {}
            }
            if min_calls == 0 {
                return Err(ConfigError::new("min_calls", "must be at least 1"));
            }
        }
        if c.consecutive_failures.is_none() && c.failure_rate.is_none() {
            return Err(ConfigError::new(
                "rules",
                "a breaker needs at least one trip rule",
            ));
        }
        if c.slow_call == Some(Duration::ZERO) {
            return Err(ConfigError::new("slow_call", "must be greater than zero"));
        }
        if c.open_duration.is_zero() || c.max_open_duration < c.open_duration {
            return Err(ConfigError::new(
                "open_duration",
                "must be greater than zero and at most the maximum",
            ));
        }
        if c.max_open_duration > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new("open_duration", "the maximum is one day"));
        }
        if !(1..=1000).contains(&c.trials) {
            return Err(ConfigError::new("trials", "must be from 1 to 1,000"));
        }
        Ok(c)
    }
}
