//! Nested retry layers on different budgets, tested from the README and rustdoc alone (an
//! outside review): `retry` module docs step 9, `RetryLayer::nested`, and the costs the
//! `budget` module docs give to overloads and rate limits when a failure is handed up.
mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use stormguard::backoff::Backoff;
use stormguard::budget::{RetryBudget, RunLimits};
use stormguard::class::{ClassPolicy, ToolClass};
use stormguard::error::{ErrorCode, ToolError};
use stormguard::retry::RetryLayer;
use support::{funded, spent};
use tower::{Service, ServiceBuilder, ServiceExt};

// ---------------------------------------------------------------- helpers

/// The operation's owner: the outermost layer.
fn owner(policy: ClassPolicy, budget: RetryBudget) -> RetryLayer {
    RetryLayer::new(policy, budget).name("owner")
}

/// A layer declared nested under the owner.
fn under(name: &'static str, policy: ClassPolicy, budget: RetryBudget) -> RetryLayer {
    RetryLayer::new(policy, budget).name(name).nested()
}

fn pol(class: ToolClass, max: u32) -> ClassPolicy {
    pol_b(class, max, Duration::from_millis(10))
}

fn pol_b(class: ToolClass, max: u32, delay: Duration) -> ClassPolicy {
    ClassPolicy::builder(class)
        .max_attempts(max)
        .backoff(Backoff::constant(delay).build().unwrap())
        .build()
        .unwrap()
}

fn pol_d(class: ToolClass, max: u32, delay: Duration, deadline: Duration) -> ClassPolicy {
    ClassPolicy::builder(class)
        .max_attempts(max)
        .backoff(Backoff::constant(delay).build().unwrap())
        .deadline(deadline)
        .build()
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Out {
    /// ConnectionRefused: transient (nothing sent).
    Refused,
    /// ConnectionReset: ambiguous (may have happened).
    Reset,
}

/// A u32 dependency following a script, then `then` forever; counts its calls.
#[derive(Clone)]
struct Dep {
    calls: Arc<AtomicU32>,
    script: Arc<Vec<Out>>,
    then: Out,
}

impl Dep {
    fn always(o: Out) -> Self {
        Dep {
            calls: Arc::new(AtomicU32::new(0)),
            script: Arc::new(vec![]),
            then: o,
        }
    }
    fn script(s: Vec<Out>, then: Out) -> Self {
        Dep {
            calls: Arc::new(AtomicU32::new(0)),
            script: Arc::new(s),
            then,
        }
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<u32> for Dep {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _req: u32) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
        let o = self.script.get(n).copied().unwrap_or(self.then);
        std::future::ready(match o {
            Out::Refused => Err(std::io::ErrorKind::ConnectionRefused.into()),
            Out::Reset => Err(std::io::ErrorKind::ConnectionReset.into()),
        })
    }
}

/// An HTTP dependency answering `status` (with an optional Retry-After) every time.
#[derive(Clone)]
struct HttpDep {
    calls: Arc<AtomicU32>,
    status: u16,
    retry_after: Option<&'static str>,
}

impl HttpDep {
    fn new(status: u16, retry_after: Option<&'static str>) -> Self {
        HttpDep {
            calls: Arc::new(AtomicU32::new(0)),
            status,
            retry_after,
        }
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<http::Request<String>> for HttpDep {
    type Response = http::Response<String>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<http::Response<String>, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _req: http::Request<String>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut b = http::Response::builder().status(self.status);
        if let Some(ra) = self.retry_after {
            b = b.header("retry-after", ra);
        }
        std::future::ready(Ok(b.body(String::new()).unwrap()))
    }
}

fn get() -> http::Request<String> {
    http::Request::get("http://dep.test/x")
        .body(String::new())
        .unwrap()
}

fn post(key: Option<&str>) -> http::Request<String> {
    let mut b = http::Request::post("http://dep.test/x");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(String::new()).unwrap()
}

/// Records (code, retryable, attempts) of every error that passes between two layers.
type Seen = Arc<Mutex<Vec<(ErrorCode, bool, u32)>>>;

fn probe(seen: &Seen) -> impl Fn(ToolError) -> ToolError + Clone {
    let seen = seen.clone();
    move |e: ToolError| {
        seen.lock()
            .unwrap()
            .push((e.code(), e.retryable(), e.attempts()));
        e
    }
}

fn summary(e: &ToolError) -> (ErrorCode, bool, u32) {
    (e.code(), e.retryable(), e.attempts())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// ---------------------------------------------------------------- a hand-up

/// Owner with a funded budget, nested layer on a spent one: the nested layer hands each
/// failure up (retryable), the owner retries on its own budget, up to the operation's cap.
#[tokio::test(start_paused = true)]
async fn owner_funded_inner_spent_owner_retries() {
    let owner_b = funded(10);
    let inner_b = spent();
    let dep = Dep::always(Out::Refused);
    let seen: Seen = Default::default();
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), owner_b.clone()))
        .map_err(probe(&seen))
        .layer(under("inner", pol(ToolClass::Read, 3), inner_b.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 3, "three calls in all");
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert!(
        close(owner_b.balance(), 8.0),
        "owner paid 2 retries, balance {}",
        owner_b.balance()
    );
    assert!(close(inner_b.balance(), 0.0));
    let seen = seen.lock().unwrap().clone();
    // The first two failures were handed up still retryable; the third is the ending.
    assert_eq!(seen.len(), 3, "errors that passed up: {seen:?}");
    assert!(seen[0].1 && seen[1].1, "handed up retryable: {seen:?}");
    assert_eq!(seen[0].0, ErrorCode::Unavailable, "{seen:?}");
}

// The other two- and three-layer cases, and the attempt caps, are the reference model's:
// tests/nested_budgets_model.rs.

// ---------------------------------------------------------------- deadlines

/// Owner's deadline (1 s) shorter than its backoff (2 s): step 8 before step 9: the handed-up
/// failure ends as deadline_exceeded, nothing drawn from the owner.
#[tokio::test(start_paused = true)]
async fn deadline_owner_backoff_past_deadline() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_d(
                ToolClass::Read,
                3,
                Duration::from_secs(2),
                Duration::from_secs(1),
            ),
            owner_b.clone(),
        ))
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::DeadlineExceeded, false, 1));
    assert!(close(owner_b.balance(), 10.0));
}

