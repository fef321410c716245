//! The storm demo: the same three-layer stack (agent loop -> tool wrapper -> client, each allowing
//! 3 attempts) built three ways, driven by an open-loop load against a failing dependency.
//!
//! ```text
//! cargo run --release --example storm            # a table
//! cargo run --release --example storm -- --json  # one JSON object per line
//! ```
//!
//! Stacks:
//! - `tower-nested`: tower 0.5's `Retry` three deep, no budget;
//! - `tower-nested-budget`: the same with one `TpsBudget::default()` per layer;
//! - `stormguard-nested`: three stormguard `Retry` layers sharing one `RetryBudget` (defaults):
//!   the client's is the stack of the tool `lookup`, declared once in [`TOOLS`] (a read whose
//!   own layer owns its attempts); the tool wrapper's and the agent loop's are `Retry` layers of
//!   the class the declaration says, on the budget it draws on;
//! - `stormguard-breaker`: the same with a stormguard `CircuitBreaker` (defaults) under the
//!   client's `Retry` (the tool `lookup-guarded`, which names the default breaker).
//!
//! Scenarios (in-process ones run on tokio's paused clock, so simulated minutes take seconds):
//! - `outage` at 1 request/s for 600 s and at 100 requests/s for 60 s: every call fails;
//! - `transient` at 100 requests/s for 300 s: each call fails with probability 0.1;
//! - `empty-results` at 100 requests/s for 300 s: half the answers are "no such record", 5 % of
//!   calls fail;
//! - `recovery` at 100 requests/s for 90 s: every call fails for 30 s, then the dependency heals;
//!   `recovery_ms` is the time from healing to the first success a caller sees;
//! - `partial` at 100 requests/s for 60 s: each call fails with probability 0.5 (a dependency
//!   that is half up: a breaker must not make it an outage);
//! - `brownout` at 100 requests/s and at 1 request/s for 120 s: every call fails for 20 s, then
//!   30 % fail for 40 s, then none; `recovery_ms` is from the end of the full outage to the first
//!   success;
//! - `outage-after-healthy` at 100 requests/s for 120 s: healthy for 60 s, then every call
//!   fails (what the acceptance rule lets through before it sheds);
//! - `overload` at 100 requests/s for 60 s: the dependency answers 50 calls a second and tells
//!   the others to come back in a second (a `503` with `Retry-After: 1`);
//! - `outage-http`: a real HTTP server on 127.0.0.1 answering 503, 200 requests at 50/s;
//! - `fairness`: agent runs share one budget (defaults) for 300 s, each with its own three-layer
//!   stack over its own dependency: 1, 2, 5 or 20 runs in an outage at 10 requests/s each beside
//!   run `b` with 10 % transient failures, at 100/s and at 10/s; `b-alone` is run `b` with nobody
//!   else on the budget. `stormguard-nested` gives each run its own handle
//!   (`RetryBudget::for_run`); `stormguard-nested-run-scopes` builds the stacks on plain clones
//!   and sends each run's requests in its scope (`RetryBudget::scope`); `stormguard-nested-one-run`
//!   shares plain clones without scopes, so all runs are one to the budget. Each case runs three
//!   times with different seeds: calls and successes are summed, and the success rate's range is
//!   shown.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::breaker::Breaker;
use stormguard::budget::{RetryBudget, RunLimits};
use stormguard::classify::hint::ServerHint;
use stormguard::classify::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    HttpClassifier, NeverClassifyEos,
};
use stormguard::error::ErrorCode;
#[path = "common/pictures.rs"]
mod pictures;

use stormguard::error::ToolError;
use stormguard::receipt::NotStored;
use stormguard::retry::RetryLayer;
use stormguard::tool::{Call, Stores, Toolbox, Tools};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

const SEED: u64 = 0x5EED;

/// The tool every stormguard stack here is built from, declared once: a read whose own `Retry`
/// (the client's layer) owns its attempts, on the default budget; `lookup-guarded` has the
/// default breaker under it (`{}`: `BreakerConfig::default()`), `lookup-hedged` the `tail`
/// scenario's hedge (the 90th percentile of recent latencies, after 50 answers).
const TOOLS: &str = r#"{
    "breakers": { "dependency": {} },
    "hedges": { "tail": { "percentile": 0.9, "min_samples": 50 } },
    "tools": [
        { "name": "lookup", "class": "read", "retry": ["layer"] },
        { "name": "lookup-guarded", "class": "read", "retry": ["layer"], "breaker": "dependency" },
        { "name": "lookup-hedged", "class": "read", "retry": ["layer"], "hedge": "tail" }
    ]
}"#;

/// The declared tools, live, drawing on `budget` (seeded here, so that runs repeat exactly; a
/// run's handle in the `fairness` scenario); each build has its own breaker and hedge.
fn tools(budget: &RetryBudget) -> Tools {
    Toolbox::from_json_str(TOOLS)
        .and_then(|toolbox| toolbox.build(Stores::new()))
        .expect("the demo's tool table is valid")
        .with_default_budget(budget.clone())
}

// ---------------------------------------------------------------------------------------------
// The dependency: counts calls, per operation too, and fails as the scenario says.

/// The answer that means "no such record".
const EMPTY: u64 = u64::MAX;

