//! [`ToolLayer`]: the stack a tool declaration builds, and [`ToolService`], what it makes.

use super::boxed::{BoxFuture, Boxed};
use super::call::Call;
use super::parts::{KeyPart, RetryOwner, UnknownOutcome};
use super::spec::Tool;
use super::toolbox::SpecError;
use crate::breaker::{Breaker, CircuitBreakerLayer};
use crate::budget::RetryBudget;
use crate::class::ClassPolicy;
use crate::classify::{Classify, DefaultClassifier, NeverClassifyEos};
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::key::{Action, KeyError, SetIdempotencyKeyLayer};
use crate::quota::KeyedQuotaLayer;
use crate::receipt::{AnyStore, Codec, DefaultCodec, ReceiptConfig, ReceiptGuardLayer};
use crate::retry::layer::Role;
use crate::retry::RetryLayer;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The stack of one declared tool, made by [`Tools::layer`](super::Tools::layer): put it over
/// the tool's body, a `Service<`[`Call`]`>`.
///
/// From the outside in: a [`Retry`](crate::retry::Retry) of the tool's class (with its deadline)
/// on its budget, retrying only if the tool's retry owner is `layer` (for `model`, `client` or
/// `none` it makes one attempt and hands a retryable failure up, still marked retryable); the
/// receipts, if the tool records them (the key made from the call as the tool's
/// [`KeyPart`]s say, stamped on the call), else the key alone, if it has one; its breaker; its
/// quota; the body. Every layer reads results with the one classifier given here, so the class
/// and the classifier cannot disagree, and the order is the documented one.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// use serde_json::{json, Value};
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::classify::OkIsSuccess;
/// use stormguard::tool::{Call, Stores, Toolbox};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let toolbox = Toolbox::from_json_str(r#"{
///     "stores": { "receipts": { "kind": "memory", "retention_secs": 604800 } },
///     "tools": [{
///         "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
///         "key": ["run", "tool", "id:invoice_id"],
///         "receipt": { "store": "receipts", "provider_key_window_secs": 86400 },
///         "unknown_outcome": "escalate"
///     }]
/// }"#)?;
/// let tools = toolbox.build(Stores::new())?;
///
/// let sent = Arc::new(AtomicU32::new(0));
/// let counter = sent.clone();
/// let body = service_fn(move |call: Call| {
///     counter.fetch_add(1, Ordering::SeqCst);
///     // The key the stack stamped, for the provider's Idempotency-Key header.
///     let key = call.key().expect("stamped").to_string();
///     async move { Ok::<Value, std::io::Error>(json!({ "sent": true, "key": key })) }
/// });
/// let mut send_invoice = tools.layer("send_invoice")?.classifier(OkIsSuccess).layer(body);
///
/// // The model sends the invoice at step 2, then reissues it at step 5: one invoice.
/// let first = send_invoice.ready().await?.call(Call::new("run-81f2", "step-2", json!({ "invoice_id": 4471 }))).await?;
/// let again = send_invoice.ready().await?.call(Call::new("run-81f2", "step-5", json!({ "invoice_id": 4471 }))).await?;
/// assert_eq!(first, again); // answered from the receipt
/// assert_eq!(sent.load(Ordering::SeqCst), 1);
/// # Ok(()) }
/// ```
pub struct ToolLayer<C = DefaultClassifier, Cd = DefaultCodec> {
    parts: Parts,
    classifier: C,
    codec: Cd,
}

/// What a declaration makes of its tool's stack, apart from the classifier and the codec.
#[derive(Clone)]
struct Parts {
    tool: Arc<Tool>,
    name: Arc<str>,
    policy: ClassPolicy,
    role: Role,
    budget: RetryBudget,
    breaker: Option<Breaker>,
    quota: Option<KeyedQuotaLayer<String, Call>>,
    /// The context entry the quota counts under (`None`: `global`, or no quota).
    quota_context: Option<String>,
    receipt: Option<(AnyStore, ReceiptConfig)>,
    key: Option<SpecKey>,
}

impl<C: Clone, Cd: Clone> Clone for ToolLayer<C, Cd> {
    fn clone(&self) -> Self {
        ToolLayer {
            parts: self.parts.clone(),
            classifier: self.classifier.clone(),
            codec: self.codec.clone(),
        }
    }
}

impl<C, Cd> fmt::Debug for ToolLayer<C, Cd> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolLayer")
            .field("tool", &self.parts.name)
            .field("policy", &self.parts.policy)
            .field("owns_retries", &(self.parts.role == Role::JoinsOrOpens))
            .field("breaker", &self.parts.breaker.as_ref().map(Breaker::name))
            .field("quota", &self.parts.quota.is_some())
            .field("receipts", &self.parts.receipt.is_some())
            .field("key", &self.parts.key.is_some())
            .finish()
    }
}

