//! A breaker per key (host, model, tenant), chosen per request: [`KeyedBreakerLayer`].

use super::future::KeyedBreakerFuture;
use super::{BreakerRegistry, CircuitBreaker, CountDependencyFailures};
use crate::classify::{Classify, DefaultClassifier};
use crate::error::BoxError;
use std::fmt;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A [`CircuitBreaker`] per key: `key` names the breaker a request goes through (its host, its
/// model, its tenant), and the [`BreakerRegistry`] hands out one breaker per name, made on first
/// use with the registry's config. One model (or host) failing opens its own breaker; calls to
/// the others go on.
///
/// The breaker is chosen in `call`, from the request, so the service is always ready: the call's
/// future drives the inner service (a clone) ready, admits or rejects through the key's breaker,
/// and counts the outcome as [`CircuitBreaker`] does. Each call takes the registry's lock to find
/// its breaker (a short map lookup).
///
/// ```
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::breaker::{BreakerConfig, BreakerRegistry, KeyedBreakerLayer, State};
/// use stormguard::error::{ErrorCode, ToolError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = BreakerRegistry::new(BreakerConfig::builder().consecutive_failures(2).no_failure_rate().build().unwrap());
/// // "model-a" is down, "model-b" answers.
/// let api = service_fn(|model: &'static str| async move {
///     if model == "model-a" { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) } else { Ok(model) }
/// });
/// let mut svc = KeyedBreakerLayer::new(registry.clone(), |model: &&'static str| model.to_string()).layer(api);
/// for _ in 0..2 {
///     let _ = svc.ready().await.unwrap().call("model-a").await;
/// }
/// assert_eq!(registry.get("model-a").state(), State::Open);
/// let err = svc.ready().await.unwrap().call("model-a").await.unwrap_err();
/// assert_eq!(err.downcast_ref::<ToolError>().unwrap().code(), ErrorCode::CircuitOpen);
/// // The other model's breaker is its own.
/// assert_eq!(svc.ready().await.unwrap().call("model-b").await.unwrap(), "model-b");
/// # }
/// ```
pub struct KeyedBreakerLayer<F, C = DefaultClassifier, P = CountDependencyFailures> {
    registry: BreakerRegistry,
    key: F,
    classifier: C,
    policy: P,
}

impl<F> KeyedBreakerLayer<F> {
    /// Breakers from `registry`, by the name `key` reads from each request.
    pub fn new(registry: BreakerRegistry, key: F) -> Self {
        KeyedBreakerLayer {
            registry,
            key,
            classifier: DefaultClassifier,
            policy: CountDependencyFailures,
        }
    }
}

impl<F, C, P> KeyedBreakerLayer<F, C, P> {
    /// Replaces the classifier.
    pub fn classifier<C2>(self, classifier: C2) -> KeyedBreakerLayer<F, C2, P> {
        KeyedBreakerLayer {
            registry: self.registry,
            key: self.key,
            classifier,
            policy: self.policy,
        }
    }

    /// Replaces the count policy.
    pub fn count_policy<P2>(self, policy: P2) -> KeyedBreakerLayer<F, C, P2> {
        KeyedBreakerLayer {
            registry: self.registry,
            key: self.key,
            classifier: self.classifier,
            policy,
        }
    }
}

impl<F: Clone, C: Clone, P: Clone> Clone for KeyedBreakerLayer<F, C, P> {
    fn clone(&self) -> Self {
        KeyedBreakerLayer {
            registry: self.registry.clone(),
            key: self.key.clone(),
            classifier: self.classifier.clone(),
            policy: self.policy.clone(),
        }
    }
}

impl<F, C, P> fmt::Debug for KeyedBreakerLayer<F, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakerLayer")
            .field("breakers", &self.registry.names())
            .finish_non_exhaustive()
    }
}

impl<S, F: Clone, C: Clone, P: Clone> Layer<S> for KeyedBreakerLayer<F, C, P> {
    type Service = KeyedBreaker<S, F, C, P>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedBreaker {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`KeyedBreakerLayer`] makes: always ready, it picks each request's breaker in
/// `call` (made on first use of its name) and returns a
/// [`KeyedBreakerFuture`](super::future::KeyedBreakerFuture).
///
/// ```
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::breaker::{BreakerConfig, BreakerRegistry, KeyedBreaker, KeyedBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let registry = BreakerRegistry::new(BreakerConfig::default());
/// let api = service_fn(|host: String| async move { Ok::<_, std::io::Error>(host.len()) });
/// let layer = KeyedBreakerLayer::new(registry.clone(), |host: &String| host.clone());
/// let mut svc: KeyedBreaker<_, _> = layer.layer(api);
/// assert_eq!(registry.names(), Vec::<String>::new());
/// assert_eq!(svc.ready().await.unwrap().call("db-1".to_string()).await.unwrap(), 4);
/// assert_eq!(registry.names(), vec!["db-1".to_string()]);
/// # }
/// ```
pub struct KeyedBreaker<S, F, C = DefaultClassifier, P = CountDependencyFailures> {
    inner: S,
    layer: KeyedBreakerLayer<F, C, P>,
}

impl<S: Clone, F: Clone, C: Clone, P: Clone> Clone for KeyedBreaker<S, F, C, P> {
    fn clone(&self) -> Self {
        KeyedBreaker {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, F, C, P> fmt::Debug for KeyedBreaker<S, F, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreaker")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, F, C, P> KeyedBreaker<S, F, C, P> {
    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use stormguard::breaker::{BreakerConfig, BreakerRegistry, KeyedBreakerLayer};
    ///
    /// struct Client { region: &'static str }
    ///
    /// let registry = BreakerRegistry::new(BreakerConfig::default());
    /// let layer = KeyedBreakerLayer::new(registry, |model: &String| model.clone());
    /// let mut svc = layer.layer(Client { region: "eu" });
    /// svc.get_mut().region = "us";
    /// assert_eq!(svc.get_ref().region, "us");
    /// let client: Client = svc.into_inner();
    /// assert_eq!(client.region, "us");
    /// ```
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

impl<S, F, C, P, Req, K> Service<Req> for KeyedBreaker<S, F, C, P>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    F: Fn(&Req) -> K,
    K: AsRef<str>,
    C: Classify<S::Response, S::Error> + Clone,
    P: super::CountPolicy + Clone,
{
    type Response = super::future::Watched<C, S::Response, S::Error, P>;
    type Error = BoxError;
    type Future = KeyedBreakerFuture<S, C, P, Req>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The breaker is in the request: admission, and the inner's readiness, come in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let name = (self.layer.key)(&req);
        let breaker = self.layer.registry.get(name.as_ref());
        let guarded = CircuitBreaker::new(
            self.inner.clone(),
            breaker,
            self.layer.classifier.clone(),
            self.layer.policy.clone(),
        );
        KeyedBreakerFuture::new(guarded, req)
    }
}
