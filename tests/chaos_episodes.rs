//! The episode harness on a user's toolbox: a sound table does nothing twice over 1,000 seeded
//! episodes with crashes; a table with a deliberate defect does, and the report says where.
#![cfg(feature = "chaos")]

use serde_json::json;
use stormguard::chaos::{Harness, Resume, Step};
use stormguard::tool::Toolbox;

/// A billing agent's table: a read, a keyed write and an unkeyed write, with `overrides` merged
/// into the tools by name.
fn toolbox(send_invoice: serde_json::Value, post_ticket: serde_json::Value) -> Toolbox {
    let file = json!({
        "stores": { "receipts": { "kind": "postgres", "retention_secs": 604800 } },
        "tools": [
            { "name": "search", "class": "read", "retry": ["layer"] },
            send_invoice,
            post_ticket,
        ]
    });
    Toolbox::from_json_str(&file.to_string()).unwrap()
}

fn sound_invoice() -> serde_json::Value {
    json!({ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
            "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } })
}

fn sound_ticket() -> serde_json::Value {
    json!({ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
            "key": ["run", "tool", "id:ticket"], "unknown_outcome": "escalate",
            "receipt": { "store": "receipts" } })
}

fn script() -> Vec<Step> {
    vec![
        Step::new("search", json!({ "q": "unpaid invoices" })),
        Step::new("send_invoice", json!({ "invoice_id": 4471 })),
        Step::new(
            "post_ticket",
            json!({ "ticket": "t-1", "body": "sent 4471" }),
        ),
    ]
}

#[test]
fn a_sound_table_does_nothing_twice_over_1000_episodes_with_crashes() {
    // A table the audit passes (issue 37: no audit fix may lead to a duplicate).
    let audit = toolbox(sound_invoice(), sound_ticket()).audit();
    assert!(!audit.has_errors(), "{}", audit.to_markdown());
    // The audit's earlier suggested fix for the ticket (no retries, escalate, no receipt) is
    // no longer a pass: nothing would record the ticket across a crash.
    let unrecorded = json!({ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
            "unknown_outcome": "escalate" });
    let audit = toolbox(sound_invoice(), unrecorded).audit();
    assert!(
        audit
            .findings
            .iter()
            .any(|f| f.code == "write-without-receipt"),
        "{}",
        audit.to_markdown()
    );
    let report = Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
        .run(1_000, 7)
        .unwrap();
    println!("1,000 episodes, seed 7: {report:?}");
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert_eq!(report.lost_work, 0, "{report:?}");
    assert!(report.crashes > 100, "{report:?}");
    // What could not be decided was escalated, not guessed.
    assert!(
        report
            .escalations
            .get("outcome_unknown")
            .copied()
            .unwrap_or(0)
            > 0,
        "{report:?}"
    );
    // The same seed, the same run.
    let again = Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
        .run(1_000, 7)
        .unwrap();
    assert_eq!(again, report);
}

#[test]
fn an_unkeyed_write_retried_automatically_duplicates_and_the_report_names_it() {
    let retried = json!({ "name": "post_ticket", "class": "unkeyed_write", "retry": ["layer"],
                          "unknown_outcome": "escalate" });
    let report = Harness::new(toolbox(sound_invoice(), retried), script())
        .run(1_000, 7)
        .unwrap();
    // Without a key and receipt, a crash and resume sends it again.
    assert!(report.duplicate_effects > 0, "{report:?}");
    assert!(report.silent_duplicates > 0, "{report:?}");
    assert_eq!(
        report.duplicates_by_tool.keys().collect::<Vec<_>>(),
        ["post_ticket"]
    );
}

#[test]
fn a_key_that_changes_when_the_model_reissues_duplicates() {
    // The model owns the retries, and the key includes the step: its reissue is a new key.
    let step_keyed = json!({ "name": "send_invoice", "class": "keyed_write", "retry": ["model"],
            "key": ["run", "step", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } });
    let report = Harness::new(toolbox(step_keyed, sound_ticket()), script())
        .run(1_000, 7)
        .unwrap();
    assert!(report.duplicate_effects > 0, "{report:?}");
    assert_eq!(
        report.duplicates_by_tool.keys().collect::<Vec<_>>(),
        ["send_invoice"]
    );
    // The same with the step left out of the key: nothing twice.
    let run_keyed = json!({ "name": "send_invoice", "class": "keyed_write", "retry": ["model"],
            "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } });
    let report = Harness::new(toolbox(run_keyed, sound_ticket()), script())
        .run(1_000, 7)
        .unwrap();
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
}

#[test]
fn a_script_outside_the_toolbox_or_a_bad_rate_is_refused() {
    let tb = toolbox(sound_invoice(), sound_ticket());
    let err = Harness::new(tb.clone(), vec![Step::new("nope", json!({}))])
        .run(1, 1)
        .unwrap_err();
    assert_eq!(err.field(), "script");
    let err = Harness::new(tb, script())
        .after_work(1.5)
        .run(1, 1)
        .unwrap_err();
    assert_eq!(err.field(), "after_work");
}

#[test]
fn the_rates_of_two_tables_are_drawn_side_by_side() {
    let sound = Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
        .run(200, 7)
        .unwrap();
    let mut retried = sound_ticket();
    retried["retry"] = json!(["layer"]);
    retried.as_object_mut().unwrap().remove("receipt");
    retried.as_object_mut().unwrap().remove("key");
    let defect = Harness::new(toolbox(sound_invoice(), retried), script())
        .run(200, 7)
        .unwrap();
    let svg = stormguard::chaos::Report::svg(&[("sound", &sound), ("ticket retried", &defect)]);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(dir.join("episodes.svg"), &svg).unwrap();
    // Each run's first bar is its duplicate effects per episode, as the report says.
    let titles: Vec<f64> = svg
        .match_indices("<title>")
        .map(|(i, _)| svg[i + 7..].split('<').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(titles.len(), 6);
    assert_eq!(titles[0], 0.0, "the sound table duplicates nothing");
    let rate = defect.duplicate_effects as f64 / 200.0;
    assert!(
        (titles[3] - rate).abs() < 1e-4 && rate > 0.0,
        "{titles:?} {defect:?}"
    );
}

#[test]
fn a_key_built_from_the_models_wording_duplicates_when_it_rewords() {
    // The note is free text: the model words it differently when it asks again.
    let worded = json!({ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
            "key": ["run", "tool", "text:note"], "unknown_outcome": "escalate",
            "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } });
    let script = vec![
        Step::new("send_invoice", json!({ "invoice_id": 4471, "note": "due" }))
            .reworded(json!({ "invoice_id": 4471, "note": "payment due" })),
    ];
    let tb = toolbox(worded, sound_ticket());
    let quiet = |h: Harness| {
        h.crashes(0.0)
            .before_work(0.0)
            .after_work(0.0)
            .late_commits(0.0)
    };
    let report = quiet(Harness::new(tb.clone(), script.clone()))
        .rewords(0.5)
        .run(400, 7)
        .unwrap();
    assert!(report.duplicate_effects > 100, "{report:?}");
    assert_eq!(
        report.faults.get("reworded"),
        Some(&report.duplicate_effects)
    );
    // Never reworded, the same key deduplicates.
    let report = quiet(Harness::new(tb, script))
        .rewords(0.0)
        .run(400, 7)
        .unwrap();
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
}

#[test]
fn a_run_resumed_after_the_key_window_sends_again_without_receipts() {
    // A key alone: the provider deduplicates for its window, then forgets.
    let key_only = json!({ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
            "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate" });
    let next_day = |invoice: serde_json::Value| {
        Harness::new(toolbox(invoice, sound_ticket()), script())
            .crashes(1.0)
            .resumes(&[Resume::AfterKeyWindow])
            .run(300, 7)
            .unwrap()
    };
    let report = next_day(key_only);
    assert!(
        report.duplicates_by_tool.contains_key("send_invoice"),
        "{report:?}"
    );
    // With receipts, the pending intent is older than the window: escalated, not sent.
    let report = next_day(sound_invoice());
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert!(
        report.escalations.contains_key("outcome_unknown"),
        "{report:?}"
    );
    assert_eq!(
        report.faults.get("resume_after_key_window"),
        Some(&report.crashes)
    );
}

#[test]
fn no_resume_is_refused() {
    let err = Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
        .resumes(&[])
        .run(1, 1)
        .unwrap_err();
    assert_eq!(err.field(), "resumes");
}

#[test]
fn parallel_branches_under_faults_repeat_for_a_seed() {
    // Two branches at every step, retried through faults: their calls interleave by the
    // backoff's jitter, which the harness seeds from the run's seed.
    let run = || {
        Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
            .parallel(1.0)
            .before_work(0.3)
            .after_work(0.2)
            .run(300, 11)
            .unwrap()
    };
    let first = run();
    assert!(
        first.faults.get("parallel").copied().unwrap_or(0) >= 300,
        "{first:?}"
    );
    for _ in 0..3 {
        assert_eq!(run(), first);
    }
    assert_eq!(first.duplicate_effects, 0, "{first:?}");
}

#[test]
fn a_stack_the_toolbox_cannot_build_is_refused_before_any_episode() {
    // A receipt with no key to file it under.
    let unkeyed_receipt = json!({ "name": "send_invoice", "class": "keyed_write",
            "retry": ["layer"], "unknown_outcome": "escalate", "receipt": { "store": "receipts" } });
    // A read-back with no receipts to find the unknown outcome in.
    let read_back_alone = json!({ "name": "post_ticket", "class": "unkeyed_write",
            "retry": ["none"], "key": ["run", "tool", "id:ticket"],
            "unknown_outcome": { "read_back": { "attempts": 3, "within_secs": 10 } } });
    for (invoice, ticket) in [
        (unkeyed_receipt, sound_ticket()),
        (sound_invoice(), read_back_alone),
    ] {
        let err = Harness::new(toolbox(invoice, ticket), script())
            .run(10, 1)
            .expect_err("an unbuildable stack is refused, not run into escalations");
        assert!(
            err.tool() == Some("send_invoice") || err.tool() == Some("post_ticket"),
            "{err}"
        );
    }
}

#[test]
fn fault_rates_over_one_and_an_unknown_tool_name_the_setting_at_fault() {
    let tb = toolbox(sound_invoice(), sound_ticket());
    let err = Harness::new(tb.clone(), script())
        .before_work(0.6)
        .after_work(0.5)
        .run(1, 1)
        .unwrap_err();
    assert_eq!(err.field(), "fault_rates");
    assert!(err.to_string().contains("before_work (0.6)"), "{err}");
    let err = Harness::new(tb, script())
        .applies("nope", stormguard::chaos::Applies::EveryCall)
        .run(1, 1)
        .unwrap_err();
    assert_eq!((err.field(), err.tool()), ("applies", Some("nope")));
}

#[test]
fn no_episode_or_an_empty_script_is_refused() {
    let tb = toolbox(sound_invoice(), sound_ticket());
    let err = Harness::new(tb.clone(), script()).run(0, 1).unwrap_err();
    assert_eq!(err.field(), "episodes");
    let err = Harness::new(tb, vec![]).run(10, 1).unwrap_err();
    assert_eq!(err.field(), "script");
}

#[test]
fn a_step_that_never_reaches_the_provider_is_refused_not_passed() {
    // A typo in the arguments: the key's field is missing, every call is refused locally.
    let typo = vec![Step::new("send_invoice", json!({ "invoiceid": 4471 }))];
    let err = Harness::new(toolbox(sound_invoice(), sound_ticket()), typo)
        .run(50, 7)
        .unwrap_err();
    assert_eq!((err.field(), err.tool()), ("script", Some("send_invoice")));
    assert!(err.reason().contains("reached the provider"), "{err}");
    // Reached, its calls are counted by tool.
    let report = Harness::new(toolbox(sound_invoice(), sound_ticket()), script())
        .run(50, 7)
        .unwrap();
    assert_eq!(
        report.calls_by_tool.values().sum::<u64>(),
        report.calls,
        "{report:?}"
    );
}

#[test]
fn endless_reissues_are_refused_and_an_endless_log_lag_posts_a_read_back_ticket_again() {
    let tb = toolbox(sound_invoice(), sound_ticket());
    let err = Harness::new(tb, script())
        .reissues(u32::MAX)
        .run(1, 1)
        .unwrap_err();
    assert_eq!(err.field(), "reissues");
    // A ticket read back from a log that never shows anything: the read-back's miss means
    // "not done", and the ticket is posted again (the harness shows it; no overflow).
    let read_back = json!({ "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"],
            "key": ["run", "tool", "id:ticket"], "receipt": { "store": "receipts" },
            "unknown_outcome": { "read_back": { "attempts": 3, "within_secs": 10 } } });
    let report = Harness::new(toolbox(sound_invoice(), read_back), script())
        .log_lag(std::time::Duration::MAX)
        .crashes(0.5)
        .run(200, 7)
        .unwrap();
    assert_eq!(
        report.duplicates_by_tool.keys().collect::<Vec<_>>(),
        ["post_ticket"],
        "{report:?}"
    );
}

#[test]
fn a_step_carries_the_callers_tenant_to_a_quota_keyed_on_it() {
    let tb = Toolbox::from_json_str(
        r#"{ "quotas": { "q": { "per_sec": 100, "burst": 10 } },
             "tools": [{ "name": "search", "class": "read", "retry": ["layer"],
                         "quota": { "name": "q", "key": "tenant", "cost": 1 } }] }"#,
    )
    .unwrap();
    let search = Step::new("search", json!({ "q": "unpaid" }));
    // Without the tenant, no call can be counted against the quota: nothing is tested.
    let err = Harness::new(tb.clone(), vec![search.clone()])
        .run(20, 7)
        .unwrap_err();
    assert_eq!((err.field(), err.tool()), ("script", Some("search")));
    let report = Harness::new(tb, vec![search.with("tenant", "acme")])
        .run(20, 7)
        .unwrap();
    assert!(report.calls_by_tool["search"] >= 20, "{report:?}");
}

#[test]
fn a_table_the_audit_passes_does_nothing_twice_though_the_model_reissues_escalations() {
    let tb = toolbox(sound_invoice(), sound_ticket());
    let audit = tb.audit();
    assert!(audit.findings.is_empty(), "{:?}", audit.findings);
    let report = Harness::new(tb, script()).run(1_000, 11).unwrap();
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert!(report.crashes > 100, "{report:?}");
    // The model reissued what it was told not to, and nothing was sent twice for it.
    assert!(
        report.faults.get("defied").copied().unwrap_or(0) > 0,
        "{report:?}"
    );
}

#[test]
fn an_unknown_outcome_reissued_by_the_model_is_held_without_a_receipt() {
    // No receipt, retries handed to the model: the audit says nothing records the call...
    let bare = json!({ "name": "post_ticket", "class": "unkeyed_write", "retry": ["model"],
                       "unknown_outcome": "escalate" });
    let tb = toolbox(sound_invoice(), bare);
    let codes: Vec<_> = tb.audit().findings.iter().map(|f| f.code).collect();
    assert_eq!(codes, ["write-without-receipt"]);
    // ...and with no crash, no lost answer asked for again and no parallel branch, the model's
    // reissues of an outcome_unknown are held below it: nothing twice.
    let quiet = |h: Harness| {
        h.crashes(0.0)
            .rewords(0.0)
            .parallel(0.0)
            .reissues_escalations(1.0)
    };
    let report = quiet(Harness::new(tb.clone(), script()))
        .run(1_000, 7)
        .unwrap();
    assert_eq!(report.duplicate_effects, 0, "{report:?}");
    assert!(
        report.faults.get("defied").copied().unwrap_or(0) > 20,
        "{report:?}"
    );
    // A crash and resume is what the audit warned of: the book is lost with the process.
    let crashed = Harness::new(tb, script())
        .rewords(0.0)
        .parallel(0.0)
        .run(1_000, 7)
        .unwrap();
    assert!(crashed.duplicate_effects > 0, "{crashed:?}");
    assert_eq!(
        crashed.duplicates_by_tool.keys().collect::<Vec<_>>(),
        ["post_ticket"]
    );
}
