use super::clock::{Clock, SystemClock};
use super::codec::{Codec, JsonCodec};
use super::store::{Begin, ReceiptStore};
use crate::class::ToolClass;
use crate::classify::{ClassifiedResponse, Classify, DefaultClassifier, FailureClass, Verdict};
use crate::error::{BoxError, ConfigError, ErrorCode, ToolError};
use crate::key::{canonical_json, IdempotencyKey, KeyError, KeyStamp};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The identity of one side effect: its idempotency key and a fingerprint of the arguments that
/// must match for a repeat to be the same action.
///
/// ```
/// use serde_json::json;
/// use stormguard::receipt::Action;
///
/// let a = Action::new("run-1", "step-2", "charge", &json!({"order": 7, "cents": 1200}))?;
/// let b = Action::new("run-1", "step-2", "charge", &json!({"cents": 1200, "order": 7}))?;
/// assert_eq!(a, b); // field order does not matter
/// let c = Action::new("run-1", "step-3", "charge", &json!({"order": 7, "cents": 1200}))?;
/// assert_ne!(a.key(), c.key()); // another step is another action
/// # Ok::<(), stormguard::key::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    key: IdempotencyKey,
    fingerprint: String,
}

fn fingerprint_of(value: &serde_json::Value) -> String {
    let digest = Sha256::digest(canonical_json(value).as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn pick(args: &serde_json::Value, fields: &[&str]) -> serde_json::Value {
    serde_json::Value::Object(
        fields
            .iter()
            .map(|f| {
                (
                    (*f).to_string(),
                    args.get(*f).cloned().unwrap_or(serde_json::Value::Null),
                )
            })
            .collect(),
    )
}

impl Action {
    /// Key and fingerprint over all of `args`.
    pub fn new(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
    ) -> Result<Action, KeyError> {
        let value = crate::key::to_value(args)?;
        Ok(Action {
            key: IdempotencyKey::derive(run, step, tool, &value)?,
            fingerprint: fingerprint_of(&value),
        })
    }

    /// For a task-shaped tool: the key covers the `identity` fields, the fingerprint the
    /// `material` ones (a free-text field the model may reword belongs to neither).
    ///
    /// ```
    /// use serde_json::json;
    /// use stormguard::receipt::Action;
    ///
    /// let first = json!({"invoice_id": 4471, "to": "ap@acme.test", "body": "Dear customer"});
    /// let reworded = json!({"invoice_id": 4471, "to": "ap@acme.test", "body": "Hello"});
    /// let identity = ["invoice_id"];
    /// let material = ["invoice_id", "to"];
    /// assert_eq!(
    ///     Action::task("run-1", "step-2", "send_invoice", &first, &identity, &material)?,
    ///     Action::task("run-1", "step-2", "send_invoice", &reworded, &identity, &material)?,
    /// );
    /// # Ok::<(), stormguard::key::KeyError>(())
    /// ```
    pub fn task(
        run: &str,
        step: &str,
        tool: &str,
        args: &impl Serialize,
        identity: &[&str],
        material: &[&str],
    ) -> Result<Action, KeyError> {
        let value = crate::key::to_value(args)?;
        Ok(Action {
            key: IdempotencyKey::derive_fields(run, step, tool, &value, identity)?,
            fingerprint: fingerprint_of(&pick(&value, material)),
        })
    }

    /// The idempotency key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The fingerprint of the material arguments.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// Whether a read-back sees every effect that has been acknowledged.
///
/// An unkeyed write whose outcome a crash left unknown, with a read-back declared eventually
/// consistent: its "not there" proves nothing, so it is not consulted and the call is escalated.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Absent
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// let looked = Arc::new(AtomicU32::new(0));
/// let mut tool = ReceiptLayer::new(store, ToolClass::UnkeyedWrite, action)
///     .clock(clock)
///     .read_back(SentLog(looked.clone()), Consistency::Eventual)
///     .layer(provider);
/// let err = tool.ready().await.unwrap().call(req).await.unwrap_err();
/// let err = err.downcast::<stormguard::error::ToolError>().unwrap();
/// assert_eq!(err.code().as_str(), "outcome_unknown");
/// assert_eq!((looked.load(Ordering::SeqCst), sends.load(Ordering::SeqCst)), (0, 0));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// A read right after a write sees it: a miss means "not done". The only kind used.
    Immediate,
    /// A read may miss a recent write: a miss proves nothing, so the read-back is never used
    /// (a read-back that cannot see lagging effects is worse than none).
    Eventual,
}

/// What a read-back found.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Absent
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// let looked = Arc::new(AtomicU32::new(0));
/// let mut tool = ReceiptLayer::new(store, ToolClass::UnkeyedWrite, action)
///     .clock(clock)
///     .read_back(SentLog(looked.clone()), Consistency::Immediate)
///     .layer(provider);
/// // Absent, and the read-back is consistent: the email never went out, so it is sent now.
/// tool.ready().await.unwrap().call(req).await.unwrap();
/// assert_eq!((looked.load(Ordering::SeqCst), sends.load(Ordering::SeqCst)), (1, 1));
/// # }
/// ```
#[derive(Debug)]
pub enum ReadBackResult<Res> {
    /// The action's effect is there; this is its result.
    Found(Res),
    /// The effect is not there: safe to execute.
    Absent,
    /// The read-back could not tell.
    Unknown,
}

/// Looks for an action's effect at the provider (its sent log, say) when the provider takes no
/// idempotency key and a crash left the outcome unknown.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Found("sent to ap@acme.test".to_string())
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// // The provider keeps a sent log and takes no key: the read-back is what can tell.
/// let looked = Arc::new(AtomicU32::new(0));
/// let mut tool = ReceiptLayer::new(store, ToolClass::UnkeyedWrite, action)
///     .clock(clock)
///     .read_back(SentLog(looked.clone()), Consistency::Immediate)
///     .layer(provider);
/// let result = tool.ready().await.unwrap().call(req.clone()).await.unwrap();
/// assert_eq!(result, "sent to ap@acme.test"); // found: recorded as the receipt
/// assert_eq!((looked.load(Ordering::SeqCst), sends.load(Ordering::SeqCst)), (1, 0));
/// // From now on the receipt answers; nothing is sent or looked up again.
/// assert_eq!(tool.ready().await.unwrap().call(req).await.unwrap(), result);
/// assert_eq!((looked.load(Ordering::SeqCst), sends.load(Ordering::SeqCst)), (1, 0));
/// # }
/// ```
pub trait ReadBack<Req, Res>: Clone + Send + Sync + 'static {
    /// Looks for `req`'s effect.
    fn read_back(&self, req: &Req) -> impl Future<Output = ReadBackResult<Res>> + Send;
}

/// No read-back: an unknown outcome of an unkeyed write is returned as `outcome_unknown`.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Absent
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// // Without a read-back, the unknown outcome of an unkeyed write goes back to a person.
/// let mut tool = ReceiptLayer::new(store, ToolClass::UnkeyedWrite, action)
///     .clock(clock)
///     .layer(provider);
/// let err = tool.ready().await.unwrap().call(req).await.unwrap_err();
/// let err = err.downcast::<stormguard::error::ToolError>().unwrap();
/// assert_eq!(err.code().as_str(), "outcome_unknown");
/// assert_eq!(sends.load(Ordering::SeqCst), 0);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoReadBack;

impl<Req, Res: Send> ReadBack<Req, Res> for NoReadBack {
    fn read_back(&self, _: &Req) -> impl Future<Output = ReadBackResult<Res>> + Send {
        std::future::ready(ReadBackResult::Unknown)
    }
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    class: ToolClass,
    lease: Duration,
    wait: Duration,
    poll: Duration,
    retention: Duration,
    consistency: Consistency,
}

/// Records intent and receipt around each call of a side-effecting tool; see the
/// [module docs](super).
///
/// `action` maps a request to its [`Action`] (key and fingerprint). Defaults: a 30 s lease (how
/// long a call may be in flight), a 10 s wait for a parallel duplicate, 7 days' retention, the
/// system clock, JSON receipts, no read-back.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Absent
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// // A keyed write resumes with the same key: the provider deduplicates it.
/// let mut tool = ReceiptLayer::new(store.clone(), ToolClass::KeyedWrite, action)
///     .clock(clock.clone())
///     .layer(provider);
/// tool.ready().await.unwrap().call(req.clone()).await.unwrap();
/// tool.ready().await.unwrap().call(req).await.unwrap(); // answered from its receipt
/// assert_eq!(sends.load(Ordering::SeqCst), 1);
/// // Invalid settings are refused when the layer is built.
/// let bad = ReceiptLayer::new(store, ToolClass::KeyedWrite, action)
///     .retention(std::time::Duration::from_secs(60));
/// assert_eq!(bad.err().unwrap().field(), "retention");
/// # }
/// ```
#[derive(Clone)]
pub struct ReceiptLayer<
    St,
    F,
    C = DefaultClassifier,
    Cd = JsonCodec,
    RB = NoReadBack,
    Ck = SystemClock,
> {
    store: St,
    action: F,
    classifier: C,
    codec: Cd,
    read_back: RB,
    clock: Ck,
    settings: Settings,
}

impl<St, F> ReceiptLayer<St, F> {
    /// A layer recording to `store` for a tool of `class`.
    pub fn new(store: St, class: ToolClass, action: F) -> Self {
        ReceiptLayer {
            store,
            action,
            classifier: DefaultClassifier,
            codec: JsonCodec,
            read_back: NoReadBack,
            clock: SystemClock,
            settings: Settings {
                class,
                lease: Duration::from_secs(30),
                wait: Duration::from_secs(10),
                poll: Duration::from_millis(50),
                retention: Duration::from_secs(7 * 24 * 3600),
                consistency: Consistency::Eventual,
            },
        }
    }
}

impl<St, F, C, Cd, RB, Ck> ReceiptLayer<St, F, C, Cd, RB, Ck> {
    /// How long a call may be in flight before its intent counts as abandoned (a crash), and how
    /// long to wait for a parallel duplicate's receipt before answering `in_progress`. The lease
    /// must be at least 1 ms, the wait at most one hour.
    pub fn timing(mut self, lease: Duration, wait: Duration) -> Result<Self, ConfigError> {
        if lease.is_zero() || lease > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new(
                "lease",
                "must be greater than zero and at most one day",
            ));
        }
        if wait > Duration::from_secs(3600) {
            return Err(ConfigError::new("wait", "must be at most one hour"));
        }
        self.settings.lease = lease;
        self.settings.wait = wait;
        Ok(self)
    }

    /// How long records are kept (at least one hour; longer than your longest resume). A resume
    /// that finds an older intent is refused with `receipt_expired`.
    pub fn retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        if retention > Duration::from_secs(10 * 365 * 24 * 3600) {
            return Err(ConfigError::new("retention", "must be at most ten years"));
        }
        if retention < Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "retention",
                "must be at least one hour (and longer than the longest resume)",
            ));
        }
        self.settings.retention = retention;
        Ok(self)
    }

    /// Replaces the classifier that decides what a result means for the intent.
    pub fn classifier<C2>(self, classifier: C2) -> ReceiptLayer<St, F, C2, Cd, RB, Ck> {
        ReceiptLayer {
            store: self.store,
            action: self.action,
            classifier,
            codec: self.codec,
            read_back: self.read_back,
            clock: self.clock,
            settings: self.settings,
        }
    }

    /// Replaces how results are stored.
    pub fn codec<Cd2>(self, codec: Cd2) -> ReceiptLayer<St, F, C, Cd2, RB, Ck> {
        ReceiptLayer {
            store: self.store,
            action: self.action,
            classifier: self.classifier,
            codec,
            read_back: self.read_back,
            clock: self.clock,
            settings: self.settings,
        }
    }

    /// Declares a read-back for an unkeyed write. It runs only with
    /// [`Consistency::Immediate`] and only once the crashed call's lease has passed.
    pub fn read_back<RB2>(
        self,
        read_back: RB2,
        consistency: Consistency,
    ) -> ReceiptLayer<St, F, C, Cd, RB2, Ck> {
        let mut settings = self.settings;
        settings.consistency = consistency;
        ReceiptLayer {
            store: self.store,
            action: self.action,
            classifier: self.classifier,
            codec: self.codec,
            read_back,
            clock: self.clock,
            settings,
        }
    }

    /// Replaces the clock (tests).
    pub fn clock<Ck2>(self, clock: Ck2) -> ReceiptLayer<St, F, C, Cd, RB, Ck2> {
        ReceiptLayer {
            store: self.store,
            action: self.action,
            classifier: self.classifier,
            codec: self.codec,
            read_back: self.read_back,
            clock,
            settings: self.settings,
        }
    }
}

