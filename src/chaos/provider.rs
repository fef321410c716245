//! The simulated provider of the episode harness: it applies each write as the real provider
//! would ([`Applies`]), fails calls as drawn (before the work, after it, or with the work landing
//! after the caller gave up), crashes once if the episode draws a crash, keeps a sent log that
//! lags behind its commits (what a read-back reads), forgets idempotency keys after its key
//! window, and (in the real-process mode) keeps its books in a file that outlives a SIGKILL.

use super::episodes::Harness;
use super::script::Applies;
use crate::backoff::rng::mix;
use crate::error::{BoxError, ErrorCode, FailureClass, ToolError};
use crate::key::canonical_json;
use crate::receipt::{Clock, ReadBack, ReadBackResult};
use crate::tool::Call;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_service::Service;

mod late;
mod tally;

use late::Late;

/// What a child process prints when the provider has applied a call and the process is to die
/// before its receipt: the parent kills it (SIGKILL) when it reads this line.
pub(super) const CRASH_POINT: &str = "stormguard-chaos: the provider applied the call; kill me now";

/// How long after the caller gave up a late commit lands.
pub(super) const LATE: Duration = Duration::from_secs(1);

/// The epoch (ms) of an in-process episode's clock: a fixed date, so runs repeat exactly.
const EPOCH_MS: u64 = 1_767_225_600_000;

/// An episode's one clock: tokio's (paused) clock since the episode began, or the system clock
/// some hours ahead (a child process of the real-process mode). Receipt stores, the provider's
/// key windows and its log's lag all read it, so a resume "after the lease" is the same wait
/// for all of them.
#[derive(Clone, Copy, Debug)]
pub(super) enum EpisodeClock {
    Tokio(tokio::time::Instant),
    #[cfg(all(feature = "sqlite", unix))]
    Ahead(u64),
}

impl Clock for EpisodeClock {
    fn now_ms(&self) -> u64 {
        match self {
            EpisodeClock::Tokio(start) => EPOCH_MS + start.elapsed().as_millis() as u64,
            #[cfg(all(feature = "sqlite", unix))]
            EpisodeClock::Ahead(ms) => crate::receipt::SystemClock.now_ms() + ms,
        }
    }
}

/// The provider of one episode (clones share it).
#[derive(Clone)]
pub(super) struct Provider {
    state: Arc<Mutex<ProviderState>>,
    world: Arc<World>,
    crashed: Arc<tokio::sync::Notify>,
}

/// What the provider is: its rates, each tool's behaviour, its clock.
struct World {
    seed: u64,
    /// The upper bounds of the fault intervals of one draw: refused, rate limited, reset after
    /// the work, late commit.
    bounds: [f64; 4],
    crash: f64,
    /// The calls of an episode a crash may fall on (its script's length, at least one).
    crash_window: usize,
    /// What each tool's call does, and the provider's key window (ms).
    tools: HashMap<String, (Applies, u64)>,
    log_lag_ms: u64,
    clock: EpisodeClock,
    /// Where the books are written after every change (the real-process mode), if anywhere.
    persist: Option<PathBuf>,
}

#[derive(Default, Serialize, Deserialize)]
pub(super) struct ProviderState {
    calls: u64,
    crashed: bool,
    /// The script step under way.
    step: usize,
    /// When each write was applied (ms), by its identity (key, arguments or call).
    done: HashMap<String, u64>,
    /// The sent log: when a call carrying each idempotency key was first applied (ms).
    log: HashMap<String, u64>,
    /// Effects by script step.
    effects: BTreeMap<usize, u64>,
    /// Late commits not landed yet, by number: kept with the books, so a process that resumes
    /// after the one that queued them died lands them (the provider would).
    late: BTreeMap<u64, Late>,
    /// Calls that reached the provider, by tool.
    calls_by_tool: BTreeMap<String, u64>,
    /// The next late commit's number.
    next_late: u64,
    /// The late commits this process has scheduled (not the books: a new process has none).
    #[serde(skip)]
    landing: std::collections::BTreeSet<u64>,
    /// Faults met, by name.
    faults: BTreeMap<String, u64>,
}

type BodyFuture = Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>;

/// A uniform draw in [0, 1) from (seed, salt).
pub(super) fn unit(seed: u64, salt: u64) -> f64 {
    (mix(seed ^ mix(salt)) >> 11) as f64 / (1u64 << 53) as f64
}