/// The answer of a dependency over its capacity: what a `503` with `Retry-After: 1` is to an HTTP
/// classifier (`Transient`, `unavailable`, the server's delay).
const OVERLOADED: u64 = u64::MAX - 1;

#[derive(Clone, Copy)]
enum Failing {
    Always,
    WithProbability(f64),
    /// Half the answers are empty; calls fail with this probability.
    HalfEmpty(f64),
    /// Every call fails until this long after the start.
    Until(Duration),
    /// Healthy until this long after the start, then every call fails.
    After(Duration),
    /// Answers at most this many calls in each second; the others are told to come back in a
    /// second (`OVERLOADED`).
    Capacity(u64),
    /// Every call fails for `outage`, then each fails with probability `p` until `until`, then
    /// none does.
    Brownout {
        outage: Duration,
        p: f64,
        until: Duration,
    },
}

#[derive(Clone)]
struct Dependency {
    failing: Failing,
    /// Seeds the calls' fates (`SEED` but in the `fairness` scenario's repeats).
    seed: u64,
    state: Arc<Mutex<DepState>>,
}

struct DepState {
    calls: u64,
    per_op: HashMap<u64, u32>,
    start: Instant,
    /// When the first call after healing succeeded, from the start.
    first_success_after_heal: Option<Duration>,
    /// Calls in each second from the start.
    per_second: Vec<u64>,
}

impl Dependency {
    fn new(failing: Failing) -> Self {
        Self::seeded(failing, SEED)
    }

    fn seeded(failing: Failing, seed: u64) -> Self {
        Dependency {
            failing,
            seed,
            state: Arc::new(Mutex::new(DepState {
                calls: 0,
                per_op: HashMap::new(),
                start: Instant::now(),
                first_success_after_heal: None,
                per_second: Vec::new(),
            })),
        }
    }

    fn calls(&self) -> u64 {
        self.state.lock().unwrap().calls
    }

    fn recovery(&self) -> Option<Duration> {
        let s = self.state.lock().unwrap();
        match (self.failing, s.first_success_after_heal) {
            (Failing::Until(heal), Some(at)) => Some(at - heal),
            (Failing::Brownout { outage, .. }, Some(at)) => Some(at - outage),
            _ => None,
        }
    }

    fn per_second(&self) -> Vec<u64> {
        self.state.lock().unwrap().per_second.clone()
    }

    fn max_per_op(&self) -> u32 {
        let s = self.state.lock().unwrap();
        s.per_op.values().copied().max().unwrap_or(0)
    }
}

fn next_f64(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

impl Service<u64> for Dependency {
    type Response = u64;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, op: u64) -> Self::Future {
        let mut s = self.state.lock().unwrap();
        s.calls += 1;
        let second = s.start.elapsed().as_secs() as usize;
        if s.per_second.len() <= second {
            s.per_second.resize(second + 1, 0);
        }
        s.per_second[second] += 1;
        let this_second = s.per_second[second];
        let nth = s.per_op.entry(op).or_default();
        *nth += 1;
        // A call's fate is drawn from its operation and its attempt number, not from the order
        // calls arrive in: every stack sees the same fate for the same attempt of the same
        // operation (common random numbers), so stacks that make fewer calls are compared on the
        // same luck, not on a reshuffled one.
        let mut fate = self.seed ^ op.wrapping_mul(0xA24B_AED4_963E_E407) ^ u64::from(*nth) << 48;
        let roll = next_f64(&mut fate);
        let mut answer = op;
        let fail = match self.failing {
            Failing::Always => true,
            Failing::WithProbability(p) => roll < p,
            Failing::HalfEmpty(p) => {
                if roll >= p && roll < 0.5 + p / 2.0 {
                    answer = EMPTY;
                }
                roll < p
            }
            Failing::After(down) => s.start.elapsed() >= down,
            Failing::Capacity(capacity) => {
                if this_second > capacity {
                    answer = OVERLOADED;
                }
                false
            }
            Failing::Until(heal) => {
                let now = s.start.elapsed();
                if now >= heal && s.first_success_after_heal.is_none() {
                    s.first_success_after_heal = Some(now);
                }
                now < heal
            }
            Failing::Brownout { outage, p, until } => {
                let now = s.start.elapsed();
                let fail = now < outage || (now < until && roll < p);
                if now >= outage && !fail && s.first_success_after_heal.is_none() {
                    s.first_success_after_heal = Some(now);
                }
                fail
            }
        };
        std::future::ready(if fail {
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "dependency unavailable",
            ))
        } else {
            Ok(answer)
        })
    }
}

/// The in-process classifier: `EMPTY` is a normal "no such record" answer.
#[derive(Clone, Copy)]
struct DemoClassifier;

impl<E: AsDynError> Classify<u64, E> for DemoClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<u64, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(EMPTY) => Classification::empty(),
            Ok(OVERLOADED) => {
                Classification::failure(FailureClass::Transient, ErrorCode::Unavailable)
                    .with_hint(ServerHint::RetryAfter(Duration::from_secs(1)))
            }
            Ok(_) => Classification::success(),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// tower's Retry with a typical policy: 3 attempts, full jitter from 100 ms, optional TpsBudget.