impl<St, F, C, Cd, RB, Ck> fmt::Debug for ReceiptLayer<St, F, C, Cd, RB, Ck> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiptLayer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, St: Clone, F: Clone, C: Clone, Cd: Clone, RB: Clone, Ck: Clone> Layer<S>
    for ReceiptLayer<St, F, C, Cd, RB, Ck>
{
    type Service = Receipts<S, St, F, C, Cd, RB, Ck>;

    fn layer(&self, inner: S) -> Self::Service {
        Receipts {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`ReceiptLayer`] makes.
///
/// ```
/// # use std::convert::Infallible;
/// # use std::sync::{Arc, atomic::{AtomicU32, Ordering}};
/// # use tower::{Layer, Service, ServiceExt, service_fn};
/// # use stormguard::class::ToolClass;
/// # use stormguard::key::{IdempotencyKey, KeyStamp};
/// # use stormguard::receipt::*;
/// # #[derive(Clone)]
/// # struct SendEmail { to: String, key: Option<String> }
/// # impl KeyStamp for SendEmail {
/// #     fn stamped_key(&self) -> Option<&str> { self.key.as_deref() }
/// #     fn stamp_key(&mut self, key: &IdempotencyKey) { self.key = Some(key.to_string()) }
/// # }
/// # #[derive(Clone)]
/// # struct SentLog(Arc<AtomicU32>);
/// # impl ReadBack<SendEmail, String> for SentLog {
/// #     async fn read_back(&self, _: &SendEmail) -> ReadBackResult<String> {
/// #         self.0.fetch_add(1, Ordering::SeqCst);
/// #         ReadBackResult::Absent
/// #     }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let sends = Arc::new(AtomicU32::new(0));
/// # let counter = sends.clone();
/// # let provider = service_fn(move |req: SendEmail| {
/// #     counter.fetch_add(1, Ordering::SeqCst);
/// #     async move { Ok::<_, Infallible>(format!("sent to {}", req.to)) }
/// # });
/// # let action = |req: &SendEmail| Action::new("run-1", "step-2", "send_email", &req.to);
/// # let req = SendEmail { to: "ap@acme.test".into(), key: None };
/// // A crash left this action's intent pending, with no receipt; its lease has passed.
/// let (store, clock) = (InMemoryStore::new(), ManualClock::new(1_000_000));
/// let crashed = action(&req).unwrap();
/// store.begin(crashed.key().as_str(), crashed.fingerprint(), "crashed", 1_000_000, 1_030_000)
///     .await.unwrap();
/// clock.advance_ms(60_000);
/// let mut tool: Receipts<_, _, _, _, _, _, _> = ReceiptLayer::new(store, ToolClass::KeyedWrite, action)
///     .clock(clock)
///     .layer(provider);
/// assert_eq!(tool.ready().await.unwrap().call(req).await.unwrap(), "sent to ap@acme.test");
/// # }
/// ```
#[derive(Clone)]
pub struct Receipts<
    S,
    St,
    F,
    C = DefaultClassifier,
    Cd = JsonCodec,
    RB = NoReadBack,
    Ck = SystemClock,
> {
    inner: S,
    layer: ReceiptLayer<St, F, C, Cd, RB, Ck>,
}

impl<S, St, F, C, Cd, RB, Ck> Receipts<S, St, F, C, Cd, RB, Ck> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, St, F, C, Cd, RB, Ck> fmt::Debug for Receipts<S, St, F, C, Cd, RB, Ck> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipts")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

fn refusal(code: ErrorCode, key: &IdempotencyKey) -> BoxError {
    tracing::info!(key = %key, code = code.as_str(), "receipt refused the call");
    crate::telemetry::receipt_outcome(code.as_str());
    Box::new(ToolError::new(code).with_retryable(code.default_retryable()))
}

fn counted(outcome: &'static str) {
    crate::telemetry::receipt_outcome(outcome);
}

impl<S, St, F, C, Cd, RB, Ck, Req> Service<Req> for Receipts<S, St, F, C, Cd, RB, Ck>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Future: Send + 'static,
    St: ReceiptStore,
    F: Fn(&Req) -> Result<Action, KeyError>,
    C: Classify<S::Response, S::Error> + Clone + Send + Sync + 'static,
    Cd: Codec<S::Response>,
    RB: ReadBack<Req, S::Response>,
    Ck: Clock,
    Req: KeyStamp + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let action = match (self.layer.action)(&req) {
            Ok(action) => action,
            Err(e) => {
                let err = ToolError::new(ErrorCode::InvalidArgument)
                    .with_hint("the action's idempotency key could not be derived; fix the run, step or tool name")
                    .with_retryable(false)
                    .with_source(e);
                return Box::pin(std::future::ready(Err(Box::new(err) as BoxError)));
            }
        };
        if !crate::key::note_key(action.key()) {
            let err = ToolError::new(ErrorCode::IdempotencyKeyChanged).with_retryable(false);
            return Box::pin(std::future::ready(Err(Box::new(err) as BoxError)));
        }
        req.stamp_key(action.key());
        // The inner service was polled ready for this call: take it, leave a clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let run = Run {
            inner,
            store: self.layer.store.clone(),
            classifier: self.layer.classifier.clone(),
            codec: self.layer.codec.clone(),
            read_back: self.layer.read_back.clone(),
            clock: self.layer.clock.clone(),
            settings: self.layer.settings,
            action,
            owner: owner_token(),
        };
        Box::pin(run.go(req))
    }
}

