//! An rmcp tool server guarded by stormguard and a real rmcp client with a stormguard `Retry`,
//! over TCP on 127.0.0.1 (the cases of `examples/mcp.rs`).
#![cfg(feature = "rmcp")]

#[path = "../examples/mcp.rs"]
#[allow(dead_code)]
mod mcp;

#[tokio::test]
async fn every_case_does_what_the_readme_says() {
    let cases = mcp::all_cases().await;
    let case = |name: &str| cases.iter().find(|c| c.case == name).unwrap();

    // An outage: the server's Retry makes 3 requests and gives up; the client adds none.
    let outage = case("outage");
    assert_eq!((outage.requests, outage.client_calls), (3, 1));
    assert_eq!(
        (outage.is_error, outage.code.as_deref(), outage.retryable),
        (true, Some("unavailable"), Some(false))
    );

    // A bad argument: one request, and the server's hint reaches the client.
    let invalid = case("invalid_argument");
    assert_eq!((invalid.requests, invalid.client_calls), (1, 1));
    assert_eq!(invalid.code.as_deref(), Some("invalid_argument"));
    assert!(
        invalid.hint.as_deref().unwrap().contains("422"),
        "{:?}",
        invalid.hint
    );

    // A tool with an output schema fails: an error result, not a protocol error.
    let schema = case("output_schema");
    assert!(schema.is_error);
    assert!(
        schema.protocol_error.is_none(),
        "{:?}",
        schema.protocol_error
    );
    assert_eq!(schema.code.as_deref(), Some("unavailable"));

    // An ambiguous failure of a keyed write: sent again with the same key, applied once.
    let keyed = case("keyed_write");
    assert_eq!(
        (keyed.requests, keyed.effects, keyed.is_error),
        (2, 1, false)
    );
}

/// An error from a tool server that says `unavailable` and nothing of its class (not from a
/// stormguard `Retry`): the tool may have acted, so a client's unkeyed write escalates after one
/// call, while a read is retried.
#[tokio::test(start_paused = true)]
async fn a_classless_unavailable_from_a_server_is_not_repeated_for_an_unkeyed_write() {
    use rmcp::model::{CallToolResult, ContentBlock};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use stormguard::budget::RetryBudget;
    use stormguard::class::ToolClass;
    use stormguard::classify::McpClassifier;
    use stormguard::error::ErrorCode;
    use stormguard::retry::RetryLayer;
    use tower::{Service, ServiceBuilder, ServiceExt};

    for (class, calls_wanted) in [(ToolClass::UnkeyedWrite, 1), (ToolClass::Read, 3)] {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let tool = tower::service_fn(move |_: u32| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, std::io::Error>(CallToolResult::error(vec![ContentBlock::text(
                    r#"{"code":"unavailable","retryable":true,"hint":"the database is down"}"#,
                )]))
            }
        });
        let mut client = ServiceBuilder::new()
            .layer(
                RetryLayer::new(class, RetryBudget::default())
                    .classifier(McpClassifier)
                    .replay(stormguard::retry::CloneReplay),
            )
            .service(tool);
        let result = client.ready().await.unwrap().call(7).await;
        assert_eq!(calls.load(Ordering::SeqCst), calls_wanted, "{class:?}");
        if class == ToolClass::UnkeyedWrite {
            assert_eq!(result.unwrap_err().code(), ErrorCode::OutcomeUnknown);
        }
    }
}

