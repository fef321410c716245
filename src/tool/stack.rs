//! [`ToolLayer`]: the stack a tool declaration builds, and [`ToolService`], what it makes.

use super::boxed::Boxed;
use super::call::Call;
use super::either::Either::{With, Without};
use super::held::Book;
use super::key_watch::KeyWatch;
use super::parts::{KeyPart, RetryOwner, UnknownOutcome};
use super::read_back::Bounded;
use super::service::{Held, ToolService};
use super::spec::Tool;
use super::spec_key::SpecKey;
use super::toolbox::{HedgeSpec, SpecError};
use crate::backoff::Backoff;
use crate::breaker::{Breaker, CircuitBreakerLayer};
use crate::budget::RetryBudget;
use crate::class::{ClassPolicy, Evidence};
use crate::classify::{AnswerStatus, Classify, DefaultClassifier, NeverClassifyEos};
use crate::error::BoxError;
use crate::hedge::HedgeLayer;
use crate::key::SetIdempotencyKeyLayer;
use crate::quota::KeyedQuotaLayer;
use crate::receipt::{
    AnyStore, Codec, Consistency, DefaultCodec, NoReadBack, ReadBack, ReceiptConfig,
    ReceiptGuardLayer,
};
use crate::retry::layer::Role;
use crate::retry::RetryLayer;
use std::fmt;
use std::sync::Arc;
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
pub struct ToolLayer<C = DefaultClassifier, Cd = DefaultCodec, RB = NoReadBack> {
    parts: Parts,
    classifier: C,
    codec: Cd,
    /// The tool's hedge, reading answers with `classifier`.
    hedge: Option<HedgeLayer<C>>,
    /// The user's read-back (see [`Tools::layer_reading_back`](super::Tools::layer_reading_back)).
    read_back: RB,
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
    /// The declared read-back's bounds: attempts and the time they may take.
    read_back: Option<(u32, Duration)>,
    /// The held-calls book, for a tool without receipts.
    held: Option<Held>,
    /// Whether this read has answered `201 Created` (the tool's, shared by its stacks).
    creates: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl<C: Clone, Cd: Clone, RB: Clone> Clone for ToolLayer<C, Cd, RB> {
    fn clone(&self) -> Self {
        ToolLayer {
            parts: self.parts.clone(),
            classifier: self.classifier.clone(),
            codec: self.codec.clone(),
            hedge: self.hedge.clone(),
            read_back: self.read_back.clone(),
        }
    }
}

impl<C, Cd, RB> fmt::Debug for ToolLayer<C, Cd, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolLayer")
            .field("tool", &self.parts.name)
            .field("policy", &self.parts.policy)
            .field("owns_retries", &(self.parts.role == Role::JoinsOrOpens))
            .field("breaker", &self.parts.breaker.as_ref().map(Breaker::name))
            .field("quota", &self.parts.quota.is_some())
            .field("hedge", &self.hedge.is_some())
            .field("read_back", &self.parts.read_back.is_some())
            .field("receipts", &self.parts.receipt.is_some())
            .field("key", &self.parts.key.is_some())
            .finish()
    }
}