/// The nested (spent) layer's deadline joins the operation; the owner's retry after a 1 s
/// backoff would end past the nested layer's 100 ms deadline.
#[tokio::test(start_paused = true)]
async fn deadline_from_nested_layer_binds_owner() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_b(ToolClass::Read, 3, Duration::from_secs(1)),
            owner_b.clone(),
        ))
        .layer(under(
            "inner",
            pol_d(
                ToolClass::Read,
                3,
                Duration::from_millis(10),
                Duration::from_millis(100),
            ),
            spent(),
        ))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::DeadlineExceeded, false, 1));
    assert!(close(owner_b.balance(), 10.0));
}

/// Owner funded, deadline 1 s, backoff 300 ms, max 10; nested spent: attempts at 0, .3, .6, .9.
#[tokio::test(start_paused = true)]
async fn deadline_ends_owner_retries() {
    let owner_b = funded(20);
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_d(
                ToolClass::Read,
                10,
                Duration::from_millis(300),
                Duration::from_secs(1),
            ),
            owner_b.clone(),
        ))
        .layer(under("inner", pol(ToolClass::Read, 10), spent()))
        .service(dep.clone());
    let start = tokio::time::Instant::now();
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 4);
    assert_eq!(summary(&err), (ErrorCode::DeadlineExceeded, false, 4));
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(
        close(owner_b.balance(), 17.0),
        "owner balance {}",
        owner_b.balance()
    );
}

// ---------------------------------------------------------------- write classes

/// Unkeyed write, ambiguous failure: outcome_unknown after one call, never handed up to be
/// retried by the funded owner.
#[tokio::test(start_paused = true)]
async fn unkeyed_write_owner_funded_inner_spent_escalates() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Reset);
    let seen: Seen = Default::default();
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 3), owner_b.clone()))
        .map_err(probe(&seen))
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 1));
    assert!(close(owner_b.balance(), 10.0));
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| !s.1),
        "nothing handed up retryable: {seen:?}"
    );
}

