use super::transition::Transition;
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
    /// The last `n` counted outcomes, 1 to 10,000 (a ring: the oldest drops out as a new one
    /// arrives).
    Count(u32),
    /// The outcomes of the last `d`, in one-second buckets (1 s to 10 min).
    Time(Duration),
}

/// The failure-rate trip rule: open when at least `threshold` of the counted outcomes in
/// `window` failed, once it holds at least `min_calls` of them.
///
/// ```
/// use stormguard::breaker::{BreakerConfig, FailureRate, Window};
///
/// let rule = BreakerConfig::default().failure_rate().unwrap();
/// assert_eq!(rule, FailureRate { threshold: 0.9, window: Window::Count(50), min_calls: 20 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailureRate {
    /// The share of failures that trips it (0 < threshold <= 1).
    pub threshold: f64,
    /// Which outcomes count.
    pub window: Window,
    /// How many outcomes the window must hold before the rule applies.
    pub min_calls: u32,
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
/// | consecutive failures | 20 | - | - | trips a dead dependency after 20 calls at any rate; at a 50 % failure rate the chance of 20 in a row is 10⁻⁶ per call |
/// | failure rate | 90 % | 50 % | 10 % | trips only a dependency that accepts almost nothing: one that still answers half its calls is kept, because shedding its successes makes a partial failure an outage (measured: 0.2 % success with a 50 % rule, 55 % without a breaker) |
/// | window | last 50 counted calls | last 100 | 30 s | a count window works at any rate |
/// | minimum calls | 20 | 100 | 100 | an agent run may make only dozens of calls |
/// | open time | at least 250 ms, then a probe after 25 turned-away calls, or once open a fifth of the outage so far (at most 30 s) | 60 s | 5 s | the probe rate follows the traffic (every 0.25 s at 100 calls/s) and, at low traffic, the outage's length (a dependency down 20 s is probed within 4 s at 1 call/s); nothing doubles |
/// | half-open trials | 1 | 10 | 1 | Fowler's single trial call; its success closes the breaker |
/// | trial timeout | 10 s | - | - | a trial unanswered this long counts as failed, so a hung call cannot keep the breaker half-open |
/// | slow call | off | 60 s | - | |
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::BreakerConfig;
///
/// let config = BreakerConfig::default();
/// assert_eq!(config.trials(), 1);
/// assert_eq!(config.open_min(), Duration::from_millis(250));
/// assert_eq!(config.open_max(), Duration::from_secs(30));
/// assert_eq!(config.probe_after(), 25);
/// ```
#[derive(Clone)]
pub struct BreakerConfig {
    pub(super) consecutive_failures: Option<u32>,
    pub(super) failure_rate: Option<FailureRate>,
    pub(super) slow_call: Option<Duration>,
    pub(super) open_duration: Duration,
    pub(super) max_open_duration: Duration,
    pub(super) probe_after: u32,
    pub(super) open_share: f64,
    pub(super) trial_timeout: Duration,
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

    /// The failure-rate rule, if on.
    pub fn failure_rate(&self) -> Option<FailureRate> {
        self.failure_rate
    }

    /// The shortest time the breaker stays open after a trip.
    pub fn open_min(&self) -> Duration {
        self.open_duration
    }

    /// The longest time it stays open: a probe goes then, whatever the traffic.
    pub fn open_max(&self) -> Duration {
        self.max_open_duration
    }

    /// How many calls it turns away, after the shortest open time, before a probe goes.
    pub fn probe_after(&self) -> u32 {
        self.probe_after
    }

    /// The share of the outage so far after which an open breaker probes whatever the traffic
    /// (see [`BreakerConfigBuilder::open_share`]).
    pub fn open_share(&self) -> f64 {
        self.open_share
    }

