//! The budget's sync against lost answers, on the real Redis at `STORMGUARD_REDIS_URL` (skipped,
//! and said so, when it is unset): a worker deposits, spends from its lease and syncs, and any
//! sync may meet a timeout whose script Redis ran anyway (a late answer) or never ran (a lost
//! call). However the answers go, once the worker has synced with every answer back, what the
//! fleet holds plus what the worker spent is exactly what its successes deposited: every deposit
//! applied once, none twice, none lost.
//!
//! It drives the lease's own sync (the outbox and the script), not a copy of it; only the task
//! that would call it on a timer is left out, so each sync meets the fault the case chose.

use super::budget::{Lease, LEASE_TTL};
use super::link::Fault;
use super::outbox::Outbox;
use super::Fleet;
use crate::budget::balance::{Balance, BalanceTerms as Terms};
use proptest::prelude::*;
use std::time::Duration;

fn redis_url() -> Option<String> {
    super::scripts_props::redis_url()
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![2 => Just(Fault::None), 1 => Just(Fault::LateAnswer), 1 => Just(Fault::Lost)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_deposit_is_applied_once_however_the_answers_go(
        lease_retries in 0i64..=3,
        steps in prop::collection::vec((0u64..=6, 0i64..=100, fault()), 1..24),
    ) {
        let Some(url) = redis_url() else { return Ok(()) };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (made, held_here, spent, status) = rt.block_on(async {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let fleet = Fleet::builder(url.as_str())
                .prefix(format!("stormguard-test:sync-props:{}:{nanos}", std::process::id()))
                .worker("w0")
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            assert!(fleet.wait_up(Duration::from_secs(5)).await, "Redis answers");
            let terms = Terms {
                deposit: 1_000,
                // Far above what the cases deposit: the cap never clips, so the books balance.
                max: 1_000_000,
                floor: 0,
                floor_window: Duration::from_secs(60),
            };
            let lease = Lease::new(&fleet, "b", terms, lease_retries * 1_000);
            let mut outbox = Outbox::new();
            let (mut made, mut spent) = (0i64, 0i64);
            for (successes, spend_pct, fault) in &steps {
                for _ in 0..*successes {
                    lease.deposit();
                }
                made += *successes as i64 * 1_000;
                let cost = lease.held() * spend_pct / 100;
                if cost > 0 && lease.take(cost) {
                    spent += cost;
                }
                fleet.link.faults.lock().unwrap().push_back(*fault);
                // The probe would bring the fleet back after a timeout; here, at once.
                fleet.link.came_up();
                let _ = lease.sync(&mut outbox, false).await;
            }
            // Then a sync whose answers come (a fault a quiet step left unused is dropped).
            fleet.link.faults.lock().unwrap().clear();
            fleet.link.came_up();
            lease.sync(&mut outbox, false).await.expect("a sync with its answer");
            assert!(outbox.unanswered().is_none());
            let status = super::status::budget(&fleet.link, "b", LEASE_TTL).await.unwrap();
            (made, lease.held(), spent, status)
        });
        let milli = |retries: f64| (retries * 1_000.0).round() as i64;
        prop_assert_eq!(
            milli(status.balance) + milli(status.leased) + spent,
            made,
            "balance {} + leased {} + spent {} milli-retries against {} deposited",
            status.balance, status.leased, spent, made
        );
        prop_assert_eq!(status.leases.get("w0").copied().map_or(0, milli), held_here);
    }
}
