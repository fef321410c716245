//! [`KeyedQuotaLayerBuilder`]: a keyed quota's name and capacity, checked when it is built.

use super::{KeyFn, KeyedQuotaLayer};
use crate::error::ConfigError;
use crate::quota::keys::SHARDS;
use crate::quota::Rate;
use std::borrow::Cow;
use std::fmt;

/// Builds a [`KeyedQuotaLayer`]; made by [`KeyedQuotaLayer::builder`].
///
/// ```
/// use stormguard::quota::{KeyedQuotaLayer, KeyedQuotaLayerBuilder, Rate};
///
/// let rate = Rate::per_minute(60).build()?;
/// let builder: KeyedQuotaLayerBuilder<String, String> = KeyedQuotaLayer::builder(rate, |t: &String| (t.clone(), 1));
/// let region = "eu";
/// let layer = builder.name(format!("tenants-{region}")).capacity(1_000).build()?;
/// assert_eq!(layer.rate(), rate);
/// assert!(format!("{layer:?}").contains("tenants-eu"));
/// assert_eq!(layer.keys(), 0); // a key's quota is made on its first call
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[must_use]
pub struct KeyedQuotaLayerBuilder<K, Req> {
    pub(super) rate: Rate,
    pub(super) key_and_cost: KeyFn<K, Req>,
    pub(super) name: Cow<'static, str>,
    pub(super) capacity: usize,
}

impl<K, Req> KeyedQuotaLayerBuilder<K, Req> {
    /// The name in metrics (`quota` label) and traces (default `keyed-quota`).
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// How many keys' quotas may be kept before idle ones are dropped (100,000 by default; at
    /// least 16, at most 100,000,000): each of the 16 shards drops its idle keys when it reaches
    /// its share and a new key comes to it. Not a bound on busy keys, which are never dropped.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The layer, or the setting that cannot work.
    pub fn build(self) -> Result<KeyedQuotaLayer<K, Req>, ConfigError> {
        if !(SHARDS..=100_000_000).contains(&self.capacity) {
            return Err(ConfigError::new(
                "capacity",
                "must be between 16 and 100,000,000 keys",
            ));
        }
        Ok(KeyedQuotaLayer::with(
            self.rate,
            self.key_and_cost,
            self.name,
            self.capacity,
        ))
    }
}

impl<K, Req> fmt::Debug for KeyedQuotaLayerBuilder<K, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQuotaLayerBuilder")
            .field("rate", &self.rate)
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}
