use std::fmt;
use std::future::Future;
use std::time::Duration;

/// What [`ReceiptStore::begin`] found for a key.
///
/// Times are ages and remainders measured by the store's own clock (PostgreSQL's server clock;
/// the host's clock for SQLite and the in-memory store), so two callers on machines whose clocks
/// disagree still judge one lease the same way.
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{Begin, InMemoryStore, ManualClock, ReceiptStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = ManualClock::new(1_000);
/// let store = InMemoryStore::with_clock(clock.clone());
/// let lease = Duration::from_secs(30);
/// assert_eq!(store.begin("k", "fp", "me", lease).await.unwrap(), Begin::Fresh);
/// clock.advance_ms(1);
/// let again = store.begin("k", "fp", "you", lease).await.unwrap();
/// assert_eq!(again, Begin::Pending { age_ms: 1, lease_left_ms: 29_999 });
/// assert_eq!(store.begin("k", "other-args", "you", lease).await.unwrap(), Begin::Mismatch);
/// store.complete("k", "me", b"msg-4471").await.unwrap();
/// let done = store.begin("k", "fp", "you", lease).await.unwrap();
/// assert_eq!(done, Begin::Done { age_ms: 1, receipt: b"msg-4471".to_vec() });
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// No record (or this caller's own intent, recorded by an earlier try of this same `begin`):
    /// the intent is recorded and this caller executes.
    Fresh,
    /// An intent without a receipt: another caller is executing it (`lease_left_ms > 0`), or a
    /// caller crashed or gave up its lease (`lease_left_ms == 0`).
    Pending {
        /// How long ago the intent was first recorded, by the store's clock.
        age_ms: u64,
        /// How much of its executor's lease is left, by the store's clock (0: it has passed).
        lease_left_ms: u64,
    },
    /// The action completed; this is its stored receipt.
    Done {
        /// How long ago the intent was first recorded, by the store's clock.
        age_ms: u64,
        /// The encoded result.
        receipt: Vec<u8>,
    },
    /// The key was recorded with other arguments (a different fingerprint).
    Mismatch,
}

/// A stored record as a store reads it, for [`Begin::decide`]: the one place every store turns
/// a row into an answer.
///
/// ```
/// use stormguard::receipt::{Begin, Record};
///
/// let row = Record { fingerprint: "fp", owner: "me", since_ms: 1_000, lease_until_ms: 31_000, receipt: None };
/// assert_eq!(Begin::decide(Some(row), "fp", "you", 2_000), Begin::Pending { age_ms: 1_000, lease_left_ms: 29_000 });
/// assert_eq!(Begin::decide(Some(row), "fp", "me", 2_000), Begin::Fresh); // my own intent
/// assert_eq!(Begin::decide(Some(row), "other", "you", 2_000), Begin::Mismatch);
/// assert_eq!(Begin::decide(None, "fp", "you", 2_000), Begin::Fresh);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The fingerprint the intent was recorded with.
    pub fingerprint: &'a str,
    /// The caller holding the intent.
    pub owner: &'a str,
    /// When the intent was recorded (ms since the Unix epoch, store clock).
    pub since_ms: u64,
    /// Until when its owner holds it (ms since the Unix epoch, store clock).
    pub lease_until_ms: u64,
    /// The receipt, once the action completed.
    pub receipt: Option<&'a [u8]>,
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
            _ if row.fingerprint != fingerprint => Begin::Mismatch,
            Some(receipt) => Begin::Done {
                age_ms,
                receipt: receipt.to_vec(),
            },
            // A retried `begin` whose first try was recorded (a lost reply): still ours.
            None if row.owner == owner && row.lease_until_ms > now_ms => Begin::Fresh,
            None => Begin::Pending {
                age_ms,
                lease_left_ms: row.lease_until_ms.saturating_sub(now_ms),
            },
        }
    }
}

