//! One test per audit finding: it fires on the defect and not on the fixed tool.

use stormguard::class::ToolClass;
use stormguard::tool::{
    Annotations, KeyPart, QuotaSpec, RetryOwner, Severity, StoreSpec, Tool, Toolbox, UnknownOutcome,
};

fn codes(tools: Vec<Tool>) -> Vec<&'static str> {
    let mut tb = Toolbox::new(vec![])
        .unwrap()
        .with_store(
            "pg",
            StoreSpec {
                kind: "postgres".into(),
                retention_secs: 3600,
            },
        )
        .unwrap();
    for t in tools {
        tb = tb.with_tool(t).unwrap();
    }
    tb.audit().findings.into_iter().map(|f| f.code).collect()
}

fn codes_with_quota(tools: Vec<Tool>) -> Vec<&'static str> {
    let mut tb = Toolbox::new(vec![])
        .unwrap()
        .with_quota(
            "q",
            QuotaSpec {
                per_sec: 1,
                burst: 10,
            },
        )
        .unwrap();
    for t in tools {
        tb = tb.with_tool(t).unwrap();
    }
    tb.audit().findings.into_iter().map(|f| f.code).collect()
}

fn keyed() -> Tool {
    Tool::new("send_invoice", ToolClass::KeyedWrite, RetryOwner::Layer)
        .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")])
        .unknown_outcome(UnknownOutcome::Escalate)
}

#[test]
fn the_fixed_keyed_write_has_no_findings() {
    assert_eq!(codes(vec![keyed()]), Vec::<&str>::new());
}

#[test]
fn keyed_write_without_key_source() {
    let mut t = keyed();
    t.key = None;
    assert_eq!(codes(vec![t]), ["keyed-write-without-key-source"]);
    assert!(!codes(vec![keyed()]).contains(&"keyed-write-without-key-source"));
}

#[test]
fn key_includes_free_text() {
    let t = keyed().key(vec![KeyPart::Run, KeyPart::text("subject")]);
    assert_eq!(codes(vec![t]), ["key-includes-free-text"]);
}

#[test]
fn unkeyed_write_with_retries() {
    let bad = Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Client)
        .unknown_outcome(UnknownOutcome::Escalate);
    assert_eq!(
        codes(vec![bad]),
        ["unkeyed-write-with-retries", "write-without-receipt"]
    );
    let fixed = Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Model)
        .unknown_outcome(UnknownOutcome::Escalate)
        .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("ticket")])
        .receipt("pg", None);
    assert!(codes(vec![fixed]).is_empty());
}

#[test]
fn write_without_receipt() {
    // The retries handed to the model: still nothing records the call, so a resume (or the
    // model asking again for a lost answer) sends it again.
    let bare = Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Model)
        .unknown_outcome(UnknownOutcome::Escalate);
    assert_eq!(codes(vec![bare]), ["write-without-receipt"]);
    let recorded = Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Model)
        .unknown_outcome(UnknownOutcome::Escalate)
        .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("ticket")])
        .receipt("pg", None);
    assert!(codes(vec![recorded]).is_empty());
}

#[test]
fn resumed_keyed_write_without_receipt() {
    let resumed = keyed().resume_window_secs(3600);
    assert_eq!(
        codes(vec![resumed]),
        ["resumed-keyed-write-without-receipt"]
    );
    // Not resumed: the provider's key covers the retries in the process.
    assert!(codes(vec![keyed()]).is_empty());
    let recorded = keyed().resume_window_secs(3600).receipt("pg", Some(86_400));
    assert!(codes(vec![recorded]).is_empty());
}

#[test]
fn write_without_unknown_outcome() {
    let mut t = keyed();
    t.unknown_outcome = None;
    assert_eq!(codes(vec![t]), ["write-without-unknown-outcome"]);
    let read = Tool::new("search", ToolClass::Read, RetryOwner::Layer);
    assert!(codes(vec![read]).is_empty());
}

#[test]
fn several_retry_owners() {
    let t = keyed().also_retried_by(RetryOwner::Client);
    assert_eq!(codes(vec![t]), ["several-retry-owners"]);
    let with_none = keyed().also_retried_by(RetryOwner::None);
    assert!(codes(vec![with_none]).is_empty());
}

