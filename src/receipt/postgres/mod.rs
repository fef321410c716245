//! The PostgreSQL receipt store: several processes or machines share one run's receipts.
//!
//! A small pool of connections (8 by default), each driven by a committer task: the calls
//! queued while one transaction commits run together in the next, their statements pipelined,
//! so many writers share one WAL flush (group commit; see `committer.rs`), and the server
//! flushes the commits of different connections together too. Each key's calls go to one
//! connection, in the order they were made. A connection found closed (the backend was killed,
//! the server restarted) is opened again for the next batch. Every time is the server's (`clock_timestamp()`), so callers whose clocks
//! disagree judge leases alike. Every statement runs under `statement_timeout` and
//! `lock_timeout`, so no call waits without bound.

mod calls;
mod committer;
mod options;

pub use options::{PostgresOptions, PostgresOptionsBuilder};

use super::store::{Durability, StoreError};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_postgres::{Client, NoTls, Statement};

/// A receipt store in PostgreSQL. Create the table once with [`PostgresStore::migrate`]
/// (idempotent, and it takes no lock when the schema is current); every query is
/// parameterised, prepared once per connection on first use and reused.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use stormguard::receipt::{Durability, PostgresOptions, PostgresStore};
/// let url = "host=127.0.0.1 user=postgres dbname=test";
/// let store = PostgresStore::connect_with(url, Durability::Process).await?;
/// store.migrate().await?;
/// // Or with every setting:
/// let store = PostgresOptions::builder(url)
///     .durability(Durability::PowerLoss)
///     .connections(16)
///     .statement_timeout(Duration::from_secs(5))
///     .lock_timeout(Duration::from_secs(1))
///     .build()?
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: Arc<Pool>,
}

impl PostgresOptions {
    /// Opens the first connection (the others open on first use) and returns the store.
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let first = open(&self).await?;
        let slots = (0..self.connections)
            .map(|i| committer::Slot::start(self.clone(), (i == 0).then(|| first.clone())))
            .collect();
        Ok(PostgresStore {
            pool: Arc::new(Pool {
                options: self,
                slots,
            }),
        })
    }
}

struct Pool {
    options: PostgresOptions,
    /// One committer (and its connection) per slot.
    slots: Box<[committer::Slot]>,
}

struct Conn {
    client: Client,
    statements: OnceLock<Statements>,
}

struct Statements {
    insert: Statement,
    select: Statement,
    claim: Statement,
    release: Statement,
    complete: Statement,
    abandon: Statement,
    settle_done: Statement,
    settle_not_done: Statement,
    prune: Statement,
}

// `$n::bigint` is the test clock, NULL for the server's.
const INSERT: &str =
    "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms, taken_ms)
     SELECT $1, $2, $3, now.ms, now.ms + $4, now.ms
     FROM (SELECT COALESCE($5::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) AS ms) AS now
     ON CONFLICT (key) DO NOTHING RETURNING key";
