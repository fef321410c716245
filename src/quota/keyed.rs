//! A quota per key (tenant, run, model), with weighted calls (tokens): [`KeyedQuotaLayer`].

mod builder;

use super::future::KeyedQuotaFuture;
use super::keys::Keys;
use super::wait::{sleep_for, too_costly};
use super::Rate;
use crate::error::BoxError;
use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

pub use builder::KeyedQuotaLayerBuilder;

/// Holds each key's calls to its own quota at a [`Rate`], weighted by their cost: a provider's
/// limits per organisation, per model, in requests or in tokens per minute.
///
/// `key_and_cost` reads the key (a tenant, a run, a model) and the call's cost (1 for a request
/// quota; the tokens it will use for a token quota) from the request. A call waits until its key
/// has room for its whole cost, in line behind that key's earlier calls (first come, first
/// served, GCRA as [`QuotaLayer`](super::QuotaLayer)), and never behind another key's. A call
/// that costs more than the burst could never go: it fails at once with `invalid_argument`
/// (retryable: false), without waiting; one that costs 0 goes at once and reserves nothing. The
/// cost is reserved when the call is made: estimate it from the request (a prompt's tokens plus
/// `max_tokens`). A call dropped while it waits (a timeout above, a cancelled run) keeps its
/// reservation: its room in the quota goes unused, as with [`QuotaLayer`](super::QuotaLayer).
///
/// Unlike [`QuotaLayer`](super::QuotaLayer), the wait happens in the call's future (the key is in
/// the request), and the inner service is driven ready after the wait, on a clone: the service is
/// always ready. A key's state lives while it has reservations ahead of now; once its quota is
/// full again it may be dropped: a shard (of 16) that reaches `capacity / 16` keys drops its idle
/// ones before it takes a new key. So `capacity` is when idle keys go, not a bound: busy keys are
/// never dropped (a shard with more busy keys than its share grows, with a `WARN`), and idle
/// keys stay until a new key comes to their shard (after a burst of many tenants, the memory of
/// that burst, at most, until traffic returns). Each call takes one short shard lock to find its
/// key.
///
/// [`new`](Self::new) makes a layer with the defaults (name `keyed-quota`, capacity 100,000 keys);
/// [`builder`](Self::builder) sets them.
///
/// The layer is generic over the key and the request, not over the closure: `key_and_cost` is
/// kept behind an `Arc<dyn Fn>` (one indirect call per request). With the closure's type in the
/// layer's, a borrowed key (`|_: &Req| ("org", 1)`, a `&'static str`) named the key's type twice,
/// and a `tokio::spawn` of a task holding the service failed to compile ("one type is more
/// general than the other": the check that the task is `Send` sees two unrelated lifetimes).
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::quota::{KeyedQuotaLayer, Rate};
///
/// struct Prompt { tenant: &'static str, tokens: u32 }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 1,000 tokens a second per tenant, up to 1,000 at once.
/// let tpm = Rate::per_second(1_000).burst(1_000).build().unwrap();
/// let layer = KeyedQuotaLayer::builder(tpm, |p: &Prompt| (p.tenant, p.tokens))
///     .name("tokens")
///     .build()
///     .unwrap();
/// let model = service_fn(|p: Prompt| async move { Ok::<_, std::io::Error>(p.tokens) });
/// let mut svc = layer.layer(model);
/// let start = tokio::time::Instant::now();
/// svc.ready().await.unwrap().call(Prompt { tenant: "a", tokens: 1_000 }).await.unwrap();
/// // Tenant b has its own quota: no wait.
/// svc.ready().await.unwrap().call(Prompt { tenant: "b", tokens: 1_000 }).await.unwrap();
/// assert_eq!(start.elapsed(), Duration::ZERO);
/// // Tenant a's next 500 tokens wait for half a second of refill.
/// svc.ready().await.unwrap().call(Prompt { tenant: "a", tokens: 500 }).await.unwrap();
/// assert_eq!(start.elapsed(), Duration::from_millis(500));
/// // More than the burst can never go.
/// let err = svc.ready().await.unwrap().call(Prompt { tenant: "a", tokens: 5_000 }).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<stormguard::error::ToolError>().unwrap().code().as_str(), "invalid_argument");
/// # }
/// ```
pub struct KeyedQuotaLayer<K, Req> {
    keys: Arc<Keys<K>>,
    key_and_cost: KeyFn<K, Req>,
    name: Cow<'static, str>,
}

