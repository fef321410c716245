//! The fault layer's service: draw, then answer as the fault says.

use super::decide::draw;
use super::effects::Effect;
use super::{Fault, NameOperation, Plan};
use crate::error::BoxError;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tower_service::Service;

/// An answer the fault layer can make up for a status, its headers and its body: an
/// `http::Response` with them (feature `http`, any body made from a `String`), or, for a plain
/// value (a number, a string, JSON), the [`ToolError`](crate::error::ToolError) a client of that
/// provider would return: `rate_limited` with the wait, `quota_exhausted`, `unavailable` (not
/// processed for 503 and 529, ambiguous for a 502 or 504 after the work).
pub trait FaultAnswer: Sized {
    /// The answer with `status`, `headers` and `body`, or the error that stands for it.
    fn fault_answer(
        status: u16,
        headers: &[(&'static str, String)],
        body: &'static str,
    ) -> Result<Self, BoxError>;
}

#[cfg(feature = "http")]
impl<B: From<String>> FaultAnswer for http::Response<B> {
    fn fault_answer(
        status: u16,
        headers: &[(&'static str, String)],
        body: &'static str,
    ) -> Result<Self, BoxError> {
        let mut answer = http::Response::new(B::from(body.to_string()));
        *answer.status_mut() =
            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in headers {
            if let Ok(value) = http::HeaderValue::from_str(value) {
                answer.headers_mut().insert(*name, value);
            }
        }
        Ok(answer)
    }
}

/// The error a client of a plain-value service would return for the answer.
fn as_tool_error(status: u16, headers: &[(&'static str, String)], body: &str) -> BoxError {
    Box::new(tool_error(status, headers, body))
}

/// The error a client reads from a fault's answer: a used-up quota is permanent, a rate limit
/// and an overload transient, a 504 and any other after-work status ambiguous.
fn tool_error(
    status: u16,
    headers: &[(&'static str, String)],
    body: &str,
) -> crate::error::ToolError {
    use crate::classify::FailureClass;
    use crate::error::{ErrorCode, ToolError};
    match status {
        429 if body.contains("insufficient_quota") => {
            ToolError::new(ErrorCode::QuotaExhausted).with_class(FailureClass::Permanent)
        }
        429 => {
            let wait = headers
                .iter()
                .find(|(name, _)| *name == "retry-after-ms")
                .and_then(|(_, ms)| ms.parse().ok())
                .map(Duration::from_millis);
            let err = ToolError::new(ErrorCode::RateLimited).with_class(FailureClass::Transient);
            match wait {
                Some(wait) => err.with_retry_after(wait),
                None => err,
            }
        }
        503 | 529 => ToolError::new(ErrorCode::Unavailable).with_class(FailureClass::Transient),
        504 => ToolError::new(ErrorCode::Timeout).with_class(FailureClass::Ambiguous),
        _ => ToolError::new(ErrorCode::Unavailable).with_class(FailureClass::Ambiguous),
    }
}

/// An MCP tool's answer (feature `rmcp`): every fault is an `isError` result carrying the
/// structured error a tool server built on stormguard sends (what `McpClassifier` reads).
///
/// ```
/// use rmcp::model::CallToolResult;
/// use stormguard::chaos::{ChaosLayer, Fault};
/// use stormguard::classify::FailureClass;
/// use stormguard::error::{ErrorCode, ToolError};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let chaos = ChaosLayer::builder(7).fault(Fault::FailedAfterWork(502), 1.0).build().unwrap();
/// let effects = chaos.effects();
/// let tool = chaos.layer(service_fn(|_: ()| async {
///     Ok::<_, std::io::Error>(CallToolResult::success(vec![]))
/// }));
/// let answer = tool.oneshot(()).await.unwrap();
/// assert_eq!(answer.is_error, Some(true));
/// let err = ToolError::from_call_tool_result(&answer).unwrap();
/// assert_eq!((err.code(), err.class()), (ErrorCode::Unavailable, Some(FailureClass::Ambiguous)));
/// assert_eq!(effects.work_done(), 1); // the tool did the work
/// # }
/// ```
#[cfg(feature = "rmcp")]
impl FaultAnswer for rmcp::model::CallToolResult {
    fn fault_answer(
        status: u16,
        headers: &[(&'static str, String)],
        body: &'static str,
    ) -> Result<Self, BoxError> {
        Ok(tool_error(status, headers, body).to_call_tool_result())
    }
}

macro_rules! plain_fault_answer {
    ($($t:ty),*) => {$(
        impl FaultAnswer for $t {
            fn fault_answer(
                status: u16,
                headers: &[(&'static str, String)],
                body: &'static str,
            ) -> Result<Self, BoxError> {
                Err(as_tool_error(status, headers, body))
            }
        }
    )*};
}

plain_fault_answer!(
    (),
    bool,
    u8,
    u16,
    u32,
    u64,
    usize,
    i32,
    i64,
    String,
    Vec<u8>,
    serde_json::Value
);

const QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}}"#;
const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

/// The service of a [`ChaosLayer`](super::ChaosLayer).
pub struct Chaos<S, O> {
    inner: S,
    plan: Arc<Plan>,
    operation: O,
    next_operation: Arc<AtomicU64>,
}

impl<S, O> Chaos<S, O> {
    pub(crate) fn new(inner: S, plan: Arc<Plan>, operation: O) -> Self {
        Chaos {
            inner,
            plan,
            operation,
            next_operation: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<S: Clone, O: Clone> Clone for Chaos<S, O> {
    fn clone(&self) -> Self {
        Chaos {
            inner: self.inner.clone(),
            plan: self.plan.clone(),
            operation: self.operation.clone(),
            next_operation: self.next_operation.clone(),
        }
    }
}

impl<S: fmt::Debug, O> fmt::Debug for Chaos<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chaos")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

pin_project! {
    /// The future of a [`Chaos`] call: the inner future untouched when no fault is configured,
    /// else the fault's answer.
    pub struct ResponseFuture<F, T> {
        #[pin]
        kind: Kind<F, T>,
    }
}

pin_project! {
    #[project = Proj]
    enum Kind<F, T> {
        Through { #[pin] inner: F },
        Fault { future: Boxed<T> },
    }
}

impl<F, T> ResponseFuture<F, T> {
    fn through(inner: F) -> Self {
        ResponseFuture {
            kind: Kind::Through { inner },
        }
    }

    fn fault(future: Boxed<T>) -> Self {
        ResponseFuture {
            kind: Kind::Fault { future },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F, T>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            Proj::Through { inner } => Poll::Ready(ready!(inner.poll(cx)).map_err(Into::into)),
            Proj::Fault { future } => future.as_mut().poll(cx),
        }
    }
}

fn retry_after(wait: Duration) -> Vec<(&'static str, String)> {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    vec![
        ("retry-after", secs.to_string()),
        ("retry-after-ms", wait.as_millis().to_string()),
    ]
}

impl<S, O, Req> Service<Req> for Chaos<S, O>
where
    O: NameOperation<Req>,
    S: Service<Req> + Clone + Send + 'static,
    S::Response: FaultAnswer + Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    S::Future: Send + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if self.plan.faults.is_empty() {
            return ResponseFuture::through(self.inner.call(req));
        }
        let operation = self
            .operation
            .operation(&req)
            .unwrap_or_else(|| self.next_operation.fetch_add(1, Ordering::Relaxed));
        let attempt = self.plan.effects.next_attempt(operation);
        let fault = draw(self.plan.seed, operation, attempt, &self.plan.faults);
        let effects = self.plan.effects.clone();
        effects.saw(
            Effect {
                operation,
                attempt,
                fault: fault.map(|f| f.as_str()),
            },
            fault.is_none_or(|f| f.does_the_work()),
        );
        if let Some(f) = fault {
            tracing::debug!(operation, attempt, fault = f.as_str(), "chaos: injected");
        }
        let made_up = |status, headers: Vec<(&'static str, String)>, body| -> Self::Future {
            let answer = S::Response::fault_answer(status, &headers, body);
            ResponseFuture::fault(Box::pin(async move { answer }))
        };
        let future: Boxed<S::Response> = match fault {
            Some(Fault::RateLimited(wait)) => return made_up(429, retry_after(wait), "{}"),
            Some(Fault::QuotaExhausted) => return made_up(429, Vec::new(), QUOTA),
            Some(Fault::Overloaded) => return made_up(529, Vec::new(), OVERLOADED),
            Some(Fault::Unavailable) => return made_up(503, Vec::new(), "{}"),
            Some(Fault::LateCommit(after)) => {
                let mut late = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if std::future::poll_fn(|cx| late.poll_ready(cx)).await.is_ok()
                        && late.call(req).await.is_ok()
                    {
                        effects.worked(operation);
                    }
                });
                Box::pin(async {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "chaos: timed out (the work lands later)",
                    )
                    .into())
                })
            }
            other => {
                let call = self.inner.call(req);
                Box::pin(async move {
                    if let Some(Fault::Latency(d)) = other {
                        tokio::time::sleep(d).await;
                    }
                    let answer = call.await.map_err(Into::into)?;
                    effects.worked(operation);
                    match other {
                        Some(Fault::FailedAfterWork(status)) => {
                            S::Response::fault_answer(status, &[], "{}")
                        }
                        Some(Fault::ResetAfterWork) => Err(io::Error::new(
                            io::ErrorKind::ConnectionReset,
                            "chaos: connection reset after the work was done",
                        )
                        .into()),
                        _ => Ok(answer),
                    }
                })
            }
        };
        ResponseFuture::fault(future)
    }
}