/// The columns a `Record` is read from (see `calls::record`), then the store's time.
const SELECT: &str = "SELECT fingerprint, owner, since_ms, lease_until_ms, receipt,
     COALESCE(taken_ms, since_ms), sent_ms, COALESCE(lands_by_ms, 0),
     COALESCE($2::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
     FROM stormguard_receipts WHERE key = $1";
const CLAIM: &str =
    "UPDATE stormguard_receipts SET lease_until_ms = now.ms + $3, owner = $2, taken_ms = now.ms
     FROM (SELECT COALESCE($4::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) AS ms) AS now
     WHERE key = $1 AND receipt IS NULL AND lease_until_ms <= now.ms";
/// `$4`: how long ago the request of an attempt in doubt was sent (NULL: none), `$5`: how long
/// after its send it may land.
const RELEASE: &str = "UPDATE stormguard_receipts SET lease_until_ms = LEAST(lease_until_ms, now.ms),
     sent_ms = CASE WHEN $4::bigint IS NULL THEN sent_ms ELSE now.ms - $4 END,
     lands_by_ms = CASE WHEN $4::bigint IS NULL THEN lands_by_ms
         ELSE GREATEST(COALESCE(lands_by_ms, 0), now.ms - $4 + $5::bigint) END
     FROM (SELECT COALESCE($3::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) AS ms) AS now
     WHERE key = $1 AND receipt IS NULL AND owner = $2";
const COMPLETE: &str = "UPDATE stormguard_receipts SET receipt = $2,
     done_ms = COALESCE($4::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
     WHERE key = $1 AND owner = $3 AND receipt IS NULL";
const ABANDON: &str =
    "DELETE FROM stormguard_receipts WHERE key = $1 AND receipt IS NULL AND owner = $2";
const SETTLE_DONE: &str = "UPDATE stormguard_receipts SET receipt = $2,
     done_ms = COALESCE($3::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
     WHERE key = $1 AND receipt IS NULL";
/// Only once nothing of the intent can still land (its caller's lease and any in-flight bound
/// have passed, as `Record::may_land_for_ms` judges them): re-checked here, so a take-over in
/// between is never settled over.
const SETTLE_NOT_DONE: &str = "DELETE FROM stormguard_receipts
     USING (SELECT COALESCE($2::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) AS ms) AS now
     WHERE key = $1 AND receipt IS NULL
       AND (lease_until_ms <= now.ms OR lease_until_ms <= COALESCE(taken_ms, since_ms))
       AND (sent_ms IS NULL OR lands_by_ms <= now.ms OR lands_by_ms <= sent_ms)";
const PRUNE: &str = "DELETE FROM stormguard_receipts WHERE key IN (
     SELECT key FROM stormguard_receipts
     WHERE since_ms < COALESCE($2::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) - $1
     LIMIT 1000)";
const PRUNE_STEP: u64 = 1_000;

const COLUMNS: [&str; 10] = [
    "key",
    "fingerprint",
    "owner",
    "since_ms",
    "lease_until_ms",
    "receipt",
    "done_ms",
    "taken_ms",
    "sent_ms",
    "lands_by_ms",
];

fn err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::from_source(what, e)
}

/// A duration in ms for SQL, capped at a century (so `now + lease` never overflows a bigint).
fn ms(d: Duration) -> i64 {
    const CENTURY_MS: i64 = 100 * 366 * 24 * 3600 * 1000;
    i64::try_from(d.as_millis()).map_or(CENTURY_MS, |v| v.min(CENTURY_MS))
}

/// Opens one connection with this store's session settings.
async fn open(options: &PostgresOptions) -> Result<Arc<Conn>, StoreError> {
    let connect = tokio_postgres::connect(&options.config, NoTls);
    let (client, connection) = tokio::time::timeout(options.connect_timeout, connect)
        .await
        .map_err(|_| StoreError::new("connect: timed out"))?
        .map_err(err("connect"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "receipt store connection closed");
        }
    });
    let sync = if options.durability == Durability::Process {
        Some("off")
    } else {
        let row = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .map_err(err("read synchronous_commit"))?;
        (row.get::<_, String>(0) == "off").then_some("on")
    };
    let mut session = format!(
        "SET statement_timeout = {}; SET lock_timeout = {};",
        ms(options.statement_timeout),
        ms(options.lock_timeout)
    );
    if let Some(sync) = sync {
        session.push_str(&format!(" SET synchronous_commit = {sync};"));
    }
    client
        .batch_execute(&session)
        .await
        .map_err(err("configure the session"))?;
    Ok(Arc::new(Conn {
        client,
        statements: OnceLock::new(),
    }))
}

impl Conn {
    /// The prepared statements, prepared on first use (after [`PostgresStore::migrate`] has
    /// created the table). A failed preparation is not cached: the next call tries again.
    async fn statements(&self) -> Result<&Statements, StoreError> {
        if let Some(statements) = self.statements.get() {
            return Ok(statements);
        }
        let prepare = |sql| self.client.prepare(sql);
        let prepared = Statements {
            insert: prepare(INSERT).await.map_err(err("prepare"))?,
            select: prepare(SELECT).await.map_err(err("prepare"))?,
            claim: prepare(CLAIM).await.map_err(err("prepare"))?,
            release: prepare(RELEASE).await.map_err(err("prepare"))?,
            complete: prepare(COMPLETE).await.map_err(err("prepare"))?,
            abandon: prepare(ABANDON).await.map_err(err("prepare"))?,
            settle_done: prepare(SETTLE_DONE).await.map_err(err("prepare"))?,
            settle_not_done: prepare(SETTLE_NOT_DONE).await.map_err(err("prepare"))?,
            prune: prepare(PRUNE).await.map_err(err("prepare"))?,
        };
        // Two first calls may race to prepare: either set is as good as the other.
        Ok(self.statements.get_or_init(|| prepared))
    }
}

impl Pool {
    /// Queues `work` to `key`'s slot (always the same one for one key, so one key's calls run
    /// in the order they were made) and answers once it has committed.
    fn submit<T, F, Fut>(
        &self,
        key: &str,
        work: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: Fn(Arc<Conn>, Option<i64>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        self.slots[(hash % self.slots.len() as u64) as usize].submit(work)
    }

    /// The test clock's reading, or `None` for the server's clock.
    fn now(&self) -> Option<i64> {
        self.options
            .clock
            .as_ref()
            .map(|c| i64::try_from(c.now_ms()).unwrap_or(i64::MAX))
    }
}

impl PostgresStore {
    /// Connects with [`Durability::PowerLoss`] and the default settings.
    pub async fn connect(config: &str) -> Result<Self, StoreError> {
        PostgresOptions::builder(config).options.connect().await
    }

