//! A provider's quota kept by the whole fleet: GCRA in Redis, keyed and weighted.

use super::future::{FleetQuotaFuture, State};
use super::link::Link;
use super::scripts;
use super::Fleet;
use crate::error::{BoxError, ConfigError};
use crate::quota::future::KeyedQuotaFuture;
use crate::quota::keys::Keys;
use crate::quota::wait::{sleep_for, too_costly};
use crate::quota::Rate;
use crate::telemetry::FLEET_LOCAL;
use std::borrow::Cow;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;

/// One quota as every layer and clone of it holds it: GCRA in Redis under the quota's key, and
/// the local per-key quotas it falls back to while the fleet is down.
struct RedisLimiter {
    link: Arc<Link>,
    name: Cow<'static, str>,
    rate: Rate,
    /// The per-key quotas used while the fleet is down, by the key as Redis sees it.
    fallback: Keys<String>,
    interval_us: u64,
    tolerance_us: u64,
}

/// A request's key (as written into Redis) and cost, as a layer keeps the closure that reads
/// them.
type KeyFn<Req> = Arc<dyn Fn(&Req) -> (String, u32) + Send + Sync>;

/// Holds the calls of every worker of a [`Fleet`] to one quota per key, weighted by cost: the
/// fleet as a whole stays under a provider's limits (requests or tokens per minute, per
/// organisation or model), where a [`KeyedQuotaLayer`](crate::quota::KeyedQuotaLayer) in each
/// worker would let N workers send N times the limit.
///
/// Each call reserves its cost in Redis (one script: GCRA on Redis's clock, first come first
/// served across the fleet, bursts up to the rate's `burst`) and waits in its own future for its
/// slot, then drives the inner service ready and calls it, as the keyed quota does. While the
/// fleet is down (or Redis does not answer within the fleet's timeout) each key's `fallback`
/// rate holds the call locally instead: set it to the provider's limit divided by the number of
/// workers. A call that costs more than the burst fails at once with `invalid_argument`; one that
/// costs 0 reserves nothing. A call dropped while it waits (or while its reservation is on its way
/// to Redis) keeps its reservation: its room goes unused, as with the local quotas. A call that
/// falls back locally and costs more than the fallback's burst waits until its whole cost fits
/// the fallback's rate (it is not refused: the fleet's burst is what it is checked against). Key
/// names are written into Redis keys: `{prefix}:quota:{bytes in name}:{name}:{key}`; the key of a quota full
/// again expires, so idle tenants cost Redis nothing.
///
/// The layer is generic over the request, not over the closure: `key_and_cost` is kept behind an
/// `Arc<dyn Fn>` that writes the key as a string at once (what Redis keys it by, and the
/// fallback too). So a borrowed key (`|_: &Req| ("org", 1)`) works in a service a spawned task
/// holds (with the key's type in the layer's, `tokio::spawn` failed to compile: "one type is more
/// general than the other").
///
/// # Backpressure
/// Always ready; the wait is in the call's future, on a clone of the inner service.
///
/// ```no_run
/// use std::time::Duration;
/// use tower::{Layer, ServiceExt, service_fn};
/// use stormguard::fleet::{Fleet, FleetQuotaLayer};
/// use stormguard::quota::Rate;
///
/// struct Prompt { tenant: String, tokens: u32 }
///
/// # #[tokio::main] async fn main() -> Result<(), stormguard::error::BoxError> {
/// let fleet = Fleet::builder("redis://127.0.0.1:6379/").build()?;
/// // 40,000 tokens a minute per tenant for the whole fleet of 8 workers.
/// // 40,000 a minute for the fleet; 5,000 a minute in this worker while Redis is down.
/// let fleet_rate = Rate::per_minute(40_000).burst(8_000).build()?;
/// let fallback = Rate::per_minute(5_000).burst(1_000).build()?;
/// let tpm = FleetQuotaLayer::builder(&fleet, "tpm", fleet_rate, fallback, |p: &Prompt| {
///     (p.tenant.clone(), p.tokens)
/// })
/// .build()?;
/// let model = tpm.layer(service_fn(|p: Prompt| async move { Ok::<_, std::io::Error>(p.tokens) }));
/// model.oneshot(Prompt { tenant: "acme".into(), tokens: 700 }).await?;
/// # Ok(()) }
/// ```
pub struct FleetQuotaLayer<Req> {
    limiter: Arc<RedisLimiter>,
    key_and_cost: KeyFn<Req>,
}