/// The nested layer is the unkeyed write (stricter class joins): still one call.
#[tokio::test(start_paused = true)]
async fn unkeyed_write_nested_owner_read_funded_escalates() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Reset);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), owner_b.clone()))
        .layer(under("inner", pol(ToolClass::UnkeyedWrite, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 1));
    assert!(close(owner_b.balance(), 10.0));
}

/// Unkeyed write owner spent, nested Read funded: the nested layer must not retry an
/// ambiguous failure of the (unkeyed-write) operation on its own budget.
#[tokio::test(start_paused = true)]
async fn unkeyed_write_owner_spent_inner_read_funded_escalates() {
    let inner_b = funded(10);
    let dep = Dep::always(Out::Reset);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 3), spent()))
        .layer(under("inner", pol(ToolClass::Read, 3), inner_b.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 1));
    assert!(close(inner_b.balance(), 10.0));
}

/// A transient failure of an unkeyed write may be retried: handed up, the owner retries.
#[tokio::test(start_paused = true)]
async fn unkeyed_write_transient_handed_up_and_retried() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 3), owner_b.clone()))
        .layer(under("inner", pol(ToolClass::UnkeyedWrite, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert!(close(owner_b.balance(), 8.0));
}

/// A transient failure, then an ambiguous one: the second must escalate, not be handed up.
#[tokio::test(start_paused = true)]
async fn unkeyed_write_transient_then_ambiguous_escalates() {
    let owner_b = funded(10);
    let dep = Dep::script(vec![Out::Refused], Out::Reset);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 5), owner_b.clone()))
        .layer(under("inner", pol(ToolClass::Read, 5), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 2);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 2));
    assert!(close(owner_b.balance(), 9.0));
}

// ---------------------------------------------------------------- run handles

/// Owner on a run handle with max_retries 1, nested spent: the owner's run budget decides,
/// and its refusal ends the operation as run_budget_exhausted.
#[tokio::test(start_paused = true)]
async fn for_run_owner_run_limit_decides() {
    let shared = funded(10);
    let run = shared.for_run(RunLimits::builder().max_retries(1).build().unwrap());
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 5), run.clone()))
        .layer(under("inner", pol(ToolClass::Read, 5), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 2);
    assert_eq!(summary(&err), (ErrorCode::RunBudgetExhausted, false, 2));
    assert_eq!(run.run_retries(), Some(1));
}

/// Owner and nested on the same spent shared balance, the nested one through a run handle.
#[tokio::test(start_paused = true)]
async fn for_run_handle_of_owners_spent_budget() {
    let shared = spent();
    let run = shared.for_run(RunLimits::default());
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), shared.clone()))
        .layer(under("inner", pol(ToolClass::Read, 3), run.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::RetryBudgetExhausted, false, 1));
}

/// Nested on a run handle (max_retries 0) of the owner's funded budget: a run's limit ends the
/// operation where it is reached (the `retry` docs, step 9).
#[tokio::test(start_paused = true)]
async fn for_run_nested_run_limit_zero_under_owner_plain_handle() {
    let shared = funded(10);
    let run = shared.for_run(RunLimits::builder().max_retries(0).build().unwrap());
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), shared.clone()))
        .layer(under("inner", pol(ToolClass::Read, 3), run.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    // The run's limit ends the operation; nothing is handed up.
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::RunBudgetExhausted, false, 1));
}

/// Owner on run A (max_retries 1), nested on run B (funded shared, no limit) of the same
/// budget: B retries on its own account.
#[tokio::test(start_paused = true)]
async fn for_run_two_runs_of_one_budget() {
    let shared = funded(10);
    let a = shared.for_run(RunLimits::builder().max_retries(0).build().unwrap());
    let b = shared.for_run(RunLimits::default());
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), a.clone()))
        .layer(under("inner", pol(ToolClass::Read, 3), b.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    // The nested run B's budget grants, so the owner's run A is never asked.
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert_eq!((a.run_retries(), b.run_retries()), (Some(0), Some(2)));
}

// ---------------------------------------------------------------- a Buffer between layers

/// Owner funded above a Buffer, nested spent below it, http::Request carrying the operation.
#[tokio::test(start_paused = true)]
async fn buffer_owner_funded_inner_spent() {
    let owner_b = funded(10);
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), owner_b.clone()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert!(
        close(owner_b.balance(), 8.0),
        "owner balance {}",
        owner_b.balance()
    );
}

