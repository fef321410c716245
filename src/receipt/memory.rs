use super::store::{Begin, ReceiptStore, StoreError};
use std::collections::HashMap;
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone)]
struct Row {
    fingerprint: String,
    owner: String,
    since_ms: u64,
    lease_until_ms: u64,
    receipt: Option<Vec<u8>>,
}

/// A receipt store in memory: for tests and single-process tools. Nothing survives the process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use stormguard::receipt::{Begin, InMemoryStore, ReceiptStore};
///
/// let store = InMemoryStore::new();
/// assert_eq!(store.begin("k", "fp", "me", 0, 1_000).await.unwrap(), Begin::Fresh);
/// store.complete("k", "me", b"sent", 10).await.unwrap();
/// assert!(matches!(store.begin("k", "fp", "you", 20, 1_020).await.unwrap(), Begin::Done { .. }));
/// assert_eq!(store.begin("k", "other", "you", 20, 1_020).await.unwrap(), Begin::Mismatch);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct InMemoryStore {
    rows: Arc<Mutex<HashMap<String, Row>>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> MutexGuard<'_, HashMap<String, Row>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.rows().len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("records", &self.len())
            .finish()
    }
}

impl ReceiptStore for InMemoryStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let mut rows = self.rows();
        let begin = match rows.get(key) {
            None => {
                rows.insert(
                    key.to_string(),
                    Row {
                        fingerprint: fingerprint.to_string(),
                        owner: owner.to_string(),
                        since_ms: now_ms,
                        lease_until_ms,
                        receipt: None,
                    },
                );
                Begin::Fresh
            }
            Some(row) if row.fingerprint != fingerprint => Begin::Mismatch,
            Some(row) => match &row.receipt {
                Some(receipt) => Begin::Done {
                    since_ms: row.since_ms,
                    receipt: receipt.clone(),
                },
                None => Begin::Pending {
                    since_ms: row.since_ms,
                    lease_until_ms: row.lease_until_ms,
                },
            },
        };
        ready(Ok(begin))
    }

    fn claim(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let mut rows = self.rows();
        let claimed = match rows.get_mut(key) {
            Some(row) if row.receipt.is_none() && row.lease_until_ms <= now_ms => {
                row.owner = owner.to_string();
                row.lease_until_ms = lease_until_ms;
                true
            }
            _ => false,
        };
        ready(Ok(claimed))
    }

    fn release(
        &self,
        key: &str,
        owner: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        if let Some(row) = self.rows().get_mut(key) {
            if row.receipt.is_none() && row.owner == owner {
                row.lease_until_ms = now_ms;
            }
        }
        ready(Ok(()))
    }

    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
        _now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let result = match self.rows().get_mut(key) {
            Some(row) if row.receipt.is_none() && row.owner == owner => {
                row.receipt = Some(receipt.to_vec());
                Ok(())
            }
            _ => Err(StoreError::new(format!(
                "{key}: this caller no longer holds the intent"
            ))),
        };
        ready(result)
    }

    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let mut rows = self.rows();
        if rows
            .get(key)
            .is_some_and(|row| row.receipt.is_none() && row.owner == owner)
        {
            rows.remove(key);
        }
        ready(Ok(()))
    }

    fn prune(&self, before_ms: u64) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let mut rows = self.rows();
        let before = rows.len();
        rows.retain(|_, row| row.since_ms >= before_ms);
        ready(Ok((before - rows.len()) as u64))
    }
}
