//! One MCP client session for every declared tool, against a real rmcp server on 127.0.0.1:
//! each call through its own tool's stack (class, key, retries), the key carried in `_meta`,
//! the server's listed tools declared from their annotations.
#![cfg(feature = "rmcp")]

mod support;

use rmcp::ServiceExt as _;
use serde_json::json;
use stormguard::error::ErrorCode;
use stormguard::tool::{Call, Stores, Toolbox};
use support::shop::{serve, Seen};
use tower::ServiceExt;

const TOOLS: &str = r#"{ "tools": [{
    "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
    "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate"
}] }"#;

#[tokio::test(start_paused = true)]
async fn one_session_calls_each_tool_through_its_own_stack_with_its_key_in_meta() {
    let seen = Seen::default();
    let addr = serve(seen.clone()).await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client = ().serve(stream).await.expect("MCP client connects");
    let peer = client.peer().clone();

    // The declared tool keeps its declaration; the others come from the server's list.
    let listed = peer.list_all_tools().await.unwrap();
    let toolbox = Toolbox::from_json_str(TOOLS)
        .unwrap()
        .with_mcp_tools(&listed)
        .unwrap();
    let class_of = |name: &str| {
        toolbox
            .tools()
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .class
    };
    assert_eq!(class_of("search"), stormguard::class::ToolClass::Read);
    assert_eq!(
        class_of("send_invoice"),
        stormguard::class::ToolClass::KeyedWrite
    );
    assert_eq!(
        class_of("post_ticket"),
        stormguard::class::ToolClass::UnkeyedWrite
    );
    let session = toolbox
        .build(Stores::new())
        .unwrap()
        .mcp_session(peer)
        .unwrap();

    // A read: answered.
    let found = session
        .clone()
        .oneshot(Call::new("run-1", "step-1", json!({ "q": "boots" })).to("search"))
        .await
        .unwrap();
    assert_ne!(found.is_error, Some(true));

    // A keyed write whose answer was lost: sent again under the same key, one invoice.
    let sent = session
        .clone()
        .oneshot(Call::new("run-1", "step-2", json!({ "invoice_id": 4471 })).to("send_invoice"))
        .await
        .unwrap();
    assert_ne!(sent.is_error, Some(true), "{sent:?}");
    assert_eq!(seen.calls("send_invoice"), 2);
    let keys = seen.keys.lock().unwrap().clone();
    assert!(keys[0].is_some(), "the key travelled in _meta");
    assert_eq!(keys[0], keys[1], "the same key on the retry");
    assert_eq!(seen.sent.lock().unwrap().values().sum::<u32>(), 1);

    // An unkeyed write (declared from the list) that may have acted: escalated, not repeated.
    let err = session
        .clone()
        .oneshot(Call::new("run-1", "step-3", json!({})).to("post_ticket"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::OutcomeUnknown, "{err:?}");
    assert_eq!(seen.calls("post_ticket"), 1);

    // A tool the toolbox does not hold: refused before anything is sent.
    let err = session
        .oneshot(Call::new("run-1", "step-4", json!({})).to("drop_tables"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let _ = client.cancel().await;
}