#[tokio::test(start_paused = true)]
async fn buffer_owner_spent_inner_funded() {
    let inner_b = funded(10);
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), spent()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), inner_b.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert!(
        close(inner_b.balance(), 8.0),
        "inner balance {}",
        inner_b.balance()
    );
}

#[tokio::test(start_paused = true)]
async fn buffer_both_spent() {
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), spent()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::RetryBudgetExhausted, false, 1));
}

/// Three layers with a Buffer under the owner: owner funded, two nested spent.
#[tokio::test(start_paused = true)]
async fn buffer_three_layers_owner_funded() {
    let owner_b = funded(10);
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 4), owner_b.clone()))
        .buffer(8)
        .layer(under("middle", pol(ToolClass::Read, 3), spent()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(dep.calls(), 4);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 4));
    assert!(
        close(owner_b.balance(), 7.0),
        "owner balance {}",
        owner_b.balance()
    );
}

/// Unkeyed write across a Buffer, 502 (ambiguous): one call, outcome_unknown.
#[tokio::test(start_paused = true)]
async fn buffer_unkeyed_write_502_escalates() {
    let owner_b = funded(10);
    let dep = HttpDep::new(502, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 3), owner_b.clone()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(None))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 1));
    assert!(close(owner_b.balance(), 10.0));
}

/// Unkeyed write across a Buffer, owner spent, inner Read funded: inner must not retry a 502.
#[tokio::test(start_paused = true)]
async fn buffer_unkeyed_write_502_inner_funded_escalates() {
    let inner_b = funded(10);
    let dep = HttpDep::new(502, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::UnkeyedWrite, 3), spent()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), inner_b.clone()))
        .service(dep.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(None))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::OutcomeUnknown, false, 1));
    assert!(close(inner_b.balance(), 10.0));
}

/// Keyed write across a Buffer: without the key, missing_idempotency_key after one call; with
/// it, the owner (funded) retries what the spent nested layer hands up.
#[tokio::test(start_paused = true)]
async fn buffer_keyed_write_with_and_without_key() {
    let owner_b = funded(10);
    let dep = HttpDep::new(502, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::KeyedWrite, 3), owner_b.clone()))
        .buffer(8)
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(None))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::MissingIdempotencyKey, false, 1));
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("k-1")))
        .await
        .unwrap_err();
    assert_eq!(dep.calls(), 1 + 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert!(
        close(owner_b.balance(), 8.0),
        "owner balance {}",
        owner_b.balance()
    );
}

/// Buffer + deadline: the nested layer's deadline (behind the Buffer) binds the owner.
#[tokio::test(start_paused = true)]
async fn buffer_nested_deadline_binds_owner() {
    let owner_b = funded(10);
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_b(ToolClass::Read, 3, Duration::from_secs(1)),
            owner_b.clone(),
        ))
        .buffer(8)
        .layer(under(
            "inner",
            pol_d(
                ToolClass::Read,
                3,
                Duration::from_millis(10),
                Duration::from_millis(100),
            ),
            spent(),
        ))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::DeadlineExceeded, false, 1));
    assert!(close(owner_b.balance(), 10.0));
}

// ---------------------------------------------------------------- what a handed-up failure costs the owner

/// Runs one GET through `owner_b` (optionally over a spent nested layer) against `dep`; returns
/// (calls, error summary, owner balance after).
async fn cost_run(
    nested: bool,
    owner_b: RetryBudget,
    dep: HttpDep,
    max: u32,
) -> (u32, (ErrorCode, bool, u32), f64) {
    let owner = owner(pol(ToolClass::Read, max), owner_b.clone());
    let res = if nested {
        let mut svc = ServiceBuilder::new()
            .layer(owner)
            .layer(under("inner", pol(ToolClass::Read, max), spent()))
            .service(dep.clone());
        svc.ready().await.unwrap().call(get()).await
    } else {
        let mut svc = ServiceBuilder::new().layer(owner).service(dep.clone());
        svc.ready().await.unwrap().call(get()).await
    };
    let err = res.unwrap_err();
    (dep.calls(), summary(&err), owner_b.balance())
}

