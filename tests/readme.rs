//! Every ```rust snippet of README.md and of the guides in docs/, run against real servers on
//! 127.0.0.1, with asserts for what the text around it claims. The first test checks that each
//! snippet's lines stand here verbatim (as consecutive lines), so the pages cannot drift from the
//! code that is tested.
mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use stormguard::error::{BoxError, ErrorCode};
use support::server::{self, Body};

/// The pages whose ```rust snippets are run here: the README and every guide in `docs/`.
const PAGES: &[(&str, &str)] = &[
    ("README.md", include_str!("../README.md")),
    ("docs/receipts.md", include_str!("../docs/receipts.md")),
    ("docs/decisions.md", include_str!("../docs/decisions.md")),
    ("docs/breaker.md", include_str!("../docs/breaker.md")),
    ("docs/mcp.md", include_str!("../docs/mcp.md")),
    ("docs/model-apis.md", include_str!("../docs/model-apis.md")),
    ("docs/fleet.md", include_str!("../docs/fleet.md")),
    ("docs/hedging.md", include_str!("../docs/hedging.md")),
    ("docs/failover.md", include_str!("../docs/failover.md")),
    ("docs/reqwest.md", include_str!("../docs/reqwest.md")),
    ("docs/grpc.md", include_str!("../docs/grpc.md")),
    (
        "docs/observability.md",
        include_str!("../docs/observability.md"),
    ),
    ("docs/results.md", include_str!("../docs/results.md")),
    ("docs/tools.md", include_str!("../docs/tools.md")),
    ("docs/sagas.md", include_str!("../docs/sagas.md")),
];

#[test]
fn every_snippet_of_the_readme_and_the_guides_is_the_code_tested_here() {
    let this: Vec<&str> = include_str!("readme.rs")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut snippets = 0;
    for (page, text) in PAGES {
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if !line.starts_with("```rust") {
                continue;
            }
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            snippets += 1;
            let found = this.windows(block.len()).any(|w| w == block.as_slice());
            assert!(
                found,
                "a snippet of {page} is not in tests/readme.rs verbatim:\n{}",
                block.join("\n")
            );
        }
    }
    assert!(snippets >= 10, "found only {snippets} snippets");
}

#[test]
fn every_guide_in_docs_is_checked_here_and_linked_from_the_readme() {
    let readme = PAGES[0].1;
    let listed: Vec<&str> = PAGES.iter().map(|(page, _)| *page).collect();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(stem) = name.strip_suffix(".md") {
            let page = format!("docs/{stem}.md");
            assert!(listed.contains(&page.as_str()), "{page} is not in PAGES");
            assert!(
                readme.contains(&format!("({page})")),
                "the README does not link {page}"
            );
        }
    }
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "the README has {lines} lines: guides go to docs/"
    );
}

/// The hyper client as the snippets' `http_client`: takes `http::Request<String>`, and sends
/// every request to `addr` whatever host its URI names (a proxy in front of the test server).
fn http_client(
    addr: std::net::SocketAddr,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<hyper::body::Incoming>,
    Error = BoxError,
    Future: Send,
> + Clone {
    tower::ServiceBuilder::new()
        .map_request(move |req: http::Request<String>| {
            let (mut parts, body) = req.into_parts();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            parts.uri = format!("http://{addr}{path}").parse().unwrap();
            http::Request::from_parts(parts, Body::from(body))
        })
        .service(server::HttpClient::new())
}

#[cfg(feature = "sqlite")]
/// `http_client` for the declared tool: the hyper client of [`http_client`] with each answer's
/// body read into a `String` (a receipt stores the answer whole).
fn collected_client(
    addr: std::net::SocketAddr,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future: Send,
> + Clone
       + Send
       + 'static {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    http_client(addr).and_then(
        |response: http::Response<hyper::body::Incoming>| async move {
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok(http::Response::from_parts(
                parts,
                String::from_utf8_lossy(&bytes).into_owned(),
            ))
        },
    )
}

