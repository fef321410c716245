//! The SQLite receipt store: one file, WAL, durable across `kill -9` of the process.

use super::store::{Begin, Durability, ReceiptStore, StoreError};
use rusqlite::{params, Connection, OptionalExtension};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A receipt store in one SQLite file (WAL mode). Several processes may share the file; each
/// operation is one atomic statement (statements are prepared once and cached).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use stormguard::receipt::{Begin, Durability, ReceiptStore, SqliteStore};
///
/// let dir = std::env::temp_dir().join(format!("stormguard-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
/// assert_eq!(store.begin("k", "fp", "me", 0, 1_000).await?, Begin::Fresh);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS stormguard_receipts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    owner TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    receipt BLOB,
    done_ms INTEGER
);
CREATE INDEX IF NOT EXISTS stormguard_receipts_since ON stormguard_receipts (since_ms);
";

fn err(what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::from_source(what, e)
}

impl SqliteStore {
    /// Opens (or creates) the store at `path`, with the table created if missing.
    pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = Connection::open(&path).map_err(err("open"))?;
        let sync = match durability {
            Durability::Process => "NORMAL",
            Durability::PowerLoss => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA busy_timeout = 5000;"
        ))
        .map_err(err("configure"))?;
        conn.execute_batch(SCHEMA)
            .map_err(err("create the table"))?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path,
        })
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        let conn = self.conn.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut conn)
            })
            .await
            .map_err(|e| StoreError::from_source("the blocking task failed", e))?
        }
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl ReceiptStore for SqliteStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let (key, fingerprint, owner) =
            (key.to_string(), fingerprint.to_string(), owner.to_string());
        self.with(move |conn| {
            loop {
                // One statement, atomic on its own: the intent is recorded or the key exists.
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
                         VALUES (?1, ?2, ?5, ?3, ?4) ON CONFLICT (key) DO NOTHING",
                    )
                    .and_then(|mut st| {
                        st.execute(params![key, fingerprint, ms(now_ms), ms(lease_until_ms), owner])
                    })
                    .map_err(err("record the intent"))?;
                if inserted == 1 {
                    return Ok(Begin::Fresh);
                }
                let row: Option<(String, i64, i64, Option<Vec<u8>>)> = conn
                    .prepare_cached(
                        "SELECT fingerprint, since_ms, lease_until_ms, receipt
                         FROM stormguard_receipts WHERE key = ?1",
                    )
                    .and_then(|mut st| {
                        st.query_row(params![key], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                        })
                        .optional()
                    })
                    .map_err(err("read the record"))?;
                let Some(row) = row else {
                    continue; // removed in between (an abandoned intent): try again
                };
                return Ok(match row {
                    (fp, ..) if fp != fingerprint => Begin::Mismatch,
                    (_, since, _, Some(receipt)) => Begin::Done {
                        since_ms: since as u64,
                        receipt,
                    },
                    (_, since, lease, None) => Begin::Pending {
                        since_ms: since as u64,
                        lease_until_ms: lease as u64,
                    },
                });
            }
        })
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE stormguard_receipts SET lease_until_ms = ?3, owner = ?4
                     WHERE key = ?1 AND receipt IS NULL AND lease_until_ms <= ?2",
                )
                .and_then(|mut st| st.execute(params![key, ms(now_ms), ms(lease_until_ms), owner]))
                .map_err(err("claim the intent"))?;
            Ok(n == 1)
        })
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn| {
            conn.prepare_cached(
                "UPDATE stormguard_receipts SET lease_until_ms = ?2
                 WHERE key = ?1 AND receipt IS NULL AND owner = ?3",
            )
            .and_then(|mut st| st.execute(params![key, ms(now_ms), owner]))
            .map_err(err("release the intent"))?;
            Ok(())
        })
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner, receipt) = (key.to_string(), owner.to_string(), receipt.to_vec());
        self.with(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE stormguard_receipts SET receipt = ?2, done_ms = ?3
                     WHERE key = ?1 AND owner = ?4 AND receipt IS NULL",
                )
                .and_then(|mut st| st.execute(params![key, receipt, ms(now_ms), owner]))
                .map_err(err("record the receipt"))?;
            if n == 1 {
                Ok(())
            } else {
                Err(StoreError::new(format!(
                    "{key}: this caller no longer holds the intent"
                )))
            }
        })
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn| {
            conn.prepare_cached(
                "DELETE FROM stormguard_receipts WHERE key = ?1 AND receipt IS NULL AND owner = ?2",
            )
            .and_then(|mut st| st.execute(params![key, owner]))
            .map_err(err("remove the intent"))?;
            Ok(())
        })
    }

    fn prune(&self, before_ms: u64) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.with(move |conn| {
            let n = conn
                .prepare_cached("DELETE FROM stormguard_receipts WHERE since_ms < ?1")
                .and_then(|mut st| st.execute(params![ms(before_ms)]))
                .map_err(err("prune"))?;
            Ok(n as u64)
        })
    }
}
