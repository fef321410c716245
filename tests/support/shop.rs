//! A small rmcp tool server on 127.0.0.1 (a shop: `search`, `send_invoice`, `post_ticket`) that
//! records what it saw: calls by tool, the idempotency keys in `_meta`, the invoices sent.
#![allow(dead_code, unreachable_pub)]

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::RequestMetaObject;
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt as _};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use stormguard::classify::FailureClass;
use stormguard::error::{ErrorCode, ToolError};
use stormguard::key::mcp_request_key;

/// What the server saw: every call by tool, the keys they carried, the effects applied.
#[derive(Clone, Default)]
pub struct Seen {
    pub calls: Arc<Mutex<HashMap<String, u32>>>,
    pub keys: Arc<Mutex<Vec<Option<String>>>>,
    /// Invoices sent, by key (the provider deduplicates on it).
    pub sent: Arc<Mutex<HashMap<String, u32>>>,
}

impl Seen {
    fn count(&self, tool: &str) -> u32 {
        *self.calls.lock().unwrap().entry(tool.into()).or_default() += 1;
        self.calls.lock().unwrap()[tool]
    }

    pub fn calls(&self, tool: &str) -> u32 {
        self.calls.lock().unwrap().get(tool).copied().unwrap_or(0)
    }
}

#[derive(Clone)]
struct Shop {
    seen: Seen,
}

#[derive(Deserialize, JsonSchema)]
struct Query {
    #[allow(dead_code)]
    q: String,
}

#[derive(Deserialize, JsonSchema)]
struct Invoice {
    invoice_id: u64,
}

#[tool_router]
impl Shop {
    fn new(seen: Seen) -> Self {
        Shop { seen }
    }

    #[tool(
        description = "Search the catalogue",
        annotations(read_only_hint = true)
    )]
    async fn search(&self, Parameters(_): Parameters<Query>) -> Result<String, ToolError> {
        self.seen.count("search");
        Ok("found".into())
    }

    /// Sends at once, then loses the answer on the first call: the provider deduplicates on
    /// the key, so the retry under the same key sends nothing more.
    #[tool(description = "Send an invoice")]
    async fn send_invoice(
        &self,
        meta: RequestMetaObject,
        Parameters(args): Parameters<Invoice>,
    ) -> Result<String, ToolError> {
        let n = self.seen.count("send_invoice");
        let key = mcp_request_key(&meta).map(str::to_owned);
        self.seen.keys.lock().unwrap().push(key.clone());
        // The provider sends once per key.
        self.seen
            .sent
            .lock()
            .unwrap()
            .entry(key.unwrap_or_default())
            .or_insert(1);
        if n == 1 {
            return Err(ToolError::new(ErrorCode::Unavailable)
                .with_class(FailureClass::Ambiguous)
                .with_hint("the mail relay timed out after accepting the message"));
        }
        Ok(format!("invoice {} sent", args.invoice_id))
    }

    /// A tool with no key support that times out after acting: its outcome is unknown.
    #[tool(description = "Open a support ticket")]
    async fn post_ticket(&self) -> Result<String, ToolError> {
        self.seen.count("post_ticket");
        Err(ToolError::new(ErrorCode::Unavailable).with_hint("the ticket service timed out"))
    }
}

#[tool_handler]
impl ServerHandler for Shop {}

/// Starts the shop on 127.0.0.1, recording into `seen`; returns its address.
pub async fn serve(seen: Seen) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let shop = Shop::new(seen.clone());
            tokio::spawn(async move {
                if let Ok(running) = shop.serve(stream).await {
                    let _ = running.waiting().await;
                }
            });
        }
    });
    addr
}
