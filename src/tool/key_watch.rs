//! [`KeyWatch`]: whether a keyed write's body read the key the stack stamped on its call. A body
//! that never calls [`Call::key`] cannot have sent the key to the provider, so an ambiguous
//! failure is not retried as though it had (it would be a second effect): the attempt is
//! decided as a keyed write without its key, and the crate says so.

use super::call::Call;
use crate::operation::ledger::with_current;
use crate::telemetry;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// The body of a keyed write, watched for reading its key.
#[derive(Clone)]
pub(super) struct KeyWatch<S> {
    pub(super) inner: S,
    pub(super) tool: Arc<str>,
    /// The WARN has been said for this tool.
    pub(super) warned: Arc<AtomicBool>,
}

impl<S: Service<Call>> Service<Call> for KeyWatch<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = Watched<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let read = call.key_read();
        let operation = call.operation().cloned();
        Watched {
            future: self.inner.call(call),
            read,
            operation,
            tool: self.tool.clone(),
            warned: self.warned.clone(),
        }
    }
}

pin_project! {
    /// The body's future; on its end, whether the key was read.
    pub(super) struct Watched<F> {
        #[pin]
        future: F,
        read: Option<Arc<AtomicBool>>,
        operation: Option<crate::operation::Operation>,
        tool: Arc<str>,
        warned: Arc<AtomicBool>,
    }
}

impl<F: Future> Future for Watched<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = ready!(this.future.poll(cx));
        if let Some(read) = this.read.take() {
            if !read.load(Ordering::Relaxed) {
                not_delivered(this.operation.as_ref(), this.tool, this.warned);
            }
        }
        Poll::Ready(out)
    }
}

#[cold]
fn not_delivered(operation: Option<&crate::operation::Operation>, tool: &str, warned: &AtomicBool) {
    match operation {
        Some(op) => op.with(|op| op.key_not_delivered()),
        None => {
            with_current(|op| op.key_not_delivered());
        }
    }
    telemetry::key_not_delivered(tool);
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            tool,
            "the keyed write's body never read the key the stack stamped (call.key()): it cannot \
             have reached the provider, so a failure that may have taken effect is not retried \
             (missing_idempotency_key); send call.key() as the provider's Idempotency-Key, or declare \
             the tool an unkeyed write"
        );
    }
}
