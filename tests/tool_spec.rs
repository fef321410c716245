//! The tool table's file format: typed errors for every bad input, and round trips.

use proptest::prelude::*;
use stormguard::class::ToolClass;
use stormguard::tool::{KeyPart, RetryOwner, Tool, Toolbox, UnknownOutcome};

fn err(json: &str) -> (Option<String>, String) {
    let e = Toolbox::from_json_str(json).unwrap_err();
    (e.tool().map(str::to_owned), e.field().to_owned())
}

fn one(tool: &str) -> String {
    format!(r#"{{"tools": [{tool}]}}"#)
}

#[test]
fn bad_json_inputs_are_typed_errors_naming_tool_and_field() {
    let t = |rest: &str| {
        one(&format!(
            r#"{{"name": "t", "class": "keyed_write", "retry": ["layer"]{rest}}}"#
        ))
    };
    assert_eq!(err("{"), (None, "file".into()));
    assert_eq!(
        err(r#"{"tools": [{"name": "t", "class": "keyed_write"}]}"#).1,
        "file"
    );
    assert_eq!(
        err(r#"{"tools": [{"name": "t", "class": "nope", "retry": ["layer"]}]}"#).1,
        "file"
    );
    assert_eq!(err(&t(r#", "colour": "red""#)).1, "file");
    assert_eq!(
        err(&one(
            r#"{"name": " ", "class": "read", "retry": ["layer"]}"#
        ))
        .1,
        "name"
    );
    assert_eq!(
        err(&one(r#"{"name": "t", "class": "read", "retry": []}"#)),
        (Some("t".into()), "retry".into())
    );
    assert_eq!(
        err(&t(r#", "deadline_secs": 0"#)),
        (Some("t".into()), "deadline_secs".into())
    );
    assert_eq!(
        err(&t(r#", "resume_window_secs": 0"#)),
        (Some("t".into()), "resume_window_secs".into())
    );
    assert_eq!(err(&t(r#", "key": []"#)), (Some("t".into()), "key".into()));
    assert_eq!(
        err(&t(r#", "budget": "nope""#)),
        (Some("t".into()), "budget".into())
    );
    assert_eq!(
        err(&t(r#", "breaker": "nope""#)),
        (Some("t".into()), "breaker".into())
    );
    assert_eq!(
        err(&t(r#", "hedge": "nope""#)),
        (Some("t".into()), "hedge".into())
    );
    assert_eq!(
        err(&t(
            r#", "quota": {"name": "nope", "key": "tenant", "cost": 1}"#
        )),
        (Some("t".into()), "quota".into())
    );
    assert_eq!(
        err(&t(r#", "receipt": {"store": "nope"}"#)),
        (Some("t".into()), "receipt.store".into())
    );
    assert_eq!(
        err(&t(
            r#", "unknown_outcome": {"read_back": {"attempts": 0, "within_secs": 5}}"#
        ))
        .1,
        "unknown_outcome.read_back"
    );
    // A key part in the wrong form fails inside serde: a parse error of the file.
    assert_eq!(err(&t(r#", "key": ["uuid"]"#)).1, "file");
    let dup = r#"{"tools": [{"name": "t", "class": "read", "retry": ["layer"]}, {"name": "t", "class": "read", "retry": ["none"]}]}"#;
    assert_eq!(err(dup), (Some("t".into()), "name".into()));
    assert_eq!(
        err(r#"{"budgets": {"b": {"ratio": 1.5, "min_per_sec": 1}}, "tools": []}"#).1,
        "budgets.ratio"
    );
    assert_eq!(
        err(r#"{"breakers": {"b": {"failure_ratio": 0.0, "open_secs": 1}}, "tools": []}"#).1,
        "breakers.failure_ratio"
    );
    assert_eq!(
        err(r#"{"breakers": {"b": {"failure_ratio": 0.5, "open_secs": 0}}, "tools": []}"#).1,
        "breakers.open_secs"
    );
    assert_eq!(
        err(r#"{"quotas": {"q": {"per_sec": 0, "burst": 1}}, "tools": []}"#).1,
        "quotas"
    );
    assert_eq!(
        err(r#"{"stores": {"s": {"kind": "disk", "retention_secs": 1}}, "tools": []}"#).1,
        "stores.kind"
    );
    assert_eq!(
        err(r#"{"stores": {"s": {"kind": "redis", "retention_secs": 0}}, "tools": []}"#).1,
        "stores.retention_secs"
    );
    assert_eq!(
        err(&t(r#", "quota": {"name": "", "key": "tenant", "cost": 1}"#)).1,
        "quota"
    );
}

#[test]
fn serde_deserialize_runs_the_same_checks() {
    let bad = r#"{"name": "t", "class": "read", "retry": [], "deadline_secs": 3}"#;
    let e = serde_json::from_str::<Tool>(bad).unwrap_err();
    assert!(e.to_string().contains("retry"), "{e}");
    let tb = r#"{"tools": [{"name": "t", "class": "read", "retry": ["layer"], "budget": "b"}]}"#;
    assert!(serde_json::from_str::<Toolbox>(tb)
        .unwrap_err()
        .to_string()
        .contains("budget"));
}

#[test]
fn the_builder_runs_the_same_checks() {
    let t = Tool::new("t", ToolClass::KeyedWrite, RetryOwner::Layer).budget("nope");
    let e = Toolbox::new(vec![t]).unwrap_err();
    assert_eq!((e.tool(), e.field()), (Some("t"), "budget"));
}

#[cfg(feature = "audit")]
#[test]
fn bad_toml_inputs_are_typed_errors() {
    let e = Toolbox::from_toml_str("[[tools]]\nname = \"t\"\nclass = \"read\"\nretry = []\n")
        .unwrap_err();
    assert_eq!((e.tool(), e.field()), (Some("t"), "retry"));
    let e = Toolbox::from_toml_str("tools = 3").unwrap_err();
    assert_eq!(e.field(), "file");
    let e = Toolbox::from_toml_str(
        "[[tools]]\nname = \"t\"\nclass = \"read\"\nretry = [\"layer\"]\nbreaker = \"b\"\n",
    )
    .unwrap_err();
    assert_eq!(e.field(), "breaker");
}

#[cfg(feature = "audit")]
#[test]
fn the_example_files_load() {
    for f in ["examples/tools.toml", "examples/tools-clean.toml"] {
        let text = std::fs::read_to_string(f).unwrap();
        let tb = Toolbox::from_toml_str(&text).unwrap();
        assert_eq!(tb.tools().len(), 8, "{f}");
    }
}

fn tool() -> impl Strategy<Value = Tool> {
    let class = prop_oneof![
        Just(ToolClass::Read),
        Just(ToolClass::IdempotentWrite),
        Just(ToolClass::KeyedWrite),
        Just(ToolClass::UnkeyedWrite),
        Just(ToolClass::MultiStep)
    ];
    let owner = prop_oneof![
        Just(RetryOwner::Layer),
        Just(RetryOwner::Client),
        Just(RetryOwner::Model),
        Just(RetryOwner::None)
    ];
    let part = prop_oneof![
        Just(KeyPart::Run),
        Just(KeyPart::Tool),
        Just(KeyPart::Step),
        "[a-z_]{1,8}".prop_map(KeyPart::Id),
        "[a-z_]{1,8}".prop_map(KeyPart::Text)
    ];
    let unknown = prop_oneof![
        Just(None),
        Just(Some(UnknownOutcome::Escalate)),
        (1u32..5, 1u64..100).prop_map(|(attempts, within_secs)| Some(UnknownOutcome::ReadBack {
            attempts,
            within_secs
        }))
    ];
    (
        class,
        proptest::collection::vec(owner, 1..3),
        proptest::option::of(proptest::collection::vec(part, 1..4)),
        unknown,
        // A deadline is at most one day.
        proptest::option::of(1u64..=86_400),
        proptest::option::of(1u64..100_000),
        any::<bool>(),
        proptest::option::of(proptest::option::of(1u64..100_000)),
    )
        .prop_map(
            |(class, owners, key, unknown, deadline, resume, reissue, receipt)| {
                let mut t = Tool::new("x", class, owners[0]);
                for o in &owners[1..] {
                    t = t.also_retried_by(*o);
                }
                t.key = key;
                t.unknown_outcome = unknown;
                t.deadline_secs = deadline;
                t.resume_window_secs = resume;
                t.reissue_likely = reissue;
                if let Some(window) = receipt {
                    t = t.receipt("pg", window);
                }
                t.budget = Some("default".into());
                t
            },
        )
}

fn toolbox() -> impl Strategy<Value = Toolbox> {
    proptest::collection::vec(tool(), 0..6).prop_map(|tools| {
        let mut tb = Toolbox::new(vec![])
            .unwrap()
            .with_budget(
                "default",
                stormguard::tool::BudgetSpec {
                    ratio: 0.1,
                    min_per_sec: 10,
                },
            )
            .unwrap()
            .with_store(
                "pg",
                stormguard::tool::StoreSpec {
                    kind: "postgres".into(),
                    retention_secs: 86_400,
                },
            )
            .unwrap();
        for (i, mut t) in tools.into_iter().enumerate() {
            t.name = format!("tool_{i}");
            tb = tb.with_tool(t).unwrap();
        }
        tb
    })
}

proptest! {
    #[test]
    fn json_round_trip(tb in toolbox()) {
        prop_assert_eq!(Toolbox::from_json_str(&tb.to_json_string()).unwrap(), tb);
    }

    #[cfg(feature = "audit")]
    #[test]
    fn toml_round_trip(tb in toolbox()) {
        prop_assert_eq!(Toolbox::from_toml_str(&tb.to_toml_string()).unwrap(), tb);
    }
}
