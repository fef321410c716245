//! One tool's declaration.

use serde::{Deserialize, Serialize};

use super::parts::{
    Annotations, BackoffSpec, KeyPart, QuotaUse, ReceiptUse, RetryOwner, UnknownOutcome,
};
use super::toolbox::SpecError;
use crate::backoff::MAX_CAP;
use crate::class::ToolClass;
use crate::class::MAX_ATTEMPTS_LIMIT;

/// The longest deadline or read-back a declaration takes, in seconds.
const DAY: u64 = 86_400;

/// The deadline of a declared tool that declares none, in seconds: five minutes, longer than a
/// model API's slowest non-streamed answer, so that a hung call ends `deadline_exceeded` (or
/// `outcome_unknown` for a write) instead of waiting without bound.
///
/// ```
/// use stormguard::tool::{Stores, Toolbox, DEFAULT_DEADLINE_SECS};
/// let tools = Toolbox::from_json_str(r#"{"tools": [{"name": "search", "class": "read", "retry": ["layer"]}]}"#)?
///     .build(Stores::new())?;
/// let deadline = tools.layer("search")?.policy().deadline();
/// assert_eq!(deadline, Some(std::time::Duration::from_secs(DEFAULT_DEADLINE_SECS)));
/// # Ok::<(), stormguard::tool::SpecError>(())
/// ```
pub const DEFAULT_DEADLINE_SECS: u64 = 300;
/// A backoff's cap when a declaration gives none (the backoff's own default), in milliseconds.
const DEFAULT_CAP_MS: u64 = 10_000;

/// One tool, declared once: everything its stack needs, as data.
///
/// Required parts are arguments of [`Tool::new`]; the rest are optional and the audit says when
/// one is missing. Deserialising runs the same checks as [`Tool::validate`].
///
/// ```
/// use stormguard::class::ToolClass;
/// use stormguard::tool::{RetryOwner, Tool};
///
/// let t = Tool::new("search", ToolClass::Read, RetryOwner::Layer).budget("default").deadline_secs(5);
/// assert_eq!(t.name, "search");
/// assert!(t.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "ToolFields")]
pub struct Tool {
    /// The tool's name, unique in its toolbox.
    pub name: String,
    /// The declared class.
    pub class: ToolClass,
    /// Who retries it (one owner; more is an audit error).
    pub retry: Vec<RetryOwner>,
    /// The idempotency key's parts (`None`: no key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<KeyPart>>,
    /// Where its receipts go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<ReceiptUse>,
    /// What an unknown outcome does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_outcome: Option<UnknownOutcome>,
    /// The dependency it calls (`"orders-api"`, `"openai"`): the tools that name the same one
    /// and no `budget` share that dependency's retry budget. `None`: the tool is a dependency
    /// of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// The retry budget's name. `None`: its dependency's own budget (see `dependency`), never
    /// one shared with unrelated dependencies, so that one dependency's outage cannot spend the
    /// retries of another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The breaker's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<String>,
    /// The quota spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaUse>,
    /// The hedge's name (reads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<String>,
    /// The operation's deadline, in seconds: no attempt or retry starts after it, and a
    /// backoff that would end past it is not granted, and an attempt in flight when it passes is
    /// cut off (`deadline_exceeded`; `outcome_unknown` for a write that may not be repeated).
    /// `None`: [`DEFAULT_DEADLINE_SECS`] (five minutes), so that a hung dependency under a
    /// client without a timeout is never waited on without bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_secs: Option<u64>,
    /// Attempts at most per operation, the first included (`None`: the class's default, 3 for
    /// a read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The backoff between attempts (`None`: the class's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffSpec>,
    /// The longest the agent may pause and resume a run using this tool, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_window_secs: Option<u64>,
    /// The model is likely to reissue this call at a later step (a step in its key is then a
    /// second effect).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reissue_likely: bool,
    /// Decide with `class` even where the tool's name or its requests say it is a write (a
    /// `create_report` that only reads, a search API's POST); see
    /// [`Evidence`](crate::class::Evidence). Off by default: the stricter decides.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trust_class: bool,
    /// The MCP server's hints, checked against `class` by the audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
}

/// A tool as read, before its checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ToolFields {
    name: String,
    class: ToolClass,
    retry: Vec<RetryOwner>,
    #[serde(default)]
    key: Option<Vec<KeyPart>>,
    #[serde(default)]
    receipt: Option<ReceiptUse>,
    #[serde(default)]
    unknown_outcome: Option<UnknownOutcome>,
    #[serde(default)]
    dependency: Option<String>,
    #[serde(default)]
    budget: Option<String>,
    #[serde(default)]
    breaker: Option<String>,
    #[serde(default)]
    quota: Option<QuotaUse>,
    #[serde(default)]
    hedge: Option<String>,
    #[serde(default)]
    deadline_secs: Option<u64>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    backoff: Option<BackoffSpec>,
    #[serde(default)]
    resume_window_secs: Option<u64>,
    #[serde(default)]
    reissue_likely: bool,
    #[serde(default)]
    trust_class: bool,
    #[serde(default)]
    annotations: Option<Annotations>,
}

