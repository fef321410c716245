//! Agent episodes run through each policy on tokio's paused clock, with the real stormguard
//! layers for the `stormguard` policies: what each step does, crashes and resumes, and the count.

use super::provider::{draw, Call, Done, EffectId, Fate, Faults, Provider, SimClassifier};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
use stormguard::budget::{RetryBudget, RunLimits};
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::{Action, KeyError};
use stormguard::receipt::{
    Clock, Consistency, InMemoryStore, ReadBack, ReadBackResult, ReceiptConfig, ReceiptGuardLayer,
    ReceiptStore,
};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

/// The policies compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Retry everything, no key.
    Naive,
    /// A fresh key on every attempt.
    RandomKey,
    /// No key; before a retry or a resume, look for the effect in the provider's (lagging) log.
    ReadbackOnly,
    /// Class-based retry, derived keys, receipts, unknown outcomes escalated.
    Stormguard,
    /// The same, with a consistent read-back where no key can protect the write.
    StormguardReadback,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::Naive,
        Policy::RandomKey,
        Policy::ReadbackOnly,
        Policy::Stormguard,
        Policy::StormguardReadback,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Naive => "naive",
            Policy::RandomKey => "random-key",
            Policy::ReadbackOnly => "readback-only",
            Policy::Stormguard => "stormguard",
            Policy::StormguardReadback => "stormguard-readback",
        }
    }

    fn stormguard(self) -> bool {
        matches!(self, Policy::Stormguard | Policy::StormguardReadback)
    }
}

/// The steps of an episode: (tool, class, the provider takes a key, a repeat has an effect).
pub const STEPS: [(&str, ToolClass, bool, bool); 6] = [
    ("lookup_order", ToolClass::Read, false, false),
    ("set_status", ToolClass::IdempotentWrite, false, false),
    ("send_invoice", ToolClass::KeyedWrite, true, true),
    ("charge_card", ToolClass::KeyedWrite, true, true),
    ("post_ticket", ToolClass::UnkeyedWrite, false, true),
    ("book_shipment", ToolClass::MultiStep, true, true),
];

/// Effects an episode intends (the steps whose repeat is a duplicate).
pub const EFFECTS: u32 = 4;

/// The receipt lease (longer than the provider's in-flight bound) and the wait for a parallel
/// duplicate's receipt.
const LEASE: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(10);

/// How a step ended for the run.
#[derive(Clone, Debug)]
enum StepEnd {
    Done,
    /// The run stops and asks a human: why (code, tool, when) and the error's hint.
    Escalated(String, String),
    /// The run gives up on the step and reports failure.
    Failed,
}

/// The counts of one policy over the episodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub episodes: u32,
    pub effects_intended: u64,
    pub duplicate_effects: u64,
    pub episodes_duplicated: u32,
    pub silent_duplicates: u32,
    pub escalated: u32,
    pub failed: u32,
    pub provider_calls: u64,
    /// Provider calls beyond the first of each action.
    pub repeats: u64,
    pub step_calls: u64,
    /// Why runs were escalated: "code: tool, when" -> count, and the hint the error carried.
    pub escalations: BTreeMap<String, (u32, String)>,
    /// Which faults fired: fates drawn, crashes, reissues, parallel duplicates, resumes after
    /// the key window, resumes on the other worker's clock.
    pub faults: BTreeMap<String, u64>,
}

impl Stats {
    pub fn rate(&self, n: u32) -> f64 {
        f64::from(n) / f64::from(self.episodes.max(1))
    }
}

/// The stores' clock: tokio's (paused) clock, so leases follow the simulated time. It enters
/// the runtime it was made on before reading it: the SQLite store reads its clock on its own
/// writer thread, where tokio's clock would otherwise be the real one (outside review: with
/// `--sqlite`, no lease ever passed).
#[derive(Clone)]
pub struct SimClock {
    base: Instant,
    runtime: tokio::runtime::Handle,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let _inside = self.runtime.enter();
        1_800_000_000_000 + self.base.elapsed().as_millis() as u64
    }
}

