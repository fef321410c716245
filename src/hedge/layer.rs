//! [`HedgeLayer`] and its builder: the delay, the name, the classifier and the replay.

use super::latency::Latencies;
use super::{Hedge, HedgeState};
use crate::budget::RetryBudget;
use crate::classify::DefaultClassifier;
use crate::error::ConfigError;
use crate::retry::DefaultReplay;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// The longest fixed delay accepted.
const MAX_DELAY: Duration = Duration::from_secs(3600);

/// Builds a [`HedgeLayer`] from its delay: [`HedgeLayer::fixed`] or [`HedgeLayer::percentile`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::{budget::RetryBudget, hedge::HedgeLayer};
///
/// let region = "eu";
/// // The name (a `&'static str`, or a `String` made at run time) labels its metrics.
/// let layer = HedgeLayer::percentile(RetryBudget::default(), 0.95, 100)
///     .name(format!("search-{region}"))
///     .build()?;
/// assert!(format!("{layer:?}").contains("search-eu"));
/// assert_eq!(layer.delay(), None); // no hedge before 100 answers were seen
/// // A delay of zero, a quantile outside (0, 1): refused.
/// assert_eq!(HedgeLayer::fixed(RetryBudget::default(), Duration::ZERO).build().unwrap_err().field(), "delay");
/// assert!(HedgeLayer::percentile(RetryBudget::default(), 1.0, 10).build().is_err());
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[must_use]
pub struct HedgeLayerBuilder<C = DefaultClassifier, R = DefaultReplay> {
    budget: RetryBudget,
    delay: DelaySpec,
    classifier: C,
    replay: R,
    name: Cow<'static, str>,
}

#[derive(Clone, Copy, Debug)]
enum DelaySpec {
    Fixed(Duration),
    Percentile { q: f64, min_samples: u32 },
}

impl<C, R> fmt::Debug for HedgeLayerBuilder<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayerBuilder")
            .field("delay", &self.delay)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<C, R> HedgeLayerBuilder<C, R> {
    /// The layer's name in metrics (`layer` label) and traces (default `hedge`).
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Replaces the classifier (what a failure is: a failure waits for the other attempt).
    pub fn classifier<C2>(self, classifier: C2) -> HedgeLayerBuilder<C2, R> {
        HedgeLayerBuilder {
            budget: self.budget,
            delay: self.delay,
            classifier,
            replay: self.replay,
            name: self.name,
        }
    }

    /// Replaces how a request is copied for the hedge (default: `Clone`; `HttpReplay`,
    /// `GrpcReplay` for those requests).
    pub fn replay<R2>(self, replay: R2) -> HedgeLayerBuilder<C, R2> {
        HedgeLayerBuilder {
            budget: self.budget,
            delay: self.delay,
            classifier: self.classifier,
            replay,
            name: self.name,
        }
    }

    /// The layer, or what is wrong with the settings.
    pub fn build(self) -> Result<HedgeLayer<C, R>, ConfigError> {
        let (fixed, latencies) = match self.delay {
            DelaySpec::Fixed(d) => {
                if d < Duration::from_micros(1) || d > MAX_DELAY {
                    return Err(ConfigError::new("delay", "must be between 1 µs and 1 h"));
                }
                (Some(d), Latencies::new(0.5, u32::MAX))
            }
            DelaySpec::Percentile { q, min_samples } => {
                if !(q > 0.0 && q < 1.0) {
                    return Err(ConfigError::new(
                        "percentile",
                        "the quantile must be above 0 and below 1",
                    ));
                }
                if !(1..=1_000_000).contains(&min_samples) {
                    return Err(ConfigError::new(
                        "min_samples",
                        "must be between 1 and 1,000,000",
                    ));
                }
                (None, Latencies::new(q, min_samples))
            }
        };
        Ok(HedgeLayer {
            shared: Arc::new(HedgeState {
                budget: self.budget,
                fixed,
                latencies,
                classifier: self.classifier,
                replay: self.replay,
                name: self.name,
            }),
        })
    }
}

/// Applies [`Hedge`] to a service; every service it makes shares one latency record.
///
/// ```
/// use std::time::Duration;
/// use stormguard::{budget::RetryBudget, hedge::HedgeLayer};
///
/// let layer = HedgeLayer::fixed(RetryBudget::default(), Duration::from_millis(30)).build()?;
/// # let _ = layer;
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
pub struct HedgeLayer<C = DefaultClassifier, R = DefaultReplay> {
    shared: Arc<HedgeState<C, R>>,
}

impl HedgeLayer {
    /// A builder that hedges a call still unanswered after `delay` (1 µs to 1 h), drawing
    /// hedges from `budget` (the budget the `Retry` layers share).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::{budget::RetryBudget, hedge::HedgeLayer};
    ///
    /// let layer = HedgeLayer::fixed(RetryBudget::default(), Duration::from_millis(30)).build()?;
    /// assert_eq!(layer.delay(), Some(Duration::from_millis(30)));
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn fixed(budget: RetryBudget, delay: Duration) -> HedgeLayerBuilder {
        HedgeLayerBuilder::new(budget, DelaySpec::Fixed(delay))
    }

    /// A builder that hedges a call still unanswered after the `q` quantile (`0 < q < 1`, e.g.
    /// 0.95) of the last 512 reads' latencies, once `min_samples` (1 to 1,000,000) reads were
    /// answered, drawing hedges from `budget` (the budget the `Retry` layers share).
    ///
    /// ```
    /// use stormguard::{budget::RetryBudget, hedge::HedgeLayer};
    ///
    /// let layer = HedgeLayer::percentile(RetryBudget::default(), 0.95, 100).build()?;
    /// assert_eq!(layer.delay(), None); // no hedge before 100 answers were seen
    /// # Ok::<(), stormguard::error::ConfigError>(())
    /// ```
    pub fn percentile(budget: RetryBudget, q: f64, min_samples: u32) -> HedgeLayerBuilder {
        HedgeLayerBuilder::new(budget, DelaySpec::Percentile { q, min_samples })
    }
}

impl HedgeLayerBuilder {
    fn new(budget: RetryBudget, delay: DelaySpec) -> Self {
        HedgeLayerBuilder {
            budget,
            delay,
            classifier: DefaultClassifier,
            replay: DefaultReplay,
            name: Cow::Borrowed("hedge"),
        }
    }
}

impl<C, R> HedgeLayer<C, R> {
    /// The delay a call made now would wait before its hedge, if one is known yet.
    pub fn delay(&self) -> Option<Duration> {
        self.shared.fixed.or_else(|| self.shared.latencies.delay())
    }
}

impl<C, R: Clone> HedgeLayer<C, R> {
    /// The same settings, reading answers with `classifier` (and a latency record of its own).
    pub(crate) fn with_classifier<C2>(&self, classifier: C2) -> HedgeLayer<C2, R> {
        let s = &self.shared;
        HedgeLayer {
            shared: Arc::new(HedgeState {
                budget: s.budget.clone(),
                fixed: s.fixed,
                latencies: s.latencies.fresh(),
                classifier,
                replay: s.replay.clone(),
                name: s.name.clone(),
            }),
        }
    }
}

impl<C, R> Clone for HedgeLayer<C, R> {
    fn clone(&self) -> Self {
        HedgeLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C, R> fmt::Debug for HedgeLayer<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("name", &self.shared.name)
            .field("delay", &self.delay())
            .finish_non_exhaustive()
    }
}

impl<S, C, R> Layer<S> for HedgeLayer<C, R> {
    type Service = Hedge<S, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge {
            inner,
            shared: self.shared.clone(),
        }
    }
}
