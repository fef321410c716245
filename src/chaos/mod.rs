//! Crash on purpose: a seeded fault layer that injects what breaks agents (feature `chaos`).
//!
//! Generic fault injection (an error, some latency) misses the failures that duplicate side
//! effects: the ones that come *after the work was done*. [`ChaosLayer`] goes right above a client
//! (or a fake provider) and, for a share of attempts drawn from a seed, answers as a real
//! provider or proxy does on a bad day:
//!
//! | [`Fault`] | what the caller sees | did the inner service do the work? |
//! |---|---|---|
//! | `RateLimited` | 429 with `Retry-After` and `retry-after-ms` | no |
//! | `QuotaExhausted` | 429 with OpenAI's `insufficient_quota` body | no |
//! | `Overloaded` | 529 with Anthropic's `overloaded_error` body | no |
//! | `Unavailable` | 503 | no |
//! | `FailedAfterWork(status)` | a 502 or 503 from a proxy, after forwarding | **yes** |
//! | `ResetAfterWork` | the connection reset (`io::ErrorKind::ConnectionReset`) | **yes** |
//! | `LateCommit(after)` | a timeout at once (`io::ErrorKind::TimedOut`) | **yes, `after` later** |
//! | `Latency(d)` | the answer, `d` later (tokio's clock) | yes |
//!
//! Over an MCP tool service (`CallToolResult`, feature `rmcp`), each fault's answer is an
//! `isError` result carrying the structured error instead of a status.
//! A streamed answer cut mid-stream is [`StreamCutLayer`]'s (a share of answers whose body fails
//! after some data frames).
//!
//! The draw is a pure function of (seed, operation, attempt): the operation is what the
//! [`operation`](ChaosLayerBuilder::operation) function names (by default each call is its own),
//! the attempt is how many times the layer has seen that operation. So the same seed gives the
//! same faults for the same calls, and every retry of an operation draws again. What the layer did is kept in its [`Effects`]: how many
//! times the inner service did the work for each operation, which a test turns into "no effect
//! twice". With no fault configured the layer passes calls through untouched (no allocation).
//!
//! ```
//! use std::time::Duration;
//! use stormguard::chaos::{ChaosLayer, Fault};
//! use stormguard::error::BoxError;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let chaos = ChaosLayer::builder(7)
//!     .fault(Fault::FailedAfterWork(502), 0.2)
//!     .fault(Fault::RateLimited(Duration::from_secs(1)), 0.1)
//!     .build()
//!     .unwrap();
//! let effects = chaos.effects();
//! let provider = chaos.layer(service_fn(|_: http::Request<String>| async {
//!     Ok::<_, BoxError>(http::Response::new(String::from("sent")))
//! }));
//! for _ in 0..1_000 {
//!     let _ = provider.clone().oneshot(http::Request::new(String::new())).await;
//! }
//! // About 20 % of the calls did the work and answered 502; 10 % did not do it.
//! assert!((150..250).contains(&effects.failed_after_work()));
//! assert_eq!(effects.work_done(), 1_000 - effects.not_done());
//! # }
//! ```

mod agent;
#[cfg(feature = "http")]
mod cut;
mod decide;
mod effects;
mod episodes;
#[cfg(all(feature = "sqlite", unix))]
mod processes;
mod provider;
mod script;
mod service;
mod settings;
mod svg;

#[cfg(feature = "http")]
pub use cut::{CutBody, CutFuture, StreamCut, StreamCutLayer};
pub use effects::{Effect, Effects};
pub use episodes::{Harness, Report};
pub use script::{Applies, Resume, Step};
pub use service::{Chaos, FaultAnswer, ResponseFuture};

use crate::error::ConfigError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// One fault the layer injects (see the [module docs](self) for what each looks like).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// 429 with `Retry-After` (whole seconds, rounded up) and `retry-after-ms`; nothing done.
    RateLimited(Duration),
    /// 429 with OpenAI's `insufficient_quota` error body; nothing done.
    QuotaExhausted,
    /// 529 with Anthropic's `overloaded_error` body; nothing done.
    Overloaded,
    /// 503, nothing done.
    Unavailable,
    /// The inner service does the work; the caller gets this status (502, 503, 504: a proxy that
    /// forwarded the request and lost the answer).
    FailedAfterWork(u16),
    /// The inner service does the work; the caller gets a connection reset.
    ResetAfterWork,
    /// The caller gets a timeout at once; the inner service does the work this long after (the
    /// request was queued somewhere and lands after the caller gave up).
    LateCommit(Duration),
    /// The call goes through, this much later.
    Latency(Duration),
}

impl Fault {
    /// The snake_case name used in metrics and in the [`Effects`].
    ///
    /// ```
    /// assert_eq!(stormguard::chaos::Fault::ResetAfterWork.as_str(), "reset_after_work");
    /// ```
    pub const fn as_str(&self) -> &'static str {
        match self {
            Fault::RateLimited(_) => "rate_limited",
            Fault::QuotaExhausted => "quota_exhausted",
            Fault::Overloaded => "overloaded",
            Fault::Unavailable => "unavailable",
            Fault::FailedAfterWork(_) => "failed_after_work",
            Fault::ResetAfterWork => "reset_after_work",
            Fault::LateCommit(_) => "late_commit",
            Fault::Latency(_) => "latency",
        }
    }

    /// Whether the inner service does the work when this fault is drawn.
    pub const fn does_the_work(&self) -> bool {
        matches!(
            self,
            Fault::FailedAfterWork(_)
                | Fault::ResetAfterWork
                | Fault::LateCommit(_)
                | Fault::Latency(_)
        )
    }
}