struct Run<S, St, C, Cd, RB, Ck> {
    inner: S,
    store: St,
    classifier: C,
    codec: Cd,
    read_back: RB,
    clock: Ck,
    settings: Settings,
    action: Action,
    /// This call's token: only the holder of an intent releases, abandons or completes it.
    owner: String,
}

/// A token unique to one call of the layer (process, time and a counter, hashed).
fn owner_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

/// Settles an intent this call holds if the call's future is dropped first (cancelled, timed
/// out): an intent whose request was never sent is removed, one that may have been sent gives up
/// its lease so the next attempt decides at once.
struct Hold<St: ReceiptStore> {
    store: St,
    key: String,
    owner: String,
    sent: bool,
    settled: bool,
}

impl<St: ReceiptStore> Drop for Hold<St> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        counted(if self.sent {
            "cancelled_after_send"
        } else {
            "not_sent"
        });
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the lease will pass on its own
        };
        let (store, key, owner, sent) = (
            self.store.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
            self.sent,
        );
        runtime.spawn(async move {
            let _ = if sent {
                store.release(&key, &owner, 0).await
            } else {
                store.abandon(&key, &owner).await
            };
        });
    }
}

fn store_down(e: super::store::StoreError) -> BoxError {
    counted("store_unavailable");
    tracing::warn!(error = %e, "receipt store unavailable; the call was not executed");
    Box::new(ToolError::new(ErrorCode::StoreUnavailable).with_source(e))
}

