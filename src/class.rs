//! Tool classes: retry policy follows what a tool does, not a global default.
//!
//! | failure class | `Read` | `IdempotentWrite` | `KeyedWrite` with a key | `KeyedWrite` without a key | `UnkeyedWrite` | `MultiStep` |
//! |---|---|---|---|---|---|---|
//! | `Transient` | retry | retry | retry (same key) | retry | retry | return |
//! | `Ambiguous` | retry | retry | retry (same key) | `missing_idempotency_key` | `outcome_unknown` | `outcome_unknown` |
//! | `ModelRecoverable` | return | return | return | return | return | return |
//! | `Permanent` | return | return | return | return | return | return |
//! | `Policy` | return | return | return | return | return | return |
//!
//! *Transient* means the effect did not happen, so even a write without a key may be sent again;
//! *ambiguous* means it may have happened, so only a read, a naturally idempotent write or a write
//! carrying its idempotency key may be sent again. A multi-step workflow is never retried as a
//! whole: give each step its own key and class. *Return* hands the result back unchanged (an `Err`
//! becomes a non-retryable [`ToolError`](crate::error::ToolError)); the two codes end the
//! operation with an error that tells the run to escalate.
//!
//! ```
//! use stormguard::class::{Decision, ToolClass};
//! use stormguard::classify::FailureClass;
//! use stormguard::error::ErrorCode;
//!
//! assert_eq!(ToolClass::Read.decide(FailureClass::Ambiguous, false), Decision::Retry);
//! assert_eq!(
//!     ToolClass::UnkeyedWrite.decide(FailureClass::Ambiguous, false),
//!     Decision::Escalate(ErrorCode::OutcomeUnknown),
//! );
//! assert_eq!(ToolClass::KeyedWrite.decide(FailureClass::Ambiguous, true), Decision::Retry);
//! ```

use crate::backoff::Backoff;
use crate::error::{ErrorCode, FailureClass};
mod evidence;

pub use crate::retry::policy::{ClassPolicy, ClassPolicyBuilder, MAX_ATTEMPTS_LIMIT};
#[cfg(any(feature = "reqwest", feature = "reqwest-0_13"))]
pub(crate) use evidence::answer_path;
pub use evidence::Evidence;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a tool does to the world, which decides how it may be retried.
///
/// Ordered from the most to the least permissive; [`ToolClass::strictest`] picks the later one.
///
/// ```
/// use stormguard::class::ToolClass;
///
/// assert_eq!(ToolClass::KeyedWrite.as_str(), "keyed_write");
/// assert_eq!(ToolClass::Read.strictest(ToolClass::UnkeyedWrite), ToolClass::UnkeyedWrite);
/// assert_eq!(ToolClass::MultiStep.policy().max_attempts(), 1);
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// search, get, list: no effect on the world.
    Read,
    /// set a field, upsert by id, delete by id: doing it twice equals doing it once.
    IdempotentWrite,
    /// send, charge, create, made safe to repeat by an idempotency key.
    KeyedWrite,
    /// A write to a provider without key support: an ambiguous outcome is never retried.
    UnkeyedWrite,
    /// reserve, charge, issue: no whole-workflow retry.
    MultiStep,
}

/// What to do with one failure.
///
/// ```
/// use stormguard::class::{Decision, ToolClass};
/// use stormguard::classify::FailureClass;
/// use stormguard::error::ErrorCode;
///
/// assert_eq!(ToolClass::MultiStep.decide(FailureClass::Transient, true), Decision::Return);
/// assert_eq!(
///     ToolClass::KeyedWrite.decide(FailureClass::Ambiguous, false),
///     Decision::Escalate(ErrorCode::MissingIdempotencyKey),
/// );
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Retry it, if the budget, the attempt cap and the deadline allow.
    Retry,
    /// Hand the result back as it is: retrying cannot help.
    Return,
    /// End the operation with this code: the run must escalate or verify.
    Escalate(ErrorCode),
}

impl ToolClass {
    /// Every class, from the most to the least permissive.
    ///
    /// ```
    /// use stormguard::class::ToolClass;
    ///
    /// assert!(ToolClass::ALL.windows(2).all(|w| w[0] < w[1]));
    /// for class in ToolClass::ALL {
    ///     assert_eq!(serde_json::to_value(class).unwrap(), class.as_str());
    /// }
    /// ```
    pub const ALL: [ToolClass; 5] = [
        ToolClass::Read,
        ToolClass::IdempotentWrite,
        ToolClass::KeyedWrite,
        ToolClass::UnkeyedWrite,
        ToolClass::MultiStep,
    ];

