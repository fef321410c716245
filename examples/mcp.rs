//! An MCP tool server guarded by stormguard, called by a real rmcp client with a stormguard
//! `Retry`, over TCP on 127.0.0.1.
//!
//! ```text
//! cargo run --release --all-features --example mcp            # a table
//! cargo run --release --all-features --example mcp -- --json  # one JSON object per line
//! ```
//!
//! The server's tools are declared once ([`SERVER_TOOLS`]: class, key, backoff) and call a fake
//! backend (an HTTP-shaped tower service that counts requests) through the stacks their
//! declarations build; a failure goes back to the model as a `ToolError` in the tool result
//! (`isError: true`, the JSON as text and in `_meta`). The client declares the server's tools
//! from their listed annotations (`Toolbox::with_mcp_tools`) and sends each call through its
//! tool's stack over the rmcp peer (`McpPeer`, read by `McpClassifier`), so it does not retry what
//! the server said not to. Cases:
//! - `outage`: the backend answers 503; the server's `Retry` makes 3 requests and gives up with
//!   `retryable: false`; the client's `Retry` adds none;
//! - `invalid_argument`: the backend answers 422; one request, and the hint reaches the client;
//! - `output_schema`: a tool with an output schema fails; the client receives the error (with its
//!   code), not a protocol error;
//! - `keyed_write`: the backend applies an invoice email, then the connection drops (ambiguous);
//!   the server's `Retry` sends it again with the same key, and the backend applies it once.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_handler, tool_router, Json, ServerHandler, ServiceExt as _};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use stormguard::classify::{Classify, HttpClassifier, McpClassifier};
use stormguard::error::ToolError;
use stormguard::key::KeyStamp;
use stormguard::tool::{Call, McpPeer, Stores, ToolRouter, Toolbox};
use tower::{Service, ServiceExt};

type BackendReq = http::Request<String>;
type BackendRes = http::Response<String>;

/// The fake backend: counts requests, and answers as the case says.
#[derive(Clone, Default)]
pub struct Backend {
    requests: Arc<AtomicU32>,
    /// Effects applied, by idempotency key (an email the backend sent).
    effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Backend {
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }

    fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }

    fn service(
        &self,
    ) -> impl Service<BackendReq, Response = BackendRes, Error = std::io::Error, Future: Send> + Clone
    {
        let backend = self.clone();
        tower::service_fn(move |req: BackendReq| {
            let n = backend.requests.fetch_add(1, Ordering::SeqCst);
            let backend = backend.clone();
            async move {
                let status = |code: u16, body: &str| {
                    Ok(http::Response::builder()
                        .status(code)
                        .body(body.to_string())
                        .unwrap())
                };
                match req.uri().path() {
                    "/search" => status(503, "search is down"),
                    "/tickets" => status(422, r#"{"error":"priority must be 1-4"}"#),
                    "/reports" => status(500, "report engine crashed"),
                    "/invoices" => {
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        // The provider deduplicates by key: a repeat answers, sends nothing.
                        let first = {
                            let mut effects = backend.effects.lock().unwrap();
                            let count = effects.entry(key).or_default();
                            let first = *count == 0;
                            if first {
                                *count += 1;
                            }
                            first
                        };
                        if first && n == 0 {
                            // Sent, then the connection dropped before the answer.
                            return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
                        }
                        status(200, r#"{"message_id":"msg-4471"}"#)
                    }
                    _ => status(404, ""),
                }
            }
        })
    }
}

#[derive(Deserialize, JsonSchema)]
struct SearchArgs {
    /// What to look for.
    query: String,
}

#[derive(Deserialize, JsonSchema)]
struct TicketArgs {
    title: String,
    priority: u32,
}

#[derive(Deserialize, JsonSchema)]
struct InvoiceArgs {
    invoice_id: u64,
    /// The email text (written by the model; not part of the key).
    body: String,
}

#[derive(Serialize, JsonSchema)]
struct Report {
    rows: u32,
}

/// The server's tools, declared once: each one's class (what its annotations below say, and
/// the keyed write its code makes `send_invoice`), its key, and a quick backoff for the demo.
const SERVER_TOOLS: &str = r#"{ "tools": [
    { "name": "search", "class": "read", "retry": ["layer"], "backoff": { "base_ms": 5 },
      "annotations": { "readOnlyHint": true } },
    { "name": "create_ticket", "class": "unkeyed_write", "retry": ["none"],
      "unknown_outcome": "escalate" },
    { "name": "report", "class": "read", "retry": ["layer"], "backoff": { "base_ms": 5 },
      "annotations": { "readOnlyHint": true } },
    { "name": "send_invoice", "class": "keyed_write", "retry": ["layer"], "backoff": { "base_ms": 5 },
      "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate" }
] }"#;

