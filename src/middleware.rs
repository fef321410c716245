//! The stormguard stack as a [`reqwest_middleware::Middleware`] (feature `reqwest-middleware`),
//! for code that sends its requests through `reqwest_middleware::ClientWithMiddleware`: rig's
//! HTTP client, and every user of `reqwest-retry`.
//!
//! [`Guard`] runs a stormguard [`Retry`](crate::retry::Retry) around the rest of the middleware
//! chain. It joins the operation of a stormguard `Retry` above it on the same task
//! (a tool wrapper, the agent loop), so nested retries share one attempt cap and one budget: three
//! nested layers of 3 attempts make 3 calls for one failing request, where three nested
//! `RetryTransientMiddleware`s make 27 (`tests/reqwest_middleware.rs`). Answers and errors are
//! classified by type, as every layer (a `reqwest::Response` by status; a
//! `reqwest_middleware::Error` by the `reqwest::Error` or the stormguard error inside it). A
//! request is copied for a retry with `try_clone` (a streamed body is sent once), and carries its
//! `Idempotency-Key` header, if any, as every reqwest request.
//!
//! What it returns: the answer, or a `reqwest_middleware::Error::Middleware` holding the
//! [`ToolError`] (`err.downcast_ref::<ToolError>()` on the
//! `anyhow::Error`, or [`ToolError::from`] on a `BoxError`). The
//! `http::Extensions` the chain passes along reach the middlewares after this one as a copy on
//! each attempt; what they write into them does not come back up.
//!
//! ```
//! use reqwest_middleware::ClientBuilder;
//! use stormguard::budget::RetryBudget;
//! use stormguard::class::ToolClass;
//! use stormguard::middleware::Guard;
//! use stormguard::retry::RetryLayer;
//! # use reqwest013 as reqwest;
//!
//! let budget = RetryBudget::default();
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(Guard::new(RetryLayer::new(ToolClass::Read, budget)))
//!     .build();
//! # drop(client);
//! ```

use crate::classify::{Classify, DefaultClassifier};
use crate::error::ToolError;
use crate::retry::{DefaultReplay, Replay, RetryLayer};
use http::Extensions;
use reqwest013::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A stormguard `Retry` as a reqwest-middleware [`Middleware`]; see the [module docs](self).
#[derive(Clone)]
pub struct Guard<C = DefaultClassifier, R = DefaultReplay> {
    retry: RetryLayer<C, R>,
}

impl<C, R> Guard<C, R> {
    /// Runs `retry` around the rest of the chain.
    pub fn new(retry: RetryLayer<C, R>) -> Self {
        Guard { retry }
    }
}

impl<C, R> fmt::Debug for Guard<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

/// The rest of the chain as a tower service, for one request: each attempt sends a copy of the
/// extensions down the chain.
#[derive(Clone)]
struct Rest<'a> {
    next: Next<'a>,
    extensions: Extensions,
}

impl<'a> Service<Request> for Rest<'a> {
    type Response = Response;
    type Error = reqwest_middleware::Error;
    type Future = Pin<Box<dyn Future<Output = reqwest_middleware::Result<Response>> + Send + 'a>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let next = self.next.clone();
        let mut extensions = self.extensions.clone();
        Box::pin(async move { next.run(req, &mut extensions).await })
    }
}

fn into_middleware_error(err: ToolError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(err)
}

#[async_trait::async_trait]
impl<C, R> Middleware for Guard<C, R>
where
    C: Classify<Response, reqwest_middleware::Error> + Clone + Send + Sync + 'static,
    R: Replay<Request> + Clone + Send + Sync + 'static,
{
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let rest = Rest {
            next,
            extensions: extensions.clone(),
        };
        let mut retry = self.retry.layer(rest);
        std::future::poll_fn(|cx| retry.poll_ready(cx))
            .await
            .map_err(into_middleware_error)?;
        retry.call(req).await.map_err(into_middleware_error)
    }
}