trait Failed {
    fn failed(&self) -> bool;
}

impl Failed for u64 {
    fn failed(&self) -> bool {
        *self == OVERLOADED
    }
}

impl<B> Failed for http::Response<B> {
    fn failed(&self) -> bool {
        self.status().is_server_error()
    }
}

#[derive(Clone)]
struct TowerPolicy {
    attempts_left: u32,
    retries: u32,
    budget: Option<Arc<TpsBudget>>,
    seeds: Arc<AtomicU64>,
    rng: Option<u64>,
}

impl TowerPolicy {
    fn new(budget: Option<Arc<TpsBudget>>, seeds: Arc<AtomicU64>) -> Self {
        TowerPolicy {
            attempts_left: 3,
            retries: 0,
            budget,
            seeds,
            rng: None,
        }
    }
}

impl<Req: Clone, Res: Failed, E> tower::retry::Policy<Req, Res, E> for TowerPolicy {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        let failed = match result {
            Ok(res) => res.failed(),
            Err(_) => true,
        };
        if !failed {
            if let Some(budget) = &self.budget {
                budget.deposit();
            }
            return None;
        }
        if self.attempts_left <= 1 {
            return None;
        }
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                return None;
            }
        }
        self.attempts_left -= 1;
        let seeds = &self.seeds;
        let rng = self
            .rng
            .get_or_insert_with(|| seeds.fetch_add(1, Ordering::Relaxed).wrapping_mul(SEED));
        let ceiling = Duration::from_millis(100) * 2u32.pow(self.retries);
        self.retries += 1;
        Some(tokio::time::sleep(ceiling.mul_f64(next_f64(rng))))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

fn tower_layer(budgeted: bool, seeds: &Arc<AtomicU64>) -> tower::retry::RetryLayer<TowerPolicy> {
    let budget = budgeted.then(|| Arc::new(TpsBudget::default()));
    tower::retry::RetryLayer::new(TowerPolicy::new(budget, seeds.clone()))
}

fn stormguard_budget() -> RetryBudget {
    seeded_budget(SEED)
}

fn seeded_budget(seed: u64) -> RetryBudget {
    // The crate's default settings, with a fixed seed so runs repeat exactly.
    RetryBudget::builder()
        .seed(seed)
        .build()
        .expect("defaults are valid")
}

// ---------------------------------------------------------------------------------------------
// Driving a stack with an open-loop load.

type BoxService<Req, Res> = tower::util::BoxCloneService<Req, Res, tower::BoxError>;

#[derive(Clone, Copy)]
enum Stack {
    TowerNested,
    TowerNestedBudget,
    StormguardNested,
    StormguardBreaker,
}

impl Stack {
    const ALL: [Stack; 4] = [
        Stack::TowerNested,
        Stack::TowerNestedBudget,
        Stack::StormguardNested,
        Stack::StormguardBreaker,
    ];

    fn name(self) -> &'static str {
        match self {
            Stack::TowerNested => "tower-nested",
            Stack::TowerNestedBudget => "tower-nested-budget",
            Stack::StormguardNested => "stormguard-nested",
            Stack::StormguardBreaker => "stormguard-breaker",
        }
    }

    /// The three-layer stack over `leaf`, each logical request `i` sent as `make(i)`;
    /// stormguard's layers classify with `classifier`.
    fn build<S, Req, Res, C>(
        self,
        leaf: S,
        make: impl Fn(u64) -> Req + Clone + Send + Sync + 'static,
        classifier: C,
    ) -> (BoxService<u64, Res>, Option<Breaker>)
    where
        S: Service<Req, Response = Res> + Clone + Send + 'static,
        S::Error: Into<tower::BoxError> + Send + Sync + 'static,
        S::Future: Send + 'static,
        Req: Clone + Send + 'static,
        Res: Failed + Send + 'static,
        C: StackClassifier<Res>,
    {
        let seeds = Arc::new(AtomicU64::new(1));
        match self {
            Stack::TowerNested | Stack::TowerNestedBudget => {
                let budgeted = matches!(self, Stack::TowerNestedBudget);
                let svc = ServiceBuilder::new()
                    .map_request(make)
                    .layer(tower_layer(budgeted, &seeds))
                    .layer(tower_layer(budgeted, &seeds))
                    .layer(tower_layer(budgeted, &seeds))
                    .service(leaf);
                (BoxService::new(svc.map_err(Into::into)), None)
            }
            Stack::StormguardNested => {
                let tools = tools(&stormguard_budget());
                (
                    stormguard_stack(&tools, "lookup", leaf, make, classifier),
                    None,
                )
            }
            Stack::StormguardBreaker => {
                let tools = tools(&stormguard_budget());
                let breaker = tools.breaker("dependency").cloned();
                let svc = stormguard_stack(&tools, "lookup-guarded", leaf, make, classifier);
                (svc, breaker)
            }
        }
    }
}

/// What stormguard's layers read `Res` with: decided at the head (no stream to watch, so the
/// breaker hands `Res` on as it is), from the leaf's errors and from the tool's stack's.
trait StackClassifier<Res>:
    Classify<Res, tower::BoxError, ClassifyEos = NeverClassifyEos>
    + Classify<Res, ToolError>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<Res, C> StackClassifier<Res> for C where
    C: Classify<Res, tower::BoxError, ClassifyEos = NeverClassifyEos>
        + Classify<Res, ToolError>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Three stormguard `Retry` layers over `leaf`: the agent loop's and the tool wrapper's, of the
