//! [`Harness`]: seeded episodes of a user's own toolbox, with faults after the work, crashes and
//! resumes, and the count of duplicate effects.

use super::provider::Provider;
use crate::backoff::rng::mix;
use crate::classify::OkIsSuccess;
use crate::error::ToolError;
use crate::receipt::{InMemoryStore, ManualClock};
use crate::tool::{Call, SpecError, Stores, Toolbox, Tools};
use serde_json::Value;
use std::collections::BTreeMap;
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

/// How far an episode's agent has come: each step's outcome (`Err` holds the code it ended
/// with) and the model's turn.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Progress {
    pub(super) outcomes: Vec<Result<(), String>>,
    pub(super) turn: u32,
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
    pub(super) toolbox: Toolbox,
    pub(super) script: Vec<Step>,
    pub(super) before_work: f64,
    pub(super) after_work: f64,
    pub(super) crash: f64,
    pub(super) reissues: u32,
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
        self.check()?;
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

    /// The checks [`run`](Self::run) makes first: the rates, and every step's tool declared.
    pub(super) fn check(&self) -> Result<(), SpecError> {
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
        Ok(())
    }

    async fn episode(&self, seed: u64, n: u32, report: &mut Report) -> Result<(), SpecError> {
        let clock = ManualClock::new(0);
        let toolbox = self.toolbox.with_stores_in_memory();
        let stores: Vec<(String, InMemoryStore)> = toolbox
            .stores()
            .keys()
            .map(|name| (name.clone(), InMemoryStore::with_clock(clock.clone())))
            .collect();
        let provider = Provider::new(self, seed ^ mix(u64::from(n) + 1), None);
        let build = || {
            let given = stores.iter().fold(Stores::new(), |s, (name, store)| {
                s.with(name, store.clone())
            });
            toolbox.build(given)
        };
        let tools = build()?;
        let mut progress = Progress::default();
        let crashed = || {
            // A crash: a new process resumes the step it never saw complete, once the
            // receipts' leases have passed.
            report.crashes += 1;
            clock.advance_ms(3_600_000);
            build()
        };
        let run = format!("ep-{n}");
        self.steps(&run, &provider, tools, &mut progress, crashed, |_| ())
            .await?;
        provider.tally(&self.script, &progress.outcomes, report);
        Ok(())
    }

    /// The agent's loop over the script from where `progress` stands: each step through its
    /// tool's stack, reissued by the model at its next step when it failed in a way it may
    /// retry. A call that never returns is a crash: `crashed` gives the tools of the process
    /// that resumes the step. `checkpoint` is told after each step, as an agent framework
    /// records its progress.
    pub(super) async fn steps(
        &self,
        run: &str,
        provider: &Provider,
        mut tools: Tools,
        progress: &mut Progress,
        mut crashed: impl FnMut() -> Result<Tools, SpecError>,
        mut checkpoint: impl FnMut(&Progress),
    ) -> Result<(), SpecError> {
        for (i, step) in self.script.iter().enumerate().skip(progress.outcomes.len()) {
            let mut reissues = 0;
            progress.turn += 1;
            let outcome = loop {
                let turn = progress.turn;
                let call = Call::new(run, format!("step-{turn}"), step.args.clone());
                provider.action(i, &step.tool);
                let sent = tokio::time::timeout(
                    Duration::from_secs(3_600),
                    self.call(&tools, provider, &step.tool, call),
                )
                .await;
                match sent {
                    Err(_) => tools = crashed()?,
                    Ok(Ok(_)) => break Ok(()),
                    Ok(Err(e)) if e.retryable() && reissues < self.reissues => {
                        // The model reissues it at its next step.
                        reissues += 1;
                        progress.turn += 1;
                    }
                    Ok(Err(e)) => break Err(e.code().as_str().to_owned()),
                }
            };
            progress.outcomes.push(outcome);
            checkpoint(progress);
        }
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