impl SimClock {
    pub fn new() -> Self {
        SimClock {
            base: Instant::now(),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

/// The provider's own log, read consistently: what it does not hold was not applied (and, once
/// the receipt lease has passed, cannot still land: the lease outlasts the in-flight bound).
#[derive(Clone)]
struct ConsistentLog(Provider);

impl ReadBack<Call, Done> for ConsistentLog {
    fn read_back(&self, call: &Call) -> impl Future<Output = ReadBackResult<Done>> + Send {
        let found = self.0.logged(call.effect, Duration::ZERO);
        async move {
            match found {
                Some(done) => ReadBackResult::Found(done),
                None => ReadBackResult::Absent,
            }
        }
    }
}

type Stack = BoxCloneService<Call, Done, BoxError>;

fn action(call: &Call) -> Result<Action, KeyError> {
    let (tool, ..) = STEPS[usize::from(call.effect.step)];
    // The logical identity: the run, the step, the tool and the order it acts on; never the
    // model's wording.
    Action::new(
        &format!("run-{}", call.effect.episode),
        &format!("step-{}", call.effect.step),
        tool,
        &serde_json::json!({ "order": call.effect.episode }),
    )
}

/// What a stormguard run holds: one stack per step, over a store, a breaker per tool, a run
/// budget.
struct Stacks {
    stacks: Vec<Stack>,
}

impl Stacks {
    fn new<St: ReceiptStore>(
        policy: Policy,
        provider: &Provider,
        store: &St,
        breakers: &[Breaker],
        budget: &RetryBudget,
    ) -> Self {
        let stacks = STEPS
            .iter()
            .enumerate()
            .map(|(i, (_, class, _, _))| {
                let retry = stormguard::retry::RetryLayer::new(*class, budget.clone())
                    .classifier(SimClassifier);
                let breaker =
                    CircuitBreakerLayer::new(breakers[i].clone()).classifier(SimClassifier);
                if *class == ToolClass::Read {
                    let svc = ServiceBuilder::new()
                        .layer(retry)
                        .layer(breaker)
                        .service(provider.clone());
                    return BoxCloneService::new(ServiceExt::<Call>::map_err(svc, BoxError::from));
                }
                let receipts = ReceiptGuardLayer::new(store.clone(), *class, action as fn(&_) -> _)
                    .classifier(SimClassifier)
                    .config(
                        ReceiptConfig::builder()
                            .lease(LEASE)
                            .wait(WAIT)
                            .build()
                            .expect("valid timing"),
                    );
                let below = ServiceBuilder::new()
                    .layer(breaker)
                    .service(provider.clone());
                if policy == Policy::StormguardReadback {
                    let receipts =
                        receipts.read_back(ConsistentLog(provider.clone()), Consistency::Immediate);
                    let svc = ServiceBuilder::new()
                        .layer(retry)
                        .layer(receipts)
                        .service(below);
                    BoxCloneService::new(ServiceExt::<Call>::map_err(svc, BoxError::from))
                } else {
                    let svc = ServiceBuilder::new()
                        .layer(retry)
                        .layer(receipts)
                        .service(below);
                    BoxCloneService::new(ServiceExt::<Call>::map_err(svc, BoxError::from))
                }
            })
            .collect();
        Stacks { stacks }
    }
}

/// One policy over `episodes` episodes from `seed`, on the in-memory store (or SQLite files
/// under `sqlite`, reopened after each crash).
pub async fn run(
    policy: Policy,
    seed: u64,
    episodes: u32,
    faults: Faults,
    sqlite: Option<&std::path::Path>,
) -> Stats {
    let provider = Provider::new(seed, faults);
    let clock = SimClock::new();
    let memory = InMemoryStore::with_clock(clock.clone());
    let breakers: Vec<Breaker> = STEPS
        .iter()
        .map(|(tool, ..)| Breaker::new(*tool, BreakerConfig::default()))
        .collect();
    // The default settings, with the run's seed for the backoff jitter: runs repeat exactly.
    let budget = RetryBudget::builder()
        .seed(seed)
        .build()
        .expect("defaults are valid");
    let mut stats = Stats::default();
    let sqlite_path = sqlite.map(|dir| dir.join(format!("{}-{seed}.db", policy.name())));
    if let Some(path) = &sqlite_path {
        let _ = std::fs::remove_file(path);
    }
    for episode in 0..episodes {
        let ep = Episode {
            policy,
            seed,
            episode,
            faults,
            provider: provider.clone(),
        };
        let run_budget = budget.for_run(RunLimits::default());
        let end = match &sqlite_path {
            None => {
                ep.run(&mut stats, |_| memory.clone(), &breakers, &run_budget)
                    .await
            }
            Some(path) => {
                let open = |_| {
                    stormguard::receipt::SqliteStore::open_with_clock(
                        path,
                        stormguard::receipt::Durability::Process,
                        clock.clone(),
                    )
                    .expect("the SQLite store opens")
                };
                ep.run(&mut stats, open, &breakers, &run_budget).await
            }
        };
        // Let every late commit land before counting.
        tokio::time::sleep(faults.in_flight + Duration::from_secs(1)).await;
        provider.settle_now();
        let mut duplicated = 0;
        for (step, (_, _, _, side_effect)) in STEPS.iter().enumerate() {
            if !side_effect {
                continue;
            }
            let applied = provider.applied(EffectId {
                episode,
                step: step as u8,
            });
            duplicated += u64::from(applied.saturating_sub(1));
            if applied > 1 && std::env::var_os("EPISODES_DEBUG").is_some() {
                eprintln!(
                    "DUP {} ep {episode} step {step} applied {applied}",
                    policy.name()
                );
            }
        }
        stats.episodes += 1;
        stats.effects_intended += u64::from(EFFECTS);
        stats.duplicate_effects += duplicated;
        if duplicated > 0 {
            stats.episodes_duplicated += 1;
            if matches!(end, StepEnd::Done) {
                stats.silent_duplicates += 1;
            }
        }
        match end {
            StepEnd::Done => {}
            StepEnd::Escalated(code, hint) => {
                stats.escalated += 1;
                let entry = stats.escalations.entry(code).or_insert((0, hint));
                entry.0 += 1;
            }
            StepEnd::Failed => stats.failed += 1,
        }
    }
    stats.provider_calls = provider.calls();
    stats.repeats = provider.repeats();
    for (fate, n) in provider.fates() {
        if fate != Fate::Ok {
            stats.faults.insert(format!("{fate:?}"), n);
        }
    }
    stats
}

/// When a crashed run came back.
#[derive(Clone, Copy)]
enum Resume {
    /// Within the receipt lease (a supervisor restarted it at once).
    Soon,
    /// After the lease, within the provider's key window.
    Later,
    /// After the provider's key window (25 h).
    AfterKeyWindow,
}

struct Episode {
    policy: Policy,
    seed: u64,
    episode: u32,
    faults: Faults,
    provider: Provider,
}

impl Episode {
    fn roll(&self, what: u64, step: u8) -> f64 {
        draw(&[self.seed ^ what, u64::from(self.episode), u64::from(step)])
    }

    fn call(&self, step: u8, wording: u32) -> Call {
        let (_, _, keyed_endpoint, side_effect) = STEPS[usize::from(step)];
        Call {
            effect: EffectId {
                episode: self.episode,
                step,
            },
            keyed_endpoint,
            side_effect,
            text: format!("order {} step {step}, wording {wording}", self.episode),
            key: None,
        }
    }

    /// Runs the episode to its end: every step done, or escalated, or failed. A crash drops
    /// every future of the run without running a destructor (as SIGKILL would: no lease is given
    /// up), then the run resumes from its checkpoint, on the other worker, with the store opened
    /// again.
    async fn run<St: ReceiptStore>(
        &self,
        stats: &mut Stats,
        open: impl Fn(u32) -> St,
        breakers: &[Breaker],
        budget: &RetryBudget,
    ) -> StepEnd {
        let crash = self.roll(0xC4A5, 0) < self.faults.crash;
        if crash {
            let step = 1 + (self.roll(0xC4A6, 0) * 5.0) as u8;
            self.provider.crash_at(self.episode, step.min(5));
            *stats.faults.entry("crash".into()).or_default() += 1;
        }
        let mut generation = 0;
        let mut stacks = self.policy.stormguard().then(|| {
            Stacks::new(
                self.policy,
                &self.provider,
                &open(generation),
                breakers,
                budget,
            )
        });
        let mut checkpoint = 0u8;
        // When this run (on the worker that crashed) last sent each step, by its own clock.
        let mut sent_at: [Option<Instant>; 6] = [None; 6];
        let mut resumed = false;
        let mut resume = None;
        let mut skew = Duration::ZERO;
        while usize::from(checkpoint) < STEPS.len() {
            let step = checkpoint;
            let outcome = {
                let fut =
                    Box::pin(self.step(stats, stacks.as_ref(), step, resumed, &mut sent_at, skew));
                let crashed = self.provider.crashed();
                tokio::pin!(crashed);
                let mut fut = fut;
                tokio::select! {
                    biased;
                    end = &mut fut => Some(end),
                    () = &mut crashed => {
                        // SIGKILL: nothing of the run is dropped cleanly.
                        std::mem::forget(fut);
                        None
                    }
                }
            };
            let Some(end) = outcome else {
                // Resume: soon (a supervisor restarts it), later, or after the key window.
                let r = self.roll(0x5E5, step);
                let (delay, kind) = if self.roll(0xD1D, step) < self.faults.resume_after_window {
                    *stats
                        .faults
                        .entry("resume_after_key_window".into())
                        .or_default() += 1;
                    (Duration::from_secs(25 * 3600), Resume::AfterKeyWindow)
                } else if r < 0.5 {
                    (
                        Duration::from_millis(200 + (r * 3600.0) as u64),
                        Resume::Soon,
                    )
                } else {
                    (Duration::from_secs(5 + (r * 55.0) as u64), Resume::Later)
                };
                resume = Some(kind);
                tokio::time::sleep(delay).await;
                generation += 1;
                if self.policy.stormguard() {
                    stacks = Some(Stacks::new(
                        self.policy,
                        &self.provider,
                        &open(generation),
                        breakers,
                        budget,
                    ));
                }
                // The other worker: its clock is ahead of the first one's.
                skew = self.faults.clock_skew;
                *stats
                    .faults
                    .entry("resume_on_other_worker".into())
                    .or_default() += 1;
                resumed = true;
                continue;
            };
            match end {
                StepEnd::Done => {
                    checkpoint += 1;
                    resumed = false;
                    resume = None;
                }
                StepEnd::Escalated(code, hint) => {
                    let (tool, ..) = STEPS[usize::from(step)];
                    let when = match resume {
                        None => "first run",
                        Some(Resume::Soon) => "resumed within the lease",
                        Some(Resume::Later) => "resumed after the lease",
                        Some(Resume::AfterKeyWindow) => "resumed after the key window",
                    };
                    return StepEnd::Escalated(format!("{code}: {tool}, {when}"), hint);
                }
                StepEnd::Failed => return StepEnd::Failed,
            }
        }
        StepEnd::Done
    }

    /// One step as the agent loop does it: the call (twice at once for a parallel duplicate),
    /// a reissue by the model on a failure it may retry, and now and then a reworded reissue of
    /// a call that succeeded (the transcript lost its answer).
    async fn step(
        &self,
        stats_faults: &mut Stats,
        stacks: Option<&Stacks>,
        step: u8,
        resumed: bool,
        sent_at: &mut [Option<Instant>; 6],
        skew: Duration,
    ) -> StepEnd {
        let (_, _, _, side_effect) = STEPS[usize::from(step)];
        let parallel = step > 0 && self.roll(0x9A4, step) < self.faults.parallel;
        if parallel {
            *stats_faults
                .faults
                .entry("parallel_duplicate".into())
                .or_default() += 1;
        }
        let mut end = StepEnd::Failed;
        for reissue in 0..3u32 {
            stats_faults.step_calls += 1;
            end = if parallel {
                stats_faults.step_calls += 1;
                let mut other = *sent_at;
                let (a, b) = tokio::join!(
                    self.once(stacks, step, reissue, resumed || reissue > 0, sent_at, skew),
                    self.once(
                        stacks,
                        step,
                        reissue + 10,
                        resumed || reissue > 0,
                        &mut other,
                        skew
                    ),
                );
                match (a, b) {
                    (StepEnd::Done, _) | (_, StepEnd::Done) => StepEnd::Done,
                    (e @ StepEnd::Escalated(..), _) | (_, e @ StepEnd::Escalated(..)) => e,
                    _ => StepEnd::Failed,
                }
            } else {
                self.once(stacks, step, reissue, resumed || reissue > 0, sent_at, skew)
                    .await
            };
            match &end {
                StepEnd::Done => break,
                StepEnd::Escalated(..) => return end,
                StepEnd::Failed if !self.policy.stormguard() && reissue >= 1 => return end,
                StepEnd::Failed => {}
            }
        }
        if matches!(end, StepEnd::Done)
            && side_effect
            && self.roll(0x2E1, step) < self.faults.reissue
        {
            *stats_faults
                .faults
                .entry("reworded_reissue".into())
                .or_default() += 1;
            stats_faults.step_calls += 1;
            let _ = self.once(stacks, step, 100, true, sent_at, skew).await;
        }
        end
    }

    /// One call of the step by the policy.
    async fn once(
        &self,
        stacks: Option<&Stacks>,
        step: u8,
        wording: u32,
        again: bool,
        sent_at: &mut [Option<Instant>; 6],
        skew: Duration,
    ) -> StepEnd {
        let call = self.call(step, wording);
        match stacks {
            Some(stacks) => {
                self.stormguard_once(&stacks.stacks[usize::from(step)], call)
                    .await
            }
            None => self.plain_once(call, again, sent_at, skew).await,
        }
    }

    /// Through the real stormguard stack: what the error says decides (retryable: the model
    /// reissues; `outcome_unknown` and other non-retryable refusals of a write: escalate).
    async fn stormguard_once(&self, stack: &Stack, call: Call) -> StepEnd {
        let dbg = std::env::var("EPISODES_DEBUG_EP")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            == Some(call.effect.episode);
        let r = stack.clone().oneshot(call.clone()).await;
        if dbg {
            eprintln!(
                "t={:?} step {} -> {:?}",
                Instant::now(),
                call.effect.step,
                r.as_ref().map(|_| ()).map_err(|e| e.to_string())
            );
        }
        match r {
            Ok(_) => StepEnd::Done,
            Err(e) => {
                let Some(err) = e.downcast_ref::<ToolError>() else {
                    return StepEnd::Failed;
                };
                if err.retryable() {
                    tokio::time::sleep(err.retry_after().unwrap_or(Duration::from_secs(1))).await;
                    return StepEnd::Failed;
                }
                match err.code() {
                    // The outcome is unknown, or the call collides with another: a human decides.
                    ErrorCode::OutcomeUnknown
                    | ErrorCode::InProgress
                    | ErrorCode::ReceiptExpired
                    | ErrorCode::IdempotencyKeyReused
                    | ErrorCode::MissingIdempotencyKey => {
                        StepEnd::Escalated(err.code().as_str().to_string(), err.hint().to_string())
                    }
                    // Attempts or budget spent on a failure that did nothing: reported failure.
                    _ => StepEnd::Failed,
                }
            }
        }
    }

    /// The policies without stormguard: up to 3 attempts with backoff on any failure.
    async fn plain_once(
        &self,
        call: Call,
        again: bool,
        sent_at: &mut [Option<Instant>; 6],
        skew: Duration,
    ) -> StepEnd {
        let step = usize::from(call.effect.step);
        for attempt in 0..3u32 {
            if self.policy == Policy::ReadbackOnly && call.side_effect && (again || attempt > 0) {
                // "Has it already been done?", asked of the lagging log, after waiting out the
                // in-flight bound as this worker's clock measures it.
                if let Some(sent) = sent_at[step] {
                    let bound = self.faults.in_flight;
                    let seen = (Instant::now() + skew).saturating_duration_since(sent);
                    if seen < bound {
                        tokio::time::sleep(bound - seen).await;
                    }
                }
                if self
                    .provider
                    .logged(call.effect, self.faults.log_lag)
                    .is_some()
                {
                    return StepEnd::Done;
                }
            }
            let mut c = call.clone();
            if self.policy == Policy::RandomKey {
                // A fresh key on every attempt: what a key generated inside the retry loop is.
                static NEXT: AtomicU64 = AtomicU64::new(0);
                c.key = Some(format!("rk-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
            }
            sent_at[step] = Some(Instant::now());
            if self.provider.clone().oneshot(c).await.is_ok() {
                return StepEnd::Done;
            }
            let backoff = Duration::from_millis(100) * 2u32.pow(attempt);
            tokio::time::sleep(backoff.mul_f64(self.roll(0xB0F ^ u64::from(attempt), step as u8)))
                .await;
        }
        StepEnd::Failed
    }
}
