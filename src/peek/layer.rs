//! [`PeekErrorBodyLayer`] and its builder.

use super::PeekErrorBody;
use std::time::Duration;
use tower_layer::Layer;

/// The most a peek may read (1 MiB).
const MAX_LIMIT: usize = 1 << 20;

/// Reads up to `limit` bytes of a non-2xx response's body (for at most `timeout`), parses it as
/// an [`ErrorBody`](super::ErrorBody) into the response's extensions, and hands the response on with the same body:
/// the bytes read come first, then the rest of the original stream. A 2xx response passes
/// through untouched and unread (no allocation, no copy).
///
/// Put it directly above the HTTP client, below the layers that classify (a `Retry`, a
/// breaker with [`ModelApiClassifier`](crate::classify::ModelApiClassifier)).
///
/// Built with [`PeekErrorBodyLayer::builder`]: by default it reads at most 16 KiB, for at most
/// 2 s (a model API's error body is well under 1 KiB).
///
/// ```
/// use std::time::Duration;
/// use stormguard::peek::PeekErrorBodyLayer;
///
/// let peek = PeekErrorBodyLayer::builder().limit(16 * 1024).timeout(Duration::from_secs(2)).build()?;
/// assert_eq!(peek.limit(), 16 * 1024);
/// assert_eq!(PeekErrorBodyLayer::builder().build()?.timeout(), Duration::from_secs(2));
/// assert_eq!(PeekErrorBodyLayer::builder().limit(0).build().unwrap_err().field(), "limit");
/// assert_eq!(PeekErrorBodyLayer::builder().timeout(Duration::ZERO).build().unwrap_err().field(), "timeout");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeekErrorBodyLayer {
    limit: usize,
    timeout: Duration,
}

impl PeekErrorBodyLayer {
    /// A builder with the defaults: at most 16 KiB, for at most 2 s.
    pub fn builder() -> PeekErrorBodyLayerBuilder {
        PeekErrorBodyLayerBuilder {
            limit: 16 * 1024,
            timeout: Duration::from_secs(2),
        }
    }

    /// The most bytes of an error body it reads.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The longest it waits for an error body.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Builds a [`PeekErrorBodyLayer`]; [`build`](Self::build) rejects what cannot work.
///
/// ```
/// use std::time::Duration;
/// use stormguard::peek::{PeekErrorBodyLayer, PeekErrorBodyLayerBuilder};
///
/// let builder: PeekErrorBodyLayerBuilder = PeekErrorBodyLayer::builder().limit(4 * 1024);
/// let peek = builder.timeout(Duration::from_millis(500)).build()?;
/// assert_eq!((peek.limit(), peek.timeout()), (4 * 1024, Duration::from_millis(500)));
/// // More than 1 MiB is refused.
/// assert_eq!(PeekErrorBodyLayer::builder().limit(2 << 20).build().unwrap_err().field(), "limit");
/// # Ok::<(), stormguard::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct PeekErrorBodyLayerBuilder {
    limit: usize,
    timeout: Duration,
}

impl PeekErrorBodyLayerBuilder {
    /// Reads at most `limit` bytes of an error body (1 B to 1 MiB; default 16 KiB).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Waits at most `timeout` for them (1 ms to 1 min; default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The layer, or the setting that cannot work.
    pub fn build(self) -> Result<PeekErrorBodyLayer, crate::error::ConfigError> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            return Err(crate::error::ConfigError::new(
                "limit",
                "must be between 1 byte and 1 MiB",
            ));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout > Duration::from_secs(60) {
            return Err(crate::error::ConfigError::new(
                "timeout",
                "must be between 1 ms and 1 minute",
            ));
        }
        Ok(PeekErrorBodyLayer {
            limit: self.limit,
            timeout: self.timeout,
        })
    }
}

impl<S> Layer<S> for PeekErrorBodyLayer {
    type Service = PeekErrorBody<S>;

    fn layer(&self, inner: S) -> PeekErrorBody<S> {
        PeekErrorBody::new(inner, self.limit, self.timeout)
    }
}