impl<Req> FleetQuotaLayer<Req> {
    /// A builder for the fleet's quota `name`, holding each key to `rate` across the fleet (the
    /// provider's limit) and to `fallback` in this worker while the fleet is down (the provider's
    /// limit divided by the number of workers: there is no safe guess, so both are required);
    /// `key_and_cost` reads a request's key (a tenant, a model; any `Display`) and cost (1 per
    /// request, or its tokens). The name is an argument, not a setter as on the local quotas,
    /// because it is the quota's identity in Redis: every worker that builds the quota of one
    /// name shares it (as with a fleet budget's name).
    pub fn builder<K, F>(
        fleet: &Fleet,
        name: impl Into<Cow<'static, str>>,
        rate: Rate,
        fallback: Rate,
        key_and_cost: F,
    ) -> FleetQuotaLayerBuilder<Req>
    where
        F: Fn(&Req) -> (K, u32) + Send + Sync + 'static,
        K: fmt::Display,
    {
        FleetQuotaLayerBuilder {
            fleet: fleet.clone(),
            name: name.into(),
            key_and_cost: Arc::new(move |req: &Req| {
                let (key, cost) = key_and_cost(req);
                (key.to_string(), cost)
            }),
            rate,
            fallback,
        }
    }

    /// The fleet-wide rate each key is held to.
    pub fn rate(&self) -> Rate {
        self.limiter.rate
    }
}

/// Builds a [`FleetQuotaLayer`]; made by [`FleetQuotaLayer::builder`], which takes both rates.
///
/// ```
/// use stormguard::fleet::{Fleet, FleetQuotaLayer};
/// use stormguard::quota::Rate;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap();
/// let rate = Rate::per_second(100).build().unwrap();
/// assert!(FleetQuotaLayer::builder(&fleet, "api", rate, rate, |_: &()| ("all", 1)).build().is_ok());
/// let too_fine = Rate::per_second(2_000_000).build().unwrap();
/// let err = FleetQuotaLayer::builder(&fleet, "api", too_fine, rate, |_: &()| ("all", 1)).build();
/// assert_eq!(err.unwrap_err().field(), "rate");
/// # }
/// ```
pub struct FleetQuotaLayerBuilder<Req> {
    fleet: Fleet,
    name: Cow<'static, str>,
    key_and_cost: KeyFn<Req>,
    rate: Rate,
    fallback: Rate,
}

impl<Req> fmt::Debug for FleetQuotaLayerBuilder<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetQuotaLayerBuilder")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl<Req> FleetQuotaLayerBuilder<Req> {
    /// The layer, or the setting that cannot work.
    pub fn build(self) -> Result<FleetQuotaLayer<Req>, ConfigError> {
        let (rate, fallback) = (self.rate, self.fallback);
        let interval_us = rate.interval().as_micros() as u64;
        if interval_us == 0 {
            return Err(ConfigError::new(
                "rate",
                "a fleet quota needs at least a microsecond between units",
            ));
        }
        Ok(FleetQuotaLayer {
            limiter: Arc::new(RedisLimiter {
                link: self.fleet.link.clone(),
                name: self.name,
                rate,
                fallback: Keys::new(fallback, 100_000),
                interval_us,
                tolerance_us: interval_us.saturating_mul(u64::from(rate.burst() - 1)),
            }),
            key_and_cost: self.key_and_cost,
        })
    }
}

