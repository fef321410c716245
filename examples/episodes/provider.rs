//! The simulated provider: applies effects, remembers keys for a window, keeps a sent log, and
//! answers with the faults the seed draws for each attempt of each action.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::classify::hint::ServerHint;
use stormguard::classify::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    NeverClassifyEos,
};
use stormguard::error::ErrorCode;
use stormguard::key::{IdempotencyKey, KeyStamp};
use tokio::time::Instant;
use tower::Service;

/// One logical action of one episode: what a duplicate is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectId {
    pub episode: u32,
    pub step: u8,
}

/// A tool call as the provider receives it.
#[derive(Clone, Debug)]
pub struct Call {
    pub effect: EffectId,
    /// Whether the provider honours an idempotency key on this endpoint.
    pub keyed_endpoint: bool,
    /// Whether a repeat has an effect of its own (sends, charges, unkeyed posts); false for
    /// reads and natural idempotent writes.
    pub side_effect: bool,
    /// The model-written free text (reworded on a reissue); never part of the key, and not read
    /// by the simulated provider.
    #[allow(dead_code)]
    pub text: String,
    pub key: Option<String>,
}

/// Sent again as a clone: it carries no operation of its own.
impl stormguard::retry::Request for Call {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl KeyStamp for Call {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

/// The provider's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    pub effect: EffectId,
    pub receipt: String,
}

// Its receipt is its JSON.
stormguard::stored_as_json!(Done);

/// The provider's failures, as the client sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimError {
    /// 429 with a Retry-After: not processed.
    Throttled,
    /// 503: processed or not, the client cannot tell.
    Unavailable,
    /// The client gave up waiting (a transport timeout).
    Timeout,
    /// 409: a request with this key is still in flight.
    KeyInFlight,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            SimError::Throttled => "429 rate limited",
            SimError::Unavailable => "503 unavailable",
            SimError::Timeout => "timed out",
            SimError::KeyInFlight => "409 a request with this key is in flight",
        };
        f.write_str(what)
    }
}

impl std::error::Error for SimError {}

impl AsDynError for SimError {
    fn as_dyn_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

/// What stormguard's layers read the provider's answers as.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClassifier;

impl<E: AsDynError> Classify<Done, E> for SimClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<Done, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(_) => Classification::success(),
            Err(e) => match e.as_dyn_error().downcast_ref::<SimError>() {
                Some(SimError::Throttled) => {
                    Classification::failure(FailureClass::Transient, ErrorCode::RateLimited)
                        .with_hint(ServerHint::RetryAfter(Duration::from_millis(200)))
                }
                Some(SimError::KeyInFlight) => {
                    Classification::failure(FailureClass::Transient, ErrorCode::Conflict)
                        .with_hint(ServerHint::RetryAfter(Duration::from_millis(500)))
                }
                Some(SimError::Unavailable) => {
                    Classification::failure(FailureClass::Ambiguous, ErrorCode::Unavailable)
                }
                Some(SimError::Timeout) => {
                    Classification::failure(FailureClass::Ambiguous, ErrorCode::Timeout)
                }
                None => classify_error(e.as_dyn_error()),
            },
        })
    }
}

/// The fault rates (per attempt unless said otherwise).
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// 429, not processed.
    pub throttle: f64,
    /// 503 before processing.
    pub refuse_503: f64,
    /// 503 after the work was done.
    pub done_503: f64,
    /// A timeout after the provider committed.
    pub timeout_committed: f64,
    /// A timeout; the provider never got the request.
    pub timeout_lost: f64,
    /// A timeout; the commit lands later, within `in_flight`.
    pub late_commit: f64,
    /// Per episode: a crash between the provider's accept and the receipt, then a resume.
    pub crash: f64,
    /// Per crash: the resume comes after the provider's key window (25 h).
    pub resume_after_window: f64,
    /// Per write step: the model reissues the call (reworded) after it succeeded.
    pub reissue: f64,
    /// Per write step: two branches of the run issue it at once.
    pub parallel: f64,
    /// How long a request may be in flight at the provider (the bound late commits respect).
    pub in_flight: Duration,
    /// How far the provider's sent log lags behind its commits.
    pub log_lag: Duration,
    /// The second worker's clock, ahead of the first's (resumes run on the other worker).
    pub clock_skew: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            throttle: 0.03,
            refuse_503: 0.01,
            done_503: 0.01,
            timeout_committed: 0.015,
            timeout_lost: 0.01,
            late_commit: 0.015,
            crash: 0.08,
            resume_after_window: 0.1,
            reissue: 0.05,
            parallel: 0.02,
            in_flight: Duration::from_secs(2),
            log_lag: Duration::from_secs(3),
            clock_skew: Duration::from_secs(5),
        }
    }
}

