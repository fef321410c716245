//! [`Tools`]: a toolbox made live, and what it builds by name: a tool's stack, a router over
//! every tool, a saga.

use super::call::Call;
use super::held::{Book, HeldCall, HeldResolution};
use super::parts::UnknownOutcome;
use super::router::ToolRouter;
use super::service::ToolService;
use super::spec::Tool;
use super::stack::{Shared, ToolLayer};
use super::toolbox::{SpecError, Toolbox};
use crate::breaker::Breaker;
use crate::budget::RetryBudget;
use crate::classify::DefaultClassifier;
use crate::quota::KeyedQuotaLayer;
use crate::receipt::{AnyStore, DefaultCodec, NoReadBack, ReceiptConfig};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// A toolbox made live: one [`RetryBudget`], [`Breaker`], quota and receipt store per name,
/// shared by every tool that names it, and the stack of each tool
/// ([`layer`](Self::layer)). Made by [`Toolbox::build`].
///
/// A tool that names no budget draws on its dependency's own: the tools that name the same
/// `dependency` share one, and a tool that names none has one of its own. Unrelated
/// dependencies never share a budget by default, so a model API's outage cannot spend the
/// retries of the orders API.
///
/// ```
/// use stormguard::tool::{Stores, Toolbox};
///
/// let toolbox = Toolbox::from_json_str(r#"{
///     "budgets": { "billing": { "ratio": 0.1, "min_per_sec": 1 } },
///     "tools": [
///         { "name": "search", "class": "read", "retry": ["layer"], "dependency": "orders-api" },
///         { "name": "status", "class": "read", "retry": ["layer"], "dependency": "orders-api" },
///         { "name": "chat", "class": "read", "retry": ["layer"] },
///         { "name": "lookup", "class": "read", "retry": ["layer"], "budget": "billing" }
///     ]
/// }"#)?;
/// let tools = toolbox.build(Stores::new())?;
/// assert!(tools.budget("billing").is_some());
/// // `search` and `status` share the orders API's budget: what one deposits, the other holds.
/// tools.layer("search")?.budget().deposit();
/// assert!(tools.budget_of("status").unwrap().balance() > 0.0);
/// assert_eq!(tools.budget_of("status").unwrap().name(), Some("orders-api"));
/// // `chat` names no dependency: its budget is its own.
/// assert_eq!(tools.budget_of("chat").unwrap().balance(), 0.0);
/// assert_eq!(tools.budget_of("chat").unwrap().name(), Some("chat"));
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
#[derive(Clone)]
pub struct Tools {
    pub(super) toolbox: Toolbox,
    pub(super) budgets: BTreeMap<String, RetryBudget>,
    /// The budget of each dependency whose tools name no budget (`(true, dependency)`), and of
    /// each tool naming neither (`(false, tool)`): a dependency and a tool of one name never
    /// share.
    pub(super) own_budgets: BTreeMap<(bool, String), RetryBudget>,
    /// The budget given to every tool that names none ([`Tools::with_default_budget`]).
    pub(super) default_budget: Option<RetryBudget>,
    pub(super) breakers: BTreeMap<String, Breaker>,
    pub(super) quotas: BTreeMap<String, KeyedQuotaLayer<String, Call>>,
    pub(super) stores: BTreeMap<String, AnyStore>,
    /// The calls held because their outcome is unknown (tools without receipts).
    pub(super) held: Book,
    /// Per tool declared `read` (without `trust_class`): whether it has answered `201 Created`,
    /// shared by every stack made for it, so a layer made per call keeps what an earlier saw.
    pub(super) creates: BTreeMap<String, Arc<AtomicBool>>,
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

impl Tools {
    /// The stack of the tool `name`, to put over its body (a `Service<Call>`): its `Retry` as
    /// its class and retry owner say (with its attempts, backoff and deadline), then its
    /// receipts (or its key alone), its hedge, its breaker and its quota, in the documented
    /// order, with one classifier for every layer. A tool the toolbox does not hold, more than
    /// one retry owner, or a tool that reads back (give its read-back with
    /// [`layer_reading_back`](Self::layer_reading_back)) is a [`SpecError`].
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// let tools = Toolbox::default().build(Stores::new())?;
    /// assert_eq!(tools.layer("nope").unwrap_err().field(), "name");
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn layer(&self, name: &str) -> Result<ToolLayer, SpecError> {
        let (tool, shared) = self.shared(name)?;
        if matches!(tool.unknown_outcome, Some(UnknownOutcome::ReadBack { .. })) {
            return Err(SpecError::new(
                Some(name),
                "unknown_outcome",
                "the tool reads back an unknown outcome: give its read-back with Tools::layer_reading_back(name, read_back)",
            ));
        }
        ToolLayer::new(tool, shared, NoReadBack)
    }