impl ToolLayer {
    pub(super) fn new(
        tool: Arc<Tool>,
        budget: RetryBudget,
        breaker: Option<Breaker>,
        quota: Option<KeyedQuotaLayer<String, Call>>,
        receipt: Option<(AnyStore, ReceiptConfig)>,
    ) -> Result<Self, SpecError> {
        let refuse =
            |field: &str, reason: &str| Err(SpecError::new(Some(&tool.name), field, reason));
        let role = match tool.retry.as_slice() {
            [RetryOwner::Layer] => Role::JoinsOrOpens,
            [_] => Role::HandsUp,
            _ => return refuse(
                "retry",
                "more than one retry owner: name one (the layer, the client, the model or none)",
            ),
        };
        if tool.hedge.is_some() {
            return refuse(
                "hedge",
                "a built stack has no hedge yet: leave it out of the tool and put a HedgeLayer above the stack",
            );
        }
        if matches!(tool.unknown_outcome, Some(UnknownOutcome::ReadBack { .. })) {
            return refuse(
                "unknown_outcome",
                "a built stack has no read-back yet: declare `escalate`, or build this tool's stack by hand with ReceiptGuardLayer::read_back",
            );
        }
        if receipt.is_some() && tool.key.is_none() {
            return refuse(
                "key",
                "a tool with receipts needs a key: name its parts (run, tool, id:FIELD)",
            );
        }
        let mut policy = ClassPolicy::builder(tool.class);
        if let Some(secs) = tool.deadline_secs {
            policy = policy.deadline(Duration::from_secs(secs));
        }
        let policy = policy
            .build()
            .map_err(|e| SpecError::new(Some(&tool.name), "deadline_secs", &e.to_string()))?;
        let name: Arc<str> = Arc::from(tool.name.as_str());
        let key = tool.key.as_ref().map(|parts| SpecKey {
            tool: name.clone(),
            parts: Arc::from(parts.as_slice()),
        });
        let quota_context = tool
            .quota
            .as_ref()
            .filter(|q| q.key != "global")
            .map(|q| q.key.clone());
        let parts = Parts {
            tool,
            name,
            policy,
            role,
            budget,
            breaker,
            quota,
            quota_context,
            receipt,
            key,
        };
        Ok(ToolLayer {
            parts,
            classifier: DefaultClassifier,
            codec: DefaultCodec,
        })
    }
}

impl<C, Cd> ToolLayer<C, Cd> {
    /// The classifier every layer of the stack reads results with (the default reads an answer
    /// by its type: for a body that answers JSON and fails with an `Err`, give
    /// [`OkIsSuccess`](crate::classify::OkIsSuccess)).
    pub fn classifier<C2>(self, classifier: C2) -> ToolLayer<C2, Cd> {
        ToolLayer {
            parts: self.parts,
            classifier,
            codec: self.codec,
        }
    }

    /// How a receipt stores the answer (the default: by its type, see
    /// [`Stored`](crate::receipt::Stored)).
    pub fn codec<Cd2>(self, codec: Cd2) -> ToolLayer<C, Cd2> {
        ToolLayer {
            parts: self.parts,
            classifier: self.classifier,
            codec,
        }
    }

    /// The declaration.
    ///
    /// ```
    /// use stormguard::tool::{Stores, Toolbox};
    /// let tools = Toolbox::from_json_str(r#"{"tools": [{"name": "search", "class": "read", "retry": ["layer"]}]}"#)?
    ///     .build(Stores::new())?;
    /// assert_eq!(tools.layer("search")?.tool().name, "search");
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn tool(&self) -> &Tool {
        &self.parts.tool
    }

    /// The budget its `Retry` draws on (shared with every tool that names it).
    pub fn budget(&self) -> &RetryBudget {
        &self.parts.budget
    }

    /// The policy its `Retry` applies: the tool's class, with its deadline.
    pub fn policy(&self) -> &ClassPolicy {
        &self.parts.policy
    }
}