/// What the seed decided for one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fate {
    Ok,
    Throttle,
    Refuse503,
    Done503,
    TimeoutCommitted,
    TimeoutLost,
    LateCommit,
    Crash,
}

/// How long the client waits before it gives up on an attempt.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the provider remembers a key (Stripe: 24 h).
pub const KEY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// splitmix64.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A number in [0, 1) drawn from `parts`.
pub fn draw(parts: &[u64]) -> f64 {
    let mut z = 0x5EED_u64;
    for p in parts {
        z = mix(z ^ p);
    }
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Default)]
struct State {
    /// How many times each effect was applied.
    applied: HashMap<EffectId, u32>,
    /// When each effect was first committed (what a consistent log shows).
    committed_at: HashMap<EffectId, Instant>,
    /// Keys: the answer once committed (`None` while the request is in flight), and when the
    /// key was first seen.
    keys: HashMap<String, (Option<Done>, Instant)>,
    /// Late commits not landed yet: when, what, under which key.
    late: Vec<(Instant, EffectId, Option<String>)>,
    /// Attempts per effect, for the fate draws.
    attempts: HashMap<EffectId, u32>,
    /// Calls received.
    calls: u64,
    /// Actions called at least once (the rest of the calls are retries and repeats).
    seen: std::collections::HashSet<EffectId>,
    /// Fates drawn, by kind.
    fates: HashMap<Fate, u64>,
    /// Set by a `Crash` fate: the process dies now.
    crashed: bool,
}

/// The provider, shared by every episode of a policy run (effects are per episode).
#[derive(Clone)]
pub struct Provider {
    state: Arc<Mutex<State>>,
    seed: u64,
    faults: Faults,
    /// Episodes whose first attempt of this step crashes.
    crash_steps: Arc<Mutex<HashMap<u32, u8>>>,
    /// Told when a call crashes the run.
    crash_signal: Arc<tokio::sync::Notify>,
}

impl Provider {
    pub fn new(seed: u64, faults: Faults) -> Self {
        Provider {
            state: Arc::default(),
            seed,
            faults,
            crash_steps: Arc::default(),
            crash_signal: Arc::default(),
        }
    }

    /// Resolves when a call crashes the run.
    pub async fn crashed(&self) {
        loop {
            self.crash_signal.notified().await;
            if self.take_crash() {
                return;
            }
        }
    }

    /// The first attempt of `step` in `episode` crashes the run after the provider accepted it.
    pub fn crash_at(&self, episode: u32, step: u8) {
        self.crash_steps.lock().unwrap().insert(episode, step);
    }

    /// Whether the last call crashed the run (and clears it).
    pub fn take_crash(&self) -> bool {
        std::mem::take(&mut self.state.lock().unwrap().crashed)
    }

    fn settle(s: &mut State, now: Instant) {
        let mut i = 0;
        while i < s.late.len() {
            if s.late[i].0 <= now {
                let (_, effect, key) = s.late.swap_remove(i);
                commit(s, effect, key.as_deref(), now);
            } else {
                i += 1;
            }
        }
    }

    /// Lands every late commit due by now.
    pub fn settle_now(&self) {
        Self::settle(&mut self.state.lock().unwrap(), Instant::now());
    }

    /// How many times `effect` was applied.
    pub fn applied(&self, effect: EffectId) -> u32 {
        self.state
            .lock()
            .unwrap()
            .applied
            .get(&effect)
            .copied()
            .unwrap_or(0)
    }

    /// The sent log: whether `effect` shows there, read `lag` behind (zero: consistent).
    pub fn logged(&self, effect: EffectId, lag: Duration) -> Option<Done> {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap();
        Self::settle(&mut s, now);
        let at = *s.committed_at.get(&effect)?;
        (at + lag <= now).then(|| receipt(effect))
    }

    pub fn calls(&self) -> u64 {
        self.state.lock().unwrap().calls
    }

    /// Calls beyond the first for each action: retries, resends and repeats.
    pub fn repeats(&self) -> u64 {
        let s = self.state.lock().unwrap();
        s.calls - s.seen.len() as u64
    }

    pub fn fates(&self) -> HashMap<Fate, u64> {
        self.state.lock().unwrap().fates.clone()
    }

