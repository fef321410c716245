//! Each key's quota ([`Gcra`]) in a sharded map; idle keys are dropped when a shard grows past
//! its share.
//!
//! A key is hashed once per call (SipHash with a random key, as `std`'s maps: keys are tenants
//! and may be chosen by whoever sends the calls): the hash picks the shard, and the shard's map
//! is keyed by the hash itself, each entry holding the keys with that hash (almost always one).

use super::{Gcra, Rate};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) const SHARDS: usize = 16;

/// The keys with one hash, and their quotas: almost always one.
type Bucket<K> = Vec<(K, Arc<Gcra>)>;

/// One shard: its keys by hash, and how many it holds.
struct Shard<K> {
    map: HashMap<u64, Bucket<K>, BuildHasherDefault<Prehashed>>,
    keys: usize,
}

/// The keys' quotas, in shards; idle keys are dropped when a shard grows past its share.
pub(crate) struct Keys<K> {
    shards: Vec<Mutex<Shard<K>>>,
    hasher: std::collections::hash_map::RandomState,
    pub(super) rate: Rate,
    /// Keys a shard holds before it drops its idle ones.
    pub(super) per_shard: usize,
}

impl<K> Keys<K> {
    /// Room for `capacity` keys, each held to its own `rate`.
    pub(crate) fn new(rate: Rate, capacity: usize) -> Keys<K> {
        Keys {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::default(),
                        keys: 0,
                    })
                })
                .collect(),
            hasher: Default::default(),
            rate,
            per_shard: capacity / SHARDS,
        }
    }
}

impl<K: Hash + Eq + Clone> Keys<K> {
    /// Reserves `cost` in `key`'s quota and says how long until it comes (zero: now).
    pub(crate) fn reserve_n(&self, key: &K, cost: u32) -> Duration {
        self.with(key, |gcra| gcra.reserve_n(cost))
    }

    /// `key`'s quota, made if it has none.
    #[cfg(test)]
    pub(crate) fn gcra(&self, key: &K) -> Arc<Gcra> {
        self.with(key, Arc::clone)
    }

    /// `f` on `key`'s quota, under its shard's lock.
    fn with<T>(&self, key: &K, f: impl FnOnce(&Arc<Gcra>) -> T) -> T {
        let hash = self.hasher.hash_one(key);
        // The middle bits pick the shard: the map inside uses the low ones and the top seven.
        let shard = &self.shards[((hash >> 32) as usize) % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = shard.map.get(&hash) {
            if let Some((_, gcra)) = bucket.iter().find(|(k, _)| k == key) {
                return f(gcra);
            }
        }
        if shard.keys >= self.per_shard {
            // A full quota holds nothing: made anew, it answers the same.
            shard.map.retain(|_, bucket| {
                bucket.retain(|(_, g)| !g.idle());
                !bucket.is_empty()
            });
            shard.keys = shard.map.values().map(Vec::len).sum();
            if shard.keys >= self.per_shard {
                tracing::warn!(
                    keys = shard.keys,
                    "keyed quota: more busy keys than its capacity; the shard grows"
                );
            }
        }
        let gcra = Arc::new(Gcra::new(self.rate));
        let out = f(&gcra);
        shard.map.entry(hash).or_default().push((key.clone(), gcra));
        shard.keys += 1;
        out
    }

    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).keys)
            .sum()
    }
}

/// The hasher of a map keyed by a hash already taken: it passes the `u64` through.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are written (`write_u64`); anything else is folded in, never lost.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keys_whose_hashes_collide_keep_their_own_quotas() {
        let keys: Keys<u32> = Keys::new(Rate::per_second(1).build().unwrap(), 1_000);
        // Two keys forced into one bucket: each is found, neither takes the other's room.
        let hash = keys.hasher.hash_one(1u32);
        let mut shard = keys.shards[((hash >> 32) as usize) % SHARDS]
            .lock()
            .unwrap();
        let other = Arc::new(Gcra::new(keys.rate));
        shard.map.entry(hash).or_default().push((2, other.clone()));
        shard.keys += 1;
        drop(shard);
        assert_eq!(keys.reserve_n(&1, 1), Duration::ZERO);
        assert_eq!(keys.reserve_n(&1, 1), Duration::from_secs(1));
        // Key 1 joined key 2's bucket and took nothing from it.
        assert!(other.idle());
        assert_eq!(keys.len(), 2);
    }
}
