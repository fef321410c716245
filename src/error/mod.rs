//! Structured errors a model can act on: [`ToolError`] and its stable [`ErrorCode`].
//!
//! A [`ToolError`] is what a model reads: a stable machine `code`, a `retryable` flag, a `hint`
//! written for the model (or the person) who reads it, the [`FailureClass`] it was classified
//! as, the number of attempts made, an optional `retry_after`, and the original error as its
//! [`source`](std::error::Error::source).
//!
//! The code is the contract; the hint text may change between releases.
//!
//! # What each layer returns
//!
//! | layer | its `Error` type | what it originates |
//! |---|---|---|
//! | [`Retry`](crate::retry::Retry) | `ToolError`, always (an inner error becomes one, kept as its source) | every ending: `outcome_unknown`, `retry_budget_exhausted`, `deadline_exceeded`, ... |
//! | [`CircuitBreaker`](crate::breaker::CircuitBreaker), [`KeyedBreaker`](crate::breaker::KeyedBreaker) | [`BoxError`] | a boxed `ToolError` (`circuit_open`); the inner error otherwise, boxed |
//! | [`ReceiptGuard`](crate::receipt::ReceiptGuard) (the receipt layer) | [`BoxError`] | a boxed `ToolError` (`in_progress`, `receipt_expired`, `store_unavailable`, `idempotency_key_reused`, ...); the inner error otherwise, boxed |
//! | [`SetIdempotencyKey`](crate::key::SetIdempotencyKey) | [`BoxError`] | a boxed `ToolError` (`idempotency_key_changed`, `invalid_argument`); the inner error otherwise, boxed |
//! | [`KeyedQuota`](crate::quota::KeyedQuota), the fleet's quota | [`BoxError`] | a boxed `ToolError` (`invalid_argument`: a call costlier than the burst) |
//! | [`Quota`](crate::quota::Quota), [`Hedge`](crate::hedge::Hedge), the operation and body-peeking layers | the inner service's error, untouched | nothing |
//!
//! With a [`Retry`](crate::retry::Retry) outermost (the documented stack) the caller always gets
//! a `ToolError`. Below it, or without one, turn a [`BoxError`] into a `ToolError` with
//! `ToolError::from` (or `.into()`, or `?`): a layer's own refusal comes out as it is, any other
//! error as [`classify_error`](crate::classify::classify_error) reads it, kept as the source.
//!
//! ```
//! use stormguard::error::{BoxError, ErrorCode, ToolError};
//!
//! // What a circuit breaker's rejection looks like from outside: a boxed ToolError.
//! let from_breaker: BoxError = Box::new(ToolError::new(ErrorCode::CircuitOpen));
//! let err: ToolError = from_breaker.into();
//! assert_eq!(err.code(), ErrorCode::CircuitOpen);
//! // An inner error the breaker passed through: classified.
//! let passed_through: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
//! assert_eq!(ToolError::from(passed_through).code(), ErrorCode::Unavailable);
//! ```
//!
//! # JSON shape
//!
//! [`ToolError`] serialises (serde) to this shape, which is what a model should see:
//!
//! ```json
//! {"code":"outcome_unknown","retryable":false,"hint":"...","retry_after_ms":null,"attempts":1,"class":"ambiguous","cause":null}
//! ```
//!
//! `retry_after_ms` is `null` when the server gave no hint; `class` is `null` for errors that were
//! not classified (configuration or store errors). `cause` is the dependency's own structured
//! error when it gave one (a `ToolError` in the source chain: an MCP tool's error read back, a
//! classifier's [`dependency_error`](crate::classify::Classify::dependency_error); else a
//! failure status a client turned into an `HttpStatusError`, read by the HTTP status table), as
//! `{"code", "retryable", "hint"}`, else `null`: the evidence a layer that gave up keeps.
//!
//! ```
//! use stormguard::error::{ErrorCode, ToolError};
//!
//! let err = ToolError::new(ErrorCode::OutcomeUnknown).with_attempts(1);
//! assert!(!err.retryable());
//! let json = err.to_json();
//! assert_eq!(json["code"], "outcome_unknown");
//! assert_eq!(json["retryable"], false);
//! ```

mod code;
mod config;
pub(crate) mod failure;
pub(crate) mod hint;
mod json;
#[cfg(feature = "rmcp")]
mod mcp;

pub use code::ErrorCode;
pub use config::ConfigError;
pub(crate) use failure::FailureClass;
pub use json::{MAX_CAUSE_DEPTH, MAX_JSON_DEPTH};
#[cfg(feature = "rmcp")]
pub use mcp::MCP_META_KEY;

