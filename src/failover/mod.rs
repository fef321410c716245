//! Failover that understands the failure: an ordered list of targets (providers or models),
//! each with its own breaker and quota, and a call that moves on only when its target cannot
//! serve it now and did nothing.
//!
//! | the target answered | the call |
//! |---|---|
//! | `quota_exhausted` (OpenAI's `insufficient_quota`) | moves on; the target is skipped for [`probe_every`](FailoverBuilder::probe_every) |
//! | `circuit_open` (its breaker) | moves on; nothing was sent there |
//! | overloaded or unavailable, not processed (529, `overloaded_error`, 503, connection refused) | moves on, also for a write: it did nothing |
//! | rate limited, asking a wait longer than [`max_wait`](FailoverBuilder::max_wait) (or none) | moves on; skipped for the server's wait |
//! | rate limited with a shorter wait | returned: the `Retry` above waits and retries here |
//! | `invalid_argument`, other model-recoverable, permanent or policy failures | returned: another provider would say the same |
//! | an ambiguous failure (a timeout, a reset after sending) | returned: it may have taken effect here, and a provider's idempotency key does not travel to another provider, so sending it elsewhere could do a write twice |
//! | a success or an empty answer | returned |
//!
//! A target that was left is skipped by later calls until its wait passes; then one call (not
//! every call) tries it first again, so the failover is sticky to a healthy target and comes back
//! to an earlier one within `probe_every` of its healing. Each move to another target is an
//! attempt of the operation (it counts against the `Retry` above's cap and is refused after the
//! operation's deadline) and a withdrawal from the failover's [`RetryBudget`]. When no target is
//! left, the call ends with a [`ToolError`](crate::error::ToolError) whose code is the last reason (`quota_exhausted`,
//! `circuit_open`, `unavailable`, `rate_limited`), whose hint names every target and why it was
//! left, and whose source is an [`Exhausted`] listing them.
//!
//! Where it goes: under the agent's `Retry`, over one stack per target:
//! `Retry -> Failover -> [breaker -> quota -> client]` for each target.
//!
//! ```
//! use std::time::Duration;
//! use stormguard::budget::RetryBudget;
//! use stormguard::error::{BoxError, ErrorCode};
//! use stormguard::failover::Failover;
//! use stormguard::error::ToolError;
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // Two model providers: the first has spent its quota, the second answers.
//! let spent = service_fn(|_: String| async {
//!     Err::<String, BoxError>(ToolError::new(ErrorCode::QuotaExhausted).into())
//! });
//! let healthy = service_fn(|prompt: String| async move { Ok::<_, BoxError>(format!("answer to {prompt}")) });
//! use tower::util::BoxCloneSyncService as Boxed;
//!
//! let failover = Failover::builder(RetryBudget::default(), "openai", Boxed::new(spent))
//!     .or("anthropic", Boxed::new(healthy))
//!     .probe_every(Duration::from_secs(1))
//!     .build()
//!     .unwrap();
//! let answer = failover.oneshot("hello".to_string()).await.unwrap();
//! assert_eq!(answer, "answer to hello");
//! # }
//! ```

mod decide;
mod run;
mod trail;

pub use decide::Leave;
pub use trail::{Exhausted, Tried};

use crate::budget::RetryBudget;
use crate::classify::DefaultClassifier;
use crate::error::{BoxError, ConfigError};
use crate::retry::DefaultReplay;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tower_service::Service;

/// Rewrites a request for the target it is about to be sent to (the model name, a base URL, a
/// key), given the target's name: any `Fn(&mut Req, &str)`, or [`NoRewrite`].
pub trait Rewrite<Req> {
    /// Rewrites `req` for the target named `target`.
    fn rewrite(&self, req: &mut Req, target: &str);
}

/// Sends every request as it is (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRewrite;

impl<Req> Rewrite<Req> for NoRewrite {
    fn rewrite(&self, _: &mut Req, _: &str) {}
}

impl<Req, F: Fn(&mut Req, &str)> Rewrite<Req> for F {
    fn rewrite(&self, req: &mut Req, target: &str) {
        self(req, target)
    }
}

/// A service over an ordered list of targets that moves a call on only when its target cannot
/// serve it now and did nothing (see the [module docs](self)).
///
/// Built with [`Failover::builder`]. Clones share the targets' state (which targets are skipped
/// and until when).
pub struct Failover<S, C = DefaultClassifier, R = DefaultReplay, W = NoRewrite> {
    shared: Arc<Shared<S, C, R, W>>,
}

