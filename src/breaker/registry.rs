use super::{Breaker, BreakerConfig};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Hands out one [`Breaker`] per name (per host, per tool), made on first use with one config.
///
/// Each lookup takes one short lock (a map lookup). For a fixed dependency, look its breaker up
/// once, when you build the stack, and hand it to a
/// [`CircuitBreakerLayer`](super::CircuitBreakerLayer). Where the breaker depends on the request
/// (a model, a host), a [`KeyedBreakerLayer`](super::KeyedBreakerLayer) looks it up per call, by
/// design: one short lock per call is fine there.
///
/// ```
/// use stormguard::breaker::{BreakerConfig, BreakerRegistry};
///
/// let registry = BreakerRegistry::new(BreakerConfig::default());
/// let a = registry.get("billing-api");
/// let b = registry.get("billing-api");
/// assert_eq!(a.name(), b.name());
/// assert_eq!(registry.names(), vec!["billing-api".to_string()]);
/// ```
#[derive(Clone)]
pub struct BreakerRegistry {
    config: BreakerConfig,
    breakers: Arc<Mutex<HashMap<String, Breaker>>>,
}

impl BreakerRegistry {
    /// An empty registry whose breakers use `config`.
    pub fn new(config: BreakerConfig) -> Self {
        BreakerRegistry {
            config,
            breakers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The breaker named `name`, made now if it is new.
    pub fn get(&self, name: &str) -> Breaker {
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        breakers
            .entry(name.to_string())
            .or_insert_with(|| Breaker::new(name.to_string(), self.config.clone()))
            .clone()
    }

    /// The names of the breakers made so far, sorted.
    pub fn names(&self) -> Vec<String> {
        let breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = breakers.keys().cloned().collect();
        names.sort();
        names
    }
}

impl fmt::Debug for BreakerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerRegistry")
            .field("names", &self.names())
            .finish()
    }
}
