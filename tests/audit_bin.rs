//! The `stormguard-audit` binary on the two example files: exit codes and the expected findings.
#![cfg(feature = "audit")]

use std::process::Command;

const CODES: [&str; 15] = [
    "keyed-write-without-key-source",
    "key-includes-free-text",
    "unkeyed-write-with-retries",
    "write-without-unknown-outcome",
    "write-without-receipt",
    "several-retry-owners",
    "receipt-retention-shorter-than-resume",
    "resume-longer-than-key-window",
    "annotation-idempotent-contradicts-class",
    "annotation-read-only-contradicts-class",
    "quota-used-with-two-settings",
    "step-in-key-of-reissued-write",
    "store-kind-not-built",
    "read-back-without-receipt",
    "receipt-without-key",
];

/// How often each code fires on the defective table (once unless listed).
fn times(code: &str) -> usize {
    match code {
        // post_ticket and update_customer both read back without receipts.
        "read-back-without-receipt" => 2,
        _ => 1,
    }
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stormguard-audit"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_defective_table_exits_1_with_each_finding_once() {
    let (code, out) = run(&["examples/tools.toml"]);
    assert_eq!(code, 1, "{out}");
    for c in CODES {
        assert_eq!(
            out.matches(&format!("`{c}`")).count(),
            times(c),
            "{c} in {out}"
        );
    }
    let (code, json) = run(&["examples/tools.toml", "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v["audit"]["findings"].as_array().unwrap().len(),
        CODES.iter().map(|c| times(c)).sum::<usize>()
    );
}

#[test]
fn the_clean_table_exits_0() {
    let (code, out) = run(&["examples/tools-clean.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("No findings."));
}

#[test]
fn a_bad_file_exits_2_with_the_typed_error() {
    let dir = std::env::temp_dir().join(format!("sg-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[tools]]\nname = \"t\"\nclass = \"read\"\nretry = []\n",
    )
    .unwrap();
    let (code, out) = run(&[bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(out.contains("tool `t`, field `retry`"), "{out}");
    assert_eq!(run(&["no/such/file.toml"]).0, 2);
    std::fs::write(
        dir.join("k.rs"),
        "let k = IdempotencyKey::new(Uuid::new_v4());\n",
    )
    .unwrap();
    let (code, out) = run(&["examples/tools-clean.toml", "--scan", dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("k.rs:1"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_readme_shows_the_binarys_own_output() {
    let readme = include_str!("../README.md");
    let start = readme.find("## Audit your tool table").unwrap();
    let section = &readme[start
        ..start
            + readme[start..]
                .find("\n## ")
                .unwrap_or(readme.len() - start)];
    let (_, out) = run(&["examples/tools.toml"]);
    let shown: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("| ") || l.starts_with("- **"))
        .collect();
    assert!(shown.len() >= 4);
    for line in shown {
        assert!(
            out.lines().any(|o| o == line),
            "the README shows a line the audit does not print: {line}"
        );
    }
}

/// The codes the audit gives one tool, in a JSON audit.
fn codes_of(v: &serde_json::Value, tool: &str) -> Vec<String> {
    v["audit"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["tool"] == tool)
        .map(|f| f["code"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_clean_table_against_the_servers_tools_list_finds_the_renamed_and_the_undeclared() {
    // The server renamed `book_shipment` to `book_shipments` and added `delete_customer`: the
    // table alone passes, the table against the server's answer does not.
    let (code, json) = run(&[
        "examples/tools-clean.toml",
        "--mcp",
        "examples/mcp-tools-list.json",
        "--json",
    ]);
    assert_eq!(code, 1, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(codes_of(&v, "book_shipment"), ["declared-not-listed"]);
    let renamed = codes_of(&v, "book_shipments");
    assert!(
        renamed.contains(&"listed-not-declared".to_owned())
            && renamed.contains(&"write-without-receipt".to_owned()),
        "{renamed:?}"
    );
    let undeclared = codes_of(&v, "delete_customer");
    assert!(
        undeclared.contains(&"write-without-receipt".to_owned()),
        "{undeclared:?}"
    );
    // Every tool the server lists under its declared name adds nothing.
    for tool in [
        "search_docs",
        "fetch_invoice",
        "send_invoice",
        "charge_card",
    ] {
        assert_eq!(codes_of(&v, tool), Vec::<String>::new(), "{tool}");
    }
}

#[test]
fn the_servers_annotations_overrule_the_tables_and_a_bad_answer_exits_2() {
    let dir = std::env::temp_dir().join(format!("sg-audit-mcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The table calls fetch_invoice a read; the server's own answer says it is destructive.
    let list = dir.join("list.json");
    std::fs::write(
        &list,
        r#"{"tools": [{"name": "fetch_invoice", "annotations": {"destructiveHint": true}}]}"#,
    )
    .unwrap();
    let (code, json) = run(&[
        "examples/tools-clean.toml",
        "--mcp",
        list.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 1, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        codes_of(&v, "fetch_invoice"),
        ["annotation-destructive-on-read"]
    );
    assert_eq!(codes_of(&v, "search_docs"), ["declared-not-listed"]);
    // Not a tools/list answer, a hint that is not a boolean, a missing file, a missing path.
    for (text, says) in [
        (r#"{"error": {"code": -32601}}"#, "not a tools/list answer"),
        (
            r#"{"tools": [{"name": "t", "annotations": {"readOnlyHint": "yes"}}]}"#,
            "true or false",
        ),
    ] {
        std::fs::write(&list, text).unwrap();
        let (code, out) = run(&["examples/tools-clean.toml", "--mcp", list.to_str().unwrap()]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains(says), "{out}");
    }
    assert_eq!(
        run(&["examples/tools-clean.toml", "--mcp", "no/such.json"]).0,
        2
    );
    let (code, out) = run(&["examples/tools-clean.toml", "--mcp"]);
    assert_eq!(code, 2);
    assert!(out.contains("--mcp needs a path"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_misspelt_declaration_fails_the_audit_and_one_page_of_several_is_refused() {
    let dir = std::env::temp_dir().join(format!("sg-audit-near-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("tools.toml");
    std::fs::write(
        &table,
        "[[tools]]\nname = \"send_invoce\"\nclass = \"keyed_write\"\nretry = [\"layer\"]\nkey = [\"run\", \"tool\", \"id:invoice_id\"]\nunknown_outcome = \"escalate\"\n",
    )
    .unwrap();
    // The server's send_invoice says idempotent: undeclared, it would be retried without a key.
    let list = dir.join("list.json");
    std::fs::write(
        &list,
        r#"{"tools": [{"name": "send_invoice", "annotations": {"idempotentHint": true}}]}"#,
    )
    .unwrap();
    let (code, json) = run(&[
        table.to_str().unwrap(),
        "--mcp",
        list.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 1, "a misspelt tool fails CI: {json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let misspelt = v["audit"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "declared-not-listed")
        .unwrap()
        .clone();
    assert_eq!(misspelt["severity"], "error");
    assert!(misspelt["message"]
        .as_str()
        .unwrap()
        .contains("`send_invoice`"));
    std::fs::write(
        &list,
        r#"{"result": {"tools": [{"name": "send_invoce"}], "nextCursor": "page-2"}}"#,
    )
    .unwrap();
    let (code, out) = run(&[table.to_str().unwrap(), "--mcp", list.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("nextCursor"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
