use super::{Breaker, CircuitBreaker, CountDependencyFailures};
use crate::classify::DefaultClassifier;
use tower_layer::Layer;

/// Applies a [`CircuitBreaker`] to a service. Every service the layer makes shares its
/// [`Breaker`].
///
/// ```
/// use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
/// use stormguard::classify::HttpClassifier;
///
/// let breaker = Breaker::new("billing-api", BreakerConfig::default());
/// let layer = CircuitBreakerLayer::new(breaker).classifier(HttpClassifier);
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct CircuitBreakerLayer<C = DefaultClassifier, P = CountDependencyFailures> {
    breaker: Breaker,
    classifier: C,
    policy: P,
}

impl CircuitBreakerLayer {
    /// A layer over `breaker`, counting with the default classifier and count policy.
    pub fn new(breaker: Breaker) -> Self {
        CircuitBreakerLayer {
            breaker,
            classifier: DefaultClassifier,
            policy: CountDependencyFailures,
        }
    }
}

impl<C, P> CircuitBreakerLayer<C, P> {
    /// Replaces the classifier.
    pub fn classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2, P> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier,
            policy: self.policy,
        }
    }

    /// Replaces the count policy (what counts as a failure, a success, or neither).
    pub fn count_policy<P2>(self, policy: P2) -> CircuitBreakerLayer<C, P2> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
            policy,
        }
    }
}

impl<S, C: Clone, P: Clone> Layer<S> for CircuitBreakerLayer<C, P> {
    type Service = CircuitBreaker<S, C, P>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::new(
            inner,
            self.breaker.clone(),
            self.classifier.clone(),
            self.policy.clone(),
        )
    }
}
