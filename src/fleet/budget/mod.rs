//! The fleet's retry budget: the ratio balance and the floor in Redis, a lease of retries in
//! each worker.
//!
//! A decision never waits on Redis. Each worker holds a small lease (a couple of retries' worth
//! of the shared balance, and one use of the shared floor for the current floor window) and
//! withdraws from it with one atomic; its successes are counted in one atomic and deposited in a
//! batch. One task per budget syncs with Redis every `sync_interval`, or at once when the lease
//! runs low: one script deposits the batch and tops the lease up.
//!
//! **The cap holds fleet-wide.** What sits in leases counts against `max_balance`: the script
//! keeps the sum of every live worker's lease (each sync reports what the worker still holds)
//! and holds balance plus leases at the cap, so the fleet spends at most `max_balance` plus its
//! floor, as one process would. A worker not heard from for 10 s (a live one syncs at least every
//! 2 s) is taken for dead: its lease stops counting and is lost (the fleet retries less, never
//! more). A budget dropped gives its lease back. A new budget holds nothing until its first
//! sync has answered (one round trip after it is built, started at once): a retry asked for in
//! that moment is refused, never granted on a guess (`RetryBudget::fleet_ready` waits for it).
//!
//! Leases are held, not handed back when a worker goes quiet: an agent whose failures come tens
//! of seconds apart would otherwise find its lease empty at every one. The price is what sits in
//! quiet workers' leases: up to `workers × fleet_lease` retries of the balance, which the others
//! cannot spend (keep it well below `max_balance`: 8 workers × 2 of 100 by default), and one
//! floor use per worker until its floor window ends (with more workers than the floor has uses,
//! the first workers to ask hold them). Both err toward fewer retries, never more.
//!
//! **A sync is applied once.** A sync that times out may still run in Redis: its batch is sent
//! again, first, with the same id, and the script answers a repeated id from memory (see
//! [`outbox`](super::outbox)), so 10 successes are 10 deposits however late Redis answers.

mod handle;
mod sync;

pub(super) use sync::Ask;

use super::link::{Failed, Link};
use super::scripts;
use crate::budget::balance::{Balance, BalanceTerms};
use crate::telemetry::FLEET_LOCAL;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// One worker's lease on the fleet's budget.
pub(crate) struct Lease {
    link: Arc<Link>,
    /// The budget's hash, its leases by worker, when each worker was last heard from, and this
    /// lease's last sync (what the script remembers to answer a sync sent again).
    keys: [String; 4],
    pub(crate) name: String,
    terms: BalanceTerms,
    /// The milli-retries this worker keeps leased.
    lease: i64,
    /// Successes not yet deposited.
    pending: AtomicU64,
    /// Milli-retries of the shared balance held here.
    balance: AtomicI64,
    /// Uses of the shared floor held here, valid until `floor_until`.
    floor: AtomicU32,
    floor_until: AtomicU64,
    epoch: Instant,
    wake: Notify,
    /// Whether a sync has answered since the budget was built (until then the lease is empty).
    synced: AtomicBool,
    synced_now: Notify,
    /// When the last sync answered (`now()`), for the heartbeat.
    last_sync: AtomicU64,
}

/// A worker not heard from for this long is taken for dead by the others, and its lease stops
/// counting against the cap.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(10);
/// A live worker syncs at least this often, even with nothing to deposit or take.
const HEARTBEAT: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.keys[0])
            .field("balance", &self.balance.load(Ordering::Relaxed))
            .field("floor", &self.floor.load(Ordering::Relaxed))
            .finish()
    }
}

impl Lease {
    /// A lease on the budget `name`, and its sync task.
    pub(crate) fn start(
        fleet: &super::Fleet,
        name: &str,
        terms: BalanceTerms,
        lease: i64,
        handle: &tokio::runtime::Handle,
    ) -> Arc<Lease> {
        let lease = Lease::new(fleet, name, terms, lease);
        handle.spawn(sync::sync_task(lease.clone()));
        lease
    }