impl<Req> Clone for FleetQuotaLayer<Req> {
    fn clone(&self) -> Self {
        FleetQuotaLayer {
            limiter: self.limiter.clone(),
            key_and_cost: self.key_and_cost.clone(),
        }
    }
}

impl<Req> fmt::Debug for FleetQuotaLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetQuotaLayer")
            .field("name", &self.limiter.name)
            .field("rate", &self.limiter.rate)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Layer<S> for FleetQuotaLayer<Req> {
    type Service = FleetQuota<S, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        FleetQuota {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`FleetQuotaLayer`] makes: each call reserves its cost in the fleet's quota (or,
/// while the fleet is down, in this worker's fallback) and waits for its slot in its future.
///
/// ```
/// use tower::{Layer, ServiceExt, service_fn};
/// use stormguard::fleet::{Fleet, FleetQuota, FleetQuotaLayer};
/// use stormguard::quota::Rate;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fleet = Fleet::builder("redis://127.0.0.1:1/").build().unwrap(); // down: local fallback
/// let (rate, fallback) = (Rate::per_second(1_000).burst(1_000).build().unwrap(), Rate::per_second(100).burst(100).build().unwrap());
/// let tpm = FleetQuotaLayer::builder(&fleet, "tokens", rate, fallback, |tokens: &u32| ("org", *tokens))
///     .build()
///     .unwrap();
/// let svc: FleetQuota<_, u32> = tpm.layer(service_fn(|t: u32| async move { Ok::<_, std::io::Error>(t) }));
/// assert_eq!(svc.clone().oneshot(50).await.unwrap(), 50);
/// // More than the fleet's burst can never go, whichever quota holds the call.
/// let err = svc.oneshot(5_000).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<stormguard::error::ToolError>().unwrap().code().as_str(), "invalid_argument");
/// # }
/// ```
pub struct FleetQuota<S, Req> {
    inner: S,
    layer: FleetQuotaLayer<Req>,
}

impl<S, Req> FleetQuota<S, Req> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, Req> Clone for FleetQuota<S, Req> {
    fn clone(&self) -> Self {
        FleetQuota {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, Req> fmt::Debug for FleetQuota<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetQuota")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, Req> Service<Req> for FleetQuota<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = FleetQuotaFuture<S, Req>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The key is in the request: the wait, and the inner's readiness, come in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (key, cost) = (self.layer.key_and_cost)(&req);
        let limiter = self.layer.limiter.clone();
        let burst = limiter.rate.burst();
        let inner = if cost > burst {
            KeyedQuotaFuture::failed(too_costly(cost, burst, "the fleet's quota"))
        } else if cost == 0 {
            KeyedQuotaFuture::waiting(None, self.inner.clone(), req)
        } else {
            return FleetQuotaFuture {
                state: State::Reserving {
                    reserve: Box::pin(reserve(limiter, key, cost)),
                    service: Some(self.inner.clone()),
                    request: Some(req),
                },
            };
        };
        FleetQuotaFuture {
            state: State::Then { inner },
        }
    }
}

/// Reserves `cost` for `key` in Redis, or in this worker's fallback quota while the fleet is
/// down; the sleep until the slot comes.
async fn reserve(limiter: Arc<RedisLimiter>, key: String, cost: u32) -> Option<Pin<Box<Sleep>>> {
    let redis_key = format!("{}:{key}", limiter.link.key("quota", &limiter.name));
    let mut invocation = scripts::QUOTA.key(redis_key);
    invocation
        .arg(limiter.interval_us)
        .arg(limiter.tolerance_us)
        .arg(cost);
    let wait = match limiter.link.eval::<u64>(&invocation).await {
        Ok(us) => Duration::from_micros(us),
        Err(_) => {
            metrics::counter!(FLEET_LOCAL, "part" => "quota").increment(1);
            limiter.fallback.reserve_n(&key, cost)
        }
    };
    sleep_for(wait, &limiter.name, cost)
}