/// The run and step every call of the demo belongs to.
const RUN: &str = "run-81f2";
const STEP: &str = "step-2";

#[derive(Clone)]
struct Tools {
    /// Every tool's stack over the backend, built once per server.
    stacks: ToolRouter<BackendRes>,
}

impl Tools {
    /// Calls the backend through the stack `tool` declares (the key, if it has one, covers the
    /// invoice, never the model's wording); a failure becomes the `ToolError` the model sees.
    async fn call_backend(&self, tool: &str, args: serde_json::Value) -> Result<String, ToolError> {
        let call = Call::new(RUN, STEP, args).to(tool);
        match self.stacks.clone().oneshot(call).await {
            Ok(resp) if resp.status().is_success() => Ok(resp.into_body()),
            // A failure retrying cannot help is handed back: say what it was.
            Ok(resp) => Err(Classify::<_, std::io::Error>::dependency_error(
                &HttpClassifier,
                &resp,
            )
            .unwrap_or_else(|| ToolError::new(stormguard::error::ErrorCode::Internal))
            .with_retryable(false)),
            Err(e) => Err(e),
        }
    }
}

/// The backend request a call stands for: a POST to its tool's path with its arguments, and
/// the key its stack stamped.
fn backend_request(call: &Call) -> BackendReq {
    let path = match call.tool() {
        Some("search") => "/search",
        Some("create_ticket") => "/tickets",
        Some("report") => "/reports",
        Some("send_invoice") => "/invoices",
        _ => "/unknown",
    };
    let mut req = http::Request::post(format!("http://backend{path}"))
        .body(call.args().to_string())
        .unwrap();
    if let Some(key) = call.key() {
        req.stamp_key(key);
    }
    req
}

#[tool_router]
impl Tools {
    fn new(backend: Backend) -> Self {
        let tools = Toolbox::from_json_str(SERVER_TOOLS)
            .and_then(|toolbox| toolbox.build(Stores::new()))
            .expect("the server's tool table is valid");
        let service = backend.service();
        let body =
            tower::service_fn(move |call: Call| service.clone().oneshot(backend_request(&call)));
        let stacks = tools
            .router(body, HttpClassifier)
            .expect("every declared tool has a stack");
        Tools { stacks }
    }

    #[tool(
        description = "Search the knowledge base",
        annotations(read_only_hint = true)
    )]
    async fn search(&self, Parameters(args): Parameters<SearchArgs>) -> Result<String, ToolError> {
        self.call_backend("search", serde_json::json!({ "query": args.query }))
            .await
    }

    #[tool(description = "Open a support ticket")]
    async fn create_ticket(
        &self,
        Parameters(args): Parameters<TicketArgs>,
    ) -> Result<String, ToolError> {
        let args = serde_json::json!({ "title": args.title, "priority": args.priority });
        self.call_backend("create_ticket", args).await
    }

    #[tool(
        description = "Build the monthly report",
        annotations(read_only_hint = true)
    )]
    async fn report(&self) -> Result<Json<Report>, ToolError> {
        self.call_backend("report", serde_json::json!({}))
            .await
            .map(|_| Json(Report { rows: 0 }))
    }

    #[tool(description = "Send an invoice email (deduplicated by the provider's idempotency key)")]
    async fn send_invoice(
        &self,
        Parameters(args): Parameters<InvoiceArgs>,
    ) -> Result<String, ToolError> {
        // Annotations cannot say "keyed": the declaration does (its key: the run, the tool and
        // the invoice).
        let args = serde_json::json!({ "invoice_id": args.invoice_id, "body": args.body });
        self.call_backend("send_invoice", args).await
    }
}

#[tool_handler]
impl ServerHandler for Tools {}

/// What one case did.
pub struct Case {
    pub case: &'static str,
    pub requests: u32,
    pub effects: u32,
    pub is_error: bool,
    pub code: Option<String>,
    pub retryable: Option<bool>,
    pub hint: Option<String>,
    pub protocol_error: Option<String>,
    pub client_calls: u32,
}