/// Names the operation a request belongs to (two calls with the same name are attempts of one
/// action): any `Fn(&Req) -> u64` (a hash of its idempotency key, of its arguments, of the
/// task's identity), or [`EachCall`].
pub trait NameOperation<Req> {
    /// The operation of `req`, or `None`: a new one for each call.
    fn operation(&self, req: &Req) -> Option<u64>;
}

/// Each call is an operation of its own (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct EachCall;

impl<Req> NameOperation<Req> for EachCall {
    fn operation(&self, _: &Req) -> Option<u64> {
        None
    }
}

impl<Req, F: Fn(&Req) -> u64> NameOperation<Req> for F {
    fn operation(&self, req: &Req) -> Option<u64> {
        Some(self(req))
    }
}

/// What every clone of the layer and its services share.
pub(crate) struct Plan {
    pub(crate) seed: u64,
    pub(crate) faults: Vec<(Fault, f64)>,
    pub(crate) effects: Effects,
}

/// The fault layer; built with [`ChaosLayer::builder`].
pub struct ChaosLayer<O = EachCall> {
    plan: Arc<Plan>,
    operation: O,
}

impl ChaosLayer {
    /// A layer whose draws come from `seed`.
    pub fn builder(seed: u64) -> ChaosLayerBuilder {
        ChaosLayerBuilder {
            seed,
            faults: Vec::new(),
            operation: EachCall,
        }
    }

    /// A layer that injects nothing: calls pass through untouched.
    ///
    /// ```
    /// let off = stormguard::chaos::ChaosLayer::off();
    /// assert_eq!(off.effects().calls(), 0);
    /// ```
    pub fn off() -> Self {
        ChaosLayer {
            plan: Arc::new(Plan {
                seed: 0,
                faults: Vec::new(),
                effects: Effects::default(),
            }),
            operation: EachCall,
        }
    }
}

impl<O> ChaosLayer<O> {
    /// What the layer's services did, shared with them.
    pub fn effects(&self) -> Effects {
        self.plan.effects.clone()
    }
}

impl<O: Clone> Clone for ChaosLayer<O> {
    fn clone(&self) -> Self {
        ChaosLayer {
            plan: self.plan.clone(),
            operation: self.operation.clone(),
        }
    }
}

impl<O> fmt::Debug for ChaosLayer<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosLayer")
            .field("seed", &self.plan.seed)
            .field("faults", &self.plan.faults)
            .finish_non_exhaustive()
    }
}

impl<S, O: Clone> Layer<S> for ChaosLayer<O> {
    type Service = Chaos<S, O>;

    fn layer(&self, inner: S) -> Self::Service {
        Chaos::new(inner, self.plan.clone(), self.operation.clone())
    }
}

/// Builds a [`ChaosLayer`].
pub struct ChaosLayerBuilder<O = EachCall> {
    seed: u64,
    faults: Vec<(Fault, f64)>,
    operation: O,
}

impl<O> ChaosLayerBuilder<O> {
    /// Injects `fault` into a share `probability` of attempts (the shares of all faults add up
    /// to at most 1).
    pub fn fault(mut self, fault: Fault, probability: f64) -> Self {
        self.faults.push((fault, probability));
        self
    }

    /// Names the operation each request belongs to, so that the attempts of one action draw
    /// from one stream and the [`Effects`] count work per action. By default each call is an
    /// operation of its own.
    ///
    /// ```
    /// use stormguard::chaos::{ChaosLayer, Fault};
    ///
    /// // Attempts of one charge share its idempotency key.
    /// let chaos = ChaosLayer::builder(7)
    ///     .fault(Fault::ResetAfterWork, 0.3)
    ///     .operation(|req: &http::Request<String>| {
    ///         let key = req.headers().get("idempotency-key").map(|v| v.as_bytes()).unwrap_or_default();
    ///         key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # drop(chaos);
    /// ```
    pub fn operation<O2>(self, operation: O2) -> ChaosLayerBuilder<O2> {
        ChaosLayerBuilder {
            seed: self.seed,
            faults: self.faults,
            operation,
        }
    }

    /// The layer, or a [`ConfigError`]: a probability outside `[0, 1]` or not a number, shares
    /// adding up to more than 1, a `FailedAfterWork` status that is not 5xx.
    ///
    /// ```
    /// use stormguard::chaos::{ChaosLayer, Fault};
    /// assert!(ChaosLayer::builder(1).fault(Fault::Overloaded, 0.7).fault(Fault::Unavailable, 0.4).build().is_err());
    /// assert!(ChaosLayer::builder(1).fault(Fault::FailedAfterWork(200), 0.1).build().is_err());
    /// ```
    pub fn build(self) -> Result<ChaosLayer<O>, ConfigError> {
        let mut total = 0.0;
        for (fault, p) in &self.faults {
            if !(0.0..=1.0).contains(p) {
                return Err(ConfigError::new(
                    "chaos.fault",
                    "a probability outside [0, 1] or not a number",
                ));
            }
            if let Fault::FailedAfterWork(status) = fault {
                if !(500..600).contains(status) {
                    return Err(ConfigError::new(
                        "chaos.fault",
                        "FailedAfterWork takes a 5xx status (a proxy's answer)",
                    ));
                }
            }
            total += p;
        }
        if total > 1.0 + 1e-9 {
            return Err(ConfigError::new(
                "chaos.fault",
                "the faults' probabilities add up to more than 1",
            ));
        }
        Ok(ChaosLayer {
            plan: Arc::new(Plan {
                seed: self.seed,
                faults: self.faults,
                effects: Effects::default(),
            }),
            operation: self.operation,
        })
    }
}

impl<O> fmt::Debug for ChaosLayerBuilder<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosLayerBuilder")
            .field("seed", &self.seed)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}
