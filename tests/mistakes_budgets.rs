//! Budgets by dependency (issue 37), against real HTTP servers on 127.0.0.1: tools that name no
//! budget do not share one across unrelated dependencies, a spent budget's hint names the
//! dependency that spent it, and a toolbox built per call is said out loud.
#![cfg(feature = "reqwest")]

mod support;

use http_body_util::Full;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use stormguard::budget::RetryBudget;
use stormguard::error::{BoxError, ErrorCode};
use stormguard::tool::{Call, Stores, Toolbox, Tools};
use support::call;
use support::server::{serve, Body};
use tower::{service_fn, Layer, Service};

fn answer(status: u16) -> http::Response<Body> {
    http::Response::builder()
        .status(status)
        .body(Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap()
}

/// A read tool's body: GETs the provider and answers its status and body, read into a string.
fn get(
    addr: SocketAddr,
) -> impl Service<Call, Response = http::Response<String>, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    let client = reqwest::Client::new();
    service_fn(move |_call: Call| {
        let (client, url) = (client.clone(), format!("http://{addr}/"));
        async move {
            let resp = client.get(url).send().await?;
            let status = resp.status().as_u16();
            let text = resp.text().await?;
            Ok::<_, BoxError>(http::Response::builder().status(status).body(text)?)
        }
    })
}

/// Two read tools, `chat` and `search_orders`, on quick backoffs; `chat_dependency` and
/// `orders_dependency` are their `dependency` fields (`None`: left out).
fn toolbox(chat_dependency: Option<&str>, orders_dependency: Option<&str>) -> Toolbox {
    let tool = |name: &str, dependency: Option<&str>| {
        let mut t = json!({ "name": name, "class": "read", "retry": ["layer"],
                            "backoff": { "base_ms": 1, "cap_ms": 2 } });
        if let Some(d) = dependency {
            t["dependency"] = json!(d);
        }
        t
    };
    let tools = json!({ "tools": [tool("chat", chat_dependency), tool("search_orders", orders_dependency)] });
    Toolbox::from_json_str(&tools.to_string()).unwrap()
}

/// `n` chat calls into a provider that answers 503 to every one: the last call's error.
async fn chat_outage(tools: &Tools, addr: SocketAddr, n: u32) -> stormguard::error::ToolError {
    let mut chat = tools.layer("chat").unwrap().layer(get(addr));
    let mut last = None;
    for i in 0..n {
        let call_ = Call::new(format!("run-{i}"), "step-1", json!({}));
        last = Some(call(&mut chat, call_).await.unwrap_err());
    }
    last.unwrap()
}

/// Mistake (left as is): every tool on the toolbox's defaults. A chat outage spends the chat
/// tool's budget only: a blip on the healthy orders API is still retried, and the chat's
/// refusal names the chat's budget. Control: the same tools told, in one word, to share one
/// budget (`with_default_budget`), where the blip is refused as it was before.
#[tokio::test]
async fn a_chat_outage_does_not_spend_the_orders_apis_retries() {
    let (chat_addr, _) = serve(|_| answer(503)).await;
    for shared in [false, true] {
        let (orders_addr, orders_sent) = serve(|n| answer(if n == 0 { 503 } else { 200 })).await;
        let mut tools = toolbox(None, None).build(Stores::new()).unwrap();
        if shared {
            tools = tools.with_default_budget(RetryBudget::default());
        }
        let err = chat_outage(&tools, chat_addr, 40).await;
        assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted, "{err}");
        let mut orders = tools
            .layer("search_orders")
            .unwrap()
            .layer(get(orders_addr));
        let blip = call(&mut orders, Call::new("run-x", "step-1", json!({}))).await;
        if shared {
            let err = blip.unwrap_err();
            assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted, "{err}");
            assert_eq!(orders_sent.load(Ordering::SeqCst), 1);
        } else {
            // By default the chat's refusal names whose budget is spent.
            assert!(err.hint().contains("(`chat`)"), "{}", err.hint());
            assert_eq!(blip.unwrap().status(), 200, "the blip is retried");
            assert_eq!(orders_sent.load(Ordering::SeqCst), 2);
            assert_eq!(
                tools.budget_of("search_orders").unwrap().name(),
                Some("search_orders")
            );
        }
    }
}