/// class the tool `name` declares and on the budget it draws on, above the declared tool's own
/// stack (the client's layer: its `Retry`, and its breaker or hedge if it names one) over a body
/// that sends the call's request `i` to `leaf` as `make(i)`. All three join one operation.
fn stormguard_stack<S, Req, Res, C>(
    tools: &Tools,
    name: &str,
    leaf: S,
    make: impl Fn(u64) -> Req + Clone + Send + Sync + 'static,
    classifier: C,
) -> BoxService<u64, Res>
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Error: Into<tower::BoxError> + Send + Sync + 'static,
    S::Future: Send + 'static,
    Req: Send + 'static,
    Res: Send + 'static,
    C: StackClassifier<Res>,
{
    let tool = tools.layer(name).expect("a declared tool");
    let (policy, budget) = (*tool.policy(), tool.budget().clone());
    let body = tower::service_fn(move |call: Call| {
        let req = make(call.args().as_u64().unwrap_or_default());
        leaf.clone().oneshot(req)
    });
    // A read keeps no receipts: its answers (a streamed HTTP body among them) are not stored.
    let client = tool
        .classifier(classifier.clone())
        .codec(NotStored)
        .layer(body);
    let layer = |name: &'static str| {
        RetryLayer::new(policy, budget.clone())
            .name(name)
            .classifier(classifier.clone())
    };
    let svc = ServiceBuilder::new()
        .map_request(|i: u64| Call::new("storm", "step", serde_json::json!(i)))
        .layer(layer("agent-loop"))
        .layer(layer("tool-wrapper"))
        .service(client);
    BoxService::new(svc.map_err(tower::BoxError::from))
}

/// How the runs of the `fairness` scenario reach their shared budget.
#[derive(Clone, Copy)]
enum Sharing {
    /// Each run's stacks are built on its own handle (`RetryBudget::for_run`).
    Handles,
    /// Every stack gets a plain clone of the budget: one run to it.
    Clones,
    /// Every stack gets a plain clone, and each run's requests are sent in its scope
    /// (`RetryBudget::scope`): a stack built once serving many runs.
    Scopes,
}

impl Sharing {
    fn stack(self) -> &'static str {
        match self {
            Sharing::Handles => "stormguard-nested",
            Sharing::Clones => "stormguard-nested-one-run",
            Sharing::Scopes => "stormguard-nested-run-scopes",
        }
    }
}

/// What one repeat of the `fairness` scenario saw: the failing runs together, then run `b`.
struct FairRepeat {
    failing: (u64, u64, u32),
    healthy: (u64, u64, u32),
}

/// Failing runs beside the healthy one, in the `fairness` scenario.
const FAILING_RUNS: [u32; 4] = [1, 2, 5, 20];
/// Repeats of each `fairness` case, with different seeds (the success is given as a range).
const REPEATS: u64 = 3;
const FAIR_SECS: u64 = 300;
const FAIL_RATE: f64 = 10.0;
/// Run `b`'s rates: a busy run, and a quiet one whose deposits a few failing runs can outspend.
const HEALTHY_RATES: [f64; 2] = [100.0, 10.0];

/// One repeat: `failing` runs in an outage (10 requests/s each) and run `b` (`rate_b`, 10 %
/// transient failures) on one budget for 300 s, each run with its own three-layer stack over its
/// own dependency. `failing == 0` is run `b` alone.
fn fairness_once(failing: u32, sharing: Sharing, rate_b: f64, seed: u64) -> FairRepeat {
    let rt = paused_runtime();
    let deps: Vec<Dependency> = (0..failing)
        .map(|i| Dependency::seeded(Failing::Always, seed ^ u64::from(i + 1) << 32))
        .collect();
    let dep_b = Dependency::seeded(Failing::WithProbability(0.1), seed);
    let (ok_failing, ok_b) = rt.block_on(async {
        let shared = seeded_budget(seed);
        // Each run's handle for its stacks, and the run whose scope its requests are sent in.
        let handle = || {
            let run = shared.for_run(RunLimits::default());
            match sharing {
                Sharing::Handles => (run, None),
                Sharing::Clones => (shared.clone(), None),
                Sharing::Scopes => (shared.clone(), Some(run)),
            }
        };
        let mut runs = JoinSet::new();
        for dep in &deps {
            let (budget, scope) = handle();
            let svc = stormguard_stack(
                &tools(&budget),
                "lookup",
                dep.clone(),
                |i| i,
                DemoClassifier,
            );
            let count = (FAIL_RATE * FAIR_SECS as f64) as u64;
            runs.spawn(drive_as(scope, svc, |i| i, FAIL_RATE, count));
        }
        let (budget, scope) = handle();
        let b = stormguard_stack(
            &tools(&budget),
            "lookup",
            dep_b.clone(),
            |i| i,
            DemoClassifier,
        );
        let count_b = (rate_b * FAIR_SECS as f64) as u64;
        let ok_b = drive_as(scope, b, |i| i, rate_b, count_b).await;
        let mut ok_failing = 0;
        while let Some(ok) = runs.join_next().await {
            ok_failing += ok.expect("a failing run");
        }
        (ok_failing, ok_b)
    });
    let calls = deps.iter().map(Dependency::calls).sum();
    let max_per_op = deps.iter().map(Dependency::max_per_op).max().unwrap_or(0);
    FairRepeat {
        failing: (calls, ok_failing, max_per_op),
        healthy: (dep_b.calls(), ok_b, dep_b.max_per_op()),
    }
}

