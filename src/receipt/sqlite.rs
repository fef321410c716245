//! The SQLite receipt store: one file, WAL, durable across `kill -9` of the process.
//!
//! One writer thread owns the connection. Calls are queued to it in the order they are made
//! and it runs the calls waiting at that moment in one transaction (group commit: one flush for
//! the whole batch under [`Durability::PowerLoss`]), each inside a savepoint of its own so one
//! failing call does not undo the others. No call holds a runtime thread, and a call queued
//! after another (the clean-up of a cancelled call after its `begin`) runs after it.

use super::clock::{Clock, StoreClock};
use super::store::{
    Begin, Durability, InDoubt, PendingIntent, ReceiptStore, Record, Resolution, Resolved,
    StoreError,
};
use rusqlite::{params, Connection, OptionalExtension};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

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
    shared: Arc<Shared>,
}

struct Shared {
    jobs: mpsc::Sender<Job>,
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
    done_ms INTEGER,
    taken_ms INTEGER,
    sent_ms INTEGER,
    lands_by_ms INTEGER
);
CREATE INDEX IF NOT EXISTS stormguard_receipts_since ON stormguard_receipts (since_ms);
";

/// Columns added after the first release: a file written by an earlier version gets them when it
/// is opened (NULL in its old rows, read as "unknown").
const ADDED: [&str; 3] = ["taken_ms", "sent_ms", "lands_by_ms"];

/// Adds the columns an older file lacks, in one write transaction (two processes opening one old
/// file add them once).
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let missing = |conn: &Connection| -> rusqlite::Result<Vec<&'static str>> {
        let mut st = conn.prepare("SELECT name FROM pragma_table_info('stormguard_receipts')")?;
        let have = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(ADDED
            .into_iter()
            .filter(|c| !have.iter().any(|h| h == c))
            .collect())
    };
    if missing(conn)?.is_empty() {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let added = missing(conn).and_then(|columns| {
        columns.iter().try_for_each(|c| {
            conn.execute_batch(&format!(
                "ALTER TABLE stormguard_receipts ADD COLUMN {c} INTEGER"
            ))
        })
    });
    match added {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The columns a [`Record`] is read from, in the order [`row_record`] reads them.
const RECORD_COLUMNS: &str =
    "fingerprint, owner, since_ms, lease_until_ms, receipt, COALESCE(taken_ms, since_ms), sent_ms, COALESCE(lands_by_ms, 0)";

/// A row of [`RECORD_COLUMNS`], owned.
type Row = (
    String,
    String,
    i64,
    i64,
    Option<Vec<u8>>,
    i64,
    Option<i64>,
    i64,
);

fn read_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Row> {
    Ok((
        r.get(at)?,
        r.get(at + 1)?,
        r.get(at + 2)?,
        r.get(at + 3)?,
        r.get(at + 4)?,
        r.get(at + 5)?,
        r.get(at + 6)?,
        r.get(at + 7)?,
    ))
}

fn row_record(row: &Row) -> Record<'_> {
    let (fp, owner, since, lease_until, receipt, taken, sent, lands_by) = row;
    Record {
        fingerprint: fp,
        owner,
        since_ms: *since as u64,
        lease_until_ms: *lease_until as u64,
        receipt: receipt.as_deref(),
        taken_ms: *taken as u64,
        sent_ms: sent.map(|s| s as u64),
        lands_by_ms: *lands_by as u64,
    }
}

/// The record of `key`, if there is one.
fn read_record(conn: &Connection, key: &str) -> Result<Option<Row>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM stormguard_receipts WHERE key = ?1"
    ))
    .and_then(|mut st| st.query_row(params![key], |r| read_row(r, 0)).optional())
    .map_err(err("read the record"))
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
            shared: Arc::new(Shared {
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

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn until(now: u64, lease: Duration) -> i64 {
    ms(now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)))
}

