use std::fmt;
use std::future::Future;

/// What [`ReceiptStore::begin`] found for a key.
///
/// ```
/// use stormguard::receipt::{Begin, InMemoryStore, ReceiptStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = InMemoryStore::new();
/// let (now, lease) = (1_000, 31_000);
/// assert_eq!(store.begin("k", "fp", "me", now, lease).await.unwrap(), Begin::Fresh);
/// let again = store.begin("k", "fp", "you", now + 1, lease).await.unwrap();
/// assert_eq!(again, Begin::Pending { since_ms: now, lease_until_ms: lease });
/// assert_eq!(store.begin("k", "other-args", "you", now + 2, lease).await.unwrap(), Begin::Mismatch);
/// store.complete("k", "me", b"msg-4471", now + 3).await.unwrap();
/// let done = store.begin("k", "fp", "you", now + 4, lease).await.unwrap();
/// assert_eq!(done, Begin::Done { since_ms: now, receipt: b"msg-4471".to_vec() });
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// No record: the intent is recorded now and this caller executes.
    Fresh,
    /// An intent without a receipt: another caller is executing it (its lease is live), or a
    /// caller crashed (its lease has passed).
    Pending {
        /// When the intent was first recorded (ms since the Unix epoch).
        since_ms: u64,
        /// Until when its executor holds it (ms since the Unix epoch).
        lease_until_ms: u64,
    },
    /// The action completed; this is its stored receipt.
    Done {
        /// When the intent was first recorded (ms since the Unix epoch).
        since_ms: u64,
        /// The encoded result.
        receipt: Vec<u8>,
    },
    /// The key was recorded with other arguments (a different fingerprint).
    Mismatch,
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
    /// SQLite: `synchronous = FULL`. PostgreSQL: the connection keeps the server's
    /// `synchronous_commit` (`on` by default, or a stronger `remote_write` / `remote_apply`),
    /// and is raised to `on` only if it is configured `off`.
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
/// Times are milliseconds since the Unix epoch, given by the caller (so tests can use a manual
/// clock). `owner` is the token of the caller executing the action: only the owner of an intent
/// may release, abandon or complete it, so a caller whose lease passed cannot undo the claim of
/// the caller that took over. Implementations: [`InMemoryStore`](super::InMemoryStore),
/// `SqliteStore` (feature `sqlite`), `PostgresStore` (feature `postgres`).
///
/// ```
/// use stormguard::receipt::{Begin, InMemoryStore, ReceiptStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = InMemoryStore::new();
/// // A caller records its intent, then crashes: its lease passes.
/// assert_eq!(store.begin("k", "fp", "crashed", 0, 1_000).await.unwrap(), Begin::Fresh);
/// // A resumed caller finds the intent pending and takes it over once the lease has passed.
/// assert!(!store.claim("k", "resumed", 500, 2_000).await.unwrap());
/// assert!(store.claim("k", "resumed", 1_000, 2_000).await.unwrap());
/// // The crashed caller can no longer complete it; the new owner can.
/// assert!(store.complete("k", "crashed", b"r", 1_100).await.is_err());
/// store.complete("k", "resumed", b"r", 1_200).await.unwrap();
/// assert_eq!(store.prune(1).await.unwrap(), 1); // older than 1 ms since the epoch: removed
/// # }
/// ```
pub trait ReceiptStore: Clone + Send + Sync + 'static {
    /// Records the intent for `key` unless a record exists; says what was there.
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Takes over a pending intent whose lease has passed (`lease_until_ms <= now_ms`) for
    /// `owner` until `lease_until_ms`. `false` if another caller took it first or it has a receipt.
    fn claim(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives up the lease of a pending intent (the outcome is unknown; a later caller decides).
    fn release(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the receipt of `key`, if `owner` still holds its intent and it has no receipt.
    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes a pending intent whose call provably did not take effect.
    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Removes every record whose intent is older than `before_ms`; returns how many.
    fn prune(&self, before_ms: u64) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
