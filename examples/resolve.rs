//! Settling an `outcome_unknown`: list the intents a crash or an ambiguous failure left without a
//! receipt, check each with the provider, and record what it says.
//!
//! ```text
//! cargo run --features sqlite --example resolve -- receipts.db list
//! cargo run --features sqlite --example resolve -- receipts.db done <key> '{"message_id":"msg-4471"}'
//! cargo run --features sqlite --example resolve -- receipts.db not-done <key>
//! cargo run --features sqlite --example resolve -- --demo     # all of it on a scratch store
//! ```
//!
//! `done` stores the bytes as the action's receipt (encoded as the layer's codec encodes: JSON
//! by default), so the next attempt is answered from it and nothing is sent; `not-done` removes
//! the intent, so the next attempt sends. A receipt already there is never overwritten.

use std::convert::Infallible;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use stormguard::class::ToolClass;
use stormguard::key::Action;
use stormguard::receipt::{
    Durability, ReceiptLayer, ReceiptStore, Resolution, Resolved, SqliteStore,
};
use tower::{Layer, ServiceExt};

async fn list(store: &SqliteStore) -> Result<(), stormguard::error::BoxError> {
    let pending = store.pending(100).await?;
    if pending.is_empty() {
        println!("no pending intents");
    }
    for p in pending {
        let who = if p.lease_left_ms > 0 {
            format!(
                "its caller may still be running ({} ms of lease left)",
                p.lease_left_ms
            )
        } else {
            "its caller is gone: check with the provider".to_string()
        };
        println!("{}  recorded {} s ago; {who}", p.key, p.age_ms / 1000);
    }
    Ok(())
}

async fn settle(
    store: &SqliteStore,
    key: &str,
    resolution: Resolution,
) -> Result<(), stormguard::error::BoxError> {
    match store.resolve(key, resolution).await? {
        Resolved::Settled => println!("{key}: settled"),
        Resolved::AlreadyDone => println!("{key}: it has a receipt already; nothing changed"),
        Resolved::NoRecord => println!("{key}: no such record; nothing changed"),
    }
    Ok(())
}

/// A scratch store with an escalated send, listed, settled, and answered from the receipt.
async fn demo() -> Result<(), stormguard::error::BoxError> {
    let dir = std::env::temp_dir().join(format!("stormguard-resolve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
    let action = |invoice: &Invoice| Action::new("run-81f2", "step-2", "send_invoice", &invoice.0);
    // A crashed run left its intent; the lease (10 ms here) has passed.
    let crashed = action(&Invoice(4471, None))?;
    store
        .begin(
            crashed.key().as_str(),
            crashed.fingerprint(),
            "crashed-run",
            Duration::from_millis(10),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let provider = tower::service_fn(|inv: Invoice| async move {
        Ok::<_, Infallible>(format!("msg-{}-sent-again", inv.0))
    });
    let tool = ReceiptLayer::new(store.clone(), ToolClass::UnkeyedWrite, action).layer(provider);
    let err = tool.clone().oneshot(Invoice(4471, None)).await.unwrap_err();
    println!("the resumed run: {err}");
    list(&store).await?;
    // The provider's sent log shows msg-4471-1 went out: record it.
    settle(
        &store,
        crashed.key().as_str(),
        Resolution::Done(br#""msg-4471-1""#.to_vec()),
    )
    .await?;
    let answer = tool.oneshot(Invoice(4471, None)).await?;
    println!("the next attempt: {answer} (from the receipt; nothing sent)");
    assert_eq!(answer, "msg-4471-1");
    list(&store).await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[derive(Clone)]
struct Invoice(u64, Option<String>);

impl stormguard::key::KeyStamp for Invoice {
    fn stamped_key(&self) -> Option<&str> {
        self.1.as_deref()
    }
    fn stamp_key(&mut self, key: &stormguard::key::IdempotencyKey) {
        self.1 = Some(key.to_string());
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: resolve <db> list | <db> done <key> <receipt> | <db> not-done <key> | --demo"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async {
        match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["--demo"] => demo().await,
            [db, "list"] => {
                list(&SqliteStore::open_existing(
                    Path::new(db),
                    Durability::PowerLoss,
                )?)
                .await
            }
            [db, "done", key, receipt] => {
                let store = SqliteStore::open_existing(Path::new(db), Durability::PowerLoss)?;
                settle(&store, key, Resolution::Done(receipt.as_bytes().to_vec())).await
            }
            [db, "not-done", key] => {
                let store = SqliteStore::open_existing(Path::new(db), Durability::PowerLoss)?;
                settle(&store, key, Resolution::NotDone).await
            }
            _ => Err("bad arguments".into()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.to_string() == "bad arguments" => usage(),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