/// A request's key and cost, as a layer keeps the closure that reads them.
type KeyFn<K, Req> = Arc<dyn Fn(&Req) -> (K, u32) + Send + Sync>;

impl<K, Req> KeyedQuotaLayer<K, Req> {
    /// Each key gets its own quota at `rate`; `key_and_cost` reads a request's key and cost.
    /// The defaults: name `keyed-quota`, capacity 100,000 keys (as
    /// `builder(rate, key_and_cost).build()`).
    pub fn new<F>(rate: Rate, key_and_cost: F) -> Self
    where
        F: Fn(&Req) -> (K, u32) + Send + Sync + 'static,
    {
        Self::with(
            rate,
            Arc::new(key_and_cost),
            Cow::Borrowed("keyed-quota"),
            DEFAULT_CAPACITY,
        )
    }

    /// A builder for a layer giving each key its own quota at `rate`; `key_and_cost` reads a
    /// request's key and cost.
    ///
    /// ```
    /// use stormguard::quota::{KeyedQuotaLayer, Rate};
    ///
    /// let rate = Rate::per_minute(500).build()?;
    /// let layer = KeyedQuotaLayer::builder(rate, |tenant: &String| (tenant.clone(), 1))
    ///     .name("per-tenant")
    ///     .capacity(10_000)
    ///     .build()?;
    /// # let _ = layer;
    /// let err = KeyedQuotaLayer::builder(rate, |tenant: &String| (tenant.clone(), 1))
    ///     .capacity(8)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "capacity");
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn builder<F>(rate: Rate, key_and_cost: F) -> KeyedQuotaLayerBuilder<K, Req>
    where
        F: Fn(&Req) -> (K, u32) + Send + Sync + 'static,
    {
        KeyedQuotaLayerBuilder {
            rate,
            key_and_cost: Arc::new(key_and_cost),
            name: Cow::Borrowed("keyed-quota"),
            capacity: DEFAULT_CAPACITY,
        }
    }

    fn with(
        rate: Rate,
        key_and_cost: KeyFn<K, Req>,
        name: Cow<'static, str>,
        capacity: usize,
    ) -> Self {
        KeyedQuotaLayer {
            keys: Arc::new(Keys::new(rate, capacity)),
            key_and_cost,
            name,
        }
    }

    /// The rate each key's quota holds calls to.
    pub fn rate(&self) -> Rate {
        self.keys.rate
    }

    /// The keys whose quotas are kept now (busy ones, and idle ones not dropped yet).
    pub fn keys(&self) -> usize
    where
        K: Hash + Eq + Clone,
    {
        self.keys.len()
    }
}

/// How many keys' quotas a [`KeyedQuotaLayer`] keeps by default before idle ones are dropped.
const DEFAULT_CAPACITY: usize = 100_000;

impl<K, Req> Clone for KeyedQuotaLayer<K, Req> {
    fn clone(&self) -> Self {
        KeyedQuotaLayer {
            keys: self.keys.clone(),
            key_and_cost: self.key_and_cost.clone(),
            name: self.name.clone(),
        }
    }
}

impl<K, Req> fmt::Debug for KeyedQuotaLayer<K, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQuotaLayer")
            .field("name", &self.name)
            .field("rate", &self.keys.rate)
            .finish_non_exhaustive()
    }
}

impl<S, K, Req> Layer<S> for KeyedQuotaLayer<K, Req> {
    type Service = KeyedQuota<S, K, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedQuota {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`KeyedQuotaLayer`] makes: always ready; each call waits, in its future
/// ([`KeyedQuotaFuture`]), for its own key's room.
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, Service, ServiceExt, service_fn};
/// use stormguard::quota::{KeyedQuota, KeyedQuotaLayer, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let rate = Rate::per_second(2).burst(1).build().unwrap();
/// let echo = service_fn(|tenant: &'static str| async move { Ok::<_, std::io::Error>(tenant) });
/// let mut svc: KeyedQuota<_, _, _> = KeyedQuotaLayer::new(rate, |t: &&'static str| (*t, 1)).layer(echo);
/// let start = tokio::time::Instant::now();
/// svc.ready().await.unwrap().call("a").await.unwrap();
/// svc.ready().await.unwrap().call("b").await.unwrap(); // another key: no wait
/// assert_eq!(start.elapsed(), Duration::ZERO);
/// svc.ready().await.unwrap().call("a").await.unwrap(); // a's next slot is 500 ms on
/// assert_eq!(start.elapsed(), Duration::from_millis(500));
/// # }
/// ```
pub struct KeyedQuota<S, K, Req> {
    inner: S,
    layer: KeyedQuotaLayer<K, Req>,
}