impl Provider {
    /// The provider of one episode on `clock`; with `persist`, its books are read from that file
    /// (a resumed process) and written back after every change.
    pub(super) fn new(
        h: &Harness,
        seed: u64,
        clock: EpisodeClock,
        persist: Option<PathBuf>,
    ) -> Self {
        let tools = h
            .toolbox
            .tools()
            .iter()
            .map(|t| {
                let window = t
                    .receipt
                    .as_ref()
                    .and_then(|r| r.provider_key_window_secs)
                    .unwrap_or(86_400);
                (t.name.clone(), (h.applies_to(&t.name), window * 1_000))
            })
            .collect();
        let state = persist
            .as_ref()
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice::<ProviderState>(&bytes).ok())
            .unwrap_or_default();
        let mut bound = 0.0;
        let bounds = [h.before_work, h.rate_limited, h.after_work, h.late].map(|p| {
            bound += p;
            bound
        });
        Provider {
            state: Arc::new(Mutex::new(state)),
            world: Arc::new(World {
                seed,
                bounds,
                crash: h.crash,
                crash_window: h.script.len().max(1),
                tools,
                log_lag_ms: u64::try_from(h.log_lag.as_millis()).unwrap_or(u64::MAX),
                clock,
                persist,
            }),
            crashed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Writes the books where they outlive the process (write, flush to disk, rename).
    fn save(&self, st: &ProviderState) {
        if let Some(path) = &self.world.persist {
            write_synced(path, st);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProviderState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The script step under way: the effects that follow are counted against it.
    pub(super) fn step(&self, step: usize) {
        let mut st = self.lock();
        st.step = step;
        self.save(&st);
    }

    /// Resolves when the provider has crashed the process (in-process mode): the caller drops
    /// nothing and runs no destructor, as SIGKILL would.
    pub(super) async fn crash(&self) {
        self.crashed.notified().await;
    }

    /// Applies call number `call` that reached the provider at `now` (ms): once per key (within the key window), once per
    /// arguments, every time or never, as the tool's [`Applies`] says.
    fn apply(
        &self,
        st: &mut ProviderState,
        step: usize,
        tool: &str,
        key: Option<&str>,
        args: &str,
        (call, now): (u64, u64),
    ) {
        let (applies, window) = self.world.tools.get(tool).copied().unwrap_or_default();
        let identity = match applies {
            Applies::Nothing => None,
            Applies::OncePerKey => {
                Some(key.map_or_else(|| format!("call-{call}"), |k| format!("{tool}:{k}")))
            }
            Applies::OncePerArgs => Some(format!("{tool}:{args}")),
            Applies::EveryCall => Some(format!("call-{call}")),
        };
        if let Some(identity) = identity {
            let fresh = match st.done.get(&identity) {
                None => true,
                // The provider forgot the key: the same key applies again.
                Some(&at) => applies == Applies::OncePerKey && now.saturating_sub(at) > window,
            };
            if fresh {
                st.done.insert(identity, now);
                *st.effects.entry(step).or_default() += 1;
            }
        }
        if let (Some(key), false) = (key, applies == Applies::Nothing) {
            st.log.entry(key.to_owned()).or_insert(now);
        }
    }

    fn met(st: &mut ProviderState, fault: &str) {
        *st.faults.entry(fault.to_owned()).or_default() += 1;
    }

    fn serve(&self, call: Call) -> BodyFuture {
        let tool = call.tool().unwrap_or_default().to_owned();
        let key = call.key().map(|k| k.to_string());
        let args = canonical_json(call.args()).unwrap_or_default();
        let w = &self.world;
        let mut st = self.lock();
        st.calls += 1;
        *st.calls_by_tool.entry(tool.clone()).or_default() += 1;
        let draw = unit(w.seed, st.calls);
        let fail = |e: BoxError| -> BodyFuture { Box::pin(async move { Err(e) }) };
        if draw < w.bounds[0] {
            Self::met(&mut st, "refused");
            return fail(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
        }
        if draw < w.bounds[1] {
            Self::met(&mut st, "rate_limited");
            let limited = ToolError::new(ErrorCode::RateLimited)
                .with_class(FailureClass::Transient)
                .with_retry_after(Duration::from_secs(1));
            return fail(limited.into());
        }
        let step = st.step;
        if draw >= w.bounds[2] && draw < w.bounds[3] {
            // Queued somewhere: the caller times out at once, the work lands later.
            Self::met(&mut st, "late_commit");
            let late = self.late(&st, &tool, &key, &args);
            self.land_later(&mut st, late);
            self.save(&st);
            return fail(std::io::Error::from(std::io::ErrorKind::TimedOut).into());
        }
        // The crash comes once, after the provider accepted the call and before the answer
        // (the receipt) reaches the caller. It falls on one of the episode's first calls, drawn
        // from its seed; in half the crashes the work is still in flight and lands later.
        let crash_call = 1 + (unit(w.seed, 1) * w.crash_window as f64) as u64;
        let crash = !st.crashed && unit(w.seed, 0) < w.crash && st.calls >= crash_call;
        if crash && w.persist.is_none() && unit(w.seed, 3) < 0.5 {
            Self::met(&mut st, "crash_in_flight");
            let late = self.late(&st, &tool, &key, &args);
            self.land_later(&mut st, late);
        } else {
            let at = (st.calls, w.clock.now_ms());
            self.apply(&mut st, step, &tool, key.as_deref(), &args, at);
        }
        if crash {
            st.crashed = true;
            Self::met(&mut st, "crash");
            self.save(&st);
            if w.persist.is_some() {
                // A real process: the parent reads this and sends SIGKILL.
                println!("{CRASH_POINT}");
                let _ = std::io::stdout().flush();
            } else {
                self.crashed.notify_one();
            }
            return Box::pin(std::future::pending());
        }
        self.save(&st);
        if draw >= w.bounds[1] && draw < w.bounds[2] {
            Self::met(&mut st, "reset_after_work");
            return fail(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into());
        }
        Box::pin(async move { Ok(json!({ "done": tool })) })
    }
}

/// The provider's sent log, read back: a call carrying this key is found once the log shows it
/// (its lag after the commit), absent before.
impl ReadBack<Call, Value> for Provider {
    async fn read_back(&self, call: &Call) -> ReadBackResult<Value> {
        let Some(key) = call.key().map(|k| k.to_string()) else {
            return ReadBackResult::Unknown;
        };
        let now = self.world.clock.now_ms();
        match self.lock().log.get(&key) {
            Some(&at) if now >= at.saturating_add(self.world.log_lag_ms) => {
                ReadBackResult::Found(json!({ "done": call.tool().unwrap_or_default() }))
            }
            _ => ReadBackResult::Absent,
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