/// The `fairness` scenario: for 1, 2, 5 and 20 failing runs beside healthy run `b` (at 100/s,
/// then at 10/s), sharing the budget through run handles or plain clones; and `b` alone. Each
/// case runs `REPEATS` times with different seeds: calls and successes are summed, the success
/// rate's range is given.
fn fairness() -> Vec<Row> {
    let mut cases = Vec::new();
    for rate_b in HEALTHY_RATES {
        cases.push((0, Sharing::Handles, rate_b));
        for n in FAILING_RUNS {
            cases.push((n, Sharing::Handles, rate_b));
            cases.push((n, Sharing::Scopes, rate_b));
            cases.push((n, Sharing::Clones, rate_b));
        }
    }
    let mut rows = Vec::new();
    for (n, sharing, rate_b) in cases {
        let wall = std::time::Instant::now();
        let repeats: Vec<FairRepeat> = (0..REPEATS)
            .map(|r| fairness_once(n, sharing, rate_b, SEED.wrapping_add(r)))
            .collect();
        let elapsed = wall.elapsed();
        let mut row = |run: String, rate: f64, pick: fn(&FairRepeat) -> (u64, u64, u32)| {
            let logical = (rate * FAIR_SECS as f64) as u64;
            let rates: Vec<f64> = repeats
                .iter()
                .map(|r| pick(r).1 as f64 / logical as f64)
                .collect();
            rows.push(Row {
                scenario: "fairness",
                stack: sharing.stack(),
                run: Some(run),
                rate,
                logical: logical * REPEATS,
                calls: repeats.iter().map(|r| pick(r).0).sum(),
                successes: repeats.iter().map(|r| pick(r).1).sum(),
                success_range: Some((
                    rates.iter().copied().fold(f64::INFINITY, f64::min),
                    rates.iter().copied().fold(0.0, f64::max),
                )),
                max_per_op: repeats.iter().map(|r| pick(r).2).max().unwrap_or(0),
                breaker_opens: 0,
                recovery: None,
                p99: None,
                per_second: Vec::new(),
                elapsed,
            });
        };
        if n == 0 {
            row("b-alone".to_string(), rate_b, |r| r.healthy);
            continue;
        }
        row(format!("{n} failing"), FAIL_RATE * f64::from(n), |r| {
            r.failing
        });
        row(format!("b beside {n}"), rate_b, |r| r.healthy);
    }
    rows
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// Sends `count` requests at `rate` per second, each on its own task; returns the successes.
async fn drive<Req, Res>(
    svc: BoxService<Req, Res>,
    make: impl Fn(u64) -> Req,
    rate: f64,
    count: u64,
) -> u64
where
    Req: Send + 'static,
    Res: Failed + Send + 'static,
{
    drive_as(None, svc, make, rate, count).await
}

/// [`drive`], each request sent in `run`'s scope (`RetryBudget::scope`) if there is one.
async fn drive_as<Req, Res>(
    run: Option<RetryBudget>,
    svc: BoxService<Req, Res>,
    make: impl Fn(u64) -> Req,
    rate: f64,
    count: u64,
) -> u64
where
    Req: Send + 'static,
    Res: Failed + Send + 'static,
{
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = JoinSet::new();
    for i in 0..count {
        tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
        let svc = svc.clone();
        let req = make(i);
        let run = run.clone();
        tasks.spawn(async move {
            let answer = match run {
                Some(run) => run.scope(svc.oneshot(req)).await,
                None => svc.oneshot(req).await,
            };
            match answer {
                Ok(res) => !res.failed(),
                Err(_) => false,
            }
        });
    }
    let mut successes = 0;
    while let Some(done) = tasks.join_next().await {
        successes += u64::from(done.expect("request task"));
    }
    successes
}

struct Row {
    scenario: &'static str,
    stack: &'static str,
    /// Which agent run the row is about (the `fairness` scenario), if any.
    run: Option<String>,
    rate: f64,
    logical: u64,
    calls: u64,
    successes: u64,
    /// The lowest and highest success rate over the repeats (the `fairness` scenario).
    success_range: Option<(f64, f64)>,
    max_per_op: u32,
    breaker_opens: u64,
    recovery: Option<Duration>,
    /// The 99th percentile of the logical requests' latency (the `tail` scenario).
    p99: Option<Duration>,
    /// Dependency calls in each second (the in-process scenarios).
    per_second: Vec<u64>,
    elapsed: Duration,
}

impl Row {
    fn amplification(&self) -> f64 {
        self.calls as f64 / self.logical as f64
    }

    fn success_rate(&self) -> f64 {
        self.successes as f64 / self.logical as f64
    }

    fn json(&self) -> String {
        serde_json::json!({
            "scenario": self.scenario,
            "stack": self.stack,
            "run": self.run,
            "rate_per_sec": self.rate,
            "logical": self.logical,
            "dependency_calls": self.calls,
            "amplification": (self.amplification() * 10000.0).round() / 10000.0,
            "successes": self.successes,
            "success_rate": self.success_rate(),
            "success_range": self.success_range.map(|(lo, hi)| [lo, hi]),
            "max_calls_per_operation": self.max_per_op,
            "breaker_opens": self.breaker_opens,
            "recovery_ms": self.recovery.map(|d| d.as_millis() as u64),
            "p99_ms": self.p99.map(|d| d.as_secs_f64() * 1000.0),
            "wall_ms": self.elapsed.as_millis() as u64,
        })
        .to_string()
    }
}

fn simulate(scenario: &'static str, stack: Stack, failing: Failing, rate: f64, secs: u64) -> Row {
    let wall = std::time::Instant::now();
    let rt = paused_runtime();
    let dep = Dependency::new(failing);
    let count = (rate * secs as f64) as u64;
    let (successes, breaker) = rt.block_on(async {
        let (svc, breaker) = stack.build(dep.clone(), |i| i, DemoClassifier);
        (drive(svc, |i| i, rate, count).await, breaker)
    });
    Row {
        scenario,
        stack: stack.name(),
        run: None,
        rate,
        logical: count,
        calls: dep.calls(),
        successes,
        success_range: None,
        max_per_op: dep.max_per_op(),
        breaker_opens: breaker.map_or(0, |b| b.opens()),
        recovery: dep.recovery(),
        p99: None,
        per_second: dep.per_second(),
        elapsed: wall.elapsed(),
    }
}

// ---------------------------------------------------------------------------------------------
// The `tail` scenario: reads that answer in 10 ms, but 5 % take a second. Hedging, side by side.

/// A read whose attempt takes 10 ms, or 1 s for 5 % of attempts (drawn from the operation and
/// the attempt number, so every stack meets the same slow attempts).
#[derive(Clone, Default)]
struct SlowReads {
    calls: Arc<AtomicU64>,
    per_op: Arc<Mutex<HashMap<u64, u32>>>,
}

impl SlowReads {
    /// One attempt of `op`: the time it takes.
    fn attempt(&self, op: u64) -> tokio::time::Sleep {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let nth = {
            let mut per_op = self.per_op.lock().unwrap();
            let n = per_op.entry(op).or_default();
            *n += 1;
            *n
        };
        let mut fate = SEED ^ op.wrapping_mul(0xA24B_AED4_963E_E407) ^ u64::from(nth) << 48;
        let slow = next_f64(&mut fate) < 0.05;
        tokio::time::sleep(Duration::from_millis(if slow { 1_000 } else { 10 }))
    }
}

pin_project_lite::pin_project! {
    /// The answer of a `SlowReads` attempt, once its time has passed.
    struct Answered {
        #[pin]
        sleep: tokio::time::Sleep,
        op: u64,
    }
}

impl Future for Answered {
    type Output = Result<u64, std::io::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let op = *this.op;
        this.sleep.poll(cx).map(|()| Ok(op))
    }
}