    /// A lease on the budget `name`, without its sync task.
    pub(super) fn new(
        fleet: &super::Fleet,
        name: &str,
        terms: BalanceTerms,
        lease: i64,
    ) -> Arc<Lease> {
        let link = &fleet.link;
        let lease = Arc::new(Lease {
            link: link.clone(),
            keys: [
                link.key("budget", name),
                link.key("budget-leases", name),
                link.key("budget-seen", name),
                format!(
                    "{}:{}:{:016x}",
                    link.key("budget-sync", name),
                    link.worker(),
                    super::link::random()
                ),
            ],
            name: name.to_string(),
            terms,
            lease,
            pending: AtomicU64::new(0),
            balance: AtomicI64::new(0),
            floor: AtomicU32::new(0),
            floor_until: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: Notify::new(),
            synced: AtomicBool::new(false),
            synced_now: Notify::new(),
            last_sync: AtomicU64::new(0),
        });
        link.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .budgets
            .insert(name.to_string());
        lease
    }

    /// The fleet's link (for the status read).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// Waits until the first sync has answered, at most `limit`; says whether it did.
    pub(crate) async fn wait_synced(&self, limit: Duration) -> bool {
        let synced = self.synced_now.notified();
        if self.synced.load(Ordering::Acquire) {
            return true;
        }
        let _ = tokio::time::timeout(limit, synced).await;
        self.synced.load(Ordering::Acquire)
    }

    /// Milli-retries of the lease held here now.
    pub(crate) fn held(&self) -> i64 {
        self.balance.load(Ordering::Acquire)
    }

    /// Asks Redis for one retry of `cost` now, the floor if the balance cannot pay: the exact
    /// path, one round trip per decision (what the lease saves).
    pub(crate) async fn withdraw_now(&self, cost: i64) -> Result<bool, Failed> {
        let ask = Ask {
            want: cost,
            want_floor: 1,
            exact: true,
            held: self.held(),
            ..Ask::default()
        };
        // No id: the exact path is never sent twice.
        let (granted, floor, _, _): (i64, i64, i64, i64) =
            self.link.eval(&self.invocation(ask, None)).await?;
        Ok(granted >= cost || floor > 0)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn invocation(&self, ask: Ask, id: Option<u64>) -> redis::ScriptInvocation<'static> {
        let mut invocation = scripts::BUDGET.key(&self.keys[0]);
        invocation
            .key(&self.keys[1])
            .key(&self.keys[2])
            .key(&self.keys[3])
            .arg(ask.deposit)
            .arg(ask.give_back)
            .arg(ask.want)
            .arg(ask.want_floor)
            .arg(self.terms.max)
            .arg(self.terms.floor)
            .arg(self.terms.floor_window.as_millis() as u64)
            .arg(u8::from(ask.exact))
            .arg(self.link.worker())
            .arg(ask.held)
            .arg(LEASE_TTL.as_millis() as u64)
            .arg(id.map_or(String::new(), |id| id.to_string()))
            .arg(u8::from(ask.closing));
        invocation
    }
}

/// The fleet's side of the budget: what the budget takes from and deposits into while the fleet
/// is up.
impl Balance for Lease {
    /// One success, deposited with the next batch (one atomic add).
    #[inline]
    fn deposit(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes `cost` milli-retries from the lease.
    fn take(&self, cost: i64) -> bool {
        let taken = self
            .balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b >= cost).then_some(b - cost)
            });
        match taken {
            Ok(before) => {
                if before - cost < self.lease {
                    self.wake.notify_one();
                }
                true
            }
            Err(_) => {
                self.wake.notify_one();
                false
            }
        }
    }

    /// Takes one use of the fleet's floor, if this worker holds one for the current window.
    fn take_floor(&self) -> bool {
        if self.now() >= self.floor_until.load(Ordering::Acquire) {
            self.floor.store(0, Ordering::Release);
        }
        let taken = self
            .floor
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        self.wake.notify_one();
        taken
    }

    /// Whether decisions go through the fleet now.
    #[inline]
    fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// Counts a decision taken locally because the fleet is down.
    fn note_local(&self) {
        metrics::counter!(FLEET_LOCAL, "part" => "budget").increment(1);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
