//! The invoice tool the receipt tests call: its request (`Send_`), its action and key, a provider
//! that counts deliveries and deduplicates by key (and its variants: a read-back of its log, one
//! never ready, one that refuses), the receipt layer over it, and a crashed call's intent.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::{Action, IdempotencyKey, KeyStamp};
use stormguard::receipt::{
    Begin, ReadBack, ReadBackResult, ReceiptConfig, ReceiptConfigBuilder, ReceiptGuardLayer,
    ReceiptStore,
};
use tower::Service;

pub const T0: u64 = 1_700_000_000_000;

pub fn code(err: BoxError) -> ErrorCode {
    match err.downcast::<ToolError>() {
        Ok(e) => e.code(),
        Err(e) => panic!("not a ToolError: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A tool whose provider counts deliveries and deduplicates by key.

#[derive(Clone, Debug)]
pub struct Send_ {
    pub invoice: u64,
    pub key: Option<String>,
}

impl KeyStamp for Send_ {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

pub fn send(invoice: u64) -> Send_ {
    Send_ { invoice, key: None }
}

pub fn action(req: &Send_) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-2", "send_invoice", &req.invoice)
}

pub type ActionFn = fn(&Send_) -> Result<Action, stormguard::key::KeyError>;

#[derive(Clone, Default)]
pub struct Provider {
    pub deliveries: Arc<AtomicU32>,
    pub seen: Arc<Mutex<std::collections::HashMap<String, String>>>,
    pub delay: Duration,
    pub dedup: bool,
}

impl Provider {
    pub fn keyed() -> Self {
        Provider {
            dedup: true,
            ..Provider::default()
        }
    }
    pub fn deliveries(&self) -> u32 {
        self.deliveries.load(Ordering::SeqCst)
    }
}

impl Service<Send_> for Provider {
    type Response = String;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<String, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Send_) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            tokio::time::sleep(this.delay).await;
            let key = req.key.clone().unwrap_or_default();
            if this.dedup {
                if let Some(sent) = this.seen.lock().unwrap().get(&key) {
                    return Ok(sent.clone());
                }
            }
            let n = this.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
            let sent = format!("msg-{}-{n}", req.invoice);
            this.seen.lock().unwrap().insert(key, sent.clone());
            Ok(sent)
        })
    }
}

pub fn layer<St: ReceiptStore>(store: &St, class: ToolClass) -> ReceiptGuardLayer<St, ActionFn> {
    ReceiptGuardLayer::new(store.clone(), class, action as ActionFn)
        .config(timing().build().unwrap())
}

/// A 30 s lease, a 2 s wait for a parallel duplicate.
pub fn timing() -> ReceiptConfigBuilder {
    ReceiptConfig::builder()
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(2))
}

pub async fn crash<St: ReceiptStore>(store: &St, invoice: u64) {
    let act = action(&send(invoice)).unwrap();
    let lease = Duration::from_secs(30);
    assert_eq!(
        store
            .begin(act.key().as_str(), act.fingerprint(), "crashed-run", lease)
            .await
            .unwrap(),
        Begin::Fresh
    );
}

/// A crashed call's intent with a 10 ms lease (passed by the time the test goes on).
pub async fn crash_short<St: ReceiptStore>(store: &St, invoice: u64) {
    let act = action(&send(invoice)).unwrap();
    store
        .begin(
            act.key().as_str(),
            act.fingerprint(),
            "crashed-run",
            Duration::from_millis(10),
        )
        .await
        .unwrap();
}

/// Runs each future on a task of its own and waits for them all, in order.
pub async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// The provider's own log of what it sent, as a read-back.
#[derive(Clone)]
pub struct SentLog(pub Provider);

impl ReadBack<Send_, String> for SentLog {
    fn read_back(&self, req: &Send_) -> impl Future<Output = ReadBackResult<String>> + Send {
        let found = self
            .0
            .seen
            .lock()
            .unwrap()
            .values()
            .find(|s| s.starts_with(&format!("msg-{}-", req.invoice)))
            .cloned();
        async move { found.map_or(ReadBackResult::Absent, ReadBackResult::Found) }
    }
}

/// A provider whose connection pool never becomes ready.
#[derive(Clone)]
pub struct NeverReady;

impl Service<Send_> for NeverReady {
    type Response = String;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<String, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Pending
    }
    fn call(&mut self, _: Send_) -> Self::Future {
        unreachable!("never ready")
    }
}

/// A provider that refuses the connection (a failure that did not take effect).
#[derive(Clone)]
pub struct Refusing;

impl Service<Send_> for Refusing {
    type Response = String;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<String, std::io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Send_) -> Self::Future {
        std::future::ready(Err(std::io::ErrorKind::ConnectionRefused.into()))
    }
}