impl<S, St, C, Cd, RB, Ck> Run<S, St, C, Cd, RB, Ck> {
    async fn go<Req>(self, req: Req) -> Result<S::Response, BoxError>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        St: ReceiptStore,
        C: Classify<S::Response, S::Error>,
        Cd: Codec<S::Response>,
        RB: ReadBack<Req, S::Response>,
        Ck: Clock,
    {
        let key = self.action.key.clone();
        let lease_ms = self.settings.lease.as_millis() as u64;
        let started = tokio::time::Instant::now();
        loop {
            let now = self.clock.now_ms();
            let begin = self
                .store
                .begin(
                    key.as_str(),
                    &self.action.fingerprint,
                    &self.owner,
                    now,
                    now.saturating_add(lease_ms),
                )
                .await
                .map_err(store_down)?;
            match begin {
                Begin::Fresh => {
                    counted("fresh");
                    tracing::debug!(key = %key, "intent recorded; executing");
                    return self.execute(req, false).await;
                }
                Begin::Mismatch => return Err(refusal(ErrorCode::IdempotencyKeyReused, &key)),
                Begin::Done { since_ms, receipt } => {
                    self.check_retention(since_ms, now, &key)?;
                    counted("receipt");
                    tracing::debug!(key = %key, "receipt found; not executing");
                    return self.codec.decode(&receipt).map_err(|e| {
                        Box::new(
                            ToolError::new(ErrorCode::Internal)
                                .with_hint("the stored receipt could not be decoded; escalate")
                                .with_retryable(false)
                                .with_source(e),
                        ) as BoxError
                    });
                }
                Begin::Pending {
                    since_ms,
                    lease_until_ms,
                } => {
                    self.check_retention(since_ms, now, &key)?;
                    if lease_until_ms > now {
                        // Another caller holds it: wait, bounded, for its receipt.
                        if started.elapsed() >= self.settings.wait {
                            return Err(refusal(ErrorCode::InProgress, &key));
                        }
                        tokio::time::sleep(self.settings.poll).await;
                        continue;
                    }
                    return self.stale(req, now).await;
                }
            }
        }
    }

