//! [`Harness`]: seeded episodes of a user's own toolbox, with faults after the work, crashes and
//! resumes, and the count of duplicate effects.

use crate::backoff::rng::mix;
use crate::class::ToolClass;
use crate::classify::OkIsSuccess;
use crate::error::{BoxError, ToolError};
use crate::key::canonical_json;
use crate::receipt::{InMemoryStore, ManualClock};
use crate::tool::{Call, SpecError, Stores, Toolbox, Tools};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// One call of the agent's script: a tool of the toolbox and the model's arguments.
///
/// ```
/// let step = stormguard::chaos::Step::new("send_invoice", serde_json::json!({ "invoice_id": 4471 }));
/// assert_eq!(step.tool, "send_invoice");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The tool called.
    pub tool: String,
    /// The model's arguments.
    pub args: Value,
}

impl Step {
    /// A call of `tool` with `args`.
    pub fn new(tool: &str, args: Value) -> Self {
        Step {
            tool: tool.to_owned(),
            args,
        }
    }
}

/// What seeded episodes of a toolbox came to: the figure a test asserts is
/// [`duplicate_effects`](Self::duplicate_effects) `== 0`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Episodes run.
    pub episodes: u32,
    /// Effects the provider applied (a write done once counts once).
    pub effects: u64,
    /// Actions (one step of one episode) whose effect was applied more than once, counted once
    /// per extra effect.
    pub duplicate_effects: u64,
    /// Duplicates in an action the agent saw succeed: nobody would have noticed.
    pub silent_duplicates: u64,
    /// Actions the agent saw succeed whose write was never applied.
    pub lost_work: u64,
    /// Escalations (errors that are not retryable) by their code.
    pub escalations: BTreeMap<String, u64>,
    /// Crashes injected.
    pub crashes: u64,
    /// The duplicate effects by tool.
    pub duplicates_by_tool: BTreeMap<String, u64>,
}

/// Seeded episodes of a user's toolbox, as the reference text's habit has it: kill the process
/// after the provider accepted a send and before the receipt is written, resume, and count what
/// happened twice.
///
/// Each episode runs the agent's script through the stacks the toolbox declares
/// ([`Tools::layer`](crate::tool::Tools::layer)) over a simulated provider that applies each
/// write as its class says a real one would (a keyed write once per idempotency key, an
/// idempotent write once per arguments, an unkeyed write every time), and that fails some calls
/// before the work (a refused connection) and some after it (a reset), both drawn from the seed.
/// A crash drops the call in flight once the provider applied it, as a SIGKILL would; the
/// episode then resumes in a new "process" (new stacks over the same receipt stores, kept in
/// memory, after the receipts' lease) and repeats the step whose completion it never saw. A
/// failure the agent may retry is reissued by the model at its next step. Every store the
/// toolbox declares is replaced by one in memory whose clock follows the harness's.
///
/// `run` builds its own runtime on tokio's paused clock: call it from a plain `#[test]`.
///
/// ```
/// use serde_json::json;
/// use stormguard::chaos::{Harness, Step};
/// use stormguard::tool::Toolbox;
///
/// let toolbox = Toolbox::from_json_str(r#"{
///     "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
///     "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
///                 "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
///                 "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } }]
/// }"#)?;
/// let script = vec![Step::new("send_invoice", json!({ "invoice_id": 4471 }))];
/// let report = Harness::new(toolbox, script).run(500, 7)?;
/// assert_eq!(report.duplicate_effects, 0);
/// assert!(report.crashes > 0);
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Harness {
    toolbox: Toolbox,
    script: Vec<Step>,
    before_work: f64,
    after_work: f64,
    crash: f64,
    reissues: u32,
}

impl Harness {
    /// Episodes of `script` over `toolbox`'s tools; by default 10 % of calls refused before the
    /// work, 10 % reset after it, a crash in 20 % of episodes, and up to 2 reissues of a call
    /// the agent may retry.
    pub fn new(toolbox: Toolbox, script: Vec<Step>) -> Self {
        Harness {
            toolbox,
            script,
            before_work: 0.1,
            after_work: 0.1,
            crash: 0.2,
            reissues: 2,
        }
    }

    /// The share of provider calls refused before any work (0.0 to 1.0).
    pub fn before_work(mut self, p: f64) -> Self {
        self.before_work = p;
        self
    }