impl ReceiptStore for SqliteStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let (key, fingerprint, owner) =
            (key.to_string(), fingerprint.to_string(), owner.to_string());
        self.with(move |conn, now| {
            // A record removed between the insert and the read (an abandoned intent, by another
            // process) is tried again; a few rounds are plenty.
            for _ in 0..8 {
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms, taken_ms)
                         VALUES (?1, ?2, ?5, ?3, ?4, ?3) ON CONFLICT (key) DO NOTHING",
                    )
                    .and_then(|mut st| {
                        st.execute(params![key, fingerprint, ms(now), until(now, lease), owner])
                    })
                    .map_err(err("record the intent"))?;
                if inserted == 1 {
                    return Ok(Begin::Fresh);
                }
                let Some(row) = read_record(conn, &key)? else {
                    continue;
                };
                return Ok(Begin::decide(
                    Some(row_record(&row)),
                    &fingerprint,
                    &owner,
                    now,
                ));
            }
            Err(StoreError::new("record the intent: the record kept vanishing"))
        })
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn, now| {
            let n = conn
                .prepare_cached(
                    "UPDATE stormguard_receipts SET lease_until_ms = ?3, owner = ?4, taken_ms = ?2
                     WHERE key = ?1 AND receipt IS NULL AND lease_until_ms <= ?2",
                )
                .and_then(|mut st| st.execute(params![key, ms(now), until(now, lease), owner]))
                .map_err(err("claim the intent"))?;
            Ok(n == 1)
        })
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn, now| {
            match in_doubt.map(|d| d.at(now)) {
                None => conn
                    .prepare_cached(
                        "UPDATE stormguard_receipts SET lease_until_ms = MIN(lease_until_ms, ?2)
                     WHERE key = ?1 AND receipt IS NULL AND owner = ?3",
                    )
                    .and_then(|mut st| st.execute(params![key, ms(now), owner])),
                Some((sent, lands_by)) => conn
                    .prepare_cached(
                        "UPDATE stormguard_receipts SET lease_until_ms = MIN(lease_until_ms, ?2),
                        sent_ms = ?4, lands_by_ms = MAX(COALESCE(lands_by_ms, 0), ?5)
                     WHERE key = ?1 AND receipt IS NULL AND owner = ?3",
                    )
                    .and_then(|mut st| {
                        st.execute(params![key, ms(now), owner, ms(sent), ms(lands_by)])
                    }),
            }
            .map_err(err("release the intent"))?;
            Ok(())
        })
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner, receipt) = (key.to_string(), owner.to_string(), receipt.to_vec());
        self.with(move |conn, now| {
            let n = conn
                .prepare_cached(
                    "UPDATE stormguard_receipts SET receipt = ?2, done_ms = ?3
                     WHERE key = ?1 AND owner = ?4 AND receipt IS NULL",
                )
                .and_then(|mut st| st.execute(params![key, receipt, ms(now), owner]))
                .map_err(err("record the receipt"))?;
            if n == 1 {
                Ok(())
            } else {
                Err(StoreError::not_holder(&key))
            }
        })
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let (key, owner) = (key.to_string(), owner.to_string());
        self.with(move |conn, _| {
            conn.prepare_cached(
                "DELETE FROM stormguard_receipts WHERE key = ?1 AND receipt IS NULL AND owner = ?2",
            )
            .and_then(|mut st| st.execute(params![key, owner]))
            .map_err(err("remove the intent"))?;
            Ok(())
        })
    }

    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        let key = key.to_string();
        self.with(move |conn, now| {
            // Each statement re-checks what the record allowed, so another process changing it
            // in between (a take-over) is never settled over; a few rounds are plenty.
            for _ in 0..8 {
                let Some(row) = read_record(conn, &key)? else {
                    return Ok(Resolved::NoRecord);
                };
                let settled = match (row_record(&row).resolve(&resolution, now), &resolution) {
                    (Resolved::Settled, Resolution::Done(receipt)) => conn
                        .prepare_cached(
                            "UPDATE stormguard_receipts SET receipt = ?2, done_ms = ?3
                             WHERE key = ?1 AND receipt IS NULL",
                        )
                        .and_then(|mut st| st.execute(params![key, receipt, ms(now)]))
                        .map_err(err("record the receipt"))?,
                    (Resolved::Settled, Resolution::NotDone) => conn
                        .prepare_cached(
                            "DELETE FROM stormguard_receipts WHERE key = ?1 AND receipt IS NULL
                             AND lease_until_ms <= ?2 AND COALESCE(lands_by_ms, 0) <= ?2",
                        )
                        .and_then(|mut st| st.execute(params![key, ms(now)]))
                        .map_err(err("remove the intent"))?,
                    (refused, _) => return Ok(refused),
                };
                if settled == 1 {
                    return Ok(Resolved::Settled);
                }
            }
            Err(StoreError::new(
                "settle the intent: the record kept changing",
            ))
        })
    }

    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingIntent>, StoreError>> + Send {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |conn, now| {
            let mut st = conn
                .prepare_cached(&format!(
                    "SELECT key, {RECORD_COLUMNS} FROM stormguard_receipts
                     WHERE receipt IS NULL ORDER BY since_ms, key LIMIT ?1"
                ))
                .map_err(err("list the pending intents"))?;
            let rows = st
                .query_map(params![limit], |r| {
                    let key: String = r.get(0)?;
                    Ok(row_record(&read_row(r, 1)?).pending(key, now))
                })
                .map_err(err("list the pending intents"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(err("list the pending intents"))
        })
    }

    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let this = self.clone();
        let age = ms(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX));
        async move {
            let mut removed = 0;
            loop {
                let n = this
                    .with(move |conn, now| {
                        conn.prepare_cached(
                            "DELETE FROM stormguard_receipts WHERE rowid IN
                             (SELECT rowid FROM stormguard_receipts WHERE since_ms < ?1 LIMIT ?2)",
                        )
                        .and_then(|mut st| {
                            st.execute(params![ms(now).saturating_sub(age), PRUNE_STEP])
                        })
                        .map_err(err("prune"))
                    })
                    .await?;
                removed += n as u64;
                if (n as i64) < PRUNE_STEP {
                    return Ok(removed);
                }
            }
        }
    }
}