    fn check_retention(
        &self,
        since_ms: u64,
        now: u64,
        key: &IdempotencyKey,
    ) -> Result<(), BoxError> {
        if now.saturating_sub(since_ms) > self.settings.retention.as_millis() as u64 {
            return Err(refusal(ErrorCode::ReceiptExpired, key));
        }
        Ok(())
    }

    /// An intent whose executor is gone (a crash, an ambiguous failure).
    async fn stale<Req>(self, req: Req, now: u64) -> Result<S::Response, BoxError>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        St: ReceiptStore,
        C: Classify<S::Response, S::Error>,
        Cd: Codec<S::Response>,
        RB: ReadBack<Req, S::Response>,
        Ck: Clock,
    {
        let key = self.action.key.clone();
        match self.settings.class {
            ToolClass::Read | ToolClass::IdempotentWrite | ToolClass::KeyedWrite => {
                claim(
                    &self.store,
                    &self.action.key,
                    &self.owner,
                    self.settings.lease,
                    now,
                )
                .await?;
                counted("resumed_with_key");
                tracing::info!(key = %key, "pending intent without receipt; executing again with the same key");
                self.execute(req, true).await
            }
            ToolClass::UnkeyedWrite if self.settings.consistency == Consistency::Immediate => {
                match self.read_back.read_back(&req).await {
                    ReadBackResult::Found(res) => {
                        claim(
                            &self.store,
                            &self.action.key,
                            &self.owner,
                            self.settings.lease,
                            now,
                        )
                        .await?;
                        counted("read_back_found");
                        tracing::info!(key = %key, "read-back found the effect; recording its receipt");
                        let encoded = self.codec.encode(&res);
                        record(&self.store, &self.clock, key.as_str(), &self.owner, encoded).await;
                        Ok(res)
                    }
                    ReadBackResult::Absent => {
                        claim(
                            &self.store,
                            &self.action.key,
                            &self.owner,
                            self.settings.lease,
                            now,
                        )
                        .await?;
                        counted("read_back_absent");
                        tracing::info!(key = %key, "read-back found no effect; executing");
                        self.execute(req, true).await
                    }
                    ReadBackResult::Unknown => Err(refusal(ErrorCode::OutcomeUnknown, &key)),
                }
            }
            _ => Err(refusal(ErrorCode::OutcomeUnknown, &key)),
        }
    }

