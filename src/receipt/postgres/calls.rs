//! The store's calls: each `ReceiptStore` method as one job for its key's committer (see
//! `committer.rs`), its statements prepared once per connection.

use super::{err, ms, open, PostgresStore, PRUNE_STEP};
use crate::receipt::store::{
    Begin, InDoubt, PendingIntent, ReceiptStore, Record, Resolution, Resolved, StoreError,
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
                    let (owned, at) = Owned::read(&row);
                    return Ok(Begin::decide(Some(owned.record()), fingerprint, owner, at));
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
        in_doubt: Option<InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let args = Arc::new((key.to_string(), owner.to_string()));
        let sent_ago = in_doubt.map(|d| ms(d.sent_ago));
        let within = in_doubt.map_or(0, |d| ms(d.lands_within));
        self.pool.submit(key, move |conn, now| {
            let args = args.clone();
            async move {
                let (key, owner) = &*args;
                let st = conn.statements().await?;
                conn.client
                    .execute(&st.release, &[key, owner, &now, &sent_ago, &within])
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
                // Each statement checks what `Record::resolve` allows, so a record changed in
                // between (a take-over) is never settled over; a few rounds are plenty.
                for _ in 0..8 {
                    let n = match resolution {
                        Resolution::Done(receipt) => conn
                            .client
                            .execute(&st.settle_done, &[key, receipt, &now])
                            .await
                            .map_err(err("record the receipt"))?,
                        Resolution::NotDone => conn
                            .client
                            .execute(&st.settle_not_done, &[key, &now])
                            .await
                            .map_err(err("remove the intent"))?,
                    };
                    if n == 1 {
                        return Ok(Resolved::Settled);
                    }
                    let row = conn
                        .client
                        .query_opt(&st.select, &[key, &now])
                        .await
                        .map_err(err("read the record"))?;
                    let Some(row) = row else {
                        return Ok(Resolved::NoRecord);
                    };
                    let (owned, at) = Owned::read(&row);
                    match owned.record().resolve(resolution, at) {
                        Resolved::Settled => continue, // changed in between: once more
                        refused => return Ok(refused),
                    }
                }
                Err(StoreError::new(
                    "settle the intent: the record kept changing",
                ))
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
                    "SELECT fingerprint, owner, since_ms, lease_until_ms, receipt,
                    COALESCE(taken_ms, since_ms), sent_ms, COALESCE(lands_by_ms, 0),
                    COALESCE($2::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint),
                    key
                 FROM stormguard_receipts WHERE receipt IS NULL ORDER BY since_ms, key LIMIT $1",
                    &[&i64::try_from(limit).unwrap_or(i64::MAX), &pool.now()],
                )
                .await
                .map_err(err("list the pending intents"))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let (owned, now) = Owned::read(r);
                    owned.record().pending(r.get(9), now)
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

/// A row of `SELECT` (the columns of a [`Record`], then the store's time), owned.
struct Owned {
    fingerprint: String,
    owner: String,
    since: i64,
    lease_until: i64,
    receipt: Option<Vec<u8>>,
    taken: i64,
    sent: Option<i64>,
    lands_by: i64,
}

impl Owned {
    /// The record's columns and the store's time, from a row of `SELECT`'s shape.
    fn read(row: &tokio_postgres::Row) -> (Owned, u64) {
        let owned = Owned {
            fingerprint: row.get(0),
            owner: row.get(1),
            since: row.get(2),
            lease_until: row.get(3),
            receipt: row.get(4),
            taken: row.get(5),
            sent: row.get(6),
            lands_by: row.get(7),
        };
        let now: i64 = row.get(8);
        (owned, now.max(0) as u64)
    }

    fn record(&self) -> Record<'_> {
        let ms = |v: i64| v.max(0) as u64;
        Record {
            fingerprint: &self.fingerprint,
            owner: &self.owner,
            since_ms: ms(self.since),
            lease_until_ms: ms(self.lease_until),
            receipt: self.receipt.as_deref(),
            taken_ms: ms(self.taken),
            sent_ms: self.sent.map(ms),
            lands_by_ms: ms(self.lands_by),
        }
    }
}
