//! The receipt stores on real backends, one test each: real SQLite files and the real PostgreSQL
//! (when `STORMGUARD_POSTGRES_URL` is set; CI sets it). Leases judged by the server's clock,
//! migrations and locks that never stall, a deleted SQLite file, pruning, reconnection, and a
//! receipt hit that costs nothing below. What the guard answers is in `receipts_answers.rs`; calls
//! cut short (crashes, cancellations, take-overs) are in `receipts_cut_short.rs`.
#![cfg(all(feature = "sqlite", feature = "postgres"))]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stormguard::class::ToolClass;
use stormguard::error::ErrorCode;
use stormguard::receipt::{
    Begin, Durability, InMemoryStore, ManualClock, PostgresOptions, PostgresStore, ReceiptConfig,
    ReceiptGuardLayer, ReceiptStore, SqliteStore,
};
use support::receipts::{action, code, futures_join_all, layer, send, ActionFn, Provider, T0};
use support::stores::{fresh_schema, pg_store, pg_with, raw_pg, temp_db};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

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
    let store =
        pg_with(PostgresOptions::builder(&url).lock_timeout(Duration::from_millis(300))).await;
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
// 13. Group commit: calls batched in one transaction keep their own answers.

#[tokio::test]
async fn postgres_batched_calls_keep_their_answers_and_a_rolled_back_batch_runs_again() {
    let Some(url) = fresh_schema().await else {
        return;
    };
    // One connection, so calls made at once share a transaction.
    let store = pg_with(
        PostgresOptions::builder(&url)
            .durability(Durability::PowerLoss)
            .connections(1)
            .lock_timeout(Duration::from_millis(300)),
    )
    .await;
    let lease = Duration::from_secs(30);
    // 40 keys, each begun by two owners at once (often in one batch): one of each is fresh.
    let begins = (0..80).map(|i| {
        let store = store.clone();
        async move {
            let owner = format!("owner-{i}");
            let begin = store
                .begin(&format!("k{}", i % 40), "fp", &owner, lease)
                .await;
            (i % 40, owner, begin.unwrap())
        }
    });
    let answers = futures_join_all(begins).await;
    let fresh: Vec<_> = answers.iter().filter(|a| a.2 == Begin::Fresh).collect();
    assert_eq!(fresh.len(), 40, "{answers:?}");
    let owner_of_k0 = fresh.iter().find(|a| a.0 == 0).unwrap().1.clone();

    // k0's row locked elsewhere: a batch holding k0's receipt fails on the lock timeout and
    // rolls back; every other call of it runs again on its own and commits.
    let locker = raw_pg(&url).await;
    locker
        .batch_execute("BEGIN; SELECT 1 FROM stormguard_receipts WHERE key = 'k0' FOR UPDATE;")
        .await
        .unwrap();
    let blocked = {
        let store = store.clone();
        let owner = owner_of_k0.clone();
        tokio::spawn(async move { store.complete("k0", &owner, b"r0").await })
    };
    let news = (0..20).map(|i| {
        let store = store.clone();
        async move { store.begin(&format!("n{i}"), "fp", "first", lease).await }
    });
    for begin in futures_join_all(news).await {
        assert_eq!(begin.unwrap(), Begin::Fresh);
    }
    assert!(
        blocked.await.unwrap().is_err(),
        "the locked row's call fails"
    );
    locker.batch_execute("ROLLBACK").await.unwrap();
    // What the calls answered is what the store holds.
    for i in 0..20 {
        let again = store.begin(&format!("n{i}"), "fp", "second", lease).await;
        assert_ne!(again.unwrap(), Begin::Fresh, "n{i} was committed");
    }
    store.complete("k0", &owner_of_k0, b"r0").await.unwrap();
    let settled = store.begin("k0", "fp", "third", lease).await.unwrap();
    assert!(matches!(settled, Begin::Done { .. }), "{settled:?}");
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
    let store = pg_with(PostgresOptions::builder(&url).connections(2)).await;
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
