//! The simulated provider of the episode harness: it applies each write as a real provider of
//! its class would, fails calls as drawn, crashes once if the episode draws a crash, and (in
//! the real-process mode) keeps its state in a file that outlives a SIGKILL.

use super::episodes::{Harness, Report, Step};
use crate::backoff::rng::mix;
use crate::class::ToolClass;
use crate::error::BoxError;
use crate::key::canonical_json;
use crate::tool::Call;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tower_service::Service;

/// What a child process prints when the provider has applied a call and the process is to die
/// before its receipt: the parent kills it (SIGKILL) when it reads this line.
pub(super) const CRASH_POINT: &str = "stormguard-chaos: the provider applied the call; kill me now";

/// The simulated provider of one episode: it applies each write as a real provider of its class
/// would, fails calls as drawn, and crashes once if the episode draws a crash.
#[derive(Clone)]
pub(super) struct Provider {
    state: Arc<Mutex<ProviderState>>,
    seed: u64,
    before_work: f64,
    after_work: f64,
    crash: f64,
    /// The calls of an episode a crash may fall on (its script's length, at least one).
    crash_window: usize,
    classes: Arc<HashMap<String, ToolClass>>,
    /// Where the state is written after every change (the real-process mode), if anywhere.
    persist: Option<Arc<PathBuf>>,
}

#[derive(Default, Serialize, Deserialize)]
pub(super) struct ProviderState {
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
    /// The provider of one episode; with `persist`, its state is read from that file (a
    /// resumed process) and written back after every change.
    pub(super) fn new(h: &Harness, seed: u64, persist: Option<PathBuf>) -> Self {
        let classes = h
            .toolbox
            .tools()
            .iter()
            .map(|t| (t.name.clone(), t.class))
            .collect();
        let state = persist
            .as_ref()
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice::<ProviderState>(&bytes).ok())
            .unwrap_or_default();
        Provider {
            state: Arc::new(Mutex::new(state)),
            seed,
            before_work: h.before_work,
            after_work: h.after_work,
            crash: h.crash,
            crash_window: h.script.len().max(1),
            classes: Arc::new(classes),
            persist: persist.map(Arc::new),
        }
    }

    /// Writes the state where it outlives the process (write, flush to disk, rename).
    fn save(&self, st: &ProviderState) {
        if let Some(path) = &self.persist {
            write_synced(path, st);
        }
    }

    pub(super) fn action(&self, step: usize, tool: &str) {
        let mut st = self.lock();
        st.action = (step, tool.to_owned());
        self.save(&st);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProviderState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn body(&self) -> Provider {
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
            self.save(&st);
            if self.persist.is_some() {
                // A real process: the parent reads this and sends SIGKILL.
                println!("{CRASH_POINT}");
                let _ = std::io::stdout().flush();
            }
            return Box::pin(std::future::pending());
        }
        self.save(&st);
        if draw < self.before_work + self.after_work {
            let reset: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
            return Box::pin(async move { Err(reset) });
        }
        Box::pin(async move { Ok(json!({ "done": tool })) })
    }

    pub(super) fn tally(
        &self,
        script: &[Step],
        outcomes: &[Result<(), String>],
        report: &mut Report,
    ) {
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

/// Writes `value` as JSON where it outlives the process: flushed to disk, then renamed over
/// `path`. A child that cannot keep its books cannot be counted: it stops loudly (exit 3).
pub(super) fn write_synced(path: &std::path::Path, value: &impl Serialize) {
    let tmp = path.with_extension("tmp");
    let written = serde_json::to_vec(value).ok().and_then(|bytes| {
        let mut file = std::fs::File::create(&tmp).ok()?;
        file.write_all(&bytes).ok()?;
        file.sync_all().ok()
    });
    if written.is_none() || std::fs::rename(&tmp, path).is_err() {
        eprintln!("stormguard-chaos: cannot write {}", path.display());
        std::process::exit(3);
    }
}