impl<S, C, Cd> Layer<S> for ToolLayer<C, Cd>
where
    S: Service<Call> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    C: Classify<S::Response, BoxError, ClassifyEos = NeverClassifyEos>
        + Clone
        + Send
        + Sync
        + 'static,
    Cd: Codec<S::Response> + Clone + Send + Sync + 'static,
{
    type Service = ToolService<S::Response>;

    fn layer(&self, body: S) -> ToolService<S::Response> {
        let mut below: Boxed<Call, S::Response> = Boxed::new(body);
        if let Some(quota) = &self.parts.quota {
            below = Boxed::new(quota.layer(below));
        }
        if let Some(breaker) = &self.parts.breaker {
            let layer =
                CircuitBreakerLayer::new(breaker.clone()).classifier(self.classifier.clone());
            below = Boxed::new(layer.layer(below));
        }
        match (&self.parts.receipt, &self.parts.key) {
            (Some((store, config)), Some(key)) => {
                let layer =
                    ReceiptGuardLayer::new(store.clone(), self.parts.policy.class(), key.clone())
                        .config(*config)
                        .classifier(self.classifier.clone())
                        .codec(self.codec.clone());
                below = Boxed::new(layer.layer(below));
            }
            (None, Some(key)) => {
                below = Boxed::new(SetIdempotencyKeyLayer::new(key.clone()).layer(below));
            }
            _ => {}
        }
        let retry = RetryLayer::new(self.parts.policy, self.parts.budget.clone())
            .name(self.parts.name.to_string())
            .classifier(self.classifier.clone())
            .role(self.parts.role);
        ToolService {
            inner: Boxed::new(retry.layer(below)),
            name: self.parts.name.clone(),
            quota_context: self.parts.quota_context.clone(),
        }
    }
}

/// A declared tool's stack over its body: a `Service<`[`Call`]`>` whose errors are
/// [`ToolError`]s. Made by a [`ToolLayer`].
pub struct ToolService<Res> {
    inner: Boxed<Call, Res, ToolError>,
    name: Arc<str>,
    quota_context: Option<String>,
}

impl<Res> Clone for ToolService<Res> {
    fn clone(&self) -> Self {
        ToolService {
            inner: self.inner.clone(),
            name: self.name.clone(),
            quota_context: self.quota_context.clone(),
        }
    }
}

impl<Res> fmt::Debug for ToolService<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolService")
            .field("tool", &self.name)
            .finish()
    }
}

impl<Res: Send + 'static> Service<Call> for ToolService<Res> {
    type Response = Res;
    type Error = ToolError;
    type Future = BoxFuture<Res, ToolError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: Call) -> Self::Future {
        if let Some(to) = call.tool().filter(|to| *to != &*self.name) {
            // Its key and class would be this tool's: refused, never sent as this tool.
            let err = ToolError::new(ErrorCode::InvalidArgument)
                .with_retryable(false)
                .with_hint(format!(
                    "a call addressed to `{to}` reached the stack of `{}`",
                    self.name
                ));
            return Box::pin(std::future::ready(Err(err)));
        }
        call.set_tool(&self.name);
        if let Some(entry) = &self.quota_context {
            if call.get(entry).is_none() {
                // Counted under no one's quota would be a silent default: refused instead.
                let err = ToolError::new(ErrorCode::InvalidArgument)
                    .with_retryable(false)
                    .with_hint(format!(
                        "the tool's quota is counted per `{entry}`: give it with Call::with(\"{entry}\", ..)"
                    ));
                return Box::pin(std::future::ready(Err(err)));
            }
        }
        self.inner.call(call)
    }
}

/// The idempotency key a declaration says: the run and the step if its parts name them (`-`
/// where they do not), the tool's name always, and the named argument fields (a key of the
/// run and the tool alone covers no argument; its fingerprint covers them all).
#[derive(Clone, Debug)]
pub(super) struct SpecKey {
    tool: Arc<str>,
    parts: Arc<[KeyPart]>,
}

impl SpecKey {
    /// The action `call` stands for.
    pub(super) fn action(&self, call: &Call) -> Result<Action, KeyError> {
        let has = |p: &KeyPart| self.parts.contains(p);
        let run = if has(&KeyPart::Run) { call.run() } else { "-" };
        let step = if has(&KeyPart::Step) {
            call.step()
        } else {
            "-"
        };
        let fields: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                KeyPart::Id(f) | KeyPart::Text(f) => Some(f.as_str()),
                _ => None,
            })
            .collect();
        // An identifier that is `null` identifies nothing: two actions without one would share
        // a key (and the second be answered with the first's receipt).
        let null = |f: &&str| call.args().get(*f).is_some_and(serde_json::Value::is_null);
        if fields.iter().any(null) {
            return Err(KeyError::new(
                "args",
                "an identity field the key covers is null: give the identifier",
            ));
        }
        if fields.is_empty() {
            Action::of_identity(run, step, &self.tool, call.args())
        } else {
            Action::task(run, step, &self.tool, call.args(), &fields, &fields)
        }
    }
}

impl crate::key::MakeIdempotencyKey<Call> for SpecKey {
    fn make_key(&self, call: &Call) -> Result<Action, KeyError> {
        self.action(call)
    }
}
