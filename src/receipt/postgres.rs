//! The PostgreSQL receipt store: several processes or machines share one run's receipts.

use super::store::{Begin, ReceiptStore, StoreError};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use tokio_postgres::{Client, NoTls};

/// A receipt store in PostgreSQL. Create the table once with [`PostgresStore::migrate`]
/// (idempotent); every query is parameterised.
///
/// ```no_run
/// # async fn example() -> Result<(), stormguard::receipt::StoreError> {
/// use stormguard::receipt::PostgresStore;
/// let store = PostgresStore::connect("host=127.0.0.1 user=postgres dbname=test").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    client: Arc<Client>,
}

fn err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::from_source(what, e)
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Connects (without TLS: for a database on this host or a private network) and spawns the
    /// connection task on the current tokio runtime.
    pub async fn connect(config: &str) -> Result<Self, StoreError> {
        let (client, connection) = tokio_postgres::connect(config, NoTls)
            .await
            .map_err(err("connect"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "receipt store connection closed");
            }
        });
        Ok(PostgresStore {
            client: Arc::new(client),
        })
    }

    /// Creates the table and index if they are missing (and adds columns a newer version needs).
    /// Safe to run at every start.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.client
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
        let client = self.client.clone();
        let (key, fingerprint, owner) =
            (key.to_string(), fingerprint.to_string(), owner.to_string());
        async move {
            loop {
                let inserted = client
                    .query_opt(
                        "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
                         VALUES ($1, $2, $5, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING key",
                        &[&key, &fingerprint, &ms(now_ms), &ms(lease_until_ms), &owner],
                    )
                    .await
                    .map_err(err("record the intent"))?;
                if inserted.is_some() {
                    return Ok(Begin::Fresh);
                }
                // A new statement sees the row the conflicting insert committed.
                let row = client
                    .query_opt(
                        "SELECT fingerprint, since_ms, lease_until_ms, receipt
                         FROM stormguard_receipts WHERE key = $1",
                        &[&key],
                    )
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
        let client = self.client.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            let n = client
                .execute(
                    "UPDATE stormguard_receipts SET lease_until_ms = $3, owner = $4
                     WHERE key = $1 AND receipt IS NULL AND lease_until_ms <= $2",
                    &[&key, &ms(now_ms), &ms(lease_until_ms), &owner],
                )
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
        let client = self.client.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            client
                .execute(
                    "UPDATE stormguard_receipts SET lease_until_ms = $2
                     WHERE key = $1 AND receipt IS NULL AND owner = $3",
                    &[&key, &ms(now_ms), &owner],
                )
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
        let client = self.client.clone();
        let (key, owner, receipt) = (key.to_string(), owner.to_string(), receipt.to_vec());
        async move {
            let n = client
                .execute(
                    "UPDATE stormguard_receipts SET receipt = $2, done_ms = $3
                     WHERE key = $1 AND owner = $4 AND receipt IS NULL",
                    &[&key, &receipt, &ms(now_ms), &owner],
                )
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
        let client = self.client.clone();
        let (key, owner) = (key.to_string(), owner.to_string());
        async move {
            client
                .execute(
                    "DELETE FROM stormguard_receipts WHERE key = $1 AND receipt IS NULL AND owner = $2",
                    &[&key, &owner],
                )
                .await
                .map_err(err("remove the intent"))?;
            Ok(())
        }
    }

    fn prune(&self, before_ms: u64) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let client = self.client.clone();
        async move {
            client
                .execute(
                    "DELETE FROM stormguard_receipts WHERE since_ms < $1",
                    &[&ms(before_ms)],
                )
                .await
                .map_err(err("prune"))
        }
    }
}