    fn fate(&self, s: &mut State, call: &Call) -> Fate {
        let n = s.attempts.entry(call.effect).or_default();
        *n += 1;
        let nth = *n;
        let crash = nth == 1
            && self.crash_steps.lock().unwrap().get(&call.effect.episode)
                == Some(&call.effect.step);
        if crash {
            return Fate::Crash;
        }
        let f = &self.faults;
        let roll = draw(&[
            self.seed,
            u64::from(call.effect.episode),
            u64::from(call.effect.step),
            u64::from(nth),
        ]);
        let mut edge = 0.0;
        for (p, fate) in [
            (f.throttle, Fate::Throttle),
            (f.refuse_503, Fate::Refuse503),
            (f.done_503, Fate::Done503),
            (f.timeout_committed, Fate::TimeoutCommitted),
            (f.timeout_lost, Fate::TimeoutLost),
            (f.late_commit, Fate::LateCommit),
        ] {
            edge += p;
            if roll < edge {
                return fate;
            }
        }
        Fate::Ok
    }
}

fn receipt(effect: EffectId) -> Done {
    Done {
        effect,
        receipt: format!("r-{}-{}", effect.episode, effect.step),
    }
}

fn commit(s: &mut State, effect: EffectId, key: Option<&str>, now: Instant) {
    *s.applied.entry(effect).or_default() += 1;
    s.committed_at.entry(effect).or_insert(now);
    if let Some(key) = key {
        let seen = s.keys.get(key).map_or(now, |(_, seen)| *seen);
        s.keys
            .insert(key.to_string(), (Some(receipt(effect)), seen));
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Done, SimError>> + Send>>;

impl Service<Call> for Provider {
    type Response = Done;
    type Error = SimError;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), SimError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Answer {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap();
        s.calls += 1;
        s.seen.insert(call.effect);
        Self::settle(&mut s, now);
        // A key the provider remembers answers from its table (Stripe's semantics); one still
        // in flight is a 409.
        let key = call.key.clone().filter(|_| call.keyed_endpoint);
        if let Some(k) = &key {
            match s.keys.get(k) {
                Some((_, seen)) if now.duration_since(*seen) >= KEY_WINDOW => {
                    s.keys.remove(k);
                }
                Some((Some(done), _)) => {
                    let done = done.clone();
                    return Box::pin(async move { Ok(done) });
                }
                Some((None, _)) => return Box::pin(async { Err(SimError::KeyInFlight) }),
                None => {}
            }
        }
        let fate = self.fate(&mut s, &call);
        *s.fates.entry(fate).or_default() += 1;
        if std::env::var("EPISODES_DEBUG_EP")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            == Some(call.effect.episode)
        {
            eprintln!(
                "t={:?} step {} fate {fate:?} key {:?}",
                now, call.effect.step, call.key
            );
        }
        let effect = call.effect;
        let done = receipt(effect);
        let k = key.as_deref();
        match fate {
            Fate::Ok => {
                commit(&mut s, effect, k, now);
                Box::pin(async move { Ok(done) })
            }
            Fate::Throttle => Box::pin(async { Err(SimError::Throttled) }),
            Fate::Refuse503 => Box::pin(async { Err(SimError::Unavailable) }),
            Fate::Done503 => {
                commit(&mut s, effect, k, now);
                Box::pin(async { Err(SimError::Unavailable) })
            }
            Fate::TimeoutCommitted => {
                commit(&mut s, effect, k, now);
                Box::pin(timeout())
            }
            Fate::TimeoutLost => Box::pin(timeout()),
            Fate::LateCommit => {
                // Lands after the client gave up, within the in-flight bound.
                let nth = s.attempts.get(&effect).copied().unwrap_or(0);
                let spread = self.faults.in_flight.saturating_sub(CLIENT_TIMEOUT);
                let after = CLIENT_TIMEOUT
                    + spread.mul_f64(draw(&[
                        self.seed ^ 0x1A7E,
                        u64::from(effect.episode),
                        u64::from(effect.step),
                        u64::from(nth),
                    ]));
                if let Some(k) = k {
                    s.keys.entry(k.to_string()).or_insert((None, now));
                }
                s.late.push((now + after, effect, key.clone()));
                Box::pin(timeout())
            }
            Fate::Crash => {
                // Accepted; the caller's process dies before it hears back. Half the time the
                // effect is applied at once, half the time it is still in flight and lands
                // within the in-flight bound.
                let roll = draw(&[self.seed ^ 0xC0DE, u64::from(effect.episode)]);
                if roll < 0.5 {
                    commit(&mut s, effect, k, now);
                } else {
                    if let Some(k) = k {
                        s.keys.entry(k.to_string()).or_insert((None, now));
                    }
                    let after = self.faults.in_flight.mul_f64(roll);
                    s.late.push((now + after, effect, key.clone()));
                }
                s.crashed = true;
                self.crash_signal.notify_one();
                Box::pin(std::future::pending())
            }
        }
    }
}

async fn timeout() -> Result<Done, SimError> {
    tokio::time::sleep(CLIENT_TIMEOUT).await;
    Err(SimError::Timeout)
}