/// 503 + Retry-After (an overload) costs the owner two retries, as it would alone.
#[tokio::test(start_paused = true)]
async fn cost_overload_503_retry_after_two() {
    let alone = cost_run(false, funded(3), HttpDep::new(503, Some("1")), 5).await;
    let nested = cost_run(true, funded(3), HttpDep::new(503, Some("1")), 5).await;
    // one retry at 2 (3 -> 1), then 2 > 1 is refused
    assert_eq!(alone.0, 2, "alone: {alone:?}");
    assert!(close(alone.2, 1.0), "alone: {alone:?}");
    assert_eq!(
        nested, alone,
        "handed up, the owner pays what it would pay alone"
    );
}

/// 529 + Retry-After: also two.
#[tokio::test(start_paused = true)]
async fn cost_overload_529_retry_after_two() {
    let alone = cost_run(false, funded(3), HttpDep::new(529, Some("1")), 5).await;
    let nested = cost_run(true, funded(3), HttpDep::new(529, Some("1")), 5).await;
    assert_eq!(alone.0, 2, "alone: {alone:?}");
    assert!(close(alone.2, 1.0), "alone: {alone:?}");
    assert_eq!(nested, alone);
}

/// 429 + Retry-After waited in full: 5/14 a retry; a balance of 1 pays two.
#[tokio::test(start_paused = true)]
async fn cost_rate_limit_waited_in_full_five_fourteenths() {
    let alone = cost_run(false, funded(1), HttpDep::new(429, Some("1")), 5).await;
    let nested = cost_run(true, funded(1), HttpDep::new(429, Some("1")), 5).await;
    assert_eq!(alone.0, 3, "alone: {alone:?}");
    // 5/14 = 0.357142..; the balance is kept in thousandths, it seems (0.357 per retry).
    assert!(
        (alone.2 - (1.0 - 10.0 / 14.0)).abs() < 1e-3,
        "alone: {alone:?}"
    );
    assert_eq!(nested, alone);
}

/// 429 with no Retry-After: any other rate limit costs one.
#[tokio::test(start_paused = true)]
async fn cost_other_rate_limit_one() {
    let alone = cost_run(false, funded(1), HttpDep::new(429, None), 5).await;
    let nested = cost_run(true, funded(1), HttpDep::new(429, None), 5).await;
    assert_eq!(alone.0, 2, "alone: {alone:?}");
    assert!(close(alone.2, 0.0), "alone: {alone:?}");
    assert_eq!(nested, alone);
}

/// A plain 503 (no Retry-After) is an ordinary failure: one.
#[tokio::test(start_paused = true)]
async fn cost_plain_503_one() {
    let alone = cost_run(false, funded(2), HttpDep::new(503, None), 5).await;
    let nested = cost_run(true, funded(2), HttpDep::new(503, None), 5).await;
    assert_eq!(alone.0, 3, "alone: {alone:?}");
    assert_eq!(nested, alone);
}

// ---------------------------------------------------------------- second round

/// The 5/14 price read directly from the budget (no layers).
#[tokio::test(start_paused = true)]
async fn throttled_price_direct() {
    let b = funded(1);
    b.try_withdraw_throttled(Duration::ZERO).unwrap();
    assert!((b.balance() - 9.0 / 14.0).abs() < 1e-3);
}

/// A throttled retry refused: the error carries the server's delay, nested or not.
#[tokio::test(start_paused = true)]
async fn throttled_refusal_carries_retry_after() {
    for nested in [false, true] {
        let dep = HttpDep::new(429, Some("1"));
        let owner = owner(pol(ToolClass::Read, 5), funded(1));
        let err = if nested {
            let mut svc = ServiceBuilder::new()
                .layer(owner)
                .layer(under("inner", pol(ToolClass::Read, 5), spent()))
                .service(dep.clone());
            svc.ready().await.unwrap().call(get()).await.unwrap_err()
        } else {
            let mut svc = ServiceBuilder::new().layer(owner).service(dep.clone());
            svc.ready().await.unwrap().call(get()).await.unwrap_err()
        };
        assert_eq!(
            err.retry_after(),
            Some(Duration::from_secs(1)),
            "nested={nested}"
        );
    }
}

