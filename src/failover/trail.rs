//! What a call that ran out of targets reports: each target, and why the call left it.

use super::decide::Leave;
use crate::error::BoxError;
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// One target a call left or skipped, in the order the failover considered them.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tried {
    /// The target's name, as given to the builder.
    pub target: Cow<'static, str>,
    /// Why the call left it, or why it was skipped.
    pub why: Leave,
    /// Whether this call sent the request there (`false`: skipped, because an earlier call left
    /// it and its wait had not passed, or its breaker answered for it).
    pub sent: bool,
}

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.target, self.why.as_str())?;
        if !self.sent {
            f.write_str(" (not sent)")?;
        }
        Ok(())
    }
}

/// The source of the [`ToolError`](crate::error::ToolError) a [`Failover`](super::Failover) returns
/// when no target could serve the call: every target it left or skipped, and the last target's
/// own error, if its answer was an error (its [`source`](std::error::Error::source)).
///
/// ```
/// use stormguard::failover::Exhausted;
/// # fn inspect(err: &stormguard::error::ToolError) {
/// if let Some(exhausted) = std::error::Error::source(err).and_then(|s| s.downcast_ref::<Exhausted>()) {
///     for tried in exhausted.tried() {
///         println!("{}: {}", tried.target, tried.why.as_str());
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Exhausted {
    tried: Vec<Tried>,
    wait: Option<Duration>,
    last: Option<BoxError>,
}

impl Exhausted {
    pub(crate) fn new(tried: Vec<Tried>, wait: Option<Duration>, last: Option<BoxError>) -> Self {
        Exhausted { tried, wait, last }
    }

    /// Every target the call left or skipped, in order.
    pub fn tried(&self) -> &[Tried] {
        &self.tried
    }

    /// How long until the first skipped target is due to be tried again, if one is skipped.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The hint of the error: the targets and why each was left, in one line.
    pub(crate) fn hint(&self) -> String {
        let mut hint = String::from("no target could serve the call: ");
        for (i, tried) in self.tried.iter().enumerate() {
            if i > 0 {
                hint.push_str(", ");
            }
            hint.push_str(&tried.to_string());
        }
        hint
    }
}

impl fmt::Display for Exhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hint())
    }
}

impl std::error::Error for Exhausted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
