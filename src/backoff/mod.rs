//! Backoff between attempts: exponential, linear or constant, with full, equal or decorrelated
//! jitter (the formulas of Marc Brooker's "Exponential Backoff And Jitter", AWS Architecture Blog).
//!
//! | jitter | delay before retry `n` (from 0), with `ceil = min(cap, base · 2ⁿ)` |
//! |---|---|
//! | [`Jitter::None`] | `ceil` |
//! | [`Jitter::Full`] | `uniform(0, ceil)` |
//! | [`Jitter::Equal`] | `ceil/2 + uniform(0, ceil/2)` |
//! | [`Jitter::Decorrelated`] | `min(cap, uniform(base, 3 · previous))`, `previous` starting at `base` |
//!
//! Linear backoff uses `ceil = min(cap, base · (n + 1))`, constant `ceil = base`.
//!
//! Each logical operation gets its own [`BackoffState`] with its own seed, so concurrent retries
//! spread out. (tower's `ExponentialBackoffMaker` clones one RNG state into every backoff it
//! makes, so backoffs from one maker replay the same "random" delays in lockstep.) A server hint
//! (`Retry-After`) replaces the computed delay; see [`Retry`](crate::retry::Retry).
//!
//! ```
//! use std::time::Duration;
//! use stormguard::backoff::{Backoff, Jitter};
//!
//! let backoff = Backoff::exponential(Duration::from_millis(100))
//!     .cap(Duration::from_secs(2))
//!     .jitter(Jitter::Full)
//!     .build()?;
//! let mut state = backoff.state(42); // a fixed seed, as a test would use
//! for _ in 0..10 {
//!     assert!(state.next_delay() <= Duration::from_secs(2));
//! }
//! # Ok::<(), stormguard::error::ConfigError>(())
//! ```

pub(crate) mod rng;

pub(crate) use rng::Rng;

use crate::error::ConfigError;
use std::time::Duration;

/// The longest cap accepted (one hour).
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::{Backoff, MAX_CAP};
///
/// assert_eq!(MAX_CAP, Duration::from_secs(3600));
/// let err = Backoff::exponential(Duration::from_secs(1))
///     .cap(MAX_CAP + Duration::from_secs(1))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "cap");
/// ```
pub const MAX_CAP: Duration = Duration::from_secs(3600);

/// How the delay grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Growth {
    Exponential,
    Linear,
    Constant,
}

/// How the delay is randomised.
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::{Backoff, Jitter};
///
/// let none = Backoff::exponential(Duration::from_millis(100)).jitter(Jitter::None).build()?;
/// let mut state = none.state(7);
/// assert_eq!(state.next_delay(), Duration::from_millis(100));
/// assert_eq!(state.next_delay(), Duration::from_millis(200));
/// let linear = Backoff::linear(Duration::from_millis(100)).jitter(Jitter::Decorrelated);
/// assert_eq!(linear.build().unwrap_err().field(), "jitter");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// No randomness: clients that failed together retry together.
    None,
    /// `uniform(0, ceil)`: the least total work (AWS's recommendation, gRPC A6's formula).
    Full,
    /// `ceil/2 + uniform(0, ceil/2)`: never shorter than half the ceiling.
    Equal,
    /// `min(cap, uniform(base, 3 · previous))`: exponential backoff only.
    Decorrelated,
}

/// A validated backoff configuration. Build one from its curve:
/// [`Backoff::exponential`], [`Backoff::linear`] or [`Backoff::constant`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::{Backoff, Jitter};
///
/// let backoff = Backoff::exponential(Duration::from_millis(100)).build()?;
/// assert_eq!(backoff.cap(), Duration::from_secs(10));
/// assert_eq!(backoff.jitter(), Jitter::Full);
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
/// assert_eq!(backoff.ceiling(20), Duration::from_secs(10)); // capped
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    growth: Growth,
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

impl Backoff {
    /// A builder for exponential growth from `base`, doubling per retry. Defaults: cap 10 s,
    /// full jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::backoff::Backoff;
    ///
    /// let backoff = Backoff::exponential(Duration::from_millis(100)).build()?;
    /// assert_eq!(backoff.ceiling(2), Duration::from_millis(400));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn exponential(base: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Growth::Exponential, base)
    }

    /// A builder for linear growth: `base · (n + 1)`. Defaults: cap 10 s, full jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::backoff::Backoff;
    ///
    /// let backoff = Backoff::linear(Duration::from_millis(100)).build()?;
    /// assert_eq!(backoff.ceiling(2), Duration::from_millis(300));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn linear(base: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Growth::Linear, base)
    }

    /// A builder for the same delay every time (zero allowed). Defaults: cap `delay`, no jitter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::backoff::{Backoff, Jitter};
    ///
    /// let backoff = Backoff::constant(Duration::from_millis(100)).build()?;
    /// assert_eq!(backoff.ceiling(5), Duration::from_millis(100));
    /// assert_eq!(backoff.jitter(), Jitter::None);
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn constant(delay: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Growth::Constant, delay)
    }

    /// Exponential, full jitter; `base <= cap` and `base > 0` are the caller's promise.
    pub(crate) const fn full_jitter(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            growth: Growth::Exponential,
            base,
            cap,
            jitter: Jitter::Full,
        }
    }

    /// The first delay's scale.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The longest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The jitter.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// A fresh state for one operation, seeded with `seed`.
    pub fn state(&self, seed: u64) -> BackoffState {
        BackoffState {
            backoff: *self,
            retries: 0,
            previous: self.base,
            rng: Rng::new(seed),
        }
    }

    /// The ceiling (delay before jitter) for retry `n`, counted from 0.
    pub fn ceiling(&self, n: u32) -> Duration {
        match self.growth {
            Growth::Constant => self.base,
            Growth::Linear => self.base.saturating_mul(n.saturating_add(1)).min(self.cap),
            Growth::Exponential => {
                let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
                self.base.saturating_mul(factor).min(self.cap)
            }
        }
    }
}

