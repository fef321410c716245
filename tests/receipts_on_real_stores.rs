//! The receipt guard and its stores on real backends, one test each: real
//! SQLite files, the real PostgreSQL (when `STORMGUARD_POSTGRES_URL` is set; CI sets it) and real
//! HTTP servers on 127.0.0.1.
#![cfg(all(feature = "sqlite", feature = "postgres"))]
mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::classify::{HttpClassifier, NotProcessed};
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::{Action, IdempotencyKey, KeyStamp};
use stormguard::receipt::{
    Begin, Codec, Consistency, Durability, InMemoryStore, ManualClock, NotStored, PostgresOptions,
    PostgresStore, ReadBack, ReadBackResult, ReceiptConfig, ReceiptConfigBuilder,
    ReceiptGuardLayer, ReceiptStore, Resolution, Resolved, SqliteStore, StoreError,
};
use stormguard::retry::{HttpReplay, RetryLayer};
use support::server::{self, Body, HttpClient};
use support::stores::{fresh_schema, pg_store, raw_pg, temp_db};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

const T0: u64 = 1_700_000_000_000;

fn code(err: BoxError) -> ErrorCode {
    match err.downcast::<ToolError>() {
        Ok(e) => e.code(),
        Err(e) => panic!("not a ToolError: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A tool whose provider counts deliveries and deduplicates by key.

#[derive(Clone, Debug)]
struct Send_ {
    invoice: u64,
    key: Option<String>,
}

impl KeyStamp for Send_ {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

fn send(invoice: u64) -> Send_ {
    Send_ { invoice, key: None }
}

fn action(req: &Send_) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-2", "send_invoice", &req.invoice)
}

type ActionFn = fn(&Send_) -> Result<Action, stormguard::key::KeyError>;

#[derive(Clone, Default)]
struct Provider {
    deliveries: Arc<AtomicU32>,
    seen: Arc<Mutex<std::collections::HashMap<String, String>>>,
    delay: Duration,
    dedup: bool,
}

impl Provider {
    fn keyed() -> Self {
        Provider {
            dedup: true,
            ..Provider::default()
        }
    }
    fn deliveries(&self) -> u32 {
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

fn layer<St: ReceiptStore>(store: &St, class: ToolClass) -> ReceiptGuardLayer<St, ActionFn> {
    ReceiptGuardLayer::new(store.clone(), class, action as ActionFn)
        .config(timing().build().unwrap())
}

/// A 30 s lease, a 2 s wait for a parallel duplicate.
fn timing() -> ReceiptConfigBuilder {
    ReceiptConfig::builder()
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(2))
}

async fn crash<St: ReceiptStore>(store: &St, invoice: u64) {
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

// ---------------------------------------------------------------------------------------------
// 1. A 503 on a write is not proof that nothing happened.

/// The HTTP client below the receipt layer, its answer reduced to the status (what the tool's
/// caller needs, and what a receipt can hold).
fn status_client() -> tower::util::BoxCloneService<http::Request<Body>, http::Response<()>, BoxError>
{
    tower::util::BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(|resp: http::Response<hyper::body::Incoming>| resp.map(|_| ()))
            .service(HttpClient::new()),
    )
}

#[derive(Clone)]
struct StatusCodec;

impl Codec<http::Response<()>> for StatusCodec {
    fn encode(&self, res: &http::Response<()>) -> Result<Vec<u8>, BoxError> {
        Ok(res.status().as_u16().to_be_bytes().to_vec())
    }
    fn decode(&self, bytes: &[u8]) -> Result<http::Response<()>, BoxError> {
        let code = u16::from_be_bytes(bytes.try_into()?);
        Ok(http::Response::builder().status(code).body(())?)
    }
}

fn email(addr: std::net::SocketAddr) -> http::Request<Body> {
    http::Request::post(format!("http://{addr}/emails/4471"))
        .body(Body::default())
        .unwrap()
}

fn email_action(req: &http::Request<Body>) -> Result<Action, stormguard::key::KeyError> {
    Action::new("run-1", "step-2", "send_email", &req.uri().path())
}

#[tokio::test]
async fn a_503_after_the_work_is_never_a_second_email_reported_as_success() {
    // The provider sends the email, then a proxy in front of it answers 503 (upstream reset).
    let (addr, emails) = server::serve(|_| server::status(503, &[])).await;
    let store = SqliteStore::open(temp_db("503"), Durability::Process).unwrap();
    let receipts = ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, email_action)
        .classifier(HttpClassifier)
        .codec(StatusCodec);
    let mut tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts.clone())
        .service(status_client());
    let err = tool
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert_eq!(emails.load(Ordering::SeqCst), 1, "not sent again");
    // The agent resumes and asks again: the intent is pending, nothing tells whether the email
    // went out, so it stays escalated.
    let mut resumed = receipts.layer(status_client());
    let err = resumed
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap_err();
    assert_eq!(code(err), ErrorCode::OutcomeUnknown);
    assert_eq!(emails.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_503_on_a_read_is_still_retried_and_a_documented_not_processed_503_is_retried_for_writes()
{
    let (addr, calls) = server::serve(|n| server::status(if n < 2 { 503 } else { 200 }, &[])).await;
    let mut read = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::Read, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .service(status_client());
    let get = http::Request::get(format!("http://{addr}/invoices/4471"))
        .body(Body::default())
        .unwrap();
    assert_eq!(
        read.ready()
            .await
            .unwrap()
            .call(get)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // A provider documented to answer 503 only before processing, with no proxy in between.
    let (addr, calls) = server::serve(|n| server::status(if n < 1 { 503 } else { 200 }, &[])).await;
    let documented =
        NotProcessed::new(HttpClassifier, [http::StatusCode::SERVICE_UNAVAILABLE]).unwrap();
    let store = InMemoryStore::new();
    let mut write = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default())
                .classifier(documented)
                .replay(HttpReplay),
        )
        .layer(
            ReceiptGuardLayer::new(store, ToolClass::UnkeyedWrite, email_action)
                .classifier(documented)
                .codec(StatusCodec),
        )
        .service(status_client());
    let ok = write
        .ready()
        .await
        .unwrap()
        .call(email(addr))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the 503 was trusted: sent again"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Leases judged by one clock: the store's.

#[tokio::test]
async fn postgres_judges_every_lease_by_the_server_clock() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    // Two machines, each with its own connection; neither layer reads a local clock.
    let a = PostgresStore::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    let b = PostgresStore::connect(&url).await.unwrap();
    let provider = Provider {
        delay: Duration::from_millis(1_000),
        ..Provider::default()
    };
    let lease = |st: &PostgresStore| {
        ReceiptGuardLayer::new(st.clone(), ToolClass::KeyedWrite, action as ActionFn).config(
            ReceiptConfig::builder()
                .lease(Duration::from_millis(1_500))
                .wait(Duration::from_secs(5))
                .build()
                .unwrap(),
        )
    };
    let (mut on_a, mut on_b) = (
        lease(&a).layer(provider.clone()),
        lease(&b).layer(provider.clone()),
    );
    let (first, second) = tokio::join!(on_a.ready().await.unwrap().call(send(51)), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        on_b.ready().await.unwrap().call(send(51)).await
    });
    assert_eq!(first.unwrap(), second.unwrap());
    assert_eq!(provider.deliveries(), 1, "the live call was not taken over");
    // The ages the store reports are the server's: a fresh record is a few ms old.
    let key = action(&send(52)).unwrap();
    b.begin(
        key.key().as_str(),
        key.fingerprint(),
        "x",
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    match a
        .begin(
            key.key().as_str(),
            key.fingerprint(),
            "y",
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    {
        Begin::Pending {
            age_ms,
            lease_left_ms,
        } => {
            assert!(age_ms < 5_000, "{age_ms}");
            assert!(
                (25_000..=30_000).contains(&lease_left_ms),
                "{lease_left_ms}"
            );
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// 6. A resume older than the provider's key window is not a keyed retry.

#[derive(Clone)]
struct SentLog(Provider);

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

#[tokio::test]
async fn a_keyed_resume_past_the_key_window_is_treated_as_unkeyed() {
    let clock = ManualClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    let provider = Provider::keyed();
    crash(&store, 61).await;
    clock.advance_ms(48 * 3600 * 1000); // 48 h later: past Stripe's 24 h
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let err = svc.ready().await.unwrap().call(send(61)).await.unwrap_err();
    let err = err.downcast::<ToolError>().unwrap();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown);
    assert!(err.hint().contains("window"), "{}", err.hint());
    assert_eq!(provider.deliveries(), 0);
    // With a consistent read-back, the provider's log decides.
    let mut checked = layer(&store, ToolClass::KeyedWrite)
        .read_back(SentLog(provider.clone()), Consistency::Immediate)
        .layer(provider.clone());
    checked.ready().await.unwrap().call(send(61)).await.unwrap();
    assert_eq!(provider.deliveries(), 1);
    // Inside the window, the same crash resumes with its key.
    crash(&store, 62).await;
    clock.advance_ms(3600 * 1000);
    let mut svc = layer(&store, ToolClass::KeyedWrite)
        .config(
            timing()
                .key_window(Duration::from_secs(2 * 3600))
                .build()
                .unwrap(),
        )
        .layer(provider.clone());
    svc.ready().await.unwrap().call(send(62)).await.unwrap();
    assert_eq!(provider.deliveries(), 2);
}

// ---------------------------------------------------------------------------------------------
// 7. Starting a store never stalls the fleet; no statement waits without bound.

#[tokio::test]
async fn migrate_takes_no_lock_when_the_schema_is_current() {
    let Some((store, url)) = pg_store().await else {
        return;
    };
    // A reader and a writer hold transactions open on the table.
    let reader = raw_pg(&url).await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM stormguard_receipts;")
        .await
        .unwrap();
    let writer = raw_pg(&url).await;
    writer
        .batch_execute(
            "BEGIN; INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
             VALUES ('held', 'fp', 'w', 0, 0);",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let restarted = PostgresStore::connect(&url).await.unwrap();
    restarted.migrate().await.unwrap();
    let lease = Duration::from_secs(30);
    assert_eq!(
        restarted.begin("other", "fp", "me", lease).await.unwrap(),
        Begin::Fresh
    );
    assert_eq!(
        store.begin("third", "fp", "me", lease).await.unwrap(),
        Begin::Fresh
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    reader.batch_execute("ROLLBACK").await.unwrap();
    writer.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_locked_table_fails_a_store_call_in_bounded_time() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let store = PostgresOptions::builder(&url)
        .lock_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let locker = raw_pg(&url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE stormguard_receipts IN ACCESS EXCLUSIVE MODE;")
        .await
        .unwrap();
    let started = Instant::now();
    let provider = Provider::keyed();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let err = svc.ready().await.unwrap().call(send(71)).await.unwrap_err();
    assert_eq!(code(err), ErrorCode::StoreUnavailable);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.deliveries(), 0);
    locker.batch_execute("ROLLBACK").await.unwrap();
    svc.ready().await.unwrap().call(send(71)).await.unwrap();
    assert_eq!(provider.deliveries(), 1);
}

// ---------------------------------------------------------------------------------------------
// 8. A deleted or replaced SQLite file is noticed.

#[tokio::test]
async fn a_deleted_or_replaced_sqlite_file_fails_closed() {
    for replace in [false, true] {
        let path = temp_db(if replace { "replaced" } else { "deleted" });
        let store = SqliteStore::open(&path, Durability::Process).unwrap();
        let provider = Provider::default();
        let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(provider.clone());
        svc.ready().await.unwrap().call(send(81)).await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        if replace {
            drop(SqliteStore::open(&path, Durability::Process).unwrap());
        }
        let err = svc.ready().await.unwrap().call(send(81)).await.unwrap_err();
        assert_eq!(code(err), ErrorCode::StoreUnavailable, "replace: {replace}");
        assert_eq!(provider.deliveries(), 1, "never sent twice");
    }
    // A resumed process refuses a store that is gone rather than starting empty.
    let missing = temp_db("missing");
    assert!(SqliteStore::open_existing(&missing, Durability::Process).is_err());
}

// ---------------------------------------------------------------------------------------------
// 9. Waiters wait.

async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
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

/// A crashed call's intent with a 10 ms lease (passed by the time the test goes on).
async fn crash_short<St: ReceiptStore>(store: &St, invoice: u64) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_lose_the_take_over_wait_for_the_receipt() {
    for store in [StoreKind::Memory, StoreKind::Sqlite, StoreKind::Postgres] {
        let Some(store) = store.open().await else {
            continue;
        };
        match store {
            Opened::Memory(s) => waiters_wait_short(s).await,
            Opened::Sqlite(s) => waiters_wait_short(s).await,
            Opened::Postgres(s) => waiters_wait_short(s).await,
        }
    }
}

async fn waiters_wait_short<St: ReceiptStore>(store: St) {
    // The crashed call's lease passes; then 20 duplicates arrive at once. One takes it over;
    // the others wait for its receipt instead of answering in_progress at once.
    crash_short(&store, 91).await;
    let provider = Provider {
        delay: Duration::from_millis(200),
        ..Provider::keyed()
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let svc = ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, action as ActionFn)
        .config(
            ReceiptConfig::builder()
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(5))
                .build()
                .unwrap(),
        )
        .layer(provider.clone());
    let results = futures_join_all((0..20).map(|_| svc.clone().oneshot(send(91)))).await;
    let codes: Vec<_> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(codes.is_empty(), "refused: {codes:?}");
    assert_eq!(provider.deliveries(), 1);
}

enum StoreKind {
    Memory,
    Sqlite,
    Postgres,
}

enum Opened {
    Memory(InMemoryStore),
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl StoreKind {
    async fn open(self) -> Option<Opened> {
        Some(match self {
            StoreKind::Memory => Opened::Memory(InMemoryStore::new()),
            StoreKind::Sqlite => {
                Opened::Sqlite(SqliteStore::open(temp_db("kind"), Durability::Process).unwrap())
            }
            StoreKind::Postgres => Opened::Postgres(pg_store().await?.0),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Cancellation during `begin` (and before the send) leaves no orphan.

#[tokio::test]
async fn a_call_cancelled_while_sqlite_records_its_intent_leaves_no_orphan() {
    let path = temp_db("cancel");
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    // Another process holds the write lock: recording the intent waits for it.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let lock_path = path.clone();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&lock_path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        conn.execute_batch("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(provider.clone());
    let timed_out = tokio::time::timeout(
        Duration::from_millis(100),
        svc.ready().await.unwrap().call(send(101)),
    )
    .await;
    assert!(
        timed_out.is_err(),
        "the caller's timeout fired during begin"
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    // The intent recorded after the caller left is removed by the clean-up queued behind it:
    // the next attempt sends at once (not in_progress, not outcome_unknown).
    let started = Instant::now();
    svc.ready().await.unwrap().call(send(101)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.deliveries(), 1);
}

#[tokio::test]
async fn a_call_cancelled_while_postgres_records_its_intent_leaves_no_orphan() {
    let Some((store, url)) = pg_store().await else {
        return;
    };
    let locker = raw_pg(&url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE stormguard_receipts IN EXCLUSIVE MODE;")
        .await
        .unwrap();
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(provider.clone());
    let timed_out = tokio::time::timeout(
        Duration::from_millis(100),
        svc.ready().await.unwrap().call(send(102)),
    )
    .await;
    assert!(timed_out.is_err());
    tokio::time::sleep(Duration::from_millis(50)).await;
    locker.batch_execute("COMMIT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    svc.ready().await.unwrap().call(send(102)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.deliveries(), 1);
}

/// A provider whose connection pool never becomes ready.
#[derive(Clone)]
struct NeverReady;

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

#[tokio::test]
async fn a_call_cancelled_before_it_was_sent_removes_its_intent() {
    let store = InMemoryStore::new();
    let mut stuck = layer(&store, ToolClass::UnkeyedWrite).layer(NeverReady);
    let timed_out = tokio::time::timeout(
        Duration::from_millis(50),
        stuck.ready().await.unwrap().call(send(103)),
    )
    .await;
    assert!(timed_out.is_err());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.is_empty(), "the unsent intent was removed");
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(provider.clone());
    svc.ready().await.unwrap().call(send(103)).await.unwrap();
    assert_eq!(provider.deliveries(), 1);
}

// ---------------------------------------------------------------------------------------------
// 11. A receipt hit costs nothing downstream.

#[tokio::test]
async fn a_receipt_hit_never_waits_for_or_spends_a_quota_slot() {
    use stormguard::quota::{QuotaLayer, Rate};
    let store = InMemoryStore::new();
    let provider = Provider::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer(&store, ToolClass::KeyedWrite))
        .layer(QuotaLayer::new(Rate::per_second(5).build().unwrap()))
        .service(provider.clone());
    let started = Instant::now();
    for _ in 0..6 {
        svc.ready().await.unwrap().call(send(111)).await.unwrap();
    }
    assert_eq!(provider.deliveries(), 1);
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "receipt hits waited for the quota: {:?}",
        started.elapsed()
    );
    // The quota's slots are all there for the next real sends: 1 used, 4 left in the first
    // second... a second action goes out at once.
    let started = Instant::now();
    svc.ready().await.unwrap().call(send(112)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 12. The in-memory store never stalls the runtime; SQLite prunes in batches.

#[tokio::test(flavor = "current_thread")]
async fn pruning_a_large_in_memory_store_leaves_the_runtime_responsive() {
    let clock = ManualClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    let lease = Duration::from_secs(30);
    for i in 0..100_000u32 {
        store
            .begin(&format!("k{i}"), "fp", "me", lease)
            .await
            .unwrap();
    }
    clock.advance_ms(10_000);
    let lag = Arc::new(Mutex::new(Duration::ZERO));
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ticker = {
        let lag = lag.clone();
        tokio::spawn(async move {
            loop {
                let before = Instant::now();
                tokio::select! {
                    _ = &mut stop_rx => return,
                    _ = tokio::task::yield_now() => {}
                }
                let gap = before.elapsed();
                let mut worst = lag.lock().unwrap();
                *worst = (*worst).max(gap);
            }
        })
    };
    let removed = store.prune(Duration::from_secs(5)).await.unwrap();
    stop_tx.send(()).unwrap();
    ticker.await.unwrap();
    assert_eq!(removed, 100_000);
    assert!(store.is_empty());
    let worst = *lag.lock().unwrap();
    assert!(
        worst < Duration::from_millis(100),
        "the runtime stalled for {worst:?}"
    );
}

#[tokio::test]
async fn sqlite_prunes_more_than_one_batch() {
    let clock = ManualClock::new(T0);
    let store =
        SqliteStore::open_with_clock(temp_db("prune"), Durability::Process, clock.clone()).unwrap();
    let lease = Duration::from_secs(30);
    let writes = futures_join_all((0..2_500u32).map(|i| {
        let store = store.clone();
        async move {
            store
                .begin(&format!("k{i}"), "fp", "me", lease)
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(writes.iter().all(|b| *b == Begin::Fresh));
    clock.advance_ms(10_000);
    store.begin("young", "fp", "me", lease).await.unwrap();
    assert_eq!(store.prune(Duration::from_secs(5)).await.unwrap(), 2_500);
    assert!(matches!(
        store.begin("young", "fp", "other", lease).await.unwrap(),
        Begin::Pending { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// 14. Smaller promises.

#[tokio::test]
async fn postgres_reconnects_after_its_backends_die() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let name = format!("sg_reconnect_{}", std::process::id());
    let url = format!("{url} application_name={name}");
    let store = PostgresOptions::builder(&url)
        .connections(2)
        .build()
        .unwrap()
        .connect()
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let lease = Duration::from_secs(30);
    store.begin("before", "fp", "me", lease).await.unwrap();
    let admin = raw_pg(&std::env::var("STORMGUARD_POSTGRES_URL").unwrap()).await;
    let killed = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert!(killed.get::<_, i64>(0) >= 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every later call works again: the dead connections are opened anew.
    for i in 0..4 {
        assert_eq!(
            store
                .begin(&format!("after-{i}"), "fp", "me", lease)
                .await
                .unwrap(),
            Begin::Fresh
        );
    }
}

#[tokio::test]
async fn an_old_receipt_on_hand_still_answers() {
    let clock = ManualClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let first = svc.ready().await.unwrap().call(send(141)).await.unwrap();
    clock.advance_ms(8 * 24 * 3600 * 1000); // past the 7-day retention
    assert_eq!(
        svc.ready().await.unwrap().call(send(141)).await.unwrap(),
        first
    );
    assert_eq!(provider.deliveries(), 1);
    // An old intent without a receipt is refused, with a hint that says how to settle it.
    crash(&store, 142).await;
    clock.advance_ms(8 * 24 * 3600 * 1000);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(send(142))
        .await
        .unwrap_err();
    let err = err.downcast::<ToolError>().unwrap();
    assert_eq!(err.code(), ErrorCode::ReceiptExpired);
    assert!(err.hint().contains("resolve"), "{}", err.hint());
}

/// What goes wrong in a [`Faulty`] store.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// The first `complete` fails (a full disk).
    FirstCompleteFails,
    /// Every `claim` is recorded, but its reply is lost.
    ClaimRepliesLost,
    /// The first `claim` finds another caller took the intent, finished without effect and
    /// removed it.
    FirstClaimLostToAnother,
}

/// The in-memory store with one [`Fault`].
#[derive(Clone)]
struct Faulty {
    store: InMemoryStore,
    calls: Arc<AtomicU32>,
    fault: Fault,
}

impl Faulty {
    fn new(fault: Fault) -> Self {
        Faulty {
            store: InMemoryStore::new(),
            calls: Arc::default(),
            fault,
        }
    }

    /// Whether this is the first call the fault counts.
    fn first(&self, fault: Fault) -> bool {
        self.fault == fault && self.calls.fetch_add(1, Ordering::SeqCst) == 0
    }
}

impl ReceiptStore for Faulty {
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.store.begin(key, fingerprint, owner, lease)
    }
    fn claim(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let lost = self.fault == Fault::ClaimRepliesLost;
        let taken = self.first(Fault::FirstClaimLostToAnother);
        let (store, gone) = (self.store.clone(), key.to_string());
        let claimed = self.store.claim(key, owner, lease);
        async move {
            if taken {
                let _ = store.resolve(&gone, Resolution::NotDone).await;
                return Ok(false);
            }
            let claimed = claimed.await;
            if lost {
                return Err(StoreError::new("the reply was lost"));
            }
            claimed
        }
    }
    fn release(
        &self,
        key: &str,
        owner: &str,
        in_doubt: Option<stormguard::receipt::InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.release(key, owner, in_doubt)
    }
    fn complete(
        &self,
        key: &str,
        owner: &str,
        receipt: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let fail = self.first(Fault::FirstCompleteFails);
        let done = self.store.complete(key, owner, receipt);
        async move {
            if fail {
                return Err(StoreError::new("disk full"));
            }
            done.await
        }
    }
    fn abandon(
        &self,
        key: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.abandon(key, owner)
    }
    fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        self.store.resolve(key, resolution)
    }
    fn pending(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<stormguard::receipt::PendingIntent>, StoreError>> + Send
    {
        self.store.pending(limit)
    }
    fn prune(&self, older_than: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.store.prune(older_than)
    }
}

#[tokio::test]
async fn a_failed_receipt_write_gives_up_its_lease() {
    let store = Faulty::new(Fault::FirstCompleteFails);
    let provider = Provider::keyed();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    // The effect happened; its receipt could not be stored: the caller still gets the result.
    svc.ready().await.unwrap().call(send(143)).await.unwrap();
    // The next attempt does not wait out the 30 s lease: it resumes at once with the same key.
    let started = Instant::now();
    svc.ready().await.unwrap().call(send(143)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        provider.deliveries(),
        1,
        "the provider deduplicated the key"
    );
}

#[tokio::test]
async fn a_non_ascii_idempotency_key_from_the_caller_is_refused_not_overwritten() {
    let (addr, calls) = server::serve(|_| server::status(200, &[])).await;
    let mut tool =
        ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, email_action)
            .classifier(HttpClassifier)
            .codec(StatusCodec)
            .layer(status_client());
    let mut req = email(addr);
    req.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes(b"caf\xe9-4471").unwrap(),
    );
    let err = tool.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(code(err), ErrorCode::InvalidArgument);
    let mut stamp = stormguard::key::SetIdempotencyKeyLayer::new(|_: &http::Request<Body>| {
        IdempotencyKey::parse("run-1:step-2:send:abc").map(Action::from_key)
    })
    .layer(status_client());
    let mut req = email(addr);
    req.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes(b"caf\xe9-4471").unwrap(),
    );
    let err = stamp.ready().await.unwrap().call(req).await.unwrap_err();
    assert_eq!(code(err), ErrorCode::InvalidArgument);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_operator_settles_an_outcome_unknown() {
    let store = SqliteStore::open(temp_db("resolve"), Durability::Process).unwrap();
    let provider = Provider::default();
    let mut svc =
        ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, action as ActionFn)
            .config(
                ReceiptConfig::builder()
                    .lease(Duration::from_millis(10))
                    .wait(Duration::from_secs(2))
                    .build()
                    .unwrap(),
            )
            .layer(provider.clone());
    for (invoice, resolution) in [
        (144, Resolution::NotDone),
        (
            145,
            Resolution::Done(br#""msg-145-from-the-provider-log""#.to_vec()),
        ),
    ] {
        crash_short(&store, invoice).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(send(invoice))
            .await
            .unwrap_err();
        assert_eq!(code(err), ErrorCode::OutcomeUnknown);
        let key = action(&send(invoice)).unwrap();
        assert_eq!(
            store.resolve(key.key().as_str(), resolution).await.unwrap(),
            Resolved::Settled
        );
    }
    // Not done: sent now. Done: its receipt answers.
    assert_eq!(
        svc.ready().await.unwrap().call(send(144)).await.unwrap(),
        "msg-144-1"
    );
    assert_eq!(
        svc.ready().await.unwrap().call(send(145)).await.unwrap(),
        "msg-145-from-the-provider-log"
    );
    assert_eq!(provider.deliveries(), 1);
}

#[tokio::test]
async fn a_take_over_cut_short_never_removes_the_crashed_callers_intent() {
    // The claim is recorded but its reply is lost: the call fails, and its clean-up must not
    // remove the intent of the crashed caller, which may have sent the email.
    let store = Faulty::new(Fault::ClaimRepliesLost);
    crash_short(&store.store, 145).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::UnkeyedWrite)
        .read_back(SentLog(provider.clone()), Consistency::Immediate)
        .layer(provider.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(send(145))
        .await
        .unwrap_err();
    assert_eq!(code(err), ErrorCode::StoreUnavailable);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pending = store.store.pending(10).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "the crashed caller's intent is still there"
    );
    assert_eq!(provider.deliveries(), 0);
}

/// A provider that refuses the connection (a failure that did not take effect).
#[derive(Clone)]
struct Refusing;

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

#[tokio::test]
async fn a_resumed_call_that_fails_without_effect_keeps_the_crashed_intent_and_its_age() {
    let clock = ManualClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    crash(&store, 146).await;
    clock.advance_ms(23 * 3600 * 1000); // inside the 24 h key window
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(Refusing);
    assert!(svc.ready().await.unwrap().call(send(146)).await.is_err());
    // The resend proved nothing about the crashed send: the intent stays, as old as it was, so
    // two hours later it is past the key window and escalated, not resent as a fresh action.
    let pending = store.pending(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].age_ms, 23 * 3600 * 1000);
    clock.advance_ms(2 * 3600 * 1000);
    let provider = Provider::keyed();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(send(146))
        .await
        .unwrap_err();
    assert_eq!(code(err), ErrorCode::OutcomeUnknown);
    assert_eq!(provider.deliveries(), 0);
}

// ---------------------------------------------------------------------------------------------
// Found by an outside review.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_processes_may_migrate_a_new_schema_at_once() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let starts: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let store = PostgresStore::connect_with(&url, Durability::Process).await?;
                store.migrate().await
            })
        })
        .collect();
    for start in starts {
        start.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_keyed_write_answered_503_is_retried_not_stored_as_its_receipt() {
    let (addr, calls) =
        server::serve(|n| server::status(if n == 0 { 503 } else { 200 }, &[])).await;
    let store = InMemoryStore::new();
    let receipts = ReceiptGuardLayer::new(store, ToolClass::KeyedWrite, email_action)
        .classifier(HttpClassifier)
        .codec(StatusCodec);
    let mut tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts.clone())
        .service(status_client());
    let ok = tool.ready().await.unwrap().call(email(addr)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // The 200 is the receipt: a resume is answered from it.
    let again = receipts
        .layer(status_client())
        .oneshot(email(addr))
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_postgres_lease_of_any_length_is_accepted() {
    let Some((store, _)) = pg_store().await else {
        return;
    };
    assert_eq!(
        store.begin("k", "fp", "me", Duration::MAX).await.unwrap(),
        Begin::Fresh
    );
    assert!(matches!(
        store.begin("k", "fp", "you", Duration::MAX).await.unwrap(),
        Begin::Pending { lease_left_ms, .. } if lease_left_ms > 1_000_000_000
    ));
}

#[test]
fn open_existing_refuses_an_empty_file_and_another_database() {
    let empty = temp_db("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(SqliteStore::open_existing(&empty, Durability::Process).is_err());
    let other = temp_db("other");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
        .unwrap();
    assert!(SqliteStore::open_existing(&other, Durability::Process).is_err());
    let real = temp_db("real");
    drop(SqliteStore::open(&real, Durability::Process).unwrap());
    assert!(SqliteStore::open_existing(&real, Durability::Process).is_ok());
}

#[tokio::test]
async fn an_intent_recorded_after_a_lost_take_over_is_this_calls_own() {
    // A stale keyed intent; the take-over is lost and the record removed; the waiting call then
    // records a fresh intent, and its send fails without effect: that intent must be removed
    // (it is this call's), so the next attempt starts fresh rather than finding a pending one.
    let store = Faulty::new(Fault::FirstClaimLostToAnother);
    crash_short(&store.store, 147).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut svc = layer(&store, ToolClass::UnkeyedWrite)
        .read_back(SentLog(Provider::default()), Consistency::Immediate)
        .layer(Refusing);
    assert!(svc.ready().await.unwrap().call(send(147)).await.is_err());
    assert!(
        store.store.pending(10).await.unwrap().is_empty(),
        "its own intent was removed"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 20, items 16b and 17b.

/// 17b: a retry answered from a stored receipt never reached the dependency; the error counts
/// only the attempts that did.
#[tokio::test]
async fn an_answer_from_a_stored_receipt_is_not_counted_as_an_attempt() {
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    // A receipt layer whose classifier disagrees with the Retry's: it stores the 503.
    let every_answer_a_success =
        |_: &Result<http::Response<()>, BoxError>| stormguard::classify::Classification::success();
    let receipts =
        ReceiptGuardLayer::new(InMemoryStore::new(), ToolClass::KeyedWrite, email_action)
            .classifier(every_answer_a_success)
            .codec(StatusCodec);
    let tool = ServiceBuilder::new()
        .layer(
            RetryLayer::new(ToolClass::KeyedWrite, RetryBudget::default())
                .classifier(HttpClassifier)
                .replay(HttpReplay),
        )
        .layer(receipts)
        .service(status_client());
    let err = tool.oneshot(email(addr)).await.unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one request");
    assert_eq!(err.attempts(), 1, "{err}");
}

/// 16b: a receipt layer over a streamed answer (decided at its end, never stored) needs no codec
/// that could store it: `NotStored` says so.
#[tokio::test]
async fn a_receipt_layer_runs_over_a_streaming_body() {
    use http_body_util::BodyExt;
    let (addr, calls) =
        server::serve(|_| http::Response::new(Body::from("a stream of tokens"))).await;
    let store = InMemoryStore::new();
    let tool = ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, email_action)
        .classifier(stormguard::classify::GrpcClassifier)
        .codec(NotStored)
        .layer(HttpClient::new());
    let resp = tool.clone().oneshot(email(addr)).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"a stream of tokens");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // No receipt: the intent stays pending, its lease given up; a keyed repeat is sent again
    // with the same key (the provider deduplicates it).
    assert_eq!(store.pending(10).await.unwrap()[0].lease_left_ms, 0);
    let again = tool.oneshot(email(addr)).await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A charge: the key covers the order, the fingerprint the order and the amount.
#[derive(Clone)]
struct Amount {
    order: u64,
    amount: u32,
    key: Option<String>,
}

impl KeyStamp for Amount {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

fn amount(order: u64, amount: u32) -> Amount {
    Amount {
        order,
        amount,
        key: None,
    }
}

fn amount_action(req: &Amount) -> Result<Action, stormguard::key::KeyError> {
    Action::task(
        "run-1",
        "step-3",
        "charge",
        &serde_json::json!({"order": req.order, "amount": req.amount}),
        &["order"],
        &["order", "amount"],
    )
}

/// Item 7: the same key with other arguments (another fingerprint) is refused with a hint that
/// names the key, says whether the first request has its receipt, and tells the model not to
/// reword a repeated action; nothing is sent, and the first request's record stays.
#[tokio::test]
async fn a_key_reused_with_other_arguments_is_refused_with_what_became_of_the_first() {
    let store = InMemoryStore::new();
    let sent = Arc::new(AtomicU32::new(0));
    let counter = sent.clone();
    let provider = tower::service_fn(move |req: Amount| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, std::io::Error>(format!("ch-{}", req.order)) }
    });
    let tool =
        ReceiptGuardLayer::new(store.clone(), ToolClass::KeyedWrite, amount_action).layer(provider);
    // Pending: a crashed run recorded the order with amount 100.
    let first = amount_action(&amount(7, 100)).unwrap();
    store
        .begin(
            first.key().as_str(),
            first.fingerprint(),
            "crashed",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let err = code_and_hint(tool.clone().oneshot(amount(7, 120)).await.unwrap_err());
    assert_eq!(err.0, ErrorCode::IdempotencyKeyReused);
    assert!(err.1.contains(first.key().as_str()), "{}", err.1);
    assert!(err.1.contains("pending"), "{}", err.1);
    assert!(err.1.contains("do not reword"), "{}", err.1);
    // Done: the first request's receipt holds the result.
    let done = amount_action(&amount(8, 100)).unwrap();
    assert_eq!(tool.clone().oneshot(amount(8, 100)).await.unwrap(), "ch-8");
    let err = code_and_hint(tool.clone().oneshot(amount(8, 120)).await.unwrap_err());
    assert_eq!(err.0, ErrorCode::IdempotencyKeyReused);
    assert!(err.1.contains(done.key().as_str()), "{}", err.1);
    assert!(err.1.contains("receipt"), "{}", err.1);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.pending(10).await.unwrap().len(),
        1,
        "the crashed one's"
    );
}

fn code_and_hint(err: BoxError) -> (ErrorCode, String) {
    let err = err.downcast::<ToolError>().unwrap();
    assert!(!err.retryable());
    (err.code(), err.hint().to_string())
}
