//! Scratch receipt stores for the tests: a fresh SQLite file, a fresh PostgreSQL schema, any of
//! the three stores by kind, and an in-memory store with one fault.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stormguard::receipt::{
    Begin, Durability, InMemoryStore, PostgresOptionsBuilder, PostgresStore, ReceiptStore,
    Resolution, Resolved, SqliteStore, StoreError,
};

/// A path for a new SQLite file in a directory of its own.
pub fn temp_db(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "stormguard-test-{}-{name}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("receipts.db")
}

static PG_SCHEMAS: AtomicU32 = AtomicU32::new(0);

/// A connection string whose `search_path` is a new, empty schema (so tests run in parallel), or
/// `None` with a note when `STORMGUARD_POSTGRES_URL` is not set.
pub async fn fresh_schema() -> Option<String> {
    let url = super::service_url("STORMGUARD_POSTGRES_URL")?;
    let schema = format!(
        "sg_test_{}_{}",
        std::process::id(),
        PG_SCHEMAS.fetch_add(1, Ordering::SeqCst)
    );
    raw_pg(&url)
        .await
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        ))
        .await
        .unwrap();
    Some(format!("{url} options='-c search_path={schema}'"))
}

/// A plain tokio-postgres client (to hold locks, kill backends, look at tables).
pub async fn raw_pg(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    client
}

/// A migrated store in a fresh schema, and the connection string that reaches it.
pub async fn pg_store() -> Option<(PostgresStore, String)> {
    let url = fresh_schema().await?;
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some((store, url))
}

/// The store `options` describe, connected and migrated.
pub async fn pg_with(options: PostgresOptionsBuilder) -> PostgresStore {
    let store = options.build().unwrap().connect().await.unwrap();
    store.migrate().await.unwrap();
    store
}

pub enum StoreKind {
    Memory,
    Sqlite,
    Postgres,
}

pub enum Opened {
    Memory(InMemoryStore),
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl StoreKind {
    pub async fn open(self) -> Option<Opened> {
        Some(match self {
            StoreKind::Memory => Opened::Memory(InMemoryStore::new()),
            StoreKind::Sqlite => {
                Opened::Sqlite(SqliteStore::open(temp_db("kind"), Durability::Process).unwrap())
            }
            StoreKind::Postgres => Opened::Postgres(pg_store().await?.0),
        })
    }
}

/// What goes wrong in a [`Faulty`] store.
#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    /// The first `complete` fails (a full disk).
    FirstCompleteFails,
    /// Every `claim` is recorded, but its reply is lost.
    ClaimRepliesLost,
    /// The first `claim` finds another caller took the intent, finished without effect and
    /// removed it.
    FirstClaimLostToAnother,
}

/// The in-memory store with one [`Fault`].
#[derive(Clone)]
pub struct Faulty {
    pub store: InMemoryStore,
    calls: Arc<AtomicU32>,
    fault: Fault,
}

impl Faulty {
    pub fn new(fault: Fault) -> Self {
        Faulty {
            store: InMemoryStore::new(),
            calls: Arc::default(),
            fault,
        }
    }

    /// Whether this is the first call the fault counts.
    fn first(&self, fault: Fault) -> bool {
        self.fault == fault && self.calls.fetch_add(1, Ordering::SeqCst) == 0
    }
}

impl ReceiptStore for Faulty {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.store.begin(key, fingerprint, owner, lease)
    }
    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let lost = self.fault == Fault::ClaimRepliesLost;
        let taken = self.first(Fault::FirstClaimLostToAnother);
        let (store, gone) = (self.store.clone(), key.to_string());
        let claimed = self.store.claim(key, owner, lease);
        async move {
            if taken {
                let _ = store.resolve(&gone, Resolution::NotDone).await;
                return Ok(false);
            }
            let claimed = claimed.await;
            if lost {
                return Err(StoreError::new("the reply was lost"));
            }
            claimed
        }
    }
    fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<stormguard::receipt::InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.release(key, owner, in_doubt)
    }
    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let fail = self.first(Fault::FirstCompleteFails);
        let done = self.store.complete(key, owner, receipt);
        async move {
            if fail {
                return Err(StoreError::new("disk full"));
            }
            done.await
        }
    }
    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.abandon(key, owner)
    }
    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        self.store.resolve(key, resolution)
    }
    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<stormguard::receipt::PendingIntent>, StoreError>> + Send
    {
        self.store.pending(limit)
    }
    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.store.prune(older_than)
    }
}
