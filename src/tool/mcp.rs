//! One MCP client session for every declared tool (feature `rmcp`): [`McpPeer`], the body that
//! sends a [`Call`] as a `tools/call` (its key in `_meta`), [`Tools::mcp_session`] and
//! [`Toolbox::with_mcp_tools`].

use super::boxed::BoxFuture;
use super::call::Call;
use super::listed::ListedTool;
use super::parts::Annotations;
use super::router::ToolRouter;
use super::toolbox::{SpecError, Toolbox};
use super::tools::Tools;
use crate::classify::McpClassifier;
use crate::error::{BoxError, ErrorCode, ToolError};
use crate::key::KeyStamp;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;
use std::task::{Context, Poll};
use tower_service::Service;

/// A tool's body over an rmcp client peer: each [`Call`] goes out as a `tools/call` of the tool
/// it is addressed to, its arguments as the call's arguments (a JSON object, or none), and the
/// key the stack stamped in `_meta` under [`MCP_KEY_META`](crate::key::MCP_KEY_META). The
/// peer's errors come back as they are (boxed), so [`McpClassifier`] reads their JSON-RPC codes.
/// A call addressed to no tool, or whose arguments are not an object, is refused
/// `invalid_argument` before it is sent.
#[derive(Clone, Debug)]
pub struct McpPeer {
    peer: Peer<RoleClient>,
}

impl McpPeer {
    /// The body over `peer` (an rmcp client's `peer()`).
    pub fn new(peer: Peer<RoleClient>) -> Self {
        McpPeer { peer }
    }

    /// The `tools/call` request `call` stands for.
    ///
    /// ```
    /// use serde_json::json;
    /// use stormguard::key::{IdempotencyKey, MCP_KEY_META};
    /// use stormguard::tool::{Call, McpPeer};
    ///
    /// let call = Call::new("run-1", "step-2", json!({ "invoice_id": 4471 })).to("send_invoice");
    /// let params = McpPeer::params(&call).unwrap();
    /// assert_eq!(params.name, "send_invoice");
    /// assert_eq!(params.arguments.unwrap()["invoice_id"], 4471);
    /// assert!(params.meta.is_none()); // no key stamped yet
    /// assert!(McpPeer::params(&Call::new("r", "s", json!([1]))).is_err());
    /// ```
    pub fn params(call: &Call) -> Result<CallToolRequestParams, ToolError> {
        let refuse = |hint: &'static str| {
            ToolError::new(ErrorCode::InvalidArgument)
                .with_retryable(false)
                .with_hint(hint)
        };
        let Some(name) = call.tool() else {
            return Err(refuse("address the call to a tool: Call::to(name)"));
        };
        let mut params = CallToolRequestParams::new(name.to_owned());
        params.arguments = match call.args() {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            _ => return Err(refuse("an MCP tool's arguments are a JSON object")),
        };
        if let Some(key) = call.key() {
            params.stamp_key(key);
        }
        Ok(params)
    }
}

impl Service<Call> for McpPeer {
    type Response = CallToolResult;
    type Error = BoxError;
    type Future = BoxFuture<CallToolResult, BoxError>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let peer = self.peer.clone();
        Box::pin(async move {
            let params = McpPeer::params(&call)?;
            Ok(peer.call_tool(params).await?)
        })
    }
}

impl Tools {
    /// Every declared tool over one MCP client session: a call addressed with
    /// [`Call::to`] goes through that tool's own stack (its class, key, receipts, budget and
    /// breaker) and out over `peer` as a `tools/call` ([`McpPeer`]), read by [`McpClassifier`]
    /// (an `isError` result by its structured error; a JSON-RPC error by its code). A tool the
    /// server lists but the toolbox does not declare is refused: declare it, or add the
    /// server's list with [`Toolbox::with_mcp_tools`]. A toolbox holding a tool that reads back
    /// is a [`SpecError`] (its read-back is its own: build that tool's stack with
    /// [`Tools::layer_reading_back`] and the others' with [`Tools::router`]).
    ///
    /// See `docs/mcp.md` for a whole session against an rmcp server.
    pub fn mcp_session(
        &self,
        peer: Peer<RoleClient>,
    ) -> Result<ToolRouter<CallToolResult>, SpecError> {
        self.router(McpPeer::new(peer), McpClassifier)
    }
}

impl Toolbox {
    /// The toolbox with the tools an MCP server lists (`tools/list`), as
    /// [`Toolbox::with_listed_tools`] does with the JSON answer: a tool it declares keeps its
    /// declaration (and takes the server's annotations, so the audit checks them against its
    /// class); any other is declared from its annotations, as documentation and never as the
    /// guarantee: read-only is a read and idempotent an idempotent write, both retried by the
    /// layer; anything else an unkeyed write nobody retries, whose unknown outcome is escalated
    /// (the audit's rule: declare it yourself, keyed, to have it retried). A listed name the
    /// toolbox cannot hold (an empty one) is a [`SpecError`]; a name listed twice is declared
    /// once.
    ///
    /// ```
    /// use rmcp::model::{Tool as McpTool, ToolAnnotations};
    /// use stormguard::class::ToolClass;
    /// use stormguard::tool::Toolbox;
    ///
    /// let schema = std::sync::Arc::new(serde_json::Map::new());
    /// let listed = vec![
    ///     McpTool::new("search", "Search the docs", schema.clone()).annotate(ToolAnnotations::new().read_only(true)),
    ///     McpTool::new("post_ticket", "Open a ticket", schema),
    /// ];
    /// let toolbox = Toolbox::new(vec![])?.with_mcp_tools(&listed)?;
    /// assert_eq!(toolbox.tools()[0].class, ToolClass::Read);
    /// assert_eq!(toolbox.tools()[1].class, ToolClass::UnkeyedWrite);
    /// // Nothing records the ticket's calls: a resume would send it again. Declare it yourself,
    /// // with a key and a receipt.
    /// let audit = toolbox.audit();
    /// let codes: Vec<_> = audit.findings.iter().map(|f| (f.tool.as_str(), f.code)).collect();
    /// assert_eq!(codes, [("post_ticket", "write-without-receipt")]);
    /// # Ok::<(), stormguard::tool::SpecError>(())
    /// ```
    pub fn with_mcp_tools(self, listed: &[rmcp::model::Tool]) -> Result<Self, SpecError> {
        let listed: Vec<ListedTool> = listed
            .iter()
            .map(|t| ListedTool {
                name: t.name.as_ref().to_owned(),
                annotations: t.annotations.as_ref().map(|a| Annotations {
                    read_only_hint: a.read_only_hint,
                    idempotent_hint: a.idempotent_hint,
                    destructive_hint: a.destructive_hint,
                }),
            })
            .collect();
        self.with_listed_tools(&listed)
    }
}