#[derive(Clone)]
struct Reads(SlowReads);

impl Service<u64> for Reads {
    type Response = u64;
    type Error = std::io::Error;
    type Future = Answered;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, op: u64) -> Self::Future {
        Answered {
            sleep: self.0.attempt(op),
            op,
        }
    }
}

#[derive(Clone, Copy)]
enum TailStack {
    TowerHedge,
    StormguardNested,
    StormguardHedged,
}

impl TailStack {
    const ALL: [TailStack; 3] = [
        TailStack::TowerHedge,
        TailStack::StormguardNested,
        TailStack::StormguardHedged,
    ];

    fn name(self) -> &'static str {
        match self {
            TailStack::TowerHedge => "tower-hedge",
            TailStack::StormguardNested => "stormguard-nested",
            TailStack::StormguardHedged => "stormguard-hedged",
        }
    }
}

/// tower's hedge policy: every read may be hedged.
#[derive(Clone)]
struct HedgeReads;

impl tower::hedge::Policy<u64> for HedgeReads {
    fn clone_request(&self, req: &u64) -> Option<u64> {
        Some(*req)
    }

    fn can_retry(&self, _: &u64) -> bool {
        true
    }
}

/// Both hedges wait for the 90th percentile of recent latencies, after 50 answers.
const TAIL_QUANTILE: f64 = 0.9;
const TAIL_MIN_SAMPLES: u32 = 50;

