//! A breaker's shared state: one packed atomic word for the state machine, windows of atomics.
//!
//! The word holds the state, a generation that every transition bumps, and the half-open trial
//! counters, so each transition and each trial admission is a single compare-and-swap: never
//! more trials in flight than configured, even under concurrency, and no outcome from an earlier
//! generation (a call admitted before the breaker opened) counts in a later one.

use super::config::{BreakerConfig, Window};
pub(super) use super::decide::{open_decision, Admission, Admit, OpenDecision};
use super::share::{Alone, Sharing};
use super::transition::State;
use super::window::{Buckets, Ring, Tally};
use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

// word: bits 0-18 trials admitted, 19-37 trial successes, 38-39 state, 40-63 generation.
pub(super) const FIELD: u64 = (1 << 19) - 1;
pub(super) const SUCCESS_SHIFT: u32 = 19;
pub(super) const STATE_SHIFT: u32 = 38;
pub(super) const GEN_SHIFT: u32 = 40;
pub(super) const CLOSED: u64 = 0;
pub(super) const OPEN: u64 = 1;
pub(super) const HALF_OPEN: u64 = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Word(pub(super) u64);

impl Word {
    pub(super) fn new(generation: u64, state: u64) -> Word {
        Word((generation & 0xff_ffff) << GEN_SHIFT | state << STATE_SHIFT)
    }
    pub(super) fn state(self) -> u64 {
        (self.0 >> STATE_SHIFT) & 3
    }
    pub(super) fn generation(self) -> u32 {
        (self.0 >> GEN_SHIFT) as u32
    }
    pub(super) fn admitted(self) -> u64 {
        self.0 & FIELD
    }
    pub(super) fn successes(self) -> u64 {
        (self.0 >> SUCCESS_SHIFT) & FIELD
    }
    pub(super) fn next(self, state: u64) -> Word {
        Word::new(u64::from(self.generation()) + 1, state)
    }
    pub(super) fn public(self) -> State {
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

pub(super) struct Counters {
    pub(super) success: metrics::Counter,
    pub(super) failure: metrics::Counter,
    pub(super) ignored: metrics::Counter,
    pub(super) rejected: metrics::Counter,
}

pub(super) struct Machine {
    pub(super) name: Cow<'static, str>,
    pub(super) config: BreakerConfig,
    pub(super) word: AtomicU64,
    /// (generation << 40) | milliseconds since `epoch` when the shortest open time ends.
    pub(super) open_until: AtomicU64,
    /// Milliseconds since `epoch` when the longest open time ends (a probe goes then whatever
    /// the traffic).
    pub(super) open_max_until: AtomicU64,
    /// Milliseconds since `epoch` when the breaker last opened from closed: the outage's start,
    /// kept across failed probes.
    pub(super) outage_since: AtomicU64,
    /// Calls rejected since the breaker last opened (a probe goes after `probe_after` of them).
    pub(super) rejected_since_open: AtomicU32,
    /// (generation << 40) | milliseconds since `epoch` when the half-open state's first trial
    /// was admitted (a trial unanswered after `trial_timeout` counts as failed).
    pub(super) trial_started: AtomicU64,
    pub(super) opens: AtomicU64,
    pub(super) consecutive: AtomicU32,
    pub(super) tally: Tally,
    pub(super) reason: Mutex<String>,
    pub(super) epoch: Instant,
    pub(super) counters: Counters,
    /// What this breaker is shared with, if anything (see [`share`](super::share)): its
    /// outcomes go there, and its gate holds the open breaker's probes.
    pub(super) sharing: OnceLock<Arc<dyn Sharing>>,
}

impl Machine {
    /// What this breaker is shared with: [`Alone`] until something shares it.
    #[inline]
    pub(super) fn sharing(&self) -> &dyn Sharing {
        match self.sharing.get() {
            Some(sharing) => &**sharing,
            None => &Alone,
        }
    }
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
    pub(super) machine: Arc<Machine>,
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
            machine: Arc::new(Machine {
                name,
                config,
                word: AtomicU64::new(Word::new(0, CLOSED).0),
                open_until: AtomicU64::new(0),
                open_max_until: AtomicU64::new(0),
                outage_since: AtomicU64::new(0),
                rejected_since_open: AtomicU32::new(0),
                trial_started: AtomicU64::new(0),
                opens: AtomicU64::new(0),
                consecutive: AtomicU32::new(0),
                tally,
                reason: Mutex::new(String::new()),
                epoch: Instant::now(),
                counters,
                sharing: OnceLock::new(),
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
        self.machine.opens.load(Ordering::Acquire)
    }

    /// The settings it was made with.
    ///
    /// ```
    /// use stormguard::breaker::{Breaker, BreakerConfig};
    /// let b = Breaker::new("dep", BreakerConfig::default());
    /// assert_eq!(b.config().probe_after(), 25);
    /// ```
    pub fn config(&self) -> &BreakerConfig {
        &self.machine.config
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.machine.name
    }

    /// Why the breaker last opened, in words (empty if it never did).
    pub fn reason(&self) -> String {
        self.machine
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn word(&self) -> Word {
        Word(self.machine.word.load(Ordering::Acquire))
    }

    /// Nanoseconds since the breaker was made, plus one (0 is "not timed").
    pub(super) fn now_tick(&self) -> u64 {
        self.machine.epoch.elapsed().as_nanos() as u64 + 1
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.machine.epoch.elapsed().as_millis() as u64
    }

    /// Decides whether a call may go through now.
    pub(super) fn admit(&self) -> Admission {
        let s = &*self.machine;
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
                    let wait = s.sharing().gate(wait);
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
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.machine.name)
            .field("state", &self.state())
            .field("opens", &self.opens())
            .finish()
    }
}
