//! The episode harness with real processes: each crash a SIGKILL of a child right after the
//! provider applied a call, each resume a new process over the same SQLite files.
#![cfg(all(feature = "chaos", feature = "sqlite", unix))]

use serde_json::json;
use stormguard::chaos::{Harness, Report, Resume, Step};
use stormguard::tool::Toolbox;

/// A keyed invoice and an unkeyed ticket, both with receipts in a store of `kind`, held two
/// seconds in flight (a run resumed at once waits that long, in real time, for the killed
/// process's lease).
fn toolbox(kind: &str) -> Toolbox {
    Toolbox::from_json_str(&format!(
        r#"{{
        "stores": {{ "receipts": {{ "kind": "{kind}", "retention_secs": 604800 }} }},
        "tools": [
            {{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
               "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
               "receipt": {{ "store": "receipts", "provider_key_window_secs": 86400, "lease_secs": 2 }} }},
            {{ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
               "key": ["run", "tool", "id:ticket"], "unknown_outcome": "escalate",
               "receipt": {{ "store": "receipts", "lease_secs": 2 }} }}
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
    // Resumed after the lease, within the provider's key window: the keyed invoice is safe.
    let harness = Harness::new(toolbox("memory"), script()).resumes(&[Resume::AfterLease]);
    let report = run_on(
        harness,
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

#[test]
fn a_resume_at_once_meets_the_killed_processs_lease_and_sends_nothing_twice() {
    // The resumed process, a second after the kill, finds the lease held and waits for it.
    let at_once = Harness::new(toolbox("sqlite"), script()).resumes(&[Resume::AtOnce]);
    let report = run_on(
        at_once,
        "sqlite",
        "a_resume_at_once_meets_the_killed_processs_lease_and_sends_nothing_twice",
    );
    assert!(report.crashes >= 4, "{report:?}");
    assert_eq!(report.faults.get("resume_at_once"), Some(&report.crashes));
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
}

#[test]
fn a_run_resumed_the_next_day_in_a_new_process_sends_a_keyed_write_again_without_receipts() {
    // A key and no receipts: the provider has forgotten the key when the run resumes.
    let key_only = Toolbox::from_json_str(
        r#"{ "tools": [
            { "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
              "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate" },
            { "name": "post_ticket", "class": "read", "retry": ["layer"] } ] }"#,
    )
    .unwrap();
    let next_day = Harness::new(key_only, script()).resumes(&[Resume::AfterKeyWindow]);
    let report = run_on(
        next_day,
        "memory",
        "a_run_resumed_the_next_day_in_a_new_process_sends_a_keyed_write_again_without_receipts",
    );
    assert_eq!(
        report.faults.get("resume_after_key_window"),
        Some(&report.crashes)
    );
    assert!(
        report.duplicates_by_tool.contains_key("send_invoice"),
        "{report:?}"
    );
}

#[test]
fn a_test_that_calls_run_in_processes_twice_is_refused_on_its_second_call() {
    let test = "a_test_that_calls_run_in_processes_twice_is_refused_on_its_second_call";
    let dir = std::env::temp_dir().join(format!("stormguard-twice-{}", std::process::id()));
    let harness = Harness::new(toolbox("sqlite"), script()).crashes(0.0);
    let first = harness.run_in_processes(1, 7, test, &dir).unwrap();
    assert_eq!(first.episodes, 1);
    // The second call's child runs this test from its start and reaches the first call.
    let err = harness.run_in_processes(1, 8, test, &dir).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(err.field(), "test");
    assert!(err.to_string().contains("more than once"), "{err}");
}

#[test]
fn a_wrong_test_name_is_refused_with_the_name_to_check() {
    let dir = std::env::temp_dir().join(format!("stormguard-misnamed-{}", std::process::id()));
    let err = Harness::new(toolbox("sqlite"), script())
        .run_in_processes(1, 7, "no_such_test", &dir)
        .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(err.field(), "test");
    assert!(err.to_string().contains("ran no episode"), "{err}");
    assert!(err.to_string().contains("no_such_test"), "{err}");
}

#[test]
fn a_late_commit_queued_by_a_killed_process_lands_and_the_resumed_run_ends() {
    // Half the calls time out at once and land a second later; every episode crashes. The
    // commits a killed child queued are the provider's: the resumed child lands them.
    let harness = Harness::new(toolbox("sqlite"), script())
        .before_work(0.0)
        .after_work(0.0)
        .rate_limited(0.0)
        .late_commits(0.5)
        .crashes(1.0);
    let report = run_on(
        harness,
        "sqlite",
        "a_late_commit_queued_by_a_killed_process_lands_and_the_resumed_run_ends",
    );
    assert!(
        report.faults.get("late_commit").copied().unwrap_or(0) > 0,
        "{report:?}"
    );
    assert!(report.crashes >= 4, "{report:?}");
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
}

#[cfg(feature = "postgres")]
#[test]
fn a_database_the_child_cannot_reach_is_refused_as_its_store() {
    let dir = std::env::temp_dir().join(format!("stormguard-unreachable-{}", std::process::id()));
    let err = Harness::new(toolbox("postgres"), script())
        .postgres("host=127.0.0.1 port=1 user=postgres dbname=test connect_timeout=2")
        .run_in_processes(
            1,
            7,
            "a_database_the_child_cannot_reach_is_refused_as_its_store",
            &dir,
        )
        .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(err.field(), "stores", "{err}");
    assert!(err.reason().contains("episode 0"), "{err}");
}