/// The targets, their state and the settings, shared by every clone and every call.
struct Shared<S, C, R, W> {
    targets: Vec<(Cow<'static, str>, S)>,
    /// Per target: until when it is skipped, and why it was left.
    away: Mutex<run::TargetState>,
    budget: RetryBudget,
    max_wait: Duration,
    probe_every: Duration,
    rewrite: W,
    classifier: C,
    replay: R,
}

impl<S> Failover<S> {
    /// Starts a failover whose first target is `service`, named `name` (in metrics, traces and
    /// errors); moves to other targets draw on `budget`.
    ///
    /// ```
    /// use stormguard::budget::RetryBudget;
    /// use stormguard::failover::Failover;
    /// # use stormguard::error::BoxError;
    /// # let a = tower::service_fn(|r: String| async move { Ok::<_, BoxError>(r) });
    /// # let b = a.clone();
    ///
    /// let failover = Failover::builder(RetryBudget::default(), "primary", a)
    ///     .or("secondary", b)
    ///     .build()
    ///     .unwrap();
    /// # drop(failover);
    /// ```
    pub fn builder(
        budget: RetryBudget,
        name: impl Into<Cow<'static, str>>,
        service: S,
    ) -> FailoverBuilder<S> {
        FailoverBuilder {
            targets: vec![(name.into(), service)],
            budget,
            max_wait: DEFAULT_MAX_WAIT,
            probe_every: DEFAULT_PROBE_EVERY,
            rewrite: NoRewrite,
            classifier: DefaultClassifier,
            replay: DefaultReplay,
        }
    }
}

/// The default [`max_wait`](FailoverBuilder::max_wait): 1 s.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);
/// The default [`probe_every`](FailoverBuilder::probe_every): 1 s.
pub const DEFAULT_PROBE_EVERY: Duration = Duration::from_secs(1);
/// The most targets a failover takes.
pub const MAX_TARGETS: usize = 64;

/// Builds a [`Failover`]: the targets in order, then the settings.
pub struct FailoverBuilder<S, C = DefaultClassifier, R = DefaultReplay, W = NoRewrite> {
    targets: Vec<(Cow<'static, str>, S)>,
    budget: RetryBudget,
    max_wait: Duration,
    probe_every: Duration,
    rewrite: W,
    classifier: C,
    replay: R,
}

impl<S, C, R, W> FailoverBuilder<S, C, R, W> {
    /// The next target, tried when the ones before it cannot serve the call.
    pub fn or(mut self, name: impl Into<Cow<'static, str>>, service: S) -> Self {
        self.targets.push((name.into(), service));
        self
    }

    /// A rate limit whose wait is longer than this moves the call on; a shorter one is returned
    /// to the `Retry` above, which waits and retries on the same target. Default 1 s.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// How long a target that was left is skipped when the server named no longer wait; then
    /// one call tries it again. Default 1 s; at least 1 ms.
    pub fn probe_every(mut self, probe_every: Duration) -> Self {
        self.probe_every = probe_every;
        self
    }

    /// Rewrites each request for the target it goes to (a model name, a base URL, an API key),
    /// given the target's name; also for the first target.
    ///
    /// ```
    /// # use stormguard::budget::RetryBudget;
    /// # use stormguard::failover::Failover;
    /// # use stormguard::error::BoxError;
    /// # let client = tower::service_fn(|r: http::Request<String>| async move { Ok::<_, BoxError>(r.uri().to_string()) });
    /// let failover = Failover::builder(RetryBudget::default(), "gpt", client.clone())
    ///     .or("claude", client)
    ///     .rewrite(|req: &mut http::Request<String>, target: &str| {
    ///         let model = if target == "gpt" { "gpt-5" } else { "claude-sonnet" };
    ///         *req.body_mut() = format!(r#"{{"model":"{model}"}}"#);
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # drop(failover);
    /// ```
    pub fn rewrite<W2>(self, rewrite: W2) -> FailoverBuilder<S, C, R, W2> {
        FailoverBuilder {
            targets: self.targets,
            budget: self.budget,
            max_wait: self.max_wait,
            probe_every: self.probe_every,
            rewrite,
            classifier: self.classifier,
            replay: self.replay,
        }
    }

    /// How answers are classified (default: by their type, as every layer; see
    /// [`DefaultClassifier`]).
    pub fn classifier<C2>(self, classifier: C2) -> FailoverBuilder<S, C2, R, W> {
        FailoverBuilder {
            targets: self.targets,
            budget: self.budget,
            max_wait: self.max_wait,
            probe_every: self.probe_every,
            rewrite: self.rewrite,
            classifier,
            replay: self.replay,
        }
    }

