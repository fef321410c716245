use super::{Gcra, Quota, Rate};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use tower_layer::Layer;

/// Holds calls to a [`Rate`], shared by every clone; makes [`Quota`] services. See the
/// [module docs](super).
///
/// ```
/// use stormguard::quota::{QuotaLayer, Rate};
///
/// let layer = QuotaLayer::new(Rate::per_minute(3_000).burst(20).build().unwrap())
///     .name("model-api");
/// assert_eq!(layer.rate().burst(), 20);
/// ```
#[derive(Clone)]
pub struct QuotaLayer {
    pub(super) state: Arc<Gcra>,
    rate: Rate,
    pub(super) name: Cow<'static, str>,
}

impl QuotaLayer {
    /// A layer holding calls to `rate`; its clones share the one quota.
    pub fn new(rate: Rate) -> Self {
        QuotaLayer {
            state: Arc::new(Gcra::new(rate)),
            rate,
            name: Cow::Borrowed("quota"),
        }
    }

    /// The name in metrics (`quota` label) and traces.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// The rate it holds calls to.
    pub fn rate(&self) -> Rate {
        self.rate
    }
}

impl fmt::Debug for QuotaLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaLayer")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .finish()
    }
}

impl<S> Layer<S> for QuotaLayer {
    type Service = Quota<S>;

    fn layer(&self, inner: S) -> Quota<S> {
        Quota::new(inner, self.clone())
    }
}
