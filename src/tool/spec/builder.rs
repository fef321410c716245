//! The builder methods of a [`Tool`]: each sets one optional part.

use super::Tool;
use crate::class::ToolClass;
use crate::tool::parts::{
    Annotations, BackoffSpec, KeyPart, QuotaUse, ReceiptUse, RetryOwner, UnknownOutcome,
};

impl Tool {
    /// The class as MCP annotations suggest it (a hint, not a guarantee): read-only is a read,
    /// idempotent an idempotent write, anything else an unkeyed write.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{Annotations, Tool}};
    /// let a = Annotations { read_only_hint: Some(true), ..Default::default() };
    /// assert_eq!(Tool::class_from_annotations(&a), ToolClass::Read);
    /// ```
    pub fn class_from_annotations(a: &Annotations) -> ToolClass {
        if a.read_only_hint == Some(true) {
            ToolClass::Read
        } else if a.idempotent_hint == Some(true) {
            ToolClass::IdempotentWrite
        } else {
            ToolClass::UnkeyedWrite
        }
    }

    /// Sets the key parts.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{KeyPart, RetryOwner, Tool}};
    /// let t = Tool::new("t", ToolClass::KeyedWrite, RetryOwner::Layer).key(vec![KeyPart::Run]);
    /// assert_eq!(t.key.unwrap().len(), 1);
    /// ```
    pub fn key(mut self, parts: Vec<KeyPart>) -> Self {
        self.key = Some(parts);
        self
    }

    /// Adds a further retry owner (the audit flags more than one).
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// let t = Tool::new("t", ToolClass::Read, RetryOwner::Layer).also_retried_by(RetryOwner::Client);
    /// assert_eq!(t.retry.len(), 2);
    /// ```
    pub fn also_retried_by(mut self, owner: RetryOwner) -> Self {
        self.retry.push(owner);
        self
    }

    /// Sets the receipt store and the provider's key window.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// let t = Tool::new("t", ToolClass::KeyedWrite, RetryOwner::Layer).receipt("pg", Some(86_400));
    /// assert_eq!(t.receipt.unwrap().store, "pg");
    /// ```
    pub fn receipt(
        mut self,
        store: impl Into<String>,
        provider_key_window_secs: Option<u64>,
    ) -> Self {
        self.receipt = Some(ReceiptUse {
            store: store.into(),
            provider_key_window_secs,
            lease_secs: None,
        });
        self
    }

    /// Sets the unknown-outcome behaviour.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool, UnknownOutcome}};
    /// let t = Tool::new("t", ToolClass::UnkeyedWrite, RetryOwner::None).unknown_outcome(UnknownOutcome::Escalate);
    /// assert!(t.unknown_outcome.is_some());
    /// ```
    pub fn unknown_outcome(mut self, u: UnknownOutcome) -> Self {
        self.unknown_outcome = Some(u);
        self
    }

    /// Sets the dependency it calls: tools that name the same one (and no budget) share its
    /// retry budget.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// let t = Tool::new("search", ToolClass::Read, RetryOwner::Layer).dependency("orders-api");
    /// assert_eq!(t.dependency.as_deref(), Some("orders-api"));
    /// ```
    pub fn dependency(mut self, name: impl Into<String>) -> Self {
        self.dependency = Some(name.into());
        self
    }

    /// Sets the retry budget by name.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).budget("b").budget.as_deref(), Some("b"));
    /// ```
    pub fn budget(mut self, name: impl Into<String>) -> Self {
        self.budget = Some(name.into());
        self
    }

    /// Sets the breaker by name.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).breaker("b").breaker.is_some());
    /// ```
    pub fn breaker(mut self, name: impl Into<String>) -> Self {
        self.breaker = Some(name.into());
        self
    }

    /// Sets the quota, its key and the cost of one call.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).quota("q", "tenant", 2).quota.unwrap().cost, 2);
    /// ```
    pub fn quota(mut self, name: impl Into<String>, key: impl Into<String>, cost: u32) -> Self {
        self.quota = Some(QuotaUse {
            name: name.into(),
            key: key.into(),
            cost,
        });
        self
    }

    /// Trusts the declared class over what the tool's name and requests show (see
    /// [`Tool::trust_class`]).
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// let t = Tool::new("create_report", ToolClass::Read, RetryOwner::Layer).trust_class();
    /// assert!(t.trust_class);
    /// ```
    pub fn trust_class(mut self) -> Self {
        self.trust_class = true;
        self
    }

    /// Sets the deadline in seconds.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).deadline_secs(3).deadline_secs, Some(3));
    /// ```
    pub fn deadline_secs(mut self, secs: u64) -> Self {
        self.deadline_secs = Some(secs);
        self
    }

    /// Sets the longest resume window in seconds.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).resume_window_secs(60).resume_window_secs, Some(60));
    /// ```
    pub fn resume_window_secs(mut self, secs: u64) -> Self {
        self.resume_window_secs = Some(secs);
        self
    }

    /// Sets the MCP annotations the server declares.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{Annotations, RetryOwner, Tool}};
    /// let t = Tool::new("t", ToolClass::Read, RetryOwner::Layer).annotations(Annotations::default());
    /// assert!(t.annotations.is_some());
    /// ```
    pub fn annotations(mut self, a: Annotations) -> Self {
        self.annotations = Some(a);
        self
    }

    /// Sets the attempts per operation, the first included.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).max_attempts(2).max_attempts, Some(2));
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Sets the backoff between attempts.
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{BackoffSpec, RetryOwner, Tool}};
    /// let t = Tool::new("t", ToolClass::Read, RetryOwner::Layer).backoff(BackoffSpec { base_ms: 5, cap_ms: None });
    /// assert_eq!(t.backoff.unwrap().base_ms, 5);
    /// ```
    pub fn backoff(mut self, backoff: BackoffSpec) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Sets the hedge by name (reads only).
    ///
    /// ```
    /// use stormguard::{class::ToolClass, tool::{RetryOwner, Tool}};
    /// assert_eq!(Tool::new("t", ToolClass::Read, RetryOwner::Layer).hedge("h").hedge.as_deref(), Some("h"));
    /// ```
    pub fn hedge(mut self, name: impl Into<String>) -> Self {
        self.hedge = Some(name.into());
        self
    }
}