/// How an operator settles an intent whose outcome was escalated (`outcome_unknown`), after
/// checking with the provider; see [`ReceiptStore::resolve`].
///
/// ```
/// use stormguard::receipt::Resolution;
///
/// // The provider's log shows the email went out: record what it answered as the receipt.
/// let done = Resolution::Done(br#"{"message_id":"msg-4471"}"#.to_vec());
/// // Nothing went out: remove the intent, so the next attempt sends it.
/// let not_done = Resolution::NotDone;
/// assert_ne!(done, not_done);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened; these bytes (encoded as the layer's codec would) become its receipt.
    Done(Vec<u8>),
    /// The effect did not happen; the intent is removed and the next attempt executes.
    NotDone,
}

/// An intent without a receipt, as an operator's listing shows it ([`ReceiptStore::pending`]).
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{InMemoryStore, ReceiptStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = InMemoryStore::new();
/// store.begin("run-1:step-2:send:ab12", "fp", "crashed", Duration::from_secs(30)).await.unwrap();
/// let pending = store.pending(10).await.unwrap();
/// assert_eq!(pending[0].key, "run-1:step-2:send:ab12");
/// assert!(pending[0].lease_left_ms > 0); // its caller may still be running
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIntent {
    /// The action's idempotency key.
    pub key: String,
    /// How long ago the intent was recorded (store clock).
    pub age_ms: u64,
    /// What is left of its caller's lease (0: the caller is gone; a later attempt decides, or
    /// an operator settles it).
    pub lease_left_ms: u64,
}

/// What [`ReceiptStore::resolve`] found.
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{InMemoryStore, ReceiptStore, Resolution, Resolved};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = InMemoryStore::new();
/// assert_eq!(store.resolve("k", Resolution::NotDone).await.unwrap(), Resolved::NoRecord);
/// store.begin("k", "fp", "crashed", Duration::from_secs(30)).await.unwrap();
/// // The operator checked: the effect happened. Its receipt is recorded.
/// assert_eq!(store.resolve("k", Resolution::Done(b"sent".to_vec())).await.unwrap(), Resolved::Settled);
/// assert_eq!(store.resolve("k", Resolution::NotDone).await.unwrap(), Resolved::AlreadyDone);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// A pending intent was settled as asked.
    Settled,
    /// The key has a receipt already; nothing was changed.
    AlreadyDone,
    /// There is no record for the key; nothing was changed.
    NoRecord,
}

/// What a committed intent or receipt survives, for the stores that let you choose.
///
/// Both settings survive the death of the processes that use the store (`kill -9` of the agent,
/// a panic, a deploy), which is the crash a resumed agent run has to handle. They differ on a
/// crash of the machine or of the database server: a record lost there makes the next run see
/// no intent and execute again.
///
/// ```
/// use stormguard::receipt::Durability;
///
/// // Durability::Process is what the demos and benchmarks use; PowerLoss flushes every commit.
/// assert_ne!(Durability::Process, Durability::PowerLoss);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Survives the death of the client processes. SQLite: `synchronous = NORMAL` in WAL mode;
    /// the last commits may be lost on power loss or an OS crash. PostgreSQL:
    /// `synchronous_commit = off` on this store's connection; a commit returns before its WAL
    /// is flushed, so the commits of the last `3 × wal_writer_delay` (600 ms by default) are lost
    /// on any crash or immediate restart of the PostgreSQL server (a backend killed by the OOM
    /// killer restarts them all), not only on power loss.
    Process,
    /// Every commit is flushed to disk before it returns and survives power loss; slower.
    /// SQLite: `synchronous = FULL`. PostgreSQL: the connection's `synchronous_commit` is set
    /// to `on` if it is configured `off`, and kept otherwise (`on` by default; `remote_apply`
    /// waits for more from a synchronous standby, `local` and `remote_write` for less:
    /// `remote_write` waits for the standby's OS write, not its flush). Every value but `off`
    /// flushes the commit on the primary before it returns.
    PowerLoss,
}

/// A receipt store failed (I/O, a lock, a broken connection).
///
/// ```
/// use std::error::Error;
/// use stormguard::receipt::StoreError;
///
/// let io = std::io::Error::from(std::io::ErrorKind::StorageFull);
/// let err = StoreError::from_source("record the intent", io);
/// assert_eq!(err.to_string(), "receipt store: record the intent");
/// assert!(err.source().is_some());
/// ```
#[derive(Debug)]
pub struct StoreError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A store error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            source: None,
        }
    }

    /// A store error caused by `source`.
    pub fn from_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

