//! The store's calls: each `ReceiptStore` method as one job for the writer thread (see
//! `mod.rs`).

use super::schema::{read_record, read_row, row_record, RECORD_COLUMNS};
use super::{err, SqliteStore, PRUNE_STEP};
use crate::receipt::store::{
    Begin, InDoubt, PendingIntent, ReceiptStore, Resolution, Resolved, StoreError,
};
use rusqlite::params;
use std::future::Future;
use std::time::Duration;

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
                             AND (lease_until_ms <= ?2 OR lease_until_ms <= COALESCE(taken_ms, since_ms))
                             AND (sent_ms IS NULL OR lands_by_ms <= ?2 OR lands_by_ms <= sent_ms)",
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
