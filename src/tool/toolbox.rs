//! The tools of one agent and the named shared parts they use.

mod specs;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::spec::{Tool, ToolFields};
use crate::saga::SagaSpec;
use specs::HedgesField;
pub use specs::{BreakerSpec, BudgetSpec, HedgeSpec, QuotaSpec, SpecError, StoreSpec};

/// The tools of one agent plus the named shared parts, as data; built in Rust ([`Toolbox::new`])
/// or loaded from a file, with the same checks either way.
///
/// ```
/// use stormguard::tool::Toolbox;
/// let tb = Toolbox::from_json_str(r#"{"tools": [{"name": "search", "class": "read", "retry": ["layer"]}]}"#).unwrap();
/// assert_eq!(tb.tools()[0].name, "search");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "ToolboxFields")]
pub struct Toolbox {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    budgets: BTreeMap<String, BudgetSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    breakers: BTreeMap<String, BreakerSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    quotas: BTreeMap<String, QuotaSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    stores: BTreeMap<String, StoreSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    hedges: BTreeMap<String, HedgeSpec>,
    tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    sagas: BTreeMap<String, SagaSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolboxFields {
    #[serde(default)]
    budgets: BTreeMap<String, BudgetSpec>,
    #[serde(default)]
    breakers: BTreeMap<String, BreakerSpec>,
    #[serde(default)]
    quotas: BTreeMap<String, QuotaSpec>,
    #[serde(default)]
    stores: BTreeMap<String, StoreSpec>,
    #[serde(default)]
    hedges: HedgesField,
    tools: Vec<ToolFields>,
    #[serde(default)]
    sagas: BTreeMap<String, SagaSpec>,
}

impl TryFrom<ToolboxFields> for Toolbox {
    type Error = SpecError;
    fn try_from(f: ToolboxFields) -> Result<Self, SpecError> {
        let tb = Toolbox {
            budgets: f.budgets,
            breakers: f.breakers,
            quotas: f.quotas,
            stores: f.stores,
            hedges: f.hedges.into_map(),
            tools: f
                .tools
                .into_iter()
                .map(Tool::try_from)
                .collect::<Result<_, _>>()?,
            sagas: f.sagas,
        };
        tb.validate()?;
        Ok(tb)
    }
}

impl Toolbox {
    /// A toolbox of these tools and no shared parts yet (add them with the `with_*` methods).
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool, Toolbox}};
    /// let t = Tool::new("a", ToolClass::Read, RetryOwner::Layer);
    /// assert_eq!(Toolbox::new(vec![t.clone(), t]).unwrap_err().field(), "name");
    /// ```
    pub fn new(tools: Vec<Tool>) -> Result<Self, SpecError> {
        let tb = Toolbox {
            tools,
            ..Default::default()
        };
        tb.validate()?;
        Ok(tb)
    }

    /// Adds a tool (after the shared parts it names) and checks the toolbox again.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{BudgetSpec, RetryOwner, Tool, Toolbox}};
    /// let tb = Toolbox::new(vec![]).unwrap()
    ///     .with_budget("b", BudgetSpec { ratio: 0.1, min_per_sec: 1 }).unwrap()
    ///     .with_tool(Tool::new("t", ToolClass::Read, RetryOwner::Layer).budget("b")).unwrap();
    /// assert_eq!(tb.tools().len(), 1);
    /// ```
    pub fn with_tool(mut self, tool: Tool) -> Result<Self, SpecError> {
        self.tools.push(tool);
        self.validate().map(|()| self)
    }

    /// Adds a named budget and checks the toolbox again.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{BudgetSpec, RetryOwner, Tool, Toolbox}};
    /// let tb = Toolbox::new(vec![]).unwrap().with_budget("b", BudgetSpec { ratio: 2.0, min_per_sec: 1 });
    /// assert_eq!(tb.unwrap_err().field(), "budgets.ratio");
    /// ```
    pub fn with_budget(mut self, name: &str, spec: BudgetSpec) -> Result<Self, SpecError> {
        self.budgets.insert(name.to_owned(), spec);
        self.validate().map(|()| self)
    }

    /// Adds a named breaker and checks the toolbox again.
    ///
    /// ```
    /// use stormguard::tool::{BreakerSpec, Toolbox};
    /// assert!(Toolbox::new(vec![]).unwrap().with_breaker("b", BreakerSpec { failure_ratio: 0.5, open_secs: 10 }).is_ok());
    /// ```
    pub fn with_breaker(mut self, name: &str, spec: BreakerSpec) -> Result<Self, SpecError> {
        self.breakers.insert(name.to_owned(), spec);
        self.validate().map(|()| self)
    }

    /// Adds a named quota and checks the toolbox again.
    ///
    /// ```
    /// use stormguard::tool::{QuotaSpec, Toolbox};
    /// assert!(Toolbox::new(vec![]).unwrap().with_quota("q", QuotaSpec { per_sec: 0, burst: 1 }).is_err());
    /// ```
    pub fn with_quota(mut self, name: &str, spec: QuotaSpec) -> Result<Self, SpecError> {
        self.quotas.insert(name.to_owned(), spec);
        self.validate().map(|()| self)
    }

    /// Adds a saga of the toolbox's tools (see [`crate::saga`]) and checks the toolbox again:
    /// every step and compensation must be one of its tools.
    ///
    /// ```
    /// use stormguard::saga::SagaSpec;
    /// use stormguard::tool::Toolbox;
    /// let err = Toolbox::new(vec![]).unwrap().with_saga("trip", SagaSpec::new().step("nope", None));
    /// assert_eq!(err.unwrap_err().field(), "sagas");
    /// ```
    pub fn with_saga(mut self, name: &str, spec: SagaSpec) -> Result<Self, SpecError> {
        self.sagas.insert(name.to_owned(), spec);
        self.validate().map(|()| self)
    }

    /// The same toolbox with every receipt store in memory (the episode harness runs a user's
    /// toolbox on stores it can crash and resume in process).
    #[cfg(feature = "chaos")]
    pub(crate) fn with_stores_in_memory(&self) -> Toolbox {
        let mut tb = self.clone();
        for store in tb.stores.values_mut() {
            store.kind = String::from("memory");
        }
        tb
    }

    /// The declared sagas.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().sagas().is_empty());
    /// ```
    pub fn sagas(&self) -> &BTreeMap<String, SagaSpec> {
        &self.sagas
    }

    /// Adds a named receipt store and checks the toolbox again.
    ///
    /// ```
    /// use stormguard::tool::{StoreSpec, Toolbox};
    /// let s = StoreSpec { kind: "postgres".into(), retention_secs: 86_400 };
    /// assert!(Toolbox::new(vec![]).unwrap().with_store("pg", s).is_ok());
    /// ```
    pub fn with_store(mut self, name: &str, spec: StoreSpec) -> Result<Self, SpecError> {
        self.stores.insert(name.to_owned(), spec);
        self.validate().map(|()| self)
    }

    /// The tools, to amend in place (the caller validates after).
    pub(super) fn tools_mut(&mut self) -> &mut [Tool] {
        &mut self.tools
    }

    /// The tools, in declaration order.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().tools().is_empty());
    /// ```
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The named receipt stores.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().stores().is_empty());
    /// ```
    pub fn stores(&self) -> &BTreeMap<String, StoreSpec> {
        &self.stores
    }

    /// The named budgets.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().budgets().is_empty());
    /// ```
    pub fn budgets(&self) -> &BTreeMap<String, BudgetSpec> {
        &self.budgets
    }

    /// The named breakers.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().breakers().is_empty());
    /// ```
    pub fn breakers(&self) -> &BTreeMap<String, BreakerSpec> {
        &self.breakers
    }

    /// The named hedges.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().hedges().is_empty());
    /// ```
    pub fn hedges(&self) -> &BTreeMap<String, HedgeSpec> {
        &self.hedges
    }

    /// The named quotas.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::new(vec![]).unwrap().quotas().is_empty());
    /// ```
    pub fn quotas(&self) -> &BTreeMap<String, QuotaSpec> {
        &self.quotas
    }

    /// Reads a toolbox from JSON; a bad file or a failed check is a [`SpecError`].
    ///
    /// ```
    /// let err = stormguard::tool::Toolbox::from_json_str(r#"{"tools": [{"name": "t", "class": "read", "retry": ["layer"], "budget": "nope"}]}"#).unwrap_err();
    /// assert_eq!(err.field(), "budget");
    /// ```
    pub fn from_json_str(s: &str) -> Result<Self, SpecError> {
        let raw: ToolboxFields =
            serde_json::from_str(s).map_err(|e| SpecError::new(None, "file", &e.to_string()))?;
        Toolbox::try_from(raw)
    }

    /// Writes the toolbox as JSON.
    ///
    /// ```
    /// let tb = stormguard::tool::Toolbox::new(vec![]).unwrap();
    /// assert_eq!(stormguard::tool::Toolbox::from_json_str(&tb.to_json_string()).unwrap(), tb);
    /// ```
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads a toolbox from TOML (feature `audit`); a bad file or a failed check is a
    /// [`SpecError`].
    ///
    /// ```
    /// let err = stormguard::tool::Toolbox::from_toml_str("[[tools]]\nname = \"t\"\nclass = \"read\"\n").unwrap_err();
    /// assert_eq!(err.field(), "file");
    /// ```
    #[cfg(feature = "audit")]
    pub fn from_toml_str(s: &str) -> Result<Self, SpecError> {
        let raw: ToolboxFields =
            toml::from_str(s).map_err(|e| SpecError::new(None, "file", &e.to_string()))?;
        Toolbox::try_from(raw)
    }

    /// Writes the toolbox as TOML (feature `audit`).
    ///
    /// ```
    /// let tb = stormguard::tool::Toolbox::new(vec![]).unwrap();
    /// assert_eq!(stormguard::tool::Toolbox::from_toml_str(&tb.to_toml_string()).unwrap(), tb);
    /// ```
    #[cfg(feature = "audit")]
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Every check: each tool's own, unique names, every named part declared, sane settings.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::default().validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), SpecError> {
        let mut names = BTreeSet::new();
        for t in &self.tools {
            t.validate()?;
            if !names.insert(t.name.as_str()) {
                return Err(SpecError::new(
                    Some(&t.name),
                    "name",
                    "two tools share this name",
                ));
            }
            let missing = |field: &str, what: &str| {
                Err(SpecError::new(
                    Some(&t.name),
                    field,
                    &format!("names a {what} the toolbox does not declare"),
                ))
            };
            if matches!(&t.budget, Some(b) if !self.budgets.contains_key(b)) {
                return missing("budget", "budget");
            }
            if matches!(&t.breaker, Some(b) if !self.breakers.contains_key(b)) {
                return missing("breaker", "breaker");
            }
            if let Some(q) = &t.quota {
                match self.quotas.get(&q.name) {
                    None => return missing("quota", "quota"),
                    // A call that costs more than the quota ever holds can never be sent.
                    Some(spec) if q.cost > spec.burst => {
                        return Err(SpecError::new(
                            Some(&t.name),
                            "quota.cost",
                            &format!(
                                "costs {} but quota `{}` holds at most {} (its burst): no call could be sent",
                                q.cost, q.name, spec.burst
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
            if matches!(&t.receipt, Some(r) if !self.stores.contains_key(&r.store)) {
                return missing("receipt.store", "receipt store");
            }
            if matches!(&t.hedge, Some(h) if !self.hedges.contains_key(h)) {
                return missing("hedge", "hedge");
            }
        }
        let bad = |field: &str, name: &str, reason: &str| {
            Err(SpecError::new(None, field, &format!("`{name}`: {reason}")))
        };
        for (n, b) in &self.budgets {
            if !(0.0..=1.0).contains(&b.ratio) {
                return bad("budgets.ratio", n, "must be within 0.0..=1.0");
            }
        }
        for (n, b) in &self.breakers {
            // Over at least 20 calls, a ratio of 1/20 or less would trip on one failure.
            if !(b.failure_ratio > 0.05 && b.failure_ratio <= 1.0) {
                return bad("breakers.failure_ratio", n, "must be within (0.05, 1.0]");
            }
            if b.open_secs == 0 || b.open_secs > 86_400 {
                return bad(
                    "breakers.open_secs",
                    n,
                    "must be between 1 second and one day",
                );
            }
        }
        for (n, h) in &self.hedges {
            match (h.delay_ms, h.percentile) {
                (Some(_), Some(_)) => {
                    return bad("hedges", n, "a fixed delay_ms or a percentile, not both")
                }
                (Some(ms), None) if ms == 0 || ms > 3_600_000 => {
                    return bad(
                        "hedges.delay_ms",
                        n,
                        "must be between 1 and 3600000 (one hour)",
                    )
                }
                (Some(_), None) if h.min_samples.is_some() => {
                    return bad(
                        "hedges.min_samples",
                        n,
                        "a fixed delay learns nothing: min_samples goes with a percentile",
                    )
                }
                (None, Some(q)) if !(q > 0.0 && q < 1.0) => {
                    return bad("hedges.percentile", n, "must be within (0.0, 1.0)")
                }
                _ => {}
            }
            if h.min_samples.is_some_and(|m| !(1..=1_000_000).contains(&m)) {
                return bad("hedges.min_samples", n, "must be between 1 and 1000000");
            }
        }
        for (name, saga) in &self.sagas {
            if saga.steps.is_empty() {
                return bad("sagas", name, "a saga needs at least one step");
            }
            for step in &saga.steps {
                for tool in std::iter::once(&step.tool).chain(step.compensation.as_ref()) {
                    if !names.contains(tool.as_str()) {
                        return Err(SpecError::new(
                            None,
                            "sagas",
                            &format!("`{name}`: `{tool}` is not a tool of the toolbox"),
                        ));
                    }
                }
            }
        }
        for (n, q) in &self.quotas {
            if q.per_sec == 0 || q.burst == 0 {
                return bad("quotas", n, "per_sec and burst must be at least 1");
            }
        }
        for (n, s) in &self.stores {
            if !["memory", "sqlite", "postgres", "redis"].contains(&s.kind.as_str()) {
                return bad(
                    "stores.kind",
                    n,
                    "must be memory, sqlite, postgres or redis",
                );
            }
            if s.retention_secs == 0 {
                return bad("stores.retention_secs", n, "must be at least 1 second");
            }
        }
        Ok(())
    }
}