    /// The share of provider calls that do the work and then lose the answer (0.0 to 1.0).
    pub fn after_work(mut self, p: f64) -> Self {
        self.after_work = p;
        self
    }

    /// The share of episodes with a crash (0.0 to 1.0).
    pub fn crashes(mut self, p: f64) -> Self {
        self.crash = p;
        self
    }

    /// How many times the model reissues a call that failed in a way it may retry.
    pub fn reissues(mut self, n: u32) -> Self {
        self.reissues = n;
        self
    }

    /// Runs `episodes` seeded episodes (the same seed, the same run). A script naming a tool the
    /// toolbox does not hold, a rate outside 0.0 to 1.0, or a stack that cannot be built is a
    /// [`SpecError`].
    pub fn run(&self, episodes: u32, seed: u64) -> Result<Report, SpecError> {
        for (field, p) in [
            ("before_work", self.before_work),
            ("after_work", self.after_work),
            ("crashes", self.crash),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(SpecError::new(None, field, "must be within 0.0..=1.0"));
            }
        }
        if self.before_work + self.after_work > 1.0 {
            return Err(SpecError::new(
                None,
                "after_work",
                "the two fault rates add up to more than 1.0",
            ));
        }
        for step in &self.script {
            if !self.toolbox.tools().iter().any(|t| t.name == step.tool) {
                return Err(SpecError::new(
                    Some(&step.tool),
                    "script",
                    "the toolbox holds no such tool",
                ));
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|e| SpecError::new(None, "runtime", &e.to_string()))?;
        let mut report = Report::default();
        for n in 0..episodes {
            runtime.block_on(self.episode(seed, n, &mut report))?;
        }
        report.episodes = episodes;
        Ok(report)
    }

    async fn episode(&self, seed: u64, n: u32, report: &mut Report) -> Result<(), SpecError> {
        let clock = ManualClock::new(0);
        let toolbox = self.toolbox.with_stores_in_memory();
        let stores: Vec<(String, InMemoryStore)> = toolbox
            .stores()
            .keys()
            .map(|name| (name.clone(), InMemoryStore::with_clock(clock.clone())))
            .collect();
        let provider = Provider::new(self, seed ^ mix(u64::from(n) + 1));
        let build = || {
            let given = stores.iter().fold(Stores::new(), |s, (name, store)| {
                s.with(name, store.clone())
            });
            toolbox.build(given)
        };
        let mut tools = build()?;
        let run = format!("ep-{n}");
        let mut turn = 0u32;
        let mut outcomes = Vec::new();
        for (i, step) in self.script.iter().enumerate() {
            let mut reissues = 0;
            turn += 1;
            let outcome = loop {
                let call = Call::new(&run, format!("step-{turn}"), step.args.clone());
                provider.action(i, &step.tool);
                let sent = tokio::time::timeout(
                    Duration::from_secs(3_600),
                    self.call(&tools, &provider, &step.tool, call),
                )
                .await;
                match sent {
                    // A crash: a new process resumes the step it never saw complete, once the
                    // receipts' leases have passed.
                    Err(_) => {
                        report.crashes += 1;
                        clock.advance_ms(3_600_000);
                        tools = build()?;
                    }
                    Ok(Ok(_)) => break Ok(()),
                    Ok(Err(e)) if e.retryable() && reissues < self.reissues => {
                        // The model reissues it at its next step.
                        reissues += 1;
                        turn += 1;
                    }
                    Ok(Err(e)) => break Err(e.code().as_str().to_owned()),
                }
            };
            outcomes.push(outcome);
        }
        provider.tally(&self.script, &outcomes, report);
        Ok(())
    }

    async fn call(
        &self,
        tools: &Tools,
        provider: &Provider,
        tool: &str,
        call: Call,
    ) -> Result<Value, ToolError> {
        let body = provider.body();
        let stack = match tools.layer(tool) {
            Ok(layer) => layer.classifier(OkIsSuccess).layer(body),
            Err(e) => {
                return Err(
                    ToolError::new(crate::error::ErrorCode::Internal).with_hint(e.to_string())
                )
            }
        };
        let mut stack = stack;
        std::future::poll_fn(|cx| stack.poll_ready(cx)).await?;
        stack.call(call).await
    }
}

