//! Settling an `outcome_unknown`: list the intents a crash or an ambiguous failure left without a
//! receipt, wait until nothing of them can still land, check each with the provider, and record
//! what it says.
//!
//! ```text
//! cargo run --features sqlite --example resolve -- receipts.db list
//! cargo run --features sqlite --example resolve -- receipts.db done <key> '{"message_id":"msg-4471"}'
//! cargo run --features sqlite --example resolve -- receipts.db not-done <key>
//! cargo run --features sqlite --example resolve -- --demo     # all of it on a scratch store
//! ```
//!
//! `list` shows, for each pending intent, when it was first recorded, when its last attempt was
//! sent, and how long a request of it may still land at the provider (its caller's lease, or the
//! in-flight bound after an attempt that timed out). **Check with the provider only once that is
//! 0**: before, an empty provider log proves nothing, because the request may still commit.
//! `done` stores the bytes as the action's receipt (encoded as the layer's codec encodes: JSON by
//! default), so the next attempt is answered from it and nothing is sent; `not-done` removes the
//! intent, so the next attempt sends, and is refused while a request may still land. A receipt
//! already there is never overwritten.

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stormguard::budget::RetryBudget;
use stormguard::class::ToolClass;
use stormguard::error::BoxError;
use stormguard::key::Action;
use stormguard::receipt::{
    Durability, ReceiptConfig, ReceiptGuardLayer, ReceiptStore, Resolution, Resolved, SqliteStore,
};
use stormguard::retry::{CloneReplay, RetryLayer};
use tower::{ServiceBuilder, ServiceExt};

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

async fn list(store: &SqliteStore) -> Result<(), BoxError> {
    let pending = store.pending(100).await?;
    if pending.is_empty() {
        println!("no pending intents");
    }
    for p in pending {
        let what = if p.may_still_land_for_ms > 0 {
            format!(
                "a request of it may still land for {}: do not settle it yet, check again after",
                secs(p.may_still_land_for_ms)
            )
        } else {
            "nothing of it can land any more: check with the provider, then settle it".to_string()
        };
        println!(
            "{}\n  first recorded {} ago, last sent {} ago; {what}",
            p.key,
            secs(p.age_ms),
            secs(p.last_sent_ms_ago)
        );
    }
    Ok(())
}

async fn settle(store: &SqliteStore, key: &str, resolution: Resolution) -> Result<(), BoxError> {
    match store.resolve(key, resolution).await? {
        Resolved::Settled => println!("{key}: settled"),
        Resolved::AlreadyDone => println!("{key}: it has a receipt already; nothing changed"),
        Resolved::NoRecord => println!("{key}: no such record; nothing changed"),
        Resolved::InFlight { may_land_for_ms } => {
            return Err(format!(
                "{key}: refused, nothing changed: a request of it may still land for {}; check with the provider after that",
                secs(may_land_for_ms)
            )
            .into())
        }
        other => return Err(format!("{key}: {other:?}").into()),
    }
    Ok(())
}

/// The provider's sent log: what it delivered, by invoice.
type SentLog = Arc<Mutex<Vec<u64>>>;

/// A scratch store; an unkeyed send whose client gives up before the provider commits it (the
/// commit lands later, as it does at a real provider); listed, refused a "not done", checked,
/// settled, and answered from the receipt.
async fn demo() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("stormguard-resolve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
    let action = |invoice: &Invoice| Action::new("run-81f2", "step-2", "send_invoice", &invoice.0);
    let sent: SentLog = Arc::default();
    let log = sent.clone();
    // The provider commits 300 ms after it got the request, whoever is still waiting.
    let provider = tower::service_fn(move |inv: Invoice| {
        let log = log.clone();
        let commit = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            log.lock().unwrap().push(inv.0);
            format!("msg-{}-1", inv.0)
        });
        async move { Ok::<_, BoxError>(commit.await?) }
    });
    // The client gives up after 100 ms; a request may land up to the lease (1 s) after its send.
    let config = ReceiptConfig::builder()
        .lease(Duration::from_secs(1))
        .build()?;
    let tool = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::UnkeyedWrite, RetryBudget::default()).replay(CloneReplay))
        .layer(
            ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, action).config(config),
        )
        .timeout(Duration::from_millis(100))
        .service(provider);
    let err = tool.clone().oneshot(Invoice(4471, None)).await.unwrap_err();
    println!("the run: {err}");
    println!("\n$ resolve receipts.db list");
    list(&store).await?;
    let key = action(&Invoice(4471, None))?.key().to_string();
    println!("\n$ resolve receipts.db not-done {key}   (the provider's log is still empty)");
    if let Err(refused) = settle(&store, &key, Resolution::NotDone).await {
        println!("{refused}");
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    println!("\n(1.1 s later) $ resolve receipts.db list");
    list(&store).await?;
    let delivered = sent.lock().unwrap().contains(&4471);
    println!("the provider's log: invoice 4471 delivered: {delivered}");
    assert!(delivered, "the late commit landed within the bound");
    println!("\n$ resolve receipts.db done {key} '\"msg-4471-1\"'");
    settle(&store, &key, Resolution::Done(br#""msg-4471-1""#.to_vec())).await?;
    let answer = tool.oneshot(Invoice(4471, None)).await?;
    println!("\nthe next attempt: {answer} (from the receipt; nothing sent)");
    assert_eq!(answer, "msg-4471-1");
    assert_eq!(sent.lock().unwrap().len(), 1, "one delivery");
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
        let open = |db: &str| SqliteStore::open_existing(Path::new(db), Durability::PowerLoss);
        match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["--demo"] => demo().await,
            [db, "list"] => list(&open(db)?).await,
            [db, "done", key, receipt] => {
                let receipt = Resolution::Done(receipt.as_bytes().to_vec());
                settle(&open(db)?, key, receipt).await
            }
            [db, "not-done", key] => settle(&open(db)?, key, Resolution::NotDone).await,
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
