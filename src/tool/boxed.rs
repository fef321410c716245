//! [`Boxed`]: a service behind a box, so that a stack whose layers a tool declaration chooses at
//! run time has one type.

use crate::error::BoxError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use tower_service::Service;

pub(super) type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

pin_project_lite::pin_project! {
    /// A future whose error is turned into `E`.
    struct ErrIntoFuture<F, E> {
        #[pin]
        future: F,
        into: std::marker::PhantomData<fn() -> E>,
    }
}

impl<F, T, E1, E> Future for ErrIntoFuture<F, E>
where
    F: Future<Output = Result<T, E1>>,
    E1: Into<E>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T, E>> {
        self.project().future.poll(cx).map_err(Into::into)
    }
}

/// What a boxed service can do: be ready, be called, be cloned.
trait Erased<Req, Res, E>: Send + Sync {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>>;
    fn call(&mut self, req: Req) -> BoxFuture<Res, E>;
    fn clone_box(&self) -> Box<dyn Erased<Req, Res, E>>;
}

/// Turns the errors of the service it holds into `E`. The service sits in a mutex only so that
/// a `Send` service that is not `Sync` (a `BoxCloneService`) still makes a `Sync` box: calls
/// reach it through `&mut` without locking; only a clone locks it.
struct ErrInto<S>(Mutex<S>);

impl<S> ErrInto<S> {
    fn service(&mut self) -> &mut S {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S, Req, Res, E> Erased<Req, Res, E> for ErrInto<S>
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Error: Into<E>,
    S::Future: Send + 'static,
    E: 'static,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        self.service().poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> BoxFuture<Res, E> {
        // Not an `async` block: the stack's future (some kilobytes) is moved once, into the box,
        // not into a block first.
        Box::pin(ErrIntoFuture {
            future: self.service().call(req),
            into: std::marker::PhantomData,
        })
    }

    fn clone_box(&self) -> Box<dyn Erased<Req, Res, E>> {
        let service = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Box::new(ErrInto(Mutex::new(service)))
    }
}

/// A service behind a box (one allocation per call, for its future), `Clone`, `Send` and
/// `Sync`, with errors as `E` (a [`BoxError`] below the tool's `Retry`).
pub(super) struct Boxed<Req, Res, E = BoxError>(Box<dyn Erased<Req, Res, E>>);

impl<Req: 'static, Res: 'static, E: 'static> Boxed<Req, Res, E> {
    pub(super) fn new<S>(service: S) -> Self
    where
        S: Service<Req, Response = Res> + Clone + Send + 'static,
        S::Error: Into<E>,
        S::Future: Send + 'static,
    {
        Boxed(Box::new(ErrInto(Mutex::new(service))))
    }
}

impl<Req, Res, E> Clone for Boxed<Req, Res, E> {
    fn clone(&self) -> Self {
        Boxed(self.0.clone_box())
    }
}

impl<Req, Res, E> fmt::Debug for Boxed<Req, Res, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Boxed")
    }
}

impl<Req, Res, E> Service<Req> for Boxed<Req, Res, E> {
    type Response = Res;
    type Error = E;
    type Future = BoxFuture<Res, E>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.0.call(req)
    }
}