#[cfg(feature = "sqlite")]
/// "Example": the declared tool, as written, over `http_client`; one call at `step`.
#[rustfmt::skip]
async fn declared_tool_example(
    http_client: impl tower::Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = BoxError,
            Future: Send,
        > + Clone
        + Send
        + 'static,
    db_path: std::path::PathBuf,
) -> Result<http::Response<String>, BoxError> {
    use tower::{Layer, Service, ServiceExt};
    use stormguard::receipt::{Durability, SqliteStore};
    use stormguard::tool::{Call, Stores, Toolbox};

    let toolbox = Toolbox::from_json_str(r#"{
        "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
        "tools": [{ "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
                    "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate",
                    "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } }]
    }"#)?;
    let receipts = SqliteStore::open(&db_path, Durability::PowerLoss)?;
    let tools = toolbox.build(Stores::new().with("receipts", receipts))?;

    // The tool's body: the model's arguments in, the billing API's answer out, with the key the stack
    // made as its Idempotency-Key.
    let body = tower::service_fn(move |call: Call| {
        let id = call.args()["invoice_id"].as_u64().unwrap_or_default();
        let request = http::Request::post(format!("http://billing.test/invoices/{id}/send"))
            .header("idempotency-key", call.key().map_or("", |k| k.as_str()))
            .body(String::new());
        let mut client = http_client.clone();
        async move { client.ready().await?.call(request?).await }
    });
    // Built once: the run and the step come with each call.
    let mut send_invoice = tools.layer("send_invoice")?.layer(body);
    let call = Call::new("run-81f2", "step-2", serde_json::json!({ "invoice_id": 4471 }));
    let response = send_invoice.ready().await?.call(call).await?;
    Ok(response)
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn the_declared_tool_retries_a_502_with_its_key_and_answers_a_repeat_from_its_receipt() {
    let dir = std::env::temp_dir().join(format!("stormguard-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("receipts.db");
    let _ = std::fs::remove_file(&db);
    // Two 502s, then the invoice is sent; the server echoes the key it got.
    let (addr, calls) = server::serve(|n| server::status(if n < 2 { 502 } else { 201 }, &[])).await;
    let response = declared_tool_example(collected_client(addr), db.clone())
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "3 attempts with one key");
    // The same call again, from a new process over the same file (a crash and resume): answered
    // from the receipt, nothing sent.
    let response = declared_tool_example(collected_client(addr), db.clone())
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a repeat sent the invoice again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn the_declared_tool_keys_every_attempt_alike_and_leaves_the_step_out() {
    let dir = std::env::temp_dir().join(format!("stormguard-readme-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (addr, _, keys) =
        server::serve_keys(|n| server::status(if n < 1 { 502 } else { 201 }, &[])).await;
    declared_tool_example(collected_client(addr), dir.join("r.db"))
        .await
        .unwrap();
    let keys: Vec<String> = keys.lock().unwrap().iter().flatten().cloned().collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert!(
        keys[0].starts_with("run-81f2:-:send_invoice:"),
        "{}",
        keys[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// "Example": the snippet as written, over `http_client`.
#[rustfmt::skip]
async fn send_invoice_example(
    http_client: impl tower::Service<
            http::Request<String>,
            Response = http::Response<hyper::body::Incoming>,
            Error = BoxError,
            Future: Send,
        > + Clone,
) -> Result<serde_json::Value, BoxError> {
    use tower::{Service, ServiceBuilder, ServiceExt};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use stormguard::retry::RetryLayer;

    // One budget for every layer that guards this dependency (clones share it).
    let budget = RetryBudget::default();

    let mut send_invoice = ServiceBuilder::new()
        // the tool wrapper: a keyed write, retried after an ambiguous failure (a 502) only when its
        // request carries an Idempotency-Key (the default reads an http::Response by its status)
        .layer(RetryLayer::new(ToolClass::KeyedWrite, budget.clone()).name("send_invoice"))
        // the HTTP client's own layer joins the same operation (it travels in the request, across a
        // Buffer or a spawned task too): 3 attempts in all, not 9; `nested()`: never a second owner
        .layer(RetryLayer::new(ToolClass::Read, budget).name("billing-api").nested())
        .service(http_client);

    let request = http::Request::post("http://billing.test/invoices/4471/send")
        .header("idempotency-key", "run-81f2:step-2:send_invoice:d4842b79")
        .body(String::new())?;
    let tool_result = match send_invoice.ready().await?.call(request).await {
        Ok(response) => serde_json::json!({ "status": response.status().as_u16() }),
        // what the model sees: {"code":"unavailable","retryable":false,"hint":"...","attempts":3,...}
        Err(err) => err.to_mcp_result(),
    };
    Ok(tool_result)
}

#[tokio::test]
async fn the_example_retries_a_keyed_502_and_makes_3_calls_not_9() {
    // Two 502s, then the invoice is sent: retried with its key.
    let (addr, calls) = server::serve(|n| server::status(if n < 2 { 502 } else { 200 }, &[])).await;
    let result = send_invoice_example(http_client(addr)).await.unwrap();
    assert_eq!(result["status"], 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // Down for good: 3 calls across the two layers, and the JSON the comment shows.
    let (addr, calls) = server::serve(|_| server::status(502, &[])).await;
    let result = send_invoice_example(http_client(addr)).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let error = &result["structuredContent"];
    assert_eq!(result["isError"], true);
    assert_eq!(error["code"], "unavailable");
    assert_eq!(error["retryable"], false);
    assert_eq!(error["attempts"], 3);
}

#[tokio::test]
async fn the_example_without_its_key_ends_after_one_call() {
    use stormguard::classify::HttpClassifier;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let (addr, calls) = server::serve(|_| server::status(502, &[])).await;
    let budget = RetryBudget::default();
    let mut send_invoice = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::KeyedWrite, budget.clone()).replay(HttpReplay))
        .layer(RetryLayer::new(ToolClass::Read, budget).classifier(HttpClassifier))
        .service(http_client(addr));
    let request = http::Request::post("http://billing.test/invoices/4471/send")
        .body(String::new())
        .unwrap();
    let err = send_invoice
        .ready()
        .await
        .unwrap()
        .call(request)
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(err.code(), ErrorCode::MissingIdempotencyKey);
}

#[tokio::test]
#[rustfmt::skip]
async fn raising_max_attempts_on_the_outermost_layer_gives_the_operation_more() {
    use stormguard::retry::RetryLayer;
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    let run = async move {
        use stormguard::class::ClassPolicy;

        // Five attempts for this operation, whatever the layers below allow each time they are called.
        let five = ClassPolicy::builder(ToolClass::Read).max_attempts(5).build()?;
        let mut search = ServiceBuilder::new()
            .layer(RetryLayer::new(five, budget.clone()).name("agent-loop"))
            .layer(RetryLayer::new(ToolClass::Read, budget.clone()).name("tool-wrapper"))
            .layer(RetryLayer::new(ToolClass::Read, budget).name("client"))
            .service(http_client);
        let req = http::Request::get("http://search.test/?q=storm").body(String::new())?;
        let err = search.ready().await?.call(req).await.unwrap_err();
        Ok::<_, BoxError>(err)
    };
    let err = run.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(err.attempts(), 5);
    assert!(!err.retryable());
}

#[cfg(feature = "sqlite")]
#[tokio::test]
#[rustfmt::skip]
async fn receipts_answer_a_reworded_reissue_and_a_resume_without_a_second_send() {
    use serde::{Deserialize, Serialize};
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;
    use stormguard::class::ToolClass;
    use stormguard::key::{IdempotencyKey, KeyStamp};
    use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

    #[derive(Clone)]
    struct SendInvoice {
        email: serde_json::Value,
        key: Option<String>,
    }
    impl stormguard::retry::Request for SendInvoice {
        fn replay(&self) -> Option<Self> {
            Some(self.clone())
        }
        fn carries_key(&self) -> bool {
            self.key.is_some()
        }
    }
    impl KeyStamp for SendInvoice {
        fn stamped_key(&self) -> Option<&str> {
            self.key.as_deref()
        }
        fn stamp_key(&mut self, key: &IdempotencyKey) {
            self.key = Some(key.to_string());
        }
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Sent {
        message_id: String,
    }
    impl stormguard::classify::Answer for Sent {}
    stormguard::stored_as_json!(Sent);

    let dir = std::env::temp_dir().join(format!("stormguard-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("receipts.db"));
    let sends = Arc::new(AtomicU32::new(0));
    let email = |body: &str| SendInvoice {
        email: serde_json::json!({"invoice_id": 4471, "to": "ap@acme.test", "body": body}),
        key: None,
    };
    let mut answers = Vec::new();
    for (attempt, body) in [(0, "Dear customer"), (1, "Hello, here is your invoice"), (2, "Hi")] {
        let counter = sends.clone();
        let email_client = service_fn(move |req: SendInvoice| {
            counter.fetch_add(1, Ordering::SeqCst);
            assert!(req.key.is_some(), "the key is stamped before the send");
            async move { Ok::<_, std::io::Error>(Sent { message_id: "msg-4471-3".into() }) }
        });
        // Each pass opens the file anew, as a resumed process would.
        let mut send_invoice = {
            let run = || -> Result<_, BoxError> {
                use stormguard::key::Action;
                use stormguard::receipt::{Durability, ReceiptGuardLayer, SqliteStore};

                let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
                let mut send_invoice = ServiceBuilder::new()
                    .layer(ReceiptGuardLayer::new(store, ToolClass::KeyedWrite, |req: &SendInvoice| {
                        // the key covers invoice_id; the fingerprint covers invoice_id and recipient;
                        // the body the model writes belongs to neither, so a reworded body is the same action
                        Action::task("run-81f2", "step-2", "send_invoice", &req.email, &["invoice_id"], &["invoice_id", "to"])
                    }))
                    .service(email_client);
                let _ = &mut send_invoice;
                Ok(send_invoice)
            };
            run().unwrap()
        };
        let sent = send_invoice.ready().await.unwrap().call(email(body)).await.unwrap();
        answers.push(sent);
        assert_eq!(sends.load(Ordering::SeqCst), 1, "pass {attempt}");
    }
    assert!(answers.iter().all(|a| a.message_id == "msg-4471-3"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
#[rustfmt::skip]
async fn the_breaker_example_retries_503s_then_fails_fast_without_a_retry() {
    use stormguard::classify::HttpClassifier;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    use stormguard::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerLayer};

    let breakers = BreakerRegistry::new(BreakerConfig::default());
    let mut billing = ServiceBuilder::new()
        // reads a 503 as a failure (HttpClassifier) and never retries circuit_open
        .layer(RetryLayer::new(ToolClass::KeyedWrite, budget.clone()).classifier(HttpClassifier).replay(HttpReplay))
        .layer(CircuitBreakerLayer::new(breakers.get("billing-api")).classifier(HttpClassifier))
        .service(http_client);
    // With receipts, put the breaker below the ReceiptGuardLayer: a stored receipt says nothing about
    // the dependency's health (see the crate docs, "Where each layer goes").

    let charge = || http::Request::post("http://billing.test/charges")
        .header("idempotency-key", "run-1:step-3:charge:4471").body(String::new()).unwrap();
    for _ in 0..3 {
        let err = billing.ready().await.unwrap().call(charge()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 9, "3 calls each");
    // Failures go on (fewer retries once the budget is spent) until the 20th in a row opens
    // the breaker; the call after it is rejected, and not retried.
    let mut charges = 3;
    let err = loop {
        let err = billing.ready().await.unwrap().call(charge()).await.unwrap_err();
        charges += 1;
        assert!(charges < 30, "the breaker never opened");
        if err.code() == ErrorCode::CircuitOpen {
            break err;
        }
    };
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert_eq!(calls.load(Ordering::SeqCst), 20, "20 failures in a row, after {charges} charges");
    let err = billing.ready().await.unwrap().call(charge()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::CircuitOpen);
    assert!(err.retry_after().is_some_and(|d| d > Duration::ZERO));
    assert_eq!(calls.load(Ordering::SeqCst), 20, "rejected without reaching the API");
}

#[cfg(feature = "reqwest")]
#[tokio::test]
#[rustfmt::skip]
async fn the_reqwest_example_retries_a_502_with_the_same_key() {
    use stormguard::key::{Action, SetIdempotencyKeyLayer};
    use stormguard::retry::RetryLayer;
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    fn order_id_of(req: &reqwest::Request) -> String {
        req.url().path().rsplit('/').next().unwrap_or_default().to_string()
    }
    let (addr, calls, keys) =
        server::serve_keys(|n| server::status(if n == 0 { 502 } else { 200 }, &[])).await;
    let budget = RetryBudget::default();
    let run = async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let mut charge = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::KeyedWrite, budget.clone()))
            .layer(SetIdempotencyKeyLayer::new(|req: &reqwest::Request| {
                Action::new("run-81f2", "step-3", "charge", &order_id_of(req))
            }))
            .service(client);
        let url = format!("http://{addr}/orders/7781").parse()?;
        let req = reqwest::Request::new(reqwest::Method::POST, url);
        let resp = charge.ready().await?.call(req).await?;
        Ok::<_, BoxError>(resp.status().as_u16())
    };
    assert_eq!(run.await.unwrap(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].as_deref().is_some_and(|k| k.starts_with("run-81f2:step-3:charge:")));
    assert_eq!(keys[0], keys[1], "one key on both attempts");
}

#[cfg(feature = "sqlite")]
#[tokio::test]
#[rustfmt::skip]
async fn settling_an_outcome_unknown_answers_or_sends_the_next_attempt() -> Result<(), BoxError> {
    use serde::{Deserialize, Serialize};
    use stormguard::class::ToolClass;
    use stormguard::key::{Action, IdempotencyKey, KeyStamp};
    use stormguard::receipt::{Durability, ReceiptGuardLayer, SqliteStore};
    use tower::{Layer, ServiceExt};

    #[derive(Clone)]
    struct Invoice(u64, Option<String>);
    impl stormguard::retry::Request for Invoice {
        fn replay(&self) -> Option<Self> { Some(self.clone()) }
        fn carries_key(&self) -> bool { self.1.is_some() }
    }
    impl KeyStamp for Invoice {
        fn stamped_key(&self) -> Option<&str> { self.1.as_deref() }
        fn stamp_key(&mut self, key: &IdempotencyKey) { self.1 = Some(key.to_string()) }
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Sent { message_id: String }
    impl stormguard::classify::Answer for Sent {}
    stormguard::stored_as_json!(Sent);
    /// The provider's sent log: invoice 1 went out before the crash, invoice 2 did not.
    struct ProviderLog(std::collections::HashMap<String, String>);
    impl ProviderLog {
        fn message_id_for(&self, key: &str) -> Option<String> { self.0.get(key).cloned() }
    }

    let dir = std::env::temp_dir().join(format!("stormguard-readme-resolve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _ = std::fs::remove_file(dir.join("receipts.db"));
    let store = SqliteStore::open(dir.join("receipts.db"), Durability::Process)?;
    let action = |inv: &Invoice| Action::new("run-1", "step-2", "send_invoice", &inv.0);
    let mut log = std::collections::HashMap::new();
    for invoice in [1, 2] {
        // A crashed run recorded each intent; its 10 ms lease passes.
        let act = action(&Invoice(invoice, None))?;
        store.begin(act.key().as_str(), act.fingerprint(), "crashed", Duration::from_millis(10)).await?;
        if invoice == 1 {
            log.insert(act.key().to_string(), "msg-1".to_string());
        }
    }
    let provider_log = ProviderLog(log);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let sends = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = sends.clone();
    let provider = tower::service_fn(move |inv: Invoice| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, std::io::Error>(Sent { message_id: format!("msg-{}", inv.0) }) }
    });
    let tool = ReceiptGuardLayer::new(store.clone(), ToolClass::UnkeyedWrite, action).layer(provider);
    for invoice in [1, 2] {
        let err = tool.clone().oneshot(Invoice(invoice, None)).await.unwrap_err();
        assert_eq!(err.downcast::<stormguard::error::ToolError>().unwrap().code(), ErrorCode::OutcomeUnknown);
    }

    use stormguard::receipt::{ReceiptStore, Resolution, Resolved};

    for intent in store.pending(100).await? {
        if intent.key.starts_with("saga:") {
            continue; // a saga's own record: it takes it over itself
        }
        if intent.may_still_land_for_ms > 0 {
            continue; // a request may still land: an empty log proves nothing yet
        }
        // Check with the provider: its sent log, its dashboard, a support ticket.
        let resolution = match provider_log.message_id_for(&intent.key) {
            Some(message_id) => Resolution::Done(serde_json::to_vec(&Sent { message_id })?),
            None => Resolution::NotDone,
        };
        assert_eq!(store.resolve(&intent.key, resolution).await?, Resolved::Settled);
    }

    // Invoice 1 is answered from its receipt; invoice 2 is sent now; nothing else is sent.
    assert_eq!(tool.clone().oneshot(Invoice(1, None)).await.unwrap(), Sent { message_id: "msg-1".into() });
    assert_eq!(tool.clone().oneshot(Invoice(2, None)).await.unwrap(), Sent { message_id: "msg-2".into() });
    assert_eq!(sends.load(Ordering::SeqCst), 1);
    assert!(store.pending(100).await?.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test]
#[rustfmt::skip]
async fn the_hedging_example_answers_a_hung_read_from_its_hedge() -> Result<(), BoxError> {
    use stormguard::classify::HttpClassifier;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    // The 101st request hangs for 5 s; every other one answers at once.
    let (addr, calls) = server::serve_after(
        |n| if n == 100 { Duration::from_secs(5) } else { Duration::ZERO },
        |_| server::status(200, &[]),
    )
    .await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    use stormguard::hedge::HedgeLayer;

    let mut search = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).classifier(HttpClassifier).replay(HttpReplay))
        // after 100 answers: a second attempt when no answer came within the 95th percentile
        // of the last 512; an attempt of the operation, paid from the budget; never for writes
        .layer(HedgeLayer::percentile(budget, 0.95, 100).classifier(HttpClassifier).replay(HttpReplay).build()?)
        .service(http_client);

    let get = || http::Request::get("http://search.test/q?storm").body(String::new()).unwrap();
    for _ in 0..100 {
        search.ready().await?.call(get()).await?;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 100, "no hedge before 100 answers");
    let started = std::time::Instant::now();
    let answer = search.ready().await?.call(get()).await?;
    assert_eq!(answer.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(2), "answered by the hedge, not after 5 s");
    assert_eq!(calls.load(Ordering::SeqCst), 102, "the hung request and its hedge");
    Ok(())
}

#[tokio::test]
#[rustfmt::skip]
async fn the_model_api_example_tells_a_used_up_quota_from_a_rate_limit() -> Result<(), BoxError> {
    use stormguard::classify::Classify;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    // Requests 0: OpenAI's insufficient_quota 429; 1, 2: Anthropic's 529; then 200.
    let (addr, calls) = server::serve(|n| match n {
        0 => http::Response::builder().status(429).body(Body::from(r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#)).unwrap(),
        1 | 2 => http::Response::builder().status(529).body(Body::from(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)).unwrap(),
        _ => server::status(200, &[]),
    })
    .await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    use stormguard::classify::{ModelApiClassifier};
    use stormguard::peek::PeekErrorBodyLayer;

    let mut model = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).classifier(ModelApiClassifier).replay(HttpReplay))
        // reads at most 16 KiB of an error body, for at most 2 s, and hands the body on whole
        .layer(PeekErrorBodyLayer::builder().limit(16 * 1024).timeout(Duration::from_secs(2)).build()?)
        .service(http_client);

    let ask = || http::Request::post("http://api.test/v1/messages").body(String::from("{}")).unwrap();
    // A used-up quota: one request, handed back, and the error for the model says so.
    let answer = model.ready().await?.call(ask()).await?;
    assert_eq!(answer.status(), 429);
    let error = Classify::<_, BoxError>::dependency_error(&ModelApiClassifier, &answer).unwrap();
    assert_eq!((error.code(), error.retryable()), (ErrorCode::QuotaExhausted, false));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Overloaded twice, then an answer: retried with backoff.
    let answer = model.ready().await?.call(ask()).await?;
    assert_eq!(answer.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    Ok(())
}

#[tokio::test]
#[rustfmt::skip]
async fn the_streamed_answer_example_sends_a_stream_broken_before_its_first_token_again() -> Result<(), BoxError> {
    use http_body_util::BodyExt;
    use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use support::sse::{serve, Answer, EVENT};
    use tower::{Service, ServiceBuilder, ServiceExt};
    // The first stream breaks after its head; the second is whole.
    let (addr, received) = serve(vec![Answer::BreakBefore]).await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    let breaker = Breaker::new("model-api", BreakerConfig::default());
    use stormguard::classify::StreamClassifier;
    use stormguard::stream::CommitAtFirstFrameLayer;

    let mut chat = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).classifier(StreamClassifier).replay(HttpReplay))
        .layer(CircuitBreakerLayer::new(breaker.clone()).classifier(StreamClassifier))
        // holds a 2xx answer until its first data frame, for at most 30 s
        .layer(CommitAtFirstFrameLayer::new(Duration::from_secs(30))?)
        .service(http_client);

    let ask = || http::Request::get("http://api.test/v1/chat/completions").body(String::new()).unwrap();
    let answer = chat.ready().await?.call(ask()).await?;
    assert_eq!(answer.into_body().collect().await?.to_bytes(), EVENT);
    assert_eq!(*received.lock().unwrap(), 2, "the broken stream was sent again");
    Ok(())
}

#[tokio::test]
#[rustfmt::skip]
async fn the_tenant_quota_example_spaces_each_tenants_tokens_apart() -> Result<(), BoxError> {
    use stormguard::classify::ModelApiClassifier;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let (addr, calls) = server::serve(|_| server::status(200, &[])).await;
    let (http_client, budget) = (http_client(addr), RetryBudget::default());
    let header = |req: &http::Request<String>, name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let tenant_of = move |req: &http::Request<String>| header(req, "x-tenant");
    let tokens_of = move |req: &http::Request<String>| header(req, "x-tokens").parse::<u32>().unwrap_or(1);
    use stormguard::quota::{KeyedQuotaLayer, Rate};

    // each tenant: 1,000 tokens a second, a whole second's worth at once; key and cost per call
    let tokens = Rate::per_second(1_000).burst(1_000).build()?;
    let mut model = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).classifier(ModelApiClassifier).replay(HttpReplay))
        .layer(KeyedQuotaLayer::new(tokens, move |req: &http::Request<String>| (tenant_of(req), tokens_of(req))))
        .service(http_client);

    let ask = |tenant: &str, tokens: u32| http::Request::post("http://api.test/v1/chat/completions")
        .header("x-tenant", tenant).header("x-tokens", tokens.to_string()).body(String::new()).unwrap();
    let start = std::time::Instant::now();
    model.ready().await?.call(ask("acme", 1_000)).await?;
    model.ready().await?.call(ask("globex", 1_000)).await?; // its own quota: no wait
    assert!(start.elapsed() < Duration::from_millis(500));
    model.ready().await?.call(ask("acme", 1_000)).await?; // waits for acme's refill
    assert!(start.elapsed() >= Duration::from_millis(950));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    Ok(())
}

#[cfg(feature = "rmcp")]
#[path = "../examples/mcp.rs"]
#[allow(dead_code)]
mod mcp;

#[cfg(feature = "rmcp")]
#[tokio::test]
#[rustfmt::skip]
async fn the_mcp_example_does_not_retry_what_the_server_gave_up_on() -> Result<(), BoxError> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt as _;
    use stormguard::retry::RetryLayer;
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let backend = mcp::Backend::default();
    let addr = mcp::start_server(backend.clone()).await;
    let client = ().serve(tokio::net::TcpStream::connect(addr).await?).await?;
    let (peer, budget) = (client.peer().clone(), RetryBudget::default());
    use stormguard::classify::McpClassifier;

    // the MCP client's call_tool as a tower service, retried only where the server allows it
    let call_tool = tower::service_fn(move |params: CallToolRequestParams| {
        let peer = peer.clone();
        async move { peer.call_tool(params).await }
    });
    let mut agent = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget.clone()).classifier(McpClassifier))
        .service(call_tool);

    let search = CallToolRequestParams::new("search").with_arguments(serde_json::json!({ "query": "storm" }).as_object().unwrap().clone());
    let err = agent.ready().await?.call(search).await.unwrap_err();
    // The server's Retry spent its 3 attempts on a 503 and said `retryable: false`: one call.
    assert_eq!((err.code(), err.retryable()), (ErrorCode::Unavailable, false));
    assert_eq!(backend.requests(), 3);
    Ok(())
}

#[cfg(feature = "rmcp")]
#[tokio::test]
#[rustfmt::skip]
async fn the_mcp_session_example_sends_a_lost_answer_again_under_one_key() -> Result<(), BoxError> {
    use rmcp::ServiceExt as _;
    use serde_json::json;
    use support::shop::{serve, Seen};
    use tower::ServiceExt;
    // A shop whose send_invoice loses its first answer (after sending: it dedupes on the key).
    let seen = Seen::default();
    let client = ().serve(tokio::net::TcpStream::connect(serve(seen.clone()).await).await?).await?;
    let peer = client.peer().clone();
    use stormguard::tool::{Call, Stores, Toolbox};

    let toolbox = Toolbox::from_json_str(r#"{ "tools": [{
        "name": "send_invoice", "class": "keyed_write", "retry": ["layer"],
        "key": ["run", "tool", "id:invoice_id"], "unknown_outcome": "escalate" }] }"#)?
        // every other tool the server lists, declared from its annotations
        .with_mcp_tools(&peer.list_all_tools().await?)?;
    let session = toolbox.build(Stores::new())?.mcp_session(peer.clone())?;

    let call = Call::new("run-81f2", "step-2", json!({ "invoice_id": 4471 })).to("send_invoice");
    let answer = session.clone().oneshot(call).await?;
    assert_ne!(answer.is_error, Some(true));
    let keys = seen.keys.lock().unwrap().clone();
    assert_eq!((keys.len(), keys[0].is_some(), keys[0] == keys[1]), (2, true, true), "twice, one key in _meta");
    assert_eq!(seen.sent.lock().unwrap().len(), 1, "one invoice");
    assert_eq!(toolbox.tools().len(), 3, "search and post_ticket from the server's list");
    Ok(())
}

/// "A fleet on one Redis": the snippet as written, as one worker of `WORKERS`.
#[cfg(feature = "redis")]
#[rustfmt::skip]
async fn fleet_worker(
    redis_url: &str,
    http_client: impl tower::Service<
            http::Request<String>,
            Response = http::Response<hyper::body::Incoming>,
            Error = BoxError,
            Future: Send,
        > + Clone + Send + 'static,
) -> Result<impl tower::Service<http::Request<String>, Response = http::Response<hyper::body::Incoming>, Error = stormguard::error::ToolError>, BoxError> {
    use stormguard::classify::HttpClassifier;
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::class::ToolClass;
    use tower::ServiceBuilder;
    const WORKERS: u32 = 2;
    use stormguard::breaker::{Breaker, BreakerConfig, CircuitBreakerLayer};
    use stormguard::budget::RetryBudget;
    use stormguard::fleet::{Fleet, FleetQuotaLayer};
    use stormguard::quota::Rate;

    let fleet = Fleet::builder(redis_url).prefix("billing-agents").build()?;
    fleet.wait_up(Duration::from_secs(1)).await; // or start local and join when Redis answers
    // The ratio balance and the floor are the fleet's: 10 retries a minute for all the workers.
    let budget = RetryBudget::builder().fleet(&fleet, "payments").build()?;
    budget.fleet_ready(Duration::from_secs(1)).await; // its first lease: one round trip
    // The provider's 200 requests a second for the whole fleet; each worker's share while Redis is down.
    let rate = Rate::per_second(200).build()?;
    let fallback = Rate::per_second(200 / WORKERS).build()?;
    let quota = FleetQuotaLayer::builder(&fleet, "provider", rate, fallback, |_: &http::Request<String>| {
        ("org", 1)
    })
    .build()?;
    // One worker's failures open every worker's breaker.
    let breaker = Breaker::new("payments", BreakerConfig::default());
    fleet.share_breaker(&breaker)?;
    let mut payments = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::IdempotentWrite, budget).classifier(HttpClassifier).replay(HttpReplay))
        .layer(CircuitBreakerLayer::new(breaker).classifier(HttpClassifier))
        .layer(quota)
        .service(http_client);

    assert!(fleet.is_up());
    let _ = &mut payments;
    Ok(payments)
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_example_opens_both_workers_breakers_on_the_fleets_count() -> Result<(), BoxError>
{
    use tower::{Service, ServiceExt};
    let Some(redis_url) = support::service_url("STORMGUARD_REDIS_URL") else {
        return Ok(());
    };
    // The snippet's keys are fixed: start from a clean slate.
    let client = redis::Client::open(redis_url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("billing-agents:*")
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<()>(&mut conn)
            .await?;
    }
    let (addr, calls) = server::serve(|_| server::status(503, &[])).await;
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(fleet_worker(&redis_url, http_client(addr)).await?);
    }
    let charge = || {
        http::Request::post("http://payments.test/charges")
            .body(String::new())
            .unwrap()
    };
    // The two workers take turns until both answer circuit_open.
    let mut open = [false, false];
    for _ in 0..40 {
        for (i, w) in workers.iter_mut().enumerate() {
            let err = w.ready().await?.call(charge()).await.unwrap_err();
            open[i] |= err.code() == ErrorCode::CircuitOpen;
        }
        if open == [true, true] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open, [true, true], "both breakers open");
    // About 20 failures in all opened both, where two breakers of their own would have needed
    // 20 each (40).
    let sent = calls.load(Ordering::SeqCst);
    assert!(sent < 40, "{sent} calls reached the provider");
    eprintln!("{sent} calls reached the provider before both breakers opened");
    Ok(())
}

#[tokio::test]
#[rustfmt::skip]
async fn the_failover_example_leaves_a_spent_quota_for_the_next_provider() -> Result<(), BoxError> {
    use stormguard::retry::{HttpReplay, RetryLayer};
    use stormguard::{budget::RetryBudget, class::ToolClass};
    use tower::{Service, ServiceBuilder, ServiceExt};
    let spent = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let (openai, openai_calls) = server::serve(move |_| http::Response::builder().status(429).body(Body::from(spent)).unwrap()).await;
    let (anthropic, anthropic_calls) = server::serve(|_| server::status(200, &[])).await;
    let (openai_client, anthropic_client) = (http_client(openai), http_client(anthropic));
    let budget = RetryBudget::default();
    use stormguard::classify::ModelApiClassifier;
    use stormguard::peek::PeekErrorBodyLayer;
    use stormguard::failover::Failover;
    use tower::util::BoxCloneSyncService;

    // One stack per provider: its error-body peek over its client (its breaker and quota go here too).
    let provider = |client| BoxCloneSyncService::new(ServiceBuilder::new().layer(PeekErrorBodyLayer::builder().build().unwrap()).service(client));
    let failover = Failover::builder(budget.clone(), "openai", provider(openai_client))
        .or("anthropic", provider(anthropic_client))
        .classifier(ModelApiClassifier)
        // each request names the target's model
        .rewrite(|req: &mut http::Request<String>, target: &str| {
            let model = if target == "openai" { "gpt-5" } else { "claude-sonnet-4" };
            req.headers_mut().insert("x-model", http::HeaderValue::from_static(model));
        })
        .build()?;
    let mut model = ServiceBuilder::new()
        .layer(RetryLayer::new(ToolClass::Read, budget).classifier(ModelApiClassifier).replay(HttpReplay))
        .service(failover);

    let ask = || http::Request::post("http://api.test/v1/messages").body(String::from("{}")).unwrap();
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let answer = model.ready().await?.call(ask()).await?;
        assert_eq!(answer.status(), 200);
    }
    assert_eq!(anthropic_calls.load(Ordering::SeqCst), 10, "every question answered by the second");
    // Asked once, then skipped: a probe a second at most (none unless this machine is starved).
    let probes = started.elapsed().as_secs() as u32;
    assert!((1..=1 + probes).contains(&openai_calls.load(Ordering::SeqCst)), "the spent provider asked once, then skipped");
    Ok(())
}

#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
#[rustfmt::skip]
async fn the_reqwest_middleware_example_nests_in_place_of_reqwest_retry() -> Result<(), BoxError> {
    use stormguard::retry::RetryLayer;
    use stormguard::{budget::RetryBudget, class::ToolClass};
    let (addr, calls) = server::serve(|n| server::status(if n < 2 { 503 } else { 200 }, &[])).await;
    let (reqwest, budget) = (reqwest013::Client::builder().retry(reqwest013::retry::never()).build()?, RetryBudget::default());
    use reqwest_middleware::ClientBuilder;
    use stormguard::middleware::Guard;

    let client = ClientBuilder::new(reqwest)
        // in place of reqwest-retry's RetryTransientMiddleware
        .with(Guard::new(RetryLayer::new(ToolClass::Read, budget.clone())))
        .build();

    let answer = client.get(format!("http://{addr}/search?q=storm")).send().await?;
    assert_eq!(answer.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "two 503s retried");
    Ok(())
}

#[test]
fn tools_declare_each_tool_once() -> Result<(), stormguard::tool::SpecError> {
    use stormguard::class::ToolClass;
    use stormguard::tool::{KeyPart, RetryOwner, StoreSpec, Tool, Toolbox, UnknownOutcome};

    let send_invoice = Tool::new("send_invoice", ToolClass::KeyedWrite, RetryOwner::Layer)
        .key(vec![KeyPart::Run, KeyPart::Tool, KeyPart::id("invoice_id")])
        .receipt("pg", Some(86_400))
        .unknown_outcome(UnknownOutcome::Escalate)
        .resume_window_secs(3_600);
    let toolbox = Toolbox::new(vec![])?
        .with_store(
            "pg",
            StoreSpec {
                kind: "postgres".into(),
                retention_secs: 604_800,
            },
        )?
        .with_tool(send_invoice)?;
    assert!(toolbox.audit().findings.is_empty());
    Ok(())
}

#[cfg(feature = "audit")]
#[test]
fn tools_audit_your_tool_table() -> Result<(), stormguard::tool::SpecError> {
    use stormguard::tool::Toolbox;

    let toolbox = Toolbox::from_toml_str(include_str!("../examples/tools.toml"))?;
    let audit = toolbox.audit();
    assert!(audit.has_errors());
    assert_eq!(audit.findings.len(), 16);
    Ok(())
}

/// The tool table of "Crash on purpose": a read and a keyed write with receipts; `step_keyed`
/// puts the step in the write's key and gives its retries to the model.
#[cfg(feature = "chaos")]
fn crash_on_purpose_table(step_keyed: bool) -> stormguard::tool::Toolbox {
    let (key, owner) = if step_keyed {
        (
            serde_json::json!(["run", "step", "tool", "id:invoice_id"]),
            "model",
        )
    } else {
        (serde_json::json!(["run", "tool", "id:invoice_id"]), "layer")
    };
    let file = serde_json::json!({
        "stores": { "receipts": { "kind": "sqlite", "retention_secs": 604800 } },
        "tools": [
            { "name": "search", "class": "read", "retry": ["layer"] },
            { "name": "send_invoice", "class": "keyed_write", "retry": [owner], "key": key,
              "unknown_outcome": "escalate",
              "receipt": { "store": "receipts", "provider_key_window_secs": 86400 } }
        ]
    });
    stormguard::tool::Toolbox::from_json_str(&file.to_string()).unwrap()
}

/// "Crash on purpose": the snippet as written, over `toolbox`.
#[cfg(feature = "chaos")]
#[rustfmt::skip]
fn crash_on_purpose(toolbox: &stormguard::tool::Toolbox) -> Result<stormguard::chaos::Report, BoxError> {
    use stormguard::chaos::{Harness, Step};

    let script = vec![
        Step::new("search", serde_json::json!({ "q": "unpaid invoices" })),
        Step::new("send_invoice", serde_json::json!({ "invoice_id": 4471 })),
    ];
    let report = Harness::new(toolbox.clone(), script).run(1_000, 7)?;
    assert_eq!(report.duplicate_effects, 0);
    Ok(report)
}

#[cfg(feature = "chaos")]
#[test]
fn crash_on_purpose_passes_a_sound_table_and_fails_a_key_with_the_step() {
    let report = crash_on_purpose(&crash_on_purpose_table(false)).unwrap();
    assert!(report.crashes > 100, "{report:?}");
    let failed = std::panic::catch_unwind(|| crash_on_purpose(&crash_on_purpose_table(true)));
    assert!(failed.is_err(), "the step in the key went unnoticed");
    let report = stormguard::chaos::Harness::new(
        crash_on_purpose_table(true),
        vec![stormguard::chaos::Step::new(
            "send_invoice",
            serde_json::json!({ "invoice_id": 4471 }),
        )],
    )
    .run(1_000, 7)
    .unwrap();
    assert!(
        report.duplicates_by_tool.contains_key("send_invoice"),
        "{report:?}"
    );
}
