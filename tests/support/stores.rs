//! Scratch receipt stores for the tests: a fresh SQLite file, a fresh PostgreSQL schema.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use stormguard::receipt::PostgresStore;

/// A path for a new SQLite file in a directory of its own.
pub fn temp_db(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "stormguard-test-{}-{name}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("receipts.db")
}

static PG_SCHEMAS: AtomicU32 = AtomicU32::new(0);

/// A connection string whose `search_path` is a new, empty schema (so tests run in parallel), or
/// `None` with a note when `STORMGUARD_POSTGRES_URL` is not set.
pub async fn fresh_schema() -> Option<String> {
    let url = super::service_url("STORMGUARD_POSTGRES_URL")?;
    let schema = format!(
        "sg_test_{}_{}",
        std::process::id(),
        PG_SCHEMAS.fetch_add(1, Ordering::SeqCst)
    );
    raw_pg(&url)
        .await
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        ))
        .await
        .unwrap();
    Some(format!("{url} options='-c search_path={schema}'"))
}

/// A plain tokio-postgres client (to hold locks, kill backends, look at tables).
pub async fn raw_pg(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    client
}

/// A migrated store in a fresh schema, and the connection string that reaches it.
pub async fn pg_store() -> Option<(PostgresStore, String)> {
    let url = fresh_schema().await?;
    let store = PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some((store, url))
}