/// Starts the tool server on 127.0.0.1 over `backend`; returns its address.
pub async fn start_server(backend: Backend) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tools = Tools::new(backend.clone());
            tokio::spawn(async move {
                if let Ok(running) = tools.serve(stream).await {
                    let _ = running.waiting().await;
                }
            });
        }
    });
    addr
}

/// Starts the server on 127.0.0.1 and a client connected to it; runs `tool` with `arguments`
/// through the client's `Retry`.
async fn run_case(case: &'static str, tool: &'static str, arguments: serde_json::Value) -> Case {
    let backend = Backend::default();
    let addr = start_server(backend.clone()).await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client = ().serve(stream).await.expect("MCP client connects");
    let peer = client.peer().clone();
    // The client's table: the server's tools as it lists them, classes from their annotations.
    let listed = peer.list_all_tools().await.expect("tools/list");
    let tools = Toolbox::new(vec![])
        .and_then(|toolbox| toolbox.with_mcp_tools(&listed))
        .and_then(|toolbox| toolbox.build(Stores::new()))
        .expect("the server's tools");
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let over_peer = McpPeer::new(peer);
    let body = tower::service_fn(move |call: Call| {
        counter.fetch_add(1, Ordering::SeqCst);
        over_peer.clone().oneshot(call)
    });
    let mut agent = tools.router(body, McpClassifier).expect("a stack per tool");
    let params = Call::new(RUN, STEP, arguments).to(tool);
    let result: Result<CallToolResult, ToolError> = agent.ready().await.unwrap().call(params).await;
    let (is_error, error, protocol_error) = match result {
        Ok(r) => (
            r.is_error == Some(true),
            ToolError::from_call_tool_result(&r),
            None,
        ),
        // A failure no retry helps is handed back as the result; an error is the transport's,
        // or a protocol error (the client's `Retry` wraps it).
        Err(e) => match e.cause() {
            Some(_) => (true, Some(e), None),
            None => (true, None, Some(e.to_string())),
        },
    };
    // The tool server's own words, which the client's error keeps as its cause.
    let hint = error
        .as_ref()
        .map(|e| e.cause().unwrap_or(e).hint().to_string());
    let _ = client.cancel().await;
    Case {
        case,
        requests: backend.requests(),
        effects: backend.effects(),
        is_error,
        code: error.as_ref().map(|e| e.code().as_str().to_string()),
        retryable: error.as_ref().map(ToolError::retryable),
        hint,
        protocol_error,
        client_calls: calls.load(Ordering::SeqCst),
    }
}

pub async fn all_cases() -> Vec<Case> {
    vec![
        run_case("outage", "search", serde_json::json!({ "query": "storm" })).await,
        run_case(
            "invalid_argument",
            "create_ticket",
            serde_json::json!({ "title": "refund", "priority": 9 }),
        )
        .await,
        run_case("output_schema", "report", serde_json::json!({})).await,
        run_case(
            "keyed_write",
            "send_invoice",
            serde_json::json!({ "invoice_id": 4471, "body": "Your invoice is attached." }),
        )
        .await,
    ]
}

#[allow(dead_code)]
#[tokio::main]
async fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let cases = all_cases().await;
    if !json {
        println!(
            "{:<18} {:>8} {:>7} {:>8} {:>7} {:<18} {:>9}  hint",
            "case", "requests", "effects", "client", "error", "code", "retryable"
        );
    }
    for c in &cases {
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "case": c.case,
                    "requests": c.requests,
                    "effects": c.effects,
                    "client_calls": c.client_calls,
                    "is_error": c.is_error,
                    "code": c.code,
                    "retryable": c.retryable,
                    "hint": c.hint,
                    "protocol_error": c.protocol_error,
                })
            );
        } else {
            println!(
                "{:<18} {:>8} {:>7} {:>8} {:>7} {:<18} {:>9}  {}",
                c.case,
                c.requests,
                c.effects,
                c.client_calls,
                c.is_error,
                c.code.as_deref().unwrap_or("-"),
                c.retryable.map_or("-".into(), |r| r.to_string()),
                c.hint
                    .as_deref()
                    .or(c.protocol_error.as_deref())
                    .unwrap_or("")
            );
        }
    }
}
