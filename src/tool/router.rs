//! [`ToolRouter`]: one service for every tool of a toolbox, each call through its own tool's
//! stack (an MCP client session that calls many tools over one client).

use super::boxed::BoxFuture;
use super::call::Call;
use super::service::ToolService;
use crate::error::{ErrorCode, ToolError};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Every tool of a toolbox over one body: each [`Call`] goes through the stack of the tool it is
/// addressed to ([`Call::to`]), so its class, key, receipts and budget are that tool's, per
/// request. A call addressed to no tool, or to one the toolbox does not hold, is refused
/// `invalid_argument`. Made by [`Tools::router`](super::Tools::router).
///
/// ```
/// use serde_json::json;
/// use tower::{Service, ServiceExt, service_fn};
/// use stormguard::classify::OkIsSuccess;
/// use stormguard::error::ErrorCode;
/// use stormguard::tool::{Call, Stores, Toolbox};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let tools = Toolbox::from_json_str(r#"{"tools": [
///     { "name": "search", "class": "read", "retry": ["layer"] },
///     { "name": "post_ticket", "class": "unkeyed_write", "retry": ["none"], "unknown_outcome": "escalate" }
/// ]}"#)?.build(Stores::new())?;
/// // One client for every tool (an MCP session): the body sends the call by its tool's name.
/// let session = service_fn(|call: Call| async move {
///     Ok::<_, std::io::Error>(json!({ "tool": call.tool() }))
/// });
/// let mut router = tools.router(session, OkIsSuccess)?;
/// let answer = router.ready().await?.call(Call::new("r", "s", json!({})).to("search")).await?;
/// assert_eq!(answer["tool"], "search");
/// let err = router.ready().await?.call(Call::new("r", "s", json!({})).to("nope")).await.unwrap_err();
/// assert_eq!(err.code(), ErrorCode::InvalidArgument);
/// # Ok(()) }
/// ```
pub struct ToolRouter<Res> {
    tools: Arc<BTreeMap<String, ToolService<Res>>>,
}

impl<Res> ToolRouter<Res> {
    pub(crate) fn new(tools: BTreeMap<String, ToolService<Res>>) -> Self {
        ToolRouter {
            tools: Arc::new(tools),
        }
    }
}

impl<Res> Clone for ToolRouter<Res> {
    fn clone(&self) -> Self {
        ToolRouter {
            tools: self.tools.clone(),
        }
    }
}

impl<Res> fmt::Debug for ToolRouter<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRouter")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<Res: Send + 'static> Service<Call> for ToolRouter<Res> {
    type Response = Res;
    type Error = ToolError;
    type Future = BoxFuture<Res, ToolError>;

    /// Always ready: each call waits for its own tool's stack.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let Some(mut service) = call.tool().and_then(|t| self.tools.get(t)).cloned() else {
            let hint = match call.tool() {
                Some(t) => format!("the toolbox holds no tool `{t}`"),
                None => String::from("address the call to a tool: Call::to(name)"),
            };
            let err = ToolError::new(ErrorCode::InvalidArgument)
                .with_retryable(false)
                .with_hint(hint);
            return Box::pin(std::future::ready(Err(err)));
        };
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(call).await
        })
    }
}