/// The final error's cause, alone and nested (hand-ups in between): does a hand-up's
/// `retryable: true` leak into the cause of the final `retryable: false` error?
#[tokio::test(start_paused = true)]
async fn final_error_cause_alone_vs_nested() {
    let alone = cost_run_err(false).await;
    let nested = cost_run_err(true).await;
    assert_eq!(alone.to_json()["cause"], nested.to_json()["cause"]);
}

async fn cost_run_err(nested: bool) -> ToolError {
    let dep = HttpDep::new(503, None);
    let owner = owner(pol(ToolClass::Read, 3), funded(10));
    if nested {
        let mut svc = ServiceBuilder::new()
            .layer(owner)
            .layer(under("inner", pol(ToolClass::Read, 3), spent()))
            .service(dep.clone());
        svc.ready().await.unwrap().call(get()).await.unwrap_err()
    } else {
        let mut svc = ServiceBuilder::new().layer(owner).service(dep.clone());
        svc.ready().await.unwrap().call(get()).await.unwrap_err()
    }
}

/// Hand-up timing: a spent nested layer with a long backoff (1 s) under a funded owner with a
/// short one (100 ms). Does the nested layer sleep its backoff before handing up?
#[tokio::test(start_paused = true)]
async fn hand_up_does_not_sleep_nested_backoff() {
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_b(ToolClass::Read, 3, Duration::from_millis(100)),
            funded(10),
        ))
        .layer(under(
            "inner",
            pol_b(ToolClass::Read, 3, Duration::from_secs(1)),
            spent(),
        ))
        .service(dep.clone());
    let start = tokio::time::Instant::now();
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    let took = start.elapsed();
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert_eq!(dep.calls(), 3);
    assert_eq!(took, Duration::from_millis(200));
}

/// Deadline 1 s on the owner (funded, 100 ms backoff); nested spent with a 2 s backoff.
#[tokio::test(start_paused = true)]
async fn deadline_nested_long_backoff_spent_budget() {
    let owner_b = funded(10);
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_d(
                ToolClass::Read,
                3,
                Duration::from_millis(100),
                Duration::from_secs(1),
            ),
            owner_b.clone(),
        ))
        .layer(under(
            "inner",
            pol_b(ToolClass::Read, 3, Duration::from_secs(2)),
            spent(),
        ))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    // Step 8 comes before step 9: the nested layer's own delay (the spacing its dependency
    // needs) cannot fit in the operation's deadline, which ends the operation there, though the
    // owner's shorter backoff would have fitted.
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::DeadlineExceeded, false, 1));
    assert_eq!(owner_b.balance(), 10.0);
}

/// Two run handles of one shared balance: owner run A (no limit), nested run B (max_retries 0).
#[tokio::test(start_paused = true)]
async fn for_run_owner_run_a_nested_run_b_limited() {
    let shared = funded(10);
    let a = shared.for_run(RunLimits::default());
    let b = shared.for_run(RunLimits::builder().max_retries(0).build().unwrap());
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), a.clone()))
        .layer(under("inner", pol(ToolClass::Read, 3), b.clone()))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    // A run's limit ends the operation where it is reached: B's, here.
    assert_eq!(dep.calls(), 1);
    assert_eq!(summary(&err), (ErrorCode::RunBudgetExhausted, false, 1));
}

/// Owner on a run handle of budget S (funded), nested on a spent, unrelated budget, the whole
/// call run in the owner's scope: the owner's run pays the hand-ups.
#[tokio::test(start_paused = true)]
async fn for_run_owner_pays_hand_ups_in_scope() {
    let shared = funded(10);
    let run = shared.for_run(RunLimits::builder().max_retries(5).build().unwrap());
    let dep = Dep::always(Out::Refused);
    let svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 3), run.clone()))
        .layer(under("inner", pol(ToolClass::Read, 3), spent()))
        .service(dep.clone());
    let err = run.scope(svc.oneshot(1)).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
    assert_eq!(run.run_retries(), Some(2));
}

