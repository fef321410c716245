//! What the benches share: a leaf service that answers at once, and one call polled once.

use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use tower::Service;

/// Answers at once with `req + 1`.
#[derive(Clone, Copy)]
pub struct Leaf;

impl Service<u64> for Leaf {
    type Response = u64;
    type Error = std::io::Error;
    type Future = Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req + 1))
    }
}

/// One call polled once with a no-op waker: what is measured is the middleware.
pub fn once<S: Service<u64>>(svc: &mut S, n: u64) -> S::Response
where
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
        panic!("not ready")
    };
    match pin!(svc.call(n)).poll(&mut cx) {
        Poll::Ready(Ok(out)) => out,
        _ => panic!("the stack should answer at once"),
    }
}
