pub use super::record::{InDoubt, Record};
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
/// assert_eq!(store.begin("k", "other-args", "you", lease).await.unwrap(), Begin::Mismatch { done: false });
/// store.complete("k", "me", b"msg-4471").await.unwrap();
/// let done = store.begin("k", "fp", "you", lease).await.unwrap();
/// assert_eq!(done, Begin::Done { age_ms: 1, receipt: b"msg-4471".to_vec() });
/// # }
/// ```
#[non_exhaustive]
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
    Mismatch {
        /// Whether the action recorded under the key has its receipt (it completed); `false`:
        /// it is still pending.
        done: bool,
    },
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
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened; these bytes (encoded as the layer's codec would) become its receipt.
    Done(Vec<u8>),
    /// The effect did not happen; the intent is removed and the next attempt executes.
    NotDone,
}

/// An intent without a receipt, as an operator's listing shows it ([`ReceiptStore::pending`]).
///
/// **Check with the provider only once `may_still_land_for_ms` is 0.** Before that, a request
/// of this intent may still land (its caller holds the lease and may still send, or an attempt
/// timed out and its request may still commit), so an empty provider log proves nothing, and
/// [`ReceiptStore::resolve`] refuses a [`Resolution::NotDone`] with [`Resolved::InFlight`].
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
/// assert!(pending[0].may_still_land_for_ms > 0); // so do not settle it yet
/// # }
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIntent {
    /// The action's idempotency key.
    pub key: String,
    /// How long ago the intent was first recorded, by the first attempt (store clock).
    pub age_ms: u64,
    /// How long ago its last attempt was sent (store clock): the moment an attempt that ended
    /// in doubt was sent, or, for an attempt running (or crashed), when it took the intent.
    pub last_sent_ms_ago: u64,
    /// What is left of its caller's lease (0: the caller is gone or gave it up; a later attempt
    /// decides, or an operator settles it).
    pub lease_left_ms: u64,
    /// How long a request of this intent may still land at the provider: the lease left, or
    /// the in-flight bound after the send of an attempt that ended in doubt, whichever is
    /// later. Settle it only once this is 0.
    pub may_still_land_for_ms: u64,
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
/// // A caller holds this one's lease: it may still send, so "not done" is refused.
/// store.begin("k2", "fp", "running", Duration::from_secs(30)).await.unwrap();
/// assert!(matches!(store.resolve("k2", Resolution::NotDone).await.unwrap(), Resolved::InFlight { .. }));
/// # }
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// A pending intent was settled as asked.
    Settled,
    /// The key has a receipt already; nothing was changed.
    AlreadyDone,
    /// There is no record for the key; nothing was changed.
    NoRecord,
    /// A [`Resolution::NotDone`] refused, nothing changed: a request of this intent may still
    /// land at the provider for this long (its caller holds the lease, or an attempt that
    /// ended in doubt is within its in-flight bound). An empty provider log proves nothing
    /// yet: check again once it has passed.
    InFlight {
        /// How long it may still land (store clock).
        may_land_for_ms: u64,
    },
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
#[non_exhaustive]
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
/// clock.advance_ms(1_000); // its caller's lease has passed: nothing of it can still land
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
    /// With `in_doubt`, the attempt's request was sent and may still land: the store records
    /// when it was sent and until when it may land (the later of that and any earlier bound),
    /// which [`pending`](Self::pending) shows and [`resolve`](Self::resolve) honours.
    fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<InDoubt>,
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

    /// Settles a pending intent whatever its owner: for an operator who checked with the
    /// provider what became of an `outcome_unknown` call. A receipt already there is kept. A
    /// [`Resolution::NotDone`] is refused ([`Resolved::InFlight`]) while a request of the intent
    /// may still land ([`Record::may_land_for_ms`]): its caller's lease is live, or an attempt
    /// that ended in doubt is within its in-flight bound. `Done` is recorded at any time.
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
