//! The layer and its service: derive the action, stamp its key, hand the call to a [`Run`].

use super::config::ReceiptConfig;
use super::read_back::{Consistency, NoReadBack};
use super::run::{GuardState, Run, Settings};
use super::store::ReceiptStore;
use super::stored::DefaultCodec;
use crate::class::ToolClass;
use crate::classify::DefaultClassifier;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::key::{KeyStamp, MakeIdempotencyKey};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Records intent and receipt around each call of a side-effecting tool; see the
/// [module docs](super) for what each `begin` answer leads to, and an example.
///
/// `action` maps a request to its [`Action`](crate::key::Action) (key and fingerprint): a
/// [`MakeIdempotencyKey`], such as a closure. The layer stamps the key on the request itself;
/// below it, the stack needs no [`SetIdempotencyKeyLayer`](crate::key::SetIdempotencyKeyLayer).
/// Defaults: the times of [`ReceiptConfig::default`] (a 30 s lease, how long a call may be in
/// flight; a 10 s wait for a parallel duplicate; 7 days' retention; a 24 h provider key window),
/// JSON receipts, no read-back. Other times come as a [`ReceiptConfig`], whose `build` refuses
/// invalid ones:
///
/// ```
/// use std::time::Duration;
/// use stormguard::class::ToolClass;
/// use stormguard::key::Action;
/// use stormguard::receipt::{InMemoryStore, ReceiptConfig, ReceiptGuardLayer};
///
/// let action = |invoice: &u64| Action::new("run-1", "step-2", "send_invoice", invoice);
/// let config = ReceiptConfig::builder()
///     .lease(Duration::from_secs(5))
///     .wait(Duration::from_secs(2))
///     .build()?;
/// let layer = ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, action).config(config);
/// # let _ = layer;
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ReceiptGuardLayer<St, F, C = DefaultClassifier, Cd = DefaultCodec, RB = NoReadBack> {
    store: St,
    action: F,
    classifier: C,
    codec: Cd,
    read_back: RB,
    settings: Settings,
}

impl<St, F> ReceiptGuardLayer<St, F> {
    /// A layer recording to `store` for a tool of `class`.
    pub fn new(store: St, class: ToolClass, action: F) -> Self {
        ReceiptGuardLayer {
            store,
            action,
            classifier: DefaultClassifier,
            codec: DefaultCodec,
            read_back: NoReadBack,
            settings: Settings::new(class, ReceiptConfig::default()),
        }
    }
}

impl<St, F, C, Cd, RB> ReceiptGuardLayer<St, F, C, Cd, RB> {
    /// The times it works with (lease, wait, retention, key window); see [`ReceiptConfig`].
    /// With a [`read_back`](Self::read_back), the lease must outlast the provider's in-flight
    /// time: a read-back runs only once it has passed.
    pub fn config(mut self, config: ReceiptConfig) -> Self {
        self.settings.lease = config.lease;
        self.settings.wait = config.wait;
        self.settings.retention = config.retention;
        self.settings.key_window = config.key_window;
        self
    }

    /// Replaces the classifier that decides what a result means for the intent. The default,
    /// [`DefaultClassifier`], reads an answer by its type ([`Answer`](crate::classify::Answer)):
    /// an `http::Response` by its status, so a 503 is never stored as the receipt; a success
    /// is stored, and only a success.
    pub fn classifier<C2>(self, classifier: C2) -> ReceiptGuardLayer<St, F, C2, Cd, RB> {
        ReceiptGuardLayer {
            store: self.store,
            action: self.action,
            classifier,
            codec: self.codec,
            read_back: self.read_back,
            settings: self.settings,
        }
    }

    /// Replaces how results are stored. By default ([`DefaultCodec`]) an answer is stored by its
    /// type: an `http::Response` with its body in memory, JSON values, strings, numbers, an MCP
    /// result, or your own [`Stored`](super::Stored) type; give [`JsonCodec`](super::JsonCodec)
    /// for any serde type, and [`NotStored`](super::NotStored) over a streamed response, which no
    /// receipt holds.
    pub fn codec<Cd2>(self, codec: Cd2) -> ReceiptGuardLayer<St, F, C, Cd2, RB> {
        ReceiptGuardLayer {
            store: self.store,
            action: self.action,
            classifier: self.classifier,
            codec,
            read_back: self.read_back,
            settings: self.settings,
        }
    }