/// The shared parts [`Tools`](super::Tools) found for a tool, by name.
pub(super) struct Shared {
    pub(super) budget: RetryBudget,
    pub(super) breaker: Option<Breaker>,
    pub(super) quota: Option<KeyedQuotaLayer<String, Call>>,
    pub(super) receipt: Option<(AnyStore, ReceiptConfig)>,
    pub(super) hedge: Option<HedgeSpec>,
    pub(super) held: Book,
    /// Whether the tool (a read) has answered `201 Created`, shared by its stacks.
    pub(super) creates: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl<RB> ToolLayer<DefaultClassifier, DefaultCodec, RB> {
    /// The stack `tool` declares over `shared`; `read_back` is the user's when the tool reads
    /// back (and [`NoReadBack`] when it does not: [`Tools`](super::Tools) checks which).
    pub(super) fn new(tool: Arc<Tool>, shared: Shared, read_back: RB) -> Result<Self, SpecError> {
        let Shared {
            budget,
            breaker,
            quota,
            receipt,
            hedge,
            held,
            creates,
        } = shared;
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
        let bounds = match tool.unknown_outcome {
            Some(UnknownOutcome::ReadBack {
                attempts,
                within_secs,
            }) => {
                if receipt.is_none() {
                    return refuse(
                        "unknown_outcome",
                        "a read-back runs in the receipt layer: give the tool receipts",
                    );
                }
                Some((attempts, Duration::from_secs(within_secs)))
            }
            _ => None,
        };
        if receipt.is_some() && tool.key.is_none() {
            return refuse(
                "key",
                "a tool with receipts needs a key: name its parts (run, tool, id:FIELD)",
            );
        }
        let policy = policy_of(&tool)?;
        let hedge = match hedge {
            Some(spec) => Some(hedge_of(&tool.name, &spec, &budget)?),
            None => None,
        };
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
        // Without receipts nothing records a write's calls: the book holds the ones whose outcome
        // is unknown, and a write it can see (its class, its name) while in flight too.
        let held = match receipt {
            Some(_) => None,
            None => Some(Held {
                book: held,
                track: write_without_record(&tool),
            }),
        };
        let parts = Parts {
            held,
            creates,
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
            read_back: bounds,
        };
        Ok(ToolLayer {
            parts,
            classifier: DefaultClassifier,
            codec: DefaultCodec,
            hedge,
            read_back,
        })
    }
}

/// A tool that records receipts over a body whose answer its codec stores nothing of (a
/// `reqwest::Response`): the intent and the key still guard it, but a repeat after a success
/// is not answered from a receipt. Said when the stack is built.
#[cold]
fn answer_not_stored(tool: &str) {
    tracing::warn!(
        tool,
        "the tool records receipts, and its answer is not stored (a streamed answer such as a \
         reqwest::Response): a repeat after a success is resumed with the same key or escalated, \
         not answered from a receipt; answer what the body read (its JSON, an \
         http::Response<String>) to store it"
    );
}

/// A tool the book tracks while in flight: a write that no key deduplicates, by its class or,
/// unless the table trusts its class, by its name.
fn write_without_record(tool: &Tool) -> bool {
    use crate::class::ToolClass;
    match tool.class {
        ToolClass::UnkeyedWrite | ToolClass::MultiStep => true,
        ToolClass::KeyedWrite => tool.key.is_none(),
        ToolClass::Read | ToolClass::IdempotentWrite => {
            !tool.trust_class && tool_evidence(tool).is_some()
        }
    }
}

/// What the tool itself shows of its class: its name (a write verb), else its server's
/// annotations (`destructiveHint`).
fn tool_evidence(tool: &Tool) -> Option<Evidence> {
    Evidence::tool_name(&tool.name).or_else(|| {
        let a = tool.annotations?;
        Evidence::annotations(a.destructive_hint, a.idempotent_hint)
    })
}

/// The `Retry`'s policy: the tool's class with its deadline, attempts and backoff.
fn policy_of(tool: &Tool) -> Result<ClassPolicy, SpecError> {
    let bad =
        |field: &str, e: &dyn fmt::Display| SpecError::new(Some(&tool.name), field, &e.to_string());
    let mut policy = ClassPolicy::builder(tool.class);
    // A tool that declares no deadline still has one: nothing waits on a hung call unbounded.
    let secs = tool
        .deadline_secs
        .unwrap_or(super::spec::DEFAULT_DEADLINE_SECS);
    policy = policy.deadline(Duration::from_secs(secs));
    if let Some(n) = tool.max_attempts {
        policy = policy.max_attempts(n);
    }
    if let Some(b) = tool.backoff {
        let base = Duration::from_millis(b.base_ms);
        let mut backoff = Backoff::exponential(base);
        match b.cap_ms {
            Some(cap) => backoff = backoff.cap(Duration::from_millis(cap)),
            // The default cap, or the base if that is longer.
            None => backoff = backoff.cap(base.max(Duration::from_secs(10))),
        }
        policy = policy.backoff(backoff.build().map_err(|e| bad("backoff", &e))?);
    }
    policy.build().map_err(|e| bad(e.field(), &e))
}

/// The tool's hedge on its budget, as its spec says.
fn hedge_of(tool: &str, spec: &HedgeSpec, budget: &RetryBudget) -> Result<HedgeLayer, SpecError> {
    let builder = match spec.delay_ms {
        Some(ms) => HedgeLayer::fixed(budget.clone(), Duration::from_millis(ms)),
        None => HedgeLayer::percentile(
            budget.clone(),
            spec.percentile.unwrap_or(0.95),
            spec.min_samples.unwrap_or(20),
        ),
    };
    builder
        .name(format!("{tool}-hedge"))
        .build()
        .map_err(|e| SpecError::new(Some(tool), "hedge", &e.to_string()))
}

impl<C, Cd, RB> ToolLayer<C, Cd, RB> {
    /// The classifier every layer of the stack reads results with (the default reads an answer
    /// by its type: for a body that answers JSON and fails with an `Err`, give
    /// [`OkIsSuccess`](crate::classify::OkIsSuccess)).
    pub fn classifier<C2: Clone>(self, classifier: C2) -> ToolLayer<C2, Cd, RB> {
        ToolLayer {
            parts: self.parts,
            hedge: self.hedge.map(|h| h.with_classifier(classifier.clone())),
            classifier,
            codec: self.codec,
            read_back: self.read_back,
        }
    }

