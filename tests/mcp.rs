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
