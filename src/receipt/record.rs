//! A stored record as every store reads it, and the answers made of it: [`Begin::decide`],
//! [`Record::pending`], [`Record::resolve`]. One place turns a row into an answer, so the three
//! stores cannot disagree; the stores only read the row and carry the answer out.

use super::store::{Begin, PendingIntent, Resolution, Resolved};
use std::time::Duration;

/// A stored record as a store reads it, for [`Begin::decide`] and [`Record::pending`]: the one
/// place every store turns a row into an answer.
///
/// Every remainder it computes is clamped to the length it was granted for, so a store clock
/// (or a second handle's clock) stepped back never lengthens a lease or an in-flight bound: an
/// hour's step back shows at most the 5 s of a 5 s lease, not 3,605 s. (A step forward ends
/// them early; keep leases longer than the largest step your time sync makes.)
///
/// ```
/// use stormguard::receipt::{Begin, Record};
///
/// let row = Record {
///     fingerprint: "fp", owner: "me", since_ms: 1_000, lease_until_ms: 31_000, receipt: None,
///     taken_ms: 1_000, sent_ms: None, lands_by_ms: 0,
/// };
/// assert_eq!(Begin::decide(Some(row), "fp", "you", 2_000), Begin::Pending { age_ms: 1_000, lease_left_ms: 29_000 });
/// assert_eq!(Begin::decide(Some(row), "fp", "me", 2_000), Begin::Fresh); // my own intent
/// assert_eq!(Begin::decide(Some(row), "other", "you", 2_000), Begin::Mismatch { done: false });
/// assert_eq!(Begin::decide(None, "fp", "you", 2_000), Begin::Fresh);
/// // Read on a clock far behind the one that granted it: never more than the 30 s lease.
/// assert_eq!(row.lease_left_ms(0), 30_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The fingerprint the intent was recorded with.
    pub fingerprint: &'a str,
    /// The caller holding the intent.
    pub owner: &'a str,
    /// When the intent was first recorded (ms since the Unix epoch, store clock).
    pub since_ms: u64,
    /// Until when its owner holds it (ms since the Unix epoch, store clock).
    pub lease_until_ms: u64,
    /// The receipt, once the action completed.
    pub receipt: Option<&'a [u8]>,
    /// When its owner took it (its `begin` or `claim`, store clock): the lease was granted for
    /// `lease_until_ms - taken_ms`. A record written before this was kept reads `since_ms`.
    pub taken_ms: u64,
    /// When the request of the last attempt that ended in doubt was sent (store clock), if one
    /// did ([`ReceiptStore::release`](super::ReceiptStore::release) with an [`InDoubt`]).
    pub sent_ms: Option<u64>,
    /// Until when that request may still land at the provider (store clock; 0: none in doubt).
    pub lands_by_ms: u64,
}

impl Record<'_> {
    /// What is left of the owner's lease at `now`, at most the length it was granted for.
    pub fn lease_left_ms(&self, now_ms: u64) -> u64 {
        let granted = self.lease_until_ms.saturating_sub(self.taken_ms);
        self.lease_until_ms.saturating_sub(now_ms).min(granted)
    }

    /// How long a request of this intent may still land at the provider: while its owner holds
    /// the lease it may still send; after an attempt ended in doubt, until the in-flight bound
    /// after that attempt's send has passed (each clamped as above). 0 once neither holds, and
    /// for a record with a receipt.
    pub fn may_land_for_ms(&self, now_ms: u64) -> u64 {
        if self.receipt.is_some() {
            return 0;
        }
        let in_flight = match self.sent_ms {
            Some(sent) => {
                let bound = self.lands_by_ms.saturating_sub(sent);
                self.lands_by_ms.saturating_sub(now_ms).min(bound)
            }
            None => 0,
        };
        self.lease_left_ms(now_ms).max(in_flight)
    }

    /// The record as an operator's listing shows it
    /// ([`ReceiptStore::pending`](super::ReceiptStore::pending)).
    pub fn pending(&self, key: String, now_ms: u64) -> PendingIntent {
        let last_sent = self
            .sent_ms
            .map_or(self.taken_ms, |sent| sent.max(self.taken_ms));
        PendingIntent {
            key,
            age_ms: now_ms.saturating_sub(self.since_ms),
            last_sent_ms_ago: now_ms.saturating_sub(last_sent),
            lease_left_ms: self.lease_left_ms(now_ms),
            may_still_land_for_ms: self.may_land_for_ms(now_ms),
        }
    }

    /// What a [`ReceiptStore::resolve`](super::ReceiptStore::resolve) of this record at `now`
    /// does: [`Resolved::Settled`] if it may go ahead, else what it answers instead
    /// (`AlreadyDone`, or `InFlight` for a `NotDone` while a request may still land).
    pub fn resolve(&self, resolution: &Resolution, now_ms: u64) -> Resolved {
        if self.receipt.is_some() {
            return Resolved::AlreadyDone;
        }
        match (resolution, self.may_land_for_ms(now_ms)) {
            (Resolution::NotDone, may_land_for_ms @ 1..) => Resolved::InFlight { may_land_for_ms },
            _ => Resolved::Settled,
        }
    }
}