    async fn execute<Req>(mut self, req: Req, resumed: bool) -> Result<S::Response, BoxError>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        St: ReceiptStore,
        C: Classify<S::Response, S::Error>,
        Cd: Codec<S::Response>,
        Ck: Clock,
    {
        let key = self.action.key.as_str().to_string();
        let mut hold = Hold {
            store: self.store.clone(),
            key: key.clone(),
            owner: self.owner.clone(),
            sent: false,
            settled: false,
        };
        if let Err(e) = std::future::poll_fn(|cx| self.inner.poll_ready(cx)).await {
            // Never sent: forget the intent (the hold does it when dropped).
            return Err(e.into());
        }
        let future = self.inner.call(req);
        hold.sent = true;
        let result = future.await;
        let verdict = match self.classifier.classify(&result) {
            ClassifiedResponse::Ready(c) => c.verdict(),
            ClassifiedResponse::RequiresEos(_) => Verdict::Success,
        };
        let encoded = match (&result, verdict) {
            (Ok(res), Verdict::Success | Verdict::Empty) => Some(self.codec.encode(res)),
            _ => None,
        };
        let result = result.map_err(Into::into);
        let owner = self.owner.as_str();
        match (encoded, verdict) {
            (Some(encoded), _) => {
                if record(&self.store, &self.clock, &key, owner, encoded).await {
                    counted("recorded");
                    tracing::debug!(key, resumed, "receipt recorded");
                }
            }
            (
                None,
                Verdict::Failure(FailureClass::Ambiguous) | Verdict::Success | Verdict::Empty,
            ) => {
                // It may have taken effect: keep the intent, give up the lease.
                if self
                    .store
                    .release(&key, owner, self.clock.now_ms())
                    .await
                    .is_ok()
                {
                    counted("left_pending");
                }
                tracing::info!(key, "ambiguous failure; the intent stays pending");
            }
            (None, _) => {
                // It did not take effect: forget the intent, so a later call starts fresh.
                if self.store.abandon(&key, owner).await.is_ok() {
                    counted("abandoned");
                }
                tracing::debug!(key, "failure without effect; intent removed");
            }
        }
        hold.settled = true;
        result
    }
}

