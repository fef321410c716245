//! The SQLite receipt store: one file, WAL, durable across `kill -9` of the process.
//!
//! One writer thread owns the connection. Calls are queued to it in the order they are made
//! and it runs the calls waiting at that moment in one transaction (group commit: one flush for
//! the whole batch under [`Durability::PowerLoss`]), each inside a savepoint of its own so one
//! failing call does not undo the others. No call holds a runtime thread, and a call queued
//! after another (the clean-up of a cancelled call after its `begin`) runs after it.

mod calls;
mod schema;

use super::clock::{Clock, StoreClock};
use super::store::{Durability, StoreError};
use rusqlite::Connection;
use schema::{migrate, SCHEMA};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// The most calls one transaction carries.
const MAX_BATCH: usize = 256;
/// The most rows one prune step deletes (then other calls run).
const PRUNE_STEP: i64 = 1_000;

type Deliver = Box<dyn FnOnce(Option<&str>) + Send>;
type Job = Box<dyn FnOnce(Result<(&Connection, u64), &str>) -> (Deliver, bool) + Send>;

/// A receipt store in one SQLite file (WAL mode). Several processes on one host may share the
/// file (WAL needs shared memory, so not across machines: the host's clock is the store's).
///
/// If the file is deleted or replaced while the store is open, every later call fails
/// (`store_unavailable`) instead of recording into a file nobody else sees. A process resuming
/// a run should open with [`open_existing`](Self::open_existing), so that a missing file is an
/// error rather than an empty store that has forgotten every receipt.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use stormguard::receipt::{Begin, Durability, ReceiptStore, SqliteStore};
///
/// let dir = std::env::temp_dir().join(format!("stormguard-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
/// assert_eq!(store.begin("k", "fp", "me", Duration::from_secs(30)).await?, Begin::Fresh);
/// // A resumed run refuses a store that is not there.
/// assert!(SqliteStore::open_existing(dir.join("missing.db"), Durability::Process).is_err());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Worker>,
}

/// The handle on the store's worker thread: where its jobs go, and the file it opened.
struct Worker {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
}

fn err(what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::from_source(what, e)
}

/// What identifies the file on disk, to notice it being deleted or replaced.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId(u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(FileId(meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        Some(FileId(0, meta.len().min(1)))
    }
}

impl SqliteStore {
    /// Opens (or creates) the store at `path`, with the table created if missing.
    pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        Self::start(path.as_ref(), durability, true, StoreClock::default())
    }

    /// Opens the store at `path`, which must exist and hold a receipt store: for a process that
    /// resumes a run, where an empty new store would forget every receipt and intent. A missing
    /// file, an empty one or another application's database is an error.
    pub fn open_existing(
        path: impl AsRef<Path>,
        durability: Durability,
    ) -> Result<Self, StoreError> {
        Self::start(path.as_ref(), durability, false, StoreClock::default())
    }

    /// Opens (or creates) the store at `path`, judging leases and ages by `clock` (tests).
    /// The clock is read on the store's writer thread, outside any tokio runtime: a clock over
    /// tokio's paused time must enter its runtime first (`Handle::enter`), or it reads the real
    /// time there.
    pub fn open_with_clock(
        path: impl AsRef<Path>,
        durability: Durability,
        clock: impl Clock,
    ) -> Result<Self, StoreError> {
        Self::start(path.as_ref(), durability, true, StoreClock::of(clock))
    }

    fn start(
        path: &Path,
        durability: Durability,
        create: bool,
        clock: StoreClock,
    ) -> Result<Self, StoreError> {
        use rusqlite::OpenFlags;
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(path, flags).map_err(err("open"))?;
        let sync = match durability {
            Durability::Process => "NORMAL",
            Durability::PowerLoss => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA busy_timeout = 5000;"
        ))
        .map_err(err("configure"))?;
        if !create {
            // An existing store, not an empty file nor another application's database.
            let found: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'stormguard_receipts'",
                    [],
                    |r| r.get(0),
                )
                .map_err(err("open"))?;
            if found != 1 {
                return Err(StoreError::new(
                    "open: the file holds no receipt store (empty, or another database)",
                ));
            }
        }
        conn.execute_batch(SCHEMA)
            .map_err(err("create the table"))?;
        migrate(&conn).map_err(err("add the columns of this version"))?;
        let id = file_id(path).ok_or_else(|| StoreError::new("the store file vanished at open"))?;
        let (jobs, queue) = mpsc::channel();
        let watched = path.to_path_buf();
        std::thread::Builder::new()
            .name("stormguard-sqlite".into())
            .spawn(move || writer(conn, queue, &watched, id, &clock))
            .map_err(|e| StoreError::from_source("start the writer thread", e))?;
        Ok(SqliteStore {
            shared: Arc::new(Worker {
                jobs,
                path: path.to_path_buf(),
            }),
        })
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Queues `f` to the writer thread now (so calls run in the order they were made, whether or
    /// not their futures are polled) and answers once its batch has committed.
    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, u64) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |ctx| {
            let result = match ctx {
                Ok((conn, now)) => f(conn, now),
                Err(why) => Err(StoreError::new(why.to_string())),
            };
            let ok = result.is_ok();
            let deliver: Deliver = Box::new(move |failed| {
                let _ = tx.send(match failed {
                    Some(why) => Err(StoreError::new(why.to_string())),
                    None => result,
                });
            });
            (deliver, ok)
        });
        let queued = self.shared.jobs.send(job);
        async move {
            queued.map_err(|_| StoreError::new("the store's writer thread has stopped"))?;
            rx.await.map_err(|_| {
                StoreError::new("the store's writer thread stopped before answering")
            })?
        }
    }
}

/// The writer thread: takes what is queued, runs it in one transaction, answers after commit.
fn writer(
    conn: Connection,
    queue: mpsc::Receiver<Job>,
    path: &Path,
    id: FileId,
    clock: &StoreClock,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if file_id(path) != Some(id) {
            tracing::error!(path = %path.display(), "the receipt store file was deleted or replaced; failing closed");
            let why =
                "the store file was deleted or replaced while open; refusing to record into it";
            for job in batch {
                job(Err(why)).0(None);
            }
            continue;
        }
        if batch.len() == 1 {
            // Alone: one autocommit statement or two, no transaction of our own to pay for.
            for job in batch {
                job(Ok((&conn, clock.now_ms()))).0(None);
            }
            continue;
        }
        if let Err(e) = exec(&conn, "BEGIN IMMEDIATE") {
            let why = format!("start a transaction: {e}");
            for job in batch {
                job(Err(&why)).0(None);
            }
            continue;
        }
        let mut delivers = Vec::with_capacity(batch.len());
        for job in batch {
            let saved = exec(&conn, "SAVEPOINT job").is_ok();
            let (deliver, ok) = job(Ok((&conn, clock.now_ms())));
            if saved {
                if !ok {
                    let _ = exec(&conn, "ROLLBACK TO job");
                }
                let _ = exec(&conn, "RELEASE job");
            }
            delivers.push(deliver);
        }
        let failed = exec(&conn, "COMMIT").err().map(|e| {
            let _ = exec(&conn, "ROLLBACK");
            format!("commit: {e}")
        });
        for deliver in delivers {
            deliver(failed.as_deref());
        }
    }
}

/// Runs a statement prepared once and cached.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .finish()
    }
}
