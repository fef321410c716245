//! tokio's paused clock (a test's `start_paused`) jumps to the next timer whenever the runtime
//! has nothing to do, including while it waits for a SQLite store's blocking thread: a declared
//! tool's deadline then passes at once, with the receipt's write in flight, and every call fails
//! though nothing was slow. The crate cannot stop the jump; it says what happened, in the
//! error's hint and once as a WARN, and the same tool on a running clock succeeds.
#![cfg(feature = "sqlite")]

mod support;

use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use stormguard::error::{BoxError, ErrorCode, ToolError};
use stormguard::receipt::{Durability, SqliteStore};
use stormguard::tool::{Call, Stores, Toolbox};
use tower::{service_fn, Layer, Service, ServiceExt};

/// Sends 5 invoices through a keyed write on SQLite receipts (deadline 1 s) on a runtime whose
/// clock is paused or running; the endings and the sends.
fn five_invoices(paused: bool) -> (Vec<Result<(), ToolError>>, u32) {
    let mut rt = tokio::runtime::Builder::new_current_thread();
    rt.enable_all();
    if paused {
        rt.start_paused(true);
    }
    rt.build().unwrap().block_on(async {
        let dir = std::env::temp_dir().join(format!("sg-paused-{}-{paused}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("receipts.db");
        let _ = std::fs::remove_file(&db);
        let toolbox = Toolbox::from_json_str(
            r#"{
            "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
            "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
                        "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
                        "deadline_secs": 1,
                        "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } }]
        }"#,
        )
        .unwrap();
        let receipts = SqliteStore::open(&db, Durability::PowerLoss).unwrap();
        let tools = toolbox
            .build(Stores::new().with("receipts", receipts))
            .unwrap();
        let sent = Arc::new(AtomicU32::new(0));
        let counter = sent.clone();
        let body = service_fn(move |call: Call| {
            let _key = call.key().map(|k| k.to_string()); // delivered to the provider
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, BoxError>(http::Response::new(String::from("sent"))) }
        });
        let mut svc = tools.layer("send_invoice").unwrap().layer(body);
        let mut endings = Vec::new();
        for i in 0..5 {
            let call = Call::new("run-1", "step-1", json!({ "invoice_id": i }));
            let res = svc.ready().await.unwrap().call(call).await;
            endings.push(res.map(|_| ()));
        }
        std::fs::remove_dir_all(&dir).unwrap();
        (endings, sent.load(Ordering::SeqCst))
    })
}

#[test]
fn a_deadline_passed_on_a_paused_clock_says_the_clock_is_paused() {
    let ((endings, _), warnings) = support::logs::warnings(|| five_invoices(true));
    let failed: Vec<&ToolError> = endings.iter().filter_map(|e| e.as_ref().err()).collect();
    // The jump ends a call whenever the store's fsync outlasts the runtime's turn to park (a
    // busier machine: more of them); each one it ends says why.
    assert!(!failed.is_empty(), "{endings:?}");
    for err in &failed {
        assert!(
            matches!(
                err.code(),
                ErrorCode::DeadlineExceeded | ErrorCode::OutcomeUnknown
            ),
            "{err:?}"
        );
        assert!(
            err.hint().contains("tokio's clock is paused"),
            "{}",
            err.hint()
        );
    }
    let said: Vec<_> = warnings
        .iter()
        .filter(|l| l.contains("paused clock"))
        .collect();
    assert_eq!(said.len(), 1, "one WARN per process: {warnings:?}");
}

#[test]
fn the_same_tool_on_a_running_clock_sends_every_invoice() {
    let (endings, sent) = five_invoices(false);
    for e in &endings {
        assert!(e.is_ok(), "{e:?}");
    }
    assert_eq!(sent, 5);
}