#[test]
fn receipt_retention_shorter_than_resume() {
    let t = keyed().receipt("pg", Some(86_400)).resume_window_secs(7200);
    assert_eq!(codes(vec![t]), ["receipt-retention-shorter-than-resume"]);
    let fixed = keyed().receipt("pg", Some(86_400)).resume_window_secs(3600);
    assert!(codes(vec![fixed]).is_empty());
}

#[test]
fn resume_longer_than_key_window() {
    let t = keyed().receipt("pg", Some(600)).resume_window_secs(1800);
    assert_eq!(codes(vec![t]), ["resume-longer-than-key-window"]);
    let fixed = keyed().receipt("pg", Some(3600)).resume_window_secs(1800);
    assert!(codes(vec![fixed]).is_empty());
}

#[test]
fn idempotent_hint_on_a_keyed_or_unkeyed_write() {
    let hint = Annotations {
        idempotent_hint: Some(true),
        ..Default::default()
    };
    assert_eq!(
        codes(vec![keyed().annotations(hint)]),
        ["annotation-idempotent-contradicts-class"]
    );
    let fine = Tool::new("upsert", ToolClass::IdempotentWrite, RetryOwner::Layer)
        .unknown_outcome(UnknownOutcome::Escalate)
        .annotations(hint);
    assert!(codes(vec![fine]).is_empty());
}

#[test]
fn read_only_hint_on_a_write() {
    let hint = Annotations {
        read_only_hint: Some(true),
        ..Default::default()
    };
    assert_eq!(
        codes(vec![keyed().annotations(hint)]),
        ["annotation-read-only-contradicts-class"]
    );
    let fine = Tool::new("search", ToolClass::Read, RetryOwner::Layer).annotations(hint);
    assert!(codes(vec![fine]).is_empty());
}

#[test]
fn name_says_write_on_read() {
    // The runtime decides `create_ticket` as an unkeyed write; the audit says so before it runs.
    let read = Tool::new("create_ticket", ToolClass::Read, RetryOwner::Layer);
    assert_eq!(codes(vec![read.clone()]), ["name-says-write-on-read"]);
    let idempotent = Tool::new("send_digest", ToolClass::IdempotentWrite, RetryOwner::Layer)
        .unknown_outcome(UnknownOutcome::Escalate);
    assert_eq!(codes(vec![idempotent]), ["name-says-write-on-read"]);
    // Told the name misleads, or given a name that does not begin with a write verb: silent.
    assert!(codes(vec![read.trust_class()]).is_empty());
    assert!(codes(vec![Tool::new(
        "ticket_status",
        ToolClass::Read,
        RetryOwner::Layer
    )])
    .is_empty());
    // A verb inside the name is not its first word.
    assert!(codes(vec![Tool::new(
        "list_created",
        ToolClass::Read,
        RetryOwner::Layer
    )])
    .is_empty());
}

#[test]
fn annotation_destructive_on_read() {
    let hint = Annotations {
        destructive_hint: Some(true),
        ..Default::default()
    };
    let read = Tool::new("ticket_status", ToolClass::Read, RetryOwner::Layer).annotations(hint);
    assert_eq!(codes(vec![read]), ["annotation-destructive-on-read"]);
    // The severity is an error: a retry of a destructive call repeats it.
    let tb = Toolbox::new(vec![Tool::new(
        "ticket_status",
        ToolClass::Read,
        RetryOwner::Layer,
    )
    .annotations(hint)])
    .unwrap();
    assert!(tb.audit().has_errors());
    // `trust_class` does not silence what the server says of its own tool.
    let trusted = Tool::new("ticket_status", ToolClass::Read, RetryOwner::Layer)
        .annotations(hint)
        .trust_class();
    assert_eq!(codes(vec![trusted]), ["annotation-destructive-on-read"]);
    let fine = keyed().annotations(hint);
    assert!(codes(vec![fine]).is_empty());
}

#[test]
fn quota_used_with_two_settings() {
    let a = Tool::new("a", ToolClass::Read, RetryOwner::Layer).quota("q", "tenant", 1);
    let b = Tool::new("b", ToolClass::Read, RetryOwner::Layer).quota("q", "user", 1);
    assert_eq!(
        codes_with_quota(vec![a.clone(), b]),
        ["quota-used-with-two-settings"]
    );
    let c = Tool::new("c", ToolClass::Read, RetryOwner::Layer).quota("q", "tenant", 2);
    assert_eq!(
        codes_with_quota(vec![a.clone(), c]),
        ["quota-used-with-two-settings"]
    );
    let same = Tool::new("d", ToolClass::Read, RetryOwner::Layer).quota("q", "tenant", 1);
    assert!(codes_with_quota(vec![a, same]).is_empty());
}