/// Stores `res` as the receipt of `key`; `true` if it was stored. A failure here is logged, not
/// returned: the effect happened, the intent stays pending, and a resume decides again (with the
/// same key).
async fn record<St: ReceiptStore, Ck: Clock>(
    store: &St,
    clock: &Ck,
    key: &str,
    owner: &str,
    encoded: Result<Vec<u8>, BoxError>,
) -> bool {
    match encoded {
        Ok(bytes) => match store.complete(key, owner, &bytes, clock.now_ms()).await {
            Ok(()) => true,
            Err(e) => {
                counted("receipt_not_stored");
                tracing::error!(key, error = %e, "the receipt could not be stored; a resume will decide again");
                false
            }
        },
        Err(e) => {
            counted("receipt_not_stored");
            tracing::error!(key, error = %e, "the result could not be encoded as a receipt");
            false
        }
    }
}

/// Takes over a stale intent; another caller that took it first makes this `in_progress`.
async fn claim<St: ReceiptStore>(
    store: &St,
    key: &IdempotencyKey,
    owner: &str,
    lease: Duration,
    now: u64,
) -> Result<(), BoxError> {
    let lease_until = now.saturating_add(lease.as_millis() as u64);
    if store
        .claim(key.as_str(), owner, now, lease_until)
        .await
        .map_err(store_down)?
    {
        Ok(())
    } else {
        Err(refusal(ErrorCode::InProgress, key))
    }
}
