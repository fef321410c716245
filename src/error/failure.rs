//! [`FailureClass`]: what a failure means for a retry. It lives here, below both `classify`
//! (which assigns it) and `retry` (which acts on it), so neither module imports the other for it;
//! its one public path is `classify::FailureClass`.

use serde::{Deserialize, Serialize};

/// What a failure means for a retry (the reference text's failure classes).
///
/// ```
/// use stormguard::classify::FailureClass;
///
/// assert_eq!(FailureClass::ModelRecoverable.as_str(), "model_recoverable");
/// assert!(FailureClass::Ambiguous.is_dependency_failure());
/// assert!(!FailureClass::Permanent.is_dependency_failure());
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Safe to retry: the effect did not happen (connection refused, throttled, 503).
    Transient,
    /// The effect may have happened: a timeout after sending, a reset mid-response, a 500, 502
    /// or 504 on a write.
    Ambiguous,
    /// A bad argument or unparseable output: return it to the model to fix.
    ModelRecoverable,
    /// Retrying cannot help: a bad credential, a forbidden action, a conflict.
    Permanent,
    /// A guardrail tripped: halt loudly.
    Policy,
}

impl FailureClass {
    /// The stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureClass::Transient => "transient",
            FailureClass::Ambiguous => "ambiguous",
            FailureClass::ModelRecoverable => "model_recoverable",
            FailureClass::Permanent => "permanent",
            FailureClass::Policy => "policy",
        }
    }

    /// Whether a failure of this class says the dependency is unhealthy (what a breaker counts):
    /// `Transient` and `Ambiguous`. Caller mistakes and guardrails say nothing about its health.
    pub const fn is_dependency_failure(self) -> bool {
        matches!(self, FailureClass::Transient | FailureClass::Ambiguous)
    }
}
