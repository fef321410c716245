//! Calls through the receipt guard that were cut short, on real stores (SQLite files, the real
//! PostgreSQL when `STORMGUARD_POSTGRES_URL` is set; CI sets it): a crash resumed within or past
//! the key window, taken over or settled by an operator; a cancellation; duplicates waiting on a
//! take-over; a receipt write or a claim's reply that failed.
#![cfg(all(feature = "sqlite", feature = "postgres"))]
mod support;

use std::time::{Duration, Instant};
use stormguard::class::ToolClass;
use stormguard::error::{ErrorCode, ToolError};
use stormguard::receipt::{
    Consistency, Durability, InMemoryStore, ManualClock, ReceiptConfig, ReceiptGuardLayer,
    ReceiptStore, Resolution, Resolved, SqliteStore,
};
use support::receipts::{
    action, code, crash, crash_short, futures_join_all, layer, send, timing, ActionFn, NeverReady,
    Provider, Refusing, SentLog, T0,
};
use support::stores::{pg_store, raw_pg, temp_db, Fault, Faulty, Opened, StoreKind};
use tower::{Layer, Service, ServiceExt};

// ---------------------------------------------------------------------------------------------
// 6. A resume older than the provider's key window is not a keyed retry.

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
// 9. Waiters wait.

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
// 14. Smaller promises.

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