#[test]
fn step_in_key_of_reissued_write() {
    let mut t = keyed().key(vec![
        KeyPart::Run,
        KeyPart::Tool,
        KeyPart::Step,
        KeyPart::id("invoice_id"),
    ]);
    t.reissue_likely = true;
    assert_eq!(codes(vec![t.clone()]), ["step-in-key-of-reissued-write"]);
    // Flagged as well when the reissue is not declared likely: agents reissue.
    t.reissue_likely = false;
    assert_eq!(codes(vec![t]), ["step-in-key-of-reissued-write"]);
}

#[test]
fn receipts_in_memory_for_a_resumed_tool() {
    let memory = StoreSpec {
        kind: "memory".into(),
        retention_secs: 604_800,
    };
    let t = keyed()
        .receipt("mem", Some(86_400))
        .resume_window_secs(3_600);
    let tb = Toolbox::new(vec![])
        .unwrap()
        .with_store("mem", memory)
        .unwrap()
        .with_tool(t.clone())
        .unwrap();
    let found: Vec<_> = tb.audit().findings.iter().map(|f| f.code).collect();
    assert_eq!(found, ["receipts-in-memory-for-resumed-tool"]);
    // Not resumed: nothing to lose.
    let mut t = t;
    t.resume_window_secs = None;
    let tb = Toolbox::new(vec![])
        .unwrap()
        .with_store(
            "mem",
            StoreSpec {
                kind: "memory".into(),
                retention_secs: 604_800,
            },
        )
        .unwrap()
        .with_tool(t)
        .unwrap();
    assert!(tb.audit().findings.is_empty());
}

#[test]
fn keyed_write_without_key_window() {
    let pg = StoreSpec {
        kind: "postgres".into(),
        retention_secs: 604_800,
    };
    let tb = Toolbox::new(vec![])
        .unwrap()
        .with_store("pg", pg)
        .unwrap()
        .with_tool(keyed().receipt("pg", None))
        .unwrap();
    let found: Vec<_> = tb.audit().findings.iter().map(|f| f.code).collect();
    assert_eq!(found, ["keyed-write-without-key-window"]);
}

#[test]
fn severities_and_has_errors() {
    let mut t = keyed();
    t.key = None;
    let tb = Toolbox::new(vec![t]).unwrap();
    let audit = tb.audit();
    assert_eq!(audit.findings[0].severity, Severity::Error);
    assert!(audit.has_errors());
    assert_eq!(audit.findings[0].tool, "send_invoice");
    let v: serde_json::Value = serde_json::from_str(&audit.to_json()).unwrap();
    assert_eq!(v["findings"][0]["code"], "keyed-write-without-key-source");
    assert!(audit
        .to_markdown()
        .contains("| send_invoice | keyed_write | - | - | escalate | layer |"));
}

#[test]
fn scan_flags_random_keys_near_a_key_only() {
    let near = "fn call() {\n    let key = IdempotencyKey::from(Uuid::new_v4().to_string());\n}\n";
    let hits = stormguard::tool::scan(&[("src/a.rs", near)], 10);
    assert_eq!(hits.len(), 1);
    assert_eq!((hits[0].path.as_str(), hits[0].line), ("src/a.rs", 2));
    let header = "let n = rand::random::<u64>();\nreq.header(\"Idempotency-Key\", n.to_string());";
    assert_eq!(stormguard::tool::scan(&[("b.rs", header)], 3).len(), 1);
    let unrelated = "let trace_id = Uuid::new_v4();\n";
    assert!(stormguard::tool::scan(&[("c.rs", unrelated)], 10).is_empty());
}

