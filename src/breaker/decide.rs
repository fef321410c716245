//! The breaker's pure decisions: how a call was admitted ([`Admit`], packed in an
//! [`Admission`]), whether an open breaker probes ([`open_decision`]) and whether a failure
//! trips a closed one ([`trip_reason`]). The shared state in `state.rs` only carries them out.

use super::config::{BreakerConfig, Window};

/// How a call was let through, as seen by a `match`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// While closed, in this generation.
    Closed(u32),
    /// As a half-open trial, in this generation.
    Trial(u32),
    /// Rejected: the breaker is open for about this many milliseconds yet.
    Rejected(u32),
}

/// An [`Admit`] packed in one word (kind in the high half, value in the low half), so that
/// moving it through the service and into the call's future is one 8-byte store and load, never
/// two 4-byte stores read back as one (a store-forwarding stall on the closed fast path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Admission(u64);

impl Admission {
    const TRIAL: u64 = 1 << 32;
    const REJECTED: u64 = 2 << 32;

    pub(super) fn closed(generation: u32) -> Admission {
        Admission(u64::from(generation))
    }
    pub(super) fn trial(generation: u32) -> Admission {
        Admission(Self::TRIAL | u64::from(generation))
    }
    pub(super) fn rejected(ms: u32) -> Admission {
        Admission(Self::REJECTED | u64::from(ms))
    }
    #[inline]
    pub(super) fn view(self) -> Admit {
        let value = self.0 as u32;
        match self.0 >> 32 {
            0 => Admit::Closed(value),
            1 => Admit::Trial(value),
            _ => Admit::Rejected(value),
        }
    }
    #[inline]
    pub(super) fn is_rejected(self) -> bool {
        self.0 >> 32 == 2
    }
}

/// What an open breaker does with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpenDecision {
    /// Turn it away; the caller may try again in about this long.
    Reject { retry_after_ms: u64 },
    /// Let it through as a half-open probe.
    Probe,
}

/// The open state's rule, as a pure function of the clock and the count: a probe goes once the
/// shortest open time has passed *and* `probe_after` calls have been turned away since the
/// trip, or once the longest open time has passed whatever the traffic. With the defaults
/// (250 ms, 25 calls, 30 s): at 100 calls/s a probe every quarter second (so a healed
/// dependency is back within one); at one call a second, one call in 25 (so an outage still
/// sheds nearly everything); at one a minute, one every half minute. No doubling: a healthy dependency is never kept waiting for a grown open time.
pub(super) fn open_decision(
    now_ms: u64,
    shortest_until_ms: u64,
    longest_until_ms: u64,
    rejected: u32,
    probe_after: u32,
) -> OpenDecision {
    if now_ms >= longest_until_ms || (now_ms >= shortest_until_ms && rejected >= probe_after) {
        return OpenDecision::Probe;
    }
    // The time after which a call is sure to go through as a probe: the shortest open time if
    // enough calls were turned away already (or none need be), else the longest. Under traffic
    // the probe comes sooner. (By then another caller may hold the probe: a half-open breaker
    // admits its trials only.)
    let to_longest = longest_until_ms - now_ms;
    let to_shortest = shortest_until_ms.saturating_sub(now_ms);
    let sure = if rejected >= probe_after {
        to_shortest
    } else {
        to_longest
    };
    OpenDecision::Reject {
        retry_after_ms: sure.max(1),
    }
}

/// When an open breaker probes whatever the traffic, in milliseconds after this trip: `share`
/// of the outage so far (`age_ms`, from the trip that ended the last closed spell), within the
/// shortest and the longest open time; the longest when `share` is 0. A healed dependency then
/// waits at most that share of its outage at low traffic, and the probes of an outage grow
/// apart geometrically (by `1 + share`), so a long one costs few.
pub(super) fn longest_open_ms(age_ms: u64, shortest_ms: u64, longest_ms: u64, share: f64) -> u64 {
    if share <= 0.0 {
        return longest_ms;
    }
    ((age_ms as f64 * share) as u64).clamp(shortest_ms, longest_ms.max(shortest_ms))
}

