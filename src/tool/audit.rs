//! The audit of a tool table: the five-column table and the findings, a pure function.

use std::collections::BTreeMap;

use serde::Serialize;

use super::parts::{KeyPart, RetryOwner, UnknownOutcome};
use super::spec::Tool;
use super::toolbox::Toolbox;
use crate::class::ToolClass;

mod budgets;
mod build;
mod evidence;
mod saga;

/// How bad a finding is: an `Error` fails the audit.
///
/// ```
/// use stormguard::tool::Severity;
/// assert_eq!(Severity::Error.as_str(), "error");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Unsafe: a duplicate effect or a lost outcome is possible.
    Error,
    /// Likely wrong.
    Warning,
    /// Worth a look.
    Note,
}

impl Severity {
    /// The lowercase name.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::Severity::Note.as_str(), "note");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// One row of the tool table: the reference text's five columns plus the name.
///
/// ```
/// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool, Toolbox}};
/// let tb = Toolbox::new(vec![Tool::new("search", ToolClass::Read, RetryOwner::Layer)]).unwrap();
/// assert_eq!(tb.audit().table[0].retry_owner, "layer");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The tool.
    pub name: String,
    /// Its class.
    pub class: String,
    /// Its key source (`-` for none).
    pub key_source: String,
    /// Its receipt store (`-` for none).
    pub receipt: String,
    /// Its unknown-outcome behaviour (`-` for none).
    pub unknown_outcome: String,
    /// Its retry owner(s).
    pub retry_owner: String,
}

/// One finding: severity, tool, stable code, message, fix.
///
/// ```
/// use stormguard::{class::ToolClass, tool::{RetryOwner, Severity, Tool, Toolbox}};
/// let tb = Toolbox::new(vec![Tool::new("send", ToolClass::KeyedWrite, RetryOwner::Layer)]).unwrap();
/// let audit = tb.audit();
/// assert!(audit.findings.iter().any(|f| f.code == "keyed-write-without-key-source" && f.severity == Severity::Error));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// The tool.
    pub tool: String,
    /// A stable code (kebab-case).
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: &'static str,
}

/// The audit: the table and the findings.
///
/// ```
/// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool, Toolbox}};
/// let audit = Toolbox::new(vec![Tool::new("search", ToolClass::Read, RetryOwner::Layer)]).unwrap().audit();
/// assert!(!audit.has_errors());
/// assert!(audit.to_markdown().contains("| search | read |"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// One row per tool, in declaration order.
    pub table: Vec<Row>,
    /// The findings, tool by tool.
    pub findings: Vec<Finding>,
}

impl Audit {
    /// Whether any finding is an [`Severity::Error`].
    ///
    /// ```
    /// assert!(!stormguard::tool::Toolbox::default().audit().has_errors());
    /// ```
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// The table and the findings as Markdown.
    ///
    /// ```
    /// assert!(stormguard::tool::Toolbox::default().audit().to_markdown().contains("No findings."));
    /// ```
    pub fn to_markdown(&self) -> String {
        let mut s = String::from("| tool | class | key source | receipt | unknown outcome | retry owner |\n|---|---|---|---|---|---|\n");
        for r in &self.table {
            s += &format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                r.name, r.class, r.key_source, r.receipt, r.unknown_outcome, r.retry_owner
            );
        }
        s += "\n";
        if self.findings.is_empty() {
            s += "No findings.\n";
        }
        for f in &self.findings {
            s += &format!(
                "- **{}** `{}` `{}`: {} Fix: {}\n",
                f.severity.as_str(),
                f.tool,
                f.code,
                f.message,
                f.fix
            );
        }
        s
    }

    /// The audit as JSON.
    ///
    /// ```
    /// let v: serde_json::Value = serde_json::from_str(&stormguard::tool::Toolbox::default().audit().to_json()).unwrap();
    /// assert!(v["findings"].as_array().unwrap().is_empty());
    /// ```
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

fn is_write(c: ToolClass) -> bool {
    c != ToolClass::Read
}

fn row(t: &Tool) -> Row {
    let join = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(", ")
        }
    };
    Row {
        name: t.name.clone(),
        class: t.class.as_str().to_owned(),
        key_source: join(t.key.iter().flatten().map(ToString::to_string).collect()),
        receipt: t
            .receipt
            .as_ref()
            .map_or("-".to_owned(), |r| r.store.clone()),
        unknown_outcome: match t.unknown_outcome {
            None => "-".to_owned(),
            Some(UnknownOutcome::Escalate) => "escalate".to_owned(),
            Some(UnknownOutcome::ReadBack {
                attempts,
                within_secs,
            }) => {
                format!("read back ({attempts} in {within_secs}s)")
            }
        },
        retry_owner: join(
            t.retry
                .iter()
                .map(|o| {
                    serde_json::to_value(o)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                })
                .collect(),
        ),
    }
}

