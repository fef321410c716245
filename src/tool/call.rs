//! [`Call`]: one call of a tool, with the identity its key is made from.

use crate::key::{IdempotencyKey, KeyStamp};
use crate::operation::Operation;
use serde_json::Value;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One call of a tool: the agent run and step it belongs to, and the model's arguments.
///
/// It is the request of a stack built from a [`Tool`](super::Tool) (see
/// [`Tools::layer`](super::Tools::layer)): the run and the step reach the key from each call,
/// so one stack, built once, serves every run. Which of them the key includes is the tool's to
/// say ([`KeyPart`](super::KeyPart)). Below the stack, the tool's body reads the
/// [`args`](Self::args) and sends the [`key`](Self::key) the stack stamped (as the provider's
/// `Idempotency-Key`, say). The call also carries the logical operation, so a `Buffer` between
/// the stack and the body keeps it, and [`Call::scope`] lends it to a future the body spawns.
/// It does not cross into another request type: a client layer behind a `Buffer` of
/// `reqwest::Request`s (which cannot carry it) loses it; declare such a layer
/// [`nested`](crate::retry::RetryLayer::nested).
///
/// ```
/// use serde_json::json;
/// use stormguard::tool::Call;
///
/// let call = Call::new("run-81f2", "step-2", json!({ "invoice_id": 4471 }));
/// assert_eq!(call.run(), "run-81f2");
/// assert_eq!(call.args()["invoice_id"], 4471);
/// assert!(call.key().is_none()); // stamped by the stack
/// ```
#[derive(Clone)]
pub struct Call {
    // Shared: a retry's copy of the call, and the held-calls book's, cost a count each.
    run: Arc<str>,
    step: Arc<str>,
    /// Shared: a retry's clone and the held-calls book's copy cost a count, not a deep copy.
    args: Arc<Value>,
    /// What the caller knows beyond the model's arguments (a tenant, a user), by name.
    context: Option<Arc<Vec<(String, String)>>>,
    /// The tool, once its stack has seen the call.
    tool: Option<Arc<str>>,
    key: Option<IdempotencyKey>,
    /// Set when the body reads the stamped key ([`Call::key`]): a keyed write whose body never
    /// read it cannot have sent it (one flag per stamping, shared by the attempt's clones).
    key_read: Option<Arc<AtomicBool>>,
    operation: Option<Operation>,
}

/// What makes two calls the same call (with the tool): the run, the arguments, the caller's
/// context; shared, not copied.
pub(super) type Sameness = (Arc<str>, Arc<Value>, Option<Arc<Vec<(String, String)>>>);

impl Call {
    /// A call at `step` of agent run `run`, with the model's `args`.
    ///
    /// ```
    /// let call = stormguard::tool::Call::new("run-1", "step-3", serde_json::json!({}));
    /// assert_eq!(call.step(), "step-3");
    /// ```
    pub fn new(run: impl Into<String>, step: impl Into<String>, args: Value) -> Self {
        Call {
            run: Arc::from(run.into()),
            step: Arc::from(step.into()),
            args: Arc::new(args),
            context: None,
            tool: None,
            key: None,
            key_read: None,
            operation: None,
        }
    }

