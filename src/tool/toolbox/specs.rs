//! The settings of a toolbox's named shared parts (budgets, breakers, quotas, receipt stores),
//! and [`SpecError`], what a tool table that cannot work is refused with.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A tool table that cannot work: names the tool (when one is at fault), the field and why.
///
/// ```
/// use stormguard::tool::Toolbox;
/// let err = Toolbox::from_json_str(r#"{"tools": [{"name": "t", "class": "read", "retry": []}]}"#).unwrap_err();
/// assert_eq!(err.tool(), Some("t"));
/// assert_eq!(err.field(), "retry");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    tool: Option<String>,
    field: String,
    reason: String,
}

impl SpecError {
    pub(crate) fn new(tool: Option<&str>, field: &str, reason: &str) -> Self {
        SpecError {
            tool: tool.map(str::to_owned),
            field: field.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// The tool at fault, if one is.
    ///
    /// ```
    /// let err = stormguard::tool::Toolbox::from_json_str("{").unwrap_err();
    /// assert_eq!(err.tool(), None);
    /// ```
    pub fn tool(&self) -> Option<&str> {
        self.tool.as_deref()
    }

    /// The field at fault (`file` for a file that does not parse).
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Toolbox::from_json_str("{").unwrap_err().field(), "file");
    /// ```
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why.
    ///
    /// ```
    /// assert!(!stormguard::tool::Toolbox::from_json_str("{").unwrap_err().reason().is_empty());
    /// ```
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tool {
            Some(t) => write!(f, "tool `{t}`, field `{}`: {}", self.field, self.reason),
            None => write!(f, "field `{}`: {}", self.field, self.reason),
        }
    }
}

impl std::error::Error for SpecError {}

/// A retry budget's settings.
///
/// ```
/// let b = stormguard::tool::BudgetSpec { ratio: 0.1, min_per_sec: 10 };
/// assert_eq!(b.min_per_sec, 10);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Retries allowed per first attempt (0.0..=1.0).
    pub ratio: f64,
    /// Retries always allowed per second.
    pub min_per_sec: u32,
}

/// A breaker's settings: the default breaker's (see
/// [`BreakerConfig`](crate::breaker::BreakerConfig)) with these two numbers; `{}` in a file is
/// the default breaker.
///
/// ```
/// let b = stormguard::tool::BreakerSpec { failure_ratio: 0.5, open_secs: 30 };
/// assert_eq!(b.open_secs, 30);
/// let d: stormguard::tool::BreakerSpec = serde_json::from_str("{}").unwrap();
/// assert_eq!(d, stormguard::tool::BreakerSpec::default());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSpec {
    /// The failure ratio over the last 50 calls (at least 20) that opens it (above 0.05, at
    /// most 1.0; default 0.9).
    pub failure_ratio: f64,
    /// The longest it stays open before a probe goes whatever the traffic, in seconds (1 to
    /// 86400, default 30): it stays open at least 250 ms, then probes after 25 turned-away calls
    /// (see [`BreakerConfig`](crate::breaker::BreakerConfig); the open time never doubles).
    pub open_secs: u64,
}

impl Default for BreakerSpec {
    /// The default breaker's numbers: 0.9 and 30 s.
    fn default() -> Self {
        BreakerSpec {
            failure_ratio: 0.9,
            open_secs: 30,
        }
    }
}

/// A hedge's settings: when the copy of a slow read goes. Either a fixed `delay_ms`, or a
/// `percentile` of recent latencies after `min_samples` answers (default: the 0.95 quantile
/// after 20, `{}` in a file).
///
/// ```
/// let h: stormguard::tool::HedgeSpec = serde_json::from_str(r#"{"delay_ms": 50}"#).unwrap();
/// assert_eq!(h.delay_ms, Some(50));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeSpec {
    /// A fixed delay, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The quantile of recent latencies to wait (within (0.0, 1.0)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentile: Option<f64>,
    /// Answers seen before the first hedge by percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u32>,
}

/// The hedges of a file: a map of settings, or (as before) a list of names with the defaults.
#[derive(Deserialize)]
#[serde(untagged)]
pub(in crate::tool) enum HedgesField {
    Names(std::collections::BTreeSet<String>),
    Specs(std::collections::BTreeMap<String, HedgeSpec>),
}

impl Default for HedgesField {
    fn default() -> Self {
        HedgesField::Specs(Default::default())
    }
}

impl HedgesField {
    pub(in crate::tool) fn into_map(self) -> std::collections::BTreeMap<String, HedgeSpec> {
        match self {
            HedgesField::Names(names) => names
                .into_iter()
                .map(|n| (n, HedgeSpec::default()))
                .collect(),
            HedgesField::Specs(map) => map,
        }
    }
}

/// A quota's settings.
///
/// ```
/// let q = stormguard::tool::QuotaSpec { per_sec: 5, burst: 10 };
/// assert_eq!(q.burst, 10);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Units refilled per second.
    pub per_sec: u32,
    /// Units held at most.
    pub burst: u32,
}

/// A receipt store's settings.
///
/// ```
/// let s = stormguard::tool::StoreSpec { kind: "postgres".into(), retention_secs: 86_400 };
/// assert_eq!(s.retention_secs, 86_400);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSpec {
    /// `memory`, `sqlite`, `postgres` or `redis`.
    pub kind: String,
    /// How long a receipt is kept, in seconds.
    pub retention_secs: u64,
}