use serde::ser::{Serialize, SerializeStruct, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// A boxed error, as tower uses it.
///
/// ```
/// use stormguard::error::{BoxError, ErrorCode, ToolError};
///
/// let err: BoxError = ToolError::new(ErrorCode::Conflict).into();
/// assert_eq!(ToolError::from_boxed(err, ErrorCode::Internal).code(), ErrorCode::Conflict);
/// let io: BoxError = std::io::Error::other("disk full").into();
/// assert_eq!(ToolError::from_boxed(io, ErrorCode::Internal).code(), ErrorCode::Internal);
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error a model reads: a stable code, a retryable flag and a hint. [`Retry`] returns it;
/// the layers that return a [`BoxError`] box one (see [what each layer
/// returns](self#what-each-layer-returns); `ToolError::from` unboxes it).
///
/// [`Retry`]: crate::retry::Retry
///
/// Build one with [`ToolError::new`] (the code decides the default `retryable` flag and hint) and
/// the `with_*` methods.
///
/// ```
/// use std::time::Duration;
/// use stormguard::error::{ErrorCode, ToolError};
///
/// let err = ToolError::new(ErrorCode::RateLimited)
///     .with_retry_after(Duration::from_secs(2))
///     .with_hint("the model API is rate limiting this key; wait 2 s");
/// assert_eq!(err.code(), ErrorCode::RateLimited);
/// assert_eq!(err.to_string(), "rate_limited: the model API is rate limiting this key; wait 2 s");
/// ```
pub struct ToolError {
    // Boxed: a `Result<Response, ToolError>` stays as small as the response on the hot path.
    inner: Box<Inner>,
}

struct Inner {
    code: ErrorCode,
    retryable: bool,
    hint: Cow<'static, str>,
    class: Option<FailureClass>,
    attempts: u32,
    retry_after: Option<Duration>,
    source: Option<BoxError>,
    /// Made by a nested retry layer handing a failure up to the operation's owner: a wrapper of
    /// the dependency's error, not the dependency's own (the owner unwraps it, see `cause`).
    handed_up: bool,
}

impl ToolError {
    /// A new error with the code's default `retryable` flag and hint, no attempts recorded.
    pub fn new(code: ErrorCode) -> Self {
        ToolError {
            inner: Box::new(Inner {
                code,
                retryable: code.default_retryable(),
                hint: Cow::Borrowed(code.default_hint()),
                class: None,
                attempts: 0,
                retry_after: None,
                source: None,
                handed_up: false,
            }),
        }
    }

    /// Replaces the hint (what the reader should do next).
    pub fn with_hint(mut self, hint: impl Into<Cow<'static, str>>) -> Self {
        self.inner.hint = hint.into();
        self
    }

    /// Sets whether a caller may retry the same call.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.inner.retryable = retryable;
        self
    }

    /// Records the failure class the error was classified as.
    pub fn with_class(mut self, class: FailureClass) -> Self {
        self.inner.class = Some(class);
        self
    }

    /// Records how many attempts the operation made.
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.inner.attempts = attempts;
        self
    }

    /// Records the delay the server (or a breaker) asked for before a new call.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.inner.retry_after = Some(retry_after);
        self
    }

    /// Attaches the underlying error, reachable through [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Marks a nested retry layer's hand-up of a failure (see `Inner::handed_up`).
    pub(crate) fn handed_up(mut self) -> Self {
        self.inner.handed_up = true;
        self
    }

    /// Whether a nested retry layer made this error to hand a failure up.
    pub(crate) fn is_handed_up(&self) -> bool {
        self.inner.handed_up
    }

    /// Takes the underlying error out.
    pub(crate) fn into_source(self) -> Option<BoxError> {
        self.inner.source
    }

    /// The stable machine code.
    pub fn code(&self) -> ErrorCode {
        self.inner.code
    }

    /// Whether the same call may be made again. `false` once a stormguard layer has spent the
    /// retries it was allowed: no outer layer, and no model, should retry it.
    pub fn retryable(&self) -> bool {
        self.inner.retryable
    }

    /// What the reader should do next.
    pub fn hint(&self) -> &str {
        &self.inner.hint
    }

    /// The failure class, if the error was classified.
    pub fn class(&self) -> Option<FailureClass> {
        self.inner.class
    }

    /// How many attempts the logical operation made (0 when unknown).
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }

    /// The delay the server or a breaker asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// The dependency's own structured error, if the source chain holds one: the first
    /// `ToolError` below this one.
    ///
    /// ```
    /// use stormguard::error::{ErrorCode, ToolError};
    ///
    /// let theirs = ToolError::new(ErrorCode::InvalidArgument).with_hint("field `to` is not an email address");
    /// let ours = ToolError::new(ErrorCode::OutcomeUnknown).with_source(theirs);
    /// assert_eq!(ours.cause().unwrap().code(), ErrorCode::InvalidArgument);
    /// assert_eq!(ours.to_json()["cause"]["hint"], "field `to` is not an email address");
    /// assert!(ToolError::new(ErrorCode::Internal).cause().is_none());
    /// ```
    pub fn cause(&self) -> Option<&ToolError> {
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            if let Some(tool) = e.downcast_ref::<ToolError>() {
                return Some(tool);
            }
            next = e.source();
        }
        None
    }

    /// Turns any error into a `ToolError`: an error that already is one (boxed) is unwrapped,
    /// anything else is wrapped as `code` with the error as its source.
    pub fn from_boxed(err: BoxError, code: ErrorCode) -> Self {
        match err.downcast::<ToolError>() {
            Ok(tool) => *tool,
            Err(other) => ToolError::new(code).with_source(other),
        }
    }

    /// The documented JSON shape (see the [module docs](self)).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// An MCP `CallToolResult` with `isError: true`: the JSON shape both as text content (for
    /// clients that only read text) and as `structuredContent`.
    ///
    /// A strict MCP client rejects that `structuredContent` for a tool with an output schema (it
    /// validates it against the schema even on errors); for such a tool use
    /// `to_call_tool_result` (feature `rmcp`), which puts the JSON in `_meta` instead.
    ///
    /// ```
    /// use stormguard::error::{ErrorCode, ToolError};
    /// let result = ToolError::new(ErrorCode::InvalidArgument).to_mcp_result();
    /// assert_eq!(result["isError"], true);
    /// assert_eq!(result["structuredContent"]["code"], "invalid_argument");
    /// ```
    pub fn to_mcp_result(&self) -> serde_json::Value {
        let json = self.to_json();
        serde_json::json!({
            "content": [{ "type": "text", "text": json.to_string() }],
            "structuredContent": json,
            "isError": true,
        })
    }
}

