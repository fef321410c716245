//! [`SetIdempotencyKeyFuture`]: the future of [`SetIdempotencyKey`](super::SetIdempotencyKey),
//! the inner call's with the key stamped on its request, or a refusal ready at once (a key that
//! could not be derived, or a request that already carries a different one).
//!
//! ```
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use stormguard::error::{ErrorCode, ToolError};
//! use stormguard::key::{future::SetIdempotencyKeyFuture, Action, SetIdempotencyKeyLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let inner = service_fn(|_: http::Request<()>| async { Ok::<_, std::io::Error>("sent") });
//! // An empty run name cannot make a key: refused before the inner service is called.
//! let derive = |_: &http::Request<()>| Action::new("", "step-2", "t", &());
//! let mut svc = SetIdempotencyKeyLayer::new(derive).layer(inner);
//! let refused: SetIdempotencyKeyFuture<_> = svc.ready().await.unwrap().call(http::Request::new(()));
//! let err = refused.await.unwrap_err();
//! assert_eq!(err.downcast_ref::<ToolError>().unwrap().code(), ErrorCode::InvalidArgument);
//! # }
//! ```

use crate::error::{BoxError, ToolError};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// The future [`SetIdempotencyKey`](super::SetIdempotencyKey) returns: the inner call's, or a refusal that is ready at once.
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt, service_fn};
    /// use stormguard::key::{future::SetIdempotencyKeyFuture, Action, SetIdempotencyKeyLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let inner = service_fn(|_: http::Request<()>| async { Ok::<_, std::io::Error>("sent") });
    /// let derive = |_: &http::Request<()>| Action::new("run-1", "step-2", "t", &());
    /// let mut svc = SetIdempotencyKeyLayer::new(derive).layer(inner);
    /// let future: SetIdempotencyKeyFuture<_> = svc.ready().await.unwrap().call(http::Request::new(()));
    /// assert_eq!(future.await.unwrap(), "sent");
    /// # }
    /// ```
    pub struct SetIdempotencyKeyFuture<F> {
        #[pin]
        state: KeyState<F>,
    }
}

pin_project! {
    #[project = KeyStateProj]
    enum KeyState<F> {
        Called { #[pin] future: F },
        Refused { error: Option<ToolError> },
    }
}

impl<F> SetIdempotencyKeyFuture<F> {
    pub(super) fn called(future: F) -> Self {
        SetIdempotencyKeyFuture {
            state: KeyState::Called { future },
        }
    }

    pub(super) fn refused(error: ToolError) -> Self {
        SetIdempotencyKeyFuture {
            state: KeyState::Refused { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for SetIdempotencyKeyFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            KeyStateProj::Called { future } => future.poll(cx).map_err(Into::into),
            KeyStateProj::Refused { error } => Poll::Ready(Err(match error.take() {
                Some(e) => Box::new(e),
                None => "idempotency key future polled after completion".into(),
            })),
        }
    }
}

impl<F> fmt::Debug for SetIdempotencyKeyFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetIdempotencyKeyFuture")
            .finish_non_exhaustive()
    }
}
