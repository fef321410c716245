use super::{Breaker, BreakerConfig, State};
use crate::error::ConfigError;
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
/// Keyed by something open-ended (a tenant), the registry would grow with every name it ever saw:
/// when it holds `capacity` breakers (10,000 by default, [`with_capacity`](Self::with_capacity)),
/// a new name first drops the closed breakers no one else holds (no stack, no call under way);
/// their counts of recent failures go with them. Open and half-open breakers, and breakers in
/// use, are kept: past `capacity` of those the registry grows, with a `WARN`.
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
    capacity: usize,
    breakers: Arc<Mutex<HashMap<String, Breaker>>>,
}

/// How many breakers a registry holds by default before it drops the closed, unused ones.
const DEFAULT_CAPACITY: usize = 10_000;

impl BreakerRegistry {
    /// An empty registry whose breakers use `config`.
    pub fn new(config: BreakerConfig) -> Self {
        BreakerRegistry {
            config,
            capacity: DEFAULT_CAPACITY,
            breakers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// An empty registry that drops its closed, unused breakers when it holds `capacity` (at
    /// least 1) and a new name comes.
    ///
    /// ```
    /// use stormguard::breaker::{BreakerConfig, BreakerRegistry};
    ///
    /// let registry = BreakerRegistry::with_capacity(BreakerConfig::default(), 2)?;
    /// let held = registry.get("tenant-1"); // a stack holds this one
    /// registry.get("tenant-2");
    /// registry.get("tenant-3"); // full: tenant-2's breaker (closed, unused) goes
    /// assert_eq!(registry.names(), vec!["tenant-1".to_string(), "tenant-3".to_string()]);
    /// assert_eq!(BreakerRegistry::with_capacity(BreakerConfig::default(), 0).unwrap_err().field(), "capacity");
    /// # drop(held);
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn with_capacity(config: BreakerConfig, capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new("capacity", "must be at least 1"));
        }
        Ok(BreakerRegistry {
            capacity,
            ..BreakerRegistry::new(config)
        })
    }

    /// The breaker named `name`, made now if it is new.
    pub fn get(&self, name: &str) -> Breaker {
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(breaker) = breakers.get(name) {
            return breaker.clone();
        }
        if breakers.len() >= self.capacity {
            // Only this map holds it, and it is closed: nothing is lost but recent counts.
            breakers.retain(|_, b| Arc::strong_count(&b.machine) > 1 || b.state() != State::Closed);
            if breakers.len() >= self.capacity {
                tracing::warn!(
                    breakers = breakers.len(),
                    capacity = self.capacity,
                    "breaker registry: more open or busy breakers than its capacity; it grows"
                );
            }
        }
        let breaker = Breaker::new(name.to_string(), self.config.clone());
        breakers.insert(name.to_string(), breaker.clone());
        breaker
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