    /// The number of trial calls admitted while half-open.
    pub fn trials(&self) -> u32 {
        self.trials
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: Some(20),
            failure_rate: Some(FailureRate {
                threshold: 0.9,
                window: Window::Count(50),
                min_calls: 20,
            }),
            slow_call: None,
            open_duration: Duration::from_millis(250),
            max_open_duration: Duration::from_secs(30),
            probe_after: 25,
            open_share: 0.2,
            trial_timeout: Duration::from_secs(10),
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
            .field("probe_after", &self.probe_after)
            .field("open_share", &self.open_share)
            .field("trial_timeout", &self.trial_timeout)
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
///     .probe_after(10)
///     .trials(3)
///     .build()?;
/// assert_eq!(config.open_min(), Duration::from_secs(2));
///
/// assert!(BreakerConfig::builder().trials(0).build().is_err());
/// // A rule that can never fire is refused: 20 calls can never fill a ring of 10.
/// let never = BreakerConfig::builder().failure_rate(0.5, Window::Count(10), 20).build();
/// assert_eq!(never.unwrap_err().field(), "min_calls");
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
        self.config.failure_rate = Some(FailureRate {
            threshold,
            window,
            min_calls,
        });
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

    /// The shortest and the longest time the breaker stays open after a trip: a probe goes
    /// once `min` has passed and [`probe_after`](Self::probe_after) calls were turned away, or
    /// once `max` has passed whatever the traffic.
    pub fn open_duration(mut self, min: Duration, max: Duration) -> Self {
        self.config.open_duration = min;
        self.config.max_open_duration = max;
        self
    }

    /// How many calls an open breaker turns away, counted from the trip (those turned away
    /// before the shortest open time included), before it lets a probe through once the
    /// shortest open time has passed (0 to 1,000,000; 0: a probe goes as soon as the shortest
    /// open time has passed, the classic time-only breaker). Counting calls rather than seconds makes the probe rate
    /// follow the traffic: frequent at a high rate, so a healed dependency is back at once;
    /// rare at a low one, so an outage still sheds nearly every call.
    pub fn probe_after(mut self, calls: u32) -> Self {
        self.config.probe_after = calls;
        self
    }

    /// At low traffic, how long an open breaker waits for its probe: at most this share of the
    /// outage so far (from the trip that ended the last closed spell), within the shortest and
    /// the longest open time. 0.2 by default: a dependency down for 10 s is probed at least
    /// every 2 s, one down for a minute every 12 s, so a healed dependency waits at most a fifth
    /// of its outage (and at most the longest open time, 30 s by default) for the first call to
    /// reach it. Whatever the traffic, an outage of length `T` costs about `ln(T) / ln(1.2)`
    /// probes while a fifth of it is under the longest open time, then one per longest open
    /// time: about 25 for three minutes, about 150 for an hour. From 0 to 1; 0 turns it off (the
    /// longest open time only, as a classic breaker). Under traffic the
    /// [`probe_after`](Self::probe_after) rule probes sooner.
    ///
    /// ```
    /// use stormguard::breaker::BreakerConfig;
    ///
    /// assert_eq!(BreakerConfig::default().open_share(), 0.2);
    /// assert!(BreakerConfig::builder().open_share(1.5).build().is_err());
    /// ```
    pub fn open_share(mut self, share: f64) -> Self {
        self.config.open_share = share;
        self
    }

    /// How long a half-open trial may go unanswered (1 ms to one hour, default 10 s) before it
    /// counts as failed: the breaker opens again and a later probe tries, so one hung call
    /// cannot keep a healed dependency shut. A `Timeout` below the breaker bounds the call
    /// itself; this bounds the breaker's wait for it whatever is below.
    pub fn trial_timeout(mut self, timeout: Duration) -> Self {
        self.config.trial_timeout = timeout;
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
        if let Some(FailureRate {
            threshold,
            window,
            min_calls,
        }) = c.failure_rate
        {
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
            if let Window::Count(n) = window {
                if min_calls > n {
                    return Err(ConfigError::new(
                        "min_calls",
                        "exceeds what the count window holds: the rule could never fire",
                    ));
                }
            }
            if threshold * f64::from(min_calls) <= 1.0 {
                return Err(ConfigError::new(
                    "failure_rate",
                    "threshold x min_calls is below one failure: the rule would trip on any single failure (say consecutive_failures(1) if that is meant)",
                ));
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
        if c.trial_timeout < Duration::from_millis(1) || c.trial_timeout > Duration::from_secs(3600)
        {
            return Err(ConfigError::new(
                "trial_timeout",
                "must be between 1 ms and one hour",
            ));
        }
        if !(0.0..=1.0).contains(&c.open_share) {
            return Err(ConfigError::new("open_share", "must be from 0 to 1"));
        }
        if c.probe_after > 1_000_000 {
            return Err(ConfigError::new("probe_after", "must be at most 1,000,000"));
        }
        if !(1..=1000).contains(&c.trials) {
            return Err(ConfigError::new("trials", "must be from 1 to 1,000"));
        }
        Ok(c)
    }
}