    /// The stack of the tool `name` that declares `unknown_outcome = { read_back = { attempts,
    /// within_secs } }`, with the [`ReadBack`](crate::receipt::ReadBack) that looks for a
    /// call's effect at the provider.
    /// After a crash left a call's outcome unknown (its lease passed with no outcome recorded),
    /// the receipt layer asks it, up to `attempts` times within `within_secs` (a read that
    /// cannot tell is made again; past the bound the call is escalated `outcome_unknown`):
    /// found, its answer becomes the receipt and nothing is sent; absent, the call is sent. It
    /// must read consistently (a miss must mean "not done"). A tool that declares no read-back,
    /// or has no receipts, is a [`SpecError`].
    ///
    /// ```
    /// use serde_json::{json, Value};
    /// use stormguard::receipt::{ReadBack, ReadBackResult};
    /// use stormguard::tool::{Call, Stores, Toolbox};
    ///
    /// /// The provider's sent log: consistent, keyed by ticket.
    /// #[derive(Clone)]
    /// struct SentLog;
    /// impl ReadBack<Call, Value> for SentLog {
    ///     async fn read_back(&self, call: &Call) -> ReadBackResult<Value> {
    ///         match call.args()["ticket"].as_u64() {
    ///             Some(7) => ReadBackResult::Found(json!({ "posted": 7 })),
    ///             _ => ReadBackResult::Absent,
    ///         }
    ///     }
    /// }
    ///
    /// let tools = Toolbox::from_json_str(r#"{
    ///     "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
    ///     "tools": [{
    ///         "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
    ///         "key": ["run", "tool", "id:ticket"], "receipt": { "store": "receipts" },
    ///         "unknown_outcome": { "read_back": { "attempts": 3, "within_secs": 10 } }
    ///     }]
    /// }"#)?.build(Stores::new())?;
    /// assert_eq!(tools.layer("post_ticket").unwrap_err().field(), "unknown_outcome");
    /// let layer = tools.layer_reading_back("post_ticket", SentLog)?;
    /// # let _ = layer;
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn layer_reading_back<RB>(
        &self,
        name: &str,
        read_back: RB,
    ) -> Result<ToolLayer<DefaultClassifier, DefaultCodec, RB>, SpecError> {
        let (tool, shared) = self.shared(name)?;
        if !matches!(tool.unknown_outcome, Some(UnknownOutcome::ReadBack { .. })) {
            return Err(SpecError::new(
                Some(name),
                "unknown_outcome",
                "the tool declares no read-back: declare `unknown_outcome = { read_back = { attempts, within_secs } }`, or build it with Tools::layer",
            ));
        }
        ToolLayer::new(tool, shared, read_back)
    }

