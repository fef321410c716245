//! Keyed writes per second (intent + receipt) through the SQLite and PostgreSQL stores, with one
//! writer and with 16 concurrent writers.
//!
//! `cargo bench --all-features --bench receipts`. The SQLite store commits the calls waiting
//! at one moment in one transaction, and the PostgreSQL store spreads keys over a pool of
//! connections whose commits the server flushes together (group commit): compare the
//! `_16_writers` figures with the `_1_writer` ones of the same run. PostgreSQL is measured when
//! `STORMGUARD_POSTGRES_URL` is set (`.ci/run` sets it), else skipped with a note.
//! SQLite runs in WAL mode with `synchronous = NORMAL` (`Durability::Process`: survives kill -9)
//! and `FULL` (`Durability::PowerLoss`); PostgreSQL with `synchronous_commit = off`
//! (`Durability::Process`) and `on` (`Durability::PowerLoss`, the server default).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stormguard::receipt::{Begin, Durability, PostgresStore, ReceiptStore, SqliteStore};

static KEYS: AtomicU64 = AtomicU64::new(0);

async fn keyed_write<St: ReceiptStore>(store: &St) {
    let key = format!(
        "bench-{}-{}",
        std::process::id(),
        KEYS.fetch_add(1, Ordering::Relaxed)
    );
    let lease = Duration::from_secs(30);
    let begin = store
        .begin(&key, "fp", "bench", lease)
        .await
        .expect("begin");
    assert_eq!(begin, Begin::Fresh);
    store
        .complete(&key, "bench", b"{\"message_id\":\"msg-1\"}")
        .await
        .expect("complete");
}

async fn writes<St: ReceiptStore>(store: &St, total: u64, writers: u64) -> Duration {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let store = store.clone();
        let n = total / writers + u64::from(w < total % writers);
        tasks.spawn(async move {
            for _ in 0..n {
                keyed_write(&store).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("writer");
    }
    start.elapsed()
}

fn bench_store<St: ReceiptStore>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: St,
) {
    let mut group = c.benchmark_group("receipts");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for writers in [1u64, 16] {
        group.bench_function(
            format!(
                "{name}_{writers}_writer{}",
                if writers > 1 { "s" } else { "" }
            ),
            |b| {
                b.iter_custom(|iters| rt.block_on(writes(&store, iters, writers)));
            },
        );
    }
    group.finish();
}

fn receipts(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("stormguard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (name, durability) in [
        ("sqlite_process", Durability::Process),
        ("sqlite_power_loss", Durability::PowerLoss),
    ] {
        let store = SqliteStore::open(dir.join(format!("{name}.db")), durability).expect("sqlite");
        bench_store(c, &rt, name, store);
    }
    match std::env::var("STORMGUARD_POSTGRES_URL") {
        Ok(url) => {
            for (name, durability) in [
                ("postgres_process", Durability::Process),
                ("postgres_power_loss", Durability::PowerLoss),
            ] {
                let store = rt.block_on(async {
                    // A schema of its own, new for each run: a table grown by earlier runs
                    // would measure its own size, not the store.
                    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                    tokio::spawn(conn);
                    client
                        .batch_execute(&format!(
                            "DROP SCHEMA IF EXISTS sg_bench_{name} CASCADE; CREATE SCHEMA sg_bench_{name};"
                        ))
                        .await
                        .expect("bench schema");
                    let url = format!("{url} options='-c search_path=sg_bench_{name}'");
                    let store = PostgresStore::connect_with(&url, durability)
                        .await
                        .expect("connect");
                    store.migrate().await.expect("migrate");
                    store
                });
                bench_store(c, &rt, name, store);
            }
        }
        Err(_) => eprintln!("postgres: skipped, STORMGUARD_POSTGRES_URL is not set"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, receipts);
criterion_main!(benches);