/// Whether a failure recorded while closed trips the breaker, and why: a pure function of the
/// rules, the failures in a row and the window's (calls, failures) after the record.
pub(super) fn trip_reason(
    config: &BreakerConfig,
    name: &str,
    in_a_row: u32,
    window: Option<(u32, u32)>,
) -> Option<String> {
    if config.consecutive_failures.is_some_and(|n| in_a_row >= n) {
        return Some(format!("{in_a_row} calls in a row to {name} failed"));
    }
    let (rule, (calls, failures)) = config.failure_rate.zip(window)?;
    if calls < rule.min_calls || f64::from(failures) < rule.threshold * f64::from(calls) {
        return None;
    }
    Some(match rule.window {
        Window::Count(_) => format!("{failures} of the last {calls} calls to {name} failed"),
        Window::Time(d) => format!(
            "{failures} of {calls} calls to {name} in the last {} s failed",
            d.as_secs()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trip_rules_fire_exactly_at_their_thresholds() {
        let config = BreakerConfig::default();
        assert_eq!(
            trip_reason(&config, "dep", 19, Some((19, 19))),
            None,
            "under min_calls"
        );
        assert!(trip_reason(&config, "dep", 20, Some((20, 20)))
            .unwrap()
            .contains("20 calls in a row"));
        // 90 % of the last 50: 44 failures do not trip, 45 do (in any order).
        assert_eq!(trip_reason(&config, "dep", 3, Some((50, 44))), None);
        let reason = trip_reason(&config, "dep", 3, Some((50, 45))).unwrap();
        assert_eq!(reason, "45 of the last 50 calls to dep failed");
        // Half failing is kept: no rule fires.
        assert_eq!(trip_reason(&config, "dep", 10, Some((50, 25))), None);
    }

    #[test]
    fn an_open_breaker_probes_by_traffic_or_by_its_longest_open_time() {
        let reject = |ms| OpenDecision::Reject { retry_after_ms: ms };
        // Shortest open time until 250 ms, longest until 30 s.
        // Before the shortest open time: rejected; the sure time is the longest unless enough
        // calls were turned away already.
        assert_eq!(open_decision(100, 250, 30_000, 3, 25), reject(29_900));
        assert_eq!(open_decision(100, 250, 30_000, 1_000, 25), reject(150));
        // After it: a probe once enough calls were turned away.
        assert_eq!(open_decision(300, 250, 30_000, 25, 25), OpenDecision::Probe);
        assert_eq!(open_decision(300, 250, 30_000, 24, 25), reject(29_700));
        // Quiet traffic: the longest open time lets one through anyway.
        assert_eq!(
            open_decision(30_000, 250, 30_000, 0, 25),
            OpenDecision::Probe
        );
        // probe_after 0: the classic time-only breaker.
        assert_eq!(open_decision(100, 250, 30_000, 0, 0), reject(150));
        assert_eq!(open_decision(250, 250, 30_000, 0, 0), OpenDecision::Probe);
    }

    #[test]
    fn the_longest_open_time_is_a_share_of_the_outage_within_the_bounds() {
        // Opened just now: the shortest open time.
        assert_eq!(longest_open_ms(0, 250, 30_000, 0.2), 250);
        assert_eq!(longest_open_ms(10_000, 250, 30_000, 0.2), 2_000);
        assert_eq!(longest_open_ms(3_600_000, 250, 30_000, 0.2), 30_000);
        // Off: the longest open time, as before.
        assert_eq!(longest_open_ms(10_000, 250, 30_000, 0.0), 30_000);
    }

    #[test]
    fn an_outage_at_one_call_a_second_costs_logarithmically_many_probes() {
        // The rule alone, driven at one call a second through a 600 s outage: every call that
        // finds the probe time passed is a probe, which fails and opens the breaker again.
        let (mut probes, mut open_until, since) = (0, 0u64, 0u64);
        for t in (0..600_000u64).step_by(1_000) {
            if t >= open_until {
                probes += 1;
                open_until = t + longest_open_ms(t - since, 250, 30_000, 0.2);
            }
        }
        assert!((25..=40).contains(&probes), "{probes} probes");
        // Healed at 20 s after 20 s down: the next probe is at most 4 s away (a fifth of 20 s).
        assert!(longest_open_ms(20_000, 250, 30_000, 0.2) <= 4_000);
    }

    #[test]
    fn an_admission_round_trips_through_its_packed_word() {
        for view in [
            Admit::Closed(0),
            Admit::Closed(u32::MAX),
            Admit::Trial(7),
            Admit::Rejected(5_000),
        ] {
            let packed = match view {
                Admit::Closed(g) => Admission::closed(g),
                Admit::Trial(g) => Admission::trial(g),
                Admit::Rejected(ms) => Admission::rejected(ms),
            };
            assert_eq!(packed.view(), view);
            assert_eq!(packed.is_rejected(), matches!(view, Admit::Rejected(_)));
        }
    }
}