/// Builds a [`Backoff`] from the curve it was made with ([`Backoff::exponential`],
/// [`Backoff::linear`], [`Backoff::constant`]); [`build`](Self::build) rejects invalid settings.
/// The defaults depend on the curve: exponential and linear cap at 10 s with full
/// jitter; constant caps at its delay with no jitter.
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::Backoff;
///
/// let err = Backoff::linear(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.field(), "base");
/// // A constant backoff may be zero; it has no jitter.
/// let zero = Backoff::constant(Duration::ZERO).build()?;
/// assert_eq!(zero.state(1).next_delay(), Duration::ZERO);
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct BackoffBuilder {
    growth: Growth,
    /// The base delay of the growth.
    base: Duration,
    cap: Option<Duration>,
    jitter: Option<Jitter>,
}

impl BackoffBuilder {
    fn new(growth: Growth, base: Duration) -> Self {
        BackoffBuilder {
            growth,
            base,
            cap: None,
            jitter: None,
        }
    }

    /// The longest delay (at most [`MAX_CAP`]).
    pub fn cap(mut self, cap: Duration) -> Self {
        self.cap = Some(cap);
        self
    }

    /// The jitter.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = Some(jitter);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<Backoff, ConfigError> {
        let (growth, base) = (self.growth, self.base);
        let (cap, jitter) = match growth {
            Growth::Constant => (
                self.cap.unwrap_or(base),
                self.jitter.unwrap_or(Jitter::None),
            ),
            Growth::Exponential | Growth::Linear => (
                self.cap.unwrap_or(Duration::from_secs(10)),
                self.jitter.unwrap_or(Jitter::Full),
            ),
        };
        if growth != Growth::Constant && base.is_zero() {
            return Err(ConfigError::new(
                "base",
                "must be greater than zero for exponential and linear backoff",
            ));
        }
        if cap < base {
            return Err(ConfigError::new("cap", "must be at least the base delay"));
        }
        if cap > MAX_CAP {
            return Err(ConfigError::new("cap", "must be at most one hour"));
        }
        if jitter == Jitter::Decorrelated && growth != Growth::Exponential {
            return Err(ConfigError::new(
                "jitter",
                "decorrelated jitter applies to exponential backoff only",
            ));
        }
        Ok(Backoff {
            growth,
            base,
            cap,
            jitter,
        })
    }
}

/// The backoff of one operation: how many retries it has waited for and its own RNG.
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::{Backoff, Jitter};
///
/// let backoff = Backoff::linear(Duration::from_millis(100)).jitter(Jitter::Equal).build()?;
/// let (mut a, mut b) = (backoff.state(42), backoff.state(42));
/// let first = a.next_delay();
/// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
/// assert_eq!(b.next_delay(), first); // the same seed gives the same delays
/// assert_eq!(a.retries(), 1);
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct BackoffState {
    backoff: Backoff,
    retries: u32,
    previous: Duration,
    rng: Rng,
}

impl BackoffState {
    /// The delay before the next retry.
    pub fn next_delay(&mut self) -> Duration {
        let b = &self.backoff;
        let ceiling = b.ceiling(self.retries);
        self.retries = self.retries.saturating_add(1);
        let delay = match b.jitter {
            Jitter::None => ceiling,
            Jitter::Full => ceiling.mul_f64(self.rng.next_f64()),
            Jitter::Equal => ceiling / 2 + (ceiling / 2).mul_f64(self.rng.next_f64()),
            Jitter::Decorrelated => {
                let high = self.previous.saturating_mul(3).min(b.cap);
                let span = high.saturating_sub(b.base);
                (b.base + span.mul_f64(self.rng.next_f64())).min(b.cap)
            }
        };
        self.previous = delay.max(b.base);
        delay
    }

    /// How many delays this state has handed out.
    pub fn retries(&self) -> u32 {
        self.retries
    }
}