/// The simulated provider of one episode: it applies each write as a real provider of its class
/// would, fails calls as drawn, and crashes once if the episode draws a crash.
#[derive(Clone)]
struct Provider {
    state: Arc<Mutex<ProviderState>>,
    seed: u64,
    before_work: f64,
    after_work: f64,
    crash: f64,
    /// The calls of an episode a crash may fall on (its script's length, at least one).
    crash_window: usize,
    classes: Arc<HashMap<String, ToolClass>>,
}

#[derive(Default)]
struct ProviderState {
    calls: u64,
    crashed: bool,
    /// The script step under way, and its tool.
    action: (usize, String),
    /// What a keyed or idempotent write already did, by key or arguments.
    done: HashMap<String, ()>,
    /// Effects by script step.
    effects: BTreeMap<usize, u64>,
}

type BodyFuture = Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>;

fn unit(seed: u64, salt: u64) -> f64 {
    (mix(seed ^ mix(salt)) >> 11) as f64 / (1u64 << 53) as f64
}

impl Provider {
    fn new(h: &Harness, seed: u64) -> Self {
        let classes = h
            .toolbox
            .tools()
            .iter()
            .map(|t| (t.name.clone(), t.class))
            .collect();
        Provider {
            state: Arc::default(),
            seed,
            before_work: h.before_work,
            after_work: h.after_work,
            crash: h.crash,
            crash_window: h.script.len().max(1),
            classes: Arc::new(classes),
        }
    }

    fn action(&self, step: usize, tool: &str) {
        self.lock().action = (step, tool.to_owned());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProviderState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn body(&self) -> Provider {
        self.clone()
    }

    fn serve(&self, call: Call) -> BodyFuture {
        let tool = call.tool().unwrap_or_default().to_owned();
        let class = self.classes.get(&tool).copied().unwrap_or(ToolClass::Read);
        let mut st = self.lock();
        st.calls += 1;
        let draw = unit(self.seed, st.calls);
        if draw < self.before_work {
            let refused: BoxError =
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
            return Box::pin(async move { Err(refused) });
        }
        let identity = match class {
            ToolClass::Read => None,
            ToolClass::KeyedWrite => Some(
                call.key()
                    .map_or_else(|| format!("call-{}", st.calls), |k| k.to_string()),
            ),
            ToolClass::IdempotentWrite => Some(format!(
                "{tool}:{}",
                canonical_json(call.args()).unwrap_or_default()
            )),
            _ => Some(format!("call-{}", st.calls)),
        };
        if let Some(id) = identity {
            if st.done.insert(id, ()).is_none() {
                let step = st.action.0;
                *st.effects.entry(step).or_default() += 1;
            }
        }
        // The crash comes once, after the work, as a SIGKILL between the send and the receipt.
        // It falls on one of the episode's first calls, drawn from its seed.
        let crash_call = 1 + (unit(self.seed, 1) * self.crash_window as f64) as u64;
        if !st.crashed && unit(self.seed, 0) < self.crash && st.calls >= crash_call {
            st.crashed = true;
            return Box::pin(std::future::pending());
        }
        if draw < self.before_work + self.after_work {
            let reset: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
            return Box::pin(async move { Err(reset) });
        }
        Box::pin(async move { Ok(json!({ "done": tool })) })
    }

    fn tally(&self, script: &[Step], outcomes: &[Result<(), String>], report: &mut Report) {
        let st = self.lock();
        for (i, (step, outcome)) in script.iter().zip(outcomes).enumerate() {
            let effects = st.effects.get(&i).copied().unwrap_or(0);
            report.effects += effects;
            let extra = effects.saturating_sub(1);
            if extra > 0 {
                report.duplicate_effects += extra;
                *report
                    .duplicates_by_tool
                    .entry(step.tool.clone())
                    .or_default() += extra;
                if outcome.is_ok() {
                    report.silent_duplicates += extra;
                }
            }
            let write = !matches!(self.classes.get(&step.tool), Some(ToolClass::Read) | None);
            match outcome {
                Ok(()) if write && effects == 0 => report.lost_work += 1,
                Ok(()) => {}
                Err(code) => *report.escalations.entry(code.clone()).or_default() += 1,
            }
        }
    }
}

impl Service<Call> for Provider {
    type Response = Value;
    type Error = BoxError;
    type Future = BodyFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> BodyFuture {
        self.serve(call)
    }
}
