use super::{DefaultReplay, Retrier, Retry};
use crate::budget::acceptance::Acceptance;
use crate::budget::RetryBudget;
#[cfg(doc)]
use crate::class::ToolClass;
use crate::class::{ClassPolicy, Evidence};
use crate::classify::DefaultClassifier;
use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use tower_layer::Layer;

/// Applies [`Retry`] to a service. Every clone of the layer, and every service it makes, shares
/// the [`RetryBudget`] it was given.
///
/// ```
/// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
/// use stormguard::classify::HttpClassifier;
///
/// let budget = RetryBudget::default();
/// let layer = RetryLayer::new(ToolClass::Read, budget)
///     .name("search-api")
///     .classifier(HttpClassifier);
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct RetryLayer<C = DefaultClassifier, R = DefaultReplay> {
    policy: ClassPolicy,
    budget: RetryBudget,
    classifier: C,
    replay: R,
    name: Cow<'static, str>,
    role: Role,
    trust: bool,
    /// A failed answer it does not retry ends as a `ToolError`, not `Ok` (a declared tool's).
    answers_as_errors: bool,
    /// What the tool's name shows (a toolbox's layer), weighed when the request shows nothing.
    named: Option<Evidence>,
    /// Set once the tool answered `201 Created` (a toolbox's read or idempotent write): from
    /// then on its calls are weighed as a write's.
    creates: Option<Arc<AtomicBool>>,
}

/// How a layer takes part in the operation it is called in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Joins the operation it finds, else opens one (the default).
    JoinsOrOpens,
    /// Always opens an operation of its own ([`RetryLayer::own_operation`]).
    Own,
    /// Only joins ([`RetryLayer::nested`]): finding none, it retries nothing.
    Nested,
    /// Joins or opens, and retries nothing: the tool's retries are the model's or the client's
    /// (a tool declared so, see [`crate::tool::RetryOwner`]).
    HandsUp,
}

impl RetryLayer {
    /// Retries as `policy` allows, drawing from `budget`. `policy` is a [`ToolClass`] (its
    /// default policy, [`ToolClass::policy`]) or a [`ClassPolicy`] built for it: the layer's one
    /// way to be given its class.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::{budget::RetryBudget, class::{ClassPolicy, ToolClass}, retry::RetryLayer};
    /// use tower::{Layer, service_fn};
    ///
    /// let svc = service_fn(|x: u32| async move { Ok::<_, std::io::Error>(x) });
    /// let read = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(svc);
    /// assert_eq!(read.policy(), &ToolClass::Read.policy());
    ///
    /// let five = ClassPolicy::builder(ToolClass::KeyedWrite).max_attempts(5).build().unwrap();
    /// let write = RetryLayer::new(five, RetryBudget::default()).layer(read.into_inner());
    /// assert_eq!(write.policy().class(), ToolClass::KeyedWrite);
    /// assert_eq!(write.policy().max_attempts(), 5);
    /// ```
    pub fn new(policy: impl Into<ClassPolicy>, budget: RetryBudget) -> Self {
        let policy = policy.into();
        let class = policy.class();
        RetryLayer {
            policy,
            budget,
            classifier: DefaultClassifier,
            replay: DefaultReplay,
            name: Cow::Borrowed(class.as_str()),
            role: Role::JoinsOrOpens,
            trust: false,
            answers_as_errors: false,
            named: None,
            creates: None,
        }
    }
}

impl<C, R> RetryLayer<C, R> {
    /// Names the dependency, for traces and metrics (defaults to the class name).
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Declares that this layer's requests are their own logical operation: it opens a new ledger
    /// instead of joining the current one, with its own attempts, class and deadline.
    ///
    /// Use it for a call made *inside* a tool that is not part of the tool's action: an
    /// auth-token refresh (a POST, `UnkeyedWrite`) inside a `Read` would otherwise make the read
    /// an unkeyed write, so that its first timeout is escalated after one call; each branch of a
    /// fan-out (four parallel reads inside one tool would otherwise share its 3 attempts). A
    /// layer that joins with a stricter class without it logs a WARN and counts
    /// `stormguard_class_tightened_total`.
    ///
    /// ```
    /// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    ///
    /// let budget = RetryBudget::default();
    /// // The tool's own layer, and the token refresh its client makes when a token expires.
    /// let tool = RetryLayer::new(ToolClass::Read, budget.clone()).name("search");
    /// let refresh = RetryLayer::new(ToolClass::UnkeyedWrite, budget).name("oauth-refresh").own_operation();
    /// # let _ = (tool, refresh);
    /// ```
    pub fn own_operation(mut self) -> Self {
        self.role = Role::Own;
        self
    }