    /// Declares a read-back for a write no key protects (an unkeyed write, or a keyed one older
    /// than the key window). It runs only with [`Consistency::Immediate`] and only once the
    /// lease of the last attempt has passed: after a crash, and after an ambiguous failure or a
    /// dropped call too (whose lease is then kept running, not given up), because a request
    /// still in flight can land after a read-back that found nothing. **Set the lease
    /// ([`ReceiptConfigBuilder::lease`](super::ReceiptConfigBuilder::lease)) longer than the provider's longest in-flight time** (its
    /// request timeout, or your client's, plus a margin): that bound is what makes "absent" mean
    /// "safe to send".
    pub fn read_back<RB2>(
        self,
        read_back: RB2,
        consistency: Consistency,
    ) -> ReceiptGuardLayer<St, F, C, Cd, RB2> {
        let mut settings = self.settings;
        settings.consistency = consistency;
        ReceiptGuardLayer {
            store: self.store,
            action: self.action,
            classifier: self.classifier,
            codec: self.codec,
            read_back,
            settings,
        }
    }
}

impl<St, F, C, Cd, RB> fmt::Debug for ReceiptGuardLayer<St, F, C, Cd, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiptGuardLayer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, St: Clone, F: Clone, C: Clone, Cd: Clone, RB: Clone> Layer<S>
    for ReceiptGuardLayer<St, F, C, Cd, RB>
{
    type Service = ReceiptGuard<S, St, F, C, Cd, RB>;

    fn layer(&self, inner: S) -> Self::Service {
        ReceiptGuard {
            inner,
            action: self.action.clone(),
            shared: Arc::new(GuardState {
                store: self.store.clone(),
                classifier: self.classifier.clone(),
                codec: self.codec.clone(),
                read_back: self.read_back.clone(),
                settings: self.settings,
            }),
        }
    }
}

/// The service [`ReceiptGuardLayer`] makes.
///
/// It is always ready: the store is asked first, and the inner service is driven ready only for
/// a call that will be sent, so a call answered from a receipt (or refused) never waits for, or
/// spends, a quota slot or a connection below.
///
/// ```
/// use std::convert::Infallible;
/// use tower::{Layer, ServiceExt, service_fn};
/// use stormguard::class::ToolClass;
/// use stormguard::key::Action;
/// use stormguard::receipt::{InMemoryStore, ReceiptGuard, ReceiptGuardLayer};
///
/// # #[derive(Clone)] struct Invoice(u64, Option<String>);
/// # impl stormguard::key::KeyStamp for Invoice {
/// #     fn stamped_key(&self) -> Option<&str> { self.1.as_deref() }
/// #     fn stamp_key(&mut self, key: &stormguard::key::IdempotencyKey) { self.1 = Some(key.to_string()) }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let provider = service_fn(|inv: Invoice| async move { Ok::<_, Infallible>(format!("sent {}", inv.0)) });
/// let action = |inv: &Invoice| Action::new("run-1", "step-2", "send_invoice", &inv.0);
/// let tool: ReceiptGuard<_, _, _> = ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, action)
///     .layer(provider);
/// assert_eq!(tool.oneshot(Invoice(4471, None)).await.unwrap(), "sent 4471");
/// # }
/// ```
#[derive(Clone)]
pub struct ReceiptGuard<S, St, F, C = DefaultClassifier, Cd = DefaultCodec, RB = NoReadBack> {
    inner: S,
    action: F,
    shared: Arc<GuardState<St, C, Cd, RB>>,
}

impl<S, St, F, C, Cd, RB> ReceiptGuard<S, St, F, C, Cd, RB> {
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

impl<S: fmt::Debug, St, F, C, Cd, RB> fmt::Debug for ReceiptGuard<S, St, F, C, Cd, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiptGuard")
            .field("inner", &self.inner)
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

fn refused<T: Send + 'static>(err: ToolError) -> BoxFuture<T> {
    Box::pin(std::future::ready(Err(Box::new(err) as BoxError)))
}

impl<S, St, F, C, Cd, RB, Req> Service<Req> for ReceiptGuard<S, St, F, C, Cd, RB>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Future: Send + 'static,
    St: ReceiptStore,
    F: MakeIdempotencyKey<Req>,
    C: crate::classify::Classify<S::Response, S::Error> + Send + Sync + 'static,
    Cd: super::codec::Codec<S::Response>,
    RB: super::read_back::ReadBack<Req, S::Response>,
    Req: KeyStamp + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<S::Response>;

    /// Always ready: see the type docs.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let action = match self.action.make_key(&req) {
            Ok(action) => action,
            Err(e) => {
                super::refuse::answered_here(req.operation().as_ref());
                let err = ToolError::new(ErrorCode::InvalidArgument)
                    .with_hint(format!("the action's idempotency key could not be derived ({e}): give the identity fields it covers, or fix the run, step or tool name"))
                    .with_retryable(false)
                    .with_source(e);
                return refused(err);
            }
        };
        if let Err(err) = crate::key::check_stamped(&req, action.key()) {
            super::refuse::answered_here(req.operation().as_ref());
            return refused(err);
        }
        req.stamp_key(action.key());
        let run = Run {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            action,
            op: req.operation(),
            _req: PhantomData,
        };
        Box::pin(run.go(req))
    }
}