impl TryFrom<ToolFields> for Tool {
    type Error = SpecError;
    fn try_from(f: ToolFields) -> Result<Self, SpecError> {
        let t = Tool {
            name: f.name,
            class: f.class,
            retry: f.retry,
            key: f.key,
            receipt: f.receipt,
            unknown_outcome: f.unknown_outcome,
            dependency: f.dependency,
            budget: f.budget,
            breaker: f.breaker,
            quota: f.quota,
            hedge: f.hedge,
            deadline_secs: f.deadline_secs,
            max_attempts: f.max_attempts,
            backoff: f.backoff,
            resume_window_secs: f.resume_window_secs,
            reissue_likely: f.reissue_likely,
            trust_class: f.trust_class,
            annotations: f.annotations,
        };
        t.validate()?;
        Ok(t)
    }
}

mod builder;

impl Tool {
    /// A tool with its required parts: name, class and its one retry owner.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::None).retry, vec![RetryOwner::None]);
    /// ```
    pub fn new(name: impl Into<String>, class: ToolClass, retry: RetryOwner) -> Self {
        Tool {
            name: name.into(),
            class,
            retry: vec![retry],
            key: None,
            receipt: None,
            unknown_outcome: None,
            dependency: None,
            budget: None,
            breaker: None,
            quota: None,
            hedge: None,
            deadline_secs: None,
            max_attempts: None,
            backoff: None,
            resume_window_secs: None,
            reissue_likely: false,
            trust_class: false,
            annotations: None,
        }
    }

    /// Whose budget it draws on when it names none: its dependency's (`true`, the name), or its
    /// own (`false`, its name). The two never share: a tool `chat` declaring no dependency and a
    /// tool declaring `dependency = "chat"` draw on two budgets.
    pub(crate) fn budget_owner(&self) -> (bool, &str) {
        match &self.dependency {
            Some(d) => (true, d),
            None => (false, &self.name),
        }
    }

    /// The checks deserialising also runs: a non-empty name, one or more retry owners, no zero
    /// durations, costs or read-back attempts, no empty names of shared parts.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// let err = Tool::new("t", ToolClass::Read, RetryOwner::Layer).deadline_secs(0).validate().unwrap_err();
    /// assert_eq!((err.tool(), err.field()), (Some("t"), "deadline_secs"));
    /// ```
    pub fn validate(&self) -> Result<(), SpecError> {
        let err = |field: &'static str, reason: &str| {
            Err(SpecError::new(Some(&self.name), field, reason))
        };
        if self.name.trim().is_empty() {
            return err("name", "a tool needs a name");
        }
        if self.retry.is_empty() {
            return err(
                "retry",
                "name the retry owner: layer, client, model or none",
            );
        }
        for (field, v) in [
            ("deadline_secs", self.deadline_secs),
            ("resume_window_secs", self.resume_window_secs),
        ] {
            if v == Some(0) {
                return err(field, "must be at least 1 second");
            }
        }
        if let Some(r) = &self.receipt {
            if r.store.is_empty() {
                return err("receipt.store", "must name a store");
            }
            if r.lease_secs == Some(0) {
                return err("receipt.lease_secs", "must be at least 1 second");
            }
            if r.provider_key_window_secs == Some(0) {
                return err(
                    "receipt.provider_key_window_secs",
                    "must be at least 1 second",
                );
            }
        }
        if let Some(UnknownOutcome::ReadBack {
            attempts,
            within_secs,
        }) = self.unknown_outcome
        {
            if attempts == 0 || within_secs == 0 || within_secs > DAY {
                return err(
                    "unknown_outcome.read_back",
                    "a read-back needs at least 1 attempt within 1 second to one day",
                );
            }
        }
        if let Some(q) = &self.quota {
            if q.name.is_empty() || q.key.is_empty() {
                return err("quota", "a quota needs a name and a key");
            }
            if q.cost == 0 {
                return err("quota.cost", "must be at least 1");
            }
        }
        if self
            .max_attempts
            .is_some_and(|n| !(1..=MAX_ATTEMPTS_LIMIT).contains(&n))
        {
            return err(
                "max_attempts",
                "must be between 1 (the first attempt) and 100",
            );
        }
        if self.deadline_secs.is_some_and(|s| s > DAY) {
            return err("deadline_secs", "must be at most one day (86400)");
        }
        if let Some(b) = self.backoff {
            let most = MAX_CAP.as_millis() as u64;
            let cap = b.cap_ms.unwrap_or(DEFAULT_CAP_MS.max(b.base_ms));
            if b.base_ms == 0 || cap < b.base_ms || cap > most {
                return err(
                    "backoff",
                    "base_ms must be at least 1, cap_ms at least base_ms, both at most one hour",
                );
            }
        }
        if self.hedge.is_some() && self.class != ToolClass::Read {
            // The hedge never sends a write twice: declared on one, it would do nothing.
            return err("hedge", "only a read is hedged: leave the hedge out");
        }
        if self.hedge.is_some() && self.retry.as_slice() != [RetryOwner::Layer] {
            // A hedge is a second attempt: under any other owner, the one attempt the layer
            // makes would become two (and the client's or the model's retries multiply them).
            return err(
                "hedge",
                "a hedge is a second attempt: only a tool whose retries the layer owns is hedged",
            );
        }
        if matches!(&self.key, Some(k) if k.is_empty()) {
            return err("key", "an empty key; leave it out for no key");
        }
        for (field, v) in [
            ("dependency", &self.dependency),
            ("budget", &self.budget),
            ("breaker", &self.breaker),
            ("hedge", &self.hedge),
        ] {
            if matches!(v, Some(n) if n.is_empty()) {
                return err(field, "must not be empty");
            }
        }
        Ok(())
    }
}
