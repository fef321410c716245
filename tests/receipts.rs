//! Intent, receipt and every `begin` answer, run against each store: in memory, SQLite (a real
//! file) and PostgreSQL (when `STORMGUARD_POSTGRES_URL` is set; CI sets it).
#![cfg(all(feature = "sqlite", feature = "postgres"))]
mod support;

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::class::ToolClass;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::key::Action;
use stormguard::key::{IdempotencyKey, KeyStamp};
use stormguard::receipt::{
    Begin, Consistency, Durability, InMemoryStore, ManualClock, PostgresOptions, PostgresStore,
    ReadBack, ReadBackResult, ReceiptConfig, ReceiptGuardLayer, ReceiptStore, Resolution, Resolved,
    SqliteStore, StoreError,
};
use support::stores::{fresh_schema, pg_with, temp_db};
use tower::{Layer, Service, ServiceExt};

#[derive(Clone, Debug)]
struct SendEmail {
    invoice: u64,
    to: &'static str,
    key: Option<String>,
}

/// Sent again as a clone: it carries no operation of its own.
impl stormguard::retry::Request for SendEmail {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl KeyStamp for SendEmail {
    fn stamped_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    fn stamp_key(&mut self, key: &IdempotencyKey) {
        self.key = Some(key.to_string());
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Sent {
    message_id: String,
}
impl stormguard::classify::Answer for Sent {}

/// An email provider that honours idempotency keys and counts deliveries.
#[derive(Clone, Default)]
struct Provider {
    deliveries: Arc<AtomicU32>,
    seen: Arc<Mutex<std::collections::HashMap<String, Sent>>>,
    delay: Duration,
    fail_with: Option<std::io::ErrorKind>,
}

impl Provider {
    fn deliveries(&self) -> u32 {
        self.deliveries.load(Ordering::SeqCst)
    }
}

impl Service<SendEmail> for Provider {
    type Response = Sent;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Sent, std::io::Error>> + std::marker::Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendEmail) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            tokio::time::sleep(this.delay).await;
            if let Some(kind) = this.fail_with {
                return Err(kind.into());
            }
            let key = req.key.clone().unwrap_or_default();
            let mut seen = this.seen.lock().unwrap();
            if let Some(sent) = seen.get(&key).filter(|_| !key.is_empty()) {
                return Ok(sent.clone());
            }
            let n = this.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
            let sent = Sent {
                message_id: format!("msg-{}-{n}", req.invoice),
            };
            seen.insert(key, sent.clone());
            Ok(sent)
        })
    }
}

fn action(req: &SendEmail) -> Result<Action, stormguard::key::KeyError> {
    Action::task(
        "run-81f2",
        "step-2",
        "send_invoice",
        &serde_json::json!({"invoice": req.invoice, "to": req.to}),
        &["invoice"],
        &["invoice", "to"],
    )
}

fn send(invoice: u64) -> SendEmail {
    SendEmail {
        invoice,
        to: "ap@acme.test",
        key: None,
    }
}

type Action_ = fn(&SendEmail) -> Result<Action, stormguard::key::KeyError>;