/// The one way a rule adds a finding of tool `t`.
fn adder<'a>(
    t: &'a Tool,
    out: &'a mut Vec<Finding>,
) -> impl FnMut(Severity, &'static str, String, &'static str) + 'a {
    move |severity, code, message, fix| {
        out.push(Finding {
            severity,
            tool: t.name.clone(),
            code,
            message,
            fix,
        })
    }
}

fn tool_findings(tb: &Toolbox, t: &Tool, out: &mut Vec<Finding>) {
    let mut add = adder(t, out);
    let keyed = t.key.is_some();
    if t.class == ToolClass::KeyedWrite && !keyed {
        add(
            Severity::Error,
            "keyed-write-without-key-source",
            "a keyed write with no key source: every retry is a new effect.".into(),
            "declare `key` from the run, the tool and identifier fields of the arguments",
        );
    }
    for p in t.key.iter().flatten() {
        if let KeyPart::Text(f) = p {
            add(Severity::Error, "key-includes-free-text", format!("the key includes `{f}`, free text the model writes: a reworded retry is a new key."),
                "key on identifier fields and the task's identity only");
        }
    }
    // A saga's step runs once per saga run: its run is what tells two apart.
    let in_saga = tb.sagas().values().any(|s| {
        s.steps
            .iter()
            .any(|st| st.tool == t.name || st.compensation.as_deref() == Some(&t.name))
    });
    let tells_apart = |p: &KeyPart| matches!(p, KeyPart::Id(_) | KeyPart::Text(_));
    if matches!(&t.key, Some(k) if !in_saga && !k.iter().any(tells_apart)) {
        add(Severity::Warning, "key-without-argument-part", "the key names no argument field: two different calls in one run (two invoices) share a key, and the second is refused `idempotency_key_reused` by the receipts (or answered the first's result by the provider) instead of sent.".into(),
            "add the identifier fields that tell two calls apart (`id:invoice_id`)");
    }
    let auto = t
        .retry
        .iter()
        .any(|o| matches!(o, RetryOwner::Layer | RetryOwner::Client));
    if matches!(t.class, ToolClass::UnkeyedWrite | ToolClass::MultiStep) && !keyed && auto {
        add(Severity::Error, "unkeyed-write-with-retries", "an unkeyed write is retried automatically: an ambiguous failure becomes a duplicate.".into(),
            "set `retry = [\"none\"]` (or the model), or get a key from the provider and declare it a keyed write");
    }
    if is_write(t.class) && t.unknown_outcome.is_none() {
        add(
            Severity::Error,
            "write-without-unknown-outcome",
            "a write with no unknown-outcome behaviour.".into(),
            "declare `unknown_outcome = \"escalate\"` or a bounded `read_back`",
        );
    }
    let mut owners: Vec<RetryOwner> = t
        .retry
        .iter()
        .copied()
        .filter(|o| *o != RetryOwner::None)
        .collect();
    owners.dedup();
    if owners.len() > 1 {
        add(
            Severity::Error,
            "several-retry-owners",
            format!("{} retry owners: their attempts multiply.", owners.len()),
            "pick one owner and turn the others' retries off",
        );
    }
    if let Some(resume) = t.resume_window_secs {
        if let Some(r) = &t.receipt {
            if let Some(s) = tb.stores().get(&r.store) {
                if s.retention_secs < resume {
                    add(
                        Severity::Error,
                        "receipt-retention-shorter-than-resume",
                        format!(
                            "receipts are kept {}s but a run may resume after {resume}s.",
                            s.retention_secs
                        ),
                        "keep receipts at least as long as the longest resume window",
                    );
                }
            }
            if let Some(w) = r.provider_key_window_secs {
                if w < resume {
                    add(Severity::Error, "resume-longer-than-key-window",
                        format!("the provider forgets a key after {w}s but a run may resume after {resume}s."),
                        "shorten the resume window, or escalate resumed calls past the key window");
                }
            }
        }
    }
    if let Some(a) = t.annotations {
        if a.idempotent_hint == Some(true)
            && matches!(
                t.class,
                ToolClass::KeyedWrite | ToolClass::UnkeyedWrite | ToolClass::MultiStep
            )
        {
            add(
                Severity::Warning,
                "annotation-idempotent-contradicts-class",
                format!(
                    "the server says idempotentHint: true but the tool is declared {}.",
                    t.class.as_str()
                ),
                "trust the declared class; ask the server's owner to fix the hint",
            );
        }
        if a.read_only_hint == Some(true) && is_write(t.class) {
            add(
                Severity::Warning,
                "annotation-read-only-contradicts-class",
                format!(
                    "the server says readOnlyHint: true but the tool is declared {}.",
                    t.class.as_str()
                ),
                "trust the declared class; ask the server's owner to fix the hint",
            );
        }
    }
    if is_write(t.class) && t.key.iter().flatten().any(|p| *p == KeyPart::Step) {
        let message = if t.reissue_likely {
            "the key includes the step, and the model is likely to reissue this call at a later step: a new key, a second effect."
        } else {
            "the key includes the step: a model that reissues this call at a later step (agents do) makes a new key, a second effect."
        };
        add(
            Severity::Warning,
            "step-in-key-of-reissued-write",
            message.into(),
            "drop `step` from the key; key on the run, the tool and the object's identifier",
        );
    }
    if let (Some(_), Some(r)) = (t.resume_window_secs, &t.receipt) {
        if tb
            .stores()
            .get(&r.store)
            .is_some_and(|s| s.kind == "memory")
        {
            add(Severity::Error, "receipts-in-memory-for-resumed-tool",
                format!("receipts go to `{}`, a memory store, but a run may resume: the crash a resume follows loses them, and the call is sent again.", r.store),
                "record the receipts in a durable store (sqlite or postgres)");
        }
    }
    if t.receipt.is_none() {
        match t.class {
            ToolClass::UnkeyedWrite | ToolClass::MultiStep => add(
                Severity::Error,
                "write-without-receipt",
                "nothing records that this write was sent: after a crash, a resume sends it again, and so does a model asking again for a step whose answer it lost (only a call whose outcome is unknown is held, in memory).".into(),
                "declare a key (run, tool, id:FIELD) and a receipt in a durable store; the key need not reach the provider",
            ),
            ToolClass::KeyedWrite => {
                if let Some(resume) = t.resume_window_secs {
                    add(
                        Severity::Error,
                        "resumed-keyed-write-without-receipt",
                        format!("a run may resume after {resume}s, but nothing records the call and no key window is declared: a resume after the provider forgot the key sends it again."),
                        "declare a receipt with `provider_key_window_secs`",
                    );
                }
            }
            ToolClass::Read | ToolClass::IdempotentWrite => {}
        }
    }
    if t.class == ToolClass::KeyedWrite {
        if let Some(r) = t
            .receipt
            .as_ref()
            .filter(|r| r.provider_key_window_secs.is_none())
        {
            add(Severity::Error, "keyed-write-without-key-window",
                format!("a keyed write whose provider keeps no keys (no key window on receipt store `{}`): a retry after an ambiguous failure is a second effect.", r.store),
                "declare `provider_key_window_secs`, or declare the tool an unkeyed write");
        }
    }
}

