//! [`Either`]: one of two services, so that a declared stack's optional layers compose
//! statically (a layer left out is the other arm, a branch per call) and the whole stack is
//! boxed once, not once per layer.

use crate::error::BoxError;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_service::Service;

/// The layer's service (`With`) or the service it would have wrapped (`Without`).
#[derive(Clone, Debug)]
pub(super) enum Either<A, B> {
    With(A),
    Without(B),
}

impl<A, B, Req> Service<Req> for Either<A, B>
where
    A: Service<Req>,
    B: Service<Req, Response = A::Response>,
    A::Error: Into<BoxError>,
    B::Error: Into<BoxError>,
{
    type Response = A::Response;
    type Error = BoxError;
    type Future = EitherFuture<A::Future, B::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Either::With(a) => a.poll_ready(cx).map_err(Into::into),
            Either::Without(b) => b.poll_ready(cx).map_err(Into::into),
        }
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        match self {
            Either::With(a) => EitherFuture::With {
                future: a.call(req),
            },
            Either::Without(b) => EitherFuture::Without {
                future: b.call(req),
            },
        }
    }
}

pin_project! {
    /// The future of the arm called.
    #[project = EitherProj]
    pub(super) enum EitherFuture<A, B> {
        With { #[pin] future: A },
        Without { #[pin] future: B },
    }
}

impl<A, B, T, EA, EB> Future for EitherFuture<A, B>
where
    A: Future<Output = Result<T, EA>>,
    B: Future<Output = Result<T, EB>>,
    EA: Into<BoxError>,
    EB: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EitherProj::With { future } => future.poll(cx).map_err(Into::into),
            EitherProj::Without { future } => future.poll(cx).map_err(Into::into),
        }
    }
}
