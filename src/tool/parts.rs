//! The parts of a tool declaration: key parts, retry owner, unknown-outcome behaviour, the
//! receipt and quota a tool uses, and its MCP annotations.

use serde::{Deserialize, Serialize};

use super::toolbox::SpecError;

/// One part of an idempotency key: the task's identity or a field of the arguments.
///
/// Written in a file as `"run"`, `"tool"`, `"step"`, `"id:FIELD"` (an identifier field) or
/// `"text:FIELD"` (free text the model writes: a key must never include one).
///
/// ```
/// use stormguard::tool::KeyPart;
///
/// assert_eq!(KeyPart::parse("id:invoice_id").unwrap(), KeyPart::id("invoice_id"));
/// assert_eq!(KeyPart::text("subject").to_string(), "text:subject");
/// assert!(KeyPart::parse("uuid").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KeyPart {
    /// The agent run's id.
    Run,
    /// The tool's name.
    Tool,
    /// The step number within the run.
    Step,
    /// An argument field that is an identifier (an invoice id, an order id).
    Id(String),
    /// An argument field that is free text the model writes.
    Text(String),
}

impl KeyPart {
    /// An identifier field.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::KeyPart::id("order").to_string(), "id:order");
    /// ```
    pub fn id(field: impl Into<String>) -> Self {
        KeyPart::Id(field.into())
    }

    /// A free-text field.
    ///
    /// ```
    /// assert_eq!(stormguard::tool::KeyPart::text("body").to_string(), "text:body");
    /// ```
    pub fn text(field: impl Into<String>) -> Self {
        KeyPart::Text(field.into())
    }

    /// Reads the file form; an unknown form or an empty field name is a [`SpecError`].
    ///
    /// ```
    /// assert!(stormguard::tool::KeyPart::parse("id:").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let field = |name: &str| {
            if name.is_empty() {
                Err(SpecError::new(
                    None,
                    "key",
                    "a field name must not be empty",
                ))
            } else {
                Ok(name.to_owned())
            }
        };
        match s {
            "run" => Ok(KeyPart::Run),
            "tool" => Ok(KeyPart::Tool),
            "step" => Ok(KeyPart::Step),
            _ => {
                if let Some(name) = s.strip_prefix("id:") {
                    field(name).map(KeyPart::Id)
                } else if let Some(name) = s.strip_prefix("text:") {
                    field(name).map(KeyPart::Text)
                } else {
                    Err(SpecError::new(
                        None,
                        "key",
                        "a key part is run, tool, step, id:FIELD or text:FIELD",
                    ))
                }
            }
        }
    }
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Run => f.write_str("run"),
            KeyPart::Tool => f.write_str("tool"),
            KeyPart::Step => f.write_str("step"),
            KeyPart::Id(n) => write!(f, "id:{n}"),
            KeyPart::Text(n) => write!(f, "text:{n}"),
        }
    }
}

impl TryFrom<String> for KeyPart {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, SpecError> {
        KeyPart::parse(&s)
    }
}

impl From<KeyPart> for String {
    fn from(p: KeyPart) -> String {
        p.to_string()
    }
}

/// Who retries this tool: exactly one owner is the rule (the audit flags more).
///
/// ```
/// use stormguard::tool::RetryOwner;
/// assert_eq!(serde_json::to_value(RetryOwner::Layer).unwrap(), "layer");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOwner {
    /// This crate's retry layer, spending the tool's budget.
    Layer,
    /// The HTTP/SDK client's own retries.
    Client,
    /// The model, by calling the tool again.
    Model,
    /// Nobody retries.
    None,
}

/// What to do when a write's outcome is unknown (a timeout after the request left).
///
/// ```
/// use stormguard::tool::UnknownOutcome;
/// let v = serde_json::to_value(UnknownOutcome::ReadBack { attempts: 3, within_secs: 10 }).unwrap();
/// assert_eq!(v["read_back"]["attempts"], 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum UnknownOutcome {
    /// Stop and hand the unknown outcome to a human or the caller.
    Escalate,
    /// Read the effect back, consistently, at most `attempts` times within `within_secs`.
    ReadBack {
        /// How many reads at most (at least 1).
        attempts: u32,
        /// How long the reads may take in all, in seconds (at least 1).
        within_secs: u64,
    },
}

/// The receipt store a tool records its outcomes in, by name, with the provider's key window.
///
/// ```
/// use stormguard::tool::ReceiptUse;
/// let r = ReceiptUse { store: "pg".into(), provider_key_window_secs: Some(86_400), lease_secs: None };
/// assert_eq!(r.store, "pg");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptUse {
    /// The name of a store declared in the toolbox.
    pub store: String,
    /// How long the provider honours an idempotency key, in seconds (`None`: the provider
    /// keeps no keys, the receipt is the only record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_key_window_secs: Option<u64>,
    /// How long a call may be in flight before its intent counts as abandoned (a crash), in
    /// seconds (`None`: the receipt layer's default, 30 s). After a crash, a resume waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_secs: Option<u64>,
}

/// The backoff between a tool's attempts when its class's default does not fit: exponential
/// from `base_ms`, doubling per retry up to `cap_ms`, with full jitter (the class default's
/// shape; only the numbers change).
///
/// ```
/// use stormguard::tool::BackoffSpec;
/// let b: BackoffSpec = serde_json::from_str(r#"{"base_ms": 5}"#).unwrap();
/// assert_eq!((b.base_ms, b.cap_ms), (5, None));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffSpec {
    /// The first retry's ceiling, in milliseconds (at least 1).
    pub base_ms: u64,
    /// The largest ceiling, in milliseconds, at most one hour (`None`: 10 s, or `base_ms` if
    /// that is longer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_ms: Option<u64>,
}

/// A quota a tool spends: which quota, the key it is counted under and the cost of one call.
///
/// ```
/// use stormguard::tool::QuotaUse;
/// let q = QuotaUse { name: "openai".into(), key: "tenant".into(), cost: 1 };
/// assert_eq!(q.cost, 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaUse {
    /// The name of a quota declared in the toolbox.
    pub name: String,
    /// What the quota is counted under (`tenant`, `user`, `global`).
    pub key: String,
    /// Units one call costs (at least 1).
    pub cost: u32,
}

/// MCP `ToolAnnotations` hints as the server declares them: documentation, never a guarantee.
///
/// ```
/// use stormguard::tool::Annotations;
/// let a: Annotations = serde_json::from_str(r#"{"idempotentHint": true}"#).unwrap();
/// assert_eq!(a.idempotent_hint, Some(true));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Annotations {
    /// `readOnlyHint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// `idempotentHint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// `destructiveHint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
}