    /// How a receipt stores the answer (the default: by its type, see
    /// [`Stored`](crate::receipt::Stored)).
    pub fn codec<Cd2>(self, codec: Cd2) -> ToolLayer<C, Cd2, RB> {
        ToolLayer {
            parts: self.parts,
            classifier: self.classifier,
            codec,
            hedge: self.hedge,
            read_back: self.read_back,
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

impl<S, C, Cd, RB> Layer<S> for ToolLayer<C, Cd, RB>
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
    RB: ReadBack<Call, S::Response>,
{
    type Service = ToolService<S::Response>;

    fn layer(&self, body: S) -> ToolService<S::Response> {
        // Every layer reads a JSON answer's own status before the classifier given: a body
        // that folds a 503 into `{"status": 503}` under `OkIsSuccess` is a 503, not a receipt.
        // The retry's copy reports; the others overrule silently (one call counts once).
        let says = AnswerStatus::new(self.classifier.clone(), self.parts.name.clone());
        // A read that answers `201 Created` creates something: from then on its `Retry` weighs
        // its calls as a write's (unless the table trusts its class). An idempotent write may
        // answer 201 (a PUT that made the resource): no disagreement there.
        let declared = self.parts.policy.class();
        let creates = (declared == crate::class::ToolClass::Read && !self.parts.tool.trust_class)
            .then(|| self.parts.creates.clone().unwrap_or_default());
        let says = match &creates {
            Some(flag) => says.watching_creates(flag.clone(), declared),
            None => says,
        };
        let classifier = says.silent();
        if self.parts.receipt.is_some() && !self.codec.stores() {
            answer_not_stored(&self.parts.name);
        }
        // The optional layers compose statically (a layer left out is a branch, not a box):
        // the stack is boxed once, over the `Retry`.
        let below = if self.parts.policy.class() == crate::class::ToolClass::KeyedWrite
            && self.parts.key.is_some()
        {
            // Whether the body reads the key it is given: one that never does cannot send it.
            With(KeyWatch {
                inner: body,
                tool: self.parts.name.clone(),
                warned: Default::default(),
            })
        } else {
            Without(body)
        };
        let below = match &self.parts.quota {
            Some(quota) => With(quota.layer(below)),
            None => Without(below),
        };
        let below = match &self.parts.breaker {
            Some(breaker) => {
                let layer =
                    CircuitBreakerLayer::new(breaker.clone()).classifier(classifier.clone());
                With(layer.layer(below))
            }
            None => Without(below),
        };
        let below = match &self.hedge {
            Some(hedge) => With(
                hedge
                    .clone()
                    .with_classifier(classifier.clone())
                    .layer(below),
            ),
            None => Without(below),
        };
        let below = match (&self.parts.receipt, &self.parts.key) {
            (Some((store, config)), Some(key)) => {
                let layer =
                    ReceiptGuardLayer::new(store.clone(), self.parts.policy.class(), key.clone())
                        .config(*config)
                        .classifier(classifier.clone())
                        .codec(self.codec.clone());
                With(match self.parts.read_back {
                    Some((attempts, within)) => {
                        let read_back = Bounded {
                            inner: self.read_back.clone(),
                            attempts,
                            within,
                        };
                        let layer = layer.read_back(read_back, Consistency::Immediate);
                        With(layer.layer(below))
                    }
                    None => Without(layer.layer(below)),
                })
            }
            (None, Some(key)) => {
                Without(With(SetIdempotencyKeyLayer::new(key.clone()).layer(below)))
            }
            _ => Without(Without(below)),
        };
        let retry = RetryLayer::new(self.parts.policy, self.parts.budget.clone())
            .name(self.parts.name.to_string())
            .classifier(says)
            .role(self.parts.role)
            .answers_as_errors();
        let retry = match creates {
            Some(flag) => retry.learns_creates(flag),
            None => retry,
        };
        // The tool's name is evidence too: a `create_ticket` declared a read decides as the
        // write it says it is, unless the table trusts its class; and so are its server's
        // annotations (a `destructiveHint` on a read).
        let retry = match self.parts.tool.trust_class {
            true => retry.trust_class(),
            false => retry.named(tool_evidence(&self.parts.tool)),
        };
        let key_fields = self.parts.key.as_ref().map_or_else(Vec::new, |key| {
            key.parts
                .iter()
                .filter_map(|p| match p {
                    KeyPart::Id(f) | KeyPart::Text(f) => Some(f.clone()),
                    _ => None,
                })
                .collect()
        });
        ToolService::new(
            Boxed::new(retry.layer(below)),
            self.parts.name.clone(),
            self.parts.quota_context.clone(),
            key_fields.into(),
            self.parts.held.clone(),
        )
    }
}
