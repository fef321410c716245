//! Shared test helpers: a scripted dependency that counts its calls.
#![allow(dead_code, unreachable_pub)]

pub mod counted;
#[cfg(feature = "redis")]
pub mod fleet;
pub mod invoice;
pub mod logs;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod receipts;
pub mod server;
#[cfg(feature = "rmcp")]
pub mod shop;
pub mod sse;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod stores;

use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use stormguard::classify::FailureClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use tower::Service;

/// The address of a service a test needs (`STORMGUARD_POSTGRES_URL`, `STORMGUARD_REDIS_URL`):
/// `None` with a "skipped" note when it is not set, and a failure under `CI=true`, where
/// `.ci/run` sets it: a CI run must never pass by skipping.
pub fn service_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("{var} is not set under CI=true: .ci/run sets it (and starts the service)")
        }
        Err(_) => {
            eprintln!("skipped: {var} is not set (.ci/run sets it and starts the service)");
            None
        }
    }
}

/// What one call to the dependency does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    Ok,
    /// A normal "no such record" answer: `Ok(0)` (see [`classifier`]).
    Empty,
    Fail(FailureClass),
}

/// Classifies the dependency's results: `Ok(0)` is an empty answer.
pub fn classifier(result: &Result<u32, BoxError>) -> stormguard::classify::Classification {
    use stormguard::classify::{classify_error, Classification};
    match result {
        Ok(0) => Classification::empty(),
        Ok(_) => Classification::success(),
        Err(e) => classify_error(&**e),
    }
}

/// The error a failure of `class` is made of, as a real client would produce it.
pub fn error_for(class: FailureClass) -> BoxError {
    match class {
        FailureClass::Transient => io::Error::from(io::ErrorKind::ConnectionRefused).into(),
        FailureClass::Ambiguous => io::Error::from(io::ErrorKind::ConnectionReset).into(),
        FailureClass::ModelRecoverable => io::Error::from(io::ErrorKind::InvalidInput).into(),
        FailureClass::Permanent => io::Error::from(io::ErrorKind::PermissionDenied).into(),
        FailureClass::Policy => Box::new(
            ToolError::new(ErrorCode::PolicyViolation)
                .with_class(FailureClass::Policy)
                .with_retryable(false),
        ),
        _ => unreachable!("no other classes"),
    }
}

/// A dependency that plays a script of outcomes, then repeats `then`, counting calls.
#[derive(Clone)]
pub struct Dependency {
    calls: Arc<AtomicU32>,
    script: Arc<Mutex<VecDeque<Outcome>>>,
    then: Outcome,
}

impl Dependency {
    pub fn always(outcome: Outcome) -> Self {
        Self::script([], outcome)
    }

    pub fn script(script: impl IntoIterator<Item = Outcome>, then: Outcome) -> Self {
        Dependency {
            calls: Arc::new(AtomicU32::new(0)),
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            then,
        }
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn next(&self) -> Outcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.script.lock().unwrap().pop_front().unwrap_or(self.then)
    }
}

impl<Req> Service<Req> for Dependency {
    type Response = u32;
    type Error = BoxError;
    type Future = Ready<Result<u32, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Req) -> Self::Future {
        ready(match self.next() {
            Outcome::Ok => Ok(self.calls()),
            Outcome::Empty => Ok(0),
            Outcome::Fail(class) => Err(error_for(class)),
        })
    }
}

/// A tool-call request, a different type from what the client layer sees.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub tool: &'static str,
    pub arg: u32,
}

/// Sent again as a clone: it carries no operation of its own.
impl stormguard::retry::Request for ToolCall {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Waits for `svc` to be ready for `Req` and calls it.
pub async fn call<S: Service<Req>, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error> {
    use tower::ServiceExt;
    ServiceExt::<Req>::ready(svc).await?.call(req).await
}

/// A budget with no floor: only deposits pay for retries.
pub fn no_floor() -> stormguard::budget::RetryBudget {
    stormguard::budget::RetryBudget::builder()
        .floor(0, std::time::Duration::from_secs(60))
        // The ratio balance's books alone: no retry paid by the dependency's acceptance.
        .acceptance(0.0, 32)
        .build()
        .unwrap()
}

/// A budget that refuses every retry: no floor, no acceptance, and nothing deposited.
pub fn spent() -> stormguard::budget::RetryBudget {
    no_floor()
}

/// A budget holding exactly `n` retries (no floor, no acceptance, one retry per success), so
/// what a layer drew from it can be read back with `balance()`.
pub fn funded(n: u32) -> stormguard::budget::RetryBudget {
    let budget = stormguard::budget::RetryBudget::builder()
        .floor(0, std::time::Duration::from_secs(60))
        .acceptance(0.0, 32)
        .retry_ratio(1.0)
        .build()
        .unwrap();
    for _ in 0..n {
        budget.deposit();
    }
    assert_eq!(budget.balance(), f64::from(n));
    budget
}

/// An in-process HTTP service that answers `status` with `headers` to its first `failures`
/// calls, then 200; and the count of its calls.
pub fn http_script(
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    failures: u32,
) -> (
    Arc<AtomicU32>,
    impl Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone,
) {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let svc = tower::service_fn(move |_req: http::Request<String>| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut b = http::Response::builder().status(200);
            if n < failures {
                b = headers
                    .iter()
                    .fold(b.status(status), |b, (k, v)| b.header(*k, *v));
            }
            Ok::<_, std::convert::Infallible>(b.body(String::new()).unwrap())
        }
    });
    (calls, svc)
}