#[test]
fn saga_steps_without_receipts_or_compensation() {
    use stormguard::saga::SagaSpec;
    let pg = StoreSpec {
        kind: "postgres".into(),
        retention_secs: 604_800,
    };
    let step = |name: &str| {
        Tool::new(name, ToolClass::KeyedWrite, RetryOwner::Layer)
            .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("trip_id")])
            .receipt("pg", Some(86_400))
            .unknown_outcome(UnknownOutcome::Escalate)
    };
    let tb = |reserve: Tool, spec: SagaSpec| {
        let mut tb = Toolbox::new(vec![])
            .unwrap()
            .with_store("pg", pg.clone())
            .unwrap();
        for t in [reserve, step("release"), step("issue")] {
            tb = tb.with_tool(t).unwrap();
        }
        let tb = tb.with_saga("trip", spec).unwrap();
        tb.audit()
            .findings
            .into_iter()
            .map(|f| (f.code, f.tool))
            .collect::<Vec<_>>()
    };
    let fixed = SagaSpec::new()
        .step("reserve", Some("release"))
        .step("issue", None);
    assert!(tb(step("reserve"), fixed.clone()).is_empty());
    // The reserve cannot be undone when the issue fails.
    let undone = SagaSpec::new().step("reserve", None).step("issue", None);
    assert_eq!(
        tb(step("reserve"), undone),
        [("saga-step-without-compensation", "reserve".to_owned())]
    );
    // A step a resume would repeat.
    let mut bare = step("reserve");
    bare.receipt = None;
    assert_eq!(
        tb(bare, fixed),
        [("saga-step-without-receipt", "reserve".to_owned())]
    );
}

#[test]
fn key_without_argument_part() {
    let mut t = keyed();
    t.key = Some(vec![KeyPart::Run, KeyPart::Tool]);
    assert_eq!(codes(vec![t]), ["key-without-argument-part"]);
    assert!(!codes(vec![keyed()]).contains(&"key-without-argument-part"));
}

#[test]
fn budget_across_dependencies() {
    let tb = |second: &str| {
        Toolbox::from_json_str(&format!(
            r#"{{ "budgets": {{ "b": {{ "ratio": 0.1, "min_per_sec": 1 }} }},
                 "tools": [
                   {{ "name": "chat", "class": "read", "retry": ["layer"], "budget": "b", "dependency": "llm" }},
                   {{ "name": "search", "class": "read", "retry": ["layer"], "budget": "b", "dependency": "{second}" }}
                 ] }}"#
        ))
        .unwrap()
        .audit()
    };
    let audit = tb("orders-api");
    let f: Vec<_> = audit
        .findings
        .iter()
        .map(|f| (f.code, f.tool.as_str()))
        .collect();
    assert_eq!(f, [("budget-across-dependencies", "budgets.b")]);
    assert!(
        audit.findings[0].message.contains("`llm`, `orders-api`"),
        "{}",
        audit.findings[0].message
    );
    assert!(
        tb("llm").findings.is_empty(),
        "one dependency's tools may share a budget"
    );
}

#[test]
fn scan_flags_clock_derived_keys_near_a_key() {
    for maker in [
        "SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis()",
        "chrono::Utc::now().timestamp_millis()",
        "Local::now().timestamp()",
        "OffsetDateTime::now_utc().unix_timestamp()",
        "Uuid::now_v7()",
        "Ulid::new()",
    ] {
        let src = format!(
            "let stamp = {maker};\nreq.header(\"idempotency-key\", format!(\"inv-{{stamp}}\"));"
        );
        assert_eq!(
            stormguard::tool::scan(&[("a.rs", &src)], 3).len(),
            1,
            "{maker}"
        );
        let unrelated = format!("let started = {maker};\n");
        assert!(
            stormguard::tool::scan(&[("b.rs", &unrelated)], 3).is_empty(),
            "{maker}"
        );
    }
}

#[test]
fn receipt_without_key() {
    let mut t = keyed().receipt("pg", Some(86_400));
    t.key = None;
    let found = codes(vec![t]);
    assert!(found.contains(&"receipt-without-key"), "{found:?}");
    assert!(!codes(vec![keyed().receipt("pg", Some(86_400))]).contains(&"receipt-without-key"));
}

#[test]
fn attempts_without_layer_retry() {
    let t = Tool::new("search", ToolClass::Read, RetryOwner::Model).max_attempts(3);
    assert_eq!(codes(vec![t]), ["attempts-without-layer-retry"]);
    let layer = Tool::new("search", ToolClass::Read, RetryOwner::Layer).max_attempts(3);
    assert!(codes(vec![layer]).is_empty());
}