fn tail(stack: TailStack) -> Row {
    let wall = std::time::Instant::now();
    let rt = paused_runtime();
    let (rate, secs) = (100.0, 60u64);
    let count = (rate * secs as f64) as u64;
    let leaf = SlowReads::default();
    let reads = Reads(leaf.clone());
    let (successes, latencies) = rt.block_on(async {
        let svc: BoxService<u64, u64> = match stack {
            TailStack::TowerHedge => {
                // tower 0.5's `Hedge`: the percentile of the last full period (1 s here).
                let hedge = tower::hedge::Hedge::new::<u64>(
                    reads,
                    HedgeReads,
                    u64::from(TAIL_MIN_SAMPLES),
                    TAIL_QUANTILE as f32,
                    Duration::from_secs(1),
                );
                // `Hedge` is not `Clone`: a `Buffer` shares it (no delay on the paused clock).
                BoxService::new(tower::buffer::Buffer::new(hedge, 1024))
            }
            TailStack::StormguardNested => {
                let tools = tools(&stormguard_budget());
                stormguard_stack(&tools, "lookup", reads, |i| i, DemoClassifier)
            }
            TailStack::StormguardHedged => {
                // The hedge declared in `TOOLS`: the same as tower's above.
                let tools = tools(&stormguard_budget());
                let declared = tools.toolbox().hedges()["tail"];
                assert_eq!(declared.percentile, Some(TAIL_QUANTILE));
                assert_eq!(declared.min_samples, Some(TAIL_MIN_SAMPLES));
                stormguard_stack(&tools, "lookup-hedged", reads, |i| i, DemoClassifier)
            }
        };
        drive_timed(svc, rate, count).await
    });
    let mut sorted = latencies;
    sorted.sort_unstable();
    let p99 = sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
    let max_per_op = leaf
        .per_op
        .lock()
        .unwrap()
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    Row {
        scenario: "tail",
        stack: stack.name(),
        run: None,
        rate,
        logical: count,
        calls: leaf.calls.load(Ordering::Relaxed),
        successes,
        success_range: None,
        max_per_op,
        breaker_opens: 0,
        recovery: None,
        p99: Some(p99),
        per_second: Vec::new(),
        elapsed: wall.elapsed(),
    }
}

/// `drive`, keeping each request's latency.
async fn drive_timed(svc: BoxService<u64, u64>, rate: f64, count: u64) -> (u64, Vec<Duration>) {
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = JoinSet::new();
    for i in 0..count {
        tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
        let svc = svc.clone();
        tasks.spawn(async move {
            let sent = Instant::now();
            let ok = svc.oneshot(i).await.is_ok();
            (ok, sent.elapsed())
        });
    }
    let (mut successes, mut latencies) = (0, Vec::with_capacity(count as usize));
    while let Some(done) = tasks.join_next().await {
        let (ok, latency) = done.expect("request task");
        successes += u64::from(ok);
        latencies.push(latency);
    }
    (successes, latencies)
}

// ---------------------------------------------------------------------------------------------
// The same over real sockets: a hyper server on 127.0.0.1 that answers 503.

type HttpReq = http::Request<Full<Bytes>>;
type HttpRes = http::Response<hyper::body::Incoming>;

/// Calls the 503 server received, in total and per logical operation (the request body).
#[derive(Default)]
struct Received {
    calls: AtomicU64,
    per_op: Mutex<HashMap<u64, u32>>,
}

async fn start_503_server(received: Arc<Received>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let received = received.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let received = received.clone();
                        async move {
                            received.calls.fetch_add(1, Ordering::Relaxed);
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            if let Some(op) = body
                                .ok()
                                .and_then(|b| std::str::from_utf8(&b).ok()?.parse::<u64>().ok())
                            {
                                *received.per_op.lock().unwrap().entry(op).or_default() += 1;
                            }
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .status(503)
                                    .body(Full::new(Bytes::from_static(b"unavailable")))
                                    .expect("response"),
                            )
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    addr
}

/// The hyper client as a `Clone` tower service that reads each body to the end.
#[derive(Clone)]
struct HttpClient {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Service<HttpReq> for HttpClient {
    type Response = HttpRes;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpRes, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpReq) -> Self::Future {
        let client = self.client.clone();
        Box::pin(async move { Ok(client.request(req).await?) })
    }
}

fn outage_http(stack: Stack) -> Row {
    let wall = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (rate, count) = (50.0, 200);
    let received = Arc::new(Received::default());
    let (successes, breaker) = rt.block_on(async {
        let addr = start_503_server(received.clone()).await;
        let client = HttpClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        let uri: http::Uri = format!("http://{addr}/tool").parse().expect("uri");
        let make = move |i: u64| {
            http::Request::post(uri.clone())
                .body(Full::new(Bytes::from(i.to_string())))
                .expect("request")
        };
        let (svc, breaker) = stack.build(client, make, HttpClassifier);
        let successes = drive(svc, |i| i, rate, count).await;
        (successes, breaker)
    });
    let max_per_op = received
        .per_op
        .lock()
        .unwrap()
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    Row {
        scenario: "outage-http",
        stack: stack.name(),
        run: None,
        rate,
        logical: count,
        calls: received.calls.load(Ordering::Relaxed),
        successes,
        success_range: None,
        max_per_op,
        breaker_opens: breaker.map_or(0, |b| b.opens()),
        recovery: None,
        p99: None,
        per_second: Vec::new(),
        elapsed: wall.elapsed(),
    }
}

const SCENARIOS: [&str; 12] = [
    "outage",
    "transient",
    "empty-results",
    "recovery",
    "partial",
    "brownout",
    "outage-after-healthy",
    "overload",
    "tail",
    "outage-http",
    "fairness",
    "",
];