    /// The tool `name` and the shared parts it names.
    fn shared(&self, name: &str) -> Result<(Arc<Tool>, Shared), SpecError> {
        let tool = self
            .toolbox
            .tools()
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| SpecError::new(Some(name), "name", "the toolbox holds no such tool"))?;
        // Every name was checked when the toolbox was; a miss here is refused, never a panic.
        let unknown = |field: &str| {
            SpecError::new(
                Some(name),
                field,
                "names a part the toolbox was not built with",
            )
        };
        let budget = match &tool.budget {
            Some(b) => self
                .budgets
                .get(b)
                .ok_or_else(|| unknown("budget"))?
                .clone(),
            None => self
                .unnamed_budget(tool)
                .ok_or_else(|| unknown("budget"))?
                .clone(),
        };
        let breaker = match &tool.breaker {
            Some(b) => Some(
                self.breakers
                    .get(b)
                    .ok_or_else(|| unknown("breaker"))?
                    .clone(),
            ),
            None => None,
        };
        let quota = match &tool.quota {
            Some(q) => Some(
                self.quotas
                    .get(&q.name)
                    .ok_or_else(|| unknown("quota"))?
                    .clone(),
            ),
            None => None,
        };
        let receipt = match &tool.receipt {
            Some(r) => {
                let spec = self
                    .toolbox
                    .stores()
                    .get(&r.store)
                    .ok_or_else(|| unknown("receipt.store"))?;
                let store = self
                    .stores
                    .get(&r.store)
                    .ok_or_else(|| unknown("receipt.store"))?;
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
                Some((store.clone(), config))
            }
            None => None,
        };
        let hedge = match &tool.hedge {
            Some(h) => Some(
                *self
                    .toolbox
                    .hedges()
                    .get(h)
                    .ok_or_else(|| unknown("hedge"))?,
            ),
            None => None,
        };
        let shared = Shared {
            budget,
            breaker,
            quota,
            receipt,
            hedge,
            held: self.held.clone(),
            creates: self.creates.get(name).cloned(),
        };
        Ok((Arc::new(tool.clone()), shared))
    }

    /// Every tool's stack over one `body`, each with `classifier`: a call goes through the stack
    /// of the tool it is addressed to ([`Call::to`]). See [`ToolRouter`]. The first tool whose
    /// stack cannot be built is a [`SpecError`] (a tool that reads back among them: its
    /// read-back is its own, give it with [`layer_reading_back`](Self::layer_reading_back) and
    /// route to it yourself). Every stack reads answers at their head (the classifier's
    /// end-of-stream type is `NeverClassifyEos`): a breaker that must count a stream breaking
    /// after its first frame (`StreamClassifier`) is built by hand, see `docs/model-apis.md`.
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

    /// The budget the stack of the tool `name` draws on: the one it names, or its dependency's
    /// own (see [`Tools`]); `None` for a tool the toolbox does not hold.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// let tools = Toolbox::from_json_str(r#"{"tools": [{"name": "search", "class": "read", "retry": ["layer"], "dependency": "orders-api"}]}"#)?
    ///     .build(Stores::new())?;
    /// assert_eq!(tools.budget_of("search").unwrap().name(), Some("orders-api"));
    /// assert_eq!(tools.budget_of("search").unwrap().balance(), 0.0); // nothing deposited yet
    /// assert!(tools.budget_of("nope").is_none());
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn budget_of(&self, name: &str) -> Option<&RetryBudget> {
        let tool = self.tool(name)?;
        match &tool.budget {
            Some(b) => self.budgets.get(b),
            None => self.unnamed_budget(tool),
        }
    }

    /// The budget of a tool that names none.
    fn unnamed_budget(&self, tool: &Tool) -> Option<&RetryBudget> {
        match &self.default_budget {
            Some(budget) => Some(budget),
            None => {
                let (dependency, name) = tool.budget_owner();
                self.own_budgets.get(&(dependency, name.to_owned()))
            }
        }
    }

