//! The PostgreSQL receipt store: several processes or machines share one run's receipts.

use super::store::{Begin, Durability, ReceiptStore, StoreError};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use tokio_postgres::{Client, NoTls, Statement};

/// A receipt store in PostgreSQL. Create the table once with [`PostgresStore::migrate`]
/// (idempotent); every query is parameterised, prepared once on first use and reused.
///
/// One connection serves every clone of the store; concurrent calls are pipelined on it.
///
/// ```no_run
/// # async fn example() -> Result<(), stormguard::receipt::StoreError> {
/// use stormguard::receipt::{Durability, PostgresStore};
/// let url = "host=127.0.0.1 user=postgres dbname=test";
/// let store = PostgresStore::connect_with(url, Durability::Process).await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
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
    prune: Statement,
}

const INSERT: &str =
    "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
     VALUES ($1, $2, $5, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING key";
const SELECT: &str = "SELECT fingerprint, since_ms, lease_until_ms, receipt
     FROM stormguard_receipts WHERE key = $1";
const CLAIM: &str = "UPDATE stormguard_receipts SET lease_until_ms = $3, owner = $4
     WHERE key = $1 AND receipt IS NULL AND lease_until_ms <= $2";
const RELEASE: &str = "UPDATE stormguard_receipts SET lease_until_ms = $2
     WHERE key = $1 AND receipt IS NULL AND owner = $3";
const COMPLETE: &str = "UPDATE stormguard_receipts SET receipt = $2, done_ms = $3
     WHERE key = $1 AND owner = $4 AND receipt IS NULL";
const ABANDON: &str =
    "DELETE FROM stormguard_receipts WHERE key = $1 AND receipt IS NULL AND owner = $2";
const PRUNE: &str = "DELETE FROM stormguard_receipts WHERE since_ms < $1";

fn err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::from_source(what, e)
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Inner {
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
            prune: prepare(PRUNE).await.map_err(err("prepare"))?,
        };
        // Two first calls may race to prepare: either set is as good as the other.
        Ok(self.statements.get_or_init(|| prepared))
    }
}

impl PostgresStore {
    /// Connects with [`Durability::PowerLoss`]: see [`connect_with`](Self::connect_with).
    pub async fn connect(config: &str) -> Result<Self, StoreError> {
        Self::connect_with(config, Durability::PowerLoss).await
    }