/// The client side of a real rmcp server on 127.0.0.1: `call` runs through a client `Retry` of
/// `class` with `McpClassifier`; returns the client's calls, the backend's requests and the
/// result.
async fn through_client_retry<F, Fut>(
    class: stormguard::class::ToolClass,
    call: F,
) -> (
    u32,
    u32,
    Result<rmcp::model::CallToolResult, stormguard::error::ToolError>,
)
where
    F: Fn(rmcp::Peer<rmcp::RoleClient>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<
            Output = Result<rmcp::model::CallToolResult, rmcp::service::ServiceError>,
        > + Send
        + 'static,
{
    use rmcp::ServiceExt as _;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use stormguard::budget::RetryBudget;
    use stormguard::classify::McpClassifier;
    use stormguard::retry::RetryLayer;
    use tower::{Service, ServiceBuilder, ServiceExt};

    let backend = mcp::Backend::default();
    let addr = mcp::start_server(backend.clone()).await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client = ().serve(stream).await.expect("MCP client connects");
    let peer = client.peer().clone();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let service = tower::service_fn(move |()| {
        counter.fetch_add(1, Ordering::SeqCst);
        call.clone()(peer.clone())
    });
    let mut agent = ServiceBuilder::new()
        .layer(
            RetryLayer::new(class, RetryBudget::default())
                .classifier(McpClassifier)
                .replay(stormguard::retry::CloneReplay),
        )
        .service(service);
    let result = agent.ready().await.unwrap().call(()).await;
    let _ = client.cancel().await;
    (calls.load(Ordering::SeqCst), backend.requests(), result)
}

/// JSON-RPC "invalid params" (-32602: arguments of the wrong type, a tool that does not exist)
/// and "method not found" (-32601) from a real rmcp server mean the tool never ran: an unkeyed
/// write is not escalated as `outcome_unknown`, a read is not sent three times.
#[tokio::test]
async fn a_protocol_error_that_says_not_processed_is_not_retried_or_escalated() {
    use rmcp::model::{CallToolRequestParams, CallToolResult, GetPromptRequestParams};
    use stormguard::class::ToolClass;
    use stormguard::error::ErrorCode;

    let bad_args = |peer: rmcp::Peer<rmcp::RoleClient>| async move {
        let args = serde_json::json!({"title": "refund", "priority": "high"});
        let params = CallToolRequestParams::new("create_ticket")
            .with_arguments(args.as_object().cloned().unwrap());
        peer.call_tool(params).await
    };
    let no_such_tool = |peer: rmcp::Peer<rmcp::RoleClient>| async move {
        peer.call_tool(CallToolRequestParams::new("no_such_tool"))
            .await
    };
    // This server has no prompts: `prompts/get` is a method it does not have.
    let no_such_method = |peer: rmcp::Peer<rmcp::RoleClient>| async move {
        peer.get_prompt(GetPromptRequestParams::new("summary"))
            .await
            .map(|_| CallToolResult::success(vec![]))
    };
    for class in [ToolClass::UnkeyedWrite, ToolClass::Read] {
        for (name, calls, requests, result) in [
            (
                "invalid params",
                through_client_retry(class, bad_args).await,
            ),
            (
                "unknown tool",
                through_client_retry(class, no_such_tool).await,
            ),
            (
                "method not found",
                through_client_retry(class, no_such_method).await,
            ),
        ]
        .map(|(name, (c, r, res))| (name, c, r, res))
        {
            let err = match result {
                Err(err) => err,
                // rmcp 3.11 answers arguments it cannot read with an `isError` result (the
                // words are for the model), handed back as it is.
                Ok(r) if name == "invalid params" => {
                    assert_eq!(r.is_error, Some(true));
                    assert_eq!((calls, requests), (1, 0), "{name}, {class:?}");
                    continue;
                }
                Ok(r) => panic!("{name}: {r:?}"),
            };
            assert_eq!((calls, requests), (1, 0), "{name}, {class:?}: {err:?}");
            assert_ne!(err.code(), ErrorCode::OutcomeUnknown, "{name}, {class:?}");
            let want = if name == "method not found" {
                ErrorCode::Internal
            } else {
                ErrorCode::InvalidArgument
            };
            assert_eq!(err.code(), want, "{name}, {class:?}: {err:?}");
            assert!(!err.retryable(), "{name}, {class:?}");
        }
    }
}

/// Every JSON-RPC error code, as an rmcp client error, through a client `Retry`: the four that
/// say the request was never processed end after one call for every class; "internal error"
/// (-32603) and a server-defined code may follow a tool that acted: an unkeyed write
/// escalates, a read is retried.
#[tokio::test(start_paused = true)]
async fn each_json_rpc_error_code_through_a_client_retry() {
    use rmcp::model::{CallToolResult, ErrorCode as RpcCode, ErrorData};
    use rmcp::service::ServiceError;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use stormguard::budget::RetryBudget;
    use stormguard::class::ToolClass;
    use stormguard::classify::{classify_error, FailureClass, McpClassifier};
    use stormguard::error::ErrorCode;
    use stormguard::retry::RetryLayer;
    use tower::{Service, ServiceBuilder, ServiceExt};

    use FailureClass::*;
    let table = [
        (RpcCode::PARSE_ERROR, Permanent, ErrorCode::Internal),
        (RpcCode::INVALID_REQUEST, Permanent, ErrorCode::Internal),
        (RpcCode::METHOD_NOT_FOUND, Permanent, ErrorCode::Internal),
        (
            RpcCode::INVALID_PARAMS,
            ModelRecoverable,
            ErrorCode::InvalidArgument,
        ),
        (RpcCode::INTERNAL_ERROR, Ambiguous, ErrorCode::Internal),
        (RpcCode(-32000), Ambiguous, ErrorCode::Internal),
    ];
    for (code, class_wanted, code_wanted) in table {
        let data = ErrorData::new(code, "from the server", None);
        let c = classify_error(&ServiceError::McpError(data.clone()));
        assert_eq!(
            (c.failure_class(), c.code()),
            (Some(class_wanted), Some(code_wanted)),
            "{code:?}"
        );
        // The bare `ErrorData` too (a client that maps its errors to it).
        let c = classify_error(&data);
        assert_eq!(c.failure_class(), Some(class_wanted), "bare {code:?}");

        for class in [ToolClass::UnkeyedWrite, ToolClass::Read] {
            let calls = Arc::new(AtomicU32::new(0));
            let seen = calls.clone();
            let data = data.clone();
            let tool = tower::service_fn(move |()| {
                seen.fetch_add(1, Ordering::SeqCst);
                let data = data.clone();
                async move { Err::<CallToolResult, _>(ServiceError::McpError(data)) }
            });
            let mut client = ServiceBuilder::new()
                .layer(
                    RetryLayer::new(class, RetryBudget::default())
                        .classifier(McpClassifier)
                        .replay(stormguard::retry::CloneReplay),
                )
                .service(tool);
            let err = client.ready().await.unwrap().call(()).await.unwrap_err();
            let calls = calls.load(Ordering::SeqCst);
            match (class_wanted, class) {
                (Ambiguous, ToolClass::UnkeyedWrite) => {
                    assert_eq!(
                        (calls, err.code()),
                        (1, ErrorCode::OutcomeUnknown),
                        "{code:?}"
                    )
                }
                (Ambiguous, _) => assert_eq!(calls, 3, "{code:?} {class:?}"),
                _ => assert_eq!((calls, err.code()), (1, code_wanted), "{code:?} {class:?}"),
            }
        }
    }
}
