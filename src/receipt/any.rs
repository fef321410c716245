//! [`AnyStore`]: one of the stores this crate ships, chosen at run time (a tool table names a
//! store by its kind).

use super::store::{Begin, InDoubt, PendingIntent, ReceiptStore, Resolution, Resolved, StoreError};
use super::InMemoryStore;
#[cfg(feature = "postgres")]
use super::PostgresStore;
#[cfg(feature = "sqlite")]
use super::SqliteStore;
use std::time::Duration;

/// One of the receipt stores this crate ships, chosen at run time: what a
/// [`Toolbox`](crate::tool::Toolbox) built from a file holds, since the file names each store
/// by its kind. Made from a store with `From`; every call goes to the store it holds.
///
/// ```
/// use stormguard::receipt::{AnyStore, InMemoryStore, ReceiptStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = AnyStore::from(InMemoryStore::new());
/// assert_eq!(store.kind(), "memory");
/// assert!(store.pending(10).await.unwrap().is_empty());
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// [`InMemoryStore`].
    Memory(InMemoryStore),
    /// [`SqliteStore`] (feature `sqlite`).
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// [`PostgresStore`] (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

impl AnyStore {
    /// The store's kind as a tool table names it: `memory`, `sqlite` or `postgres`.
    ///
    /// ```
    /// use stormguard::receipt::{AnyStore, InMemoryStore};
    /// assert_eq!(AnyStore::from(InMemoryStore::new()).kind(), "memory");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "memory",
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(_) => "postgres",
        }
    }
}

impl From<InMemoryStore> for AnyStore {
    fn from(store: InMemoryStore) -> Self {
        AnyStore::Memory(store)
    }
}

#[cfg(feature = "sqlite")]
impl From<SqliteStore> for AnyStore {
    fn from(store: SqliteStore) -> Self {
        AnyStore::Sqlite(store)
    }
}

#[cfg(feature = "postgres")]
impl From<PostgresStore> for AnyStore {
    fn from(store: PostgresStore) -> Self {
        AnyStore::Postgres(store)
    }
}

/// Calls `$call` on the store `$self` holds, awaited.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call.await,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $call.await,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $call.await,
        }
    };
}

impl ReceiptStore for AnyStore {
    async fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        each!(self, s => s.begin(key, fingerprint, owner, lease))
    }

    async fn claim(&self, key: &str, owner: &str, lease: Duration) -> Result<bool, StoreError> {
        each!(self, s => s.claim(key, owner, lease))
    }

    async fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<InDoubt>,
    ) -> Result<(), StoreError> {
        each!(self, s => s.release(key, owner, in_doubt))
    }

    async fn complete(&self, key: &str, owner: &str, receipt: &[u8]) -> Result<(), StoreError> {
        each!(self, s => s.complete(key, owner, receipt))
    }

    async fn abandon(&self, key: &str, owner: &str) -> Result<(), StoreError> {
        each!(self, s => s.abandon(key, owner))
    }

    async fn resolve(&self, key: &str, resolution: Resolution) -> Result<Resolved, StoreError> {
        each!(self, s => s.resolve(key, resolution))
    }

    async fn pending(&self, limit: usize) -> Result<Vec<PendingIntent>, StoreError> {
        each!(self, s => s.pending(limit))
    }

    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        each!(self, s => s.prune(older_than))
    }
}