    /// Connects (without TLS: for a database on this host or a private network), sets this
    /// connection's `synchronous_commit` from `durability`, and spawns the connection task on
    /// the current tokio runtime.
    ///
    /// [`Durability::Process`] sets `synchronous_commit = off`: a commit returns before its WAL
    /// is flushed. Every client process may die without losing anything, but a crash or an
    /// immediate restart of the PostgreSQL server loses the commits of the last
    /// `3 × wal_writer_delay` (600 ms by default), and a lost intent is a repeated side effect.
    /// Use it where the database is as likely to outlive the run as the run's own disk is.
    /// [`Durability::PowerLoss`] keeps the server's setting (`on` by default, or a stronger
    /// `remote_write` / `remote_apply` from the role, database or connection string) and raises
    /// it to `on` only if it is `off`.
    pub async fn connect_with(config: &str, durability: Durability) -> Result<Self, StoreError> {
        let (client, connection) = tokio_postgres::connect(config, NoTls)
            .await
            .map_err(err("connect"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "receipt store connection closed");
            }
        });
        if durability == Durability::Process {
            client
                .batch_execute("SET synchronous_commit = off")
                .await
                .map_err(err("set synchronous_commit"))?;
        } else {
            let row = client
                .query_one("SHOW synchronous_commit", &[])
                .await
                .map_err(err("read synchronous_commit"))?;
            let current: String = row.get(0);
            if current == "off" {
                client
                    .batch_execute("SET synchronous_commit = on")
                    .await
                    .map_err(err("set synchronous_commit"))?;
            }
        }
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                client,
                statements: OnceLock::new(),
            }),
        })
    }

    /// This connection's `synchronous_commit`, as PostgreSQL reports it: what a commit of this
    /// store waits for (see [`Durability`]).
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
        let row = self
            .inner
            .client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .map_err(err("read synchronous_commit"))?;
        Ok(row.get(0))
    }

    /// Creates the table and index if they are missing (and adds columns a newer version needs).
    /// Safe to run at every start.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.inner
            .client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS stormguard_receipts (
                    key TEXT PRIMARY KEY,
                    fingerprint TEXT NOT NULL,
                    owner TEXT NOT NULL,
                    since_ms BIGINT NOT NULL,
                    lease_until_ms BIGINT NOT NULL,
                    receipt BYTEA,
                    done_ms BIGINT
                );
                ALTER TABLE stormguard_receipts
                    ADD COLUMN IF NOT EXISTS owner TEXT NOT NULL DEFAULT '';
                CREATE INDEX IF NOT EXISTS stormguard_receipts_since
                    ON stormguard_receipts (since_ms);",
            )
            .await
            .map_err(err("migrate"))
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl ReceiptStore for PostgresStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let inner = self.inner.clone();
        let (key, fingerprint, owner) =
            (key.to_string(), fingerprint.to_string(), owner.to_string());
        async move {
            let st = inner.statements().await?;
            loop {
                let inserted = inner
                    .client
                    .query_opt(
                        &st.insert,
                        &[&key, &fingerprint, &ms(now_ms), &ms(lease_until_ms), &owner],
                    )
                    .await
                    .map_err(err("record the intent"))?;
                if inserted.is_some() {
                    return Ok(Begin::Fresh);
                }
                // A new statement sees the row the conflicting insert committed.
                let row = inner
                    .client
                    .query_opt(&st.select, &[&key])
                    .await
                    .map_err(err("read the record"))?;
                let Some(row) = row else {
                    continue; // removed in between (an abandoned intent): try again
                };
                let (fp, since, lease, receipt): (String, i64, i64, Option<Vec<u8>>) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                return Ok(match receipt {
                    _ if fp != fingerprint => Begin::Mismatch,
                    Some(receipt) => Begin::Done {
                        since_ms: since as u64,
                        receipt,
                    },
                    None => Begin::Pending {
                        since_ms: since as u64,
                        lease_until_ms: lease as u64,
                    },
                });
            }
        }
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let inner = self.inner.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            let st = inner.statements().await?;
            let n = inner
                .client
                .execute(&st.claim, &[&key, &ms(now_ms), &ms(lease_until_ms), &owner])
                .await
                .map_err(err("claim the intent"))?;
            Ok(n == 1)
        }
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let inner = self.inner.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            let st = inner.statements().await?;
            inner
                .client
                .execute(&st.release, &[&key, &ms(now_ms), &owner])
                .await
                .map_err(err("release the intent"))?;
            Ok(())
        }
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let inner = self.inner.clone();
        let (key, owner, receipt) = (key.to_string(), owner.to_string(), receipt.to_vec());
        async move {
            let st = inner.statements().await?;
            let n = inner
                .client
                .execute(&st.complete, &[&key, &receipt, &ms(now_ms), &owner])
                .await
                .map_err(err("record the receipt"))?;
            if n == 1 {
                Ok(())
            } else {
                Err(StoreError::new(format!(
                    "{key}: this caller no longer holds the intent"
                )))
            }
        }
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let inner = self.inner.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            let st = inner.statements().await?;
            inner
                .client
                .execute(&st.abandon, &[&key, &owner])
                .await
                .map_err(err("remove the intent"))?;
            Ok(())
        }
    }

    fn prune(&self, before_ms: u64) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let inner = self.inner.clone();
        async move {
            let st = inner.statements().await?;
            inner
                .client
                .execute(&st.prune, &[&ms(before_ms)])
                .await
                .map_err(err("prune"))
        }
    }
}
