//! MCP (rmcp) tool results: a [`ToolError`] as a `CallToolResult` the model sees, and read back
//! on the client side (feature `rmcp`).

use super::ToolError;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};

/// The `_meta` key under which the error's JSON travels.
///
/// ```
/// use stormguard::error::{ErrorCode, ToolError, MCP_META_KEY};
///
/// assert_eq!(MCP_META_KEY, "io.stormguard/error");
/// let result = ToolError::new(ErrorCode::Timeout).to_call_tool_result();
/// assert_eq!(result.meta.unwrap().0[MCP_META_KEY]["code"], "timeout");
/// ```
pub const MCP_META_KEY: &str = "io.stormguard/error";

impl ToolError {
    /// The error as an MCP tool result (`isError: true`) that survives a tool's output schema:
    /// the JSON shape ([`to_json`](Self::to_json)) as text content (what a model reads), and the
    /// same JSON in `_meta` under [`MCP_META_KEY`] (what a client reads back), with no
    /// `structuredContent`. Clients that validate `structuredContent` against the tool's
    /// `outputSchema` even on errors (the MCP TypeScript SDK does) would turn an error object
    /// there into a protocol error, and the model would never see the hint. This is also what
    /// `From<ToolError> for CallToolResult` and rmcp's `IntoCallToolResult` give, so a tool may
    /// return `Result<Json<T>, ToolError>`.
    ///
    /// ```
    /// use stormguard::error::{ErrorCode, ToolError, MCP_META_KEY};
    ///
    /// let result = ToolError::new(ErrorCode::InvalidArgument).with_hint("`email` is not an address").to_call_tool_result();
    /// assert_eq!(result.is_error, Some(true));
    /// assert!(result.structured_content.is_none());
    /// let meta = result.meta.as_ref().unwrap();
    /// assert_eq!(meta.0[MCP_META_KEY]["code"], "invalid_argument");
    /// let back = ToolError::from_call_tool_result(&result).unwrap();
    /// assert_eq!((back.code(), back.retryable()), (ErrorCode::InvalidArgument, false));
    /// ```
    pub fn to_call_tool_result(&self) -> CallToolResult {
        let json = self.to_json();
        let mut meta = MetaObject::default();
        meta.0.insert(MCP_META_KEY.to_string(), json.clone());
        CallToolResult::error(vec![ContentBlock::text(json.to_string())]).with_meta(Some(meta))
    }

    /// The error as `CallToolResult::structured_error`: the JSON as text content and as
    /// `structuredContent`. For tools without an output schema, where structured clients read
    /// `structuredContent`; with one, use [`to_call_tool_result`](Self::to_call_tool_result).
    pub fn to_structured_call_tool_result(&self) -> CallToolResult {
        CallToolResult::structured_error(self.to_json())
    }

    /// Reads a stormguard error back from a tool result with `isError: true`: from `_meta`
    /// ([`MCP_META_KEY`]), else `structuredContent` or a text content that holds the whole JSON
    /// shape (`code`, `retryable` and `hint`). `None` for a success, or for an error that is not
    /// a stormguard one (another server's `{"code": "unavailable", "message": ...}` included:
    /// [`McpClassifier`](crate::classify::McpClassifier) hands those to the model).
    ///
    /// ```
    /// use rmcp::model::{CallToolResult, ContentBlock};
    /// use stormguard::error::{ErrorCode, ToolError};
    ///
    /// let structured = ToolError::new(ErrorCode::Unavailable).with_retryable(false).to_structured_call_tool_result();
    /// assert_eq!(ToolError::from_call_tool_result(&structured).unwrap().retryable(), false);
    /// let plain = CallToolResult::error(vec![ContentBlock::text("boom")]);
    /// assert!(ToolError::from_call_tool_result(&plain).is_none());
    /// let theirs = CallToolResult::error(vec![ContentBlock::text(r#"{"code":"unavailable","message":"db down, do not retry"}"#)]);
    /// assert!(ToolError::from_call_tool_result(&theirs).is_none());
    /// assert!(ToolError::from_call_tool_result(&CallToolResult::success(vec![])).is_none());
    /// ```
    pub fn from_call_tool_result(result: &CallToolResult) -> Option<ToolError> {
        if result.is_error != Some(true) {
            return None;
        }
        if let Some(err) = result
            .meta
            .as_ref()
            .and_then(|m| m.0.get(MCP_META_KEY))
            .and_then(ToolError::from_json)
        {
            return Some(err);
        }
        // Without the `_meta` key, only the whole shape counts: another server's error JSON
        // with a `code` field is not a stormguard error (its words are for the model).
        let whole = |v: &serde_json::Value| {
            ToolError::is_whole_shape(v)
                .then(|| ToolError::from_json(v))
                .flatten()
        };
        if let Some(err) = result.structured_content.as_ref().and_then(whole) {
            return Some(err);
        }
        result.content.iter().find_map(|c| {
            let text = c.as_text()?;
            let value: serde_json::Value = serde_json::from_str(&text.text).ok()?;
            whole(&value)
        })
    }
}

impl From<ToolError> for CallToolResult {
    fn from(err: ToolError) -> Self {
        err.to_call_tool_result()
    }
}

impl rmcp::handler::server::tool::IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        Ok(self.to_call_tool_result().into())
    }
}
