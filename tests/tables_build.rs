//! The table the docs call clean builds: every tool of `examples/tools-clean.toml` is layered
//! over its body and answers a call, its receipts in PostgreSQL on 127.0.0.1. The audit passing
//! a table that `build` or `layer` then refuses is a silent mistake (the audit's
//! `store-kind-not-built` and `read-back-without-receipt` rules say what they would refuse).
#![cfg(all(feature = "audit", feature = "postgres"))]

mod support;

use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use stormguard::classify::OkIsSuccess;
use stormguard::error::BoxError;
use stormguard::receipt::{PostgresStore, ReadBack, ReadBackResult};
use stormguard::tool::{Call, Stores, Toolbox};
use support::call;
use tower::{service_fn, Layer};

/// The post_ticket read-back: the provider's list of tickets has none for this call.
#[derive(Clone)]
struct NoTicket;
impl ReadBack<Call, Value> for NoTicket {
    async fn read_back(&self, _: &Call) -> ReadBackResult<Value> {
        ReadBackResult::Absent
    }
}

#[tokio::test]
async fn the_clean_table_builds_and_every_tool_answers() {
    let Some(url) = support::service_url("STORMGUARD_POSTGRES_URL") else {
        return;
    };
    let text = std::fs::read_to_string("examples/tools-clean.toml").unwrap();
    let toolbox = Toolbox::from_toml_str(&text).unwrap();
    assert!(
        toolbox.audit().findings.is_empty(),
        "{}",
        toolbox.audit().to_markdown()
    );
    let pg = PostgresStore::connect(&url).await.unwrap();
    pg.migrate().await.unwrap();
    let tools = toolbox.build(Stores::new().with("pg", pg)).unwrap();

    // One run per test run: the receipts stay in the shared database.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let run = format!("run-clean-{nanos}");
    let args = json!({ "invoice_id": 1, "ticket": 2, "message_id": 3, "order_id": 4, "q": "x" });
    let body = service_fn(|call: Call| async move {
        Ok::<Value, BoxError>(json!({ "done": call.args().clone() }))
    });
    for t in toolbox.tools() {
        let layer = match t.name.as_str() {
            "post_ticket" => tools
                .layer_reading_back(&t.name, NoTicket)
                .unwrap()
                .classifier(OkIsSuccess)
                .layer(body),
            name => tools
                .layer(name)
                .unwrap()
                .classifier(OkIsSuccess)
                .layer(body),
        };
        let mut svc = layer;
        let answer = call(
            &mut svc,
            Call::new(run.clone(), "step-1", args.clone()).with("tenant", "acme"),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(answer["done"], args, "{}", t.name);
    }
}

/// A table whose store is of a kind receipts do not have, or whose read-back has no receipts,
/// is refused by the audit as `build` and `layer` refuse it.
#[test]
fn the_audit_says_what_build_would_refuse() {
    let table = r#"
        [stores.cache]
        kind = "redis"
        retention_secs = 3600

        [[tools]]
        name = "update_customer"
        class = "idempotent_write"
        retry = ["layer"]
        unknown_outcome = { read_back = { attempts = 2, within_secs = 10 } }
    "#;
    let toolbox = Toolbox::from_toml_str(table).unwrap();
    let codes: Vec<_> = toolbox.audit().findings.iter().map(|f| f.code).collect();
    assert!(codes.contains(&"store-kind-not-built"), "{codes:?}");
    assert!(codes.contains(&"read-back-without-receipt"), "{codes:?}");
    assert!(toolbox.audit().has_errors());
    // And what they say is so: build refuses the store, layer the read-back.
    assert_eq!(toolbox.build(Stores::new()).unwrap_err().field(), "stores");
    let without_store =
        Toolbox::from_toml_str(&table.replace("kind = \"redis\"", "kind = \"memory\"")).unwrap();
    let tools = without_store.build(Stores::new()).unwrap();
    assert_eq!(
        tools.layer("update_customer").unwrap_err().field(),
        "unknown_outcome"
    );
}