    /// Declares that this layer runs inside another stormguard [`Retry`] (the tool's layer,
    /// which owns the retries): it joins that layer's operation and never becomes a second
    /// owner. While it has the operation, it retries on the operation's attempts and draws on
    /// its own budget; when that budget refuses (and is not the owner's), it hands the failure
    /// up and the owner's budget decides. A layer nested by accident (a client's own retry
    /// layer under a tool's) retries with the operation's attempts as long as the operation
    /// reaches it; where it does not (a request type that cannot carry it, such as a
    /// `reqwest::Request` or a plain value, behind a `tower::buffer::Buffer` or in a spawned
    /// task), it would open an operation of its own and retry on its own account: for a write,
    /// up to its attempts of duplicates. A nested layer
    /// then makes one attempt and hands a failure up unchanged, still retryable, for the owner
    /// to decide; it counts `stormguard_operations_uncarried_total{layer}` and logs a WARN, so
    /// the lost operation is seen.
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::{budget::RetryBudget, class::ToolClass, retry::RetryLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let counter = calls.clone();
    /// let down = service_fn(move |_: u32| {
    ///     counter.fetch_add(1, Ordering::SeqCst);
    ///     async { Err::<u32, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
    /// });
    /// // The client's layer, reached with no operation (a plain `u32` cannot carry one).
    /// let mut client = RetryLayer::new(ToolClass::Read, RetryBudget::default()).nested().layer(down);
    /// let err = client.ready().await.unwrap().call(1).await.unwrap_err();
    /// assert_eq!(calls.load(Ordering::SeqCst), 1); // one attempt: it owns no retries
    /// assert!(err.retryable()); // the owner above decides
    /// # }
    /// ```
    pub fn nested(mut self) -> Self {
        self.role = Role::Nested;
        self
    }

    /// Decides with the declared class even where the request says otherwise.
    ///
    /// By default a layer checks its class against what its request shows
    /// ([`Evidence`](crate::class::Evidence)): an HTTP POST or PATCH without an
    /// `Idempotency-Key` is decided as an `UnkeyedWrite` (RFC 9110 §9.2.2), so an ambiguous
    /// failure (a 502, a timeout) is not sent again and ends as `outcome_unknown`, whatever class
    /// the layer was given; it logs a WARN once, counts `stormguard_class_from_evidence_total`
    /// and says why in the error's hint. A POST that is safe to send twice (a search API's
    /// query, a GraphQL read) is declared so with this one word.
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::{budget::RetryBudget, class::ToolClass, error::ErrorCode, retry::RetryLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let counter = calls.clone();
    /// let bad_gateway = service_fn(move |_: http::Request<String>| {
    ///     counter.fetch_add(1, Ordering::SeqCst);
    ///     async { Ok::<_, std::io::Error>(http::Response::builder().status(502).body(String::new()).unwrap()) }
    /// });
    /// let query = || http::Request::post("http://search.test/_search").body("{}".to_string()).unwrap();
    ///
    /// // Declared a read, but a POST without a key: one call, and the outcome is unknown.
    /// let mut declared = RetryLayer::new(ToolClass::Read, RetryBudget::default()).layer(bad_gateway.clone());
    /// let err = declared.ready().await.unwrap().call(query()).await.unwrap_err();
    /// assert_eq!((err.code(), calls.load(Ordering::SeqCst)), (ErrorCode::OutcomeUnknown, 1));
    /// assert!(err.hint().contains("trust_class"));
    ///
    /// // The user knows this POST is a read: the 502 is retried, 3 attempts in all.
    /// calls.store(0, Ordering::SeqCst);
    /// let mut trusted = RetryLayer::new(ToolClass::Read, RetryBudget::default()).trust_class().layer(bad_gateway);
    /// let err = trusted.ready().await.unwrap().call(query()).await.unwrap_err();
    /// assert_eq!((err.code(), calls.load(Ordering::SeqCst)), (ErrorCode::Unavailable, 3));
    /// # }
    /// ```
    pub fn trust_class(mut self) -> Self {
        self.trust = true;
        self
    }

    /// What the tool's name shows, for a toolbox's layer (its requests are tool calls).
    pub(crate) fn named(mut self, named: Option<Evidence>) -> Self {
        self.named = named;
        self
    }

    /// A failed answer that is not retried (a 4xx, a spent quota) ends as a [`ToolError`]
    /// built from the dependency's own error, not as the `Ok` answer (for the tool stack,
    /// whose errors are what the model reads).
    ///
    /// [`ToolError`]: crate::error::ToolError
    pub(crate) fn answers_as_errors(mut self) -> Self {
        self.answers_as_errors = true;
        self
    }

    /// Weighs the tool's calls as a write's once `creates` is set (by the stack's classifier,
    /// when the tool answered `201 Created`).
    pub(crate) fn learns_creates(mut self, creates: Arc<AtomicBool>) -> Self {
        self.creates = Some(creates);
        self
    }

    /// Sets how the layer takes part in operations (for the tool stack).
    pub(crate) fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// Replaces the classifier.
    pub fn classifier<C2>(self, classifier: C2) -> RetryLayer<C2, R> {
        RetryLayer {
            policy: self.policy,
            budget: self.budget,
            classifier,
            replay: self.replay,
            name: self.name,
            role: self.role,
            trust: self.trust,
            answers_as_errors: self.answers_as_errors,
            named: self.named,
            creates: self.creates,
        }
    }

    /// Replaces how requests are copied for a retry and checked for an idempotency key.
    pub fn replay<R2>(self, replay: R2) -> RetryLayer<C, R2> {
        RetryLayer {
            policy: self.policy,
            budget: self.budget,
            classifier: self.classifier,
            replay,
            name: self.name,
            role: self.role,
            trust: self.trust,
            answers_as_errors: self.answers_as_errors,
            named: self.named,
            creates: self.creates,
        }
    }
}

impl<S: Clone, C: Clone, R: Clone> Layer<S> for RetryLayer<C, R> {
    type Service = Retry<S, C, R>;

    fn layer(&self, inner: S) -> Retry<S, C, R> {
        let retrier = Retrier {
            template: Mutex::new(inner.clone()),
            policy: self.policy,
            budget: self.budget.clone(),
            classifier: self.classifier.clone(),
            replay: self.replay.clone(),
            name: self.name.clone(),
            role: self.role,
            trust: self.trust,
            answers_as_errors: self.answers_as_errors,
            named: self.named,
            creates: self.creates.clone(),
            warned: AtomicBool::new(false),
            acceptance: Arc::new(Acceptance::new(
                self.budget.next_seed(),
                self.budget.acceptance().map_or(1, |(_, window)| window),
            )),
        };
        Retry::new(inner, retrier)
    }
}