impl<S: Clone, K, Req> Clone for KeyedQuota<S, K, Req> {
    fn clone(&self) -> Self {
        KeyedQuota {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K, Req> fmt::Debug for KeyedQuota<S, K, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQuota")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, Req> KeyedQuota<S, K, Req> {
    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// use stormguard::quota::{KeyedQuotaLayer, Rate};
    ///
    /// struct Client { region: &'static str }
    ///
    /// let rate = Rate::per_second(5).build().unwrap();
    /// let layer = KeyedQuotaLayer::new(rate, |tenant: &String| (tenant.clone(), 1));
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

impl<S, K, Req> Service<Req> for KeyedQuota<S, K, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: Hash + Eq + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedQuotaFuture<S, Req>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The key is in the request: the wait, and the inner's readiness, come in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (key, cost) = (self.layer.key_and_cost)(&req);
        let rate = self.layer.keys.rate;
        if cost > rate.burst() {
            return KeyedQuotaFuture::failed(too_costly(cost, rate.burst(), "the quota"));
        }
        // A call that costs nothing reserves nothing and waits for nothing.
        let wait = if cost == 0 {
            std::time::Duration::ZERO
        } else {
            self.layer.keys.reserve_n(&key, cost)
        };
        let sleep = sleep_for(wait, &self.layer.name, cost);
        KeyedQuotaFuture::waiting(sleep, self.inner.clone(), req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn idle_keys_are_dropped_when_a_shard_fills() {
        let rate = Rate::per_second(10).build().unwrap();
        let layer = KeyedQuotaLayer::builder(rate, |k: &u32| (*k, 1))
            .capacity(16)
            .build()
            .unwrap();
        for k in 0..1_000u32 {
            let _ = layer.keys.gcra(&k).reserve_n(1);
        }
        // All busy (each reserved 100 ms ahead): kept.
        assert_eq!(layer.keys(), 1_000);
        tokio::time::advance(Duration::from_secs(1)).await;
        for k in 1_000..1_100u32 {
            let _ = layer.keys.gcra(&k).reserve_n(1);
        }
        // The idle thousand were dropped as the shards filled again.
        assert!(layer.keys() < 200, "{}", layer.keys());
        assert!(layer.capacity_check());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_costs_nothing_waits_for_nothing_and_reserves_nothing() {
        use tower::ServiceExt;
        let rate = Rate::per_second(10).burst(10).build().unwrap();
        let layer = KeyedQuotaLayer::new(rate, |c: &(u32, u32)| (c.0, c.1));
        let svc = layer.layer(tower::service_fn(|c: (u32, u32)| async move {
            Ok::<_, std::io::Error>(c.1)
        }));
        let start = tokio::time::Instant::now();
        svc.clone().oneshot((1, 10)).await.unwrap(); // drains key 1
        svc.clone().oneshot((1, 0)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        svc.clone().oneshot((1, 10)).await.unwrap(); // waits for a full refill, no more
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    /// A key borrowed for `'static` (`("org", 1)`) in a service a spawned task holds: this test
    /// is its compile check (with the closure's type in the layer's, it did not compile: "one
    /// type is more general than the other").
    #[tokio::test(start_paused = true)]
    async fn a_layer_with_a_static_str_key_runs_inside_tokio_spawn() {
        use tower::ServiceExt;
        let rate = Rate::per_second(10).build().unwrap();
        let served = tokio::spawn(async move {
            let layer = KeyedQuotaLayer::builder(rate, |_: &String| ("org", 1u32))
                .build()
                .unwrap();
            let svc = layer.layer(tower::service_fn(|s: String| async move {
                Ok::<_, std::io::Error>(s)
            }));
            svc.oneshot("call".to_string()).await.unwrap()
        });
        assert_eq!(served.await.unwrap(), "call");
    }

    impl<K, Req> KeyedQuotaLayer<K, Req> {
        fn capacity_check(&self) -> bool {
            self.keys.per_shard == 1
        }
    }
}