    /// The same tools with `budget` as the budget of every tool that names none (instead of
    /// its dependency's own, so these tools share it whatever they call): one the agent's
    /// other layers already draw on, a run's handle ([`RetryBudget::for_run`]) for the stacks
    /// of that run, or a seeded one for a simulation that must repeat exactly. Stacks built before keep the budget they had.
    ///
    /// ```
    /// use stormguard::budget::{RetryBudget, RunLimits};
    /// use stormguard::tool::{Stores, Toolbox};
    ///
    /// let shared = RetryBudget::default();
    /// let tools = Toolbox::from_json_str(r#"{"tools": [{"name": "search", "class": "read", "retry": ["layer"]}]}"#)?
    ///     .build(Stores::new())?;
    /// // This run's stacks spend this run's share of the shared budget.
    /// let run = tools.clone().with_default_budget(shared.for_run(RunLimits::default()));
    /// run.layer("search")?.budget().deposit();
    /// assert!(shared.balance() > 0.0);
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn with_default_budget(mut self, budget: RetryBudget) -> Self {
        self.default_budget = Some(budget);
        self
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

    /// The calls held because their outcome is unknown, oldest first: the calls of tools
    /// without receipts that ended `outcome_unknown` (or were dropped in flight) and that the
    /// stacks of these tools answer `outcome_unknown` again, not sent, when the same call (the
    /// same tool, run, context and arguments, at any step) comes back. The operator's loop
    /// checks each at the provider and says what it found with
    /// [`resolve_held`](Self::resolve_held). The book is in memory, shared by the clones of
    /// these `Tools`; a tool whose run may resume after a crash records its calls in a receipt
    /// store instead (the audit's `write-without-receipt`).
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
    /// use serde_json::{json, Value};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::classify::OkIsSuccess;
    /// use stormguard::error::ErrorCode;
    /// use stormguard::tool::{Call, HeldResolution, Stores, Toolbox};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let tools = Toolbox::from_json_str(r#"{"tools": [{
    ///     "name": "post_ticket", "class": "unkeyed_write", "retry": ["model"],
    ///     "unknown_outcome": "escalate"
    /// }]}"#)?.build(Stores::new())?;
    /// let sent = Arc::new(AtomicU32::new(0));
    /// let counter = sent.clone();
    /// // The provider creates the ticket, then the connection resets: did it?
    /// let body = service_fn(move |_: Call| {
    ///     let n = counter.fetch_add(1, Ordering::SeqCst);
    ///     async move {
    ///         match n {
    ///             0 => Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
    ///             _ => Ok::<Value, std::io::Error>(json!({ "ticket": "T-2" })),
    ///         }
    ///     }
    /// });
    /// let mut post = tools.layer("post_ticket")?.classifier(OkIsSuccess).layer(body);
    /// let ticket = json!({ "subject": "refund 4471" });
    /// let first = post.ready().await?.call(Call::new("run-9", "step-2", ticket.clone())).await;
    /// assert_eq!(first.unwrap_err().code(), ErrorCode::OutcomeUnknown);
    ///
    /// // The model reissues it anyway, at its next step: answered, not sent.
    /// let again = post.ready().await?.call(Call::new("run-9", "step-3", ticket.clone())).await;
    /// assert_eq!(again.unwrap_err().code(), ErrorCode::OutcomeUnknown);
    /// assert_eq!(sent.load(Ordering::SeqCst), 1);
    ///
    /// // The operator finds no ticket at the provider: the next call is sent.
    /// let held = tools.held();
    /// assert_eq!((held.len(), held[0].step.as_str()), (1, "step-2"));
    /// assert!(tools.resolve_held(&held[0].id, HeldResolution::NotDone));
    /// let last = post.ready().await?.call(Call::new("run-9", "step-4", ticket)).await?;
    /// assert_eq!(last["ticket"], "T-2");
    /// assert_eq!(sent.load(Ordering::SeqCst), 2);
    /// # Ok(()) }
    /// ```
    pub fn held(&self) -> Vec<HeldCall> {
        self.held.list()
    }

    /// The operator's word on the held call `id` (from [`held`](Self::held)):
    /// [`HeldResolution::NotDone`] forgets it, so the next same call is sent;
    /// [`HeldResolution::Done`] keeps it, so the same call in its run is answered `conflict`
    /// ("it took effect"), never sent. `false` if no call `id` is held.
    ///
    /// ```
    /// use stormguard::tool::{HeldResolution, Stores, Toolbox};
    /// let tools = Toolbox::default().build(Stores::new())?;
    /// assert!(!tools.resolve_held("post_ticket:run-9:00", HeldResolution::Done));
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn resolve_held(&self, id: &str, resolution: HeldResolution) -> bool {
        self.held.resolve(id, resolution)
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