impl Toolbox {
    /// Audits the tool table: a pure function of the toolbox.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool, Toolbox}};
    /// let tb = Toolbox::new(vec![Tool::new("post_ticket", ToolClass::UnkeyedWrite, RetryOwner::Layer)]).unwrap();
    /// let codes: Vec<_> = tb.audit().findings.iter().map(|f| f.code).collect();
    /// assert_eq!(codes, ["unkeyed-write-with-retries", "write-without-unknown-outcome", "write-without-receipt"]);
    /// ```
    pub fn audit(&self) -> Audit {
        let mut findings = Vec::new();
        let mut quota_uses: BTreeMap<&str, (&str, &str, u32)> = BTreeMap::new();
        for t in self.tools() {
            tool_findings(self, t, &mut findings);
            evidence::findings(t, &mut findings);
            if let Some(q) = &t.quota {
                match quota_uses.get(q.name.as_str()) {
                    Some(&(first, key, cost)) if key != q.key || cost != q.cost => findings.push(Finding {
                        severity: Severity::Warning,
                        tool: t.name.clone(),
                        code: "quota-used-with-two-settings",
                        message: format!("quota `{}` is counted by `{}` (cost {}) here but by `{key}` (cost {cost}) in `{first}`.", q.name, q.key, q.cost),
                        fix: "use one key and cost per quota, or declare two quotas",
                    }),
                    Some(_) => {}
                    None => {
                        quota_uses.insert(&q.name, (&t.name, &q.key, q.cost));
                    }
                }
            }
        }
        saga::findings(self, &mut findings);
        budgets::findings(self, &mut findings);
        budgets::spelling_findings(self, &mut findings);
        build::findings(self, &mut findings);
        Audit {
            table: self.tools().iter().map(row).collect(),
            findings,
        }
    }
}