    /// How a request is copied for the next target (default: [`DefaultReplay`]). A request that
    /// cannot be copied goes to one target only.
    pub fn replay<R2>(self, replay: R2) -> FailoverBuilder<S, C, R2, W> {
        FailoverBuilder {
            targets: self.targets,
            budget: self.budget,
            max_wait: self.max_wait,
            probe_every: self.probe_every,
            rewrite: self.rewrite,
            classifier: self.classifier,
            replay,
        }
    }

    /// The failover, or a [`ConfigError`] for two targets with one name, more than
    /// [`MAX_TARGETS`], or a `probe_every` under 1 ms.
    ///
    /// ```
    /// # use stormguard::budget::RetryBudget;
    /// # use stormguard::failover::Failover;
    /// # use stormguard::error::BoxError;
    /// # let a = tower::service_fn(|r: String| async move { Ok::<_, BoxError>(r) });
    /// let twice = Failover::builder(RetryBudget::default(), "a", a.clone()).or("a", a).build();
    /// assert_eq!(twice.unwrap_err().field(), "failover.targets");
    /// ```
    pub fn build(self) -> Result<Failover<S, C, R, W>, ConfigError> {
        if self.targets.len() > MAX_TARGETS {
            return Err(ConfigError::new(
                "failover.targets",
                "more targets than MAX_TARGETS (64)",
            ));
        }
        for (i, (name, _)) in self.targets.iter().enumerate() {
            if self.targets[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(ConfigError::new(
                    "failover.targets",
                    "two targets share one name; each needs its own (it names them in errors)",
                ));
            }
        }
        if self.probe_every < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "failover.probe_every",
                "under 1 ms; a target left would be tried again at once",
            ));
        }
        let away = Mutex::new(run::TargetState::new(self.targets.len()));
        Ok(Failover {
            shared: Arc::new(Shared {
                targets: self.targets,
                away,
                budget: self.budget,
                max_wait: self.max_wait,
                probe_every: self.probe_every,
                rewrite: self.rewrite,
                classifier: self.classifier,
                replay: self.replay,
            }),
        })
    }
}

impl<S, C, R, W> Failover<S, C, R, W> {
    /// The targets' names, in order.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.shared.targets.iter().map(|(name, _)| name.as_ref())
    }

    /// The targets skipped now, with why each was left and how long until it is tried again.
    ///
    /// ```
    /// # use stormguard::budget::RetryBudget;
    /// # use stormguard::failover::Failover;
    /// # use stormguard::error::BoxError;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # let a = tower::service_fn(|r: String| async move { Ok::<_, BoxError>(r) });
    /// let failover = Failover::builder(RetryBudget::default(), "a", a).build().unwrap();
    /// assert!(failover.skipped().is_empty());
    /// # }
    /// ```
    pub fn skipped(&self) -> Vec<(String, Leave, Duration)> {
        let now = tokio::time::Instant::now();
        let state = run::lock(&self.shared.away);
        self.shared
            .targets
            .iter()
            .zip(state.until.iter().zip(state.why.iter()))
            .filter_map(|((name, _), (until, why))| match (until, why) {
                (Some(until), Some(why)) if *until > now => {
                    Some((name.to_string(), *why, *until - now))
                }
                _ => None,
            })
            .collect()
    }
}

impl<S, C, R, W> Clone for Failover<S, C, R, W> {
    fn clone(&self) -> Self {
        Failover {
            shared: self.shared.clone(),
        }
    }
}

impl<S, C, R, W> fmt::Debug for Failover<S, C, R, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failover")
            .field("targets", &self.targets().collect::<Vec<_>>())
            .field("max_wait", &self.shared.max_wait)
            .field("probe_every", &self.shared.probe_every)
            .finish_non_exhaustive()
    }
}

impl<S, C, R, W> fmt::Debug for FailoverBuilder<S, C, R, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailoverBuilder")
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

/// The future of a [`Failover`] call (boxed: a call may visit several targets).
pub type ResponseFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, C, R, W, Req> Service<Req> for Failover<S, C, R, W>
where
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    S::Future: Send + 'static,
    C: crate::classify::Classify<S::Response, S::Error> + Send + Sync + 'static,
    R: crate::retry::Replay<Req> + Send + Sync + 'static,
    W: Rewrite<Req> + Send + Sync + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    /// Always ready: each target's readiness is awaited when the call reaches it.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        Box::pin(run::call(self.shared.clone(), req))
    }
}