impl StoreError {
    /// The caller no longer holds the intent of `key` (its lease passed and another caller took
    /// it over, or a receipt is there already): what every store answers then.
    pub fn not_holder(key: &str) -> Self {
        StoreError::new(format!("{key}: this caller no longer holds the intent"))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receipt store: {}", self.message)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Where intents and receipts are recorded. Every method is atomic on its own.
///
/// **One clock.** Every time is read by the store, not by its callers: a lease is given as a
/// length and judged against the store's clock, so callers on machines whose clocks disagree
/// never take over each other's live calls. `PostgresStore` uses the server's
/// `clock_timestamp()`. `SqliteStore` (WAL mode needs every process on one host) and
/// [`InMemoryStore`](super::InMemoryStore) use the host's clock, or one given to them with
/// `with_clock` (tests). What they tolerate is a step of the host clock: a step forward larger
/// than what is left of a lease ends it early, so keep leases longer than the largest step your
/// time sync may make.
///
/// `owner` is the token of the caller executing the action: only the owner of an intent
/// may release, abandon or complete it, so a caller whose lease passed cannot undo the claim of
/// the caller that took over. Implementations: [`InMemoryStore`](super::InMemoryStore),
/// `SqliteStore` (feature `sqlite`), `PostgresStore` (feature `postgres`).
///
/// ```
/// use std::time::Duration;
/// use stormguard::receipt::{Begin, InMemoryStore, ManualClock, ReceiptStore, Resolution, Resolved};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = ManualClock::new(1_000);
/// let store = InMemoryStore::with_clock(clock.clone());
/// let lease = Duration::from_millis(1_000);
/// // A caller records its intent, then crashes: its lease passes.
/// assert_eq!(store.begin("k", "fp", "crashed", lease).await.unwrap(), Begin::Fresh);
/// clock.advance_ms(500);
/// assert!(!store.claim("k", "resumed", lease).await.unwrap()); // still live
/// clock.advance_ms(500);
/// assert!(store.claim("k", "resumed", lease).await.unwrap());
/// // The crashed caller can no longer complete it; the new owner can.
/// assert!(store.complete("k", "crashed", b"r").await.is_err());
/// store.complete("k", "resumed", b"r").await.unwrap();
/// // An operator settles an escalated intent after checking with the provider.
/// store.begin("k2", "fp", "crashed", lease).await.unwrap();
/// assert_eq!(store.resolve("k2", Resolution::NotDone).await.unwrap(), Resolved::Settled);
/// assert_eq!(store.resolve("k", Resolution::NotDone).await.unwrap(), Resolved::AlreadyDone);
/// clock.advance_ms(10_000);
/// assert_eq!(store.prune(Duration::from_secs(5)).await.unwrap(), 1); // older than 5 s: removed
/// # }
/// ```
pub trait ReceiptStore: Clone + Send + Sync + 'static {
    /// Records the intent for `key`, held by `owner` for `lease`, unless a record exists; says
    /// what was there. Safe to call again after a lost reply: the caller's own live intent is
    /// [`Begin::Fresh`] again.
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Takes over a pending intent whose lease has passed, for `owner` for `lease`. `false` if
    /// its lease is live, another caller took it first, or it has a receipt.
    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives up the lease of a pending intent (the outcome is unknown; a later caller decides).
    fn release(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the receipt of `key`, if `owner` still holds its intent and it has no receipt
    /// ([`StoreError::not_holder`] otherwise).
    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes a pending intent whose call provably did not take effect.
    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles a pending intent whatever its owner and lease: for an operator who checked with
    /// the provider what became of an `outcome_unknown` call. A receipt already there is kept.
    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send;

    /// Up to `limit` intents without a receipt, oldest first: what an operator checks with the
    /// provider and settles with [`resolve`](Self::resolve).
    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingIntent>, StoreError>> + Send;

    /// Removes every record whose intent is older than `older_than` (store clock), in bounded
    /// batches so that other calls run in between; returns how many.
    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
