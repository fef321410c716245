//! The episode harness with real processes: each crash a SIGKILL of a child right after the
//! provider applied a call, each resume a new process over the same SQLite files.
#![cfg(all(feature = "chaos", feature = "sqlite", unix))]

use serde_json::json;
use stormguard::chaos::{Harness, Report, Step};
use stormguard::tool::Toolbox;

/// A keyed invoice and an unkeyed ticket, both with receipts in a store of `kind`.
fn toolbox(kind: &str) -> Toolbox {
    Toolbox::from_json_str(&format!(
        r#"{{
        "stores": {{ "receipts": {{ "kind": "{kind}", "retention_secs": 604800 }} }},
        "tools": [
            {{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
               "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
               "receipt": {{ "store": "receipts", "provider_key_window_secs": 86400 }} }},
            {{ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
               "key": ["run", "tool", "id:ticket"], "unknown_outcome": "escalate",
               "receipt": {{ "store": "receipts" }} }}
        ]
    }}"#
    ))
    .unwrap()
}

fn script() -> Vec<Step> {
    vec![
        Step::new("send_invoice", json!({ "invoice_id": 4471 })),
        Step::new("post_ticket", json!({ "ticket": 7 })),
    ]
}

/// `episodes` episodes of the toolbox with receipts in `kind`, run by the test `test`.
fn run(kind: &str, test: &str) -> Report {
    run_on(Harness::new(toolbox(kind), script()), kind, test)
}

fn run_on(harness: Harness, kind: &str, test: &str) -> Report {
    let dir = std::env::temp_dir().join(format!("stormguard-{test}-{}", std::process::id()));
    let report = harness
        .crashes(0.7)
        .run_in_processes(12, 7, test, &dir)
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{kind}: {report:?}");
    report
}

#[test]
fn receipts_in_sqlite_leave_no_duplicate_after_real_sigkills() {
    let report = run(
        "sqlite",
        "receipts_in_sqlite_leave_no_duplicate_after_real_sigkills",
    );
    assert!(report.crashes >= 4, "{report:?}");
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert!(report.effects > 0, "{report:?}");
}

#[test]
fn receipts_kept_in_memory_send_an_unkeyed_write_again_after_a_real_sigkill() {
    let report = run(
        "memory",
        "receipts_kept_in_memory_send_an_unkeyed_write_again_after_a_real_sigkill",
    );
    assert!(report.crashes >= 4, "{report:?}");
    // The resumed process finds no receipt: the ticket is posted a second time.
    assert!(report.duplicate_effects > 0, "{report:?}");
    assert_eq!(
        report.duplicates_by_tool.keys().collect::<Vec<_>>(),
        ["post_ticket"],
        "{report:?}"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn receipts_in_postgres_leave_no_duplicate_after_real_sigkills() {
    let Ok(url) = std::env::var("STORMGUARD_POSTGRES_URL") else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "STORMGUARD_POSTGRES_URL is not set under CI=true: .ci/run sets it"
        );
        eprintln!("skipped: STORMGUARD_POSTGRES_URL is not set");
        return;
    };
    let harness = Harness::new(toolbox("postgres"), script()).postgres(&url);
    let report = run_on(
        harness,
        "postgres",
        "receipts_in_postgres_leave_no_duplicate_after_real_sigkills",
    );
    assert!(report.crashes >= 4, "{report:?}");
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert!(report.effects > 0, "{report:?}");
    // What a crash left unknown was escalated, not sent again.
    assert!(
        report.escalations.contains_key("outcome_unknown"),
        "{report:?}"
    );
}

#[test]
fn a_postgres_store_without_its_database_is_refused() {
    let dir = std::env::temp_dir().join(format!("stormguard-refused-{}", std::process::id()));
    let err = Harness::new(toolbox("postgres"), script())
        .run_in_processes(
            1,
            7,
            "a_postgres_store_without_its_database_is_refused",
            &dir,
        )
        .unwrap_err();
    assert_eq!(err.field(), "stores");
    assert!(err.to_string().contains("Harness::postgres"), "{err}");
}
