//! [`Tools`]: a toolbox made live, its budgets, breakers, quotas and receipt stores shared by
//! name, and a layer per tool.

use super::call::Call;
use super::router::ToolRouter;
use super::spec::Tool;
use super::stack::{ToolLayer, ToolService};
use super::toolbox::{SpecError, Toolbox};
use crate::breaker::{Breaker, BreakerConfig, Window};
use crate::budget::RetryBudget;
use crate::error::ConfigError;
use crate::quota::{KeyedQuotaLayer, Rate};
use crate::receipt::{AnyStore, InMemoryStore, ReceiptConfig};
use crate::saga::Saga;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
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

/// A toolbox made live: one [`RetryBudget`], [`Breaker`], quota and receipt store per name,
/// shared by every tool that names it, and the stack of each tool
/// ([`layer`](Self::layer)). Made by [`Toolbox::build`].
///
/// ```
/// use stormguard::tool::{Stores, Toolbox};
///
/// let toolbox = Toolbox::from_json_str(r#"{
///     "budgets": { "billing": { "ratio": 0.1, "min_per_sec": 1 } },
///     "tools": [
///         { "name": "search", "class": "read", "retry": ["layer"] },
///         { "name": "lookup", "class": "read", "retry": ["layer"], "budget": "billing" }
///     ]
/// }"#)?;
/// let tools = toolbox.build(Stores::new())?;
/// assert!(tools.budget("billing").is_some());
/// // A tool that names no budget draws on the toolbox's default one, shared by all such tools:
/// // what one deposits, the other holds.
/// assert_eq!(tools.default_budget().balance(), 0.0);
/// tools.layer("search")?.budget().deposit();
/// assert!(tools.default_budget().balance() > 0.0);
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
#[derive(Clone)]
pub struct Tools {
    toolbox: Toolbox,
    budgets: BTreeMap<String, RetryBudget>,
    default_budget: RetryBudget,
    breakers: BTreeMap<String, Breaker>,
    quotas: BTreeMap<String, KeyedQuotaLayer<String, Call>>,
    stores: BTreeMap<String, AnyStore>,
}

