//! What a breaker does with an outcome: count it (closed), settle a trial (half-open), open or
//! close, and tell the world (traces, metrics, the `on_transition` callback).

use super::decide::{longest_open_ms, trip_reason};
use super::policy::Count;
use super::state::{
    Admission, Admit, Breaker, Word, CLOSED, GEN_SHIFT, HALF_OPEN, OPEN, SUCCESS_SHIFT,
};
use super::transition::{State, Transition};
use super::window::Tally;
use std::sync::atomic::Ordering;

impl Breaker {
    /// Records the outcome of an admitted call.
    pub(super) fn record(&self, admission: Admission, count: Count) {
        let s = &*self.machine;
        match count {
            Count::Success => s.counters.success.increment(1),
            Count::Failure => s.counters.failure.increment(1),
            Count::Ignore => s.counters.ignored.increment(1),
        }
        s.sharing().record(count);
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
        let s = &*self.machine;
        let _ = s
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let w = Word(w);
                (w.state() == HALF_OPEN && w.generation() == generation && w.admitted() > 0)
                    .then_some(w.0 - 1)
            });
    }

    pub(super) fn rejected(&self) {
        self.machine.counters.rejected.increment(1);
    }

    fn record_closed(&self, generation: u32, count: Count) {
        let s = &*self.machine;
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
        let s = &*self.machine;
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

    pub(super) fn trip(&self, word: Word, from: State, reason: String) {
        let s = &*self.machine;
        let open = word.next(OPEN);
        if s.word
            .compare_exchange(word.0, open.0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let now = self.now_ms();
        if from == State::Closed {
            s.outage_since.store(now, Ordering::Release);
        }
        let age = now.saturating_sub(s.outage_since.load(Ordering::Acquire));
        let shortest = s.config.open_duration;
        let longest = longest_open_ms(
            age,
            shortest.as_millis() as u64,
            s.config.max_open_duration.as_millis() as u64,
            s.config.open_share,
        );
        s.rejected_since_open.store(0, Ordering::Release);
        s.open_max_until.store(now + longest, Ordering::Release);
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
            longest
        );
        *s.reason.lock().unwrap_or_else(|p| p.into_inner()) = reason.clone();
        self.transition(from, State::Open, reason);
    }

    pub(super) fn transition(&self, from: State, to: State, reason: String) {
        let s = &*self.machine;
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