/// An attempt that ended in doubt (an ambiguous failure, a call dropped after its send): its
/// request may still land at the provider. Given to
/// [`ReceiptStore::release`](super::ReceiptStore::release), which records when it was sent and
/// until when it may land, so that [`ReceiptStore::pending`](super::ReceiptStore::pending) shows
/// it and [`ReceiptStore::resolve`](super::ReceiptStore::resolve) refuses a `NotDone` until then.
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{InDoubt, InMemoryStore, ManualClock, ReceiptStore, Resolution, Resolved};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = ManualClock::new(1_000_000);
/// let store = InMemoryStore::with_clock(clock.clone());
/// store.begin("k", "fp", "me", Duration::from_secs(30)).await.unwrap();
/// clock.advance_ms(2_000);
/// // Sent 2 s ago, timed out now; it may land up to 30 s after its send.
/// let doubt = InDoubt { sent_ago: Duration::from_secs(2), lands_within: Duration::from_secs(30) };
/// store.release("k", "me", Some(doubt)).await.unwrap();
/// let listed = &store.pending(10).await.unwrap()[0];
/// assert_eq!((listed.lease_left_ms, listed.may_still_land_for_ms, listed.last_sent_ms_ago), (0, 28_000, 2_000));
/// assert_eq!(store.resolve("k", Resolution::NotDone).await.unwrap(), Resolved::InFlight { may_land_for_ms: 28_000 });
/// clock.advance_ms(28_000);
/// assert_eq!(store.resolve("k", Resolution::NotDone).await.unwrap(), Resolved::Settled);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InDoubt {
    /// How long ago the request was handed to the provider.
    pub sent_ago: Duration,
    /// How long after its send it may still land: the layer's lease, the in-flight bound.
    pub lands_within: Duration,
}

impl InDoubt {
    /// `(sent_ms, lands_by_ms)` at the store's time `now_ms`.
    pub fn at(&self, now_ms: u64) -> (u64, u64) {
        let sent =
            now_ms.saturating_sub(u64::try_from(self.sent_ago.as_millis()).unwrap_or(u64::MAX));
        let within = u64::try_from(self.lands_within.as_millis()).unwrap_or(u64::MAX);
        (sent, sent.saturating_add(within))
    }
}

impl Begin {
    /// What `begin` answers for the record found (`None`: there was none and one was inserted)
    /// at the store's time `now_ms`.
    pub fn decide(found: Option<Record<'_>>, fingerprint: &str, owner: &str, now_ms: u64) -> Begin {
        let Some(row) = found else {
            return Begin::Fresh;
        };
        let age_ms = now_ms.saturating_sub(row.since_ms);
        match row.receipt {
            _ if row.fingerprint != fingerprint => Begin::Mismatch {
                done: row.receipt.is_some(),
            },
            Some(receipt) => Begin::Done {
                age_ms,
                receipt: receipt.to_vec(),
            },
            // A retried `begin` whose first try was recorded (a lost reply): still ours.
            None if row.owner == owner && row.lease_until_ms > now_ms => Begin::Fresh,
            None => Begin::Pending {
                age_ms,
                lease_left_ms: row.lease_left_ms(now_ms),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    prop_compose! {
        /// A record taken at `taken` with a lease of `lease`, maybe released at `released`, maybe
        /// with an attempt in doubt sent at `sent` that may land for `within`; read at `now`
        /// (anywhere: a clock behind, on time or ahead).
        fn case()(
            since in 0u64..1_000_000,
            after in 0u64..1_000_000,
            lease in 1u64..100_000,
            released in proptest::option::of(0u64..200_000),
            doubt in proptest::option::of((0u64..200_000, 1u64..100_000)),
            now in 0u64..3_000_000,
        ) -> (u64, u64, u64, u64, Option<u64>, u64, u64, u64) {
            let taken = since + after;
            let mut until = taken + lease;
            if let Some(r) = released {
                until = until.min(taken + r);
            }
            let (sent, lands_by, within) = match doubt {
                Some((ago, within)) => (Some(taken + ago), taken + ago + within, within),
                None => (None, 0, 0),
            };
            (since, taken, lease, until, sent, lands_by, within, now)
        }
    }

    proptest! {
        /// Against the plain remainders a clock on time would give: equal whenever the clock is
        /// not behind the moment the lease (or the send) was granted; never longer than the
        /// length granted, whatever the clock says; 0 once passed.
        #[test]
        fn remainders_are_clamped_to_what_was_granted(c in case()) {
            let (since, taken, lease, until, sent, lands_by, within, now) = c;
            let r = Record {
                fingerprint: "fp", owner: "me", since_ms: since, lease_until_ms: until,
                receipt: None, taken_ms: taken, sent_ms: sent, lands_by_ms: lands_by,
            };
            let lease_left = r.lease_left_ms(now);
            prop_assert!(lease_left <= lease);
            if now >= taken {
                prop_assert_eq!(lease_left, until.saturating_sub(now));
            }
            let may_land = r.may_land_for_ms(now);
            prop_assert!(may_land >= lease_left);
            prop_assert!(may_land <= lease.max(within));
            match sent {
                Some(s) if now >= s => {
                    prop_assert_eq!(may_land, lease_left.max(lands_by.saturating_sub(now)));
                }
                None => prop_assert_eq!(may_land, lease_left),
                _ => {}
            }
            // Settling "not done" is refused exactly while something may still land.
            let refused = matches!(r.resolve(&Resolution::NotDone, now), Resolved::InFlight { .. });
            prop_assert_eq!(refused, may_land > 0);
            prop_assert_eq!(r.resolve(&Resolution::Done(vec![]), now), Resolved::Settled);
            let listed = r.pending("k".into(), now);
            prop_assert_eq!(listed.age_ms, now.saturating_sub(since));
            prop_assert_eq!(listed.may_still_land_for_ms, may_land);
        }
    }
}