    /// The stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ToolClass::Read => "read",
            ToolClass::IdempotentWrite => "idempotent_write",
            ToolClass::KeyedWrite => "keyed_write",
            ToolClass::UnkeyedWrite => "unkeyed_write",
            ToolClass::MultiStep => "multi_step",
        }
    }

    /// The decision table of the [module docs](self). `keyed` says whether the request carries an
    /// idempotency key.
    pub const fn decide(self, failure: FailureClass, keyed: bool) -> Decision {
        match failure {
            FailureClass::Transient => match self {
                ToolClass::MultiStep => Decision::Return,
                _ => Decision::Retry,
            },
            FailureClass::Ambiguous => match self {
                ToolClass::Read | ToolClass::IdempotentWrite => Decision::Retry,
                ToolClass::KeyedWrite if keyed => Decision::Retry,
                ToolClass::KeyedWrite => Decision::Escalate(ErrorCode::MissingIdempotencyKey),
                ToolClass::UnkeyedWrite | ToolClass::MultiStep => {
                    Decision::Escalate(ErrorCode::OutcomeUnknown)
                }
            },
            FailureClass::ModelRecoverable | FailureClass::Permanent | FailureClass::Policy => {
                Decision::Return
            }
        }
    }

    /// Whether two classes decide every failure alike (`Read` and `IdempotentWrite` do): a
    /// nested layer that makes an operation stricter without changing a decision is not worth a
    /// warning.
    ///
    /// ```
    /// use stormguard::class::ToolClass;
    /// assert!(ToolClass::Read.decides_like(ToolClass::IdempotentWrite));
    /// assert!(!ToolClass::Read.decides_like(ToolClass::UnkeyedWrite));
    /// ```
    pub fn decides_like(self, other: ToolClass) -> bool {
        [
            FailureClass::Transient,
            FailureClass::Ambiguous,
            FailureClass::ModelRecoverable,
            FailureClass::Permanent,
            FailureClass::Policy,
        ]
        .iter()
        .all(|&f| {
            [false, true]
                .iter()
                .all(|&keyed| self.decide(f, keyed) == other.decide(f, keyed))
        })
    }

    /// The stricter of two classes: what a nested layer applies when the operation it serves was
    /// opened with another class.
    pub fn strictest(self, other: ToolClass) -> ToolClass {
        self.max(other)
    }

    /// The class an MCP tool's annotations imply, pessimistic as the MCP defaults are:
    /// `readOnlyHint` gives `Read`, `idempotentHint` gives `IdempotentWrite`, anything else
    /// `UnkeyedWrite` (annotations are hints: set `KeyedWrite` yourself when your code sends a key).
    ///
    /// ```
    /// use stormguard::class::ToolClass;
    /// assert_eq!(ToolClass::from_mcp_annotations(Some(true), None), ToolClass::Read);
    /// assert_eq!(ToolClass::from_mcp_annotations(None, None), ToolClass::UnkeyedWrite);
    /// ```
    pub fn from_mcp_annotations(read_only: Option<bool>, idempotent: Option<bool>) -> ToolClass {
        match (read_only, idempotent) {
            (Some(true), _) => ToolClass::Read,
            (_, Some(true)) => ToolClass::IdempotentWrite,
            _ => ToolClass::UnkeyedWrite,
        }
    }

    /// The class from an rmcp tool's annotations (feature `rmcp`), with the MCP spec's defaults
    /// for what is missing (`readOnlyHint: false`, `idempotentHint: false`): no annotations is an
    /// `UnkeyedWrite`. Annotations are hints from a server you may not trust: use this for your
    /// own tools, and set `KeyedWrite` yourself where your code sends a key.
    ///
    /// ```
    /// use rmcp::model::ToolAnnotations;
    /// use stormguard::class::ToolClass;
    ///
    /// let search = ToolAnnotations::new().read_only(true);
    /// assert_eq!(ToolClass::from_tool_annotations(Some(&search)), ToolClass::Read);
    /// let upsert = ToolAnnotations::new().idempotent(true);
    /// assert_eq!(ToolClass::from_tool_annotations(Some(&upsert)), ToolClass::IdempotentWrite);
    /// assert_eq!(ToolClass::from_tool_annotations(None), ToolClass::UnkeyedWrite);
    /// ```
    #[cfg(feature = "rmcp")]
    pub fn from_tool_annotations(annotations: Option<&rmcp::model::ToolAnnotations>) -> ToolClass {
        match annotations {
            Some(a) => ToolClass::from_mcp_annotations(a.read_only_hint, a.idempotent_hint),
            None => ToolClass::UnkeyedWrite,
        }
    }

    /// The class's default policy.
    ///
    /// | class | max attempts | backoff |
    /// |---|---|---|
    /// | `Read`, `IdempotentWrite` | 3 | exponential, full jitter, 100 ms base, 5 s cap |
    /// | `KeyedWrite`, `UnkeyedWrite` | 3 | exponential, full jitter, 250 ms base, 10 s cap |
    /// | `MultiStep` | 1 | - |
    ///
    /// Every class honours a server's `Retry-After` up to 30 s and has no deadline of its own.
    pub fn policy(self) -> ClassPolicy {
        let (attempts, base, cap) = match self {
            ToolClass::Read | ToolClass::IdempotentWrite => (3, 100, 5_000),
            ToolClass::KeyedWrite | ToolClass::UnkeyedWrite => (3, 250, 10_000),
            ToolClass::MultiStep => (1, 250, 10_000),
        };
        ClassPolicy::new(
            self,
            attempts,
            Backoff::full_jitter(Duration::from_millis(base), Duration::from_millis(cap)),
        )
    }
}
