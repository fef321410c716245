//! MCP tool results, classified on the client side (feature `rmcp`): [`McpClassifier`].

use super::{
    classify_error, AsDynError, Classification, ClassifiedResponse, Classify, FailureClass,
    NeverClassifyEos, ServerHint,
};
use crate::error::{ErrorCode, ToolError};
use rmcp::model::CallToolResult;

/// Classifies the results of an MCP client's `call_tool` (an rmcp `Peer::call_tool` behind
/// `tower::service_fn`), so a client-side [`Retry`](crate::retry::Retry) honours what the tool's
/// server decided:
///
/// | result | verdict |
/// |---|---|
/// | `isError` absent or false | `Success` |
/// | a stormguard error (read by [`ToolError::from_call_tool_result`]) with `retryable: false` | a failure that is not retried (the server gave up, or the call cannot help): handed back |
/// | a stormguard error with `retryable: true` | its class, its `retry_after` as the hint; with no class, `Ambiguous` for `unavailable`, `timeout` and `internal` (the tool may have acted before it failed: a write is retried only if its class allows it), else `Transient` |
/// | another `isError` result | `Failure(ModelRecoverable)`: the tool's message is for the model |
/// | a JSON-RPC error -32602 "invalid params" (an unknown tool, arguments the server cannot read) | `Failure(ModelRecoverable)`, `invalid_argument`: the tool never ran |
/// | a JSON-RPC error -32601 "method not found", -32600 "invalid request", -32700 "parse error" | `Failure(Permanent)`, `internal`: the request was never processed, and sending it again cannot help |
/// | a JSON-RPC error -32603 "internal error", or a server-defined code | `Failure(Ambiguous)`, `internal`: the tool may have run |
/// | a transport error | by [`classify_error`] |
///
/// The protocol errors are read from rmcp's `ServiceError::McpError` (what `Peer::call_tool`
/// returns) or a bare `rmcp::ErrorData`, anywhere in the error's source chain, by
/// [`classify_error`] too. So an unkeyed write that the server refused before running it ends
/// with the refusal, not `outcome_unknown`, and a read is not sent again.
///
/// ```
/// use rmcp::model::CallToolResult;
/// use stormguard::classify::hint::ServerHint;
/// use stormguard::classify::{Classify, ClassifiedResponse, McpClassifier, FailureClass};
/// use stormguard::error::{ErrorCode, ToolError};
///
/// let classify = |r: CallToolResult| {
///     let ClassifiedResponse::Ready(c) = McpClassifier.classify(&Ok::<_, std::io::Error>(r)) else { unreachable!() };
///     c
/// };
/// // The server's Retry already spent its attempts on an outage: do not retry again.
/// let gave_up = ToolError::new(ErrorCode::Unavailable).with_retryable(false).to_call_tool_result();
/// assert_eq!(classify(gave_up).hint(), ServerHint::DoNotRetry);
/// // Rate limited, come back later: retried.
/// let later = ToolError::new(ErrorCode::RateLimited).to_call_tool_result();
/// assert_eq!(classify(later).failure_class(), Some(FailureClass::Transient));
/// // Unavailable, with no class: the tool may have acted; only a class that allows it retries.
/// let down = ToolError::new(ErrorCode::Unavailable).to_call_tool_result();
/// assert_eq!(classify(down).failure_class(), Some(FailureClass::Ambiguous));
/// // The server refused the call before running it (JSON-RPC -32602): not retried, and an
/// // unkeyed write does not end `outcome_unknown`.
/// let refused = rmcp::service::ServiceError::McpError(rmcp::ErrorData::invalid_params("tool not found", None));
/// let ClassifiedResponse::Ready(c) = McpClassifier.classify(&Err::<CallToolResult, _>(refused)) else { unreachable!() };
/// assert_eq!(c.failure_class(), Some(FailureClass::ModelRecoverable));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct McpClassifier;

impl<E: AsDynError> Classify<CallToolResult, E> for McpClassifier {
    type ClassifyEos = NeverClassifyEos;

    fn classify(&self, result: &Result<CallToolResult, E>) -> ClassifiedResponse<NeverClassifyEos> {
        ClassifiedResponse::Ready(match result {
            Ok(r) => classify_call_tool_result(r),
            Err(e) => classify_error(e.as_dyn_error()),
        })
    }

    fn dependency_error(&self, response: &CallToolResult) -> Option<ToolError> {
        ToolError::from_call_tool_result(response)
    }
}

/// An MCP tool result: a success unless `isError`, then the tool's structured error.
pub(super) fn classify_call_tool_result(r: &CallToolResult) -> Classification {
    if r.is_error != Some(true) {
        return Classification::success();
    }
    match ToolError::from_call_tool_result(r) {
        Some(err) => classify_tool_error(&err),
        None => Classification::failure(FailureClass::ModelRecoverable, ErrorCode::InvalidArgument),
    }
}

/// A JSON-RPC error from an MCP peer, classified by its code (the table above), if `e` is one.
pub(super) fn classify_protocol_error(
    e: &(dyn std::error::Error + 'static),
) -> Option<Classification> {
    let data = match e.downcast_ref::<rmcp::service::ServiceError>() {
        Some(rmcp::service::ServiceError::McpError(data)) => data,
        Some(_) => return None,
        None => e.downcast_ref::<rmcp::ErrorData>()?,
    };
    Some(classify_json_rpc_code(data.code.0))
}

/// JSON-RPC 2.0's reserved codes that say the request was rejected before anything ran; every
/// other code (-32603 "internal error", the server-defined ones) may follow a tool that acted.
fn classify_json_rpc_code(code: i32) -> Classification {
    use rmcp::model::ErrorCode as Rpc;
    let (class, code) = match Rpc(code) {
        Rpc::INVALID_PARAMS => (FailureClass::ModelRecoverable, ErrorCode::InvalidArgument),
        Rpc::METHOD_NOT_FOUND | Rpc::INVALID_REQUEST | Rpc::PARSE_ERROR => {
            (FailureClass::Permanent, ErrorCode::Internal)
        }
        _ => (FailureClass::Ambiguous, ErrorCode::Internal),
    };
    Classification::failure(class, code)
}

fn classify_tool_error(err: &ToolError) -> Classification {
    let class = err.class().unwrap_or(match err.code() {
        // A failure after the tool began: it may have acted.
        ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::Internal => {
            FailureClass::Ambiguous
        }
        _ => FailureClass::Transient,
    });
    if !err.retryable() {
        // Whatever its class, the server said no: a Retry hands it back.
        let class = match class {
            FailureClass::Transient => FailureClass::Ambiguous,
            other => other,
        };
        return Classification::failure(class, err.code()).with_hint(ServerHint::DoNotRetry);
    }
    let c = Classification::failure(class, err.code());
    match err.retry_after() {
        Some(after) => c.with_hint(ServerHint::RetryAfter(after)),
        None => c,
    }
}
