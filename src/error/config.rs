use std::fmt;

/// A setting, or a setup step, that cannot work: rejected when a builder's `build` runs, or when
/// the setup step is taken (never a panic, never a silent default). [`field`](Self::field) names
/// the setting or the step.
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::Backoff;
///
/// let err = Backoff::exponential(Duration::from_secs(2))
///     .cap(Duration::from_secs(1))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "cap");
/// assert!(err.to_string().contains("cap"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    reason: &'static str,
}

impl ConfigError {
    pub(crate) const fn new(field: &'static str, reason: &'static str) -> Self {
        ConfigError { field, reason }
    }

    /// The setting that was rejected.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why it was rejected.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}
