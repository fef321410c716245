//! When the fleet probes Redis, and what an up or a down says in the log: a pure function of the
//! fleet's recent history, driven by the link's probe task.
//!
//! - **Up means writable.** The probe is a small `SET` with an expiry, not a `PING`: a Redis
//!   that is full (`maxmemory` reached, `noeviction`) answers `PING` but refuses every script,
//!   and a fleet that came up on a `PING` would fall at its next script, again and again.
//! - **Re-joins back off.** While the fleet is down, the wait before the next probe doubles from
//!   one `sync_interval` to four, with jitter of up to half of it, so a fleet of workers does not
//!   probe a sick Redis in step, and a worker rejoins a restarted Redis within six intervals
//!   (300 ms at the default 50 ms; the fleet demo's goal is a second).
//! - **One `WARN` per outage.** A fleet that falls again within ten `sync_interval`s of coming up
//!   is still in the same outage: that fall is a `DEBUG` event, and the backoff goes on growing
//!   from where it was. An outage ends when the fleet has stayed up that long.

use std::time::Duration;
use tokio::time::Instant;

/// The up fleet probes every this many `sync_interval`s; it is also the longest wait between
/// probes while down, and how long the fleet must stay up for an outage to end.
pub(super) const UP_PERIOD: u32 = 10;

/// The longest wait between probes while down, in `sync_interval`s (before jitter).
pub(super) const DOWN_PERIOD: u32 = 4;

/// What an event says in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Say {
    /// An outage began (`WARN`), or the fleet first answered in it (`INFO`).
    Loud,
    /// More of the same outage (`DEBUG`).
    Quiet,
}

/// The fleet's recent history, as the probe and the log need it.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// Failed probes in this outage (the backoff's exponent).
    failed_probes: u32,
    /// When the fleet last came up, while it is up (or fell since, within the same outage).
    up_since: Option<Instant>,
    /// Whether an outage is under way (its `WARN` said), until the fleet stays up long enough.
    in_outage: bool,
    /// Whether the fleet has answered since the outage began (its next rise is quiet).
    rose_in_outage: bool,
}

impl Health {
    /// The fleet fell (a call or a probe failed while it was up). A fall within the settle time
    /// of the last rise belongs to the same outage.
    pub(super) fn fell(&mut self, now: Instant, interval: Duration) -> Say {
        let settle = interval * UP_PERIOD;
        let same_outage = self.in_outage
            && self
                .up_since
                .is_some_and(|up| now.saturating_duration_since(up) < settle);
        self.up_since = None;
        if same_outage {
            Say::Quiet
        } else {
            self.in_outage = true;
            self.failed_probes = 0;
            self.rose_in_outage = false;
            Say::Loud
        }
    }

    /// The fleet came up (a write answered).
    pub(super) fn rose(&mut self, now: Instant) -> Say {
        self.up_since = Some(now);
        if std::mem::replace(&mut self.rose_in_outage, true) {
            Say::Quiet
        } else {
            Say::Loud
        }
    }

    /// A probe failed while the fleet was down.
    pub(super) fn probe_failed(&mut self) {
        self.failed_probes = self.failed_probes.saturating_add(1);
    }

    /// How long to wait before the next probe; `random` is a fresh random number.
    pub(super) fn next_probe(&self, up: bool, interval: Duration, random: u64) -> Duration {
        let base = if up {
            interval * UP_PERIOD
        } else {
            // interval × 2^failed, at most four intervals.
            interval
                .saturating_mul(1 << self.failed_probes.min(4))
                .min(interval * DOWN_PERIOD)
        };
        let half = base.as_nanos() as u64 / 2;
        base + Duration::from_nanos(random % (half + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fleet_that_falls_right_after_it_rose_is_still_in_the_same_outage() {
        let t0 = Instant::now();
        let mut h = Health::default();
        assert_eq!(h.rose(t0), Say::Loud, "the first answer");
        // Even a quick first fall is news: no outage was under way.
        assert_eq!(h.fell(t0 + 100 * MS, 50 * MS), Say::Loud);
        // A full Redis behind a PING probe: it answers, the next script fails, nine times.
        let mut t = t0 + 100 * MS;
        for i in 0..9 {
            h.probe_failed();
            t += 200 * MS;
            let rise = h.rose(t);
            assert_eq!(
                rise,
                if i == 0 { Say::Loud } else { Say::Quiet },
                "rise {i}"
            );
            assert_eq!(h.fell(t + 5 * MS, 50 * MS), Say::Quiet, "fall {i}");
        }
        // Up for ten intervals: the outage is over, the next fall is news.
        t += 10 * MS;
        h.rose(t);
        assert_eq!(h.fell(t + 500 * MS, 50 * MS), Say::Loud);
    }

    #[test]
    fn the_backoff_doubles_to_four_intervals_and_starts_over_with_a_new_outage() {
        let t0 = Instant::now();
        let mut h = Health::default();
        h.rose(t0);
        assert_eq!(h.fell(t0, 20 * MS), Say::Loud);
        let waits: Vec<_> = (0..7)
            .map(|_| {
                let w = h.next_probe(false, 20 * MS, 0);
                h.probe_failed();
                w
            })
            .collect();
        assert_eq!(
            waits,
            [20, 40, 80, 80, 80, 80, 80].map(|ms| ms * MS).to_vec()
        );
        // A rise and a quick fall keep the backoff where it was.
        h.rose(t0);
        h.fell(t0 + MS, 20 * MS);
        assert_eq!(h.next_probe(false, 20 * MS, 0), 80 * MS);
        // A fall after a long spell up is a new outage: from one interval again.
        h.rose(t0 + 10 * MS);
        h.fell(t0 + 10 * MS + 200 * MS, 20 * MS);
        assert_eq!(h.next_probe(false, 20 * MS, 0), 20 * MS);
        assert_eq!(h.next_probe(true, 20 * MS, 0), 200 * MS);
    }

    proptest! {
        /// Whatever happens: a fall is loud exactly when it begins an outage (the first, or one
        /// after the fleet stayed up ten intervals), and every wait lies within [base, 1.5 base] with base from one to ten intervals.
        #[test]
        fn one_loud_fall_per_outage_and_waits_in_bounds(
            interval_ms in 1u64..=1_000,
            events in prop::collection::vec((0u8..3, 0u64..=2_000, any::<u64>()), 1..60),
        ) {
            let interval = Duration::from_millis(interval_ms);
            let mut h = Health::default();
            let mut now = Instant::now();
            let mut up = false;
            let mut last_rise: Option<Instant> = None;
            let mut in_outage = false;
            for (kind, step_ms, random) in events {
                now += Duration::from_millis(step_ms);
                match kind {
                    0 if !up => { h.rose(now); up = true; last_rise = Some(now); }
                    1 if up => {
                        let loud = h.fell(now, interval) == Say::Loud;
                        let settled = last_rise.is_some_and(|r| now - r >= interval * UP_PERIOD);
                        prop_assert_eq!(loud, !in_outage || settled, "loud exactly when an outage begins");
                        in_outage = true;
                        up = false;
                    }
                    _ if !up => h.probe_failed(),
                    _ => {}
                }
                let wait = h.next_probe(up, interval, random);
                let most = if up { interval * UP_PERIOD } else { interval * DOWN_PERIOD };
                let least = if up { most } else { interval };
                prop_assert!(wait >= least && wait <= most + most / 2, "{wait:?}");
            }
        }
    }
}