/// The owner's refusal of a handed-up failure (not the cap): what is the final error's cause?
/// Alone, the cause is the dependency's HTTP status; nested, compare.
#[tokio::test(start_paused = true)]
async fn the_cause_of_a_refused_hand_up_is_the_dependencys_http_error() {
    let mut got = vec![];
    for nested in [false, true] {
        let dep = HttpDep::new(503, None);
        let owner = owner(pol(ToolClass::Read, 5), funded(1));
        let err = if nested {
            let mut svc = ServiceBuilder::new()
                .layer(owner)
                .layer(under("inner", pol(ToolClass::Read, 5), spent()))
                .service(dep.clone());
            svc.ready().await.unwrap().call(get()).await.unwrap_err()
        } else {
            let mut svc = ServiceBuilder::new().layer(owner).service(dep.clone());
            svc.ready().await.unwrap().call(get()).await.unwrap_err()
        };
        assert_eq!(summary(&err), (ErrorCode::RetryBudgetExhausted, false, 2));
        got.push(err.to_json()["cause"].clone());
    }
    assert_eq!(
        got[0], got[1],
        "the cause (the dependency's own error) is the same nested or not"
    );
}

/// Same with io errors (no structured error from the dependency): alone there is no ToolError
/// cause; nested, does the hand-up show up as the "dependency's own structured error"?
#[tokio::test(start_paused = true)]
async fn a_refused_hand_up_of_a_plain_error_has_no_made_up_cause() {
    let mut got = vec![];
    for nested in [false, true] {
        let dep = Dep::always(Out::Refused);
        let owner = owner(pol(ToolClass::Read, 5), funded(1));
        let err = if nested {
            let mut svc = ServiceBuilder::new()
                .layer(owner)
                .layer(under("inner", pol(ToolClass::Read, 5), spent()))
                .service(dep.clone());
            svc.ready().await.unwrap().call(1).await.unwrap_err()
        } else {
            let mut svc = ServiceBuilder::new().layer(owner).service(dep.clone());
            svc.ready().await.unwrap().call(1).await.unwrap_err()
        };
        assert_eq!(summary(&err), (ErrorCode::RetryBudgetExhausted, false, 2));
        got.push(err.to_json()["cause"].clone());
    }
    assert_eq!(got[0], got[1], "the cause is the same nested or not");
}

/// Step 7 comes before step 8: a nested layer with max_attempts 1 hands up whatever its
/// backoff; the owner (100 ms backoff, 1 s deadline) retries.
#[tokio::test(start_paused = true)]
async fn deadline_nested_max1_long_backoff_hands_up() {
    let dep = Dep::always(Out::Refused);
    let mut svc = ServiceBuilder::new()
        .layer(owner(
            pol_d(
                ToolClass::Read,
                3,
                Duration::from_millis(100),
                Duration::from_secs(1),
            ),
            funded(10),
        ))
        .layer(under(
            "inner",
            pol_b(ToolClass::Read, 1, Duration::from_secs(2)),
            spent(),
        ))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(dep.calls(), 3);
    assert_eq!(summary(&err), (ErrorCode::Unavailable, false, 3));
}

/// For comparison: the step-7 hand-up (nested layer's own attempts spent), then the owner's
/// refusal. Does the final cause also show the hand-up instead of the dependency's error?
#[tokio::test(start_paused = true)]
async fn cause_after_step7_hand_up_and_owner_refusal() {
    let dep = HttpDep::new(503, None);
    let mut svc = ServiceBuilder::new()
        .layer(owner(pol(ToolClass::Read, 5), spent()))
        .layer(under("inner", pol(ToolClass::Read, 1), funded(10)))
        .service(dep.clone());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert_eq!(summary(&err), (ErrorCode::RetryBudgetExhausted, false, 1));
    // The cause is what the dependency answered, not the nested layer's hand-up.
    let cause = err.cause().expect("the dependency's error");
    assert!(cause.hint().contains("HTTP 503"), "{}", cause.hint());
}