impl Serialize for ToolError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("ToolError", 7)?;
        s.serialize_field("code", self.inner.code.as_str())?;
        s.serialize_field("retryable", &self.inner.retryable)?;
        s.serialize_field("hint", &*self.inner.hint)?;
        let ms = self
            .inner
            .retry_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        s.serialize_field("retry_after_ms", &ms)?;
        s.serialize_field("attempts", &self.inner.attempts)?;
        s.serialize_field("class", &self.inner.class)?;
        s.serialize_field("cause", &self.evidence())?;
        s.end()
    }
}

impl ToolError {
    /// What `cause` shows: the dependency's own `ToolError`, else (feature `http`) the failure
    /// status a client turned into an [`HttpStatusError`](crate::classify::HttpStatusError).
    fn evidence(&self) -> Option<Cause<'_>> {
        if let Some(tool) = self.cause() {
            return Some(Cause {
                code: tool.code(),
                retryable: tool.retryable(),
                hint: Cow::Borrowed(tool.hint()),
            });
        }
        #[cfg(feature = "http")]
        if let Some(answered) = std::error::Error::source(self).and_then(crate::classify::answered)
        {
            return Some(Cause {
                code: answered.code(),
                retryable: answered.retryable(),
                hint: Cow::Owned(answered.hint().to_string()),
            });
        }
        None
    }
}

/// The dependency's error as `cause` shows it: its code, flag and hint.
struct Cause<'a> {
    code: ErrorCode,
    retryable: bool,
    hint: Cow<'a, str>,
}

impl Serialize for Cause<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Cause", 3)?;
        s.serialize_field("code", self.code.as_str())?;
        s.serialize_field("retryable", &self.retryable)?;
        s.serialize_field("hint", &*self.hint)?;
        s.end()
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.code.as_str(), self.inner.hint)
    }
}

impl fmt::Debug for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolError")
            .field("code", &self.inner.code)
            .field("retryable", &self.inner.retryable)
            .field("hint", &self.inner.hint)
            .field("class", &self.inner.class)
            .field("attempts", &self.inner.attempts)
            .field("retry_after", &self.inner.retry_after)
            .field("source", &self.inner.source)
            .finish()
    }
}

impl std::error::Error for ToolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<ErrorCode> for ToolError {
    fn from(code: ErrorCode) -> Self {
        ToolError::new(code)
    }
}