    /// Adds what the caller knows beyond the model's arguments, by name: a quota counted per
    /// tenant reads `tenant` here (see [`QuotaUse`](super::QuotaUse)).
    ///
    /// ```
    /// let call = stormguard::tool::Call::new("r", "s", serde_json::json!({})).with("tenant", "acme");
    /// assert_eq!(call.get("tenant"), Some("acme"));
    /// assert_eq!(call.get("user"), None);
    /// ```
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        let context = Arc::make_mut(self.context.get_or_insert_with(Default::default));
        context.retain(|(n, _)| *n != name);
        context.push((name, value.into()));
        self
    }

    /// A value of the caller's context, by name (see [`with`](Self::with)).
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Call::new("r", "s", serde_json::json!({})).get("tenant"), None);
    /// ```
    pub fn get(&self, name: &str) -> Option<&str> {
        self.context
            .iter()
            .flat_map(|c| c.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Addresses the call to the tool `name`: a [`ToolRouter`](super::ToolRouter) sends it to
    /// that tool's stack, and another tool's stack refuses it.
    ///
    /// ```
    /// let call = stormguard::tool::Call::new("r", "s", serde_json::json!({})).to("search");
    /// assert_eq!(call.tool(), Some("search"));
    /// ```
    pub fn to(mut self, name: &str) -> Self {
        self.tool = Some(Arc::from(name));
        self
    }

    /// The tool the call is addressed to, or whose stack has seen it (`None` before).
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Call::new("r", "s", serde_json::json!({})).tool(), None);
    /// ```
    pub fn tool(&self) -> Option<&str> {
        self.tool.as_deref()
    }

    pub(super) fn set_tool(&mut self, tool: &Arc<str>) {
        self.tool = Some(tool.clone());
    }

    /// What makes two calls the same call for the held-calls book: the run, the arguments and
    /// the caller's context (not the step: a reissue comes at a later step).
    pub(super) fn sameness(&self) -> Sameness {
        (self.run.clone(), self.args.clone(), self.context.clone())
    }

    /// The agent run.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Call::new("r", "s", serde_json::json!(null)).run(), "r");
    /// ```
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The step within the run.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Call::new("r", "s", serde_json::json!(null)).step(), "s");
    /// ```
    pub fn step(&self) -> &str {
        &self.step
    }

    /// The arguments, shared (a clone of the call shares them: see `above`).
    pub(super) fn args_shared(&self) -> &Arc<Value> {
        &self.args
    }

    /// The step, shared (for the held-calls book).
    pub(super) fn step_shared(&self) -> Arc<str> {
        self.step.clone()
    }

    /// The model's arguments.
    ///
    /// ```
    /// let call = stormguard::tool::Call::new("r", "s", serde_json::json!({"q": "storm"}));
    /// assert_eq!(call.args()["q"], "storm");
    /// ```
    pub fn args(&self) -> &Value {
        &self.args
    }

    /// The idempotency key the stack stamped (a tool with a receipt or a key), if any.
    ///
    /// ```
    /// use stormguard::key::{IdempotencyKey, KeyStamp};
    /// let mut call = stormguard::tool::Call::new("r", "s", serde_json::json!(1));
    /// call.stamp_key(&IdempotencyKey::parse("k-1").unwrap());
    /// assert_eq!(call.key().map(|k| k.as_str()), Some("k-1"));
    /// ```
    ///
    /// Reading it is how the stack knows the key can reach the provider: a keyed write whose
    /// body never reads it is decided as one without its key (see
    /// [`ToolLayer`](super::ToolLayer)).
    pub fn key(&self) -> Option<&IdempotencyKey> {
        if let Some(read) = &self.key_read {
            read.store(true, Ordering::Relaxed);
        }
        self.key.as_ref()
    }

    /// The flag [`key`](Self::key) sets, for the attempt under way.
    pub(crate) fn key_read(&self) -> Option<Arc<AtomicBool>> {
        self.key_read.clone()
    }

    /// The logical operation the call belongs to, once a stormguard `Retry` has seen it.
    ///
    /// ```
    /// assert!(stormguard::tool::Call::new("r", "s", serde_json::json!(1)).operation().is_none());
    /// ```
    pub fn operation(&self) -> Option<&Operation> {
        self.operation.as_ref()
    }

    /// Lends the call's operation to `future` (one you `tokio::spawn` in the tool's body), so
    /// that stormguard layers inside it join the operation.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let call = stormguard::tool::Call::new("r", "s", serde_json::json!(1));
    /// // No operation yet: the future runs as it is.
    /// assert_eq!(tokio::spawn(call.scope(async { 2 })).await.unwrap(), 2);
    /// # }
    /// ```
    pub fn scope<F: std::future::Future>(&self, future: F) -> crate::operation::Scoped<F> {
        crate::operation::Scoped::new(future, self.operation.clone())
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The arguments may hold what the model was told in confidence: not printed.
        f.debug_struct("Call")
            .field("run", &self.run)
            .field("step", &self.step)
            .field("tool", &self.tool)
            .field("key", &self.key.as_ref().map(IdempotencyKey::as_str))
            .field("carries_operation", &self.operation.is_some())
            .finish()
    }
}

impl crate::retry::Request for Call {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn carries_key(&self) -> bool {
        self.key.is_some()
    }

    fn operation(&self) -> Option<Operation> {
        self.operation.clone()
    }

    fn can_carry() -> bool {
        true
    }

    fn attach(&mut self, operation: &Operation) {
        self.operation = Some(operation.clone());
    }
}

impl KeyStamp for Call {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_ref().map(IdempotencyKey::as_str)
    }

    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.clone());
        self.key_read = Some(Arc::new(AtomicBool::new(false)));
    }

    fn operation(&self) -> Option<Operation> {
        self.operation.clone()
    }
}
