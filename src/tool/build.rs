//! [`Toolbox::build`]: a toolbox made live, its budgets, breakers, quotas and receipt stores
//! made once per name ([`Stores`] gives the stores that are not in memory).

use super::call::Call;
use super::toolbox::{SpecError, Toolbox};
use super::tools::Tools;
use crate::breaker::{Breaker, BreakerConfig, Window};
use crate::budget::RetryBudget;
use crate::error::ConfigError;
use crate::quota::{KeyedQuotaLayer, Rate};
use crate::receipt::{AnyStore, InMemoryStore, ReceiptConfig};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The receipt stores a toolbox's tools record in, by the names its file gives them. A store of
/// kind `memory` that is not given is made; every other kind must be given, of its kind.
///
/// ```
/// use stormguard::receipt::InMemoryStore;
/// use stormguard::tool::Stores;
///
/// let stores = Stores::new().with("billing", InMemoryStore::new());
/// assert_eq!(stores.names().collect::<Vec<_>>(), ["billing"]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Stores(BTreeMap<String, AnyStore>);

impl Stores {
    /// No stores yet.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Stores::new().names().count(), 0);
    /// ```
    pub fn new() -> Self {
        Stores::default()
    }

    /// Gives the store the toolbox names `name`.
    ///
    /// ```
    /// use stormguard::{receipt::InMemoryStore, tool::Stores};
    /// assert_eq!(Stores::new().with("a", InMemoryStore::new()).names().count(), 1);
    /// ```
    pub fn with(mut self, name: impl Into<String>, store: impl Into<AnyStore>) -> Self {
        self.0.insert(name.into(), store.into());
        self
    }

    /// The names given.
    ///
    /// ```
    /// assert!(stormguard::tool::Stores::new().names().next().is_none());
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

fn config_error(field: &str, name: &str, err: &ConfigError) -> SpecError {
    SpecError::new(None, field, &format!("`{name}`: {err}"))
}

impl Toolbox {
    /// Makes the toolbox live: its named budgets, breakers and quotas, the budget of each
    /// dependency whose tools name none, and its receipt stores (`stores` gives each one that
    /// is not of kind `memory`). Build it once at startup and clone the [`Tools`]: each build
    /// starts its budgets, breakers, quotas and held calls empty, so the same declaration built
    /// again in one process is said with a WARN (once) and counted in
    /// `stormguard_toolbox_rebuilds_total`. A store missing or of another
    /// kind than declared, a store given that the toolbox does not declare, or a setting the
    /// layers refuse (a retention under one hour) is a [`SpecError`].
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    ///
    /// let toolbox = Toolbox::from_json_str(r#"{
    ///     "stores": { "pg": { "kind": "postgres", "retention_secs": 604800 } },
    ///     "tools": []
    /// }"#)?;
    /// let err = toolbox.build(Stores::new()).unwrap_err();
    /// assert_eq!(err.field(), "stores");
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn build(&self, stores: Stores) -> Result<Tools, SpecError> {
        let tools = self.build_seeded(stores, None)?;
        super::rebuilds::note(self);
        Ok(tools)
    }