fn layer<St: ReceiptStore>(store: &St, class: ToolClass) -> ReceiptGuardLayer<St, Action_> {
    ReceiptGuardLayer::new(store.clone(), class, action as Action_).config(
        ReceiptConfig::builder()
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
}

async fn call<S: Service<SendEmail, Response = Sent, Error = BoxError>>(
    svc: &mut S,
    req: SendEmail,
) -> Result<Sent, BoxError> {
    svc.ready().await?.call(req).await
}

fn code(err: BoxError) -> ErrorCode {
    err.downcast::<ToolError>()
        .map(|e| e.code())
        .unwrap_or(ErrorCode::Internal)
}

const T0: u64 = 1_700_000_000_000;

const LEASE: Duration = Duration::from_millis(100);

async fn begin_answers<St: ReceiptStore>(store: St, clock: ManualClock) {
    assert_eq!(
        store.begin("a", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    // A retried begin of the same owner (a lost reply) is still its own.
    assert_eq!(
        store.begin("a", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    clock.advance_ms(1);
    assert_eq!(
        store.begin("a", "fp", "two", LEASE).await.unwrap(),
        Begin::Pending {
            age_ms: 1,
            lease_left_ms: 99
        }
    );
    assert_eq!(
        store.begin("a", "other", "two", LEASE).await.unwrap(),
        Begin::Mismatch { done: false }
    );
    clock.advance_ms(49);
    assert!(
        !store.claim("a", "two", LEASE * 4).await.unwrap(),
        "the lease is live"
    );
    clock.advance_ms(50);
    assert!(
        store.claim("a", "two", LEASE * 4).await.unwrap(),
        "the lease has passed"
    );
    assert!(
        !store.claim("a", "three", LEASE * 4).await.unwrap(),
        "taken already"
    );
    // The caller that lost the lease can neither release, abandon nor complete it.
    clock.advance_ms(50);
    store.release("a", "one", None).await.unwrap();
    store.abandon("a", "one").await.unwrap();
    assert!(store.complete("a", "one", b"late").await.is_err());
    assert_eq!(
        store.begin("a", "fp", "four", LEASE).await.unwrap(),
        Begin::Pending {
            age_ms: 150,
            lease_left_ms: 350
        }
    );
    clock.advance_ms(50);
    store.complete("a", "two", b"receipt").await.unwrap();
    clock.advance_ms(100);
    assert_eq!(
        store.begin("a", "fp", "four", LEASE).await.unwrap(),
        Begin::Done {
            age_ms: 300,
            receipt: b"receipt".to_vec()
        }
    );
    // A receipt is final: not overwritten, not abandoned, not resolved away.
    assert!(store.complete("a", "two", b"again").await.is_err());
    store.abandon("a", "two").await.unwrap();
    assert_eq!(
        store.resolve("a", Resolution::NotDone).await.unwrap(),
        Resolved::AlreadyDone
    );
    assert!(matches!(
        store.begin("a", "fp", "four", LEASE).await.unwrap(),
        Begin::Done { receipt, .. } if receipt == b"receipt"
    ));
    assert_eq!(
        store.begin("b", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    store.abandon("b", "one").await.unwrap();
    assert_eq!(
        store.begin("b", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    // Release ends a lease at once.
    store.release("b", "one", None).await.unwrap();
    assert!(store.claim("b", "two", LEASE).await.unwrap());
    // An operator settles what is pending, whoever holds it.
    assert_eq!(
        store
            .resolve("b", Resolution::Done(b"checked".to_vec()))
            .await
            .unwrap(),
        Resolved::Settled
    );
    assert!(matches!(
        store.begin("b", "fp", "five", LEASE).await.unwrap(),
        Begin::Done { receipt, .. } if receipt == b"checked"
    ));
    assert_eq!(
        store.begin("c", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    // Its caller holds the lease and may still send: "not done" is refused until it passes.
    assert_eq!(
        store.resolve("c", Resolution::NotDone).await.unwrap(),
        Resolved::InFlight {
            may_land_for_ms: 100
        }
    );
    clock.advance_ms(100);
    assert_eq!(
        store.resolve("c", Resolution::NotDone).await.unwrap(),
        Resolved::Settled
    );
    assert_eq!(
        store.resolve("c", Resolution::NotDone).await.unwrap(),
        Resolved::NoRecord
    );
    assert_eq!(
        store.begin("c", "fp", "two", LEASE).await.unwrap(),
        Begin::Fresh
    );
    // Prune removes what is older than the cut, by the store's clock.
    clock.advance_ms(10_000);
    assert_eq!(
        store.begin("new", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    assert_eq!(store.prune(Duration::from_secs(5)).await.unwrap(), 3);
    assert_eq!(
        store.begin("a", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
    assert!(matches!(
        store.begin("new", "fp", "two", LEASE).await.unwrap(),
        Begin::Pending { .. }
    ));
}

async fn a_receipt_is_returned_without_calling_again<St: ReceiptStore>(
    store: St,
    _clock: ManualClock,
) {
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let first = call(&mut svc, send(4471)).await.unwrap();
    let again = call(&mut svc, send(4471)).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(provider.deliveries(), 1);
    // Same key, other recipient: not the same action.
    let mut other = send(4471);
    other.to = "someone@else.test";
    assert_eq!(
        code(call(&mut svc, other).await.unwrap_err()),
        ErrorCode::IdempotencyKeyReused
    );
    assert_eq!(provider.deliveries(), 1);
}

async fn parallel_duplicates_execute_once<St: ReceiptStore>(store: St, _clock: ManualClock) {
    let provider = Provider {
        delay: Duration::from_millis(300),
        ..Provider::default()
    };
    let svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let (mut s1, mut s2) = (svc.clone(), svc.clone());
    let (a, b) = tokio::join!(call(&mut s1, send(7)), call(&mut s2, send(7)));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(provider.deliveries(), 1);
}

async fn a_duplicate_that_waits_too_long_is_told_in_progress<St: ReceiptStore>(
    store: St,
    _clock: ManualClock,
) {
    let provider = Provider {
        delay: Duration::from_secs(5),
        ..Provider::default()
    };
    let svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let (mut s1, mut s2) = (svc.clone(), svc.clone());
    let (a, b) = tokio::join!(call(&mut s1, send(8)), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        call(&mut s2, send(8)).await
    });
    assert!(a.is_ok());
    assert_eq!(code(b.unwrap_err()), ErrorCode::InProgress);
    assert_eq!(provider.deliveries(), 1);
}

async fn a_crashed_keyed_write_resumes_with_the_same_key<St: ReceiptStore>(
    store: St,
    clock: ManualClock,
) {
    let provider = Provider::default();
    // The crashed run: intent recorded, the provider did the work, no receipt.
    let req = send(9);
    let act = action(&req).unwrap();
    assert_eq!(
        store
            .begin(
                act.key().as_str(),
                act.fingerprint(),
                "crashed-run",
                Duration::from_secs(30)
            )
            .await
            .unwrap(),
        Begin::Fresh
    );
    let mut sent = req.clone();
    sent.stamp_key(act.key());
    call_provider(&provider, sent).await;
    assert_eq!(provider.deliveries(), 1);

    clock.advance_ms(31_000); // the crashed call's lease has passed
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    let resumed = call(&mut svc, req).await.unwrap();
    assert_eq!(
        resumed.message_id, "msg-9-1",
        "the provider returned the stored result"
    );
    assert_eq!(provider.deliveries(), 1);
}

async fn call_provider(provider: &Provider, req: SendEmail) {
    provider.clone().oneshot(req).await.unwrap();
}

#[derive(Clone)]
struct SentLog(Provider, bool);

impl ReadBack<SendEmail, Sent> for SentLog {
    fn read_back(
        &self,
        req: &SendEmail,
    ) -> impl std::future::Future<Output = ReadBackResult<Sent>> + std::marker::Send {
        let found = self
            .0
            .seen
            .lock()
            .unwrap()
            .values()
            .find(|s| s.message_id.starts_with(&format!("msg-{}-", req.invoice)))
            .cloned();
        let consistent = self.1;
        async move {
            match (found, consistent) {
                (Some(sent), _) => ReadBackResult::Found(sent),
                (None, true) => ReadBackResult::Absent,
                (None, false) => ReadBackResult::Unknown,
            }
        }
    }
}

async fn a_crashed_unkeyed_write_reads_back_or_escalates<St: ReceiptStore>(
    store: St,
    clock: ManualClock,
) {
    let provider = Provider::default();
    let crash = |invoice: u64, store: St| async move {
        let act = action(&send(invoice)).unwrap();
        store
            .begin(
                act.key().as_str(),
                act.fingerprint(),
                "crashed-run",
                Duration::from_secs(30),
            )
            .await
            .unwrap();
    };
    // Without a read-back: outcome_unknown, nothing sent.
    crash(10, store.clone()).await;
    clock.advance_ms(31_000);
    let mut plain = layer(&store, ToolClass::UnkeyedWrite).layer(provider.clone());
    assert_eq!(
        code(call(&mut plain, send(10)).await.unwrap_err()),
        ErrorCode::OutcomeUnknown
    );
    assert_eq!(provider.deliveries(), 0);

    // An eventually consistent read-back is never trusted.
    let eventual = layer(&store, ToolClass::UnkeyedWrite)
        .read_back(SentLog(provider.clone(), true), Consistency::Eventual);
    let mut eventual = eventual.layer(provider.clone());
    assert_eq!(
        code(call(&mut eventual, send(10)).await.unwrap_err()),
        ErrorCode::OutcomeUnknown
    );

    // A consistent read-back that finds nothing: safe to send, once.
    let consistent = layer(&store, ToolClass::UnkeyedWrite)
        .read_back(SentLog(provider.clone(), true), Consistency::Immediate);
    let mut consistent = consistent.layer(provider.clone());
    call(&mut consistent, send(10)).await.unwrap();
    assert_eq!(provider.deliveries(), 1);

    // A consistent read-back that finds the effect: its result, recorded, nothing sent.
    crash(11, store.clone()).await;
    call_provider(&provider, send(11)).await; // the crashed call had been delivered
    clock.advance_ms(31_000);
    let found = call(&mut consistent, send(11)).await.unwrap();
    assert_eq!(found.message_id, "msg-11-2");
    assert_eq!(provider.deliveries(), 2);
    // ... and the receipt is now the system of record.
    assert_eq!(call(&mut plain, send(11)).await.unwrap(), found);
}

async fn an_old_intent_is_refused_loudly<St: ReceiptStore>(store: St, clock: ManualClock) {
    let act = action(&send(12)).unwrap();
    store
        .begin(
            act.key().as_str(),
            act.fingerprint(),
            "crashed-run",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    clock.advance_ms(8 * 24 * 3600 * 1000); // past the 7-day default retention
    let provider = Provider::default();
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(provider.clone());
    assert_eq!(
        code(call(&mut svc, send(12)).await.unwrap_err()),
        ErrorCode::ReceiptExpired
    );
    assert_eq!(provider.deliveries(), 0);
}

async fn a_failure_without_effect_forgets_the_intent<St: ReceiptStore>(
    store: St,
    _clock: ManualClock,
) {
    let refused = Provider {
        fail_with: Some(std::io::ErrorKind::ConnectionRefused),
        ..Provider::default()
    };
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(refused);
    assert!(call(&mut svc, send(13)).await.is_err());
    let act = action(&send(13)).unwrap();
    assert_eq!(
        store
            .begin(
                act.key().as_str(),
                act.fingerprint(),
                "crashed-run",
                Duration::from_millis(1)
            )
            .await
            .unwrap(),
        Begin::Fresh
    );

    // An ambiguous failure keeps the intent and gives up its lease.
    let reset = Provider {
        fail_with: Some(std::io::ErrorKind::ConnectionReset),
        ..Provider::default()
    };
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(reset);
    assert!(call(&mut svc, send(14)).await.is_err());
    let act = action(&send(14)).unwrap();
    assert!(matches!(
        store
            .begin(
                act.key().as_str(),
                act.fingerprint(),
                "crashed-run",
                Duration::from_millis(1)
            )
            .await
            .unwrap(),
        Begin::Pending {
            lease_left_ms: 0,
            ..
        }
    ));
    let mut again = layer(&store, ToolClass::UnkeyedWrite).layer(Provider::default());
    assert_eq!(
        code(call(&mut again, send(14)).await.unwrap_err()),
        ErrorCode::OutcomeUnknown
    );
}

/// An attempt that ended in doubt: the store records when it was sent and until when it may
/// land; `pending` shows it, `resolve` refuses "not done" until then, a later doubt never
/// shortens the bound, and "done" is recorded at any time.
async fn an_attempt_in_doubt_may_still_land<St: ReceiptStore>(store: St, clock: ManualClock) {
    let lease = Duration::from_secs(5);
    let doubt = |sent_ago_ms, within_ms| stormguard::receipt::InDoubt {
        sent_ago: Duration::from_millis(sent_ago_ms),
        lands_within: Duration::from_millis(within_ms),
    };
    assert_eq!(
        store.begin("k", "fp", "one", lease).await.unwrap(),
        Begin::Fresh
    );
    clock.advance_ms(1_000);
    // Its request was sent 800 ms ago and timed out: it may land until 5 s after its send.
    store
        .release("k", "one", Some(doubt(800, 5_000)))
        .await
        .unwrap();
    let listed = &store.pending(10).await.unwrap()[0];
    assert_eq!(
        (
            listed.age_ms,
            listed.last_sent_ms_ago,
            listed.lease_left_ms,
            listed.may_still_land_for_ms
        ),
        (1_000, 800, 0, 4_200)
    );
    assert_eq!(
        store.resolve("k", Resolution::NotDone).await.unwrap(),
        Resolved::InFlight {
            may_land_for_ms: 4_200
        }
    );
    // A resumed attempt takes it, and ends in doubt with a shorter bound: the first one's
    // request may still land, so the longer bound stays.
    assert!(matches!(
        store.begin("k", "fp", "two", lease).await.unwrap(),
        Begin::Pending {
            lease_left_ms: 0,
            ..
        }
    ));
    assert!(store.claim("k", "two", lease).await.unwrap());
    clock.advance_ms(200);
    store
        .release("k", "two", Some(doubt(100, 1_000)))
        .await
        .unwrap();
    let listed = &store.pending(10).await.unwrap()[0];
    assert_eq!(
        (listed.last_sent_ms_ago, listed.may_still_land_for_ms),
        (100, 4_000)
    );
    clock.advance_ms(3_999);
    assert!(matches!(
        store.resolve("k", Resolution::NotDone).await.unwrap(),
        Resolved::InFlight { may_land_for_ms: 1 }
    ));
    clock.advance_ms(1);
    assert_eq!(store.pending(10).await.unwrap()[0].may_still_land_for_ms, 0);
    assert_eq!(
        store.resolve("k", Resolution::NotDone).await.unwrap(),
        Resolved::Settled
    );
    // "Done" needs no waiting: the effect is there.
    assert_eq!(
        store.begin("d", "fp", "one", lease).await.unwrap(),
        Begin::Fresh
    );
    store
        .release("d", "one", Some(doubt(0, 5_000)))
        .await
        .unwrap();
    assert_eq!(
        store
            .resolve("d", Resolution::Done(b"found".to_vec()))
            .await
            .unwrap(),
        Resolved::Settled
    );
    assert!(store.pending(10).await.unwrap().is_empty());
}

macro_rules! suite {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;

            async fn store(clock: ManualClock) -> Option<impl ReceiptStore> {
                ($make)(clock).await
            }

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test]
                    async fn $name() {
                        let clock = ManualClock::new(T0);
                        let Some(store) = store(clock.clone()).await else {
                            return;
                        };
                        super::$name(store, clock).await;
                    }
                };
            }

            case!(begin_answers);
            case!(a_receipt_is_returned_without_calling_again);
            case!(parallel_duplicates_execute_once);
            case!(a_duplicate_that_waits_too_long_is_told_in_progress);
            case!(a_crashed_keyed_write_resumes_with_the_same_key);
            case!(a_crashed_unkeyed_write_reads_back_or_escalates);
            case!(an_old_intent_is_refused_loudly);
            case!(a_failure_without_effect_forgets_the_intent);
            case!(an_attempt_in_doubt_may_still_land);
        }
    };
}

/// A PostgreSQL store in a schema of its own (so tests run in parallel) on a test clock, or
/// `None` with a note.
async fn postgres_on(clock: ManualClock) -> Option<PostgresStore> {
    let url = fresh_schema().await?;
    let store = pg_with(PostgresOptions::builder(&url).clock(clock)).await;
    Some(store)
}

/// A store in a fresh schema, and the connection string that reaches the same schema.
async fn postgres_with_url() -> Option<(PostgresStore, String)> {
    let url = fresh_schema().await?;
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    Some((store, url))
}

suite!(memory, |clock| async {
    Some(InMemoryStore::with_clock(clock))
});
suite!(sqlite, |clock| async {
    Some(SqliteStore::open_with_clock(temp_db("suite"), Durability::Process, clock).unwrap())
});
suite!(pg, postgres_on);

#[tokio::test]
async fn a_second_sqlite_handle_sees_the_first_ones_receipt() {
    let path = temp_db("second");
    let first = SqliteStore::open(&path, Durability::Process).unwrap();
    let provider = Provider::default();
    let mut a = layer(&first, ToolClass::KeyedWrite).layer(provider.clone());
    let sent = call(&mut a, send(20)).await.unwrap();
    drop(a);
    drop(first);
    let second = SqliteStore::open(&path, Durability::PowerLoss).unwrap();
    let mut b = layer(&second, ToolClass::KeyedWrite).layer(provider.clone());
    assert_eq!(call(&mut b, send(20)).await.unwrap(), sent);
    assert_eq!(provider.deliveries(), 1);
}

#[tokio::test]
async fn a_second_postgres_connection_sees_the_first_ones_receipt() {
    let Some((first, url)) = postgres_with_url().await else {
        return;
    };
    let provider = Provider::default();
    let mut a = layer(&first, ToolClass::KeyedWrite).layer(provider.clone());
    let sent = call(&mut a, send(21)).await.unwrap();
    // Another "machine": a connection of its own to the same database and schema.
    // It also records with the other durability setting (`synchronous_commit = off`).
    let second = PostgresStore::connect_with(&url, Durability::Process)
        .await
        .unwrap();
    let elsewhere = Provider::default();
    let mut b = layer(&second, ToolClass::KeyedWrite).layer(elsewhere.clone());
    assert_eq!(call(&mut b, send(21)).await.unwrap(), sent);
    assert_eq!(provider.deliveries(), 1);
    assert_eq!(elsewhere.deliveries(), 0);
}

#[tokio::test]
async fn postgres_durability_sets_synchronous_commit_and_never_weakens_a_stronger_one() {
    let Some(url) = support::service_url("STORMGUARD_POSTGRES_URL") else {
        return;
    };
    let with = |setting: &str| format!("{url} options='-c synchronous_commit={setting}'");
    let sync = |url: String, durability| async move {
        let store = PostgresStore::connect_with(&url, durability).await.unwrap();
        store.synchronous_commit().await.unwrap()
    };
    assert_eq!(sync(url.clone(), Durability::Process).await, "off");
    assert_eq!(sync(with("off"), Durability::PowerLoss).await, "on");
    assert_eq!(
        sync(with("remote_apply"), Durability::PowerLoss).await,
        "remote_apply"
    );
    assert_eq!(sync(with("local"), Durability::PowerLoss).await, "local");
}

#[tokio::test]
async fn a_postgres_store_used_before_migrate_fails_then_works_after_it() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let store = PostgresStore::connect_with(&url, Durability::Process)
        .await
        .unwrap();
    // No table yet: the call fails before anything is recorded, and the failed preparation is
    // not cached.
    let e = store.begin("k", "fp", "me", LEASE).await.unwrap_err();
    assert!(e.to_string().contains("prepare"), "{e}");
    store.migrate().await.unwrap();
    assert_eq!(
        store.begin("k", "fp", "me", LEASE).await.unwrap(),
        Begin::Fresh
    );
    store.complete("k", "me", b"r").await.unwrap();
    assert!(matches!(
        store.begin("k", "fp", "other", LEASE).await.unwrap(),
        Begin::Done { .. }
    ));
}

/// A store that cannot record anything.
#[derive(Clone)]
struct Broken;

impl ReceiptStore for Broken {
    fn begin(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        down()
    }
    fn claim(
        &self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        down()
    }
    fn release(
        &self,
        _: &str,
        _: &str,
        _: Option<stormguard::receipt::InDoubt>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        down()
    }
    fn complete(
        &self,
        _: &str,
        _: &str,
        _: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        down()
    }
    fn abandon(&self, _: &str, _: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        down()
    }
    fn resolve(
        &self,
        _: &str,
        _: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        down()
    }
    fn pending(
        &self,
        _: usize,
    ) -> impl Future<Output = Result<Vec<stormguard::receipt::PendingIntent>, StoreError>> + Send
    {
        down()
    }
    fn prune(&self, _: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        down()
    }
}

fn down<T>() -> std::future::Ready<Result<T, StoreError>> {
    std::future::ready(Err(StoreError::new("disk full")))
}

#[tokio::test]
async fn nothing_executes_when_the_intent_cannot_be_recorded() {
    let provider = Provider::default();
    let mut svc = layer(&Broken, ToolClass::KeyedWrite).layer(provider.clone());
    assert_eq!(
        code(call(&mut svc, send(30)).await.unwrap_err()),
        ErrorCode::StoreUnavailable
    );
    assert_eq!(provider.deliveries(), 0);
}

#[tokio::test]
async fn a_cancelled_call_gives_up_its_lease_at_once() {
    let store = InMemoryStore::new();
    let slow = Provider {
        delay: Duration::from_millis(500),
        ..Provider::default()
    };
    let mut svc = layer(&store, ToolClass::KeyedWrite).layer(slow.clone());
    // The caller gives up after 50 ms: the call was sent, its outcome is unknown.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call(&mut svc, send(40)))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Its request may still land (for up to the 30 s lease after its send): listed so, and
    // no operator can settle it "not done" yet.
    let listed = &store.pending(10).await.unwrap()[0];
    assert_eq!(listed.lease_left_ms, 0);
    assert!(listed.may_still_land_for_ms > 29_000, "{listed:?}");
    assert!(matches!(
        store
            .resolve(&listed.key, Resolution::NotDone)
            .await
            .unwrap(),
        Resolved::InFlight { .. }
    ));
    // Without the lease given back this would wait for the 30 s lease and answer in_progress.
    let started = std::time::Instant::now();
    call(&mut svc, send(40)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(slow.deliveries(), 1);
}

/// The provider behind a service whose first `poll_ready` fails (a closed connection pool).
#[derive(Clone)]
struct FlakyReady(Provider, Arc<AtomicU32>);

impl Service<SendEmail> for FlakyReady {
    type Response = Sent;
    type Error = std::io::Error;
    type Future = <Provider as Service<SendEmail>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        if self.1.fetch_add(1, Ordering::SeqCst) == 0 {
            return std::task::Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()));
        }
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: SendEmail) -> Self::Future {
        self.0.call(req)
    }
}

#[tokio::test]
async fn a_call_that_was_never_sent_leaves_no_intent() {
    let store = InMemoryStore::new();
    let provider = Provider::default();
    let flaky = FlakyReady(provider.clone(), Arc::default());
    // The layer's own readiness passes; the clone it calls with fails once.
    let layer = layer(&store, ToolClass::UnkeyedWrite);
    let mut svc = layer.layer(flaky);
    let first = svc.call(send(41)).await;
    assert!(first.is_err());
    tokio::time::sleep(Duration::from_millis(20)).await;
    // An unkeyed write whose intent lingered would now be outcome_unknown; it was removed.
    call(&mut svc, send(41)).await.unwrap();
    assert_eq!(provider.deliveries(), 1);
}

#[tokio::test]
async fn retry_above_receipts_retries_an_ambiguous_keyed_write() {
    use stormguard::budget::RetryBudget;
    use stormguard::retry::RetryLayer;
    let store = InMemoryStore::new();
    let provider = Provider::default();
    let resets = Arc::new(AtomicU32::new(0));
    let (p, r) = (provider.clone(), resets.clone());
    // The first attempt is reset before the provider processes it.
    let flaky = tower::service_fn(move |req: SendEmail| {
        let (mut p, first) = (p.clone(), r.fetch_add(1, Ordering::SeqCst) == 0);
        async move {
            if first {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
            }
            p.call(req).await
        }
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(
            ToolClass::KeyedWrite,
            RetryBudget::default(),
        ))
        .layer(layer(&store, ToolClass::KeyedWrite))
        .service(flaky);
    // The receipt layer stamped the key and told the operation, so Retry may retry.
    let sent = svc.ready().await.unwrap().call(send(42)).await.unwrap();
    assert_eq!(sent.message_id, "msg-42-1");
    assert_eq!(resets.load(Ordering::SeqCst), 2);
    assert_eq!(provider.deliveries(), 1);
}

// ---------------------------------------------------------------------------------------------
// A clock stepped back never lengthens a lease (issue 20, item 11): a store handle whose clock is
// an hour behind the one that recorded the intent, and one an hour ahead.

/// A clock the test sets, forward or back.
#[derive(Clone)]
struct Stepped(Arc<AtomicU64>);

impl Stepped {
    fn at(ms: u64) -> Self {
        Stepped(Arc::new(AtomicU64::new(ms)))
    }
    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl stormguard::receipt::Clock for Stepped {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const HOUR_MS: u64 = 3_600_000;

/// `first` records an intent with a 5 s lease at T0; `second` (another handle on the same
/// records, on `clock`) reads it with its clock an hour behind, then an hour ahead.
async fn clock_steps<St: ReceiptStore>(first: St, second: St, clock: Stepped) {
    let lease = Duration::from_secs(5);
    assert_eq!(
        first.begin("k", "fp", "one", lease).await.unwrap(),
        Begin::Fresh
    );
    clock.set(T0 - HOUR_MS);
    let Begin::Pending { lease_left_ms, .. } = second.begin("k", "fp", "two", lease).await.unwrap()
    else {
        panic!("pending")
    };
    assert!(
        lease_left_ms <= 5_000,
        "{lease_left_ms} ms left of a 5 s lease"
    );
    let listed = &second.pending(10).await.unwrap()[0];
    assert!(listed.lease_left_ms <= 5_000, "{listed:?}");
    assert!(listed.may_still_land_for_ms <= 5_000, "{listed:?}");
    assert!(matches!(
        second.resolve("k", Resolution::NotDone).await.unwrap(),
        Resolved::InFlight { may_land_for_ms } if may_land_for_ms <= 5_000
    ));
    // An hour ahead: the lease has passed (a step forward ends it early, as documented).
    clock.set(T0 + HOUR_MS);
    assert_eq!(
        second.begin("k", "fp", "two", lease).await.unwrap(),
        Begin::Pending {
            age_ms: HOUR_MS,
            lease_left_ms: 0
        }
    );
    // An attempt that ended in doubt, its 5 s in-flight bound read an hour behind: at most 5 s.
    assert!(second.claim("k", "two", lease).await.unwrap());
    let doubt = stormguard::receipt::InDoubt {
        sent_ago: Duration::ZERO,
        lands_within: lease,
    };
    second.release("k", "two", Some(doubt)).await.unwrap();
    clock.set(T0);
    let listed = &second.pending(10).await.unwrap()[0];
    assert!(listed.may_still_land_for_ms <= 5_000, "{listed:?}");
    assert!(listed.lease_left_ms <= 5_000, "{listed:?}");
    // A lease given up (nothing in doubt) stays given up on a clock behind: every store settles
    // "not done" alike.
    clock.set(T0 + HOUR_MS);
    assert_eq!(
        second.begin("k2", "fp", "two", lease).await.unwrap(),
        Begin::Fresh
    );
    second.release("k2", "two", None).await.unwrap();
    clock.set(T0);
    assert_eq!(
        second.resolve("k2", Resolution::NotDone).await.unwrap(),
        Resolved::Settled
    );
}

#[tokio::test]
async fn a_clock_stepped_back_never_lengthens_a_lease_in_memory() {
    let clock = Stepped::at(T0);
    let store = InMemoryStore::with_clock(clock.clone());
    clock_steps(store.clone(), store, clock).await;
}

#[tokio::test]
async fn a_clock_stepped_back_never_lengthens_a_lease_in_sqlite() {
    let path = temp_db("steps");
    let first = SqliteStore::open_with_clock(&path, Durability::Process, Stepped::at(T0)).unwrap();
    let clock = Stepped::at(T0);
    let second = SqliteStore::open_with_clock(&path, Durability::Process, clock.clone()).unwrap();
    clock_steps(first, second, clock).await;
}

#[tokio::test]
async fn a_clock_stepped_back_never_lengthens_a_lease_in_postgres() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let on = |clock: Stepped| {
        let url = url.clone();
        async move { pg_with(PostgresOptions::builder(&url).clock(clock)).await }
    };
    let clock = Stepped::at(T0);
    let (first, second) = (on(Stepped::at(T0)).await, on(clock.clone()).await);
    clock_steps(first, second, clock).await;
}

// ---------------------------------------------------------------------------------------------
// A store written by an earlier version opens, gets the new columns, and keeps working.

/// The table as the first release created it, with one intent a crashed run left in it.
const OLD_SCHEMA: &str = "
CREATE TABLE stormguard_receipts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    owner TEXT NOT NULL,
    since_ms BIGINT NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    receipt BLOB,
    done_ms BIGINT
);
CREATE INDEX stormguard_receipts_since ON stormguard_receipts (since_ms);";

async fn an_old_store_keeps_working<St: ReceiptStore>(store: St, clock: ManualClock) {
    // The old row: recorded at T0 with a 30 s lease, by a run that crashed.
    let listed = &store.pending(10).await.unwrap()[0];
    assert_eq!(
        (
            listed.key.as_str(),
            listed.age_ms,
            listed.last_sent_ms_ago,
            listed.lease_left_ms
        ),
        ("old", 10_000, 10_000, 20_000)
    );
    assert_eq!(listed.may_still_land_for_ms, 20_000);
    clock.advance_ms(20_000);
    assert!(store.claim("old", "resumed", LEASE).await.unwrap());
    store.complete("old", "resumed", b"r").await.unwrap();
    assert!(matches!(
        store.begin("old", "fp", "again", LEASE).await.unwrap(),
        Begin::Done { .. }
    ));
    assert_eq!(
        store.begin("new", "fp", "one", LEASE).await.unwrap(),
        Begin::Fresh
    );
}

#[tokio::test]
async fn a_sqlite_file_of_the_first_release_opens_and_keeps_working() {
    let path = temp_db("old");
    let old = rusqlite::Connection::open(&path).unwrap();
    old.execute_batch(&OLD_SCHEMA.replace("BIGINT", "INTEGER"))
        .unwrap();
    old.execute(
        "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
         VALUES ('old', 'fp', 'crashed', ?1, ?2)",
        rusqlite::params![T0 as i64, (T0 + 30_000) as i64],
    )
    .unwrap();
    drop(old);
    let clock = ManualClock::new(T0 + 10_000);
    // Two processes opening the old file at once add the columns once.
    let (a, b) = tokio::join!(
        async { SqliteStore::open_with_clock(&path, Durability::Process, clock.clone()) },
        async { SqliteStore::open_with_clock(&path, Durability::Process, clock.clone()) },
    );
    drop(a.unwrap());
    an_old_store_keeps_working(b.unwrap(), clock).await;
    assert!(SqliteStore::open_existing(&path, Durability::Process).is_ok());
}

#[tokio::test]
async fn a_postgres_schema_of_the_first_release_migrates_and_keeps_working() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    let raw = support::stores::raw_pg(&url).await;
    raw.batch_execute(&OLD_SCHEMA.replace("BLOB", "BYTEA"))
        .await
        .unwrap();
    raw.execute(
        "INSERT INTO stormguard_receipts (key, fingerprint, owner, since_ms, lease_until_ms)
         VALUES ('old', 'fp', 'crashed', $1, $2)",
        &[&(T0 as i64), &((T0 + 30_000) as i64)],
    )
    .await
    .unwrap();
    let clock = ManualClock::new(T0 + 10_000);
    let store = pg_with(PostgresOptions::builder(&url).clock(clock.clone())).await;
    an_old_store_keeps_working(store, clock).await;
}

#[tokio::test]
async fn an_attempt_in_doubt_survives_a_restart_of_the_sqlite_store() {
    let path = temp_db("doubt");
    let clock = ManualClock::new(T0);
    let store = SqliteStore::open_with_clock(&path, Durability::Process, clock.clone()).unwrap();
    let reset = Provider {
        fail_with: Some(std::io::ErrorKind::ConnectionReset),
        ..Provider::default()
    };
    let mut svc = layer(&store, ToolClass::UnkeyedWrite).layer(reset);
    assert!(call(&mut svc, send(50)).await.is_err());
    drop((svc, store));
    // Another process opens the file: the request of that attempt may still land.
    clock.advance_ms(1_000);
    let reopened = SqliteStore::open_with_clock(&path, Durability::Process, clock.clone()).unwrap();
    let listed = &reopened.pending(10).await.unwrap()[0];
    // (The send is timed on the runtime's clock: a millisecond or so before the failure.)
    assert_eq!(listed.lease_left_ms, 0);
    assert!(
        (1_000..1_100).contains(&listed.last_sent_ms_ago),
        "{listed:?}"
    );
    assert!(
        (28_900..=29_000).contains(&listed.may_still_land_for_ms),
        "{listed:?}"
    );
    clock.advance_ms(29_000);
    assert_eq!(
        reopened
            .resolve(&listed.key, Resolution::NotDone)
            .await
            .unwrap(),
        Resolved::Settled
    );
}

stormguard::stored_as_json!(Sent);