impl fmt::Debug for Tools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tools")
            .field("tools", &self.toolbox.tools().len())
            .field("budgets", &self.budgets.keys().collect::<Vec<_>>())
            .field("breakers", &self.breakers.keys().collect::<Vec<_>>())
            .field("quotas", &self.quotas.keys().collect::<Vec<_>>())
            .field("stores", &self.stores.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn config_error(field: &str, name: &str, err: &ConfigError) -> SpecError {
    SpecError::new(None, field, &format!("`{name}`: {err}"))
}

impl Toolbox {
    /// Makes the toolbox live: its named budgets, breakers and quotas, and its receipt stores
    /// (`stores` gives each one that is not of kind `memory`). A store missing or of another
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
        self.validate()?;
        let mut budgets = BTreeMap::new();
        for (name, spec) in self.budgets() {
            let budget = RetryBudget::builder()
                .retry_ratio(spec.ratio)
                .floor(spec.min_per_sec, Duration::from_secs(1))
                .build()
                .map_err(|e| config_error("budgets", name, &e))?;
            budgets.insert(name.clone(), budget);
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
            default_budget: RetryBudget::default(),
            breakers,
            quotas,
            stores: made,
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
/// [`ToolLayer`]).
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

impl Tools {
    /// The stack of the tool `name`, to put over its body (a `Service<Call>`): its `Retry` as
    /// its class and retry owner say, then its receipts (or its key alone), its breaker and its
    /// quota, in the documented order, with one classifier for every layer. A tool the toolbox
    /// does not hold, more than one retry owner, or a part a built stack does not have yet (a
    /// hedge; a read-back) is a [`SpecError`].
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// let tools = Toolbox::default().build(Stores::new())?;
    /// assert_eq!(tools.layer("nope").unwrap_err().field(), "name");
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn layer(&self, name: &str) -> Result<ToolLayer, SpecError> {
        let tool = self
            .toolbox
            .tools()
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| SpecError::new(Some(name), "name", "the toolbox holds no such tool"))?;
        let budget = match &tool.budget {
            Some(b) => self.budgets[b].clone(),
            None => self.default_budget.clone(),
        };
        let breaker = tool.breaker.as_ref().map(|b| self.breakers[b].clone());
        let quota = tool.quota.as_ref().map(|q| self.quotas[&q.name].clone());
        let receipt = match &tool.receipt {
            Some(r) => {
                let spec = &self.toolbox.stores()[&r.store];
                let window = Duration::from_secs(r.provider_key_window_secs.unwrap_or(1));
                let mut config = ReceiptConfig::builder()
                    .retention(Duration::from_secs(spec.retention_secs))
                    .key_window(window);
                if let Some(secs) = r.lease_secs {
                    config = config.lease(Duration::from_secs(secs));
                }
                let config = config
                    .build()
                    .map_err(|e| SpecError::new(Some(name), "receipt", &e.to_string()))?;
                Some((self.stores[&r.store].clone(), config))
            }
            None => None,
        };
        ToolLayer::new(Arc::new(tool.clone()), budget, breaker, quota, receipt)
    }

    /// Every tool's stack over one `body`, each with `classifier`: a call goes through the stack
    /// of the tool it is addressed to ([`Call::to`]). See [`ToolRouter`]. The first tool whose
    /// stack cannot be built is a [`SpecError`].
    pub fn router<S, C>(&self, body: S, classifier: C) -> Result<ToolRouter<S::Response>, SpecError>
    where
        ToolLayer<C>: tower_layer::Layer<S, Service = ToolService<S::Response>>,
        S: tower_service::Service<Call> + Clone,
        C: Clone,
    {
        let mut stacks = BTreeMap::new();
        for tool in self.toolbox.tools() {
            let layer = self.layer(&tool.name)?.classifier(classifier.clone());
            stacks.insert(
                tool.name.clone(),
                tower_layer::Layer::layer(&layer, body.clone()),
            );
        }
        Ok(ToolRouter::new(stacks))
    }

    /// The saga the toolbox declares as `name` ([`Toolbox::with_saga`], or `sagas` in the file),
    /// each step through its tool's stack over `body` with `classifier`; its decisions are
    /// recorded in the first step's receipt store. Every step and compensation must be a tool
    /// with receipts and a key (a resume must not repeat it), or it is a [`SpecError`]. See
    /// [`crate::saga`].
    pub fn saga<S, C>(&self, name: &str, body: S, classifier: C) -> Result<Saga, SpecError>
    where
        ToolLayer<C>: tower_layer::Layer<S, Service = ToolService<Value>>,
        S: tower_service::Service<Call, Response = Value> + Clone,
        C: Clone,
    {
        let bad = |field: &str, reason: String| Err(SpecError::new(Some(name), field, &reason));
        let Some(spec) = self.toolbox.sagas().get(name) else {
            return bad("sagas", String::from("the toolbox declares no such saga"));
        };
        if spec.steps.is_empty() {
            return bad("steps", String::from("a saga needs at least one step"));
        }
        let mut names = Vec::new();
        for step in &spec.steps {
            names.push(step.tool.as_str());
            names.extend(step.compensation.as_deref());
        }
        let mut store = None;
        for tool in &names {
            let Some(t) = self.tool(tool) else {
                return bad("steps", format!("`{tool}` is not a tool of the toolbox"));
            };
            let Some(receipt) = t.receipt.as_ref().filter(|_| t.key.is_some()) else {
                return bad(
                    "steps",
                    format!("`{tool}` needs receipts and a key: a resume must not repeat it"),
                );
            };
            store.get_or_insert_with(|| self.stores[&receipt.store].clone());
        }
        let mut stacks = BTreeMap::new();
        for tool in names {
            let layer = self.layer(tool)?.classifier(classifier.clone());
            stacks.insert(
                tool.to_owned(),
                tower_layer::Layer::layer(&layer, body.clone()),
            );
        }
        let Some(store) = store else {
            return bad("steps", String::from("a saga needs at least one step"));
        };
        Ok(Saga::new(
            name,
            spec.steps.clone(),
            ToolRouter::new(stacks),
            store,
        ))
    }

    /// The declaration this was built from.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// assert!(Toolbox::default().build(Stores::new())?.toolbox().tools().is_empty());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn toolbox(&self) -> &Toolbox {
        &self.toolbox
    }

    /// The tool declared as `name`.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// assert!(Toolbox::default().build(Stores::new())?.tool("x").is_none());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.toolbox.tools().iter().find(|t| t.name == name)
    }

    /// The budget named `name`.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// assert!(Toolbox::default().build(Stores::new())?.budget("x").is_none());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn budget(&self, name: &str) -> Option<&RetryBudget> {
        self.budgets.get(name)
    }

    /// The budget of every tool that names none.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// let tools = Toolbox::default().build(Stores::new())?;
    /// assert_eq!(tools.default_budget().balance(), 0.0); // nothing deposited yet
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn default_budget(&self) -> &RetryBudget {
        &self.default_budget
    }

    /// The breaker named `name`.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// assert!(Toolbox::default().build(Stores::new())?.breaker("x").is_none());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn breaker(&self, name: &str) -> Option<&Breaker> {
        self.breakers.get(name)
    }

    /// The receipt store named `name` (for the operator's loop: `pending`, `resolve`).
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// assert!(Toolbox::default().build(Stores::new())?.store("x").is_none());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn store(&self, name: &str) -> Option<&AnyStore> {
        self.stores.get(name)
    }
}