    /// [`Toolbox::build`] with every budget's backoff and acceptance draws seeded from `seed`
    /// (each budget its own stream), so a simulation repeats; `None`: random seeds.
    pub(crate) fn build_seeded(
        &self,
        stores: Stores,
        seed: Option<u64>,
    ) -> Result<Tools, SpecError> {
        self.validate()?;
        let seeded = |builder: crate::budget::RetryBudgetBuilder, n: u64| match seed {
            Some(seed) => {
                builder.seed(crate::backoff::rng::mix(seed ^ crate::backoff::rng::mix(n)))
            }
            None => builder,
        };
        let mut budgets = BTreeMap::new();
        for (n, (name, spec)) in self.budgets().iter().enumerate() {
            let builder = RetryBudget::builder()
                .name(name.as_str())
                .retry_ratio(spec.ratio)
                .floor(spec.min_per_sec, Duration::from_secs(1));
            let budget = seeded(builder, n as u64 + 1)
                .build()
                .map_err(|e| config_error("budgets", name, &e))?;
            budgets.insert(name.clone(), budget);
        }
        // Each dependency whose tools name no budget has its own (a tool naming no dependency
        // is one), named after it for the refusal's hint. The first takes seed stream 0.
        let mut own_budgets = BTreeMap::new();
        for tool in self.tools().iter().filter(|t| t.budget.is_none()) {
            let (dependency, owner) = tool.budget_owner();
            let at = (dependency, owner.to_owned());
            if own_budgets.contains_key(&at) {
                continue;
            }
            let n = match own_budgets.len() as u64 {
                0 => 0,
                k => (1 << 32) + k,
            };
            let budget = seeded(RetryBudget::builder().name(owner), n)
                .build()
                .map_err(|e| config_error("budgets", owner, &e))?;
            own_budgets.insert(at, budget);
        }
        let mut breakers = BTreeMap::new();
        for (name, spec) in self.breakers() {
            let open = Duration::from_secs(spec.open_secs);
            let config = BreakerConfig::builder()
                .failure_rate(spec.failure_ratio, Window::Count(50), 20)
                .open_duration(open.min(Duration::from_millis(250)), open)
                .build()
                .map_err(|e| config_error("breakers", name, &e))?;
            breakers.insert(name.clone(), Breaker::new(name.clone(), config));
        }
        let mut quotas = BTreeMap::new();
        for (name, spec) in self.quotas() {
            let rate = Rate::per_second(spec.per_sec)
                .burst(spec.burst)
                .build()
                .map_err(|e| config_error("quotas", name, &e))?;
            quotas.insert(name.clone(), self.quota_layer(name, rate)?);
        }
        for (name, spec) in self.stores() {
            // The receipt layer's own check, at build rather than at the first tool's layer.
            ReceiptConfig::builder()
                .retention(Duration::from_secs(spec.retention_secs))
                .build()
                .map_err(|e| config_error("stores", name, &e))?;
        }
        let mut given = stores.0;
        let mut made = BTreeMap::new();
        for (name, spec) in self.stores() {
            let store = match given.remove(name) {
                Some(store) if store.kind() == spec.kind => store,
                Some(store) => {
                    return Err(SpecError::new(
                        None,
                        "stores",
                        &format!(
                            "`{name}` is declared {} and was given a {} store",
                            spec.kind,
                            store.kind()
                        ),
                    ))
                }
                None if spec.kind == "memory" => InMemoryStore::new().into(),
                None if spec.kind == "redis" => {
                    return Err(SpecError::new(
                        None,
                        "stores",
                        &format!("`{name}` is a redis store: receipts have no Redis store yet (the audit reads it; a built stack needs sqlite, postgres or memory)"),
                    ))
                }
                None => {
                    return Err(SpecError::new(
                        None,
                        "stores",
                        &format!(
                            "`{name}` is a {} store: give it with Stores::new().with(\"{name}\", store)",
                            spec.kind
                        ),
                    ))
                }
            };
            made.insert(name.clone(), store);
        }
        if let Some(name) = given.keys().next() {
            return Err(SpecError::new(
                None,
                "stores",
                &format!("`{name}` was given but the toolbox declares no such store"),
            ));
        }
        Ok(Tools {
            toolbox: self.clone(),
            budgets,
            own_budgets,
            default_budget: None,
            breakers,
            quotas,
            stores: made,
            held: Default::default(),
            creates: self
                .tools()
                .iter()
                .filter(|t| t.class == crate::class::ToolClass::Read && !t.trust_class)
                .map(|t| (t.name.clone(), Default::default()))
                .collect(),
        })
    }

    /// One keyed quota for every tool that names `name`: each tool's calls are counted under
    /// the context value its [`QuotaUse`](super::QuotaUse) names (`global`: one count for all),
    /// at its cost.
    fn quota_layer(
        &self,
        name: &str,
        rate: Rate,
    ) -> Result<KeyedQuotaLayer<String, Call>, SpecError> {
        let uses: BTreeMap<String, (String, u32)> = self
            .tools()
            .iter()
            .filter_map(|t| {
                let q = t.quota.as_ref().filter(|q| q.name == name)?;
                Some((t.name.clone(), (q.key.clone(), q.cost)))
            })
            .collect();
        let uses = Arc::new(uses);
        KeyedQuotaLayer::builder(rate, move |call: &Call| quota_key(&uses, call))
            .name(name.to_owned())
            .build()
            .map_err(|e| config_error("quotas", name, &e))
    }
}

/// The count a call goes to and its cost: `global`, or the value of the context entry the tool's
/// quota names (a call without it is refused before it reaches the quota, see
/// [`ToolLayer`](super::ToolLayer)).
fn quota_key(uses: &BTreeMap<String, (String, u32)>, call: &Call) -> (String, u32) {
    let Some((key, cost)) = call.tool().and_then(|t| uses.get(t)) else {
        return (String::from("global"), 1);
    };
    match key.as_str() {
        "global" => (String::from("global"), *cost),
        key => (
            format!("{key}={}", call.get(key).unwrap_or_default()),
            *cost,
        ),
    }
}
