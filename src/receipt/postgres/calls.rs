//! The store's calls: each `ReceiptStore` method as one job for its key's committer (see
//! `committer.rs`), its statements prepared once per connection.

use super::{err, ms, open, PostgresStore, PRUNE_STEP};
use crate::receipt::store::{
    Begin, PendingIntent, ReceiptStore, Record, Resolution, Resolved, StoreError,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

impl ReceiptStore for PostgresStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let args = Arc::new((key.to_string(), fingerprint.to_string(), owner.to_string()));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, fingerprint, owner) = &*args;
                let st = conn.statements().await?;
                loop {
                    let inserted = conn
                        .client
                        .query_opt(&st.insert, &[key, fingerprint, owner, &ms(lease), &now])
                        .await
                        .map_err(err("record the intent"))?;
                    if inserted.is_some() {
                        return Ok(Begin::Fresh);
                    }
                    // A new statement sees the row the conflicting insert committed.
                    let row = conn
                        .client
                        .query_opt(&st.select, &[key, &now])
                        .await
                        .map_err(err("read the record"))?;
                    let Some(row) = row else {
                        continue; // removed in between (an abandoned intent): try again
                    };
                    let (fp, holder, receipt): (String, String, Option<Vec<u8>>) =
                        (row.get(0), row.get(1), row.get(4));
                    let (since, lease_until, at): (i64, i64, i64) =
                        (row.get(2), row.get(3), row.get(5));
                    let record = Record {
                        fingerprint: &fp,
                        owner: &holder,
                        since_ms: since as u64,
                        lease_until_ms: lease_until as u64,
                        receipt: receipt.as_deref(),
                    };
                    return Ok(Begin::decide(Some(record), fingerprint, owner, at as u64));
                }
            }
        })
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let args = Arc::new((key.to_string(), owner.to_string()));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, owner) = &*args;
                let st = conn.statements().await?;
                let n = conn
                    .client
                    .execute(&st.claim, &[key, owner, &ms(lease), &now])
                    .await
                    .map_err(err("claim the intent"))?;
                Ok(n == 1)
            }
        })
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let args = Arc::new((key.to_string(), owner.to_string()));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, owner) = &*args;
                let st = conn.statements().await?;
                conn.client
                    .execute(&st.release, &[key, owner, &now])
                    .await
                    .map_err(err("release the intent"))?;
                Ok(())
            }
        })
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let args = Arc::new((key.to_string(), owner.to_string(), receipt.to_vec()));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, owner, receipt) = &*args;
                let st = conn.statements().await?;
                let n = conn
                    .client
                    .execute(&st.complete, &[key, receipt, owner, &now])
                    .await
                    .map_err(err("record the receipt"))?;
                if n == 1 {
                    Ok(())
                } else {
                    Err(StoreError::not_holder(key))
                }
            }
        })
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let args = Arc::new((key.to_string(), owner.to_string()));
        self.pool.submit(key, move |conn, _| {
            let args = args.clone();
            async move {
                let (key, owner) = &*args;
                let st = conn.statements().await?;
                conn.client
                    .execute(&st.abandon, &[key, owner])
                    .await
                    .map_err(err("remove the intent"))?;
                Ok(())
            }
        })
    }

    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        let args = Arc::new((key.to_string(), resolution));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, resolution) = &*args;
                let st = conn.statements().await?;
                let n = match resolution {
                    Resolution::Done(receipt) => conn
                        .client
                        .execute(&st.settle_done, &[key, receipt, &now])
                        .await
                        .map_err(err("record the receipt"))?,
                    Resolution::NotDone => conn
                        .client
                        .execute(&st.settle_not_done, &[key])
                        .await
                        .map_err(err("remove the intent"))?,
                };
                if n == 1 {
                    return Ok(Resolved::Settled);
                }
                let done = conn
                    .client
                    .query_opt(&st.done, &[key])
                    .await
                    .map_err(err("read the record"))?;
                Ok(match done {
                    Some(_) => Resolved::AlreadyDone,
                    None => Resolved::NoRecord,
                })
            }
        })
    }

    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingIntent>, StoreError>> + Send {
        let pool = self.pool.clone();
        async move {
            let conn = open(&pool.options).await?;
            let rows = conn
                .client
                .query(
                    "SELECT key, since_ms, lease_until_ms,
                    COALESCE($2::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
                 FROM stormguard_receipts WHERE receipt IS NULL ORDER BY since_ms, key LIMIT $1",
                    &[&i64::try_from(limit).unwrap_or(i64::MAX), &pool.now()],
                )
                .await
                .map_err(err("list the pending intents"))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let (since, lease, now): (i64, i64, i64) = (r.get(1), r.get(2), r.get(3));
                    PendingIntent {
                        key: r.get(0),
                        age_ms: now.saturating_sub(since).max(0) as u64,
                        lease_left_ms: lease.saturating_sub(now).max(0) as u64,
                    }
                })
                .collect())
        }
    }

    /// On a connection of its own, one batch of rows per statement (autocommit), so it never
    /// joins a batch of calls (nor holds their rows' locks while it runs).
    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let pool = self.pool.clone();
        async move {
            let conn = open(&pool.options).await?;
            let st = conn.statements().await?;
            let mut removed = 0;
            loop {
                let n = conn
                    .client
                    .execute(&st.prune, &[&ms(older_than), &pool.now()])
                    .await
                    .map_err(err("prune"))?;
                removed += n;
                if n < PRUNE_STEP {
                    return Ok(removed);
                }
            }
        }
    }
}
