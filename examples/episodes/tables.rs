//! The five tool tables of the episodes example, the agent's script, and the harness that runs
//! them (shared with `tests/episodes.rs`).

use serde_json::{json, Value};
use stormguard::chaos::{Applies, Harness, Step};
use stormguard::tool::Toolbox;

/// The tables compared: a name, what it is, and how it declares each write.
pub const POLICIES: [(&str, &str); 5] = [
    ("naive", "every tool retried on any failure, no key"),
    (
        "random-key",
        "a new key at every model step, retries left to the model",
    ),
    (
        "readback-only",
        "writes declared unkeyed, settled by one read of a log 3 s behind (lease 1 s)",
    ),
    (
        "stormguard",
        "class, derived key, receipts, unknown escalated",
    ),
    (
        "stormguard-readback",
        "the same, reading back the writes no key protects",
    ),
];

/// The agent's script: six calls, and how the model rewords the two that carry free text.
pub fn script() -> Vec<Step> {
    vec![
        Step::new("lookup_order", json!({ "order_id": 981 })),
        Step::new(
            "set_status",
            json!({ "order_id": 981, "status": "invoiced" }),
        ),
        Step::new(
            "send_invoice",
            json!({ "invoice_id": 4471, "note": "Payment due in 30 days." }),
        )
        .reworded(json!({ "invoice_id": 4471, "note": "Please pay within 30 days." })),
        Step::new(
            "charge_card",
            json!({ "order_id": 981, "amount_cents": 12900 }),
        ),
        Step::new(
            "post_ticket",
            json!({ "ticket": "T-981", "body": "Invoice 4471 sent." }),
        )
        .reworded(json!({ "ticket": "T-981", "body": "Sent invoice 4471 to the customer." })),
        Step::new(
            "book_shipment",
            json!({ "order_id": 981, "carrier": "dhl" }),
        ),
    ]
}

/// The harness for one table: the same script, provider and faults for every table.
pub fn harness(policy: &str) -> Result<Harness, stormguard::tool::SpecError> {
    let toolbox = Toolbox::from_json_str(&tools(policy).to_string())?;
    Ok(Harness::new(toolbox, script())
        // What the provider does, whatever a table declares.
        .applies("lookup_order", Applies::Nothing)
        .applies("set_status", Applies::OncePerArgs)
        .applies("send_invoice", Applies::OncePerKey)
        .applies("charge_card", Applies::OncePerKey)
        .applies("post_ticket", Applies::EveryCall)
        .applies("book_shipment", Applies::OncePerKey)
        // Faults per call that reaches the provider, and per episode.
        .before_work(0.02)
        .rate_limited(0.03)
        .after_work(0.025)
        .late_commits(0.015)
        .crashes(0.08)
        .rewords(0.05)
        .parallel(0.02))
}

/// The six tools as `policy` declares them.
pub fn tools(policy: &str) -> Value {
    let receipts = json!({ "store": "receipts", "provider_key_window_secs": 86400 });
    let tool = |name: &str, class: &str, retry: &str, key: &[&str], extra: Value| {
        let mut t = json!({ "name": name, "class": class, "retry": [retry] });
        if !key.is_empty() {
            t["key"] = json!(key);
        }
        if let (Some(t), Value::Object(extra)) = (t.as_object_mut(), extra) {
            t.extend(extra);
        }
        t
    };
    let writes = [
        "set_status",
        "send_invoice",
        "charge_card",
        "post_ticket",
        "book_shipment",
    ];
    let ids = ["order_id", "invoice_id", "order_id", "ticket", "order_id"];
    let list: Vec<Value> = match policy {
        "naive" => std::iter::once("lookup_order")
            .chain(writes)
            .map(|name| tool(name, "read", "layer", &[], json!({})))
            .collect(),
        "random-key" => std::iter::once(tool("lookup_order", "read", "layer", &[], json!({})))
            .chain(writes.iter().map(|name| {
                tool(
                    name,
                    "keyed_write",
                    "model",
                    &["run", "step", "tool"],
                    json!({}),
                )
            }))
            .collect(),
        "readback-only" => std::iter::once(tool("lookup_order", "read", "layer", &[], json!({})))
            .chain(writes.iter().zip(ids).map(|(name, id)| {
                let key = ["run", "tool", &format!("id:{id}")];
                let settle = json!({
                    "receipt": { "store": "receipts", "lease_secs": 1 },
                    "unknown_outcome": { "read_back": { "attempts": 1, "within_secs": 1 } }
                });
                tool(name, "unkeyed_write", "layer", &key, settle)
            }))
            .collect(),
        _ => {
            let read_back = policy == "stormguard-readback";
            let unknown = |settles: bool| {
                if settles && read_back {
                    json!({ "read_back": { "attempts": 3, "within_secs": 10 } })
                } else {
                    json!("escalate")
                }
            };
            let keyed = |name: &str, id: &str, class: &str, retry: &str, settles: bool| {
                let key = ["run", "tool", &format!("id:{id}")];
                let extra = json!({ "receipt": receipts, "unknown_outcome": unknown(settles) });
                tool(name, class, retry, &key, extra)
            };
            vec![
                tool("lookup_order", "read", "layer", &[], json!({})),
                tool("set_status", "idempotent_write", "layer", &[], json!({})),
                keyed("send_invoice", "invoice_id", "keyed_write", "layer", false),
                keyed("charge_card", "order_id", "keyed_write", "layer", false),
                keyed("post_ticket", "ticket", "unkeyed_write", "none", true),
                keyed("book_shipment", "order_id", "multi_step", "none", true),
            ]
        }
    };
    json!({
        "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
        "tools": list,
    })
}