/// Down for 20 s, then 30 % of calls fail for 40 s, then none.
const BROWNOUT: Failing = Failing::Brownout {
    outage: Duration::from_secs(20),
    p: 0.3,
    until: Duration::from_secs(60),
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    // `--scenario NAME` (repeatable) runs only those scenarios.
    let mut only = Vec::new();
    let mut svg = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => {}
            "--svg" => match it.next() {
                Some(dir) => svg = Some(std::path::PathBuf::from(dir)),
                None => {
                    eprintln!("storm: --svg takes a directory");
                    std::process::exit(2);
                }
            },
            "--scenario" => match it.next() {
                Some(name) if SCENARIOS.contains(&name.as_str()) && !name.is_empty() => {
                    only.push(name.clone())
                }
                other => {
                    eprintln!(
                        "storm: --scenario takes one of {:?}, got {other:?}",
                        &SCENARIOS[..SCENARIOS.len() - 1]
                    );
                    std::process::exit(2);
                }
            },
            other => {
                eprintln!(
                    "storm: unknown argument {other:?} (use --json, --scenario NAME, --svg DIR)"
                );
                std::process::exit(2);
            }
        }
    }
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let mut rows = Vec::new();
    let mut emit = |row: Row| {
        if json {
            println!("{}", row.json());
        }
        rows.push(row);
    };
    // The in-process scenarios: (name, how the dependency fails, requests/s, seconds).
    let scenarios = [
        ("outage", Failing::Always, 1.0, 600),
        ("outage", Failing::Always, 100.0, 60),
        ("transient", Failing::WithProbability(0.1), 100.0, 300),
        ("empty-results", Failing::HalfEmpty(0.05), 100.0, 300),
        (
            "recovery",
            Failing::Until(Duration::from_secs(30)),
            100.0,
            90,
        ),
        ("partial", Failing::WithProbability(0.5), 100.0, 60),
        ("brownout", BROWNOUT, 100.0, 120),
        ("brownout", BROWNOUT, 1.0, 120),
        (
            "outage-after-healthy",
            Failing::After(Duration::from_secs(60)),
            100.0,
            120,
        ),
        ("overload", Failing::Capacity(50), 100.0, 60),
    ];
    for (name, failing, rate, secs) in scenarios {
        if wanted(name) {
            for stack in Stack::ALL {
                emit(simulate(name, stack, failing, rate, secs));
            }
        }
    }
    if wanted("tail") {
        for stack in TailStack::ALL {
            emit(tail(stack));
        }
    }
    if wanted("outage-http") {
        for stack in Stack::ALL {
            emit(outage_http(stack));
        }
    }
    if wanted("fairness") {
        for row in fairness() {
            emit(row);
        }
    }
    if let Some(dir) = &svg {
        // Dependency calls per second, for the stacks the README pictures compare.
        let pick = |scenario: &str, rate: f64| -> Vec<pictures::Series> {
            rows.iter()
                .filter(|r| r.scenario == scenario && r.rate == rate && !r.per_second.is_empty())
                .filter(|r| {
                    matches!(
                        r.stack,
                        "tower-nested" | "stormguard-nested" | "stormguard-breaker"
                    )
                })
                .map(|r| pictures::Series {
                    stack: r.stack,
                    per_second: r.per_second.clone(),
                })
                .collect()
        };
        for (scenario, file, title) in [
            (
                "outage",
                "storm-outage.svg",
                "Outage at 100 requests/s: dependency calls per second",
            ),
            (
                "brownout",
                "storm-brownout.svg",
                "Brownout at 100 requests/s (down 20 s, 30 % failing 40 s, healthy 60 s)",
            ),
        ] {
            let series = pick(scenario, 100.0);
            if series.is_empty() {
                continue;
            }
            if let Err(e) = pictures::calls_per_second(dir, file, title, &series) {
                eprintln!("storm: writing {file} failed: {e}");
                std::process::exit(1);
            }
        }
    }
    if !json {
        println!(
            "{:<14} {:<45} {:>7} {:>8} {:>10} {:>14} {:>22} {:>7} {:>6} {:>12} {:>9}",
            "scenario",
            "stack (run)",
            "rate/s",
            "logical",
            "dep calls",
            "amplification",
            "success",
            "max/op",
            "opens",
            "recovery",
            "p99"
        );
        for r in &rows {
            println!(
                "{:<14} {:<45} {:>7} {:>8} {:>10} {:>13.3}x {:>22} {:>7} {:>6} {:>12} {:>9}",
                r.scenario,
                match &r.run {
                    Some(run) => format!("{} ({run})", r.stack),
                    None => r.stack.to_string(),
                },
                r.rate,
                r.logical,
                r.calls,
                r.amplification(),
                match r.success_range {
                    Some((lo, hi)) => format!(
                        "{:.2}% ({:.2}-{:.2})",
                        r.success_rate() * 100.0,
                        lo * 100.0,
                        hi * 100.0
                    ),
                    None => format!("{:.2}%", r.success_rate() * 100.0),
                },
                if r.max_per_op == 0 {
                    "-".to_string()
                } else {
                    r.max_per_op.to_string()
                },
                r.breaker_opens,
                r.recovery
                    .map_or("-".to_string(), |d| format!("{} ms", d.as_millis())),
                r.p99
                    .map_or("-".to_string(), |d| format!("{} ms", d.as_millis())),
            );
        }
    }
}
