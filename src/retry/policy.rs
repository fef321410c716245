//! [`ClassPolicy`]: how one tool class is retried (attempts, backoff, server-hint cap, deadline),
//! next to the decision that reads it ([`decide`](super::decide)). Re-exported from
//! [`class`](crate::class), where the defaults per class are.

use crate::backoff::Backoff;
use crate::class::ToolClass;
use crate::error::ConfigError;
use std::time::Duration;

/// How one class is retried: attempt cap, backoff, the longest server hint honoured, deadline.
///
/// Start from a class's defaults with [`ClassPolicy::builder`] (or from any policy with
/// [`into_builder`](Self::into_builder)) and change what you need; `build` checks the result.
///
/// ```
/// use std::time::Duration;
/// use stormguard::class::{ClassPolicy, ToolClass};
///
/// let policy = ClassPolicy::builder(ToolClass::Read)
///     .max_attempts(4)
///     .deadline(Duration::from_secs(20))
///     .build()
///     .unwrap();
/// assert_eq!(policy.max_attempts(), 4);
/// let longer = policy.into_builder().deadline(Duration::from_secs(60)).build().unwrap();
/// assert_eq!(longer.max_attempts(), 4);
///
/// assert!(ClassPolicy::builder(ToolClass::Read).max_attempts(0).build().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassPolicy {
    class: ToolClass,
    max_attempts: u32,
    backoff: Backoff,
    max_server_delay: Duration,
    deadline: Option<Duration>,
}

impl ClassPolicy {
    pub(crate) fn new(class: ToolClass, max_attempts: u32, backoff: Backoff) -> Self {
        ClassPolicy {
            class,
            max_attempts,
            backoff,
            max_server_delay: Duration::from_secs(30),
            deadline: None,
        }
    }

    /// A builder starting from `class`'s defaults ([`ToolClass::policy`]).
    pub fn builder(class: ToolClass) -> ClassPolicyBuilder {
        class.policy().into_builder()
    }

    /// A builder starting from this policy.
    pub fn into_builder(self) -> ClassPolicyBuilder {
        ClassPolicyBuilder { policy: self }
    }

    /// The tool class.
    pub fn class(&self) -> ToolClass {
        self.class
    }

    /// The most attempts, the first one included. On the outermost layer (the one that opens
    /// the operation) it caps the whole logical operation; on a nested layer it caps the
    /// attempts that layer makes in a row, after which it hands the failure up to the layer
    /// above (see the [`retry`](crate::retry) module docs).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The longest `Retry-After` honoured; a longer hint is clamped to this.
    pub fn max_server_delay(&self) -> Duration {
        self.max_server_delay
    }

    /// The deadline this layer sets on the operation, measured from when the layer is first
    /// called for it (or, if it had to wait for its inner service first, from when that wait
    /// began). See [`ClassPolicyBuilder::deadline`].
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }
}

/// A class's default policy ([`ToolClass::policy`]): what
/// [`RetryLayer::new`](crate::retry::RetryLayer::new) applies when it is given a bare class.
///
/// ```
/// use stormguard::class::{ClassPolicy, ToolClass};
///
/// assert_eq!(ClassPolicy::from(ToolClass::KeyedWrite), ToolClass::KeyedWrite.policy());
/// ```
impl From<ToolClass> for ClassPolicy {
    fn from(class: ToolClass) -> Self {
        class.policy()
    }
}

/// Builds a [`ClassPolicy`]; invalid settings are rejected by [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use stormguard::class::{ClassPolicy, ToolClass};
///
/// let builder = ClassPolicy::builder(ToolClass::KeyedWrite);
/// let err = builder.max_server_delay(Duration::from_secs(7200)).build().unwrap_err();
/// assert_eq!(err.field(), "max_server_delay");
/// let err = builder.deadline(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.field(), "deadline");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ClassPolicyBuilder {
    policy: ClassPolicy,
}

/// The largest `max_attempts` accepted (gRPC caps at 5; agents rarely need more than 10).
///
/// ```
/// use stormguard::class::{ClassPolicy, ToolClass, MAX_ATTEMPTS_LIMIT};
///
/// let builder = ClassPolicy::builder(ToolClass::Read);
/// assert!(builder.max_attempts(MAX_ATTEMPTS_LIMIT).build().is_ok());
/// let err = builder.max_attempts(MAX_ATTEMPTS_LIMIT + 1).build().unwrap_err();
/// assert_eq!(err.field(), "max_attempts");
/// ```
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;

impl ClassPolicyBuilder {
    /// The most attempts, the first included: 1 to [`MAX_ATTEMPTS_LIMIT`]. On the outermost
    /// layer it caps the whole logical operation; on a nested layer, the attempts that layer
    /// makes in a row before it hands the failure up (see the [`retry`](crate::retry) module
    /// docs).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.policy.max_attempts = n;
        self
    }

    /// The backoff between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = backoff;
        self
    }

    /// The longest server hint honoured (at most one hour; default 30 s). A server that asks for
    /// longer is retried after this limit or the class's backoff, whichever is longer, so a limit
    /// of zero ignores the server's wait and keeps the backoff (it never means "retry at once").
    pub fn max_server_delay(mut self, d: Duration) -> Self {
        self.policy.max_server_delay = d;
        self
    }

    /// A deadline for the whole operation: from when this layer is first called for it (or began
    /// waiting for its inner service to be ready), at most one day.
    ///
    /// Every layer's deadline holds: a nested layer's deadline joins the operation, and the
    /// earliest one wins. No attempt starts at or after it: a first attempt whose wait for
    /// readiness outlasted it is not sent, a retry whose backoff would end after it is not
    /// granted, and a retry still waiting for its service to be ready (a quota, a pool) when it
    /// passes is abandoned; each ends the operation with `deadline_exceeded`. An attempt in
    /// flight when it passes is cut off: `deadline_exceeded` for a call that may be sent again,
    /// `outcome_unknown` (or `missing_idempotency_key`) for a write that may not. Put a
    /// `tower::timeout` layer below the `Retry` to bound each attempt on its own.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.policy.deadline = Some(d);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<ClassPolicy, ConfigError> {
        let p = self.policy;
        if p.max_attempts == 0 || p.max_attempts > MAX_ATTEMPTS_LIMIT {
            return Err(ConfigError::new(
                "max_attempts",
                "must be between 1 and 100 (the first attempt counts)",
            ));
        }
        if p.max_server_delay > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "max_server_delay",
                "must be at most one hour",
            ));
        }
        if let Some(d) = p.deadline {
            if d.is_zero() || d > Duration::from_secs(24 * 3600) {
                return Err(ConfigError::new(
                    "deadline",
                    "must be greater than zero and at most one day",
                ));
            }
        }
        Ok(p)
    }
}
