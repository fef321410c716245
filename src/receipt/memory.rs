use super::clock::{Clock, StoreClock};
use super::store::{
    Begin, InDoubt, PendingIntent, ReceiptStore, Record, Resolution, Resolved, StoreError,
};
use std::collections::HashMap;
use std::fmt;
use std::future::{ready, Future};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Shards: a call locks one of them, for one map operation; a prune locks them one at a time.
const SHARDS: usize = 64;

struct Row {
    fingerprint: Box<str>,
    owner: Box<str>,
    since_ms: u64,
    lease_until_ms: u64,
    receipt: Option<Box<[u8]>>,
    taken_ms: u64,
    sent_ms: Option<u64>,
    lands_by_ms: u64,
}

impl Row {
    fn record(&self) -> Record<'_> {
        Record {
            fingerprint: &self.fingerprint,
            owner: &self.owner,
            since_ms: self.since_ms,
            lease_until_ms: self.lease_until_ms,
            receipt: self.receipt.as_deref(),
            taken_ms: self.taken_ms,
            sent_ms: self.sent_ms,
            lands_by_ms: self.lands_by_ms,
        }
    }
}

type Shard = Mutex<HashMap<Box<str>, Row>>;

/// The receipt table: rows in shards, each behind its own lock, and the store's clock.
struct Table {
    shards: Box<[Shard]>,
    hasher: RandomState,
    clock: StoreClock,
}

/// A receipt store in memory: for tests and single-process tools. Nothing survives the process.
///
/// The table is split in 64 shards, each behind its own lock held for one map operation, so a
/// large table never stalls the runtime; [`prune`](ReceiptStore::prune) takes the shards one at
/// a time, yields between them, and gives the memory of what it removed back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use stormguard::receipt::{Begin, InMemoryStore, ReceiptStore};
///
/// let store = InMemoryStore::new();
/// let lease = Duration::from_secs(1);
/// assert_eq!(store.begin("k", "fp", "me", lease).await.unwrap(), Begin::Fresh);
/// store.complete("k", "me", b"sent").await.unwrap();
/// assert!(matches!(store.begin("k", "fp", "you", lease).await.unwrap(), Begin::Done { .. }));
/// assert_eq!(store.begin("k", "other", "you", lease).await.unwrap(), Begin::Mismatch { done: true });
/// assert_eq!(store.len(), 1);
/// # }
/// ```
#[derive(Clone)]
pub struct InMemoryStore {
    shared: Arc<Table>,
}

impl Default for InMemoryStore {
    fn default() -> Self {
        InMemoryStore {
            shared: Arc::new(Table {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: RandomState::new(),
                clock: StoreClock::default(),
            }),
        }
    }
}

impl InMemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store judging leases and ages by `clock` (tests: a
    /// [`ManualClock`](super::ManualClock)).
    pub fn with_clock(clock: impl Clock) -> Self {
        InMemoryStore {
            shared: Arc::new(Table {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: RandomState::new(),
                clock: StoreClock::of(clock),
            }),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<Box<str>, Row>> {
        let i = (self.shared.hasher.hash_one(key) as usize) % SHARDS;
        lock(&self.shared.shards[i])
    }

    fn now(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn until(now: u64, lease: Duration) -> u64 {
    now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
}

impl fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("records", &self.len())
            .finish()
    }
}

impl ReceiptStore for InMemoryStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let now = self.now();
        let mut rows = self.shard(key);
        let begin = match rows.get(key) {
            Some(row) => Begin::decide(Some(row.record()), fingerprint, owner, now),
            None => {
                rows.insert(
                    key.into(),
                    Row {
                        fingerprint: fingerprint.into(),
                        owner: owner.into(),
                        since_ms: now,
                        lease_until_ms: until(now, lease),
                        receipt: None,
                        taken_ms: now,
                        sent_ms: None,
                        lands_by_ms: 0,
                    },
                );
                Begin::Fresh
            }
        };
        ready(Ok(begin))
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let now = self.now();
        let claimed = match self.shard(key).get_mut(key) {
            Some(row) if row.receipt.is_none() && row.lease_until_ms <= now => {
                row.owner = owner.into();
                row.lease_until_ms = until(now, lease);
                row.taken_ms = now;
                true
            }
            _ => false,
        };
        ready(Ok(claimed))
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let now = self.now();
        if let Some(row) = self.shard(key).get_mut(key) {
            if row.receipt.is_none() && &*row.owner == owner {
                row.lease_until_ms = row.lease_until_ms.min(now);
                if let Some(doubt) = in_doubt {
                    let (sent, lands_by) = doubt.at(now);
                    row.sent_ms = Some(sent);
                    row.lands_by_ms = row.lands_by_ms.max(lands_by);
                }
            }
        }
        ready(Ok(()))
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let result = match self.shard(key).get_mut(key) {
            Some(row) if row.receipt.is_none() && &*row.owner == owner => {
                row.receipt = Some(receipt.into());
                Ok(())
            }
            _ => Err(StoreError::not_holder(key)),
        };
        ready(result)
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut rows = self.shard(key);
        if rows
            .get(key)
            .is_some_and(|row| row.receipt.is_none() && &*row.owner == owner)
        {
            rows.remove(key);
        }
        ready(Ok(()))
    }

    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        let now = self.now();
        let mut rows = self.shard(key);
        let resolved = match rows.get_mut(key) {
            None => Resolved::NoRecord,
            Some(row) => match (row.record().resolve(&resolution, now), resolution) {
                (Resolved::Settled, Resolution::Done(receipt)) => {
                    row.receipt = Some(receipt.into());
                    Resolved::Settled
                }
                (Resolved::Settled, Resolution::NotDone) => {
                    rows.remove(key);
                    Resolved::Settled
                }
                (refused, _) => refused,
            },
        };
        ready(Ok(resolved))
    }

    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingIntent>, StoreError>> + Send {
        let now = self.now();
        let mut out: Vec<(u64, PendingIntent)> = Vec::new();
        for shard in self.shared.shards.iter() {
            out.extend(
                lock(shard)
                    .iter()
                    .filter(|(_, r)| r.receipt.is_none())
                    .map(|(k, r)| (r.since_ms, r.record().pending(k.to_string(), now))),
            );
        }
        // Oldest first, as the SQL stores order them.
        out.sort_by(|(a, pa), (b, pb)| a.cmp(b).then_with(|| pa.key.cmp(&pb.key)));
        out.truncate(limit);
        ready(Ok(out.into_iter().map(|(_, p)| p).collect()))
    }

    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let this = self.clone();
        async move {
            let cut = this
                .now()
                .saturating_sub(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX));
            let mut removed = 0u64;
            for shard in this.shared.shards.iter() {
                {
                    let mut rows = lock(shard);
                    let before = rows.len();
                    rows.retain(|_, row| row.since_ms >= cut);
                    removed += (before - rows.len()) as u64;
                    if rows.capacity() > 2 * rows.len() + 16 {
                        rows.shrink_to_fit();
                    }
                }
                tokio::task::yield_now().await;
            }
            Ok(removed)
        }
    }
}