    /// Connects with `durability` and the default settings.
    ///
    /// [`Durability::Process`] sets `synchronous_commit = off`: a commit returns before its WAL
    /// is flushed. Every client process may die without losing anything, but a crash or an
    /// immediate restart of the PostgreSQL server loses the commits of the last
    /// `3 × wal_writer_delay` (600 ms by default), and a lost intent is a repeated side effect.
    /// Use it where the database is as likely to outlive the run as the run's own disk is.
    /// [`Durability::PowerLoss`] reads the connection's `synchronous_commit` (the server's, or
    /// what the role, database or connection string set) and sets it to `on` only if it is
    /// `off`; any other value is kept: `on` (the default) and `remote_apply` as they are, and
    /// also `local` and `remote_write`, which wait for less than `on` from a synchronous standby
    /// (`remote_write`: the standby's OS write, not its flush). Every value but `off` flushes
    /// the commit's WAL on this server before the commit returns.
    pub async fn connect_with(config: &str, durability: Durability) -> Result<Self, StoreError> {
        let mut options = PostgresOptions::builder(config).options;
        options.durability = durability;
        options.connect().await
    }

    /// The `synchronous_commit` of this store's connections, as PostgreSQL reports it: what a
    /// commit of this store waits for (see [`Durability`]).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), stormguard::receipt::StoreError> {
    /// use stormguard::receipt::{Durability, PostgresStore};
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// let store = PostgresStore::connect_with(url, Durability::Process).await?;
    /// assert_eq!(store.synchronous_commit().await?, "off");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn synchronous_commit(&self) -> Result<String, StoreError> {
        let conn = open(&self.pool.options).await?;
        let row = conn
            .client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .map_err(err("read synchronous_commit"))?;
        Ok(row.get(0))
    }

    /// Creates the table and index if they are missing (and adds columns a newer version needs).
    /// Safe to run at every start, from many processes at once: it first reads the catalog,
    /// which takes no lock on the table, and changes the schema (on a connection of its own, in
    /// one transaction holding an advisory lock, so concurrent starts migrate one at a time,
    /// under the lock timeout) only if something is missing; a busy table then fails it in
    /// bounded time rather than queueing every writer behind it.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let own = open(&self.pool.options).await?;
        if schema_is_current(&own.client).await? {
            return Ok(());
        }
        // One migration at a time per schema (several processes starting together would race
        // on the catalog: PostgreSQL answers 23505 on pg_type for two concurrent CREATE TABLE),
        // and the schema read again under the lock: another process may have just done it.
        let begun = own
            .client
            .batch_execute(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.stormguard_receipts'));",
            )
            .await;
        let result = match begun {
            Err(e) => Err(e),
            Ok(()) if schema_is_current(&own.client).await? => {
                own.client.batch_execute("COMMIT").await
            }
            Ok(()) => {
                own.client
                    .batch_execute(
                        "CREATE TABLE IF NOT EXISTS stormguard_receipts (
                            key TEXT PRIMARY KEY,
                            fingerprint TEXT NOT NULL,
                            owner TEXT NOT NULL,
                            since_ms BIGINT NOT NULL,
                            lease_until_ms BIGINT NOT NULL,
                            receipt BYTEA,
                            done_ms BIGINT,
                            taken_ms BIGINT,
                            sent_ms BIGINT,
                            lands_by_ms BIGINT
                        );
                        ALTER TABLE stormguard_receipts
                            ADD COLUMN IF NOT EXISTS owner TEXT NOT NULL DEFAULT '';
                        ALTER TABLE stormguard_receipts ADD COLUMN IF NOT EXISTS done_ms BIGINT;
                        ALTER TABLE stormguard_receipts ADD COLUMN IF NOT EXISTS taken_ms BIGINT;
                        ALTER TABLE stormguard_receipts ADD COLUMN IF NOT EXISTS sent_ms BIGINT;
                        ALTER TABLE stormguard_receipts ADD COLUMN IF NOT EXISTS lands_by_ms BIGINT;
                        CREATE INDEX IF NOT EXISTS stormguard_receipts_since
                            ON stormguard_receipts (since_ms);
                        COMMIT;",
                    )
                    .await
            }
        };
        if result.is_err() {
            let _ = own.client.batch_execute("ROLLBACK").await;
        }
        result.map_err(err("migrate"))
    }
}

/// Whether the table, its columns and its index are there, read from the catalog.
async fn schema_is_current(client: &Client) -> Result<bool, StoreError> {
    let columns: Vec<String> = COLUMNS.iter().map(|c| (*c).to_string()).collect();
    let row = client
        .query_one(
            "SELECT
                (SELECT count(*) FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = 'stormguard_receipts'
                   AND column_name = ANY($1)),
                EXISTS (SELECT 1 FROM pg_indexes
                 WHERE schemaname = current_schema() AND indexname = 'stormguard_receipts_since')",
            &[&columns],
        )
        .await
        .map_err(err("read the schema"))?;
    let (found, index): (i64, bool) = (row.get(0), row.get(1));
    Ok(found == COLUMNS.len() as i64 && index)
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("options", &self.pool.options)
            .finish()
    }
}
