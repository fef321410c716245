//! Each key's quota ([`Gcra`]) in a sharded map; idle keys are dropped when a shard grows past
//! its share.

use super::{Gcra, Rate};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};

pub(super) const SHARDS: usize = 16;

/// The keys' quotas, in shards; idle keys are dropped when a shard grows past its share.
pub(crate) struct Keys<K> {
    shards: Vec<Mutex<HashMap<K, Arc<Gcra>>>>,
    hasher: std::collections::hash_map::RandomState,
    pub(super) rate: Rate,
    /// Keys a shard holds before it drops its idle ones.
    pub(super) per_shard: usize,
}

impl<K> Keys<K> {
    /// Room for `capacity` keys, each held to its own `rate`.
    pub(crate) fn new(rate: Rate, capacity: usize) -> Keys<K> {
        Keys {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            rate,
            per_shard: capacity / SHARDS,
        }
    }
}

impl<K: Hash + Eq + Clone> Keys<K> {
    pub(crate) fn gcra(&self, key: &K) -> Arc<Gcra> {
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gcra) = map.get(key) {
            return gcra.clone();
        }
        if map.len() >= self.per_shard {
            // A full quota holds nothing: made anew, it answers the same.
            map.retain(|_, g| !g.idle());
            if map.len() >= self.per_shard {
                tracing::warn!(
                    keys = map.len(),
                    "keyed quota: more busy keys than its capacity; the shard grows"
                );
            }
        }
        let gcra = Arc::new(Gcra::new(self.rate));
        map.insert(key.clone(), gcra.clone());
        gcra
    }

    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}