/// Tools that name the same dependency share its budget: the chat outage spends the retries
/// of `summarize` on the same model API, and its refusal names that dependency.
#[tokio::test]
async fn tools_naming_one_dependency_share_its_budget() {
    let (chat_addr, _) = serve(|_| answer(503)).await;
    let (llm_addr, llm_sent) = serve(|_| answer(503)).await;
    let tools = toolbox(Some("llm"), Some("llm"))
        .build(Stores::new())
        .unwrap();
    chat_outage(&tools, chat_addr, 40).await;
    let mut same_api = tools.layer("search_orders").unwrap().layer(get(llm_addr));
    let err = call(&mut same_api, Call::new("run-y", "step-1", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RetryBudgetExhausted, "{err}");
    assert!(
        err.hint().contains("(`llm`)") && err.hint().contains("outage of `llm`"),
        "{}",
        err.hint()
    );
    assert_eq!(
        llm_sent.load(Ordering::SeqCst),
        1,
        "not retried: the budget is spent"
    );
}

/// Mistake: the toolbox built per call. Each build starts its budget empty, so 30 chats in an
/// outage send three attempts each; built once, the budget's floor holds the outage to about
/// one retry for three calls. The second build of the same declaration is said (one WARN) and
/// every rebuild counted.
#[test]
fn a_toolbox_built_per_call_is_said_out_loud() {
    let (((per_call, once), rebuilds), warnings) = support::logs::warnings(|| {
        let ((per_call, once), counted) = support::counted::counting(async {
            let (addr, sent) = serve(|_| answer(503)).await;
            let declared = |name: &str| {
                Toolbox::from_json_str(
                    &json!({ "tools": [{ "name": name, "class": "read",
                    "retry": ["layer"], "backoff": { "base_ms": 1, "cap_ms": 2 } }] })
                    .to_string(),
                )
                .unwrap()
            };
            for i in 0..30 {
                let tools = declared("chat_per_call").build(Stores::new()).unwrap();
                let mut chat = tools.layer("chat_per_call").unwrap().layer(get(addr));
                let _ = call(
                    &mut chat,
                    Call::new(format!("run-{i}"), "step-1", json!({})),
                )
                .await;
            }
            let per_call = sent.swap(0, Ordering::SeqCst);
            let tools = declared("chat_once").build(Stores::new()).unwrap();
            let mut chat = tools.layer("chat_once").unwrap().layer(get(addr));
            for i in 0..30 {
                let _ = call(
                    &mut chat,
                    Call::new(format!("run-{i}"), "step-1", json!({})),
                )
                .await;
            }
            (per_call, sent.load(Ordering::SeqCst))
        });
        (
            (per_call, once),
            counted.total("stormguard_toolbox_rebuilds_total"),
        )
    });
    eprintln!(
        "30 calls in an outage: {per_call} requests with a toolbox per call, {once} built once"
    );
    assert_eq!(per_call, 90, "a fresh budget per call: three attempts each");
    assert!(
        once <= 45,
        "built once, the budget holds: {once} requests for 30 calls"
    );
    assert_eq!(rebuilds, 29, "every build after the first is counted");
    let said: Vec<_> = warnings
        .iter()
        .filter(|l| l.contains("built again") && l.contains("chat_per_call"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {warnings:#?}");
    assert!(
        said[0].contains("build it once at startup and clone its Tools"),
        "{}",
        said[0]
    );
    assert!(
        !warnings
            .iter()
            .any(|l| l.contains("built again") && l.contains("chat_once")),
        "a toolbox built once is not reported"
    );
}
