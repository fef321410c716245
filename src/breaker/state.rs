//! A breaker's shared state: one packed atomic word for the state machine, windows of atomics.
//!
//! The word holds the state, a generation that every transition bumps, and the half-open trial
//! counters, so each transition and each trial admission is a single compare-and-swap: never
//! more trials in flight than configured, even under concurrency, and no outcome from an earlier
//! generation (a call admitted before the breaker opened) counts in a later one.

use super::config::{BreakerConfig, Window};
pub(super) use super::decide::{open_decision, trip_reason, Admission, Admit, OpenDecision};
use super::policy::Count;
use super::transition::{State, Transition};
use super::window::{Buckets, Ring, Tally};
use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

// word: bits 0-18 trials admitted, 19-37 trial successes, 38-39 state, 40-63 generation.
const FIELD: u64 = (1 << 19) - 1;
const SUCCESS_SHIFT: u32 = 19;
const STATE_SHIFT: u32 = 38;
const GEN_SHIFT: u32 = 40;
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Word(u64);

impl Word {
    fn new(generation: u64, state: u64) -> Word {
        Word((generation & 0xff_ffff) << GEN_SHIFT | state << STATE_SHIFT)
    }
    fn state(self) -> u64 {
        (self.0 >> STATE_SHIFT) & 3
    }
    fn generation(self) -> u32 {
        (self.0 >> GEN_SHIFT) as u32
    }
    fn admitted(self) -> u64 {
        self.0 & FIELD
    }
    fn successes(self) -> u64 {
        (self.0 >> SUCCESS_SHIFT) & FIELD
    }
    fn next(self, state: u64) -> Word {
        Word::new(u64::from(self.generation()) + 1, state)
    }
    fn public(self) -> State {
        match self.state() {
            CLOSED => State::Closed,
            OPEN => State::Open,
            _ => State::HalfOpen,
        }
    }
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

struct Counters {
    success: metrics::Counter,
    failure: metrics::Counter,
    ignored: metrics::Counter,
    rejected: metrics::Counter,
}

pub(super) struct Shared {
    pub(super) name: Cow<'static, str>,
    pub(super) config: BreakerConfig,
    word: AtomicU64,
    /// (generation << 40) | milliseconds since `epoch` when the shortest open time ends.
    open_until: AtomicU64,
    /// Milliseconds since `epoch` when the longest open time ends (a probe goes then whatever
    /// the traffic).
    open_max_until: AtomicU64,
    /// Calls rejected since the breaker last opened (a probe goes after `probe_after` of them).
    rejected_since_open: AtomicU32,
    /// (generation << 40) | milliseconds since `epoch` when the half-open state's first trial
    /// was admitted (a trial unanswered after `trial_timeout` counts as failed).
    trial_started: AtomicU64,
    opens: AtomicU64,
    consecutive: AtomicU32,
    tally: Tally,
    reason: Mutex<String>,
    epoch: Instant,
    counters: Counters,
    /// The fleet this breaker is shared with (feature `redis`): its counts go there, and its
    /// gate holds the open breaker's probes to the fleet's trial lease.
    #[cfg(feature = "redis")]
    pub(super) fleet: std::sync::OnceLock<Arc<super::fleet::Tap>>,
}

/// A circuit breaker's shared state: one per dependency. Cloning the handle shares it; give a
/// clone to every [`CircuitBreakerLayer`](super::CircuitBreakerLayer) that guards that dependency.
///
/// ```
/// use stormguard::breaker::{Breaker, BreakerConfig, State};
///
/// let breaker = Breaker::new("billing-api", BreakerConfig::default());
/// assert_eq!(breaker.state(), State::Closed);
/// assert_eq!(breaker.opens(), 0);
/// ```
#[derive(Clone)]
pub struct Breaker {
    pub(super) shared: Arc<Shared>,
}

impl Breaker {
    /// A closed breaker named `name` (used in hints, traces and metric labels).
    pub fn new(name: impl Into<Cow<'static, str>>, config: BreakerConfig) -> Breaker {
        let name = name.into();
        let tally = match config.failure_rate.map(|rule| rule.window) {
            Some(Window::Count(n)) => Tally::Count(Ring::new(n)),
            Some(Window::Time(d)) => Tally::Time(Buckets::new(d.as_secs())),
            None => Tally::Off,
        };
        let label = name.to_string();
        let counter = |count: &'static str| metrics::counter!(super::OUTCOMES, "breaker" => label.clone(), "count" => count);
        let counters = Counters {
            success: counter("success"),
            failure: counter("failure"),
            ignored: counter("ignored"),
            rejected: metrics::counter!(super::REJECTIONS, "breaker" => label.clone()),
        };
        metrics::gauge!(super::STATE, "breaker" => label).set(State::Closed.gauge());
        Breaker {
            shared: Arc::new(Shared {
                name,
                config,
                word: AtomicU64::new(Word::new(0, CLOSED).0),
                open_until: AtomicU64::new(0),
                open_max_until: AtomicU64::new(0),
                rejected_since_open: AtomicU32::new(0),
                trial_started: AtomicU64::new(0),
                opens: AtomicU64::new(0),
                consecutive: AtomicU32::new(0),
                tally,
                reason: Mutex::new(String::new()),
                epoch: Instant::now(),
                counters,
                #[cfg(feature = "redis")]
                fleet: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The current state. An open breaker whose open duration has passed reports `Open` until a
    /// call arrives to try it.
    pub fn state(&self) -> State {
        self.word().public()
    }

    /// How many times the breaker has opened (half-open trials that failed included).
    pub fn opens(&self) -> u64 {
        self.shared.opens.load(Ordering::Acquire)
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Why the breaker last opened, in words (empty if it never did).
    pub fn reason(&self) -> String {
        self.shared
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn word(&self) -> Word {
        Word(self.shared.word.load(Ordering::Acquire))
    }

    /// Nanoseconds since the breaker was made, plus one (0 is "not timed").
    pub(super) fn now_tick(&self) -> u64 {
        self.shared.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn now_ms(&self) -> u64 {
        self.shared.epoch.elapsed().as_millis() as u64
    }

    /// Decides whether a call may go through now.
    pub(super) fn admit(&self) -> Admission {
        let s = &*self.shared;
        let mut word = self.word();
        loop {
            match word.state() {
                CLOSED => return Admission::closed(word.generation()),
                OPEN => {
                    let until = s.open_until.load(Ordering::Acquire);
                    let shortest = s.config.open_duration;
                    if until >> GEN_SHIFT != u64::from(word.generation()) {
                        // Opened a moment ago; its end is being written.
                        return Admission::rejected(millis(shortest));
                    }
                    let until_ms = until & ((1 << GEN_SHIFT) - 1);
                    let now = self.now_ms();
                    let rejected = s.rejected_since_open.load(Ordering::Acquire);
                    let max_until = s.open_max_until.load(Ordering::Acquire);
                    let wait = match open_decision(
                        now,
                        until_ms,
                        max_until,
                        rejected,
                        s.config.probe_after,
                    ) {
                        OpenDecision::Probe => None,
                        OpenDecision::Reject { retry_after_ms } => Some(retry_after_ms),
                    };
                    #[cfg(feature = "redis")]
                    let wait = match s.fleet.get() {
                        Some(tap) => tap.gate(wait),
                        None => wait,
                    };
                    if let Some(retry_after_ms) = wait {
                        s.rejected_since_open.fetch_add(1, Ordering::AcqRel);
                        return Admission::rejected(
                            u32::try_from(retry_after_ms).unwrap_or(u32::MAX),
                        );
                    }
                    let half_open = word.next(HALF_OPEN);
                    match s.word.compare_exchange(
                        word.0,
                        half_open.0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            self.transition(
                                State::Open,
                                State::HalfOpen,
                                "enough calls were turned away, or the longest open time passed: probing".into(),
                            );
                            word = half_open;
                        }
                        Err(actual) => word = Word(actual),
                    }
                }
                _ => {
                    if word.admitted() >= u64::from(s.config.trials) {
                        // A trial that does not answer in time counts as failed: a hung call
                        // must not keep a healed dependency shut.
                        let started = s.trial_started.load(Ordering::Acquire);
                        let timeout = s.config.trial_timeout.as_millis() as u64;
                        if started >> GEN_SHIFT == u64::from(word.generation())
                            && self.now_ms() >= (started & ((1 << GEN_SHIFT) - 1)) + timeout
                        {
                            let reason = format!(
                                "a trial call to {} did not answer within {} ms",
                                s.name, timeout
                            );
                            self.trip(word, State::HalfOpen, reason);
                            word = self.word();
                            continue;
                        }
                        return Admission::rejected(millis(s.config.open_duration));
                    }
                    match s.word.compare_exchange(
                        word.0,
                        word.0 + 1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            if word.admitted() == 0 {
                                s.trial_started.store(
                                    u64::from(word.generation()) << GEN_SHIFT | self.now_ms(),
                                    Ordering::Release,
                                );
                            }
                            return Admission::trial(word.generation());
                        }
                        Err(actual) => word = Word(actual),
                    }
                }
            }
        }
    }

    /// Records the outcome of an admitted call.
    pub(super) fn record(&self, admission: Admission, count: Count) {
        let s = &*self.shared;
        match count {
            Count::Success => s.counters.success.increment(1),
            Count::Failure => s.counters.failure.increment(1),
            Count::Ignore => s.counters.ignored.increment(1),
        }
        #[cfg(feature = "redis")]
        if let Some(tap) = s.fleet.get() {
            tap.record(count);
        }
        match admission.view() {
            Admit::Closed(generation) => self.record_closed(generation, count),
            Admit::Trial(generation) => self.record_trial(generation, count),
            Admit::Rejected(_) => {}
        }
    }

    /// Gives back a trial permit whose call was cancelled or answered without evidence.
    pub(super) fn release(&self, admission: Admission) {
        let Admit::Trial(generation) = admission.view() else {
            return;
        };
        let s = &*self.shared;
        let _ = s
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let w = Word(w);
                (w.state() == HALF_OPEN && w.generation() == generation && w.admitted() > 0)
                    .then_some(w.0 - 1)
            });
    }

    pub(super) fn rejected(&self) {
        self.shared.counters.rejected.increment(1);
    }

    fn record_closed(&self, generation: u32, count: Count) {
        let s = &*self.shared;
        let word = self.word();
        if word.state() != CLOSED || word.generation() != generation {
            // Admitted before the breaker last changed state: no evidence about this generation.
            return;
        }
        let failed = match count {
            Count::Ignore => return,
            Count::Success => {
                if s.consecutive.load(Ordering::Relaxed) != 0 {
                    s.consecutive.store(0, Ordering::Relaxed);
                }
                false
            }
            Count::Failure => true,
        };
        let in_a_row = if failed {
            s.consecutive.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            0
        };
        let window = match &s.tally {
            Tally::Count(ring) => Some(ring.record(failed)),
            Tally::Time(buckets) => Some(buckets.record(s.epoch.elapsed().as_secs(), failed)),
            Tally::Off => None,
        };
        if !failed {
            return;
        }
        let Some(reason) = trip_reason(&s.config, &s.name, in_a_row, window) else {
            return;
        };
        let word = self.word();
        if word.state() == CLOSED && word.generation() == generation {
            self.trip(word, State::Closed, reason);
        }
    }

    fn record_trial(&self, generation: u32, count: Count) {
        let s = &*self.shared;
        match count {
            Count::Ignore => self.release(Admission::trial(generation)),
            Count::Failure => {
                let word = self.word();
                if word.state() == HALF_OPEN && word.generation() == generation {
                    let reason = format!("a trial call to {} failed", s.name);
                    self.trip(word, State::HalfOpen, reason);
                }
            }
            Count::Success => {
                let mut word = self.word();
                loop {
                    if word.state() != HALF_OPEN || word.generation() != generation {
                        return;
                    }
                    let successes = word.successes() + 1;
                    let next = if successes >= u64::from(s.config.trials) {
                        word.next(CLOSED)
                    } else {
                        Word(word.0 + (1 << SUCCESS_SHIFT))
                    };
                    match s.word.compare_exchange(
                        word.0,
                        next.0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) if next.state() == CLOSED => {
                            s.consecutive.store(0, Ordering::Release);
                            match &s.tally {
                                Tally::Count(ring) => ring.reset(),
                                Tally::Time(buckets) => buckets.reset(),
                                Tally::Off => {}
                            }
                            let reason = format!("{successes} trial calls succeeded");
                            self.transition(State::HalfOpen, State::Closed, reason);
                            return;
                        }
                        Ok(_) => return,
                        Err(actual) => word = Word(actual),
                    }
                }
            }
        }
    }

    /// Opens a closed breaker because the fleet's breaker is open (feature `redis`); says
    /// whether it did.
    #[cfg(feature = "redis")]
    pub(super) fn force_open(&self, reason: String) -> bool {
        let word = self.word();
        if word.state() != CLOSED {
            return false;
        }
        self.trip(word, State::Closed, reason);
        self.word().state() == OPEN
    }

    /// Closes an open or half-open breaker because the fleet's trial succeeded (feature
    /// `redis`); says whether it did.
    #[cfg(feature = "redis")]
    pub(super) fn force_close(&self, reason: String) -> bool {
        let s = &*self.shared;
        let word = self.word();
        if word.state() == CLOSED {
            return false;
        }
        let closed = word.next(CLOSED);
        if s.word
            .compare_exchange(word.0, closed.0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        s.consecutive.store(0, Ordering::Release);
        match &s.tally {
            Tally::Count(ring) => ring.reset(),
            Tally::Time(buckets) => buckets.reset(),
            Tally::Off => {}
        }
        self.transition(word.public(), State::Closed, reason);
        true
    }

    /// Failures in a row now (feature `redis`: the tail a fleet sync reports).
    #[cfg(feature = "redis")]
    pub(super) fn consecutive(&self) -> u32 {
        self.shared.consecutive.load(Ordering::Acquire)
    }

    fn trip(&self, word: Word, from: State, reason: String) {
        let s = &*self.shared;
        let open = word.next(OPEN);
        if s.word
            .compare_exchange(word.0, open.0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let now = self.now_ms();
        let (shortest, longest) = (s.config.open_duration, s.config.max_open_duration);
        s.rejected_since_open.store(0, Ordering::Release);
        s.open_max_until
            .store(now + longest.as_millis() as u64, Ordering::Release);
        s.open_until.store(
            u64::from(open.generation()) << GEN_SHIFT | (now + shortest.as_millis() as u64),
            Ordering::Release,
        );
        let duration = shortest;
        s.opens.fetch_add(1, Ordering::AcqRel);
        let reason = format!(
            "{reason}; open for at least {} ms, then probing after {} turned-away calls (at most {} ms)",
            duration.as_millis(),
            s.config.probe_after,
            longest.as_millis()
        );
        *s.reason.lock().unwrap_or_else(|p| p.into_inner()) = reason.clone();
        self.transition(from, State::Open, reason);
    }

    fn transition(&self, from: State, to: State, reason: String) {
        let s = &*self.shared;
        tracing::info!(
            breaker = %s.name,
            from = from.as_str(),
            to = to.as_str(),
            reason = %reason,
            "circuit breaker transition"
        );
        let name = s.name.to_string();
        metrics::gauge!(super::STATE, "breaker" => name.clone()).set(to.gauge());
        metrics::counter!(
            super::TRANSITIONS,
            "breaker" => name.clone(),
            "from" => from.as_str(),
            "to" => to.as_str()
        )
        .increment(1);
        if let Some(callback) = &s.config.on_transition {
            callback(&Transition {
                breaker: name,
                from,
                to,
                reason,
            });
        }
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.shared.name)
            .field("state", &self.state())
            .field("opens", &self.opens())
            .finish()
    }
}
